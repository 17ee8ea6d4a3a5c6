"""What every benchmark shares: statistics, the results file, tables, plots, launching ranks.

Conventions (issue 12):

* figures are medians with their tails (p90, p99, max) over repeated measurements (:func:`stats`);
* a comparison is a ratio of two figures measured in the same run, never against a stored number;
* every benchmark takes ``--quick`` (a tiny size, for CI: ``accelpact bench all --quick``),
  ``--json PATH`` (the results file, :func:`write_result`) and, where a plot makes sense,
  ``--plot PATH`` (a PNG, matplotlib Agg);
* a results file is ``{"benchmark", "quick", "meta", "config", "results", "headline"}``; its
  ``headline`` holds the few figures :mod:`accelpact.bench.summary` quotes (None with a reason in
  ``headline_reasons`` when not measured);
* nothing here is asserted in a test: tests only check the JSON's keys and types.

No torch import at module level (``accelpact bench explore`` must not pull torch in).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from accelpact.impl.runtime.wrappers import WRAPPERS
from accelpact.testing import run_ranks

__all__ = [
    "BenchError", "LAYOUT", "QUICK_DIR", "RESULTS_DIR", "add_common", "bootstrap_ci", "fmt", "line_plot", "meta", "pct",
    "print_table", "rank_values", "rss_kb", "stats", "write_result",
]

#: The world each wrapper's multi-rank benchmarks run on, (nodes, ranks per node), from the wrapper
#: table: one node of 2 where R is the world (DDP), 2 x 2 where R is a replicate group (HSDP).
LAYOUT: dict[str, tuple[int, int]] = {w.name: (1, 2) if w.recovers == "world" else (2, 2) for w in WRAPPERS.values()}

#: Full results (``accelpact bench all`` without ``--quick``): kept with the code, read by ``summary``.
RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: Quick results (CI): a scratch folder under the ignored ``runs/``.
QUICK_DIR = Path("runs") / "bench-quick"


class BenchError(RuntimeError):
    """A benchmark's run failed (a rank crashed, a launch timed out): the message says where to look."""


# ------------------------------------------------------------------------------------------ statistics

def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (defined for any n >= 1)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def stats(xs: Iterable[float | None], scale: float = 1.0) -> dict[str, Any]:
    """n, median, p90, p99, max, min and mean of ``xs`` (None values dropped), each times ``scale``."""
    v = [float(x) * scale for x in xs if x is not None]
    if not v:
        return {"n": 0, "median": None, "p90": None, "p99": None, "max": None, "min": None, "mean": None}
    return {"n": len(v), "median": statistics.median(v), "p90": pct(v, 0.90), "p99": pct(v, 0.99), "max": max(v),
            "min": min(v), "mean": statistics.fmean(v)}


def bootstrap_ci(xs: Sequence[float], stat: Callable[[Sequence[float]], float] = statistics.median,
                 n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``stat(xs)`` (resampling ``xs`` with replacement)."""
    if not xs:
        raise ValueError("bootstrap_ci: no values")
    rng = random.Random(seed)
    n = len(xs)
    boots = sorted(stat([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    lo = boots[int((1 - level) / 2 * (n_boot - 1))]
    hi = boots[int((1 + level) / 2 * (n_boot - 1))]
    return lo, hi


def rss_kb() -> int:
    """This process's resident set size in KiB (``VmRSS``; 0 where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------------------------- arguments

def add_common(p: argparse.ArgumentParser, name: str, plot: bool = True) -> None:
    """``--quick``, ``--json PATH``, ``--plot PATH`` and ``--out DIR`` (scratch run folders)."""
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI; seconds, not minutes)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON to PATH")
    if plot:
        p.add_argument("--plot", default=None, metavar="PATH", help="also draw the results into PATH (PNG)")
    p.add_argument("--out", default=f"runs/bench-{name}", metavar="DIR", help="scratch folder of the runs (default %(default)s)")


def parse_worlds(text: str, min_nodes: int = 1, why: str = "needs at least one node and one rank per node") -> list[tuple[int, int]]:
    """``"2x2,4x4"`` -> ``[(2, 2), (4, 4)]`` (``--worlds``): ValueError naming the item, and ``why``
    when it has fewer than ``min_nodes`` nodes or no rank per node."""
    out = []
    for item in filter(None, text.split(",")):
        try:
            n, m = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--worlds: {item!r} is not NODESxRANKS_PER_NODE (e.g. 2x2)") from None
        if n < min_nodes or m < 1:
            raise ValueError(f"--worlds: {item!r}: {why}")
        out.append((n, m))
    return out


