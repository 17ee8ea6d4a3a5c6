"""Batch conservation under shrink and grow (issue 41): which micro-batches of a step a replica processes.

A step of the job is a fixed set of ``total`` micro-batches, numbered ``0 .. total-1``; the number
never changes while the job runs, whatever its replica count.  The replicas in the data-parallel
dimension (``active``: their indices, any order) share them round-robin: the i-th active replica in
ascending order processes every micro-batch ``m`` with ``m % len(active) == i``.  Each micro-batch
of a step is then processed exactly once across the replicas that remain, and the data cursor is
per micro-batch, not per rank: no sample is skipped or repeated when the count changes.

The loss a replica back-propagates is the sum of its micro-batches' losses times
:func:`loss_weight`: the wrappers average gradients over the replicas (DDP over W, HSDP over the
replicate group), so the reduced gradient is the mean over the same ``total`` micro-batches whatever
the replica count (the math is the same; the floating-point reduction order is not).

Pure functions; no I/O.  The model records each resumed rank's share (``State.shares``) and S17
``BatchConserved`` judges the recorded shares against ``total`` alone.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ShareError", "loss_weight", "share"]


class ShareError(ValueError):
    """A share asked for a replica that is not active, or of a step with no micro-batches."""


def share(replica: int, active: Iterable[int], total: int) -> tuple[int, ...]:
    """The micro-batches (global indices, ascending) that replica ``replica`` processes in every step
    while the replicas ``active`` are in the data-parallel dimension; ``total``: the step's
    micro-batch count.  Empty when there are more active replicas than micro-batches."""
    order = sorted(set(active))
    if total < 1:
        raise ShareError(f"share: a step needs at least one micro-batch, got total={total}")
    if replica not in order:
        raise ShareError(f"share: replica {replica} is not in the data-parallel dimension {order}")
    i, n = order.index(replica), len(order)
    return tuple(range(i, total, n))


def loss_weight(active: Iterable[int], total: int) -> float:
    """The factor on the sum of a replica's micro-batch losses so that the gradient the wrappers
    average over ``len(active)`` replicas is the mean over all ``total`` micro-batches."""
    n = len(set(active))
    if total < 1 or n < 1:
        raise ShareError(f"loss_weight: need total >= 1 and at least one active replica, got total={total}, active={n}")
    return n / total
