"""FSDP1 HYBRID_SHARD adapter against a REAL replicate-group failure (S5 RebindComplete,
S6 StatePreserved, RankValidate digests).

Reference counts per torch-facts: replicate group 2(L+1) (``_inter_node_pg`` + comm-hook
``DefaultState.process_group`` slot), shard group 2(L+1)+1 (after the first forward); the adapter's
targeted sites equal the walker's; rebind after the failure continues bit-identically to an
uninterrupted run; skipping the rebind makes the next backward raise.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _mpwork  # noqa: E402

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(300)
def test_fsdp1_hybrid_2x2_rebind_after_real_failure(tmp_path):
    L = 4
    res = _mpwork.run_ranks(_mpwork.rebind_scenario, 4, tmp_path, timeout=240, wrapper="fsdp1-hybrid", layers=L)
    for r in res:
        assert len(r["r_sites"]) == 2 * (L + 1), r["r_sites"]
        assert sum(p.endswith("._inter_node_pg") for p in r["r_sites"]) == L + 1
        assert sum(p.endswith("._inter_node_state.process_group") for p in r["r_sites"]) == L + 1
        assert r["shard_sites"] == r["shard_walker"] == 2 * (L + 1) + 1
    _mpwork.assert_rebind_results(res, "fsdp1-hybrid", 2, 2)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_fsdp1_hybrid_4x2_rebind_after_real_failure(tmp_path):
    L = 2
    res = _mpwork.run_ranks(_mpwork.rebind_scenario, 8, tmp_path, timeout=450, wrapper="fsdp1-hybrid",
                            nodes=4, ranks_per_node=2, layers=L, pre_steps=1, post_steps=1, ablation=False)
    for r in res:
        assert len(r["r_sites"]) == 2 * (L + 1)
    _mpwork.assert_rebind_results(res, "fsdp1-hybrid", 4, 2)