def parse_list(text: str, kind: type = int) -> list:
    """``"2,8,32"`` -> ``[2, 8, 32]`` (ValueError naming the item)."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            out.append(kind(item))
        except ValueError:
            raise ValueError(f"{item!r} is not a {kind.__name__}") from None
    return out


# ------------------------------------------------------------------------------------------ results

def meta(quick: bool) -> dict[str, Any]:
    """Where and when: the machine (cores, load), versions, time (UTC)."""
    out: dict[str, Any] = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(), "quick": quick,
        "argv": sys.argv[1:],
    }
    try:
        out["loadavg"] = list(os.getloadavg())
    except OSError:
        out["loadavg"] = None
    if "torch" in sys.modules:
        out["torch"] = str(sys.modules["torch"].__version__)
    return out


def write_result(args: argparse.Namespace, name: str, config: dict[str, Any], results: Any,
                 headline: dict[str, Any] | None = None, reasons: dict[str, str] | None = None,
                 t0: float | None = None) -> dict[str, Any]:
    """The results document; written to ``args.json`` when given.  Returns it.  A headline figure
    that is None gets a reason (the benchmark's, else a generic one): null is never silent."""
    reasons = dict(reasons or {})
    for key, value in (headline or {}).items():
        if value is None and not reasons.get(key):
            reasons[key] = "not measured in this run (see the benchmark's flags and its results)"
    doc: dict[str, Any] = {"benchmark": name, "quick": bool(getattr(args, "quick", False)), "meta": meta(bool(getattr(args, "quick", False))),
                           "config": config, "results": results, "headline": headline or {},
                           "headline_reasons": reasons}
    if t0 is not None:
        doc["meta"]["wall_s"] = time.monotonic() - t0
    path = getattr(args, "json", None)
    if path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=_jsonable))
        os.replace(tmp, p)
        print(f"json: {p}", flush=True)
    return doc


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    return repr(x)


# ----------------------------------------------------------------------------------------- printing

def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    """A number for a table cell ('-' for None)."""
    if x is None:
        return "-"
    v = x * scale
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A rich table; the first column left-aligned, the others right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*[str(x) for x in r])
    _console().print(table)


def _console():
    """A rich console; 160 columns when the output is not a terminal (rich's default is 80)."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=160)


def line_plot(path: str | os.PathLike, title: str, xlabel: str, ylabel: str,
              series: Mapping[str, tuple[Sequence[float], Sequence[float | None]]], *, logx: bool = False,
              logy: bool = False, bands: Mapping[str, tuple[Sequence[float], Sequence[float | None]]] | None = None) -> Path:
    """One line per series (x, y); ``bands``: an upper line per series (e.g. p90), drawn dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if not pts:
            continue
        line = ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=label)
        if bands and label in bands:
            bx, by = bands[label]
            bpts = [(x, y) for x, y in zip(bx, by, strict=True) if y is not None]
            ax.plot([x for x, _ in bpts], [y for _, y in bpts], "--", color=line[0].get_color(), alpha=0.6)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Lay out, write (its folder made) and close a matplotlib figure; prints where it went."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    print(f"plot: {out}", flush=True)
    return out


# ------------------------------------------------------------------------------------------ ranks

def rank_values(fn: Callable[..., Any], world: int, out: str | os.PathLike, timeout_s: float = 300.0,
                init_group: bool = True, **kwargs: Any) -> list[Any]:
    """Run ``fn(ctx, **kwargs)`` on ``world`` fresh processes (:func:`accelpact.testing.run_ranks`,
    loopback gloo, bounded and reaped); every rank's return value, or :class:`BenchError` with the
    run's explanation.  The ranks log c10d's C++ messages from ERROR up only: the engine's watchdog
    re-arms bounded store waits, and torch 2.13 warns at every expired one (every 5 s per rank)."""
    run = run_ranks(fn, world, out, init_group=init_group, timeout_s=timeout_s, env={"TORCH_CPP_LOG_LEVEL": "ERROR"},
                    **kwargs)
    if not run.ok or len(run.returns) != world:
        raise BenchError(f"{fn.__module__}.{fn.__qualname__} on {world} rank(s) failed:\n{run.explain()}")
    return [run.returns[r] for r in range(world)]
