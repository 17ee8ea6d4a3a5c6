"""Refill (issue 41; spec/hotswap.md, "Refill"): a keeper whose worker died starts a fresh spare in its
place, so one spare absorbs one death after another.  A real job (the harness's DDP workload, three
ranks and one spare, every process behind its keeper, :func:`~accelpact.impl.launch.launch.run_local`)
whose workers this test SIGKILLs from outside, one identity after another, each once the previous swap
was released and the refilled spare entered the pool (facts read off the result files and the job's
store, every wait bounded): three swaps, zero restarts, final state equal to the fault-free run.

The keeper's refill logic alone (indices, the pool's count, the ready pipe, an idle spare's death):
tests/test_keeper.py, the ``refill`` section.  The spare's prebuild (``Session._prebuild``), in this
process: the last two tests."""

from __future__ import annotations

import datetime
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.conformance.cli_check import check_dir  # noqa: E402 - after the torch skip
from accelpact.impl.controlplane import REFILLS_KEY  # noqa: E402 - after the torch skip
from accelpact.impl.launch.job import Job, Topology, Workload  # noqa: E402 - after the torch skip
from accelpact.impl.launch.launch import run_local, run_reference  # noqa: E402 - after the torch skip
from accelpact.impl.launch.snapshots import compare_runs  # noqa: E402 - after the torch skip
from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip

#: bounds every wait of the striker and the launch
TIMEOUT_S = 400.0
VICTIMS = (1, 2, 0)


def _job(out: Path) -> Job:
    # long enough that three swaps, each after the previous refill is ready, land before the end
    return Job(topology=Topology(3, 1, spares=1), workload=Workload("ddp", 1, 400, 0, 50, 0.05), out=str(out),
               scenario="refill", backend="gloo", trace=True, deadline_s=60.0, collective_timeout_s=60.0)


def _results(out: Path) -> dict[int, dict]:
    got = {}
    for r in range(3):
        try:
            got[r] = json.loads(RunDir(out).result(0, r).read_text())
        except (OSError, ValueError):  # not written yet, or being replaced
            pass
    return got


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def _strike(out: Path, store, done: threading.Event, log: list) -> None:
    """Kill each victim's current holder in turn, once the job trains with every identity alive,
    ``n`` swaps recorded and ``n`` refills in the pool (n kills so far)."""
    deadline = time.monotonic() + TIMEOUT_S
    for n, victim in enumerate(VICTIMS):
        while not done.is_set() and time.monotonic() < deadline:
            res = _results(out)
            swaps = max((len(v.get("swaps") or []) + (1 if v.get("swapped_in") else 0) for v in res.values()), default=0)
            steady = len(res) == 3 and all(v.get("outcome") == "running" and _alive(v.get("pid")) and (v.get("frontier") or 0) > 1
                                            for v in res.values())
            if steady and swaps >= n and int(store.add(f"attempt0/{REFILLS_KEY}", 0)) >= n:
                pid = int(res[victim]["pid"])
                os.kill(pid, signal.SIGKILL)
                log.append((victim, pid, res[victim].get("frontier")))
                break
            time.sleep(0.05)
        else:
            return


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.nightly("three swaps of a real job, each after its refill is ready (about 90 s on two cores): the keeper's refill, "
                     "a crash and an idle spare's death, runs every time in tests/test_keeper.py")
