"""The generic job runner: ``python -m accelpact.impl.worker --job job.json``.

Run under torchrun (or :func:`accelpact.impl.launch.run_local`, which sets the same environment
variables).  One worker process is one rank.  It

1. connects to the supervisor's store (``MASTER_ADDR:MASTER_PORT``; under torchrun the agent hosts
   it) and namespaces everything by the restart count, ``attempt{TORCHELASTIC_RESTART_COUNT}/``:
   torchrun's store keeps the previous attempt's keys, and ``init_process_group(env://)`` fails on
   every restart without the prefix (torch-facts, "torchrun");
2. builds the groups, the workload and the pact (``recovery.attach``);
3. resumes from the latest *committed* checkpoint if there is one (the L2 path: C, then replays
   F - C steps);
4. trains to ``workload.steps``, checkpointing every ``workload.checkpoint_every`` committed steps
   through a dedicated healthy gloo group (never through a communicator that failed);
5. injects the job's faults only in the attempt they name (``"attempt"``, default 0);
6. writes ``result-a{attempt}-r{rank}.json`` (rewritten atomically at every boundary, so a killed
   rank leaves its last committed progress), ``trace-a{attempt}-r{rank}.ndjson`` (when
   ``"trace": true``) and ``final-r{rank}.pt`` (the per-rank snapshot at the end).

Every exit goes through ``os._exit`` (gloo teardown can turn exit codes into -6); the worker
records the exit code in its result file just before (see :func:`_record_exits`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["JobError", "build_recorded_groups", "faults_for_attempt", "load_job", "main", "run_job", "validate_job"]

from .faults import FAULT_KINDS, FAULT_POINTS  # no torch import at module level there

WRAPPERS = ("fsdp1-hybrid", "fsdp2-hybrid", "ddp")  # workload.WRAPPERS, without importing torch


class JobError(ValueError):
    """The job JSON is malformed; the message names the field and what to write instead."""


def validate_job(job: dict) -> dict:
    """Check a job dict and fill defaults; raise :class:`JobError` naming the bad field."""
    if not isinstance(job, dict):
        raise JobError("job must be a JSON object")
    for key in ("topology", "workload", "out"):
        if key not in job:
            raise JobError(f"job is missing {key!r}")
    topo = job["topology"]
    for k in ("nodes", "ranks_per_node"):
        if not isinstance(topo.get(k), int) or topo[k] < 1:
            raise JobError(f"topology.{k} must be an integer >= 1, got {topo.get(k)!r}")
    wl = job["workload"]
    if wl.get("wrapper") not in WRAPPERS:
        raise JobError(f"workload.wrapper must be one of {WRAPPERS}, got {wl.get('wrapper')!r}")
    steps = wl.get("steps")
    if not isinstance(steps, int) or steps < 1:
        raise JobError(f"workload.steps must be an integer >= 1, got {steps!r}")
    every = wl.setdefault("checkpoint_every", 0)
    if not isinstance(every, int) or every < 0:
        raise JobError(f"workload.checkpoint_every must be an integer >= 0 (0: no checkpoints), got {every!r}")
    wl.setdefault("seed", 0)
    backend = job.setdefault("backend", "gloo")
    if backend not in ("gloo", "nccl"):
        raise JobError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    job.setdefault("scenario", "job")
    job.setdefault("trace", False)
    job.setdefault("deadline_s", 20.0)
    job.setdefault("collective_timeout_s", 60.0)
    # a step's waits: one collective on a slow or hung peer, then up to six phase waits
    job.setdefault("step_deadline_s", job["collective_timeout_s"] + 6 * job["deadline_s"]
                   if all(isinstance(job[k], (int, float)) for k in ("deadline_s", "collective_timeout_s")) else None)
    for key in ("deadline_s", "collective_timeout_s", "step_deadline_s"):
        if not isinstance(job[key], (int, float)) or isinstance(job[key], bool) or job[key] <= 0:
            raise JobError(f"{key} must be a number of seconds > 0, got {job[key]!r}")
    job.setdefault("seeded_bug", None)
    envelope = job.setdefault("envelope", None)
    if envelope is not None and not isinstance(envelope, str):
        raise JobError(f"envelope must be the path of an envelope file or null, got {envelope!r}")
    faults = job.setdefault("faults", [])
    for i, f in enumerate(faults):
        if not isinstance(f.get("step"), int) or not 0 <= f["step"] < steps:
            raise JobError(f"faults[{i}].step must be an integer in [0, {steps}), got {f.get('step')!r}")
        if f.get("at") not in FAULT_POINTS:
            raise JobError(f"faults[{i}].at must be one of {FAULT_POINTS}, got {f.get('at')!r}")
        if f.get("kind") not in FAULT_KINDS:
            raise JobError(f"faults[{i}].kind must be one of {FAULT_KINDS}, got {f.get('kind')!r}")
    return job


def _failing_group(job: dict, topo, wrapper: str, own: list[int]) -> list[int]:
    """R for the trace header: the replicate group the job's first group fault strikes (the
    checker builds its model config from it); this rank's own group when no fault names one."""
    if wrapper == "ddp":
        return list(range(topo.nodes * topo.ranks_per_node))
    for f in job.get("faults", []):
        if f.get("kind") == "collective_timeout" and f.get("ranks"):
            local = int(f["ranks"][0]) % topo.ranks_per_node
            return [n * topo.ranks_per_node + local for n in range(topo.nodes)]
    return own


