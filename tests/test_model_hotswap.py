"""Hot swap in the model (issue 13, item 1; spec/protocol.md P16, spec/properties.md S9-S13).

A rank that dies in training is replaced in place by a spare that takes its identity and its state
from a live replica; the survivors discard the uncommitted step and the job releases at F with zero
lost steps (L1).  No spare left, or no live replica: L2.  Without spares the model is the classic
one (the manifest pins of tests/test_model_explore.py check the counts).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from accelpact.conformance.mapping import Script
from accelpact.conformance.outcomes import classify_final, scenario_final
from accelpact.model import hotswap
from accelpact.model.contract import ObservationKey, decide, default_envelope
from accelpact.model.explore import _Search, all_resumed, explore
from accelpact.model.invariants import (
    INVARIANTS,
    check_edge,
    check_state,
    discard_leaves_no_trace,
    identity_conserved,
    l1_only_qualified,
    one_holder,
    spare_state_exact,
    swap_qualified,
)
from accelpact.model.protocol import ACTIONS, HOTSWAP_ACTIONS, Action, all_actions, is_final
from accelpact.model.transitions import enabled, step, successors
from accelpact.model.state import DEPOSED_ACTING, DEPOSED_AWAKE, DEPOSED_STOPPED, PC_JOINED, PC_TRAIN, Config, State, initial_state
from accelpact.model.stateful import make_machine
from accelpact.model.symmetry import Symmetry, apply, rank_classes

ROOT = Path(__file__).resolve().parents[1]
CRASH = frozenset({"crash"})
HSDP1 = Config(max_faults=1, spares=1, faults=CRASH)   # 2x2, R = {1, 3}, F = 3
DDP4 = dict(nodes=4, ranks_per_node=1, affected_local=0, group="world")


def _run(cfg: Config, s: State, *tokens: str) -> State:
    """Apply actions written as in spec/protocol.md (``Name(rank[,arg])``), each enabled."""
    for tok in tokens:
        m = re.fullmatch(r"(\w+)\((\d*)(?:,(\w+))?\)", tok)
        assert m, tok
        name, rank, arg = m.groups()
        a = Action(name, int(rank) if rank else None, arg)
        assert enabled(cfg, s, a), f"{a} is not enabled"
        s = step(cfg, s, a)
    return s


def _endings(cfg: Config, s: State) -> tuple[set[str], int]:
    """Every ending reachable from ``s`` (symmetry-reduced BFS): 'L1' (every rank resumed), or
    'L2:<abort>'; asserts that every state without successor is final and safe."""
    sym = Symmetry(cfg)
    acts = all_actions(cfg)
    s = sym.canonical(s)
    seen, queue, out = {s}, deque([s]), set()
    while queue:
        x = queue.popleft()
        bad = check_state(cfg, x)
        assert not bad, [(inv.id, msg) for inv, msg in bad]
        n = 0
        for _a, y in successors(cfg, x, acts):
            n += 1
            assert not check_edge(cfg, x, y)
            y = sym.canonical(y)
            if y not in seen:
                seen.add(y)
                queue.append(y)
        if not n:
            assert is_final(cfg, x), x
            out.add(f"L2:{x.store.abort}" if x.supervisor else "L1" if all_resumed(cfg, x) else "stuck")
    return out, len(seen)


def _crashed(cfg: Config, point: str, *ranks: int) -> State:
    s = initial_state(cfg)
    for r in ranks:
        s = step(cfg, s, Action("FaultCrash", r, point))
    return s


# ---- no spares: the classic model ---------------------------------------------------------------


def test_without_spares_no_hot_swap_action_is_instantiated():
    names = {a.name for a in all_actions(Config(max_faults=2))}
    assert not names & set(HOTSWAP_ACTIONS)
    assert all(a.arg is None for a in all_actions(Config()) if a.name == "FaultCrash")
    assert set(HOTSWAP_ACTIONS) <= set(ACTIONS)  # in the table (spec names, mutants), instantiated only with spares
    with_spares = all_actions(Config(spares=1))
    assert set(HOTSWAP_ACTIONS) <= {a.name for a in with_spares}
    assert Action("FaultCrash", 1, "backward") in with_spares
    with pytest.raises(ValueError, match="spares must be >= 0"):
        Config(spares=-1)


# ---- P16: a crash in training with a spare and a live replica is L1 -----------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", ["forward", "backward", "boundary"])
def test_a_crash_with_a_spare_and_a_live_replica_ends_in_l1_with_zero_lost_steps(point):
    """2x2, one spare: every behaviour after a crash of any rank at ``point`` ends with every rank
    training in generation 1 at tau = F, nothing replayed, the dead identity held by the spare."""
    cfg = HSDP1.with_(points=(point,))
    r = explore(cfg, keep_graph=True)
    assert r.ok and r.complete, [v.format() for v in r.violations]
    assert r.exit_bound == 0, "no abort is reachable: no L2"
    ends = [r.graph.nodes[n]["state"] for n in r.graph if not r.graph.out_degree(n)]
    assert ends
    for s in ends:
        assert not s.supervisor and all_resumed(cfg, s)
        assert all(rk.tau == cfg.frontier and rk.replayed == 0 and rk.ahead == 0 and not rk.grads for rk in s.ranks)
        (g, dead), = s.store.dead
        assert s.ranks[dead].inc == 1 and s.store.spares == 0
        assert {x[:2] for x in s.swapped} == {(0, dead)}
        if point != "boundary":  # every survivor discarded its uncommitted step
            assert {r for _g, r in s.discarded} == set(cfg.world) - {dead}


@pytest.mark.timeout(300)
def test_a_crash_inside_the_optimizer_step():
    """HSDP's optimizer step runs no collective on R: the survivors commit it and observe the death
    at the boundary, at F + 1; but the dead rank last published its identity (F, RNG, data cursor)
    at F, so the spare posts F and the agreement aborts on the mismatch (L2: the spare holds nothing
    until the groups are rebuilt, and no replica holds the identity's RNG and cursor at F + 1).  A
    wrapper whose optimizer step uses R observes it inside the step, possibly half applied: L2 (P16.4)."""
    s = _crashed(HSDP1.with_(points=("optimizer",)), "optimizer", 1)
    ends, _n = _endings(HSDP1.with_(points=("optimizer",)), s)
    assert ends == {"L2:mismatch"}
    cfg = HSDP1.with_(points=("optimizer",), uses_r=("backward", "optimizer", "boundary"))
    ends, _n = _endings(cfg, _crashed(cfg, "optimizer", 1))
    assert ends and all(e.startswith("L2") for e in ends), ends


# ---- P16: no spare left, or no live replica: L2 ------------------------------------------------


@pytest.mark.timeout(300)
def test_two_deaths_and_one_spare_is_l2():
    cfg = Config(max_faults=2, spares=1, faults=CRASH, points=("backward",))
    ends, _n = _endings(cfg, _crashed(cfg, "backward", 0, 1))
    assert ends and all(e.startswith("L2") for e in ends), ends


@pytest.mark.timeout(300)
def test_a_death_after_the_only_spare_was_used_is_l2():
    cfg = Config(max_faults=2, spares=1, faults=CRASH, points=("boundary",))
    s = _crashed(cfg, "boundary", 1)
    # drive the swap to its end, then a second rank dies: no spare left
    for _ in range(200):
        nxt = [(a, t) for a, t in successors(cfg, s) if not a.name.startswith("Fault")]
        if not nxt:
            break
        s = nxt[0][1]
    assert all_resumed(cfg, s) and s.store.spares == 0
    s = step(cfg, s, Action("FaultCrash", 2, "boundary"))
    ends, _n = _endings(cfg, s)
    assert ends and all(e.startswith("L2") for e in ends), ends


@pytest.mark.timeout(300)
def test_failbench_f2_in_2x2_loses_both_replicas_and_is_l2():
    """FailBench F2 (two concurrent crashes, ranks r and r+2): in 2x2 ranks 1 and 3 are the whole
    replicate group: no replica lives, so even two spares cannot help."""
    cfg = Config(max_faults=2, spares=2, faults=CRASH, points=("forward",))
    ends, _n = _endings(cfg, _crashed(cfg, "forward", 1, 3))
    assert ends and all(e.startswith("L2") for e in ends), ends


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cfg", [
    pytest.param(Config(nodes=3, max_faults=2, spares=2, faults=CRASH, points=("forward",)), id="3x2-hsdp",
                 marks=pytest.mark.nightly("minutes on a loaded 2-core machine")),
    pytest.param(Config(**DDP4, max_faults=2, spares=2, faults=CRASH, points=("forward",)), id="4x1-ddp")])
def test_failbench_f2_with_two_spares_is_l1_where_replicas_survive(cfg):
    """F2 where a replica of each dead rank lives (3x2: rank 5 holds the shard of 1 and 3; DDP:
    every rank is a replica): every ending is L1."""
    ends, n = _endings(cfg, _crashed(cfg, "forward", 1, 3))
    assert ends == {"L1"} and n > 100


@pytest.mark.timeout(300)
def test_no_replica_is_l2():
    """1x2: each replicate group has one rank; a dead rank's shard exists nowhere else."""
    cfg = Config(nodes=1, ranks_per_node=2, spares=1, max_faults=1, faults=CRASH, points=("boundary",))
    ends, _n = _endings(cfg, _crashed(cfg, "boundary", 1))
    assert ends and all(e.startswith("L2") for e in ends), ends


# ---- P16: the steps ----------------------------------------------------------------------------


def test_a_late_waking_holder_is_fenced_out_and_the_job_goes_on():
    """S10 (P16.5): the dead process was only stopped; it wakes after the spare took its identity,
    reads a later incarnation at its first store operation and exits, writing nothing."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, spares=1, faults=CRASH)
    s = _run(cfg, initial_state(cfg), "FaultCrash(1,boundary)", "RankObserve(0,boundary)", "RankClaimSpare(0)", "SpareJoin(1)")
    assert s.ranks[1].pc == PC_JOINED and s.ranks[1].inc == 1 and s.deposed == {(0, 1, 0, DEPOSED_STOPPED)}
    assert s.joins == {(0, 1, 1)} and one_holder(cfg, s) is None and identity_conserved(cfg, s) is None
    assert not enabled(cfg, s, Action("RankFenced", 1))  # stopped: it makes no store operation
    woke = _run(cfg, s, "RankFenced(1,wake)")  # S10 is reachable: a spec step wakes the deposed process
    assert woke.deposed == {(0, 1, 0, DEPOSED_AWAKE)} and one_holder(cfg, woke) is None
    t = _run(cfg, woke, "RankFenced(1)")
    assert not t.deposed and not t.store.abort
    broken = replace(s, deposed=frozenset({(0, 1, 0, DEPOSED_ACTING)}))
    assert "held by two live processes" in one_holder(cfg, broken)
    # the fence is the store's incarnation: a woken process that finds no later claim goes on as the rank
    unclaimed = woke.with_store(claims=frozenset())
    assert (0, 1, 0, DEPOSED_ACTING) in step(cfg, unclaimed, Action("RankFenced", 1)).deposed
    t = _run(cfg, t, "RankGuard(0)", "RankArrive(0)", "RankArrive(1)", "RankDecideAgreement(1)",
             "RankAwaitAgreement(0)", "RankAwaitAgreement(1)", "RankReplace(0)", "RankReplace(1)", "RankRebind(0)",
             "RankRebind(1)", "RankTransferState(0)", "RankValidate(0)", "RankValidate(1)", "RankReady(0)", "RankReady(1)", "RankDecideRelease(1)",
             "RankResume(0)", "RankResume(1)")
    assert is_final(cfg, t) and all_resumed(cfg, t) and classify_final(t) == "L1"
    assert scenario_final(cfg, Script(()), (t, frozenset()))


def test_the_discard_returns_the_rank_to_the_committed_boundary():
    """S11 (P16.4): gradients dropped, wrapper idle, RNG and cursor at F; the guard then passes."""
    cfg = HSDP1.with_(points=("backward",))
    s = _run(cfg, initial_state(cfg), "FaultCrash(1,backward)", "RankObserve(0,backward)")
    rk = s.ranks[0]
    assert rk.grads and rk.ahead == 1 and rk.tau == cfg.frontier
    assert not enabled(cfg, s, Action("RankGuard", 0)) and not enabled(cfg, s, Action("RankReject", 0))
    t = _run(cfg, s, "RankDiscardStep(0)", "RankGuard(0)")
    rk = t.ranks[0]
    assert not rk.grads and rk.ahead == 0 and rk.point == "boundary" and (0, 0) in t.discarded
    assert discard_leaves_no_trace(cfg, t) is None
    dirty = t.with_rank(0, grads=True)
    assert "still holds gradients True" in discard_leaves_no_trace(cfg, dirty)
    assert "1 step(s) past F" in discard_leaves_no_trace(cfg, t.with_rank(0, ahead=1))


def test_the_replica_sends_only_from_the_committed_boundary():
    """P16.3: RankTransferState needs a replica that rebuilt and rebound its groups (it stands at
    the committed boundary), never one mid-step, and a spare that rebuilt them too; the spare posts
    its identity's published F and holds no state until then."""
    cfg = HSDP1.with_(points=("backward",))
    s = _run(cfg, initial_state(cfg), "FaultCrash(1,backward)", "RankObserve(3,backward)", "RankClaimSpare(3)", "SpareJoin(1)")
    assert not enabled(cfg, s, Action("RankTransferState", 3))
    s = _run(cfg, s, "RankDiscardStep(3)", "RankGuard(3)", "RankArrive(3)", "RankArrive(1)")
    assert not enabled(cfg, s, Action("RankTransferState", 3))  # the new group is not built yet
    for r in (0, 2):
        s = _run(cfg, s, f"RankObserve({r},backward)", f"RankDiscardStep({r})", f"RankGuard({r})", f"RankArrive({r})")
    s = _run(cfg, s, "RankDecideAgreement(2)", "RankAwaitAgreement(1)", "RankAwaitAgreement(3)",
             "RankReplace(1)", "RankReplace(3)", "RankRebind(3)")
    assert not enabled(cfg, s, Action("RankTransferState", 3))  # the spare has not rebound yet
    assert not enabled(cfg, s, Action("RankValidate", 3))       # its group's validation waits for the spare's state
    s = _run(cfg, s, "RankRebind(1)")
    assert not enabled(cfg, s, Action("RankValidate", 1))       # no state yet
    s = _run(cfg, s, "RankTransferState(3)")
    sp = s.ranks[1]
    assert (sp.pc, sp.tau, sp.frontier, sp.ahead, sp.shard, sp.inc) == ("rebound", 3, 3, 0, 1, 1)
    assert s.transfers == {(0, 1, True)}
    # rank 0 is no replica of rank 1 (another replicate group): it never sends
    s2 = _run(cfg, s, "RankAwaitAgreement(0)", "RankReplace(0)", "RankRebind(0)")
    assert not enabled(cfg, s2, Action("RankTransferState", 0))


def test_the_claim_is_single_assignment_and_takes_one_spare_per_dead_rank():
    cfg = Config(max_faults=2, spares=2, faults=CRASH, points=("forward",))
    s = _run(cfg, _crashed(cfg, "forward", 0, 1), "RankObserve(2,backward)", "RankClaimSpare(2)")
    assert s.store.claims == {(0, 0, 1), (0, 1, 1)} and s.store.spares == 0
    assert not enabled(cfg, s, Action("RankClaimSpare", 3))  # decided: nothing left to claim


# ---- the decision (the contract extended with the swap facts) ----------------------------------


def test_decide_with_the_swap_facts():
    env = default_envelope()
    key = lambda phase, profile="hsdp": ObservationKey("cpu-gloo", profile, phase, "zero-replay")  # noqa: E731 - a local shorthand
    ok = dict(died=True, spare=True, replica=True)
    assert hotswap.decide(env, key("backward"), True) == decide(env, key("backward"), True)  # no death: the contract's
    assert hotswap.decide(env, key("boundary"), True) == decide(env, key("boundary"), True)
    d = hotswap.decide(env, key("backward"), True, **ok)
    assert d.level == "L1" and "discard" in d.reason
    assert hotswap.decide(env, key("boundary"), True, **ok).level == "L1"
    assert "half applied" in hotswap.decide(env, key("optimizer"), True, **ok).reason
    assert "no spare" in hotswap.decide(env, key("forward"), True, **{**ok, "spare": False}).reason
    assert "none of its replicas" in hotswap.decide(env, key("forward"), True, **{**ok, "replica": False}).reason
    assert hotswap.decide(env, key("boundary"), False, **ok).level == "L2"
    assert hotswap.decide(env, key("boundary", "tpu"), True, **ok).level == "L2"


# ---- S9, S12 fail on states that break them ----------------------------------------------------


def test_spare_state_and_swap_qualification_predicates_can_fail():
    cfg = HSDP1
    s = initial_state(cfg)
    good = replace(s, swapped=frozenset({(0, 1, 1, 3, 0, False, False)}))
    assert spare_state_exact(cfg, good) is None
    for bad in ((0, 1, 0, 3, 0, False, False), (0, 1, 1, 4, 0, False, False), (0, 1, 1, 3, 1, False, False),
                (0, 1, 1, 3, 0, True, False), (0, 1, 1, 3, 0, False, True)):
        assert "state at F=3" in spare_state_exact(cfg, replace(s, swapped=frozenset({bad})))
    dead = s.with_store(dead=frozenset({(0, 1)}))
    resumed = replace(dead, resumed=frozenset({(0, 0, "boundary", False)}))
    assert "no live replica" in swap_qualified(cfg, resumed)
    assert swap_qualified(cfg, replace(resumed, transfers=frozenset({(0, 1, True)}))) is None
    assert "from a rank that is not its replica" in swap_qualified(cfg, replace(resumed, transfers=frozenset({(0, 1, False)})))
    many = dead.with_store(claims=frozenset({(0, 1, 1), (0, 3, 1)}))
    assert "has 1 spare" in swap_qualified(cfg, many)
    assert [i.id for i in INVARIANTS if i.id in ("S9", "S10", "S11", "S12", "S13")] == ["S12", "S9", "S10", "S13", "S11"]


def test_identity_conserved_judges_claims_joins_seats_and_the_pool():
    """S13: one holder per identity and incarnation, the spare pool conserved, from the raw claims,
    the dead ranks, the pool, history joins and each seat's incarnation."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, spares=2, faults=CRASH)
    s = _run(cfg, initial_state(cfg), "FaultCrash(1,boundary)", "RankObserve(0,boundary)", "RankClaimSpare(0)", "SpareJoin(1)")
    assert s.store.claims == {(0, 1, 1)} and s.store.spares == 1 and identity_conserved(cfg, s) is None
    assert "pool is not conserved" in identity_conserved(cfg, s.with_store(spares=2))
    twice = s.with_store(claims=s.store.claims | {(0, 1, 2)}, spares=0)
    assert "claimed twice in one generation" in identity_conserved(cfg, twice)
    skipped = replace(s.with_store(claims=frozenset({(0, 1, 2)})), joins=frozenset({(0, 1, 2)})).with_rank(1, inc=2)
    assert "next incarnation" in identity_conserved(cfg, skipped)
    alive = s.with_store(claims=frozenset({(0, 0, 1)}), dead=frozenset({(0, 1)}))
    assert "did not die in training" in identity_conserved(cfg, alive)
    assert "without that claim" in identity_conserved(cfg, replace(s, joins=frozenset({(0, 1, 2)})))
    assert "held by incarnation 0" in identity_conserved(cfg, s.with_rank(1, inc=0))
    assert identity_conserved(cfg, initial_state(cfg)) is None


# ---- symmetry, hypothesis, spec ----------------------------------------------------------------


@pytest.mark.timeout(240)
def test_symmetry_with_spares_is_per_group_and_agrees_with_the_full_search():
    cfg = HSDP1.with_(points=("backward",))
    assert rank_classes(cfg) == ((0,), (2,), (1, 3))
    assert rank_classes(Config(nodes=3, spares=1)) == ((0,), (2, 4), (1, 3, 5))
    red, full = explore(cfg, symmetry=True), explore(cfg, symmetry=False)
    assert red.ok and full.ok and red.liveness == full.liveness
    assert (red.depth, red.exit_bound) == (full.depth, full.exit_bound) and red.states < full.states
    sym = Symmetry(cfg)
    search = _Search(cfg, symmetry=False)
    search.run(stop=True)
    checked = 0
    for s in search.states[:: max(1, len(search.states) // 400)]:
        c = sym.canonical(s)
        assert sym.canonical(apply(s, {1: 3, 3: 1})) == c
        checked += bool(s.deposed or s.store.claims or s.discarded)
    assert checked > 50


@pytest.mark.timeout(600)
def test_hypothesis_machine_holds_with_spares():
    cfg = Config(max_faults=2, spares=1)
    run_state_machine_as_test(make_machine(cfg), settings=settings(settings.default, max_examples=30))


def test_spec_names_and_replays_the_hot_swap_run():
    """spec/protocol.md section "Hot swap (issue 13)" names every hot-swap action and pc, and its
    ``hotswap-run`` block (2x2, one spare) replays: every step enabled and safe, the end L1."""
    text = (ROOT / "spec" / "protocol.md").read_text()
    section = text[text.index("## 11. Hot swap (issue 13)"):]
    for name in (*HOTSWAP_ACTIONS, "FaultCrash", "`joined`", "S9", "S10", "S11", "S12"):
        assert name in section, name
    (block,) = re.findall(r"```hotswap-run\n(.*?)```", section, flags=re.S)
    lines = block.strip().splitlines()
    assert lines[-1] == "=> L1"
    cfg = Config(spares=1)
    s = initial_state(cfg)
    for tok in " ".join(lines[:-1]).split():
        t = _run(cfg, s, tok)
        assert not check_state(cfg, t) and not check_edge(cfg, s, t), tok
        s = t
    assert is_final(cfg, s) and all_resumed(cfg, s)
    assert all(rk.pc == PC_TRAIN and rk.gen == 1 and rk.tau == cfg.frontier for rk in s.ranks)
    # S3 judges the point each rank observed (backward), not the boundary its discard rewrote it to;
    # the spare observed nothing: its point is its transfer's (the committed boundary)
    assert {(r, p) for _g, r, p, *_ in s.resumed} == {(0, "backward"), (1, "boundary"), (2, "backward"), (3, "backward")}
    assert l1_only_qualified(cfg, s) is None
    env = cfg.envelope
    without = replace(env, entries=tuple(e for e in env.entries if not (e.key.died and e.key.phase == "backward")))
    assert "(cpu-gloo, hsdp, backward, zero-replay; died=True, spare=True, replica=True) for L1" in \
        l1_only_qualified(cfg.with_(envelope=without), s)
    # without a death the backward cell is the discard's (issue 27): L1 only after the discard
    no_death = s.with_store(dead=frozenset())
    assert l1_only_qualified(cfg, no_death) is None
    assert "after a failure in flight (backward) without discarding" in l1_only_qualified(cfg, no_death.with_(discarded=frozenset()))
