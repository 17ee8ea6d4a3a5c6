"""``accelpact bench hunt``: hypothesis' worth, measured: for every mutant of the table
(``model/mutants.py``), how many random runs of the state machine (``model/stateful.py``) it takes
to catch it, in a 2x2 and a 4x4 world, against exhaustive search's time on the mutant's fast
manifest configuration (``tests/test_model_mutants.py`` ``CAUGHT_ON_MANIFEST``, repeated here).

Each (mutant, world) hunt runs until the first failing run, or until ``--max-runs`` runs or
``--budget`` seconds, whichever comes first ("not caught" then).  Runs are derandomized hypothesis
draws, so a row's run count is reproducible.  Times are measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import time

from accelpact.model.mutants import MUTANTS
from accelpact.model.state import Config
from .common import meta
from accelpact.model.stateful import make_machine

#: the worlds hunted in: (nodes, ranks per node)
WORLDS = ((2, 2), (4, 4))
#: mutants of the hot swap: hunted with two spares in the world
SWAP = frozenset({"transfer-from-stale-replica", "no-identity-fence", "keep-partial-grads", "discard-keeps-cursor",
                  "swap-without-replica", "transfer-fact-always-replica", "fence-reads-next-generation",
                  "claim-keeps-pool", "double-claim"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mutants", default="", help=f"comma-separated mutants (default all): {', '.join(MUTANTS)}")
    parser.add_argument("--max-runs", type=int, default=2000, help="runs per hunt before giving up (default 2000)")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per hunt before giving up (default 30)")
    parser.add_argument("--steps", type=int, default=100, help="steps per run (default 100)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write one JSON object to PATH")


def hunt(name: str, nodes: int, rpn: int, *, max_runs: int, budget_s: float, steps: int) -> dict:
    """Runs of the state machine until one fails (the mutant caught) or a limit is reached."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.errors import Flaky
    from hypothesis.stateful import run_state_machine_as_test

    cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=min(1, rpn - 1), max_faults=3,
                 spares=2 if name in SWAP else 0, mutant=name)
    base = make_machine(cfg)
    runs = {"n": 0, "over": False}
    t0 = time.monotonic()

    class Counted(base):  # type: ignore[misc, valid-type]  # a subclass of the machine built for cfg
        def __init__(self) -> None:
            if runs["over"] or time.monotonic() - t0 > budget_s:
                runs["over"] = True
                raise TimeoutError("budget")
            runs["n"] += 1
            super().__init__()

    st = settings(max_examples=max_runs, stateful_step_count=steps, database=None, deadline=None,
                  phases=(Phase.generate,), suppress_health_check=list(HealthCheck), derandomize=True)
    caught, why = False, ""
    try:
        run_state_machine_as_test(Counted, settings=st)
    except (AssertionError, Flaky, TimeoutError) as exc:
        if runs["over"]:
            why = f"not caught within {budget_s:.0f} s"
        else:
            # any property failing is a catch (the correct protocol passes every one); whether it is
            # the property the mutant was written against is reported beside it
            msg = str(exc)
            caught, why = True, msg.splitlines()[0][:160]
    else:
        why = f"not caught in {max_runs} runs"
    expect = MUTANTS[name].expect
    named = caught and (any(e in why for e in expect) or (("deadlock" in why or "final state" in why) and "L2" in expect))
    return {"mutant": name, "world": f"{nodes}x{rpn}", "caught": caught, "expected_property": named, "runs": runs["n"],
            "seconds": round(time.monotonic() - t0, 2), "first": why}


def run(args: argparse.Namespace) -> int:
    names = [x.strip() for x in args.mutants.split(",") if x.strip()] or list(MUTANTS)
    bad = [n for n in names if n not in MUTANTS]
    if bad or args.max_runs < 1 or args.budget <= 0:
        print(f"accelpact bench hunt: unknown mutant(s) {bad}; allowed: {', '.join(MUTANTS)}" if bad
              else "accelpact bench hunt: --max-runs must be >= 1 and --budget > 0")
        return 2
    rows = []
    for name in names:
        for nodes, rpn in WORLDS:
            row = hunt(name, nodes, rpn, max_runs=args.max_runs, budget_s=args.budget, steps=args.steps)
            rows.append(row)
            mark = (f"caught after {row['runs']:>5} run(s){'' if row['expected_property'] else ' (another property: ' + row['first'][:60] + ')'}"
                    if row["caught"] else f"{row['first']} ({row['runs']} runs)")
            print(f"{name:<30} {row['world']:<4} {mark}  {row['seconds']:7.2f} s", flush=True)
    caught = sum(r["caught"] for r in rows)
    print(f"caught {caught} of {len(rows)} hunts", flush=True)
    if args.json:
        from pathlib import Path

        doc = {"benchmark": "hunt", "quick": False, "meta": meta(False),
               "config": {"max_runs": args.max_runs, "budget_s": args.budget, "steps": args.steps, "worlds": [f"{n}x{r}" for n, r in WORLDS]},
               "results": rows, "headline": {"caught": caught, "hunts": len(rows)}, "headline_reasons": {}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"json: {args.json}", flush=True)
    return 0
