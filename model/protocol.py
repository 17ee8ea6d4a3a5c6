"""The six-phase recovery protocol as pure transition functions (spec/protocol.md).

Every spec action is one pair ``enabled(config, state, rank, arg) -> bool`` and
``step(config, state, rank, arg) -> State``, registered in :data:`ACTIONS` under the
name the spec uses.  Actions are named actor + verb, as in tlaplus/Examples TwoPhase:
``Rank*`` are protocol steps a rank takes, ``Fault*`` are injected faults,
``Supervisor*`` is torchrun.  Three drivers use this one transition function, through
:mod:`accelpact.model.transitions` (the table of a config, a mutant's included): the
exhaustive search (``explore``), the hypothesis state machine (``stateful``) and the
trace checker (``accelpact.conformance``).

Granularity follows the implementation: one action per control-plane round trip or
per local phase, so that every trace record of a real rank is one model step.

Phases: 1 Observe, 2 Guard, 3 Agree, 4 Replace, 5 Rebind, 6 Validate (+ Release).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from . import hotswap
from .batches import share
from .contract import DISCARD_PHASES, IN_FLIGHT_PHASES, decide
from .state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    DEPOSED_ACTING,
    DEPOSED_AWAKE,
    DEPOSED_STOPPED,
    PC_AGREED,
    PC_ARRIVED,
    PC_CRASHED,
    PC_EXITED,
    PC_GUARDED,
    PC_JOINED,
    PC_LEFT,
    PC_OBSERVED,
    PC_READY,
    PC_REBOUND,
    PC_REPLACED,
    PC_RESTARTED,
    PC_TRAIN,
    PC_VALIDATED,
    REASON_DEADLINE,
    REASON_EXCEPTION,
    REASON_MISMATCH,
    REASON_REJECTED,
    RECOVERY_PCS,
    SHARD_NONE,
    SHARD_OWN,
    STEP_ORDER,
    Config,
    Rank,
    State,
    initial_state,
)

__all__ = [
    "ACTIONS",
    "Action",
    "ActionSpec",
    "FAULT_KINDS",
    "ELASTIC_ACTIONS",
    "HOTSWAP_ACTIONS",
    "LINK_ACTIONS",
    "all_actions",
    "initial_state",
    "is_final",
    "link_arg",
    "stalled",
]

#: Fault kinds (spec/fault-model.md).  Config.faults selects a subset; empty means all.
from .faults import MODEL_KINDS as FAULT_KINDS  # noqa: E402 - the one fault table (model/faults.py) derives them


@dataclass(frozen=True, slots=True)
class Action:
    """One action instance: a spec action name, its actor rank (None for global), an argument."""

    name: str
    rank: int | None = None
    arg: str | None = None

    def __str__(self) -> str:
        inside = ", ".join(str(x) for x in (self.rank, self.arg) if x is not None)
        return f"{self.name}({inside})"

    @classmethod
    def parse(cls, token: str) -> "Action":
        """The instance a spec run names, ``Name(rank)`` or ``Name(rank,arg)`` (spec/protocol.md's
        ``*-run`` blocks: no spaces); a token of another shape is a ValueError naming it."""
        name, sep, inside = token.partition("(")
        if not (sep and name.isidentifier() and inside.endswith(")")):
            raise ValueError(f"action token {token!r}: expected Name(rank) or Name(rank,arg)")
        rank, _, rest = inside[:-1].partition(",")
        try:
            return cls(name, int(rank), rest or None)
        except ValueError:
            raise ValueError(f"action token {token!r}: the rank {rank!r} is not an integer") from None


@dataclass(frozen=True, slots=True)
class ActionSpec:
    name: str
    actor: str          # "rank" | "spare" | "keeper" | "fault" | "supervisor"
    phase: int | None   # protocol phase the action belongs to (1-6), None for faults/supervisor
    enabled: Callable[[Config, State, int | None, str | None], bool]
    step: Callable[[Config, State, int | None, str | None], State]
    fault_kind: str | None = None
    doc: str = ""
    #: The actor's program counters in which ``enabled`` can hold (a necessary condition, read off
    #: its first test); None: any.  The search skips an instance whose actor is elsewhere, without
    #: calling ``enabled`` (engine.Search, only for this table's own ``enabled``: a mutant that
    #: replaces it is asked everywhere).  tests/test_model_explore.py checks it on every reachable state.
    pcs: frozenset[str] | None = None


# --------------------------------------------------------------------------------------
# Helpers.  Generation fencing lives in the store keys: every entry carries the generation it
# was written in, and every lookup and count is of one generation's entries.

def true_lookup(pairs: tuple[tuple[int, str], ...], gen: int) -> str | None:
    """The value written under generation ``gen``'s key (None when the key is empty)."""
    for g, value in pairs:
        if g == gen:
            return value
    return None


def _compare_set(pairs: tuple[tuple[int, str], ...], gen: int, value: str) -> tuple[tuple[int, str], ...]:
    """Single assignment: write only if generation ``gen``'s key is empty."""
    if true_lookup(pairs, gen) is not None:
        return pairs
    return pairs + ((gen, value),)


def _count_arrivals(s: State, gen: int) -> int:
    return sum(1 for a in s.store.arrivals if a[0] == gen)


def _count_ready(s: State, gen: int) -> int:
    return sum(1 for a in s.store.ready if a[0] == gen)


def _in_dp(cfg: Config, s: State, r: int) -> bool:
    """Rank r's replica is in the data-parallel dimension (not out after a shrink, P19)."""
    return not s.store.out or cfg.replica_of(r) not in s.store.out


def _dp_ranks(cfg: Config, s: State) -> tuple[int, ...]:
    """The ranks whose replica is in the data-parallel dimension: those a barrier of the episode
    counts (every rank of W unless a shrink took a replica out, P19)."""
    if not s.store.out:
        return cfg.world
    return tuple(r for r in cfg.world if cfg.replica_of(r) not in s.store.out)


def _dp_peers(cfg: Config, s: State, r: int) -> tuple[int, ...]:
    """The members of rank r's group (with r) in the data-parallel dimension: those its validation waits for."""
    peers = _peers(cfg, r)
    return peers if not s.store.out else tuple(m for m in peers if cfg.replica_of(m) not in s.store.out)


def _member(cfg: Config, s: State, r: int) -> bool:
    """Rank r's group failed in its current generation's episode: it rebuilds that group (R)."""
    f = s.store.failed
    return f is not None and f[0] == s.ranks[r].gen and cfg.group_of(r) in f[2]


def _rebuilds(cfg: Config, s: State, r: int) -> bool:
    """Rank r rebuilds its communicators in its generation's episode (phases 4-6): a member of R;
    any rank in an episode that rebuilds every group (:func:`_rebuilds_all`)."""
    if _member(cfg, s, r):
        return True
    return _in_episode(s, r) and _rebuilds_all(s, s.ranks[r].gen)


def _rebuilds_all(s: State, g: int) -> bool:
    """Episode ``g`` rebuilds every group of every rank: a crash episode (hot swap): the world, default
    and control groups contain the dead rank, so every group is rebuilt with the spare in it
    (``FaultCrash(rank, point)`` records every group in history ``failures``); and an episode whose step
    was discarded in flight (issue 27, P17.1): the step was abandoned with collectives in flight on
    every group, none of which can be used again.  (By phase 4 every rank has arrived: every discard
    of the episode is in; a rank that observed in flight and could not discard rejected, and no rank
    is in phase 4.)"""
    return _crash_episode(s, g) or any(gd == g for gd, _q in s.discarded)


def _rebuilds_wide(s: State, r: int) -> bool:
    """Rank r rebuilds its groups over all of W in its generation g's episode (P18.3): where every group
    is rebuilt (:func:`_rebuilds_all`), or where their failure was learned: the wide revoke of g was
    published (``Store.wide_revoked``: a rank's failure flag or checkpoint save failed under it,
    ``RankRevokeWide``).  Read after the agreement, when every rank has arrived (no rank publishes
    after its arrival), so every rank of g decides alike.  A broken link that nothing met yet is not
    known: the groups over W are kept, and the break is met later (latent, :func:`_wide_broken`)."""
    g = s.ranks[r].gen
    return g in s.store.wide_revoked or _rebuilds_all(s, g)


def _struck_in_flight(s: State, gen: int) -> bool:
    """Generation ``gen``'s failure struck inside forward or backward on a group of R's kind (a step
    abandoned mid-pass): every group is broken (history ``failures``, P17.1).  A link cut that crosses
    only the groups over all of W (P18.2) fails no training collective of the step."""
    f = s.store.failed
    return f is not None and f[0] == gen and f[1] in DISCARD_PHASES and bool(f[2])


def _loaded(s: State, r: int) -> bool:
    """Rank r holds S_app: every rank but a spare whose state has not been transferred yet."""
    return s.ranks[r].shard != SHARD_NONE


def _peers(cfg: Config, r: int) -> tuple[int, ...]:
    """The members of rank r's group (with r): those its replacement and validation wait for."""
    return cfg.members(cfg.group_of(r))


def _failed_members(cfg: Config, s: State) -> tuple[int, ...]:
    f = s.store.failed
    return tuple(m for gi in sorted(f[2]) for m in cfg.members(gi)) if f is not None else ()


def _in_episode(s: State, r: int) -> bool:
    """True while rank r's generation has a failed communicator (a recovery is under way)."""
    f = s.store.failed
    return f is not None and f[0] == s.ranks[r].gen


def _alive(s: State, r: int) -> bool:
    """A rank of the job: not gone (exited, crashed, restarted) and not an idle spare since its replica left."""
    return s.ranks[r].pc not in (PC_EXITED, PC_CRASHED, PC_RESTARTED, PC_LEFT)


#: the program counters of a live rank (:func:`_alive`)
_ALIVE_PCS = (PC_TRAIN, *RECOVERY_PCS, PC_JOINED)


def _active(s: State, r: int) -> bool:
    """Alive, main thread not hung, no exception propagating: can take a protocol step."""
    rk = s.ranks[r]
    return _alive(s, r) and not rk.hung and not rk.raised


def _via_store(s: State, r: int) -> bool:
    """Active, and the store answers: a step that reads or writes the store (every step but the
    guard, the rebinding and the validation collective, which are local or on the new group)."""
    return _active(s, r) and not s.store.down


