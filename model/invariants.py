"""Safety properties as predicates on one state (spec/properties.md, ids S1-S7).

Kept apart from the actions, as in tlaplus/Examples: each invariant returns ``None``
when it holds, or a sentence saying what is wrong.  Edge properties (generation
monotonicity) take the pair of states around one step.  Liveness properties (L1-L3)
are properties of the whole state graph and live in :mod:`accelpact.model.explore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .contract import decide
from .protocol import true_lookup
from .state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    EXIT_REASONS,
    PC_EXITED,
    PC_RESTARTED,
    PC_TRAIN,
    Config,
    State,
)


@dataclass(frozen=True, slots=True)
class Invariant:
    id: str
    name: str
    check: Callable[[Config, State], str | None]
    doc: str = ""


@dataclass(frozen=True, slots=True)
class EdgeInvariant:
    id: str
    name: str
    check: Callable[[Config, State, State], str | None]
    doc: str = ""


def no_split_brain(cfg: Config, s: State) -> str | None:
    """S1: all or none.  A rank resumes from generation g only if every rank of W completed
    phases 2-6 of g and posted its release vote in g.  (A rank that fails *after* voting is a
    fault of the next generation, like a crash after the release: the job-wide abort then
    ends every rank, resumed or not.)"""
    world = set(cfg.world)
    for g, r, _p, _d in sorted(s.resumed):
        voted = {rr for (gg, rr) in s.store.ready if gg == g}
        if voted != world:
            missing = sorted(world - voted)
            states = ", ".join(f"{m}:{s.ranks[m].pc}" for m in missing)
            return f"rank {r} resumed from generation {g} but rank(s) {missing} never completed recovery in it ({states})"
    return None


def one_decision_per_generation(cfg: Config, s: State) -> str | None:
    """S2.1: the agreement and the release are each decided at most once per generation."""
    for name in ("agree", "release"):
        gens = [g for g, _v in getattr(s.store, name)]
        if len(gens) != len(set(gens)):
            return f"two '{name}' decisions for one generation: {getattr(s.store, name)}"
    return None


def agreed_frontier(cfg: Config, s: State) -> str | None:
    """S2.2: every rank that passed phase 3 in generation g reported rank 0's committed F."""
    for g, r, f in sorted(s.agreed):
        # rank 0's frontier as it reported it in generation g (its current one if it never did)
        posted = [a[2] for a in s.store.arrivals if a[0] == g and a[1] == 0]
        f0 = posted[0] if posted else s.ranks[0].frontier
        if f != f0:
            return f"rank {r} passed agreement in generation {g} with F={f}, but rank 0's committed frontier is F={f0}"
    return None


def agreement_quorum(cfg: Config, s: State) -> str | None:
    """S2.3: a rank passes phase 3 in generation g only after every rank of W posted (F, g) in g
    and the decision written in g is commit."""
    world = set(cfg.world)
    for g, r, _f in sorted(s.agreed):
        posted = {a[1] for a in s.store.arrivals if a[0] == g and a[3] == g}
        if posted != world:
            return f"rank {r} passed agreement in generation {g} but only ranks {sorted(posted)} of {sorted(world)} posted (F, {g})"
        if true_lookup(s.store.agree, g) != DECISION_COMMIT:
            return f"rank {r} passed agreement in generation {g} without a commit decided in generation {g}"
    return None


def l1_only_qualified(cfg: Config, s: State) -> str | None:
    """S3: L1 (resume) only at a committed boundary, with passing guards, for a qualified key."""
    for g, r, point, dirty in sorted(s.resumed):
        d = decide(cfg.envelope, cfg.key(point), guards_ok=not dirty)
        if not d.preserve:
            return f"rank {r} resumed (L1) from generation {g} although the contract says L2: {d.reason}"
    return None


