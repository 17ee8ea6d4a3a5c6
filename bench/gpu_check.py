"""``python -m accelpact.bench.gpu_check``: the engine's NCCL paths on one GPU, as one prepared script.

Seven sub-checks, each a world-size-1 job of its own (a TCPStore on loopback hosted by this process,
one rank in a child process started, bounded and reaped by :func:`accelpact.testing.run_ranks`), so
that one failing or hanging sub-check costs its own bound and no other's.  Every rank begins with
``Backend.prepare_process(0)`` (the NCCL error-handling environment of :data:`NCCL_ENV`, ``cuda:0``
current) and ``init_process_group("nccl", device_id=cuda:0)``.

``watchdog_timeout`` (bound 80 s)
    A real NCCL watchdog timeout: a 1-rank NCCL group with a 2 s collective timeout, warmed by one
    all-reduce; then ``torch.cuda._sleep`` spinning about 8 s on the current stream and an
    all-reduce queued behind it.  The watchdog times the work out and, in
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``, aborts the group's communicators and raises nothing.
    Checks: no error before; ``get_error()`` on the group's backend (:func:`backend_error`) says
    ``TIMEOUT``; the engine's boundary check (:func:`recorded_errors` over the group's revoke record)
    names the group; the process survives (the default group still all-reduces, a new NCCL group
    builds and all-reduces).  Also reported, not judged: ``is_completed()``/``exception()`` of the
    timed-out work and when the error became visible.
``ddp_repair`` (bound 100 s)
    DDP over R on ``cuda:0``, ``attach`` with the candidate envelope of the ``(cuda-nccl, ddp)`` cell,
    a ``collective_timeout`` fault at step 1's boundary (the injector aborts R's communicator); the
    engine observes it, guards (stream drain), agrees, replaces (a new NCCL communicator, bound,
    eagerly connected, with R's training timeout), rebinds (DDP's reducer, the c10d name), validates
    (all-reduce and the state checksum on CUDA) and releases; training goes on.  Checks: generation 1,
    one repair, the new group's backend/device/timeout/name/registration, the default and control
    groups after R's abort, a collective on the new group, the guard's bounded drain behind a queued
    kernel.
``real_timeout_repair`` (bound 120 s)
    A genuine NCCL timeout of R met by the engine (issue 26 item 5): DDP over R (a 1-rank NCCL group
    with a 3 s collective timeout) on ``cuda:0``, the engine attached as in ``ddp_repair``; at step 1's
    boundary an injector of this script applies :func:`accelpact.testing.nccl_timeout.nccl_timeout`
    (the fault point is just before the boundary all-reduce: ``torch.cuda._sleep`` spins the current
    stream 5 s, so the all-reduce on R cannot start before its timeout).  Nothing is aborted from
    outside: NCCL's own timeout (the boundary wait's ``work.wait(timeout)``, or its watchdog) ends the
    collective, and the engine observes it at the boundary and repairs R in place.  Checks: one
    repair, generation 1, the RankObserve at the boundary (not in flight), the observation later than
    the timeout's start and its error named, training goes on with finite losses on the new group.
``fsdp2_boundary`` (bound 100 s)
    FSDP2 (``fully_shard`` per layer and at the root, on the 1x1 (replicate, shard) mesh of
    :func:`accelpact.impl.launch.workload.build_groups` over NCCL groups bound to ``cuda:0``) with the engine
    attached (``fsdp2-hybrid``, R = the replicate group) through two steps and their boundaries.
    Checks: no repair, generation 0, finite losses, the parameters' shards on the device, the guard
    clean, no group with a recorded backend error.
``swap_blob_exchange`` (bound 50 s)
    The hot swap's point-to-point exchange between two NCCL ranks on the one GPU (each its own
    ``NCCL_HOSTID``, channels over loopback sockets: :data:`ONE_GPU_PAIR_ENV`):
    :func:`accelpact.impl.runtime.hotswap.exchange_in_place` of a CPU int64 (the blob size) and a CPU
    uint8 blob (1 MiB) through the device and written back into the receiver's CPU tensors, of a CUDA
    tensor sent as it is; then :func:`accelpact.impl.runtime.hotswap.transfer` from rank 0 (two AdamW
    steps, its CPU ``step`` included) into rank 1's fresh model.  Checks: the written-back values,
    the placement, the state received into the spare's own parameter storage and equal to the
    source's (the two state checksums).
``state_checksum`` (bound 50 s)
    :func:`accelpact.impl.runtime.digest.state_checksum` on CUDA (model and AdamW state): an int64 vector on
    the device, the same twice, the same as a CPU copy's, changed by one flipped bit and restored.
``device_rng_rerun`` (bound 30 s)
    The GPU RNG kept (issue 43 item 2): the workload's ``CharLM`` with dropout on ``cuda:0``; the state at
    "F" (:func:`accelpact.impl.runtime.rng.capture`), one training-mode forward, then "RNG back to F"
    (:func:`accelpact.impl.runtime.rng.restore`) and the forward again; and a checkpoint
    (:class:`~accelpact.impl.runtime.checkpoint.CheckpointManager`, world 1) saved, drawn past and loaded.
    Checks: dropout draws; the rerun equals the run, also after the checkpoint load; the CUDA state was
    captured and restoring the CPU generator alone gives a different rerun (the defect the restore fixes).

Prints one JSON object (the last line): ``ok`` and, per sub-check, ``ok`` (true/false; null where it
did not run) with its observations.  Exit codes: **0** every sub-check passed; **1** any failed or
ran past its bound; **0** with ``{"ok": null, "skipped": reason}`` on a machine without CUDA (the
contract tests/test_backend_paths.py and conformance/conftest.py rely on; tell a skip from a pass by
``ok``).  The JSON also says whether this torch binds ``get_error`` on ``ProcessGroupNCCL``
(``get_error_bound``: the boundary's only view of a silently aborted group, spec/nccl.md row 17),
before any sub-check runs.  The sub-checks' bounds add up to 530 s; ``--timeout`` (default 540 s) caps the total
(``bench/device_check.sh`` runs it under ``--timeout 150``: the six sub-checks of then took 69.4 s on the first
lent GPU, bench/nccl-log.md).
``--only a,b`` runs some sub-checks.  ``--backend gloo`` runs the backend-neutral ones
(``fsdp2_boundary``, ``swap_blob_exchange``, ``state_checksum``, ``device_rng_rerun``) on the CPU: the CPU suite's check of
the script itself (tests/test_gpu_check.py), never evidence about NCCL.  spec/nccl.md, "Running on one
lent GPU".
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from typing import Any

from accelpact.impl.controlplane import ControlPlane, PREFIX
from accelpact.impl.hooks import Hooks
from accelpact.impl.launch.job import Topology
from accelpact.impl.launch.workload import CharLM, DataCursor, WorkloadSpec, build_groups, vocab_size
from accelpact.impl.recovery import PactGroups, attach
from accelpact.impl.rundir import RunDir
from accelpact.impl.runtime import digest, revoke, rng
from accelpact.impl.runtime.checkpoint import CheckpointManager
from accelpact.impl.runtime.backends import NCCL_ENV, backend, backend_error, backend_of, recorded_errors, wait_bounded
from accelpact.impl.runtime.digest import checksum_hex, state_checksum
from accelpact.impl.runtime.hotswap import exchange_in_place, transfer
from accelpact.impl.trace import Trace
from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey, default_envelope
from accelpact.testing import run_ranks
from accelpact.testing.faults import Fault, FaultContext, FaultInjector, FaultPlan
from accelpact.testing.nccl_timeout import SPIN_MARGIN_S, cycles_per_second, nccl_timeout

__all__ = ["EXIT_FAILED", "SUBCHECKS", "ddp_repair", "device_checksum", "device_rng_rerun", "fsdp2_boundary", "get_error_binding", "main",
           "real_timeout_repair", "swap_blob_exchange", "watchdog_timeout"]

#: Exit code of a run with a failed (or timed-out) sub-check; a pass and a skip (no CUDA) both exit 0.
EXIT_FAILED = 1
def _registration(pg) -> dict[str, Any]:
    """What c10d's registries say about ``pg`` (None fields: not registered)."""
    import torch.distributed.distributed_c10d as c10d

    w = c10d._world
    name = w.pg_names.get(pg)
    return {"name": None if name is None else str(name), "backend": (w.pg_map.get(pg) or (None, None))[0],
            "config": w.pg_backend_config.get(pg), "ranks": sorted(w.pg_group_ranks.get(pg, {}))}



