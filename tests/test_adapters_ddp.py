"""DDP adapter against a REAL failure of its group R (the data-parallel world) (S5 RebindComplete,
S6 StatePreserved, RankValidate digests).

DDP caches the group in ``ddp.process_group`` (1 Python reference) and in the C++ Reducer, which
no walk sees: ``_update_process_group`` must be used. Ablation: rewriting only the Python-visible
reference (GenericAdapter) leaves the Reducer on the dead group and the next backward raises.
A second failure is rebound with the same sites (discover once, rebind many).
"""
import pytest

from accelpact.testing import check_rebind_results, rebind_scenario

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(300)
def test_ddp_2x2_rebind_after_real_failure(ranks):
    res = ranks.run(rebind_scenario, 4, init_group=True, timeout_s=240, wrapper="ddp", ablation="python-only",
                    regen=True).values()
    for r in res:
        assert r["r_sites"] == ["model.process_group"]
        assert r["python_only_rebound"] == 1  # the walker saw (and rewrote) only the Python attribute
    check_rebind_results(res, "ddp", 2, 2)


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.nightly("4x2 (about 15 s); the 2x2 rebind runs every time, and DDP repairs in test_hsdp_boundary_failure_repaired_in_place[ddp]")
def test_ddp_4x2_rebind_after_real_failure(ranks):
    res = ranks.run(rebind_scenario, 8, init_group=True, timeout_s=450, wrapper="ddp",
                    nodes=4, ranks_per_node=2, layers=2, pre_steps=1, post_steps=1, ablation=False).values()
    check_rebind_results(res, "ddp", 4, 2)
