"""Shrink, grow and refill in the model (issue 41, spec/protocol.md section 14, P19).

The spec's ``shrink-run`` replays step by step with every property holding; the decisions and
the accounting are checked against facts computed here (the replicas' ranks, the micro-batch
count), and the pinned configurations hold every property in exhaustive search
(tests/test_model_explore.py compares their counts with model/manifest.json).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelpact.model import hotswap
from accelpact.model.batches import ShareError, loss_weight, share
from accelpact.model.explore import MANIFEST_CONFIGS, explore
from accelpact.model.invariants import check_edge, check_state
from accelpact.model.protocol import ELASTIC_ACTIONS, Action, all_actions, initial_state, is_final
from accelpact.model.state import PC_JOINED, PC_LEFT, PC_TRAIN, Config
from accelpact.model.transitions import enabled, step

ROOT = Path(__file__).resolve().parents[1]
HSDP = Config(max_faults=1, shrink=True, refill=True, faults=frozenset({"crash"}), points=("boundary",))
DDP3 = Config(nodes=3, ranks_per_node=1, affected_local=0, group="world", max_faults=1, shrink=True,
              faults=frozenset({"crash"}), points=("boundary",), micro_batches=6)


_action = Action.parse


def _run() -> list[str]:
    text = (ROOT / "spec" / "protocol.md").read_text()
    section = text[text.index("## 14. Shrink, grow and refill"):]
    for name in (*ELASTIC_ACTIONS, "S17", "`BatchConserved`", "S18", "`ShardsHeld`", "fixed-share", "shrink-last-replica",
                 "refill-double-count"):
        assert name in section, name
    (block,) = re.findall(r"```shrink-run\n(.*?)```", section, flags=re.S)
    lines = block.strip().splitlines()
    assert lines[-1] == "=> L1"
    return " ".join(lines[:-1]).split()


def test_share_is_round_robin_and_covers_the_step():
    for total in (1, 4, 6, 7):
        for active in ([0], [0, 1], [0, 2], [1, 2, 3]):
            got = sorted(b for i in active for b in share(i, active, total))
            assert got == list(range(total))
    assert share(2, [0, 2], 5) == (1, 3)
    assert loss_weight([0, 2], 4) == 0.5
    with pytest.raises(ShareError, match="not in the data-parallel dimension"):
        share(1, [0, 2], 4)
    with pytest.raises(ShareError, match="at least one micro-batch"):
        share(0, [0], 0)


def test_the_spec_shrink_run_replays():
    """Every step enabled and safe; after the shrink the one replica left processes both micro-batches
    of a step; after the grow every rank trains again, the grown identities held by spares (inc 1)
    with the state of their live replica, and each replica processes one micro-batch."""
    cfg = HSDP
    s = initial_state(cfg)
    for tok in _run():
        a = _action(tok)
        assert enabled(cfg, s, a), f"{tok} is not enabled"
        t = step(cfg, s, a)
        assert not check_state(cfg, t) and not check_edge(cfg, s, t), (tok, check_state(cfg, t), check_edge(cfg, s, t))
        s = t
        if tok == "RankResume(3)" and s.ranks[3].gen == 1:
            assert s.store.out == frozenset({0}) and s.ranks[0].pc == PC_LEFT
            assert {(r, sh) for g, r, sh in s.shares if g == 0} == {(2, (0, 1)), (3, (0, 1))}
    assert is_final(cfg, s) and not s.supervisor
    assert all(rk.pc == PC_TRAIN and rk.gen == 2 for rk in s.ranks)
    assert [rk.inc for rk in s.ranks] == [1, 1, 0, 0]
    assert {(r, sh) for g, r, sh in s.shares if g == 1} == {(0, (0,)), (1, (0,)), (2, (1,)), (3, (1,))}
    assert s.store.out == frozenset() and s.store.shrunk == {(0, 0)} and s.store.grown == {(1, 0)}
    # the pool: one survivor left, one keeper refill, two claims by the grow
    assert s.pooled == {("leave", 0, 0), ("refill", 0, 1)} and s.store.spares == 0


def test_no_elastic_action_without_the_opt_in():
    """A job that does not opt in is the classic one: no shrink, grow or refill action exists, and a
    death with no spare idle is L2 (the contract's decision)."""
    for cfg in (Config(), Config(spares=1), Config(refill=True)):
        names = {a.name for a in all_actions(cfg)}
        for name, flag in ELASTIC_ACTIONS.items():
            assert (name in names) == bool(getattr(cfg, flag)), (cfg, name)
    no = Config(max_faults=1, refill=True, faults=frozenset({"crash"}), points=("boundary",))
    s = step(no, initial_state(no), Action("FaultCrash", 1, "boundary"))
    assert not hotswap.claim_decision(no, s, 0).preserve


def test_a_shrink_needs_every_shard_to_keep_a_replica():
    """Two deaths in the two replicas of 2x2 leave no copy of shard 1 staying: the decision is L2,
    not a shrink; one death leaves both shards with a replica: a shrink."""
    cfg = HSDP.with_(max_faults=2, refill=False)
    s = step(cfg, initial_state(cfg), Action("FaultCrash", 1, "boundary"))
    d = hotswap.claim_decision(cfg, s, 0)
    assert d.preserve and d.shrink
    s2 = step(cfg, s, Action("FaultCrash", 2, "boundary"))
    assert not hotswap.claim_decision(cfg, s2, 0).preserve
    # a spare idle: the swap, never a shrink
    sp = cfg.with_(spares=1)
    t = step(sp, initial_state(sp), Action("FaultCrash", 1, "boundary"))
    d = hotswap.claim_decision(sp, t, 0)
    assert d.preserve and not d.shrink


def test_a_joined_spare_of_a_leaving_replica_returns_to_the_pool():
    """2x2, one spare: rank 0 dies and a spare takes it; rank 1 dies at the same point before anyone
    arrived: no spare is left for it, node 0's replica leaves, and the spare that joined as 0 leaves
    with it (back into the pool)."""
    cfg = HSDP.with_(max_faults=2, refill=False, spares=1)
    s = initial_state(cfg)
    for tok in ("FaultCrash(0,boundary)", "RankObserve(2,boundary)", "RankClaimSpare(2)", "SpareJoin(0)",
                "FaultCrash(1,boundary)", "RankObserve(3,boundary)", "RankShrink(3)", "RankLeave(0)"):
        a = _action(tok)
        assert enabled(cfg, s, a), tok
        s = step(cfg, s, a)
        assert not check_state(cfg, s), (tok, check_state(cfg, s))
    assert s.ranks[0].pc == PC_LEFT and s.store.spares == 1 and s.store.out == frozenset({0})
    assert not any(rk.pc == PC_JOINED for rk in s.ranks)


def test_ddp_shrink_keeps_six_micro_batches_over_two_replicas():
    """DDP 3x1, M = 6: rank 1 dies; ranks 0 and 2 resume processing (0, 2, 4) and (1, 3, 5)."""
    cfg = DDP3
    s = initial_state(cfg)
    s = step(cfg, s, Action("FaultCrash", 1, "boundary"))
    for tok in ("RankObserve(0,boundary)", "RankObserve(2,boundary)", "RankShrink(0)", "RankGuard(0)", "RankGuard(2)",
                "RankArrive(0)", "RankArrive(2)", "RankDecideAgreement(2)", "RankAwaitAgreement(0)", "RankAwaitAgreement(2)",
                "RankReplace(0)", "RankReplace(2)", "RankRebind(0)", "RankRebind(2)", "RankValidate(0)", "RankValidate(2)",
                "RankReady(0)", "RankReady(2)", "RankDecideRelease(2)", "RankResume(0)", "RankResume(2)"):
        a = _action(tok)
        assert enabled(cfg, s, a), tok
        s = step(cfg, s, a)
        assert not check_state(cfg, s), (tok, check_state(cfg, s))
    assert {(r, sh) for _g, r, sh in s.shares} == {(0, (0, 2, 4)), (2, (1, 3, 5))}
    assert is_final(cfg, s)


@pytest.mark.parametrize("name", ["2x1-ddp-shrink-refill-f1"])
def test_a_fast_shrink_configuration_holds_every_property(name):
    r = explore(MANIFEST_CONFIGS[name][0])
    assert r.ok, [(v.property, v.message) for v in r.violations]
    assert r.liveness and all(r.liveness.values()), r.liveness
