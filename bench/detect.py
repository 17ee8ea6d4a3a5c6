"""``accelpact bench detect``: failure detection on real jobs, faults injected from outside.

Each trial launches a real job at 2x2 (4 worker processes, FSDP1 HYBRID_SHARD on gloo, a short
workload with steps of about 0.1 s) with its own small launcher (:func:`launch`: the same
environment as :func:`accelpact.impl.launch.launch.run_local`, the store hosted by this process, every
child in one :class:`~accelpact.impl.launch.launch.ProcessSet`), waits until every rank has committed
``--inject-after`` steps (polling the result files), and then strikes one rank *from this process*
with :mod:`accelpact.testing.inject` on its pid (from its result file):

==========  ==========================================================================================
kind        what strikes the victim
==========  ==========================================================================================
crash       ``inject.crash``: SIGKILL
sigstop     ``inject.stop``: SIGSTOP (never resumed; SIGKILLed once the survivors are done)
gil         ``inject.gil_hang``: its main thread holds the GIL, forever (SIGKILLed at the end)
linkcut     ``inject.cut_links(except_ports=[store port])``: every gloo connection of the rank shut down
partition   ``netns.Fabric.partition``: every rank in its own network namespace, the victim's link
            silently dropped (store and gloo), SIGKILLed at the end
straggler   ``inject.slow(how="sleep")`` for ``--straggler-s`` seconds, ``--straggler-times`` times:
            the job must finish normally and no rank may be suspected (a false positive)
==========  ==========================================================================================

Per trial, from the survivors' traces (every rank but the victim):

* **TTD** = the first survivor's observation of the failure minus the injection time: the earliest
  of a ``RankSuspect`` record's ``detected_at_ns`` (the failure detector) and the ``t_ns`` of a
  ``RankObserve`` / ``RankReject`` / ``RankTimeout`` / ``RankExpire`` / ``RankFail`` / ``RankExit`` /
  ``RankLoseStore`` record (gloo saw it, a wait expired, a peer's abort arrived).  The injection
  time is ``time.monotonic_ns()`` here just before the primitive is called (for ``linkcut``: just
  before ``cut_links``' first ``shutdown``, which follows a scan of ``/proc`` that takes tens to
  hundreds of ms, :func:`_first_shutdown`); on one machine it is the workers' clock.
  ``ttd_detector`` is the same from ``RankSuspect`` records only (None when the survivors had
  already left by another path).  A straggler trial has no TTD: an observation there is a false
  alarm (``false_alarm_ms``).
* **time to outcome** = the last exit of a rank that ends by itself (its ``end`` record; every
  rank but a crashed, stopped, GIL-hung or partitioned victim) minus the injection time.
* **false positives**: ``RankSuspect`` records naming a rank that was not struck (every one of a
  straggler trial).

``--failbench`` adds the FailBench fault traces as scenario sets, each under
:func:`accelpact.impl.launch.launch.run_restarting` (or torchrun, ``--failbench-launcher``) with
``max_restarts`` 3 and a checkpoint every 2 steps: F1 one crash; F2 two concurrent crashes (ranks
r and r+2, the same point of the same step); F3 three cascading crashes, one per attempt, spaced
apart.  Each crash is the job's own ``crash`` fault at ``forward`` of a step (a SIGKILL of the
rank by itself; its ``FaultCrash`` record is the fault time).  Each must end as the contract says
(L2): every rank of the struck attempt exits, the next attempt resumes from the last checkpoint
and the job finishes.  Per fault: TTD (as above, in the struck attempt) and T_recover (fault until
every rank of the next attempt is back at the interrupted frontier,
:func:`accelpact.impl.launch.launch.l2_episodes`).

Nothing here is asserted: speed is measured, never tested.  No torch import at module level.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from . import common
from accelpact.impl.launch.job import Job, Topology, Workload
from accelpact.impl.launch.launch import ProcessSet, WORKER_MODULE, l2_episodes, run_restarting, run_torchrun, worker_env
from accelpact.impl.rundir import RunDir
from accelpact.testing import inject, netns

__all__ = ["FAILBENCH", "DETECT_KINDS", "add_arguments", "analyze_trial", "launch", "run", "run_failbench", "run_trial"]

DETECT_KINDS = ("crash", "sigstop", "gil", "linkcut", "partition", "straggler")
#: kinds whose victim never exits by itself: SIGKILLed once the survivors are done
_LEFT_BEHIND = ("sigstop", "gil", "partition")
#: records that are a survivor's observation of a failure (besides RankSuspect's detected_at_ns)
OBSERVE_ACTIONS = ("RankObserve", "RankReject", "RankTimeout", "RankExpire", "RankFail", "RankExit", "RankLoseStore")

NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE

#: FailBench scenario sets: name -> (what, faults, expected restarts).  Crash at ``forward`` of a
#: step; checkpoint every 2 steps (so each restart replays one step).
FAILBENCH: dict[str, tuple[str, list[dict[str, Any]], int]] = {
    "F1": ("one crash", [{"step": 7, "at": "forward", "kind": "crash", "ranks": [1], "attempt": 0}], 1),
    "F2": ("two concurrent crashes, ranks r and r+2", [{"step": 7, "at": "forward", "kind": "crash", "ranks": [1, 3],
                                                      "attempt": 0}], 1),
    "F3": ("three cascading crashes, one per attempt", [
        {"step": 5, "at": "forward", "kind": "crash", "ranks": [1], "attempt": 0},
        {"step": 9, "at": "forward", "kind": "crash", "ranks": [2], "attempt": 1},
        {"step": 13, "at": "forward", "kind": "crash", "ranks": [3], "attempt": 2}], 3),
}
FAILBENCH_STEPS = 16
FAILBENCH_CKPT_EVERY = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "detect", plot=False)
    p.add_argument("--trials", type=int, default=10, help="trials per kind (default %(default)s; quick 1)")
    p.add_argument("--kinds", default=",".join(DETECT_KINDS),
                   help="comma list of fault kinds, or 'none' (default: all: %(default)s; quick: crash,straggler)")
    p.add_argument("--steps", type=int, default=None, help="training steps of each job (default 60; quick 16)")
    p.add_argument("--inject-after", type=int, default=None,
                   help="strike once every rank committed this many steps (default 5; quick 3)")
    p.add_argument("--layers", type=int, default=2, help="wrapped layers of the workload (default %(default)s)")
    p.add_argument("--straggler-s", type=float, default=2.0, help="each straggler sleep, seconds (default %(default)s)")
    p.add_argument("--straggler-times", type=int, default=2, help="straggler sleeps per trial (default %(default)s)")
    p.add_argument("--failbench", action="store_true", help="also run the FailBench scenario sets F1-F3")
    p.add_argument("--failbench-trials", type=int, default=1, help="runs of each FailBench set (default %(default)s)")
    p.add_argument("--failbench-launcher", choices=("restarting", "torchrun"), default="restarting",
                   help="FailBench supervisor: launch.run_restarting (default) or launch.run_torchrun")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="bound on each phase of a trial (start to the injection, injection to the outcome), seconds")


# ----------------------------------------------------------------------------------------- config

def _config(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(args.quick)
    kinds_arg = args.kinds if not (quick and args.kinds == ",".join(DETECT_KINDS)) else "crash,straggler"
    kinds = [] if kinds_arg.strip() == "none" else [k.strip() for k in kinds_arg.split(",") if k.strip()]
    return {
        "quick": quick, "kinds": kinds, "trials": 1 if quick and args.trials == 10 else args.trials,
        "steps": args.steps if args.steps is not None else (16 if quick else 60),
        "inject_after": args.inject_after if args.inject_after is not None else (3 if quick else 5),
        "layers": args.layers, "straggler_s": args.straggler_s, "straggler_times": args.straggler_times,
        "nodes": NODES, "ranks_per_node": RANKS_PER_NODE, "wrapper": "fsdp1-hybrid", "backend": "gloo",
        "timeout_s": args.timeout, "failbench": bool(args.failbench),
        "failbench_trials": args.failbench_trials, "failbench_launcher": args.failbench_launcher,
    }


def check_config(cfg: dict[str, Any]) -> str | None:
    """The first problem with the flags, or None."""
    bad = [k for k in cfg["kinds"] if k not in DETECT_KINDS]
    if bad:
        return f"--kinds: unknown kind(s) {bad}; allowed: {', '.join(DETECT_KINDS)} (or 'none')"
    if cfg["trials"] < 1:
        return f"--trials must be >= 1, got {cfg['trials']}"
    if cfg["inject_after"] < 1 or cfg["steps"] < cfg["inject_after"] + 3:
        return f"need --inject-after >= 1 and --steps >= inject-after + 3, got {cfg['inject_after']} and {cfg['steps']}"
    if not cfg["straggler_s"] > 0 or cfg["straggler_times"] < 1:
        return "--straggler-s must be > 0 and --straggler-times >= 1"
    if cfg["failbench_trials"] < 1:
        return "--failbench-trials must be >= 1"
    if not cfg["kinds"] and not cfg["failbench"]:
        return "nothing to run: --kinds none without --failbench"
    return None


def _job(cfg: dict[str, Any], out: Path, scenario: str, *, steps: int | None = None, ckpt_every: int = 0,
         faults: list[dict[str, Any]] | None = None):
    return Job(topology=Topology(cfg["nodes"], cfg["ranks_per_node"]),
               workload=Workload(cfg["wrapper"], cfg["layers"], steps or cfg["steps"], 0, ckpt_every), out=str(out),
               scenario=scenario, backend=cfg["backend"], trace=True).replace(faults=faults or [])


# ---------------------------------------------------------------------------------------- launcher

@contextlib.contextmanager
def launch(job: Any, *, fabric: Any = None, store_timeout_s: float = 600.0) -> Iterator[tuple[Any, int]]:
    """Start every rank of ``job`` (attempt 0) like :func:`accelpact.impl.launch.launch.run_local`, the
    store hosted here; on a ``netns.Fabric`` (``host=True``) each rank runs in its own namespace
    (gloo on its ``eth0``) and the store listens on the fabric's host address.  Yields
    ``(ProcessSet, store port)``; leaving the block SIGKILLs and reaps every rank, then drops the
    store."""
    from datetime import timedelta

    import torch.distributed as dist

    n = job.world
    run = RunDir(job.out)
    run.clear()
    path = job.write()
    host = fabric.host_addr if fabric is not None else "127.0.0.1"
    store = dist.TCPStore(host, 0, world_size=n + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=store_timeout_s))
    try:
        with open(run.local_log(0), "ab") as logf, ProcessSet() as ps:
            for rank in range(n):
                env = worker_env({
                    "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": n, "LOCAL_WORLD_SIZE": n, "GROUP_RANK": 0,
                    "MASTER_ADDR": host, "MASTER_PORT": store.port, "TORCHELASTIC_RESTART_COUNT": 0,
                    "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_CPP_LOG_LEVEL": "ERROR",
                    **({"GLOO_SOCKET_IFNAME": "eth0"} if fabric is not None else {}),
                })
                prefix = fabric.cmd_prefix(rank) if fabric is not None else []
                ps.start(prefix + [sys.executable, "-m", WORKER_MODULE, "--job", str(path)], env=env, stdout=logf)
            yield ps, store.port
    finally:
        del store


def _wait(pred: Callable[[], bool], timeout_s: float, every_s: float = 0.01) -> bool:
    """Poll ``pred`` until true (True) or ``timeout_s`` passed (False)."""
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() >= end:
            return False
        time.sleep(every_s)
    return True


def _gone(path: Path, timeout_s: float) -> bool:
    return _wait(lambda: not path.exists(), timeout_s, 0.002)


# ------------------------------------------------------------------------------------------ a trial

def _inject(kind: str, pid: int, victim: int, port: int, cfg: dict[str, Any], fabric: Any,
            alive: Callable[[], bool]) -> tuple[int, dict[str, Any]]:
    """Strike ``pid`` with ``kind``; (injection time ns, what happened)."""
    info: dict[str, Any] = {}
    t_cut: int | None = None
    t0 = time.monotonic_ns()
    if kind == "crash":
        inject.crash(pid)
    elif kind == "sigstop":
        inject.stop(pid)
    elif kind == "gil":
        inject.gil_hang(pid, None)
        # the mailbox disappears when the handler runs: the hang has started
        info["hang_started"] = _gone(inject.mailbox(pid, inject.GIL_HANG_SIGNAL), 5.0)
    elif kind == "linkcut":
        with _first_shutdown(inject) as first:
            cut = inject.cut_links(pid, except_ports=[port])
        info["connections_cut"] = len(cut)
        t_cut = first[0] if first else None
    elif kind == "partition":
        fabric.partition(victim)
    elif kind == "straggler":
        slept = 0
        for i in range(cfg["straggler_times"]):
            if i:
                # the next sleep once this one is over and the rank trained a little
                _wait(lambda: not alive(), cfg["straggler_s"] + 1.0, 0.05)
            if not alive():
                break
            try:
                inject.slow(pid, cfg["straggler_s"], how="sleep")
            except inject.InjectError:
                break  # it finished meanwhile
            slept += _gone(inject.mailbox(pid, inject.SLEEP_SIGNAL), 5.0)
        info["sleeps"] = slept
    else:  # pragma: no cover - checked by check_config
        raise ValueError(kind)
    info["inject_ms"] = (time.monotonic_ns() - t0) / 1e6
    # the fault's time: when the primitive was called (a signal is sent at once, the link goes down
    # at once), except for a link cut: its first shutdown comes at the end of cut_links, after a scan
    # of /proc/<pid>/net/tcp{,6} (25-65 ms idle, hundreds under load)
    if kind == "linkcut":
        info["cut_after_ms"] = None if t_cut is None else (t_cut - t0) / 1e6
        return (t_cut if t_cut is not None else t0), info
    return t0, info


@contextlib.contextmanager
def _first_shutdown(inject_mod: Any) -> Iterator[list[int]]:
    """The time of ``cut_links``' first ``shutdown`` (the moment the link fails), taken in this
    process only and only for the ``with`` block: the ``socket`` module ``inject`` uses is replaced
    by a view of it whose socket class notes ``time.monotonic_ns()`` before its first shutdown."""
    import socket
    import types

    first: list[int] = []

    class _Timed(socket.socket):
        def shutdown(self, how: int) -> None:
            if not first:
                first.append(time.monotonic_ns())
            super().shutdown(how)

    view = types.SimpleNamespace(**{k: getattr(socket, k) for k in dir(socket) if not k.startswith("__")})
    view.socket = _Timed
    saved = inject_mod.socket
    inject_mod.socket = view
    try:
        yield first
    finally:
        inject_mod.socket = saved


def run_trial(kind: str, index: int, cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """One trial of ``kind``: launch, strike after ``inject_after`` committed steps, wait (bounded)
    for the outcome, kill what is left, read the traces (:func:`analyze_trial`)."""
    victim = (index + 1) % WORLD  # rotates over the ranks, rank 1 first
    job = _job(cfg, out / f"{kind}-{index}", f"detect-{kind}")
    run = RunDir(job.out)
    trial: dict[str, Any] = {"kind": kind, "trial": index, "victim": victim, "out": str(run.path), "error": None}
    bound = cfg["timeout_s"]
    t_start = time.monotonic()
    fab_cm = netns.Fabric(WORLD, host=True) if kind == "partition" else contextlib.nullcontext(None)
    with fab_cm as fab, launch(job, fabric=fab) as (ps, port):
        procs = ps.procs

        def frontiers() -> dict[int, int]:
            return {r: int(res.get("frontier") or 0) for (a, r), res in run.results().items() if a == 0}

        def ready() -> bool:
            f = frontiers()
            return (len(f) == WORLD and min(f.values()) >= cfg["inject_after"]) or bool(ps.running() != list(range(WORLD)))

        if not _wait(ready, bound, 0.01) or ps.running() != list(range(WORLD)):
            trial["error"] = (f"no injection: the ranks did not all reach step {cfg['inject_after']} within {bound:.0f} s "
                              f"(exit codes {ps.codes}; frontiers {frontiers()})")
        else:
            pid = int(run.results()[(0, victim)]["pid"])
            trial["frontier_at_injection"] = frontiers()
            trial["ready_s"] = time.monotonic() - t_start

            def victim_alive() -> bool:
                return procs[victim].poll() is None

            try:
                t_inj, info = _inject(kind, pid, victim, port, cfg, fab, victim_alive)
            except (inject.InjectError, netns.FabricError) as exc:
                trial["error"] = f"injection failed: {exc}"
            else:
                trial.update(t_inject_ns=t_inj, **info)
                if kind == "crash":
                    # SIGKILL to the process gone (a zombie, its sockets closed by the kernel: what
                    # its peers can see), as this parent sees it
                    gone = _wait(lambda: not victim_alive(), 10.0, 0.001)
                    trial["victim_gone_ms"] = (time.monotonic_ns() - t_inj) / 1e6 if gone else None
                waited = [r for r in range(WORLD) if not (kind in _LEFT_BEHIND and r == victim)]
                done = _wait(lambda: all(procs[r].poll() is not None for r in waited), bound, 0.02)
                trial["survivors_exited"] = done
                if not done:
                    trial["error"] = (f"ranks {[r for r in waited if procs[r].poll() is None]} still running "
                                      f"{bound:.0f} s after the injection")
        trial["codes_before_kill"] = ps.codes
        ps.kill()
    trial["codes"] = [p.returncode for p in procs]
    trial["wall_s"] = time.monotonic() - t_start
    return analyze_trial(trial, run)


def _observations(run: Any, attempt: int, ranks: list[int]) -> tuple[list[tuple[int, str, int]], list[dict[str, Any]],
                                                                     dict[int, int]]:
    """(observations (t_ns, action, rank), RankSuspect records, end t_ns per rank) of ``ranks``."""
    obs: list[tuple[int, str, int]] = []
    suspects: list[dict[str, Any]] = []
    ends: dict[int, int] = {}
    for r in ranks:
        for rec in run.records(attempt, r):
            if rec.get("type") == "end":
                ends[r] = int(rec["t_ns"])
            if rec.get("type") != "action":
                continue
            act = rec.get("action")
            if act == "RankSuspect":
                det = rec.get("detail", {})
                t = int(det.get("detected_at_ns", rec["t_ns"]))
                obs.append((t, act, r))
                suspects.append({"by": r, "suspect": det.get("suspect"), "kind": det.get("kind"), "detected_at_ns": t})
            elif act in OBSERVE_ACTIONS:
                obs.append((int(rec["t_ns"]), act, r))
    return sorted(obs), suspects, ends


def analyze_trial(trial: dict[str, Any], run: Any) -> dict[str, Any]:
    """TTD, detector TTD, time to outcome and false positives of one trial from its traces."""
    kind, victim = trial["kind"], trial["victim"]
    t_inj = trial.get("t_inject_ns")
    survivors = [r for r in range(WORLD) if r != victim]
    obs, suspects, _ = _observations(run, 0, survivors)
    _, own_suspects, ends = _observations(run, 0, list(range(WORLD)))
    struck = kind != "straggler"
    wrong = [s for s in own_suspects if not struck or s["suspect"] != victim]
    trial["suspects"] = own_suspects
    trial["false_positives"] = len(wrong)
    trial["ttd_ms"] = trial["ttd_detector_ms"] = trial["outcome_ms"] = None
    trial["first_observation"] = None
    if t_inj is not None:
        if obs:
            t, act, r = obs[0]
            trial["ttd_ms"] = (t - t_inj) / 1e6
            trial["first_observation"] = {"action": act, "rank": r}
        det = [s["detected_at_ns"] for s in suspects]
        if det:
            trial["ttd_detector_ms"] = (min(det) - t_inj) / 1e6
        ending = [r for r in range(WORLD) if not (r == victim and kind in _LEFT_BEHIND + ("crash",))]
        if ending and all(r in ends for r in ending):
            trial["outcome_ms"] = (max(ends[r] for r in ending) - t_inj) / 1e6
    codes = trial.get("codes") or []
    if kind == "straggler":
        # nothing to detect: an observation is a false alarm (its time kept), not a TTD
        trial["false_alarm_ms"], trial["ttd_ms"] = trial["ttd_ms"], None
        trial["finished"] = bool(codes) and all(c == 0 for c in codes)
        trial["ok"] = trial["error"] is None and trial["finished"] and not own_suspects
    else:
        trial["ok"] = trial["error"] is None and trial["ttd_ms"] is not None and bool(trial.get("survivors_exited"))
    return trial


# ----------------------------------------------------------------------------------------- FailBench

def run_failbench(cfg: dict[str, Any], out: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every FailBench set ``failbench_trials`` times; per set its runs, per run its faults (TTD,
    T_recover) and whether the outcome is the contract's (L2)."""
    sets: dict[str, Any] = {}
    for name, (what, faults, restarts) in FAILBENCH.items():
        runs: list[dict[str, Any]] = []
        for i in range(cfg["failbench_trials"]):
            say(f"detect: FailBench {name} ({what}), run {i + 1}/{cfg['failbench_trials']}")
            job = _job(cfg, out / f"failbench-{name}-{i}", f"failbench-{name}", steps=FAILBENCH_STEPS,
                       ckpt_every=FAILBENCH_CKPT_EVERY, faults=faults)
            t0 = time.monotonic()
            if cfg["failbench_launcher"] == "torchrun":
                res = run_torchrun(job, max_restarts=3, timeout_s=cfg["timeout_s"] * 3)
            else:
                res = run_restarting(job, max_restarts=3, timeout_s=cfg["timeout_s"] * 3)
            run = RunDir(res.out)
            episodes = {e["attempt"]: e for e in l2_episodes(res)}
            per_fault: list[dict[str, Any]] = []
            problems: list[str] = []
            for f in faults:
                a = f["attempt"]
                struck = sorted({r for g in faults if g["attempt"] == a for r in g["ranks"]})
                survivors = [r for r in range(WORLD) if r not in struck]
                obs, _, ends = _observations(run, a, survivors)
                ep = episodes.get(a + 1, {})
                fronts = [x.get("t_frontier") for x in res.attempt(a + 1).values()]
                t_front = [float(t) for t in fronts if t is not None] if fronts and None not in fronts else []
                expect_c = (f["step"] // FAILBENCH_CKPT_EVERY) * FAILBENCH_CKPT_EVERY
                prev = res.attempt(a)
                all_exited = len(prev) == WORLD and all(x.get("outcome") != "finished" for x in prev.values())
                resumed = ep.get("resumed_from")
                if not all_exited:
                    problems.append(f"attempt {a}: not every rank exited ({ {r: x.get('outcome') for r, x in prev.items()} })")
                if resumed != expect_c:
                    problems.append(f"attempt {a + 1}: resumed from {resumed}, expected the last checkpoint {expect_c}")
                for rank in f["ranks"]:  # one entry per crash (F2: two at once)
                    t_f = min((rec["t_ns"] for rec in run.records(a, rank)
                               if rec.get("type") == "action" and rec.get("action") == "FaultCrash"), default=None)
                    if t_f is None:
                        problems.append(f"attempt {a}: rank {rank} has no FaultCrash record (it did not crash)")
                    per_fault.append({
                        "attempt": a, "step": f["step"], "rank": rank, "t_fault_ns": t_f,
                        "ttd_ms": None if t_f is None or not obs else (obs[0][0] - t_f) / 1e6,
                        "first_observation": None if not obs else {"action": obs[0][1], "rank": obs[0][2]},
                        "survivors_exit_ms": (max(ends.values()) - t_f) / 1e6
                        if t_f is not None and len(ends) == len(survivors) else None,
                        "t_recover_s": (max(t_front) - t_f / 1e9) if t_f is not None and t_front else None,
                        "l2_fault_to_frontier_s": ep.get("fault_to_frontier_s"), "exit_codes": ep.get("exit_codes"),
                        "resumed_from": resumed, "expected_checkpoint": expect_c,
                        "replayed_steps": ep.get("replayed_steps"), "exit_to_ready_s": ep.get("exit_to_ready_s"),
                        "all_exited": all_exited,
                    })
            if len(res.attempts) - 1 != restarts:
                problems.append(f"{len(res.attempts) - 1} restart(s), expected {restarts}")
            if not res.ok():
                problems.append(f"the job did not finish (rc={res.returncode}, timed_out={res.timed_out}); see {res.log}")
            runs.append({"out": str(res.out), "wall_s": time.monotonic() - t0, "restarts": len(res.attempts) - 1,
                         "finished": res.ok(), "outcome": "L2" if not problems else "unexpected",
                         "problems": problems, "faults": per_fault})
        ttds = [f["ttd_ms"] for r in runs for f in r["faults"]]
        recs = [f["t_recover_s"] for r in runs for f in r["faults"]]
        sets[name] = {"what": what, "faults": faults, "expected_restarts": restarts, "runs": runs,
                      "ttd_ms": common.stats(ttds), "t_recover_ms": common.stats(recs, 1e3),
                      "as_contract": all(r["outcome"] == "L2" for r in runs)}
    return sets


# ---------------------------------------------------------------------------------------------- run

def _summarize(kinds: list[str], trials: list[dict[str, Any]], skipped: dict[str, str]) -> dict[str, Any]:
    per: dict[str, Any] = {}
    for k in kinds:
        ts = [t for t in trials if t["kind"] == k]
        if not ts:
            per[k] = {"n": 0, "skipped": skipped.get(k)}
            continue
        by = collections.Counter(t["first_observation"]["action"] for t in ts if t.get("first_observation"))
        per[k] = {"n": len(ts), "ok": sum(bool(t["ok"]) for t in ts), "detected": sum(t["ttd_ms"] is not None for t in ts),
                  "ttd_ms": common.stats(t["ttd_ms"] for t in ts),
                  "ttd_detector_ms": common.stats(t["ttd_detector_ms"] for t in ts),
                  "outcome_ms": common.stats(t["outcome_ms"] for t in ts),
                  "false_positives": sum(t["false_positives"] for t in ts), "first_observation": dict(by),
                  "errors": [t["error"] for t in ts if t["error"]]}
        if k == "straggler":
            per[k]["finished"] = sum(bool(t.get("finished")) for t in ts)
    return per


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    cfg = _config(args)
    problem = check_config(cfg)
    if problem:
        print(f"accelpact bench detect: error: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    skipped: dict[str, str] = {}
    if "partition" in cfg["kinds"]:
        why = netns.available()
        if why:
            skipped["partition"] = f"network namespaces unavailable: {why}"
    trials: list[dict[str, Any]] = []
    for kind in cfg["kinds"]:
        if kind in skipped:
            print(f"detect: {kind} skipped: {skipped[kind]}", flush=True)
            continue
        for i in range(cfg["trials"]):
            t = run_trial(kind, i, cfg, out)
            trials.append(t)
            print(f"detect: {kind} {i + 1}/{cfg['trials']} victim r{t['victim']}: TTD {common.fmt(t['ttd_ms'])} ms "
                  f"(by {(t['first_observation'] or {}).get('action', '-')}), detector {common.fmt(t['ttd_detector_ms'])} ms, "
                  f"outcome {common.fmt(t['outcome_ms'])} ms, codes {t['codes']}, false positives {t['false_positives']}"
                  f"{'' if t['ok'] else ' NOT OK: ' + str(t['error'] or 'see the trial')}", flush=True)
    per = _summarize(cfg["kinds"], trials, skipped)
    fb = run_failbench(cfg, out, say=lambda m: print(m, flush=True)) if cfg["failbench"] else None

    rows = []
    for k in cfg["kinds"]:
        s = per[k]
        if not s["n"]:
            rows.append([k, 0, "-", "-", "-", "-", "-", "-", "-", "-", f"skipped: {s['skipped']}"])
            continue
        a, d, o = s["ttd_ms"], s["ttd_detector_ms"], s["outcome_ms"]
        rows.append([k, f"{s['ok']}/{s['n']}", common.fmt(a["median"]), common.fmt(a["p90"]), common.fmt(a["max"]),
                     common.fmt(d["median"]), common.fmt(o["median"]), common.fmt(o["p90"]), common.fmt(o["max"]),
                     s["false_positives"], ", ".join(f"{act} {c}" for act, c in s["first_observation"].items()) or "-"])
    if rows:
        common.print_table(f"failure detection, {WORLD} ranks ({cfg['wrapper']} 2x2, gloo CPU), faults injected from outside: ms",
                           ("kind", "ok/n", "TTD med", "TTD p90", "TTD max", "detector med", "outcome med", "outcome p90",
                            "outcome max", "false pos", "first observed by"), rows)
    if fb:
        fb_rows = []
        for name, s in fb.items():
            for j, r in enumerate(s["runs"]):
                for f in r["faults"]:
                    fb_rows.append([f"{name}#{j}", f"attempt {f['attempt']} step {f['step']} r{f['rank']}",
                                    common.fmt(f["ttd_ms"]), common.fmt(f["survivors_exit_ms"]),
                                    common.fmt(f["t_recover_s"], 1e3), f["resumed_from"],
                                    r["outcome"] if not r["problems"] else "; ".join(r["problems"])[:80]])
        for name, s in fb.items():
            print(f"  {name}: {s['what']}", flush=True)
        common.print_table("FailBench (L2: every rank exits, restart from the last checkpoint): ms",
                           ("set", "crash", "TTD", "survivors out", "T_recover", "resumed from", "outcome"), fb_rows)

    fps = sum(s.get("false_positives", 0) for s in per.values())
    summary: dict[str, Any] = {
        "ttd_ms_median": {k: per[k]["ttd_ms"]["median"] for k in cfg["kinds"] if per[k]["n"]},
        "ttd_detector_ms_median": {k: per[k]["ttd_detector_ms"]["median"] for k in cfg["kinds"] if per[k]["n"]},
        "outcome_ms_median": {k: per[k]["outcome_ms"]["median"] for k in cfg["kinds"] if per[k]["n"]},
        "false_positives": fps, "trials": len(trials), "ok": sum(bool(t["ok"]) for t in trials), "skipped": skipped,
    }
    if fb is not None:
        summary["failbench"] = {n: {"as_contract": s["as_contract"], "ttd_ms_median": s["ttd_ms"]["median"],
                                    "t_recover_ms_median": s["t_recover_ms"]["median"]} for n, s in fb.items()}
    headline = {"detect_ttd_ms_median_crash": summary["ttd_ms_median"].get("crash"), "detect_false_positives": fps}
    reasons = {} if headline["detect_ttd_ms_median_crash"] is not None else {
        "detect_ttd_ms_median_crash": "no crash trial detected in this run (--kinds without crash, or it failed)"}
    config = {k: v for k, v in cfg.items() if k != "quick"}
    config["world"] = WORLD
    results = {"kinds": per, "trials": trials, "failbench": fb, "skipped": skipped}
    doc = common.write_result(argparse.Namespace(quick=cfg["quick"], json=None), "detect", config, results, headline,
                              reasons, t0)
    doc["summary"] = summary
    if args.json:
        p = Path(args.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, p)
        print(f"json: {p}", flush=True)
    complete = all(t["ok"] for t in trials) and (fb is None or all(s["as_contract"] for s in fb.values()))
    return 0 if complete else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m accelpact.bench.detect ...`` (the same flags as ``accelpact bench detect``)."""
    p = argparse.ArgumentParser(prog="accelpact bench detect", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
