"""``accelpact bench explore``: exploration speed (states/s) per configuration, with and without symmetry.

Reports the median and the tails (p90, max) of the wall time over ``--repeat`` runs, and the
ratio reduced/unreduced measured in the same run.  Times are measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from accelpact.model.explore import MANIFEST_CONFIGS, explore
from .common import meta

DEFAULT_CONFIGS = ("2x2-f1", "3x2-f1", "2x1-ddp-f2", "2x2-f2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration and mode (default 3)")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma-separated manifest configurations (default {','.join(DEFAULT_CONFIGS)}); any of: {', '.join(MANIFEST_CONFIGS)}")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                        help="print one JSON object (--json) or write it to PATH (--json PATH)")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def measure(name: str, symmetry: bool, repeat: int) -> dict:
    cfg, _fast = MANIFEST_CONFIGS[name]
    times, states = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = explore(cfg, symmetry=symmetry)
        times.append(time.perf_counter() - t0)
        states = r.states
    med = statistics.median(times)
    return {
        "config": name, "symmetry": symmetry, "states": states, "repeat": repeat,
        "median_s": med, "p90_s": _pct(times, 0.9), "max_s": max(times),
        "states_per_s": states / med if med > 0 else float("inf"),
    }


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        print("accelpact bench explore: --repeat must be >= 1", flush=True)
        return 2
    names = [x.strip() for x in args.configs.split(",") if x.strip()]
    bad = [n for n in names if n not in MANIFEST_CONFIGS]
    if bad:
        print(f"accelpact bench explore: --configs: unknown {', '.join(bad)}; allowed: {', '.join(MANIFEST_CONFIGS)}")
        return 2
    rows = []
    for name in names:
        red = measure(name, True, args.repeat)
        full = measure(name, False, args.repeat)
        rows.append({"config": name, "reduced": red, "unreduced": full,
                     "state_ratio": red["states"] / full["states"], "time_ratio": red["median_s"] / full["median_s"]})
        if args.json != "-":
            for m in (red, full):
                print(f"{name:<12} symmetry={'on ' if m['symmetry'] else 'off'} states {m['states']:>8,}  "
                      f"median {m['median_s']:7.3f} s  p90 {m['p90_s']:7.3f} s  max {m['max_s']:7.3f} s  "
                      f"{m['states_per_s']:>10,.0f} states/s", flush=True)
            print(f"{name:<12} reduced/unreduced: states x{rows[-1]['state_ratio']:.3f}, median time x{rows[-1]['time_ratio']:.3f}", flush=True)
    if args.json == "-":
        print(json.dumps({"benchmark": "explore", "repeat": args.repeat, "results": rows}, indent=2))
    elif args.json:
        from pathlib import Path

        ratio = statistics.median(r["time_ratio"] for r in rows) if rows else None
        doc = {"benchmark": "explore", "quick": False, "meta": meta(False), "config": {"repeat": args.repeat, "configs": names},
               "results": rows, "headline": {"symmetry_time_ratio_median": ratio}, "headline_reasons": {}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"json: {args.json}", flush=True)
    return 0