def _nominal_frontier(cfg: Config, s: State, r: int) -> int:
    """The committed frontier rank r holds when nothing struck it: F of its generation's episode
    once it observed that episode, F of the previous episode while it still trains toward it."""
    rk = s.ranks[r]
    if rk.pc == PC_TRAIN and rk.gen > 0:
        return cfg.frontier_at(rk.gen - 1)
    f = s.store.failed
    if f is None or (s.discarded and (rk.gen, r) in s.discarded):  # a discarded step was not committed
        return cfg.frontier_at(rk.gen)
    return cfg.frontier_at(rk.gen) + _committed_since(f[1], rk.point)


def _committed_since(struck: str, seen: str) -> int:
    """1 when a rank that observes at ``seen`` a failure that struck in flight at ``struck`` has
    committed that step meanwhile (it observes at the boundary, after its optimizer step)."""
    return 1 if seen == "boundary" and struck != "boundary" else 0


def stalled(cfg: Config, s: State) -> bool:
    """Some rank cannot make progress: the only situation in which a deadline can expire.

    This encodes the deadline assumption (spec/protocol.md, "Deadlines"): deadlines are
    longer than any healthy phase, so they expire only when a peer is crashed, hung,
    slowed, has lost a write, or is already gone.  A rank that died in training whose identity is
    being handed to a spare (hot swap, :func:`accelpact.model.hotswap.excused`) does not count: the
    deadlines cover the swap.
    """
    if not s.store.dead:
        return any(
            rk.pc in (PC_CRASHED, PC_EXITED) or rk.hung or rk.delayed or rk.lost or rk.raised
            for rk in s.ranks
        )
    return any(
        (rk.pc == PC_CRASHED and not hotswap.excused(cfg, s, q)) or rk.pc == PC_EXITED
        or rk.hung or rk.delayed or rk.lost or rk.raised
        for q, rk in enumerate(s.ranks)
    )


def _gone(cfg: Config, s: State, q: int) -> bool:
    """Rank q crashed (and is not being swapped) or exited: a peer's wait on it fails."""
    pk = s.ranks[q]
    if pk.pc == PC_EXITED:
        return True
    return pk.pc == PC_CRASHED and not (s.store.dead and hotswap.excused(cfg, s, q))


def _crash_episode(s: State, gen: int) -> bool:
    """Generation ``gen``'s failure is a rank that died in training (hot swap; never without spares)."""
    return any(g == gen for g, _r in s.store.dead)


def _abort(s: State, reason: str) -> State:
    return s if s.store.abort else s.with_store(abort=reason)


#: What an exit forgets of a rank (spec P11.5): its process is gone, and with it everything it held
#: (S_app, its point, communicators and references, its fault flags).  The protocol and the
#: properties still read four things of an exited rank, which :func:`_exit` keeps: that it exited
#: (``pc``), in which generation (``gen``: a generation never decreases, W1), why (``reason``: its
#: exit code, W2, and what torchrun's restart reports), and that it was slow (``delayed``: a failure
#: detector may still suspect it, ``RankSuspect``).  Every other field returns to its initial value,
#: so two runs that differ only in what an exited process held are one state.  What others learned
#: from it before it exited stays theirs: phase 6's digests (``State.validated``), and whether it saw
#: its episode's collective fail where the failure struck (``State.witnessed``: a partial
#: collective's witness, read by ``RankObserve``).  ``tests/test_model_protocol.py`` perturbs every
#: forgotten field of every exited rank in every reachable state of several configurations and
#: checks that no enabled action, successor or property changes.
_EXIT_FORGETS: dict[str, object] = {
    f.name: f.default for f in fields(Rank) if f.compare and f.name not in ("pc", "gen", "reason", "delayed")}


def _exit(cfg: Config, s: State, r: int, reason: str) -> State:
    rk = s.ranks[r]
    g = rk.gen
    s = s.with_(exits=s.exits | {(g, r, reason, true_lookup(s.store.release, g) == DECISION_RELEASE)})
    f = s.store.failed
    if f is not None and _member(cfg, s, r) and rk.point == f[1] and g not in s.witnessed:
        s = s.with_(witnessed=s.witnessed | {g})
    return s.with_rank(r, **_EXIT_FORGETS, pc=PC_EXITED, reason=reason)


def _decision_key(pc: str) -> str:
    """Which decision a rank in ``pc`` is waiting for: agreement before phase 4, release after."""
    return "agree" if pc in (PC_TRAIN, PC_OBSERVED, PC_GUARDED, PC_ARRIVED, PC_JOINED) else "release"


def _write_abort_decision(cfg: Config, s: State, r: int, reason: str) -> State:
    rk = s.ranks[r]
    which = _decision_key(rk.pc)
    pairs = getattr(s.store, which)
    return s.with_store(**{which: _compare_set(pairs, rk.gen, f"abort:{reason}")})


def _contract_decision(cfg: Config, s: State, r: int):
    """The contract's decision for rank r (C3); in a crash episode, with the hot-swap facts
    (:func:`accelpact.model.hotswap.rank_decision`: a spare left, a replica alive)."""
    rk = s.ranks[r]
    if s.store.dead and _crash_episode(s, rk.gen):
        return hotswap.rank_decision(cfg, s, r)
    return decide(cfg.envelope, cfg.key(rk.point), guards_ok=not rk.dirty)


# --------------------------------------------------------------------------------------
# Phase 1: Observe

def _seen_failing(cfg: Config, s: State, r: int) -> bool:
    """Some other member of a failed group saw the episode's collective fail where the failure
    struck: it observed there, or it has not observed yet (it still will), or it observed there and
    exited since (``State.witnessed``: an exited rank's own point is forgotten)."""
    f = s.store.failed
    assert f is not None  # RankObserve asks only inside an episode
    if f[0] in s.witnessed:
        return True
    for m in _failed_members(cfg, s):
        mk = s.ranks[m]
        if m != r and mk.gen == f[0] and mk.pc != PC_EXITED and (mk.pc == PC_TRAIN or mk.point == f[1]):
            return True
    return False


def _observable(cfg: Config, f: tuple[int, str, frozenset[int]]) -> tuple[str, ...]:
    """Where an episode's failure ``f`` can be observed: where a rank next uses R after it struck
    (``Config.observable``); a failure that broke no group of R's kind (a link cut across none, P18.2)
    fails no training collective of the step: it is met at the boundary, by the failure flag or a
    save.  With the commit fence (``Config.fence``, P17.2: an all-reduce over all of W as
    ``optimizer.step()`` starts, in ``backward``), a failure in forward or backward stops every rank
    before its commit: a group of R's kind is observed in flight, never at the boundary past a
    commit; one over W at the fence (``backward``), or, when the fence's exchanges do not cross the
    broken link, at the boundary after every rank committed."""
    if cfg.fence and f[1] in DISCARD_PHASES:
        if f[2]:
            return tuple(p for p in cfg.observable(f[1]) if p != "boundary")
        return ("backward", "boundary")
    return cfg.observable(f[1]) if f[2] else ("boundary",)


def _death_observable(cfg: Config, f: tuple[int, str, frozenset[int]]) -> tuple[str, ...]:
    """Where a survivor observes a death that struck at ``f[1]`` (P16.0): the first use of R at or
    after it, never later (a death leaves no partial collective of the step).  A death at the
    boundary strikes during its failure flag, an all-reduce over W that is not atomic either (soak
    K5): a survivor whose copy of the flag completed has gone on into the next step and observes at
    its first use of R there (or the commit fence, P17.2), the step uncommitted (in flight: it
    discards it), while a peer whose copy failed observes at the boundary."""
    first = tuple(p for p in _observable(cfg, f) if p == cfg.observable(f[1])[0])
    if f[1] != "boundary":
        return first
    nxt = [q for q in STEP_ORDER if q != "boundary" and (q in cfg.uses_r or (cfg.fence and q == "backward"))]
    return first + tuple(nxt[:1])


def _wide_broken(s: State, r: int) -> bool:
    """Rank r holds groups over all of W that a link broke: a link failed (history ``Store.wide``) in a
    generation at or after the one its groups were built in (``Rank.wide``).  Kept past an episode that
    did not learn of it, such a group is broken, latent, until a collective on it meets the break."""
    w = s.ranks[r].wide
    return any(gl >= w for gl in s.store.wide)


def _flag_fails(cfg: Config, s: State, r: int) -> bool:
    """The failure flag (an all-reduce over all of W on the control group; or the commit fence, or a
    checkpoint save, P18.4) can fail under rank r: a group over W it holds is broken by a link, now or
    latent since an earlier generation (:func:`_wide_broken`), or a peer it waits on is gone or hung
    (before P18.4, only ``RankTimeout`` from ``train``, D1), or the wide revoke of its generation closed
    its groups over W (``Store.wide_revoked``)."""
    return (_wide_broken(s, r) or s.ranks[r].gen in s.store.wide_revoked
            or any(_gone(cfg, s, q) or pk.hung for q, pk in enumerate(s.ranks)))


def _start_latent(cfg: Config, s: State, r: int, point: str) -> State:
    """The episode of rank r's generation g starts on a latent break it met at ``point`` (one unit of the
    fault budget, :func:`_meets_latent`).  No group of R's kind failed, except a group of R's kind over
    all of W (DDP: R is W): it is a group over W, failed with them (spec/protocol.md D8)."""
    g = s.ranks[r].gen
    groups = frozenset({0}) if len(cfg.members(0)) == len(cfg.world) else frozenset()
    s = s.with_store(failed=(g, point, groups))
    return s.with_(faults=s.faults + 1, failures=s.failures | {(g, gi) for gi in groups})


def _meets_latent(cfg: Config, s: State, r: int) -> bool:
    """Rank r, training in generation g outside any episode, holds groups over W a link broke (latent,
    :func:`_wide_broken`): its next collective over W that crosses the break can fail and start the
    episode of g with no new fault (the commit fence in backward: ``RankObserve(r, backward)``; the
    failure flag or a checkpoint save at the boundary: ``RankRevokeWide(r)``).  Whether a collective
    crosses the break is the world's choice, as a fault is: the meeting takes one unit of the fault
    budget (``Config.max_faults`` bounds the episodes, so the search stays finite), and, as a fault,
    happens only between episodes (every rank trains in g, or reads g-1's release already decided)."""
    rk = s.ranks[r]
    if rk.pc != PC_TRAIN or not s.store.wide or s.store.abort or not _fault_ok(cfg, s, "link") or not _via_store(s, r):
        return False
    f = s.store.failed
    return (f is None or f[0] < rk.gen) and _wide_broken(s, r) and _between_episodes(cfg, s, rk.gen)


