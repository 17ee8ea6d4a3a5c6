"""The search's speed-ups against the plain search: the parallel search (model/engine_parallel.py)
builds the same graph as the sequential one, and ``ActionSpec.pcs`` (which lets the search skip an
action without asking its ``enabled``) never hides an enabled action."""

from __future__ import annotations

import multiprocessing

import pytest

from accelpact.model.engine import Search
from accelpact.model.engine_parallel import ParallelSearch
from accelpact.model.explore import explore, manifest_numbers
from accelpact.model.protocol import ACTIONS, all_actions, is_final
from accelpact.model.state import Config

SMALL = Config(max_faults=1)
CONFIGS = [
    SMALL,
    Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2),
    # hot swap on 2x2 with symmetry: a crash at the boundary (18k states; every point is 181k, nightly's size)
    Config(max_faults=1, spares=1, faults=frozenset({"crash"}), points=("boundary",)),
    # a crash at every point, with the discard of the uncommitted step: DDP 2x1
    Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, spares=1, faults=frozenset({"crash"})),
]


def _graph(search: Search) -> tuple[set, set]:
    """The graph by value: its states, and its edges as (state, state, first action)."""
    states = [search.states[n] for n in range(len(search.states))]
    edges = {(states[u], states[search.dst[e]], search.actions[search.lab[e]])
             for u in range(len(search.off) - 1) for e in range(search.off[u], search.off[u + 1])}
    return set(states), edges


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.nodes}x{c.ranks_per_node}-f{c.max_faults}-{c.failing}-s{c.spares}-{'+'.join(c.points)}")
def test_parallel_search_builds_the_sequential_graph(cfg):
    one = Search(cfg, symmetry=True)
    assert one.run(stop=False) == []
    two = ParallelSearch(cfg, symmetry=True)
    try:
        assert two.run(stop=False) == []
        assert (len(two.states), two.transitions, two.edges, two.depth) == (len(one.states), one.transitions, one.edges, one.depth)
        assert _graph(two) == _graph(one)
        # BFS levels and parents: each state's level is its distance, and its parent is one level up
        pos = {two.states[n]: n for n in range(len(two.states))}
        for n, st in enumerate(one.states):
            m = pos[st]
            assert two.level[m] == one.level[n]
            assert (two.parent[m] < 0) == (one.parent[n] < 0)
            if two.parent[m] >= 0:
                assert two.level[two.parent[m]] == two.level[m] - 1
        assert two.aborted_mask() == bytearray(1 if two.states[n].store.abort or two.states[n].store.down else 0
                                               for n in range(len(two.states)))
        for n in range(len(two.states)):
            if two.off[n] == two.off[n + 1]:
                assert two.is_final_node(n) == is_final(cfg, two.states[n])
    finally:
        two.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["2x2-f1", "2x1-ddp-f2"])
def test_parallel_explore_agrees_with_sequential(cfg):
    """The whole exploration (safety, L1, L2, L3) gives the same numbers with two workers."""
    one, two = explore(cfg, workers=1), explore(cfg, workers=2)
    assert manifest_numbers(two) == manifest_numbers(one)
    assert two.liveness == one.liveness and two.ok


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant,faults", [
    ("timeout-leaves-decision-open", {"group_fail", "delay"}),
    ("skip-validation", {"group_fail", "corrupt"}),
])
def test_parallel_explore_catches_mutants_as_sequential(mutant, faults):
    """A mutant is caught with a counterexample of the same (shortest) length (on its smallest
    configuration, tests/test_model_mutants.py's SMALLEST: 2x1, two faults at the boundary)."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=2, faults=frozenset(faults),
                 points=("boundary",), mutant=mutant)
    one, two = explore(cfg, workers=1), explore(cfg, workers=2)
    assert not one.ok and not two.ok
    assert len(two.violations[0].counterexample) == len(one.violations[0].counterexample)


@pytest.mark.timeout(300)
@pytest.mark.nightly("two search processes expand 65,536 states of 2x2-f2 before the first progress call (about 55 s)")
def test_interrupted_parallel_search_leaves_no_worker():
    class Stop(Exception):
        pass

    def progress(_search):
        raise Stop

    search = ParallelSearch(Config(max_faults=2), symmetry=True)
    with pytest.raises(Stop):
        search.run(stop=True, progress=progress)
    assert not [p for p in multiprocessing.active_children() if p.is_alive()]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.nodes}x{c.ranks_per_node}-f{c.max_faults}-{c.failing}-s{c.spares}-{'+'.join(c.points)}")
def test_action_pcs_never_hide_an_enabled_action(cfg):
    """``ActionSpec.pcs`` is a necessary condition of ``enabled``: on every reachable state, an
    enabled action's actor is in one of its declared program counters (asked of every action, not
    through the search's skipping)."""
    search = Search(cfg, symmetry=True)
    search.run(stop=False)
    declared = [(a, ACTIONS[a.name]) for a in all_actions(cfg) if ACTIONS[a.name].pcs is not None]
    assert declared
    for s in search.states:
        for a, spec in declared:
            if spec.enabled(cfg, s, a.rank, a.arg):
                assert s.ranks[a.rank].pc in spec.pcs, f"{a} is enabled with its rank in {s.ranks[a.rank].pc}"
