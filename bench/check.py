"""``accelpact bench check``: trace-checking time versus the number of ranks.

For each world (``--worlds 4x4,16x8,32x32``) a model run of one boundary repair is projected to the
per-rank traces a faithful implementation writes (``checker.scheduled_repair`` + ``project``), and
the checker is timed on them ``--repeat`` times: median, p90 and max seconds, records and search
nodes.  The acceptance must hold (a rejection is an error, exit 1).  Measured, never asserted in a
test.  Pure Python, no torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worlds", default="2x2,4x4,8x4,16x4,16x8,32x32",
                        help="comma-separated NODESxRANKS_PER_NODE worlds (default 2x2 ... 32x32 = 1,024 ranks)")
    parser.add_argument("--repeat", type=int, default=3, help="timed checks per world (default 3)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")


def _worlds(text: str) -> list[tuple[int, int]]:
    out = []
    for item in filter(None, text.split(",")):
        try:
            n, m = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--worlds: {item!r} is not NODESxRANKS_PER_NODE (e.g. 4x4)") from None
        if n < 1 or m < 1:
            raise ValueError(f"--worlds: {item!r} needs at least one node and one rank per node")
        out.append((n, m))
    return out


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from accelpact.conformance.checker import check_traces, project, scheduled_repair
    from accelpact.model.state import Config

    try:
        worlds = _worlds(args.worlds)
    except ValueError as exc:
        print(f"accelpact bench check: error: {exc}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"accelpact bench check: error: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    console = Console()
    rows: list[dict[str, Any]] = []
    for nodes, rpn in worlds:
        cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=rpn - 1, max_faults=1, points=("boundary",))
        traces = project(cfg, scheduled_repair(cfg))
        records = sum(len(t.records) for t in traces.values())
        times, nodes_used = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            v = check_traces(cfg, traces)
            times.append(time.perf_counter() - t0)
            nodes_used = v.nodes
            if not v.accepted:
                print(f"accelpact bench check: {nodes}x{rpn}: the checker rejected a model run:\n{v.message}", file=sys.stderr)
                return 1
        s = sorted(times)
        rows.append({"world": f"{nodes}x{rpn}", "ranks": nodes * rpn, "records": records, "nodes": nodes_used,
                     "median_s": statistics.median(times), "p90_s": s[min(len(s) - 1, int(0.9 * len(s)))], "max_s": s[-1]})
        console.print(f"checked {nodes}x{rpn} ({nodes * rpn} ranks, {records} records): median {rows[-1]['median_s']:.3f} s", highlight=False)
    table = Table(title="trace checking: one boundary repair, accepted (seconds)")
    for col in ("world", "ranks", "records", "search nodes", "median", "p90", "max"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["world"], str(r["ranks"]), str(r["records"]), str(r["nodes"]), f"{r['median_s']:.3f}",
                      f"{r['p90_s']:.3f}", f"{r['max_s']:.3f}")
    console.print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "check", "results": rows}, f, indent=1)
    return 0
