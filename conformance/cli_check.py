"""``accelpact check-trace DIR``: check recorded traces against the model (conformance/checker.py).

Uses the run folder's job file (``DIR/job.json``, written by the launcher; read with
:func:`accelpact.impl.launch.job.load_job`) for the model configuration and fault script when it names
faults, or a scenario file given with ``--scenario``; else the trace headers.  Exit 0 when
accepted, 1 when rejected, 2 when the files are unusable.  No torch import.
"""

from __future__ import annotations

from .checker import TraceChecker, abstraction_from_records, config_from_headers
from .runner import check_run_traces
from .scenario import load_scenario, scenario_from_job
from ..impl.launch.job import FieldError, load_job
from ..impl.rundir import RunDir
from ..impl.trace import TraceError, load_traces


def add_arguments(parser) -> None:
    parser.add_argument("dir", help="run folder with trace-a<attempt>-r<rank>.ndjson files")
    parser.add_argument("--scenario", default=None, help="scenario JSON (default: the run folder's job.json when it has faults)")


def run(args) -> int:
    run_dir = RunDir(args.dir)
    sc = None
    try:
        if args.scenario:
            sc = load_scenario(args.scenario)
        elif run_dir.job.exists():
            job = load_job(run_dir.job)
            if job.faults:
                sc = scenario_from_job(job, source=str(run_dir.job))
    except FieldError as exc:  # ScenarioError, JobError
        print(f"check-trace: cannot use the scenario: {exc}; falling back to the trace headers")
        sc = None
    try:
        if sc is not None:
            ok, msg = check_run_traces(sc, run_dir.path)
        else:
            ok, msgs = True, []
            # a run whose faults nobody told the checker (a user's job, faults from outside): any
            # fault the model has may have struck unlogged, within a budget inferred from the records
            # (checker.count_unlogged_faults); every attempt of a torchrun restart is checked
            for attempt, traces in sorted(load_traces(run_dir.path).items()):
                v = TraceChecker(config_from_headers(traces), traces, silent_faults=True,
                                 abstraction=abstraction_from_records(traces)).check()
                ok = ok and v.accepted
                msgs.append(f"attempt {attempt}: {v.message}")
            msg = "\n".join(msgs)
    except TraceError as exc:
        print(f"check-trace: {exc}")
        return 2
    print(msg)
    return 0 if ok else 1
