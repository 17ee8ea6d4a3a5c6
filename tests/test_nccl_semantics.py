"""NCCL semantics the engine relies on, tested without a GPU (issue 26; spec/nccl.md).

* Hot swap's point-to-point messages run on the group's device and land back in the tensors the
  receivers read (``hotswap.exchange_in_place``): checked on gloo with a ``place`` that copies, as NCCL's
  ``Backend.place`` copies a CPU tensor to CUDA, and a group that, like ``ProcessGroupNCCL``
  (registered for ``cuda`` only), refuses a tensor that was not placed.
* The NCCL environment check (``backends.prebuilt_env_problem``): with env dicts.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from accelpact.impl.runtime import backends, hotswap
from accelpact.testing import gloo_threads


class _DeviceOnlyGroup:
    """A gloo group that, as NCCL on a CPU tensor, refuses a tensor ``place`` did not return."""

    def __init__(self, pg, placed: set) -> None:
        self.pg, self.placed = pg, placed

    def _placed(self, tensors):
        for t in tensors:
            if id(t) not in self.placed:
                raise RuntimeError("No backend type associated with device type cpu")

    def send(self, tensors, dst, tag):
        self._placed(tensors)
        return self.pg.send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        self._placed(tensors)
        return self.pg.recv(tensors, src, tag)

    def name(self):
        return "gloo"


def _copying_place(placed: set):
    def place(t, pg=None):
        c = t.clone()  # a copy "on the device", as Tensor.to("cuda") of a CPU tensor
        placed.add(id(c))
        placed_keep.append(c)  # ids stay unique while the test runs
        return c

    placed_keep: list = []
    return place


def _pair(fn):
    """Run ``fn(rank, pg)`` on two gloo ranks (threads, one HashStore); return their results."""
    return gloo_threads(2, fn)


def _exchange(r, g, tensors, place):
    hotswap.exchange_in_place(g, tensors, 1 - r, 10.0, send=r == 0, place=place)


def test_exchange_in_place_writes_the_placed_result_back():
    """The receiver reads the value from its own (CPU) tensor after the exchange: with a receive into
    ``place(size)`` that read ``size`` afterwards, the receiver would still have 0."""

    def body(r, pg):
        placed: set = set()
        g = _DeviceOnlyGroup(pg, placed)
        size = torch.tensor([1234 if r == 0 else 0], dtype=torch.int64)
        step = torch.tensor(7.0 if r == 0 else 0.0)  # AdamW's CPU step counter
        _exchange(r, g, [size, step], _copying_place(placed))
        return int(size[0]), float(step)

    assert _pair(body) == {0: (1234, 7.0), 1: (1234, 7.0)}


def test_the_sender_s_tensor_is_left_as_it_was():
    def body(r, pg):
        placed: set = set()
        g = _DeviceOnlyGroup(pg, placed)
        t = torch.tensor([5 if r == 0 else 0])
        _exchange(r, g, [t], _copying_place(placed))
        return int(t[0])

    assert _pair(body) == {0: 5, 1: 5}


def test_a_tensor_already_on_the_device_is_exchanged_as_it_is():
    def body(r, pg):
        t = torch.tensor([9 if r == 0 else 0])
        _exchange(r, pg, [t], lambda x, _pg: x)
        return int(t[0])

    assert _pair(body) == {0: 9, 1: 9}


def test_transfer_moves_the_state_through_a_copying_place(monkeypatch):
    """The whole ``hotswap.transfer`` on a device-only group whose ``place`` copies: the size, the
    manifest blob and every state tensor (AdamW's CPU ``step`` included) reach the spare."""
    placed: set = set()
    place = _copying_place(placed)
    monkeypatch.setattr(backends.Backend, "place", lambda self, t, pg=None: place(t, pg))

    torch.manual_seed(0)
    src = torch.nn.Linear(4, 3)
    src_opt = torch.optim.AdamW(src.parameters(), lr=1e-2, foreach=False)
    for _ in range(3):
        src(torch.randn(2, 4)).pow(2).sum().backward()
        src_opt.step()
        src_opt.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    dst = torch.nn.Linear(4, 3)
    dst_opt = torch.optim.AdamW(dst.parameters(), lr=1e-2, foreach=False)

    def body(r, pg):
        g = _DeviceOnlyGroup(pg, placed)
        module, opt = (src, src_opt) if r == 0 else (dst, dst_opt)
        return hotswap.transfer(g, (0, 1), 0, r, module, opt, torch.device("cpu"), 10.0)

    moved = _pair(body)
    assert moved[0] == moved[1] > 0
    for a, b in zip(src.parameters(), dst.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(src.parameters(), dst.parameters(), strict=True):
        sa, sb = src_opt.state[a], dst_opt.state[b]
        assert list(sa) == list(sb)
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k
        assert sb["step"].device.type == "cpu" and float(sb["step"]) == 3.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_backend_place_copies_a_cpu_tensor_to_the_device():
    be = backends.backend("nccl")
    t = torch.zeros(1)
    assert be.place(t) is not t and be.place(t).device.type == "cuda"


# ------------------------------------------------------------------------ the inherited NCCL environment
def test_groups_built_in_the_wrong_nccl_env_are_refused_with_what_to_do():
    nccl = backends.backend("nccl")
    torchrun = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}  # what torchrun's agent gives its workers
    why = backends.prebuilt_env_problem(nccl, torchrun, prebuilt=True)
    assert why is not None
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in why and "TORCH_NCCL_DUMP_ON_TIMEOUT=(unset)" in why
    assert "before init_process_group" in why and "let accelpact.init build the groups" in why
    for k, v in backends.NCCL_ENV.items():
        assert f"{k}={v}" in why
    one_off = {**backends.NCCL_ENV, "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "15000"}
    why = backends.prebuilt_env_problem(nccl, one_off, prebuilt=True, what="the mesh's groups")
    assert why is not None and why.startswith("the mesh's groups") and "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=15000" in why
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=2" not in why.split(";")[0]


def test_groups_built_in_the_engines_env_or_by_the_engine_pass():
    nccl, gloo = backends.backend("nccl"), backends.backend("gloo")
    assert backends.prebuilt_env_problem(nccl, dict(backends.NCCL_ENV), prebuilt=True) is None
    assert backends.prebuilt_env_problem(nccl, {**backends.NCCL_ENV, "OTHER": "x"}, prebuilt=True) is None
    assert backends.prebuilt_env_problem(nccl, {}, prebuilt=False) is None  # accelpact.init builds them after prepare_process
    assert backends.prebuilt_env_problem(gloo, {}, prebuilt=True) is None  # gloo reads none of it


def test_init_refuses_a_user_nccl_mesh_built_in_the_wrong_env(monkeypatch):
    """``accelpact.init("nccl", mesh=...)``: the check runs before ``prepare_process`` sets the env
    (which would hide the mismatch); no GPU needed, the machine check is bypassed."""
    import accelpact
    from accelpact.impl.launch.api import ApiError

    class Mesh:
        mesh_dim_names = ("replicate", "shard")

        def size(self, dim=None):
            return 4 if dim is None else 2

    monkeypatch.setattr(backends.Backend, "unavailable", lambda self, world: None)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    for k in backends.NCCL_ENV:
        if k != "TORCH_NCCL_ASYNC_ERROR_HANDLING":
            monkeypatch.delenv(k, raising=False)
    with pytest.raises(ApiError, match="TORCH_NCCL_ASYNC_ERROR_HANDLING=1.*let accelpact.init build the groups"):
        accelpact.init("nccl", mesh=Mesh(), env={"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})


# ------------------------------------------------------------------------ a backend's recorded error
class _Err:
    def __init__(self, name):
        self.name = name


class _FakeNcclGroup:
    def __init__(self, raw):
        self.raw = raw

    def name(self):
        return "nccl"

    def _get_backend(self, device):
        assert device.type == "cuda"
        return self.raw


def test_backend_error_reads_the_accelerator_backends_error_state():
    class Raw:
        def __init__(self, name):
            self.err = _Err(name)

        def get_error(self):
            return self.err

    assert backends.backend_error(_FakeNcclGroup(Raw("SUCCESS"))) is None
    assert backends.backend_error(_FakeNcclGroup(Raw("COMM_ERROR"))) == "COMM_ERROR"
    assert backends.backend_error(_FakeNcclGroup(Raw("TIMEOUT"))) == "TIMEOUT"


def test_backend_error_says_nothing_where_it_cannot_know():
    class Unsupported:
        def get_error(self):
            raise RuntimeError("Backend nccl does not support getError")

    assert backends.backend_error(_FakeNcclGroup(Unsupported())) is None
    assert backends.backend_error(_FakeNcclGroup(object())) is None  # a binding without get_error
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    assert backends.backend_error(pg) is None  # gloo: CPU, not consulted


def test_the_boundary_consults_every_recorded_groups_error_state():
    """``recorded_errors`` over the engine's revoke records (``Pact.group_records``): a group whose
    NCCL backend recorded an error is named; R is skipped when asked (its probe failed: the boundary's
    own failure), revoked (closed) records and gloo records (no group reference) are left out."""
    from accelpact.impl.runtime.revoke import SocketRecord, record_group

    class Raw:
        def __init__(self, name):
            self.name_ = name

        def get_error(self):
            return _Err(self.name_)

    shard, r = _FakeNcclGroup(Raw("COMM_ERROR")), _FakeNcclGroup(Raw("TIMEOUT"))
    ok = _FakeNcclGroup(Raw("SUCCESS"))
    recs = {"replicate": record_group(r), "replicate/0": record_group(r), "shard": record_group(shard),
            "world": record_group(ok), "control": SocketRecord(backend="gloo")}
    assert backends.recorded_errors(recs) == {"replicate": "TIMEOUT", "shard": "COMM_ERROR"}
    assert backends.recorded_errors(recs, skip=("replicate", "replicate/0")) == {"shard": "COMM_ERROR"}
    recs["shard"].closed = True
    assert backends.recorded_errors(recs, skip=("replicate", "replicate/0")) == {}


def test_the_gpu_count_check_counts_the_spares(monkeypatch):
    """Spares take ``cuda:LOCAL_RANK`` past the training ranks': the check counts every process of the node."""
    import accelpact
    from accelpact.impl.launch.api import ApiError

    asked: list[int] = []

    def unavailable(self, n):
        asked.append(n)
        return "stop here"

    monkeypatch.setattr(backends.Backend, "unavailable", unavailable)
    with pytest.raises(ApiError, match="stop here"):
        accelpact.init("nccl", spares=1, env={"RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"})
    assert asked == [3]  # two training ranks and one spare, each on its own GPU


# ------------------------------------------------------------------ where get_error is bound (row 17)
def test_the_installed_build_binds_get_error_per_backend_class_not_on_the_base():
    """The fact spec/nccl.md row 17 rests on, pinned on this (CPU) build: ``Backend`` itself has no
    ``get_error`` at runtime although the .pyi declares one; a subclass binds its own
    (``_ProcessGroupWrapper``, under ``USE_C10D_GLOO``), as ``ProcessGroupNCCL`` does under
    ``USE_C10D_NCCL``; ``_get_backend`` returns the most derived class; the ErrorType enum is bound.
    torch 2.14 binds it on ``Backend`` too, whose default says SUCCESS (spec/nccl.md, "Versions")."""
    c10d = torch._C._distributed_c10d
    assert ("get_error" in vars(c10d.Backend)) is (backends._minor(torch.__version__) >= (2, 14))
    assert "get_error" in vars(c10d._ProcessGroupWrapper)
    assert {"SUCCESS", "TIMEOUT", "COMM_ERROR", "REMOTE_ERROR"} <= set(c10d.ErrorType.__members__)
    pg = dist.ProcessGroup(dist.HashStore(), 0, 1)
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    assert type(pg._get_backend(torch.device("cpu"))) is dist.ProcessGroupGloo


def test_backend_error_names_the_real_enum_and_asks_a_wrappers_wrapped_backend():
    class Raw:
        def __init__(self, err):
            self.err = err

        def get_error(self):
            return self.err

    class Wrapper:  # a _ProcessGroupWrapper whose own call failed: its wrapped_pg is asked
        def __init__(self, inner):
            self.wrapped_pg = inner

        def get_error(self):
            raise RuntimeError("Backend gloo does not support getError")

    et = torch._C._distributed_c10d.ErrorType
    assert backends.backend_error(_FakeNcclGroup(Raw(et.TIMEOUT))) == "TIMEOUT"
    assert backends.backend_error(_FakeNcclGroup(Raw(et.SUCCESS))) is None
    assert backends.backend_error(_FakeNcclGroup(Wrapper(Raw(et.REMOTE_ERROR)))) == "REMOTE_ERROR"
    assert backends.backend_error(_FakeNcclGroup(Wrapper(object()))) is None
    real = torch._C._distributed_c10d._ProcessGroupWrapper(
        dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5)),
        dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5)))
    assert backends.backend_error(_FakeNcclGroup(real)) is None  # it asks gloo, which does not support getError


