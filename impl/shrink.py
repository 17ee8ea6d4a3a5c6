"""Shrink and grow (issue 41): no restart while a replica lives.

A job that opted in (``attach(..., micro_batches=M)``) counts its step in ``M`` micro-batches, shared
among the replicas in the data-parallel dimension (``accelpact.model.batches.share``).  Then:

* **shrink**: a rank dies (or is deposed), no spare is idle, and every shard of the dead ranks still
  has a live replica: the dead ranks' whole replicas leave the data-parallel dimension at the
  committed frontier F (the swap's episode without a spare: ``Effects._claim_spares`` decides it, the
  model's :func:`accelpact.model.hotswap.decide` with ``shrink=True``); every group is rebuilt over the
  ranks that remain; the global batch stays ``M`` micro-batches, each processed once.
* **grow**: at a committed boundary of a shrunk job, when the spare pool covers every vacant identity,
  the vacant identities are claimed by spares (the swap's claim, transfer and validation: a grow is a
  swap whose dead ranks are the vacant identities, opened at the boundary, ``RankStartGrow``).

A replica is one shard group for HSDP/FSDP1 hybrid (R = the replicate group: a replica is the ranks
holding one full copy) and one rank for DDP (R = the world group).  Identities never change: the job's
ranks keep their numbers; a shrunk job's groups are built over its *active* ranks only
(:attr:`accelpact.impl.runtime.groups.JobGroups.active`).

What is here: the replica arithmetic, the control plane over the active ranks, the store keys of the
two decisions (single assignment: every rank reads the one that stands) and the requested shrink of a
fault-free run (``ACCELPACT_SHRINK_AT=step:replica``), which a test compares a real death with.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping, Sequence

from .controlplane import PREFIX, ControlPlane

__all__ = ["ActiveControlPlane", "SHRINK_AT_ENV", "ShrinkError", "active_replicas", "bench", "bench_gone", "bench_key",
           "benched_idle",
           "claim_bench", "grow_decision", "parse_shrink_at", "publish_active", "read_active", "replica_of", "replica_ranks",
           "replicas_of", "shrink_decision", "wait_recall"]

#: a fault-free run's requested shrink: ``step:replica`` (at the committed boundary where F == step,
#: replica ``replica`` leaves the data-parallel dimension), for tests and references
SHRINK_AT_ENV = "ACCELPACT_SHRINK_AT"


class ShrinkError(ValueError):
    """A malformed shrink request, or micro-batch settings that cannot hold the job's replicas."""


def replica_of(topo: Any, kind: str, rank: int) -> int:
    """The replica holding ``rank``: the rank itself when R is the world group (DDP: every rank holds a
    full copy), else its shard group's index (HSDP: ``topo.node_of``)."""
    return rank if kind == "world" else topo.node_of(rank)


def replica_ranks(topo: Any, kind: str, replica: int) -> tuple[int, ...]:
    """The ranks of replica ``replica`` (see :func:`replica_of`)."""
    return (replica,) if kind == "world" else tuple(topo.shard_ranks(replica))


def replicas_of(topo: Any, kind: str) -> int:
    """How many replicas the job started with."""
    return topo.world if kind == "world" else topo.nodes


def active_replicas(topo: Any, kind: str, active_ranks: Iterable[int] | None) -> tuple[int, ...]:
    """The replicas in the data-parallel dimension: those whose every rank is active (None: all)."""
    n = replicas_of(topo, kind)
    if active_ranks is None:
        return tuple(range(n))
    ranks = set(active_ranks)
    return tuple(r for r in range(n) if set(replica_ranks(topo, kind, r)) <= ranks)


