"""The engine's NCCL fixes, checked on the generic path they share with gloo (issue 11, section 3).

Every device decision goes through :class:`accelpact.impl.runtime.backends.Backend`; these tests run that
generic code on gloo/CPU (this machine has no GPU), each against the defect it fixes:

* the boundary wait polls completion and the revoke, not the work's future (an NCCL future
  completes at enqueue), and is bounded;
* phase 6's tensors live on the backend's device; the replica check is an exact checksum computed
  on the tensors' own devices and catches every single-bit flip;
* a revoke by abort keeps the group's c10d registration; the rebound group carries the old name,
  is found by name, and keeps the old group's training timeout;
* the guard drains the step's stream with a bound instead of a device-wide synchronize;
* an unqualified platform decides L2 with a message that says how to qualify it, and qualify
  produces cells for ``cuda-nccl``;
* the NCCL error-handling environment is the one torch 2.13 reads.

spec/nccl.md lists the NCCL-specific lines and what could not be run here.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import types
import weakref
from pathlib import Path

import pytest
import torch

from accelpact.impl.runtime import backends as B
from accelpact.impl.runtime import digest as D
from accelpact.impl import recovery as R
from accelpact.impl import effects as E
from accelpact.impl.episode import Episode
from accelpact.impl.runtime import revoke
from accelpact.model.contract import (
    DEFAULT_OBJECTIVE,
    ObservationKey,
    decide,
    default_envelope,
    envelope_from_mapping,
    unqualified_notice,
)

pytestmark = pytest.mark.timeout(180)
TORCH_DIR = Path(torch.__file__).parent


# ---- test doubles ---------------------------------------------------------------------------------------

class DoneFuture:
    """The future of an NCCL work: complete as soon as the work is enqueued."""

    def add_done_callback(self, cb):
        cb(self)


class FakeWork:
    """A work whose future completes at once and that completes after ``completes_after`` polls of
    ``is_completed()`` (never, when None); ``wait`` records whether the work had completed."""

    def __init__(self, completes_after: int | None = 3, error: BaseException | None = None) -> None:
        self.completes_after = completes_after
        self.error = error
        self.polls = 0
        self.waits: list[tuple[bool, object]] = []

    @property
    def done(self) -> bool:
        return self.completes_after is not None and self.polls > self.completes_after

    def get_future(self):
        return DoneFuture()

    def is_completed(self) -> bool:
        self.polls += 1
        return self.done

    def wait(self, timeout=None):
        self.waits.append((self.done, timeout))
        if self.error is not None:
            raise self.error
        if not self.done and timeout is not None:
            raise RuntimeError("Operation timed out!")
        return True


def fake_pact(*, revoked: bool = False, record=None, deadline_s: float = 30.0, backend: str = "nccl"):
    """What ``Pact._wait_unless_revoked`` reads of its pact; R is a group of ``backend`` (NCCL: the
    polled wait; gloo: the sliced blocking wait, :attr:`Backend.sliced_wait`)."""
    return types.SimpleNamespace(
        gen=0, deadline_s=deadline_s, _pg=types.SimpleNamespace(name=lambda: backend), _r_record=record, _retiring=[],
        watchdog=types.SimpleNamespace(revocations=[]),
        control=types.SimpleNamespace(revoked=lambda g, key: revoked),
        groups=types.SimpleNamespace(key="world", members=(0, 1)))


def tiny_state(seed: int = 0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(3, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return m, opt


# ---- the boundary wait ------------------------------------------------------------------------------------

def test_boundary_wait_polls_completion_not_the_future():
    """The future completes at once (NCCL: at enqueue); the wait returns only once the work has
    completed, and then calls ``work.wait`` (which raises the op's error and orders the stream)."""
    work = FakeWork(completes_after=5)
    R.Pact._wait_unless_revoked(fake_pact(), work, "the boundary all-reduce")
    assert work.polls > 5
    assert work.waits and all(done for done, _ in work.waits), work.waits


def test_boundary_wait_gives_up_after_the_revoke(monkeypatch):
    """A work that never completes while R is revoked: RevokedWhilePending after the grace."""
    monkeypatch.setattr(R, "REVOKE_GRACE_S", 0.0)
    work = FakeWork(completes_after=None)
    with pytest.raises(R.RevokedWhilePending, match="still pending"):
        R.Pact._wait_unless_revoked(fake_pact(revoked=True), work, "the boundary all-reduce")


def test_boundary_wait_is_bounded_by_the_groups_timeout(monkeypatch):
    """No revoke and no completion: past the budget the wait calls ``work.wait(timeout)``, whose
    timeout error (NCCL: DistBackendError) is the failure observed."""
    monkeypatch.setattr(R, "REVOKE_GRACE_S", 0.0)
    work = FakeWork(completes_after=None)
    with pytest.raises(RuntimeError, match="timed out"):
        R.Pact._wait_unless_revoked(fake_pact(deadline_s=0.05), work, "the boundary all-reduce")
    (done, timeout), = work.waits
    assert not done and isinstance(timeout, datetime.timedelta)


def test_a_work_completed_on_an_aborted_communicator_is_not_trusted():
    """NCCL: an aborted communicator reports its works complete without an error; gloo: a revoked
    group's ops fail, so a completed op stands."""
    aborted = revoke.SocketRecord("nccl", closed=True)
    with pytest.raises(R.RevokedWhilePending, match="aborted"):
        R.Pact._wait_unless_revoked(fake_pact(record=aborted), FakeWork(completes_after=0), "the boundary all-reduce")
    R.Pact._wait_unless_revoked(fake_pact(record=revoke.SocketRecord("gloo", closed=True)), FakeWork(0), "x")


def test_gloo_boundary_wait_blocks_in_slices_until_the_op_completes():
    """gloo: ``work.wait`` slices of REVOKE_CHECK_S; a slice that times out while the op is pending
    is not an error; the op's completion ends the wait (no future, no polling)."""
    work = FakeWork(completes_after=3)
    R.Pact._wait_unless_revoked(fake_pact(backend="gloo"), work, "the boundary all-reduce")
    *slices, (done, last) = work.waits
    assert len(slices) >= 3 and not any(d for d, _ in slices) and done, work.waits
    assert all(t == datetime.timedelta(seconds=R.REVOKE_CHECK_S) for _, t in slices)
    assert last is None  # completed after a slice ran out: its own result, unbounded


def test_gloo_boundary_wait_gives_up_after_the_revoke_and_raises_the_ops_error(monkeypatch):
    monkeypatch.setattr(R, "REVOKE_GRACE_S", 0.0)
    with pytest.raises(R.RevokedWhilePending, match="still pending"):
        R.Pact._wait_unless_revoked(fake_pact(revoked=True, backend="gloo"), FakeWork(completes_after=None), "x")
    with pytest.raises(RuntimeError, match="Connection reset"):  # the op failed: its error, not a slice's timeout
        R.Pact._wait_unless_revoked(fake_pact(backend="gloo"), FakeWork(completes_after=0, error=RuntimeError("Connection reset")),
                                    "x")
    with pytest.raises(RuntimeError, match="timed out"):  # no revoke, never completes: bounded by the group's timeout
        R.Pact._wait_unless_revoked(fake_pact(deadline_s=0.05, backend="gloo"), FakeWork(completes_after=None), "x")


def test_a_timed_out_gloo_wait_leaves_the_op_pending_and_its_result_right():
    """The torch fact the sliced wait relies on (spec/torch-facts.md): gloo's ``work.wait(timeout)``
    raises when the timeout passes first, and the op completes later with the right result; two
    ranks in two threads, the second joining the all-reduce 0.3 s late."""
    import threading

    be = B.backend("gloo")
    store = torch.distributed.HashStore()
    pgs = [None, None]

    def build(r: int) -> None:
        pgs[r], _ = be.build_group(torch.distributed.PrefixStore("s/", store), r, 2, name=f"s/g{r}", global_ranks=(0, 1),
                                   connect_timeout_s=10.0, timeout_s=30.0)

    ths = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(30)
    assert all(pgs), "the two-rank gloo group was not built"
    late = torch.full((2,), 2.0)
    joined = threading.Timer(0.3, lambda: pgs[1].allreduce([late]).wait())
    joined.start()
    t = torch.full((2,), 1.0)
    work = pgs[0].allreduce([t])
    with pytest.raises(RuntimeError):
        work.wait(datetime.timedelta(seconds=0.02))
    assert not work.is_completed()
    B.wait_bounded(work, 10.0, sliced=True, check_every_s=0.02)
    joined.join(10)
    assert t.tolist() == [3.0, 3.0] and late.tolist() == [3.0, 3.0]


def test_wait_bounded_on_a_real_gloo_work_and_the_op_error():
    be = B.backend("gloo")
    pg, _rec = be.build_group(torch.distributed.PrefixStore("t/", torch.distributed.HashStore()), 0, 1, name="t/g1",
                              global_ranks=(0,), connect_timeout_s=10.0, timeout_s=30.0)
    t = torch.full((2,), 3.0)
    B.wait_bounded(pg.allreduce([t]), 10.0)
    assert t.tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match="boom"):
        B.wait_bounded(FakeWork(completes_after=0, error=ValueError("boom")), 1.0)


