"""A slow healthy step is not a failure (issue 40, part 5; part 4's checkpoint acknowledgements).

Every wait of a fault-free step (the commit's device drain, the checkpoint's acknowledgements, a
collective on a slow peer) is bounded by the collective timeout the user configures (default: torch's
NCCL default, 10 min: ``impl/deadlines.py`` ``DEFAULT_COLLECTIVE_TIMEOUT_S``) or ended by the failure
detector's verdict on a dead peer, never by the recovery's phase deadline (20 s).

* On gloo, real processes under torchrun, default settings: one rank 90 s late inside a step (a
  ``time.sleep`` in its forward, as an evaluation or a slow checkpoint would be) causes no episode and
  no restart, with and without ``rebuild=``, and each run's final state is ``torch.equal`` to an
  undelayed run's.  The three runs go concurrently (the late ones mostly sleep).
* The NCCL-semantics double of the commit's drain: a device backlog longer than the phase deadline,
  within the collective timeout, is committed; one past the collective timeout is not.
* The checkpoint acknowledgement wait makes O(1) store requests per rank (counted on a fake store),
  and still ends on ``abandoned()`` (SaveFailed) and on its bound (CheckpointError).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl import deadlines  # noqa: E402 - after the torch skip
from accelpact.impl.guard import BoundaryGuard  # noqa: E402 - after the torch skip
from accelpact.impl.launch.launch import ProcessSet, worker_env  # noqa: E402 - after the torch skip
from accelpact.impl.recovery import Pact  # noqa: E402 - after the torch skip
from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip
from accelpact.impl.runtime import backends  # noqa: E402 - after the torch skip
from accelpact.impl.runtime.checkpoint import CheckpointError, CheckpointManager, SaveFailed  # noqa: E402 - after the torch skip

WORLD = 4
STEPS = 5
LATE_S = 90.0
LATE_STEP = 3
LAUNCH_S = 330.0

#: A torchrun script as a user writes it (FSDP2 HSDP, 2 replicas, checkpoints every 2 steps), with
#: ``--late RANK:STEP:SECONDS:WHERE``: that rank sleeps inside that step, before its forward
#: (``forward``), between its backward and the optimizer step (``before-commit``) or after the
#: optimizer step (``after-commit``).
SCRIPT = '''\
import argparse, json, os, time
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
import accelpact

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--rebuild", action="store_true")
p.add_argument("--late", default="-1:-1:0:forward")
args = p.parse_args()
torch.set_num_threads(1)
late_rank, late_step, late_s, late_at = args.late.split(":")
late_rank, late_step, late_s = int(late_rank), int(late_step), float(late_s)


def build(job, extra):
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2)]
    model = nn.Sequential(*blocks, nn.Linear(16, 1)).to(job.device)
    for block in model:
        fully_shard(block, mesh=job.mesh)
    fully_shard(model, mesh=job.mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)


job = accelpact.init(replicas=2, trace_dir=args.out)
if args.rebuild:
    run = job.attach(rebuild=build, checkpoint_dir=f"{args.out}/ckpt", checkpoint_every=2)
else:
    model, optim = build(job, None)
    run = job.attach(model, optim, checkpoint_dir=f"{args.out}/ckpt", checkpoint_every=2)
late_for = 0.0


def late(step, where):
    global late_for
    if job.rank == late_rank and step == late_step and where == late_at:
        t = time.monotonic()
        time.sleep(late_s)  # alive and busy: an evaluation, a checkpoint to a slow disk
        late_for = time.monotonic() - t


for step in run.steps(args.steps):
    g = torch.Generator().manual_seed(1000 * step + job.rank)
    x = torch.randn(8, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    with run.step(step):
        late(step, "forward")
        loss = nn.functional.mse_loss(run.module(x), y)
        loss.backward()
        late(step, "before-commit")  # its peers wait in the commit fence (with rebuild=)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        late(step, "after-commit")  # its peers wait in the failure flag, and their detectors see it behind
    if run.discarded:
        continue
    run.boundary(loss.detach())


def local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


final = {f"param.{n}": local(q) for n, q in run.module.named_parameters()}
final.update({f"optim.{i}.{k}": local(v) for i, s in run.optimizer.state_dict()["state"].items() for k, v in s.items()
              if torch.is_tensor(v)})
torch.save(final, f"{args.out}/final-r{job.rank}.pt")
with open(f"{args.out}/summary-r{job.rank}.json", "w") as f:
    json.dump({"repairs": len(run.reports), "swaps": len(run.swaps), "frontier": run.frontier, "late_for": late_for,
               "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
               "collective_timeout_s": job.settings.collective_timeout_s}, f)
job.close()
'''

#: what an episode leaves in a trace (any one of them: the slow step was taken for a failure)
EPISODE_ACTIONS = {"RankObserve", "RankSuspect", "RankExpire", "RankDiscardStep", "RankArrive", "RankReject", "RankExit"}


def _launch(ps: ProcessSet, script: Path, out: Path, *extra: str) -> None:
    """torchrun (``--max-restarts 1``: a restart would show, not fail the launch) with the default
    settings: every ``ACCELPACT_*`` variable removed, but the detector's silence bound (as
    tests/test_examples.py: 12 ranks on 2 shared cores can be descheduled past its 0.8 s default; a
    sleeping rank's heartbeat goes on either way)."""
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           "--max-restarts", "1", "--monitor-interval", "0.1", str(script), "--out", str(out),
           "--steps", str(STEPS), *extra]
    env = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    env["ACCELPACT_DEAD_AFTER_S"] = "5"
    ps.start(cmd, env=env, stdout=open(out / "agent.log", "wb"), cwd=out)  # noqa: SIM115 - closed with the process


