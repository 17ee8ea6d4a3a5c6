"""Generate the conformance corpus from the model (spec/scenario-format.md, "Corpus").

The scenario space (topologies x wrappers x fault points x kinds x victim rank) is enumerated,
each candidate is classified by the model's reachable outcome class under its script
(:func:`accelpact.conformance.outcomes.model_outcomes`), and one representative is emitted per
distinct (cell, outcome class), where a cell is (topology, wrapper, point, kind, victim role:
member of R / rank outside R, number of faults).  ``expect.outcome`` is
set from the model whenever the model's outcome is unique.

Deterministic: same model, same files, byte for byte.  ``python -m
accelpact.conformance.generate`` rewrites ``conformance/scenarios/``; ``--check`` exits 1 if the
checked-in corpus differs (``tests/test_scenarios.py`` asserts the same).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ..model.faults import KINDS, RECOVERY_POINTS, Fault
from ..impl.launch.job import Topology, Workload
from ..impl.runtime.wrappers import WRAPPERS
from .outcomes import check_expectation, model_outcomes
from .scenario import Scenario

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
SHORT = {"fsdp1-hybrid": "fsdp1", "fsdp1-zero2": "fsdp1-zero2", "fsdp2-hybrid": "fsdp2", "ddp": "ddp"}
STEP = 5          # F for single-episode scenarios
STEPS = 8
EVERY = 3         # checkpoint_every: C = 3 for F = 5


def _workload(wrapper: str, steps: int = STEPS) -> Workload:
    return Workload(wrapper, 2, steps, 0, EVERY)


#: kinds left out of the every-kind-at-every-point enumeration below, with scenarios of their own:
#: a partition (issue 28) is, to the model and in a run without network namespaces, a stopped rank
#: (accelpact/testing/faults.py ``_partition``), so the enumeration would repeat stop's cells
PARTITION_ONLY_BELOW = ("partition",)

#: R in the generated scenarios is the group of this rank (local index 1: the replicate group without rank 0)
VICTIM = 1


def _trigger(topo: Topology, wrapper: str, at: str, kind: str = "collective_timeout", step: int = STEP) -> Fault:
    """The fault on R that starts a recovery: the replicate group of local index 1 (or W for ddp)."""
    recovers = WRAPPERS[wrapper].recovers
    return Fault(step, at, kind, topo.group(recovers, VICTIM), recovers)


def _role(topo: Topology, wrapper: str, rank: int) -> str:
    return "member" if rank in topo.group(WRAPPERS[wrapper].recovers, VICTIM) else "outside"


def _classic_name(at: str) -> str:
    """A group failure's scenario name by point: the repair at the boundary, a discard in place in
    forward and backward (issue 27), a rejection inside optimizer.step()."""
    return {"boundary": "repair", "optimizer": "reject-optimizer"}.get(at, f"inflight-{at}")


def candidates() -> list[tuple[tuple, Scenario]]:
    """Every candidate scenario with its cell key, in a fixed order."""
    out: list[tuple[tuple, Scenario]] = []
    t22, t42 = Topology(2, 2), Topology(4, 2)

    def add(cell: tuple, name: str, topo: Topology, wrapper: str, faults: list[Fault], steps: int = STEPS) -> None:
        out.append((cell, Scenario(name, topo, _workload(wrapper, steps), tuple(faults))))

    for wrapper in ("fsdp1-hybrid", "fsdp2-hybrid", "ddp"):
        w = SHORT[wrapper]
        # the happy repair, each in-flight discard (P17) and the optimizer's rejection, per wrapper
        for at in ("boundary", "forward", "backward", "optimizer"):
            name = f"2x2-{w}-{_classic_name(at)}"
            # None of the wrappers communicates inside optimizer.step(): a communicator broken
            # there is first observed at the boundary (correctly L1, measured).  The in-flight
            # optimizer failure is an exception raised inside the step (e.g. a failed sharded
            # optimizer collective).
            kind = "exception" if at == "optimizer" else "collective_timeout"
            add(("2x2", wrapper, at, kind, "-", 1), name, t22, wrapper, [_trigger(t22, wrapper, at, kind=kind)])
    wrapper = "fsdp1-hybrid"
    # a fault of each kind at the boundary itself and in each recovery phase, on each rank role
    for at in ("boundary",) + RECOVERY_POINTS:
        for kind in [k for k, fk in KINDS.items() if at in fk.points and not fk.job_wide and k not in PARTITION_ONLY_BELOW]:
            if at == "boundary" and KINDS[kind].failure:
                continue  # these are the group failure itself (the repair scenarios)
            if KINDS[kind].pair:
                continue  # a link's two ends: the link scenarios below
            for rank in (3, 2):  # a member of R (not rank 0) and a rank outside R
                role = _role(t22, wrapper, rank)
                if KINDS[kind].members_only and role != "member":
                    continue
                cell = ("2x2", wrapper, at, kind, role, 2)
                name = f"2x2-fsdp1-{at}-{kind.replace('_', '-')}-r{rank}"
                faults = [_trigger(t22, wrapper, "boundary"), Fault(STEP, at, kind, (rank,), "replicate")]
                add(cell, name, t22, wrapper, faults)
    # the other wrappers: a crash in agreement on a member and a hang in validation
    for wrapper in ("fsdp2-hybrid", "ddp"):
        w = SHORT[wrapper]
        for at, kind in (("agree", "crash"), ("validate", "hang")):
            faults = [_trigger(t22, wrapper, "boundary"), Fault(STEP, at, kind, (3,), _trigger(t22, wrapper, "boundary").group)]
            add(("2x2", wrapper, at, kind, "member", 2), f"2x2-{w}-{at}-{kind}-r3", t22, wrapper, faults)
    # successive faults in one job: two repairs, then a repair followed by a failed one
    wrapper = "fsdp1-hybrid"
    add(("2x2", wrapper, "boundary", "successive", "-", 2), "2x2-fsdp1-successive-repairs", t22, wrapper,
        [_trigger(t22, wrapper, "boundary", step=2), _trigger(t22, wrapper, "boundary", step=5)])
    add(("2x2", wrapper, "boundary", "successive-crash", "-", 3), "2x2-fsdp1-repair-then-crash", t22, wrapper,
        [_trigger(t22, wrapper, "boundary", step=2), _trigger(t22, wrapper, "boundary", step=5),
         Fault(5, "validate", "crash", (3,), "replicate")])
    # several groups in one job: both replicate groups failing at one boundary (one episode, one
    # generation), and repairs alternating between the groups (each episode its own R)
    both = Fault(STEP, "boundary", "collective_timeout", tuple(range(t22.world)), "replicate")
    for hsdp in ("fsdp1-hybrid", "fsdp2-hybrid"):
        w = SHORT[hsdp]
        add(("2x2", hsdp, "boundary", "two-groups", "-", 2), f"2x2-{w}-two-groups-repair", t22, hsdp, [both])
        add(("2x2", hsdp, "boundary", "alternating", "-", 2), f"2x2-{w}-alternating-repairs", t22, hsdp,
            [Fault(3, "boundary", "collective_timeout", t22.group("replicate", 0), "replicate"),
             Fault(6, "boundary", "collective_timeout", t22.group("replicate", 1), "replicate")])
    add(("2x2", "fsdp1-hybrid", "validate", "two-groups-crash", "member", 3), "2x2-fsdp1-two-groups-validate-crash-r3",
        t22, "fsdp1-hybrid", [both, Fault(STEP, "validate", "crash", (3,), "replicate")])
    add(("2x2", "fsdp1-hybrid", "boundary", "two-groups-corrupt", "member", 3), "2x2-fsdp1-two-groups-corrupt-state-r2",
        t22, "fsdp1-hybrid", [both, Fault(STEP, "boundary", "corrupt_state", (2,), "replicate")])
    # where a failure is observed: R broken during the optimizer step (which uses no collective on
    # R) is met by the boundary probe after the commit and repaired (HSDP); DDP too
    for hsdp in ("fsdp1-hybrid", "fsdp2-hybrid", "ddp"):
        add(("2x2", hsdp, "optimizer", "collective_timeout", "-", 1), f"2x2-{SHORT[hsdp]}-optimizer-break-repair", t22, hsdp,
            [_trigger(t22, hsdp, "optimizer")])
    # the store is lost during a recovery (its server process killed): every rank exits, the job
    # restarts on a fresh store; killed by a member of R and by a rank outside it
    for at, rank in (("agree", 0), ("validate", 3)):
        add(("2x2", "fsdp1-hybrid", at, "store_loss", _role(t22, "fsdp1-hybrid", rank), 2),
            f"2x2-fsdp1-{at}-store-loss-r{rank}", t22, "fsdp1-hybrid",
            [_trigger(t22, "fsdp1-hybrid", "boundary"), Fault(STEP, at, "store_loss", (rank,), "replicate")])
    # ten faults in one job: ten successive repairs (DDP keeps the model search small)
    add(("2x2", "ddp", "boundary", "ten", "-", 10), "2x2-ddp-ten-repairs", t22, "ddp",
        [_trigger(t22, "ddp", "boundary", step=s) for s in range(1, 11)], steps=12)
    # hot swap (issue 13): a rank SIGKILLed with spares in the job.  A spare takes its identity, the state
    # comes from a live replica, the step in flight is discarded and rerun (L1), per wrapper and point;
    # L2 when the dead rank's replica died too, or when a second death finds no spare left; FailBench's
    # F2 (ranks r and r+2) with two spares where a replica survives (DDP 3x1)
    for swapped in ("fsdp1-hybrid", "fsdp2-hybrid", "ddp"):
        w = SHORT[swapped]
        topo, prefix = (Topology(2, 1, spares=1), "2x1") if swapped == "ddp" else (Topology(2, 2, spares=1), "2x2")
        group = WRAPPERS[swapped].recovers
        for at in ("forward", "backward", "boundary"):
            add((prefix, swapped, at, "crash-swap", "-", 1), f"{prefix}-{w}-spare1-{at}-crash-r1", topo, swapped,
                [Fault(STEP, at, "crash", (1,), group)])
    add(("2x2", "fsdp1-hybrid", "backward", "crash-swap-no-replica", "-", 2), "2x2-fsdp1-spare2-backward-crash-r1-r3",
        Topology(2, 2, spares=2), "fsdp1-hybrid", [Fault(STEP, "backward", "crash", (1, 3), "replicate")])
    add(("2x2", "fsdp1-hybrid", "backward", "crash-swap-no-spare", "-", 2), "2x2-fsdp1-spare1-backward-crash-r0-r1",
        Topology(2, 2, spares=1), "fsdp1-hybrid", [Fault(STEP, "backward", "crash", (0, 1), "replicate")])
    add(("3x1", "ddp", "backward", "crash-swap-f2", "-", 2), "3x1-ddp-spare2-backward-crash-r0-r2",
        Topology(3, 1, spares=2), "ddp", [Fault(STEP, "backward", "crash", (0, 2), "world")])
    # FSDP1 _HYBRID_SHARD_ZERO2 through each recovery path: the repair at the boundary, the
    # discard in place of a failure in backward (P17), a crash in backward taken over by a spare (hot swap)
    z2 = "fsdp1-zero2"
    for at in ("boundary", "backward"):
        add(("2x2", z2, at, "collective_timeout", "-", 1), f"2x2-{SHORT[z2]}-{_classic_name(at)}", t22, z2,
            [_trigger(t22, z2, at)])
    add(("2x2", z2, "backward", "crash-swap", "-", 1), f"2x2-{SHORT[z2]}-spare1-backward-crash-r1",
        Topology(2, 2, spares=1), z2, [Fault(STEP, "backward", "crash", (1,), WRAPPERS[z2].recovers)])
    # a swapped job meets every later fault the model allows (issue 23): a second swap (the second
    # spare), a repair of a replicate group after the swap, and a second death during the swap's own
    # agreement (no replica of the dead identities' state is left whole: L2)
    t22s2 = Topology(2, 2, spares=2)
    add(("2x2", "fsdp1-hybrid", "backward", "crash-swap-twice", "-", 2), "2x2-fsdp1-spare2-two-swaps", t22s2,
        "fsdp1-hybrid", [Fault(2, "backward", "crash", (1,), "replicate"), Fault(5, "backward", "crash", (2,), "replicate")])
    add(("2x2", "fsdp1-hybrid", "boundary", "crash-swap-then-repair", "-", 2), "2x2-fsdp1-spare1-swap-then-repair",
        Topology(2, 2, spares=1), "fsdp1-hybrid",
        [Fault(2, "backward", "crash", (1,), "replicate"), Fault(5, "boundary", "collective_timeout", (0, 2), "replicate")])
    add(("2x2", "fsdp1-hybrid", "agree", "crash-swap-crash", "-", 2), "2x2-fsdp1-spare2-crash-during-swap", t22s2,
        "fsdp1-hybrid", [Fault(2, "backward", "crash", (1,), "replicate"), Fault(2, "agree", "crash", (2,), "replicate")])
    # issue 25: a rank stopped (SIGSTOP: every thread, its heartbeat too) at the boundary while a spare
    # is idle is deposed (its keeper kills it) and swapped like a dead one
    add(("2x2", "fsdp1-hybrid", "boundary", "stop-swap", "-", 1), "2x2-fsdp1-spare1-boundary-stop-r1",
        Topology(2, 2, spares=1), "fsdp1-hybrid", [Fault(STEP, "boundary", "stop", (1,), "replicate")])
    # issue 25 (P18): a broken link between two nodes fails every group across it.  Within a replicate
    # group (R's and the groups over W) at the boundary and in backward (a discard in place, P17);
    # across no group of R's kind (only the groups over W: the failure flag meets it)
    for wrapper in ("fsdp1-hybrid", "fsdp2-hybrid", "ddp"):
        w = SHORT[wrapper]
        for a, b, at in ((0, 2, "boundary"), (1, 3, "backward")):
            add(("2x2", wrapper, at, "link_cut", f"r{a}-r{b}", 1), f"2x2-{w}-link-r{a}-r{b}-{at}", t22, wrapper,
                [Fault(STEP, at, "link_cut", (a, b), WRAPPERS[wrapper].recovers)])
    add(("2x2", "fsdp1-hybrid", "boundary", "link_cut", "r0-r3", 1), "2x2-fsdp1-link-r0-r3-boundary", t22, "fsdp1-hybrid",
        [Fault(STEP, "boundary", "link_cut", (0, 3), "replicate")])
    # issue 27: two failures in one step: a communicator failure in backward, and a death (no spare) or
    # an exception during the episode that discards it (the model allows L2 only)
    for at, kind in (("agree", "crash"), ("rebind", "exception")):
        add(("2x2", "fsdp1-hybrid", at, f"inflight-{kind}", "r3", 2), f"2x2-fsdp1-inflight-backward-{at}-{kind}-r3", t22,
            "fsdp1-hybrid", [_trigger(t22, "fsdp1-hybrid", "backward"), Fault(STEP, at, kind, (3,), "replicate")])
    # issue 28: a silent partition of a rank (a FaultCrash to the model, as a stopped rank): at the boundary
    # of a member of R without a spare (L2), and with a spare idle (its peers depose it for the spare, L1)
    add(("2x2", "fsdp1-hybrid", "boundary", "partition", "member", 2), "2x2-fsdp1-boundary-partition-r3", t22,
        "fsdp1-hybrid", [_trigger(t22, "fsdp1-hybrid", "boundary"), Fault(STEP, "boundary", "partition", (3,), "replicate")])
    add(("2x2", "fsdp1-hybrid", "boundary", "partition-swap", "-", 1), "2x2-fsdp1-spare1-boundary-partition-r1",
        Topology(2, 2, spares=1), "fsdp1-hybrid", [Fault(STEP, "boundary", "partition", (1,), "replicate")])
    # a few 4x2 cases (symmetric scripts only: the model search is larger there)
    wrapper = "fsdp1-hybrid"
    for at in ("boundary", "forward"):
        name = f"4x2-fsdp1-{_classic_name(at)}"
        add(("4x2", wrapper, at, "collective_timeout", "-", 1), name, t42, wrapper, [_trigger(t42, wrapper, at)])
    return out


def generate(verbose: bool = False) -> dict[str, str]:
    """name -> canonical file text, one representative per (cell, outcome class)."""
    chosen: dict[str, str] = {}
    classes: set[tuple] = set()
    for cell, sc in candidates():
        outcome = model_outcomes(sc)
        problem = check_expectation(sc, outcome)
        if problem:
            raise RuntimeError(f"generate: {problem}")
        key = cell[:4] + (cell[4] if cell[4] != "-" else "", outcome.outcome_class)
        # one representative per cell and outcome class: r0/r1... of the same role collapse
        if key in classes:
            continue
        classes.add(key)
        expect = next(iter(outcome.outcomes)) if len(outcome.outcomes) == 1 else None
        sc = replace(sc, expect=expect)
        chosen[sc.name] = sc.dumps()
        if verbose:
            print(f"{sc.name:44s} {outcome.outcome_class:28s} states={outcome.states}", file=sys.stderr)
    return dict(sorted(chosen.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelpact.conformance.generate", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if conformance/scenarios differs from what the model generates")
    ap.add_argument("--dir", type=Path, default=SCENARIO_DIR, help="corpus directory (default: the package's scenarios/)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    files = generate(args.verbose)
    existing = {p.stem: p.read_text() for p in sorted(args.dir.glob("*.json"))}
    if args.check:
        stale = sorted(set(existing) ^ set(files)) + sorted(n for n in files if n in existing and existing[n] != files[n])
        if stale:
            print(f"corpus out of date in {args.dir}: {stale}; run `python -m accelpact.conformance.generate`", file=sys.stderr)
            return 1
        print(f"corpus up to date: {len(files)} scenarios")
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for name in set(existing) - set(files):
        (args.dir / f"{name}.json").unlink()
    for name, text in files.items():
        (args.dir / f"{name}.json").write_text(text)
    print(f"wrote {len(files)} scenarios to {args.dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
