"""Launching jobs: under torchrun (the L2 supervisor, model ``SupervisorRestart``) or a local launcher.

* :func:`run_torchrun` runs ``python -m torch.distributed.run ... -m accelpact.testing.worker --job J``
  with a c10d rendezvous on a free loopback port.  torchrun restarts *every* worker on any non-zero
  exit (``TORCHELASTIC_RESTART_COUNT`` increments); the worker namespaces its store by that count
  (see :mod:`accelpact.testing.worker`).  The launch is always bounded: on timeout the whole process
  group (agent and workers) is killed.
* :func:`run_local` spawns the workers directly with the same environment variables torchrun sets
  and hosts the store itself (so it survives worker deaths).  No restarts; used by tests that need
  to SIGKILL a rank at a chosen moment.
* :func:`run_restarting` supervises like torchrun (every worker restarted from the last checkpoint
  after any failed worker) but serves each attempt's store from its own :class:`StoreServer`
  process, the way a rendezvous moves to a fresh store when its host is lost: the store can then be
  killed from outside (fault kind ``store_loss``) and the job still restarts.
* :func:`run_reference` runs the uninterrupted reference once per (workload, topology, backend)
  and caches its final snapshots, so many scenarios compare against one run.

Spares (hot swap, ``topology.spares`` = S > 0): :func:`run_torchrun` and :func:`run_local` start
W + S processes on one node (``WORLD_SIZE`` = ``LOCAL_WORLD_SIZE`` = W + S, ``ACCELPACT_SPARES_PER_NODE`` =
S; ranks W..W+S-1 are the spares: on one node the spares per node are the last ranks, spec/hotswap.md
"Spares per node"), and each of them, spares too, runs under a keeper (:mod:`accelpact.impl.launch.keeper`), so
that a crashed rank's death is not taken for the job's by torchrun, and a dead worker's keeper starts a
fresh spare in its place (refill: the pool holds S spares again within seconds).  With S = 0 nothing differs.

Every child process is started, waited on and reaped by one :class:`ProcessSet` (also the core of
the multi-process test harness, :mod:`accelpact.testing`).  Every file name of a run folder comes
from :class:`~accelpact.impl.rundir.RunDir`; the job is the typed :class:`~accelpact.impl.launch.job.Job`.

No torch import at module level: the launcher process itself never needs torch, except
:func:`run_local`, which hosts a TCPStore.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

from .job import Job, Topology
from .keeper import SPARES_PER_NODE_ENV  # torch-free
from ..rundir import RunDir

__all__ = [
    "LaunchError",
    "LaunchResult",
    "PHASES",
    "ProcessSet",
    "StoreServer",
    "free_port",
    "job_key",
    "l1_episodes",
    "l2_episodes",
    "swap_episodes",
    "run_local",
    "run_reference",
    "run_restarting",
    "run_torchrun",
    "worker_env",
]

WORKER_MODULE = "accelpact.testing.worker"  # the harness's rank program (it arms the job's faults)
KEEPER_MODULE = "accelpact.impl.launch.keeper_entry"  # the keeper (impl/launch/keeper.py), without its deprecation line
#: the keeper's opt-in to keep a worker without spares (impl/launch/keeper.py; issue 41): set for a job
#: whose workload opted in to micro-batches, so that a death is posted (and the job shrinks) even when no
#: spare was launched or every spare is spent, instead of torchrun restarting every rank
KEEP_ENV = "ACCELPACT_KEEP"


def _kept(job: Job) -> bool:
    """Whether every process of ``job`` runs behind a keeper: with spares, or opted in to micro-batches
    (``Workload.micro_batches``: a death with no spare idle shrinks the job, which needs its notice)."""
    return bool(job.topology.spares or job.workload.micro_batches)


def _keep_env(job: Job) -> dict[str, Any]:
    return {KEEP_ENV: 1} if job.workload.micro_batches else {}


class LaunchError(RuntimeError):
    """A job could not be launched or did not produce the files it must produce."""


# ----------------------------------------------------------------------------- spawning and reaping

def worker_env(extra: Mapping[str, Any] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: ``base`` (default ``os.environ``), ``OMP_NUM_THREADS=1`` (a rank
    never oversubscribes the cores), unbuffered output, then ``extra`` (values made strings)."""
    env = dict(os.environ if base is None else base)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _alive(pid: int) -> bool:
    try:
        os.getpgid(pid)
        return True
    except ProcessLookupError:
        return False


