"""The ``accelpact`` command line: one subcommand per job, each owned by its package.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported lazily, so ``accelpact explore`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "explore": ("accelpact.model.cli", "explore the protocol model exhaustively (bfs) or with hypothesis"),
    "demo": ("accelpact.impl.launch.demo", "run the end-to-end demo: L1 repair and L2 restart under torchrun"),
    "run-scenario": ("accelpact.conformance.cli_run", "run one conformance scenario file against the implementation"),
    "check-trace": ("accelpact.conformance.cli_check", "check recorded traces against the model"),
    "qualify": ("accelpact.conformance.cli_qualify", "run conformance trials per observation key and write an envelope"),
    "soak": ("accelpact.testing.soak.cli", "a long training job under a seeded storm of external faults, judged whole"),
    "bench": ("accelpact.bench.cli", "benchmarks: exploration speed, recovery phase timings, L1 vs L2"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelpact", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("accelpact"):
                p.set_defaults(_missing=f"subcommand '{name}' is not available in this build ({exc.name} missing)")
                continue
            if exc.name == "torch":
                p.set_defaults(_missing=f"subcommand '{name}' needs torch: pip install torch==2.13.0")
                continue
            raise
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    missing = getattr(args, "_missing", None)
    if missing:
        print(f"accelpact: {missing}", file=sys.stderr)
        return 2
    mod = importlib.import_module(args._module)
    return int(mod.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
