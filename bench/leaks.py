"""``accelpact bench leaks``: what ten (``--repairs``) successive in-place repairs leave behind.

Each rank builds its job as the worker does (control group, recorded workload groups, the
workload's wrapped model, ``attach``), trains one fault-free step, then fails R at the boundary of
every following step (``collective_timeout`` injected through the engine's test hooks, fenced so
that every rank has committed first), so that each step is one repair.  After attach and after each
repair it records, per rank:

* ``threads``: native threads (``/proc/self/task``), gloo's worker threads included;
* ``fds``: open file descriptors (``/proc/self/fd``), the groups' sockets included;
* ``groups``: process groups registered with c10d (``_world.pg_map``);
* ``rss_mb``: resident set size.

Reported: the values after attach, after the first and after the last repair, and the growth from
the first to the last repair (the first repair may retire what only generation 0 holds; a leak
shows as growth per repair).  Like ``tests/test_impl_recovery.py::test_ten_repairs_no_leak``, but
through the worker's own group layout and for every wrapper, and with RSS.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from . import common
from accelpact.impl.hooks import Hooks
from accelpact.impl.launch import workload
from accelpact.impl.runtime.wrappers import wrapper as wrapper_of
from accelpact.testing.faults import FaultInjector, FaultPlan
import accelpact

__all__ = ["add_arguments", "run", "leaks_rank"]

LAYOUT = common.LAYOUT


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "leaks", plot=True)
    p.add_argument("--repairs", type=int, default=10, help="successive repairs (default 10)")
    p.add_argument("--wrappers", default=None, help="comma-separated (default ddp,fsdp1-hybrid,fsdp2-hybrid; quick ddp); "
                                                     "ddp runs 1x2, the hybrid wrappers 2x2")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each launch, seconds")


def _measure(tag: Any) -> dict[str, Any]:
    import torch.distributed as dist

    return {"after": tag, "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "groups": len(dist.distributed_c10d._world.pg_map), "rss_mb": common.rss_kb() / 1024}


def leaks_rank(ctx, wrapper: str, nodes: int, ranks_per_node: int, repairs: int, deadline_s: float = 15.0) -> dict:
    """Rank function (``init_group=False``: it builds its job with ``accelpact.init``): the measurements after attach and after each repair."""


    job = accelpact.init("gloo", replicas=nodes, deadline_s=deadline_s, collective_timeout_s=60.0)
    topo = job.topology
    spec = workload.WorkloadSpec(wrapper=wrapper, layers=2, dim=16, heads=2, seq=8, batch=2)
    app = workload.build_job(spec, topo, workload.groups_of(job))
    kind = wrapper_of(wrapper).recovers
    members = topo.group(kind, ranks_per_node - 1 if kind == "replicate" else 0)
    faults = [{"step": s, "at": "boundary", "kind": "collective_timeout", "ranks": [members[s % len(members)]], "group": kind}
              for s in range(1, repairs + 1)]
    hooks = Hooks(injector=FaultInjector(FaultPlan.from_list(faults), fenced_points=("boundary",)))
    training = job.attach(app.module, app.optimizer, hooks=hooks)
    assert training is not None  # a training rank (no spares here)
    pact = training.pact
    setattr(app.groups, kind, None)  # as the worker: the engine owns R, nothing else keeps generation 0's
    rows = []
    for step in range(repairs + 2):
        with pact.step(step):
            loss = workload.train_step(app, step)
        rep = pact.boundary(loss)
        if step == 0:
            rows.append(_measure("attach"))
        elif rep is not None:
            pact.wait_retired()  # the replaced group is destroyed off the repair's path, a few tens of ms later
            rows.append({**_measure(len(pact.reports)), "total_ms": rep.total_ns / 1e6})
    job.close()  # nobody leaves before everyone is done
    return {"rank": job.rank, "gen": pact.gen, "rows": rows}


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        wrappers = common.parse_list(args.wrappers, str) if args.wrappers else (["ddp"] if args.quick else list(LAYOUT))
    except ValueError as exc:
        print(f"accelpact bench leaks: error: {exc}", file=sys.stderr)
        return 2
    if args.repairs < 2 or any(w not in LAYOUT for w in wrappers):
        print(f"accelpact bench leaks: error: --repairs >= 2; --wrappers from {', '.join(LAYOUT)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    table = []
    ok = True
    for w in wrappers:
        n, m = LAYOUT[w]
        print(f"leaks: {w} {n}x{m}, {args.repairs} repairs", flush=True)
        try:
            res = common.rank_values(leaks_rank, n * m, f"{args.out}/{w}", timeout_s=args.timeout, init_group=False, wrapper=w, nodes=n,
                                     ranks_per_node=m, repairs=args.repairs)
        except common.BenchError as exc:
            print(f"accelpact bench leaks: {exc}", file=sys.stderr)
            return 1
        per_rank = []
        for r in res:
            rows = r["rows"]
            first, last = rows[1], rows[-1]
            growth = {k: last[k] - first[k] for k in ("threads", "fds", "groups", "rss_mb")}
            per_rank.append({"rank": r["rank"], "generation": r["gen"], "attach": rows[0], "first": first, "last": last,
                             "growth_first_to_last": growth, "rows": rows,
                             "repair_total_ms": common.stats([x["total_ms"] for x in rows[1:]])})
            ok = ok and r["gen"] == args.repairs
            table.append([w, r["rank"], r["gen"]] + [f"{rows[0][k]:g}/{first[k]:g}/{last[k]:g}" for k in ("threads", "fds", "groups")]
                         + [f"{rows[0]['rss_mb']:.0f}/{first['rss_mb']:.0f}/{last['rss_mb']:.0f}",
                            " ".join(f"{k}{v:+.4g}" for k, v in growth.items())])
        results[w] = {"topology": f"{n}x{m}", "ranks": per_rank,
                      "max_growth": {k: max(p["growth_first_to_last"][k] for p in per_rank)
                                     for k in ("threads", "fds", "groups", "rss_mb")}}
    common.print_table(f"after attach / first repair / repair {args.repairs}, per rank",
                       ["wrapper", "rank", "gen", "threads", "fds", "groups", "RSS MB", f"growth repair 1 -> {args.repairs}"], table)
    if getattr(args, "plot", None):
        series = {}
        for w in wrappers:
            rows = results[w]["ranks"][0]["rows"]
            xs = list(range(len(rows)))
            series[f"{w} r0 threads"] = (xs, [x["threads"] for x in rows])
            series[f"{w} r0 fds"] = (xs, [x["fds"] for x in rows])
            series[f"{w} r0 RSS MB"] = (xs, [x["rss_mb"] for x in rows])
        common.line_plot(args.plot, "threads, fds and RSS of rank 0 after attach (0) and after each repair", "repairs",
                         "count / MB", series)
    headline = {f"{w}_max_growth_{k}": results[w]["max_growth"][k] for w in wrappers for k in ("threads", "fds", "groups", "rss_mb")}
    common.write_result(args, "leaks", {"wrappers": wrappers, "repairs": args.repairs}, results, headline, None, t0)
    return 0 if ok else 1
