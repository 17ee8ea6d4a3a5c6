"""``accelpact bench goodput``: fault-to-frontier of AccelPact L1, torchrun restart (L2) and torchft.

The same 2-rank world for all three (the workload's ``CharLM``, DDP-style data parallelism over two
ranks, gloo on loopback), ``--repeat`` faults each, measured in the same run:

* **L1** (AccelPact in-place repair): a boundary failure of the world group (``collective_timeout``
  on rank 1 after a step committed), repaired in place; fault to every rank resumed at F.
* **L2** (torchrun restart from the last DCP checkpoint): an in-flight failure (exception in
  backward), every rank exits 70, torchrun restarts the job, which reloads checkpoint C and replays
  F - C steps; fault to every rank back at F.  Both launches are those of ``accelpact bench
  recovery`` (:func:`accelpact.bench.recovery.measure`) with ``--wrapper ddp`` on 1x2.
* **torchft** (optional, :mod:`accelpact.bench.torchft_run` under an interpreter that has torchft):
  two replica groups of one rank, a lighthouse, the same boundary fault (the gloo communicator's
  sockets shut down after a commit); fault to both replicas ready again (quorum + ``configure``)
  for the interrupted step, and fault to that step committed.

Ratios are of medians measured in this run.  ``goodput_at_mtbf`` is derived, not measured:
``1 - fault_to_frontier / MTBF`` for a job that fails every MTBF seconds.

torchft is looked for in ``--torchft-python``, then ``$ACCELPACT_TORCHFT_PYTHON``, then
``runs/tft-venv/bin/python`` (a venv whose ``.pth`` reuses ``.venv``'s torch 2.13.0; see
bench/README.md), then this interpreter; ``--torchft off`` skips it (the default of ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import common

__all__ = ["add_arguments", "run", "find_torchft"]

MTBF_S = (600.0, 3600.0, 6 * 3600.0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "goodput")
    p.add_argument("--repeat", type=int, default=None, help="faults per method (default 5; quick 1)")
    p.add_argument("--layers", type=int, default=2, help="wrapped layers of the workload (default %(default)s)")
    p.add_argument("--torchft", choices=("auto", "on", "off"), default=None,
                   help="torchft arm: auto = if an interpreter with torchft is found (default; quick: off)")
    p.add_argument("--torchft-python", default=None, metavar="PATH", help="interpreter that has torchft next to torch 2.13.0")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each launch, seconds")


def find_torchft(explicit: str | None) -> tuple[str | None, str]:
    """(interpreter, why): an interpreter that imports torchft, or None and the reason."""
    candidates = [c for c in (explicit, os.environ.get("ACCELPACT_TORCHFT_PYTHON"), "runs/tft-venv/bin/python", sys.executable) if c]
    tried = []
    for c in candidates:
        if c != sys.executable and not Path(c).exists():
            tried.append(f"{c}: not there")
            continue
        try:
            out = subprocess.run([c, "-c", "import torch, torchft; print(torch.__version__, torchft.__file__)"],
                                 capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{c}: {exc}")
            continue
        if out.returncode == 0:
            return c, out.stdout.strip()
        tried.append(f"{c}: {(out.stderr.strip().splitlines() or ['import failed'])[-1]}")
    return None, "torchft is not importable: " + "; ".join(tried)


def _torchft(python: str, repeat: int, layers: int, out: Path, timeout: float) -> dict[str, Any]:
    fault_steps = [4 + 3 * i for i in range(repeat)]
    cmd = [python, "-m", "accelpact.bench.torchft_run", "launch", "--steps", str(fault_steps[-1] + 3),
           "--fault-steps", ",".join(map(str, fault_steps)), "--layers", str(layers), "--out", str(out),
           "--bound", str(timeout)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise common.BenchError(f"torchft launch failed (rc={proc.returncode}): {proc.stderr[-2000:]}")
    res = json.loads(lines[-1])
    res.pop("replicas", None)
    res["fault_steps"] = fault_steps
    res["fault_to_frontier_s"] = common.stats([f["fault_to_frontier_s"] for f in res["faults"]])
    res["fault_to_commit_s"] = common.stats([f["fault_to_commit_s"] for f in res["faults"]])
    res["configure_ms"] = common.stats(res.get("configure_s", []), 1e3)
    res["complete"] = (not res["timed_out"] and res["codes"] == [0, 0] and len(res["faults"]) == repeat
                       and all(f["fault_to_frontier_s"] is not None for f in res["faults"]))
    return res


def run(args: argparse.Namespace) -> int:
    from . import recovery

    t0 = time.monotonic()
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    mode = args.torchft or ("off" if args.quick else "auto")
    if repeat < 1:
        print("accelpact bench goodput: error: --repeat must be >= 1", file=sys.stderr)
        return 2
    rec_args = argparse.Namespace(repeat=repeat, nodes=1, ranks_per_node=2, wrapper="ddp", layers=args.layers, backend="gloo",
                                  out=str(Path(args.out) / "accelpact"), json=None, timeout=args.timeout)
    result: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    rec, _, _, _ = recovery.measure(rec_args, say=lambda m: print(f"goodput: {m}", flush=True), swap=False)
    result["accelpact"] = {"l1": rec["l1"], "l2": rec["l2"], "complete": rec["complete"], "config": rec["config"]}
    l1 = rec["l1"]["fault_to_frontier_s"]["median"]
    l2 = rec["l2"]["fault_to_frontier_s"]["median"]
    tft_med = None
    if mode == "off":
        reasons["torchft_over_accelpact_fault_to_frontier"] = "torchft arm off (--torchft off, the default of --quick)"
        result["torchft"] = None
    else:
        python, why = find_torchft(args.torchft_python)
        if python is None:
            reasons["torchft_over_accelpact_fault_to_frontier"] = why
            result["torchft"] = None
            print(f"goodput: torchft skipped: {why}", flush=True)
            if mode == "on":
                print(f"accelpact bench goodput: --torchft on: {why}", file=sys.stderr)
                return 1
        else:
            print(f"goodput: torchft: {repeat} boundary failures, 2 replica groups x 1 rank ({python}: {why})", flush=True)
            try:
                result["torchft"] = _torchft(python, repeat, args.layers, Path(args.out).resolve() / "torchft", args.timeout)
                result["torchft"]["python"] = python
                result["torchft"]["version"] = why
                tft_med = result["torchft"]["fault_to_frontier_s"]["median"]
            except (common.BenchError, subprocess.TimeoutExpired) as exc:
                reasons["torchft_over_accelpact_fault_to_frontier"] = f"torchft run failed: {exc}"[:500]
                result["torchft"] = None
    rows = [["AccelPact L1 (in place)", l1, rec["l1"]["fault_to_frontier_s"], rec["l1"]["replayed_steps"]],
            ["torchrun restart L2", l2, rec["l2"]["fault_to_frontier_s"], rec["l2"]["replayed_steps"]]]
    if result.get("torchft"):
        rows.append(["torchft (reconfigure)", tft_med, result["torchft"]["fault_to_frontier_s"],
                     [f["failed_steps"] for f in result["torchft"]["faults"]]])
    common.print_table("fault to frontier, same 2-rank world (gloo CPU, loopback): milliseconds",
                       ["method", "n", "median", "p90", "max", "x L1", "replayed / failed steps"],
                       [[name, s["n"], common.fmt(s["median"], 1e3), common.fmt(s["p90"], 1e3), common.fmt(s["max"], 1e3),
                         common.fmt((med / l1) if med and l1 else None), replay] for name, med, s, replay in rows])
    if result.get("torchft"):
        t = result["torchft"]
        print(f"torchft: fault to the interrupted step committed: median {common.fmt(t['fault_to_commit_s']['median'], 1e3)} ms; "
              f"configure(): median {common.fmt(t['configure_ms']['median'])} ms, max {common.fmt(t['configure_ms']['max'])} ms "
              f"(n={t['configure_ms']['n']}); fault-free step {common.fmt(t.get('step_s'), 1e3)} ms", flush=True)
    result["goodput_at_mtbf"] = {f"{int(m)}s": {name: (1 - med / m) if med else None for name, med, _, _ in rows} for m in MTBF_S}
    headline: dict[str, Any] = {
        "l2_over_l1_fault_to_frontier": (l2 / l1) if l1 and l2 else None,
        "torchft_over_accelpact_fault_to_frontier": (tft_med / l1) if tft_med and l1 else None,
        "l1_fault_to_frontier_ms": None if l1 is None else l1 * 1e3,
        "l2_fault_to_frontier_ms": None if l2 is None else l2 * 1e3,
        "torchft_fault_to_frontier_ms": None if tft_med is None else tft_med * 1e3,
    }
    if headline["l2_over_l1_fault_to_frontier"] is None:
        reasons["l2_over_l1_fault_to_frontier"] = "an L1 or L2 run did not complete (see the launch logs under --out)"
    if headline["torchft_over_accelpact_fault_to_frontier"] is None and "torchft_over_accelpact_fault_to_frontier" not in reasons:
        reasons["torchft_over_accelpact_fault_to_frontier"] = "a torchft or L1 fault-to-frontier is missing"
    if getattr(args, "plot", None):
        _plot(args.plot, rows)
    common.write_result(args, "goodput", {"repeat": repeat, "world": "1x2 (2 ranks)", "layers": args.layers, "torchft": mode},
                        result, headline, reasons, t0)
    complete = rec["complete"] and (result.get("torchft") is None or result["torchft"]["complete"])
    return 0 if complete else 1


def _plot(path: str, rows: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r[0] for r in rows]
    meds = [(r[1] or 0) * 1e3 for r in rows]
    tops = [((r[2]["max"] or 0) * 1e3) for r in rows]
    ax.bar(names, meds, color=["tab:green", "tab:red", "tab:blue"][: len(rows)], label="median")
    ax.plot(names, tops, "k_", ms=25, mew=2, label="max")
    ax.set_yscale("log")
    ax.set_ylabel("fault to frontier (ms, log)")
    ax.set_title("same 2-rank world, gloo CPU, loopback", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}", flush=True)
