"""The harness's rank program (accelpact/testing/worker.py), the typed job it reads, and the local launcher
(impl/launch.run_local).

Spec ids: C5.1 (in-flight failure -> every rank exits 70), C5.2 / I5 (resume from the last
committed checkpoint replays exactly F - C steps and ends equal to the uninterrupted run), P13.2
(the store prefix includes the restart count; faults strike only in the attempt they name),
S7 (exit codes are recorded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.impl.launch.job import Job, JobError, Topology, Workload
from accelpact.impl.rundir import RunDir
from accelpact.testing.reference import mean_over_micro_batches


def _job(out: Path, **changes) -> Job:
    job = Job(topology=Topology(2, 1), workload=Workload(wrapper="fsdp2-hybrid", layers=1, steps=5, seed=1,
                                                        checkpoint_every=2),
              out=str(out), scenario="test-worker", trace=True, deadline_s=30.0)
    return job.replace(**changes) if changes else job


@pytest.mark.parametrize("mutate,needle", [
    (lambda j: j["topology"].update(nodes=0), "topology.nodes"),
    (lambda j: j["workload"].update(wrapper="fsdp3"), "workload.wrapper"),
    (lambda j: j["workload"].update(steps=0), "workload.steps"),
    (lambda j: j["workload"].update(checkpoint_every=-1), "workload.checkpoint_every"),
    (lambda j: j["workload"].update(pad_s=-0.5), "workload.pad_s"),
    (lambda j: j["workload"].update(pad_s="1s"), "workload.pad_s"),
    (lambda j: j["workload"].update(pad_s=True), "workload.pad_s"),
    (lambda j: j["workload"].update(micro_batches=-1), "workload.micro_batches"),
    (lambda j: j["workload"].update(micro_batches=2.5), "workload.micro_batches"),
    (lambda j: j.update(backend="mpi"), "backend"),
    (lambda j: j.update(faults=[{"step": 9, "at": "boundary", "kind": "crash"}]), "faults[0].step"),
    (lambda j: j.update(faults=[{"step": 1, "at": "somewhere", "kind": "crash"}]), "faults[0].at"),
    (lambda j: j.update(faults=[{"step": 1, "at": "boundary", "kind": "meteor"}]), "faults[0].kind"),
    (lambda j: j.update(deadline_s=0), "deadline_s"),
    (lambda j: j.update(seeded_bug=3), "seeded_bug"),
    (lambda j: j.pop("out"), "'out'"),
])
def test_job_parse_names_the_bad_field(tmp_path: Path, mutate, needle: str) -> None:
    raw = _job(tmp_path).to_json()
    mutate(raw)
    with pytest.raises(JobError, match=needle.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        Job.parse(raw)


def test_the_rank_program_refuses_a_seeded_bug_that_is_not_one(tmp_path: Path, monkeypatch, capsys) -> None:
    """The job carries the seeded bug's name; the harness's rank program checks it before anything runs
    (exit 2, naming the seeded bugs): the engine only ever sees the installer (``Hooks.install``)."""
    pytest.importorskip("torch")
    from accelpact.testing import worker

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = _job(tmp_path / "run", seeded_bug="nonsense").write()
    assert worker.main(["--job", str(path)]) == 2
    assert "seeded_bug 'nonsense' is not a seeded bug; use one of ('skip-rebind'" in capsys.readouterr().err


def test_job_parse_fills_defaults(tmp_path: Path) -> None:
    job = Job.parse({"topology": {"nodes": 1, "ranks_per_node": 2}, "out": str(tmp_path),
                     "workload": {"wrapper": "ddp", "steps": 3}})
    assert job.backend == "gloo" and job.faults == () and job.trace is False
    assert job.workload.checkpoint_every == 0 and job.seeded_bug is None
    assert job.world == 2
    assert Job.parse(job.to_json()) == job  # the job file round-trips
    assert "pad_s" not in job.to_json()["workload"]  # unpadded jobs' files read as before
    padded = Job.parse({**job.to_json(), "workload": {"wrapper": "ddp", "steps": 3, "pad_s": 0.25}})
    assert padded.workload.pad_s == 0.25 and Job.parse(padded.to_json()) == padded
    # issue 41's opt-in: absent (0) leaves the job file, and a reference's cache key, as before
    assert job.workload.micro_batches == 0 and "micro_batches" not in job.to_json()["workload"]
    opted = Job.parse({**job.to_json(), "workload": {"wrapper": "ddp", "steps": 3, "micro_batches": 4}})
    assert opted.workload.micro_batches == 4 and Job.parse(opted.to_json()) == opted


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_micro_batches_train_the_mean_over_the_steps_micro_batches(tmp_path: Path) -> None:
    """``Workload.micro_batches`` (issue 41's opt-in, what the soak runs): DDP over 2 ranks, 4 micro-batches
    a step, so each rank accumulates 2 (``run.no_sync``) with the loss weighted 2/4.  Launched behind the
    keepers with ``ACCELPACT_KEEP=1`` (a death would be posted: the job can shrink).  Every rank ends
    ``torch.equal`` to the other, and within floating-point order of torch's own single-process training
    on the mean loss over the same 4 micro-batches, each read by (step, micro-batch index): a micro-batch
    read by rank, missed or counted twice moves the parameters by a whole step's update.  The first
    step's recorded loss (the boundary's mean over the ranks of the weighted sums) is the mean over the 4
    micro-batches: a wrong weight scales it."""
    torch = pytest.importorskip("torch")
    from accelpact.impl.launch import workload
    from accelpact.impl.launch import launch
    from accelpact.impl.launch.launch import KEEP_ENV, run_local

    steps, total = 3, 4
    job = Job(topology=Topology(1, 2), workload=Workload(wrapper="ddp", layers=1, steps=steps, seed=0,
                                                         micro_batches=total),
              out=str(tmp_path / "run"), scenario="test-micro-batches", trace=False, deadline_s=30.0)
    # behind keepers that keep their worker without spares (ACCELPACT_KEEP=1); a job not opted in is not
    assert launch._kept(job) and launch._keep_env(job) == {KEEP_ENV: 1}
    plain = job.replace(workload=Workload(wrapper="ddp", layers=1, steps=steps, seed=0))
    assert not launch._kept(plain) and launch._keep_env(plain) == {}
    res = run_local(job, timeout_s=150)
    assert res.ok(), res.log_tail(3000)
    run = RunDir(job.out)
    a, b = (torch.load(run.final(r), weights_only=False) for r in (0, 1))
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"]), "the replicas differ"
    assert a["step"] == a["cursor"] == steps
    results = {r: json.loads(run.result(0, r).read_text()) for r in (0, 1)}
    assert [results[r]["active_replicas"] for r in (0, 1)] == [[0, 1], [0, 1]]

    spec = workload.WorkloadSpec(wrapper="ddp", layers=1, seed=0)
    params, step_losses = mean_over_micro_batches(spec, steps, total)
    first = step_losses[0]
    expect = {f"module.{n}": p for n, p in params.items()}
    assert sorted(expect) == sorted(a["params"])
    num = sum(float((a["params"][k].double() - v.double()).pow(2).sum()) for k, v in expect.items())
    den = sum(float(v.double().pow(2).sum()) for v in expect.values())
    assert (num / den) ** 0.5 < 1e-5, f"relative difference {(num / den) ** 0.5:.3g} from the single-process run"
    rows = [json.loads(x) for x in run.steps(0, 0).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps))
    assert abs(rows[0]["loss"] - first) < 1e-5 * abs(first), (rows[0]["loss"], first)


def test_faults_strike_only_in_their_attempt(tmp_path: Path) -> None:
    """P13.2: a fault without "attempt" strikes in attempt 0 only, so a restart does not repeat it."""
    job = _job(tmp_path, faults=[{"step": 1, "at": "backward", "kind": "exception"},
                                 {"step": 3, "at": "forward", "kind": "crash", "ranks": [0], "attempt": 1}])
    assert [(f.step, f.at, f.kind, f.ranks) for f in job.faults_for_attempt(0)] == [(1, "backward", "exception", ())]
    assert [(f.step, f.at, f.kind, f.ranks) for f in job.faults_for_attempt(1)] == [(3, "forward", "crash", (0,))]
    assert job.faults_for_attempt(2) == ()


def test_exit_code_is_recorded_before_os_exit(tmp_path: Path) -> None:
    """S7: every fail-stop exit goes through os._exit; the result file records its code first."""
    code = (
        "import os\n"
        "from pathlib import Path\n"
        "from accelpact.testing.worker import ResultFile, _record_exits\n"
        f"r = ResultFile(Path({str(tmp_path)!r}), 0, 3, {{'outcome': 'running'}})\n"
        "r.update(); _record_exits(r); os._exit(72)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 72
    data = json.loads(RunDir(tmp_path).result(0, 3).read_text())
    assert data["outcome"] == "exited" and data["exit_code"] == 72 and data["t_exit"] > 0


@pytest.mark.multiproc
@pytest.mark.timeout(400)
@pytest.mark.nightly('the in-flight rejection and F - C replay of test_demo_end_to_end on the local launcher (about 40 s)')
def test_worker_rejects_inflight_then_resumes_replaying_f_minus_c(tmp_path: Path) -> None:
    """C5.1/C5.2/I5 through the worker: exception in backward of step 3 -> both ranks exit 70 with
    frontier F=3; a second attempt (same store, as torchrun keeps it) resumes from C=2, replays
    F - C = 1 step, and ends bit-identical to the uninterrupted reference."""
    import torch

    from accelpact.impl.exitcodes import ExitCode
    from accelpact.impl.launch.launch import run_local, run_reference
    from accelpact.impl.launch.snapshots import compare_snapshots
    from accelpact.testing import host_store

    job = _job(tmp_path / "run", faults=[{"step": 3, "at": "backward", "kind": "exception", "ranks": [1]}])
    ref = RunDir(run_reference(job, tmp_path / "refs", timeout_s=150, launcher="local"))
    store = host_store()
    first = run_local(job, timeout_s=150, attempt=0, store=store)
    assert not first.timed_out, first.log_tail()
    assert first.codes == [int(ExitCode.REJECTED)] * 2, first.log_tail()
    for r in first.attempt(0).values():
        assert r["outcome"] == "exited" and r["exit_code"] == 70 and r["frontier"] == 3
    second = run_local(job, timeout_s=150, attempt=1, store=store)
    assert second.codes == [0, 0], second.log_tail()
    run = RunDir(second.out)
    for rank, r in second.attempt(1).items():
        assert r["outcome"] == "finished" and r["resumed_from"] == 2 and r["replayed_steps"] == 1
        assert sorted(int(s) for s in r["t_steps"]) == [2, 3, 4]   # steps 2 (replayed), 3, 4
        ok, why = compare_snapshots(torch.load(ref.final(rank), weights_only=False),
                                    torch.load(run.final(rank), weights_only=False))
        assert ok, f"rank {rank}: {why}"


# ---- the multi-process harness (accelpact.testing), which shares the launcher's ProcessSet -------------

def _raises_or_hangs(ctx, hang_rank: int):
    """Rank ``hang_rank`` hangs (the fault under test); every other rank raises."""
    import time

    if ctx.rank == hang_rank:
        time.sleep(3600)
    raise ValueError(f"rank {ctx.rank} fails on purpose")


def _square(ctx, k: int):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + k)])
    dist.all_reduce(t)  # over the default group the harness initialised
    return {"rank": ctx.rank, "sum": float(t[0])}


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_harness_returns_values_reports_tracebacks_and_reaps_hung_ranks(ranks) -> None:
    """accelpact.testing: per-rank return values (this test module loaded in the children by its
    file path); a raising rank's traceback and exit code CRASHED; a hung rank killed at the bound
    and named in the run's explanation."""
    from accelpact.testing import CRASHED

    ok = ranks.run(_square, 3, init_group=True, k=1)
    assert ok.values() == [{"rank": r, "sum": 6.0} for r in range(3)], ok.explain()
    with ranks.start(_raises_or_hangs, 2, timeout_s=60, hang_rank=1) as launch:
        launch.procs.procs[0].wait(timeout=60)  # rank 0 has raised and exited: now end the launch
        bad = launch.wait(timeout_s=launch.procs.elapsed_s + 0.5)
    assert bad.codes == {0: CRASHED, 1: -9} and bad.hung == [1], bad.explain()
    assert "ValueError: rank 0 fails on purpose" in bad.errors[0]
    assert "rank 0 fails on purpose" in bad.explain() and "[1]" in bad.explain()
    with pytest.raises(AssertionError, match="fails on purpose"):
        bad.values()


def test_process_set_kills_descendants_in_sessions_of_their_own() -> None:
    """A child that starts its own child in a new session (as torchrun's agent starts each worker):
    leaving the ProcessSet kills the grandchild too, no process outlives its launch."""
    import time

    from accelpact.impl.launch.launch import ProcessSet

    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
            "print(p.pid, flush=True); time.sleep(120)")
    with ProcessSet() as ps:
        child = ps.start([sys.executable, "-c", code])
        deadline = time.monotonic() + 30
        grandchildren: list[int] = []
        while time.monotonic() < deadline and not grandchildren:
            grandchildren = [int(e) for e in os.listdir("/proc") if e.isdigit() and _parent(int(e)) == child.pid]
            time.sleep(0.05)
        assert grandchildren, "the child never started its own child"
    time.sleep(0.2)
    assert all(_state(pid) in (None, "Z") for pid in grandchildren), [(_state(p), p) for p in grandchildren]


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _parent(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[1]) if st else None


def _state(pid: int) -> str | None:
    st = _stat(pid)
    return st[0] if st else None