# ---- phase 6: placement and the checksum ------------------------------------------------------------------

class Placed(Exception):
    pass


def test_validation_tensors_are_placed_on_the_backends_device(monkeypatch):
    """Phase 6 asks the group's backend for the device (NCCL: the bound CUDA device; here a stand-in,
    ``meta``) and builds its tensors there, not on the CPU."""
    seen = []

    class Group:
        def allreduce(self, tensors):
            seen.extend(t.device for t in tensors)
            raise Placed

    class OnMeta:
        def device_for(self, pg):
            return torch.device("meta")

    monkeypatch.setattr(E, "backend_of", lambda pg: OnMeta())  # the engine binds backend_of at import
    from accelpact.impl.hooks import NO_HOOKS

    pact = types.SimpleNamespace(hooks=NO_HOOKS, groups=types.SimpleNamespace(members=(0, 1)), deadline_s=5.0)
    with pytest.raises(Placed):
        R.Pact._validate(pact, Episode(0, True, (0,), 0, 0, None, new_pg=Group()))
    assert seen == [torch.device("meta")]
    m, opt = tiny_state()
    assert D.state_checksum(m, opt, torch.device("meta")).device.type == "meta"


def test_checksum_equals_on_replicas_and_is_exact_modulo_2_64(monkeypatch):
    """Two identical replicas agree; each tensor's (S, W) equals a pure-Python reference modulo
    2**64 for every dtype width, across block boundaries (small blocks forced)."""
    a, oa = tiny_state()
    b, ob = tiny_state()
    assert torch.equal(D.state_checksum(a, oa), D.state_checksum(b, ob))
    monkeypatch.setattr(D, "_BLOCK_CPU", 2 * D._ROW)
    mask = (1 << 64) - 1
    g = torch.Generator().manual_seed(1)
    cases = [torch.randn(5000, generator=g), torch.randn(3001, generator=g).to(torch.bfloat16),
             torch.randn(2500, generator=g).double(), torch.tensor([2**63 - 1, 2**63 - 1, -2**63, 5]),
             torch.rand(77, generator=g) > 0.5, torch.zeros(0), torch.randn(4, 6, generator=g)[:, ::2]]
    for t in cases:
        x = [int(v) for v in D._int_view(t).tolist()]
        s, w = D._tensor_sums(t)
        assert int(s) & mask == sum(x) & mask, t.dtype
        assert int(w) & mask == sum((i + 1) * v for i, v in enumerate(x)) & mask, t.dtype


