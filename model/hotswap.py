"""Hot swap (issue 13): the decision to replace a dead rank in place by a spare, and the facts it reads.

A rank that dies in training (``FaultCrash(rank, point)``, ``Store.dead``) leaves its parameter and
optimizer shard bit-identical on each live peer of its replicate group, and (a crash in forward or
backward) every survivor at the last committed step F, its uncommitted step still to be discarded.
With a spare left and a live replica, the dead identity is handed to a spare (RankClaimSpare,
SpareJoin), the spare receives the state from the replica (RankTransferState), the survivors
discard the uncommitted step in place (RankDiscardStep), and the job releases at F with zero lost
steps (L1); otherwise it is L2, as before.  spec/protocol.md, section "Hot swap (issue 13)".

The facts (``died``, ``spare``, ``replica``) are fields of the contract's ``ObservationKey`` (C1.2)
and the contract's ``decide`` decides on them (C3.2); :func:`decide` here builds that key.

Pure functions of (config, state); no I/O.
"""

from __future__ import annotations

from .contract import DISCARD_PHASES, SWAP_PHASES, Decision, Envelope, ObservationKey
from .contract import decide as contract_decide
from .state import PC_CRASHED, PC_EXITED, PC_LEFT, PC_RESTARTED, SHARD_NONE, Config, State

__all__ = [
    "DISCARDABLE",
    "SWAP_POINTS",
    "claim_decision",
    "claim_of",
    "dead_in",
    "decide",
    "excused",
    "keeps_every_shard",
    "live_replicas",
    "rank_decision",
    "unclaimed",
    "vacant",
]

#: Where a survivor may stand when a rank died for the swap to be L1: at the committed boundary, or
#: inside forward/backward, whose uncommitted step it can discard in place (RankDiscardStep).  Inside
#: ``optimizer.step()`` (a wrapper whose optimizer step uses R) the update may be half applied: L2.
SWAP_POINTS = SWAP_PHASES  # the contract's (C1.2)
DISCARDABLE = DISCARD_PHASES


def decide(envelope: Envelope, key: ObservationKey, guards_ok: bool, *, died: bool = False, spare: bool = False,
           replica: bool = False, shrink: bool = False) -> Decision:
    """The contract's decision (C3) on ``key`` with the hot-swap facts (C1.2): ``died`` (a rank of
    the episode died in training), ``spare`` (a spare is left for every dead rank not yet claimed),
    ``replica`` (each of them has a live replica, a live member of its replicate group holding
    state).  The facts become fields of the observation key and :func:`accelpact.model.contract.decide`
    decides (its C3.2 order for a death: a point outside forward, backward and the boundary, no spare,
    no live replica, a failed guard, a key outside the envelope: L2; else the entry's levels).  The
    implementation calls this same function with the facts it observed."""
    full = ObservationKey(key.platform, key.profile, key.phase, key.objective, died=died, spare=died and spare,
                          replica=died and replica)
    decision = contract_decide(envelope, full, guards_ok)
    if died and shrink and replica and not spare and not decision.preserve:
        # P19.1: no spare idle, a live replica for every dead rank, and a job that counts its step in
        # micro-batches: qualified exactly where the swap is (the same key with a spare), it shrinks
        as_swap = contract_decide(envelope, ObservationKey(key.platform, key.profile, key.phase, key.objective, died=True,
                                                           spare=True, replica=True), guards_ok)
        if as_swap.preserve:
            return Decision("L1", "a rank died, no spare is idle and every shard keeps a live replica: its replica leaves "
                            "the data-parallel dimension at F and the job keeps its global batch (shrink)", shrink=True)
    return decision


# --------------------------------------------------------------------------------------
# Facts, read from the state (the failure detector's heartbeats and the control-plane store).

def _alive(s: State, r: int) -> bool:
    return s.ranks[r].pc not in (PC_EXITED, PC_CRASHED, PC_RESTARTED, PC_LEFT)


def dead_in(s: State, gen: int) -> tuple[int, ...]:
    """The ranks that died in training in generation ``gen`` (``Store.dead``), sorted."""
    return tuple(sorted(r for g, r in s.store.dead if g == gen))


def claim_of(s: State, gen: int, r: int) -> int | None:
    """The incarnation claimed for rank ``r``'s identity in generation ``gen`` (``g{gen}/spare/{r}``), or None."""
    for g, d, inc in s.store.claims:
        if g == gen and d == r:
            return inc
    return None


