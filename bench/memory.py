"""``accelpact bench memory``: an episode's peak resident memory against the steady state (issue 43).

For each wrapper (``ddp`` 1x2, ``fsdp1-hybrid`` and ``fsdp2-hybrid`` 2x2: :data:`common.LAYOUT`) and each
episode kind, one torchrun launch of the worker (:func:`accelpact.impl.launch.launch.run_torchrun`) with
``Workload.memory`` on, so that every rank records the peak resident size (``VmHWM``, reset as each step
opens) of every step's window (:mod:`accelpact.testing.memory`), and a model wide enough (``--dim``) that
its parameters and AdamW state dominate a rank's memory:

* ``discard``: a communicator failure in backward (``collective_timeout`` of R's sockets, every member of
  one R group): the worker passes ``rebuild=``, so the step is discarded in place and the model rebuilt;
* ``swap``: a rank SIGKILLed in backward (``crash``), one spare per episode: the spare takes its identity,
  a live replica sends it the state, every rank rebuilds, the step is discarded and rerun;
* ``repair``: R's sockets cut at the boundary (``collective_timeout``): the L1 repair, as a control
  (no model rebuilt).

``--episodes`` episodes per launch (the first after ``--warmup`` fault-free steps, the next every
``--gap`` steps, ``--gap`` steps after the last).  :func:`summarize` reads the windows per process
(each rank's file holds every process that held the identity: a dead rank's, then its spare's) and
gives, per process:

* ``base``: the resident size before the model was built (torch, gloo, the interpreter);
* ``steady``: the median peak of its fault-free windows before its first episode, leaving out its
  first window (step 0; a spare's first step after its join) and the window right after an episode;
  ``steady_all`` the same over every fault-free window (after the episodes too), ``drift`` the median
  fault-free peak after the last episode over ``steady`` (memory an episode left behind), and
  ``tensor_growth_mb`` the same difference of the CPU tensors alive as those windows close (what the
  episodes left alive, as opposed to memory the allocator keeps: the record's ``tensor_mb``);
* per episode: the peak of the window that holds it (a survivor's discarded or repaired step, a spare's
  window from its start through its join), ``ratio`` = peak / steady, ``state_ratio`` = (peak - base) /
  (steady - base) (what the state costs, the interpreter left out), ``local_ratio`` against the steady
  state just before it (the fault-free windows since the process's previous episode: what this episode
  adds, without what the ones before it left behind), and the same of the window right after it
  (``after_ratio``: the rerun of a discarded step, where the old generation may still live);
* a role per episode: ``survivor`` (discard, repair: every rank), and in a swap ``spare`` (the
  receiver, its join window against its own later steady steps), ``source`` (the live replica that
  sent the state) or ``bystander`` (neither).

Headline: per wrapper and kind, the largest ratio over ranks (each rank's median over its episodes),
beside the goal of issue 43 (1.2).  A launch that does not finish (an episode that failed) is launched
again up to ``--retries`` times, its folder kept (``<kind>-failed<i>``) and its error in the results
(``failed_launches``).  Nothing is asserted: memory is measured, not tested.
No torch import at module level.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from accelpact.impl.launch.job import Job, Topology, Workload
from accelpact.impl.rundir import RunDir
from accelpact.impl.runtime.wrappers import wrapper as wrapper_of

from . import common

__all__ = ["GOAL", "DEFAULT_WRAPPERS", "EPISODE_KINDS", "MemoryBenchError", "add_arguments", "episode_plan", "read_windows", "run", "summarize"]

#: issue 43's goal: an episode's peak at most this times the steady state
GOAL = 1.2
EPISODE_KINDS = ("discard", "swap", "repair")
#: the wrappers measured by default: issue 43's FSDP1, FSDP2 and DDP (``fsdp1-zero2`` on request)
DEFAULT_WRAPPERS = ("ddp", "fsdp1-hybrid", "fsdp2-hybrid")
ROLES = ("survivor", "spare", "source", "bystander")


class MemoryBenchError(ValueError):
    """The windows do not hold what the launch's faults promise (an episode window missing, of another
    kind, a process that stopped recording): the message names the rank, the process and the step."""


# ------------------------------------------------------------------------------------------ the plan

def episode_plan(kind: str, wrapper: str, episodes: int, warmup: int, gap: int) -> tuple[list[dict], list[dict], int, int]:
    """(faults, expected episodes, steps, spares) of one launch: ``episodes`` episodes of ``kind``,
    at steps ``warmup``, ``warmup + gap``, ...; ``gap`` fault-free steps after the last."""
    if kind not in EPISODE_KINDS:
        raise ValueError(f"unknown episode kind {kind!r}; one of {', '.join(EPISODE_KINDS)}")
    n, m = common.LAYOUT[wrapper]
    world = n * m
    group = wrapper_of(wrapper).recovers
    steps = [warmup + i * gap for i in range(episodes)]
    total = steps[-1] + gap
    # R: one replicate group (HSDP: the ranks of the last local index) or the world (DDP)
    victim = m - 1 if group == "replicate" else world - 1
    r_members = [r for r in range(world) if group == "world" or r % m == victim % m]
    faults: list[dict] = []
    expected: list[dict] = []
    for i, s in enumerate(steps):
        if kind == "discard":
            faults.append({"step": s, "at": "backward", "kind": "collective_timeout", "ranks": r_members, "group": group})
            expected.append({"step": s, "kind": "discard", "victims": []})
        elif kind == "repair":
            faults.append({"step": s, "at": "boundary", "kind": "collective_timeout", "ranks": [victim], "group": group})
            expected.append({"step": s, "kind": "repair", "victims": []})
        else:  # each swap kills another rank, each with a spare of its own
            v = (victim + i) % world
            faults.append({"step": s, "at": "backward", "kind": "crash", "ranks": [v]})
            expected.append({"step": s, "kind": "swap", "victims": [v]})
    return faults, expected, total, episodes if kind == "swap" else 0


# ------------------------------------------------------------------------------------------ reading

def read_windows(out: str | Path, attempt: int = 0) -> dict[int, list[dict]]:
    """rank -> the lines of its memory file in ``attempt`` (a line torn by a kill is left out)."""
    rows: dict[int, list[dict]] = {}
    for (a, r), path in RunDir(out).memory_files().items():
        if a != attempt:
            continue
        rows[r] = []
        for line in path.read_text().splitlines():
            try:
                rows[r].append(json.loads(line))
            except ValueError:
                continue
    return rows


def _processes(rank: int, rows: list[dict]) -> list[dict]:
    """The processes of one rank's file, in order: pid, spare index, base, its first window, steps."""
    procs: dict[int, dict] = {}
    for row in rows:
        pid = row.get("pid")
        if pid is None or "window" not in row:
            raise MemoryBenchError(f"rank {rank}: a memory line without pid or window: {row}")
        p = procs.setdefault(pid, {"rank": rank, "pid": pid, "spare": None, "base": None, "first": None, "steps": []})
        if row["window"] == "base":
            p["base"], p["spare"] = float(row["rss_mb"]), row.get("spare")
        elif row["window"] in ("attach", "join"):
            p["first"] = row
        elif row["window"] == "step":
            p["steps"].append(row)
        else:
            raise MemoryBenchError(f"rank {rank} (pid {pid}): unknown window {row['window']!r}")
    for p in procs.values():
        if p["base"] is None or p["first"] is None:
            raise MemoryBenchError(f"rank {rank} (pid {p['pid']}): no base or attach/join line: the worker's "
                                   "record did not start (was workload.memory on?)")
    return list(procs.values())


