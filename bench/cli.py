"""``accelpact bench``: dispatch to one benchmark module (``add_arguments``/``run`` like every subcommand).

Modules are imported only when chosen, so a benchmark that needs torch does not slow the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: benchmark name -> module defining add_arguments(parser) and run(args) -> int
REGISTRY: dict[str, str] = {
    "explore": "accelpact.bench.explore",
    "recovery": "accelpact.bench.recovery",
    "check": "accelpact.bench.check",
    "told-nothing": "accelpact.bench.told_nothing",
    "rebind": "accelpact.bench.rebind",
    "validate": "accelpact.bench.validate",
    "transfer": "accelpact.bench.transfer",
    "controlplane": "accelpact.bench.controlplane",
    "leaks": "accelpact.bench.leaks",
    "repair": "accelpact.bench.repair",
    "guard": "accelpact.bench.guard",
    "goodput": "accelpact.bench.goodput",
    "all": "accelpact.bench.all",
    "summary": "accelpact.bench.summary",
    "detect": "accelpact.bench.detect",
    "hunt": "accelpact.bench.hunt",
    "scale": "accelpact.bench.scale",
    "checkpoint": "accelpact.bench.checkpoint",
    "memory": "accelpact.bench.memory",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", help=f"which benchmark: {', '.join(REGISTRY)}")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the benchmark (see: accelpact bench NAME --help)")


def run(args: argparse.Namespace) -> int:
    name = args.benchmark
    if name not in REGISTRY:
        print(f"accelpact bench: unknown benchmark {name!r}; allowed: {', '.join(REGISTRY)}", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(REGISTRY[name])
    except ModuleNotFoundError as exc:
        if exc.name == REGISTRY[name]:
            print(f"accelpact bench: benchmark {name!r} is not available in this build ({exc.name} is missing)", file=sys.stderr)
            return 2
        if exc.name == "torch":
            print(f"accelpact bench: benchmark {name!r} needs torch: pip install torch==2.13.0", file=sys.stderr)
            return 2
        raise
    sub = argparse.ArgumentParser(prog=f"accelpact bench {name}")
    mod.add_arguments(sub)
    return int(mod.run(sub.parse_args(args.rest)) or 0)
