"""``accelpact check-trace DIR``: check recorded traces against the model (conformance/checker.py).

Uses the run folder's job file (``DIR/job.json``, written by the launcher; read with
:func:`accelpact.impl.launch.job.load_job`) for the model configuration and fault script when it names
faults, or a scenario file given with ``--scenario``; else the trace headers.  Exit 0 when
accepted, 1 when rejected, 2 when the files are unusable.  No torch import.
"""

from __future__ import annotations

from .checker import check_told_nothing, requested_shrink_verdict, requested_shrinks
from .runner import check_run_traces
from .scenario import load_scenario, scenario_from_job
from ..impl.launch.job import FieldError, load_job
from ..impl.rundir import RunDir
from ..impl.trace import RankTrace, TraceError, load_traces, parse_trace


def add_arguments(parser) -> None:
    parser.add_argument("dir", help="run folder with trace-a<attempt>-r<rank>.ndjson files")
    parser.add_argument("--scenario", default=None, help="scenario JSON (default: the run folder's job.json when it has faults)")


def check_dir(path, scenario: str | None = None) -> tuple[bool, str]:
    """What ``accelpact check-trace DIR`` decides and prints: (accepted, message).  The scenario file
    ``scenario`` (else the run folder's job file when it names faults) gives the configuration and the
    fault script; a run told nothing is checked attempt by attempt against the configuration its trace
    headers give, any fault the model has allowed to strike unlogged.  :class:`TraceError` when the
    files are unusable."""
    run_dir = RunDir(path)
    try:
        return _check_dir(run_dir, scenario)
    except TraceError as exc:
        # a requested shrink whose leaving rank's process ended ('left') and whose identity a spare took
        # in a grow cannot be joined per identity (load_traces): the run is outside the model anyway
        by_attempt: dict[int, list] = {}
        for (attempt, _rank), tr in _each_file(run_dir):
            by_attempt.setdefault(attempt, []).extend(requested_shrinks({tr.rank: tr}))
        if not any(by_attempt.values()):
            raise
        return False, "\n".join(f"attempt {a}: {requested_shrink_verdict(asked, str(exc)).message}"
                                for a, asked in sorted(by_attempt.items()) if asked)


def _each_file(run_dir: RunDir) -> list[tuple[tuple[int, int], RankTrace]]:
    """Every trace file of the run parsed alone, the spares' too (those that parse)."""
    files = list(run_dir.trace_files().items())
    files += [(key, p) for key, spares in run_dir.spare_trace_files().items() for p in spares.values()]
    out = []
    for key, p in files:
        try:
            text = p.read_text()
            out.append((key, parse_trace(text.splitlines(), str(p), complete=text.endswith("\n"))))
        except (OSError, TraceError):
            continue
    return out


def _check_dir(run_dir: RunDir, scenario: str | None) -> tuple[bool, str]:
    sc = None
    try:
        if scenario:
            sc = load_scenario(scenario)
        elif run_dir.job.exists():
            job = load_job(run_dir.job)
            if job.faults:
                sc = scenario_from_job(job, source=str(run_dir.job))
    except FieldError as exc:  # ScenarioError, JobError
        print(f"check-trace: cannot use the scenario: {exc}; falling back to the trace headers")
        sc = None
    if sc is not None:
        return check_run_traces(sc, run_dir.path)
    ok, msgs = True, []
    # a run whose faults nobody told the checker (a user's job, faults from outside): any
    # fault the model has may have struck unlogged, within each episode's budget inferred from its
    # records (checker.check_told_nothing); every attempt of a torchrun restart is checked
    for attempt, traces in sorted(load_traces(run_dir.path).items()):
        v = check_told_nothing(traces)
        ok = ok and v.accepted
        msgs.append(f"attempt {attempt}: {v.message}")
    return ok, "\n".join(msgs)


def run(args) -> int:
    try:
        ok, msg = check_dir(args.dir, args.scenario)
    except TraceError as exc:
        print(f"check-trace: {exc}")
        return 2
    print(msg)
    return 0 if ok else 1
