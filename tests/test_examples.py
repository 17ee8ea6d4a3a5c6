"""The examples/ scripts under real torchrun on Gloo CPU (issue 11, "examples/").

Each example runs twice: without a fault (the reference) and with an external fault (the named
ranks' group connections shut down from an injector thread at step 3's boundary).  The faulted run
must repair in place (every rank prints its repair, no restart) and end bit-identical, rank by
rank, to the reference; its traces must be accepted by the trace checker.  The FSDP2 example also
runs as on a cluster: two torchrun agents (``--nnodes 2``, c10d rendezvous on loopback), through an
L1 repair and through an L2 restart (SIGKILL of a rank) that every agent joins.

Every launch is bounded and reaped (:class:`accelpact.impl.launch.launch.ProcessSet`); ports are free
loopback ports.
"""

from __future__ import annotations

import subprocess
import time
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip
from accelpact.testing.examples import (TIMEOUT_S, assert_bit_identical, assert_trace_accepted,  # noqa: E402 - after the torch skip
                                        torchrun, worker_pid)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

def repaired(text: str, world: int) -> int:
    return sum(f"rank {r}: step 3:" in text for r in range(world))


@pytest.fixture(scope="module")
def fsdp2_reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp2") / "reference"
    torchrun("fsdp2_hsdp.py", out, "--replicas", "2")
    return out


@pytest.mark.parametrize("script, nproc, fault", [
    ("fsdp2_hsdp.py", 4, "collective_timeout@boundary:3:0,2"),
    pytest.param("fsdp1_hybrid.py", 4, "collective_timeout@boundary:3:1,3", marks=pytest.mark.nightly(
        "two torchrun launches (about 40 s): FSDP1 repairs every time in conformance's 2x2-fsdp1-repair")),
    pytest.param("ddp.py", 2, "collective_timeout@boundary:3:0:world", marks=pytest.mark.nightly(
        "two torchrun launches (about 30 s): DDP repairs every time in test_hsdp_boundary_failure_repaired_in_place[ddp] and test_demo_end_to_end[ddp-2x1]")),
])
def test_example_repairs_in_place_bit_identical(tmp_path, script, nproc, fault, request):
    replicas = ["--replicas", "2"] if nproc == 4 else ["--replicas", "1"]
    if script == "fsdp2_hsdp.py":
        reference = request.getfixturevalue("fsdp2_reference")
    else:
        reference = tmp_path / "reference"
        torchrun(script, reference, *replicas, nproc=nproc)
    text = torchrun(script, tmp_path / "fault", *replicas, "--fault", fault, nproc=nproc)
    assert repaired(text, nproc) == nproc, f"not every rank reports the repair at step 3:\n{text[-3000:]}"
    assert {a for a, _ in RunDir(tmp_path / "fault").trace_files()} == {0}, "the repair must not restart any worker"
    assert_bit_identical(reference, tmp_path / "fault", nproc)
    assert_trace_accepted(tmp_path / "fault")


def test_fsdp2_two_agents_repair_in_place(tmp_path, fsdp2_reference):
    """One torchrun agent per simulated node (2 x 2 workers): the same L1 repair, bit-identical."""
    text = torchrun("fsdp2_hsdp.py", tmp_path / "l1", "--fault", "collective_timeout@boundary:3:1,3", nproc=2,
                    nnodes=2)
    assert repaired(text, 4) == 4, text[-3000:]
    assert_bit_identical(fsdp2_reference, tmp_path / "l1", 4)
    assert_trace_accepted(tmp_path / "l1")


@pytest.mark.nightly('a two-agent torchrun restart (about 25 s): restarts run every time in test_readme_script and test_demo_end_to_end, two agents in test_fsdp2_two_agents_repair_in_place')
def test_fsdp2_two_agents_restart_from_checkpoint(tmp_path, fsdp2_reference):
    """SIGKILL of rank 1 in step 4's backward: every worker exits, both agents restart theirs, the
    job resumes from the last committed checkpoint (step 4) and ends bit-identical."""
    out = tmp_path / "l2"
    torchrun("fsdp2_hsdp.py", out, "--fault", "crash@backward:4:1", nproc=2, nnodes=2, max_restarts=1)
    assert sorted(r for a, r in RunDir(out).trace_files() if a == 1) == [0, 1, 2, 3], \
        "every worker of both agents must run a second attempt"
    assert_bit_identical(fsdp2_reference, out, 4)
    assert_trace_accepted(out)  # both attempts; workers torchrun killed end without an end record