def test_an_nccl_job_is_refused_on_a_torch_without_get_error(monkeypatch):
    """``Backend.unavailable`` (what ``accelpact.init``, conformance and qualify ask first) refuses NCCL on a
    build whose ProcessGroupNCCL has no ``get_error``: a silently aborted group could not be seen."""
    nccl = backends.backend("nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv(backends.ONE_GPU_ENV, raising=False)

    class Old:  # ProcessGroupNCCL before pytorch/pytorch#144498
        pass

    class New:
        def get_error(self):
            return None

    monkeypatch.setattr(dist, "ProcessGroupNCCL", Old, raising=False)
    why = nccl.unavailable(4) or ""
    assert "no get_error()" in why and "torch>=2.7" in why and "row 17" in why
    monkeypatch.setattr(dist, "ProcessGroupNCCL", New, raising=False)
    assert nccl.unavailable(4) is None and nccl.error_query_problem() is None
    assert "one CUDA device per rank" in (nccl.unavailable(8) or "")  # the device count is asked first
    monkeypatch.delattr(dist, "ProcessGroupNCCL", raising=False)
    assert "built without NCCL" in (nccl.unavailable(4) or "")
    assert backends.backend("gloo").error_query_problem() is None and backends.backend("gloo").unavailable(4) is None


def test_set_timeout_sets_a_groups_later_collective_timeout():
    """``Backend.set_timeout``: what a mesh the user built needs (R's timeout is the mesh's, not
    ``collective_timeout_s``): the group's backend's ``set_timeout``, read back by ``timeout_of``."""
    gloo = backends.backend("gloo")
    pg = dist.ProcessGroup(dist.HashStore(), 0, 1)
    raw = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=600))
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, raw)
    assert gloo.timeout_of(pg) == 600.0
    gloo.set_timeout(pg, 7.5)
    assert gloo.timeout_of(pg) == 7.5