def faults_for_attempt(job: dict, attempt: int) -> list[dict]:
    """The job's faults that strike in ``attempt`` (a fault without ``"attempt"`` strikes in 0 only),
    without the ``attempt`` field (the engine's ``FaultPlan`` accepts only fault fields)."""
    return [{k: v for k, v in f.items() if k != "attempt"} for f in job.get("faults", [])
            if int(f.get("attempt", 0)) == attempt]


def load_job(path: str | os.PathLike) -> dict:
    try:
        job = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise JobError(f"cannot read job file {path}: {exc}") from exc
    return validate_job(job)


def _jsonable(x: Any) -> Any:
    """Recovery reports and snapshots to plain JSON (dataclasses, tuples, numbers)."""
    if is_dataclass(x) and not isinstance(x, type):
        return _jsonable(asdict(x))
    if hasattr(x, "as_dict"):
        return _jsonable(x.as_dict())
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item"):
        try:
            return x.item()
        except (ValueError, RuntimeError):
            pass
    return repr(x)


class ResultFile:
    """``result-a{attempt}-r{rank}.json``, rewritten atomically (temp + rename) on every update."""

    def __init__(self, out: Path, attempt: int, rank: int, base: dict) -> None:
        self.path = out / f"result-a{attempt}-r{rank}.json"
        self.data = dict(base)
        self._lock = threading.Lock()
        #: fields computed when the process exits: the engine's state can be ahead of the last
        #: update (e.g. a step committed just before a peer's abort ended this rank)
        self.at_exit: dict[str, Callable[[], Any]] = {}

    def update(self, **changes) -> None:
        with self._lock:
            self.data.update(changes)
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(_jsonable(self.data)))
            os.replace(tmp, self.path)


_real_exit = os._exit


def _record_exits(result: ResultFile) -> None:
    """Route ``os._exit`` through the result file, so every exit (the engine's ``exit_now``, the
    watchdog thread's exit on the abort key) leaves its code and reason on disk first.

    ``os._exit`` is the only common point of every fail-stop exit (torch-facts: exit codes after
    gloo errors must bypass interpreter teardown).  The wrapper never raises.
    """

    def _exit(code: int) -> None:  # noqa: ANN001
        try:
            live = {k: f() for k, f in result.at_exit.items()} if code else {}
            result.update(outcome="exited" if code else result.data.get("outcome", "finished"),
                          exit_code=int(code), t_exit=time.monotonic(), **live)
        except Exception:  # noqa: BLE001 - exiting anyway; the code is what matters
            pass
        _real_exit(code)

    os._exit = _exit  # type: ignore[assignment]