def _check_no_episode(out: Path, code: int | None, reference: Path) -> None:
    log = (out / "agent.log").read_text(errors="replace")
    assert code == 0, f"{out.name}: torchrun exited {code}\n{log[-4000:]}"
    run = RunDir(out)
    assert sorted(run.trace_files()) == [(0, r) for r in range(WORLD)], f"{out.name}: a restart: {sorted(run.trace_files())}"
    for r in range(WORLD):
        acts = {x.get("action") for x in run.records(0, r) if x.get("type") == "action"}
        assert not acts & EPISODE_ACTIONS, f"{out.name}, rank {r}: the slow step was taken for a failure: {sorted(acts)}"
        s = json.loads((out / f"summary-r{r}.json").read_text())
        assert (s["repairs"], s["swaps"], s["restart"], s["frontier"]) == (0, 0, 0, STEPS), (out.name, r, s)
        assert s["collective_timeout_s"] == deadlines.DEFAULT_COLLECTIVE_TIMEOUT_S, s
        a, b = torch.load(RunDir(reference).final(r)), torch.load(run.final(r))
        assert a.keys() == b.keys()
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, f"{out.name}, rank {r}: {len(differ)} tensors differ from the undelayed run, e.g. {differ[:3]}"
    late = json.loads((out / "summary-r1.json").read_text())["late_for"]
    assert late >= LATE_S, f"{out.name}: rank 1 was late {late:.1f} s only"


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.nightly("a rank 90 s late under torchrun: about 2 minutes of wall time for four concurrent jobs; every "
                     "make test runs the commit's drain bound and the checkpoint acknowledgement wait of this file in-process")
@pytest.mark.timeout(480)
def test_a_rank_90_s_late_inside_a_step_is_no_failure_with_and_without_rebuild(tmp_path):
    """Late before its forward (its peers wait in the shard group's collectives), between backward and
    the optimizer step with ``rebuild=`` (they wait in the commit fence, on the control group) and
    after the optimizer step without it (they wait in the failure flag, and their detectors see the
    late rank's progress behind theirs)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    runs = {"late-forward": (), "late-before-commit-rebuild": ("--rebuild",), "late-after-commit": ()}
    with ProcessSet() as ps:
        _launch(ps, script, tmp_path / "reference")
        for name, extra in runs.items():
            where = name.removeprefix("late-").removesuffix("-rebuild")
            _launch(ps, script, tmp_path / name, "--late", f"1:{LATE_STEP}:{LATE_S}:{where}", *extra)
        timed_out = ps.wait(LAUNCH_S)
        codes = ps.codes
    assert not timed_out, f"still running after {LAUNCH_S} s: {codes}"
    ref_log = (tmp_path / "reference" / "agent.log").read_text(errors="replace")
    assert codes[0] == 0, f"the undelayed run exited {codes[0]}\n{ref_log[-4000:]}"
    for i, name in enumerate(runs, start=1):
        _check_no_episode(tmp_path / name, codes[i], tmp_path / "reference")


# ---- the commit's device drain, over the NCCL-semantics double --------------------------------------------------------

class _Backlog:
    """A device whose current stream holds ``backlog_s`` of queued kernels from the moment it is built: what
    ``Backend.drain`` sees on a GPU (an event recorded now completes when the backlog does); its drain
    waits like the real one, up to its bound, and says whether the event completed."""

    def __init__(self, backlog_s: float) -> None:
        self.done_at = time.monotonic() + backlog_s
        self.asked: list[float] = []

    def drain(self, device, timeout_s: float) -> bool:
        self.asked.append(timeout_s)
        time.sleep(max(0.0, min(self.done_at, time.monotonic() + timeout_s) - time.monotonic()))
        return time.monotonic() >= self.done_at


def _commit(monkeypatch, backlog_s: float, *, deadline_s: float, collective_timeout_s: float | None):
    """``Pact._before_commit`` (NCCL: drain, then judge the groups) with the guard the engine builds:
    ``sync_timeout_s`` the phase deadline, ``commit_drain_s`` R's collective timeout."""
    dev = _Backlog(backlog_s)
    monkeypatch.setattr(backends, "for_device", lambda device: dev)
    m = torch.nn.Linear(2, 2, device="meta")
    guard = BoundaryGuard(m, torch.optim.SGD(m.parameters(), lr=0.1), sync_timeout_s=deadline_s,
                          commit_drain_s=collective_timeout_s)
    fake = types.SimpleNamespace(guard=guard, discard=False, gen=0, group_records=lambda: {})
    try:
        Pact._before_commit(fake)
        return None, dev
    except backends.AbortedCommunicator as exc:
        return exc, dev
    finally:
        guard.remove()


