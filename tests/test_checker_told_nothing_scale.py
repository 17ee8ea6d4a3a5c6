"""A run told nothing, at the sizes users run (issue 42; spec/trace-checking.md, "Episodes"): random
model runs of several episodes (``checker.random_run``: every rank's steps interleaved as a real run's
may, the faults unlogged, each node's clock shifted by hours) are accepted in one walk per episode,
and a record changed is rejected naming its rank.

The walk is what keeps a 64-rank run's check in seconds: the search of an episode starts from the
first state the one before ends in (``checker.EpisodeSearch``, lazily chained), and a silent group
failure is tried first for the group whose records say it rebuilt its communicator.  Before both, a
64-rank run of three episodes took 6,249 nodes (every other group's failure walked to its end in each
episode).  Node counts, not seconds: nothing here is timed.  Pure Python, no torch."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from accelpact.conformance.checker import check_told_nothing, episode_cuts, project, random_run
from accelpact.impl.trace import RankTrace
from accelpact.model.state import Config

#: three hours: how far apart the nodes' monotonic clocks may be
SKEW_NS = 3 * 3600 * 10**9


def _told_nothing(nodes: int, rpn: int, episodes: int, seed: int) -> dict[int, RankTrace]:
    """The traces of a random run of ``episodes`` boundary failures of random groups, as a user's run
    records them: no fault record, each node's clock shifted."""
    cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=rpn - 1, failing="any", max_faults=episodes,
                 points=("boundary",), faults=frozenset({"group_fail"}))
    rng = random.Random(seed)
    traces = project(cfg, random_run(cfg, rng, episodes=episodes))
    skew = [rng.randrange(SKEW_NS) for _ in range(nodes)]
    out = {}
    for r, tr in traces.items():
        recs = [rec for rec in tr.records if not rec.action.startswith("Fault")]
        out[r] = RankTrace(r, [replace(rec, seq=i, t_ns=rec.t_ns * 1000 + skew[r // rpn]) for i, rec in enumerate(recs)],
                           tr.header, tr.end)
    return out


@pytest.mark.parametrize("nodes,rpn,episodes,seed", [(4, 4, 3, 0), (4, 4, 5, 1), (8, 8, 3, 2)])
def test_a_random_run_told_nothing_is_accepted_in_one_walk_per_episode(nodes, rpn, episodes, seed):
    tr = _told_nothing(nodes, rpn, episodes, seed)
    records = sum(len(t.records) for t in tr.values())
    assert len(episode_cuts({r: t.records for r, t in tr.items()}) or []) == episodes
    v = check_told_nothing(tr)
    assert v.accepted, v.message
    # one node per record, one start and one silent group failure per episode (eager chaining with the
    # model's order of silent faults: 6,249 nodes for the 64-rank run's 1,398 records)
    assert v.nodes <= records + 2 * episodes, (v.nodes, records)


def test_random_runs_interleave_the_ranks():
    """``random_run`` is no rank-by-rank schedule: in some episode a rank guards before a peer observes."""
    cfg = Config(nodes=4, ranks_per_node=4, affected_local=3, failing="any", max_faults=2, points=("boundary",),
                 faults=frozenset({"group_fail"}))
    path = random_run(cfg, random.Random(0), episodes=2)
    first = [a.name for a, s, _t in path if a.rank is not None and s.ranks[a.rank].gen == 0]  # the first episode's steps
    assert first.index("RankGuard") < len(first) - 1 - first[::-1].index("RankObserve")
    assert sum(1 for a, _s, _t in path if a.name == "FaultGroupFail") == 2
    assert all(rk.gen == 2 and rk.pc == "train" for rk in path[-1][2].ranks)  # both repaired


def test_a_frontier_changed_in_a_random_run_is_rejected_naming_the_rank():
    tr = _told_nothing(2, 2, 3, 0)
    r = max(tr, key=lambda q: len(tr[q].records))
    recs = list(tr[r].records)
    arrives = [i for i, rec in enumerate(recs) if rec.action == "RankArrive"]
    i = arrives[len(arrives) // 2]
    recs[i] = replace(recs[i], state={**recs[i].state, "frontier": recs[i].state["frontier"] + 1})
    v = check_told_nothing({**tr, r: RankTrace(r, recs, tr[r].header, tr[r].end)})
    assert not v.accepted
    assert r in v.unmatched and v.gen == recs[i].gen, v.message
