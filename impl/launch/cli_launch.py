"""``accelpact launch``: torchrun with spares and keepers, under a name that does not move (issue 44).

::

    accelpact launch [TORCHRUN OPTIONS] [--spares K] [--keep] -- SCRIPT.py [ARGS...]
    accelpact launch --standalone --nproc-per-node 5 --spares 1 -- examples/fsdp2_hsdp.py --replicas 2
    accelpact launch --nnodes 2 --nproc-per-node 9 --spares 1 --rdzv-backend c10d ... -- train.py

Everything before ``--`` except ``--spares`` (also spelled ``--spares-per-node``) and ``--keep`` is handed
to torchrun unchanged (``torch.distributed.run``: ``--standalone``, ``--nnodes``, ``--nproc-per-node``,
``--max-restarts``, ``--rdzv-*``, ...).  ``--spares K`` counts per node, as ``--nproc-per-node`` does,
spares included: the last ``K`` processes of *each* node (``LOCAL_RANK >= nproc - K``) are spares, and
the training ranks are numbered node after node (issue 43; README, "Hot swap"; spec/hotswap.md,
"Spares per node").  After ``--`` comes what each rank runs: a ``.py`` script (run with this Python),
``-m MODULE ...``, or any command.

Each process torchrun starts is the keeper (:mod:`accelpact.impl.launch.keeper`, through its internal
entry :mod:`accelpact.impl.launch.keeper_entry`), which runs the command as the rank's worker:
``ACCELPACT_SPARES_PER_NODE=K`` is set for the job (the keeper lays the spares out and gives each worker
its identity and ``ACCELPACT_SPARES``, the job's total, which ``accelpact.init`` reads), and ``--keep``
sets ``ACCELPACT_KEEP=1`` (a job that opted in to micro-batches: a death is posted even with no spare,
README "Shrink and grow").  Without ``--spares`` and ``--keep`` the keeper ``exec``\\ s the command: no
extra process.  ``accelpact launch`` then becomes torchrun (``exec``): its exit status, its signals.

Replaces ``ACCELPACT_SPARES=N torchrun ... -m accelpact.impl.launch.keeper -- python SCRIPT.py`` (and the
older ``-m accelpact.impl.keeper``), which still work for one release on one node and print a
deprecation line.  A malformed ``--spares``, a missing ``--`` or command, or spares that leave no
training rank on a node is an error naming it (exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..runtime.hotswap import SPARES_PER_NODE_ENV  # torch-free

__all__ = ["ENTRY_MODULE", "LaunchUsage", "Plan", "add_arguments", "plan", "run", "run_argv"]

#: the module torchrun runs as each rank: the keeper's internal entry (not a user-facing name)
ENTRY_MODULE = "accelpact.impl.launch.keeper_entry"
KEEP_ENV = "ACCELPACT_KEEP"
USAGE = "accelpact launch [TORCHRUN OPTIONS] [--spares K] [--keep] -- SCRIPT.py [ARGS...]"
#: the option's names: ``--spares-per-node`` says what ``--spares`` means
SPARES_OPTIONS = ("--spares", "--spares-per-node")


class LaunchUsage(ValueError):
    """A command line ``accelpact launch`` cannot run: the message says what to write."""


@dataclass
class Plan:
    """What ``accelpact launch`` runs: ``cmd`` (torchrun) with ``env`` added to the environment."""

    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    spares: int = 0
    torchrun_args: list[str] = field(default_factory=list)
    worker: list[str] = field(default_factory=list)

    def summary(self) -> str:
        who = (f"the last {self.spares} process(es) of each node are spares (--nproc-per-node counts them)" if self.spares
               else "no spares")
        return f"accelpact launch: torchrun {' '.join(self.torchrun_args)}; {who}; each rank runs {' '.join(self.worker)}"


def _option(args: list[str], name: str) -> str | None:
    """The value of torchrun option ``name`` (``--x V`` or ``--x=V``; torchrun also spells it with
    underscores), or None."""
    names = {name, name.replace("-", "_")}
    for i, a in enumerate(args):
        key, eq, value = a.partition("=")
        if key in names:
            if eq:
                return value
            return args[i + 1] if i + 1 < len(args) else None
    return None


def _worker(rest: list[str], python: str) -> list[str]:
    if not rest:
        raise LaunchUsage(f"no command after '--': {USAGE}")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise LaunchUsage("'-m' after '--' names no module: -- -m MODULE [ARGS...]")
        return [python, *rest]
    if rest[0].endswith(".py"):
        return [python, *rest]
    return list(rest)


def plan(argv: Sequence[str], python: str = sys.executable) -> Plan:
    """Read ``accelpact launch``'s command line (module doc) into the torchrun command it runs."""
    argv = list(argv)
    if "--" not in argv:
        raise LaunchUsage(f"put '--' between the launcher's options and what each rank runs: {USAGE} "
                          "(e.g. accelpact launch --standalone --nproc-per-node 5 --spares 1 -- train.py)")
    cut = argv.index("--")
    head, rest = argv[:cut], argv[cut + 1:]
    spares, keep, torchrun_args = 0, False, []
    i = 0
    while i < len(head):
        a = head[i]
        key, eq, value = a.partition("=")
        if key in SPARES_OPTIONS:
            if not eq:
                if i + 1 >= len(head):
                    raise LaunchUsage(f"{key} needs a value: {key} K (K spare processes on each node, K >= 0)")
                value = head[i + 1]
                i += 1
            try:
                spares = int(value)
            except ValueError:
                raise LaunchUsage(f"{key} must be an integer >= 0, got {value!r}") from None
            if spares < 0:
                raise LaunchUsage(f"{key} must be an integer >= 0, got {spares}")
        elif a == "--keep":
            keep = True
        elif a in ("-m", "--module", "--no-python", "--no_python"):
            raise LaunchUsage(f"torchrun's {a} is the launcher's own (each rank runs the keeper): put your "
                              f"command after '--' (-- -m MODULE ..., -- script.py ...)")
        else:
            torchrun_args.append(a)
        i += 1
    nproc = _option(torchrun_args, "--nproc-per-node")
    if spares and nproc is not None and nproc.isdigit() and spares >= int(nproc):
        raise LaunchUsage(f"--spares {spares} leaves no training rank on a node of --nproc-per-node {nproc}: --spares "
                          "counts the spares of each node, and --nproc-per-node every process of a node, spares included")
    worker = _worker(rest, python)
    env: dict[str, str] = {}
    if spares:
        env[SPARES_PER_NODE_ENV] = str(spares)
    if keep:
        env[KEEP_ENV] = "1"
    cmd = [python, "-m", "torch.distributed.run", *torchrun_args, "-m", ENTRY_MODULE, "--", *worker]
    return Plan(cmd, env, spares, torchrun_args, worker)


