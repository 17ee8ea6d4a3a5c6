"""``accelpact bench check``: trace-checking time versus the number of ranks, accepting and rejecting.

For each world (``--worlds 4x4,16x8,32x32``) a model run of one boundary repair is projected to the
per-rank traces a faithful implementation writes (``checker.scheduled_repair`` + ``project``), and
the checker is timed on them ``--repeat`` times: median, p90 and max seconds, records and search
nodes.  The acceptance must hold (a rejection is an error, exit 1).

Then each tampering of ``--tamper`` (``conformance/checker_tamper.py``: a record reordered, dropped,
renamed, a wrong decision, count, ``last`` flag, communicator or frontier, a trace cut short, an end
record missing, a record too many) is applied to the same run (or to a run of an abort) and the
rejection is timed the same way; with ``--search-only`` the listed tamperings are also timed with
the checks before the search turned off (``prechecks=False``), which measures the search's own
rejection.  A tampered trace that is accepted is an error (exit 1).  Measured, never asserted in a
test.  Pure Python, no torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from . import common
from .common import meta
from accelpact.conformance.checker import TraceChecker, check_traces
from accelpact.conformance.checker_tamper import TAMPERINGS, repair_config, repair_traces

__all__ = ["add_arguments", "run"]

#: tamperings timed with the checks before the search off, by default (the search's own rejection)
SEARCH_ONLY = "frontier,reorder,exited-no-end"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worlds", default="2x2,4x4,8x4,16x4,16x8,32x32",
                        help="comma-separated NODESxRANKS_PER_NODE worlds (default 2x2 ... 32x32 = 1,024 ranks)")
    parser.add_argument("--repeat", type=int, default=3, help="timed checks per world and tampering (default 3)")
    parser.add_argument("--tamper", default="all",
                        help="comma-separated tamperings to time the rejection of ('all' (default), 'none', or names "
                             "from conformance/checker_tamper.py TAMPERINGS)")
    parser.add_argument("--search-only", default=SEARCH_ONLY,
                        help=f"tamperings also timed without the checks before the search (default {SEARCH_ONLY}; 'none')")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")


def _names(text: str, option: str, known: dict) -> list[str]:
    if text.strip() == "none":
        return []
    names = list(known) if text.strip() == "all" else [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad:
        raise ValueError(f"{option}: unknown tampering(s) {bad}; known: {', '.join(known)}")
    return names


def _stats(times: list[float]) -> dict[str, float]:
    s = sorted(times)
    return {"median_s": statistics.median(times), "p90_s": s[min(len(s) - 1, int(0.9 * len(s)))], "max_s": s[-1]}


def _meta() -> dict[str, Any]:
    try:
        return meta(False)
    except Exception:  # noqa: BLE001 - the shared helper is optional here
        return {}


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    try:
        worlds = common.parse_worlds(args.worlds)
        tamper = _names(getattr(args, "tamper", "all"), "--tamper", TAMPERINGS)
        search_only = _names(getattr(args, "search_only", SEARCH_ONLY), "--search-only", TAMPERINGS)
    except ValueError as exc:
        print(f"accelpact bench check: error: {exc}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"accelpact bench check: error: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    console = Console(width=max(Console().width, 110))
    rows: list[dict[str, Any]] = []
    rejections: list[dict[str, Any]] = []
    for nodes, rpn in worlds:
        cfg = repair_config(nodes, rpn)
        traces = repair_traces(cfg)
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
        rows.append({"world": f"{nodes}x{rpn}", "ranks": nodes * rpn, "records": records, "nodes": nodes_used, **_stats(times)})
        console.print(f"checked {nodes}x{rpn} ({nodes * rpn} ranks, {records} records): median {rows[-1]['median_s']:.3f} s",
                      highlight=False)
        bases: dict[str, Any] = {}
        for name, prechecks in [(n, True) for n in tamper] + [(n, False) for n in search_only]:
            t = TAMPERINGS[name]
            if t.on not in bases:
                bases[t.on] = t.base(nodes, rpn)
            tcfg, base = bases[t.on]
            bad = t.apply(tcfg, base)
            times, verdicts = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                verdicts.append(TraceChecker(tcfg, bad, prechecks=prechecks).check())
                times.append(time.perf_counter() - t0)
                if verdicts[-1].accepted:
                    print(f"accelpact bench check: {nodes}x{rpn}: tampering {name!r} ({t.doc}) was accepted", file=sys.stderr)
                    return 1
            v = verdicts[-1]
            by = "prechecks" if v.nodes == 0 else ("search (budget)" if "budget" in v.message else "search")
            if not prechecks:
                by += " only"
            rejections.append({"world": f"{nodes}x{rpn}", "ranks": nodes * rpn, "tampering": name, "prechecks": prechecks,
                               "rejected_by": by, "nodes": v.nodes, "records": sum(len(x.records) for x in bad.values()),
                               **_stats(times)})
        if rejections:
            worst = max((r for r in rejections if r["world"] == f"{nodes}x{rpn}"), key=lambda r: r["max_s"])
            console.print(f"  rejected {len(tamper)} tampering(s) (+{len(search_only)} by the search alone): "
                          f"slowest {worst['tampering']} max {worst['max_s']:.3f} s", highlight=False)
    table = Table(title="trace checking: one boundary repair, accepted (seconds)")
    for col in ("world", "ranks", "records", "search nodes", "median", "p90", "max"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["world"], str(r["ranks"]), str(r["records"]), str(r["nodes"]), f"{r['median_s']:.3f}",
                      f"{r['p90_s']:.3f}", f"{r['max_s']:.3f}")
    console.print(table)
    if rejections:
        table = Table(title="trace checking: tampered traces, rejected (seconds); 'prechecks': before any search, "
                            "'search only': with the checks before the search turned off")
        for col in ("tampering", "rejected by", "world", "ranks", "search nodes", "median", "p90", "max"):
            table.add_column(col, justify="left" if col in ("tampering", "rejected by") else "right")
        order = {name: i for i, name in enumerate(TAMPERINGS)}
        for r in sorted(rejections, key=lambda r: (not r["prechecks"], order[r["tampering"]], r["ranks"])):
            table.add_row(r["tampering"], r["rejected_by"], r["world"], str(r["ranks"]), str(r["nodes"]),
                          f"{r['median_s']:.3f}", f"{r['p90_s']:.3f}", f"{r['max_s']:.3f}")
        console.print(table)
    if args.json:
        top = max(rows, key=lambda r: r["ranks"]) if rows else None
        at_top = [r for r in rejections if top and r["world"] == top["world"]]
        headline: dict[str, Any] = {}
        if top:
            headline = {"world": top["world"], "ranks": top["ranks"], "accept_s_median": top["median_s"]}
            if at_top:
                headline["reject_s_max"] = max(r["max_s"] for r in at_top)
        with open(args.json, "w") as f:
            json.dump({"benchmark": "check", "quick": False, "meta": _meta(),
                       "config": {"worlds": args.worlds, "repeat": args.repeat, "tamper": tamper, "search_only": search_only},
                       "results": rows, "rejections": rejections, "headline": headline, "headline_reasons": {}}, f, indent=1)
    return 0
