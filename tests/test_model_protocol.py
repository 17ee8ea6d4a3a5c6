"""Unit tests of individual protocol actions (model/protocol.py): enabled/step.

Spec ids: P1 observe/revoke, P2 guard + contract (C3), P3 decided control barrier, P4 replace,
P5 rebind, P6 validate + release; S2.1 single-assignment decisions, S4.2 fencing, S7 exit reasons.
"""

from __future__ import annotations

import pytest

from accelpact.model.protocol import Action, all_actions, is_final
from accelpact.model.transitions import enabled, step
from accelpact.model.state import (
    PC_AGREED,
    PC_ARRIVED,
    PC_EXITED,
    PC_TRAIN,
    REASON_DEADLINE,
    REASON_MISMATCH,
    REASON_REJECTED,
    Config,
    initial_state,
)

DDP = Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=2)
HSDP = Config(max_faults=3)


def A(name, rank=None, arg=None):
    if name == "RankObserve" and arg is None:
        arg = "boundary"  # where the rank observes the failure (Config.observable)
    return Action(name, rank, arg)


def run(cfg, *actions, s=None):
    s = s or initial_state(cfg)
    for a in actions:
        assert enabled(cfg, s, a), f"{a} should be enabled"
        s = step(cfg, s, a)
    return s


def to_guarded(cfg, ranks, point="boundary"):
    acts = [A("FaultGroupFail", None, point)]
    acts += [A("RankObserve", r) for r in ranks]
    acts += [A("RankGuard", r) for r in ranks]
    return run(cfg, *acts)


def test_step_refuses_a_disabled_action():
    cfg = DDP
    with pytest.raises(ValueError, match="not enabled"):
        step(cfg, initial_state(cfg), A("RankObserve", 0))


def test_p1_members_observe_and_revoke_non_members_follow_the_revoke():
    """P1: members of R observe the failed collective; non-members observe only once R is revoked."""
    cfg = HSDP  # R = {1, 3}
    s = run(cfg, A("FaultGroupFail", None, "boundary"))
    assert not enabled(cfg, s, A("RankObserve", 0))
    s = run(cfg, A("RankObserve", 1), s=s)
    assert s.store.revoked == frozenset({0}) and s.ranks[1].point == "boundary"
    assert enabled(cfg, s, A("RankObserve", 0)) and enabled(cfg, s, A("RankObserve", 2))


def test_p17_a_failure_in_backward_is_discarded_then_guarded():
    """P17/C3: a failure in backward, with the default envelope (forward and backward L1): no guard
    and no rejection before the discard; RankDiscardStep puts the rank at the committed boundary
    (no gradients, cursor at F), then RankGuard."""
    cfg = DDP
    s = run(cfg, A("FaultGroupFail", None, "forward"))
    assert not enabled(cfg, s, A("RankObserve", 0, "forward")), "forward uses no collective on R by default"
    s = run(cfg, A("RankObserve", 0, "backward"), s=s)
    assert s.ranks[0].grads and s.ranks[0].ahead == 1
    assert not enabled(cfg, s, A("RankGuard", 0)) and not enabled(cfg, s, A("RankReject", 0))
    s = run(cfg, A("RankDiscardStep", 0), s=s)
    rk = s.ranks[0]
    assert not rk.grads and rk.ahead == 0 and rk.point == "boundary" and rk.tau == rk.frontier == cfg.frontier
    assert enabled(cfg, s, A("RankGuard", 0)) and (0, 0) in s.discarded


def test_p2_contract_rejects_in_flight_failures_it_cannot_discard():
    """P2/C3: a failure inside optimizer.step() is L2, and so is one in backward where the envelope
    has no in-place discard (``without_discard``): RankGuard is disabled, RankReject aborts."""
    from accelpact.model.contract import default_envelope, without_discard

    for cfg, point in ((DDP.with_(points=("optimizer", "boundary"), uses_r=("optimizer", "boundary")), "optimizer"),
                       (DDP.with_(envelope=without_discard(default_envelope(), "no rebuild")), "backward")):
        s = run(cfg, A("FaultGroupFail", None, point), A("RankObserve", 0, point))
        assert not enabled(cfg, s, A("RankGuard", 0)) and not enabled(cfg, s, A("RankDiscardStep", 0))
        s = run(cfg, A("RankReject", 0), s=s)
        assert s.ranks[0].pc == PC_EXITED and s.ranks[0].reason == REASON_REJECTED
        assert s.store.abort == REASON_REJECTED and s.store.agree == ((0, "abort:rejected"),)


