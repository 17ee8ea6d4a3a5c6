"""The nightly profile: the large exhaustive explorations, measured, against their pinned numbers.

``make nightly`` (``python -m accelpact.model.engine_nightly``) explores each configuration of
:data:`accelpact.model.explore.NIGHTLY_CONFIGS` (2x2 with three faults, 3x2 with two; every fault
kind, every point; symmetry reduction on) with every check of ``accelpact explore``: every invariant
on every state and step, L1, L2, L3.  Each runs in its own process, so that its peak memory is its
own.  It prints states, transitions, time, states/s and peak RSS, and fails (exit 1) when a property
is violated, when a count drifted from the manifest's ``nightly`` section, or when one configuration
would take longer than ``--budget`` seconds (600 by default: the goal is ten minutes each on a
two-core machine; the search stops there and reports how far it got).  ``--update`` re-pins the counts instead of comparing them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from typing import Any

from .explore import NIGHTLY_CONFIGS, config_summary, explore, load_manifest, manifest_drift, manifest_numbers, write_manifest

__all__ = ["main", "measure"]


def _rss_mib() -> float:
    """Peak resident set size, MiB (Linux reports ru_maxrss in KiB): this process's plus its
    largest child's (a search worker's), an upper bound of the two together."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


class _OverBudget(Exception):
    """The exploration passed its time budget: what it had reached by then."""

    def __init__(self, reached: dict[str, Any]) -> None:
        super().__init__(reached)
        self.reached = reached


def measure(name: str, verbose: bool = True, budget_s: float = 0.0, workers: int = 1) -> dict[str, Any]:
    """Explore one nightly configuration here (``workers`` processes) and return its numbers and measurements.  With
    ``budget_s`` the search stops once it ran that long (checked every 65,536 states) and the row
    says so (``over_budget``: states, transitions and BFS level reached, no verdict)."""
    cfg = NIGHTLY_CONFIGS[name]
    t0, c0 = time.perf_counter(), time.process_time()

    def progress(search) -> None:
        dt = time.perf_counter() - t0
        n = search.reached
        if verbose:
            print(f"  {name}: {n:,} states, {search.transitions:,} transitions, level {search.current_level}, "
                  f"{dt:.0f} s, {n / dt:,.0f} states/s, peak {_rss_mib():,.0f} MiB", file=sys.stderr, flush=True)
        if budget_s and dt > budget_s:
            raise _OverBudget({"states": n, "transitions": search.transitions, "level": search.current_level})

    try:
        result = explore(cfg, symmetry=True, progress=progress, workers=workers)
    except _OverBudget as over:
        seconds = time.perf_counter() - t0
        return {"name": name, "workers": workers, "over_budget": over.reached, "seconds": seconds, "cpu_seconds": time.process_time() - c0,
                "states_per_s": over.reached["states"] / seconds, "peak_rss_mib": _rss_mib()}
    seconds = time.perf_counter() - t0
    return {
        "name": name,
        "workers": workers,
        "numbers": manifest_numbers(result),
        "liveness": result.liveness,
        "violations": [v.format() for v in result.violations],
        "seconds": seconds,
        "cpu_seconds": time.process_time() - c0,
        "states_per_s": result.states / seconds if seconds > 0 else 0.0,
        "peak_rss_mib": _rss_mib(),
    }


def _child(name: str, verbose: bool, budget_s: float, workers: int, conn) -> None:
    try:
        conn.send(measure(name, verbose, budget_s, workers))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails
        conn.send({"name": name, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def _run_isolated(name: str, verbose: bool, budget_s: float, workers: int) -> dict[str, Any]:
    """:func:`measure` in a forked child process: its peak RSS is this configuration's alone."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(name, verbose, budget_s, workers, child))
    proc.start()
    child.close()
    try:
        row = parent.recv()
    except EOFError:
        row = {"name": name, "error": f"the exploration process died (exit code {proc.exitcode}; out of memory?)"}
    proc.join()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelpact.model.engine_nightly", description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(NIGHTLY_CONFIGS), help=f"comma-separated, of: {', '.join(NIGHTLY_CONFIGS)}")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds allowed per configuration (0: no limit; default 600)")
    parser.add_argument("--update", action="store_true", help="re-pin the counts in model/manifest.json instead of comparing")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the measurements as JSON to PATH")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--workers", type=int, default=2,
                        help="search processes per configuration (2, default: model/engine_parallel.py, about 1.3x faster "
                             "on two cores; 1: one process)")
    args = parser.parse_args(argv)
    if args.workers not in (1, 2):
        print(f"--workers: 1 or 2 (the parallel search exchanges states between two workers), got {args.workers}", file=sys.stderr)
        return 2
    names = [x.strip() for x in args.configs.split(",") if x.strip()]
    bad = [n for n in names if n not in NIGHTLY_CONFIGS]
    if bad:
        print(f"--configs: unknown {', '.join(bad)}; allowed: {', '.join(NIGHTLY_CONFIGS)}", file=sys.stderr)
        return 2
    pinned = load_manifest().get("nightly", {})
    rows, failed, fresh = [], False, {}
    for name in names:
        row = _run_isolated(name, not args.quiet, args.budget, args.workers)
        rows.append(row)
        if "error" in row:
            print(f"{name}: FAILED: {row['error']}")
            failed = True
            continue
        if "over_budget" in row:
            o = row["over_budget"]
            print(f"{name}: did not finish within the budget of {args.budget:g} s: stopped at {o['states']:,} states, "
                  f"{o['transitions']:,} transitions, BFS level {o['level']} ({row['states_per_s']:,.0f} states/s, "
                  f"peak RSS {row['peak_rss_mib']:,.0f} MiB); no verdict")
            failed = True
            continue
        n = row["numbers"]
        print(f"{name}: {n['states']:,} states, {n['transitions']:,} transitions, {n['edges']:,} edges, depth {n['depth']}, "
              f"{row['seconds']:.1f} s with {row['workers']} worker(s) ({row['cpu_seconds']:.1f} s CPU here), {row['states_per_s']:,.0f} states/s, "
              f"peak RSS {row['peak_rss_mib']:,.0f} MiB, exit bound {n['exit_bound']} (limit {n['exit_bound_limit']})")
        for v in row["violations"]:
            print(v)
        failed |= not n["ok"]
        entry = {"symmetry": n}
        if args.update:
            fresh[name] = {"config": config_summary(NIGHTLY_CONFIGS[name]), "fast": False, **entry}
        elif name not in pinned:
            print(f"{name}: not pinned in the manifest (run with --update)")
            failed = True
        else:
            drift = manifest_drift(name, pinned[name], entry)
            row["drift"] = drift
            for line in drift:
                print(f"DRIFT {line}")
            failed |= bool(drift)
        if args.budget and row["seconds"] > args.budget:
            print(f"{name}: took {row['seconds']:.0f} s, over the budget of {args.budget:.0f} s")
            failed = True
    if fresh:
        write_manifest(list(fresh), fresh=fresh)
        print(f"pinned {', '.join(fresh)} in the manifest")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"budget_s": args.budget, "results": rows}, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