def _median(xs: Iterable[float]) -> float | None:
    v = list(xs)
    return statistics.median(v) if v else None


def _ratio(peak: float | None, steady: float | None, base: float | None = None) -> float | None:
    if peak is None or steady is None:
        return None
    if base is None:
        return peak / steady if steady > 0 else None
    return (peak - base) / (steady - base) if steady > base else None


def _steady(steps: list[dict]) -> dict[str, Any]:
    """The fault-free windows of one process: its first window left out and each right after an episode."""
    eligible, after_episode = [], True  # the first window is the one after attach or the join
    tensors: list[tuple[int, float]] = []
    first_episode = next((i for i, r in enumerate(steps) if r.get("episode")), len(steps))
    last_episode = max((i for i, r in enumerate(steps) if r.get("episode")), default=-1)
    for i, r in enumerate(steps):
        if r.get("episode"):
            after_episode = True
            continue
        if not after_episode:
            eligible.append((i, float(r["peak_rss_mb"])))
            if r.get("tensor_mb") is not None:
                tensors.append((i, float(r["tensor_mb"])))
        after_episode = False
    pre = [v for i, v in eligible if i < first_episode]
    post = [v for i, v in eligible if i > last_episode] if last_episode >= 0 else []
    steady = _median(pre) if pre else _median(v for _, v in eligible)
    t_pre = _median(v for i, v in tensors if i < first_episode)
    t_post = _median(v for i, v in tensors if i > last_episode) if last_episode >= 0 else None
    return {"tensor_mb": t_pre, "tensor_post_mb": t_post,
            "tensor_growth_mb": t_post - t_pre if t_pre is not None and t_post is not None else None,
            "eligible": eligible, "steady": steady, "steady_n": len(pre) if pre else len(eligible), "steady_from": "before" if pre else "all",
            "steady_all": _median(v for _, v in eligible), "steady_post": _median(post),
            "drift": _ratio(_median(post), steady)}