def test_three_sigkills_with_one_spare_are_three_swaps(tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = _job(out)
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size=5, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=TIMEOUT_S))
    done, log = threading.Event(), []
    t = threading.Thread(target=_strike, args=(out, store, done, log), daemon=True)
    t.start()
    try:
        res = run_local(job, timeout_s=TIMEOUT_S, store=store)
    finally:
        done.set()
        t.join(timeout=10)
    assert not res.timed_out and set(res.codes) == {0}, res.log_tail()
    assert [v for v, _, _ in log] == list(VICTIMS), f"struck {log}:\n{res.log_tail()}"
    text = res.log.read_text(errors="replace")
    for r in VICTIMS:
        assert f"now acts as rank {r}" in text, text[-3000:]
    assert sorted(a for a, _ in res.results) == [0] * len(res.results), "nothing restarted"
    # each identity's result file is its latest holder's: the swaps it took part in, and the one it came in by
    swaps = {int(sw["generation"]) for v in res.results.values()
             for sw in list(v.get("swaps") or []) + ([v["swapped_in"]] if v.get("swapped_in") else [])}
    assert swaps == {0, 1, 2}, swaps
    # `accelpact check-trace` told nothing (no faults in the job file: the configuration from the trace
    # headers, the SIGKILLs unlogged): the three deaths, swaps and keepers' refills are the model's
    ok, msg = check_dir(out)
    assert ok and msg.startswith("attempt 0: accepted"), msg
    ref = run_reference(job, tmp_path / "ref", timeout_s=TIMEOUT_S)
    same, diff = compare_runs(ref, out, 3)  # torch.equal on every tensor of every rank's final state
    assert same, f"differs from the fault-free run: {diff}"


# ------------------------------------------------------------------------------ the spare's prebuild

def _spare_session(world: int, replicas: int):
    """A spare's session as :func:`accelpact.init` makes it (no group; ``rank`` -1), without a job."""
    from accelpact.impl.launch.api import Session, Settings
    from accelpact.impl.launch.job import Topology as JobTopology
    from accelpact.impl.runtime.groups import build_job_groups
    from accelpact.impl.launch import workload

    topo = JobTopology(replicas, world // replicas)
    store = torch.distributed.HashStore()
    groups = build_job_groups(workload, topo, world, "gloo", build=False, device=torch.device("cpu"), store=store,
                              deadline_s=10.0, pg_timeout_s=10.0, collective_timeout_s=10.0)
    return Session(settings=Settings.resolve({}), rank=-1, world=world, local_rank=0, attempt=0, replicas=replicas,
                   device=torch.device("cpu"), store=store, attempt_store=store, topology=topo, groups=groups, spares=1,
                   spare=0)


def test_a_spare_builds_its_model_on_stand_in_groups_and_keeps_none() -> None:
    """``Session._prebuild``: the user's ``rebuild`` runs once as rank 0 of the job's topology, on groups
    of the job's shapes (an FSDP2 HSDP model sharded over the 2x2 mesh: a real rank's shard sizes),
    with ``extra`` None; afterwards the spare holds no group and is rank -1 again."""
    from torch.distributed.fsdp import fully_shard

    job = _spare_session(world=4, replicas=2)
    seen = {}

    def rebuild(j, extra):
        seen.update(rank=j.rank, extra=extra, world=torch.distributed.get_world_size(j.world_group),
                    mesh=tuple(j.mesh.shape), shard=torch.distributed.get_world_size(j.shard_group))
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        fully_shard(model, mesh=j.mesh)
        seen["local"] = [tuple(p.to_local().shape) for p in model.parameters()]
        return model, torch.optim.AdamW(model.parameters())

    assert job._prebuild(rebuild)
    assert seen == {"rank": 0, "extra": None, "world": 4, "mesh": (2, 2), "shard": 2,
                    "local": [(4, 8), (4,), (2, 8), (2,)]}  # dim 0 sharded over the 2 shards of a replica
    assert job.rank == -1 and job.groups.training == {} and job.groups.mesh is None
    assert not torch.distributed.is_initialized()


def test_a_failing_prebuild_leaves_the_spare_idle_and_says_why(capsys) -> None:
    job = _spare_session(world=2, replicas=2)

    def rebuild(j, extra):
        raise RuntimeError("needs the dataset on local disk")

    assert not job._prebuild(rebuild)
    assert "needs the dataset on local disk" in capsys.readouterr().err
    assert job.rank == -1 and job.groups.training == {} and not torch.distributed.is_initialized()
