"""``accelpact check-trace DIR``: check recorded traces against the model (conformance/checker.py).

Uses ``DIR/scenario.json`` or ``DIR/job.json`` (written by the runner / launcher) for the model
configuration and fault script when present, else the trace headers.  Exit 0 when accepted, 1 when
rejected, 2 when the files are unusable.  No torch import.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("dir", help="folder with trace-a<attempt>-r<rank>.ndjson files")
    parser.add_argument("--scenario", default=None, help="scenario JSON (default: DIR/job.json when it has one)")


def run(args) -> int:
    from ..impl.trace import TraceError, load_traces
    from .checker import TraceChecker, config_from_headers
    from .runner import check_run_traces
    from .scenario import ScenarioError, load_scenario, scenario_from_mapping

    d = Path(args.dir)
    sc = None
    try:
        if args.scenario:
            sc = load_scenario(args.scenario)
        elif (d / "job.json").exists():
            job = json.loads((d / "job.json").read_text())
            if job.get("faults"):
                sc = scenario_from_mapping({k: job[k] for k in ("topology", "workload", "faults")} | {"name": job.get("scenario", "job")},
                                           source=str(d / "job.json"))
    except (ScenarioError, ValueError, KeyError) as exc:
        print(f"check-trace: cannot use the scenario: {exc}; falling back to the trace headers")
        sc = None
    try:
        if sc is not None:
            ok, msg = check_run_traces(sc, d)
        else:
            ok, msgs = True, []
            for attempt, traces in sorted(load_traces(d).items()):
                v = TraceChecker(config_from_headers(traces), traces).check()
                ok = ok and v.accepted
                msgs.append(f"attempt {attempt}: {v.message}")
            msg = "\n".join(msgs)
    except TraceError as exc:
        print(f"check-trace: {exc}")
        return 2
    print(msg)
    return 0 if ok else 1