def ddp_repair(ctx, steps: int = 4, fault_step: int = 1, deadline_s: float = 30.0, collective_timeout_s: float = 120.0) -> dict:
    """Sub-check ``ddp_repair`` (world size 1): see the module doc.  Returns the observations and ``ok``."""
    import os

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    be = backend("nccl")
    dev = be.prepare_process(0)
    res: dict[str, Any] = {"device": str(dev), "env": {k: os.environ.get(k) for k in NCCL_ENV},
                           "torch": torch.__version__, "cuda": torch.version.cuda}
    td = datetime.timedelta
    dist.init_process_group("nccl", store=dist.PrefixStore("pg/", ctx.store), rank=0, world_size=1,
                            timeout=td(seconds=collective_timeout_s), **be.init_kwargs(dev))
    default = c10d._get_default_group()
    control_group = dist.new_group(backend="gloo", timeout=td(seconds=deadline_s))
    r_group, record = revoke.recorded(lambda: dist.new_group([0], backend="nccl", timeout=td(seconds=collective_timeout_s),
                                                             device_id=dev), "nccl")
    res["old"] = {"registration": _registration(r_group), "timeout_s": be.timeout_of(r_group)}

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dev),
                process_group=r_group, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    control = ControlPlane(dist.PrefixStore("cp/", ctx.store), 0, 1, prefix=PREFIX)
    header = {"world": 1, "nodes": 1, "ranks_per_node": 1, "group": "world", "affected": [0], "attempt": 0,
              "scenario": "gpu-check", "seed": 0, "backend": "nccl", "frontier_at_start": 0}
    trace = Trace(RunDir(ctx.out).trace(0, 0), 0, header)
    plan = FaultPlan.from_list([{"step": fault_step, "at": "boundary", "kind": "collective_timeout", "ranks": [0],
                                 "group": "world"}])
    key = ObservationKey(be.platform, "ddp", "boundary", DEFAULT_OBJECTIVE)
    pact = attach(model, opt, groups=PactGroups(control=control_group, affected=r_group, members=(0,), record=record,
                                                name="world"),
                  control=control, trace=trace, envelope=default_envelope(platform=be.platform, profiles=("ddp",)),
                  key=key, deadline_s=deadline_s, hooks=Hooks(injector=FaultInjector(plan, fenced_points=())))
    old_name = res["old"]["registration"]["name"]
    del r_group  # the engine must hold the only references from here on (it drops the old group at the repair)
    losses = []
    for step in range(steps):
        with pact.step(step):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(6, 8, generator=g).to(dev)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        pact.boundary(loss)
        losses.append(pact.last_loss)
    new = pact.process_group
    res["generation"] = pact.gen
    res["repairs"] = len(pact.reports)
    res["losses"] = losses
    res["new"] = {"backend": backend_of(new).name, "bound_device": str(getattr(new, "bound_device_id", None)),
                  "timeout_s": be.timeout_of(new), "group_name": str(new.group_name),
                  "registration": _registration(new)}
    validate = [r for r in RunDir(ctx.out).records(0, 0) if r.get("action") == "RankValidate"]
    res["validate_digest"] = (validate[-1].get("detail") or {}).get("digest") if validate else None
    u = torch.ones(1, device=dev)
    new.allreduce([u]).wait(td(seconds=deadline_s))
    res["new_allreduce"] = float(u[0])
    v = torch.ones(1, device=dev)
    dist.all_reduce(v)  # the default group: R's abort must not have touched it
    res["default_allreduce"] = float(v[0])
    res["default_registered"] = _registration(default)["name"] is not None
    res["control_registered"] = _registration(control_group)["name"] is not None
    # the guard's drain: a queued spin kernel on the current stream is not waited for past the bound
    drain: dict[str, Any] = {}
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(3e9))  # about a second of spinning on the current stream
        t0 = time.monotonic()
        drain["bounded_returned"] = be.drain(dev, 0.05)
        drain["bounded_s"] = time.monotonic() - t0
        drain["then_drained"] = be.drain(dev, 60.0)
    t0 = time.monotonic()
    report = pact.guard.check()
    drain["guard_ok"] = report.ok
    drain["guard_reasons"] = list(report.reasons)
    drain["guard_s"] = time.monotonic() - t0
    res["drain"] = drain
    pact.close()
    trace.close()
    checks = {
        "error handling env set": res["env"] == NCCL_ENV,
        "one repair, generation 1": res["generation"] == 1 and res["repairs"] == 1,
        "new group runs nccl, bound to the device": res["new"]["backend"] == "nccl" and res["new"]["bound_device"] == str(dev),
        "new group has R's training timeout": res["new"]["timeout_s"] == res["old"]["timeout_s"],
        "new group carries R's c10d name": res["new"]["group_name"] == old_name and res["new"]["registration"]["name"] == old_name,
        "new group registered as nccl on cuda": (res["new"]["registration"]["backend"] == "nccl"
                                                 and res["new"]["registration"]["config"] == be.backend_config),
        "validated with a checksum": bool(res["validate_digest"]),
        "collective on the new group": res["new_allreduce"] == 1.0,
        "default and control groups survive R's abort": (res["default_allreduce"] == 1.0 and res["default_registered"]
                                                          and res["control_registered"]),
        "guard drain bounded": drain.get("bounded_returned") is False and drain.get("then_drained") is True
                               and drain["guard_ok"],
    }
    res["checks"] = checks
    res["ok"] = all(checks.values())
    return res


