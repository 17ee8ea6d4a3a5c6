"""The generic job runner: ``python -m accelpact.impl.worker --job job.json``.

Run under torchrun (or :func:`accelpact.impl.launch.run_local`, which sets the same environment
variables).  One worker process is one rank.  It

1. connects to the supervisor's store (``MASTER_ADDR:MASTER_PORT``; under torchrun the agent hosts
   it) and namespaces everything by the restart count, ``attempt{TORCHELASTIC_RESTART_COUNT}/``:
   torchrun's store keeps the previous attempt's keys, and ``init_process_group(env://)`` fails on
   every restart without the prefix (spec/torch-facts.md, "torchrun");
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
from typing import Any, Callable

__all__ = ["ResultFile", "build_recorded_groups", "main", "pact_groups", "run_job"]

from .job import Job, JobError, Topology, load_job  # torch-free
from .rundir import RunDir
from .wrappers import wrapper


def _failing_group(job: Job, kind: str, own: tuple[int, ...]) -> list[int]:
    """R for the trace header: the group of R's kind that the job's first group fault strikes (the
    checker builds its model config from it); this rank's own group when no fault names one."""
    for f in job.faults:
        if f.kind == "collective_timeout" and f.ranks:
            return list(job.topology.group(kind, f.ranks[0]))
    return list(own)


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
        self.path = RunDir(out).result(attempt, rank)
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

    ``os._exit`` is the only common point of every fail-stop exit (spec/torch-facts.md: exit codes after
    gloo errors must bypass interpreter teardown).  The wrapper never raises.
    """

    def _exit(code: int) -> None:
        try:
            live = {k: f() for k, f in result.at_exit.items()} if code else {}
            result.update(outcome="exited" if code else result.data.get("outcome", "finished"),
                          exit_code=int(code), t_exit=time.monotonic(), **live)
        except Exception:  # noqa: BLE001 - exiting anyway; the code is what matters
            pass
        _real_exit(code)

    os._exit = _exit  # type: ignore[assignment]  # every exit path goes through os._exit: route it via the result file


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

    def handler(signum, frame) -> None:
        threading.Thread(target=late_exit, name="accelpact-supervisor-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)


def _previous_frontier(store, run: RunDir, attempt: int, rank: int) -> int | None:
    """The committed frontier this rank reached in the previous attempts (the F an L2 restart
    replays to): from the store's progress keys, or, when the store was lost with the previous
    attempt (a fresh one serves this attempt), from the previous attempts' result files."""
    if attempt == 0:
        return None
    best = None
    for a in range(attempt):
        key = f"accelpact/progress/a{a}/r{rank}"
        v = int(store.get(key).decode()) if store.check([key]) else _result_frontier(run, a, rank)
        if v is not None:
            best = v if best is None else max(best, v)
    return best


def _result_frontier(run: RunDir, attempt: int, rank: int) -> int | None:
    try:
        f = json.loads(run.result(attempt, rank).read_text()).get("frontier")
    except (OSError, ValueError):
        return None
    return f if isinstance(f, int) else None


def build_recorded_groups(workload, topo, rank: int, backend: str, timeout):
    """``workload.build_groups`` plus the socket record of every group this rank belongs to.

    The engine revokes a gloo group by shutting down the sockets recorded when it was built
    (:func:`accelpact.impl.revoke.recorded`).  Returns ``(groups, records)`` with records keyed
    "shard", "replicate", "world".
    """
    import torch.distributed as dist

    from . import revoke

    records = {}

    def new_group(kind: str, ranks: list[int]):
        g, rec = revoke.recorded(lambda: dist.new_group(ranks, backend=backend, timeout=timeout), backend)
        if rank in ranks:
            records[kind] = rec
        return g

    groups = workload.build_groups(topo, rank, backend, timeout, new_group=new_group)
    return groups, records


def pact_groups(topo: Topology, rank: int, wrapper_name: str, control_group, groups, records: dict):
    """The engine's :class:`~accelpact.impl.recovery.PactGroups` of this rank: R is its group of the
    wrapper's kind (``Wrapper.recovers``); the others are kept (by name) for fault injection."""
    from .recovery import PactGroups

    kind = wrapper(wrapper_name).recovers
    return PactGroups(control=control_group, affected=getattr(groups, kind), members=topo.group(kind, rank),
                      record=records[kind], name=kind, index=topo.group_index(kind, rank),
                      count=len(topo.groups_of_kind(kind)), others={k: v for k, v in records.items() if k != kind})