def test_p2_failed_guard_rejects_even_at_the_boundary():
    cfg = DDP
    s = run(cfg, A("FaultGroupFail", None, "boundary"), A("RankObserve", 0), A("FaultDirtyGuard", 0))
    assert not enabled(cfg, s, A("RankGuard", 0)) and enabled(cfg, s, A("RankReject", 0))


def test_p3_last_arriver_decides_commit_and_everyone_reads_it():
    cfg = DDP
    s = to_guarded(cfg, [0, 1])
    s = run(cfg, A("RankArrive", 0), s=s)
    assert not enabled(cfg, s, A("RankDecideAgreement", 0)), "only the last arriver decides"
    s = run(cfg, A("RankArrive", 1), A("RankDecideAgreement", 1), s=s)
    assert s.store.agree == ((0, "commit"),)
    s = run(cfg, A("RankAwaitAgreement", 0), A("RankAwaitAgreement", 1), s=s)
    assert all(rk.pc == PC_AGREED for rk in s.ranks)
    assert not enabled(cfg, s, A("RankDecideAgreement", 1)), "S2.1: decided once per generation"


def test_p3_decided_barrier_late_arriver_reads_the_abort():
    """P3: a rank that arrives after a peer's deadline expired reads the abort, never a commit."""
    cfg = DDP
    s = to_guarded(cfg, [0, 1])
    s = run(cfg, A("RankArrive", 0), A("FaultDelay", 1), A("RankTimeout", 0), s=s)
    assert s.store.agree == ((0, f"abort:{REASON_DEADLINE}"),) and s.store.abort == REASON_DEADLINE
    s = run(cfg, A("RankArrive", 1), s=s)
    assert s.ranks[1].pc == PC_ARRIVED
    assert not enabled(cfg, s, A("RankDecideAgreement", 1)), "the decision already stands"
    assert not enabled(cfg, s, A("RankAwaitAgreement", 1))
    s = run(cfg, A("RankExit", 1), s=s)
    assert s.ranks[1].reason == REASON_DEADLINE
    s = run(cfg, A("SupervisorRestart"), s=s)
    assert is_final(cfg, s) and all(rk.replayed == cfg.frontier - cfg.checkpoint for rk in s.ranks)


def test_p3_deadlines_expire_only_when_a_peer_is_stuck():
    """Deadline assumption: with every rank healthy, RankTimeout is never enabled."""
    cfg = DDP
    s = to_guarded(cfg, [0, 1])
    s = run(cfg, A("RankArrive", 0), s=s)
    assert not enabled(cfg, s, A("RankTimeout", 0))


def test_p3_frontier_mismatch_aborts():
    cfg = DDP
    s = run(cfg, A("FaultGroupFail", None, "boundary"), A("RankObserve", 0), A("RankObserve", 1), A("FaultMismatch", 1))
    s = run(cfg, A("RankGuard", 0), A("RankGuard", 1), A("RankArrive", 0), A("RankArrive", 1), A("RankDecideAgreement", 1), s=s)
    assert s.store.agree == ((0, f"abort:{REASON_MISMATCH}"),) and s.store.abort == REASON_MISMATCH
    assert not enabled(cfg, s, A("RankAwaitAgreement", 0)) and enabled(cfg, s, A("RankExit", 0))


def _recover(cfg, s, ranks):
    s = run(cfg, *[A("RankObserve", r) for r in ranks], *[A("RankGuard", r) for r in ranks], *[A("RankArrive", r) for r in ranks], s=s)
    s = run(cfg, A("RankDecideAgreement", ranks[-1]), *[A("RankAwaitAgreement", r) for r in ranks], s=s)
    s = run(cfg, *[A("RankReplace", r) for r in ranks], *[A("RankRebind", r) for r in ranks], *[A("RankValidate", r) for r in ranks], s=s)
    s = run(cfg, *[A("RankReady", r) for r in ranks], A("RankDecideRelease", ranks[-1]), *[A("RankResume", r) for r in ranks], s=s)
    return s


def test_full_recovery_resumes_every_rank_in_the_next_generation():
    """P4-P6: replace, rebind, validate, vote, release: every rank trains at gen 1 with new references."""
    cfg = DDP
    s = _recover(cfg, run(cfg, A("FaultGroupFail", None, "boundary")), [0, 1])
    assert all(rk.pc == PC_TRAIN and rk.gen == 1 and rk.comm == 1 and rk.refs == (1, 1) for rk in s.ranks)
    assert is_final(cfg, s) and s.store.release == ((0, "release"),)


