"""``accelpact bench controlplane``: the control plane's growth with the world W.

Two questions, each measured on the real code of :mod:`accelpact.impl.controlplane`:

1. **Per recovery** (agreement + release): every rank of W runs the control-plane part of one
   episode as the engine does (``Pact._recover``): the members of the failed group publish the
   revoke (twice: at the boundary and in ``RankObserve``), every rank ``arrive``s, the last arriver
   ``decide_agreement``s (a ``multi_get`` of W frontiers), everyone ``await_agreement``s; then
   ``ready``, the last voter ``decide_release``s, everyone ``await_release``s; the members
   ``retire_revoke``.  Timed from a common start to the last rank released (and to the last rank
   agreed); the store operations are counted per call (a counting proxy around each rank's
   connection).

   * ``--sim-worlds`` (default 64,256,1024; quick 8,64): simulated ranks, one thread each, each
     with its own TCPStore connection to one c10d TCPStore on 127.0.0.1 hosted by this process
     (connections are made first, untimed).  Threads share two cores and the GIL: the client-side
     Python of W ranks runs serialised here, spread over W hosts in a real job, so these times are
     an upper bound; the operation counts are exact.
   * ``--proc-worlds`` (default 2,4,8; quick 2): real processes (the launcher hosts the store, as
     torchrun's agent does), the same sequence on each rank's own store connection.

3. **The store's throughput**: concurrent clients (8 threads here; in the full run also 2 processes
   x 8 threads) doing ``add`` round trips against one TCPStore for ``--saturate-s`` seconds: the
   operations per second one store serves on this machine (a lower bound: the clients share the
   two cores with the store).

2. **Per step, fault-free** (real processes only): what a rank does on the control plane at every
   boundary in the fault-free path (``Pact.boundary`` and the worker's step loop): the failure
   flag, a ``count``-element int64 all-reduce over W on the out-of-band gloo control group (gloo's
   all-reduce is a ring: 2(W-1) sequential hops for a tiny tensor), and the worker's one
   ``store.set`` of its committed frontier.  Timed back to back, ``--iters`` times.  Extrapolated to
   W = 1024, labelled as such (nothing at W > 8 is measured for this part): the ring's 2(W-1) hops
   priced at the W = 2 measurement, and a least-squares fit ``a + b (W - 1)`` over the measured W
   (inflated: W > 2 processes share two cores).

4. **Per step, fault-free, simulated ranks** (``--flag-worlds``, default 16,64,256,1024): the
   engine's flag itself (:func:`accelpact.impl.flag.or_allreduce`) with W ranks as threads of one
   fresh process, each with its own TCPStore connection and gloo group (pairs connected lazily:
   each rank connects to the log2 W peers it exchanges with).  A rank's CPU time per flag is the
   per-rank work a real job pays (O(log W) exchanges); the wall time here serialises W ranks on two
   cores and is only an upper bound.  The headline ``step_control_ms_W1024`` is that CPU time at
   W = 1024 plus the progress ``store.set``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import common
from accelpact.impl.controlplane import ControlPlane
from accelpact.impl.flag import RING_MAX_WORLD, or_allreduce, rounds
from accelpact.testing import start_ranks

__all__ = ["add_arguments", "run", "proc_rank", "CountingStore", "episode"]

GROUP = "replicate0"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "controlplane")
    p.add_argument("--sim-worlds", default=None, help="simulated W (threads), comma-separated (default 64,256,1024; quick 8,64)")
    p.add_argument("--proc-worlds", default=None, help="real-process W, comma-separated (default 2,4,8; quick 2)")
    p.add_argument("--trials", type=int, default=None, help="recoveries per W (default 10; quick 3)")
    p.add_argument("--iters", type=int, default=None, help="fault-free boundaries timed per real W (default 300; quick 50)")
    p.add_argument("--flag-worlds", default=None,
                   help="simulated W for the fault-free flag (a thread and a gloo group per rank, one process), "
                        "comma-separated (default 16,64,256,1024; quick 4,16; empty: none)")
    p.add_argument("--flag-iters", type=int, default=None, help="flags timed per simulated W (default 10; quick 5)")
    p.add_argument("--ranks-per-node", type=int, default=8,
                   help="M of the simulated N x M world: the failed replicate group has W/M members (default 8)")
    p.add_argument("--saturate-s", type=float, default=None,
                   help="seconds of the store-throughput measurement (default 2; quick 0.5; 0: none)")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each real-process launch, seconds")


class CountingStore:
    """A store connection that counts each call by name (``add``, ``set``, ``wait`` ...)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._store, name)
        if not callable(fn):
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call


