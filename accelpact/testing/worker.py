"""The harness's rank program: ``python -m accelpact.testing.worker --job job.json``.

The conformance runner, ``accelpact demo``, the soak and the benchmarks run a typed job
(:class:`~accelpact.impl.launch.job.Job`) through the launcher (:mod:`accelpact.impl.launch.launch`,
which names this module); each rank is this program, a user of the public API like any other
script, plus the harness's side: the job's faults and seeded bug armed as test hooks
(:func:`accelpact.testing.faults.hooks_for`), the result files, the trace header's scenario fields.

Run under torchrun (or :func:`accelpact.impl.launch.launch.run_local`, which sets the same environment
variables).  One worker process is one rank.  It

1. connects to the supervisor's store (``MASTER_ADDR:MASTER_PORT``; under torchrun the agent hosts
   it) and namespaces everything by the restart count, ``attempt{TORCHELASTIC_RESTART_COUNT}/``:
   torchrun's store keeps the previous attempt's keys, and ``init_process_group(env://)`` fails on
   every restart without the prefix (spec/torch-facts.md, "torchrun");
2. builds the groups, the workload and the pact (``accelpact.init``, ``attach``);
3. resumes from the latest *committed* checkpoint if there is one (the L2 path: C, then replays
   F - C steps);
4. trains to ``workload.steps``, checkpointing every ``workload.checkpoint_every`` committed steps
   through a dedicated healthy gloo group (never through a communicator that failed); with
   ``workload.micro_batches`` = M it opts in to shrink and grow (``attach(micro_batches=M)``, README
   "Shrink and grow") and trains each step as M micro-batches (:func:`train_micro_batches`, as
   ``tests/shrink_app.py`` does): its replica's share, each read by (step, micro-batch index, its slice
   of it), accumulated without reducing but on the last, the loss weighted by ``run.loss_weight``;
5. injects the job's faults only in the attempt they name (``"attempt"``, default 0), and installs its
   seeded bug (``seeded_bug``, validated here: a name that is not one exits 2 naming the seeded bugs);
6. writes ``result-a{attempt}-r{rank}.json`` (rewritten atomically at every boundary, so a killed
   rank leaves its last committed frontier; bounded: repairs and checkpoints only), ``steps-a{attempt}-r{rank}.ndjson``
   (one line per committed step: loss and time, append-only), ``trace-a{attempt}-r{rank}.ndjson`` (when
   ``"trace": true``) and ``final-r{rank}.pt`` (the per-rank snapshot at the end; none on a rank whose
   replica left the job and was not brought back by the end: its result says ``"outcome": "left"``, and a
   finished rank's result names the replicas active at the end, ``active_replicas``); with
   ``workload.memory``, ``memory-a{attempt}-r{rank}.ndjson`` (each step's peak resident memory, reset as
   the step opens and read as it closes, and the base before the model is built: :mod:`accelpact.testing.memory`).

Every exit goes through ``os._exit`` (gloo teardown can turn exit codes into -6); the worker
records the exit code in its result file just before (see :func:`_record_exits`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..impl.exitcodes import claim_exit
from ..impl.launch import api, workload
from ..impl.launch.job import Job, JobError, load_job
from ..impl.rundir import RunDir
from ..impl.runtime.wrappers import wrapper
from . import seeded
from .faults import hooks_for
from .inject import install_handlers
from .memory import MemoryLog

__all__ = ["ResultFile", "main", "run_job", "train_micro_batches"]


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

    def __init__(self, out: Path, attempt: int, rank: int, base: dict, path: Path | None = None) -> None:
        self.path = path or RunDir(out).result(attempt, rank)
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

    def late_exit() -> None:
        time.sleep(SUPERVISOR_STOP_GRACE_S)
        claim_exit()
        os._exit(128 + signal.SIGTERM)

    def handler(signum, frame) -> None:
        threading.Thread(target=late_exit, name="accelpact-supervisor-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)


def _previous_frontier(job, run: RunDir) -> int | None:
    """The committed frontier this rank reached in the previous attempts (the F an L2 restart
    replays to): from the store's progress keys, or, when the store was lost with the previous
    attempt (a fresh one serves this attempt), from the previous attempts' result files."""
    if job.attempt == 0:
        return None
    best = job.previous_frontier()
    if best is None:
        found = [v for a in range(job.attempt) if (v := _result_frontier(run, a, job.rank)) is not None]
        best = max(found) if found else None
    return best


