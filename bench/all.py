"""``accelpact bench all``: every benchmark once, each writing ``<results>/<name>.json`` (and a PNG).

``--quick`` (what CI runs): tiny sizes, results in ``runs/bench-quick/``, no plots; about a minute
and a half on a 2-core machine.  Without it: the full sizes, results in ``bench/results/`` (read by
``accelpact bench summary``), plots beside them; the better part of an hour on 2 shared cores.

``recovery`` has no quick run of its own: ``goodput`` runs its L1 and L2 launches (the same job,
:func:`accelpact.bench.recovery._job`, on the 2-rank world).  A benchmark that fails does not
stop the others; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import common
from .cli import REGISTRY

__all__ = ["PLAN", "add_arguments", "run"]

#: name -> (quick arguments or None: not in the quick run, full arguments, draws a plot)
PLAN: dict[str, tuple[list[str] | None, list[str], bool]] = {
    "explore": (["--repeat", "1", "--configs", "2x2-f1"], ["--repeat", "3", "--configs", "2x2-f1,3x2-f1,2x1-ddp-f2"], False),
    "check": (["--worlds", "2x2,4x2", "--repeat", "1"], [], False),
    "rebind": (["--quick"], [], True),
    "validate": (["--quick"], ["--sizes-mb", "1,4,16,64,256,1024", "--repeat", "5"], True),
    "transfer": (["--quick"], ["--sizes-mb", "1,4,16,64,256", "--repeat", "5"], True),
    "controlplane": (["--quick"], [], True),
    "leaks": (["--quick"], [], True),
    "repair": (["--quick"], [], True),
    "guard": (["--quick"], [], True),
    "checkpoint": (["--quick"], ["--pad-s", "0.3"], False),
    "memory": (["--quick"], [], False),
    "goodput": (["--quick"], [], True),
    "recovery": (None, ["--repeat", "5"], False),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    p.add_argument("--results", default=None, metavar="DIR",
                   help=f"where the JSON files go (default {common.QUICK_DIR} with --quick, else bench/results)")
    p.add_argument("--only", default=None, help="comma-separated subset of: " + ", ".join(PLAN))
    p.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    p.add_argument("--no-plots", action="store_true", help="no PNGs (the quick run draws none anyway)")


def run(args: argparse.Namespace) -> int:
    t_all = time.monotonic()
    results = Path(args.results) if args.results else (common.QUICK_DIR if args.quick else common.RESULTS_DIR)
    names = [n.strip() for n in (args.only or ",".join(PLAN)).split(",") if n.strip()]
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    bad = [n for n in names + sorted(skip) if n not in PLAN]
    if bad:
        print(f"accelpact bench all: error: unknown benchmark(s) {bad}; allowed: {', '.join(PLAN)}", file=sys.stderr)
        return 2
    results.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in names:
        quick_argv, full_argv, plots = PLAN[name]
        if name in skip:
            rows.append({"benchmark": name, "rc": None, "wall_s": 0.0, "note": "skipped (--skip)"})
            continue
        if args.quick and quick_argv is None:
            rows.append({"benchmark": name, "rc": None, "wall_s": 0.0,
                         "note": "no quick run: goodput runs its L1 and L2 launches (recovery._job)"})
            continue
        argv = list((quick_argv or []) if args.quick else full_argv) + ["--json", str(results / f"{name}.json")]
        if plots and not args.quick and not args.no_plots:
            argv += ["--plot", str(results / f"{name}.png")]
        print(f"\n=== accelpact bench {name} {' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(REGISTRY[name])
            sub = argparse.ArgumentParser(prog=f"accelpact bench {name}")
            mod.add_arguments(sub)
            rc = int(mod.run(sub.parse_args(argv)) or 0)
            note = ""
        except Exception as exc:  # noqa: BLE001 - one failed benchmark must not stop the others; reported below
            rc, note = 1, f"{type(exc).__name__}: {exc}"[:300]
            print(f"accelpact bench all: {name} failed: {note}", file=sys.stderr, flush=True)
        rows.append({"benchmark": name, "rc": rc, "wall_s": time.monotonic() - t0, "json": str(results / f"{name}.json"),
                     "note": note})
    wall = time.monotonic() - t_all
    common.print_table(f"accelpact bench all{' --quick' if args.quick else ''}: {wall:.0f} s",
                       ["benchmark", "exit", "seconds", "note"],
                       [[r["benchmark"], "-" if r["rc"] is None else r["rc"], f"{r['wall_s']:.1f}", r.get("note", "")]
                        for r in rows])
    index = results / "all.json"
    stamp = common.meta(args.quick)
    for r in rows:
        r["created"] = stamp["created"]
    if args.only and index.exists():  # a partial rerun: keep the other benchmarks' rows of the last run
        try:
            old = json.loads(index.read_text()).get("runs", [])
        except (OSError, ValueError):
            old = []
        ran = {r["benchmark"] for r in rows}
        rows = [r for r in old if r.get("benchmark") not in ran] + rows
    index.write_text(json.dumps({"benchmark": "all", "quick": args.quick, "meta": stamp, "wall_s": wall, "runs": rows},
                                indent=1))
    return 1 if any(r["rc"] not in (0, None) for r in rows) else 0