def _en_observe(cfg: Config, s: State, r, point) -> bool:
    """Rank r observes its episode's failure at ``point``: where it next uses R after the failure
    struck (``Config.observable``).  A failure during a collective on R fails it for at least one
    member: another member may have completed it and observe at its next use (a partial
    collective), as long as some peer saw it fail (or still can).  Outside R's failed groups a rank
    observes through a revoke, or at the boundary through its own failure flag (P18.4)."""
    rk = s.ranks[r]
    if rk.pc != PC_TRAIN or not _via_store(s, r):
        return False
    if not _in_episode(s, r):
        # a latent break met at the commit fence (P17.2) starts an episode: the step is abandoned in flight
        return cfg.fence and point == "backward" and _meets_latent(cfg, s, r)
    f = s.store.failed
    assert f is not None
    if s.store.dead and _crash_episode(s, f[0]):
        # a rank died: every group it belonged to (its shard group, R, the control group) failed, and
        # every rank's step waits on them: each survivor observes where it first uses R, never later
        return point in _death_observable(cfg, f)
    if point not in _observable(cfg, f):
        return False
    if point != f[1] and f[1] in cfg.uses_r and _member(cfg, s, r) and not _seen_failing(cfg, s, r):
        # past a collective that failed: only if some peer saw it fail there (a partial collective)
        return False
    if _member(cfg, s, r) or rk.gen in s.store.revoked:
        return True
    # P18.4: its failure flag fails, or a checkpoint save after a boundary that found nothing; or the
    # commit fence (P17.2), an all-reduce over all of W too, in backward
    return (point == "boundary" or (cfg.fence and point in DISCARD_PHASES)) and _flag_fails(cfg, s, r)


def _st_observe(cfg: Config, s: State, r, point) -> State:
    rk = s.ranks[r]
    if not _in_episode(s, r):  # a latent break met at the commit fence: the episode of its generation starts
        s = _start_latent(cfg, s, r, point)
    f = s.store.failed
    assert f is not None
    # it trained from the previous episode's frontier to this one's (F moves between episodes), and,
    # observing at the boundary a failure that struck in flight, committed that step too
    step = (cfg.advance if rk.gen > 0 else 0) + _committed_since(f[1], point)
    # in flight, the step is uncommitted: gradients outstanding, the wrapper mid-pass, RNG and data
    # cursor one step past the committed frontier
    inflight = point in IN_FLIGHT_PHASES
    s = s.with_rank(r, pc=PC_OBSERVED, point=point, seen=point, frontier=rk.frontier + step, tau=rk.tau + step,
                    grads=inflight, ahead=1 if inflight else 0)
    # members publish revoke(R, g) so every rank observes within ms; a rank that abandons its step in
    # flight publishes the step revoke (P17.1).  A rank whose failure flag failed at the boundary publishes
    # the wide revoke before it observes (RankRevokeWide, P18.4), not here
    if (_member(cfg, s, r) or inflight) and rk.gen not in s.store.revoked:
        s = s.with_store(revoked=s.store.revoked | {rk.gen})
    return s


def _en_revoke_wide(cfg, s, r, arg) -> bool:
    """``RankRevokeWide(r)`` (P18.4): rank r's failure flag, or a checkpoint save after a boundary that
    found nothing, fails under it (:func:`_flag_fails`), and the wide revoke of its generation g is not
    published yet (single assignment on ``g{g}/revoke/wide``: the first writer publishes).  Before it
    observes (``train``): inside g's episode where the failure can be met at the boundary, or starting
    g's episode on a latent break (:func:`_meets_latent`); or after it observed at the boundary through
    its probe on R or R's revoke (``observed``).  In any episode, a crash's or a hang's too: the flag
    that fails under a gone or hung peer cannot tell it from a broken link, and the engine publishes
    what its flag says (a hot swap then rebuilds every group anyway, P16; without a spare it is L2)."""
    rk = s.ranks[r]
    g = rk.gen
    if g in s.store.wide_revoked or not _via_store(s, r) or s.store.abort:
        return False
    if rk.pc == PC_TRAIN and not _in_episode(s, r):
        return _meets_latent(cfg, s, r)
    if rk.pc == PC_TRAIN:
        f = s.store.failed
        ok = "boundary" in _observable(cfg, f)
    elif rk.pc == PC_OBSERVED:
        ok = rk.seen == "boundary"
    else:
        return False
    return ok and _flag_fails(cfg, s, r)


def _st_revoke_wide(cfg, s, r, arg) -> State:
    """Publish the wide revoke of g (every watcher closes its groups over W, so a peer blocked in the
    flag or a save wakes up and observes: P18.4).  On a latent break the episode of g starts here
    (``_start_latent``: no group of R's kind failed but, in DDP, R over all of W); the rank observes next."""
    g = s.ranks[r].gen
    if not _in_episode(s, r):  # a latent break met (one unit of the fault budget, _meets_latent)
        s = _start_latent(cfg, s, r, "boundary")
    return s.with_store(wide_revoked=s.store.wide_revoked | {g})


# Phase 2: Guard check + contract decision

