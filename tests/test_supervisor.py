"""L2 under a real torchrun supervisor (impl/launch/launch.py + accelpact/testing/worker.py).

Spec ids: C5.1 / P11.2 (an in-flight failure is rejected: every rank exits 70), C5.2 / P13.2
(torchrun restarts all workers, restart count 1, they load the committed checkpoint C and replay
F - C steps), I5 (the restarted job's state equals the uninterrupted reference), L2 (after a loss
every surviving rank exits and the supervisor restarts: here a hung rank, ended by its peer's
collective timeout and the abort that follows, never by the launch's bound).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accelpact.impl.exitcodes import ExitCode
from accelpact.impl.launch.job import Job, Topology, Workload
from accelpact.impl.launch.launch import run_reference, run_torchrun
from accelpact.impl.rundir import RunDir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _job(out: Path, wrapper: str, nodes: int, rpn: int, steps: int, faults: list, **changes) -> Job:
    job = Job(topology=Topology(nodes, rpn), workload=Workload(wrapper=wrapper, layers=1, steps=steps, seed=3,
                                                               checkpoint_every=2),
              out=str(out), scenario="test-supervisor", trace=True, deadline_s=30.0, collective_timeout_s=60.0)
    return job.replace(faults=faults, **changes)


@pytest.mark.timeout(420)
@pytest.mark.nightly("torchrun L2 after an in-flight exception (about 60 s): exit 70, restart and replay run every time in test_demo_end_to_end, test_readme_script and conformance's store loss")
def test_inflight_failure_rejected_restarted_and_replayed(tmp_path: Path) -> None:
    """C5.1/C5.2/I5: exception in backward of step 3 -> every rank exits 70 -> torchrun restarts once ->
    DCP reload of C=2 -> replay of F - C = 1 step -> final state equal to the reference."""
    import torch

    from accelpact.impl.launch.snapshots import compare_snapshots

    fault = {"step": 3, "at": "backward", "kind": "exception", "ranks": [1]}
    job = _job(tmp_path / "run", "fsdp1-hybrid", 2, 2, 5, [fault])
    ref = RunDir(run_reference(job, tmp_path / "refs", timeout_s=200))
    res = run_torchrun(job, max_restarts=1, timeout_s=200)
    assert not res.timed_out, res.log_tail()
    assert res.returncode == 0, res.log_tail()
    first, second = res.attempt(0), res.attempt(1)
    assert sorted(first) == sorted(second) == [0, 1, 2, 3]
    assert {r["exit_code"] for r in first.values()} == {int(ExitCode.REJECTED)}, first
    assert all(r["outcome"] == "exited" and r["frontier"] == 3 for r in first.values())
    assert res.restarts == 1
    for r in second.values():
        assert r["outcome"] == "finished" and r["restart_count"] == 1
        assert r["resumed_from"] == 2 and r["start_step"] == 2
        assert r["replayed_steps"] == 3 - 2
        assert r["t_fault"] is not None and r["t_frontier"] > r["t_fault"]
    # the rejection is in the traces under the model's names
    run = RunDir(res.out)
    acts1 = [t["action"] for t in run.records(0, 1) if t.get("type") == "action"]
    assert acts1[-2:] == ["RankObserve", "RankReject"], acts1
    for rank in range(4):
        ok, why = compare_snapshots(torch.load(ref.final(rank), weights_only=False),
                                    torch.load(run.final(rank), weights_only=False))
        assert ok, f"rank {rank}: {why}"


@pytest.mark.timeout(300)
@pytest.mark.nightly('a hang ended and restarted under torchrun (about 55 s): hangs end every time in test_impl_recovery (step deadline, hang in release), restarts in test_readme_script')
def test_hang_becomes_exit_and_restart(tmp_path: Path) -> None:
    """L2 (liveness): rank 1 hangs before the forward of step 2.  Its peer's forward collective (DDP's
    buffer broadcast) times out (collective_timeout_s); the peer observes that in flight and, the job
    discarding in place (P17), discards the step and arrives at the control barrier, where the hung
    rank never arrives.  The wait's deadline ends the episode: every rank exits 72 (deadline; the hung
    one by its watchdog), torchrun restarts, the job finishes."""
    fault = {"step": 2, "at": "forward", "kind": "hang", "ranks": [1], "group": "world"}  # (ddp: no replicate group)
    job = _job(tmp_path / "run", "ddp", 2, 1, 4, [fault], collective_timeout_s=8.0, deadline_s=10.0)
    res = run_torchrun(job, max_restarts=1, timeout_s=240)
    assert not res.timed_out, res.log_tail()
    assert res.returncode == 0, res.log_tail()
    first = res.attempt(0)
    assert {r["exit_code"] for r in first.values()} == {int(ExitCode.DEADLINE)}, first
    run = RunDir(res.out)
    acts = {r: [t for t in run.records(0, r) if t.get("type") == "action"] for r in (0, 1)}
    # rank 0: the in-flight observation (its collective on the hung peer failed), the discard, the
    # arrival nobody joins, and the end at the deadline: its own barrier wait's (RankTimeout) or the
    # hung rank's step deadline's abort (RankExit), whichever expires first (both are the model's)
    names0 = [t["action"] for t in acts[0]]
    assert names0[:4] == ["RankObserve", "RankDiscardStep", "RankGuard", "RankArrive"], names0
    assert names0[4:] in (["RankExit"], ["RankTimeout"]), names0
    # (DDP broadcasts its buffers -- the attention mask -- at every forward: the first collective of
    # step 2, which the hung rank never joins, is in the forward)
    assert acts[0][0]["state"]["point"] == "forward" and acts[0][0]["detail"]["in_flight"], acts[0][0]
    assert acts[0][-1]["state"]["reason"] == "deadline"
    # rank 1: hung, then ended by its watchdog (reason deadline), never taking a protocol step
    names1 = [t["action"] for t in acts[1]]
    assert names1[0] == "FaultHang" and len(names1) == 2, names1
    assert acts[1][-1]["state"]["reason"] == "deadline"
    assert res.restarts == 1
    assert all(r["outcome"] == "finished" and r["frontier"] == 4 for r in res.attempt(1).values())