def _help() -> str:
    return f"""usage: {USAGE}

  accelpact launch --standalone --nproc-per-node 5 --spares 1 -- examples/fsdp2_hsdp.py --replicas 2

Starts torchrun with every rank behind AccelPact's keeper, so a crashed rank is taken over by a spare
instead of restarting the job (README, "Hot swap").

  --spares K   the last K processes of each node are spares (default 0; also --spares-per-node K);
               torchrun's --nproc-per-node counts every process of a node, spares included, and the
               training ranks are numbered node after node (one replica per node by default)
  --keep       keep every rank even without spares (ACCELPACT_KEEP=1: a job that opted in to
               micro-batches shrinks on a death; README, "Shrink and grow")

Every other option before '--' is torchrun's and is passed on unchanged (python -m torch.distributed.run
--help lists them).  After '--': a .py script (run with this Python), -m MODULE, or any command.
"""


def run_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """``accelpact launch ARGV``: print the plan's line, then become torchrun (``exec``); 2 on a bad
    command line, 127 if torchrun cannot be started."""
    argv = list(argv)
    head = argv[:argv.index("--")] if "--" in argv else argv
    if "-h" in head or "--help" in head:
        print(_help())
        return 0
    try:
        p = plan(argv)
    except LaunchUsage as exc:
        print(f"accelpact launch: {exc}", file=sys.stderr)
        return 2
    full = {**(os.environ if env is None else env), **p.env}
    print(p.summary(), file=sys.stderr, flush=True)
    sys.stdout.flush()
    try:
        os.execvpe(p.cmd[0], p.cmd, full)
    except OSError as exc:
        print(f"accelpact launch: cannot run {p.cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``accelpact launch``'s arguments are read by :func:`plan` (torchrun's options pass through), so
    the parser only collects them (``accelpact.cli`` hands this command its argv as given)."""
    parser.usage = USAGE
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="[TORCHRUN OPTIONS] [--spares K] [--keep] -- SCRIPT.py [ARGS...]")


def run(args: argparse.Namespace) -> int:
    return run_argv(list(args.argv))
