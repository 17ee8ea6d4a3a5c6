"""The engine's boundary judgement over ``SimulatedNcclSemantics`` (issue 26; spec/nccl.md row 17).

``SimulatedNcclSemantics`` is a gloo group dressed with the four ProcessGroupNCCL behaviours the
engine depends on in ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (each cited in spec/nccl.md, "Simulated
NCCL semantics"): the watchdog records ``error_`` and aborts the communicators silently; a work
waited after that abort returns normally; ``get_error()`` reports the recorded error; an op enqueued
on the aborted group raises.  It is a test double, not NCCL: it never replaces a GPU run.
"""

from __future__ import annotations

import datetime
import types

import pytest
import torch
import torch.distributed as dist

from accelpact.impl.runtime import backends
from accelpact.impl import recovery
from accelpact.impl.recovery import Pact
from accelpact.impl.runtime.revoke import SocketRecord, record_group


class _Err:
    def __init__(self, name: str) -> None:
        self.name = name


class _DoneWork:
    """A work on a communicator the watchdog aborted: completed, no exception (WorkNCCL::isCompleted
    skips its error check once the communicator is aborted), ``wait`` returns normally."""

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout=None) -> bool:
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut


class SimulatedNcclSemantics:
    """One rank's NCCL group, simulated on a world-size-1 gloo group (see the module docstring)."""

    def __init__(self) -> None:
        self._gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
        self.error = "SUCCESS"
        self.comm_aborted = False

    # what backends.backend_of / backend_error read
    def name(self) -> str:
        return "nccl"

    def _get_backend(self, device):
        assert device.type == "cuda"
        return self

    def get_error(self):
        return _Err(self.error)

    # the watchdog, mode 2: record error_, abort the communicators, raise nothing
    def watchdog_fails(self, kind: str = "TIMEOUT") -> None:
        if self.error == "SUCCESS":
            self.error = kind
        self.comm_aborted = True

    def allreduce(self, tensors, opts=None):
        if self.comm_aborted:  # an op enqueued on an aborted communicator raises at enqueue
            raise dist.DistBackendError("NCCL communicator was aborted")
        return self._gloo.allreduce(tensors)

    def pending_work(self):
        """A work enqueued before the watchdog's abort: after it, waiting on it returns normally."""
        return _DoneWork()


def _judge(groups: dict[str, object], observed: bool = False):
    """Run ``Pact._fail_on_backend_errors`` (the boundary's judgement) on a stub engine whose R is
    ``groups["replicate"]`` and whose other training groups are the rest; return the failure, or None
    if the step stands."""
    failed: list[BaseException] = []
    r = record_group(groups["replicate"])
    others = {k: record_group(g) for k, g in groups.items() if k != "replicate"}
    others["control"] = SocketRecord(backend="gloo")
    stub = types.SimpleNamespace(groups=types.SimpleNamespace(name="replicate", key="replicate/0", others=others),
                                 _r_record=r, _observe_in_flight=lambda point, exc: failed.append(exc),
                                 _swap_if_died=lambda point, exc: None)  # no spares: no death notice
    stub.group_records = types.MethodType(Pact.group_records, stub)
    Pact._fail_on_backend_errors(stub, observed)
    return failed[0] if failed else None


def test_the_simulation_has_the_behaviours_the_engine_relies_on():
    g = SimulatedNcclSemantics()
    t = torch.ones(1)
    g.allreduce([t]).wait()
    assert backends.backend_error(g) is None
    work = g.pending_work()
    g.watchdog_fails("TIMEOUT")
    backends.wait_bounded(work, 1.0)  # returns normally: nothing raised after the silent abort
    assert backends.backend_error(g) == "TIMEOUT"
    with pytest.raises(dist.DistBackendError):
        g.allreduce([t])


def test_a_step_with_a_silently_aborted_shard_group_does_not_stand():
    """A shard-group collective timed out mid-step; R's probe passed: the step must not stand (L2)."""
    r, shard = SimulatedNcclSemantics(), SimulatedNcclSemantics()
    assert _judge({"replicate": r, "shard": shard}) is None  # healthy: the step stands
    shard.watchdog_fails("TIMEOUT")
    err = _judge({"replicate": r, "shard": shard})
    assert err is not None and "shard" in str(err) and "TIMEOUT" in str(err)