#: After torchrun's SIGTERM, how long this rank's watchdog may take to exit it with the job's
#: abort code (it normally has: the abort that made a peer exit is already in the store).
SUPERVISOR_STOP_GRACE_S = 2.0


def _on_supervisor_stop() -> None:
    """torchrun stops the other workers (SIGTERM) as soon as one exits.  Python's default action
    would end this rank at once, often before its watchdog exits it with the job's abort code and
    its RankExit record; so the handler only starts a timer, and ends the rank with 128+SIGTERM
    if the watchdog has not exited it within ``SUPERVISOR_STOP_GRACE_S``.  (The handler runs when
    the main thread next runs Python; a main thread blocked in a collective cannot be stopped by
    SIGTERM anyway, and its watchdog still can.)"""
    import signal

    from .exitcodes import claim_exit

    def late_exit() -> None:
        time.sleep(SUPERVISOR_STOP_GRACE_S)
        claim_exit()
        os._exit(128 + signal.SIGTERM)

    def handler(signum, frame) -> None:  # noqa: ANN001
        threading.Thread(target=late_exit, name="accelpact-supervisor-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)


def _previous_frontier(store, attempt: int, rank: int) -> int | None:
    """The committed frontier this rank reached in the previous attempt (the F an L2 restart replays to)."""
    if attempt == 0:
        return None
    best = None
    for a in range(attempt):
        key = f"accelpact/progress/a{a}/r{rank}"
        if store.check([key]):
            v = int(store.get(key).decode())
            best = v if best is None else max(best, v)
    return best


def _fault_time_ns(out: Path, attempt: int, gen: int | None = None) -> int | None:
    """Earliest injected-fault record (``Fault*``) in ``attempt``'s traces, of generation ``gen`` if
    given; None when tracing is off or nothing was injected."""
    earliest = None
    for p in out.glob(f"trace-a{attempt}-r*.ndjson"):
        try:
            lines = p.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written right now
            if rec.get("type") != "action" or not str(rec.get("action", "")).startswith("Fault"):
                continue
            if gen is not None and rec.get("gen") != gen:
                continue
            t = int(rec["t_ns"])
            earliest = t if earliest is None else min(earliest, t)
    return earliest


def build_recorded_groups(workload, topo, rank: int, backend: str, timeout):
    """``workload.build_groups`` plus the socket record of every group this rank belongs to.

    The engine revokes a gloo group by shutting down the sockets recorded when it was built
    (:func:`accelpact.impl.revoke.recorded`).  Returns ``(groups, records)`` with records keyed
    "shard", "replicate", "world".
    """
    import torch.distributed as dist

    from . import revoke

    rec_backend = "nccl" if backend == "nccl" else "gloo"
    records = {}

    def new_group(kind: str, ranks: list[int]):
        g, rec = revoke.recorded(lambda: dist.new_group(ranks, backend=backend, timeout=timeout), rec_backend)
        if rank in ranks:
            records[kind] = rec
        return g

    groups = workload.build_groups(topo, rank, backend, timeout, new_group=new_group)
    return groups, records


def run_job(job: dict) -> int:
    """Run one rank of ``job`` to the end; return the exit code (0 when training finished).

    Ordering: store -> default group -> control/checkpoint groups -> workload groups (all ranks,
    same order) -> workload -> checkpoint restore -> attach (starts the watchdog) -> steps.
    """
    from datetime import timedelta

    if job.get("seeded_bug"):
        os.environ["ACCELPACT_SEEDED_BUG"] = job["seeded_bug"]  # read by the engine at attach
    import torch
    import torch.distributed as dist

    from . import workload
    from .checkpoint import CheckpointManager, latest_committed
    from .controlplane import ControlPlane
    from .recovery import PactGroups, attach
    from .trace import NullTrace, Trace, trace_path

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    topo_d, wl = job["topology"], job["workload"]
    if topo_d["nodes"] * topo_d["ranks_per_node"] != world:
        raise JobError(f"topology {topo_d['nodes']}x{topo_d['ranks_per_node']} does not match WORLD_SIZE={world}; "
                       "launch with --nproc-per-node nodes*ranks_per_node")
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    result = ResultFile(out, attempt, rank, {
        "scenario": job["scenario"], "attempt": attempt, "restart_count": attempt, "rank": rank, "world": world,
        "outcome": "running", "exit_code": None, "frontier": None, "start_step": 0, "resumed_from": None,
        "replayed_steps": 0, "reports": [], "checkpoints": [], "losses": {}, "t_start": t_start,
        "t_ready": None, "t_fault": None, "t_frontier": None, "pid": os.getpid(),
    })
    result.update()
    _record_exits(result)

    # Long timeout for setup and checkpoints; the training groups get collective_timeout_s: it is
    # what turns a hung peer into an error on the others (torchrun has no hang detection).
    timeout = timedelta(seconds=float(job.get("pg_timeout_s", 120.0)))
    coll_timeout = timedelta(seconds=float(job["collective_timeout_s"]))
    deadline_s = float(job["deadline_s"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    astore = dist.PrefixStore(f"attempt{attempt}", store)
    dist.init_process_group(job["backend"], store=dist.PrefixStore("pg", astore), rank=rank, world_size=world,
                            timeout=timeout)
    # Out-of-band gloo groups over W, created in the same order on every rank: the engine's control
    # group (failure flag, validation) and DCP's group (never a communicator that may fail).
    control_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(deadline_s, 1.0)))
    ckpt_group = dist.new_group(backend="gloo", timeout=timeout)

    topo = workload.Topology(nodes=topo_d["nodes"], ranks_per_node=topo_d["ranks_per_node"])
    groups, records = build_recorded_groups(workload, topo, rank, job["backend"], coll_timeout)
    spec_fields = {k: v for k, v in wl.items() if k in workload.WorkloadSpec.__dataclass_fields__}
    spec = workload.WorkloadSpec(**spec_fields)
    app = workload.build_job(spec, topo, groups)

    ckpt = CheckpointManager(out / "ckpt", every=wl["checkpoint_every"], rank=rank, world=world,
                             store=dist.PrefixStore("ckpt", astore), group=ckpt_group)
    start = 0
    c = latest_committed(out / "ckpt", world=world)
    prev_f = _previous_frontier(store, attempt, rank)
    if c is not None:
        restored = ckpt.load(c, app.module, app.optimizer)
        if restored.cursor is not None:
            app.cursor = restored.cursor
        app.step = start = c
    replayed = max(0, (prev_f or 0) - start) if attempt > 0 else 0
    t_fault_ns = _fault_time_ns(out, attempt - 1) if attempt > 0 else None
    result.update(start_step=start, resumed_from=c, replayed_steps=replayed, frontier=start,
                  t_fault=None if t_fault_ns is None else t_fault_ns / 1e9)

    if spec.wrapper == "ddp":
        pg = PactGroups(control=control_group, affected=groups.world, members=tuple(range(world)),
                        record=records["world"], name="world", index=0, count=1,
                        others={k: v for k, v in records.items() if k != "world"})
    else:
        pg = PactGroups(control=control_group, affected=groups.replicate, members=groups.replicate_ranks,
                        record=records["replicate"], name="replicate", index=topo.local_of(rank),
                        count=topo.ranks_per_node, others={k: v for k, v in records.items() if k != "replicate"})
    faults = faults_for_attempt(job, attempt)
    trace = (Trace(trace_path(out, attempt, rank), rank, dict(
        world=world, nodes=topo.nodes, ranks_per_node=topo.ranks_per_node, group=pg.name,
        affected=_failing_group(job, topo, spec.wrapper, list(pg.members)), own_group=list(pg.members), attempt=attempt, scenario=job["scenario"], seed=wl["seed"],
        backend=job["backend"], frontier_at_start=start, wrapper=spec.wrapper))
        if job["trace"] else NullTrace())
    control = ControlPlane(astore, rank, world, prefix="accelpact/")
    # K = (platform, profile, phase, objective): the profile is the wrapper, so an envelope written by
    # `accelpact qualify` (one cell per wrapper) applies; without an envelope file, the default one.
    from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey, default_envelope, load_envelope

    platform = "cpu-gloo" if job["backend"] == "gloo" else "cuda-nccl"
    key = ObservationKey(platform, spec.wrapper, "boundary", DEFAULT_OBJECTIVE)
    envelope = load_envelope(job["envelope"]) if job["envelope"] else default_envelope()
    pact = attach(app.module, app.optimizer, groups=pg, control=control, trace=trace, deadline_s=deadline_s,
                  step_deadline_s=float(job["step_deadline_s"]),
                  fault_plan=faults, frontier=start, key=key, envelope=envelope)
    result.update(t_ready=time.monotonic())
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # under torchrun (see _on_supervisor_stop)
        _on_supervisor_stop()
    # The committed frontier F is published at the commit itself (after the guard's hook), not after
    # the boundary: a peer's abort can end this rank between its commit and the end of the step,
    # and an L2 restart replays up to the F the failure interrupted.  No peer can be a step ahead
    # before this runs: the boundary's control-group all-reduce follows every rank's commit.
    progress_key = f"accelpact/progress/a{attempt}/r{rank}"
    app.optimizer.register_step_post_hook(lambda *_: store.set(progress_key, str(pact.guard.frontier)))
    result.at_exit["frontier"] = lambda: pact.guard.frontier

    losses: dict[int, float] = {}
    t_steps: dict[int, float] = {}
    for step in range(start, wl["steps"]):
        with pact.step(step):
            loss = workload.train_step(app, step)
        report = pact.boundary(loss)
        frontier = step + 1
        now = time.monotonic()
        losses[step] = float(pact.last_loss) if pact.last_loss is not None else float(loss)
        t_steps[step] = now
        changes: dict[str, Any] = {"frontier": frontier, "losses": losses, "t_steps": t_steps}
        if report is not None:
            changes["reports"] = result.data["reports"] + [_jsonable(report)]
            changes["t_frontier"] = now  # L1: training again at the agreed F (zero replay)
            t_f = _fault_time_ns(out, attempt, gen=report.generation) if job["trace"] else None
            changes["t_fault"] = None if t_f is None else t_f / 1e9
        if prev_f is not None and frontier == prev_f:
            changes["t_frontier"] = now  # L2: back at the frontier the failure interrupted
        if ckpt.due(frontier):
            took = ckpt.save(frontier, app.module, app.optimizer, cursor=app.cursor)
            changes["checkpoints"] = result.data["checkpoints"] + [{"step": frontier, "seconds": took}]
        result.update(**changes)

    snap = workload.snapshot(app)
    tmp = out / f".final-r{rank}.pt.tmp"
    torch.save(snap, tmp)
    os.replace(tmp, out / f"final-r{rank}.pt")
    # Nobody leaves before everyone saved: a rank exiting early closes sockets under its peers.
    dist.barrier(group=ckpt_group)
    pact.close()
    result.update(outcome="finished", exit_code=0, t_end=time.monotonic(), generation=pact.gen)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelpact.impl.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="path of the job JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        job = load_job(args.job)
    except JobError as exc:
        print(f"accelpact worker: {exc}", file=sys.stderr)
        return 2
    try:
        code = run_job(job)
    except SystemExit as exc:  # an engine path that chose sys.exit
        code = int(exc.code or 0)
    except BaseException as exc:  # noqa: BLE001 - an exception outside the pact: fail-stop with a crash code
        import traceback

        traceback.print_exc()
        print(f"accelpact worker rank {os.environ.get('RANK')}: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
    return code  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())  # reached only for a bad job file (2); every run ends in os._exit