def parse_shrink_at(value: Any, where: str = SHRINK_AT_ENV) -> tuple[int, int] | None:
    """``"step:replica"`` or ``(step, replica)`` -> (step, replica); None/"" -> None."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, str):
            a, b = value.split(":")
            step, replica = int(a), int(b)
        else:
            step, replica = (int(x) for x in value)
    except (TypeError, ValueError):
        raise ShrinkError(f"{where}={value!r}: must be STEP:REPLICA (e.g. 4:1), two integers >= 0") from None
    if step < 0 or replica < 0:
        raise ShrinkError(f"{where}={value!r}: STEP and REPLICA must be >= 0")
    return step, replica


def shrink_at_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    env = os.environ if env is None else env
    return parse_shrink_at(env.get(SHRINK_AT_ENV, ""))


class ActiveControlPlane(ControlPlane):
    """The control plane of an engine whose episode counts only the active ranks ``members`` (a shrunk
    job, or an episode that shrinks or grows it: :meth:`Effects._claim_spares` sets ``members`` to the
    ranks of the next generation).  Every count and every frontier read is over ``members``; the
    agreement's reference is the lowest member's F (rank 0's when all are active, as before)."""

    def __init__(self, store: Any, rank: int, world_size: int, prefix: str = PREFIX, *, members: Sequence[int] | None = None,
                 claims_exit: bool = False) -> None:
        super().__init__(store, rank, world_size, prefix, claims_exit=claims_exit)
        if members is not None:
            self.members = tuple(sorted(members))


def _single(store: Any, key: str, value: str) -> str:
    """Single assignment: ``value`` if this call wrote ``key`` first, else the value that stands."""
    got = store.compare_set(key, "", value)
    return got.decode() if isinstance(got, (bytes, bytearray)) else str(got)


def shrink_decision(store: Any, g: int, leaving: Sequence[int], timeout_s: float = 20.0) -> tuple[tuple[int, ...], bool]:
    """The ranks that leave in generation ``g``'s shrink, as the first survivor to decide wrote them
    (``{PREFIX}g{g}/shrink``; single assignment): every survivor rebuilds without the same ranks,
    whatever order its death notices came in.  Returns them and whether this call wrote them (the
    model's ``RankShrink``: one write of the replicas out)."""
    import datetime

    key = f"{PREFIX}g{g}/shrink"
    if int(store.add(f"{key}/deciders", 1)) == 1:  # the first to decide writes; no wait on peers
        store.set(key, json.dumps(sorted(set(leaving))))
        return tuple(sorted(set(leaving))), True
    store.wait([key], datetime.timedelta(seconds=timeout_s))  # the first decider's set follows its add at once
    return tuple(json.loads(store.get(key).decode())), False


def grow_decision(store: Any, g: int, frontier: int, mine: bool) -> bool:
    """Whether the job grows at the committed boundary of ``frontier`` in generation ``g``: what the
    first rank to get there saw (``mine``: the spare pool covers every vacant identity), so that every
    rank opens the grow at the same boundary or none does (``{PREFIX}g{g}/grow/{frontier}``)."""
    return _single(store, f"{PREFIX}g{g}/grow/{frontier}", "1" if mine else "0") == "1"


def publish_active(store: Any, g: int, active: Sequence[int]) -> None:
    """The ranks in training in g+1, as generation ``g``'s decision left them (``{PREFIX}g{g}/active``;
    every survivor writes the same value): what a spare told to join the episode builds over."""
    store.set(f"{PREFIX}g{g}/active", json.dumps(sorted(active)))


def read_active(store: Any, g: int) -> tuple[int, ...] | None:
    """What :func:`publish_active` wrote for generation ``g``; None: every rank is in training in g+1."""
    key = f"{PREFIX}g{g}/active"
    if not store.check([key]):
        return None
    return tuple(json.loads(store.get(key).decode()))


# ------------------------------------------------------------------------------------- the bench
def bench_key(rank: int) -> str:
    """A benched rank's state (``idle``, or ``recalled:{g}:{point}`` once a grow claimed it)."""
    return f"{PREFIX}bench/{rank}"


def bench(store: Any, rank: int) -> None:
    """``rank`` left training in a shrink while alive (a survivor of the leaving replica, RankLeave)
    and idles as a spare of its own identity: a grow may claim it (:func:`claim_bench`)."""
    store.set(bench_key(rank), "idle")


def bench_gone(store: Any, rank: int) -> None:
    """A death notice names ``rank`` while it idles on the bench (its keeper saw it die): no grow may
    claim it (``idle`` -> ``gone``; a recall already written stands, and that grow then fails at its
    agreement: a death inside an episode is L2, as for a swap)."""
    store.compare_set(bench_key(rank), "idle", "gone")


def benched_idle(store: Any, rank: int) -> bool:
    """Whether ``rank``'s identity is held by a live benched process that a grow may claim."""
    key = bench_key(rank)
    return bool(store.check([key])) and store.get(key).decode() == "idle"


def claim_bench(store: Any, g: int, rank: int, point: str, on_claim: Any = None) -> bool:
    """``RankClaimSpare`` of a grow for a vacant identity whose holder idles on the bench: the first
    survivor to claim ``rank`` in generation ``g`` (the swap's counter, ``claimers_key``, so a claim
    from the pool for it cannot also begin) writes ``-1`` into ``g{g}/spare/{rank}`` (single
    assignment: the identity's own benched process, no spare of the pool) and recalls it.  ``on_claim``:
    what the claimer does first (the identity's state at F published).  Returns whether this call was
    the claim."""
    from .controlplane import claim_key, claimers_key

    if int(store.add(claimers_key(g, rank), 1)) != 1:
        return False
    if on_claim is not None:
        on_claim()
    if _single(store, claim_key(g, rank), "-1") != "-1":
        return False
    store.set(bench_key(rank), f"recalled:{g}:{point}")
    return True


def wait_recall(store: Any, rank: int, abort_key: str, timeout_s: float, slice_s: float = 0.05) -> tuple[int, str] | str:
    """A benched rank idles until a grow recalls it (``(g, point)``) or the job ends (the abort key's
    value: ``closed``, or an abort reason; ``deadline`` after ``timeout_s``).  Polled with ``check``
    (a store wait that times out logs a c10d warning each time), every ``slice_s``."""
    import time

    key = bench_key(rank)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store.check([key]):
            v = store.get(key).decode()
            if v.startswith("recalled:"):
                _, g, point = v.split(":", 2)
                return int(g), point
        if store.check([abort_key]):
            return store.get(abort_key).decode()
        time.sleep(slice_s)
    return "deadline"