def _descendants(roots: set[int]) -> set[int]:
    """Every live descendant of ``roots`` (Linux: each process's parent read from ``/proc/<pid>/stat``)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
            parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out: set[int] = set()
    frontier = set(roots)
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier and pid not in out}
        out |= frontier
    return out


class ProcessSet:
    """Child processes started together, waited on under one deadline, and always reaped.

    Each child leads its own session (``start_new_session``), so that killing it kills what it
    spawned too (torchrun's agent and its workers).  Use as a context manager: leaving the block,
    normally or by an exception (a failed assertion, Ctrl-C), SIGKILLs every child's process group
    and reaps every child, so no process outlives its launch::

        with ProcessSet() as ps:
            ps.start([sys.executable, "-m", "x"], env=worker_env())
            timed_out = ps.wait(timeout_s=60)
        codes = ps.codes
    """

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.t0 = time.monotonic()

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, stdout: IO | None = None,
              cwd: str | os.PathLike | None = None) -> subprocess.Popen:
        """Start one child; ``stdout`` (also stderr) is a file, or None: inherited."""
        proc = subprocess.Popen(list(cmd), env=dict(env) if env is not None else None, cwd=cwd, stdout=stdout,
                                stderr=subprocess.STDOUT if stdout is not None else None, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait(self, timeout_s: float) -> bool:
        """Wait for every child until ``timeout_s`` after the set was created; True if some child
        was still running then (the caller kills; leaving the ``with`` block does)."""
        deadline = self.t0 + timeout_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return True
        return False

    def running(self) -> list[int]:
        """Indices of the children still running."""
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def kill(self) -> None:
        """SIGKILL every child's process group (also of a child that exited: what it spawned may
        live on) and the process group of every descendant, then reap every child.  The descendants'
        groups matter: torchrun's agent starts each worker in a session of its own
        (``torch/distributed/elastic/multiprocessing/subprocess_handler``), so killing the agent's
        group alone would orphan its workers."""
        groups = {p.pid for p in self.procs}
        groups |= {os.getpgid(pid) for pid in _descendants({p.pid for p in self.procs}) if _alive(pid)}
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL could not end it
                pass

    @property
    def codes(self) -> list[int | None]:
        """Exit code per child in start order (negative: killed by that signal; None: running)."""
        return [p.poll() for p in self.procs]

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def __enter__(self) -> "ProcessSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# ------------------------------------------------------------------------------------- store server

#: Environment variable naming the pid of the process serving the job's store (set by
#: :func:`run_restarting`; fault kind ``store_loss`` kills that process).
STORE_PID_ENV = "ACCELPACT_STORE_PID"

_STORE_SERVER = """
import sys, time, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, world_size=int(sys.argv[1]), is_master=True, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=float(sys.argv[2])))
print(s.port, flush=True)
while True:
    time.sleep(3600)
"""


class StoreServer:
    """A c10d TCPStore master served by a child process of its own (loopback, free port), so the
    store can be lost without losing the launcher: ``kill()`` (or SIGKILL of ``pid`` from anywhere)
    is the loss of the store's host.  Use as a context manager; the process is always reaped."""

    port: int
    proc: subprocess.Popen
    _ps: ProcessSet

    @classmethod
    def start(cls, world_size: int, timeout_s: float = 300.0, ready_s: float = 60.0) -> "StoreServer":
        """Start the server and wait (at most ``ready_s``) for its port."""
        self = cls.__new__(cls)
        self._ps = ProcessSet()
        proc = subprocess.Popen([sys.executable, "-c", _STORE_SERVER, str(world_size), str(timeout_s)],
                                env=worker_env(), stdout=subprocess.PIPE, start_new_session=True, text=True)
        self._ps.procs.append(proc)
        self.proc = proc
        import select

        out = proc.stdout
        assert out is not None  # stdout=PIPE
        ready, _, _ = select.select([out], [], [], ready_s)
        line = out.readline() if ready else ""
        if not line.strip().isdigit():
            self._ps.kill()
            raise LaunchError(f"store server did not start within {ready_s}s (exit code {proc.poll()})")
        self.port = int(line)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self._ps.kill()

    def __enter__(self) -> "StoreServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# ------------------------------------------------------------------------------------------- results

