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
from .state import PC_CRASHED, PC_EXITED, PC_RESTARTED, SHARD_NONE, Config, State

__all__ = [
    "DISCARDABLE",
    "SWAP_POINTS",
    "claim_decision",
    "claim_of",
    "dead_in",
    "decide",
    "excused",
    "live_replicas",
    "rank_decision",
    "unclaimed",
]

#: Where a survivor may stand when a rank died for the swap to be L1: at the committed boundary, or
#: inside forward/backward, whose uncommitted step it can discard in place (RankDiscardStep).  Inside
#: ``optimizer.step()`` (a wrapper whose optimizer step uses R) the update may be half applied: L2.
SWAP_POINTS = SWAP_PHASES  # the contract's (C1.2)
DISCARDABLE = DISCARD_PHASES


def decide(envelope: Envelope, key: ObservationKey, guards_ok: bool, *, died: bool = False, spare: bool = False,
           replica: bool = False) -> Decision:
    """The contract's decision (C3) on ``key`` with the hot-swap facts (C1.2): ``died`` (a rank of
    the episode died in training), ``spare`` (a spare is left for every dead rank not yet claimed),
    ``replica`` (each of them has a live replica, a live member of its replicate group holding
    state).  The facts become fields of the observation key and :func:`accelpact.model.contract.decide`
    decides (its C3.2 order for a death: a point outside forward, backward and the boundary, no spare,
    no live replica, a failed guard, a key outside the envelope: L2; else the entry's levels).  The
    implementation calls this same function with the facts it observed."""
    full = ObservationKey(key.platform, key.profile, key.phase, key.objective, died=died, spare=died and spare,
                          replica=died and replica)
    return contract_decide(envelope, full, guards_ok)


# --------------------------------------------------------------------------------------
# Facts, read from the state (the failure detector's heartbeats and the control-plane store).

def _alive(s: State, r: int) -> bool:
    return s.ranks[r].pc not in (PC_EXITED, PC_CRASHED, PC_RESTARTED)


def dead_in(s: State, gen: int) -> tuple[int, ...]:
    """The ranks that died in training in generation ``gen`` (``Store.dead``), sorted."""
    return tuple(sorted(r for g, r in s.store.dead if g == gen))


def claim_of(s: State, gen: int, r: int) -> int | None:
    """The incarnation claimed for rank ``r``'s identity in generation ``gen`` (``g{gen}/spare/{r}``), or None."""
    for g, d, inc in s.store.claims:
        if g == gen and d == r:
            return inc
    return None


def unclaimed(s: State, gen: int) -> tuple[int, ...]:
    """Dead ranks of generation ``gen`` whose identity no claim has handed to a spare yet."""
    return tuple(d for d in dead_in(s, gen) if claim_of(s, gen, d) is None)


def live_replicas(cfg: Config, s: State, d: int) -> tuple[int, ...]:
    """The replicas of rank ``d``: live members of its replicate group (R's kind) other than ``d``
    that hold state (a spare whose state has not been transferred yet, ``SHARD_NONE``, holds none)."""
    return tuple(m for m in cfg.members(cfg.group_of(d))
                 if m != d and _alive(s, m) and s.ranks[m].shard != SHARD_NONE)


def _facts(cfg: Config, s: State, gen: int) -> tuple[bool, bool]:
    """(spare, replica) for the dead ranks of ``gen`` not claimed yet (a claim already decided both)."""
    todo = unclaimed(s, gen)
    return s.store.spares >= len(todo), all(live_replicas(cfg, s, d) for d in todo)


def claim_decision(cfg: Config, s: State, gen: int) -> Decision:
    """What the failure detector of a survivor decides for the dead ranks of ``gen``: claim spares
    (L1) or not (L2), at the point where the survivors observe the failure (``Config.observable``)."""
    f = s.store.failed
    assert f is not None and f[0] == gen, "claim_decision: no episode in this generation"
    spare, replica = _facts(cfg, s, gen)
    key = cfg.key(cfg.observable(f[1])[0])
    return decide(cfg.envelope, key, True, died=True, spare=spare, replica=replica)


def rank_decision(cfg: Config, s: State, r: int) -> Decision:
    """Rank ``r``'s decision in a crash episode (its point, its guard, and the swap facts)."""
    rk = s.ranks[r]
    spare, replica = _facts(cfg, s, rk.gen)
    return decide(cfg.envelope, cfg.key(rk.point), not rk.dirty, died=True, spare=spare, replica=replica)


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
    return not s.store.abort and claim_decision(cfg, s, rk.gen).preserve