def test_fencing_decisions_are_namespaced_by_generation():
    """S4.2: in generation 1 the generation-0 commit is invisible; the no-fence mutant reads it."""
    for mutant, visible in ((None, False), ("no-fence", True)):
        cfg = DDP.with_(mutant=mutant)
        s = _recover(cfg, run(cfg, A("FaultGroupFail", None, "boundary")), [0, 1])
        s = run(cfg, A("FaultGroupFail", None, "boundary"), A("RankObserve", 0), A("RankGuard", 0), A("RankArrive", 0), s=s)
        assert enabled(cfg, s, A("RankAwaitAgreement", 0)) is visible


def test_p6_validation_needs_every_member_of_r():
    cfg = DDP
    s = run(cfg, A("FaultGroupFail", None, "boundary"))
    s = run(cfg, *[A(n, r) for n in ("RankObserve", "RankGuard", "RankArrive") for r in (0, 1)], s=s)
    s = run(cfg, A("RankDecideAgreement", 1), A("RankAwaitAgreement", 0), A("RankAwaitAgreement", 1),
            A("RankReplace", 0), A("RankRebind", 0), s=s)
    assert not enabled(cfg, s, A("RankValidate", 0)), "rank 1 has not joined the validation collective"
    s = run(cfg, A("RankReplace", 1), A("RankRebind", 1), s=s)
    assert enabled(cfg, s, A("RankValidate", 0))


def test_p6_release_is_decided_by_the_last_voter_only():
    cfg = DDP
    s = run(cfg, A("FaultGroupFail", None, "boundary"))
    s = run(cfg, *[A(n, r) for n in ("RankObserve", "RankGuard", "RankArrive") for r in (0, 1)], s=s)
    s = run(cfg, A("RankDecideAgreement", 1), *[A(n, r) for n in ("RankAwaitAgreement", "RankReplace", "RankRebind") for r in (0, 1)], s=s)
    s = run(cfg, A("RankValidate", 0), A("RankValidate", 1), A("RankReady", 0), s=s)
    assert not enabled(cfg, s, A("RankDecideRelease", 0))
    early = run(DDP.with_(mutant="early-release"), A("RankDecideRelease", 0), s=s.with_store(last_ready=((0, 0),)))
    assert early.store.release == ((0, "release"),)


def test_watchdog_exits_hung_ranks_on_abort():
    """RankExit: the watchdog thread ends a hung rank once the abort key is set."""
    cfg = DDP
    s = to_guarded(cfg, [0, 1])
    s = run(cfg, A("FaultHang", 1), A("RankArrive", 0), s=s)
    assert s.ranks[1].hung and not enabled(cfg, s, A("RankArrive", 1))
    s = run(cfg, A("RankTimeout", 0), A("RankExit", 1), s=s)
    assert s.ranks[1].pc == PC_EXITED and not s.ranks[1].hung and s.ranks[1].reason == REASON_DEADLINE


def test_exception_in_a_phase_ends_the_rank():
    cfg = DDP
    s = to_guarded(cfg, [0, 1])
    s = run(cfg, A("FaultRaise", 0), s=s)
    assert not enabled(cfg, s, A("RankArrive", 0)) and not enabled(cfg, s, A("RankExit", 0))
    s = run(cfg, A("RankFail", 0), s=s)
    assert s.ranks[0].reason == "exception" and s.store.abort == "exception"


def test_non_member_times_out_when_every_member_of_r_died_before_revoking():
    """L3 (found by the explorer): if all of R crashes before revoke, non-members leave via their deadline;
    or (P18.4) their failure flag, whose ring crosses the dead ranks, fails and they observe through it,
    and a later wait of theirs expires."""
    cfg = HSDP  # R = {1, 3}
    s = run(cfg, A("FaultGroupFail", None, "boundary"), A("FaultCrash", 1), A("FaultCrash", 3))
    assert enabled(cfg, s, A("RankObserve", 0))  # through its failed flag: no revoke was published
    assert not enabled(cfg, s, A("RankTimeout", 1)) and not enabled(cfg, s, A("RankTimeout", 3))
    via_flag = run(cfg, A("RankObserve", 0), A("RankObserve", 2), A("RankGuard", 0), A("RankGuard", 2),
                   A("RankArrive", 0), A("RankArrive", 2), A("RankTimeout", 0), A("RankExit", 2), A("SupervisorRestart"), s=s)
    assert via_flag.store.agree == ((0, "abort:deadline"),) and is_final(cfg, via_flag)
    s = run(cfg, A("RankTimeout", 0), A("RankExit", 2), A("SupervisorRestart"), s=s)
    assert s.store.agree == ((0, "abort:deadline"),) and is_final(cfg, s)
    # with a live member the deadline of a healthy world never expires
    s2 = run(cfg, A("FaultGroupFail", None, "boundary"))
    assert not enabled(cfg, s2, A("RankTimeout", 0))