def episode(cp: Any, g: int, member: bool, frontier: int = 7, deadline_s: float = 120.0) -> tuple[int, int, str]:
    """One rank's control-plane part of one recovery of generation ``g`` (what ``Pact`` calls, in
    order).  Returns (ns when agreed, ns when released, the release decision)."""
    if member:
        cp.publish_revoke(g, GROUP)   # Pact.boundary, on the observed failure
        cp.publish_revoke(g, GROUP)   # RankObserve
    _, last = cp.arrive(g, frontier)
    if last:
        cp.decide_agreement(g)
    dec = cp.await_agreement(g, time.monotonic() + deadline_s)
    t_agreed = time.monotonic_ns()
    if dec != "commit":
        raise RuntimeError(f"generation {g}: agreement decided {dec!r}")
    _, last = cp.ready(g)
    if last:
        cp.decide_release(g)
    rel = cp.await_release(g, time.monotonic() + deadline_s)
    t_released = time.monotonic_ns()
    if member:
        cp.retire_revoke(g, GROUP)    # RankResume
    return t_agreed, t_released, rel


def _members(world: int, rpn: int) -> set[int]:
    """The failed group: replicate group 0 of an N x M world (every M-th rank); M = min(rpn, W // 2)."""
    m = max(1, min(rpn, world // 2))
    return set(range(0, world, m))


# --------------------------------------------------------------------------------- simulated ranks

def simulate(world: int, trials: int, rpn: int, prefix: str) -> dict[str, Any]:
    """``world`` threads, one TCPStore connection each, ``trials`` recoveries (generations 0..)."""
    import torch.distributed as dist

    _raise_fd_limit(4 * world + 256)
    timeout = datetime.timedelta(seconds=120)
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
    t_setup = time.monotonic()
    with ThreadPoolExecutor(min(world, 128)) as ex:
        conns = list(ex.map(lambda _: dist.TCPStore("127.0.0.1", master.port, None, False, timeout=timeout), range(world)))
    setup_s = time.monotonic() - t_setup
    rtt = []
    for _ in range(200):  # one client, sequential round trips: the store's unloaded latency
        t = time.perf_counter()
        conns[0].add(f"{prefix}rtt", 1)
        rtt.append(time.perf_counter() - t)
    members = _members(world, rpn)
    stores = [CountingStore(c) for c in conns]
    barrier = threading.Barrier(world)
    starts = [[0] * trials for _ in range(world)]
    agreed = [[0] * trials for _ in range(world)]
    released = [[0] * trials for _ in range(world)]
    errors: list[str] = []

    def body(rank: int) -> None:
        cp = ControlPlane(stores[rank], rank, world, prefix=prefix)
        try:
            for g in range(trials):
                barrier.wait()
                starts[rank][g] = time.monotonic_ns()
                agreed[rank][g], released[rank][g], _ = episode(cp, g, rank in members)
        except Exception as exc:  # noqa: BLE001 - reported as the benchmark's failure, with the rank
            errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), name=f"sim-rank-{r}", daemon=True) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    if errors:
        raise common.BenchError(f"simulated W={world}: {errors[0]} ({len(errors)} rank(s) failed)")
    ops: dict[str, int] = {}
    for s in stores:
        for k, v in s.counts.items():
            ops[k] = ops.get(k, 0) + v
    total = [max(released[r][g] for r in range(world)) - min(starts[r][g] for r in range(world)) for g in range(trials)]
    agree = [max(agreed[r][g] for r in range(world)) - min(starts[r][g] for r in range(world)) for g in range(trials)]
    n_ops = sum(ops.values())
    return {"world": world, "kind": "threads", "trials": trials, "members": len(members), "setup_s": setup_s,
            "agree_ms": common.stats(agree, 1e-6), "total_ms": common.stats(total, 1e-6),
            "ops_per_recovery": n_ops / trials, "ops_by_kind_per_recovery": {k: v / trials for k, v in sorted(ops.items())},
            "store_rtt_us": common.stats(rtt, 1e6)}


def _raise_fd_limit(need: int) -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    except (ImportError, ValueError, OSError):
        pass


