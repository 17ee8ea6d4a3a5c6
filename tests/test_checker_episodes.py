"""The checker of a run told nothing (issue 42; spec/trace-checking.md, "A run told nothing" and
"Episodes"): one search per episode, each from the states the one before ended in, the finished
episodes' facts no step reads forgotten (``model/forget.py``).

* :func:`accelpact.model.forget.forget_past` is a bisimulation: on every state reachable from the
  initial state or from a forgotten state of each configuration named here, the state and its
  forgotten image have the same steps, to states with the same image (so an episode's search from
  the image accepts exactly the records it would accept from the state, and the outcome search
  reaches the same endings); two seeded over-forgettings (a link cut, a generation's store) are
  caught;
* the cut is complete on random model runs: every projected run with its faults unlogged is
  accepted episode by episode, as the whole search accepts it;
* real runs of the soak, told nothing (tests/data/told-nothing: a 10-minute soak's attempt of
  fifteen episodes, swaps, discards and refills among them; a 5-minute soak's with a shrink and a
  grow, no spare) are accepted, and each of five tamperings is rejected naming the rank whose
  record the model cannot explain;
* the supervisor's teardown: survivors torchrun killed after a death write no end record, and are
  accepted; the same traces with a survivor's resume after the death are not.

Pure Python, no torch."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from accelpact.conformance import checker as ck
from accelpact.conformance.checker import TraceChecker, check_told_nothing, episode_cuts, project
from accelpact.impl.trace import RankTrace, load_traces
from accelpact.model.explore import MANIFEST_CONFIGS
from accelpact.model.forget import forget_past
from accelpact.model.protocol import all_actions
from accelpact.model.state import Config, State, initial_state
from accelpact.model.transitions import successors

DATA = Path(__file__).parent / "data" / "told-nothing"

#: fast manifest configurations whose episodes leave what forget_past forgets: links (Store.wide),
#: swaps, a shrink and a refill, the store's loss
BISIMULATION = ("2x2-links-f1", "2x1-ddp-links-f2", "2x1-ddp-spare1-crash-f1", "2x1-ddp-shrink-refill-f1", "2x2-store-f2")


def _mismatches(cfg: Config, forget) -> tuple[int, int]:
    """(states forgotten, states whose steps differ from their image's) over the closure of the
    reachable states under the steps and ``forget``."""
    acts = all_actions(cfg)
    s0 = initial_state(cfg)
    seen: set[State] = {s0}
    todo = deque([s0])
    forgotten = bad = 0
    while todo:
        x = todo.popleft()
        nx = forget(cfg, x)
        succ = list(successors(cfg, x, acts))
        if nx != x:
            forgotten += 1
            mine = {(str(a), forget(cfg, t)) for a, t in succ}
            theirs = {(str(a), forget(cfg, t)) for a, t in successors(cfg, nx, acts)}
            bad += mine != theirs
        for t in [t for _a, t in succ] + [nx]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return forgotten, bad


@pytest.mark.parametrize("name", BISIMULATION)
def test_forgetting_the_past_keeps_every_step(name):
    forgotten, bad = _mismatches(MANIFEST_CONFIGS[name][0], forget_past)
    assert bad == 0, f"{name}: {bad} of {forgotten} forgotten states step differently from their image"
    if name in ("2x2-links-f1", "2x1-ddp-links-f2"):
        assert forgotten > 0, f"{name}: nothing forgotten: the check checks nothing"


def test_forgetting_a_cut_that_still_breaks_a_rank_is_caught():
    """Seeded: forget every link cut at the cut (a rank still holding groups a cut broke then looks
    healthy): the bisimulation check finds states whose steps differ."""
    def over(cfg, s):
        t = forget_past(cfg, s)
        return t.with_store(wide=frozenset()) if t.store.wide else t

    _forgotten, bad = _mismatches(MANIFEST_CONFIGS["2x1-ddp-links-f2"][0], over)
    assert bad > 0


def test_forgetting_the_store_of_a_generation_a_rank_is_in_is_caught():
    """Seeded: forget the store's entries (revokes, counters, decisions) of the least generation a rank
    is in too, one generation more than ``forget_past`` does: a rank still reading that generation's
    release (or adding to its counter) then steps differently, which the bisimulation check finds."""
    from accelpact.model import forget

    def over(cfg, s):
        t = forget_past(cfg, s)
        extra = forget._old_store(t.store, min(rk.gen for rk in t.ranks) + 1)
        return t.with_store(**extra) if extra else t

    _forgotten, bad = _mismatches(MANIFEST_CONFIGS["2x1-ddp-f1"][0], over)
    assert bad > 0


# ----------------------------------------------------------------- the cut, on random model runs

def _walk(cfg: Config, rng: random.Random, limit: int = 400):
    """A random model run whose faults strike between episodes (every rank training) and sometimes
    inside one (probability 0.1), so that most runs have several episodes."""
    acts = all_actions(cfg)
    s, path = initial_state(cfg), []
    for _ in range(limit):
        succ = list(successors(cfg, s, acts))
        if not succ:
            break
        calm = [x for x in succ if not x[0].name.startswith(("Fault", "RankTimeout", "RankSuspect", "Supervisor"))]
        between = all(rk.pc == "train" for rk in s.ranks)
        wild = rng.random() < (0.3 if between else 0.1)
        a, t = rng.choice(calm if calm and not wild else succ)
        path.append((a, s, t))
        s = t
    return path


def _unlogged(traces: dict[int, RankTrace]) -> dict[int, RankTrace]:
    out = {}
    for r, tr in traces.items():
        recs = [rec for rec in tr.records if not rec.action.startswith("Fault")]
        out[r] = RankTrace(r, [replace(rec, seq=i) for i, rec in enumerate(recs)], tr.header, tr.end)
    return out


@pytest.mark.timeout(300)
def test_random_runs_are_judged_alike_whole_and_episode_by_episode():
    """Completeness of the cut (spec/trace-checking.md, "Episodes"): random runs of the model, their
    faults unlogged, get the same verdict from the search cut at the episodes as from the search of
    the whole run (where that one ends within its budget); most are accepted, and most of those
    have more than one episode."""
    rng = random.Random(7)
    cfgs = [Config(max_faults=3, failing="any", advance=2, points=("boundary",), faults=frozenset({"group_fail"})),
            Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=3, spares=2,
                   points=("boundary",), faults=frozenset({"crash", "group_fail"})),
            Config(max_faults=3, spares=1)]
    several = runs = accepted = 0
    for cfg in cfgs:
        for _ in range(12):
            path = _walk(cfg, rng)
            tr = _unlogged(project(cfg, path))
            cuts = episode_cuts({r: t.records for r, t in tr.items()})
            if not cuts:
                continue
            whole = TraceChecker(cfg, tr, silent_faults=True, max_nodes=100_000).check()
            if "budget" in whole.message.splitlines()[0]:
                continue
            runs += 1
            v = TraceChecker(cfg, tr, silent_faults=True, episodes=True, max_nodes=100_000).check()
            assert v.accepted == whole.accepted, f"{[str(a) for a, _s, _t in path]}\nwhole: {whole.message}\ncut: {v.message}"
            accepted += v.accepted
            several += v.accepted and len(cuts) > 1
    assert runs >= 20 and accepted >= runs * 2 // 3 and several >= accepted // 3, (runs, accepted, several)


# ----------------------------------------------------------------------- real runs, told nothing

def _traces(name: str) -> dict[int, RankTrace]:
    (attempt, traces), = load_traces(DATA / name).items()
    return traces


@pytest.mark.parametrize("name,episodes", [("soak10-swaps", 15), ("soak0-shrink-grow", 6)])
def test_a_soak_attempt_told_nothing_is_accepted_whole(name, episodes):
    tr = _traces(name)
    assert len(episode_cuts({r: t.records for r, t in tr.items()}) or []) == episodes
    v = check_told_nothing(tr)
    assert v.accepted, v.message


def _middle(tr: dict[int, RankTrace], r: int, action: str) -> int:
    """The index of rank r's record ``action`` in the middle of its trace."""
    idx = [i for i, rec in enumerate(tr[r].records) if rec.action == action]
    assert idx, f"rank {r} has no {action} record"
    return idx[len(idx) // 2]


def _with(tr: dict[int, RankTrace], r: int, recs=None, end="keep") -> dict[int, RankTrace]:
    t = tr[r]
    recs = t.records if recs is None else [replace(rec, seq=i) for i, rec in enumerate(recs)]
    return {**tr, r: RankTrace(r, recs, t.header, t.end if end == "keep" else end)}


def _tampered(tr: dict[int, RankTrace], how: str, r: int) -> dict[int, RankTrace]:
    recs = list(tr[r].records)
    if how == "dropped":
        del recs[_middle(tr, r, "RankArrive")]
    elif how == "swapped":
        i = _middle(tr, r, "RankReplace")
        recs[i - 1], recs[i] = recs[i], recs[i - 1]
    elif how == "frontier":
        i = _middle(tr, r, "RankArrive")
        recs[i] = replace(recs[i], state={**recs[i].state, "frontier": recs[i].state["frontier"] + 1})
    elif how == "resume-added":
        i = _middle(tr, r, "RankResume")
        recs.insert(i + 1, recs[i])
    elif how == "end-removed":
        return _with(tr, r, end=None)
    return _with(tr, r, recs)


@pytest.mark.parametrize("how", ["dropped", "swapped", "frontier", "resume-added"])
@pytest.mark.parametrize("name", [pytest.param("soak10-swaps", marks=pytest.mark.nightly(
    "the four tamperings of the 15-episode soak attempt (about 30 s): the 6-episode shrink-and-grow attempt's run every time")),
    "soak0-shrink-grow"])
def test_a_tampered_soak_attempt_is_rejected_naming_the_record(name, how):
    """A record dropped, two records swapped, a frontier changed, a resume added: each rejected,
    naming the tampered rank's record.  (An end record removed from a rank that finished is a
    SIGKILL after its last collective to the model, which no peer observes: accepted as such, and
    caught by what the run's result files say, the soak judge's ``finished``; an end record removed
    from a rank the protocol ended is rejected: :func:`test_an_exit_without_its_end_record_is_rejected`.)"""
    tr = _traces(name)
    r = max(tr, key=lambda q: len(tr[q].records))  # the rank with the most records: one of every episode
    v = check_told_nothing(_tampered(tr, how, r))
    assert not v.accepted, f"{how}: accepted"
    assert r in v.unmatched or f"r{r}#" in v.message, v.message


# ------------------------------------------------------------------------ the supervisor's teardown

def _teardown_run():
    """A model run of a 2-rank DDP job without a spare: rank 1 dies in training, rank 0 observes the
    failure and guards; then torchrun's agent kills rank 0 (no end record) and the attempt ends."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, faults=frozenset({"crash", "group_fail"}))
    acts = all_actions(cfg)
    s, path = initial_state(cfg), []
    # a death in training without a spare is, to the model, the group failure it causes and the crash
    for name, rank in (("FaultGroupFail", None), ("FaultCrash", 1), ("RankObserve", 0), ("RankGuard", 0)):
        a, t = next((a, t) for a, t in successors(cfg, s, acts) if a.name == name and a.rank == rank)
        path.append((a, s, t))
        s = t
    tr = _unlogged(project(cfg, path))
    return cfg, {r: RankTrace(r, t.records, {**t.header, "nodes": 2, "ranks_per_node": 1, "group": "world"}, None)
                 for r, t in tr.items()}


def test_the_supervisors_teardown_after_a_death_is_accepted():
    cfg, tr = _teardown_run()
    assert [rec.action for rec in tr[0].records] == ["RankObserve", "RankGuard"] and tr[0].end is None
    v = TraceChecker(cfg, tr, silent_faults=True, episodes=True).check()
    assert v.accepted, v.message


def test_a_survivor_resuming_after_the_death_is_rejected():
    cfg, tr = _teardown_run()
    last = tr[0].records[-1]
    resume = replace(last, seq=last.seq + 1, action="RankResume", t_ns=last.t_ns + 1, state={**last.state, "pc": "train"})
    v = TraceChecker(cfg, _with(tr, 0, tr[0].records + [resume]), silent_faults=True, episodes=True).check()
    assert not v.accepted and (0 in v.unmatched or "r0#2" in v.message), v.message


def test_a_survivor_without_an_end_record_and_no_death_is_rejected():
    """Without a death or an exit no supervisor tears anyone down: a missing end record is a
    truncated trace (T4)."""
    cfg, tr = _teardown_run()
    fine = {r: RankTrace(r, [], t.header, {"type": "end", "rank": r, "outcome": "released"}) for r, t in tr.items()}
    v = TraceChecker(cfg, _with(fine, 0, end=None), silent_faults=False).check()
    assert not v.accepted and "end record" in v.message and "rank 0" in v.message, v.message


def _exit_run():
    """A model run of a 2-rank DDP job without a spare whose rank 1 dies at the boundary: rank 0
    observes the failure and exits by the protocol (its deadline), with its end record."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, points=("boundary",),
                 faults=frozenset({"crash", "group_fail"}))
    acts = all_actions(cfg)
    s, path = initial_state(cfg), []
    while True:
        succ = sorted(((a, t) for a, t in successors(cfg, s, acts)
                       if a.name == "FaultGroupFail" or (a.name == "FaultCrash" and a.rank == 1)
                       or (a.rank == 0 and not a.name.startswith("Fault"))),
                      key=lambda at: (at[0].name != "FaultGroupFail", at[0].name != "FaultCrash"))
        if not succ or s.ranks[0].pc == "exited":
            break
        a, t = succ[0]
        path.append((a, s, t))
        s = t
    assert s.ranks[0].pc == "exited", [str(a) for a, _s, _t in path]
    return cfg, _unlogged(project(cfg, path))


def test_an_exit_without_its_end_record_is_rejected():
    cfg, tr = _exit_run()
    assert tr[0].end is not None and tr[0].end.get("outcome") == "exited"
    v = TraceChecker(cfg, tr, silent_faults=True, episodes=True).check()
    assert v.accepted, v.message
    v = TraceChecker(cfg, _with(tr, 0, end=None), silent_faults=True, episodes=True).check()
    assert not v.accepted and "rank 0" in v.message, v.message


def test_episode_cuts_refuse_a_rank_going_back_a_generation():
    tr = _traces("soak0-shrink-grow")
    recs = {r: list(t.records) for r, t in tr.items()}
    r = max(recs, key=lambda q: len(recs[q]))
    recs[r].append(replace(recs[r][0], seq=len(recs[r])))
    assert episode_cuts(recs) is None
    assert ck.episode_cuts({r: list(t.records) for r, t in tr.items()}) is not None


# ----------------------------------------------------------------- the outcome search, reduced

#: scenarios small enough for the outcome search without its reduction (each a few seconds at most); the
#: last five have ranks outside the failed group whose observations are taken alone once every scripted
#: fault has fired (a second fault in phases 2-6, two episodes, two groups at once)
_OUTCOME_SCENARIOS = ("2x2-ddp-repair", "2x2-fsdp1-agree-crash-r2", "2x2-fsdp1-agree-hang-r3", "2x2-ddp-inflight-forward",
                      "2x1-ddp-spare1-boundary-crash-r1", "2x2-fsdp1-agree-store-loss-r0", "2x2-ddp-link-r0-r2-boundary",
                      "2x2-fsdp1-agree-exception-r3", "2x2-fsdp1-guard-dirty-guard-r3", "2x2-fsdp1-boundary-corrupt-state-r3",
                      "2x2-fsdp1-alternating-repairs", "2x2-fsdp1-two-groups-repair")


@pytest.mark.parametrize("name", _OUTCOME_SCENARIOS)
def test_the_reduced_outcome_search_finds_every_outcome(name):
    """``model_outcomes``' partial-order reduction (conformance/outcomes.py ``_ample``) finds the
    outcomes and exit reasons the full search finds, in fewer states."""
    from accelpact.conformance.outcomes import model_outcomes
    from accelpact.conformance.scenario import load_scenario

    sc = load_scenario(Path(__file__).parents[1] / "conformance" / "scenarios" / f"{name}.json")
    full, reduced = model_outcomes(sc, reduce=False), model_outcomes(sc)
    assert (reduced.outcomes, reduced.reasons, reduced.deadlocks) == (full.outcomes, full.reasons, full.deadlocks)
    assert reduced.states <= full.states


def test_an_outcome_search_reduced_too_far_is_caught(monkeypatch):
    """Seeded: take every observation alone, a member's of the failed group too (its observation past
    a partial collective needs a peer that saw the collective fail, which moving it first can disable
    for good): on two groups failing at once the reduced search loses the scenario's ending, which the
    comparison with the full search above catches."""
    from accelpact.conformance import outcomes
    from accelpact.conformance.scenario import load_scenario

    sc = load_scenario(Path(__file__).parents[1] / "conformance" / "scenarios" / "2x2-fsdp1-two-groups-repair.json")
    full = outcomes.model_outcomes(sc, reduce=False)
    alone = outcomes._alone
    monkeypatch.setattr(outcomes, "_alone", lambda cfg, s, r, a, corrupt, quiet: a.name == "RankObserve"
                        or alone(cfg, s, r, a, corrupt, quiet))
    seeded = outcomes.model_outcomes(sc)
    assert (seeded.outcomes, seeded.reasons, seeded.deadlocks) != (full.outcomes, full.reasons, full.deadlocks)
