"""The job's attempt is the same on every rank of a round, whatever each agent's restart count says
(impl/launch/attempts.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from accelpact.impl.launch import attempts


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _env(rank: int, restarts: int | None) -> dict[str, str]:
    return {"RANK": str(rank), **({"TORCHELASTIC_RESTART_COUNT": str(restarts)} if restarts is not None else {})}


def test_agents_with_different_restart_counts_agree(store):
    """torchrun: node A's agent spent a restart (its worker failed), node B's restarted its healthy
    workers for A's re-rendezvous without spending one; both rounds' workers name one attempt."""
    assert [attempts.start(store, _env(r, 0)) for r in range(4)] == [0, 0, 0, 0]
    assert [attempts.start(store, _env(r, c)) for r, c in ((0, 1), (1, 1), (2, 0), (3, 0))] == [1, 1, 1, 1]
    assert [attempts.start(store, _env(r, c)) for r, c in ((0, 1), (1, 1), (2, 1), (3, 1))] == [2, 2, 2, 2]


def test_a_fresh_store_per_attempt_keeps_the_restart_count(store):
    """launch.run_restarting serves each attempt a new store: the count starts at 1 again and the
    restart count is the attempt."""
    assert [attempts.start(store, _env(r, 3)) for r in range(2)] == [3, 3]


def test_current_reads_without_counting(store):
    """A keeper's view: the previous round's attempt until its worker counts this round's start."""
    assert attempts.start(store, _env(1, None)) == 0
    assert attempts.current(store, _env(1, 1)) == 1      # the restart count, while the worker starts
    assert attempts.current(store, _env(1, 0)) == 0      # a lagging agent's count: the previous round
    assert attempts.start(store, _env(1, 0)) == 1
    assert attempts.current(store, _env(1, 0)) == attempts.current(store, _env(1, 0)) == 1