def _en_guard(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return (rk.pc == PC_OBSERVED and _active(s, r) and not rk.grads and not rk.ahead
            and _contract_decision(cfg, s, r).preserve)


def _st_guard(cfg, s, r, arg) -> State:
    return s.with_rank(r, pc=PC_GUARDED)


def _en_reject(cfg, s, r, arg) -> bool:
    return (s.ranks[r].pc == PC_OBSERVED and _via_store(s, r) and not _contract_decision(cfg, s, r).preserve
            and not _left_job(cfg, s, r))


def _st_reject(cfg, s, r, arg) -> State:
    s = _write_abort_decision(cfg, s, r, REASON_REJECTED)
    s = _abort(s, REASON_REJECTED)
    return _exit(cfg, s, r, REASON_REJECTED)


# Phase 3: control barrier + frontier agreement

def _en_arrive(cfg, s, r, arg) -> bool:
    """A rank whose guard passed, or a spare that joined (it posts the F its identity published at
    its last commit: it holds no state until the transfer, after the groups are rebuilt)."""
    if not (s.ranks[r].pc in (PC_GUARDED, PC_JOINED) and _via_store(s, r)):
        return False
    if cfg.shrink:
        # P19.1: a survivor arrives once every dead rank of the episode is handled (a spare claimed for
        # it, or its replica out), so the barrier counts the data-parallel dimension as it will stand;
        # a rank whose replica left leaves instead (RankLeave)
        return _in_dp(cfg, s, r) and not (_crash_episode(s, s.ranks[r].gen) and hotswap.unclaimed(s, s.ranks[r].gen, cfg))
    return True


def _st_arrive(cfg, s, r, arg) -> State:
    rk = s.ranks[r]
    g = rk.gen
    if rk.drop:  # the write is lost; the rank believes it arrived
        return s.with_rank(r, pc=PC_ARRIVED, drop=False, lost=True)
    s = s.with_store(arrivals=s.store.arrivals | {(g, r, rk.frontier, rk.gen)})
    if _count_arrivals(s, g) == len(_dp_ranks(cfg, s)):
        s = s.with_store(last_arriver=s.store.last_arriver + ((g, r),))
    return s.with_rank(r, pc=PC_ARRIVED)


def _en_decide_agreement(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return (
        rk.pc == PC_ARRIVED
        and _via_store(s, r)
        and (rk.gen, r) in s.store.last_arriver
        and true_lookup(s.store.agree, rk.gen) is None
    )


def _st_decide_agreement(cfg, s, r, arg) -> State:
    g = s.ranks[r].gen
    rows = [a for a in s.store.arrivals if a[0] == g]
    first = _dp_ranks(cfg, s)[0]  # rank 0 unless its replica left (P19)
    ref = [a for a in rows if a[1] == first]
    f0 = ref[-1][2] if ref else None
    # every row reports rank 0's F and the generation it was written in (the value is "F,g": with
    # keys that are not namespaced, mutant no-fence, this is what still tells a stale row)
    ok = f0 is not None and all(a[2] == f0 and a[3] == g for a in rows)
    value = DECISION_COMMIT if ok else f"abort:{REASON_MISMATCH}"
    s = s.with_store(agree=_compare_set(s.store.agree, g, value))
    if not ok:
        s = _abort(s, REASON_MISMATCH)
    return s


def _en_await_agreement(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return rk.pc == PC_ARRIVED and _via_store(s, r) and true_lookup(s.store.agree, rk.gen) == DECISION_COMMIT


def _st_await_agreement(cfg, s, r, arg) -> State:
    rk = s.ranks[r]
    s = s.with_rank(r, pc=PC_AGREED)
    return s.with_(agreed=s.agreed | {(rk.gen, r, rk.frontier)})


# Phase 4: communicator replacement (members of R)

def _en_replace(cfg, s, r, arg) -> bool:
    """Every rank of W (P18.3): it rebuilds what failed, read after the agreement: R's failed groups
    (members), every group (``_rebuilds_all``), the groups over all of W where their failure was learned
    (``_rebuilds_wide``); a rank that rebuilds nothing passes through.  The new communicators'
    rendezvous go through the store."""
    return s.ranks[r].pc == PC_AGREED and _via_store(s, r)


def _st_replace(cfg, s, r, arg) -> State:
    rk = s.ranks[r]
    g = rk.gen
    wide = g + 1 if _rebuilds_wide(s, r) else rk.wide
    if _rebuilds(cfg, s, r):
        return s.with_rank(r, pc=PC_REPLACED, comm=g + 1, wide=wide)
    return s.with_rank(r, pc=PC_REPLACED, wide=wide)


# Phase 5: reference rebinding (members of R)

def _en_rebind(cfg, s, r, arg) -> bool:
    return s.ranks[r].pc == PC_REPLACED and _rebuilds(cfg, s, r) and _active(s, r)


def _st_rebind(cfg, s, r, arg) -> State:
    return s.with_rank(r, pc=PC_REBOUND, refs=(s.ranks[r].gen + 1,) * cfg.refs)


# Phase 6: validation on the new group (members of R), then the release vote (all of W)

def _in_validation(cfg: Config, s: State, m: int, gen: int) -> bool:
    mk = s.ranks[m]
    if mk.gen > gen:  # already released
        return True
    if mk.pc in (PC_VALIDATED, PC_READY):
        return True
    return mk.pc == PC_REBOUND and not mk.hung and not mk.raised and _loaded(s, m)


def _validation(s: State, gen: int, group: int) -> bool | None:
    """What the validation collective of ``group`` in generation ``gen`` gathered: whether the
    members' digests were equal (``State.validated``); None while it has not completed."""
    for g, gi, agree in s.validated:
        if g == gen and gi == group:
            return agree
    return None


def _validation_complete(cfg: Config, s: State, r: int) -> bool:
    """The validation all-reduce (and the digests' all-gather) of rank r's group completes only
    when every member of that group has joined it (each failed group validates its own new
    communicator)."""
    rk = s.ranks[r]
    if rk.pc != PC_REBOUND or not _active(s, r) or not _loaded(s, r):
        return False
    return (_validation(s, rk.gen, cfg.group_of(r)) is not None
            or all(_in_validation(cfg, s, m, rk.gen) for m in _dp_peers(cfg, s, r)))


def _digests_agree(cfg: Config, s: State, r: int) -> bool:
    """The digests rank r compares once its group's collective completed: as the members published
    them at that moment (recorded by the first member to complete it, when every member was in
    phase 6), not as they are now: a peer may have exited since, and an exited rank holds nothing."""
    got = _validation(s, s.ranks[r].gen, cfg.group_of(r))
    return _replicas_agree(cfg, s, _dp_peers(cfg, s, r)) if got is None else got


def _complete_validation(cfg: Config, s: State, r: int) -> State:
    g, gi = s.ranks[r].gen, cfg.group_of(r)
    if _validation(s, g, gi) is not None:
        return s
    return s.with_(validated=s.validated | {(g, gi, _replicas_agree(cfg, s, _dp_peers(cfg, s, r)))})


def _shard_of(cfg: Config, s: State, r: int) -> int:
    """The replicate group whose parameter/optimizer shard rank r holds."""
    sh = s.ranks[r].shard
    return cfg.group_of(r) if sh == SHARD_OWN else sh


def _replicas_agree(cfg: Config, s: State, members: tuple[int, ...]) -> bool:
    """The replicas among ``members`` (the members of each group) hold the same S_app: their
    digests are equal.  A corrupt rank differs from its replicas (and, when a spare took a dead
    rank's identity, from the digest that rank published at its last commit: spec P16.6); so does
    a rank holding another group's shard or another optimizer step than its group's."""
    seen: dict[int, tuple[int, int]] = {}
    for m in members:
        rk = s.ranks[m]
        if rk.corrupt:
            return False
        if seen.setdefault(cfg.group_of(m), (_shard_of(cfg, s, m), rk.tau)) != (_shard_of(cfg, s, m), rk.tau):
            return False
    return True


def _en_validate(cfg, s, r, arg) -> bool:
    return _validation_complete(cfg, s, r) and _digests_agree(cfg, s, r)


def _st_validate(cfg, s, r, arg) -> State:
    return _complete_validation(cfg, s, r).with_rank(r, pc=PC_VALIDATED)


def _en_ready(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    want = PC_VALIDATED if _rebuilds(cfg, s, r) else PC_REPLACED
    return rk.pc == want and _via_store(s, r)


def _st_ready(cfg, s, r, arg) -> State:
    rk = s.ranks[r]
    g = rk.gen
    if rk.drop:
        return s.with_rank(r, pc=PC_READY, drop=False, lost=True)
    s = s.with_store(ready=s.store.ready | {(g, r)})
    if _count_ready(s, g) == len(_dp_ranks(cfg, s)):
        s = s.with_store(last_ready=s.store.last_ready + ((g, r),))
    return s.with_rank(r, pc=PC_READY)


def _en_decide_release(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return (
        rk.pc == PC_READY
        and _via_store(s, r)
        and (rk.gen, r) in s.store.last_ready
        and true_lookup(s.store.release, rk.gen) is None
    )


def _st_decide_release(cfg, s, r, arg) -> State:
    g = s.ranks[r].gen
    return s.with_store(release=_compare_set(s.store.release, g, DECISION_RELEASE))


def _en_resume(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return rk.pc == PC_READY and _via_store(s, r) and true_lookup(s.store.release, rk.gen) == DECISION_RELEASE


def _st_resume(cfg, s, r, arg) -> State:
    rk = s.ranks[r]
    # the point it observed the failure at (not the ``boundary`` a discard rewrote it to; a spare's: its transfer's)
    entry = (rk.gen, r, rk.seen or rk.point, rk.dirty)
    if s.store.claims and (rk.gen, r, rk.inc) in s.store.claims:  # a spare's first resume: what S9 judges
        s = s.with_(swapped=s.swapped | {(rk.gen, r, rk.shard, rk.tau, rk.ahead, rk.grads, rk.corrupt)})
    s = s.with_rank(r, pc=PC_TRAIN, gen=rk.gen + 1, point="", seen="", dirty=False, delayed=False, replayed=0)
    if cfg.shrink:  # P19.2: the micro-batches its replica processes in every step from F on
        s = s.with_(shares=s.shares | {(rk.gen, r, _share_of(cfg, s, r))})
    return s.with_(resumed=s.resumed | {entry})


def _share_of(cfg: Config, s: State, r: int) -> tuple[int, ...]:
    """The micro-batches of every step that rank r's replica processes while the replicas in the
    data-parallel dimension are those not out (``model/batches.share``, P19.2)."""
    g = s.ranks[r].gen - 1  # it resumed from g: the replicas agreed in g, whatever a grow opened since
    return share(cfg.replica_of(r), _replicas_in(cfg, s, g), cfg.total_micro_batches)


def _replicas_in(cfg: Config, s: State, g: int) -> tuple[int, ...]:
    """The replicas in the data-parallel dimension in generation ``g``: the store's ``g{g}/out/*`` and
    ``g{g}/grow/*`` keys up to g, a grow (which opens its generation) before a shrink in it."""
    out: set[int] = set()
    for gg, i, grow in sorted([(gg, i, False) for gg, i in s.store.shrunk] + [(gg, i, True) for gg, i in s.store.grown],
                              key=lambda e: (e[0], not e[2])):
        if gg <= g:
            (out.discard if grow else out.add)(i)
    return tuple(i for i in cfg.replicas if i not in out)


# Failure handling inside phases 2-6

def _en_timeout(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    if not _via_store(s, r) or not stalled(cfg, s) or s.store.abort or _left_job(cfg, s, r):
        # once an abort stands, a failed wait is an exit on that abort (RankExit), not a new one
        return False
    if rk.pc == PC_TRAIN:
        # The boundary's failure flag is an all-reduce on the control group over all of W: if a
        # peer crashed, exited or hangs, it fails or its deadline expires, whether or not R was
        # revoked (found by the explorer: 2x2, group_fail + 2 crashes left non-members waiting).
        return _in_episode(s, r) and any(_gone(cfg, s, q) or pk.hung for q, pk in enumerate(s.ranks))
    if rk.pc == PC_JOINED:
        return True  # a spare (hot swap) whose store operations wait on a stalled peer
    if rk.pc == PC_AGREED:
        # building the replacement communicators is a rendezvous: R's of its members, and the groups
        # over all of W of every rank (P18.3)
        return True
    if rk.pc == PC_ARRIVED:
        return true_lookup(s.store.agree, rk.gen) is None
    if rk.pc == PC_REBOUND:
        return not _validation_complete(cfg, s, r)
    if rk.pc == PC_READY:
        return true_lookup(s.store.release, rk.gen) is None
    return False


def _left_job(cfg: Config, s: State, r: int) -> bool:
    """Rank r's replica is out (P19): it is no rank of the job any more, and its failures are its own:
    no deadline, detector, rejection or exception of it writes the job's abort; it leaves (RankLeave)."""
    return bool(s.store.out) and hotswap.vacant(cfg, s, r)


def _st_timeout(cfg, s, r, arg) -> State:
    s = _write_abort_decision(cfg, s, r, REASON_DEADLINE)
    s = _abort(s, REASON_DEADLINE)
    return _exit(cfg, s, r, REASON_DEADLINE)


def _en_suspect(cfg, s, r, arg) -> bool:
    """The failure detector (heartbeats on the control plane) declares a peer dead or hung: it
    crashed or stopped (its heartbeat ends), or its main thread hangs while this rank waits on it;
    or, a false suspicion, it is merely slow (``delayed``).  Enabled wherever the rank is in an
    episode, in any pc: a detector does not wait for a deadline."""
    rk = s.ranks[r]
    if not _via_store(s, r) or s.store.abort or _left_job(cfg, s, r):
        return False
    if not (rk.pc in RECOVERY_PCS or (rk.pc == PC_TRAIN and _in_episode(s, r))):
        return False
    if s.store.dead:  # a dead rank being swapped is declared by RankClaimSpare instead
        return any(q != r and ((pk.pc == PC_CRASHED and not hotswap.excused(cfg, s, q)) or pk.hung or pk.delayed)
                   for q, pk in enumerate(s.ranks))
    return any(q != r and (pk.pc == PC_CRASHED or pk.hung or pk.delayed) for q, pk in enumerate(s.ranks))


def _st_suspect(cfg, s, r, arg) -> State:
    """As RankTimeout: abort:deadline into its phase's decision (if still open) and the job.  A live
    suspect (a false suspicion) exits on that abort like everyone else: all or none."""
    return _st_timeout(cfg, s, r, arg)


def _en_expire(cfg, s, r, arg) -> bool:
    """The watchdog's step deadline: armed when a step starts and disarmed when its boundary
    returns, it fires only if the main thread stopped (hung) inside a failure episode: in the
    step, at the boundary, or in phases 2-6.  Without it a job whose every rank hangs would
    wait forever (nobody left to time out); with it every rank exits within a bound."""
    rk = s.ranks[r]
    if not (_alive(s, r) and rk.hung) or s.store.abort or s.store.down or _left_job(cfg, s, r):
        return False
    return rk.pc in RECOVERY_PCS or (rk.pc == PC_TRAIN and _in_episode(s, r))


def _st_expire(cfg, s, r, arg) -> State:
    """As RankTimeout: abort:deadline into its phase's decision (if still open) and the job."""
    return _st_timeout(cfg, s, r, arg)


def _en_fail(cfg, s, r, arg) -> bool:
    """An exception in phases 2-6: one propagating (FaultRaise), or phase 6's digest comparison
    finding that the replicas of R differ (once the validation collective completed)."""
    rk = s.ranks[r]
    if s.store.down or _left_job(cfg, s, r):
        return False  # its abort cannot be written: it ends by RankLoseStore (or its replica left: RankLeave)
    if rk.raised:
        return rk.pc in RECOVERY_PCS and not rk.hung
    return _validation_complete(cfg, s, r) and not _digests_agree(cfg, s, r)


def _st_fail(cfg, s, r, arg) -> State:
    if not s.ranks[r].raised:  # the digests differ: the validation collective completed
        s = _complete_validation(cfg, s, r)
    s = _write_abort_decision(cfg, s, r, REASON_EXCEPTION)
    s = _abort(s, REASON_EXCEPTION)
    return _exit(cfg, s, r, REASON_EXCEPTION)


def _en_exit(cfg, s, r, arg) -> bool:
    """The watchdog: an abort in the store ends every live rank, hung or not."""
    return bool(s.store.abort) and _alive(s, r) and not s.ranks[r].raised


def _st_exit(cfg, s, r, arg) -> State:
    return _exit(cfg, s, r, s.store.abort)


def _en_lose_store(cfg, s, r, arg) -> bool:
    """The store is gone: the rank's next store operation, or its watchdog's poll of the abort
    key (which runs even when the main thread hangs), fails, and the rank exits."""
    return s.store.down and _alive(s, r)


def _st_lose_store(cfg, s, r, arg) -> State:
    return _exit(cfg, s, r, REASON_DEADLINE)


# --------------------------------------------------------------------------------------
# Faults.  Each consumes one unit of Config.max_faults.

def _fault_ok(cfg: Config, s: State, kind: str) -> bool:
    return (
        s.faults < cfg.max_faults
        and (not cfg.faults or kind in cfg.faults)
        and not s.supervisor
    )


def _victim(s: State, r: int) -> bool:
    """A rank that a fault can strike: alive and inside a recovery episode."""
    return _alive(s, r) and _in_episode(s, r) and s.ranks[r].pc in (PC_TRAIN,) + RECOVERY_PCS


def _failing_group(cfg: Config, r: int | None) -> int:
    """The group a FaultGroupFail breaks: the fixed one (``failing="one"``, no actor), or the group
    of its actor rank (``"any"``: the action is instantiated for one representative rank per group)."""
    return cfg.groups[0] if r is None else cfg.group_of(r)


def _between_episodes(cfg: Config, s: State, gen: int) -> bool:
    """Every rank trains in generation ``gen`` or is about to: it still reads the release of
    ``gen - 1``, already decided (episodes overlap: a peer's first step after a repair may fail
    while this rank has not resumed yet).  Nobody hung, gone, or observing.  A vacant identity (its
    replica out after a shrink, P19: an idle spare or a dead process, ``PC_LEFT``/``PC_CRASHED`` with
    ``Store.out``) is no rank of the job meanwhile."""
    for q, rk in enumerate(s.ranks):
        if s.store.out and rk.pc in (PC_LEFT, PC_CRASHED) and cfg.replica_of(q) in s.store.out:
            continue
        if rk.hung:
            return False
        if rk.pc == PC_TRAIN and rk.gen == gen:
            continue
        if rk.pc == PC_READY and rk.gen == gen - 1 and true_lookup(s.store.release, gen - 1) == DECISION_RELEASE:
            continue
        return False
    return True


def _en_group_fail(cfg, s, r, point) -> bool:
    if not _fault_ok(cfg, s, "group_fail") or s.store.abort or s.store.down or point not in cfg.points:
        return False
    gen = max(rk.gen for rk in s.ranks)
    if not _between_episodes(cfg, s, gen):
        return False
    f = s.store.failed
    if f is None or f[0] < gen:
        return True
    # another group fails at the same boundary, before anyone observed the first failure
    return f[0] == gen and f[1] == point and _failing_group(cfg, r) not in f[2]


def _st_group_fail(cfg, s, r, point) -> State:
    gen, f = max(rk.gen for rk in s.ranks), s.store.failed
    groups = (f[2] if f is not None and f[0] == gen else frozenset()) | {_failing_group(cfg, r)}
    s = s.with_store(failed=(gen, point, groups))
    # in forward or backward every rank abandons its step with collectives in flight on every group
    # (a peer's shard-group all-gather or reduce-scatter waits on a rank that left the pass): every
    # group is broken, as after a death (P17.1)
    broken = {(gen, cfg.group_of(q)) for q in cfg.world} if point in DISCARD_PHASES else {(gen, _failing_group(cfg, r))}
    return s.with_(faults=s.faults + 1, failures=s.failures | broken)


def link_arg(arg: str) -> tuple[int, str]:
    """``FaultLinkCut``'s argument ``"b@point"``: the link's other end and where the cut strikes."""
    b, _, point = arg.partition("@")
    return int(b), point


def _link_groups(cfg: Config, a: int, b: int) -> frozenset[int]:
    """The groups of R's kind that a link between ranks ``a`` and ``b`` crosses: theirs, if they share one."""
    return frozenset({cfg.group_of(a)}) if cfg.group_of(a) == cfg.group_of(b) else frozenset()


def _en_link_cut(cfg, s, a, arg) -> bool:
    """``FaultLinkCut(a, b@point)``: the network link between ranks ``a`` and ``b`` (two nodes) fails
    at ``point`` of the step, starting an episode (P18.2)."""
    b, point = link_arg(arg)
    if not _fault_ok(cfg, s, "link") or s.store.abort or s.store.down or point not in cfg.points:
        return False
    gen = max(rk.gen for rk in s.ranks)
    f = s.store.failed
    return _between_episodes(cfg, s, gen) and (f is None or f[0] < gen)


def _st_link_cut(cfg, s, a, arg) -> State:
    """Every group with members on both ends fails: theirs of R's kind if they share one, and every
    group over all of W (``Store.wide``).  Mid-step on a group of R's kind, every rank abandons its
    step with collectives in flight on every group: every group is broken (P17.1)."""
    b, point = link_arg(arg)
    gen = max(rk.gen for rk in s.ranks)
    groups = _link_groups(cfg, a, b)
    s = s.with_store(failed=(gen, point, groups), wide=s.store.wide | {gen})
    broken = set(cfg.groups) if (point in DISCARD_PHASES and groups) else groups
    return s.with_(faults=s.faults + 1, failures=s.failures | {(gen, gi) for gi in broken})


def _bump(s: State) -> State:
    return s.with_(faults=s.faults + 1)


def _en_crash(cfg, s, r, arg) -> bool:
    """``FaultCrash(rank)``: a rank dies inside an episode (L2).  ``FaultCrash(rank, point)`` (only
    with spares): a rank dies in training at ``point``, which is the episode's failure (hot swap)."""
    if arg is not None:
        return _en_crash_in_training(cfg, s, r, arg)
    if not (_fault_ok(cfg, s, "crash") and _victim(s, r)):
        return False
    # in a crash episode a rank still training dies at the episode's point: FaultCrash(rank, point)
    return not (s.store.dead and s.ranks[r].pc == PC_TRAIN and _crash_episode(s, s.ranks[r].gen))


def _st_crash(cfg, s, r, arg) -> State:
    if arg is not None:
        return _st_crash_in_training(cfg, s, r, arg)
    return _bump(s.with_rank(r, pc=PC_CRASHED, hung=False, raised=False))


def _en_crash_in_training(cfg, s, r, point) -> bool:
    """A training rank dies (SIGKILL, OOM, a lost node; or it stops: SIGSTOP, a held GIL) at
    ``point`` of its step: every group it belongs to fails there.  It starts an episode, as
    ``FaultGroupFail`` does, or (a concurrent crash) joins one that a crash at the same point
    started, while it has not observed it yet."""
    if not cfg.elastic or not _fault_ok(cfg, s, "crash") or s.store.abort or s.store.down or point not in cfg.points:
        return False
    rk = s.ranks[r]
    if rk.pc != PC_TRAIN or rk.hung or not _in_dp(cfg, s, r):
        return False
    gen = max(k.gen for k in s.ranks)
    if rk.gen != gen:
        return False
    f = s.store.failed
    if f is not None and f[0] == gen:
        # with a shrink, a second death joins the episode only before its barrier counts anyone (P19.1)
        return f[1] == point and _crash_episode(s, gen) and not (cfg.shrink and _count_arrivals(s, gen))
    return _between_episodes(cfg, s, gen)


def _st_crash_in_training(cfg, s, r, point) -> State:
    gen, f = s.ranks[r].gen, s.store.failed
    groups = (f[2] if f is not None and f[0] == gen else frozenset()) | {cfg.group_of(r)}
    s = s.with_store(failed=(gen, point, groups), dead=s.store.dead | {(gen, r)})
    # every group crossing the dead rank fails: the world, default and control groups cross every
    # rank, so every rank's communicators are rebuilt in this episode (``_rebuilds``)
    s = s.with_(failures=s.failures | {(gen, cfg.group_of(q)) for q in cfg.world})
    return _bump(s.with_rank(r, pc=PC_CRASHED, hung=False, raised=False))


def _en_hang(cfg, s, r, arg) -> bool:
    return _fault_ok(cfg, s, "hang") and _victim(s, r) and _active(s, r)


def _st_hang(cfg, s, r, arg) -> State:
    return _bump(s.with_rank(r, hung=True))


def _en_raise(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return _fault_ok(cfg, s, "raise") and _victim(s, r) and rk.pc in RECOVERY_PCS and _active(s, r)


def _st_raise(cfg, s, r, arg) -> State:
    return _bump(s.with_rank(r, raised=True))


def _en_mismatch(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return (
        _fault_ok(cfg, s, "mismatch")
        and _victim(s, r)
        and rk.pc in (PC_TRAIN, PC_OBSERVED, PC_GUARDED)  # train: struck at the boundary itself
        and rk.frontier == _nominal_frontier(cfg, s, r)
        and _active(s, r)
        # a divergent rank: some other live rank keeps F (if every rank committed F + 1, that is F;
        # an exited rank's F went with its process, and a rank exits only once the abort is written
        # or the store is lost, after which no F is compared)
        and any(o != r and _alive(s, o) and s.ranks[o].frontier == _nominal_frontier(cfg, s, o) for o in range(len(s.ranks)))
    )


def _st_mismatch(cfg, s, r, arg) -> State:
    # the rank committed one step more than the others: its S_app is one step ahead
    rk = s.ranks[r]
    return _bump(s.with_rank(r, frontier=rk.frontier + 1, tau=rk.tau + 1))


def _en_dirty(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return (_fault_ok(cfg, s, "dirty_guard") and _victim(s, r) and rk.pc in (PC_TRAIN, PC_OBSERVED)
            and not rk.dirty and _active(s, r))


def _st_dirty(cfg, s, r, arg) -> State:
    return _bump(s.with_rank(r, dirty=True))


def _en_corrupt(cfg, s, r, arg) -> bool:
    """One bit of a member of R's local shard flips after the commit (silent data corruption):
    its replicas no longer agree.  Only phase 6's cross-replica check can notice."""
    rk = s.ranks[r]
    return (_fault_ok(cfg, s, "corrupt") and _victim(s, r) and _member(cfg, s, r) and rk.pc in (PC_TRAIN, PC_OBSERVED)
            and not rk.corrupt and _active(s, r))


def _st_corrupt(cfg, s, r, arg) -> State:
    return _bump(s.with_rank(r, corrupt=True))


def _en_delay(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return _fault_ok(cfg, s, "delay") and _victim(s, r) and rk.pc != PC_READY and not rk.delayed and _active(s, r)


def _st_delay(cfg, s, r, arg) -> State:
    return _bump(s.with_rank(r, delayed=True))


def _en_drop(cfg, s, r, arg) -> bool:
    rk = s.ranks[r]
    return (
        _fault_ok(cfg, s, "drop")
        and _victim(s, r)
        and rk.pc in (PC_OBSERVED, PC_GUARDED, PC_AGREED, PC_REPLACED, PC_REBOUND, PC_VALIDATED)
        and not rk.drop
        and not rk.lost
        and _active(s, r)
    )


def _st_drop(cfg, s, r, arg) -> State:
    return _bump(s.with_rank(r, drop=True))


def _en_store_loss(cfg, s, r, arg) -> bool:
    """The control-plane store's server dies (the process or host serving it is lost) while a
    recovery episode is under way."""
    return (_fault_ok(cfg, s, "store_loss") and not s.store.down
            and any(_alive(s, q) and _in_episode(s, q) for q in range(len(s.ranks))))


def _st_store_loss(cfg, s, r, arg) -> State:
    return _bump(s.with_store(down=True))


# Supervisor (torchrun): restarts every worker once all of them have exited, crashed or hung.
# torchrun tears the whole job down after the first failed worker, killing hung survivors too;
# without that, a crashed member of R plus hung peers with no abort written is a deadlock
# (found by the hypothesis machine: 2x1, group_fail + crash + hang).

def _en_restart(cfg, s, r, arg) -> bool:
    if s.supervisor:
        return False
    gone = [rk.pc in (PC_EXITED, PC_CRASHED, PC_LEFT) for rk in s.ranks]
    return any(gone) and all(g or rk.hung for g, rk in zip(gone, s.ranks, strict=True))


def _st_restart(cfg, s, r, arg) -> State:
    # restart from the last checkpoint and replay to the frontier of the last episode
    f = cfg.frontier_at(s.store.failed[0] if s.store.failed is not None else 0)
    c = cfg.checkpoint_at(f)
    # every worker process is restarted (a stopped one that held an identity before a spare too): a
    # fresh process that loads its own shard from C.  It keeps only its generation (W1) and the
    # reason its predecessor exited (what the restart reports)
    ranks = tuple(Rank(pc=PC_RESTARTED, gen=rk.gen, reason=rk.reason, tau=f, frontier=f, replayed=f - c) for rk in s.ranks)
    return s.with_(ranks=ranks, supervisor="restarted", deposed=frozenset())


# --------------------------------------------------------------------------------------
# In-flight discard (issue 27, P17; issue 13, P16).

def _en_discard(cfg, s, r, arg) -> bool:
    """A rank that observed a failure inside forward or backward, where the contract's decision is L1
    (a communicator failure with every rank alive, P17; or a dead peer and a swap, P16), discards its
    uncommitted step in place (local: no store operation).  Nothing of the step is committed on it;
    whether a peer committed the step meanwhile is what phase 3 decides (P17.2)."""
    rk = s.ranks[r]
    return (rk.pc == PC_OBSERVED and _active(s, r) and rk.point in DISCARD_PHASES and (rk.grads or rk.ahead > 0)
            and _contract_decision(cfg, s, r).preserve)


def _st_discard(cfg, s, r, arg) -> State:
    """Gradients dropped, the wrapper's runtime state back to idle, RNG and data cursor back to the
    committed boundary F: the rank stands at the committed boundary again (its point is ``boundary``)
    and the step will be rerun with the same batch after the release."""
    rk = s.ranks[r]
    s = s.with_rank(r, grads=False, ahead=0, point="boundary")
    # the abandoned step left collectives in flight on every group: every one is rebuilt (P17.1)
    return s.with_(discarded=s.discarded | {(rk.gen, r)}, failures=s.failures | {(rk.gen, gi) for gi in range(len(cfg._members))})


# --------------------------------------------------------------------------------------
# Hot swap (issue 13; spec/protocol.md "Hot swap", P16).  Instantiated only with Config.spares >= 1.

def _detector_sees_dead(cfg: Config, s: State, r: int) -> bool:
    """Rank r's failure detector can act on its episode's dead ranks: the store answers, no abort
    stands, r is in the episode (any pc of it), and some rank died in training in it and is not
    handled yet (no claim, its replica not out)."""
    rk = s.ranks[r]
    if not _via_store(s, r) or s.store.abort or not (rk.pc in RECOVERY_PCS or (rk.pc == PC_TRAIN and _in_episode(s, r))):
        return False
    return _in_episode(s, r) and _crash_episode(s, rk.gen) and bool(hotswap.unclaimed(s, rk.gen, cfg))


def _en_claim(cfg, s, r, arg) -> bool:
    """A survivor's failure detector declares the ranks that died in training dead and the decision
    (spare left, replica alive: ``hotswap.claim_decision``) is a swap: it claims a spare for each."""
    rk = s.ranks[r]
    if not _detector_sees_dead(cfg, s, r):
        return False
    decision = hotswap.claim_decision(cfg, s, rk.gen)
    return decision.preserve and not decision.shrink


def _st_claim(cfg, s, r, arg) -> State:
    """``compare_set(g{g}/spare/{dead}, "", inc + 1)`` for each dead rank not claimed yet: single
    assignment per dead identity and generation; each takes one spare from the pool."""
    g = s.ranks[r].gen
    todo = hotswap.unclaimed(s, g, cfg)
    claims = s.store.claims | {(g, d, s.ranks[d].inc + 1) for d in todo}
    return s.with_store(claims=claims, spares=s.store.spares - len(todo))


def _en_join(cfg, s, r, arg) -> bool:
    """The claimed spare reads the claim and takes rank r's identity at the claimed incarnation."""
    rk = s.ranks[r]
    if rk.pc != PC_CRASHED or s.store.abort or s.store.down:
        return False
    inc = hotswap.claim_of(s, rk.gen, r)
    return inc is not None and inc > rk.inc


def _st_join(cfg, s, r, arg) -> State:
    """The spare holds the identity in the dead rank's generation, with no state yet (``joined``,
    ``SHARD_NONE``) but the F its identity published at its last commit (F of the episode: a rank
    dies in training after its last boundary); the dead process, possibly only stopped, is deposed:
    if it ever wakes it must be fenced out."""
    rk = s.ranks[r]
    inc = hotswap.claim_of(s, rk.gen, r)
    assert inc is not None
    f = cfg.frontier_at(rk.gen)
    spare = Rank(pc=PC_JOINED, gen=rk.gen, frontier=f, tau=f, comm=-1, refs=(-1,) * cfg.refs, inc=inc, shard=SHARD_NONE)
    if s.store.grown and (rk.gen, cfg.replica_of(r)) in s.store.grown:  # a grow (P19.3): the seat was vacant, nobody to depose
        return s.with_(joins=s.joins | {(rk.gen, r, inc)}).with_rank(r, **{name: getattr(spare, name) for name in _RANK_FIELDS})
    s = s.with_(deposed=s.deposed | {(rk.gen, r, rk.inc, DEPOSED_STOPPED)}, joins=s.joins | {(rk.gen, r, inc)})
    return s.with_rank(r, **{name: getattr(spare, name) for name in _RANK_FIELDS})


_RANK_FIELDS = tuple(name for name in Rank.__dataclass_fields__ if not name.startswith("_"))


def _spares_to_load(cfg: Config, s: State, p: int) -> tuple[int, ...]:
    """The spares of rank p's replicate group that wait for their state in p's generation."""
    g = s.ranks[p].gen
    return tuple(d for d in _peers(cfg, p) if d != p and _alive(s, d) and not _loaded(s, d) and s.ranks[d].gen == g)


def _en_transfer(cfg, s, r, arg) -> bool:
    """A replica (a member of the dead rank's replicate group, holding state) that rebuilt and
    rebound its groups (it stands at the committed boundary F: nothing uncommitted) broadcasts its
    state on the new replicate group to the spares of its group, once every one of them has rebuilt
    it too (a collective on the new group: no store operation)."""
    spares = _spares_to_load(cfg, s, r)
    return (s.ranks[r].pc == PC_REBOUND and _active(s, r) and _loaded(s, r) and bool(spares)
            and all(s.ranks[d].pc == PC_REBOUND and _active(s, d) for d in spares))


def _st_transfer(cfg, s, r, arg) -> State:
    return _send_state(cfg, s, r, _spares_to_load(cfg, s, r))


def _send_state(cfg: Config, s: State, p: int, spares: tuple[int, ...]) -> State:
    """Rank p's S_app into each spare: parameters and optimizer state (its shard at its optimizer
    step, its bits), RNG and data cursor (replicas consume the same positions; the identity's own
    data shard is the rank id the spare took), F; no gradients.  The spare, still rebound, stands at
    the committed boundary and can join its group's validation."""
    pk = s.ranks[p]
    g = pk.gen
    for d in spares:
        s = s.with_rank(d, point="boundary", frontier=pk.frontier, tau=pk.tau, ahead=pk.ahead,
                        grads=False, corrupt=pk.corrupt, shard=_shard_of(cfg, s, p))
        s = s.with_(transfers=s.transfers | {(g, d, cfg.group_of(p) == cfg.group_of(d) and p != d)})
    return s


#: ``RankFenced``'s argument for the instance in which a deposed process wakes (the other instance,
#: without an argument, is its first store operation)
WAKE = "wake"


def _en_fenced(cfg, s, r, arg) -> bool:
    """``RankFenced(r, wake)``: a deposed process of rank r's identity, stopped, not dead, wakes up.
    ``RankFenced(r)``: a woken one makes its first store operation."""
    want = DEPOSED_STOPPED if arg == WAKE else DEPOSED_AWAKE
    return any(d == r and stage == want for _g, d, _inc, stage in s.deposed)


def _st_fenced(cfg, s, r, arg) -> State:
    """Waking, it runs again (nothing read yet).  Its first store operation reads its identity's
    incarnation (``g{g}/spare/{rank}``): it finds a later one (or no store) and exits at once, writing
    nothing (no abort: the job goes on without it); finding none later, it would go on as the rank
    (``DEPOSED_ACTING``; never in the spec: every deposed identity was claimed at a later incarnation)."""
    if arg == WAKE:
        entry = min(e for e in s.deposed if e[1] == r and e[3] == DEPOSED_STOPPED)
        return s.with_(deposed=(s.deposed - {entry}) | {(*entry[:3], DEPOSED_AWAKE)})
    entry = min(e for e in s.deposed if e[1] == r and e[3] == DEPOSED_AWAKE)
    g, _d, inc, _stage = entry
    held = hotswap.claim_of(s, g, r)
    if s.store.down or (held is not None and held > inc) or (cfg.shrink and _fenced_by_shrink(cfg, s, r, g, inc)):
        return s.with_(deposed=s.deposed - {entry})
    return s.with_(deposed=(s.deposed - {entry}) | {(g, r, inc, DEPOSED_ACTING)})


def _fenced_by_shrink(cfg: Config, s: State, r: int, g: int, inc: int) -> bool:
    """A deposed process of rank r's identity (deposed in generation g) finds its replica left in g or
    later (``g{g}/out/{replica}``, P19.1), or the identity claimed at a later incarnation since (a grow
    brought the replica back, P19.3)."""
    i = cfg.replica_of(r)
    return (any(gg >= g and ii == i for gg, ii in s.store.shrunk)
            or any(d == r and ii > inc for _g, d, ii in s.store.claims))


# --------------------------------------------------------------------------------------
# Shrink, grow and refill (issue 41; spec/protocol.md P19).  Instantiated only with Config.shrink
# (RankShrink, RankLeave, RankStartGrow) and Config.refill (KeeperRefill).

def _leaving(cfg: Config, s: State, gen: int) -> frozenset[int]:
    """The replicas of generation ``gen``'s dead ranks that no claim handed to a spare."""
    return frozenset(cfg.replica_of(d) for d in hotswap.unclaimed(s, gen, cfg))


def _en_shrink(cfg, s, r, arg) -> bool:
    """A survivor's failure detector declares the ranks that died in training dead and the decision
    is a shrink (no spare idle, a live replica for each, a job that counts its step in micro-batches,
    every shard keeping a live replica in a replica that stays: ``hotswap.claim_decision``): it writes
    the replicas of the dead ranks out of the data-parallel dimension (``g{g}/out/{replica}``)."""
    return _in_dp(cfg, s, r) and _detector_sees_dead(cfg, s, r) and hotswap.claim_decision(cfg, s, s.ranks[r].gen).shrink


def _st_shrink(cfg, s, r, arg) -> State:
    """The replicas of the unhandled dead ranks leave at F: their identities are vacant; each dead
    process (perhaps only stopped) is deposed, fenced out by the vacancy if it ever wakes."""
    g = s.ranks[r].gen
    dead = hotswap.unclaimed(s, g, cfg)
    leaving = _leaving(cfg, s, g)
    s = s.with_store(out=s.store.out | leaving, shrunk=s.store.shrunk | {(g, i) for i in leaving})
    deposed = {(g, d, s.ranks[d].inc, DEPOSED_STOPPED) for d in dead}
    return s.with_(deposed=s.deposed | deposed)


#: what a rank forgets when its replica leaves (as an exit does, P11.5), but its incarnation: the
#: process idles as a spare, and a later grow claims the identity at the next incarnation
_LEAVE_FORGETS = {k: v for k, v in _EXIT_FORGETS.items() if k != "inc"}


def _en_leave(cfg, s, r, arg) -> bool:
    """A live rank of a replica that left (``Store.out``), in its episode (or a spare that joined it),
    leaves training and idles on the control plane as a spare (a store write)."""
    rk = s.ranks[r]
    if not (rk.pc in (PC_OBSERVED, PC_GUARDED, PC_JOINED) or (rk.pc == PC_TRAIN and _in_episode(s, r))):
        return False
    # an exception propagating ends its part in the job the same way
    return _alive(s, r) and not rk.hung and not s.store.down and not s.store.abort and _left_job(cfg, s, r)


def _st_leave(cfg, s, r, arg) -> State:
    rk = s.ranks[r]
    s = s.with_store(spares=s.store.spares + 1)
    s = s.with_(pooled=s.pooled | {("leave", rk.gen, r)})
    return s.with_rank(r, **_LEAVE_FORGETS, pc=PC_LEFT)


def _en_start_grow(cfg, s, r, arg) -> bool:
    """At a committed boundary with no episode under way, a rank finds replicas out and the pool
    holding a spare for every vacant identity: it opens a grow in its generation (P19.3)."""
    if not s.store.out or s.store.abort or s.store.down:
        return False
    rk = s.ranks[r]
    if rk.pc != PC_TRAIN or not _active(s, r) or not _in_dp(cfg, s, r):
        return False
    gen = rk.gen
    f = s.store.failed
    if (f is not None and f[0] >= gen) or not _between_episodes(cfg, s, gen):
        return False
    return s.store.spares >= sum(len(cfg.replica_ranks(i)) for i in s.store.out)


def _st_start_grow(cfg, s, r, arg) -> State:
    """Every replica out comes back at once: its vacant identities stand dead in generation g
    (``Store.dead``), so that the swap's actions hand each to a spare with the state of a live replica
    (RankClaimSpare, SpareJoin, RankTransferState); every group is rebuilt with them (a crash episode).
    The survivors observe it at the boundary (its flag)."""
    g = s.ranks[r].gen
    back = s.store.out
    vac = tuple(d for i in sorted(back) for d in cfg.replica_ranks(i))
    s = s.with_store(out=frozenset(), failed=(g, "boundary", frozenset(cfg.group_of(d) for d in vac)),
                     dead=s.store.dead | {(g, d) for d in vac}, grown=s.store.grown | {(g, i) for i in back})
    s = s.with_(failures=s.failures | {(g, cfg.group_of(q)) for q in cfg.world})
    for d in vac:
        s = s.with_rank(d, pc=PC_CRASHED, gen=g, hung=False, raised=False)
    return s


def _en_refill(cfg, s, r, arg) -> bool:
    """Rank r's keeper, its node healthy, saw its worker die (a death in training, ``Store.dead``; not a
    vacant seat a grow stood dead): it starts a fresh spare, once per dead process."""
    if s.store.down or s.store.abort:
        return False
    return any(d == r and ("refill", g, r) not in s.pooled and (g, cfg.replica_of(r)) not in s.store.grown
               for g, d in s.store.dead)


def _st_refill(cfg, s, r, arg) -> State:
    g = min(g for g, d in s.store.dead if d == r and ("refill", g, r) not in s.pooled and (g, cfg.replica_of(r)) not in s.store.grown)
    s = s.with_store(spares=s.store.spares + 1)
    return s.with_(pooled=s.pooled | {("refill", g, r)})


# --------------------------------------------------------------------------------------

ACTIONS: dict[str, ActionSpec] = {
    a.name: a
    for a in (
        ActionSpec("RankObserve", "rank", 1, _en_observe, _st_observe, doc="observe the failed collective; members of R publish revoke", pcs=frozenset((PC_TRAIN,))),
        ActionSpec("RankRevokeWide", "rank", 1, _en_revoke_wide, _st_revoke_wide,
                   doc="the failure flag or a checkpoint save failed under the rank: publish the wide revoke of its generation",
                   pcs=frozenset((PC_TRAIN, PC_OBSERVED))),
        ActionSpec("RankDiscardStep", "rank", 2, _en_discard, _st_discard,
                   doc="a failure in forward or backward: discard the uncommitted step in place (grads dropped, wrapper idle, RNG and cursor at F)",
                   pcs=frozenset((PC_OBSERVED,))),
        ActionSpec("RankGuard", "rank", 2, _en_guard, _st_guard, doc="guards pass and the contract says L1", pcs=frozenset((PC_OBSERVED,))),
        ActionSpec("RankReject", "rank", 2, _en_reject, _st_reject, doc="the contract says L2: abort and exit", pcs=frozenset((PC_OBSERVED,))),
        ActionSpec("RankArrive", "rank", 3, _en_arrive, _st_arrive, doc="post (F, g) at the control barrier", pcs=frozenset((PC_GUARDED, PC_JOINED))),
        ActionSpec("RankDecideAgreement", "rank", 3, _en_decide_agreement, _st_decide_agreement, doc="last arriver compare_sets commit/abort", pcs=frozenset((PC_ARRIVED,))),
        ActionSpec("RankAwaitAgreement", "rank", 3, _en_await_agreement, _st_await_agreement, doc="read the agreed commit", pcs=frozenset((PC_ARRIVED,))),
        ActionSpec("RankReplace", "rank", 4, _en_replace, _st_replace,
                   doc="build what failed for generation g+1: R's (members), the groups over all of W where learned, or every group", pcs=frozenset((PC_AGREED,))),
        ActionSpec("RankRebind", "rank", 5, _en_rebind, _st_rebind, doc="every cached reference names the new communicator", pcs=frozenset((PC_REPLACED,))),
        ActionSpec("RankValidate", "rank", 6, _en_validate, _st_validate, doc="validation collective and digests on the new group", pcs=frozenset((PC_REBOUND,))),
        ActionSpec("RankReady", "rank", 6, _en_ready, _st_ready, doc="post the release vote", pcs=frozenset((PC_VALIDATED, PC_REPLACED))),
        ActionSpec("RankDecideRelease", "rank", 6, _en_decide_release, _st_decide_release, doc="last voter compare_sets release", pcs=frozenset((PC_READY,))),
        ActionSpec("RankResume", "rank", 6, _en_resume, _st_resume, doc="read release; resume at F in generation g+1", pcs=frozenset((PC_READY,))),
        ActionSpec("RankTimeout", "rank", None, _en_timeout, _st_timeout, doc="a wait's deadline expired: abort and exit", pcs=frozenset((PC_TRAIN, PC_JOINED, PC_AGREED, PC_ARRIVED, PC_REBOUND, PC_READY))),
        ActionSpec("RankExpire", "rank", None, _en_expire, _st_expire, doc="watchdog: the step deadline of a hung rank expired: abort and exit", pcs=frozenset((PC_TRAIN, *RECOVERY_PCS))),
        ActionSpec("RankSuspect", "rank", None, _en_suspect, _st_suspect,
                   doc="the failure detector declares a peer dead or hung (or suspects a slow one): abort and exit", pcs=frozenset((PC_TRAIN, *RECOVERY_PCS))),
        ActionSpec("RankFail", "rank", None, _en_fail, _st_fail, doc="an exception in phases 2-6: abort and exit", pcs=frozenset(RECOVERY_PCS)),
        ActionSpec("RankExit", "rank", None, _en_exit, _st_exit, doc="watchdog: exit on the store's abort key", pcs=frozenset(_ALIVE_PCS)),
        ActionSpec("RankLoseStore", "rank", None, _en_lose_store, _st_lose_store,
                   doc="the store is gone: the next store operation or the watchdog's poll fails; exit", pcs=frozenset(_ALIVE_PCS)),
        # hot swap (issue 13): instantiated only with spares (HOTSWAP_ACTIONS)
        ActionSpec("RankClaimSpare", "rank", None, _en_claim, _st_claim,
                   doc="the detector declares ranks dead in training: claim a spare for each (single assignment)",
                   pcs=frozenset((PC_TRAIN, *RECOVERY_PCS))),
        ActionSpec("SpareJoin", "spare", None, _en_join, _st_join, doc="a claimed spare takes the dead rank's identity",
                   pcs=frozenset((PC_CRASHED,))),
        ActionSpec("RankTransferState", "rank", 5, _en_transfer, _st_transfer,
                   doc="a replica that rebuilt and rebound its groups broadcasts its state to the spares of its group on the new group",
                   pcs=frozenset((PC_REBOUND,))),
        ActionSpec("RankFenced", "rank", None, _en_fenced, _st_fenced,
                   doc="a deposed holder wakes (arg wake); its first store operation finds a later incarnation; it exits"),
        # shrink, grow, refill (issue 41): instantiated only with Config.shrink / Config.refill (ELASTIC_ACTIONS)
        ActionSpec("RankShrink", "rank", None, _en_shrink, _st_shrink,
                   doc="the detector declares ranks dead, no spare is idle, every shard keeps a live replica: their replicas leave",
                   pcs=frozenset((PC_TRAIN, *RECOVERY_PCS))),
        ActionSpec("RankLeave", "rank", None, _en_leave, _st_leave,
                   doc="a rank whose replica left leaves training and idles as a spare",
                   pcs=frozenset((PC_TRAIN, PC_OBSERVED, PC_GUARDED, PC_JOINED))),
        ActionSpec("RankStartGrow", "rank", None, _en_start_grow, _st_start_grow,
                   doc="at a boundary, a spare idle for each rank of a replica out: open a grow that brings it back",
                   pcs=frozenset((PC_TRAIN,))),
        ActionSpec("KeeperRefill", "keeper", None, _en_refill, _st_refill,
                   doc="a keeper whose worker died starts a fresh spare in its place"),
        ActionSpec("FaultGroupFail", "fault", None, _en_group_fail, _st_group_fail, fault_kind="group_fail", doc="R's communicator fails at a point"),
        ActionSpec("FaultCrash", "fault", None, _en_crash, _st_crash, fault_kind="crash"),
        ActionSpec("FaultHang", "fault", None, _en_hang, _st_hang, fault_kind="hang"),
        ActionSpec("FaultRaise", "fault", None, _en_raise, _st_raise, fault_kind="raise"),
        ActionSpec("FaultMismatch", "fault", None, _en_mismatch, _st_mismatch, fault_kind="mismatch"),
        ActionSpec("FaultDirtyGuard", "fault", None, _en_dirty, _st_dirty, fault_kind="dirty_guard"),
        ActionSpec("FaultDelay", "fault", None, _en_delay, _st_delay, fault_kind="delay"),
        ActionSpec("FaultDrop", "fault", None, _en_drop, _st_drop, fault_kind="drop"),
        ActionSpec("FaultCorrupt", "fault", None, _en_corrupt, _st_corrupt, fault_kind="corrupt",
                   doc="a member of R's S_app silently diverges from its replicas"),
        ActionSpec("FaultStoreLoss", "fault", None, _en_store_loss, _st_store_loss, fault_kind="store_loss",
                   doc="the control-plane store's server is lost"),
        ActionSpec("FaultLinkCut", "fault", None, _en_link_cut, _st_link_cut, fault_kind="link",
                   doc="the network link between two ranks on two nodes fails: every group across it"),
        ActionSpec("SupervisorRestart", "supervisor", None, _en_restart, _st_restart, doc="torchrun restarts all workers from C"),
    )
}


#: the hot-swap actions: instantiated (``all_actions``) only with ``Config.spares >= 1``, as are the
#: ``FaultCrash(rank, point)`` instances
HOTSWAP_ACTIONS = ("RankClaimSpare", "SpareJoin", "RankTransferState", "RankFenced")
#: shrink and grow (``Config.shrink``), refill (``Config.refill``): issue 41, P19
ELASTIC_ACTIONS = {"RankShrink": "shrink", "RankLeave": "shrink", "RankStartGrow": "shrink", "KeeperRefill": "refill"}
#: the physical-link fault: instantiated only with ``Config.links`` (issue 25, P18); ``RankRevokeWide``
#: is in every configuration (a flag fails under a gone or hung peer too), its latent meeting needs a link
LINK_ACTIONS = ("FaultLinkCut",)


def all_actions(cfg: Config) -> tuple[Action, ...]:
    """Every action instance of a configuration, in a fixed order (deterministic search)."""
    out: list[Action] = []
    for spec in ACTIONS.values():
        if spec.name in HOTSWAP_ACTIONS and not cfg.elastic:
            continue
        if spec.name in ELASTIC_ACTIONS and not getattr(cfg, ELASTIC_ACTIONS[spec.name]):
            continue
        if spec.name in LINK_ACTIONS and not cfg.links:
            continue
        if spec.name == "FaultLinkCut":  # one instance per pair of ranks on two nodes and per point
            rpn = cfg.ranks_per_node
            out.extend(Action(spec.name, a, f"{b}@{p}") for a in cfg.world for b in cfg.world
                       if a < b and a // rpn != b // rpn for p in cfg.points)
            continue
        if spec.name == "FaultCrash" and cfg.elastic:  # also: a rank dies in training at a point
            out.extend(Action(spec.name, r) for r in cfg.world)
            out.extend(Action(spec.name, r, p) for r in cfg.world for p in cfg.points)
        elif spec.name == "FaultGroupFail":
            if cfg.failing == "one":
                out.extend(Action(spec.name, None, p) for p in cfg.points)
            else:  # one instance per group, acted by its first rank (the group's representative)
                out.extend(Action(spec.name, cfg.members(gi)[0], p) for gi in cfg.groups for p in cfg.points)
        elif spec.name == "RankFenced":  # a deposed process wakes, then makes its first store operation
            out.extend(Action(spec.name, r, WAKE) for r in cfg.world)
            out.extend(Action(spec.name, r) for r in cfg.world)
        elif spec.name == "RankObserve":  # one instance per point where a failure can be observed
            seen = tuple(q for q in STEP_ORDER if any(q in cfg.observable(p) for p in cfg.points))
            out.extend(Action(spec.name, r, q) for r in cfg.world for q in seen)
        elif spec.actor == "supervisor" or spec.name == "FaultStoreLoss":
            out.append(Action(spec.name))
        else:
            out.extend(Action(spec.name, r) for r in cfg.world)
    return tuple(out)


def is_final(cfg: Config, s: State) -> bool:
    """A state where the protocol has nothing left to do (spec/properties.md, "Final states").

    Either the supervisor restarted the job (L2), or no abort was decided and every rank is
    training, except ranks that crashed or hung *after* the release of their generation was
    decided: those are faults of the next generation, found by its first collective.
    """
    if s.supervisor:
        return True
    if s.store.abort or s.store.down:
        return False
    for q, rk in enumerate(s.ranks):
        if rk.pc == PC_TRAIN and not rk.hung:
            continue
        if s.store.out and hotswap.vacant(cfg, s, q):  # its replica is out (P19): no rank of the job waits on it
            continue
        if (rk.pc == PC_CRASHED or rk.hung) and true_lookup(s.store.release, rk.gen) == DECISION_RELEASE:
            continue
        return False
    return True
