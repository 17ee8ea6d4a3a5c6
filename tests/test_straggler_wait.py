"""The agreement wait of an episode that abandoned a step in flight (recovery.Pact._await_stragglers).

CI met it (``2x2-fsdp1-inflight-forward``, 1 run in 6 here): rank 1 stayed in FSDP1's reduce-scatter
of the abandoned step after the step revoke shut its sockets down, a gloo op the revoke did not wake
(K6, bench/README.md), while its three peers had arrived; their 8 s wait expired and the job ended
L2 where the model allows only L1.  The rank still beat: the wait now goes on while every absent
peer beats, at most R's collective timeout past the deadline.  These tests drive the wait with a
fake control plane and a fake detector (what a peer's heartbeat says is scripted); real runs of the
scenario are in conformance/.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from accelpact.impl.recovery import Pact  # noqa: E402 - after the importorskip of torch


class Control:
    """The two control-plane calls the wait makes: the decision appears at ``decide_at`` (monotonic
    seconds; None: never); rank ``late`` arrives at ``arrive_at``."""

    world_size = 4

    def __init__(self, decide_at: float | None = None, late: int = 1, arrive_at: float | None = None) -> None:
        self.decide_at, self.late, self.arrive_at = decide_at, late, arrive_at

    def decided_by(self, g: int, which: str, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.decide_at is not None and time.monotonic() >= self.decide_at:
                return True
            time.sleep(0.01)
        return self.decide_at is not None and time.monotonic() >= self.decide_at

    def arrived(self, g: int) -> set[int]:
        here = set(range(self.world_size)) - {self.late}
        if self.arrive_at is not None and time.monotonic() >= self.arrive_at:
            here.add(self.late)
        return here


class Detector:
    """``beats_until``: the absent peer beats until then (monotonic seconds; None: always)."""

    def __init__(self, beats_until: float | None = None) -> None:
        self.beats_until = beats_until
        self.asked = 0

    def beating(self, peers, gap_s=None) -> set[int]:
        self.asked += 1
        time.sleep(0.01)
        return set(peers) if self.beats_until is None or time.monotonic() < self.beats_until else set()


class Trace:
    def __init__(self) -> None:
        self.notes: list[tuple[str, dict]] = []

    def note(self, what: str, **detail) -> None:
        self.notes.append((what, detail))


def pact(control: Control, detector: Detector | None, collective_timeout_s: float | None = 2.0):
    return SimpleNamespace(control=control, detector=detector, collective_timeout_s=collective_timeout_s, trace=Trace(),
                           deadline_s=0.3)


EP = SimpleNamespace(g=0)


def wait(p, deadline_s: float = 0.3) -> float:
    """How long past the deadline the caller's wait is to end (seconds from now)."""
    t0 = time.monotonic()
    until = Pact._await_stragglers(p, EP, t0 + deadline_s)
    return until - t0


def test_a_beating_straggler_is_waited_for_past_the_deadline_until_it_arrives() -> None:
    """The absent rank beats and its decision comes 1.2 s in (its op timed out, it arrived, the last
    arriver decided): the wait, 0.3 s, goes on until then, and says so in the trace."""
    t0 = time.monotonic()
    p = pact(Control(decide_at=t0 + 1.2, arrive_at=t0 + 1.1), Detector())
    ended = wait(p)
    assert 1.1 <= ended <= 2.0, ended
    assert p.trace.notes and p.trace.notes[0][0] == "await-straggler" and p.trace.notes[0][1]["absent"] == [1]


def test_a_straggler_that_beats_forever_is_waited_for_at_most_the_collective_timeout() -> None:
    p = pact(Control(), Detector())
    ended = wait(p)
    assert 2.0 <= ended <= 3.0, f"deadline 0.3 s + collective timeout 2 s; the wait ended {ended:.2f} s in"


def test_a_silent_straggler_ends_the_wait_at_the_deadline() -> None:
    """Dead, stopped or its GIL held: no stretch (the deadline's RankTimeout, as before)."""
    d = Detector(beats_until=0.0)
    p = pact(Control(), d)
    ended = wait(p)
    assert ended < 0.6 and d.asked == 1 and not p.trace.notes, (ended, d.asked)


def test_a_straggler_that_goes_silent_while_waited_for_ends_the_wait_then() -> None:
    t0 = time.monotonic()
    p = pact(Control(), Detector(beats_until=t0 + 1.0))
    ended = wait(p)
    assert 0.9 <= ended <= 1.8, ended


def test_a_decision_in_time_ends_the_wait_at_once_and_none_without_a_detector_or_timeout() -> None:
    t0 = time.monotonic()
    d = Detector()
    assert wait(pact(Control(decide_at=t0 + 0.1), d)) == pytest.approx(0.3, abs=0.05)  # the caller reads it at once
    assert d.asked == 0
    assert wait(pact(Control(), None)) < 0.6
    assert wait(pact(Control(), Detector(), collective_timeout_s=None)) < 0.6


def test_a_straggler_that_arrived_between_two_looks_has_its_decision_waited_for() -> None:
    """It arrived (its frontier stands) but has not decided yet when a slice ends: the decision is
    waited for a deadline more, not timed out at once."""
    t0 = time.monotonic()
    control = Control(arrive_at=t0 + 1.0)
    control.decided_by = lambda g, which, deadline: (time.sleep(max(0.0, min(deadline, t0 + 1.05) - time.monotonic())), False)[1]
    ended = wait(pact(control, Detector()))
    assert ended >= 1.3, f"the caller's wait ends {ended:.2f} s in: at least a deadline (0.3 s) after the arrival"
