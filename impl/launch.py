"""Launching jobs: under torchrun (the L2 supervisor, model ``SupervisorRestart``) or a local launcher.

* :func:`run_torchrun` runs ``python -m torch.distributed.run ... -m accelpact.impl.worker --job J``
  with a c10d rendezvous on a free loopback port.  torchrun restarts *every* worker on any non-zero
  exit (``TORCHELASTIC_RESTART_COUNT`` increments); the worker namespaces its store by that count
  (see :mod:`accelpact.impl.worker`).  The launch is always bounded: on timeout the whole process
  group (agent and workers) is killed.
* :func:`run_local` spawns the workers directly with the same environment variables torchrun sets
  and hosts the store itself (so it survives worker deaths).  No restarts; used by tests that need
  to SIGKILL a rank at a chosen moment.
* :func:`run_reference` runs the uninterrupted reference once per (workload, topology, steps,
  backend) and caches its final snapshots, so many scenarios compare against one run.

No torch import at module level: the launcher process itself never needs torch, except
:func:`run_local`, which hosts a TCPStore.
"""

from __future__ import annotations

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

__all__ = [
    "LaunchError",
    "LaunchResult",
    "PHASES",
    "clear_outputs",
    "free_port",
    "job_key",
    "l1_episodes",
    "l2_episodes",
    "load_results",
    "read_trace",
    "run_local",
    "run_reference",
    "run_torchrun",
    "write_job",
]

WORKER_MODULE = "accelpact.impl.worker"


class LaunchError(RuntimeError):
    """A job could not be launched or did not produce the files it must produce."""


@dataclass
class LaunchResult:
    """What a launch produced: the supervisor's exit status and every per-rank result file.

    ``results`` maps (attempt, rank) to the parsed ``result-a{attempt}-r{rank}.json``.
    """

    returncode: int | None
    timed_out: bool
    wall_s: float
    out: Path
    log: Path
    results: dict[tuple[int, int], dict] = field(default_factory=dict)
    port: int = 0  # the rendezvous port torchrun was given

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


def write_job(job: dict) -> Path:
    """Write ``job`` to ``<out>/job.json`` (creating ``out``) and return the path."""
    if not job.get("out"):
        raise LaunchError("job has no 'out' directory; set job['out'] to where results and traces go")
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "job.json"
    path.write_text(json.dumps(job, indent=1, sort_keys=True))
    return path


def load_results(out: str | os.PathLike) -> dict[tuple[int, int], dict]:
    results: dict[tuple[int, int], dict] = {}
    for p in Path(out).glob("result-a*-r*.json"):
        try:
            a, r = p.stem[len("result-a"):].split("-r")
            results[(int(a), int(r))] = json.loads(p.read_text())
        except (ValueError, OSError):
            continue  # a file being rewritten at the moment of the kill: skip it
    return results


def clear_outputs(out: str | os.PathLike) -> None:
    """Remove what a previous run left in ``out`` (results, traces, snapshots, checkpoints, logs).

    Why: the worker resumes from the latest committed checkpoint it finds; a stale ``ckpt/`` from an
    earlier run with the same ``out`` would make a fresh job start at that run's end.  Only files
    this package writes are removed.
    """
    out = Path(out)
    if not out.is_dir():
        return
    for pattern in ("result-a*-r*.json", "trace-a*-r*.ndjson", "final-r*.pt", "torchrun.log", "local-a*.log",
                    "job.json", "DONE", ".final-r*.pt.tmp", "result-a*-r*.json.*.tmp"):
        for p in out.glob(pattern):
            p.unlink(missing_ok=True)
    shutil.rmtree(out / "ckpt", ignore_errors=True)


def _worker_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (agent and workers), then reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL of a reaped child
        pass


def run_torchrun(job: dict, nproc: int, max_restarts: int = 1, timeout_s: float = 300.0,
                 monitor_interval: float = 0.1, fresh: bool = True) -> LaunchResult:
    """Run ``job`` under torchrun with ``nproc`` workers and at most ``max_restarts`` restarts.

    ``fresh`` (default) first removes a previous run's outputs from ``job["out"]``
    (:func:`clear_outputs`); pass False to resume from the checkpoints already there.

    Bounded: after ``timeout_s`` the agent's whole process group is SIGKILLed and the result says
    ``timed_out``.  Worker output goes to ``<out>/torchrun.log``.
    """
    if nproc < 1:
        raise LaunchError(f"nproc must be >= 1, got {nproc}")
    if fresh and job.get("out"):
        clear_outputs(job["out"])
    path = write_job(job)
    out = Path(job["out"])
    log = out / "torchrun.log"
    for launch in range(3):
        res = _torchrun_once(path, out, log, nproc, max_restarts, timeout_s, monitor_interval)
        # The free port can be taken between free_port() and the agent's bind (another launch,
        # or an ephemeral port of a gloo connection): the rendezvous then never forms and no
        # worker ever ran.  Only that case is retried, on a new port.
        if res.results or res.timed_out or res.returncode == 0 or not _rendezvous_failed(log, res.port):
            return res
        clear_outputs(out)
        path = write_job(job)
    return res


