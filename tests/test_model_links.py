"""Physical links in the model (issue 25, spec/protocol.md section 13, P18): a link cut fails every
group across it, every episode rebuilds the groups over all of W, a failed failure flag is an
observation.  The example runs of the spec replay; S15 holds on exhaustive search and its mutant
breaks it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelpact.model.explore import all_resumed, explore
from accelpact.model.invariants import check_edge, check_state, wide_replaced
from accelpact.model.protocol import LINK_ACTIONS, Action, all_actions, initial_state, is_final
from accelpact.model.transitions import enabled, step
from accelpact.model.state import PC_TRAIN, Config

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
LINKS = Config(max_faults=1, failing="any", links=True, faults=frozenset({"link"}))


def _action(token: str) -> Action:
    m = re.fullmatch(r"([A-Za-z]+)\(([^)]*)\)", token)
    assert m, token
    name, arg = m.groups()
    rank, _, rest = arg.partition(",")
    return Action(name, int(rank), rest or None)


def _runs() -> list[list[str]]:
    text = (ROOT / "spec" / "protocol.md").read_text()
    section = text[text.index("## 13. Faults as the world makes them"):]
    for name in (*LINK_ACTIONS, "S15", "`WideReplaced`", "replace-r-only", "wide: true"):
        assert name in section, name
    blocks = re.findall(r"```link-run\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    out = []
    for block in blocks:
        lines = block.strip().splitlines()
        assert lines[-1] == "=> L1"
        out.append(" ".join(lines[:-1]).split())
    return out


@pytest.mark.parametrize("which", [0, 1])
def test_the_spec_link_runs_replay(which):
    """Each ``link-run`` of spec/protocol.md section 13 is a model behaviour: every step enabled, every
    property holds, the end is final with every rank resumed in generation 1 holding new groups over W."""
    cfg = LINKS
    s = initial_state(cfg)
    for tok in _runs()[which]:
        a = _action(tok)
        assert enabled(cfg, s, a), f"{tok} is not enabled"
        t = step(cfg, s, a)
        assert not check_state(cfg, t) and not check_edge(cfg, s, t), tok
        s = t
    assert is_final(cfg, s) and all_resumed(cfg, s)
    assert all(rk.pc == PC_TRAIN and rk.gen == 1 and rk.wide == 1 for rk in s.ranks)
    # the cut 0-2 crosses R = {0, 2} only: {1, 3} keeps its communicator; the cut 0-3 crosses none
    assert [rk.comm for rk in s.ranks] == ([1, 0, 1, 0] if which == 0 else [0, 0, 0, 0])


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
    """S15 from recorded facts: a rank training past a generation whose link failed with groups over W
    of that generation or older is named."""
    cfg = LINKS
    s = initial_state(cfg).with_store(wide=frozenset({0}))
    s = s.with_rank(1, gen=1, wide=0)
    assert "rank 1 trains in generation 1" in wide_replaced(cfg, s)
    assert wide_replaced(cfg, s.with_rank(1, gen=1, wide=1)) is None


def test_exhaustive_links_hold_and_the_mutant_breaks_s15():
    """2x1 DDP with two link faults and a group failure: every property holds, no deadlock; with
    ``replace-r-only`` S15 fails."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, failing="any", links=True,
                 faults=frozenset({"link", "group_fail", "crash"}))
    ok = explore(cfg)
    assert ok.violated() == set() and not ok.deadlocks
    bad = explore(cfg.with_(mutant="replace-r-only"))
    assert "S15" in bad.violated()