def test_a_probe_that_passed_on_an_aborted_r_does_not_stand():
    """The probe's wait raced the watchdog and returned normally on R's aborted communicator."""
    r = SimulatedNcclSemantics()
    r.watchdog_fails("COMM_ERROR")
    err = _judge({"replicate": r})
    assert err is not None and "COMM_ERROR" in str(err)
    assert _judge({"replicate": r}, observed=True) is None  # R's probe failed: the boundary's own (repairable) failure


def test_the_judgement_alone_without_get_error_lets_the_step_stand(monkeypatch):
    """The judgement reads nothing but ``backend_error``: without it (a build with no ``get_error``
    binding, which ``Backend.unavailable`` refuses on NCCL) the corrupted step would stand."""
    r, shard = SimulatedNcclSemantics(), SimulatedNcclSemantics()
    shard.watchdog_fails("TIMEOUT")
    assert _judge({"replicate": r, "shard": shard}) is not None
    monkeypatch.setattr(backends, "backend_error", lambda pg: None)  # the defect
    assert _judge({"replicate": r, "shard": shard}) is None  # the step would stand: the test above fails


# ---- the whole engine over the double: the seeded bug ``ignore-backend-errors`` ----------------------

def silent_abort_worker(ctx, seeded_bug: str | None = None, steps: int = 3, fail_step: int = 1) -> dict:
    """A rank (``init_group=True``): DDP over the default gloo group (R, "world") with the real engine
    attached, and a ``SimulatedNcclSemantics`` shard group among its training groups.  During step
    ``fail_step`` (after backward, before ``optimizer.step()``) the shard group's watchdog aborts it
    silently, as NCCL's does in mode 2 when a reduce-scatter times out: the step's gradients are not
    to be trusted and nothing raises.  Returns the steps whose boundary let them stand."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accelpact.impl.controlplane import ControlPlane
    from accelpact.testing.faults import hooks_for
    from accelpact.impl.recovery import PactGroups, attach
    from accelpact.impl.trace import Trace, trace_path

    rank, world = ctx.rank, ctx.world
    control = dist.ProcessGroupGloo(dist.PrefixStore("control", ctx.store), rank, world, datetime.timedelta(seconds=8))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2), process_group=ctx.group)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    shard = SimulatedNcclSemantics()
    groups = PactGroups(control=control, affected=ctx.group, members=tuple(range(world)), record=ctx.group_record,
                        name="world", others={"shard": record_group(shard)})
    header = {"world": world, "nodes": world, "ranks_per_node": 1, "group": "world", "affected": list(range(world)),
              "attempt": 0, "scenario": "simulated-nccl-silent-abort", "seed": 0, "backend": "gloo", "frontier_at_start": 0}
    trace = Trace(trace_path(ctx.out, 0, rank), rank, header)
    pact = attach(model, opt, groups=groups, control=ControlPlane(ctx.store, rank, world, prefix="job/"), trace=trace,
                  deadline_s=8.0, hooks=hooks_for(seeded_bug=seeded_bug))
    stood = []
    for step in range(steps):
        with pact.step(step):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(100 * step + rank))
            loss = model(x).square().mean()
            loss.backward()
            if step == fail_step:
                shard.watchdog_fails("TIMEOUT")  # this step's shard collective: aborted by the watchdog, silently
            opt.step()
            opt.zero_grad(set_to_none=True)
        pact.boundary(loss)
        stood.append(step)
    pact.close()
    trace.close()
    return {"stood": stood, "frontier": pact.frontier}


@pytest.mark.multiproc
@pytest.mark.timeout(120)
@pytest.mark.parametrize("bug", [None, "ignore-backend-errors"])
def test_the_engine_rejects_a_step_on_a_silently_aborted_group_and_the_seeded_bug_commits_it(ranks, bug):
    """Issue 26, Done when: the real engine (``Pact.boundary``) over ``SimulatedNcclSemantics``.  As it is,
    the step whose shard collective NCCL's watchdog aborted silently is an in-flight failure: RankObserve
    naming the group and ``TIMEOUT``, RankReject, every rank exits 70 (L2) and no later step runs.  With
    the seeded bug ``ignore-backend-errors`` (the boundary never reads ``get_error()``) the same run
    commits the corrupted step and trains on: exit 0, every step stood, no RankReject."""
    run = ranks.run(silent_abort_worker, 2, init_group=True, timeout_s=100, seeded_bug=bug)
    if bug is not None:  # the defect: the bad step stands, nobody notices
        assert run.codes == {0: 0, 1: 0}, run.explain()
        for r in range(2):
            assert run.result(r)["stood"] == [0, 1, 2] and run.result(r)["frontier"] == 3
            assert "RankReject" not in run.actions(r) and "RankObserve" not in run.actions(r)
        return
    assert run.codes == {0: 70, 1: 70}, run.explain()
    assert any("RankReject" in run.actions(r) for r in range(2)), run.explain()
    for r in range(2):
        obs = [x for x in run.trace(r) if x.get("action") == "RankObserve"]
        if obs:  # an observer (the other may end on its peer's job abort first: RankExit)
            assert obs[0]["detail"]["in_flight"] is True, obs
            assert "shard" in obs[0]["detail"]["error"] and "TIMEOUT" in obs[0]["detail"]["error"], obs
            assert run.actions(r)[-2:] == ["RankObserve", "RankReject"], run.actions(r)
        else:
            assert run.actions(r)[-1] == "RankExit", run.actions(r)


def test_the_commit_drains_the_steps_device_work_before_it_judges_the_groups():
    """If the CPU commits while the gradients' all-reduce still runs on the device, the boundary's abort
    of R cuts it short and the replicas differ (bench/nccl-log.md, "The first lent GPU").  ``Pact._before_commit`` drains first (the
    guard's bounded drain), then judges the groups; an undrained device is not committed."""
    calls: list[str] = []
    undrained: list[str] = []

    class Guard:
        def undrained(self) -> list[str]:
            calls.append("drain")
            return list(undrained)

    fake = types.SimpleNamespace(guard=Guard(), discard=False, gen=0,
                                 group_records=lambda: (calls.append("judge"), {})[1])
    Pact._before_commit(fake)
    assert calls == ["drain", "judge"]
    undrained.append("the step's work on cuda:0 did not finish within 20.0 s")
    calls.clear()
    with pytest.raises(backends.AbortedCommunicator, match="did not finish within 20.0 s"):
        Pact._before_commit(fake)
    assert calls == ["drain"]


def test_a_group_error_after_a_peers_death_is_a_swap_not_a_rejection(monkeypatch):
    """``2x2-fsdp1-spare1-boundary-stop-r1`` on NCCL: rank 1 stopped at the boundary and deposed, its
    death fails the NCCL shard group; the survivors, finding the recorded error at the boundary, must
    swap as the model does, not reject (L2).  With a keeper's death notice
    the boundary now raises ``SwapNeeded`` (the commit had drained the step and found no error);
    without one the error is still an in-flight failure, rejected."""
    from accelpact.impl.runtime.hotswap import SwapNeeded

    calls: list[str] = []
    monkeypatch.setattr(recovery, "recorded_errors", lambda records, skip=(): {"shard": "COMM_ERROR"})  # bound at import

    def swap_if_died(point, exc):
        calls.append(f"swap?{point}")
        if dead:
            raise SwapNeeded(point, dead, exc)

    fake = types.SimpleNamespace(groups=types.SimpleNamespace(name="replicate", key="replicate0"),
                                 group_records=lambda: {}, _swap_if_died=swap_if_died,
                                 _observe_in_flight=lambda point, exc: calls.append(f"reject@{point}"))
    dead = (1,)
    with pytest.raises(SwapNeeded):
        Pact._fail_on_backend_errors(fake, False)
    assert calls == ["swap?boundary"]
    dead, calls[:] = (), []
    Pact._fail_on_backend_errors(fake, False)
    assert calls == ["swap?boundary", "reject@backward"]
