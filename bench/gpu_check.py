"""``python -m accelpact.bench.gpu_check``: the engine's NCCL paths on one GPU, as one prepared script.

A world-size-1 NCCL job (a TCPStore on loopback hosted by this process, one rank in a child process
started and reaped by :func:`accelpact.testing.run_ranks`) runs the real engine end to end on CUDA:

1. ``Backend.prepare_process(0)`` (the NCCL error-handling environment, ``cuda:0`` current), then
   ``init_process_group("nccl", device_id=cuda:0)``; R is ``new_group([0], backend="nccl",
   device_id=...)`` with the training timeout; the control group is gloo;
2. DDP over R on ``cuda:0``, ``attach`` with the candidate envelope of the ``(cuda-nccl, ddp)`` cell
   (what ``accelpact qualify`` runs its trials under), a ``collective_timeout`` fault at step 1's
   boundary (the injector's revoke record aborts R's communicator);
3. the engine observes the failure at the boundary, then guard (stream drain), agree, replace (a new
   NCCL communicator, bound, eagerly connected, with R's training timeout), rebind (DDP's reducer,
   the c10d name), validate (all-reduce and the state checksum on CUDA) and release; training goes on;
4. checks: generation 1, one repair, the new group's backend/device/timeout, the old c10d name on the
   new group and its registration, the default and control groups still registered and working after
   R's abort, a collective on the new group, the guard's bounded drain behind a queued kernel.

Prints one JSON object (the last line); exit 0 when every check passed, 1 otherwise, and 0 with
``{"skipped": reason}`` on a machine without CUDA.  Nothing here runs in the CPU test suite except
the skip (tests/test_backend_paths.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from typing import Any

__all__ = ["main", "rank_main"]


def _registration(pg) -> dict[str, Any]:
    """What c10d's registries say about ``pg`` (None fields: not registered)."""
    import torch.distributed.distributed_c10d as c10d

    w = c10d._world
    name = w.pg_names.get(pg)
    return {"name": None if name is None else str(name), "backend": (w.pg_map.get(pg) or (None, None))[0],
            "config": w.pg_backend_config.get(pg), "ranks": sorted(w.pg_group_ranks.get(pg, {}))}


def rank_main(ctx, steps: int = 4, fault_step: int = 1, deadline_s: float = 30.0, collective_timeout_s: float = 120.0) -> dict:
    """The rank (world size 1): see the module doc.  Returns the observations and ``ok``."""
    import os

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accelpact.impl import revoke
    from accelpact.impl.backends import NCCL_ENV, backend, backend_of
    from accelpact.impl.controlplane import PREFIX, ControlPlane
    from accelpact.impl.faults import FaultPlan
    from accelpact.impl.hooks import FaultInjector, Hooks
    from accelpact.impl.recovery import PactGroups, attach
    from accelpact.impl.rundir import RunDir
    from accelpact.impl.trace import Trace
    from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey, default_envelope

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelpact.bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=420.0, help="bound on the rank's process, seconds")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({"ok": None, "skipped": f"torch is not installed ({exc})"}))
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print(json.dumps({"ok": None, "skipped": "no CUDA device on this machine: the NCCL check needs one GPU"}))
        return 0
    from accelpact.testing import run_ranks

    out = args.out or tempfile.mkdtemp(prefix="accelpact-gpu-check-")
    t0 = time.monotonic()
    run = run_ranks(rank_main, 1, out, timeout_s=args.timeout)
    if run.ok and 0 in run.returns:
        res = run.returns[0]
    else:
        res = {"ok": False, "explain": run.explain(last=12)}
    res["wall_s"] = round(time.monotonic() - t0, 2)
    res["out"] = out
    print(json.dumps(res, default=str))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