def fenced_release(cfg: Config, s: State) -> str | None:
    """S4.2: a rank resumes from generation g only on a release decided in generation g."""
    for g, r, _p, _d in sorted(s.resumed):
        if true_lookup(s.store.release, g) != DECISION_RELEASE:
            return f"rank {r} resumed from generation {g} but no release was decided in generation {g} (stale decision)"
    return None


def rebind_complete(cfg: Config, s: State) -> str | None:
    """S5: after a release every cached reference of a member of R names the new communicator."""
    for r in cfg.affected:
        rk = s.ranks[r]
        if rk.pc == PC_TRAIN and rk.gen > 0:
            if rk.comm != rk.gen:
                return f"rank {r} resumed in generation {rk.gen} holding communicator of generation {rk.comm}"
            stale = [i for i, ref in enumerate(rk.refs) if ref != rk.gen]
            if stale:
                return f"rank {r} resumed in generation {rk.gen} with reference(s) {stale} still naming generation {[rk.refs[i] for i in stale]}"
    return None


def state_preserved(cfg: Config, s: State) -> str | None:
    """S6: L1 resumes at F with S_app unchanged and zero replay; L2 resumes from C and replays F - C."""
    for r, rk in enumerate(s.ranks):
        # a rank of a later episode (its generation failed again) may carry an injected fault
        # (FaultMismatch at that boundary): checked when it resumed, before that failure
        later_episode = s.store.failed is not None and s.store.failed[0] == rk.gen
        if rk.pc == PC_TRAIN and rk.gen > 0 and not later_episode and (rk.tau != cfg.frontier or rk.replayed != 0):
            return f"rank {r} resumed at tau={rk.tau} replaying {rk.replayed} steps; L1 must resume at F={cfg.frontier} with 0"
        if rk.pc == PC_RESTARTED and (rk.tau != cfg.frontier or rk.replayed != cfg.frontier - cfg.checkpoint):
            return f"rank {r} restarted at tau={rk.tau} replaying {rk.replayed}; L2 must replay F-C={cfg.frontier - cfg.checkpoint}"
    return None


def exit_reasons(cfg: Config, s: State) -> str | None:
    """S7: every exit carries one of the documented reasons."""
    for r, rk in enumerate(s.ranks):
        if rk.pc == PC_EXITED and rk.reason not in EXIT_REASONS:
            return f"rank {r} exited with undocumented reason {rk.reason!r}"
    return None


def generation_monotonic(cfg: Config, before: State, after: State) -> str | None:
    """S4.1: no rank's generation ever decreases."""
    for r, (a, b) in enumerate(zip(before.ranks, after.ranks, strict=True)):
        if b.gen < a.gen:
            return f"rank {r}'s generation went from {a.gen} back to {b.gen}"
    return None


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("S1", "NoSplitBrain", no_split_brain),
    Invariant("S2.1", "OneDecisionPerGeneration", one_decision_per_generation),
    Invariant("S2.2", "AgreedFrontier", agreed_frontier),
    Invariant("S2.3", "AgreementQuorum", agreement_quorum),
    Invariant("S3", "L1OnlyQualified", l1_only_qualified),
    Invariant("S4.2", "FencedRelease", fenced_release),
    Invariant("S5", "RebindComplete", rebind_complete),
    Invariant("S6", "StatePreserved", state_preserved),
    Invariant("S7", "ExitReasons", exit_reasons),
)

EDGE_INVARIANTS: tuple[EdgeInvariant, ...] = (
    EdgeInvariant("S4.1", "GenerationMonotonic", generation_monotonic),
)


def check_state(cfg: Config, s: State) -> list[tuple[Invariant, str]]:
    """All violated invariants of one state, with their messages."""
    out = []
    for inv in INVARIANTS:
        msg = inv.check(cfg, s)
        if msg is not None:
            out.append((inv, msg))
    return out


def check_edge(cfg: Config, before: State, after: State) -> list[tuple[EdgeInvariant, str]]:
    out = []
    for inv in EDGE_INVARIANTS:
        msg = inv.check(cfg, before, after)
        if msg is not None:
            out.append((inv, msg))
    return out