# ------------------------------------------------------------------------------- store throughput

def _hammer(store: Any, key: str, stop_at: float, counts: list[int], i: int) -> None:
    n = 0
    while time.monotonic() < stop_at:
        store.add(key, 1)
        n += 1
    counts[i] = n


def saturate_threads(threads: int, seconds: float) -> dict[str, Any]:
    """``threads`` client connections in this process (one thread each) doing ``add`` on their own
    key for ``seconds`` against one TCPStore hosted here: the store's throughput with GIL-bound
    clients (a lower bound)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=60)
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
    with ThreadPoolExecutor(threads) as ex:
        conns = list(ex.map(lambda _: dist.TCPStore("127.0.0.1", master.port, None, False, timeout=timeout), range(threads)))
    counts = [0] * threads
    stop_at = time.monotonic() + seconds
    ts = [threading.Thread(target=_hammer, args=(c, f"sat/{i}", stop_at, counts, i), daemon=True) for i, c in enumerate(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"kind": "threads", "clients": threads, "seconds": seconds, "ops": sum(counts), "ops_per_s": sum(counts) / seconds}


def saturate_rank(ctx, threads: int, seconds: float) -> int:
    """Rank function (no group): ``threads`` connections to the launcher's store doing ``add`` for
    ``seconds`` once the launcher says go (every rank connected first); the number of operations."""
    conns = [ctx.client_store() for _ in range(threads)]
    ctx.store.set(f"sat/ready/{ctx.rank}", "1")
    ctx.store.wait(["sat/go"], datetime.timedelta(seconds=300))
    counts = [0] * threads
    stop_at = time.monotonic() + seconds
    ts = [threading.Thread(target=_hammer, args=(c, f"sat/{ctx.rank}/{i}", stop_at, counts, i), daemon=True)
          for i, c in enumerate(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts)


def saturate_procs(procs: int, threads: int, seconds: float, out: str, timeout: float) -> dict[str, Any]:
    """The same from ``procs`` processes (``threads`` connections each) against the launcher's store."""
    with start_ranks(saturate_rank, procs, out, timeout_s=timeout, env={"TORCH_CPP_LOG_LEVEL": "ERROR"}, threads=threads,
                     seconds=seconds) as ranks:
        ranks.wait_keys([f"sat/ready/{r}" for r in range(procs)], timeout_s=timeout)
        ranks.store.set("sat/go", "1")
        run = ranks.wait()
    if not run.ok or len(run.returns) != procs:
        raise common.BenchError(f"store saturation on {procs} processes failed:\n{run.explain()}")
    total = sum(run.returns.values())
    return {"kind": "processes", "clients": procs * threads, "processes": procs, "seconds": seconds, "ops": total,
            "ops_per_s": total / seconds}


# ---------------------------------------------------------------------------------- real processes

def proc_rank(ctx, trials: int, iters: int, flag_len: int, rpn: int) -> dict[str, Any]:
    """Rank function (``init_group=True``): the fault-free boundary cost, then ``trials`` recoveries'
    control-plane part, on this rank's own store connection."""
    import torch
    import torch.distributed as dist

    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))  # as the worker builds it
    flag = torch.zeros(flag_len, dtype=torch.int64)
    for _ in range(10):  # warm-up: connections and buffers
        control.allreduce([flag]).wait()
        or_allreduce(control, flag, method="doubling")
    dist.barrier()
    flag_s, rd_s, set_s = [], [], []
    for i in range(iters):  # the ring and the doubling alternate, so both see the same machine
        t0 = time.perf_counter()
        control.allreduce([flag]).wait()
        t1 = time.perf_counter()
        ctx.store.set(f"bench/progress/r{ctx.rank}", str(i))  # the worker's per-commit frontier
        t2 = time.perf_counter()
        or_allreduce(control, flag, method="doubling")
        t3 = time.perf_counter()
        flag_s.append(t1 - t0)
        set_s.append(t2 - t1)
        rd_s.append(t3 - t2)
    store = CountingStore(ctx.store)
    cp = ControlPlane(store, ctx.rank, ctx.world, prefix="bench/cp/")
    member = ctx.rank in _members(ctx.world, rpn)
    rows = []
    for g in range(trials):
        dist.barrier()
        t0 = time.monotonic_ns()
        t_agreed, t_released, _ = episode(cp, g, member)
        rows.append((t0, t_agreed, t_released))
    dist.barrier()
    return {"flag_s": flag_s, "rd_s": rd_s, "set_s": set_s, "episodes": rows, "ops": dict(store.counts)}