@dataclass
class LaunchResult:
    """What a launch produced: the supervisor's exit status and every per-rank result file.

    ``results`` maps (attempt, rank) to the parsed ``result-a{attempt}-r{rank}.json``;
    ``codes``: every worker's exit code (:func:`run_local` only; torchrun reports one status).
    """

    returncode: int | None
    timed_out: bool
    wall_s: float
    out: Path
    log: Path
    results: dict[tuple[int, int], dict] = field(default_factory=dict)
    port: int = 0  # the rendezvous port torchrun was given
    codes: list[int | None] = field(default_factory=list)

    @property
    def attempts(self) -> list[int]:
        return sorted({a for a, _ in self.results})

    @property
    def restarts(self) -> int:
        """Highest restart count any worker saw (0: no restart)."""
        return max((r.get("restart_count", a) for (a, _), r in self.results.items()), default=0)

    def attempt(self, attempt: int) -> dict[int, dict]:
        return {r: res for (a, r), res in self.results.items() if a == attempt}

    def final(self) -> dict[int, dict]:
        """The last attempt's result per rank."""
        return self.attempt(self.attempts[-1]) if self.results else {}

    def ok(self) -> bool:
        fin = self.final()
        return self.returncode == 0 and not self.timed_out and bool(fin) and all(
            r.get("outcome") == "finished" for r in fin.values())

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bind to port 0). Racy by nature; the window is short."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nproc(job: Job, nproc: int | None) -> int:
    """The number of training ranks (spares are not counted)."""
    n = job.world if nproc is None else nproc
    if n < 1:
        raise LaunchError(f"nproc must be >= 1, got {n}")
    return n


def _spares(job: Job, spares: int | None) -> int:
    s = job.topology.spares if spares is None else spares
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise LaunchError(f"spares must be an integer >= 0, got {s!r}")
    return s


# ------------------------------------------------------------------------------------------ torchrun

def run_torchrun(job: Job, nproc: int | None = None, max_restarts: int = 1, timeout_s: float = 300.0,
                 monitor_interval: float = 0.1, fresh: bool = True) -> LaunchResult:
    """Run ``job`` under torchrun with ``nproc`` workers (default ``job.world``) and at most
    ``max_restarts`` restarts.

    With ``job.topology.spares`` = S > 0, torchrun starts ``nproc + S`` processes
    (``--nproc-per-node``; ranks ``nproc ..`` are the spares), the agent's environment has
    ``ACCELPACT_SPARES_PER_NODE=S`` (one node: the last S ranks; its keepers give their workers
    ``ACCELPACT_SPARES=S``), and each process is
    ``python -m accelpact.impl.launch.keeper -- python -m accelpact.testing.worker --job J``: the keeper turns a
    training rank's crash into a death notice instead of a failed worker (see
    :mod:`accelpact.impl.launch.keeper`); fail-stop exits reach torchrun unchanged.  A job whose workload
    opted in to micro-batches (``Workload.micro_batches``) runs every process behind a keeper too, spares
    or not, with ``ACCELPACT_KEEP=1``: a death with no spare idle is posted, and the job shrinks instead of
    torchrun restarting it (README, "Shrink and grow").

    ``fresh`` (default) first removes a previous run's outputs from ``job.out``
    (:meth:`RunDir.clear`); pass False to resume from the checkpoints already there.

    Bounded: after ``timeout_s`` the agent's whole process group is SIGKILLed and the result says
    ``timed_out``.  Worker output goes to ``<out>/torchrun.log``.
    """
    n = _nproc(job, nproc)
    spares = _spares(job, None)
    run = RunDir(job.out)
    if fresh:
        run.clear()
    path = job.write()
    for _ in range(3):
        res = _torchrun_once(path, run, n, max_restarts, timeout_s, monitor_interval, spares, keep=_kept(job),
                             env=_keep_env(job))
        # The free port can be taken between free_port() and the agent's bind (another launch,
        # or an ephemeral port of a gloo connection): the rendezvous then never forms and no
        # worker ever ran.  Only that case is retried, on a new port.
        if res.results or res.timed_out or res.returncode == 0 or not _rendezvous_failed(run.torchrun_log, res.port):
            return res
        run.clear()
        path = job.write()
    return res