def test_a_device_backlog_longer_than_the_phase_deadline_is_committed(monkeypatch):
    """Scaled: phase deadline 0.3 s, collective timeout 3 s.  A 1 s backlog (over three phase deadlines)
    drains and commits; the wait's bound is the collective timeout, not the phase deadline."""
    err, dev = _commit(monkeypatch, 1.0, deadline_s=0.3, collective_timeout_s=3.0)
    assert err is None, f"a long healthy backlog was judged a failure: {err}"
    assert dev.asked == [3.0]


def test_a_device_backlog_past_the_collective_timeout_is_not_committed(monkeypatch):
    t0 = time.monotonic()
    err, dev = _commit(monkeypatch, 5.0, deadline_s=0.3, collective_timeout_s=1.0)
    assert isinstance(err, backends.AbortedCommunicator) and "did not finish within 1.0 s" in str(err), err
    assert 0.9 <= time.monotonic() - t0 < 3.0


def test_the_commit_drain_defaults_to_the_collective_timeout_and_phase_two_keeps_the_phase_deadline(monkeypatch):
    """Without ``commit_drain_s`` the commit drains for torch's NCCL default (600 s), never 20 s; the
    guard check of an episode (phase 2) is still bounded by its phase deadline."""
    dev = _Backlog(0.0)
    monkeypatch.setattr(backends, "for_device", lambda device: dev)
    m = torch.nn.Linear(2, 2, device="meta")
    guard = BoundaryGuard(m, torch.optim.SGD(m.parameters(), lr=0.1), sync_timeout_s=deadlines.DEFAULT_DEADLINE_S)
    assert guard.commit_drain_s == deadlines.DEFAULT_COLLECTIVE_TIMEOUT_S == 600.0
    assert guard.undrained() == [] and guard.check().ok
    assert dev.asked == [600.0, deadlines.DEFAULT_DEADLINE_S]
    guard.remove()


def test_the_default_collective_timeout_is_torchs_nccl_default():
    from datetime import timedelta

    from torch.distributed import constants

    from accelpact.impl.launch.api import Settings
    from accelpact.impl.launch.job import Job

    if constants.default_pg_nccl_timeout is not None:  # None on a CPU-only build (no NCCL compiled in)
        assert constants.default_pg_nccl_timeout == timedelta(seconds=deadlines.DEFAULT_COLLECTIVE_TIMEOUT_S)
    fields = {f.name: f.default for f in Job.__dataclass_fields__.values()}
    assert Settings().collective_timeout_s == fields["collective_timeout_s"] == deadlines.DEFAULT_COLLECTIVE_TIMEOUT_S
    # the step deadline still outlasts one collective and six phase waits
    assert deadlines.default_step_deadline(600.0, 20.0) == 720.0


# ---- the checkpoint acknowledgement wait -------------------------------------------------------------------------------