def summarize(windows: Mapping[int, list[dict]], episodes: list[dict]) -> dict[str, Any]:
    """What a launch's memory files say of its ``episodes`` (``[{"step", "kind", "victims"}]``, what the
    faults promise): per process its steady state and, per episode, the window that holds it and the
    ratios (the module doc); per role the largest over processes of each one's median over its
    episodes.  Pure: ``windows`` is rank -> the lines of its file (:func:`read_windows`).

    :class:`MemoryBenchError` where a live process has no window holding an expected episode, or one
    of another kind, or a swap's spare never joined."""
    if not episodes:
        raise MemoryBenchError("summarize: no episode expected; nothing to compare the steady state with")
    procs = [p for r in sorted(windows) for p in _processes(r, windows[r])]
    out_procs = []
    for p in procs:
        steps, first = p["steps"], p["first"]
        st = _steady(steps)
        eligible = st.pop("eligible")
        joined = first["window"] == "join"
        start = int(first.get("step", 0))
        last = max((int(r["step"]) for r in steps), default=start - 1)
        eps = []
        died = None  # the step of the episode this process died in (a swap's victim)
        for e in episodes:
            s, kind = int(e["step"]), e["kind"]
            if joined and s == start and kind == "swap":
                # the spare's join window: from its start through the state it received; then its first step
                eps.append({"step": s, "kind": kind, "role": "spare", "window": "join",
                            "peak_mb": float(first["peak_rss_mb"]), "after_mb": _peak(steps[:1])})
                continue
            if died is None and s > last and p["rank"] in e.get("victims", []):
                died = s
            if (joined and s < start) or (died is not None and s >= died):
                continue  # before this process held the identity, or after it died
            if s > last:
                raise MemoryBenchError(f"rank {p['rank']} (pid {p['pid']}): its windows end at step {last}, before the "
                                       f"{kind} at step {s}, and it is not that episode's victim")
            held = [i for i, r in enumerate(steps) if int(r["step"]) == s and r.get("episode")]
            if not held:
                seen = [{k: r.get(k) for k in ("step", "episode", "discarded", "report")} for r in steps if int(r["step"]) == s]
                raise MemoryBenchError(f"rank {p['rank']} (pid {p['pid']}): no window holds the {kind} at step {s} "
                                       f"(its windows of step {s}: {seen or 'none'})")
            i = held[0]
            if steps[i]["episode"] != kind:
                raise MemoryBenchError(f"rank {p['rank']} (pid {p['pid']}): the window of step {s} holds a "
                                       f"{steps[i]['episode']}, not the {kind} the faults ask for")
            role = "survivor"
            if kind == "swap":
                sources = {int(v) for v in (steps[i].get("sources") or {}).values()}
                role = "source" if p["rank"] in sources else "bystander"
            # the steady state just before it: the fault-free windows since this process's previous episode
            prev = max((j for j, r in enumerate(steps[:i]) if r.get("episode")), default=-1)
            local = _median(v for j, v in eligible if prev < j < i)
            eps.append({"step": s, "kind": kind, "role": role, "window": "step", "peak_mb": float(steps[i]["peak_rss_mb"]),
                        "after_mb": _peak(steps[i + 1:i + 2]), "local_steady_mb": local})
        for e in eps:
            local = e.get("local_steady_mb") or st["steady"]  # a spare's join: its own later steady state
            e["local_steady_mb"] = local
            e["local_ratio"] = _ratio(e["peak_mb"], local)
            e["local_state_ratio"] = _ratio(e["peak_mb"], local, p["base"])
            e["ratio"] = _ratio(e["peak_mb"], st["steady"])
            e["state_ratio"] = _ratio(e["peak_mb"], st["steady"], p["base"])
            e["after_ratio"] = _ratio(e["after_mb"], st["steady"])
            e["after_state_ratio"] = _ratio(e["after_mb"], st["steady"], p["base"])
        out_procs.append({"rank": p["rank"], "pid": p["pid"], "spare": p["spare"], "base_mb": p["base"], "died_at": died,
                          "first_window": first["window"], "first_peak_mb": float(first["peak_rss_mb"]),
                          "steps": [int(r["step"]) for r in steps], **st, "episodes": eps})
    for e in episodes:
        if e["kind"] == "swap" and not any(x["role"] == "spare" and x["step"] == e["step"]
                                           for p in out_procs for x in p["episodes"]):
            raise MemoryBenchError(f"the swap at step {e['step']}: no process joined as its spare (no join window)")
    roles: dict[str, Any] = {}
    for role in ROLES:
        per = []
        for p in out_procs:
            mine = [x for x in p["episodes"] if x["role"] == role]
            if mine:
                per.append({k: _median(x[k] for x in mine if x[k] is not None)
                            for k in ("ratio", "state_ratio", "local_ratio", "local_state_ratio", "after_ratio",
                                      "after_state_ratio", "peak_mb")}
                           | {"rank": p["rank"], "steady_mb": p["steady"], "base_mb": p["base_mb"], "drift": p["drift"],
                              "tensor_mb": p["tensor_mb"], "tensor_growth_mb": p["tensor_growth_mb"], "episodes": len(mine)})
        if per:
            roles[role] = {"processes": len(per), "per_process": per,
                           **{k: _max(x[k] for x in per) for k in ("ratio", "state_ratio", "local_ratio", "local_state_ratio",
                                                                   "after_ratio", "after_state_ratio", "drift",
                                                                   "tensor_growth_mb")}}
    every = [x for p in out_procs for x in p["episodes"]]
    return {"processes": out_procs, "roles": roles,
            "max_ratio": _max(r["ratio"] for r in roles.values()),
            "max_state_ratio": _max(r["state_ratio"] for r in roles.values()),
            "max_local_ratio": _max(r["local_ratio"] for r in roles.values()),
            "max_after_ratio": _max(r["after_ratio"] for r in roles.values()),
            "max_drift": _max(p["drift"] for p in out_procs),
            "max_tensor_growth_mb": _max(p["tensor_growth_mb"] for p in out_procs), "episode_windows": len(every)}