def _rendezvous_failed(log: Path, port: int) -> bool:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return f"failed to connect/validate to host 127.0.0.1:{port}" in text


def _torchrun_once(path: Path, run: RunDir, nproc: int, max_restarts: int, timeout_s: float,
                   monitor_interval: float, spares: int = 0, keep: bool = False,
                   env: Mapping[str, Any] | None = None) -> LaunchResult:
    port = free_port()
    worker = ["-m", WORKER_MODULE, "--job", str(path)]
    if spares or keep:  # every process runs under a keeper; the agent sees the keeper
        worker = ["-m", KEEPER_MODULE, "--", sys.executable, *worker]
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc + spares), "--max-restarts", str(max_restarts),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--monitor-interval", str(monitor_interval),
        *worker,
    ]
    log = run.torchrun_log
    with open(log, "ab") as logf, ProcessSet() as ps:
        # the workers are in the agent's session: leaving the block kills any that outlive it
        agent = ps.start(cmd, env=worker_env({**({SPARES_PER_NODE_ENV: spares} if spares else {}), **(env or {})}),
                         stdout=logf)
        timed_out = ps.wait(timeout_s)
        if timed_out:
            ps.kill()
    return LaunchResult(returncode=agent.returncode, timed_out=timed_out, wall_s=ps.elapsed_s, out=run.path, log=log,
                        results=run.results(), port=port, codes=[agent.returncode])


# ------------------------------------------------------------------------------------------- local

