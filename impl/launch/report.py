"""``accelpact report RUN``: what happened in a run, from its run folder alone (issue 44).

RUN is a run folder (a user's own run with ``trace_dir=``, one run of the demo, a soak's ``OUT/run``) or a
folder of run folders (the demo's ``--out``, a soak's ``--out``): each run folder in it is reported.  From
the traces, the result and steps files (:class:`~accelpact.impl.rundir.RunDir`; the history:
:mod:`.history` and :mod:`.restarts`, which the soak's judge reads too) it prints (rich):

* **faults**: every fault a trace recorded (``Fault*`` records: the test hooks' injected faults; a fault
  from outside the job leaves none, and is seen in the episode it caused);
* **episodes**: each generation with recovery records, or attempt that ended in a restart: its outcome (L1
  repair at the boundary, L1 discard of the step in flight, L1 hot swap, shrink, grow, L2 restart, or a
  failed / split one), what was observed where (the first ``RankObserve``'s point and error, or the
  failure detector's suspicion), the frontier F, the time lost and the committed steps replayed.  Time lost:
  in place, from the fault (the latest injected fault of that generation before the episode began, else its
  first record) to the last ``RankResume``; an L2 restart's, from the last commit before the fault to the
  first commit past it in the next attempt (:func:`accelpact.impl.launch.restarts.restarts`, with its cause);
* **totals** per outcome, and writes the timeline (``RunDir.report_png`` in each run folder, or ``--png``):
  committed steps against time per attempt, episodes as spans by outcome, faults as markers.

Exit 0; 2 when RUN is missing, not a folder, or holds no run (named, with what to pass instead).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..rundir import RunDir
from ..trace import RankTrace, TraceError, load_traces
from .history import Episode, episodes_of, step_times
from .plot import OUTCOMES, episode_timeline
from .restarts import Restart, restarts

__all__ = ["OUTCOME_LABEL", "FaultRow", "ReportError", "RunReport", "add_arguments", "find_runs", "read_run", "run"]

#: how the table names an outcome (impl/launch/history.py's vocabulary)
OUTCOME_LABEL = {"L1": "L1 repair", "discard": "L1 discard", "swap": "L1 swap", "shrink": "shrink", "grow": "grow",
                 "L2": "L2 restart", "failed": "failed", "split": "split"}


class ReportError(ValueError):
    """RUN cannot be reported: the message names the problem and what to pass instead."""


@dataclass
class FaultRow:
    attempt: int
    gen: int
    rank: int
    kind: str           # the record's action (FaultCrash, FaultGroupFail, ...)
    what: str           # its detail: kind, point, step, group, peer
    t_ns: int
    episode: str = ""   # the episode it caused (a{attempt}/g{gen}), if any


@dataclass
class RunReport:
    """One run folder's history (what the table and the timeline show)."""

    path: Path
    world: int
    attempts: int
    episodes: list[Episode]
    faults: list[FaultRow]
    restarts: list[Restart]
    observed: dict[str, str] = field(default_factory=dict)    # episode name -> what was observed where
    replayed: dict[str, int] = field(default_factory=dict)    # episode name -> committed steps replayed
    t0_ns: int = 0
    last_step: int | None = None

    def totals(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for e in self.episodes:
            row = out.setdefault(e.outcome, {"episodes": 0, "lost_s": 0.0, "replayed": 0})
            row["episodes"] += 1
            row["lost_s"] = round(row["lost_s"] + (e.lost_s or 0.0), 3)
            row["replayed"] += self.replayed.get(e.name, 0)
        return out


def find_runs(path: str | Path) -> list[Path]:
    """The run folders under ``path``: itself when it is one, else its sub-folders that are (sorted)."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{p}: no such folder; pass the run's folder (the trace_dir= / --out it ran with)")
    if not p.is_dir():
        raise ReportError(f"{p}: not a folder; pass the run's folder (the trace_dir= / --out it ran with), not a file in it")
    if _is_run(p):
        return [p]
    subs = sorted(q for q in p.iterdir() if q.is_dir() and _is_run(q))
    if subs:
        return subs
    what = "empty" if not any(p.iterdir()) else "holds no run's traces, result or steps files"
    raise ReportError(f"{p}: {what} (not a run folder, nor a folder of them: a run writes its per-rank traces there "
                      f"when accelpact.init has trace_dir=, or ACCELPACT_TRACE_DIR, set; pass that folder)")


def _is_run(p: Path) -> bool:
    run = RunDir(p)
    return bool(run.trace_files() or run.results())


def _world(traces: Mapping[int, Mapping[int, RankTrace]], run: RunDir) -> int:
    heads = [int(tr.header.get("world") or 0) for trs in traces.values() for tr in trs.values()]
    ranks = [r for (_a, r) in run.trace_files()] + [r for (_a, r) in run.results()]
    return max(heads + [r + 1 for r in ranks] + [1])


def _short_error(text: str) -> str:
    """``RuntimeError('[.../pair.cc:553] Connection closed by peer ...')`` -> ``RuntimeError: Connection closed by peer``."""
    m = re.match(r"^(\w+)\((.*)\)$", text.strip(), re.S)
    name, msg = (m.group(1), m.group(2).strip("'\"")) if m else ("", text)
    msg = re.sub(r"^\[[^\]]*\]\s*", "", msg)        # gloo's [file:line] prefix
    msg = re.split(r"(?<=[a-z])\.\s|\s\[", msg)[0]  # the first sentence, without an address
    return (f"{name}: " if name else "") + msg[:70]


def _observed(ep: Episode, recs: list) -> str:
    """What the episode's first record says was observed, and where."""
    recs = sorted(recs, key=lambda r: r.t_ns)
    obs = next((r for r in recs if r.action == "RankObserve"), None)
    sus = next((r for r in recs if r.action == "RankSuspect"), None)
    if sus is not None and (obs is None or sus.t_ns <= obs.t_ns):
        return f"detector: rank {sus.detail.get('suspect')} {sus.detail.get('kind') or 'suspected'} (seen by rank {sus.rank})"
    if obs is not None:
        err = obs.detail.get("error")
        return f"at {obs.state.get('point') or '?'} on rank {obs.rank}" + (f": {_short_error(str(err))}" if err else "")
    if ep.point == "(unrecorded)":
        codes = sorted({str(c) for c in ep.exit_codes.values()})
        return f"no record (exit codes {', '.join(codes)})"
    first = recs[0] if recs else None
    return f"{first.action} on rank {first.rank}" if first is not None else ep.point


def read_run(path: str | Path) -> RunReport:
    """The history of the run folder ``path`` (module doc)."""
    path = Path(path)
    run = RunDir(path)
    try:
        traces = load_traces(path) if run.trace_files() else {}
    except TraceError as exc:
        raise ReportError(f"{path}: its traces cannot be read: {exc}") from None
    world = _world(traces, run)
    try:
        eps = episodes_of(path, world, traces)
    except (TraceError, ValueError, KeyError) as exc:
        raise ReportError(f"{path}: its records do not make a history ({type(exc).__name__}: {exc})") from None
    faults = [FaultRow(a, rec.gen, r, rec.action, ", ".join(f"{k} {v}" for k, v in rec.detail.items() if k != "kind")
                       + (f" ({rec.detail['kind']})" if rec.detail.get("kind") else ""), rec.t_ns)
              for a, trs in sorted(traces.items()) for r, tr in sorted(trs.items()) for rec in tr.records
              if rec.action.startswith("Fault")]
    faults.sort(key=lambda f: f.t_ns)
    rs = restarts(path, world, traces=traces)
    of = {x.attempt: x for x in rs}
    rep = RunReport(path, world, len({a for a, _ in run.results()} | set(traces)), eps, faults, rs)
    for e in eps:
        recs = [rec for tr in traces.get(e.attempt, {}).values() for rec in tr.records if rec.gen == e.gen
                and not rec.action.startswith("Fault")]
        rep.observed[e.name] = _observed(e, recs)
        if e.outcome == "discard" and any(rec.action == "SpareJoin" for rec in recs):
            e.outcome = "swap"  # the history calls a swap that discarded the step in flight a discard; a spare joined
        mine = [f for f in faults if f.attempt == e.attempt and f.gen == e.gen and not f.episode]
        for f in mine:
            f.episode = e.name
        if e.outcome == "L2" and e.attempt in of:
            r = of[e.attempt]
            e.cause, e.lost_s = r.cause, r.lost_s
            e.t_end_ns = None if r.t_back is None else int(r.t_back * 1e9)
            rep.replayed[e.name] = r.replayed_steps
        elif e.t_end_ns is not None:
            before = [f.t_ns for f in mine if f.t_ns <= e.t_start_ns + 50_000_000]
            t0 = min(max(before), e.t_start_ns) if before else e.t_start_ns
            e.lost_s = round((e.t_end_ns - t0) / 1e9, 3)
            rep.replayed[e.name] = 0
    starts = [rec.t_ns for trs in traces.values() for tr in trs.values() for rec in tr.records[:1]]
    a, steps_t, last = 0, [], None
    for a in sorted({x for x, _ in run.results()} | set(traces)):
        for rows in step_times(run, a, world).values():
            steps_t += [int(t * 1e9) for t in rows.values()]
            last = max([last or 0, *rows]) if rows else last
    rep.t0_ns = min(starts + steps_t, default=0)
    rep.last_step = last
    return rep


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def print_report(console: Any, rep: RunReport) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]accelpact report[/bold] {escape(str(rep.path))}: {rep.world} ranks, {rep.attempts} attempt(s), "
                  f"{len(rep.episodes)} episode(s), {len(rep.faults)} recorded fault(s)"
                  + (f", last committed step {rep.last_step}" if rep.last_step is not None else ""), highlight=False)
    if rep.faults:
        t = Table(title="faults (as the traces recorded them: injected by the test hooks)")
        for col in ("attempt", "gen", "rank", "fault", "detail", "t (s)", "episode"):
            t.add_column(col)
        for f in rep.faults:
            t.add_row(str(f.attempt), str(f.gen), str(f.rank), f.kind, escape(f.what), f"{(f.t_ns - rep.t0_ns) / 1e9:.2f}",
                      f.episode or "-")
        console.print(t)
    else:
        console.print("faults: none recorded (a fault from outside the job leaves no record; its episode shows it)",
                      highlight=False)
    if not rep.episodes:
        console.print("episodes: none: the run trained without a recovery", highlight=False)
        return
    e_t = Table(title="episodes: time lost = fault (or first record) -> every rank resumed; L2: last commit before "
                      "the fault -> first commit past it")
    for col in ("episode", "outcome", "observed", "F", "faults", "time lost", "replayed", "detail"):
        e_t.add_column(col)
    for e in rep.episodes:
        nf = [f.kind for f in rep.faults if f.episode == e.name]
        detail = "; ".join(x for x in (e.cause, e.note, f"resumed: ranks {e.resumed}" if e.outcome in ("split",) else "",
                                       f"exit codes {sorted({str(c) for c in e.exit_codes.values()})}" if e.exit_codes else "")
                           if x)
        replayed = rep.replayed.get(e.name)
        e_t.add_row(e.name, OUTCOME_LABEL.get(e.outcome, e.outcome), escape(rep.observed.get(e.name, "")),
                    "-" if e.frontier is None else str(e.frontier), ", ".join(sorted(set(nf))) or "-", _s(e.lost_s),
                    "-" if replayed is None else str(replayed)
                    + (" (+ step in flight)" if e.outcome in ("discard", "swap") else ""), escape(detail[:100]))
    console.print(e_t)
    o_t = Table(title="totals")
    for col in ("outcome", "episodes", "time lost", "steps replayed"):
        o_t.add_column(col)
    tot = rep.totals()
    for o in OUTCOMES:
        if o in tot:
            row = tot[o]
            o_t.add_row(OUTCOME_LABEL[o], str(int(row["episodes"])), f"{row['lost_s']:.2f}s", str(int(row["replayed"])))
    console.print(o_t)
    lost = sum(r["lost_s"] for r in tot.values())
    console.print(f"{len(rep.episodes)} episode(s): {lost:.2f}s of training lost, "
                  f"{sum(int(r['replayed']) for r in tot.values())} committed step(s) replayed, "
                  f"{sum(1 for e in rep.episodes if e.outcome == 'L2')} restart(s)", highlight=False)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run folder (trace_dir= / --out), or a folder of them (the demo's, a soak's)")
    p.add_argument("--png", default=None, help="where to write the timeline (one run only; default: "
                                               "report-timeline.png in each run folder)")
    p.add_argument("--json", action="store_true", help="also print the history as JSON (one object per run)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        runs = find_runs(args.run)
        if args.png and len(runs) > 1:
            raise ReportError(f"{args.run} holds {len(runs)} runs; --png names one file: leave it out "
                              "(each run folder gets its own) or name one run")
        reports = [read_run(p) for p in runs]
    except ReportError as exc:
        print(f"accelpact report: {exc}", file=sys.stderr)
        return 2
    for rep in reports:
        print_report(console, rep)
        png = episode_timeline(args.png or RunDir(rep.path).report_png, rep.path, rep.episodes, rep.world, rep.t0_ns,
                               faults=[(f.kind, f.t_ns) for f in rep.faults],
                               title=f"{rep.path.name}: {len(rep.episodes)} episode(s), {len(rep.faults)} recorded fault(s)")
        console.print(f"timeline: {png}" if png else "timeline: not drawn (matplotlib missing: pip install accelpact[plot])",
                      highlight=False)
        if args.json:
            print(json.dumps({"run": str(rep.path), "world": rep.world, "episodes": [e.to_json() for e in rep.episodes],
                              "observed": rep.observed, "replayed": rep.replayed,
                              "faults": [f.__dict__ for f in rep.faults], "restarts": [r.to_json() for r in rep.restarts]},
                             default=str))
    return 0