def _peak(rows: list[dict]) -> float | None:
    return float(rows[0]["peak_rss_mb"]) if rows else None


def _max(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return max(v) if v else None


# ------------------------------------------------------------------------------------------ running

def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "memory", plot=False)
    p.add_argument("--wrappers", default=None,
                   help=f"comma-separated, from {', '.join(common.LAYOUT)} (default ddp,fsdp1-hybrid,fsdp2-hybrid; quick "
                        "ddp); ddp runs 1x2, the hybrid wrappers 2x2")
    p.add_argument("--kinds", default=None, help=f"comma-separated episode kinds, from {', '.join(EPISODE_KINDS)} (default all)")
    p.add_argument("--episodes", type=int, default=None, help="episodes per launch (default 2; quick 1)")
    p.add_argument("--dim", type=int, default=None,
                   help="model width: even, its parameters and AdamW state dominate a rank's memory (default 1024, "
                        "2 layers: 25.3M parameters; quick 256)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--warmup", type=int, default=None,
                   help="fault-free steps before the first episode (default 8: FSDP1's peak still creeps up over its first "
                        "steps; quick 4)")
    p.add_argument("--gap", type=int, default=None, help="steps from one episode to the next, and after the last (default 5; quick 4)")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each launch, seconds (default 300)")
    p.add_argument("--retries", type=int, default=1,
                   help="launches again a launch that did not finish (an episode that failed on the loaded machine), "
                        "this many times; each failure is kept in the results (default 1)")