def _result_frontier(run: RunDir, attempt: int, rank: int) -> int | None:
    try:
        f = json.loads(run.result(attempt, rank).read_text()).get("frontier")
    except (OSError, ValueError):
        return None
    return f if isinstance(f, int) else None


def _record_swaps(result: "ResultFile", training: Any, seen: int, run: RunDir, attempt: int, traced: bool) -> int:
    """The swaps since ``seen`` into the result file (``swaps``: dead rank, spare, replica source,
    point; ``t_fault``/``t_frontier``: the death and the resume at F, for fault-to-frontier)."""
    now = time.monotonic()
    new = [_jsonable(r) for r in training.swaps[seen:]]
    changes: dict[str, Any] = {"swaps": result.data.get("swaps", []) + new, "t_frontier": now,
                               "frontier": training.frontier}
    if traced and new:
        t_f = run.fault_time_ns(attempt, gen=new[-1]["generation"])
        changes["t_fault"] = None if t_f is None else t_f / 1e9
    result.update(**changes)
    return len(training.swaps)


def train_micro_batches(run: Any, app: workload.App, step: int) -> torch.Tensor:
    """One optimizer step of a job that opted in to micro-batches (``attach(micro_batches=M)``), as
    ``tests/shrink_app.py`` trains one: this replica's share of the step's M micro-batches
    (``run.micro_batches``), each read by (step, micro-batch index) and, under HSDP, this rank's slice of
    it (``run.replica_slot``: data-parallel index ``m * size + pos``, never the rank), forward and
    backward with the gradients accumulated locally on all but the last (``run.no_sync``), each loss
    weighted by ``run.loss_weight`` (active replicas / M: the reduced gradient is the mean over the M
    micro-batches whatever the replicas), then ``optimizer.step()``, ``zero_grad``, the cursor's advance.
    With M equal to the replica count every rank reads the batch :func:`workload.train_step` would
    (``m * size + pos`` is its rank) and the weight is 1.  Returns the sum of the weighted losses."""
    if step != app.cursor.kappa:
        raise ValueError(f"train_micro_batches({step}) but the data cursor is at kappa={app.cursor.kappa}: steps must "
                         "be consecutive (zero replay)")
    if app.spec.pad_s:
        time.sleep(app.spec.pad_s)  # the step's device time (benchmarks; WorkloadSpec.pad_s)
    mbs, weight = run.micro_batches(step), run.loss_weight
    pos, size = run.replica_slot
    module, optimizer = run.module, run.optimizer
    device = app.groups.device
    total = torch.zeros(())
    for i, m in enumerate(mbs):
        x, y = app.cursor.batch(step, dp_index=m * size + pos)
        if device is not None and device.type != "cpu":
            x, y = x.to(device), y.to(device)
        with run.no_sync(last=i == len(mbs) - 1):
            logits = module(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) * weight
            loss.backward()
        total += loss.detach().cpu()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    app.cursor.advance()
    app.step = step + 1
    return total


