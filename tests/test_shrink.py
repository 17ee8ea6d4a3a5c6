"""Shrink and grow (issue 41): no restart while a replica lives.

Unit tests (one process, fakes around the real effects and a real TCPStore): the decision (a death
with no spare in a job that opted in shrinks; without the opt-in, or inside the optimizer step, it is
L2; with a spare it is a swap), the single assignments every rank reads, the control plane over the
active ranks, the micro-batch accounting against torch's own full-batch gradient.

End to end (real torchrun, gloo CPU, ``tests/shrink_app.py``, a public-API DDP or FSDP2 HSDP script):
every run, a requested shrink against a single-process torch reference, and a grow back to three
replicas by an idle spare (10-50 s each on 2 cores); nightly, a SIGKILL from outside with no spare (DDP
and HSDP) against the same script's fault-free run with the same shrink requested at the same frontier
(torch.equal) and the uninterrupted run (a stated tolerance), HSDP's grow by two spares, and HSDP's
death, bench and recall with a spare the keepers refilled.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.conformance.cli_check import check_dir  # noqa: E402 - after the torch skip
from accelpact.impl import shrink  # noqa: E402 - after the torch skip
from accelpact.impl.effects import Effects  # noqa: E402 - after the torch skip
from accelpact.impl.episode import Done, Episode, Left, SwapFacts  # noqa: E402 - after the torch skip
from accelpact.impl.launch.job import Topology  # noqa: E402 - after the torch skip
from accelpact.impl.launch.launch import ProcessSet, worker_env  # noqa: E402 - after the torch skip
from accelpact.impl.launch.training import Training  # noqa: E402 - after the torch skip
from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip
from accelpact.impl.runtime import hotswap  # noqa: E402 - after the torch skip
from accelpact.model.batches import loss_weight, share  # noqa: E402 - after the torch skip
from accelpact.model.contract import DEFAULT_OBJECTIVE, DEFAULT_PLATFORM, ObservationKey, default_envelope  # noqa: E402 - after the torch skip

APP = Path(__file__).with_name("shrink_app.py")
TIMEOUT_S = 240.0
#: the largest relative difference (over all parameters, ||a - b|| / ||b||) between a run that shrank
#: (and grew) and the uninterrupted run or torch's single-process training: the same micro-batches,
#: summed in another order (measured on gloo CPU: 1.7e-6 to 2.1e-5)
TOLERANCE = 1e-4


def _store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))


# ------------------------------------------------------------------------------------- the decision
class _Rejected(Exception):
    pass


class _Engine(Effects):
    """The real effects; F fixed (a fake engine has no guard)."""

    frontier = 3
    tau = 3


def _engine(store, rank: int, topo: Topology, kind: str, *, opted: bool, spares: int = 0, active=None):
    """An engine of the real ``Effects`` around a fake job: its records are kept, its rejection raises."""
    eng = _Engine.__new__(_Engine)
    eng.rank = rank
    eng.control = shrink.ActiveControlPlane(store, rank, topo.world, members=active)
    eng.envelope = default_envelope()
    eng.key = ObservationKey(DEFAULT_PLATFORM, "ddp" if kind == "world" else "fsdp2-hybrid", "boundary", DEFAULT_OBJECTIVE)
    eng.groups = types.SimpleNamespace(name=kind)
    eng.gen, eng.pc, eng.deadline_s = 0, "observed", 5.0
    eng.hooks = types.SimpleNamespace(written=lambda: None)
    eng.records = []
    eng._record = lambda action, enters, done: eng.records.append((action, done))

    def reject(why, guard=()):
        raise _Rejected(why)

    eng._reject = reject
    from accelpact.impl.runtime.groups import JobGroups

    groups = JobGroups(topo, "gloo", None, store, 1.0, 1.0, 1.0, active=tuple(active) if active is not None else None)
    job = types.SimpleNamespace(topology=topo, spares=spares, groups=groups, _micro_batches=6 if opted else None, rank=rank)
    return eng, job


def _episode(job, dead, point="backward", mode=""):
    sw = SwapFacts(role="survivor", point=point, dead=tuple(dead), job=job, rebuild=None, extra=None, rng=None, mode=mode)
    return Episode(0, True, (0,), 0, 0, None, swap=sw)


def test_a_death_with_no_spare_shrinks_a_job_that_opted_in():
    """DDP, 3 ranks, rank 1 dead in backward, no spare: its replica (rank 1) leaves; g+1 holds 0 and 2;
    the control plane counts them only; nothing is claimed (no RankClaimSpare record)."""
    store = _store()
    eng, job = _engine(store, 0, Topology(1, 3), "world", opted=True)
    ep = _episode(job, (1,))
    assert Effects._claim_spares(eng, ep) is None
    assert [a for a, _ in eng.records] == ["RankShrink"]  # the one write of the replica out, nothing claimed
    eng2, job2 = _engine(store, 2, Topology(1, 3), "world", opted=True)
    assert Effects._claim_spares(eng2, _episode(job2, (1,))) is None and not eng2.records
    sw = ep.swap
    assert (sw.mode, sw.dead, sw.active, sw.decision) == ("shrink", (1,), (0, 2), "L1")
    assert eng.control.members == (0, 2)
    assert shrink.read_active(store, 0) == (0, 2)  # what a spare joining this episode would build over


def test_without_the_opt_in_or_in_the_optimizer_step_a_death_with_no_spare_is_l2():
    store = _store()
    eng, job = _engine(store, 0, Topology(1, 3), "world", opted=False)
    with pytest.raises(_Rejected, match="spare"):
        Effects._claim_spares(eng, _episode(job, (1,)))
    eng, job = _engine(store, 0, Topology(1, 3), "world", opted=True)
    with pytest.raises(_Rejected):
        Effects._claim_spares(eng, _episode(job, (2,), point="optimizer"))


def test_with_a_spare_idle_a_death_is_still_a_swap():
    store = _store()
    eng, job = _engine(store, 0, Topology(1, 3), "world", opted=True, spares=1)
    ep = _episode(job, (1,))
    done = Effects._claim_spares(eng, ep)
    assert isinstance(done, Done) and done.detail["claims"] == {1: 0} and ep.swap.mode == ""
    assert ep.swap.active is None and eng.control.members == (0, 1, 2)


def test_hsdp_the_dead_ranks_whole_replica_leaves_and_its_survivor_records_rank_leave():
    """HSDP 2 replicas x 2 shards: rank 1 dead; replica 0 (ranks 0, 1) leaves: rank 0, alive, records
    RankLeave and leaves the episode (Left); rank 2 goes on with ranks 2 and 3."""
    store = _store()
    topo = Topology(2, 2)
    eng, job = _engine(store, 0, topo, "replicate", opted=True)
    with pytest.raises(Left):
        Effects._claim_spares(eng, _episode(job, (1,)))
    assert [a for a, _ in eng.records] == ["RankShrink", "RankLeave"]
    eng2, job2 = _engine(store, 2, topo, "replicate", opted=True)
    ep = _episode(job2, (1,))
    assert Effects._claim_spares(eng2, ep) is None
    assert (ep.swap.dead, ep.swap.active) == ((0, 1), (2, 3))
    # with both shards of one index dead no replica holds that shard: L2
    eng3, job3 = _engine(store, 1, topo, "replicate", opted=True)
    store2 = _store()
    eng3.control = shrink.ActiveControlPlane(store2, 1, 4)
    with pytest.raises(_Rejected):
        Effects._claim_spares(eng3, _episode(job3, (0, 2)))


def test_a_grow_claims_the_benched_holder_and_a_spare_and_publishes_each_identitys_state_at_f():
    """HSDP 2x2 shrunk to replica 1 (ranks 2, 3 active); rank 0 idles on the bench, spare 0 in the pool:
    the grow's claims give identity 0 back to its benched holder (``-1``: recalled) and identity 1 to
    spare 0; the first claimer publishes each identity's state at F (what the recalled rank and the
    spare arrive with); a second survivor's claims stand as the first's and record nothing."""
    store = _store()
    topo = Topology(2, 2)
    shrink.bench(store, 0)
    assert shrink.benched_idle(store, 0) and not shrink.benched_idle(store, 1)
    eng, job = _engine(store, 2, topo, "replicate", opted=True, spares=1, active=(2, 3))
    ep = _episode(job, (0, 1), point="boundary", mode="grow")
    ep.swap.extra = {"cursor": 7}
    done = Effects._claim_spares(eng, ep)
    assert done.detail["claims"] == {0: -1, 1: 0} and done.detail["grow"] is True
    assert ep.swap.active is None and eng.control.members == (0, 1, 2, 3)
    assert store.get(shrink.bench_key(0)).decode() == "recalled:0:boundary"
    assert hotswap.wait_for_claim(store, 0, "accelpact/abort", timeout_s=1) == (1, 0, "boundary")
    for d in (0, 1):
        st = hotswap.read_state(store, d)
        assert st["frontier"] == 3 and st["extra"] == {"cursor": 7}
    eng2, job2 = _engine(store, 3, topo, "replicate", opted=True, spares=1, active=(2, 3))
    assert Effects._claim_spares(eng2, _episode(job2, (0, 1), point="boundary", mode="grow")) is None
    assert [hotswap.claim_read(store, 0, d, 1) for d in (0, 1)] == [-1, 0]
    assert shrink.wait_recall(store, 0, "accelpact/abort", 1) == (0, "boundary")
    # a recall stands; a benched rank that died idle (its notice) can no longer be claimed
    shrink.bench_gone(store, 0)
    assert store.get(shrink.bench_key(0)).decode() == "recalled:0:boundary"
    shrink.bench(store, 2)
    shrink.bench_gone(store, 2)
    assert not shrink.benched_idle(store, 2)


def test_every_survivor_shrinks_by_the_set_that_stands():
    """Two survivors whose notices named different dead sets (a second death noticed late) leave out
    the same ranks: the first decision stands (single assignment)."""
    store = _store()
    assert shrink.shrink_decision(store, 3, [2]) == ((2,), True)
    assert shrink.shrink_decision(store, 3, [1, 2]) == ((2,), False)
    assert shrink.shrink_decision(store, 4, [2, 1]) == ((1, 2), True)
    assert shrink.grow_decision(store, 1, 5, True) is True
    assert shrink.grow_decision(store, 1, 5, False) is True  # the first rank's view stands
    assert shrink.grow_decision(store, 1, 6, False) is False
    assert shrink.grow_decision(store, 1, 6, True) is False


def test_the_control_plane_of_a_shrunk_job_counts_its_active_ranks():
    store = _store()
    planes = {r: shrink.ActiveControlPlane(store, r, 3, members=(0, 2)) for r in (0, 2)}
    assert planes[2].arrive(5, 7) == (1, False)
    assert planes[0].arrive(5, 7) == (2, True)
    assert planes[0].decide_agreement(5) == "commit" and planes[0].arrived(5) == {0, 2}
    assert planes[0].release_quorum() == 2
    planes[2].arrive(6, 7)
    planes[0].arrive(6, 8)
    assert planes[0].decide_agreement(6).startswith("abort")


def test_a_notice_of_a_rank_out_of_training_revokes_nothing():
    """A shrunk job's watcher: the death of a rank that left (its process ends outside the job) closes
    no socket; a training rank's does."""
    from accelpact.impl.launch.keeper import post_death

    store = _store()
    closed = []
    w = hotswap.SwapWatcher(store, lambda: closed.append(1) or [], seen=0, slice_s=0.01, relevant={0, 2}.__contains__)
    post_death(store, 1)
    post_death(store, 2)
    w.start()
    deadline = time.monotonic() + 10
    while w.next < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert w.next == 3 and len(closed) == 1, (w.next, closed)