def run_local(job: Job, nproc: int | None = None, timeout_s: float = 300.0, *, attempt: int = 0,
              on_start: Callable[[list[subprocess.Popen]], None] | None = None, store: Any = None,
              spares: int | None = None) -> LaunchResult:
    """Spawn ``nproc`` workers (default ``job.world``) directly (no supervisor, no restart) with
    torchrun's environment variables.

    ``spares`` (default ``job.topology.spares``) = S > 0: S more processes, ranks ``nproc ..
    nproc + S - 1``, the spares; every process gets ``WORLD_SIZE`` = ``LOCAL_WORLD_SIZE`` = ``nproc +
    S`` and ``ACCELPACT_SPARES_PER_NODE`` = S (one node), and each runs under a keeper (``python -m
    accelpact.impl.launch.keeper -- python -m accelpact.testing.worker ...``, its worker a child in the
    keeper's process group), as under torchrun, so ``on_start`` gets the keepers' processes and a dead
    worker is refilled.  ``codes`` then has ``nproc + S`` entries.  S = 0: as without spares (but a job
    opted in to micro-batches runs behind keepers with ``ACCELPACT_KEEP=1``, as under torchrun).

    The launcher hosts the TCPStore, so the store outlives any worker.  ``attempt`` sets
    ``TORCHELASTIC_RESTART_COUNT`` (to emulate a restart by calling again with attempt + 1).
    ``on_start(procs)`` is called once every worker is spawned (tests use it to kill one).
    ``store``: a master TCPStore to reuse across calls (as torchrun's agent keeps its store across
    restarts, which is where the worker finds the previous attempt's frontier); None: a fresh one.
    Attempt 0 starts from a clean ``out`` (:meth:`RunDir.clear`); later attempts keep it.
    Returns when all workers exited, or kills them all after ``timeout_s``.
    """
    from datetime import timedelta

    import torch.distributed as dist

    n = _nproc(job, nproc)
    s = _spares(job, spares)
    total = n + s
    run = RunDir(job.out)
    if attempt == 0:
        run.clear()
    path = job.write()
    log = run.local_log(attempt)
    if store is None:
        store = dist.TCPStore("127.0.0.1", 0, world_size=total + 1, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=max(timeout_s, 1)))
    port = store.port
    served = {STORE_PID_ENV: store.pid} if isinstance(store, StoreServer) else {}
    with_spares = {SPARES_PER_NODE_ENV: s} if s else {}
    worker = [sys.executable, "-m", WORKER_MODULE, "--job", str(path)]
    with open(log, "ab") as logf, ProcessSet() as ps:
        for rank in range(total):
            env = worker_env({
                "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": total, "LOCAL_WORLD_SIZE": total,
                "GROUP_RANK": 0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                "TORCHELASTIC_RESTART_COUNT": attempt, "TORCHELASTIC_USE_AGENT_STORE": "True", **served, **with_spares,
                **_keep_env(job),
            })
            kept = s > 0 or _kept(job)  # every process of a job with spares (or opted in to micro-batches): under its keeper
            cmd = [sys.executable, "-m", KEEPER_MODULE, "--", *worker] if kept else worker
            ps.start(cmd, env=env, stdout=logf)
        if on_start is not None:
            on_start(list(ps.procs))
        timed_out = ps.wait(timeout_s)
        if timed_out:
            ps.kill()
    del store
    codes = ps.codes
    rc = next((c for c in codes if c != 0), 0)
    return LaunchResult(returncode=rc, timed_out=timed_out, wall_s=ps.elapsed_s, out=run.path, log=log,
                        results=run.results(), codes=codes)


def run_restarting(job: Job, nproc: int | None = None, max_restarts: int = 1, timeout_s: float = 300.0) -> LaunchResult:
    """Supervise like torchrun (model ``SupervisorRestart``): once every worker of an attempt has
    ended, if any failed, restart all of them (``TORCHELASTIC_RESTART_COUNT`` + 1; they load the
    last committed checkpoint), at most ``max_restarts`` times.  Unlike torchrun each attempt's
    store is served by a :class:`StoreServer` of its own (its pid in ``ACCELPACT_STORE_PID``), so
    killing it is the loss of the store's host, and the restart rendezvouses on a fresh store.
    Survivors are not killed when a peer fails: each must exit on its own, within its bound."""
    n = _nproc(job, nproc)
    t0 = time.monotonic()
    res: LaunchResult | None = None
    for attempt in range(max_restarts + 1):
        left = max(1.0, timeout_s - (time.monotonic() - t0))
        with StoreServer.start(n + job.topology.spares + 1, timeout_s=left) as server:
            res = run_local(job, n, timeout_s=left, attempt=attempt, store=server)
        if res.timed_out or all(c == 0 for c in res.codes):
            break
    assert res is not None
    return LaunchResult(returncode=res.returncode, timed_out=res.timed_out, wall_s=time.monotonic() - t0, out=res.out,
                        log=res.log, results=RunDir(job.out).results(), codes=res.codes)


# --------------------------------------------------------------------------------------- reference

