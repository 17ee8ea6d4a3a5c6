"""How long an in-flight failure waits for a keeper's death notice (``Pact._await_notices``), with fakes.

A notice comes within milliseconds of a death; waiting the whole grace (3 s) on every in-flight failure
cost each discard of a soak about 6 s (two observers in turn).  The wait must end at once where no
notice can still be coming, and keep the whole grace where one can (a peer not seen alive).
"""

from __future__ import annotations

import types

import pytest

from accelpact.impl import recovery
from accelpact.impl.runtime import hotswap


class FakeNotices:
    """``wait_new`` as hotswap.Notices: returns the new notices, the first ``posted_after`` calls none."""

    def __init__(self, dead: tuple[int, ...] = (), posted_after: int = 10**9) -> None:
        self.dead, self.posted_after, self.graces = dead, posted_after, []

    def wait_new(self, grace_s: float = hotswap.NOTICE_GRACE_S, settle_s: float = 0.0) -> tuple[int, ...]:
        self.graces.append(grace_s)
        return self.dead if len(self.graces) > self.posted_after else ()


class FakeDetector:
    def __init__(self, alive: set[int]) -> None:
        self.alive, self.asked = alive, []

    def beating(self, peers, gap_s=None) -> set[int]:
        self.asked.append(list(peers))
        return set(peers) & self.alive


def engine(notices, detector, *, revoked_by=None, world=4, rank=0):
    control = types.SimpleNamespace(world_size=world, revoked_by=lambda g, key: revoked_by)
    return types.SimpleNamespace(notices=notices, detector=detector, control=control, gen=3, rank=rank,
                                 groups=types.SimpleNamespace(key="replicate0"))


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(hotswap, "NOTICE_GRACE_S", 1.0)
    monkeypatch.setattr(recovery, "NOTICE_POLL_S", 0.05)


def test_a_peers_standing_revoke_reads_the_notices_once_without_waiting():
    n = FakeNotices()
    assert recovery.Pact._await_notices(engine(n, FakeDetector(set()), revoked_by=2)) == ()
    assert n.graces == [0.0]


def test_a_revoke_this_rank_wrote_itself_still_waits_for_the_notice():
    """A member that observed at the boundary revoked R itself before it asked for notices: its own
    revoke says nothing about a peer having waited (a conformance scenario's crash at the boundary
    with a spare then went L2 instead of a swap)."""
    n, d = FakeNotices(dead=(1,), posted_after=2), FakeDetector({2, 3})
    assert recovery.Pact._await_notices(engine(n, d, revoked_by=0)) == (1,)


def test_every_peer_beating_ends_the_wait_before_the_grace():
    n, d = FakeNotices(), FakeDetector({1, 2, 3})
    assert recovery.Pact._await_notices(engine(n, d)) == ()
    assert d.asked == [[1, 2, 3]] and n.graces[-1] == 0.0 and sum(n.graces) < hotswap.NOTICE_GRACE_S


def test_a_peer_not_beating_keeps_the_grace_and_its_notice_is_returned():
    n, d = FakeNotices(dead=(2,), posted_after=4), FakeDetector({1, 3})
    assert recovery.Pact._await_notices(engine(n, d)) == (2,)
    assert len(d.asked) == 4  # read again after every slice while rank 2 was silent


def test_a_peer_not_beating_and_no_notice_waits_the_whole_grace():
    n, d = FakeNotices(), FakeDetector({1, 3})
    assert recovery.Pact._await_notices(engine(n, d)) == ()
    assert n.graces[-1] == 0.0 and len(d.asked) >= 2


def test_without_a_detector_or_beyond_the_beat_check_the_grace_is_waited_out():
    for eng in (engine(FakeNotices(), None), engine(FakeNotices(), FakeDetector(set(range(200))), world=200)):
        assert recovery.Pact._await_notices(eng) == ()
        assert not (eng.detector and eng.detector.asked)
        assert len(eng.notices.graces) >= 2  # sliced until the grace ran out
