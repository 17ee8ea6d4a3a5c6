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


def flag_rank(ctx, patterns: list, method: str) -> list:
    import torch.distributed as dist

    from accelpact.impl.flag import or_allreduce

    out = []
    for bits in patterns:
        f = torch.tensor(bits[ctx.rank], dtype=torch.int64)
        or_allreduce(dist.group.WORLD, f, method=method)
        out.append(f.tolist())
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("method", ["doubling", "ring"])
def test_every_rank_ends_with_the_or_of_all(ranks, world, method):
    rng = random.Random(world)
    patterns = [[[int(rng.random() < 0.15) for _ in range(3)] for _ in range(world)] for _ in range(12)]
    patterns.append([[0, 0, 0]] * world)                              # nobody failed
    patterns.append([[0, 0, 0]] * (world - 1) + [[0, 1, 0]])          # only the last rank (folded when W > P)
    want = [[max(p[r][i] for r in range(world)) for i in range(3)] for p in patterns]
    run = ranks.run(flag_rank, world, init_group=True, patterns=patterns, method=method)
    assert run.ok, run.explain()
    for r, got in enumerate(run.values()):
        assert got == want, f"rank {r} ({method}, W={world}) disagrees with the OR of the inputs"


def test_an_unknown_method_is_refused():
    from accelpact.impl.flag import or_allreduce

    class One:
        def size(self):
            return 4

        def rank(self):
            return 0

    with pytest.raises(ValueError, match="auto, ring or doubling"):
        or_allreduce(One(), torch.zeros(1, dtype=torch.int64), method="tree")