def real_timeout_repair(ctx, steps: int = 4, fault_step: int = 1, r_timeout_s: float = 3.0, deadline_s: float = 30.0) -> dict:
    """Sub-check ``real_timeout_repair`` (world size 1): see the module doc."""
    import math
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    be, dev = _start(ctx, "nccl", 60.0)
    td = datetime.timedelta
    res: dict[str, Any] = {"device": str(dev), "env": {k: os.environ.get(k) for k in NCCL_ENV},
                           "r_timeout_s": r_timeout_s, "spin_s": r_timeout_s + SPIN_MARGIN_S}
    control_group = dist.new_group(backend="gloo", timeout=td(seconds=deadline_s))
    r_group, record = revoke.recorded(lambda: dist.new_group([0], backend="nccl", timeout=td(seconds=r_timeout_s),
                                                             device_id=dev), "nccl")
    res["r_timeout_read"] = be.timeout_of(r_group)
    res["sleep_cycles_per_s"] = cycles_per_second(dev)
    torch.manual_seed(0)
    model = DDP(_small_model(dev), process_group=r_group, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    control = ControlPlane(dist.PrefixStore("cp/", ctx.store), 0, 1, prefix=PREFIX)
    header = {"world": 1, "nodes": 1, "ranks_per_node": 1, "group": "world", "affected": [0], "attempt": 0,
              "scenario": "gpu-check-real-timeout", "seed": 0, "backend": "nccl", "frontier_at_start": 0}
    trace = Trace(RunDir(ctx.out).trace(0, 0), 0, header)
    fault = Fault(fault_step, "boundary", "collective_timeout", (0,), "world")  # only .group is read by the effect
    struck: list[float] = []

    def injector(point: str, pact) -> None:
        if point == "boundary" and pact.step_index == fault_step and not struck:
            struck.append(time.monotonic())
            nccl_timeout(fault, FaultContext(pact.trace, pact.rank, pact.gen, pact.model_view(), pact.group_records()))

    key = ObservationKey(be.platform, "ddp", "boundary", DEFAULT_OBJECTIVE)
    pact = attach(model, opt, groups=PactGroups(control=control_group, affected=r_group, members=(0,), record=record,
                                                name="world"),
                  control=control, trace=trace, envelope=default_envelope(platform=be.platform, profiles=("ddp",)),
                  key=key, deadline_s=deadline_s, hooks=Hooks(injector=injector))
    del r_group
    losses = []
    observed_at = None
    for step in range(steps):
        with pact.step(step):
            loss = _one_step(model, opt, dev, step)
        pact.boundary(loss)
        if step == fault_step:
            observed_at = time.monotonic()
        losses.append(pact.last_loss)
    res["generation"] = pact.gen
    res["repairs"] = len(pact.reports)
    res["losses"] = losses
    res["boundary_s"] = round(observed_at - struck[0], 3) if struck and observed_at else None
    res["observe_ms"] = round(pact.reports[0].observe_ns / 1e6, 1) if pact.reports else None
    obs = [r for r in RunDir(ctx.out).records(0, 0) if r.get("action") == "RankObserve"]
    res["observe"] = [{"point": (o.get("state") or {}).get("point"), "in_flight": (o.get("detail") or {}).get("in_flight"),
                       "error": (o.get("detail") or {}).get("error")} for o in obs]
    res["new_backend"] = backend_of(pact.process_group).name
    pact.close()
    trace.close()
    first = res["observe"][0] if res["observe"] else {}
    return _finish(res, {
        "error handling env set": res["env"] == NCCL_ENV,
        "R built with the short timeout": res["r_timeout_read"] == r_timeout_s,
        "the spin was queued at step 1's boundary": bool(struck),
        "one repair, generation 1": res["generation"] == 1 and res["repairs"] == 1,
        "observed at the boundary, not in flight, with an error": (len(res["observe"]) == 1 and first.get("point") == "boundary"
                                                                   and not first.get("in_flight") and bool(first.get("error"))),
        "training goes on on a new NCCL group": (res["new_backend"] == "nccl" and len(losses) == steps
                                                 and all(isinstance(x, float) and math.isfinite(x) for x in losses)),
    })


def get_error_binding() -> dict[str, Any]:
    """Where this torch binds ``get_error`` (spec/nccl.md row 17), without a process group or a device:
    on ``ProcessGroupNCCL`` (what ``pg._get_backend(cuda)`` returns, so what the boundary reads), on the base
    ``Backend`` (not expected), and whether :meth:`Backend.error_query_problem` lets an NCCL job run."""
    import torch
    import torch.distributed as dist

    c10d = torch._C._distributed_c10d
    cls = getattr(dist, "ProcessGroupNCCL", None)
    return {"ProcessGroupNCCL": None if cls is None else callable(getattr(cls, "get_error", None)),
            "Backend": hasattr(c10d.Backend, "get_error"), "problem": backend("nccl").error_query_problem()}


def _start(ctx, backend_name: str = "nccl", timeout_s: float = 120.0, world: int = 1):
    """``prepare_process(0)`` (every rank on the one device) and the default group of ``world`` ranks
    on ``backend_name``: (backend, device)."""
    import torch.distributed as dist

    be = backend(backend_name)
    dev = be.prepare_process(0)
    dist.init_process_group(be.name, store=dist.PrefixStore("pg/", ctx.store), rank=ctx.rank if world > 1 else 0,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s), **be.init_kwargs(dev))
    return be, dev


