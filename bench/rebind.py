"""``accelpact bench rebind``: phase 5 (rebind every cached reference, then verify) versus the depth L.

For each wrapper (FSDP1 HYBRID_SHARD, FSDP2 HSDP, DDP) and each number of wrapped layers L, one
launch of two processes (topology 1x2: one node of two ranks, gloo, the launcher-hosted store; FSDP
clamps HYBRID_SHARD to NO_SHARD when the shard group has one rank, so one process alone would not
measure the hybrid wrappers; R is then each rank's one-rank replicate group for FSDP1/FSDP2 and the
two-rank world for DDP: the work is per cached reference, not per peer) builds the workload model,
trains one step (lazy initialisation creates some of the references), then times what the engine's
``Pact.rebind`` does, called directly on the same objects (rank 0's times are reported):

* ``discover``: the adapter's targeted list of sites (the engine does it once, at attach);
* ``rebind``: ``adapter.rebind(module, sites, old, new)`` (write every site, move the c10d name),
  each right after a walker verification (cold caches: the walk touches the whole object graph);
  ``rebind_warm``: the same rebinds back to back, as phase 5 makes them (no walk before it: the
  engine verifies its known sites), the headline figure;
* ``verify``: ``adapter.verify(...)``, the generic walker over the whole module graph finding no
  reference to the old group (the check of invariant S5);
* ``phase5_bare`` = rebind + verify on the wrapped module alone;
* ``phase5``: the engine's own phase 5, ``Pact.rebind`` (rebind + the O(sites) check of the known
  sites, :meth:`Adapter.verify_sites`, + its trace record) with the engine attached to the module as
  in a job; ``verify_attached`` is a walker verification of that graph (everything the guard's hooks
  reach: the pact, its watchdog, control plane, sites ...), timed alone.

The replacement group is built as phase 4 builds it (``ReplaceAndRebind.replace``), and rebinding
alternates between the old and the new group (discover once, rebind many), ``--repeat`` times.
The process trains one more step at the end: the references still work.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from accelpact.impl.runtime.wrappers import WRAPPER_NAMES

from . import common
from accelpact.impl.controlplane import ControlPlane
from accelpact.impl.launch import workload as W
from accelpact.impl.launch.api import build_recorded_groups, pact_groups
from accelpact.impl.recovery import attach
from accelpact.impl.runtime.adapters import adapter_for, find_references
from accelpact.impl.runtime.replace import ReplaceAndRebind
from accelpact.impl.trace import Trace

__all__ = ["add_arguments", "run", "rebind_rank"]

HEADLINE_WRAPPER = "fsdp1-hybrid"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "rebind")
    p.add_argument("--layers", default=None, help="comma-separated L (default 2,8,32,128; quick 2)")
    p.add_argument("--wrappers", default=",".join(WRAPPER_NAMES), help="comma-separated wrappers (default %(default)s)")
    p.add_argument("--repeat", type=int, default=None, help="timed rebinds per (wrapper, L) (default 30; quick 3)")
    p.add_argument("--timeout", type=float, default=900.0, help="bound on the measuring process, seconds")


def rebind_rank(ctx, wrappers: list[str], layers: list[int], repeat: int) -> list[dict]:
    """Rank function (topology 1x2): the measurements, one row per (wrapper, L)."""
    import datetime

    import torch.distributed as dist

    rows: list[dict] = []
    topo = W.Topology(1, ctx.world)
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    for wrapper in wrappers:
        for L in layers:
            spec = W.WorkloadSpec(wrapper=wrapper, layers=L, dim=16, heads=2, seq=8, batch=2)
            groups, records = build_recorded_groups(W, topo, ctx.rank, "gloo", datetime.timedelta(seconds=60))
            job = W.build_job(spec, topo, groups)
            t = time.perf_counter()
            W.train_step(job, 0)
            step_s = time.perf_counter() - t
            old = W.r_group(spec, groups)
            adapter = adapter_for(job.module)
            discover = []
            for _ in range(max(3, repeat // 5)):
                t = time.perf_counter()
                sites = adapter.discover(job.module, old)
                discover.append(time.perf_counter() - t)
            walker_refs = len(find_references(job.module, old))
            members = W.r_ranks(spec, groups)
            new = ReplaceAndRebind("bench/rebind/").replace(old, 1, members, ctx.rank, ctx.store, 60.0,
                                                             name=f"{wrapper}-L{L}-{members[0]}")
            # bare: the adapter on the wrapped module alone (no engine attached)
            rebind, verify, phase5 = [], [], []
            cur, nxt = old, new
            ok = True
            for _ in range(repeat):
                t0 = time.perf_counter()
                adapter.rebind(job.module, sites, cur, nxt)
                t1 = time.perf_counter()
                check = adapter.verify(job.module, sites, cur, nxt)
                t2 = time.perf_counter()
                ok = ok and check.ok
                rebind.append(t1 - t0)
                verify.append(t2 - t1)
                phase5.append(t2 - t0)
                cur, nxt = nxt, cur
            if cur is not old:
                adapter.rebind(job.module, sites, cur, old)
            # warm: rebinds back to back, as phase 5 writes them (the loop above runs each one right
            # after a walker pass over the whole object graph, which the engine's phase 5 does not
            # make: that leaves the caches cold and costs 5-7x, measured)
            warm = []
            cur, nxt = old, new
            for _ in range(repeat):
                t0 = time.perf_counter()
                adapter.rebind(job.module, sites, cur, nxt)
                warm.append(time.perf_counter() - t0)
                cur, nxt = nxt, cur
            if cur is not old:
                adapter.rebind(job.module, sites, cur, old)
            # attached: the engine's own phase 5 (Pact.rebind) with the engine attached, as in a job:
            # the walker then also walks what the guard's hooks reach (the pact and what it holds)
            pg = pact_groups(topo, ctx.rank, wrapper, control, vars(groups), records)
            # traced (one record per rebind, as in a traced job): an unexpected exit leaves its reason
            trace = Trace(ctx.out / f"engine-{wrapper}-L{L}-r{ctx.rank}.ndjson", ctx.rank, {"bench": "rebind"})
            # detect=False: this measures phase 5 alone; its walker-verified column ("verify_attached")
            # holds one rank in Python for seconds at L=128 under load, which the heartbeat detector of
            # the peer may take for a dead rank (spec/detection.md)
            pact = attach(job.module, job.optimizer, groups=pg, deadline_s=60.0, trace=trace, detect=False,
                          control=ControlPlane(ctx.store, ctx.rank, ctx.world, prefix=f"bench/rebind/{wrapper}{L}/"))
            engine, engine_verify = [], []
            nxt = new
            for _ in range(repeat):
                prev = pact.process_group
                t0 = time.perf_counter()
                pact.rebind(nxt)  # phase 5 (RankRebind); raises RebindError on a stale reference
                t1 = time.perf_counter()
                check = adapter.verify(job.module, pact.sites, prev, nxt)
                t2 = time.perf_counter()
                ok = ok and check.ok
                engine.append(t1 - t0)
                engine_verify.append(t2 - t1)
                nxt = prev
                del prev
            W.train_step(job, 1)  # the rebound references still work
            pact.close()
            trace.close()
            rows.append({"wrapper": wrapper, "layers": L, "sites": len(sites), "walker_refs": walker_refs,
                         "verified": ok, "step_ms": step_s * 1e3, "discover_ms": common.stats(discover, 1e3),
                         "rebind_us": common.stats(rebind, 1e6), "rebind_warm_us": common.stats(warm, 1e6), "verify_ms": common.stats(verify, 1e3),
                         "phase5_bare_ms": common.stats(phase5, 1e3),
                         "phase5_ms": common.stats(engine, 1e3), "verify_attached_ms": common.stats(engine_verify, 1e3)})
            del job, adapter, sites, old, new, cur, nxt, groups, records, pact, pg
            dist.barrier()
    return rows


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        layers = common.parse_list(args.layers) if args.layers else ([2] if args.quick else [2, 8, 32, 128])
        wrappers = common.parse_list(args.wrappers, str)
    except ValueError as exc:
        print(f"accelpact bench rebind: error: {exc}", file=sys.stderr)
        return 2
    bad = [w for w in wrappers if w not in WRAPPER_NAMES]
    if bad or not wrappers or any(L < 1 for L in layers):
        print(f"accelpact bench rebind: error: --wrappers from {', '.join(WRAPPER_NAMES)}; --layers >= 1", file=sys.stderr)
        return 2
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 30)
    if repeat < 1:
        print("accelpact bench rebind: error: --repeat must be >= 1", file=sys.stderr)
        return 2
    print(f"rebind: {', '.join(wrappers)} x L={layers}, {repeat} rebinds each, 2 processes (1x2, gloo)", flush=True)
    try:
        rows = common.rank_values(rebind_rank, 2, args.out, timeout_s=args.timeout, wrappers=wrappers, layers=layers,
                                  repeat=repeat)[0]
    except common.BenchError as exc:
        print(f"accelpact bench rebind: {exc}", file=sys.stderr)
        return 1
    common.print_table("phase 5 (rebind + verify) versus layers, rank 0 of 1x2, CPU",
                       ["wrapper", "L", "sites", "discover ms", "rebind us warm med", "p90",
                        "rebind us after walk med", "p90", "p99", "max",
                        "verify ms (bare)", "phase5 ms (bare)", "engine phase5 ms med", "p90", "p99", "max",
                        "verify ms (attached)", "ok"],
                       [[r["wrapper"], r["layers"], r["sites"], common.fmt(r["discover_ms"]["median"]),
                         common.fmt(r["rebind_warm_us"]["median"]), common.fmt(r["rebind_warm_us"]["p90"]),
                         common.fmt(r["rebind_us"]["median"]), common.fmt(r["rebind_us"]["p90"]),
                         common.fmt(r["rebind_us"]["p99"]), common.fmt(r["rebind_us"]["max"]),
                         common.fmt(r["verify_ms"]["median"]), common.fmt(r["phase5_bare_ms"]["median"]),
                         common.fmt(r["phase5_ms"]["median"]), common.fmt(r["phase5_ms"]["p90"]),
                         common.fmt(r["phase5_ms"]["p99"]), common.fmt(r["phase5_ms"]["max"]),
                         common.fmt(r["verify_attached_ms"]["median"]), r["verified"]]
                        for r in rows])
    headline: dict[str, Any] = {"rebind_us_median_L32": None, "phase5_ms_median_L32": None}
    reasons: dict[str, str] = {}
    row = next((r for r in rows if r["wrapper"] == HEADLINE_WRAPPER and r["layers"] == 32), None)
    if row is None:
        reasons["rebind_us_median_L32"] = reasons["phase5_ms_median_L32"] = \
            f"no {HEADLINE_WRAPPER} run at L=32 here (layers {layers}, wrappers {wrappers})"
    else:
        headline["rebind_us_median_L32"] = row["rebind_warm_us"]["median"]
        headline["rebind_us_median_L32_after_walk"] = row["rebind_us"]["median"]
        headline["phase5_ms_median_L32"] = row["phase5_ms"]["median"]
        headline["wrapper"] = HEADLINE_WRAPPER
    if getattr(args, "plot", None):
        series = {f"{w} engine phase 5": ([r["layers"] for r in rows if r["wrapper"] == w],
                                          [r["phase5_ms"]["median"] for r in rows if r["wrapper"] == w]) for w in wrappers}
        series.update({f"{w} phase 5 bare": ([r["layers"] for r in rows if r["wrapper"] == w],
                                             [r["phase5_bare_ms"]["median"] for r in rows if r["wrapper"] == w]) for w in wrappers})
        series.update({f"{w} rebind only": ([r["layers"] for r in rows if r["wrapper"] == w],
                                            [r["rebind_us"]["median"] / 1e3 for r in rows if r["wrapper"] == w])
                       for w in wrappers})
        common.line_plot(args.plot, "phase 5 versus layers (median): engine, bare module, rebind writes only",
                         "wrapped layers L", "milliseconds", series, logx=True, logy=True)
    common.write_result(args, "rebind", {"wrappers": wrappers, "layers": layers, "repeat": repeat, "topology": "1x2",
                                         "model": "CharLM dim 16, 2 heads, seq 8, batch 2"},
                        rows, headline, reasons, t0)
    return 0 if all(r["verified"] for r in rows) else 1