def _check(args: argparse.Namespace) -> tuple[list[str], list[str]] | str:
    """(wrappers, kinds), or the first problem with the flags."""
    try:
        wrappers = common.parse_list(args.wrappers, str) if args.wrappers else (["ddp"] if args.quick else list(DEFAULT_WRAPPERS))
        kinds = common.parse_list(args.kinds, str) if args.kinds else list(EPISODE_KINDS)
    except ValueError as exc:
        return str(exc)
    bad = [w for w in wrappers if w not in common.LAYOUT]
    if bad or not wrappers:
        return f"--wrappers: {bad or 'none given'}; allowed: {', '.join(common.LAYOUT)}"
    bad = [k for k in kinds if k not in EPISODE_KINDS]
    if bad or not kinds:
        return f"--kinds: {bad or 'none given'}; allowed: {', '.join(EPISODE_KINDS)}"
    if args.episodes < 1:
        return f"--episodes must be >= 1, got {args.episodes}"
    if args.dim < 2 or args.dim % 2:
        return f"--dim must be an even width >= 2 (the workload's 2 attention heads split it), got {args.dim}"
    if not 1 <= args.layers <= 256:
        return f"--layers must be in [1, 256], got {args.layers}"
    if args.warmup < 3:
        return f"--warmup must be >= 3 (step 0 and the step after it are no steady state), got {args.warmup}"
    if args.gap < 3:
        return f"--gap must be >= 3 (the step after an episode is no steady state), got {args.gap}"
    if "swap" in kinds and any(args.episodes > common.LAYOUT[w][0] * common.LAYOUT[w][1] for w in wrappers):
        return f"--episodes {args.episodes}: each swap kills another rank; at most the world of the smallest wrapper"
    if args.timeout <= 0:
        return f"--timeout must be > 0 seconds, got {args.timeout}"
    if args.retries < 0:
        return f"--retries must be >= 0, got {args.retries}"
    return wrappers, kinds


def _job(out: Path, wrapper: str, kind: str, args: argparse.Namespace) -> tuple[Job, list[dict]]:
    faults, expected, steps, spares = episode_plan(kind, wrapper, args.episodes, args.warmup, args.gap)
    n, m = common.LAYOUT[wrapper]
    job = Job(topology=Topology(n, m, spares=spares),
              workload=Workload(wrapper, args.layers, steps, 0, 0, dim=args.dim, memory=True),
              out=str(out), scenario=f"bench-memory-{wrapper}-{kind}", trace=True, deadline_s=30.0,
              collective_timeout_s=60.0).replace(faults=faults)
    return job, expected


def _launch(job: Job, expected: list[dict], timeout_s: float, run_torchrun: Any) -> dict[str, Any]:
    """One launch of ``job`` and what its memory files say (an ``error`` where it did not finish or
    its windows do not hold the episodes)."""
    n, m = job.topology.nodes, job.topology.ranks_per_node
    t = time.monotonic()
    res = run_torchrun(job, n * m, max_restarts=0, timeout_s=timeout_s)
    entry: dict[str, Any] = {"topology": f"{n}x{m}", "steps": job.workload.steps, "episodes": expected,
                             "launch_ok": res.ok(), "returncode": res.returncode, "timed_out": res.timed_out,
                             "wall_s": time.monotonic() - t, "out": str(job.out)}
    try:
        entry["summary"] = summarize(read_windows(job.out), expected)
    except MemoryBenchError as exc:
        entry["error"] = str(exc)
    if not res.ok():
        entry["error"] = (f"the launch did not finish (rc={res.returncode}, timed out: {res.timed_out}); see "
                          f"{res.log}" + (f"; {entry['error']}" if "error" in entry else ""))
    return entry


