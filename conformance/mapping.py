"""A scenario mapped onto the model (spec/scenario-format.md "Mapping onto the model", F2 and F3).

:func:`model_config` is the model instance of a scenario (world, R, F, C, group, profile, fault
budget); :func:`script_for` translates each scenario fault into the model ``Fault*`` actions it
stands for, each allowed only in its episode's generation and in its pc window (:data:`WINDOWS`,
narrowed per kind by :attr:`accelpact.model.faults.FaultKind.windows`).  The failing group R is
computed in one place, :func:`failing_group`, through :meth:`Topology.group`.

The script filters successors; the model itself is unchanged.  Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.faults import IN_FLIGHT, KINDS
from ..impl.runtime.wrappers import wrapper
from ..model.contract import DISCARD_PHASES, without_discard
from ..model.protocol import Action
from ..model.state import (
    PC_AGREED,
    PC_ARRIVED,
    PC_GUARDED,
    PC_OBSERVED,
    PC_READY,
    PC_REBOUND,
    PC_REPLACED,
    PC_TRAIN,
    PC_VALIDATED,
    STEP_ORDER,
    Config,
    State,
)
from .scenario import Scenario

__all__ = ["KIND_WINDOWS", "WINDOWS", "Script", "ScriptedFault", "failing_group", "model_config", "script_for", "surfaces"]

#: pcs in which a recovery-phase fault may strike a rank, per point, for (member of R, non-member).
WINDOWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "boundary": ((PC_TRAIN,), (PC_TRAIN,)),
    "guard": ((PC_OBSERVED,), (PC_OBSERVED,)),
    "agree": ((PC_GUARDED, PC_ARRIVED), (PC_GUARDED, PC_ARRIVED)),
    "replace": ((PC_AGREED,), (PC_AGREED,)),
    "rebind": ((PC_REPLACED,), (PC_REPLACED,)),
    "validate": ((PC_REBOUND,), (PC_REPLACED,)),
    "release": ((PC_VALIDATED, PC_READY), (PC_REPLACED, PC_READY)),
}
#: Narrower windows for the kinds whose model action is enabled only in some pcs (the kind table's).
KIND_WINDOWS: dict[str, tuple[str, ...]] = {k: fk.windows for k, fk in KINDS.items() if fk.windows is not None}


def surfaces(point: str | None) -> tuple[str | None, ...]:
    """Where a failure injected at ``point`` can be observed: an in-flight failure surfaces at the
    next collective on R, which may lie in a later in-flight phase (a group broken in forward is
    typically noticed by the backward all-reduce); a boundary failure at the boundary."""
    if point in IN_FLIGHT:
        return IN_FLIGHT[IN_FLIGHT.index(point):]
    return (point,)


@dataclass(frozen=True, slots=True)
class ScriptedFault:
    """One model fault action the script allows: its action, rank, generation and pc window."""

    action: str            # FaultGroupFail | FaultCrash | ...
    rank: int | None       # None for FaultGroupFail and job-wide faults
    arg: str | None        # the point: FaultGroupFail's; a death in training's (FaultCrash with spares); None: any
    gen: int               # the episode (generation) it belongs to
    pcs: tuple[str, ...]   # the rank's pc must be one of these
    by: int | None = None  # a job-wide fault (no actor, e.g. FaultStoreLoss): the rank that triggers it, whose pc counts


@dataclass(frozen=True, slots=True)
class Script:
    """Which Fault* actions may fire where; each fires at most once (counted per state)."""

    faults: tuple[ScriptedFault, ...]

    def allowed(self, s: State, a: Action, fired: frozenset[int]) -> int | None:
        """Index of the scripted fault that action ``a`` fires in state ``s``, or None if not allowed."""
        for i, f in enumerate(self.faults):
            if i in fired or f.action != a.name:
                continue
            if f.action == "FaultGroupFail":
                # rank: None when one group fails per job (failing="one"), else the failing group's
                # representative, the action's actor
                # where it struck; where each rank observes it is the model's (Config.observable)
                if a.arg == f.arg and max(rk.gen for rk in s.ranks) == f.gen and f.rank == a.rank:
                    return i
                continue
            if f.by is not None:  # job-wide: the action has no actor; the triggering rank's window counts
                rk = s.ranks[f.by]
                if a.rank is None and rk.gen == f.gen and rk.pc in f.pcs:
                    return i
                continue
            if f.rank is None or f.rank != a.rank or (f.arg is not None and f.arg != a.arg):
                continue
            rk = s.ranks[f.rank]
            if rk.gen == f.gen and rk.pc in f.pcs:
                return i
        return None


def failing_group(sc: Scenario) -> tuple[int, ...]:
    """R of the first episode: the members of the groups (of the wrapper's kind) whose collective fails."""
    return tuple(sorted(sc.episode_members(sc.episode_steps[0])))


def failing_mode(sc: Scenario) -> str:
    """``one`` when every episode fails the same single group (the classic model instance, R fixed
    per job), else ``any`` (which groups fail is part of each episode; several may fail at once)."""
    if _links(sc):
        return "any"  # a link cut fails whichever groups cross it (Config.links needs "any")
    per_episode = {sc.episode_groups(s) for s in sc.episode_steps}
    return "one" if len(per_episode) == 1 and len(next(iter(per_episode))) == 1 else "any"


def _links(sc: Scenario) -> bool:
    return any(KINDS[f.kind].pair for f in sc.faults)


def model_config(sc: Scenario, **contract: Any) -> Config:
    """The model instance of a scenario (see module doc; spec/scenario-format.md "Mapping").  A
    trigger ``exception`` in forward or backward is the application's own error, which a rerun
    would raise again: the engine discards only communicator failures (P17), so the model's
    envelope has no discard there (``contract.without_discard``).  ``contract``: the ``platform``
    and ``envelope`` the engine decided with (the trace headers', ``checker.engine_contract``;
    none given: the model's defaults)."""
    cfg = _model_config(sc).with_(**contract)
    if any(f.is_trigger and f.kind == "exception" and f.at in DISCARD_PHASES for f in sc.faults):
        cfg = cfg.with_(envelope=without_discard(cfg.envelope, "an application exception is not discarded"))
    return cfg


def _model_config(sc: Scenario) -> Config:
    return Config(
        nodes=sc.topology.nodes,
        ranks_per_node=sc.topology.ranks_per_node,
        affected_local=next(iter(sc.episode_groups(sc.episode_steps[0])), 0) if sc.group == "replicate" else 0,
        group=sc.group,
        failing=failing_mode(sc),
        # a link cut whose break no collective crossed in its episode is met later, by the first flag,
        # save or fence that crosses it: one more unit of the model's budget per cut (P18.3)
        max_faults=len(script_for(sc).faults) + sum(1 for f in sc.faults if KINDS[f.kind].pair),
        frontier=sc.frontier,
        checkpoint=sc.checkpoint,
        profile=sc.workload.wrapper,
        uses_r=uses_r(sc),
        spares=sc.topology.spares,
        links=_links(sc),
        fence=True,  # the conformance worker attaches with rebuild=: it discards in place behind the commit fence (P17.2)
    )


def uses_r(sc: Scenario) -> tuple[str, ...]:
    """Where the scenario's job runs collectives on R: its wrapper's points, plus every point where
    a trigger ``exception`` is raised (an exception raised there is a failure seen there, as a
    sharded optimizer's own collective on R would be)."""
    raised = {f.at for f in sc.faults if f.is_trigger and f.kind == "exception"}
    return tuple(q for q in STEP_ORDER if q in wrapper(sc.workload.wrapper).uses_r or q in raised)


def script_for(sc: Scenario) -> Script:
    """Translate each scenario fault into the model fault actions it stands for."""
    episodes = {s: g for g, s in enumerate(sc.episode_steps)}
    out: list[ScriptedFault] = []
    groups = sc.topology.groups_of_kind(sc.group)
    for g, s in enumerate(sc.episode_steps):
        if sc.topology.spares and not any(f.is_failure for f in sc.faults if f.step == s):
            continue  # with spares, a crash starts its episode itself (FaultCrash, P16.0): no group failure
        cuts = [f for f in sc.faults if f.step == s and f.is_trigger and KINDS[f.kind].pair]
        for f in cuts:  # a physical link: its own model fault (P18.2), acted by its lower end
            out.append(ScriptedFault("FaultLinkCut", f.ranks[0], f"{f.ranks[1]}@{f.at}", g, (PC_TRAIN,)))
        if cuts:
            continue
        if failing_mode(sc) == "one":
            out.append(ScriptedFault("FaultGroupFail", None, sc.trigger_point(s), g, ()))
        else:  # one FaultGroupFail per failing group, acted by its representative (its first rank)
            out.extend(ScriptedFault("FaultGroupFail", groups[gi][0], sc.trigger_point(s), g, ()) for gi in sc.episode_groups(s))
    for f in sc.faults:
        if f.is_failure or (f.is_trigger and KINDS[f.kind].pair):
            continue  # the group failure or the link cut itself (above)
        g = episodes[f.step]
        members = sc.episode_members(f.step)
        for r in f.targets(sc.topology.world):
            if f.at in IN_FLIGHT:
                pcs: tuple[str, ...] = (PC_TRAIN,)
            elif f.kind in KIND_WINDOWS:
                pcs = KIND_WINDOWS[f.kind]
            else:
                pcs = WINDOWS[f.at][0 if r in members else 1]
            # a death in training with spares (FaultCrash(rank, point)) strikes at the scenario's point
            # of the step, not at any: a crash at the boundary is not one inside optimizer.step()
            point = f.at if KINDS[f.kind].action == "FaultCrash" and sc.topology.spares and f.at in STEP_ORDER else None
            if KINDS[f.kind].job_wide:
                out.append(ScriptedFault(f.action, None, None, g, pcs, by=r))
            else:
                out.append(ScriptedFault(f.action, r, point, g, pcs))
    return Script(tuple(out))


#: How the model sees a silent partition of a rank (scenario kind ``partition``, issue 28): as a crash
#: of the partitioned rank (``FaultCrash``), in stop's pc windows.  Its peers meet silence on every
#: connection, the store's included, with no reset; its heartbeats stop reaching the store and they
#: see it take no further protocol step: their failure detectors declare it dead (``RankSuspect``) as
#: they would a stopped or crashed process, and with a spare idle it is deposed and swapped.  What the
#: model leaves out: the partitioned process still runs; once healed it would wake into a generation
#: that went on without it and be fenced (the hot swap's ``RankFenced``), which a scenario's partition
#: (never healed: the run ends first) does not reach.  The mapping itself is the kind table's entry
#: (``KINDS["partition"].action``), read by :func:`script_for` like every kind's; this names it.
PARTITION_ACTION = KINDS["partition"].action
