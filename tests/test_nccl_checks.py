"""Every NCCL group of the process is checked, not only the engine's own (issue 43 items 1 and 5;
spec/nccl.md rows 17, 25, 26 and "Versions").

In ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` NCCL's watchdog aborts a failed group and raises nothing, so the
engine reads ``get_error()`` at the commit and after each save's collectives: of its recorded groups and of
every group registered with c10d (``_world.pg_map``: the default group, the user's).  Here c10d's registry
is a stand-in (``FakeWorld``, what ``process_groups`` reads) holding ``SimulatedNcclSemantics``-like groups:
no process group is initialised in this process.  A blocking wait (``TORCH_NCCL_BLOCKING_WAIT=1``) is
refused by name, and so is torch 2.15's ``ProcessGroupNCCL2`` behind ``backend="nccl"``.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import torch.distributed.distributed_c10d as c10d

from accelpact.impl.recovery import Pact
from accelpact.impl.runtime import backends as B
from accelpact.impl.runtime.checkpoint import MARKER, CheckpointManager, SaveFailed
from accelpact.impl.runtime.revoke import SocketRecord, record_group


class _Err:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeNcclGroup:
    """An NCCL group as ``_group_error`` / ``backend_error`` read it: ``_get_backend(cuda)`` returns a
    backend whose ``get_error()`` says what the watchdog recorded (``watchdog_fails``); ``abort()`` as
    ``Backend.abort`` calls it."""

    def __init__(self, get_error: bool = True) -> None:
        self.error = "SUCCESS"
        if get_error:
            self.get_error = lambda: _Err(self.error)

    def name(self) -> str:
        return "nccl"

    def _get_backend(self, device):
        assert device.type == "cuda", device
        return self

    def watchdog_fails(self, kind: str = "COMM_ERROR") -> None:
        self.error = kind

    def abort(self) -> None:
        pass


class FakeGlooGroup:
    def name(self) -> str:
        return "gloo"

    def _get_backend(self, device):
        raise AssertionError("a gloo group's failures raise: it is never read")


def fake_world(monkeypatch, groups: dict[str, tuple[object, str]], default: str | None = None) -> None:
    """c10d's ``_world`` with ``groups`` (c10d name -> (group, backend config)) registered, ``default``
    the default group."""
    world = types.SimpleNamespace(default_pg=groups[default][0] if default else None,
                                  pg_map={g: (cfg.split(":")[-1], None) for g, cfg in groups.values()},
                                  pg_names={g: name for name, (g, _) in groups.items()},
                                  pg_backend_config={g: cfg for g, cfg in groups.values()})
    monkeypatch.setattr(c10d, "_world", world)


def judge(records: dict) -> BaseException | None:
    """``Pact._fail_on_backend_errors`` (the boundary's judgement) on a stub engine whose R is
    ``records["replicate"]``: the failure it raised through ``_observe_in_flight`` (the recorded fact),
    or None when the step stands."""
    failed: list[BaseException] = []
    stub = types.SimpleNamespace(groups=types.SimpleNamespace(name="replicate", key="replicate/0",
                                                              others={k: v for k, v in records.items() if k != "replicate"}),
                                 _r_record=records["replicate"], _observe_in_flight=lambda point, exc: failed.append(exc),
                                 _swap_if_died=lambda point, exc: None)
    stub.group_records = types.MethodType(Pact.group_records, stub)
    Pact._fail_on_backend_errors(stub, False)
    return failed[0] if failed else None


def _job_with_a_failed_default_group(monkeypatch) -> BaseException | None:
    """R and the shard group healthy and recorded; the default NCCL group (FSDP1's ``optim_state_dict``
    gathers on it) and a user's tensor-parallel group registered with c10d only; the default group's
    watchdog recorded COMM_ERROR.  The boundary's verdict."""
    r, shard, default, tp = FakeNcclGroup(), FakeNcclGroup(), FakeNcclGroup(), FakeNcclGroup()
    fake_world(monkeypatch, {"0": (default, "cuda:nccl"), "replicate/0": (r, "cuda:nccl"), "shard/0": (shard, "cuda:nccl"),
                             "tp": (tp, "cuda:nccl"), "control": (FakeGlooGroup(), "cpu:gloo")}, default="0")
    default.watchdog_fails("COMM_ERROR")
    return judge({"replicate": record_group(r), "shard": record_group(shard), "control": SocketRecord(backend="gloo")})


def test_the_default_groups_recorded_error_fails_the_step(monkeypatch):
    err = _job_with_a_failed_default_group(monkeypatch)
    assert err is not None and "default (0)" in str(err) and "COMM_ERROR" in str(err), err


def test_seeded_defect_a_check_that_skips_the_default_group_lets_the_step_stand(monkeypatch):
    """Seeded defect: the check reads the recorded groups only (the engine before issue 43: R, shard,
    world), i.e. it skips the default group.  The verdict the test above reads is then None: it fails."""
    every = B.process_groups
    monkeypatch.setattr(B, "process_groups", lambda: [t for t in every() if not t[0].startswith("default")])
    assert _job_with_a_failed_default_group(monkeypatch) is None


def test_a_users_nccl_group_is_checked_and_a_group_seen_once(monkeypatch):
    r, tp = FakeNcclGroup(), FakeNcclGroup()
    fake_world(monkeypatch, {"replicate/0": (r, "cuda:nccl"), "tp": (tp, "cpu:gloo,cuda:nccl")})
    records = {"replicate": record_group(r)}
    assert B.recorded_errors(records) == {}
    tp.watchdog_fails("TIMEOUT")
    assert B.recorded_errors(records) == {"tp": "TIMEOUT"}
    r.watchdog_fails("COMM_ERROR")
    assert B.recorded_errors(records) == {"replicate": "COMM_ERROR", "tp": "TIMEOUT"}, "R once, under its record's name"
    # R skipped on purpose (its probe failed: the boundary's repairable failure): not found through c10d either
    assert B.recorded_errors(records, skip=("replicate",)) == {"tp": "TIMEOUT"}


def test_a_group_this_process_aborted_is_not_a_failure(monkeypatch):
    old_r = FakeNcclGroup()
    fake_world(monkeypatch, {"replicate/0": (old_r, "cuda:nccl")})
    old_r.watchdog_fails("COMM_ERROR")
    assert B.recorded_errors({}) == {"replicate/0": "COMM_ERROR"}
    assert B.backend("nccl").abort(old_r)  # the engine's own revoke: the group is being replaced
    assert B.recorded_errors({}) == {}


def test_a_group_that_cannot_be_checked_is_refused_with_what_to_do(monkeypatch):
    r = FakeNcclGroup()
    ucc, blind = object(), FakeNcclGroup(get_error=False)
    fake_world(monkeypatch, {"replicate/0": (r, "cuda:nccl"), "metrics": (ucc, "cuda:ucc")})
    err = judge({"replicate": record_group(r)})
    assert err is not None and "UNCHECKABLE" in str(err) and "'ucc'" in str(err) and "destroy" in str(err), err
    fake_world(monkeypatch, {"replicate/0": (r, "cuda:nccl"), "old": (blind, "cuda:nccl")})
    assert "get_error" in B.recorded_errors({}).get("old", ""), "an NCCL backend without get_error() is refused"
    fake_world(monkeypatch, {"replicate/0": (r, "cuda:nccl"), "control": (FakeGlooGroup(), "cpu:gloo")})
    assert judge({"replicate": record_group(r)}) is None, "gloo raises its own failures: never read"


def test_process_groups_reads_c10ds_registry_default_first(monkeypatch):
    a, d = FakeNcclGroup(), FakeNcclGroup()
    fake_world(monkeypatch, {"a": (a, "cuda:nccl"), "0": (d, "cpu:gloo,cuda:nccl")}, default="0")
    assert [(n, g, c) for n, g, c in B.process_groups()] == [("default (0)", d, "cpu:gloo,cuda:nccl"), ("a", a, "cuda:nccl")]


# ---- after each save's collectives ------------------------------------------------------------------

def _save(tmp_path: Path, group_errors=None) -> str:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mgr = CheckpointManager(tmp_path, every=1, rank=0, world=1, group_errors=group_errors)
    try:
        mgr.save(1, model, opt)
    except SaveFailed as exc:
        return f"failed: {exc}"
    return "committed" if (tmp_path / "step-1" / MARKER).exists() else "not committed"


def test_a_save_whose_collectives_failed_silently_is_a_failed_save(tmp_path, monkeypatch):
    # the default group's c10d name, registered but not installed as the default (DCP would then take
    # this process for a distributed one and run its collectives on the stand-in)
    default = FakeNcclGroup()
    fake_world(monkeypatch, {"0": (default, "cuda:nccl")})
    assert _save(tmp_path / "a") == "committed"
    default.watchdog_fails("TIMEOUT")  # DCP's gather on the default group "returned" after NCCL's watchdog aborted it
    out = _save(tmp_path / "b")
    assert out.startswith("failed") and "'0': 'TIMEOUT'" in out, out
    assert not (tmp_path / "b" / "step-1" / "rank0.pt").exists(), "nothing of the save is written"
    # seeded defect: the save does not read the groups (the engine before issue 43): it commits
    assert _save(tmp_path / "c", group_errors=dict) == "committed"


# ---- BLOCKING_WAIT: refused by name ---------------------------------------------------------------------

def _nccl_prepare_refusal(monkeypatch, env: dict[str, str]) -> str | None:
    """What ``Backend.prepare_process`` (before the first NCCL group) says in ``env``: its error, or None
    when it accepts (the device set, the NCCL variables written)."""
    for k in (*B.BLOCKING_WAIT_VARS, *B.NCCL_ENV):
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    try:
        B.backend("nccl").prepare_process(0)
    except RuntimeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", B.BLOCKING_WAIT_VARS)
def test_a_blocking_wait_is_refused_by_name(monkeypatch, name):
    why = _nccl_prepare_refusal(monkeypatch, {name: "1"})
    assert why is not None and f"{name}=1" in why and "get_error() always says SUCCESS" in why and "Unset" in why, why
    assert B.prebuilt_env_problem(B.backend("nccl"), {name: "1"}, prebuilt=False) == B.blocking_wait_problem({name: "1"})
    assert B.prebuilt_env_problem(B.backend("gloo"), {name: "1"}, prebuilt=False) is None, "gloo has no such wait"
    assert B.backend("gloo").prepare_process(0) == torch.device("cpu")
    assert _nccl_prepare_refusal(monkeypatch, {name: "0"}) is None, "0 is NCCL's own default: accepted"


def test_seeded_defect_blocking_wait_accepted(monkeypatch):
    """Seeded defect: the check is gone (``blocking_wait_problem`` finds nothing).  The refusal the test
    above reads becomes None, so it fails."""
    monkeypatch.setattr(B, "blocking_wait_problem", lambda env: None)
    assert _nccl_prepare_refusal(monkeypatch, {"TORCH_NCCL_BLOCKING_WAIT": "1"}) is None


# ---- versions: nccl2 refused unless verified ----------------------------------------------------------------

@pytest.mark.parametrize("version,env,refused", [
    ("2.13.0+cu130", {}, False),
    ("2.13.0+cu130", {"TORCH_DIST_USE_NCCL2": "1"}, True),
    ("2.14.1", {}, False),
    ("2.14.1", {"TORCH_DIST_USE_NCCL2": "1"}, True),
    ("2.15.0+cu130", {}, True),
    ("2.15.0+cu130", {"TORCH_DIST_USE_NCCL2": "0"}, False),
    ("2.15.0+cu130", {"TORCH_DIST_USE_NCCL2": "1"}, True),
    ("2.16.0.dev20270101", {}, True),
])
def test_nccl2_is_refused_and_the_legacy_class_accepted(version, env, refused):
    why = B.nccl_version_problem(version, env)
    assert (why is not None) == refused, why
    if refused:
        assert "ProcessGroupNCCL2" in why and "TORCH_DIST_USE_NCCL2=0" in why and version in why


def test_unavailable_refuses_a_faked_torch_2_15(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.15.0+cu130")
    monkeypatch.setattr(torch.distributed, "ProcessGroupNCCL", type("PG", (), {"get_error": lambda self: None}), raising=False)
    monkeypatch.delenv("TORCH_DIST_USE_NCCL2", raising=False)
    assert "TORCH_DIST_USE_NCCL2=0" in (B.backend("nccl").error_query_problem() or "")
    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "0")
    assert B.backend("nccl").error_query_problem() is None
    assert B.backend("gloo").error_query_problem() is None