def run_job(job: Job) -> int:
    """Run one rank of ``job`` to the end; return the exit code (0 when training finished).

    Ordering: store -> default group -> control/checkpoint groups -> workload groups (all ranks,
    same order) -> workload -> checkpoint restore -> attach (starts the watchdog) -> steps.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey, default_envelope, load_envelope

    from . import workload
    from .backends import backend
    from .checkpoint import CheckpointManager, latest_committed
    from .controlplane import ControlPlane
    from .faults import FaultPlan
    from .hooks import FaultInjector, Hooks
    from .recovery import attach
    from .trace import NullTrace, Trace

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    topo, wl = job.topology, job.workload
    if topo.world != world:
        raise JobError(f"topology {topo.nodes}x{topo.ranks_per_node} does not match WORLD_SIZE={world}; "
                       "launch with --nproc-per-node nodes*ranks_per_node")
    run = RunDir(job.out)
    out = run.path
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    result = ResultFile(out, attempt, rank, {
        "scenario": job.scenario, "attempt": attempt, "restart_count": attempt, "rank": rank, "world": world,
        "outcome": "running", "exit_code": None, "frontier": None, "start_step": 0, "resumed_from": None,
        "replayed_steps": 0, "reports": [], "checkpoints": [], "losses": {}, "t_start": t_start,
        "t_ready": None, "t_fault": None, "t_frontier": None, "pid": os.getpid(),
    })
    result.update()
    _record_exits(result)

    # Long timeout for setup and checkpoints; the training groups get collective_timeout_s: it is
    # what turns a hung peer into an error on the others (torchrun has no hang detection).
    timeout = timedelta(seconds=job.pg_timeout_s)
    coll_timeout = timedelta(seconds=job.collective_timeout_s)
    deadline_s = job.deadline_s
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    astore = dist.PrefixStore(f"attempt{attempt}", store)
    dist.init_process_group(job.backend, store=dist.PrefixStore("pg", astore), rank=rank, world_size=world,
                            timeout=timeout)
    # Out-of-band gloo groups over W, created in the same order on every rank: the engine's control
    # group (failure flag, validation) and DCP's group (never a communicator that may fail).
    control_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(deadline_s, 1.0)))
    ckpt_group = dist.new_group(backend="gloo", timeout=timeout)

    groups, records = build_recorded_groups(workload, topo, rank, job.backend, coll_timeout)
    spec = workload.WorkloadSpec(wrapper=wl.wrapper, layers=wl.layers, seed=wl.seed)
    app = workload.build_job(spec, topo, groups)

    ckpt = CheckpointManager(run.ckpt, every=wl.checkpoint_every, rank=rank, world=world,
                             store=dist.PrefixStore("ckpt", astore), group=ckpt_group)
    start = 0
    c = latest_committed(run.ckpt, world=world)
    prev_f = _previous_frontier(store, run, attempt, rank)
    if c is not None:
        restored = ckpt.load(c, app.module, app.optimizer)
        if restored.cursor is not None:
            app.cursor = restored.cursor
        app.step = start = c
    replayed = max(0, (prev_f or 0) - start) if attempt > 0 else 0
    t_fault_ns = run.fault_time_ns(attempt - 1) if attempt > 0 else None
    result.update(start_step=start, resumed_from=c, replayed_steps=replayed, frontier=start,
                  t_fault=None if t_fault_ns is None else t_fault_ns / 1e9)

    pg = pact_groups(topo, rank, spec.wrapper, control_group, groups, records)
    trace = (Trace(run.trace(attempt, rank), rank, dict(
        world=world, nodes=topo.nodes, ranks_per_node=topo.ranks_per_node, group=pg.name,
        affected=_failing_group(job, pg.name, pg.members), own_group=list(pg.members), attempt=attempt,
        scenario=job.scenario, seed=wl.seed, backend=job.backend, frontier_at_start=start, wrapper=spec.wrapper))
        if job.trace else NullTrace())
    control = ControlPlane(astore, rank, world, prefix="accelpact/")
    # K = (platform, profile, phase, objective): the profile is the wrapper, so an envelope written by
    # `accelpact qualify` (one cell per wrapper) applies; without an envelope file, the default one.
    key = ObservationKey(backend(job.backend).platform, spec.wrapper, "boundary", DEFAULT_OBJECTIVE)
    envelope = load_envelope(job.envelope) if job.envelope else default_envelope()
    faults = job.faults_for_attempt(attempt)
    hooks = Hooks(injector=FaultInjector(FaultPlan(faults)) if faults else None, seeded_bug=job.seeded_bug)
    pact = attach(app.module, app.optimizer, groups=pg, control=control, trace=trace, deadline_s=deadline_s,
                  step_deadline_s=job.step_deadline_s, frontier=start, key=key, envelope=envelope, hooks=hooks)
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
    for step in range(start, wl.steps):
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
            t_f = run.fault_time_ns(attempt, gen=report.generation) if job.trace else None
            changes["t_fault"] = None if t_f is None else t_f / 1e9
        if prev_f is not None and frontier == prev_f:
            changes["t_frontier"] = now  # L2: back at the frontier the failure interrupted
        if ckpt.due(frontier):
            took = ckpt.save(frontier, app.module, app.optimizer, cursor=app.cursor)
            changes["checkpoints"] = result.data["checkpoints"] + [{"step": frontier, "seconds": took}]
        result.update(**changes)

    snap = workload.snapshot(app)
    final = run.final(rank)
    tmp = final.with_name(f".{final.name}.tmp")
    torch.save(snap, tmp)
    os.replace(tmp, final)
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
    # the test harness's side of external faults (a GIL hang, a straggler's sleep) on SIGUSR2/SIGUSR1:
    # a fault injector outside this process triggers them (impl/inject.py); the engine never sees them
    from .inject import install_handlers

    install_handlers()
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
