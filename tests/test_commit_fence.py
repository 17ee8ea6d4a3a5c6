"""The commit fence (P17.2) meets a peer's step revoke before it is posted.

In a job that discards in place, a rank whose backward completed enters the fence (an all-reduce over W
on the control group) as ``optimizer.step()`` starts.  If a peer's backward failed meanwhile, that
peer's step revoke shuts this rank's control-group sockets down, possibly before the fence is posted,
and a gloo op posted on sockets shut down while no op was pending can stay blocked until the group's
timeout (spec/torch-facts.md).  CI met it in the demo's path (e): rank 0 sat in the fence while its
three peers waited for it at the episode's arrival, and the job ended at the deadline (exit 72, a
torchrun restart where the discard was due).

The first test pins the bound itself on the engine's own ``_fence`` and ``_wait_unless_revoked``: a
fence op that never completes (what gloo does in that race, which the end-to-end run meets only
sometimes) is given up ``REVOKE_GRACE_S`` after this generation's revoke, with the error the discard
path takes; with the fence's former unbounded ``work.wait()`` it blocks (the test's bound catches it).

In the second, rank 0 is made to meet that order for certain: its fence is posted only once its sockets were
shut down by the peers' step revoke (the engine's own ``_fence`` then runs unchanged).  The fault is a
link cut between ranks 1 and 3 in backward, as in the demo.  Expected (the model's): every rank
discards the step in place and finishes, none exits, and the traces are accepted by the checker.
"""

from __future__ import annotations

import threading
import time
import types

import pytest

pytest.importorskip("torch")

from accelpact.testing.hung import HungGroup  # noqa: E402 - after the importorskip of torch

FAULT_STEP = 3


def test_a_fence_op_still_pending_after_the_steps_revoke_is_given_up() -> None:
    from accelpact.impl.recovery import REVOKE_GRACE_S, Pact, RevokedWhilePending

    group = HungGroup(2, 0)
    revoked_at = time.monotonic_ns()
    engine = types.SimpleNamespace(
        gen=4, deadline_s=5.0, _pg=None, _r_record=None, _retiring=[],
        groups=types.SimpleNamespace(control=group, key="replicate0", name="replicate"),
        watchdog=types.SimpleNamespace(revocations=[(4, "replicate0", 6, revoked_at)]),  # its watcher shut them
        control=types.SimpleNamespace(revoked=lambda g, key: g == 4))
    engine._wait_unless_revoked = lambda work, what, group=None: Pact._wait_unless_revoked(engine, work, what, group)
    outcome: list[BaseException | None] = []

    def fence() -> None:
        try:
            Pact._fence(engine)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the outcome is the test's
            outcome.append(exc)

    t0 = time.monotonic()
    th = threading.Thread(target=fence, daemon=True)
    th.start()
    th.join(10.0)
    waited = time.monotonic() - t0
    group.work.released.set()
    assert not th.is_alive(), f"the fence still waits on its hung op {waited:.1f} s after the step's revoke"
    assert isinstance(outcome[0], RevokedWhilePending), outcome
    assert "commit fence" in str(outcome[0])
    assert len(engine._retiring) == 1 and engine._retiring[0].wait(5.0)  # the reaper held the group until the op ended
    print(f"fence given up after {waited * 1e3:.0f} ms (grace {REVOKE_GRACE_S * 1e3:.0f} ms)")


def late_fence_body(ctx, job) -> int:
    """A rank of ``job`` through the public API (the conformance worker).  At the fault step of
    generation 0 only: rank 1's step fails as its fence starts (a communicator failure of the step,
    as a cut control link would raise), and rank 0's fence is posted only once that failure's step
    revoke shut its sockets down (bounded)."""
    from accelpact.testing.worker import run_job
    from accelpact.impl.recovery import Pact
    from accelpact.impl.runtime.backends import AbortedCommunicator

    real = Pact._fence

    def fence(self) -> None:
        if self._step == FAULT_STEP and self.gen == 0:  # the fault's step, not its rerun
            if ctx.rank == 1:
                raise AbortedCommunicator("test: rank 1's control link failed as its commit fence started")
            if ctx.rank == 0:
                deadline = time.monotonic() + 20.0
                while not any(r[0] == self.gen for r in self.watchdog.revocations) and time.monotonic() < deadline:
                    time.sleep(0.005)
        real(self)

    Pact._fence = fence  # type: ignore[method-assign]  # this rank process only: the order under test
    code = run_job(job)
    if code:
        raise SystemExit(code)
    return code


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_a_fence_posted_after_a_peers_step_revoke_is_discarded_in_place(ranks, tmp_path) -> None:
    from accelpact.conformance.checker import check_traces, config_from_headers
    from accelpact.impl.trace import load_traces

    from accelpact.impl.launch.job import Job, Topology, Workload

    out = tmp_path / "run"
    job = Job(topology=Topology(2, 2), workload=Workload("fsdp1-hybrid", 1, 5, 0, 2), out=str(out), scenario="late-fence",
              trace=True, deadline_s=20.0, collective_timeout_s=8.0, pg_timeout_s=60.0, dead_after_s=5.0)
    run = ranks.run(late_fence_body, 4, timeout_s=180, job=job)
    assert run.codes == {0: 0, 1: 0, 2: 0, 3: 0}, run.explain()
    traces = load_traces(out)[0]
    observed = [r for r in traces[0].records if r.action == "RankObserve"]
    assert observed and observed[0].gen == 0 and observed[0].detail.get("cause") == "discard", observed
    print(f"rank 0 observed: {observed[0].detail.get('error')}")
    verdict = check_traces(config_from_headers(traces), traces, silent_faults=True)
    assert verdict.accepted, verdict.message
