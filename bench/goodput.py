"""``accelpact bench goodput``: fault-to-frontier and whole-run time of AccelPact L1, its in-flight
discard, torchrun restart (L2) and torchft, against the checkpoint's age (the paper's Tables III and IV).

The same 2-rank world for all (the workload's ``CharLM``, DDP-style data parallelism over two ranks,
gloo on loopback), each step padded to ``--step-s`` of device time (default 1 s:
``WorkloadSpec.pad_s``, a sleep at the start of the step, so the host is idle as under a GPU step
and two CPU cores are not computing for a second), measured in one run:

* **baseline**: the same job with no fault, under torchrun and (with torchft) under torchft's own
  launcher: the wall time each method loses time against ("lost" = whole run - its baseline).
* **L1** (AccelPact in-place repair): a boundary failure of the world group (``collective_timeout``
  on rank 1 after a step committed) at each fault step, repaired in place; detection = the fault
  until the last rank's ``RankObserve``, fault-to-frontier = until every rank resumed at F.
* **discard** (AccelPact in flight, P17): a communicator failure in backward (the world group's
  connections cut on rank 1), discarded in place on every rank and the step rerun: no restart, one
  step's work redone whatever A is; fault-to-frontier read off the traces as L1's.  Also reported:
  what a job with ``rebuild=`` adds to every fault-free boundary for it (the RNG state and the extra
  state kept), timed in this process; the commit point itself (phase 3's agreement) adds nothing.
* **L2** (torchrun restart from the last DCP checkpoint): an in-flight failure (exception in
  backward) at each fault step, one per torchrun attempt; every rank exits 70, torchrun restarts the
  job, which reloads checkpoint C and replays the checkpoint's age A = F - C steps; detection = the
  fault until the last worker exited, then respawn + reload, then the replay.
* **torchft** (optional, :mod:`accelpact.bench.torchft_run` under an interpreter that has torchft):
  two replica groups of one rank, a lighthouse, the same boundary fault (the gloo communicator's
  sockets shut down after a commit); torchft sees it in the next step's all-reduce (detection: that
  step ends uncommitted), reconfigures at the next quorum and runs the step again; fault-to-frontier
  = until both replicas are ready again for the interrupted step.

Each L2 restart is also reported as the soak reports one (:mod:`accelpact.impl.launch.restarts`,
:func:`restart_report`): its cause (from the records and exit codes: ``in_flight`` here), the time
lost from the last commit before the fault to the first commit past it, read off the steps files'
own timestamps, split at the attempt's last exit (before: detection; after: respawn, reload,
replay), and the steps replayed.

The fault steps put every age in ``--ages`` behind a checkpoint: checkpoints every k = max(A) + 1
steps, faults at k(r+1) + A for repeat r and age A (ascending), so an L2 restart replays exactly A
steps (checked: ``replayed_steps``).  L1 and torchft lose no committed step whatever A is; they
fail at the same steps.  Ratios are of medians measured in this run.  ``goodput_at_mtbf`` is
derived, not measured: ``1 - fault_to_frontier / MTBF`` for a job that fails every MTBF seconds.

torchft is looked for in ``--torchft-python``, then ``$ACCELPACT_TORCHFT_PYTHON``, then
``runs/tft-venv/bin/python`` (a venv whose ``.pth`` reuses ``.venv``'s torch 2.13.0; see
bench/README.md), then this interpreter; ``--torchft off`` skips it (the default of ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import common, recovery
from accelpact.impl.launch.launch import l1_episodes, l2_episodes, run_torchrun, swap_episodes
from accelpact.impl.launch.restarts import restarts as read_restarts
from accelpact.impl.launch.restarts import summary as restarts_summary

__all__ = ["add_arguments", "run", "find_torchft", "fault_plan", "restart_report"]

MTBF_S = (600.0, 3600.0, 6 * 3600.0)
DEFAULT_AGES = "1,5,10,20"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "goodput")
    p.add_argument("--ages", default=None, help=f"checkpoint ages A (steps since the last checkpoint) at the faults, "
                                                f"comma-separated (default {DEFAULT_AGES}; quick 1)")
    p.add_argument("--step-s", type=float, default=None, help="each step's device time, seconds (default 1.0; quick 0.02)")
    p.add_argument("--repeat", type=int, default=None, help="faults per age and method (default 2; quick 1)")
    p.add_argument("--layers", type=int, default=2, help="wrapped layers of the workload (default %(default)s)")
    p.add_argument("--torchft", choices=("auto", "on", "off"), default=None,
                   help="torchft arm: auto = if an interpreter with torchft is found (default; quick: off)")
    p.add_argument("--torchft-python", default=None, metavar="PATH", help="interpreter that has torchft next to torch 2.13.0")
    p.add_argument("--no-baseline", action="store_true", help="skip the fault-free run (no lost-time figures)")
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on each launch, seconds")


def fault_plan(ages: list[int], repeat: int) -> tuple[int, list[tuple[int, int]], int]:
    """(checkpoint interval k, [(fault step, age)], steps): checkpoints every k = max(ages) + 1
    steps; repeat r's fault of age A strikes step k(r+1) + A (ages ascending), after checkpoint
    k(r+1) and before the next, so a restart replays A steps; the job runs two steps past the last."""
    k = max(ages) + 1
    plan = [(k * (r + 1) + a, a) for r in range(repeat) for a in sorted(ages)]
    return k, plan, plan[-1][0] + 2


def find_torchft(explicit: str | None) -> tuple[str | None, str]:
    """(interpreter, why): an interpreter that imports torchft, or None and the reason."""
    candidates = [c for c in (explicit, os.environ.get("ACCELPACT_TORCHFT_PYTHON"), "runs/tft-venv/bin/python", sys.executable) if c]
    tried = []
    for c in candidates:
        if c != sys.executable and not Path(c).exists():
            tried.append(f"{c}: not there")
            continue
        try:
            out = subprocess.run([c, "-c", "import torch, torchft; print(torch.__version__, torchft.__file__)"],
                                 capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{c}: {exc}")
            continue
        if out.returncode == 0:
            return c, out.stdout.strip()
        tried.append(f"{c}: {(out.stderr.strip().splitlines() or ['import failed'])[-1]}")
    return None, "torchft is not importable: " + "; ".join(tried)


def _torchft(python: str, fault_steps: list[int], steps: int, layers: int, pad_s: float, out: Path,
             timeout: float) -> dict[str, Any]:
    cmd = [python, "-m", "accelpact.bench.torchft_run", "launch", "--steps", str(steps),
           "--fault-steps", ",".join(map(str, fault_steps)), "--layers", str(layers), "--pad-s", str(pad_s), "--out", str(out),
           "--bound", str(timeout)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise common.BenchError(f"torchft launch failed (rc={proc.returncode}): {proc.stderr[-2000:]}")
    res = json.loads(lines[-1])
    res.pop("replicas", None)
    res["fault_steps"] = fault_steps
    for key in ("fault_to_detect_s", "fault_to_frontier_s", "fault_to_commit_s"):
        res[key] = common.stats([f.get(key) for f in res["faults"]])
    res["configure_ms"] = common.stats(res.get("configure_s", []), 1e3)
    res["complete"] = (not res["timed_out"] and res["codes"] == [0, 0] and len(res["faults"]) == len(fault_steps)
                       and all(f["fault_to_frontier_s"] is not None for f in res["faults"]))
    return res


def _check(args: argparse.Namespace) -> tuple[list[int], float, int] | str:
    try:
        ages = common.parse_list(args.ages or ("1" if args.quick else DEFAULT_AGES))
    except ValueError as exc:
        return f"--ages: {exc}"
    if not ages or any(a < 1 for a in ages) or len(set(ages)) != len(ages):
        return f"--ages: distinct ages >= 1 steps, got {args.ages}"
    step_s = args.step_s if args.step_s is not None else (0.02 if args.quick else 1.0)
    if not step_s >= 0:
        return f"--step-s must be >= 0 seconds, got {args.step_s}"
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 2)
    if repeat < 1:
        return "--repeat must be >= 1"
    return ages, step_s, repeat


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    checked = _check(args)
    if isinstance(checked, str):
        print(f"accelpact bench goodput: error: {checked}", file=sys.stderr)
        return 2
    ages, step_s, repeat = checked
    mode = args.torchft or ("off" if args.quick else "auto")
    k, plan, steps = fault_plan(ages, repeat)
    fault_steps = [s for s, _ in plan]
    age_of = [a for _, a in plan]
    rec_args = argparse.Namespace(nodes=1, ranks_per_node=2, wrapper="ddp", layers=args.layers, backend="gloo")
    out = Path(args.out).resolve()
    victim = 1

    def job(name: str, faults: list[dict]):
        return recovery._job(rec_args, out / name, f"bench-goodput-{name}", steps, faults, checkpoint_every=k, pad_s=step_s)

    def say(m: str) -> None:
        print(f"goodput: {m}", flush=True)

    say(f"{steps} steps of {step_s:g} s device time, a checkpoint every {k}, {len(plan)} faults per method "
        f"(ages {sorted(ages)} x {repeat}; fault steps {fault_steps}); about "
        f"{(steps * (3 + 2 * (mode != 'off')) + sum(age_of)) * step_s / 60 + len(plan) * 0.15:.0f} min")
    result: dict[str, Any] = {"plan": {"checkpoint_interval": k, "steps": steps, "fault_steps": fault_steps, "ages": age_of,
                                       "step_s": step_s}}
    reasons: dict[str, str] = {}
    base = None
    if not args.no_baseline:
        say("baseline: no fault")
        base = run_torchrun(job("baseline", []), 2, max_restarts=0, timeout_s=args.timeout)
        result["baseline"] = {"ok": base.ok(), "wall_s": base.wall_s}
    say(f"L1: {len(plan)} boundary failures of the world group, repaired in place")
    l1 = run_torchrun(job("l1", [{"step": s, "at": "boundary", "kind": "collective_timeout", "ranks": [victim], "group": "world"}
                                 for s in fault_steps]), 2, max_restarts=0, timeout_s=args.timeout)
    say(f"L2: {len(plan)} in-flight failures, one per torchrun attempt, each restarted from the checkpoint")
    l2 = run_torchrun(job("l2", [{"step": s, "at": "backward", "kind": "exception", "ranks": [victim], "attempt": i}
                                 for i, s in enumerate(fault_steps)]), 2, max_restarts=len(plan), timeout_s=args.timeout)
    say(f"discard: {len(plan)} communicator failures in backward (the world group's connections cut), each discarded "
        "in place and the step rerun (P17)")
    dc = run_torchrun(job("discard", [{"step": s, "at": "backward", "kind": "collective_timeout", "ranks": [victim],
                                       "group": "world"} for s in fault_steps]), 2, max_restarts=0, timeout_s=args.timeout)
    # a discard's episode is read off the traces as a repair's is (fault, last RankObserve, last RankResume)
    ep1, ep2, ep4 = l1_episodes(l1), l2_episodes(l2), l1_episodes(dc)
    dc_res: dict[str, Any] = {"ok": dc.ok(), "discards": len(swap_episodes(dc)), "restarts": dc.restarts, "wall_s": dc.wall_s,
              "fault_to_frontier_s": common.stats(e["fault_to_frontier_s"] for e in ep4),
              "fault_to_detect_s": common.stats(e.get("fault_to_observe_s") for e in ep4),
              "episodes": [{"age": a, "fault_to_frontier_s": e["fault_to_frontier_s"]} for e, a in zip(ep4, age_of, strict=False)],
              "keep_state_us": _keep_state_cost_us()}
    l1_res: dict[str, Any] = {"ok": l1.ok(), "repairs": len(ep1), "wall_s": l1.wall_s,
              "fault_to_frontier_s": common.stats(e["fault_to_frontier_s"] for e in ep1),
              "fault_to_detect_s": common.stats(e.get("fault_to_observe_s") for e in ep1),
              "replayed_steps": [e["replayed_steps"] for e in ep1],
              "episodes": [{"age": a, "fault_to_detect_s": e.get("fault_to_observe_s"),
                            "fault_to_frontier_s": e["fault_to_frontier_s"]} for e, a in zip(ep1, age_of, strict=False)]}
    l2_res: dict[str, Any] = {"ok": l2.ok(), "restarts": l2.restarts, "wall_s": l2.wall_s,
              "fault_to_frontier_s": common.stats(e["fault_to_frontier_s"] for e in ep2),
              "fault_to_detect_s": common.stats(e.get("fault_to_exit_s") for e in ep2),
              "exit_to_ready_s": common.stats(e["exit_to_ready_s"] for e in ep2),
              "replay_s": common.stats(e.get("ready_to_frontier_s") for e in ep2),
              "replayed_steps": [e["replayed_steps"] for e in ep2],
              "exit_codes": [e["exit_codes"] for e in ep2],
              "episodes": [{"age": a, **{key: e.get(key) for key in ("replayed_steps", "fault_to_exit_s", "exit_to_ready_s",
                                                                     "ready_to_frontier_s", "fault_to_frontier_s")}}
                           for e, a in zip(ep2, age_of, strict=False)]}
    # each restart as the soak reports it (accelpact/testing/soak/restarts.py): its cause, the time lost
    # from the last commit before the fault to the first commit past it, the steps replayed
    l2_res.update(restart_report(l2.out, 2, age_of))
    if not l2_res["restarts_replayed_agree"]:
        say(f"the restarts' replayed steps {[r['replayed_steps'] for r in l2_res['restarts']]} (steps files) differ "
            f"from the workers' own {l2_res['replayed_steps']}")
    complete = (l1.ok() and l2.ok() and len(ep1) == len(plan) and len(ep2) == len(plan)
                and l2_res["replayed_steps"] == age_of and all(r == 0 for r in l1_res["replayed_steps"]))
    if l2_res["replayed_steps"] != age_of:
        say(f"L2 replayed {l2_res['replayed_steps']} steps where the plan's ages are {age_of}")
    complete = complete and dc.ok() and dc.restarts == 0 and len(ep4) == len(plan) == dc_res["discards"]
    result["accelpact"] = {"l1": l1_res, "l2": l2_res, "discard": dc_res, "complete": complete}
    tft = None
    if mode == "off":
        reasons["torchft_over_accelpact_fault_to_frontier"] = "torchft arm off (--torchft off, the default of --quick)"
    else:
        python, why = find_torchft(args.torchft_python)
        if python is None:
            reasons["torchft_over_accelpact_fault_to_frontier"] = why
            say(f"torchft skipped: {why}")
            if mode == "on":
                print(f"accelpact bench goodput: --torchft on: {why}", file=sys.stderr)
                return 1
        else:
            say(f"torchft: {len(plan)} boundary failures, 2 replica groups x 1 rank ({python}: {why})")
            try:
                tft = _torchft(python, fault_steps, steps, args.layers, step_s, out / "torchft", args.timeout)
                tft["python"], tft["version"] = python, why
                if not args.no_baseline:
                    say("torchft baseline: no fault (its own launch has no torchrun agent: lost time is against this)")
                    tft_base = _torchft(python, [], steps, args.layers, step_s, out / "torchft-baseline", args.timeout)
                    tft["baseline_wall_s"] = tft_base["wall_s"]
            except (common.BenchError, subprocess.TimeoutExpired) as exc:
                reasons["torchft_over_accelpact_fault_to_frontier"] = f"torchft run failed: {exc}"[:500]
    result["torchft"] = tft

    # fault to frontier by age: L2 grows with A, L1 and torchft do not
    by_age: dict[str, Any] = {}
    for a in sorted(ages):
        row: dict[str, Any] = {}
        row["l1"] = common.stats(e["fault_to_frontier_s"] for e in l1_res["episodes"] if e["age"] == a)["median"]
        row["l2"] = common.stats(e["fault_to_frontier_s"] for e in l2_res["episodes"] if e["age"] == a)["median"]
        row["torchft"] = (common.stats(f["fault_to_frontier_s"] for f, fa in zip(tft["faults"], age_of, strict=False) if fa == a)["median"]
                          if tft else None)
        row["discard"] = common.stats(e["fault_to_frontier_s"] for e in dc_res["episodes"] if e["age"] == a)["median"]
        row["l2_over_l1"] = (row["l2"] / row["l1"]) if row["l1"] and row["l2"] else None
        row["l2_over_discard"] = (row["l2"] / row["discard"]) if row["discard"] and row["l2"] else None
        by_age[str(a)] = row
    result["by_age"] = by_age  # l2_over_l1 per age here (a headline holds numbers only)
    l1m, l2m = l1_res["fault_to_frontier_s"]["median"], l2_res["fault_to_frontier_s"]["median"]
    tft_m = tft["fault_to_frontier_s"]["median"] if tft else None
    walls: dict[str, float | None] = {"baseline": base.wall_s if base else None, "l1": l1.wall_s, "l2": l2.wall_s,
                                      "discard": dc.wall_s, "torchft": tft["wall_s"] if tft else None}
    result["whole_run_s"] = walls
    bases = {"l1": walls["baseline"], "l2": walls["baseline"], "discard": walls["baseline"],
             "torchft": tft.get("baseline_wall_s") if tft else None}
    result["lost_s"] = {m: (w - b) if (w := walls[m]) is not None and b else None for m, b in bases.items()}
    systems = [("AccelPact L1 (in place)", l1_res["fault_to_detect_s"], l1_res["fault_to_frontier_s"], l1.wall_s,
                result["lost_s"]["l1"]),
               ("torchrun restart L2", l2_res["fault_to_detect_s"], l2_res["fault_to_frontier_s"], l2.wall_s, result["lost_s"]["l2"]),
               ("AccelPact discard in flight", dc_res["fault_to_detect_s"], dc_res["fault_to_frontier_s"], dc.wall_s,
                result["lost_s"]["discard"])]
    if tft:
        systems.append(("torchft (reconfigure)", tft["fault_to_detect_s"], tft["fault_to_frontier_s"], tft["wall_s"],
                        result["lost_s"]["torchft"]))
    common.print_table(f"fault to frontier and whole run, 2 ranks, {step_s:g} s steps, {len(plan)} faults (gloo CPU, loopback)",
                       ["method", "n", "detect med (ms)", "frontier med (ms)", "p90", "max", "x L1", "whole run (s)", "lost (s)"],
                       [[name, f["n"], common.fmt(d["median"], 1e3), common.fmt(f["median"], 1e3), common.fmt(f["p90"], 1e3),
                         common.fmt(f["max"], 1e3), common.fmt((f["median"] / l1m) if f["median"] and l1m else None),
                         common.fmt(w), common.fmt(lost)]
                        for name, d, f, w, lost in systems])
    common.print_table("fault to frontier by checkpoint age A (medians, ms)",
                       ["A (steps)", "L1", "discard", "L2", "torchft", "L2 / L1", "L2 / discard"],
                       [[a, common.fmt(r["l1"], 1e3), common.fmt(r["discard"], 1e3), common.fmt(r["l2"], 1e3),
                         common.fmt(r["torchft"], 1e3), common.fmt(r["l2_over_l1"]), common.fmt(r["l2_over_discard"])]
                        for a, r in by_age.items()])
    _print_restarts(l2_res, {"L1": l1.restarts, "discard": dc.restarts})
    print(f"goodput: a discard's per-step cost (the committed boundary's RNG state and extra state kept): median "
          f"{common.fmt(dc_res['keep_state_us']['median'])} us (p90 {common.fmt(dc_res['keep_state_us']['p90'])}); the commit "
          "fence's all-reduce over W (P17.2) is a further per-step cost: `accelpact bench guard --fence`", flush=True)
    if walls["baseline"]:
        print(f"goodput: fault-free run {walls['baseline']:.1f} s for {steps} steps", flush=True)
    if tft:
        print(f"torchft: fault to the interrupted step committed: median {common.fmt(tft['fault_to_commit_s']['median'], 1e3)} ms; "
              f"configure(): median {common.fmt(tft['configure_ms']['median'])} ms, max {common.fmt(tft['configure_ms']['max'])} ms "
              f"(n={tft['configure_ms']['n']}); fault-free step {common.fmt(tft.get('step_s'), 1e3)} ms", flush=True)
    result["goodput_at_mtbf"] = {f"{int(m)}s": {name: (1 - f["median"] / m) if f["median"] else None for name, _, f, _, _ in systems}
                                 for m in MTBF_S}
    a_min = str(min(ages))
    headline: dict[str, Any] = {
        "l2_over_l1_fault_to_frontier": by_age[a_min]["l2_over_l1"],
        "l2_over_discard_fault_to_frontier": by_age[a_min]["l2_over_discard"],
        "discard_fault_to_frontier_ms": (None if dc_res["fault_to_frontier_s"]["median"] is None
                                         else dc_res["fault_to_frontier_s"]["median"] * 1e3),
        "torchft_over_discard_fault_to_frontier": ((tft_m / dc_res["fault_to_frontier_s"]["median"])
                                                   if tft_m and dc_res["fault_to_frontier_s"]["median"] else None),
        "torchft_over_accelpact_fault_to_frontier": (tft_m / l1m) if tft_m and l1m else None,
        "l1_fault_to_frontier_ms": None if l1m is None else l1m * 1e3,
        "l2_fault_to_frontier_ms": None if l2m is None else l2m * 1e3,
        "torchft_fault_to_frontier_ms": None if tft_m is None else tft_m * 1e3,
        "step_s": step_s,
    }
    if headline["l2_over_l1_fault_to_frontier"] is None:
        reasons["l2_over_l1_fault_to_frontier"] = "an L1 or L2 run did not complete (see the launch logs under --out)"
    if headline["torchft_over_accelpact_fault_to_frontier"] is None and "torchft_over_accelpact_fault_to_frontier" not in reasons:
        reasons["torchft_over_accelpact_fault_to_frontier"] = "a torchft or L1 fault-to-frontier is missing"
    if getattr(args, "plot", None):
        _plot(args.plot, by_age, systems, step_s)
    common.write_result(args, "goodput", {"repeat": repeat, "ages": sorted(ages), "step_s": step_s, "world": "1x2 (2 ranks)",
                                          "layers": args.layers, "torchft": mode}, result, headline, reasons, t0)
    if not complete:
        say(f"incomplete: L1 {len(ep1)}/{len(plan)} repairs (rc={l1.returncode}, {l1.log}), "
            f"L2 {len(ep2)}/{len(plan)} restarts (rc={l2.returncode}, {l2.log})")
    return 0 if complete and (tft is None or tft["complete"]) else 1


def restart_report(out: str | Path, world: int, ages: list[int]) -> dict[str, Any]:
    """The restarts of the L2 run in ``out`` in the soak's terms (:mod:`accelpact.impl.launch.restarts`):
    per restart (with the plan's age A of its fault) its cause, the time lost from the last commit
    before the fault to the first commit past it (split at the attempt's last exit: ``before_s``,
    the detection; ``after_s``, torchrun's respawn, the reload and the replay) and the steps
    replayed; their statistics and totals; and whether the steps replayed agree with the workers'
    own count (``result.replayed_steps``: F - C)."""
    rs = read_restarts(out, world)
    rows = [{"age": ages[i] if i < len(ages) else None, **r.to_json()} for i, r in enumerate(rs)]
    own = _replayed_by_workers(out)
    return {"restarts": rows, "restart_totals": restarts_summary(rs),
            "lost_s": common.stats(r.lost_s for r in rs), "lost_before_exit_s": common.stats(r.before_s for r in rs),
            "lost_after_exit_s": common.stats(r.after_s for r in rs),
            "restarts_replayed_agree": [r.replayed_steps for r in rs] == own}


def _replayed_by_workers(out: str | Path) -> list[int]:
    """Each restarted attempt's ``replayed_steps`` as its workers recorded them (the most over its ranks)."""
    from accelpact.impl.rundir import RunDir

    res = RunDir(out).results()
    attempts = sorted({a for a, _ in res if a > 0})
    return [max((int(v.get("replayed_steps") or 0) for (x, _r), v in res.items() if x == a), default=0) for a in attempts]


def _print_restarts(l2_res: dict[str, Any], others: dict[str, int]) -> None:
    rows = l2_res["restarts"]
    common.print_table("L2 restarts: time lost = first commit past the fault's last step - last commit before the fault "
                       "(seconds; before / after the attempt's last exit)",
                       ["restart", "A", "cause", "last step", "lost", "before exit", "after exit", "replayed", "fault to frontier"],
                       [[f"a{r['attempt']}->a{r['attempt'] + 1}", r["age"], r["cause"], r["last_step"], common.fmt(r["lost_s"]),
                         common.fmt(r["before_s"]), common.fmt(r["after_s"]), r["replayed_steps"],
                         common.fmt(e.get("fault_to_frontier_s"))]
                        for r, e in zip(rows, l2_res["episodes"] + [{}] * len(rows), strict=False)])
    tot = l2_res["restart_totals"]
    by = ", ".join(f"{c} {v['restarts']}" for c, v in sorted(tot["by_cause"].items()))
    print(f"goodput: L2 {tot['restarts']} restart(s) ({by or 'none'}): {tot['lost_s']:.2f} s of training lost, "
          f"{tot['replayed_steps']} steps replayed" + "".join(f"; {m} {n} restart(s)" for m, n in others.items())
          + (f"; unknown causes: {tot['unknown']}" if tot["unknown"] else ""), flush=True)


def _keep_state_cost_us(n: int = 2000) -> dict[str, Any]:
    """What a job attached with ``rebuild=`` adds to every fault-free boundary for a discard in place:
    ``Training._keep_for_discard``'s work, the RNG state and a deep copy of the extra state (a data
    cursor of a few ints), timed ``n`` times in this process (microseconds)."""
    import copy

    import torch

    cursor = {"epoch": 3, "index": 12345, "seed": 7}
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        kept = {"rng": torch.get_rng_state(), "extra": copy.deepcopy(cursor), "frontier": 0}
        times.append((time.perf_counter_ns() - t) / 1e3)
        del kept
    return common.stats(times, 1.0)


def _plot(path: str, by_age: dict[str, Any], systems: list, step_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [int(a) for a in by_age]
    for key, label, color in (("l1", "AccelPact L1", "tab:green"), ("l2", "torchrun restart L2", "tab:red"),
                              ("torchft", "torchft", "tab:blue")):
        ys = [(by_age[a][key] or float("nan")) * 1e3 for a in by_age]
        if any(y == y for y in ys):
            ax.plot(xs, ys, "o-", color=color, label=label)
    ax.set_xlabel("checkpoint age A at the fault (steps)")
    ax.set_ylabel("fault to frontier, median (ms, log)")
    ax.set_yscale("log")
    ax.set_title(f"2 ranks, {step_s:g} s steps, gloo CPU", fontsize=9)
    ax.legend(fontsize=8)
    names = [s[0] for s in systems]
    det = [(s[1]["median"] or 0) * 1e3 for s in systems]
    rest = [max(((s[2]["median"] or 0) - (s[1]["median"] or 0)) * 1e3, 0.0) for s in systems]
    bx.bar(names, det, color="tab:gray", label="detection")
    bx.bar(names, rest, bottom=det, color="tab:orange", label="repair (to frontier)")
    bx.set_yscale("log")
    bx.set_ylabel("median over all ages (ms, log)")
    bx.tick_params(axis="x", labelsize=7)
    bx.legend(fontsize=8)
    common.save_figure(fig, path, dpi=110)
