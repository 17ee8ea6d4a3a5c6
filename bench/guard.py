"""``accelpact bench guard``: the engine's fault-free cost per step, paired in the same processes.

Each rank builds its groups as the worker does and two identical copies of the workload's model on
them: ``on`` is attached to the engine (guard hooks, ``with pact.step(...)``, ``pact.boundary``:
the post-commit collective on R and the failure flag over W, the watchdog's step deadline), ``off``
trains with the plain loop (forward, backward, ``optimizer.step()``, ``zero_grad``).  Blocks of
``--block-steps`` steps alternate ``on``/``off`` inside the same processes (the order flips every
block, after a warm-up of each), so drift of the shared machine hits both arms alike.

Reported: per-step medians (p90, p99, max) of both arms, the overhead = median(on) - median(off)
in ms and in % of median(off), with a 95% bootstrap confidence interval that resamples whole
blocks (each block holds one run of each arm: the pairing), and the per-block differences; and
the engine's pieces of each ``on`` step timed inside it (entering and leaving ``pact.step``, and
``pact.boundary``: the probe on R and the flag over W; with ``--fence``, the commit fence of a job that discards in
place, P17.2), which the step-to-step noise of the arms does not blur.  The default model makes a step take about 100 ms or more here
(``--dim 192 --layers 4 --seq 64 --batch 8``); ``--quick`` uses a tiny one (steps of a few ms: the
percentage then says little).

Why two model copies: the engine has no detach or pause (``Pact.close`` ends the job's trace and
cannot be undone), so the same module cannot run with and without it in alternation; a
``Pact.pause()``/``resume()`` that removes and reinstalls the guard hooks and skips the boundary
would let the benchmark pair the very same module.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from . import common
from accelpact.impl.launch import workload
import accelpact

__all__ = ["add_arguments", "run", "guard_rank"]

LAYOUT = common.LAYOUT


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "guard")
    p.add_argument("--wrapper", default="ddp", choices=list(LAYOUT),
                   help="ddp runs 1x2 (two processes on the two cores; default), the hybrid wrappers 2x2")
    p.add_argument("--dim", type=int, default=None, help="model width (default 192; quick 64)")
    p.add_argument("--layers", type=int, default=None, help="layers (default 4; quick 2)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 64; quick 32)")
    p.add_argument("--batch", type=int, default=None, help="batch per rank (default 8; quick 4)")
    p.add_argument("--blocks", type=int, default=None, help="blocks per arm (default 20; quick 4)")
    p.add_argument("--block-steps", type=int, default=None, help="steps per block (default 10; quick 4)")
    p.add_argument("--fence", action="store_true",
                   help="the on arm is a job that discards in place (attach(rebuild=...)): its engine passes the commit "
                        "fence, an all-reduce over all of W, as each optimizer.step() starts (P17.2), timed as its own piece")
    p.add_argument("--timeout", type=float, default=1200.0, help="bound on the launch, seconds")


def guard_rank(ctx, wrapper: str, nodes: int, rpn: int, dim: int, layers: int, seq: int, batch: int, blocks: int,
               block_steps: int, warmup: int = 3, fence: bool = False) -> dict:
    """Rank function (``init_group=False``: it builds its job with ``accelpact.init``): per-step seconds of both arms, with their block index."""


    job = accelpact.init("gloo", replicas=nodes, deadline_s=30.0, collective_timeout_s=120.0)
    topo = job.topology
    assert topo.ranks_per_node == rpn, (topo, rpn)
    groups = workload.groups_of(job)
    spec = workload.WorkloadSpec(wrapper=wrapper, layers=layers, dim=dim, heads=4 if dim % 4 == 0 else 2, seq=seq, batch=batch)
    on = workload.build_job(spec, topo, groups)
    off = workload.build_job(spec, topo, groups)
    training = job.attach(on.module, on.optimizer)
    assert training is not None  # a training rank (no spares here)
    pact = training.pact
    steps = {"on": 0, "off": 0}
    pieces: dict[str, list[float]] = {"enter": [], "exit": [], "boundary": [], "fence": []}
    if fence:
        # the engine of a job attached with rebuild= (what attach sets from it): it fences every commit;
        # the fence is timed as it runs, inside optimizer.step()'s pre-hook
        fence_of = pact._fence

        def timed_fence() -> None:
            t = time.perf_counter()
            fence_of()
            pieces["fence"].append(time.perf_counter() - t)

        pact.discard = True
        pact._fence = timed_fence
    else:  # the engine without the fence, as a job that cannot discard runs it (attach discards FSDP2 and DDP in place)
        pact.discard = False

    def one(arm: str) -> float:
        s = steps[arm]
        t = time.perf_counter()
        if arm == "on":
            ctx = pact.step(s)
            ctx.__enter__()
            t1 = time.perf_counter()
            loss = workload.train_step(on, s)
            t2 = time.perf_counter()
            ctx.__exit__(None, None, None)
            t3 = time.perf_counter()
            pact.boundary(loss)
            t4 = time.perf_counter()
            pieces["enter"].append(t1 - t)
            pieces["exit"].append(t3 - t2)
            pieces["boundary"].append(t4 - t3)
        else:
            workload.train_step(off, s)
        steps[arm] = s + 1
        return time.perf_counter() - t

    for _ in range(warmup):
        one("on")
        one("off")
    times: dict[str, list[tuple[int, float]]] = {"on": [], "off": []}
    for b in range(blocks):
        for arm in (("on", "off") if b % 2 == 0 else ("off", "on")):
            for _ in range(block_steps):
                times[arm].append((b, one(arm)))
    job.close()
    return {"rank": ctx.rank, "times": times, "repairs": len(pact.reports), "pieces": pieces}


def _block_bootstrap(on_by: dict[int, list[float]], off_by: dict[int, list[float]], n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """95% CI of median(on) - median(off), resampling whole blocks (each block holds both arms)."""
    rng = random.Random(seed)
    keys = list(on_by)
    out = []
    for _ in range(n_boot):
        pick = [keys[rng.randrange(len(keys))] for _ in keys]
        out.append(statistics.median([t for b in pick for t in on_by[b]]) - statistics.median([t for b in pick for t in off_by[b]]))
    out.sort()
    return out[int(0.025 * (n_boot - 1))], out[int(0.975 * (n_boot - 1))]


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    q = args.quick
    dim = args.dim or (64 if q else 192)
    layers = args.layers or (2 if q else 4)
    seq = args.seq or (32 if q else 64)
    batch = args.batch or (4 if q else 8)
    blocks = args.blocks or (4 if q else 20)
    block_steps = args.block_steps or (4 if q else 10)
    if min(dim, layers, seq, batch, blocks, block_steps) < 1 or seq < 2 or blocks < 2:
        print("accelpact bench guard: error: sizes >= 1, --seq >= 2, --blocks >= 2", file=sys.stderr)
        return 2
    n, m = LAYOUT[args.wrapper]
    print(f"guard: {args.wrapper} {n}x{m}, model dim {dim} x {layers} layers, seq {seq}, batch {batch}; "
          f"{blocks} blocks x {block_steps} steps per arm, alternating", flush=True)
    try:
        res = common.rank_values(guard_rank, n * m, args.out, timeout_s=args.timeout, init_group=False, wrapper=args.wrapper, nodes=n, rpn=m,
                                 dim=dim, layers=layers, seq=seq, batch=batch, blocks=blocks, block_steps=block_steps,
                                 fence=args.fence)
    except common.BenchError as exc:
        print(f"accelpact bench guard: {exc}", file=sys.stderr)
        return 1
    # the slowest rank per step (the ranks are in lockstep: every step ends with collectives)
    arms = {}
    for arm in ("on", "off"):
        per_step = list(zip(*[r["times"][arm] for r in res], strict=True))
        arms[arm] = [(xs[0][0], max(t for _, t in xs)) for xs in per_step]
    on_all = [t for _, t in arms["on"]]
    off_all = [t for _, t in arms["off"]]
    on_by = {b: [t for bb, t in arms["on"] if bb == b] for b in range(blocks)}
    off_by = {b: [t for bb, t in arms["off"] if bb == b] for b in range(blocks)}
    diffs = [statistics.median(on_by[b]) - statistics.median(off_by[b]) for b in range(blocks)]
    med_on, med_off = statistics.median(on_all), statistics.median(off_all)
    lo, hi = _block_bootstrap(on_by, off_by)
    result = {
        "on_ms": common.stats(on_all, 1e3), "off_ms": common.stats(off_all, 1e3),
        "overhead_ms": (med_on - med_off) * 1e3, "overhead_pct": (med_on - med_off) / med_off * 100,
        # the blocks are the pairs: resampling blocks keeps each on-block with its off-block
        "overhead_ci95_ms": [lo * 1e3, hi * 1e3], "overhead_ci95_pct": [lo / med_off * 100, hi / med_off * 100],
        "block_diffs_ms": [d * 1e3 for d in diffs], "block_diff_median_ms": statistics.median(diffs) * 1e3,
        "repairs": [r["repairs"] for r in res], "step_ms_target_met": med_off >= 0.1,
        # the engine's own pieces of an "on" step, timed inside it (every rank, every step): what the
        # protocol costs per step, without the arms' step-to-step noise
        "pieces_ms": {k: common.stats((x for r in res for x in r["pieces"][k]), 1e3)
                      for k in ("enter", "exit", "boundary", *(("fence",) if args.fence else ()))},
    }
    # The boundary is a synchronisation point: a rank that arrives early waits there for the last
    # one, time the step would have spent waiting at the next collective anyway.  The last arriver
    # (the rank with the shortest boundary in that step) pays only the protocol's own latency: the
    # probe on R and the flag over W, on the step's critical path.
    result["pieces_ms"]["boundary_last_arriver"] = common.stats(
        (min(xs) for xs in zip(*[r["pieces"]["boundary"] for r in res], strict=True)), 1e3)
    common.print_table(f"engine on versus off, fault-free ({args.wrapper} {n}x{m}, slowest rank per step): milliseconds",
                       ["arm", "steps", "median", "p90", "p99", "max"],
                       [[a, result[f"{a}_ms"]["n"], common.fmt(result[f"{a}_ms"]["median"]), common.fmt(result[f"{a}_ms"]["p90"]),
                         common.fmt(result[f"{a}_ms"]["p99"]), common.fmt(result[f"{a}_ms"]["max"])] for a in ("on", "off")])
    common.print_table("the engine's pieces of a step (every rank, every on step): milliseconds",
                       ["piece", "n", "median", "p90", "p99", "max"],
                       [[k, v["n"], common.fmt(v["median"], digits=3), common.fmt(v["p90"], digits=3), common.fmt(v["p99"], digits=3),
                         common.fmt(v["max"], digits=3)] for k, v in result["pieces_ms"].items()])
    pm = result["pieces_ms"]
    pieces_med = sum(pm[k]["median"] or 0.0 for k in ("enter", "exit", "boundary_last_arriver", *(("fence",) if args.fence else ())))
    result["pieces_pct_of_off_step"] = pieces_med / (med_off * 1e3) * 100
    print(f"on the critical path (enter + exit + the last arriver's boundary, medians): {pieces_med:.3f} ms = "
          f"{result['pieces_pct_of_off_step']:.2f}% of the off step (the guard's module hooks inside the step are not in "
          f"them; an early rank's boundary also holds its wait for the last: {pm['boundary']['median']:.3f} ms median)", flush=True)
    ci = result["overhead_ci95_pct"]
    print(f"overhead: median(on) - median(off) = {result['overhead_ms']:+.3f} ms per step = {result['overhead_pct']:+.2f}% "
          f"(95% block-bootstrap CI {ci[0]:+.2f}% .. {ci[1]:+.2f}%); median of the per-block differences "
          f"{result['block_diff_median_ms']:+.3f} ms"
          + ("" if result["step_ms_target_met"] else f"; note: the off step is {med_off * 1e3:.1f} ms (< 100 ms)"), flush=True)
    if getattr(args, "plot", None):
        common.line_plot(args.plot, "paired per-block difference on - off (ms); 0 = no overhead", "block",
                         "milliseconds", {"median(on) - median(off) per block": (list(range(blocks)), result["block_diffs_ms"])})
    headline: dict[str, Any] = {"guard_overhead_pct": result["overhead_pct"], "guard_overhead_ci95_pct": ci,
                                "guard_off_step_ms": med_off * 1e3, "guard_pieces_ms": pieces_med,
                                "guard_pieces_pct": result["pieces_pct_of_off_step"],
                                **({"commit_fence_ms": pm["fence"]["median"]} if args.fence else {})}
    reasons = {} if result["step_ms_target_met"] else {
        "guard_overhead_pct": f"measured on a {med_off * 1e3:.1f} ms step (the issue asks for >= 100 ms; a quick run?)"}
    common.write_result(args, "guard", {"wrapper": args.wrapper, "topology": f"{n}x{m}", "fence": args.fence, "dim": dim, "layers": layers,
                                        "seq": seq, "batch": batch, "blocks": blocks, "block_steps": block_steps},
                        result, headline, reasons, t0)
    return 0
