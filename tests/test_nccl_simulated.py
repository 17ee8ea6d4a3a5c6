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
from accelpact.impl.recovery import Pact
from accelpact.impl.revoke import SocketRecord, record_group


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
                                 _record=r, _observe_in_flight=lambda point, exc: failed.append(exc))
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


def test_the_seeded_defect_of_ignoring_get_error_is_caught(monkeypatch):
    """Seeded defect: the engine ignores ``get_error()``.  Then the judgement lets the corrupted step
    stand, which ``test_a_step_with_a_silently_aborted_shard_group_does_not_stand`` rejects."""
    r, shard = SimulatedNcclSemantics(), SimulatedNcclSemantics()
    shard.watchdog_fails("TIMEOUT")
    assert _judge({"replicate": r, "shard": shard}) is not None
    monkeypatch.setattr(backends, "backend_error", lambda pg: None)  # the defect
    assert _judge({"replicate": r, "shard": shard}) is None  # the step would stand: the test above fails