def _fmt(x: float | None) -> str:
    return common.fmt(x, digits=2)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    args.episodes = args.episodes if args.episodes is not None else (1 if args.quick else 2)
    args.dim = args.dim if args.dim is not None else (256 if args.quick else 1024)
    args.warmup = args.warmup if args.warmup is not None else (4 if args.quick else 8)
    args.gap = args.gap if args.gap is not None else (4 if args.quick else 5)
    checked = _check(args)
    if isinstance(checked, str):
        print(f"accelpact bench memory: error: {checked}", file=sys.stderr)
        return 2
    wrappers, kinds = checked
    from accelpact.impl.launch.launch import run_torchrun

    results: dict[str, dict[str, Any]] = {}
    ok = True
    for w in wrappers:
        n, m = common.LAYOUT[w]
        results[w] = {}
        for kind in kinds:
            job, expected = _job(Path(args.out).resolve() / w / kind, w, kind, args)
            failures: list[dict[str, Any]] = []
            for attempt in range(args.retries + 1):
                print(f"memory: {w} {n}x{m} dim {args.dim} x {args.layers} layers, {args.episodes} {kind}(s) at steps "
                      f"{[e['step'] for e in expected]} of {job.workload.steps}"
                      + (f" (launch {attempt + 1} of {args.retries + 1})" if attempt else ""), flush=True)
                entry = _launch(job, expected, args.timeout, run_torchrun)
                if entry.get("launch_ok") or attempt == args.retries:
                    break
                kept = Path(f"{job.out}-failed{attempt}")  # the failed launch's folder, kept beside the retry's
                shutil.rmtree(kept, ignore_errors=True)
                shutil.move(job.out, kept)
                entry["out"] = str(kept)
                entry["error"] = entry["error"].replace(job.out, str(kept))
                failures.append(entry)
                print(f"memory: {w} {kind}: {entry['error']}; launching again", flush=True)
            entry["failed_launches"] = failures
            ok = ok and "error" not in entry
            results[w][kind] = entry
            s = entry.get("summary")
            print(f"memory: {w} {kind}: {entry['wall_s']:.0f} s"
                  + (f", max ratio {_fmt(s['max_ratio'])}, state {_fmt(s['max_state_ratio'])}, local "
                     f"{_fmt(s['max_local_ratio'])}, after {_fmt(s['max_after_ratio'])}, drift {_fmt(s['max_drift'])}"
                     if s else "")
                  + (f"; error: {entry['error']}" if "error" in entry else ""), flush=True)
    return report(args, wrappers, kinds, results, t0, ok)


def report(args: argparse.Namespace, wrappers: list[str], kinds: list[str], results: dict[str, dict[str, Any]],
           t0: float | None, ok: bool = True) -> int:
    """Print the table of ``results`` (wrapper -> kind -> a launch's entry), write the results file
    (``args.json``); the exit status."""
    table = []
    for w in wrappers:
        for kind in kinds:
            s = results[w][kind].get("summary")
            if not s:
                table.append([w, kind, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", results[w][kind].get("error", "")[:60]])
                continue
            for role, r in s["roles"].items():
                per = r["per_process"]
                table.append([w, kind, role, r["processes"], _fmt(_median(x["base_mb"] for x in per)),
                              _fmt(_median(x["steady_mb"] for x in per if x["steady_mb"] is not None)),
                              _fmt(r["ratio"]), _fmt(r["state_ratio"]), _fmt(r["local_ratio"]), _fmt(r["after_ratio"]),
                              _fmt(r["drift"]),
                              _fmt(r["tensor_growth_mb"]), "yes" if r["ratio"] is not None and r["ratio"] <= GOAL else "no"])
    common.print_table(f"episode peak RSS / steady peak RSS, max over ranks (goal <= {GOAL}); dim {args.dim}, "
                       f"{args.layers} layers, {args.episodes} episode(s) per launch",
                       ["wrapper", "kind", "role", "ranks", "base MB", "steady MB", "ratio", "state ratio", "local", "after",
                        "drift", "tensors +MB", "<= goal"], table)
    for w in wrappers:
        for kind in kinds:
            for f in results[w][kind]["failed_launches"]:
                print(f"memory: {w} {kind}: a launch failed before the one measured: {f['error']}", flush=True)
    headline: dict[str, Any] = {"goal_ratio": GOAL}
    reasons: dict[str, str] = {}
    for w in wrappers:
        for kind in kinds:
            s = results[w][kind].get("summary")
            for key, field in (("max_ratio", "max_ratio"), ("max_state_ratio", "max_state_ratio"),
                               ("max_local_ratio", "max_local_ratio"), ("max_after_ratio", "max_after_ratio")):
                name = f"{w}_{kind}_{key}"
                headline[name] = s[field] if s else None
                if headline[name] is None:
                    reasons[name] = results[w][kind].get("error") or "no steady state measured (too few fault-free steps)"
    config = {"wrappers": wrappers, "kinds": kinds, "episodes": args.episodes, "dim": args.dim, "layers": args.layers,
              "warmup": args.warmup, "gap": args.gap, "goal": GOAL}
    common.write_result(args, "memory", config, results, headline, reasons, t0)
    if t0 is not None:
        print(f"memory: wall {time.monotonic() - t0:.0f} s", flush=True)
    return 0 if ok else 1