def test_shrink_at_is_parsed_and_checked():
    assert shrink.parse_shrink_at("4:1") == (4, 1) and shrink.parse_shrink_at((2, 0)) == (2, 0)
    assert shrink.parse_shrink_at("") is None
    for bad in ("4", "a:1", "-1:0", "1:2:3"):
        with pytest.raises(shrink.ShrinkError, match="STEP"):
            shrink.parse_shrink_at(bad)


def test_attach_opt_in_is_checked():
    from accelpact.impl.launch.api import ApiError, Session

    s = types.SimpleNamespace(world=4, replicas=2, _micro_batches=None, _shrink_at=None)
    with pytest.raises(ApiError, match="rebuild"):
        Session._opt_in(s, 4, None, None)
    with pytest.raises(ApiError, match="fewer"):
        Session._opt_in(s, 1, None, lambda j, e: None)
    with pytest.raises(ApiError, match="micro_batches"):
        Session._opt_in(s, None, "2:1", None)
    Session._opt_in(s, 4, "3:1", lambda j, e: None)
    assert (s._micro_batches, s._shrink_at) == (4, (3, 1))


# ------------------------------------------------------------------------------------- micro-batches
def _training(topo: Topology, rank: int, active, total: int) -> Training:
    from accelpact.impl.runtime.groups import JobGroups

    groups = JobGroups(topo, "gloo", None, None, 1.0, 1.0, 1.0, active=active)
    job = types.SimpleNamespace(topology=topo, rank=rank, groups=groups, _micro_batches=total)
    return Training(job=job, pact=None, checkpoints=None, start_step=0, resumed_from=None, restored_extra=None,
                    extra_state=None, wrapper="ddp")