def _rendezvous_failed(log: Path, port: int) -> bool:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return f"failed to connect/validate to host 127.0.0.1:{port}" in text


def _torchrun_once(path, out: Path, log: Path, nproc: int, max_restarts: int, timeout_s: float,
                   monitor_interval: float) -> "LaunchResult":
    port = free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--monitor-interval", str(monitor_interval),
        "-m", WORKER_MODULE, "--job", str(path),
    ]
    t0 = time.monotonic()
    with open(log, "ab") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=_worker_env(),
                                start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
        finally:
            # Workers are in the agent's session: make sure none outlives the launch.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return LaunchResult(returncode=rc, timed_out=timed_out, wall_s=time.monotonic() - t0, out=out, log=log,
                        results=load_results(out), port=port)


def run_local(job: dict, nproc: int, timeout_s: float = 300.0, *, attempt: int = 0,
              on_start=None, store=None) -> LaunchResult:
    """Spawn ``nproc`` workers directly (no supervisor, no restart) with torchrun's env variables.

    The launcher hosts the TCPStore, so the store outlives any worker.  ``attempt`` sets
    ``TORCHELASTIC_RESTART_COUNT`` (to emulate a restart by calling again with attempt + 1).
    ``on_start(procs)`` is called once every worker is spawned (tests use it to kill one).
    ``store``: a master TCPStore to reuse across calls (as torchrun's agent keeps its store across
    restarts, which is where the worker finds the previous attempt's frontier); None: a fresh one.
    Attempt 0 starts from a clean ``out`` (:func:`clear_outputs`); later attempts keep it.
    Returns when all workers exited, or kills them all after ``timeout_s``.
    """
    from datetime import timedelta

    import torch.distributed as dist

    if attempt == 0 and job.get("out"):
        clear_outputs(job["out"])
    path = write_job(job)
    out = Path(job["out"])
    log = out / f"local-a{attempt}.log"
    if store is None:
        store = dist.TCPStore("127.0.0.1", 0, world_size=nproc + 1, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=max(timeout_s, 1)))
    port = store.port
    procs: list[subprocess.Popen] = []
    t0 = time.monotonic()
    timed_out = False
    with open(log, "ab") as logf:
        try:
            for rank in range(nproc):
                env = _worker_env({
                    "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": nproc, "LOCAL_WORLD_SIZE": nproc,
                    "GROUP_RANK": 0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                    "TORCHELASTIC_RESTART_COUNT": attempt, "TORCHELASTIC_USE_AGENT_STORE": "True",
                })
                procs.append(subprocess.Popen([sys.executable, "-m", WORKER_MODULE, "--job", str(path)],
                                              stdout=logf, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
            if on_start is not None:
                on_start(procs)
            deadline = t0 + timeout_s
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        finally:
            for p in procs:
                if p.poll() is None:
                    _kill_group(p)
            del store
    codes = [p.returncode for p in procs]
    rc = next((c for c in codes if c != 0), 0)
    res = LaunchResult(returncode=rc, timed_out=timed_out, wall_s=time.monotonic() - t0, out=out, log=log,
                       results=load_results(out))
    res.codes = codes  # type: ignore[attr-defined]
    return res


def job_key(job: dict) -> str:
    """Cache key of a job's uninterrupted reference: workload, topology, backend (steps are in
    workload), and the workload code itself (a cached reference from other code proves nothing)."""
    basis = {k: job.get(k) for k in ("topology", "workload", "backend")}
    src = Path(__file__).with_name("workload.py")
    basis["workload_code"] = hashlib.sha256(src.read_bytes()).hexdigest() if src.exists() else ""
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def run_reference(job: dict, cache_dir: str | os.PathLike, timeout_s: float = 300.0,
                  launcher: str = "torchrun") -> Path:
    """Run the fault-free reference of ``job`` once and return the folder holding ``final-r*.pt``.

    Cached under ``cache_dir/ref-{job_key}``; a cached folder counts only if it has one final
    snapshot per rank and a ``DONE`` marker (so a killed reference run is redone, not trusted).
    """
    topo = job["topology"]
    nproc = int(topo["nodes"]) * int(topo["ranks_per_node"])
    folder = Path(cache_dir) / f"ref-{job_key(job)}"
    if (folder / "DONE").exists() and all((folder / f"final-r{r}.pt").exists() for r in range(nproc)):
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    ref = dict(job, faults=[], scenario="reference", out=str(folder), seeded_bug=None)
    ref["workload"] = dict(job["workload"])
    res = (run_torchrun(ref, nproc, max_restarts=0, timeout_s=timeout_s) if launcher == "torchrun"
           else run_local(ref, nproc, timeout_s=timeout_s))
    if not res.ok():
        raise LaunchError(f"reference run failed (rc={res.returncode}, timed_out={res.timed_out}); "
                          f"see {res.log}:\n{res.log_tail(2000)}")
    (folder / "DONE").write_text(job_key(job))
    return folder


# ----------------------------------------------------------------------------- reading a run back

def read_trace(out: str | os.PathLike, attempt: int, rank: int) -> list[dict]:
    """Records of ``trace-a{attempt}-r{rank}.ndjson`` ([] if absent); a torn last line is skipped."""
    p = Path(out) / f"trace-a{attempt}-r{rank}.ndjson"
    recs = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except ValueError:
                continue
    return recs


PHASES = ("observe", "agree", "retire", "rebuild", "rebind", "validate", "release", "total")


def l1_episodes(res: LaunchResult, attempt: int = 0) -> list[dict]:
    """One entry per in-place repair (generation g) of ``attempt``: phase durations (max over ranks,
    seconds), fault time (earliest ``Fault*`` record of g) and fault-to-frontier (latest
    ``RankResume`` of g minus the fault; the frontier F is kept, so this is the time until the job
    trains again at F).  Needs ``"trace": true``."""
    ranks = sorted(r for (a, r) in res.results if a == attempt)
    faults: dict[int, int] = {}
    resumes: dict[int, int] = {}
    for r in ranks:
        for rec in read_trace(res.out, attempt, r):
            if rec.get("type") != "action":
                continue
            g = int(rec.get("gen", 0))
            if rec["action"].startswith("Fault"):
                faults[g] = min(faults.get(g, rec["t_ns"]), rec["t_ns"])
            elif rec["action"] == "RankResume":
                resumes[g] = max(resumes.get(g, rec["t_ns"]), rec["t_ns"])
    episodes = []
    for g in sorted(resumes):
        reports = [rep for r in ranks for rep in res.results[(attempt, r)].get("reports", [])
                   if int(rep.get("generation", -1)) == g]
        phases = {ph: max((rep.get(f"{ph}_ns", 0) for rep in reports), default=0) / 1e9 for ph in PHASES}
        t_fault = faults.get(g)
        episodes.append({
            "generation": g, "phases_s": phases, "replayed_steps": 0,
            "refs_rebound": max((rep.get("refs_rebound", 0) for rep in reports), default=0),
            "fault_to_frontier_s": None if t_fault is None else (resumes[g] - t_fault) / 1e9,
        })
    return episodes


def _span(t0, t1):
    return (t1 - t0) if t0 and t1 else None


def l2_episodes(res: LaunchResult) -> list[dict]:
    """One entry per torchrun restart (attempt a >= 1): exit codes of attempt a-1, checkpoint C,
    replayed steps F - C, and fault-to-frontier (fault of a-1 until attempt a is back at F)."""
    episodes = []
    for a in res.attempts:
        if a == 0:
            continue
        prev, cur = res.attempt(a - 1), res.attempt(a)
        t_fault = min((r["t_fault"] for r in cur.values() if r.get("t_fault") is not None), default=None)
        t_front = [r.get("t_frontier") for r in cur.values()]
        done = t_fault is not None and all(t is not None for t in t_front)
        episodes.append({
            "attempt": a,
            "exit_codes": sorted({r.get("exit_code") for r in prev.values()}, key=lambda c: (c is None, c)),
            "resumed_from": max((r.get("resumed_from") or 0 for r in cur.values()), default=0),
            "replayed_steps": max((r.get("replayed_steps", 0) for r in cur.values()), default=0),
            # last exit of a-1 until every rank of a is attached again (torchrun respawn + import + reload)
            "exit_to_ready_s": _span(max((r.get("t_exit") or 0 for r in prev.values()), default=None),
                                     max((r.get("t_ready") or 0 for r in cur.values()), default=None)),
            "fault_to_frontier_s": (max(t_front) - t_fault) if done else None,
        })
    return episodes