class CountingStore:
    """An in-process store for W ranks' threads (``add``, ``set``, ``check``, ``wait``), counting each rank's requests."""

    def __init__(self) -> None:
        self.values: dict[str, int | bytes] = {}
        self.cond = threading.Condition()
        self.ops: dict[str, int] = {}

    def _count(self, op: str) -> None:
        name = threading.current_thread().name
        self.ops[name] = self.ops.get(name, 0) + 1
        self.ops[op] = self.ops.get(op, 0) + 1

    def add(self, key: str, n: int) -> int:
        with self.cond:
            self._count("add")
            self.values[key] = int(self.values.get(key, 0)) + n
            self.cond.notify_all()
            return int(self.values[key])

    def set(self, key: str, value) -> None:
        with self.cond:
            self._count("set")
            self.values[key] = value.encode() if isinstance(value, str) else value
            self.cond.notify_all()

    def check(self, keys) -> bool:
        with self.cond:
            self._count("check")
            return all(k in self.values for k in keys)

    def wait(self, keys, timeout=None) -> None:
        with self.cond:
            self._count("wait")
            limit = None if timeout is None else timeout.total_seconds()
            if not self.cond.wait_for(lambda: all(k in self.values for k in keys), limit):
                raise RuntimeError("Wait timeout")


def _acks(tmp_path: Path, world: int, store: CountingStore, *, late: dict[int, float] | None = None,
          never: tuple[int, ...] = (), abandoned=None, commit_timeout_s: float | None = None) -> dict[int, BaseException | None]:
    """Ranks as threads acknowledging step 2 (``late``: after that many seconds; ``never``: not at all)."""
    folder = tmp_path / "step-2"
    folder.mkdir(exist_ok=True)
    results: dict[int, BaseException | None] = {}

    def rank(r: int) -> None:
        mgr = CheckpointManager(tmp_path, every=2, rank=r, world=world, store=store, commit_timeout_s=commit_timeout_s)
        time.sleep((late or {}).get(r, 0.0))
        (folder / f"rank{r}.pt").write_bytes(b"x")
        try:
            mgr._acknowledge_and_commit(2, folder, 0, abandoned)
            results[r] = None
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}", daemon=True) for r in range(world) if r not in never]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_the_acknowledgement_wait_costs_o1_store_requests_per_rank(tmp_path):
    """64 ranks, every one acknowledging at once: at most 2 requests per rank (its ``add``, then its
    ``wait``, or the last one's ``set``), whatever the world; the old wait polled ``add(key, 0)``
    every 5 ms on every rank."""
    store = CountingStore()
    results = _acks(tmp_path, 64, store)
    assert all(v is None for v in results.values()), results
    per_rank = [store.ops[f"rank{r}"] for r in range(64)]
    assert max(per_rank) <= 2, per_rank
    assert store.ops["set"] == 1 and store.ops["add"] == 64
    assert (tmp_path / "step-2" / "COMMITTED").exists()


def test_a_slow_rank_is_waited_for_with_a_request_per_slice(tmp_path):
    """One rank 2.5 s late: its peers wait (the bound is the collective timeout, not a phase deadline),
    each with one ``wait`` and one ``abandoned()`` per slice of ``ACK_SLICE_S`` (1 s)."""
    store = CountingStore()
    asked = []
    results = _acks(tmp_path, 4, store, late={3: 2.5}, abandoned=lambda: asked.append(1) or False)
    assert all(v is None for v in results.values()), results
    assert max(store.ops[f"rank{r}"] for r in range(3)) <= 5, store.ops
    assert len(asked) <= 3 * 3, asked
    assert (tmp_path / "step-2" / "COMMITTED").exists()


def test_an_abandoned_save_and_the_bound_still_end_the_wait(tmp_path):
    """A rank that never acknowledges: ``abandoned()`` turning True ends the others' waits within a
    slice (SaveFailed, with the count); without it the bound does (CheckpointError); nothing is committed."""
    t0 = time.monotonic()
    results = _acks(tmp_path, 3, CountingStore(), never=(2,), abandoned=lambda: time.monotonic() - t0 > 0.5)
    for r in (0, 1):
        assert isinstance(results[r], SaveFailed) and "abandoned at 2/3 acknowledgements" in str(results[r]), results
    assert time.monotonic() - t0 < 3.0
    results = _acks(tmp_path, 3, CountingStore(), never=(2,), commit_timeout_s=1.5)
    for r in (0, 1):
        assert isinstance(results[r], CheckpointError), results
        assert "only 2/3 ranks acknowledged within 1.5s" in str(results[r]), results
    assert not (tmp_path / "step-2" / "COMMITTED").exists()


def test_the_acknowledgement_bound_defaults_to_the_collective_timeout(tmp_path):
    assert CheckpointManager(tmp_path, every=1, rank=0, world=2, store=CountingStore()).commit_timeout_s == \
        deadlines.DEFAULT_COLLECTIVE_TIMEOUT_S
