"""Physical links in the model (issue 25, spec/protocol.md section 13, P18): a link cut fails every
group across it, a failed failure flag is an observation and publishes the wide revoke, and an
episode rebuilds the groups over all of W only where that revoke was published (issue 40, P18.3); a
break no flag met stays latent and a later flag meets it.  The example runs of the spec replay; S15
and S16 hold on exhaustive search and their mutants break them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelpact.model.explore import explore
from accelpact.model.invariants import check_edge, check_state, no_healthy_rebuilt, wide_replaced
from accelpact.model.protocol import LINK_ACTIONS, Action, all_actions, initial_state, is_final
from accelpact.model.transitions import enabled, step
from accelpact.model.state import PC_TRAIN, Config

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
LINKS = Config(max_faults=1, failing="any", links=True, faults=frozenset({"link"}))
#: a cut, and the meeting of the latent break it left (one unit of the fault budget, P18.3)
LINKS2 = LINKS.with_(max_faults=2)


_action = Action.parse


def _runs() -> list[list[str]]:
    text = (ROOT / "spec" / "protocol.md").read_text()
    section = text[text.index("## 13. Faults as the world makes them"):]
    for name in (*LINK_ACTIONS, "S15", "`WideReplaced`", "replace-r-only", "wide: true", "S16", "`NoHealthyRebuilt`",
                 "rebuild-everything", "latent"):
        assert name in section, name
    blocks = re.findall(r"```link-run\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3
    out = []
    for block in blocks:
        lines = block.strip().splitlines()
        assert lines[-1] == "=> L1"
        out.append(" ".join(lines[:-1]).split())
    return out


#: per spec run: (generation every rank resumes in, the generation of its groups over W, comm per rank)
EXPECT = {
    # cut 0-2, no flag failed: only R = {0, 2} rebuilt, the groups over W kept (latent)
    0: (1, 0, [1, 0, 1, 0]),
    # the same, then the latent break met by rank 1's flag in generation 1: the groups over W rebuilt
    1: (2, 2, [1, 0, 1, 0]),
    # cut 0-3, the flags of 3 and 0 failed: the groups over W rebuilt, no group of R's kind
    2: (1, 1, [0, 0, 0, 0]),
}


@pytest.mark.parametrize("which", sorted(EXPECT))
def test_the_spec_link_runs_replay(which):
    """Each ``link-run`` of spec/protocol.md section 13 is a model behaviour: every step enabled, every
    property holds, the end is final with every rank resumed, holding the groups it must."""
    cfg = LINKS2
    s = initial_state(cfg)
    for tok in _runs()[which]:
        a = _action(tok)
        assert enabled(cfg, s, a), f"{tok} is not enabled"
        t = step(cfg, s, a)
        assert not check_state(cfg, t) and not check_edge(cfg, s, t), tok
        s = t
    gen, wide, comm = EXPECT[which]
    assert is_final(cfg, s)
    assert all(rk.pc == PC_TRAIN and not rk.hung and rk.gen == gen and rk.wide == wide for rk in s.ranks)
    assert [rk.comm for rk in s.ranks] == comm


def test_a_latent_break_is_met_only_by_a_rank_holding_it():
    """After the first spec run (cut 0-2 not learned), each rank's flag may meet the latent break in
    generation 1 (RankRevokeWide starts the episode, taking a unit of the fault budget); after the
    third (cut 0-3 learned, groups over W rebuilt) nothing is latent."""
    for which, latent in ((0, True), (2, False)):
        cfg = LINKS2
        s = initial_state(cfg)
        for tok in _runs()[which]:
            s = step(cfg, s, _action(tok))
        for r in cfg.world:
            assert enabled(cfg, s, Action("RankRevokeWide", r)) == latent
        if latent:
            t = step(cfg, s, Action("RankRevokeWide", 1))
            assert t.store.failed == (1, "boundary", frozenset()) and t.store.wide_revoked == frozenset({1})
            assert t.faults == s.faults + 1
            # with the fault budget spent, the break stays latent
            assert not enabled(LINKS, s, Action("RankRevokeWide", 1))


def test_a_link_fails_every_group_across_it():
    """FaultLinkCut's groups are the topology's: R's group of both ends if they share one (0-2 in
    2x2), none otherwise (0-3); the groups over W always.  Instances: pairs on two nodes only."""
    cfg = LINKS
    cuts = [a for a in all_actions(cfg) if a.name == "FaultLinkCut"]
    pairs = {(a.rank, a.arg.split("@")[0]) for a in cuts}
    assert pairs == {(0, "2"), (0, "3"), (1, "2"), (1, "3")}
    s0 = initial_state(cfg)
    same = step(cfg, s0, Action("FaultLinkCut", 0, "2@boundary"))
    cross = step(cfg, s0, Action("FaultLinkCut", 0, "3@boundary"))
    assert same.store.failed == (0, "boundary", frozenset({0})) and same.store.wide == frozenset({0})
    assert cross.store.failed == (0, "boundary", frozenset()) and cross.store.wide == frozenset({0})
    # across no group of R's kind nothing fails mid-step: only the boundary's flag or save meets it
    mid = step(cfg, s0, Action("FaultLinkCut", 0, "3@backward"))
    assert not enabled(cfg, mid, Action("RankObserve", 0, "backward"))
    assert enabled(cfg, mid, Action("RankObserve", 0, "boundary"))


def test_links_need_any_failing_groups():
    with pytest.raises(ValueError, match="links needs failing='any'"):
        Config(links=True)
    with pytest.raises(ValueError, match="nodes >= 2"):
        Config(nodes=1, ranks_per_node=2, affected_local=0, failing="any", links=True)


def test_wide_replaced_judges_the_ranks_groups_over_w():
    """S15 from recorded facts: a rank training past a generation whose wide revoke was published with
    groups over W of that generation or older is named; a link failure nobody learned of is not."""
    cfg = LINKS
    s = initial_state(cfg).with_store(wide=frozenset({0}))
    s = s.with_rank(1, gen=1, wide=0)
    assert wide_replaced(cfg, s) is None  # latent: not learned
    s = s.with_store(wide_revoked=frozenset({0}))
    assert "rank 1 trains in generation 1" in wide_replaced(cfg, s)
    assert wide_replaced(cfg, s.with_rank(1, gen=1, wide=1)) is None


def test_no_healthy_rebuilt_judges_the_step():
    """S16 on one step: a rank whose groups over W rise in generation g with no link failure since they
    were built, no death and no discard in g is named; a link failure in [w, g] excuses it."""
    cfg = LINKS
    before = initial_state(cfg).with_rank(1, pc="agreed")
    after = before.with_rank(1, pc="replaced", wide=1)
    assert "rank 1 rebuilt its groups over all of W in generation 0" in no_healthy_rebuilt(cfg, before, after)
    cut = after.with_store(wide=frozenset({0}))
    assert no_healthy_rebuilt(cfg, before.with_store(wide=frozenset({0})), cut) is None


def test_exhaustive_links_hold_and_the_mutants_break_s15_and_s16():
    """2x1 DDP with two link faults and a group failure (a cut, then a latent break met, fits the
    budget): every property holds, no deadlock; with ``replace-r-only`` S15 fails, with
    ``rebuild-everything`` S16."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, failing="any", links=True,
                 faults=frozenset({"link", "group_fail", "crash"}))
    ok = explore(cfg)
    assert ok.violated() == set() and not ok.deadlocks
    assert "S15" in explore(cfg.with_(mutant="replace-r-only")).violated()
    assert "S16" in explore(cfg.with_(mutant="rebuild-everything")).violated()
