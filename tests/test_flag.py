"""The boundary's failure flag (impl/flag.py): every rank ends with the OR of every rank's flag, by
gloo's all-reduce and by recursive doubling, on worlds that are and are not powers of two.

The expected value is computed here from the inputs (Python's ``max``), never by the code under test.
"""

from __future__ import annotations

import random

import pytest

from accelpact.impl.flag import RING_MAX_WORLD, rounds

torch = pytest.importorskip("torch")


def test_rounds_is_logarithmic():
    assert [rounds(w) for w in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [0, 1, 3, 2, 4, 3, 5, 10, 12]
    with pytest.raises(ValueError, match="world must be >= 1"):
        rounds(0)
    assert RING_MAX_WORLD >= 2


WORLDS = (2, 3, 4, 5, 6)


def flag_rank(ctx, patterns: dict, method: str) -> dict:
    """One launch of max(WORLDS) ranks: for each world W, the group of ranks 0..W-1 runs every pattern
    of W (ranks outside it only take part in building the group, as ``new_group`` requires)."""
    import torch.distributed as dist

    from accelpact.impl.flag import or_allreduce

    out: dict[int, list] = {}
    for world, pats in sorted(patterns.items()):
        group = dist.new_group(list(range(world)))
        if ctx.rank >= world:
            continue
        out[world] = []
        for bits in pats:
            f = torch.tensor(bits[ctx.rank], dtype=torch.int64)
            or_allreduce(group, f, method=method)
            out[world].append(f.tolist())
    return out


def _patterns(world: int) -> list:
    rng = random.Random(world)
    patterns = [[[int(rng.random() < 0.15) for _ in range(3)] for _ in range(world)] for _ in range(12)]
    patterns.append([[0, 0, 0]] * world)                              # nobody failed
    patterns.append([[0, 0, 0]] * (world - 1) + [[0, 1, 0]])          # only the last rank (folded when W > P)
    return patterns


@pytest.mark.multiproc
@pytest.mark.parametrize("method", ["doubling", "ring"])
def test_every_rank_ends_with_the_or_of_all(ranks, method):
    """Worlds 2-6 (powers of two and not), each its own group of one launch."""
    patterns = {w: _patterns(w) for w in WORLDS}
    run = ranks.run(flag_rank, max(WORLDS), init_group=True, patterns=patterns, method=method)
    assert run.ok, run.explain()
    for r, got in enumerate(run.values()):
        for world in WORLDS:
            want = [[max(p[q][i] for q in range(world)) for i in range(3)] for p in patterns[world]]
            if r < world:
                assert got[world] == want, f"rank {r} ({method}, W={world}) disagrees with the OR of the inputs"
            else:
                assert world not in got


def test_an_unknown_method_is_refused():
    from accelpact.impl.flag import or_allreduce

    class One:
        def size(self):
            return 4

        def rank(self):
            return 0

    with pytest.raises(ValueError, match="auto, ring or doubling"):
        or_allreduce(One(), torch.zeros(1, dtype=torch.int64), method="tree")


@pytest.mark.parametrize("method", ["ring", "doubling"])
def test_a_bounded_wait_survives_a_slow_rank_by_both_methods(method):
    """The engine bounds the flag's wait (``Pact._failure_flag``: ``wait_bounded`` in slices of
    ``REVOKE_CHECK_S``, spec/protocol.md P18.4).  A rank 0.2 s late to the flag must not break it: on
    gloo a timed-out wait on a send or receive closes every connection of the group ("Application
    timeout caused pair closure", spec/torch-facts.md), so the doubling's point-to-point waits are
    never sliced; the ring's all-reduce may be.  Slicing them (the defect) fails this test on the
    doubling: the group closes under the waiting ranks."""
    import time

    from accelpact.impl.flag import or_allreduce
    from accelpact.impl.runtime.backends import wait_bounded
    from accelpact.testing import gloo_threads

    world, late = 4, 2

    def body(rank: int, pg) -> list[int]:
        flag = torch.zeros(2, dtype=torch.int64)
        flag[rank % 2] = int(rank == late)
        if rank == late:
            time.sleep(0.2)  # ten slices
        or_allreduce(pg, flag, method=method,
                     wait=lambda work: wait_bounded(work, 20.0, check=lambda: None, check_every_s=0.02, sliced=True))
        return flag.tolist()

    expected = [max(int(r == late) for r in range(world) if r % 2 == i) for i in range(2)]
    assert gloo_threads(world, body) == {r: expected for r in range(world)}
