"""Multi-process harness for the adapter/workload tests (loopback gloo, bounded, reaped).

The test process hosts the TCPStore (port 0 = a free port); workers are spawned, join the store
as clients, run ``fn(ctx, **kwargs)`` and write their result to ``out/result-{rank}.pt``. Every
wait is bounded; stragglers are killed. Workers exit with ``os._exit`` (gloo teardown after a
poisoned group can abort the interpreter, torch-facts).
"""
from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any


@dataclass
class Ctx:
    rank: int
    world: int
    port: int
    out: Path
    store: Any = None


def _worker(modname: str, fnname: str, rank: int, world: int, port: int, out: str, kwargs: dict) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    code = 0
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
        if modname not in sys.modules:
            spec = importlib.util.spec_from_file_location(modname, kwargs.pop("__file__"))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[modname] = mod
            spec.loader.exec_module(mod)
        else:
            kwargs.pop("__file__", None)
        fn = getattr(sys.modules[modname], fnname)
        res = fn(Ctx(rank, world, port, Path(out), store), **kwargs)
        torch.save(res, Path(out) / f"result-{rank}.pt")
    except BaseException:
        (Path(out) / f"error-{rank}.txt").write_text(traceback.format_exc())
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(fn, world: int, tmp_path: Path, timeout: float = 60.0, **kwargs) -> list[Any]:
    """Run module-level ``fn`` on ``world`` spawned ranks; return per-rank results or raise with
    every failing rank's traceback."""
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, timeout=timedelta(seconds=60),
                          wait_for_workers=False)
    out = Path(tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(world):  # stale files from an earlier run must not be read as this run's
        for stale in (out / f"error-{r}.txt", out / f"result-{r}.pt"):
            stale.unlink(missing_ok=True)
    mod = sys.modules[fn.__module__]
    kwargs = dict(kwargs, __file__=mod.__file__)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(fn.__module__, fn.__name__, r, world, store.port, str(out), dict(kwargs)),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
    finally:
        hung = [i for i, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [(out / f"error-{r}.txt").read_text() for r in range(world) if (out / f"error-{r}.txt").exists()]
    if hung or errors or any(p.exitcode != 0 for p in procs):
        msg = f"ranks hung past {timeout}s: {hung}; exit codes {[p.exitcode for p in procs]}\n" + "\n".join(errors)
        raise AssertionError(msg)
    del store
    return [torch.load(out / f"result-{r}.pt", weights_only=False) for r in range(world)]


# --------------------------------------------------------------------------- shared scenario
def fail_group(ctx: Ctx, group: Any, members: tuple[int, ...], skippers: set[int], timeout_s: float = 1.5) -> str:
    """Break ``group`` for real (torch-facts): ``skippers`` skip an all-reduce so the others' short
    gloo timeout fires; after a default-group barrier the skippers' next op fails too.
    Returns this rank's error text ('' if it unexpectedly succeeded). Collective over the default group."""
    import torch
    import torch.distributed as dist

    err = ""
    if ctx.rank in members:
        group._get_backend(torch.device("cpu")).set_timeout(timedelta(seconds=timeout_s))
        if ctx.rank not in skippers:
            try:
                dist.all_reduce(torch.ones(1), group=group)
            except RuntimeError as e:
                err = str(e)
    dist.barrier()
    if ctx.rank in members and ctx.rank in skippers:
        try:
            dist.all_reduce(torch.ones(1), group=group)
        except RuntimeError as e:
            err = str(e)
    dist.barrier()
    return err


def rebind_scenario(ctx: Ctx, wrapper: str, nodes: int = 2, ranks_per_node: int = 2, layers: int = 4,
                    pre_steps: int = 2, post_steps: int = 2, ablation: bool | str = True,
                    regen: bool = False) -> dict:
    """Clean run vs. run with a REAL failure of R at a committed boundary + new group + rebind.

    Returns reference counts, adapter/walker agreement, timings, the snapshot comparison, digests
    and (``ablation``) the error raised when a second failure is NOT followed by a rebind
    (``ablation="python-only"``: followed by a rebind of the Python-visible references only);
    ``regen``: before that, a second failure and a rebind of the same sites to a generation-2 group.
    """
    import torch
    import torch.distributed as dist
    from accelpact.impl import workload as W
    from accelpact.impl.adapters import adapter_for, find_references, make_gloo_group, site_set
    from accelpact.impl.digest import state_digest

    topo = W.Topology(nodes, ranks_per_node)
    # The python-only ablation needs DDP's own bucketed all-reduce through the C++ Reducer
    # (the per-gradient hook reads ddp.process_group, which a Python-level rebind does fix).
    spec = W.WorkloadSpec(wrapper=wrapper, layers=layers, ddp_per_gradient=ablation != "python-only")
    total = pre_steps + post_steps
    res: dict = {"rank": ctx.rank}

    # uninterrupted reference run
    gb = W.build_groups(topo, ctx.rank)
    jb = W.build_job(spec, topo, gb)
    for s in range(total):
        W.train_step(jb, s)
    snap_clean = W.snapshot(jb)

    # run with a failure of R after step pre_steps-1 committed
    ga = W.build_groups(topo, ctx.rank)
    ja = W.build_job(spec, topo, ga)
    for s in range(pre_steps):
        W.train_step(ja, s)
    R, members = W.r_group(spec, ga), W.r_ranks(spec, ga)
    adapter = adapter_for(ja.module)
    res["adapter"] = adapter.name
    t0 = time.perf_counter(); sites = adapter.discover(ja.module, R); res["discover_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); walked = find_references(ja.module, R); res["walk_s"] = time.perf_counter() - t0
    res["r_sites"] = [s.path for s in sites]
    res["r_walker"] = [s.path for s in walked]
    res["r_agree"] = site_set(sites) == site_set(walked)
    other = ga.shard if wrapper != "ddp" else ga.replicate
    res["shard_sites"] = len(adapter.discover(ja.module, ga.shard))
    res["shard_walker"] = len(find_references(ja.module, ga.shard))
    res["shard_agree"] = site_set(adapter.discover(ja.module, ga.shard)) == site_set(find_references(ja.module, ga.shard))
    del other
    skippers = {r for r in members if topo.node_of(r) == 0} if wrapper != "ddp" else {0}
    res["fail_error"] = fail_group(ctx, R, members, skippers)
    local = topo.local_of(ctx.rank) if wrapper != "ddp" else 0
    new_R = make_gloo_group(ctx.store, f"gen1/{wrapper}/R{local}/", members, ctx.rank, timedelta(seconds=60), name=f"gen1-R{local}")
    t0 = time.perf_counter(); n = adapter.rebind(ja.module, sites, R, new_R); res["rebind_s"] = time.perf_counter() - t0
    res["rebound"] = n
    t0 = time.perf_counter(); check = adapter.verify(ja.module, sites, R, new_R); res["verify_s"] = time.perf_counter() - t0
    res["check"] = (check.ok, check.stale, check.total, check.detail)
    res["mesh_resolves_new"] = ga.mesh.get_group("replicate") is new_R if wrapper == "fsdp2-hybrid" else None
    res["c10d_rank_of_new"] = dist.get_rank(new_R)
    for s in range(pre_steps, total):
        W.train_step(ja, s)
    res["equal"] = W.compare_snapshots(W.snapshot(ja), snap_clean)
    res["digest"] = state_digest(ja.module, ja.optimizer)
    p0 = next(ja.module.parameters()).to_local() if hasattr(next(ja.module.parameters()), "to_local") else next(ja.module.parameters())
    keep = p0.detach().clone()
    with torch.no_grad():
        p0.view(-1)[0] += 1.0
    res["digest_perturbed"] = state_digest(ja.module, ja.optimizer)
    with torch.no_grad():
        p0.copy_(keep)
    res["digest_restored"] = state_digest(ja.module, ja.optimizer)

    cur, step = new_R, total
    if regen:  # generation 2: another real failure, the SAME sites rebound again (discover once, rebind many)
        res["fail_error_regen"] = fail_group(ctx, cur, members, skippers)
        gen2 = make_gloo_group(ctx.store, f"gen2/{wrapper}/R{local}/", members, ctx.rank, timedelta(seconds=60), name=f"gen2-R{local}")
        adapter.rebind(ja.module, sites, cur, gen2)
        check2 = adapter.verify(ja.module, sites, cur, gen2)
        res["check_regen"] = (check2.ok, check2.stale, check2.total, check2.detail)
        W.train_step(ja, step)
        W.train_step(jb, step)
        res["equal_regen"] = W.compare_snapshots(W.snapshot(ja), W.snapshot(jb))
        if wrapper == "fsdp2-hybrid":
            res["mesh_resolves_new"] = res["mesh_resolves_new"] and ga.mesh.get_group("replicate") is gen2
        cur, step = gen2, step + 1
    if ablation:  # another real failure of R, replacement built, rebind SKIPPED
        res["fail_error2"] = fail_group(ctx, cur, members, skippers)
        newer = make_gloo_group(ctx.store, f"gen9/{wrapper}/R{local}/", members, ctx.rank, timedelta(seconds=60), name=f"gen9-R{local}")
        if ablation == "python-only":  # rewrite only what a Python walk sees (DDP: not the C++ Reducer)
            from accelpact.impl.adapters import GenericAdapter
            res["python_only_rebound"] = GenericAdapter().rebind(ja.module, find_references(ja.module, cur), cur, newer)
        try:
            W.train_step(ja, step)
            res["ablation_error"] = ""
        except RuntimeError as e:
            res["ablation_error"] = str(e)[:300]
    return res


FAILURE_MARKERS = ("pair closure", "Connection closed", "Timed out", "timed out", "Connection reset")


def assert_rebind_results(res: list[dict], wrapper: str, nodes: int, ranks_per_node: int) -> None:
    """Checks shared by the per-wrapper tests (S5 RebindComplete, S6 StatePreserved, RankValidate)."""
    world = nodes * ranks_per_node
    assert len(res) == world
    for r in res:
        rk = r["rank"]
        assert r["r_agree"], f"rank {rk}: adapter sites {r['r_sites']} != walker sites {r['r_walker']}"
        assert r["shard_agree"], f"rank {rk}: adapter and walker disagree on the shard group"
        assert any(m in r["fail_error"] for m in FAILURE_MARKERS), f"rank {rk}: R did not fail for real: {r['fail_error']!r}"
        ok, stale, total, detail = r["check"]
        assert ok and stale == 0 and total == len(r["r_sites"]), f"rank {rk}: verify failed: {detail}"
        assert r["rebound"] == total
        eq, why = r["equal"]
        assert eq, f"rank {rk}: continuation after rebind differs from the uninterrupted run: {why}"
        assert r["digest_perturbed"] != r["digest"] and r["digest_restored"] == r["digest"]
        assert len(r["digest"]) == 32
        if "check_regen" in r:
            assert r["check_regen"][0], f"rank {rk}: generation-2 rebind left stale references: {r['check_regen'][3]}"
            assert r["equal_regen"][0], f"rank {rk}: after the generation-2 rebind: {r['equal_regen'][1]}"
        if "ablation_error" in r:
            assert any(m in r["ablation_error"] for m in FAILURE_MARKERS), \
                f"rank {rk}: training on with stale references did not raise: {r['ablation_error']!r}"
    # replicas of R hold identical shards (digest equal); different shards differ
    key = (lambda rk: 0) if wrapper == "ddp" else (lambda rk: rk % ranks_per_node)
    by_class: dict[int, set] = {}
    for r in res:
        by_class.setdefault(key(r["rank"]), set()).add(r["digest"])
    assert all(len(d) == 1 for d in by_class.values()), f"replica digests differ: {by_class}"
    if wrapper != "ddp" and ranks_per_node > 1:
        assert len({next(iter(d)) for d in by_class.values()}) == ranks_per_node
