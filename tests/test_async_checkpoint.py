"""Issue 44, item 3: asynchronous checkpoints (``attach(checkpoint="async")``, ``dcp.async_save``).

An L2 restart after a rank is SIGKILLed from outside while an async save is being written resumes
from the last *durable* checkpoint (the one every rank finished and acknowledged, whose marker rank 0
wrote), bit-identical (parameters, AdamW state, the RNG a dropout draws from, the data cursor) to a
fault-free reference run's state at that step, and ends bit-identical to it.

The job (:func:`job_rank`, 2 DDP ranks, one per node, through :mod:`accelpact.testing`: loopback gloo,
a store the test hosts, every rank bounded and reaped; the restart is a second launch on the same
store, which counts it as attempt 1, as a torchrun restart is) checkpoints every :data:`EVERY` steps.
The reference is the same job fault-free with synchronous checkpoints (an independent path).  Where the
fault lands: the engine never knows a fault is scheduled; the job's own code makes one save slow, as
a slow serializer would: its model holds a small state object (``get_extra_state``) that DCP pickles
on its background thread, and in attempt 0 the one of step :data:`SLOW_STEP` takes a minute, after
writing the pid of the process pickling it into a marker file this test watches.  The test then
SIGKILLs that process (:func:`accelpact.testing.inject.crash`): the save of SLOW_STEP is in flight on
every rank (the peer waits for it inside DCP's collectives).

Teeth: the seeded defect "marking the save durable before its future completes" (the per-rank file,
the acknowledgement and the marker written as soon as the save is launched, DCP's write awaited only
after them) makes the same check fail (:func:`test_a_save_marked_durable_before_its_future_completes_is_caught`).

A group cut during the background save (:func:`test_a_checkpoint_group_cut_during_an_async_save_is_repaired_and_the_save_taken_again`):
the same slow save holds the save of SLOW_STEP in flight until this test has shut down every
connection of the checkpoint group (``inject.cut_links`` on its listening ports, read off the job's
store); the background save fails on every rank, which is no exception out of ``run.boundary``: at
the next boundary the checkpoint is taken again, meets the cut group (the engine's observation, a
failed group over W at the boundary, P18.4), the groups over W are repaired in place and the save is
taken again and committed; no restart, the final state bit-identical to the fault-free run, the
traces accepted told nothing.

Nightly: ``accelpact demo --checkpoint async`` with every fault in the step after a due checkpoint (a
death swapped by a spare, a link cut discarded in place, with the save in flight as each begins).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.exitcodes import ExitCode  # noqa: E402 - after the torch skip
from accelpact.impl.runtime import checkpoint as ck  # noqa: E402 - after the torch skip
from accelpact.impl.launch.job import Topology  # noqa: E402 - after the torch skip
from accelpact.testing import host_store, inject, start_ranks  # noqa: E402 - after the torch skip
from accelpact.testing.examples import assert_trace_accepted  # noqa: E402 - after the torch skip
from accelpact.testing.soak.live import discover_groups  # noqa: E402 - after the torch skip

pytestmark = [pytest.mark.multiproc]

WORLD = 2
STEPS = 8
EVERY = 2
#: the checkpoint that is in flight when the fault strikes (2 is committed before it)
SLOW_STEP = 4
#: how long the slow serializer takes in attempt 0 (the test strikes long before)
SLOW_S = 60.0
LAUNCH_S = 90.0
DOCUMENTED = {int(c) for c in ExitCode}

#: the slow save of attempt 0, per process: (step, marker path, release path or None) (set by job_rank)
_SLOW: dict = {}


# ---------------------------------------------------------------------------------------------- the job
class Tagged:
    """The job's state object in its model (``get_extra_state``): which step's boundary it was set at.
    Pickled by DCP when a checkpoint is written (on async_save's thread); the one of the slow step
    is slow once per job, after saying so in the marker (the pid of the process pickling it): it
    takes :data:`SLOW_S`, or until the release file exists."""

    def __init__(self, step: int) -> None:
        self.step = step

    def __deepcopy__(self, memo: dict) -> "Tagged":
        return Tagged(self.step)

    def __reduce__(self):
        slow = _SLOW.get("at")
        if slow is not None and slow[0] == self.step:
            try:
                fd = os.open(slow[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                fd = None
            if fd is not None:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                deadline = time.monotonic() + SLOW_S
                while time.monotonic() < deadline and not (slow[2] is not None and os.path.exists(slow[2])):
                    time.sleep(0.01)
        return (Tagged, (self.step,))


def _commit_before_the_future(self, p):
    """The seeded defect (replaces ``CheckpointManager._complete``): the per-rank file, the
    acknowledgement and the marker first, DCP's write (the future) awaited only after them."""
    ck._atomic_write(p.folder / f"rank{self.rank}.pt", p.rank_file)
    self._acknowledge_and_commit(p.step, p.folder, p.tag, p.abandoned)
    p.future.result()
    return time.perf_counter() - p.t0


def _snapshot(model, optim) -> dict:
    """This rank's parameters, AdamW state and CPU RNG, copied."""
    state = {f"param.{n}": p.detach().clone() for n, p in model.module.named_parameters()}
    state.update({f"optim.{i}.{k}": torch.as_tensor(v).clone() for i, st in optim.state_dict()["state"].items()
                  for k, v in st.items()})
    state["rng"] = torch.get_rng_state()
    return state


def job_rank(ctx, mode: str, slow: bool, defect: bool, snap_every_step: bool, release: bool = False) -> dict:
    """The user's job: ``accelpact.init``, a DDP model with dropout, ``attach(checkpoint=mode)``, the
    three calls.  Returns its start step, the extra state it resumed with, the checkpoints it saved,
    the repairs it took part in and its snapshots (every boundary's with ``snap_every_step``; the one
    at the start and the last otherwise).  ``release``: the slow save waits for ``release`` in the
    run folder (the test's cut) instead of :data:`SLOW_S`."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import accelpact

    torch.set_num_threads(1)
    (Path(ctx.out) / f"pid-r{ctx.rank}").write_text(str(os.getpid()))
    if slow:
        _SLOW["at"] = (SLOW_STEP, str(Path(ctx.out) / "slow-save"), str(Path(ctx.out) / "release") if release else None)
    if defect:
        ck.CheckpointManager._complete = _commit_before_the_future
    job = accelpact.init("gloo", deadline_s=10.0, collective_timeout_s=20.0, dead_after_s=3.0, trace_dir=str(ctx.out))

    class Tag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.state = Tagged(0)

        def forward(self, x):
            return x

        def get_extra_state(self):
            return self.state

        def set_extra_state(self, state) -> None:
            self.state = state

    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Dropout(0.25), Tag(), nn.Linear(32, 1))
    tag = inner[3]
    model = DDP(inner, process_group=job.world_group)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    torch.manual_seed(100 + job.rank)  # this rank's dropout stream: restored from the checkpoint
    cursor = {"next": 0}
    run = job.attach(model, optim, checkpoint_dir=f"{ctx.out}/ckpt", checkpoint_every=EVERY, checkpoint=mode,
                     extra_state=lambda: dict(cursor))
    assert run is not None
    if run.restored_extra is not None:
        cursor = dict(run.restored_extra)
    out = {"start": run.start_step, "restored": run.restored_extra, "tag": tag.state.step,
           "snaps": {run.start_step: _snapshot(model, optim)}}
    for step in run.steps(STEPS):
        g = torch.Generator().manual_seed(1000 * cursor["next"] + job.rank)
        x = torch.randn(8, 16, generator=g)
        with run.step(step):
            loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
        cursor["next"] = step + 1
        tag.state = Tagged(step + 1)
        run.boundary(loss.detach())
        if snap_every_step:
            out["snaps"][step + 1] = _snapshot(model, optim)
    out["snaps"][STEPS] = _snapshot(model, optim)
    job.close()
    out["saved"] = [s for s, _took in run.saved]
    out["repairs"] = len(run.reports)
    return out


# ---------------------------------------------------------------------------------------------- the tests
def _launch(out: Path, store, **kw):
    # one rank per node (LOCAL_WORLD_SIZE=1): two nodes, so that the model has a link between them (a cut
    # of a group over W is a link fault to the trace checker; one node has no link to fail)
    ranks = start_ranks(job_rank, WORLD, out, store=store, timeout_s=LAUNCH_S, env={"LOCAL_WORLD_SIZE": "1"}, **kw)
    with ranks:
        return ranks.wait()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The fault-free run, synchronous checkpoints (an independent path): every boundary's state."""
    out = tmp_path_factory.mktemp("async-ckpt") / "reference"
    run = _launch(out, host_store(), mode="sync", slow=False, defect=False, snap_every_step=True)
    return run.values()


#: how long the strike waits, once the save is slow, for a commit marker of that save to appear (none
#: should: it is not durable), so that a save marked durable too early is on disk when the rank dies
GRACE_S = 3.0


def _strike_when_slow(marker: Path) -> tuple[threading.Thread, list]:
    """A thread that SIGKILLs the process whose pid the marker holds, once it holds one and the save of
    SLOW_STEP was committed or :data:`GRACE_S` passed."""
    got: list = []
    committed = ck.step_dir(marker.parent / "ckpt", SLOW_STEP) / ck.MARKER

    def strike() -> None:
        deadline = time.monotonic() + LAUNCH_S
        while time.monotonic() < deadline:
            try:
                pid = int(marker.read_text())
            except (OSError, ValueError):
                time.sleep(0.01)
                continue
            grace = time.monotonic() + GRACE_S
            while time.monotonic() < grace and not committed.exists():
                time.sleep(0.01)
            try:
                inject.crash(pid)
                got.append(pid)
            except inject.InjectError as exc:
                got.append(exc)
            return
        got.append(TimeoutError(f"no save of step {SLOW_STEP} was ever slow ({marker} never written)"))

    t = threading.Thread(target=strike, daemon=True)
    t.start()
    return t, got


def _killed_during_an_async_save_then_restarted(out: Path, defect: bool):
    """Attempt 0 with the slow save of SLOW_STEP struck from outside, then attempt 1 on the same store:
    (attempt 0's run, the committed steps after it, attempt 1's run)."""
    store = host_store()
    t, got = _strike_when_slow(out / "slow-save")
    first = _launch(out, store, mode="async", slow=True, defect=defect, snap_every_step=False)
    t.join(timeout=10)
    assert got and isinstance(got[0], int), (got, first.explain())
    committed = ck.committed_steps(out / "ckpt", world=WORLD)
    second = _launch(out, store, mode="async", slow=False, defect=False, snap_every_step=False)
    return first, committed, second, got[0]


def _assert_resumed_from_the_last_durable_step(reference: list[dict], first, committed: list[int], second) -> None:
    codes = [first.codes[r] for r in range(WORLD)]
    assert -9 in codes, f"no rank was SIGKILLed: {first.explain()}"
    assert all(c == -9 or c in DOCUMENTED for c in codes), f"a survivor left without a documented code: {first.explain()}"
    # the save in flight at the death is not durable; the one before it (drained at the next boundary) is
    assert (ck.step_dir(first.out / "ckpt", SLOW_STEP)).is_dir(), "the slow save never started"
    assert committed and committed[-1] == SLOW_STEP - EVERY, f"committed {committed}: the last durable step"
    c = committed[-1]
    res = second.values()  # every rank of the restart finished (AssertionError with the explanation otherwise)
    for r in range(WORLD):
        assert res[r]["start"] == c, (r, res[r]["start"], c)
        assert res[r]["restored"] == {"next": c}, res[r]["restored"]
        assert res[r]["tag"] == c, "the model's own state object came back from the checkpoint"
        for when in (c, STEPS):
            a, b = reference[r]["snaps"][when], res[r]["snaps"][when]
            assert a.keys() == b.keys(), (r, when)
            differ = [k for k in a if not torch.equal(a[k], b[k])]
            assert not differ, f"rank {r}, step {when}: {differ} differ from the fault-free run"


@pytest.mark.timeout(300)
def test_an_l2_restart_after_a_death_during_an_async_save_resumes_from_the_last_durable_step(tmp_path, reference):
    first, committed, second, _pid = _killed_during_an_async_save_then_restarted(tmp_path / "run", defect=False)
    _assert_resumed_from_the_last_durable_step(reference, first, committed, second)


@pytest.mark.timeout(300)
def test_a_save_marked_durable_before_its_future_completes_is_caught(tmp_path, reference):
    """With the defect the marker of SLOW_STEP is on disk although its DCP write never finished: the
    restart resumes from it (or fails to load it), and the check above fails."""
    first, committed, second, _pid = _killed_during_an_async_save_then_restarted(tmp_path / "run", defect=True)
    assert SLOW_STEP in committed, f"the defect did not mark the save in flight durable: {committed}"
    with pytest.raises(AssertionError):
        _assert_resumed_from_the_last_durable_step(reference, first, committed, second)


def _cut_the_checkpoint_group(out: Path, store) -> tuple[threading.Thread, list]:
    """A thread that, once the save of SLOW_STEP is slow, shuts down every connection of the job's
    checkpoint group (its listening ports on both ranks, read off the job's store), then releases the
    slow save."""
    got: list = []

    def cut() -> None:
        try:
            deadline = time.monotonic() + LAUNCH_S
            while not (out / "slow-save").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no save of step {SLOW_STEP} was ever slow")
                time.sleep(0.01)
            pids = {r: int((out / f"pid-r{r}").read_text()) for r in range(WORLD)}
            # the groups over both ranks in creation order (accelpact.init: default, control, checkpoint, ...;
            # here R, the replicate group, spans both ranks too, so discover_groups numbers them all-i)
            groups = [g for g in discover_groups(store, pids, Topology(WORLD, 1), attempt=0)
                      if g.label in ("checkpoint", "all-2")]
            assert len(groups) == 1, f"the checkpoint group not found (or not one): {groups}"
            got.append(len(inject.cut_links(pids[0], any_ports=groups[0].ports)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            got.append(exc)
        finally:
            (out / "release").write_text("1")

    t = threading.Thread(target=cut, daemon=True)
    t.start()
    return t, got


@pytest.mark.timeout(300)
def test_a_checkpoint_group_cut_during_an_async_save_is_repaired_and_the_save_taken_again(tmp_path, reference):
    out = tmp_path / "cut"
    out.mkdir()
    store = host_store()
    client = dist_client(store)
    t, got = _cut_the_checkpoint_group(out, client)
    run = _launch(out, store, mode="async", slow=True, defect=False, snap_every_step=False, release=True)
    t.join(timeout=10)
    assert got and isinstance(got[0], int) and got[0] > 0, (got, run.explain())
    res = run.values()  # every rank finished: no exception out of run.boundary, no restart
    for r in range(WORLD):
        assert SLOW_STEP not in res[r]["saved"], f"rank {r}: the save in flight at the cut reads as committed"
        assert SLOW_STEP + 1 in res[r]["saved"], f"rank {r} saved {res[r]['saved']}: the lost save was not taken again"
        assert res[r]["repairs"] >= 1, f"rank {r}: the cut group was never repaired"
        a, b = reference[r]["snaps"][STEPS], res[r]["snaps"][STEPS]
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, f"rank {r}: {differ} differ from the fault-free run"
    committed = ck.committed_steps(out / "ckpt", world=WORLD)
    assert SLOW_STEP not in committed and SLOW_STEP + 1 in committed and STEPS in committed, committed
    observed = [x for r in range(WORLD) for x in run.trace(r) if x.get("action") == "RankObserve"]
    # the retake met the cut group: the observation of a failed group over W at the boundary (P18.4)
    assert any((x.get("detail") or {}).get("wide") and f"checkpoint step {SLOW_STEP + 1}" in str(x["detail"].get("error"))
               for x in observed), observed
    assert_trace_accepted(out)  # told nothing of the cut


def dist_client(store):
    """A second connection to the hosted ``store`` (the cut's thread reads the job's keys through it)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))


# ---------------------------------------------------------------------------------------------- in one process
def test_a_background_save_that_fails_withdraws_and_its_peers_waits_end(tmp_path) -> None:
    """Rank 1 acknowledged and waits; rank 0's background save fails (its DCP future raises): it
    withdraws the try, so rank 1's wait ends within a slice (SaveFailed: a peer withdrew it), rank 0's
    ``finish()`` raises the failure, nothing is committed and nothing is in flight any more."""
    import concurrent.futures

    import torch.distributed as dist

    store = dist.HashStore()
    mgrs = [ck.CheckpointManager(tmp_path, every=2, rank=r, world=2, store=store, commit_timeout_s=60, mode="async")
            for r in range(2)]
    folder = ck.step_dir(tmp_path, 2)
    folder.mkdir(parents=True)
    (folder / "rank1.pt").write_bytes(b"x")
    waited: list = []

    def rank1() -> None:
        try:
            mgrs[1]._acknowledge_and_commit(2, folder, 0, mgrs[1]._watch(2, 0, None))
            waited.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            waited.append(exc)

    t = threading.Thread(target=rank1, daemon=True)
    t.start()
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(RuntimeError("Connection closed by peer"))
    p = ck.PendingSave(step=2, tag=0, folder=folder, rank_file=b"r0", future=future, abandoned=mgrs[0]._watch(2, 0, None),
                       interrupt=None, t0=time.perf_counter(), staged_s=0.0)
    p.thread = threading.Thread(target=mgrs[0]._finish_in_background, args=(p,), daemon=True)
    mgrs[0].pending = p
    p.thread.start()
    with pytest.raises(ck.SaveFailed, match="a collective of the background save failed"):
        mgrs[0].finish()
    assert mgrs[0].pending is None
    t.join(timeout=10)
    assert waited and isinstance(waited[0], ck.SaveFailed) and "withdrew" in str(waited[0]), waited
    assert not (folder / ck.MARKER).exists() and not (folder / "rank0.pt").exists()
    assert mgrs[0].finish() is None  # nothing in flight


def test_a_checkpoint_mode_that_is_neither_sync_nor_async_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="mode='later'"):
        ck.CheckpointManager(tmp_path, every=2, rank=0, world=1, mode="later")


def test_attach_refuses_a_checkpoint_mode_it_does_not_know() -> None:
    """``attach(checkpoint=...)`` checks its argument before anything else (a bare job stands in: the check
    comes first)."""
    import types

    from accelpact.impl.launch.api import ApiError, Session

    with pytest.raises(ApiError, match="checkpoint='later': must be 'sync' or 'async'"):
        Session.attach(types.SimpleNamespace(training=None), checkpoint="later")  # type: ignore[arg-type]  # a stand-in job


# ---------------------------------------------------------------------------------------------- the demo
@pytest.mark.timeout(1500)
@pytest.mark.nightly("the demo's four paths with async checkpoints, every fault in the step after a due checkpoint (about "
                     "2 min): the death and the cut in flight with an async save in flight; the L2 death during an "
                     "async save and the cut of its group run every time above")
def test_the_demo_with_async_checkpoints_takes_a_save_an_episode_lost_again(tmp_path) -> None:
    """``accelpact demo --checkpoint async --fault-step 4`` (checkpoints every 2 steps): the save of step 4
    is in flight when each fault strikes in step 4.  Every path ends bit-identical (the demo's own
    judgement, against its fault-free reference); the swap (a SIGKILL in backward, a spare) and the
    discard (a link cut in backward) lost that save in their episode and took it again after the
    release, in the next generation, the spare included (the marker's ``tag``); every trace accepted."""
    import json
    import subprocess
    import sys

    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "demo", "--checkpoint", "async", "--fault-step", "4",
                           "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    for path in ("l1", "l2", "swap", "discard"):
        assert summary[path]["ok"], (path, summary[path])
        assert_trace_accepted(out / path)
    for path in ("swap", "discard"):
        ep = summary[path]["episodes"][0]
        assert (ep["point"], ep["frontier"]) == ("backward", 4), ep
        marker = json.loads((ck.step_dir(out / path / "ckpt", 4) / ck.MARKER).read_text())
        assert marker["tag"] == ep["generation"] + 1, (path, marker)


@pytest.mark.parametrize("argv", [["--block-steps", "3"], ["--every", "0"], ["--pad-s", "-1"]])
def test_the_checkpoint_benchmark_refuses_bad_flags_before_running_anything(argv, capsys) -> None:
    from accelpact.cli import main as cli_main

    assert cli_main(["bench", "checkpoint", *argv]) == 2
    assert "error" in capsys.readouterr().err