def test_an_idle_spares_death_costs_nothing(tmp_path, fsdp2_reference):
    """Issue 25: SIGKILL of the idle spare's worker from outside while the job trains: its keeper posts
    it gone and waits; the job finishes with zero restarts (the agent exits 0), bit-identical."""
    import threading

    from accelpact.testing import inject

    out = tmp_path / "spare-death"
    killed: list[int] = []

    def kill_the_spare() -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and not killed:
            pid = worker_pid("fsdp2_hsdp.py", 4)
            if pid is not None and RunDir(out).trace(0, 0).exists():  # the job is training
                inject.crash(pid)
                killed.append(pid)
            time.sleep(0.05)

    t = threading.Thread(target=kill_the_spare, daemon=True)
    t.start()
    text = torchrun("fsdp2_hsdp.py", out, "--replicas", "2", nproc=5, spares=1)
    t.join(timeout=5)
    assert killed, "the spare's worker was never found to kill"
    assert "spare 0 died idle: posted gone" in text, text[-3000:]
    assert sorted(r for a, r in RunDir(out).trace_files() if a == 1) == [], "no second attempt: nothing restarted"
    assert_bit_identical(fsdp2_reference, out, 4)
    assert_trace_accepted(out)  # told nothing of the fault


@pytest.mark.nightly("a spare taking over a SIGKILLed rank (about 20 s): runs every time as test_faults_from_outside's SIGSTOP swap and conformance's 2x2-fsdp1-spare1-backward-crash-r1")
def test_fsdp2_crash_hot_swapped_by_a_spare(tmp_path, fsdp2_reference):
    """Issue 13 in a user's script: 4 workers and 1 spare under one torchrun agent, each behind the
    keeper; SIGKILL of rank 1 in step 4's backward: no restart (max-restarts 0, the agent exits 0),
    the spare takes rank 1's identity with rank 3's shard, every rank reruns step 4, bit-identical."""
    out = tmp_path / "swap"
    text = torchrun("fsdp2_hsdp.py", out, "--replicas", "2", "--fault", "crash@backward:4:1", nproc=5, spares=1)
    assert text.count("replaced by a spare, step rerun") == 3, f"every survivor reports the swap:\n{text[-3000:]}"
    assert sorted(r for a, r in RunDir(out).trace_files() if a == 1) == [], "no second attempt: nothing restarted"
    assert_bit_identical(fsdp2_reference, out, 4)
    assert_trace_accepted(out)
    # the same traces with one record of a survivor dropped are rejected
    import json
    import shutil

    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    f = RunDir(tampered).trace(0, 3)
    lines = f.read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if '"RankArrive"' in x)
    rest = [json.loads(x) for x in lines[i + 1:]]
    for rec in rest:
        if rec.get("type") == "action":
            rec["seq"] -= 1
    f.write_text("\n".join(lines[:i] + [json.dumps(x) for x in rest]) + "\n")
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "check-trace", str(tampered)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, f"a dropped RankArrive must be rejected:\n{proc.stdout[-2000:]}{proc.stderr[-1000:]}"


@pytest.mark.nightly("a SIGSTOPped rank deposed for a spare (about 25 s): runs every time as test_faults_from_outside's sigstop case")
def test_fsdp2_stopped_rank_deposed_for_an_idle_spare(tmp_path, fsdp2_reference):
    """Issue 25: rank 1 stops (SIGSTOP: every thread, its heartbeat too) at step 4's boundary while a
    spare is idle.  A survivor's failure detector declares it, asks its keeper to depose it, the
    keeper kills it, and its death is swapped like any other: zero restarts, bit-identical."""
    out = tmp_path / "stop"
    text = torchrun("fsdp2_hsdp.py", out, "--replicas", "2", "--fault", "stop@boundary:4:1", nproc=5, spares=1)
    assert "worker deposed" in text and "death notice 1 posted" in text, text[-3000:]
    assert sorted(r for a, r in RunDir(out).trace_files() if a == 1) == [], "no second attempt: nothing restarted"
    assert_bit_identical(fsdp2_reference, out, 4)
    assert_trace_accepted(out)