def measure_procs(world: int, trials: int, iters: int, rpn: int, out: str, timeout: float) -> dict[str, Any]:
    flag_len = max(1, min(rpn, world // 2))  # one element per replicate group (HSDP): M of the N x M world
    res = common.rank_values(proc_rank, world, out, timeout_s=timeout, trials=trials, iters=iters, flag_len=flag_len,
                             rpn=rpn)
    total = [max(r["episodes"][g][2] for r in res) - min(r["episodes"][g][0] for r in res) for g in range(trials)]
    agree = [max(r["episodes"][g][1] for r in res) - min(r["episodes"][g][0] for r in res) for g in range(trials)]
    ops: dict[str, int] = {}
    for r in res:
        for k, v in r["ops"].items():
            ops[k] = ops.get(k, 0) + v
    flag_med = [statistics.median(r["flag_s"]) for r in res]
    return {"world": world, "kind": "processes", "trials": trials, "members": len(_members(world, rpn)),
            "agree_ms": common.stats(agree, 1e-6), "total_ms": common.stats(total, 1e-6),
            "ops_per_recovery": sum(ops.values()) / trials, "ops_by_kind_per_recovery": {k: v / trials for k, v in sorted(ops.items())},
            # per step: every rank's samples pooled; the slowest rank's median as the step's cost
            "flag_len": flag_len, "flag_ms": common.stats([x for r in res for x in r["flag_s"]], 1e3),
            "flag_ms_slowest_rank_median": max(flag_med) * 1e3,
            "doubling_ms": common.stats([x for r in res for x in r["rd_s"]], 1e3),
            "progress_set_ms": common.stats([x for r in res for x in r["set_s"]], 1e3)}


# ------------------------------------------------------------------- the per-step flag, simulated ranks

def flag_sim(world: int, iters: int) -> dict[str, Any]:
    """In this process (call it in a fresh one: it leaves ``world`` gloo groups behind): ``world``
    simulated ranks, each a thread with its own TCPStore connection and its own ``ProcessGroupGloo``
    (lazy pair connection, one worker thread), all on loopback, running the engine's fault-free
    failure flag (:func:`accelpact.impl.flag.or_allreduce`, the doubling above ``RING_MAX_WORLD``)
    ``iters`` times, each started from a barrier, one rank raising the flag every other time (the
    OR is checked on every rank).  Per rank and flag: wall time and the thread's CPU time
    (``time.thread_time``: the rank's own work, which is what a rank of a real job spends; the wall
    time here is W ranks serialised on two cores and the GIL, an upper bound)."""
    import os
    import resource

    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")  # pairs connect on first use: log2 W peers per rank
    import torch
    import torch.distributed as dist

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    torch.set_num_threads(1)
    to = datetime.timedelta(seconds=600)
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=to, wait_for_workers=False)
    pgs: list[Any] = [None] * world
    errors: list[BaseException] = []

    def build(r: int) -> None:
        try:
            st = dist.TCPStore("127.0.0.1", master.port, None, False, timeout=to)
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private in torch 2.13's stubs
            opts._timeout = to
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            opts._threads = 1
            pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore("flag", st), r, world, opts)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def on_every_rank(fn: Any) -> float:
        """Run ``fn(rank)`` on one thread per simulated rank; the seconds until all have returned."""
        t0 = time.monotonic()
        threads = [threading.Thread(target=fn, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0

    setup_s = on_every_rank(build)
    if errors:
        raise common.BenchError(f"flag simulation at W={world}: building the groups failed: {errors[0]}")
    barrier = threading.Barrier(world)
    wall = [[0.0] * iters for _ in range(world)]
    cpu = [[0.0] * iters for _ in range(world)]
    wrong: list[str] = []

    def loop(r: int) -> None:
        flag = torch.zeros(8, dtype=torch.int64)
        for i in range(iters):
            barrier.wait()
            t, c = time.perf_counter(), time.thread_time()
            flag.zero_()
            if i % 2 and r == (7 * i) % world:
                flag[3] = 1
            or_allreduce(pgs[r], flag)
            wall[r][i], cpu[r][i] = time.perf_counter() - t, time.thread_time() - c
            if int(flag[3]) != i % 2 or int(flag.sum()) != i % 2:
                wrong.append(f"rank {r}, flag {i}: {flag.tolist()}")

    run_s = on_every_rank(loop)
    if wrong:
        raise common.BenchError(f"flag simulation at W={world}: wrong OR: {wrong[:3]}")
    ring = world <= RING_MAX_WORLD
    return {"world": world, "iters": iters, "algorithm": "ring" if ring else "doubling",
            "rounds": 2 * (world - 1) if ring else rounds(world), "setup_s": setup_s, "run_s": run_s,
            "cpu_ms_per_rank": common.stats((x for row in cpu for x in row), 1e3),
            "wall_ms_slowest_rank": common.stats((max(wall[r][i] for r in range(world)) for i in range(iters)), 1e3),
            "native_threads": len(os.listdir("/proc/self/task"))}


def measure_flag(world: int, iters: int, timeout: float) -> dict[str, Any]:
    """:func:`flag_sim` in a fresh interpreter (its groups and threads go with it)."""
    import json
    import os
    import subprocess

    code = ("import json, os, sys; from accelpact.bench.controlplane import flag_sim; "
            f"print(json.dumps(flag_sim({world}, {iters}))); sys.stdout.flush(); os._exit(0)")
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise common.BenchError(f"flag simulation at W={world}: over {timeout:.0f} s") from exc
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        raise common.BenchError(f"flag simulation at W={world} failed (rc={out.returncode}): {out.stderr[-1500:]}")
    return json.loads(lines[-1])


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least squares y = a + b x; None with fewer than two distinct x."""
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


# ------------------------------------------------------------------------------------------- run

def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        sims = common.parse_list(args.sim_worlds) if args.sim_worlds else ([8, 64] if args.quick else [64, 256, 1024])
        procs = common.parse_list(args.proc_worlds) if args.proc_worlds is not None else ([2] if args.quick else [2, 4, 8])
        flags = (common.parse_list(args.flag_worlds) if args.flag_worlds is not None
                 else ([4, 16] if args.quick else [16, 64, 256, 1024]))
    except ValueError as exc:
        print(f"accelpact bench controlplane: error: {exc}", file=sys.stderr)
        return 2
    trials = args.trials if args.trials is not None else (3 if args.quick else 10)
    iters = args.iters if args.iters is not None else (50 if args.quick else 300)
    flag_iters = args.flag_iters if args.flag_iters is not None else (5 if args.quick else 10)
    if trials < 1 or iters < 1 or flag_iters < 1 or any(w < 2 for w in sims + procs + flags) or args.ranks_per_node < 1:
        print("accelpact bench controlplane: error: --trials, --iters, --flag-iters >= 1; worlds >= 2", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    try:
        for w in procs:
            print(f"controlplane: W={w} real processes: {iters} fault-free boundaries, {trials} recoveries", flush=True)
            rows.append(measure_procs(w, trials, iters, args.ranks_per_node, f"{args.out}/procs-{w}", args.timeout))
        for w in sims:
            print(f"controlplane: W={w} simulated ranks (threads): {trials} recoveries", flush=True)
            rows.append(simulate(w, trials, args.ranks_per_node, prefix=f"bench/sim{w}/"))
        flag_rows = []
        for w in flags:
            print(f"controlplane: W={w} simulated ranks (a thread and a gloo group each): {flag_iters} fault-free flags", flush=True)
            flag_rows.append(measure_flag(w, flag_iters, args.timeout))
        sat_s = args.saturate_s if args.saturate_s is not None else (0.5 if args.quick else 2.0)
        saturation = []
        if sat_s > 0:
            print(f"controlplane: store throughput, {sat_s} s per measurement", flush=True)
            saturation.append(saturate_threads(8, sat_s))
            if not args.quick:
                saturation.append(saturate_procs(2, 8, sat_s, f"{args.out}/saturate", args.timeout))
    except common.BenchError as exc:
        print(f"accelpact bench controlplane: {exc}", file=sys.stderr)
        return 1
    if saturation:
        common.print_table("one TCPStore's throughput (add round trips from concurrent clients, loopback, 2 shared cores)",
                           ["clients", "from", "ops", "ops/s"],
                           [[x["clients"], x["kind"], x["ops"], f"{x['ops_per_s']:,.0f}"] for x in saturation])
    common.print_table("control plane per recovery (agreement + release): milliseconds from a common start",
                       ["W", "ranks", "agree med", "total med", "p90", "p99", "max", "store ops", "ops / rank",
                        "ops by kind"],
                       [[r["world"], r["kind"], common.fmt(r["agree_ms"]["median"]), common.fmt(r["total_ms"]["median"]),
                         common.fmt(r["total_ms"]["p90"]), common.fmt(r["total_ms"]["p99"]), common.fmt(r["total_ms"]["max"]),
                         f"{r['ops_per_recovery']:.0f}", f"{r['ops_per_recovery'] / r['world']:.2f}",
                         " ".join(f"{k}:{v:g}" for k, v in r["ops_by_kind_per_recovery"].items())] for r in rows])
    real = [r for r in rows if r["kind"] == "processes"]
    fit = linear_fit([r["world"] - 1 for r in real], [r["flag_ms"]["median"] for r in real]) if real else None
    fitted = (fit[0] + fit[1] * 1023) if fit else None
    # The ring's 2(W-1) sequential hops, priced at the W=2 measurement (2 hops, both cores free):
    # W > 2 here runs W processes on two cores, and each hop then waits for a context switch.
    w2 = next((r for r in real if r["world"] == 2), None)
    extrapolated = w2["flag_ms"]["median"] * 1023 if w2 else None
    ops_s = max((x["ops_per_s"] for x in saturation), default=None)
    for r in rows:  # what one store serving every operation of a recovery in sequence takes at least
        r["store_bound_ms"] = r["ops_per_recovery"] / ops_s * 1e3 if ops_s else None
    if real:
        common.print_table("fault-free control plane per step (real processes): milliseconds",
                           ["W", "flag all-reduce med", "p90", "p99", "max", "slowest rank med", "progress store.set med"],
                           [[r["world"], common.fmt(r["flag_ms"]["median"], digits=3), common.fmt(r["flag_ms"]["p90"], digits=3),
                             common.fmt(r["flag_ms"]["p99"], digits=3), common.fmt(r["flag_ms"]["max"], digits=3),
                             common.fmt(r["flag_ms_slowest_rank_median"], digits=3),
                             common.fmt(r["progress_set_ms"]["median"], digits=3)] for r in real])
        if extrapolated is not None and w2 is not None:
            print(f"flag all-reduce, ring model 2(W-1) hops priced at W=2 ({w2['flag_ms']['median'] * 500:.0f} us per hop): "
                  f"W=1024 -> {extrapolated:.0f} ms per step (extrapolated, not measured)", flush=True)
        if fit:
            print(f"least-squares fit over W={[r['world'] for r in real]} (oversubscribed cores): {fit[0]:.3f} ms + "
                  f"{fit[1] * 1e3:.1f} us x (W-1) -> {fitted:.0f} ms at W=1024 (not measured)", flush=True)
    if ops_s:
        print(f"one store at {ops_s:,.0f} ops/s serving a recovery's operations one after another: "
              + ", ".join(f"W={r['world']}: {r['store_bound_ms']:.1f} ms" for r in rows), flush=True)
    if getattr(args, "plot", None):
        xs = [r["world"] for r in rows]
        series = {"recovery control plane, total (ms)": (xs, [r["total_ms"]["median"] for r in rows]),
                  "store ops per recovery / 100": (xs, [r["ops_per_recovery"] / 100 for r in rows])}
        if real:
            series["fault-free flag all-reduce per step (ms)"] = ([r["world"] for r in real], [r["flag_ms"]["median"] for r in real])
        if flag_rows:
            series["fault-free flag, a rank's CPU per step (ms, simulated ranks)"] = (
                [r["world"] for r in flag_rows], [r["cpu_ms_per_rank"]["median"] for r in flag_rows])
        common.line_plot(args.plot, "control plane versus W (W <= 8: processes; above: threads on one store)", "W",
                         "milliseconds (ops / 100)", series, logx=True, logy=True)
    # The engine's flag (impl/flag.py) above RING_MAX_WORLD ranks: ceil(log2 W) sequential exchanges;
    # at W=2 the doubling is exactly one exchange, so W=1024's 10 rounds are priced at 10 x that.

    step_modelled = (w2["doubling_ms"]["median"] * rounds(1024) + w2["progress_set_ms"]["median"]) if w2 else None
    if real:
        common.print_table("the flag's two algorithms, measured in the same processes (alternating): milliseconds",
                           ["W", "ring all-reduce med", "doubling med", "doubling p90", "doubling rounds"],
                           [[r["world"], common.fmt(r["flag_ms"]["median"], digits=3),
                             common.fmt(r["doubling_ms"]["median"], digits=3), common.fmt(r["doubling_ms"]["p90"], digits=3),
                             rounds(r["world"])] for r in real])
        if step_modelled is not None:
            print(f"fault-free control plane per step at W=1024 (the engine's doubling flag, {rounds(1024)} rounds priced at "
                  f"the W=2 exchange, + the progress set): {step_modelled:.2f} ms (modelled, not measured)", flush=True)
    if flag_rows:
        common.print_table("fault-free flag per step, simulated ranks (one process: a thread + a gloo group per rank): ms",
                           ["W", "algorithm", "sequential hops", "per-rank CPU med", "p90", "max",
                            "slowest rank wall med (serialised: upper bound)"],
                           [[r["world"], r["algorithm"], r["rounds"], common.fmt(r["cpu_ms_per_rank"]["median"], digits=3),
                             common.fmt(r["cpu_ms_per_rank"]["p90"], digits=3), common.fmt(r["cpu_ms_per_rank"]["max"], digits=3),
                             common.fmt(r["wall_ms_slowest_rank"]["median"])] for r in flag_rows])
    flag_big = next((r for r in flag_rows if r["world"] == 1024), None)
    progress = w2["progress_set_ms"]["median"] if w2 else 0.0
    step_measured = (flag_big["cpu_ms_per_rank"]["median"] + progress) if flag_big else None
    headline: dict[str, Any] = {"control_plane_ms_W1024": None, "step_control_ms_W1024": step_measured,
                                "step_control_latency_ms_W1024_modelled": step_modelled,
                                "step_control_wall_ms_W1024_serialised": flag_big["wall_ms_slowest_rank"]["median"] if flag_big else None,
                                "step_control_ms_extrapolated_W1024": extrapolated,
                                "ops_per_recovery_W1024": None, "store_bound_ms_W1024": None,
                                "store_ops_per_s_max": ops_s}
    reasons: dict[str, str] = {}
    if step_measured is None:
        reasons["step_control_ms_W1024"] = f"no W=1024 flag simulation here (--flag-worlds {flags})"
    else:
        headline["step_control_W1024_basis"] = (
            f"measured: a rank's CPU time for the fault-free failure flag (impl/flag.py, recursive doubling above {RING_MAX_WORLD} "
            f"ranks: {rounds(1024)} exchanges) with 1,024 simulated ranks (a thread and a gloo group each, one process), "
            "plus the worker's progress store.set (W=2 processes); the latency of those 10 sequential exchanges, priced at "
            "the W=2 exchange, is step_control_latency_ms_W1024_modelled; the wall time with 1,024 ranks serialised on two "
            "cores is step_control_wall_ms_W1024_serialised (an upper bound); gloo's ring would be "
            + (f"{extrapolated:.0f} ms (step_control_ms_extrapolated_W1024)" if extrapolated is not None else "linear in W"))
    big = next((r for r in rows if r["world"] == 1024), None)
    if big is not None:
        headline["control_plane_ms_W1024"] = big["total_ms"]["median"]
        headline["ops_per_recovery_W1024"] = big["ops_per_recovery"]
        headline["store_bound_ms_W1024"] = big["store_bound_ms"]
    else:
        for k in ("control_plane_ms_W1024", "ops_per_recovery_W1024", "store_bound_ms_W1024"):
            reasons[k] = f"no W=1024 run here (simulated W {sims})"
    for k, v in headline.items():
        if v is None and k not in reasons:
            reasons[k] = "not measured in this run (see the flags)"
    common.write_result(args, "controlplane", {"sim_worlds": sims, "proc_worlds": procs, "flag_worlds": flags, "trials": trials,
                                               "iters": iters, "flag_iters": flag_iters, "ranks_per_node": args.ranks_per_node},
                        {"rows": rows, "flag_sim": flag_rows, "flag_fit_ms": None if fit is None else {"a": fit[0], "b_per_rank": fit[1],
                                                                               "at_1024": fitted},
                         "store_throughput": saturation},
                        headline, reasons, t0)
    return 0
