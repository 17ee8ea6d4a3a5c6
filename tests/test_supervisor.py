"""L2 under a real torchrun supervisor (impl/launch.py + impl/worker.py).

Spec ids: C5.1 / P11.2 (an in-flight failure is rejected: every rank exits 70), C5.2 / P13.2
(torchrun restarts all workers, restart count 1, they load the committed checkpoint C and replay
F - C steps), I5 (the restarted job's state equals the uninterrupted reference), L2 (after a loss
every surviving rank exits and the supervisor restarts within a bound: here a hung rank, bound =
collective timeout + deadline).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelpact.impl.exitcodes import ExitCode
from accelpact.impl.launch import run_reference, run_torchrun

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _job(out: Path, wrapper: str, nodes: int, rpn: int, steps: int, faults: list, **extra) -> dict:
    job = {"scenario": "test-supervisor", "topology": {"nodes": nodes, "ranks_per_node": rpn},
           "workload": {"wrapper": wrapper, "layers": 1, "dim": 16, "seq": 8, "batch": 2, "steps": steps,
                        "seed": 3, "checkpoint_every": 2},
           "faults": faults, "backend": "gloo", "out": str(out), "trace": True, "deadline_s": 30.0,
           "collective_timeout_s": 60.0}
    job.update(extra)
    return job


@pytest.mark.timeout(420)
def test_inflight_failure_rejected_restarted_and_replayed(tmp_path: Path) -> None:
    """C5.1/C5.2/I5: exception in backward of step 3 -> every rank exits 70 -> torchrun restarts once ->
    DCP reload of C=2 -> replay of F - C = 1 step -> final state equal to the reference."""
    import torch

    from accelpact.impl.workload import compare_snapshots

    fault = {"step": 3, "at": "backward", "kind": "exception", "ranks": [1]}
    job = _job(tmp_path / "run", "fsdp1-hybrid", 2, 2, 5, [fault])
    ref = run_reference(job, tmp_path / "refs", timeout_s=200)
    res = run_torchrun(job, nproc=4, max_restarts=1, timeout_s=200)
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
    trace1 = [json.loads(x) for x in (res.out / "trace-a0-r1.ndjson").read_text().splitlines()]
    assert [t["action"] for t in trace1 if t.get("type") == "action"][-2:] == ["RankObserve", "RankReject"]
    for rank in range(4):
        ok, why = compare_snapshots(torch.load(ref / f"final-r{rank}.pt", weights_only=False),
                                    torch.load(res.out / f"final-r{rank}.pt", weights_only=False))
        assert ok, f"rank {rank}: {why}"


@pytest.mark.timeout(300)
def test_hang_becomes_exit_and_restart_within_bound(tmp_path: Path) -> None:
    """L2 (liveness): rank 1 hangs before the forward of step 2.  Its peer's backward all-reduce times out
    (collective_timeout_s), the peer rejects (in flight) and writes the abort key, the hung rank's
    watchdog exits on it: all exit 70 within collective timeout + deadline, torchrun restarts."""
    coll, deadline = 8.0, 10.0
    fault = {"step": 2, "at": "forward", "kind": "hang", "ranks": [1]}
    job = _job(tmp_path / "run", "ddp", 2, 1, 4, [fault], collective_timeout_s=coll, deadline_s=deadline)
    res = run_torchrun(job, nproc=2, max_restarts=1, timeout_s=240)
    assert not res.timed_out, res.log_tail()
    assert res.returncode == 0, res.log_tail()
    first = res.attempt(0)
    assert {r["exit_code"] for r in first.values()} == {int(ExitCode.REJECTED)}, first
    hang = [json.loads(x) for x in (res.out / "trace-a0-r1.ndjson").read_text().splitlines()]
    t_hang = next(t["t_ns"] for t in hang if t.get("action") == "FaultHang") / 1e9
    last_exit = max(r["t_exit"] for r in first.values())
    assert last_exit - t_hang <= coll + deadline, (last_exit - t_hang)
    assert res.restarts == 1
    assert all(r["outcome"] == "finished" and r["frontier"] == 4 for r in res.attempt(1).values())
