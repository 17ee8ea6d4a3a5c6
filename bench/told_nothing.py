"""``accelpact bench told-nothing``: checking a run the checker is told nothing about, and judging a scenario.

Two measurements (spec/trace-checking.md, "A run told nothing" and "Measured"):

* **Runs told nothing.**  For each world of ``--worlds`` (default 4x4 and 8x8, 64 ranks), a model run of
  ``--episodes`` boundary failures of random groups in a random interleaving (``checker.random_run``:
  every rank's steps interleaved as a real run's may, not rank by rank), projected to the records a
  faithful engine writes (``checker.project``), its faults unlogged (a user's run: the faults came from
  outside), each node's clock shifted by up to three hours (hosts' monotonic clocks are unrelated), is
  written to a run folder and checked as ``accelpact check-trace DIR`` checks it
  (``cli_check.check_dir``: told nothing, episode by episode).  The baseline, timed in the same run
  and the same way: one repair of the same world projected rank by rank (``checker.scheduled_repair``),
  its fault unlogged too.
* **A scenario judged.**  The 4x4 FSDP1 repair scenario (16 ranks, one boundary cut; the corpus
  generator's cell, ``--scenario`` for another): the outcome search (``outcomes.model_outcomes``) and
  the check of a model run of it written as a real run's folder (``runner.check_run_traces``: the
  scripted checker and the one told nothing), which is what the conformance runner judges a run by.

Seconds are medians (with p90 and max) of ``--repeat`` runs in this process.  Measured, never asserted in
a test.  Pure Python, no torch.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from . import common
from accelpact.conformance.checker import Abstraction, project, random_run, scheduled_repair, write_dir
from accelpact.conformance.cli_check import check_dir
from accelpact.conformance.generate import _trigger, _workload
from accelpact.conformance.mapping import model_config, script_for
from accelpact.conformance.outcomes import model_outcomes
from accelpact.conformance.runner import abstraction_for, check_run_traces
from accelpact.conformance.scenario import Scenario, load_scenario
from accelpact.impl.launch.job import Topology
from accelpact.impl.trace import RankTrace
from accelpact.model.protocol import Action
from accelpact.model.state import Config

__all__ = ["add_arguments", "as_recorded", "repair_scenario", "run", "told_nothing_traces"]

#: how far apart the nodes' clocks may be, in nanoseconds (three hours)
SKEW_NS = 3 * 3600 * 10**9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_common(parser, "told-nothing", plot=False)
    parser.add_argument("--worlds", default="4x4,8x8", help="NODESxRANKS_PER_NODE worlds of the runs told nothing (default %(default)s)")
    parser.add_argument("--episodes", type=int, default=3, help="boundary failures per run told nothing (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="timed checks of each (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random runs (default %(default)s)")
    parser.add_argument("--scenario", default=None, metavar="PATH",
                        help="the scenario to judge (default: the 4x4 FSDP1 repair, built as the corpus generator builds a cell)")


def _unlogged(traces: dict[int, RankTrace], nodes: int, rpn: int, rng: random.Random) -> dict[int, RankTrace]:
    """``traces`` as a user's run records them: no fault record (the faults came from outside), and
    each node's clock shifted (``t_ns`` are microseconds apart, plus the node's offset)."""
    skew = [rng.randrange(SKEW_NS) for _ in range(nodes)]
    out = {}
    for r, tr in traces.items():
        recs = [rec for rec in tr.records if not rec.action.startswith("Fault")]
        recs = [replace(rec, seq=i, t_ns=rec.t_ns * 1000 + skew[r // rpn]) for i, rec in enumerate(recs)]
        out[r] = RankTrace(r, recs, tr.header, tr.end)
    return out


def told_nothing_traces(nodes: int, rpn: int, episodes: int, seed: int, *, scheduled: bool = False) -> dict[int, RankTrace]:
    """The traces of a run told nothing: ``episodes`` boundary failures of random groups in a random
    interleaving (``scheduled``: one repair of the last local index's group, rank by rank)."""
    cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=rpn - 1, failing="any", max_faults=max(episodes, 1),
                 points=("boundary",), faults=frozenset({"group_fail"}))
    rng = random.Random(seed)
    path = scheduled_repair(cfg) if scheduled else random_run(cfg, rng, episodes=episodes)
    return _unlogged(project(cfg, path), nodes, rpn, rng)


def repair_scenario(path: str | None = None, nodes: int = 4, rpn: int = 4):
    """The scenario ``path`` names, else the ``nodes`` x ``rpn`` FSDP1 repair (default 4x4): the corpus
    generator's boundary cut of the replicate group of local index 1 (``conformance/generate.py``),
    expecting L1."""
    if path:
        return load_scenario(path)
    topo = Topology(nodes, rpn)
    return Scenario(f"{nodes}x{rpn}-fsdp1-repair", topo, _workload("fsdp1-hybrid"), (_trigger(topo, "fsdp1-hybrid", "boundary"),),
                    expect="L1")