def job_key(job: Job) -> str:
    """Cache key of a job's uninterrupted reference: workload, topology without spares, backend
    (steps are in workload), and the workload code itself (a cached reference from other code proves
    nothing)."""
    j = job.to_json()
    j["topology"].pop("spares", None)  # spares take no part in an uninterrupted run
    basis: dict[str, Any] = {k: j[k] for k in ("topology", "workload", "backend")}
    src = Path(__file__).with_name("workload.py")
    basis["workload_code"] = hashlib.sha256(src.read_bytes()).hexdigest() if src.exists() else ""
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def run_reference(job: Job, cache_dir: str | os.PathLike, timeout_s: float = 300.0,
                  launcher: str = "local") -> Path:
    """Run the fault-free reference of ``job`` once and return the folder holding ``final-r*.pt``.

    Cached under ``cache_dir/ref-{job_key}``; a cached folder counts only if it has one final
    snapshot per rank and a ``DONE`` marker (so a killed reference run is redone, not trusted).
    ``launcher``: ``"local"`` (:func:`run_local`) or ``"torchrun"``.

    The reference of a job with spares is the same job without them (spares take no part in an
    uninterrupted run): it runs, and is cached under the key, of the spare-free job.

    Several processes may share ``cache_dir`` (pytest-xdist workers): each key is computed by one of
    them under an exclusive lock on ``ref-{key}.lock``, the others wait for it and reuse its folder.
    The wait is bounded by the holder's own ``timeout_s``; a holder that dies releases the lock.
    """
    if launcher not in ("local", "torchrun"):
        raise LaunchError(f"launcher must be 'local' or 'torchrun', got {launcher!r}")
    if job.topology.spares:
        job = job.replace(topology=Topology(job.topology.nodes, job.topology.ranks_per_node))
    key = job_key(job)
    folder = Path(cache_dir) / f"ref-{key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"ref-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = RunDir(folder)
        if cached.done.exists() and all(cached.final(r).exists() for r in range(job.world)):
            return folder
        if folder.exists():
            shutil.rmtree(folder)
        ref = job.replace(faults=[], scenario="reference", out=str(folder), seeded_bug=None)
        res = (run_torchrun(ref, max_restarts=0, timeout_s=timeout_s) if launcher == "torchrun"
               else run_local(ref, timeout_s=timeout_s))
        if not res.ok():
            raise LaunchError(f"reference run failed (rc={res.returncode}, timed_out={res.timed_out}); "
                              f"see {res.log}:\n{res.log_tail(2000)}")
        cached.done.write_text(key)
        return folder


# ----------------------------------------------------------------------------- reading a run back

PHASES = ("observe", "agree", "retire", "rebuild", "rebind", "validate", "release", "total")


def l1_episodes(res: LaunchResult, attempt: int = 0) -> list[dict]:
    """One entry per in-place repair (generation g) of ``attempt``: phase durations (max over ranks,
    seconds), fault time (earliest ``Fault*`` record of g), fault-to-observe (the latest
    ``RankObserve`` of g minus the fault: detection) and fault-to-frontier (latest ``RankResume`` of
    g minus the fault; the frontier F is kept, so this is the time until the job trains again at
    F).  Needs ``"trace": true``."""
    ranks = sorted(r for (a, r) in res.results if a == attempt)
    faults: dict[int, int] = {}
    resumes: dict[int, int] = {}
    observed: dict[int, int] = {}
    run = RunDir(res.out)
    for r in ranks:
        for rec in run.records(attempt, r):
            if rec.get("type") != "action":
                continue
            g = int(rec.get("gen", 0))
            if rec["action"].startswith("Fault"):
                faults[g] = min(faults.get(g, rec["t_ns"]), rec["t_ns"])
            elif rec["action"] == "RankResume":
                resumes[g] = max(resumes.get(g, rec["t_ns"]), rec["t_ns"])
            elif rec["action"] == "RankObserve":
                observed[g] = max(observed.get(g, rec["t_ns"]), rec["t_ns"])
    episodes = []
    for g in sorted(resumes):
        reports = [rep for r in ranks for rep in res.results[(attempt, r)].get("reports", [])
                   if int(rep.get("generation", -1)) == g]
        phases = {ph: max((rep.get(f"{ph}_ns", 0) for rep in reports), default=0) / 1e9 for ph in PHASES}
        t_fault = faults.get(g)
        episodes.append({
            "generation": g, "phases_s": phases, "replayed_steps": 0,
            "refs_rebound": max((rep.get("refs_rebound", 0) for rep in reports), default=0),
            "fault_to_observe_s": None if t_fault is None or g not in observed else (observed[g] - t_fault) / 1e9,
            "fault_to_frontier_s": None if t_fault is None else (resumes[g] - t_fault) / 1e9,
        })
    return episodes


