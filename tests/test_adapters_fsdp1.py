"""FSDP1 HYBRID_SHARD adapter against a REAL replicate-group failure (S5 RebindComplete,
S6 StatePreserved, RankValidate digests).

Reference counts per torch-facts: replicate group 2(L+1) (``_inter_node_pg`` + comm-hook
``DefaultState.process_group`` slot), shard group 2(L+1)+1 (after the first forward); the adapter's
targeted sites equal the walker's; rebind after the failure continues bit-identically to an
uninterrupted run; skipping the rebind makes the next backward raise. Built from a 2-D
``device_mesh`` instead, the mesh's ``_pg_registry`` holds one more reference to each group.
"""
import pytest

from accelpact.testing import check_rebind_results, rebind_scenario

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(300)
def test_fsdp1_hybrid_2x2_rebind_after_real_failure(ranks):
    L = 4
    res = ranks.run(rebind_scenario, 4, init_group=True, timeout_s=240, wrapper="fsdp1-hybrid", layers=L).values()
    for r in res:
        assert len(r["r_sites"]) == 2 * (L + 1), r["r_sites"]
        assert sum(p.endswith("._inter_node_pg") for p in r["r_sites"]) == L + 1
        assert sum(p.endswith("._inter_node_state.process_group") for p in r["r_sites"]) == L + 1
        assert r["shard_sites"] == r["shard_walker"] == 2 * (L + 1) + 1
    check_rebind_results(res, "fsdp1-hybrid", 2, 2)


@pytest.mark.timeout(300)
@pytest.mark.nightly('fsdp1-zero2 2x2 (about 13 s); its in-flight discard runs every time (conformance '
                     '2x2-fsdp1-zero2-inflight-backward), the same adapter in the fsdp1-hybrid 2x2 rebind')
def test_fsdp1_zero2_2x2_rebind_after_real_failure(ranks):
    """Issue 39: _HYBRID_SHARD_ZERO2 caches both groups where HYBRID_SHARD does (the same counts), so
    the one FSDP1 adapter rebinds it, bit-identically."""
    L = 4
    res = ranks.run(rebind_scenario, 4, init_group=True, timeout_s=240, wrapper="fsdp1-zero2", layers=L).values()
    for r in res:
        assert r["adapter"] == "fsdp1" and len(r["r_sites"]) == 2 * (L + 1), r["r_sites"]
        assert r["shard_sites"] == r["shard_walker"] == 2 * (L + 1) + 1
    check_rebind_results(res, "fsdp1-zero2", 2, 2)


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.nightly('4x2 (about 16 s); the 2x2 rebind runs every time')
def test_fsdp1_hybrid_4x2_rebind_after_real_failure(ranks):
    L = 2
    res = ranks.run(rebind_scenario, 8, init_group=True, timeout_s=450, wrapper="fsdp1-hybrid",
                    nodes=4, ranks_per_node=2, layers=L, pre_steps=1, post_steps=1, ablation=False).values()
    for r in res:
        assert len(r["r_sites"]) == 2 * (L + 1)
    check_rebind_results(res, "fsdp1-hybrid", 4, 2)


def mesh_counts(ctx, layers):
    """FSDP1 HYBRID_SHARD built from a 2-D DeviceMesh: counts and adapter/walker agreement."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from accelpact.impl.launch import workload as W
    from accelpact.impl.runtime.adapters import adapter_for, find_references, site_set

    topo = W.Topology(2, 2)
    g = W.build_groups(topo, ctx.rank)
    torch.manual_seed(0)
    m = FSDP(W.CharLM(W.vocab_size(), W.WorkloadSpec(layers=layers)), device_mesh=g.mesh,
             sharding_strategy=ShardingStrategy.HYBRID_SHARD, auto_wrap_policy=ModuleWrapPolicy({W.Block}),
             device_id=torch.device("cpu"))
    x, _ = W.DataCursor(0, 4, 16, ctx.rank, 4).batch(0)
    m(x).sum().backward()  # the shard group's _ExecOrderData reference appears after the first forward
    out = {}
    for name in ("replicate", "shard"):
        pg = g.mesh.get_group(name)
        sites, walked = adapter_for(m).discover(m, pg), find_references(m, pg)
        out[name] = (len(sites), site_set(sites) == site_set(walked), [s.path for s in walked])
    return out


@pytest.mark.timeout(200)
def test_fsdp1_hybrid_device_mesh_counts(ranks):
    L = 2
    for r in ranks.run(mesh_counts, 4, init_group=True, timeout_s=150, layers=L).values():
        n, agree, paths = r["replicate"]
        assert agree and n == 2 * (L + 1) + 1, paths  # + the mesh's _pg_registry entry
        n, agree, paths = r["shard"]
        assert agree and n == 2 * (L + 1) + 1 + 1, paths


def full_shard_wrapper(ctx):
    """FSDP1 under each sharding strategy: what ``wrapper_of`` says of it (a wrapper's name, or the
    error's message): FULL_SHARD over the world group, the two hybrid strategies over (the world as
    the shard group, a one-rank replicate group), and a model whose units mix the two."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    from accelpact.impl.runtime.wrappers import wrapper_of

    replicate = [dist.new_group([r], backend="gloo") for r in range(ctx.world)][ctx.rank]
    hybrid = {"process_group": (ctx.group, replicate), "device_id": torch.device("cpu")}

    def named(m):
        try:
            return wrapper_of(m).name
        except ValueError as exc:
            return str(exc)

    torch.manual_seed(0)
    out = {"FULL_SHARD": named(FSDP(torch.nn.Linear(4, 4), process_group=ctx.group,
                                    sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu")))}
    for s in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
        out[s.name] = named(FSDP(torch.nn.Linear(4, 4), sharding_strategy=s, **hybrid))
    inner = FSDP(torch.nn.Linear(4, 4), sharding_strategy=ShardingStrategy._HYBRID_SHARD_ZERO2, **hybrid)
    out["mixed"] = named(FSDP(torch.nn.Sequential(inner, torch.nn.Linear(4, 4)),
                              sharding_strategy=ShardingStrategy.HYBRID_SHARD, **hybrid))
    return out


@pytest.mark.timeout(120)
def test_full_shard_fsdp1_is_not_taken_for_hybrid(ranks):
    """Issue 23: ``wrapper_of`` reads FSDP1's sharding_strategy: FULL_SHARD has no replicate group to
    repair, so it is refused with what to do, not taken for ``fsdp1-hybrid``.  Issue 39: the two hybrid
    strategies share the FSDP1 adapter and are two wrappers (two contract profiles): HYBRID_SHARD is
    ``fsdp1-hybrid``, _HYBRID_SHARD_ZERO2 ``fsdp1-zero2``; a model mixing them is neither."""
    for out in ranks.run(full_shard_wrapper, 2, init_group=True, timeout_s=90).values():
        msg = out["FULL_SHARD"]
        assert "FULL_SHARD has no replicate group" in msg and "HYBRID_SHARD" in msg, msg
        assert out["HYBRID_SHARD"] == "fsdp1-hybrid" and out["_HYBRID_SHARD_ZERO2"] == "fsdp1-zero2", out
        assert "mixes" in out["mixed"] or "in one model" in out["mixed"], out["mixed"]