# ------------------------------------------------------- qualify --real-timeout (issue 26 item 5)
def test_real_timeout_is_nccl_only_and_waits_for_its_fault_kind(monkeypatch):
    from accelpact.conformance import cli_qualify as Q
    from accelpact.model import faults
    from accelpact.testing import nccl_timeout as nt

    assert "NCCL only" in (Q.real_timeout_problem("gloo") or "")
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    monkeypatch.delitem(faults.KINDS, nt.KIND, raising=False)
    assert "is not registered in" in (Q.real_timeout_problem("nccl") or "")
    monkeypatch.setitem(faults.KINDS, nt.KIND, faults.KINDS["collective_timeout"])
    assert Q.real_timeout_problem("nccl") is None


def test_real_timeout_scenario_keeps_the_cut_and_changes_only_its_mechanism():
    from accelpact.conformance import cli_qualify as Q
    from accelpact.conformance.generate import SCENARIO_DIR
    from accelpact.conformance.scenario import load_scenario

    sc = load_scenario(SCENARIO_DIR / "2x2-fsdp1-repair.json")
    real = Q.real_timeout_scenario(sc)
    assert real.name == "2x2-fsdp1-repair-nccl_timeout" and real.topology == sc.topology and real.workload == sc.workload
    assert [(f.step, f.at, f.ranks, f.group) for f in real.faults] == [(f.step, f.at, f.ranks, f.group) for f in sc.faults]
    assert {f.kind for f in real.faults} == {"nccl_timeout"}