def test_all_actions_is_deterministic():
    assert all_actions(HSDP) == all_actions(Config(max_faults=3))
    assert len(set(all_actions(HSDP))) == len(all_actions(HSDP))


# ---- where a failure is observed (issue 9, item 5) -----------------------------------------------

def test_a_failure_during_the_optimizer_step_is_observed_at_the_boundary_and_repaired():
    """The optimizer step uses no collective on R (HSDP): a failure that strikes there is met by the
    boundary probe, after the commit, so the contract may keep the state (L1)."""
    cfg = HSDP
    s = run(cfg, A("FaultGroupFail", None, "optimizer"))
    assert cfg.observable("optimizer") == ("boundary",)
    assert not enabled(cfg, s, A("RankObserve", 1, "optimizer"))
    s = run(cfg, A("RankObserve", 1, "boundary"), s=s)
    assert enabled(cfg, s, A("RankGuard", 1))


def test_a_partial_collective_leaves_peers_at_different_points_and_the_job_goes_to_l2():
    """P17.2: a failure in backward; one member is still in backward (it discards: it stands at F),
    its peer's backward completed and it committed the step (it reached the boundary at F+1).  Phase 3
    sees the two frontiers and aborts (mismatch): nobody resumes past a step another discarded."""
    cfg = HSDP  # R = {1, 3}
    s = run(cfg, A("FaultGroupFail", None, "backward"), A("RankObserve", 1, "backward"), A("RankObserve", 3, "boundary"))
    assert s.ranks[1].point == "backward" and s.ranks[3].point == "boundary"
    assert s.ranks[3].frontier == s.ranks[1].frontier + 1
    assert enabled(cfg, s, A("RankGuard", 3)) and not enabled(cfg, s, A("RankGuard", 1))
    s = run(cfg, A("RankDiscardStep", 1), A("RankGuard", 1), A("RankGuard", 3), s=s)
    for r in (0, 2):
        s = run(cfg, A("RankObserve", r, "backward"), A("RankDiscardStep", r), A("RankGuard", r), s=s)
    for r in cfg.world:
        s = run(cfg, A("RankArrive", r), s=s)
    s = run(cfg, A("RankDecideAgreement", 3), s=s)
    assert s.store.abort == REASON_MISMATCH and s.store.agree == ((0, "abort:mismatch"),)


def test_ddp_observes_a_forward_failure_in_forward_when_it_broadcasts_buffers():
    cfg = DDP.with_(uses_r=("forward", "backward", "boundary"))
    s = run(cfg, A("FaultGroupFail", None, "forward"), A("RankObserve", 0, "forward"))
    assert s.ranks[0].point == "forward"


def test_config_refuses_a_wrapper_that_never_uses_r_at_the_boundary():
    with pytest.raises(ValueError, match="boundary"):
        Config(uses_r=("backward",))
    with pytest.raises(ValueError, match="not failure points"):
        Config(uses_r=("boundary", "sideways"))


# ---- F and C move, episodes overlap, the store can be lost (issue 9, item 6) ---------------------

def _repair(cfg, s, point="boundary"):
    ranks = list(cfg.world)
    members = [r for r in ranks if cfg.is_member(r)]
    last = ranks[-1]
    acts = [A("FaultGroupFail", None, point)]
    acts += [A("RankObserve", r) for r in members + [r for r in ranks if r not in members]]
    acts += [A(n, r) for n in ("RankGuard", "RankArrive") for r in ranks]
    acts += [A("RankDecideAgreement", last)] + [A("RankAwaitAgreement", r) for r in ranks]
    acts += [A(n, r) for n in ("RankReplace", "RankRebind", "RankValidate") for r in members]
    acts += [A("RankReplace", r) for r in ranks if r not in members]  # the groups over W (P18.3)
    acts += [A("RankReady", r) for r in ranks] + [A("RankDecideRelease", last)]
    return run(cfg, *acts, s=s)


