"""The generic job runner (impl/worker.py) and its local launcher (impl/launch.run_local).

Spec ids: C5.1 (in-flight failure -> every rank exits 70), C5.2 / I5 (resume from the last
committed checkpoint replays exactly F - C steps and ends equal to the uninterrupted run), P13.2
(the store prefix includes the restart count; faults strike only in the attempt they name),
S7 (exit codes are recorded).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.impl.worker import JobError, faults_for_attempt, validate_job


def _job(out: Path, **over) -> dict:
    job = {"scenario": "test-worker", "topology": {"nodes": 2, "ranks_per_node": 1},
           "workload": {"wrapper": "fsdp2-hybrid", "layers": 1, "dim": 16, "seq": 8, "batch": 2, "steps": 5,
                        "seed": 1, "checkpoint_every": 2},
           "faults": [], "backend": "gloo", "out": str(out), "trace": True, "deadline_s": 30.0}
    job.update(over)
    return job


@pytest.mark.parametrize("mutate,needle", [
    (lambda j: j["topology"].update(nodes=0), "topology.nodes"),
    (lambda j: j["workload"].update(wrapper="fsdp3"), "workload.wrapper"),
    (lambda j: j["workload"].update(steps=0), "workload.steps"),
    (lambda j: j["workload"].update(checkpoint_every=-1), "checkpoint_every"),
    (lambda j: j.update(backend="mpi"), "backend"),
    (lambda j: j.update(faults=[{"step": 9, "at": "boundary", "kind": "crash"}]), "faults[0].step"),
    (lambda j: j.update(faults=[{"step": 1, "at": "somewhere", "kind": "crash"}]), "faults[0].at"),
    (lambda j: j.update(faults=[{"step": 1, "at": "boundary", "kind": "meteor"}]), "faults[0].kind"),
    (lambda j: j.update(deadline_s=0), "deadline_s"),
    (lambda j: j.pop("out"), "'out'"),
])
def test_validate_job_names_the_bad_field(tmp_path: Path, mutate, needle: str) -> None:
    job = _job(tmp_path)
    mutate(job)
    with pytest.raises(JobError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        validate_job(job)


def test_validate_job_fills_defaults(tmp_path: Path) -> None:
    job = validate_job({"topology": {"nodes": 1, "ranks_per_node": 2}, "out": str(tmp_path),
                        "workload": {"wrapper": "ddp", "steps": 3}})
    assert job["backend"] == "gloo" and job["faults"] == [] and job["trace"] is False
    assert job["workload"]["checkpoint_every"] == 0 and job["seeded_bug"] is None


def test_faults_strike_only_in_their_attempt() -> None:
    """P13.2: a fault without "attempt" strikes in attempt 0 only, so a restart does not repeat it."""
    job = {"faults": [{"step": 1, "at": "backward", "kind": "exception"},
                      {"step": 3, "at": "forward", "kind": "crash", "ranks": [0], "attempt": 1}]}
    assert faults_for_attempt(job, 0) == [{"step": 1, "at": "backward", "kind": "exception"}]
    assert faults_for_attempt(job, 1) == [{"step": 3, "at": "forward", "kind": "crash", "ranks": [0]}]
    assert faults_for_attempt(job, 2) == []


def test_exit_code_is_recorded_before_os_exit(tmp_path: Path) -> None:
    """S7: every fail-stop exit goes through os._exit; the result file records its code first."""
    code = (
        "import os, time\n"
        "from pathlib import Path\n"
        "from accelpact.impl.worker import ResultFile, _record_exits\n"
        f"r = ResultFile(Path({str(tmp_path)!r}), 0, 3, {{'outcome': 'running'}})\n"
        "r.update(); _record_exits(r); os._exit(72)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 72
    data = json.loads((tmp_path / "result-a0-r3.json").read_text())
    assert data["outcome"] == "exited" and data["exit_code"] == 72 and data["t_exit"] > 0


@pytest.mark.multiproc
@pytest.mark.timeout(400)
def test_worker_rejects_inflight_then_resumes_replaying_f_minus_c(tmp_path: Path) -> None:
    """C5.1/C5.2/I5 through the worker: exception in backward of step 3 -> both ranks exit 70 with
    frontier F=3; a second attempt (same store, as torchrun keeps it) resumes from C=2, replays
    F - C = 1 step, and ends bit-identical to the uninterrupted reference."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from accelpact.impl.exitcodes import ExitCode
    from accelpact.impl.launch import run_local, run_reference
    from accelpact.impl.workload import compare_snapshots

    job = _job(tmp_path / "run", faults=[{"step": 3, "at": "backward", "kind": "exception", "ranks": [1]}])
    ref = run_reference(copy.deepcopy(job), tmp_path / "refs", timeout_s=150, launcher="local")
    store = dist.TCPStore("127.0.0.1", 0, world_size=3, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    first = run_local(job, 2, timeout_s=150, attempt=0, store=store)
    assert not first.timed_out, first.log_tail()
    assert first.codes == [int(ExitCode.REJECTED)] * 2, first.log_tail()
    for r in first.attempt(0).values():
        assert r["outcome"] == "exited" and r["exit_code"] == 70 and r["frontier"] == 3
    second = run_local(job, 2, timeout_s=150, attempt=1, store=store)
    assert second.codes == [0, 0], second.log_tail()
    for rank, r in second.attempt(1).items():
        assert r["outcome"] == "finished" and r["resumed_from"] == 2 and r["replayed_steps"] == 1
        assert sorted(int(s) for s in r["t_steps"]) == [2, 3, 4]   # steps 2 (replayed), 3, 4
        ok, why = compare_snapshots(torch.load(ref / f"final-r{rank}.pt", weights_only=False),
                                    torch.load(second.out / f"final-r{rank}.pt", weights_only=False))
        assert ok, f"rank {rank}: {why}"