def unclaimed(s: State, gen: int, cfg: Config | None = None) -> tuple[int, ...]:
    """Dead ranks of generation ``gen`` whose identity no claim has handed to a spare yet and (given
    ``cfg``) whose replica has not left the data-parallel dimension (a shrink, P19: :func:`vacant`)."""
    return tuple(d for d in dead_in(s, gen)
                 if claim_of(s, gen, d) is None and not (cfg is not None and vacant(cfg, s, d)))


def vacant(cfg: Config, s: State, d: int) -> bool:
    """Rank ``d``'s identity is vacant: its replica is out of the data-parallel dimension (a shrink,
    spec/protocol.md P19, ``Store.out``)."""
    return bool(s.store.out) and cfg.replica_of(d) in s.store.out


def live_replicas(cfg: Config, s: State, d: int) -> tuple[int, ...]:
    """The replicas of rank ``d``: live members of its replicate group (R's kind) other than ``d``
    that hold state (a spare whose state has not been transferred yet, ``SHARD_NONE``, holds none)."""
    return tuple(m for m in cfg.members(cfg.group_of(d))
                 if m != d and _alive(s, m) and s.ranks[m].shard != SHARD_NONE)


def _facts(cfg: Config, s: State, gen: int) -> tuple[bool, bool, bool]:
    """(spare, replica, shrink) for the dead ranks of ``gen`` not claimed yet (a claim already decided
    them): a spare idle for each, a live replica for each, and whether the job may shrink instead (it
    counts its step in micro-batches and every shard keeps a replica once theirs are out, P19.1)."""
    todo = unclaimed(s, gen, cfg)
    shrink = cfg.shrink and keeps_every_shard(cfg, s, frozenset(cfg.replica_of(d) for d in todo))
    return s.store.spares >= len(todo), all(live_replicas(cfg, s, d) for d in todo), shrink


def keeps_every_shard(cfg: Config, s: State, leaving: frozenset[int]) -> bool:
    """Every shard (a group of R's kind) keeps a live member holding state in a replica that stays in
    the data-parallel dimension once the replicas ``leaving`` are out too (P19.1)."""
    gone = s.store.out | leaving
    return all(any(_alive(s, m) and s.ranks[m].shard != SHARD_NONE and cfg.replica_of(m) not in gone
                   for m in cfg.members(gi))
               for gi in range(len(cfg._members)))


def claim_decision(cfg: Config, s: State, gen: int) -> Decision:
    """What the failure detector of a survivor decides for the dead ranks of ``gen``: claim spares
    (L1) or not (L2), at the point where the survivors observe the failure (``Config.observable``)."""
    f = s.store.failed
    assert f is not None and f[0] == gen, "claim_decision: no episode in this generation"
    spare, replica, shrink = _facts(cfg, s, gen)
    key = cfg.key(cfg.observable(f[1])[0])
    return decide(cfg.envelope, key, True, died=True, spare=spare, replica=replica, shrink=shrink)


def rank_decision(cfg: Config, s: State, r: int) -> Decision:
    """Rank ``r``'s decision in a crash episode (its point, its guard, and the swap facts)."""
    rk = s.ranks[r]
    spare, replica, shrink = _facts(cfg, s, rk.gen)
    return decide(cfg.envelope, cfg.key(rk.point), not rk.dirty, died=True, spare=spare, replica=replica, shrink=shrink)


def excused(cfg: Config, s: State, q: int) -> bool:
    """Rank ``q`` is dead, but its identity is being handed to a spare (claimed, or a claim is what
    the detectors decide): no deadline expires for it and no detector aborts for it (the deadline
    assumption covers the swap: claim, join and transfer finish within every deadline)."""
    rk = s.ranks[q]
    if rk.pc != PC_CRASHED or (rk.gen, q) not in s.store.dead:
        return False
    inc = claim_of(s, rk.gen, q)
    if inc is not None:
        return inc > rk.inc  # the dead process, not a spare that took the identity and died in turn
    if vacant(cfg, s, q):  # its replica left the data-parallel dimension (a shrink, P19): nobody waits on it
        return True
    return not s.store.abort and claim_decision(cfg, s, rk.gen).preserve