def test_the_frontier_moves_between_episodes():
    """Episode g strikes at F + g * advance: the second repair agrees on the later frontier."""
    cfg = HSDP.with_(advance=2)
    s = _repair(cfg, initial_state(cfg))
    s = run(cfg, *[A("RankResume", r) for r in cfg.world], s=s)
    assert {rk.tau for rk in s.ranks} == {cfg.frontier}
    s = _repair(cfg, s)
    assert {a[2] for a in s.store.arrivals if a[0] == 1} == {cfg.frontier_at(1)} == {cfg.frontier + 2}


def test_an_episode_may_start_while_a_peer_has_not_resumed_yet():
    """Overlapping episodes: the release of g is decided, rank 0 has not read it, rank 1 resumed and
    its group fails again; rank 0 resumes into the failed generation and observes it there."""
    cfg = HSDP
    s = _repair(cfg, initial_state(cfg))
    s = run(cfg, *[A("RankResume", r) for r in (1, 2, 3)], s=s)
    s = run(cfg, A("FaultGroupFail", None, "boundary"), A("RankObserve", 1), s=s)
    assert s.ranks[0].gen == 0 and s.store.failed[0] == 1
    s = run(cfg, A("RankResume", 0), A("RankObserve", 0), s=s)
    assert s.ranks[0].gen == 1 and s.ranks[0].frontier == cfg.frontier_at(1)


def test_a_lost_store_ends_every_rank_and_nobody_resumes():
    cfg = HSDP.with_(faults=frozenset({"group_fail", "store_loss"}))
    s = run(cfg, A("FaultGroupFail", None, "boundary"), A("RankObserve", 1), A("FaultStoreLoss"))
    assert not enabled(cfg, s, A("RankObserve", 3)), "no protocol step reaches a lost store"
    s = run(cfg, *[A("RankLoseStore", r) for r in cfg.world], s=s)
    assert all(rk.pc == PC_EXITED and rk.reason == REASON_DEADLINE for rk in s.ranks)
    assert not is_final(cfg, s) and enabled(cfg, s, A("SupervisorRestart"))


def test_the_restart_replays_from_the_checkpoint_that_moved():
    cfg = HSDP.with_(frontier=3, checkpoint=0, checkpoint_every=2, faults=frozenset({"group_fail", "store_loss"}))
    s = _repair(cfg, initial_state(cfg))
    s = run(cfg, *[A("RankResume", r) for r in cfg.world], s=s)
    s = run(cfg, A("FaultGroupFail", None, "boundary"), A("FaultStoreLoss"), *[A("RankLoseStore", r) for r in cfg.world],
            A("SupervisorRestart"), s=s)
    # episode 1 strikes at F = 4; the last checkpoint at or before it is 4: nothing to replay
    assert {(rk.tau, rk.replayed) for rk in s.ranks} == {(4, 0)}


def test_p6_digests_are_those_gathered_when_the_collective_completed():
    """P6.1, P11.5: a member compares the digests its group's collective gathered, even after a peer
    exited since (an exited rank holds nothing: its optimizer step is back at 0)."""
    cfg = DDP
    s = run(cfg, A("FaultGroupFail", None, "boundary"))
    s = run(cfg, *[A(n, r) for n in ("RankObserve", "RankGuard", "RankArrive") for r in (0, 1)], s=s)
    s = run(cfg, A("RankDecideAgreement", 1), *[A(n, r) for n in ("RankAwaitAgreement", "RankReplace", "RankRebind") for r in (0, 1)], s=s)
    s = run(cfg, A("RankValidate", 0), s=s)
    assert s.validated == {(0, 0, True)}
    tau = s.ranks[1].tau
    s = run(cfg, A("FaultRaise", 0), A("RankFail", 0), s=s)
    assert s.ranks[0].pc == PC_EXITED and s.ranks[0].tau == 0 != tau, "the exit forgets what rank 0 held"
    assert enabled(cfg, s, A("RankValidate", 1)) and not enabled(cfg, s, A("RankFail", 1))


