"""``accelpact run-scenario FILE.json``: run one scenario for real and judge it (conformance/runner.py).

Exit 0 only when the run conforms (all three oracles); 1 when it does not; 2 when the scenario is
malformed or the backend cannot run here.  With ``--json`` the last line of output is one JSON
object (scenario, outcome, conforms, replayed_steps, bit_identical, phases_s, ...).
No torch import at module level.
"""

from __future__ import annotations

import json

from . import runner
from .scenario import ScenarioError, load_scenario
from ..testing.seeded import SEEDED_BUGS
from ..impl.runtime.backends import BACKEND_NAMES, backend


def add_arguments(parser) -> None:
    parser.add_argument("file", help="scenario JSON file (spec/scenario-format.md)")
    parser.add_argument("--backend", default="gloo", choices=BACKEND_NAMES)
    parser.add_argument("--out", default=None, help="folder for results and traces (default /tmp/accelpact-conformance/<name>)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--deadline", type=float, default=8.0, help="protocol wait deadline in seconds (default 8)")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on each launch in seconds (default 300)")
    parser.add_argument("--seeded-bug", default=None, choices=SEEDED_BUGS,
                        help="run a deliberately broken engine (the job's seeded_bug; test-only)")


def run(args) -> int:
    try:
        sc = load_scenario(args.file)
    except ScenarioError as exc:
        print(f"run-scenario: {exc}")
        return 2
    why = backend(args.backend).unavailable(sc.topology.world)
    if why:
        print(f"run-scenario: {why}; use --backend gloo")
        return 2
    rep = runner.run_scenario(sc, backend=args.backend, out=args.out, deadline_s=args.deadline, timeout_s=args.timeout,
                       seeded_bug=args.seeded_bug)
    print(rep.summary())
    if args.json:
        print(json.dumps(rep.to_json()))
    return 0 if rep.conforms else 1
