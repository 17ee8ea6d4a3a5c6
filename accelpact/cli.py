"""The ``accelpact`` command line: one subcommand per job, each owned by its package.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``.  Only the chosen
subcommand's module is imported (:data:`COMMANDS`, a table of module names), so ``accelpact explore``
never imports torch and ``accelpact --help`` imports no subcommand at all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "explore": ("accelpact.model.cli", "explore the protocol model exhaustively (bfs) or with hypothesis"),
    "demo": ("accelpact.impl.launch.demo", "run the end-to-end demo: L1 repair and L2 restart under torchrun"),
    "run-scenario": ("accelpact.conformance.cli_run", "run one conformance scenario file against the implementation"),
    "check-trace": ("accelpact.conformance.cli_check", "check recorded traces against the model"),
    "qualify": ("accelpact.conformance.cli_qualify", "run conformance trials per observation key and write an envelope"),
    "soak": ("accelpact.testing.soak.cli", "a long training job under a seeded storm of external faults, judged whole"),
    "bench": ("accelpact.bench.cli", "benchmarks: exploration speed, recovery phase timings, L1 vs L2"),
    "launch": ("accelpact.impl.launch.cli_launch", "torchrun with spares and keepers: launch [torchrun options] --spares N -- script.py"),
    "report": ("accelpact.impl.launch.report", "what happened in a run folder: faults, episodes, time lost, steps replayed, a timeline PNG"),
}
#: subcommands that read their own command line (``run_argv(argv)``): ``launch`` passes torchrun's options on
RAW_ARGV = ("launch",)


def _load(name: str) -> ModuleType | str:
    """Subcommand ``name``'s module, or why it cannot run in this installation (a missing
    ``accelpact`` module or torch).  Any other import error propagates."""
    module = COMMANDS[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("accelpact"):
            return f"subcommand '{name}' is not available in this build ({exc.name} missing)"
        if exc.name == "torch":
            return f"subcommand '{name}' needs torch: pip install torch==2.13.0"
        raise


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand's name and help; with ``command`` (one of :data:`COMMANDS`), that
    subcommand's module is imported and its arguments added (``_module``: the module, or ``_missing``:
    why it cannot run).  Importing nothing else, so that ``build_parser()`` never imports torch."""
    parser = argparse.ArgumentParser(prog="accelpact", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name != command:
            continue
        mod = _load(name)
        if isinstance(mod, str):
            p.set_defaults(_missing=mod)
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            continue
        p.set_defaults(_module=mod)
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv[:1] if a in COMMANDS), None)
    if command in RAW_ARGV:
        raw = _load(command)
        if isinstance(raw, str):
            print(f"accelpact: {raw}", file=sys.stderr)
            return 2
        return int(raw.run_argv(argv[1:]) or 0)
    args = build_parser(command).parse_args(argv)
    if not getattr(args, "command", None):
        build_parser().print_help()
        return 2
    missing = getattr(args, "_missing", None)
    if missing:
        print(f"accelpact: {missing}", file=sys.stderr)
        return 2
    return int(args._module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