def test_p6_each_failed_group_validates_on_its_own():
    """P6.1: with two groups failed at one boundary, one group's completed collective does not
    complete the other's."""
    cfg = Config(max_faults=2, failing="any", faults=frozenset({"group_fail"}), points=("boundary",))
    s = run(cfg, A("FaultGroupFail", 0, "boundary"), A("FaultGroupFail", 1, "boundary"))
    w = cfg.world
    s = run(cfg, *[A(n, r) for n in ("RankObserve", "RankGuard", "RankArrive") for r in w], s=s)
    last = next(r for g, r in s.store.last_arriver)
    s = run(cfg, A("RankDecideAgreement", last), *[A("RankAwaitAgreement", r) for r in w], s=s)
    s = run(cfg, *[A(n, r) for n in ("RankReplace", "RankRebind") for r in (0, 2, 1)], s=s)
    s = run(cfg, A("RankValidate", 0), s=s)
    assert s.validated == {(0, cfg.group_of(0), True)}
    assert not enabled(cfg, s, A("RankValidate", 1)), "rank 3 has not joined group 1's collective"
    s = run(cfg, A("RankReplace", 3), A("RankRebind", 3), A("RankValidate", 1), A("RankValidate", 3), A("RankValidate", 2), s=s)
    assert s.validated == {(0, 0, True), (0, 1, True)}


#: a value other than the initial one for every field an exit forgets (protocol._EXIT_FORGETS); hung
#: and raised stay False: an exit clears them as it always did (the watchdog thread died with the process)
_PERTURBED = {"point": "backward", "seen": "forward", "frontier": 7, "tau": 9, "comm": 5, "refs": (5, 4), "dirty": True, "drop": True,
              "lost": True, "corrupt": True, "replayed": 3, "grads": True, "ahead": 1, "inc": 2, "shard": 1, "wide": 4}


@pytest.mark.parametrize("cfg", [
    # with a spare, faults striking in backward (43k states; every point is 362k, the manifest's size)
    Config(max_faults=1), Config(max_faults=1, spares=1, points=("backward",)), DDP,
    Config(nodes=3, ranks_per_node=1, affected_local=0, group="world", max_faults=1),
    Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, faults=frozenset({"group_fail"}),
           uses_r=("forward", "backward", "boundary")),
], ids=["2x2-f1", "2x2-spare1-backward-f1", "2x1-ddp-f2", "3x1-ddp-f1", "2x1-ddp-points-f2"])
def test_nothing_reads_what_an_exit_forgets(cfg):
    """P11.5: in every reachable state, giving every exited rank's forgotten fields other values
    changes no property's verdict, no action's enabledness, and no successor (up to those fields):
    the protocol and the properties read only pc, gen, reason and delayed of an exited rank.  And a
    rank exits only once the abort is written or the store is lost."""
    from dataclasses import replace

    from accelpact.model.engine import Search
    from accelpact.model.invariants import EDGE_INVARIANTS, INVARIANTS
    from accelpact.model.protocol import _EXIT_FORGETS
    from accelpact.model.transitions import actions_for

    assert set(_PERTURBED) == set(_EXIT_FORGETS) - {"hung", "raised"}
    search = Search(cfg, symmetry=False)
    search.run(stop=False)
    table = actions_for(cfg)

    def perturbed(s):
        return replace(s, ranks=tuple(replace(rk, **_PERTURBED) if rk.pc == PC_EXITED else rk for rk in s.ranks))

    def masked(s):
        return replace(s, ranks=tuple(replace(rk, **_EXIT_FORGETS) if rk.pc == PC_EXITED else rk for rk in s.ranks))

    checked = 0
    for s in search.states:
        if not any(rk.pc == PC_EXITED for rk in s.ranks):
            continue
        assert s.store.abort or s.store.down, f"a rank exited with neither an abort nor a lost store: {s}"
        assert all(not rk.hung and not rk.raised for rk in s.ranks if rk.pc == PC_EXITED)
        p = perturbed(s)
        checked += 1
        for inv in INVARIANTS:
            assert (inv.check(cfg, s) is None) == (inv.check(cfg, p) is None), f"{inv.id} reads a forgotten field"
        for a in search.actions:
            spec = table[a.name]
            on = spec.enabled(cfg, s, a.rank, a.arg)
            assert on == spec.enabled(cfg, p, a.rank, a.arg), f"{a}'s enabledness reads a forgotten field"
            if on:
                t, u = spec.step(cfg, s, a.rank, a.arg), spec.step(cfg, p, a.rank, a.arg)
                assert masked(t) == masked(u), f"{a}'s successor reads a forgotten field"
                for inv in EDGE_INVARIANTS:
                    assert (inv.check(cfg, s, t) is None) == (inv.check(cfg, p, u) is None), f"{inv.id} reads a forgotten field"
    assert checked > 100