def _finish(res: dict, checks: dict[str, bool]) -> dict:
    res["checks"] = checks
    res["ok"] = all(checks.values())
    return res


def _value(fn) -> Any:
    """``fn()``, or what it raised (as text): an observation, never a failure of the sub-check."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a reported observation: whatever the call raises is the answer
        return f"raised {type(exc).__name__}: {exc}"


def watchdog_timeout(ctx, short_timeout_s: float = 2.0, sleep_s: float = 8.0, wait_s: float = 45.0) -> dict:
    """Sub-check ``watchdog_timeout``: see the module doc."""
    import os

    import torch
    import torch.distributed as dist

    be, dev = _start(ctx, "nccl", 60.0)
    td = datetime.timedelta
    res: dict[str, Any] = {"device": str(dev), "env": {k: os.environ.get(k) for k in NCCL_ENV},
                           "short_timeout_s": short_timeout_s, "sleep_s": sleep_s}
    short, record = revoke.recorded(lambda: dist.new_group([0], backend="nccl", timeout=td(seconds=short_timeout_s),
                                                           device_id=dev), "nccl")
    t = torch.ones(1, device=dev)
    wait_bounded(short.allreduce([t]), 30.0)
    torch.cuda.synchronize(dev)
    res["before"] = {"error": backend_error(short), "recorded": recorded_errors({"short": record}),
                     "allreduce": float(t[0])}
    # calibrate the spin kernel: cycles per second of torch.cuda._sleep on this GPU
    torch.cuda._sleep(1000)  # warm: the first launch's cost out of the measurement
    torch.cuda.synchronize(dev)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(int(2e8))
    e1.record()
    e1.synchronize()
    cps = min(max(2e8 / max(e0.elapsed_time(e1) / 1000.0, 1e-6), 1e8), 1e10)
    res["sleep_cycles_per_s"] = cps
    torch.cuda._sleep(int(cps * sleep_s))  # the current stream spins; the collective's stream waits on it
    x = torch.ones(1, device=dev)
    t0 = time.monotonic()
    work = short.allreduce([x])  # queued behind the spin: runs past the group's timeout
    err = None
    while time.monotonic() - t0 < wait_s:
        err = backend_error(short)
        if err is not None:
            break
        time.sleep(0.05)
    res["error"] = err
    res["error_seen_after_s"] = round(time.monotonic() - t0, 3)
    res["recorded"] = recorded_errors({"short": record})
    # the same check with no record at all: the scan of every process group of the process (c10d's
    # pg_map), as a user's own NCCL group or the default group is checked (spec/nccl.md row 25)
    res["unrecorded"] = recorded_errors({})
    res["short_name"] = _registration(short)["name"]
    res["work_is_completed"] = _value(work.is_completed)
    res["work_exception"] = _value(lambda: repr(work.exception()))
    # the spin ends; whatever the aborted communicator's queued kernel does then is part of the answer,
    # so each step is an observation (text when it raised) rather than the end of the sub-check
    def synchronize():
        torch.cuda.synchronize(dev)
        return "ok"

    res["synchronize"] = _value(synchronize)

    def default_allreduce():
        v = torch.ones(1, device=dev)
        dist.all_reduce(v)  # the default group: a communicator of its own, untouched by the short group's abort
        return float(v[0])

    def fresh_allreduce():
        fresh = dist.new_group([0], backend="nccl", timeout=td(seconds=30), device_id=dev)
        u = torch.ones(1, device=dev)
        wait_bounded(fresh.allreduce([u]), 30.0)
        res["fresh_error"] = backend_error(fresh)
        return float(u[0])

    res["default_allreduce"] = _value(default_allreduce)
    res["fresh_allreduce"] = _value(fresh_allreduce)
    res["short_error_after"] = _value(lambda: backend_error(short))
    return _finish(res, {
        "error handling env set": res["env"] == NCCL_ENV,
        "no error before the timeout": res["before"]["error"] is None and res["before"]["recorded"] == {}
                                       and res["before"]["allreduce"] == 1.0,
        "get_error() says TIMEOUT": err == "TIMEOUT",
        "recorded_errors (the boundary check) names the group": res["recorded"] == {"short": "TIMEOUT"},
        "the scan of every process group names it without a record": res["unrecorded"] == {res["short_name"]: "TIMEOUT"},
        "the process survives: device synchronizes, default group works": (res["synchronize"] == "ok"
                                                                           and res["default_allreduce"] == 1.0),
        "a new NCCL group builds and works": res["fresh_allreduce"] == 1.0 and res.get("fresh_error") is None,
    })


def _small_model(dev):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dev)


def _one_step(model, opt, dev, step: int = 0):
    import torch

    g = torch.Generator().manual_seed(step)
    loss = model(torch.randn(6, 8, generator=g).to(dev)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def fsdp2_boundary(ctx, backend: str = "nccl", steps: int = 2, deadline_s: float = 30.0) -> dict:
    """Sub-check ``fsdp2_boundary``: see the module doc."""
    import math

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    be, dev = _start(ctx, backend, 120.0)
    td = datetime.timedelta
    res: dict[str, Any] = {"device": str(dev), "backend": be.name}
    control_group = dist.new_group(backend="gloo", timeout=td(seconds=deadline_s))
    records: dict[str, Any] = {}

    def make(kind: str, ranks: list[int]):
        g, rec = revoke.recorded(lambda: dist.new_group(ranks, backend=be.name, timeout=td(seconds=120),
                                                        **be.init_kwargs(dev)), be.name)
        records[kind] = rec
        return g

    groups = build_groups(Topology(1, 1), 0, backend=be.name, new_group=make, device=dev)
    model = _small_model(dev)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=groups.mesh)
    fully_shard(model, mesh=groups.mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    control = ControlPlane(dist.PrefixStore("cp/", ctx.store), 0, 1, prefix=PREFIX)
    header = {"world": 1, "nodes": 1, "ranks_per_node": 1, "group": "replicate", "affected": [0], "attempt": 0,
              "scenario": "gpu-check-fsdp2", "seed": 0, "backend": be.name, "frontier_at_start": 0}
    trace = Trace(RunDir(ctx.out).trace(0, 0), 0, header)
    profile = "fsdp2-hybrid"
    pact = attach(model, opt, groups=PactGroups(control=control_group, affected=groups.replicate, members=(0,),
                                                record=records["replicate"], name="replicate",
                                                others={k: v for k, v in records.items() if k != "replicate"}),
                  control=control, trace=trace, envelope=default_envelope(platform=be.platform, profiles=(profile,)),
                  key=ObservationKey(be.platform, profile, "boundary", DEFAULT_OBJECTIVE), deadline_s=deadline_s)
    losses = []
    for step in range(steps):
        with pact.step(step):
            loss = _one_step(model, opt, dev, step)
        pact.boundary(loss)
        losses.append(pact.last_loss)
    res["losses"] = losses
    res["generation"] = pact.gen
    res["repairs"] = len(pact.reports)
    res["param_devices"] = sorted({str((p.to_local() if hasattr(p, "to_local") else p).device) for p in model.parameters()})
    report = pact.guard.check()
    res["guard_ok"] = report.ok
    res["guard_reasons"] = list(report.reasons)
    res["recorded_errors"] = recorded_errors(records)
    pact.close()
    trace.close()
    return _finish(res, {
        "through the boundaries, no repair": res["generation"] == 0 and res["repairs"] == 0 and len(losses) == steps,
        "finite losses": all(isinstance(x, float) and math.isfinite(x) for x in losses),
        "shards on the device": res["param_devices"] == [str(dev)],
        "guard clean": bool(report.ok),
        "no recorded backend error": res["recorded_errors"] == {},
    })


#: what two NCCL ranks on one GPU need (spec/nccl.md, "Several ranks on one GPU"): NCCL refuses two
#: ranks of a communicator on one device of one host, so each rank claims its own host id and every
#: channel goes over loopback sockets
ONE_GPU_PAIR_ENV = {"NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def swap_blob_exchange(ctx, backend: str = "nccl", timeout_s: float = 30.0) -> dict:
    """Sub-check ``swap_blob_exchange`` (two ranks on the one device): see the module doc."""
    import os

    import torch
    import torch.distributed as dist

    if backend == "nccl":
        os.environ.update({**ONE_GPU_PAIR_ENV, "NCCL_HOSTID": f"accelpact-gpu-check-{ctx.rank}"})
    be, dev = _start(ctx, backend, 60.0, world=2)
    pg = dist.new_group([0, 1], backend=be.name, timeout=datetime.timedelta(seconds=60), **be.init_kwargs(dev))
    src, res = ctx.rank == 0, {"device": str(dev), "backend": be.name, "rank": ctx.rank}
    placed: list[str] = []

    def place(t, g):
        moved = be.place(t, g)
        placed.append(str(moved.device))
        return moved

    size = torch.tensor([123456789 if src else 0], dtype=torch.int64)
    blob = torch.full((1 << 20,), 7 if src else 0, dtype=torch.uint8)
    on_dev = torch.arange(16, dtype=torch.float32, device=dev) * (1 if src else 0)
    exchange_in_place(pg, [size, blob, on_dev], 1, timeout_s, send=True, place=place) if src else \
        exchange_in_place(pg, [size, blob, on_dev], 0, timeout_s, send=False, place=place)
    res["size_written_back"] = int(size[0])
    res["blob_written_back"] = bool((blob == 7).all())
    res["placed_on"] = sorted(set(placed))
    res["device_tensor_kept"] = bool(torch.equal(on_dev.cpu(), torch.arange(16, dtype=torch.float32)))
    model = _small_model(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(2 if src else 0):
        _one_step(model, opt, dev, step)
    ptrs = [p.data_ptr() for p in model.parameters()]
    res["transfer_bytes"] = transfer(pg, (0, 1), 0, ctx.rank, model, opt, dev, timeout_s)
    steps = [s["step"] for s in opt.state.values() if torch.is_tensor(s.get("step"))]
    res["adamw_step_devices"] = sorted({str(s.device) for s in steps})
    res["received_in_place"] = [p.data_ptr() for p in model.parameters()] == ptrs
    mine = state_checksum(model, opt, dev)
    both = [torch.zeros_like(mine) for _ in range(2)]
    pg.allgather([both], [mine]).wait()
    res["checksums"] = [checksum_hex(c) for c in both]
    return _finish(res, {
        "blob size written back to the CPU": res["size_written_back"] == 123456789,
        "blob written back to the CPU": res["blob_written_back"],
        "CPU tensors sent on the group's device": res["placed_on"] == [str(be.device_for(pg))],
        "device tensor sent as it is": res["device_tensor_kept"],
        "transfer moves the state into the spare's own storage": (res["transfer_bytes"] > 0 and res["received_in_place"]
                                                                  and res["checksums"][0] == res["checksums"][1]),
    })


def device_checksum(ctx, backend: str = "nccl") -> dict:
    """Sub-check ``state_checksum``: see the module doc."""
    import copy

    import torch

    be, dev = _start(ctx, backend, 60.0)
    res: dict[str, Any] = {"device": str(dev), "backend": be.name}
    model = _small_model(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _one_step(model, opt, dev)
    t0 = time.monotonic()
    a = digest.state_checksum(model, opt, dev)
    b = digest.state_checksum(model, opt, dev)
    res["checksum_s"] = round(time.monotonic() - t0, 4)
    res["digest"] = digest.checksum_hex(a)
    res["on"] = str(a.device)
    res["dtype"] = str(a.dtype)
    res["repeatable"] = bool(torch.equal(a, b))
    on_cpu = copy.deepcopy(model).to("cpu")
    res["module_cpu"] = digest.checksum_hex(digest.state_checksum(on_cpu, None, torch.device("cpu")))
    res["module_dev"] = digest.checksum_hex(digest.state_checksum(model, None, dev))
    p = next(model.parameters())
    with torch.no_grad():
        bits = p.view(torch.int32).view(-1)
        bits[0] ^= 1
        flipped = digest.state_checksum(model, opt, dev)
        bits[0] ^= 1
        restored = digest.state_checksum(model, opt, dev)
    res["flip_caught"] = not torch.equal(flipped, a)
    res["restored"] = bool(torch.equal(restored, a))
    return _finish(res, {
        "an int64 vector on the device": res["on"] == str(dev) and res["dtype"] == "torch.int64",
        "repeatable": res["repeatable"],
        "device and CPU copies agree": res["module_cpu"] == res["module_dev"],
        "one flipped bit caught, restored state matches": res["flip_caught"] and res["restored"],
    })


def device_rng_rerun(ctx, backend: str = "nccl", dropout: float = 0.2) -> dict:
    """Sub-check ``device_rng_rerun``: see the module doc."""
    import torch
    import torch.distributed as dist

    be, dev = _start(ctx, backend, 60.0)
    res: dict[str, Any] = {"device": str(dev), "backend": be.name, "dropout": dropout}
    spec = WorkloadSpec(wrapper="ddp", layers=1, dim=16, heads=2, seq=8, batch=2, dropout=dropout)
    torch.manual_seed(0)
    model = CharLM(vocab_size(), spec).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, _ = DataCursor(0, spec.batch, spec.seq, 0, 1).batch(0)
    x = x.to(dev)

    def forward() -> Any:  # one training-mode forward: dropout draws from the device's generator
        model.train()
        return model(x).detach().cpu()

    at_f = rng.capture(dev)  # "F": what the training publish keeps
    first = forward()  # the uninterrupted run's step
    model.eval()
    res["dropout_active"] = not torch.equal(first, model(x).detach().cpu())
    rng.restore(at_f, dev)  # RNG back to F
    res["rerun_equal"] = bool(torch.equal(forward(), first))
    rng.restore({"cpu": at_f["cpu"], "cuda": None}, dev)  # the defect of issue 43: the CPU generator only
    res["cpu_only_rerun_equal"] = bool(torch.equal(forward(), first))
    res["cuda_state_captured"] = at_f["cuda"] is not None
    # the L2 path: the checkpoint's rank file keeps the device generator, and a load puts it back
    folder = f"{ctx.out}/ckpt"
    ckpt = CheckpointManager(folder, every=1, rank=0, world=1, group=dist.group.WORLD, device=dev)
    ckpt.save(1, model, opt)
    after_save = forward()
    forward()  # the run goes on drawing
    ckpt.load(1, model, opt)
    res["checkpoint_rerun_equal"] = bool(torch.equal(forward(), after_save))
    on_cuda = dev.type == "cuda"
    return _finish(res, {
        "dropout draws (train differs from eval)": res["dropout_active"],
        "a rerun after rng.restore equals the run": res["rerun_equal"],
        "after a checkpoint load the rerun equals the run": res["checkpoint_rerun_equal"],
        # on the CPU the CPU generator is the device's: a CPU-only restore is the whole restore
        "the CUDA state is kept and a CPU-only restore differs": (not on_cuda) or (res["cuda_state_captured"]
                                                                                   and not res["cpu_only_rerun_equal"]),
    })


#: name -> (rank function, bound in seconds, whether it runs on any backend or on NCCL only, ranks)
SUBCHECKS: dict[str, tuple[Any, float, bool, int]] = {
    "watchdog_timeout": (watchdog_timeout, 80.0, False, 1),
    "ddp_repair": (ddp_repair, 100.0, False, 1),
    "real_timeout_repair": (real_timeout_repair, 120.0, False, 1),
    "fsdp2_boundary": (fsdp2_boundary, 100.0, True, 1),
    "swap_blob_exchange": (swap_blob_exchange, 50.0, True, 2),
    "state_checksum": (device_checksum, 50.0, True, 1),
    "device_rng_rerun": (device_rng_rerun, 30.0, True, 1),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelpact.bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=540.0, help="bound on all sub-checks together, seconds")
    parser.add_argument("--only", default="", help="comma-separated sub-checks: " + ", ".join(SUBCHECKS))
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"),
                        help="gloo: the backend-neutral sub-checks on the CPU (a check of this script, not of NCCL)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SUBCHECKS)
    unknown = [n for n in names if n not in SUBCHECKS]
    if unknown:
        parser.error(f"unknown sub-check(s) {unknown}; known: {', '.join(SUBCHECKS)}")
    import torch

    if args.backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < 1):
        print(json.dumps({"ok": None, "skipped": "no CUDA device on this machine: the NCCL check needs one GPU"}))
        return 0
    import importlib

    # the rank functions by their importable name: under ``python -m`` this module is __main__, which a
    # child cannot import (run_ranks refuses it)
    table = importlib.import_module("accelpact.bench.gpu_check").SUBCHECKS
    out = args.out or tempfile.mkdtemp(prefix="accelpact-gpu-check-")
    t0 = time.monotonic()
    binding = get_error_binding() if args.backend == "nccl" else None
    results: dict[str, Any] = {}
    for name in names:
        fn, bound, neutral, world = table[name]
        if args.backend != "nccl" and not neutral:
            results[name] = {"ok": None, "skipped": "NCCL only"}
            continue
        left = args.timeout - (time.monotonic() - t0)
        if left < 10:
            results[name] = {"ok": False, "explain": f"not run: {args.timeout:.0f} s budget spent"}
            continue
        s0 = time.monotonic()
        run = run_ranks(fn, world, f"{out}/{name}", timeout_s=min(bound, left),
                        **({"backend": args.backend} if neutral else {}))
        if run.ok and 0 in run.returns:
            res = run.returns[0]
        else:
            res = {"ok": False, "explain": run.explain(last=12), "hung": bool(run.hung), "bound_s": min(bound, left)}
        res["wall_s"] = round(time.monotonic() - s0, 2)
        results[name] = res
    ran = [r["ok"] for r in results.values() if r.get("ok") is not None]
    ok = bool(ran) and all(x is True for x in ran)
    summary = {"ok": ok, "backend": args.backend, "torch": torch.__version__, "cuda": torch.version.cuda,
               "get_error_bound": binding, "failed": [n for n, r in results.items() if r.get("ok") is False], "subchecks": results,
               "wall_s": round(time.monotonic() - t0, 2), "out": out}
    print(json.dumps(summary, default=str))
    return 0 if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
