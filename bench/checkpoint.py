"""``accelpact bench checkpoint``: what checkpointing costs a step, synchronous against asynchronous.

One job (``accelpact.init`` + ``attach``, the workload's model) trains in blocks of ``--block-steps``
steps; each block runs one arm, the arms take turns and their order rotates every round, inside the
same processes (drift of the shared machine hits every arm alike):

* ``none``: no checkpoint (the baseline);
* ``sync``: a checkpoint every ``--every`` steps, ``dcp.save`` at the boundary (``attach``'s default);
* ``async``: the same checkpoints with ``attach(checkpoint="async")``: staged at the boundary
  (``dcp.async_save``), written while the next step runs, its outcome read at the next boundary.

A step is timed from entering ``run.step`` to ``run.boundary`` returning (the slowest rank per step:
the ranks are in lockstep); an async block's last save is waited for at the block's end and that
wait is added to its last step, so every save an arm took is paid inside its own steps.  Reported
per arm: every step's time (median, p90, p99, max), the save step's (the boundary that takes or
launches it) and the step after it (where an async save is waited for), the cost of checkpointing
per step (mean step of the arm - mean step of ``none``; the whole stall of a save spread over its
``--every`` steps) and per save window (the save step plus the next, less two median ``none`` steps,
median and tails), and async's cost as a ratio of sync's, all measured in the same run.  The
managers' own timings say where a save's time goes (sync: the whole save; async: the staging on the
training thread, the background write to the commit).

``--pad-s`` sleeps at the start of each step (the workload's ``pad_s``): a device's step, during
which the host's cores are idle, as on a GPU; without it (the default) the background write competes
with the step's own CPU compute on the same cores.  Checkpoint folders go under ``--out`` and all but
the newest committed ones are removed as the run goes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import accelpact
from accelpact.impl.launch import workload
from accelpact.impl.runtime.checkpoint import committed_steps, step_dir

from . import common

__all__ = ["add_arguments", "run", "checkpoint_rank"]

ARMS = ("none", "sync", "async")


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "checkpoint", plot=False)
    p.add_argument("--wrapper", default="ddp", choices=list(common.LAYOUT),
                   help="ddp runs 1x2 (default), the hybrid wrappers 2x2")
    p.add_argument("--dim", type=int, default=None, help="model width (default 256; quick 64)")
    p.add_argument("--layers", type=int, default=None, help="layers (default 4; quick 2)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 64; quick 16)")
    p.add_argument("--batch", type=int, default=None, help="batch per rank (default 8; quick 4)")
    p.add_argument("--every", type=int, default=None, help="a checkpoint every that many steps (default 4; quick 2)")
    p.add_argument("--rounds", type=int, default=None, help="rounds: one block of each arm per round (default 6; quick 2)")
    p.add_argument("--block-steps", type=int, default=None,
                   help="steps per block, a multiple of --every (default 16; quick 4)")
    p.add_argument("--pad-s", type=float, default=0.0,
                   help="seconds slept at the start of each step: a device step with the host idle (default 0)")
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on the launch, seconds")


def checkpoint_rank(ctx, wrapper: str, nodes: int, rpn: int, dim: int, layers: int, seq: int, batch: int, every: int,
                    rounds: int, block_steps: int, pad_s: float, folder: str, warmup: int = 2) -> dict:
    """Rank function (``init_group=False``): per arm, ``(block, frontier, seconds)`` of every step, and
    the checkpoint managers' timings."""
    # the detector's silence threshold as the tests set it on 2 shared cores (spec/detection.md): a
    # descheduled rank is no dead one here; the trace says why, if a rank ends anyway
    job = accelpact.init("gloo", replicas=nodes, deadline_s=60.0, collective_timeout_s=300.0, dead_after_s=5.0,
                         trace_dir=str(ctx.out))
    topo = job.topology
    assert topo.ranks_per_node == rpn, (topo, rpn)
    spec = workload.WorkloadSpec(wrapper=wrapper, layers=layers, dim=dim, heads=4 if dim % 4 == 0 else 2, seq=seq,
                                 batch=batch, pad_s=pad_s)
    app = workload.build_job(spec, topo, workload.groups_of(job))
    root = Path(folder)
    run = job.attach(app.module, app.optimizer, checkpoint_dir=root / "sync", checkpoint_every=every)
    assert run is not None  # a training rank (no spares here)
    managers = {"none": None, "sync": run.checkpoints, "async": job._checkpoints(root / "async", every)}
    managers["async"].mode = "async"  # the same manager attach(checkpoint="async") builds
    step = 0
    times: dict[str, list[tuple[int, int, float]]] = {a: [] for a in ARMS}
    # the training thread's own time in the checkpoint calls (sync: save; async: launch, and finish, the
    # wait for it at the next boundary), per save: (arm, the saved step, seconds)
    held: list[list] = []

    def timed(arm: str, call: Any, launches: bool) -> Any:
        def wrapped(*a: Any, **kw: Any) -> Any:
            pending = managers[arm].pending
            t = time.perf_counter()
            try:
                return call(*a, **kw)
            finally:
                took = time.perf_counter() - t
                if launches:
                    held.append([arm, a[0], took])
                elif pending is not None:
                    for h in held:
                        if h[0] == arm and h[1] == pending.step:
                            h[2] += took
        return wrapped

    managers["sync"].save = timed("sync", managers["sync"].save, True)
    managers["async"].launch = timed("async", managers["async"].launch, True)
    managers["async"].finish = timed("async", managers["async"].finish, False)

    def one(arm: str, block: int) -> None:
        nonlocal step
        t = time.perf_counter()
        with run.step(step):
            loss = workload.train_step(app, step)
        run.boundary(loss)
        step += 1
        times[arm].append((block, step, time.perf_counter() - t))

    def prune(arm: str) -> None:
        """Rank 0: every committed checkpoint folder of ``arm`` but the newest (complete: nobody writes it)."""
        if ctx.rank == 0 and managers[arm] is not None:
            for s in committed_steps(managers[arm].root)[:-1]:
                shutil.rmtree(step_dir(managers[arm].root, s), ignore_errors=True)

    run.checkpoints = None
    for _ in range(warmup * every):  # warm-up of the step without saves, then one save of each mode
        one("none", -1)
    for arm in ("sync", "async"):
        run.checkpoints = managers[arm]
        for _ in range(every):
            one(arm, -1)
        if arm == "async":
            run._drain()
    for a in ARMS:
        times[a].clear()
    held.clear()
    block = 0
    for r in range(rounds):
        order = ARMS[r % 3:] + ARMS[:r % 3]
        for arm in order:
            run.checkpoints = managers[arm]
            for _ in range(block_steps):
                one(arm, block)
            if arm == "async":  # the block's last save is paid by the block: its wait joins the last step
                t = time.perf_counter()
                run._drain()
                b, f, s = times[arm][-1]
                times[arm][-1] = (b, f, s + time.perf_counter() - t)
            prune(arm)
            block += 1
    run.checkpoints = managers["sync"]  # close() settles what attach built
    timings = {a: list(managers[a].timings) for a in ("sync", "async")}
    job.close()
    return {"rank": ctx.rank, "times": times, "timings": timings, "held": [tuple(h) for h in held]}