def _flip(t, index: int, bit: int) -> None:
    bits = t.data.reshape(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    bits[index] ^= (1 << bit) if bit < 8 * t.element_size() - 1 else -(1 << bit)


def test_checksum_catches_every_single_bit_flip():
    """A one-bit flip anywhere (low, exponent and sign bits; parameters and optimizer state;
    float32, bfloat16, float64) changes the checksum; flipping it back restores it."""
    m, opt = tiny_state()
    m.extra_bf16 = torch.nn.Parameter(torch.randn(9).to(torch.bfloat16))
    m.extra_f64 = torch.nn.Parameter(torch.randn(5).double())
    base = D.state_checksum(m, opt)
    targets = [(p, [0, 1, 10, 22, 23, 30, 31] if p.element_size() == 4 else
                [0, 7, 14, 15] if p.element_size() == 2 else [0, 31, 52, 62, 63]) for p in m.parameters()]
    st = opt.state[m[0].weight]
    targets += [(st["exp_avg"], [0, 23, 31]), (st["exp_avg_sq"], [3, 31])]
    checked = 0
    for t, bits in targets:
        for index in {0, t.numel() // 2, t.numel() - 1}:
            for bit in bits:
                _flip(t, index, bit)
                assert not torch.equal(D.state_checksum(m, opt), base), (tuple(t.shape), t.dtype, index, bit)
                _flip(t, index, bit)
                checked += 1
    assert torch.equal(D.state_checksum(m, opt), base) and checked > 100


def test_checksum_catches_swaps_layout_and_step_count():
    m, opt = tiny_state()
    base = D.state_checksum(m, opt)
    w = m[0].weight
    with torch.no_grad():
        w.view(-1)[[0, 1]] = w.view(-1)[[1, 0]].clone()  # same values, swapped positions: only W sees it
    assert not torch.equal(D.state_checksum(m, opt), base)
    m2, opt2 = tiny_state()
    m2[0].weight.data = m2[0].weight.data.reshape(8, 16).clone()  # same bits, another shape
    assert not torch.equal(D.state_checksum(m2, opt2), base)
    m3, opt3 = tiny_state()
    for s in opt3.state.values():
        s["step"] += 1
    assert not torch.equal(D.state_checksum(m3, opt3), base)
    assert D.checksum_hex(base) == D.checksum_hex(D.state_checksum(*tiny_state())) and len(D.checksum_hex(base)) == 48


# ---- replace: the new group, its timeout, registration through the abort ------------------------------------

def test_new_group_keeps_the_old_groups_training_timeout():
    """The phase deadline bounds building R's new group; its collectives keep R's training timeout."""
    from accelpact.impl.runtime.replace import ReplaceAndRebind

    be = B.backend("gloo")
    store = torch.distributed.HashStore()
    old, _ = be.build_group(torch.distributed.PrefixStore("old/", store), 0, 1, name="old", global_ranks=(0,),
                            connect_timeout_s=5.0, timeout_s=77.0)
    assert be.timeout_of(old) == 77.0 and B.backend_of(old) is be
    new = ReplaceAndRebind("t/").replace(old, 1, (0,), 0, store, 3.0, name="world")
    assert be.timeout_of(new) == 77.0
    assert str(new.group_name) == "t/g1/pg/world" and B.backend_of(new) is be
    t = torch.ones(1)
    B.wait_bounded(new.allreduce([t]), 10.0)
    assert float(t[0]) == 1.0


def test_backend_abort_is_per_group_once_and_a_no_op_for_sockets_backends():
    class Group:
        aborts = 0

        def abort(self):
            self.aborts += 1

    g = Group()
    assert B.backend("nccl").abort(g) is True and B.backend("nccl").abort(g) is False and g.aborts == 1
    assert B.backend("gloo").abort(Group()) is False


def test_backend_config_is_what_new_group_registers():
    """``cuda:nccl`` as ``new_group(backend="nccl")`` registers it; gloo's CPU part of ``cpu:gloo,cuda:gloo``."""
    from torch.distributed.distributed_c10d import BackendConfig

    for b in B.BACKENDS.values():
        assert b.backend_config in str(BackendConfig(b.name)).split(","), b
    assert B.backend("nccl").backend_config == "cuda:nccl"


def registration_rank(ctx) -> dict:
    """Rank function (2 ranks, default gloo group): R revoked by abort keeps its registration; the
    rebound group carries R's name; aborting the default group touches no other group."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from accelpact.impl.runtime.adapters import adopt_group_name
    from accelpact.impl.runtime.replace import ReplaceAndRebind

    td = datetime.timedelta
    w = c10d._world
    control = dist.new_group([0, 1], backend="gloo", timeout=td(seconds=30))
    r, _rec = revoke.recorded(lambda: dist.new_group([0, 1], backend="gloo", timeout=td(seconds=45)))
    name = str(w.pg_names[r])
    revoke.hard_close(revoke.SocketRecord("nccl", group_ref=weakref.ref(r)))  # the NCCL revoke: an abort
    out: dict = {"name": name, "after_abort": str(w.pg_names.get(r))}
    try:
        out["after_abort_ranks"] = dist.get_process_group_ranks(r)
    except (ValueError, RuntimeError, KeyError) as exc:
        out["after_abort_ranks"] = repr(exc)
    new = ReplaceAndRebind("t/").replace(r, 1, (0, 1), ctx.rank, ctx.store, 20.0, name="world")
    adopt_group_name(r, new)  # phase 5's move of the c10d name (every adapter's rebind ends with it)
    out["new"] = {"group_name": str(new.group_name), "resolved": c10d._resolve_process_group(name) is new,
                  "ranks": dist.get_process_group_ranks(new), "old_registered": r in w.pg_names,
                  "backend": w.pg_map[new][0], "config": w.pg_backend_config[new],
                  "timeout_s": B.backend("gloo").timeout_of(new)}
    t = torch.ones(1)
    dist.all_reduce(t, group=new)
    out["new_sum"] = float(t[0])
    revoke.hard_close(revoke.SocketRecord("nccl", group_ref=weakref.ref(ctx.group)))  # R = the default group
    out["control_registered"] = control in w.pg_names and ctx.group in w.pg_names
    u = torch.ones(1)
    dist.all_reduce(u, group=control)
    out["control_sum"] = float(u[0])
    return out


@pytest.mark.multiproc
def test_abort_keeps_registration_and_the_rebound_group_takes_the_old_name(ranks):
    run = ranks.run(registration_rank, 2, init_group=True, timeout_s=120)
    for res in run.values():
        name = res["name"]
        assert res["after_abort"] == name and res["after_abort_ranks"] == [0, 1], res
        assert res["new"] == {"group_name": name, "resolved": True, "ranks": [0, 1], "old_registered": False,
                              "backend": "gloo", "config": "cpu:gloo", "timeout_s": 45.0}, res
        assert res["new_sum"] == 2.0 and res["control_registered"] and res["control_sum"] == 2.0, res


# ---- the guard's drain ----------------------------------------------------------------------------------------

def test_guard_drains_with_a_bound_instead_of_a_device_wide_sync(monkeypatch):
    """Parameters on a non-CPU device: the guard asks that device's backend to drain the current
    stream within its bound; a stream still busy past it fails the guard (L2)."""
    from accelpact.impl.guard import BoundaryGuard

    asked = []

    class Busy:
        def drain(self, device, timeout_s):
            asked.append((device.type, timeout_s))
            return False

    monkeypatch.setattr(B, "for_device", lambda device: Busy())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("device-wide synchronize"))
    m = torch.nn.Linear(2, 2, device="meta")
    guard = BoundaryGuard(m, torch.optim.SGD(m.parameters(), lr=0.1), sync_timeout_s=0.25)
    report = guard.check()
    assert asked == [("meta", 0.25)]
    assert not report.ok and any("did not finish within 0.25 s" in r for r in report.reasons), report
    guard.remove()
    cpu = torch.nn.Linear(2, 2)
    assert BoundaryGuard(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1)).check().ok
    assert B.backend("gloo").drain(torch.device("cpu"), 0.0) is True


# ---- the contract: an unqualified platform; qualify on cuda-nccl -------------------------------------------

def test_unqualified_platform_decides_l2_with_how_to_qualify_it():
    key = ObservationKey("cuda-nccl", "ddp", "boundary", DEFAULT_OBJECTIVE)
    d = decide(default_envelope(), key, guards_ok=True)
    assert d.level == "L2" and "outside the envelope" in d.reason
    assert "not qualified" in d.reason and "accelpact qualify --backend nccl" in d.reason and "envelope" in d.reason
    assert unqualified_notice(default_envelope(), "cuda-nccl") in d.reason
    assert unqualified_notice(default_envelope(), "cpu-gloo") is None
    qualified = envelope_from_mapping({"format": "accelpact-envelope/1", "entries": [
        {"platform": "cuda-nccl", "profile": "ddp", "phase": "boundary", "objective": DEFAULT_OBJECTIVE, "actions": ["L1", "L2"]}]})
    assert unqualified_notice(qualified, "cuda-nccl") is None and decide(qualified, key, True).level == "L1"
    other = decide(qualified, ObservationKey("cuda-nccl", "hsdp", "boundary", DEFAULT_OBJECTIVE), True)
    assert other.level == "L2" and "not qualified" not in other.reason  # the platform is known; the cell is not


def test_qualify_produces_cuda_nccl_cells_run_under_a_trial_envelope(tmp_path, monkeypatch):
    """``accelpact qualify --backend nccl``: cells keyed ``cuda-nccl``; each runs under a trial envelope
    admitting L1 at its boundary (the default would decide L2 and L1 could never be qualified); gloo
    runs under the default, as before."""
    import argparse

    from accelpact.conformance import cli_qualify, runner
    from accelpact.model.contract import load_envelope

    calls = []

    class Rep:
        conforms, problems = True, []

    def fake(sc, **kw):
        calls.append((sc.name, kw.get("backend"), kw.get("envelope")))
        return Rep()

    monkeypatch.setattr(runner, "run_scenario", fake)
    monkeypatch.setattr(B.Backend, "unavailable", lambda self, world: None)
    out = tmp_path / "env.json"
    ns = argparse.Namespace(backend="nccl", trials=1, out=str(out), wrappers="ddp", phases="boundary,forward",
                            work=str(tmp_path / "w"), list=False)
    assert cli_qualify.run(ns) == 0
    env = load_envelope(out)
    assert {(e.key.platform, e.key.profile, e.key.phase, e.actions) for e in env.entries} == {
        ("cuda-nccl", "ddp", "boundary", ("L1", "L2")), ("cuda-nccl", "ddp", "forward", ("L1", "L2"))}  # a discard in place (P17)
    for _name, be, trial in calls:
        assert be == "nccl" and trial is not None
        key = ObservationKey("cuda-nccl", "ddp", "boundary", DEFAULT_OBJECTIVE)
        assert decide(load_envelope(trial), key, True).level == "L1"
    calls.clear()
    assert cli_qualify.run(argparse.Namespace(**{**vars(ns), "backend": "gloo", "out": str(tmp_path / "g.json")})) == 0
    assert calls and all(trial is None for _n, _b, trial in calls)


# ---- the NCCL environment, read against torch 2.13 -----------------------------------------------------------

def test_nccl_env_names_are_the_ones_torch_reads():
    """Each variable of NCCL_ENV is declared in the installed ProcessGroupNCCL.hpp (when the header
    ships), and torchrun's agent passes TORCH_NCCL_ASYNC_ERROR_HANDLING=1 only when its own
    environment does not set it (so the worker's own setting, before any group, is what counts)."""
    header = TORCH_DIR / "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
    if header.exists():
        text = header.read_text()
        for name in B.NCCL_ENV:
            assert f'"{name}"' in text, name
        assert "CleanUpOnly = 2" in text
    agent = (TORCH_DIR / "distributed/elastic/agent/server/local_elastic_agent.py").read_text()
    assert '"TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv(' in agent
    assert B.NCCL_ENV["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_prepare_process_sets_the_nccl_env_over_torchruns(monkeypatch):
    """NCCL: every NCCL_ENV variable set (torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 overridden) and
    the rank's device made current; gloo: the CPU, the environment untouched."""
    for k in B.NCCL_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    assert B.backend("gloo").prepare_process(3) == torch.device("cpu")
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    current = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(d))
    dev = B.backend("nccl").prepare_process(3)
    assert dev == torch.device("cuda", 3) and current == [dev]
    assert {k: os.environ.get(k) for k in B.NCCL_ENV} == B.NCCL_ENV
    assert B.backend("nccl").init_kwargs(dev) == {"device_id": dev} and B.backend("gloo").init_kwargs(dev) == {}


def test_gpu_check_skips_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: run `python -m accelpact.bench.gpu_check` itself")
    proc = subprocess.run([sys.executable, "-m", "accelpact.bench.gpu_check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["ok"] is None and "no CUDA" in res["skipped"]

