"""``accelpact explore``: check the protocol model exhaustively (bfs) or by random walks (hypothesis).

Exit status: 0 when every property holds, 1 with a counterexample, 2 for bad flags.
No torch import anywhere here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .mutants import MUTANTS
from .protocol import FAULT_KINDS
from .state import Config
from .explore import MANIFEST_PATH, explore, write_manifest
from .stateful import make_machine

POINTS = ("boundary", "forward", "backward", "optimizer")
USES_R = ("backward", "boundary")   # Config's default: HSDP's gradient all-reduce and the boundary probe


class FlagError(ValueError):
    """A command-line flag has a value outside what it allows."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="nodes in the world (default 2)")
    parser.add_argument("--ranks-per-node", type=int, default=2, help="ranks per node (default 2)")
    parser.add_argument("--max-faults", type=int, default=2, help="fault budget per run (default 2)")
    parser.add_argument("--method", default="bfs", help="bfs (exhaustive, default) or hypothesis (random walks)")
    parser.add_argument("--mutant", default=None, help=f"explore a deliberately broken variant: {', '.join(MUTANTS)}")
    parser.add_argument("--group", default="replicate", help="the affected group R: replicate (HSDP, default) or world (DDP)")
    parser.add_argument("--faults", default="", help=f"comma-separated fault kinds to enable (default all): {','.join(FAULT_KINDS)}")
    parser.add_argument("--points", default="", help=f"comma-separated failure points of FaultGroupFail (default all): {','.join(POINTS)}")
    parser.add_argument("--affected-local", type=int, default=None, help="local index of R's ranks (default 1, or 0 with one rank per node)")
    parser.add_argument("--failing", default="one", help="which groups fail: one (the group of --affected-local, default) or any "
                                                         "(chosen per episode, several at once)")
    parser.add_argument("--uses-r", default="", help="comma-separated points of a step with collectives on R, must include boundary "
                                                    f"(default backward,boundary; DDP buffer broadcasts: forward,backward,boundary): {','.join(POINTS)}")
    parser.add_argument("--advance", type=int, default=1, help="steps trained between two fault episodes (default 1)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="0 (default): the checkpoint C stays fixed; k: C is the last multiple of k at or before the frontier")
    parser.add_argument("--spares", type=int, default=0,
                        help="hot swap: spare processes idle on the control plane, which replace a crashed rank (default 0: none)")
    parser.add_argument("--links", type=_yes_no, nargs="?", const=True, default=False,
                        help="physical links (spec/protocol.md P18): FaultLink cuts the link between two nodes, failing every "
                             "group across it; needs --failing any and two nodes (default off)")
    parser.add_argument("--fence", type=_yes_no, nargs="?", const=True, default=False,
                        help="the commit fence of a job that discards in place (P17.2): a failure in forward or backward is "
                             "observed before any rank commits (default off)")
    parser.add_argument("--shrink", type=_yes_no, nargs="?", const=True, default=False,
                        help="shrink and grow (spec/protocol.md P19): a death with no spare idle takes its replica out and "
                             "keeps the global batch; a grow brings it back (default off)")
    parser.add_argument("--micro-batches", type=int, default=0,
                        help="with --shrink: the micro-batches of a step (default 0: one per replica)")
    parser.add_argument("--refill", type=_yes_no, nargs="?", const=True, default=False,
                        help="a keeper whose worker died starts a fresh spare (P19.4; default off)")
    parser.add_argument("--no-symmetry", action="store_true", help="explore without symmetry reduction")
    parser.add_argument("--workers", type=int, default=1,
                        help="bfs: search processes (1, default; 2: model/engine_parallel.py, the same graph on two cores)")
    parser.add_argument("--continue", dest="keep_going", action="store_true", help="do not stop at the first safety violation")
    parser.add_argument("--max-examples", type=int, default=200, help="hypothesis: runs to try (default 200)")
    parser.add_argument("--steps", type=int, default=100, help="hypothesis: steps per run (default 100)")
    parser.add_argument("--no-shrink", action="store_true", help="hypothesis: report the first failing run as found, without shrinking it")
    parser.add_argument("--update-manifest", action="store_true", help="recompute every configuration in model/manifest.json and rewrite it")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _csv(value: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in value.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad:
        raise FlagError(f"{flag}: unknown value(s) {', '.join(bad)}; allowed: {', '.join(allowed)}")
    return items


def _yes_no(text: str) -> bool:
    """A switch's optional value: ``--links`` alone, or ``--links true|false`` (as the manifest writes it)."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def config_from_args(args: argparse.Namespace) -> Config:
    """Validate the flags and build the Config; raises FlagError naming the flag."""
    if args.method not in ("bfs", "hypothesis"):
        raise FlagError(f"--method: unknown value {args.method!r}; allowed: bfs, hypothesis")
    if args.group not in ("replicate", "world"):
        raise FlagError(f"--group: unknown value {args.group!r}; allowed: replicate, world")
    if args.failing not in ("one", "any"):
        raise FlagError(f"--failing: unknown value {args.failing!r}; allowed: one, any")
    if args.mutant is not None and args.mutant not in MUTANTS:
        raise FlagError(f"--mutant: unknown mutant {args.mutant!r}; allowed: {', '.join(MUTANTS)}")
    for flag, v, lo in (("--nodes", args.nodes, 1), ("--ranks-per-node", args.ranks_per_node, 1), ("--max-faults", args.max_faults, 0),
                        ("--max-examples", args.max_examples, 1), ("--steps", args.steps, 1), ("--advance", args.advance, 0),
                        ("--checkpoint-every", args.checkpoint_every, 0), ("--spares", args.spares, 0),
                        ("--micro-batches", args.micro_batches, 0)):
        if v < lo:
            raise FlagError(f"{flag}: must be >= {lo}, got {v}")
    faults = _csv(args.faults, FAULT_KINDS, "--faults")
    points = _csv(args.points, POINTS, "--points") or POINTS
    uses_r = _csv(args.uses_r, POINTS, "--uses-r") or USES_R
    if "boundary" not in uses_r:
        raise FlagError("--uses-r: must include boundary (the boundary probe is a collective on R)")
    local = args.affected_local
    if local is None:
        local = 1 if args.ranks_per_node > 1 else 0
    if not 0 <= local < args.ranks_per_node:
        raise FlagError(f"--affected-local: must be in [0, {args.ranks_per_node}), got {local}")
    return Config(
        nodes=args.nodes, ranks_per_node=args.ranks_per_node, affected_local=local, group=args.group,
        max_faults=args.max_faults, faults=frozenset(faults), points=points, mutant=args.mutant, failing=args.failing,
        uses_r=uses_r, advance=args.advance, checkpoint_every=args.checkpoint_every, spares=args.spares,
        links=args.links, fence=args.fence, shrink=args.shrink, micro_batches=args.micro_batches, refill=args.refill,
    )


def _describe(cfg: Config) -> str:
    faults = ",".join(sorted(cfg.faults)) or "all"
    groups = f"R={list(cfg.affected)}" if cfg.failing == "one" else "R=any groups, per episode"
    return (f"{cfg.nodes}x{cfg.ranks_per_node} group={cfg.group} {groups} max_faults={cfg.max_faults} "
            f"faults={faults} points={','.join(cfg.points)} uses_r={','.join(cfg.uses_r)} advance={cfg.advance} "
            f"checkpoint_every={cfg.checkpoint_every} spares={cfg.spares}" + (" links" if cfg.links else "")
            + (" fence" if cfg.fence else "") + (f" shrink micro_batches={cfg.total_micro_batches}" if cfg.shrink else "")
            + (" refill" if cfg.refill else "") + f" mutant={cfg.mutant or 'none'}")


def _run_bfs(cfg: Config, args: argparse.Namespace) -> int:
    if args.workers not in (1, 2):
        raise SystemExit(f"--workers: 1 or 2 (the parallel search exchanges states between two workers), got {args.workers}")
    result = explore(cfg, symmetry=not args.no_symmetry, stop_on_violation=not args.keep_going, workers=args.workers)
    if args.json:
        print(json.dumps({"method": "bfs", **result.to_dict()}, indent=2))
        return 0 if result.ok else 1
    rows = [
        ("configuration", _describe(cfg)),
        ("symmetry reduction", "on" if result.symmetry else "off"),
        ("distinct states", f"{result.states:,}"),
        ("transitions", f"{result.transitions:,}"),
        ("graph edges", f"{result.edges:,}"),
        ("depth", str(result.depth)),
        ("invariant checks", f"{result.invariants_checked:,}"),
        ("time", f"{result.seconds:.2f} s"),
    ]
    if result.complete:
        rows += [
            ("sinks / deadlocks / livelocks", f"{result.sinks} / {result.deadlocks} / {result.livelocks}"),
            ("L1 boundary faults recover", _verdict(result.liveness.get("L1"))),
            ("L2 bounded exit", f"{_verdict(result.liveness.get('L2'))}: longest post-abort path {result.exit_bound} steps (bound {result.exit_bound_limit})"),
            ("L3 no deadlock/livelock", _verdict(result.liveness.get("L3"))),
        ]
    else:
        rows.append(("liveness", "not checked: the search stopped at the first safety violation (use --continue)"))
    rows.append(("verdict", "all properties hold" if result.ok else f"VIOLATED: {', '.join(sorted(result.violated()))}"))
    _table(rows)
    for v in result.violations:
        print()
        print(v.format())
    return 0 if result.ok else 1


def _verdict(v: bool | None) -> str:
    return "not checked" if v is None else ("holds" if v else "VIOLATED")


def _table(rows: list[tuple[str, str]]) -> None:
    if sys.stdout.isatty():
        try:
            from rich.console import Console
            from rich.table import Table

            t = Table(show_header=False)
            t.add_column(style="bold")
            t.add_column()
            for k, v in rows:
                t.add_row(k, v)
            Console().print(t)
            return
        except ImportError:  # pragma: no cover - rich is a dependency
            pass
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _run_hypothesis(cfg: Config, args: argparse.Namespace) -> int:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    s = settings(
        derandomize=True, database=None, print_blob=True, deadline=None, max_examples=args.max_examples,
        stateful_step_count=args.steps, suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate) if args.no_shrink else tuple(Phase),
    )
    t0 = time.perf_counter()
    error = None
    try:
        run_state_machine_as_test(make_machine(cfg), settings=s)
    except AssertionError as exc:
        error = str(exc)
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"method": "hypothesis", "config": _describe(cfg), "max_examples": args.max_examples,
                          "steps": args.steps, "seconds": round(seconds, 3), "ok": error is None, "counterexample": error}, indent=2))
    else:
        _table([
            ("configuration", _describe(cfg)),
            ("method", f"hypothesis, {args.max_examples} runs x {args.steps} steps, then a fault-free drain"),
            ("time", f"{seconds:.2f} s"),
            ("verdict", "all properties hold" if error is None else "VIOLATED"),
        ])
        if error:
            print()
            print(error)
    return 0 if error is None else 1


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except (FlagError, ValueError) as exc:
        print(f"accelpact explore: {exc}", file=sys.stderr)
        return 2
    if args.update_manifest:
        data = write_manifest()
        for name, entry in data["configs"].items():
            a, b = entry["symmetry"], entry.get("no_symmetry")
            unreduced = f"{b['states']:>8,}" if b else "  not pinned"
            print(f"{name:<14} states {a['states']:>8,} (no symmetry {unreduced})  edges {a['edges']:>8,}  depth {a['depth']:>3}  exit bound {a['exit_bound']}")
        print(f"wrote {MANIFEST_PATH}")
        return 0
    if args.method == "hypothesis":
        return _run_hypothesis(cfg, args)
    return _run_bfs(cfg, args)