def _slowest(res: list[dict], arm: str) -> list[tuple[int, int, float]]:
    """Per step of ``arm``: (block, frontier after it, the slowest rank's seconds)."""
    per_step = zip(*[r["times"][arm] for r in res], strict=True)
    return [(xs[0][0], xs[0][1], max(x[2] for x in xs)) for xs in per_step]


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    q = args.quick
    def given(value: int | None, quick: int, full: int) -> int:
        return value if value is not None else (quick if q else full)

    dim, layers, seq = given(args.dim, 64, 256), given(args.layers, 2, 4), given(args.seq, 16, 64)
    batch, every, rounds = given(args.batch, 4, 8), given(args.every, 2, 4), given(args.rounds, 2, 6)
    block_steps = given(args.block_steps, 4, 16)
    if min(dim, layers, seq, batch, every, rounds, block_steps) < 1 or seq < 2 or block_steps % every or args.pad_s < 0:
        print("accelpact bench checkpoint: error: sizes >= 1, --seq >= 2, --block-steps a multiple of --every, "
              "--pad-s >= 0", file=sys.stderr)
        return 2
    n, m = common.LAYOUT[args.wrapper]
    out = Path(args.out)
    folder = out / "ckpt"
    shutil.rmtree(folder, ignore_errors=True)
    print(f"checkpoint: {args.wrapper} {n}x{m}, model dim {dim} x {layers} layers, seq {seq}, batch {batch}, pad "
          f"{args.pad_s} s; a checkpoint every {every} steps; {rounds} rounds of {block_steps}-step blocks per arm "
          f"({', '.join(ARMS)})", flush=True)
    try:
        res = common.rank_values(checkpoint_rank, n * m, out, timeout_s=args.timeout, init_group=False, wrapper=args.wrapper,
                                 nodes=n, rpn=m, dim=dim, layers=layers, seq=seq, batch=batch, every=every, rounds=rounds,
                                 block_steps=block_steps, pad_s=args.pad_s, folder=str(folder))
    except common.BenchError as exc:
        print(f"accelpact bench checkpoint: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    steps = {a: _slowest(res, a) for a in ARMS}
    base = statistics.median(s for _, _, s in steps["none"])
    base_mean = statistics.fmean(s for _, _, s in steps["none"])
    result: dict[str, Any] = {"arms": {}}
    for arm in ARMS:
        xs = steps[arm]
        at_save = [s for _, f, s in xs if f % every == 0]
        after_save = [s for _, f, s in xs if f % every == 1]
        # a save's window: the step that takes (or launches) it and the next one (where async waits for it)
        by_f = {(b, f): s for b, f, s in xs}
        windows = [s + by_f[(b, f + 1)] - 2 * base for (b, f), s in by_f.items() if f % every == 0 and (b, f + 1) in by_f]
        mean = statistics.fmean(s for _, _, s in xs)
        result["arms"][arm] = {
            "step_ms": common.stats((s for _, _, s in xs), 1e3), "save_step_ms": common.stats(at_save, 1e3),
            "after_save_step_ms": common.stats(after_save, 1e3), "save_window_overhead_ms": common.stats(windows, 1e3),
            "cost_per_step_ms": (mean - base_mean) * 1e3,
        }
    for arm in ("sync", "async"):
        tm = [t for r in res for t in r["timings"][arm]]
        result["arms"][arm]["manager_ms"] = {k: common.stats((t[k] for t in tm if k in t), 1e3)
                                             for k in ("dcp_s", "stage_s", "total_s")}
    for arm in ("sync", "async"):
        # per save, the slowest rank's time on its training thread (the ranks wait for each other in it)
        per_save = [max(xs) for xs in zip(*[[h[2] for h in r["held"] if h[0] == arm] for r in res], strict=True)]
        n_steps = len(steps[arm])
        result["arms"][arm]["held_per_save_ms"] = common.stats(per_save, 1e3)
        result["arms"][arm]["held_per_step_ms"] = sum(per_save) / n_steps * 1e3 if n_steps else None
    a, s = result["arms"]["async"], result["arms"]["sync"]
    held_ratio = a["held_per_step_ms"] / s["held_per_step_ms"] if s["held_per_step_ms"] else None
    result["async_over_sync_held_per_step"] = held_ratio
    ratio = a["cost_per_step_ms"] / s["cost_per_step_ms"] if s["cost_per_step_ms"] > 0 else None
    wa, ws = a["save_window_overhead_ms"]["median"], s["save_window_overhead_ms"]["median"]
    result["async_over_sync_cost_per_step"] = ratio
    result["async_over_sync_save_window_median"] = wa / ws if wa is not None and ws else None
    common.print_table(f"step time per arm ({args.wrapper} {n}x{m}, slowest rank per step): milliseconds",
                       ["arm", "steps", "median", "p90", "p99", "max", "save step median", "after-save median",
                        "cost per step (mean - none)"],
                       [[arm, v["step_ms"]["n"], common.fmt(v["step_ms"]["median"]), common.fmt(v["step_ms"]["p90"]),
                         common.fmt(v["step_ms"]["p99"]), common.fmt(v["step_ms"]["max"]),
                         common.fmt(v["save_step_ms"]["median"]), common.fmt(v["after_save_step_ms"]["median"]),
                         common.fmt(v["cost_per_step_ms"])] for arm, v in result["arms"].items()])
    common.print_table("a save's window (its step and the next, less two median none steps): milliseconds",
                       ["arm", "saves", "median", "p90", "p99", "max"],
                       [[arm, v["save_window_overhead_ms"]["n"], *(common.fmt(v["save_window_overhead_ms"][k])
                                                                   for k in ("median", "p90", "p99", "max"))]
                        for arm, v in result["arms"].items() if arm != "none"])
    common.print_table("the training thread held by checkpointing, per save (slowest rank; sync: the save; async: its "
                       "launch and the wait for it at the next boundary): milliseconds",
                       ["arm", "saves", "median", "p90", "p99", "max", "per step"],
                       [[arm, v["held_per_save_ms"]["n"], *(common.fmt(v["held_per_save_ms"][k]) for k in ("median", "p90", "p99", "max")),
                         common.fmt(v["held_per_step_ms"])] for arm, v in ((x, result["arms"][x]) for x in ("sync", "async"))])
    common.print_table("where a save's time goes (every rank, every save): milliseconds",
                       ["arm", "piece", "n", "median", "p90", "max"],
                       [[arm, k, v["n"], common.fmt(v["median"]), common.fmt(v["p90"]), common.fmt(v["max"])]
                        for arm in ("sync", "async") for k, v in result["arms"][arm]["manager_ms"].items() if v["n"]])
    print(f"training thread held by checkpointing, per step: sync {common.fmt(s['held_per_step_ms'])} ms, async "
          f"{common.fmt(a['held_per_step_ms'])} ms" + (f" = {held_ratio:.2f} x sync" if held_ratio is not None else ""), flush=True)
    print(f"cost of checkpointing per step (mean step - mean none step): sync {s['cost_per_step_ms']:+.2f} ms, async "
          f"{a['cost_per_step_ms']:+.2f} ms" + (f" = {ratio:.2f} x sync" if ratio is not None else "")
          + f"; save window median: sync {common.fmt(ws)} ms, async {common.fmt(wa)} ms", flush=True)
    headline = {"ckpt_sync_held_per_step_ms": s["held_per_step_ms"], "ckpt_async_held_per_step_ms": a["held_per_step_ms"],
                "ckpt_async_over_sync_held": held_ratio,
                "ckpt_sync_cost_per_step_ms": s["cost_per_step_ms"], "ckpt_async_cost_per_step_ms": a["cost_per_step_ms"],
                "ckpt_async_over_sync": ratio, "ckpt_sync_save_window_ms": ws, "ckpt_async_save_window_ms": wa,
                "ckpt_none_step_ms": base * 1e3}
    reasons = {}
    if ratio is None:
        reasons["ckpt_async_over_sync"] = "the sync arm's steps were not slower than the none arm's in this run (step noise)"
    if held_ratio is None:
        reasons["ckpt_async_over_sync_held"] = "the sync arm held the training thread for no measurable time"
    common.write_result(args, "checkpoint", {"wrapper": args.wrapper, "topology": f"{n}x{m}", "dim": dim, "layers": layers,
                                             "seq": seq, "batch": batch, "every": every, "rounds": rounds,
                                             "block_steps": block_steps, "pad_s": args.pad_s}, result, headline, reasons, t0)
    return 0