@pytest.mark.parametrize("active", [None, (0, 2), (1,)])
def test_every_micro_batch_of_a_step_is_processed_once_by_the_active_replicas(active):
    topo, total = Topology(1, 3), 7
    ranks = active if active is not None else (0, 1, 2)
    shares = [_training(topo, r, active, total).micro_batches(5) for r in ranks]
    seen = [m for s in shares for m in s]
    assert sorted(seen) == list(range(total))
    assert all(_training(topo, r, active, total).loss_weight == len(ranks) / total for r in ranks)


def test_the_weighted_accumulated_gradient_averaged_over_replicas_is_the_full_batch_mean():
    """The reduced gradient of a step (each replica: its share, loss x loss_weight, accumulated; the
    wrapper's average over the active replicas) equals torch's gradient of the mean loss over all of
    the step's micro-batches, for 3 replicas and after a shrink to 2."""
    torch.manual_seed(0)
    total = 6
    xs, ys = torch.randn(total, 4, 5), torch.randn(total, 4, 2)
    model = torch.nn.Linear(5, 2)
    full = torch.stack([torch.nn.functional.mse_loss(model(xs[m]), ys[m]) for m in range(total)]).mean()
    want = torch.autograd.grad(full, list(model.parameters()))
    for active in ((0, 1, 2), (0, 2)):
        grads = []
        for r in active:
            model.zero_grad()
            for m in share(r, active, total):
                (torch.nn.functional.mse_loss(model(xs[m]), ys[m]) * loss_weight(active, total)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        reduced = [torch.stack(g).mean(0) for g in zip(*grads, strict=True)]
        for a, b in zip(reduced, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------- end to end
def _torchrun(out: Path, nproc: int, *extra: str, spares: int = 0, strike=None, refill: bool = False,
              max_restarts: int = 0) -> str:
    """``tests/shrink_app.py`` under torchrun behind the keeper (``ACCELPACT_KEEP=1``: a death is posted
    without spares too), ``max_restarts`` restarts allowed (0: an L2 ends the run non-zero).
    ``strike(out)``: run on a thread while the job runs (a fault from outside).  ``refill``: the keepers
    start a spare in a dead worker's place (``ACCELPACT_REFILL``).  The agent's output."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", "-m", "accelpact.impl.launch.keeper", "--",
           sys.executable, str(APP), "--out", str(out), *extra]
    env = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    env.update(ACCELPACT_KEEP="1", ACCELPACT_SPARES=str(spares), ACCELPACT_REFILL="1" if refill else "0",
               ACCELPACT_DEAD_AFTER_S="5",
               TORCH_CPP_LOG_LEVEL="ERROR")
    log = out / "agent.log"
    got: list = []
    with ProcessSet() as ps, open(log, "wb") as f:
        ps.start(cmd, env=env, stdout=f)
        t = None
        if strike is not None:
            t = threading.Thread(target=lambda: got.append(_guard(strike, out)), daemon=True)
            t.start()
        timed_out = ps.wait(TIMEOUT_S)
        codes = ps.codes
        if t is not None:
            t.join(timeout=30)
    text = log.read_text(errors="replace")
    assert not timed_out, f"still running after {TIMEOUT_S}s\n{text[-4000:]}"
    assert codes == [0], f"the agent exited {codes} (a restart, or a failure)\n{text[-4000:]}"
    if strike is not None:
        assert got and got[0] is True, f"the fault was not made: {got}"
    return text


def _guard(fn, out):
    try:
        return fn(out)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        return exc


def _steps(out: Path, rank: int) -> list[dict]:
    f = out / f"steps-r{rank}.ndjson"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def _final(out: Path, rank: int) -> dict:
    return torch.load(RunDir(out).final(rank))


def _relative(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every parameter (the optimizer's state left out)."""
    keys = [k for k in b if k.startswith("param.")]
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys)
    den = sum(float(b[k].double().pow(2).sum()) for k in keys)
    return (num / den) ** 0.5


def _reference(steps: int, total: int) -> dict:
    """The same training in one process, no DDP: each step the mean loss over its ``total``
    micro-batches (torch's own gradient), AdamW: an independent source of the expected state."""
    from accelpact.impl.launch import workload
    from accelpact.testing.reference import mean_over_micro_batches

    spec = workload.WorkloadSpec(wrapper="ddp", layers=2, dim=32, heads=2, seq=16, batch=2, lr=1e-3, seed=0)
    params, _ = mean_over_micro_batches(spec, steps, total)
    return {f"param.module.{n}": p for n, p in params.items()}


def _trace_actions(out: Path, rank: int, attempt: int = 0, spare: int | None = None) -> list[dict]:
    run = RunDir(out)
    f = run.trace(attempt, rank) if spare is None else run.spare_trace(spare, attempt, rank)
    return [r for r in map(json.loads, f.read_text().splitlines()) if r.get("type") == "action"]


def _accepted_told_nothing(out: Path) -> None:
    """``accelpact check-trace OUT`` (``cli_check.check_dir``, told nothing: the configuration from the
    trace headers, the SIGKILL from outside unlogged) accepts every attempt of the run."""
    ok, msg = check_dir(out)
    assert ok and msg.startswith("attempt 0: accepted"), msg


def _outside_the_model(out: Path) -> None:
    """``accelpact check-trace OUT`` rejects a run with a requested shrink by name: the model has no
    action for a replica asked to leave with nobody dead (spec/trace-checking.md T5)."""
    ok, msg = check_dir(out)
    assert not ok and "rejected: outside the model: a requested shrink" in msg, msg


STEPS, TOTAL = 6, 6


def test_a_requested_shrink_keeps_the_global_batch(tmp_path):
    """3 DDP ranks, 6 micro-batches a step, replica 1 asked to leave at F = 2: ranks 0 and 2 go on
    with shares {0, 2, 4} and {1, 3, 5} (each micro-batch once), record them in RankResume, stay
    identical, and end within TOLERANCE of torch's single-process training on the same micro-batches."""
    out = tmp_path / "req"
    _torchrun(out, 3, "--steps", str(STEPS), "--micro-batches", str(TOTAL), "--shrink-at", "2:1")
    assert [s["active"] for s in _steps(out, 0)] == [[0, 1, 2]] * 2 + [[0, 2]] * (STEPS - 2)
    assert [s["share"] for s in _steps(out, 2)][2:] == [[1, 3, 5]] * (STEPS - 2)
    assert not RunDir(out).final(1).exists(), "the replica that left kept training"
    leave = [a for a in _trace_actions(out, 1) if a["action"] == "RankLeave"]
    assert leave and leave[0]["state"]["frontier"] == 2
    resume = [a for a in _trace_actions(out, 2) if a["action"] == "RankResume"]
    assert resume[-1]["state"]["share"] == [1, 3, 5] and resume[-1]["state"]["active"] == [0, 2]
    a, b = _final(out, 0), _final(out, 2)
    assert all(torch.equal(a[k], b[k]) for k in a), "the replicas differ"
    rel = _relative(a, _reference(STEPS, TOTAL))
    print(f"requested shrink vs single-process reference: relative difference {rel:.3g}")
    assert rel < TOLERANCE
    _outside_the_model(out)


def _kill_rank(rank: int, after: int, *more: int):
    """SIGKILL ``rank``'s worker (not its keeper), and the workers of ``more`` with it, from outside
    once ``rank`` committed ``after`` steps."""
    from accelpact.testing.examples import worker_pid

    def strike(out: Path) -> bool:
        deadline = time.monotonic() + TIMEOUT_S / 2
        while time.monotonic() < deadline:
            if len(_steps(out, rank)) >= after:
                pids = [worker_pid(APP.name, r) for r in (rank, *more)]
                if None not in pids:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    return True
            time.sleep(0.01)
        return False

    return strike


#: (wrapper flags, training ranks, micro-batches, the rank killed, its replica, the ranks that go on)
LAYOUTS = {
    "ddp": ((), 3, 6, 1, 1, (0, 2)),
    # HSDP, 2 replicas x 2 shards: rank 1 dies; its replica (ranks 0, 1) leaves, rank 0 alive (RankLeave)
    "fsdp2": (("--wrapper", "fsdp2", "--replicas", "2"), 4, 4, 1, 0, (2, 3)),
}


@pytest.mark.nightly("three torchrun jobs (about 90 s on 2 cores) per wrapper: the requested shrink runs every "
                     "time, the decision and the control plane in the unit tests above")
@pytest.mark.parametrize("wrapper", sorted(LAYOUTS))
def test_a_rank_killed_from_outside_with_no_spare_shrinks_without_a_restart(tmp_path, wrapper):
    """No spare, opted in: rank 1's worker SIGKILLed from outside after 2 committed steps, wherever it
    stands: zero restarts, its replica leaves (HSDP: with its live shard-group peer, RankLeave), the job
    finishes on the other replicas, whose final state is torch.equal to the same script's fault-free
    run with the same shrink requested at the frontier it happened at, and within TOLERANCE of the
    uninterrupted run."""
    flags, nproc, total, killed, replica, rest = LAYOUTS[wrapper]
    common = ("--steps", str(STEPS), "--micro-batches", str(total), *flags)
    out = tmp_path / "kill"
    text = _torchrun(out, nproc, *common, strike=_kill_rank(killed, 2))
    assert "death notice" in text, text[-3000:]
    steps = _steps(out, rest[0])
    assert len(steps) == STEPS
    at = next(s["step"] for s in steps if replica not in s["active"])
    if wrapper == "fsdp2":
        assert any(a["action"] == "RankLeave" for a in _trace_actions(out, 0))
    _accepted_told_nothing(out)
    ref = tmp_path / "ref"
    _torchrun(ref, nproc, *common, "--shrink-at", f"{at}:{replica}")
    _outside_the_model(ref)
    full = tmp_path / "full"
    _torchrun(full, nproc, *common)
    _accepted_told_nothing(full)
    for r in rest:
        a, b = _final(out, r), _final(ref, r)
        assert a.keys() == b.keys()
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, f"rank {r}: {len(differ)} tensors differ from the requested shrink at {at}, e.g. {differ[:3]}"
        rel = _relative(a, _final(full, r))
        print(f"{wrapper}: rank {r}: shrink at F={at} vs the uninterrupted run: relative difference {rel:.3g}")
        assert rel < TOLERANCE


def test_an_idle_spare_grows_the_job_back_to_its_replica_count(tmp_path):
    """3 DDP ranks and 1 spare: replica 1 asked to leave at F = 2 (the spare idles meanwhile); at the
    next committed boundary (F = 3) the spare takes the vacant identity 1 (RankStartGrow, the swap's
    claim, transfer and validation), the job trains on with three replicas and its shares of three,
    zero restarts, every replica identical, within TOLERANCE of the uninterrupted training."""
    out = tmp_path / "grow"
    text = _torchrun(out, 4, "--steps", str(STEPS), "--micro-batches", str(TOTAL), "--shrink-at", "2:1", spares=1)
    assert "now acts as rank 1" in text, text[-3000:]
    assert [s["active"] for s in _steps(out, 0)] == [[0, 1, 2]] * 2 + [[0, 2]] + [[0, 1, 2]] * (STEPS - 3)
    grow = [a for a in _trace_actions(out, 0) if a["action"] == "RankStartGrow"]
    assert grow and grow[0]["state"]["frontier"] == 3 and grow[0]["detail"]["vacant"] == [1]
    spare = _trace_actions(out, 1, spare=0)
    assert spare[0]["action"] == "SpareJoin" and spare[-1]["state"]["share"] == [1, 4]
    finals = [_final(out, r) for r in range(3)]
    assert all(torch.equal(finals[0][k], f[k]) for f in finals[1:] for k in finals[0]), "the replicas differ"
    rel = _relative(finals[0], _reference(STEPS, TOTAL))
    print(f"shrink and grow vs single-process reference: relative difference {rel:.3g}")
    assert rel < TOLERANCE
    _outside_the_model(out)


@pytest.mark.nightly("a torchrun job of 4 ranks and 2 spares (about 30 s on 2 cores): DDP's grow runs in the "
                     "test above, HSDP's swap transfer in conformance")
def test_hsdp_an_idle_pair_of_spares_grows_a_replica_back(tmp_path):
    """FSDP2 HSDP, 2 replicas x 2 shards, 2 spares: replica 0 (ranks 0, 1) asked to leave at F = 2; at
    F = 3 both vacant identities are claimed (one grow), each receives its shard from replica 1 over
    the rebuilt replicate groups, and each shard's two holders end identical, zero restarts."""
    out = tmp_path / "hgrow"
    text = _torchrun(out, 6, "--steps", "5", "--micro-batches", "4", "--wrapper", "fsdp2", "--replicas", "2",
                     "--shrink-at", "2:0", spares=2)
    assert "now acts as rank 0" in text and "now acts as rank 1" in text, text[-3000:]
    assert [s["active"] for s in _steps(out, 2)] == [[0, 1]] * 2 + [[1]] + [[0, 1]] * 2
    for r in (0, 1):
        a, b = _final(out, r), _final(out, r + 2)
        assert all(torch.equal(a[k], b[k]) for k in a), f"shard {r}: its replicas differ"
    _outside_the_model(out)


@pytest.mark.nightly("two torchrun jobs (about 80 s on 2 cores), the first paced so that a refilled spare starts "
                     "while it trains: the shrink and the grow run in the tests above")
def test_hsdp_a_death_benches_its_peer_and_a_refilled_spare_grows_the_replica_back(tmp_path):
    """FSDP2 HSDP, 2 replicas x 2 shards, no spare, keepers refilling (``impl/launch/keeper.py``): rank 1
    SIGKILLed from outside after 2 steps.  No spare is idle then (the refill starts one), so replica 0
    leaves (shrink) and rank 0, alive, is benched (RankLeave) and idles; once the refilled spare is in
    the pool, a committed boundary opens the grow: the spare takes rank 1, rank 0 is recalled (its
    SpareJoin as itself, spare -1), both receive their shards from replica 1, and the job ends with
    two replicas again, zero restarts, each shard's holders identical and within TOLERANCE of the
    uninterrupted run."""
    common = ("--micro-batches", "4", "--wrapper", "fsdp2", "--replicas", "2", "--steps", "40")
    out = tmp_path / "refill"
    # a refilled spare takes seconds to import torch and build its model: paced steps leave it the time
    text = _torchrun(out, 4, *common, "--pace", "0.5", strike=_kill_rank(1, 2), refill=True)
    assert "now acts as rank 1" in text, text[-3000:]
    active = [s["active"] for s in _steps(out, 2)]
    assert len(active) == 40 and active[:2] == [[0, 1]] * 2 and [1] in active and active[-1] == [0, 1], active
    assert active.index([0, 1], 2) > active.index([1]), "the job never grew back"
    acts = [a["action"] for a in _trace_actions(out, 0)]
    assert "RankLeave" in acts and acts[acts.index("RankLeave") + 1] == "SpareJoin", acts
    _accepted_told_nothing(out)  # the death, the shrink, the keeper's refill and the grow, as the model has them
    full = tmp_path / "full"
    _torchrun(full, 4, *common)
    for r in (0, 1):
        a, b = _final(out, r), _final(out, r + 2)
        assert all(torch.equal(a[k], b[k]) for k in a), f"shard {r}: its replicas differ"
        rel = _relative(a, _final(full, r))
        print(f"refill grow: shard {r}: relative difference to the uninterrupted run {rel:.3g}")
        assert rel < TOLERANCE


@pytest.mark.nightly("two torchrun jobs of 2x2 FSDP2 (about 60 s on 2 cores), one with an L2 restart: the shrink "
                     "decision's L2 when a shard would lose every replica runs in the unit tests above and in the model "
                     "(S18, 2x2-shrink-crash-f2)")
def test_a_rank_and_its_only_replica_killed_end_in_one_restart_bit_identical(tmp_path):
    """2x2 FSDP2 HSDP, opted in, no spare: ranks 1 and 3 (shard 1's two replicas) SIGKILLed together
    from outside: no shrink can keep shard 1, so the survivors end the attempt with a documented code
    and torchrun restarts the job once; the restarted job (no checkpoint: from step 0) finishes with
    every rank's final state torch.equal to the uninterrupted run's."""
    common = ("--steps", str(STEPS), "--micro-batches", "4", "--wrapper", "fsdp2", "--replicas", "2")
    out = tmp_path / "kill"
    _torchrun(out, 4, *common, strike=_kill_rank(1, 2, 3), max_restarts=1)
    run = RunDir(out)
    assert run.trace(1, 0).exists() and not run.trace(2, 0).exists(), "not exactly one restart"
    assert not any(a["action"] == "RankShrink" for r in range(4) for a in _trace_actions(out, r))
    full = tmp_path / "full"
    _torchrun(full, 4, *common)
    for r in range(4):
        a, b = _final(out, r), _final(full, r)
        differ = [k for k in b if not torch.equal(a[k], b[k])]
        assert a.keys() == b.keys() and not differ, f"rank {r}: {differ[:3]} differ from the uninterrupted run"