def _span(t0, t1):
    return (t1 - t0) if t0 and t1 else None


def swap_episodes(res: LaunchResult, attempt: int = 0) -> list[dict]:
    """One entry per hot swap (generation g) of ``attempt``: the dead ranks, the spare each took,
    the replica that sent its state, the frontier F it resumed at, phase durations (max over ranks,
    ms) and fault-to-frontier (the death's ``Fault*`` record of g until the last rank's release, the
    moment it trains again at F; needs ``"trace": true``).  Read from every rank's swap records (a
    spare's ``swapped_in`` and the ``swaps`` it took part in afterwards)."""
    by_gen: dict[int, dict] = {}
    run = RunDir(res.out)
    for (a, _r), r in res.results.items():
        if a != attempt:
            continue
        for sw in list(r.get("swaps") or []) + ([r["swapped_in"]] if r.get("swapped_in") else []):
            g = int(sw["generation"])
            e = by_gen.setdefault(g, {"generation": g, "dead": sw["dead"], "spares": sw["spares"], "sources": {},
                                      "frontier": sw["frontier"], "point": "", "durations_ms": {}, "t_resume": None,
                                      "replayed_steps": 0})
            e["sources"].update(sw.get("sources") or {})
            e["point"] = sw.get("point") or e["point"]
            for k, v in (sw.get("durations_ms") or {}).items():
                e["durations_ms"][k] = max(e["durations_ms"].get(k, 0.0), v)
            if sw.get("t_resume"):
                e["t_resume"] = max(e["t_resume"] or 0.0, float(sw["t_resume"]))
    out = []
    for g in sorted(by_gen):
        e = by_gen[g]
        t1 = e.pop("t_resume")
        t0 = run.fault_time_ns(attempt, gen=g)
        e["fault_to_frontier_s"] = (t1 - t0 / 1e9) if t0 is not None and t1 is not None else None
        out.append(e)
    return out


def l2_episodes(res: LaunchResult) -> list[dict]:
    """One entry per torchrun restart (attempt a >= 1): exit codes of attempt a-1, checkpoint C,
    replayed steps F - C, and fault-to-frontier (fault of a-1 until attempt a is back at F), split
    into fault-to-exit (detection: the fault until the last worker of a-1 exited), exit-to-ready
    (torchrun's respawn, imports, rendezvous, the checkpoint's reload) and ready-to-frontier (the
    replay)."""
    episodes = []
    for a in res.attempts:
        if a == 0:
            continue
        prev, cur = res.attempt(a - 1), res.attempt(a)
        t_fault = min((r["t_fault"] for r in cur.values() if r.get("t_fault") is not None), default=None)
        t_front = [r.get("t_frontier") for r in cur.values()]
        fronts = [float(t) for t in t_front if t is not None]
        done = t_fault is not None and len(fronts) == len(t_front)
        t_exit = max((r.get("t_exit") or 0 for r in prev.values()), default=None)
        t_ready = max((r.get("t_ready") or 0 for r in cur.values()), default=None)
        episodes.append({
            "attempt": a,
            "exit_codes": sorted({r.get("exit_code") for r in prev.values()}, key=lambda c: (c is None, c)),
            "resumed_from": max((r.get("resumed_from") or 0 for r in cur.values()), default=0),
            "replayed_steps": max((r.get("replayed_steps", 0) for r in cur.values()), default=0),
            # last exit of a-1 until every rank of a is attached again (torchrun respawn + import + reload)
            "exit_to_ready_s": _span(t_exit, t_ready),
            "fault_to_exit_s": _span(t_fault, t_exit),
            "ready_to_frontier_s": _span(t_ready, max(fronts)) if done else None,
            "fault_to_frontier_s": (max(fronts) - t_fault) if done and t_fault is not None else None,
        })
    return episodes
