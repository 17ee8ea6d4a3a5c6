"""FSDP2 (``fully_shard`` on a 2-D ("replicate", "shard") mesh) adapter against a REAL
replicate-group failure (S5 RebindComplete, S6 StatePreserved, RankValidate digests).

Reference counts: ``HSDPMeshInfo.replicate_process_group`` once per parameter group (L blocks +
root = L+1) plus the DeviceMesh ``_pg_registry`` entry; after the rebind the mesh's name lookup
(``mesh.get_group("replicate")``) returns the new communicator, also after a second failure
rebound with the SAME sites (discover once, rebind many). Skipping the rebind makes the next
backward raise.
"""
import pytest

from accelpact.testing import check_rebind_results, rebind_scenario

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(300)
def test_fsdp2_hsdp_2x2_rebind_after_real_failure(ranks):
    L = 4
    res = ranks.run(rebind_scenario, 4, init_group=True, timeout_s=240, wrapper="fsdp2-hybrid", layers=L,
                    regen=True).values()
    for r in res:
        infos = [p for p in r["r_sites"] if p.endswith("mesh_info.replicate_process_group")]
        registry = [p for p in r["r_sites"] if "._pg_registry[" in p]
        assert len(infos) == L + 1, r["r_sites"]
        assert len(registry) == 1 and len(r["r_sites"]) == L + 2, r["r_sites"]
        assert r["shard_sites"] == r["shard_walker"] == L + 2
        assert r["mesh_resolves_new"] is True
    check_rebind_results(res, "fsdp2-hybrid", 2, 2)


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.nightly('4x2 (about 19 s); the 2x2 rebind runs every time')
def test_fsdp2_hsdp_4x2_rebind_after_real_failure(ranks):
    res = ranks.run(rebind_scenario, 8, init_group=True, timeout_s=450, wrapper="fsdp2-hybrid",
                    nodes=4, ranks_per_node=2, layers=2, pre_steps=1, post_steps=1, ablation=False).values()
    check_rebind_results(res, "fsdp2-hybrid", 4, 2)
