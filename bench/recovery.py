"""``accelpact bench recovery``: repeated L1 repairs and L2 restarts in the same run, measured.

Two torchrun launches of the same workload:

* L1: ``--repeat`` committed-boundary failures of the replicate group (one every other step),
  each repaired in place (a new generation per repair), no restart allowed;
* L2: ``--repeat`` in-flight failures (exception in backward), one per attempt, so torchrun
  restarts ``--repeat`` times; each restart reloads the last committed checkpoint and replays;
* swap: ``--repeat`` crashes (SIGKILL in backward, each of another rank) with ``--repeat`` spares,
  each taken over in place by a spare (hot swap: keeper, claim, every group rebuilt, the state from a
  live replica, the step discarded and rerun), no restart allowed.

Reported: median, p90 and max of every L1 phase (agree, retire, rebuild, rebind, validate,
release, total) and of fault-to-frontier for both paths, L2's exit-to-ready (respawn, import,
reload), replayed steps, and the L2/L1 ratio of median fault-to-frontier.  Nothing is asserted
here: speed is measured, never tested.  No torch import at module level.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from accelpact.impl.runtime.backends import BACKEND_NAMES
from accelpact.impl.launch.job import Job, Topology, Workload
from accelpact.impl.runtime.wrappers import WRAPPER_NAMES, wrapper
from .common import meta
from accelpact.impl.launch.launch import PHASES, l1_episodes, l2_episodes, run_torchrun, swap_episodes

__all__ = ["add_arguments", "check_args", "measure", "run", "summarize"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=int, default=3, help="L1 repairs and L2 restarts to measure (default 3)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--wrapper", choices=WRAPPER_NAMES, default="fsdp1-hybrid")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--backend", choices=BACKEND_NAMES, default="gloo")
    p.add_argument("--out", default="runs/bench-recovery", help="run folder (results, traces)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the summary as JSON to PATH")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each launch in seconds")


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (defined for any n >= 1)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def summarize(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0, "median": None, "p90": None, "max": None}
    return {"n": len(xs), "median": statistics.median(xs), "p90": _pct(xs, 0.9), "max": max(xs)}


def _job(args, out: Path, scenario: str, steps: int, faults: list[dict], spares: int = 0, checkpoint_every: int = 2,
         pad_s: float = 0.0) -> Job:
    return Job(topology=Topology(args.nodes, args.ranks_per_node, spares=spares),
               workload=Workload(args.wrapper, args.layers, steps, 0, checkpoint_every, pad_s),
               out=str(out), scenario=scenario, backend=args.backend, trace=True, deadline_s=30.0,
               collective_timeout_s=60.0).replace(faults=faults)


def check_args(args: argparse.Namespace) -> str | None:
    """The first problem with the flags, or None."""
    if args.repeat < 1:
        return f"--repeat must be >= 1, got {args.repeat}"
    if args.nodes < 1 or args.ranks_per_node < 1 or args.nodes * args.ranks_per_node < 2:
        return "need --nodes >= 1, --ranks-per-node >= 1 and at least 2 ranks"
    if wrapper(args.wrapper).recovers == "replicate" and args.nodes < 2:
        return f"--wrapper {args.wrapper} needs --nodes >= 2"
    if args.repeat > args.nodes * args.ranks_per_node:
        return f"--repeat {args.repeat}: the swap crashes a different rank each time; at most {args.nodes * args.ranks_per_node}"
    return None


def measure(args: argparse.Namespace, say=print, swap: bool = True) -> tuple[dict[str, Any], Any, Any, Any]:
    """The three launches (L1 repairs, L2 restarts, hot swaps unless ``swap`` is False) and their
    summary; (result, l1, l2, swap launch or None).
    ``args``: this module's flags (:func:`add_arguments`), already checked (:func:`check_args`)."""
    nproc = args.nodes * args.ranks_per_node
    group = wrapper(args.wrapper).recovers
    victim = args.ranks_per_node - 1 if group == "replicate" else nproc - 1
    # Odd fault steps with a checkpoint every 2: every L2 restart replays exactly one step.
    fault_steps = [3 + 2 * i for i in range(args.repeat)]
    steps = fault_steps[-1] + 2
    out = Path(args.out).resolve()
    t0 = time.monotonic()

    say(f"L1: {args.repeat} boundary failures of the {group} group, {args.wrapper} {args.nodes}x{args.ranks_per_node}")
    l1 = run_torchrun(_job(args, out / "l1", "bench-l1", steps, [
        {"step": s, "at": "boundary", "kind": "collective_timeout", "ranks": [victim], "group": group}
        for s in fault_steps]), nproc, max_restarts=0, timeout_s=args.timeout)
    say(f"L2: {args.repeat} in-flight failures, one per torchrun attempt")
    l2 = run_torchrun(_job(args, out / "l2", "bench-l2", steps, [
        {"step": s, "at": "backward", "kind": "exception", "ranks": [victim], "attempt": i}
        for i, s in enumerate(fault_steps)]), nproc, max_restarts=args.repeat, timeout_s=args.timeout)

    victims = [(victim + i) % nproc for i in range(args.repeat)]
    sw = None
    if swap:
        say(f"swap: {args.repeat} crashes in backward, each of another rank, {args.repeat} spare(s)")
        sw = run_torchrun(_job(args, out / "swap", "bench-swap", steps, [
            {"step": s, "at": "backward", "kind": "crash", "ranks": [v]} for s, v in zip(fault_steps, victims, strict=True)],
            spares=args.repeat), nproc, max_restarts=0, timeout_s=args.timeout)

    ep1, ep2, ep3 = l1_episodes(l1), l2_episodes(l2), (swap_episodes(sw) if sw is not None else [])
    result: dict[str, Any] = {
        "config": {"repeat": args.repeat, "wrapper": args.wrapper, "nodes": args.nodes,
                   "ranks_per_node": args.ranks_per_node, "layers": args.layers, "backend": args.backend,
                   "fault_steps": fault_steps, "steps": steps},
        "l1": {"ok": l1.ok(), "repairs": len(ep1), "restarts": l1.restarts,
               "phases_s": {ph: summarize([e["phases_s"][ph] for e in ep1]) for ph in PHASES},
               "fault_to_frontier_s": summarize([e["fault_to_frontier_s"] for e in ep1]),
               "replayed_steps": [e["replayed_steps"] for e in ep1]},
        "l2": {"ok": l2.ok(), "restarts": l2.restarts, "episodes": len(ep2),
               "fault_to_frontier_s": summarize([e["fault_to_frontier_s"] for e in ep2]),
               "exit_to_ready_s": summarize([e["exit_to_ready_s"] for e in ep2]),
               "replayed_steps": [e["replayed_steps"] for e in ep2],
               "exit_codes": [e["exit_codes"] for e in ep2]},
        "swap": {"ok": sw is not None and sw.ok(), "restarts": sw.restarts if sw is not None else None, "swaps": len(ep3), "victims": victims,
                 "fault_to_frontier_s": summarize([e["fault_to_frontier_s"] for e in ep3]),
                 "phases_ms": {ph: summarize([e["durations_ms"].get(ph) for e in ep3 if ph in e["durations_ms"]])
                               for ph in ("agree", "replace", "rebuild", "transfer", "validate", "release")},
                 "replayed_steps": [e["replayed_steps"] for e in ep3], "lost_steps": 0 if sw is not None and sw.ok() else None},
        "wall_s": None,
    }
    m1, m2 = result["l1"]["fault_to_frontier_s"]["median"], result["l2"]["fault_to_frontier_s"]["median"]
    result["l2_over_l1_fault_to_frontier"] = (m2 / m1) if m1 and m2 else None
    m3 = result["swap"]["fault_to_frontier_s"]["median"]
    result["l2_over_swap_fault_to_frontier"] = (m2 / m3) if m2 and m3 else None
    result["complete"] = (l1.ok() and l2.ok() and len(ep1) == args.repeat and len(ep2) == args.repeat
                          and (sw is None or (sw.ok() and len(ep3) == args.repeat and sw.restarts == 0)))
    result["wall_s"] = time.monotonic() - t0
    return result, l1, l2, sw


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    problem = check_args(args)
    if problem:
        print(f"accelpact bench recovery: error: {problem}", file=sys.stderr)
        return 2
    nproc = args.nodes * args.ranks_per_node
    result, l1, l2, sw = measure(args, console.print)
    ep1_n, ep2_n = result["l1"]["repairs"], result["l2"]["episodes"]

    def ms(x):
        return "-" if x is None else f"{x * 1e3:.1f}"

    table = Table(title=f"recovery ({args.wrapper}, {nproc} ranks, gloo CPU): milliseconds")
    for col in ("metric", "n", "median", "p90", "max"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for ph in PHASES:
        s = result["l1"]["phases_s"][ph]
        table.add_row(f"L1 {ph}", str(s["n"]), ms(s["median"]), ms(s["p90"]), ms(s["max"]))
    for label, s in (("L1 fault->frontier", result["l1"]["fault_to_frontier_s"]),
                     ("L2 fault->frontier", result["l2"]["fault_to_frontier_s"]),
                     ("L2 exit->ready", result["l2"]["exit_to_ready_s"]),
                     ("swap fault->frontier", result["swap"]["fault_to_frontier_s"])):
        table.add_row(label, str(s["n"]), ms(s["median"]), ms(s["p90"]), ms(s["max"]))
    for ph, s in result["swap"]["phases_ms"].items():
        table.add_row(f"swap {ph}", str(s["n"]), *("-" if s[k] is None else f"{s[k]:.1f}" for k in ("median", "p90", "max")))
    console.print(table)
    r3 = result["l2_over_swap_fault_to_frontier"]
    console.print(f"a crash: swap median fault-to-frontier {ms(result['swap']['fault_to_frontier_s']['median'])} ms, "
                  f"L2/swap {'-' if r3 is None else f'{r3:.1f}x'}; lost steps: swap 0 (the step discarded and rerun), "
                  f"L2 {result['l2']['replayed_steps']} replayed")
    ratio = result["l2_over_l1_fault_to_frontier"]
    console.print(f"replayed steps: L1 {result['l1']['replayed_steps']}, L2 {result['l2']['replayed_steps']}; "
                  f"L2/L1 median fault-to-frontier: {'-' if ratio is None else f'{ratio:.0f}x'}; "
                  f"wall {result['wall_s']:.0f} s")
    if not l1.ok() or ep1_n != args.repeat:
        console.print(f"[red]L1 run incomplete[/red]: {ep1_n}/{args.repeat} repairs, rc={l1.returncode}; see {l1.log}")
    if not l2.ok() or ep2_n != args.repeat:
        console.print(f"[red]L2 run incomplete[/red]: {ep2_n}/{args.repeat} restarts, rc={l2.returncode}; see {l2.log}")
    if sw is not None and (not sw.ok() or result["swap"]["swaps"] != args.repeat):
        console.print(f"[red]swap run incomplete[/red]: {result['swap']['swaps']}/{args.repeat} swaps, "
                      f"restarts {sw.restarts}, rc={sw.returncode}; see {sw.log}")
    if args.json:
        doc = {"benchmark": "recovery", "quick": False, "meta": meta(False), **result,
               "headline": {"l2_over_l1_fault_to_frontier": result["l2_over_l1_fault_to_frontier"],
                            "l2_over_swap_fault_to_frontier": result["l2_over_swap_fault_to_frontier"]},
               "headline_reasons": {} if result["l2_over_l1_fault_to_frontier"] is not None else
               {"l2_over_l1_fault_to_frontier": "an L1 or L2 fault-to-frontier is missing (incomplete run)"}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        console.print(f"json: {args.json}")
    return 0 if result["complete"] else 1