def run_job(job: Job) -> int:
    """Run one rank of ``job`` to the end; return the exit code (0 when training finished).

    A user of the public API like any other (:func:`accelpact.init` -> workload -> ``attach`` ->
    steps); what it adds is the conformance suite's bookkeeping: the result file, the trace header's
    scenario fields, the job's faults and seeded bug (its test hooks).
    """
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    topo, wl = job.topology, job.workload
    world -= topo.spares  # the launcher's last `spares` processes are the job's spares
    if topo.world != world:
        raise JobError(f"topology {topo.nodes}x{topo.ranks_per_node} does not match WORLD_SIZE={world}; "
                       "launch with --nproc-per-node nodes*ranks_per_node")
    run = RunDir(job.out)
    out = run.path
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    spare_path = run.spare_result(rank - world, attempt) if rank >= world else None
    result = ResultFile(out, attempt, rank, {
        "scenario": job.scenario, "attempt": attempt, "restart_count": attempt, "rank": rank, "world": world,
        "outcome": "running", "exit_code": None, "frontier": None, "start_step": 0, "resumed_from": None,
        "replayed_steps": 0, "reports": [], "checkpoints": [], "t_start": t_start,
        "t_ready": None, "t_fault": None, "t_frontier": None, "pid": os.getpid(),
    }, path=spare_path)
    result.update()
    _record_exits(result)

    # Every setting comes from the job file, none from ACCELPACT_* variables: a conformance run is
    # what its scenario says.  The training groups get collective_timeout_s (what turns a hung peer
    # into an error on the others when the detector has not acted); setup and checkpoints pg_timeout_s.
    aj = api.init(job.backend, replicas=topo.nodes, deadline_s=job.deadline_s,
                  collective_timeout_s=job.collective_timeout_s, pg_timeout_s=job.pg_timeout_s,
                  step_deadline_s=job.step_deadline_s, trace_dir=str(out) if job.trace else None,
                  envelope=job.envelope, spares=topo.spares, dead_after_s=job.dead_after_s, hang_floor_s=job.hang_floor_s,
                  env={k: v for k, v in os.environ.items() if not k.startswith("ACCELPACT_")})
    spec = workload.WorkloadSpec(wrapper=wl.wrapper, layers=wl.layers, seed=wl.seed, pad_s=wl.pad_s,
                                 dim=wl.dim or workload.WorkloadSpec.dim)  # 0: the workload's default width
    kind = wrapper(spec.wrapper).recovers
    holder: dict[str, Any] = {}

    def build(tj: Any, extra: Any) -> tuple[Any, Any]:
        """The workload on the job's current groups (at attach, and again after a hot swap)."""
        # a rebuild (extra given: a swap or a discard) is on the meta device: the engine imports its state
        app = workload.build_job(spec, topo, workload.groups_of(tj), materialize=extra is None)
        if extra is not None:
            app.cursor = copy.deepcopy(extra)
            app.step = app.cursor.kappa
        holder["app"] = app
        return app.module, app.optimizer

    # a fault names an identity and strikes the process holding it; a spare that takes rank r's identity
    # at F fires r's faults of later steps only (those up to F struck r's first process: one killed it),
    # and joins every fault fence (a fault at a boundary strikes once all of W reached it)
    hooks = hooks_for(job.faults, attempt=attempt, seeded_bug=job.seeded_bug, after_first_step=rank >= world)
    if aj.spare is not None:  # an idle spare reports under its own name (spare_path), not under a rank's
        result.update(spare=aj.spare, outcome="spare-idle")
        rank = -1
    header = dict(affected=_failing_group(job, kind, topo.group(kind, max(rank, 0))), scenario=job.scenario, seed=wl.seed)
    # issue 43's opt-in (Workload.memory): each step's peak resident memory, the base measured before any build
    memory = MemoryLog() if wl.memory else None
    # issue 41's opt-in (Workload.micro_batches): a death with no spare idle shrinks the job instead of an L2
    training = aj.attach(checkpoint_dir=run.ckpt, checkpoint_every=wl.checkpoint_every,
                         extra_state=lambda: holder["app"].cursor, trace_header=header, hooks=hooks, rebuild=build,
                         warmup=workload.vocab_size,  # a spare reads the corpus while it idles
                         micro_batches=wl.micro_batches or None, checkpoint=wl.checkpoint)
    if training is None:  # a spare the job never needed
        result.update(outcome="finished", exit_code=0, t_end=time.monotonic(), spare_used=False)
        return 0
    if aj.spare is None and training.spare_index is not None:  # a spare that took a dead rank's identity
        rank = aj.rank
        result.update(outcome="swapped-in", identity=rank, t_end=time.monotonic())
        result = ResultFile(out, attempt, rank, {**result.data, "rank": rank, "outcome": "running", "pid": os.getpid(),
                                                 "swapped_in": _jsonable(training.swaps[-1]), "frontier": training.frontier,
                                                 "start_step": training.start_step, "t_ready": time.monotonic()})
        result.update()
        _record_exits(result)
    if memory is not None:  # the window from the process's start through attach (a spare's: through its join)
        memory.open(run.memory(attempt, rank), joined=training.spare_index is not None, step=training.frontier,
                    gen=training.pact.gen, spare=training.spare_index)
    app = holder["app"]
    setattr(app.groups, kind, None)  # the engine owns R now: no second reference keeps generation 0's alive
    start = training.start_step
    if training.restored_extra is not None and training.spare_index is None:
        app.cursor = training.restored_extra
    app.step = start
    del app  # the loop reads holder["app"]: after a swap or a discard a local would keep the old model alive
    prev_f = _previous_frontier(aj, run)
    replayed = max(0, (prev_f or 0) - start) if attempt > 0 else 0
    t_fault_ns = run.fault_time_ns(attempt - 1) if attempt > 0 else None
    if training.spare_index is None:
        result.update(start_step=start, resumed_from=training.resumed_from, replayed_steps=replayed, frontier=start,
                      t_fault=None if t_fault_ns is None else t_fault_ns / 1e9, t_ready=time.monotonic())
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # under torchrun (see _on_supervisor_stop)
        _on_supervisor_stop()
    result.at_exit["frontier"] = lambda: training.pact.guard.frontier

    # committed steps go to an append-only file, one line each (O(1) per step, however long the run);
    # the result file is rewritten only with what stays bounded (RunDir.results() merges the two)
    steps_file = open(run.steps(attempt, rank), "a", buffering=1)
    swaps = len(training.swaps)
    for step in training.steps(wl.steps):
        loss = None
        if memory is not None:
            memory.begin(training.pact.gen, len(training.swaps))
        with training.step(step):
            if wl.micro_batches:
                loss = train_micro_batches(training, holder["app"], step)
            else:
                loss = workload.train_step(holder["app"], step)
        if training.discarded:  # a hot swap discarded the step: the model was rebuilt, the step comes again
            swaps = _record_swaps(result, training, swaps, run, attempt, job.trace)
            if memory is not None:  # the discarded step's window holds its episode
                memory.end(step, gen=training.pact.gen, swaps=training.swaps, discarded=True)
            continue
        saved = len(training.saved)
        report = training.boundary(loss)
        if memory is not None:  # the window closes with the boundary: a repair or a swap there is in it
            memory.end(step, gen=training.pact.gen, swaps=training.swaps, discarded=False, report=report)
        pact = training.pact
        if len(training.swaps) > swaps:  # a swap at the boundary: the step was committed before it
            swaps = _record_swaps(result, training, swaps, run, attempt, job.trace)
        frontier = step + 1
        now = time.monotonic()
        value = float(pact.last_loss) if pact.last_loss is not None else float(loss)
        steps_file.write(json.dumps({"step": step, "loss": value, "t": now}) + "\n")
        changes: dict[str, Any] = {"frontier": frontier}
        if report is not None:
            changes["reports"] = result.data["reports"] + [_jsonable(report)]
            changes["t_frontier"] = now  # L1: training again at the agreed F (zero replay)
            t_f = run.fault_time_ns(attempt, gen=report.generation) if job.trace else None
            changes["t_fault"] = None if t_f is None else t_f / 1e9
        if prev_f is not None and frontier == prev_f:
            changes["t_frontier"] = now  # L2: back at the frontier the failure interrupted
        if len(training.saved) > saved:
            changes["checkpoints"] = result.data["checkpoints"] + [
                {"step": at, "seconds": took} for at, took in training.saved[saved:]]
        result.update(**changes)
    steps_file.close()
    if memory is not None:
        memory.close()
    app = holder["app"]
    pact = training.pact
    if training.left:  # issue 41: this rank's replica left (benched, never recalled): its state is not the job's
        aj.close()
        result.update(outcome="left", exit_code=0, t_end=time.monotonic(), generation=pact.gen)
        return 0

    snap = workload.snapshot(app)
    final = run.final(rank)
    tmp = final.with_name(f".{final.name}.tmp")
    torch.save(snap, tmp)
    os.replace(tmp, final)
    aj.close()  # nobody leaves before everyone saved: a rank exiting early closes sockets under its peers
    result.update(outcome="finished", exit_code=0, t_end=time.monotonic(), generation=pact.gen,
                  **({"active_replicas": list(training.active_replicas)} if wl.micro_batches else {}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelpact.testing.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="path of the job JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        job = load_job(args.job)
        seeded.check(job.seeded_bug)
    except ValueError as exc:  # JobError, or a seeded_bug that is not one
        print(f"accelpact worker: {exc}", file=sys.stderr)
        return 2
    # the test harness's side of external faults (a GIL hang, a straggler's sleep) on SIGUSR2/SIGUSR1:
    # a fault injector outside this process triggers them (accelpact/testing/inject.py); the engine never sees them
    install_handlers()
    try:
        code = run_job(job)
    except SystemExit as exc:  # an engine path that chose sys.exit
        code = int(exc.code or 0)
    except BaseException as exc:  # noqa: BLE001 - an exception outside the pact: fail-stop with a crash code
        traceback.print_exc()
        print(f"accelpact worker rank {os.environ.get('RANK')}: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
    return code  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())  # reached only for a bad job file (2); every run ends in os._exit
