"""The boundary's failure flag gives up on an op the revoke of the groups over W did not wake.

At the boundary every rank ORs its failure flag over W on the control group (``Pact._failure_flag``).
When a link under the control group breaks, the ranks whose flag op fails publish the wide revoke and
every watcher shuts its rank's groups over W down, so a peer still inside the flag wakes with the
shutdown's error.  Gloo does not always wake it: an op pending when its sockets were shut down can stay
blocked until the group's own timeout (bench/README.md, K6).  CI met it in conformance
``2x2-fsdp1-link-r0-r3-boundary``: ranks 0, 1 and 3 observed the cut and arrived, rank 2 sat in the
flag, and the job ended at the 8-s arrival deadline (L2 where L1 was due).

So the flag's wait is bounded like the commit fence's (tests/test_commit_fence.py): once this rank's
watcher has shut the groups over W down for this generation, an op still pending ``REVOKE_GRACE_S``
later is abandoned (``RevokedWhilePending``) and the rank observes through the failed flag.  A revoke of
R alone never ends the flag's wait: R's failure is what the flag spreads, so the flag completes beside it.

The ops are test doubles (what gloo does in that race, which an end-to-end run meets only sometimes);
the engine's own ``_failure_flag`` and ``_wait_unless_revoked`` run unchanged.  With the flag's former
unbounded ``work.wait()`` the first test's bound catches the rank still waiting.
"""

from __future__ import annotations

import threading
import time
import types

import pytest

pytest.importorskip("torch")

from accelpact.testing.hung import HungGroup  # noqa: E402 - after the importorskip of torch


def _engine(group: HungGroup, *, wide: list, revocations: list) -> types.SimpleNamespace:
    from accelpact.impl.recovery import Pact

    engine = types.SimpleNamespace(
        gen=3, deadline_s=5.0, _pg=None, _r_record=None, _retiring=[], observed=[],
        groups=types.SimpleNamespace(control=group, key="replicate0", name="replicate", count=2, index=0),
        watchdog=types.SimpleNamespace(revocations=revocations, wide_revocations=wide),
        control=types.SimpleNamespace(revoked=lambda g, key: True))  # R's key revoked too: it must not end the flag
    engine._wait_unless_revoked = (lambda work, what, group=None, wide=False:
                                   Pact._wait_unless_revoked(engine, work, what, group, wide=wide))
    engine._swap_if_died = lambda point, exc: None
    engine._observe_wide = lambda exc: engine.observed.append(exc)
    return engine


def _flag_in_thread(engine) -> tuple[threading.Thread, list]:
    from accelpact.impl.recovery import Pact

    outcome: list = []

    def run() -> None:
        try:
            outcome.append(Pact._failure_flag(engine, False))
        except BaseException as exc:  # noqa: BLE001 - the outcome is the test's
            outcome.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, outcome


def test_a_flag_op_still_pending_after_the_wide_revoke_is_given_up_and_observed() -> None:
    from accelpact.impl.recovery import REVOKE_GRACE_S, RevokedWhilePending

    group = HungGroup(4, 2)
    # this rank's watcher shut generation 3's groups over W down (a peer's flag failed on the cut link)
    engine = _engine(group, wide=[(3, 9, time.monotonic_ns())], revocations=[])
    t0 = time.monotonic()
    th, outcome = _flag_in_thread(engine)
    th.join(10.0)
    waited = time.monotonic() - t0
    group.work.released.set()
    assert not th.is_alive(), f"the flag still waits on its hung op {waited:.1f} s after the wide revoke"
    assert outcome == [None], outcome  # None: the flag failed, which groups failed is read after the agreement
    assert len(engine.observed) == 1 and isinstance(engine.observed[0], RevokedWhilePending), engine.observed
    assert "failure flag" in str(engine.observed[0])
    assert len(engine._retiring) == 1 and engine._retiring[0].wait(5.0)  # the reaper held the group until the op ended
    print(f"flag given up after {waited * 1e3:.0f} ms (grace {REVOKE_GRACE_S * 1e3:.0f} ms)")


@pytest.mark.parametrize("revoke", ["earlier generation's wide revoke", "R's revoke"])
def test_the_flag_is_not_given_up_on_a_revoke_that_leaves_the_control_group_standing(revoke) -> None:
    """A wide revoke of an earlier generation, or R's revoke in this one (a member observed at the probe:
    the flag carries its 1 to every rank), leaves the flag waiting for its op; its own error ends it."""
    group = HungGroup(4, 2)
    if revoke == "R's revoke":
        engine = _engine(group, wide=[], revocations=[(3, "replicate0", 6, time.monotonic_ns())])
    else:
        engine = _engine(group, wide=[(2, 9, time.monotonic_ns())], revocations=[])
    th, outcome = _flag_in_thread(engine)
    th.join(0.5)  # 25 x the grace: a wait ended by this revoke would be over
    still_waiting = th.is_alive()
    group.work.released.set()
    th.join(10.0)
    assert still_waiting, f"the flag was given up on {revoke}: {outcome} {engine.observed}"
    assert outcome == [None] and len(engine.observed) == 1, (outcome, engine.observed)
    assert "Connection closed by peer" in str(engine.observed[0])  # the op's own error
    assert engine._retiring == []
