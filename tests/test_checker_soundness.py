"""The trace checker's shortcuts are sound for the model as it is (spec/trace-checking.md "Before
the search" and "Partial-order reduction"): each claim they rest on is checked here on random model
runs, so a change of the model that breaks one fails a test instead of making the checker reject an
honest trace (or accept a false one).

* the per-rank local automaton (``checker_precheck.LOCAL_STEPS``) and what the checks before the
  search assume of a rank's own variables, of the store's counters and decisions;
* every projected model run passes the checks before the search, with every fault logged or not;
* the steps the search takes alone commute with every step that can happen beside them.

Random walks, seeded: deterministic.  Pure Python, no torch."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from accelpact.conformance import checker as ck
from accelpact.conformance.checker import _held, project
from accelpact.conformance.checker_precheck import EXIT_REASON, LOCAL_STEPS, precheck
from accelpact.impl.trace import RankTrace
from accelpact.model.protocol import ACTIONS, all_actions, true_lookup
from accelpact.model.transitions import enabled, step, successors
from accelpact.model.state import PC_CRASHED, PC_EXITED, PC_RESTARTED, Config, Rank, State, initial_state

#: the fault kinds one at a time (each reaches its own corner: the walks are short), then all of them
_KINDS = ("crash", "hang", "raise", "corrupt", "drop", "delay", "mismatch", "dirty_guard", "store_loss")
CONFIGS = [Config(max_faults=2, points=("boundary",), faults=frozenset({"group_fail", k})) for k in _KINDS
           if k in {s.fault_kind for s in ACTIONS.values()}] + [
    Config(max_faults=2),
    Config(max_faults=3),
    Config(group="world", max_faults=2),
    Config(failing="any", max_faults=3),
    Config(nodes=3, ranks_per_node=2, max_faults=2),
    Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=3),
]
if "advance" in Config.__dataclass_fields__:  # F moves between episodes
    CONFIGS.append(Config(max_faults=3, points=("boundary",), faults=frozenset({"group_fail", "mismatch"}), advance=2))


def walks(cfg: Config, rng: random.Random, n: int, limit: int = 120, calm: float = 0.85):
    """``n`` random model runs (lists of (pre, action, post)); protocol steps are preferred to faults
    and timeouts (probability ``calm``) so that runs reach the later phases."""
    acts = all_actions(cfg)
    for _ in range(n):
        s = initial_state(cfg)
        path = []
        for _ in range(limit):
            succ = list(successors(cfg, s, acts))
            if not succ:
                break
            quiet = [x for x in succ if not x[0].name.startswith(("Fault", "RankTimeout", "RankExpire", "Supervisor"))]
            a, t = rng.choice(quiet if quiet and rng.random() < calm else succ)
            path.append((s, a, t))
            s = t
        yield path


def _history_free(s: State) -> State:
    """The state without its history variables (read by invariants only, never by a step)."""
    return replace(s, resumed=frozenset(), agreed=frozenset(), exits=frozenset(), shares=frozenset(), pooled=frozenset())


@pytest.mark.timeout(120)
def test_every_action_has_a_local_step():
    """A new model action must be classified for the checks before the search (a missing one is
    only not checked: safe, but the table would silently lose its teeth)."""
    missing = sorted(set(ACTIONS) - set(LOCAL_STEPS) - {"SupervisorRestart"})
    assert not missing, f"classify {missing} in conformance/checker_precheck.py LOCAL_STEPS"


def test_local_pre_pcs_are_the_models():
    """Issue 23: where both say which pcs an action's actor may be in before it, LOCAL_STEPS says what
    the model's ``ActionSpec.pcs`` says (a narrower set would reject honest traces, e.g. a joined spare's
    RankTimeout; a wider one loses teeth)."""
    both = [a for a in ACTIONS if a in LOCAL_STEPS and LOCAL_STEPS[a][0] is not None and ACTIONS[a].pcs is not None]
    assert len(both) >= 15, both
    differ = {a: (sorted(LOCAL_STEPS[a][0]), sorted(ACTIONS[a].pcs)) for a in both if LOCAL_STEPS[a][0] != ACTIONS[a].pcs}
    assert not differ, f"LOCAL_STEPS pre-pcs vs ActionSpec.pcs: {differ}"
    # an action the model bounds is bounded here too
    assert not [a for a in LOCAL_STEPS if a in ACTIONS and ACTIONS[a].pcs is not None and LOCAL_STEPS[a][0] is None]


@pytest.mark.timeout(120)
def test_local_steps_match_the_model():
    """Each step of random runs: the actor's pc before is one LOCAL_STEPS allows and after the one
    it names; no other rank changes (but by the supervisor's restart); generation, communicator,
    references, point and reason change only where the checks before the search assume; the abort
    key and each decision are written once; the counters count every add once."""
    rng = random.Random(1)
    steps = 0
    for cfg in CONFIGS:
        w = len(cfg.world)
        for path in walks(cfg, rng, 15):
            for s, a, t in path:
                steps += 1
                if a.name == "SupervisorRestart":
                    assert all(rk.pc == PC_RESTARTED for rk in t.ranks)
                    continue
                for q in cfg.world:
                    if q != a.rank and not (a.name == "RankStartGrow" and (s.ranks[q].gen, q) not in s.store.dead
                                            and (t.ranks[q].gen, q) in t.store.dead):  # a grow stands the vacant seats dead
                        assert t.ranks[q] == s.ranks[q], f"{a} changed rank {q}"
                if s.store.abort:
                    assert t.store.abort == s.store.abort, f"{a} rewrote the abort key"
                for key in ("agree", "release"):
                    for g, v in getattr(s.store, key):
                        assert true_lookup(getattr(t.store, key), g) == v, f"{a} rewrote {key}[{g}]"
                for rows, last in (("arrivals", "last_arriver"), ("ready", "last_ready")):
                    new = set(getattr(t.store, rows)) - set(getattr(s.store, rows))
                    assert len(new) <= 1 and all(x[1] == a.rank for x in new), f"{a} added {new} to {rows}"
                    for g, r in set(getattr(t.store, last)) - set(getattr(s.store, last)):
                        n = sum(1 for x in getattr(t.store, rows) if x[0] == g)
                        assert r == a.rank and (n == w or cfg.shrink and n < w)  # a shrink's barrier: the ranks in it
                if a.rank is None or a.name in ("SpareJoin", "RankFenced", "KeeperRefill"):
                    continue  # a spare, a deposed process or a keeper acts on a seat, not as its rank (P16, P19.4)
                pre, post = LOCAL_STEPS[a.name]
                b, e = s.ranks[a.rank], _held(s, t, a.rank)  # an exit record reports what the rank held
                if e.pc == PC_EXITED:  # ... which the model's exited rank no longer holds
                    assert t.ranks[a.rank] == Rank(pc=PC_EXITED, gen=b.gen, reason=e.reason, delayed=b.delayed)
                assert pre is None or b.pc in pre, f"{a} from pc {b.pc}"
                assert e.pc == (post or b.pc), f"{a}: pc {b.pc} -> {e.pc}, LOCAL_STEPS says {post}"
                assert e.gen == b.gen + (a.name == "RankResume")
                # a RankReplace moves R's communicator where the rank rebuilt R (its record then names it)
                assert e.comm in ((b.gen + 1, b.comm) if a.name == "RankReplace" else (b.comm,))
                assert e.wide in ((b.gen + 1, b.wide) if a.name == "RankReplace" else (b.wide,))  # kept unless their failure was learned (P18.3)
                assert e.refs == ((b.gen + 1,) * cfg.refs if a.name == "RankRebind" else b.refs)
                if a.name == "RankObserve":
                    assert e.point
                else:
                    want = {"RankResume": "", "RankDiscardStep": "boundary"}.get(a.name, b.point)  # P17.3: at F again
                    assert e.point == want, f"{a} moved the point"
                if a.name in EXIT_REASON:
                    assert e.reason == (EXIT_REASON[a.name] or s.store.abort) and e.reason
                else:
                    assert e.reason == b.reason
                assert b.pc not in (PC_EXITED, PC_CRASHED, PC_RESTARTED) or a.name == "FaultGroupFail"
    assert steps > 5000


def _unlogged(traces: dict[int, RankTrace]) -> dict[int, RankTrace]:
    """The traces with every fault record but the group failures removed (faults taken silently)."""
    out = {}
    for r, tr in traces.items():
        recs = [rec for rec in tr.records if not rec.action.startswith("Fault") or rec.action == "FaultGroupFail"]
        out[r] = RankTrace(r, [replace(rec, seq=i) for i, rec in enumerate(recs)], tr.header, tr.end)
    return out


@pytest.mark.timeout(180)
def test_model_runs_pass_the_checks_before_the_search():
    """Soundness of the checks before the search: the projection of every random model run passes
    them, and is accepted; with its faults unlogged (taken as silent steps) it still passes them."""
    rng = random.Random(2)
    runs = 0
    for cfg in CONFIGS:
        for path in walks(cfg, rng, 15, calm=0.7):
            runs += 1
            tr = project(cfg, [(a, s, t) for s, a, t in path])
            found = precheck(cfg, tr, silent_possible=lambda name, r: False)
            assert not found, [f.line() for f in found]
            v = ck.check_traces(cfg, tr, max_nodes=50_000)
            assert v.accepted or "budget" in v.message, v.message
            found = precheck(cfg, _unlogged(tr), silent_possible=lambda name, r: True)
            assert not found, [f.line() for f in found]
    assert runs >= 200


def _view(a, pre: State, post: State) -> tuple:
    """What a record of step pre --a--> post is compared with (checker.disagreement)."""
    r, g = a.rank, pre.ranks[a.rank].gen
    out: tuple = (post.ranks[r],)
    if a.name == "RankDecideAgreement":
        out += (true_lookup(post.store.agree, g),)
    if a.name == "RankDecideRelease":
        out += (true_lookup(post.store.release, g),)
    for name, rows, last in (("RankArrive", "arrivals", "last_arriver"), ("RankReady", "ready", "last_ready")):
        if a.name == name:
            out += ((g, r) in getattr(post.store, last), sum(1 for x in getattr(post.store, rows) if x[0] == g))
    return out


def _class(name: str) -> int:
    return -1 if name in ck._PLAIN else ck._CLASS_OF.get(name, ck._OTHER)


#: steps that disable others for good (the store is never back, a restart is the end): a path on
#: which one disables a step taken alone cannot consume that step's record, so it accepts nothing
PERMANENT = ("FaultStoreLoss", "SupervisorRestart")
#: a rank's own faults that end its protocol steps for good (or its guard's, for the episode)
SELF_PERMANENT = PERMANENT + ("FaultCrash", "FaultHang", "FaultRaise", "FaultDirtyGuard")


@pytest.mark.timeout(180)
def test_steps_taken_alone_commute():
    """Partial-order reduction (checker._LOCAL, checker._ALONE_UNLESS): in random reachable states,
    a step the search may take alone and any other rank's step enabled beside it (but those of the
    classes it waits out, and the adds ordered by the counter) commute: neither disables the other
    (except for good, PERMANENT), both orders reach the same state (history variables aside), and
    the step's record sees the same post-state."""
    rng = random.Random(3)
    pairs = 0
    for cfg in CONFIGS:
        acts = all_actions(cfg)
        for path in walks(cfg, rng, 12):
            for s, _a, _t in path:
                en = [a for a in acts if enabled(cfg, s, a)]
                for t in en:
                    if t.rank is None:
                        continue
                    local = t.name in ck._LOCAL or (t.name == "RankObserve" and not ck._in_failed_group(cfg, s, t.rank))
                    if t.name == "RankResume" and not ck.resume_alone(cfg, s, t.rank):
                        continue
                    unless = ck._ALONE_UNLESS.get(t.name)
                    if not local and unless is None:
                        continue
                    if not local and t.name == "RankObserve" and t.arg not in (None, s.store.failed[1]):
                        continue
                    st = step(cfg, s, t)
                    for u in en:
                        if u.rank == t.rank:
                            # the rank's own fault, taken silently before its step: it must commute
                            # with a local step or end it for good; the guard ends the window of the
                            # rank's own FaultCorrupt, so the checker does not take the guard alone
                            # while that fault may still strike silently
                            if not (local and u.name.startswith("Fault")) or (t.name, u.name) == ("RankGuard", "FaultCorrupt"):
                                continue
                        if not local:
                            if _class(u.name) in unless or (u.name.startswith("Fault") and u.name != "FaultGroupFail"
                                                             and ck._OTHER in unless):
                                continue  # a record of that class is left: t is not taken alone
                            if t.name in ck._COUNTED and u.name == t.name and s.ranks[u.rank].gen == s.ranks[t.rank].gen:
                                continue  # ordered by the counter: never both enabled with their counts
                        pairs += 1
                        su = step(cfg, s, u)
                        if u.rank == t.rank:
                            if not enabled(cfg, su, t):
                                assert u.name in SELF_PERMANENT, f"{u} disables {t}"
                                continue
                            assert enabled(cfg, st, u), f"{t} disables its rank's {u}, which does not disable it"
                            assert _history_free(step(cfg, st, u)) == _history_free(step(cfg, su, t)), f"{t} and {u} do not commute"
                            continue  # what t's record claims either holds in both orders or in none
                        assert enabled(cfg, st, u), f"{t} disables {u}"
                        if not enabled(cfg, su, t):
                            assert u.name in PERMANENT, f"{u} disables {t}"
                            continue
                        assert _history_free(step(cfg, st, u)) == _history_free(step(cfg, su, t)), f"{t} and {u} do not commute"
                        assert _view(t, s, st) == _view(t, su, step(cfg, su, t)), f"{u} changes what {t}'s record sees"
    assert pairs > 20_000, pairs
