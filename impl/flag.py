"""The boundary's failure flag: an OR over W in ceil(log2 W) rounds (recursive doubling).

Every fault-free step ends with the flag (``Pact._failure_flag``, the model's boundary): each rank
contributes one 0/1 per group of R's kind and every rank must learn the OR of all of them, so that
all of W enters recovery at the same boundary.  Gloo's all-reduce is a ring: 2(W-1) sequential hops
for a tiny tensor, a per-step cost that grows linearly with the world (``accelpact bench
controlplane``).  :func:`or_allreduce` computes the same value with pairwise exchanges on the same
out-of-band control group: in round k each rank swaps its partial OR with the rank whose group rank
differs in bit k, so after ceil(log2 P) rounds (P the largest power of two <= W) every rank holds
the OR of all; the W - P ranks above P first fold into a partner below P and get the result back
(two more exchanges for them).  Per rank: at most ceil(log2 W) + 1 sends and receives of a few
bytes, O(log W) latency.

Semantics, failures included, are the all-reduce's: every rank that returns holds the same flag;
a peer that is gone makes its partners' receive fail at the control group's timeout (a
``RuntimeError``, as the all-reduce's), and a rank waiting on such a partner then fails in turn, so
no rank returns a flag that misses a contribution.

Ordering requirement: every rank of the group calls it at the same point of the same step (it is a
collective of the group, like the all-reduce it replaces); messages on one pair are FIFO, so the
fixed per-round tags need no step number.
"""

from __future__ import annotations

import os
from typing import Any, Callable

__all__ = ["FLAG_METHOD_ENV", "RING_MAX_WORLD", "or_allreduce", "rounds"]

_TAG = 7100  # + round; fold-in uses _TAG - 1, fold-out _TAG - 2


def rounds(world: int) -> int:
    """Sequential exchanges on the critical path: ceil(log2 P) (+2 when W is not a power of two)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    p = 1 << (world.bit_length() - 1)
    return (p.bit_length() - 1) + (2 if world != p else 0)


def _wait(work: Any) -> None:
    work.wait()


def _exchange(group: Any, mine: Any, into: Any, peer: int, tag: int) -> None:
    """Send ``mine`` to ``peer`` and receive its value into ``into`` (both posted before waiting)."""
    out = mine.clone()  # a send's buffer must stay untouched until the send completes
    works = [group.send([out], peer, tag), group.recv([into], peer, tag)]
    for w in works:
        _wait(w)


#: ``$ACCELPACT_FLAG_METHOD`` (``auto``, ``ring``, ``doubling``): the method ``auto`` stands for in
#: this process, read once at import; ``accelpact bench scale`` measures the doubling a large world
#: runs on small worlds with it.  Unset: ``auto``.
FLAG_METHOD_ENV = "ACCELPACT_FLAG_METHOD"
_AUTO = os.environ.get(FLAG_METHOD_ENV, "auto") or "auto"
if _AUTO not in ("auto", "ring", "doubling"):
    raise ValueError(f"${FLAG_METHOD_ENV} must be auto, ring or doubling, got {_AUTO!r}")

#: Up to this many ranks the flag is gloo's own all-reduce: one exchange of two Python-level p2p works
#: costs about two ring hops, so the ring's 2(W-1) hops win at W <= 16; above, the doubling's
#: ceil(log2 W) rounds win by a factor that grows with W (W = 1024: 10 rounds, 2046 hops).  The
#: crossover was measured by ``accelpact bench controlplane`` (bench/README.md, "Why the code is as it is").
RING_MAX_WORLD = 16


def or_allreduce(group: Any, flag: Any, method: str = "auto", wait: Callable[[Any], None] = _wait) -> None:
    """In place: ``flag`` (an integer tensor of 0/1, the same shape on every rank) becomes the
    elementwise OR of every rank's ``flag`` in ``group``.  Collective over ``group`` (every rank
    must pass the same ``method``); raises the backend's ``RuntimeError`` when a peer is gone (see
    the module doc).  ``method``: ``ring`` (gloo's all-reduce with MAX), ``doubling`` (this
    module's exchanges), ``auto`` (ring up to :data:`RING_MAX_WORLD` ranks, doubling above).
    ``wait(work)`` waits for the ring's all-reduce (default ``work.wait()``); a caller bounds it (the
    commit fence and the flag give up on an op still pending after a revoke) and may raise from it.
    The doubling's sends and receives are always waited with ``work.wait()``: a gloo send or receive
    whose timed wait runs out closes every connection of the group ("Application timeout caused pair
    closure", spec/torch-facts.md), so they cannot be waited in slices as the all-reduce can."""
    import torch
    import torch.distributed as dist

    if method not in ("auto", "ring", "doubling"):
        raise ValueError(f"method must be auto, ring or doubling, got {method!r}")
    if method == "auto":
        method = _AUTO
    n, me = group.size(), group.rank()
    if n == 1:
        return
    if method == "ring" or (method == "auto" and n <= RING_MAX_WORLD):
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        wait(group.allreduce([flag], opts))
        return
    p = 1 << (n.bit_length() - 1)
    buf = torch.empty_like(flag)
    if me >= p:  # fold into the partner below P, then take the result back from it
        out = flag.clone()
        _wait(group.send([out], me - p, _TAG - 1))
        _wait(group.recv([flag], me - p, _TAG - 2))
        return
    if me < n - p:
        _wait(group.recv([buf], me + p, _TAG - 1))
        torch.maximum(flag, buf, out=flag)
    mask, k = 1, 0
    while mask < p:
        _exchange(group, flag, buf, me ^ mask, _TAG + k)
        torch.maximum(flag, buf, out=flag)
        mask, k = mask << 1, k + 1
    if me < n - p:
        _wait(group.send([flag.clone()], me + p, _TAG - 2))
