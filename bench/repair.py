"""``accelpact bench repair``: the L1 repair phase by phase, per world, with the tail over many repairs.

For each world (``--worlds``, default 2x2, 4x2, 4x4) one job of the worker (``run_local``: the
launcher hosts the store; no torchrun agent, no restart) fails R at the boundary of every step
from step 1 on (``collective_timeout`` on one member of the last replicate group), ``--repairs``
times (default 100 at 2x2 for the tail, 20 at 4x2, 10 at 4x4), each repaired in place.  The
phases of each repair come from the ranks' recovery reports (the slowest rank per phase:
``launch.l1_episodes``); fault-to-frontier from the traces (first ``Fault*`` record to the last
``RankResume``).

Phases (``RecoveryReport``): observe (boundary collective start -> failure seen), agree (guard +
contract + frontier agreement), rebuild (phase 4, a new gloo group), rebind (phase 5), validate
(phase 6), release (ready vote -> decision), retire (dropping the old group), total (observed ->
resumed).  4x4 is 16 processes on this 2-core machine: only in the full run, and its times say more
about the scheduler than about the protocol.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from . import common
from accelpact.impl.launch.job import Job, Topology, Workload
from accelpact.impl.launch.launch import PHASES, l1_episodes, run_local
from accelpact.impl.runtime.wrappers import wrapper as wrapper_of

__all__ = ["add_arguments", "run", "measure_world"]

DEFAULT_WORLDS = "2x2,4x2,4x4"
DEFAULT_REPAIRS = "100,20,10"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "repair")
    p.add_argument("--worlds", default=None, help=f"comma-separated NODESxRANKS_PER_NODE (default {DEFAULT_WORLDS}; quick 2x2)")
    p.add_argument("--repairs", default=None, help=f"repairs per world, comma-separated, one per world or one for all "
                                                  f"(default {DEFAULT_REPAIRS}; quick 3)")
    p.add_argument("--wrapper", default="fsdp1-hybrid", help="the workload's wrapper (default %(default)s)")
    p.add_argument("--layers", type=int, default=2, help="wrapped layers of the workload (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900.0, help="bound on each launch, seconds")


def measure_world(nodes: int, rpn: int, repairs: int, wrapper: str, layers: int, out: Path, timeout: float) -> dict[str, Any]:
    """One job with ``repairs`` boundary failures of R, each repaired in place; per-phase statistics (ms)."""
    kind = wrapper_of(wrapper).recovers
    topo = Topology(nodes, rpn)
    members = topo.group(kind, rpn - 1 if kind == "replicate" else 0)
    victim = members[-1]
    faults = [{"step": s, "at": "boundary", "kind": "collective_timeout", "ranks": [victim], "group": kind}
              for s in range(1, repairs + 1)]
    job = Job(topology=topo, workload=Workload(wrapper, layers, repairs + 2, 0, 0), out=str(out),
              scenario=f"bench-repair-{nodes}x{rpn}", backend="gloo", trace=True, deadline_s=30.0,
              collective_timeout_s=60.0).replace(faults=faults)
    t0 = time.monotonic()
    res = run_local(job, timeout_s=timeout)
    wall = time.monotonic() - t0
    eps = l1_episodes(res)
    phases = {ph: common.stats([e["phases_s"][ph] for e in eps], 1e3) for ph in PHASES}
    return {"world": f"{nodes}x{rpn}", "ranks": nodes * rpn, "repairs_asked": repairs, "repairs": len(eps), "ok": res.ok(),
            "returncode": res.returncode, "log": str(res.log), "wall_s": wall, "victim": victim, "group": kind,
            "phases_ms": phases, "fault_to_frontier_ms": common.stats([e["fault_to_frontier_s"] for e in eps], 1e3),
            "totals_ms": [e["phases_s"]["total"] * 1e3 for e in eps],
            "refs_rebound": max((e["refs_rebound"] for e in eps), default=0)}


def _plot(path: str, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ("observe", "agree", "rebuild", "rebind", "validate", "release", "retire", "total")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(parts)
    for i, ph in enumerate(parts):
        xs = [j + (i - len(parts) / 2) * width + width / 2 for j in range(len(rows))]
        ax1.bar(xs, [r["phases_ms"][ph]["median"] or 0.0 for r in rows], width, label=ph,
                color="black" if ph == "total" else None)
    ax1.set_xticks(range(len(rows)), [f"{r['world']}\n({r['repairs']} repairs)" for r in rows])
    ax1.set_ylabel("milliseconds (median, slowest rank per phase)")
    ax1.set_title("L1 repair by phase (phases overlap across ranks: release includes the\n"
                  "non-members' wait for phases 4-6; gloo CPU, loopback, 2 shared cores)", fontsize=8)
    ax1.legend(fontsize=7)
    big = max(rows, key=lambda r: r["repairs"])
    ax2.hist(big["totals_ms"], bins=30, color="tab:blue")
    ax2.set_xlabel("repair total (ms)")
    ax2.set_ylabel("repairs")
    ax2.set_title(f"{big['world']}: {big['repairs']} repairs, distribution of the total", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}", flush=True)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        worlds = common.parse_worlds(args.worlds or ("2x2" if args.quick else DEFAULT_WORLDS), 2,
                                     "the hybrid wrappers need at least 2 nodes")
        counts = common.parse_list(args.repairs or ("3" if args.quick else DEFAULT_REPAIRS))
    except ValueError as exc:
        print(f"accelpact bench repair: error: {exc}", file=sys.stderr)
        return 2
    if len(counts) == 1:
        counts = counts * len(worlds)
    if len(counts) != len(worlds) or any(c < 1 for c in counts):
        print("accelpact bench repair: error: --repairs: one count >= 1 per world (or one for all)", file=sys.stderr)
        return 2
    rows = []
    for (n, m), c in zip(worlds, counts, strict=True):
        print(f"repair: {args.wrapper} {n}x{m} ({n * m} processes), {c} boundary failures repaired in place", flush=True)
        rows.append(measure_world(n, m, c, args.wrapper, args.layers, Path(args.out).resolve() / f"{n}x{m}", args.timeout))
        r = rows[-1]
        if not r["ok"] or r["repairs"] != c:
            print(f"[{n}x{m}] incomplete: {r['repairs']}/{c} repairs, rc={r['returncode']}; see {r['log']}", file=sys.stderr)
    ph_rows = []
    for r in rows:
        for ph in ("observe", "agree", "rebuild", "rebind", "validate", "release", "retire", "total"):
            s = r["phases_ms"][ph]
            ph_rows.append([f"{r['world']} {ph}", s["n"], common.fmt(s["median"]), common.fmt(s["p90"]), common.fmt(s["p99"]),
                            common.fmt(s["max"])])
        s = r["fault_to_frontier_ms"]
        ph_rows.append([f"{r['world']} fault->frontier", s["n"], common.fmt(s["median"]), common.fmt(s["p90"]),
                        common.fmt(s["p99"]), common.fmt(s["max"])])
    common.print_table(f"L1 repair by phase ({args.wrapper}, gloo CPU): milliseconds, slowest rank per phase",
                       ["world / phase", "n", "median", "p90", "p99", "max"], ph_rows)
    if getattr(args, "plot", None) and any(r["repairs"] for r in rows):
        _plot(args.plot, [r for r in rows if r["repairs"]])
    headline: dict[str, Any] = {"repair_total_ms_median_2x2": None, "repair_total_ms_max_100": None,
                                "repair_fault_to_frontier_ms_median_2x2": None}
    reasons: dict[str, str] = {}
    r22 = next((r for r in rows if r["world"] == "2x2" and r["repairs"]), None)
    if r22 is None:
        reasons["repair_total_ms_median_2x2"] = "no completed 2x2 run"
        reasons["repair_fault_to_frontier_ms_median_2x2"] = "no completed 2x2 run"
    else:
        headline["repair_total_ms_median_2x2"] = r22["phases_ms"]["total"]["median"]
        headline["repair_fault_to_frontier_ms_median_2x2"] = r22["fault_to_frontier_ms"]["median"]
        headline["repairs_2x2"] = r22["repairs"]
    r100 = next((r for r in rows if r["world"] == "2x2" and r["repairs"] >= 100), None)
    if r100 is None:
        reasons["repair_total_ms_max_100"] = "no 2x2 run with 100 repairs here" + (f" (2x2: {r22['repairs']})" if r22 else "")
    else:
        headline["repair_total_ms_max_100"] = r100["phases_ms"]["total"]["max"]
    common.write_result(args, "repair", {"worlds": [f"{n}x{m}" for n, m in worlds], "repairs": counts,
                                         "wrapper": args.wrapper, "layers": args.layers, "launcher": "run_local"},
                        rows, headline, reasons, t0)
    complete = all(r["ok"] and r["repairs"] == r["repairs_asked"] for r in rows)
    return 0 if complete else 1