@pytest.mark.parametrize("registered", [False, True])
def test_qualify_real_timeout_runs_the_extra_trials_or_says_why_not(tmp_path, monkeypatch, capsys, registered):
    """``qualify --backend nccl --real-timeout`` with the runs faked (no processes, no GPU)."""
    import argparse

    from accelpact.conformance import cli_qualify as Q
    from accelpact.conformance import runner
    from accelpact.model import faults
    from accelpact.model.contract import load_envelope
    from accelpact.testing import nccl_timeout as nt

    ran: list[str] = []

    class Rep:
        conforms, problems = True, []

    def run_scenario(sc, **kw):
        ran.append(sc.name)
        return Rep()

    monkeypatch.setattr(runner, "run_scenario", run_scenario)
    monkeypatch.setattr(backends.Backend, "unavailable", lambda self, world: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    monkeypatch.delitem(faults.KINDS, nt.KIND, raising=False)
    if registered:
        monkeypatch.setitem(faults.KINDS, nt.KIND, faults.KINDS["collective_timeout"])
    out = tmp_path / "env.json"
    ns = argparse.Namespace(backend="nccl", trials=1, out=str(out), wrappers="ddp", phases="boundary,backward",
                            swap_phases="", work=str(tmp_path / "w"), list=False, real_timeout=True)
    assert Q.run(ns) == 0
    text = capsys.readouterr().out
    entries = {e.key.phase: e for e in load_envelope(out).entries}
    if registered:
        assert ran == ["2x2-ddp-repair", "2x2-ddp-repair-nccl_timeout", "2x2-ddp-inflight-backward"]
        assert entries["boundary"].evidence["real_timeout"] is True and entries["boundary"].evidence["trials"] == 2
    else:
        assert "--real-timeout skipped" in text and "not registered" in text
        assert ran == ["2x2-ddp-repair", "2x2-ddp-inflight-backward"]
        assert entries["boundary"].evidence["real_timeout"] is False
    assert "real_timeout" not in entries["backward"].evidence