def as_recorded(cfg: Config, traces: dict[int, RankTrace], abst: Abstraction) -> dict[int, RankTrace]:
    """Projected records (the model's F and tau) as the engine records them: the real committed step
    that ``abst`` maps onto each (the inverse of :meth:`Abstraction.step`)."""
    out = {}
    for r, tr in traces.items():
        recs = []
        for rec in tr.records:
            base = abst.bases.get(rec.gen)
            state = dict(rec.state)
            if base is not None:
                for k in ("frontier", "tau"):
                    if isinstance(state.get(k), int):
                        state[k] = base + state[k] - cfg.frontier_at(rec.gen)
            recs.append(replace(rec, state=state))
        out[r] = RankTrace(r, recs, tr.header, tr.end)
    return out


def _scenario_run(sc, seed: int) -> dict[int, RankTrace]:
    """A model run of ``sc``'s first episode in a random interleaving, written as a real run records it."""
    cfg = model_config(sc)
    script = script_for(sc)
    first = script.faults[0]
    fault = Action(first.action, first.rank, first.arg)
    path = random_run(cfg, random.Random(seed), episodes=1, faults=[fault])
    return as_recorded(cfg, project(cfg, path), abstraction_for(sc))


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[dict[str, Any], Any]:
    """Wall-clock statistics of ``repeat`` calls of ``fn`` (``cpu_median``: the median CPU time of this
    process, which other jobs on a shared machine do not inflate as much), and its last result."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {**common.stats(times), "cpu_median": common.stats(cpu)["median"]}, out


def run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    try:
        worlds = common.parse_worlds(args.worlds)
    except ValueError as exc:
        print(f"accelpact bench told-nothing: error: {exc}", file=sys.stderr)
        return 2
    if args.repeat < 1 or args.episodes < 1:
        print("accelpact bench told-nothing: error: --repeat and --episodes must be >= 1", file=sys.stderr)
        return 2
    if args.quick:
        worlds, repeat = [(2, 2)], 1
    else:
        repeat = args.repeat
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="accelpact-told-nothing-") as tmp:
        for nodes, rpn in worlds:
            for label, scheduled, episodes in (("random", False, args.episodes), ("rank by rank (baseline)", True, 1)):
                traces = told_nothing_traces(nodes, rpn, episodes, args.seed, scheduled=scheduled)
                folder = Path(tmp) / f"{nodes}x{rpn}-{'scheduled' if scheduled else 'random'}"
                write_dir(traces, folder)
                st, (ok, msg) = _timed(partial(check_dir, folder), repeat)
                if not ok:
                    print(f"accelpact bench told-nothing: {nodes}x{rpn} {label}: rejected a model run:\n{msg}", file=sys.stderr)
                    return 1
                rows.append({"world": f"{nodes}x{rpn}", "ranks": nodes * rpn, "run": label, "episodes": episodes,
                             "records": sum(len(t.records) for t in traces.values()), **st})
                print(f"check-trace {nodes}x{rpn} {label}: {rows[-1]['records']} records, median {st['median']:.3f} s", flush=True)
        sc = repair_scenario(args.scenario, *((2, 2) if args.quick else (4, 4)))
        outcome_st, outcome = _timed(lambda: model_outcomes(sc), 1 if args.quick else repeat)
        traces = _scenario_run(sc, args.seed)
        folder = Path(tmp) / sc.name
        write_dir(traces, folder)
        judge_st, (ok, msg) = _timed(partial(check_run_traces, sc, folder), repeat)
        if not ok:
            print(f"accelpact bench told-nothing: {sc.name}: the traces of a model run were rejected:\n{msg}", file=sys.stderr)
            return 1
    judged = {"scenario": sc.name, "states": outcome.states, "outcome": outcome.outcome_class, "outcomes_s": outcome_st,
              "traces_s": judge_st, "records": sum(len(t.records) for t in traces.values()),
              "judged_s_median": outcome_st["median"] + judge_st["median"]}
    common.print_table("checked told nothing (accelpact check-trace DIR), seconds",
                       ("world", "run", "episodes", "records", "median", "p90", "max", "cpu median"),
                       [(r["world"], r["run"], r["episodes"], r["records"], common.fmt(r["median"], digits=3),
                         common.fmt(r["p90"], digits=3), common.fmt(r["max"], digits=3), common.fmt(r["cpu_median"], digits=3))
                        for r in rows])
    common.print_table(f"{sc.name} judged, seconds",
                       ("part", "states or records", "median", "max", "cpu median"),
                       [("outcome search", outcome.states, *(common.fmt(outcome_st[k], digits=3) for k in ("median", "max", "cpu_median"))),
                        ("traces (scripted and told nothing)", judged["records"],
                         *(common.fmt(judge_st[k], digits=3) for k in ("median", "max", "cpu_median")))])
    top = max((r for r in rows if r["run"] == "random"), key=lambda r: r["ranks"])
    common.write_result(args, "told-nothing",
                        {"worlds": args.worlds, "episodes": args.episodes, "repeat": repeat, "seed": args.seed,
                         "scenario": args.scenario}, {"runs": rows, "scenario": judged},
                        headline={"ranks": top["ranks"], "told_nothing_s_median": top["median"],
                                  "scenario_judged_s_median": judged["judged_s_median"]}, t0=t_start)
    return 0

