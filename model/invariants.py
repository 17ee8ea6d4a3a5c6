"""Safety properties as predicates on one state (spec/properties.md: S1-S12, and W1-W2 for the model itself).

Kept apart from the actions, as in tlaplus/Examples: each invariant returns ``None``
when it holds, or a sentence saying what is wrong.  Edge properties (generation
monotonicity) take the pair of states around one step.  Liveness properties (L1-L3)
are properties of the whole state graph and live in :mod:`accelpact.model.explore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .contract import IN_FLIGHT_PHASES
from .protocol import true_lookup
from .state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    EXIT_REASONS,
    PC_CRASHED,
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
    """S1: all or none, over outcomes.  In no generation g does one rank resume (RankResume from g)
    while another ends in g by a fail-stop exit before g's release was decided.  (A rank that
    exits after the release of g was decided is a failure of generation g+1, as a crash after
    the release is: the job-wide abort then ends every rank, resumed or not.)"""
    resumed: dict[int, int] = {}
    for g, r, *_ in s.resumed:
        resumed.setdefault(g, r)
    for g, r, reason, released in sorted(s.exits):
        if not released and g in resumed:
            return (f"rank {resumed[g]} resumed from generation {g} (L1) while rank {r} exited in generation {g} "
                    f"with reason {reason!r} before its release was decided (L2)")
    return None


def release_quorum(cfg: Config, s: State) -> str | None:
    """S1.2: a rank resumes from generation g only after every rank of W posted its release vote in g."""
    world = set(cfg.world)
    for g, r, *_ in sorted(s.resumed):
        voted = {rr for (gg, rr) in s.store.ready if gg == g}
        if voted != world:
            missing = sorted(world - voted)
            states = ", ".join(f"{m}:{s.ranks[m].pc}" for m in missing)
            return f"rank {r} resumed from generation {g} but rank(s) {missing} never voted in it ({states})"
    return None


def decisions_stable(cfg: Config, before: State, after: State) -> str | None:
    """S2.1: a decision, once written for generation g, never changes: every rank that reads the
    agreement or the release of g reads the same value."""
    for name in ("agree", "release"):
        old, new = getattr(before.store, name), getattr(after.store, name)
        if old is new:
            continue
        for g, v in old:
            now = true_lookup(new, g)
            if now != v:
                return f"the {name} decision of generation {g} changed from {v!r} to {now!r}"
    return None


def agreed_frontier(cfg: Config, s: State) -> str | None:
    """S2.2: every rank that passed phase 3 in generation g reported rank 0's committed F, as rank 0
    posted it in g (without rank 0's post there is nothing the agreement could have compared with)."""
    for g, r, f in sorted(s.agreed):
        posted = [a[2] for a in s.store.arrivals if a[0] == g and a[1] == 0]
        if not posted:
            return f"rank {r} passed agreement in generation {g} with F={f}, but rank 0 never posted its F in generation {g}"
        f0 = posted[0]
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
    """S3: L1 (resume) only at a committed boundary, with passing guards, for a key the envelope
    qualifies for L1.  Judged from the envelope's entries and the guard flags directly, never by
    the contract's ``decide`` (which the protocol itself calls)."""
    for g, r, point, dirty, *_ in sorted(s.resumed):
        if point in IN_FLIGHT_PHASES:
            return f"rank {r} resumed (L1) from generation {g} after a failure in flight ({point})"
        if dirty:
            return f"rank {r} resumed (L1) from generation {g} with a failed guard (outstanding gradients or a busy wrapper)"
        entry = cfg.envelope.lookup(cfg.key(point))
        if entry is None or "L1" not in entry.actions:
            return f"rank {r} resumed (L1) from generation {g} but the envelope does not qualify {cfg.key(point)} for L1"
    return None


def fenced_release(cfg: Config, s: State) -> str | None:
    """S4.2: a rank resumes from generation g only on a release decided in generation g."""
    for g, r, *_ in sorted(s.resumed):
        if true_lookup(s.store.release, g) != DECISION_RELEASE:
            return f"rank {r} resumed from generation {g} but no release was decided in generation {g} (stale decision)"
    return None


def rebind_complete(cfg: Config, s: State) -> str | None:
    """S5: a rank resumes from generation g holding the communicator it must (generation g+1's if
    its group failed in g, its old one otherwise), and every cached reference names that one."""
    for g, r, _p, _d, _ok, rebound_ok in sorted(s.resumed):
        if not rebound_ok:
            rk = s.ranks[r]
            return (f"rank {r} resumed from generation {g} with communicator {rk.comm} and references {list(rk.refs)}: "
                    "a cached reference still names a broken communicator")
    return None


def state_preserved(cfg: Config, s: State) -> str | None:
    """S6: L1 resumes at the agreed F with S_app unchanged and zero replay: a rank training in a
    generation > 0 has tau = F (rank 0's committed frontier) and replayed nothing.  (The L2 half,
    a restart from C replaying F - C, is what the supervisor's step does, not a property.)"""
    for r, rk in enumerate(s.ranks):
        if rk.pc != PC_TRAIN or rk.gen == 0:
            continue
        # a rank of a later episode (its generation failed again) may carry an injected fault
        # (FaultMismatch at that boundary): checked when it resumed, before that failure
        if s.store.failed is not None and s.store.failed[0] == rk.gen:
            continue
        f = _agreed_frontier(cfg, s, rk.gen - 1)  # the frontier agreed in the generation it resumed from
        if rk.tau != f or rk.replayed != 0:
            return f"rank {r} resumed at tau={rk.tau} replaying {rk.replayed} steps; L1 must resume at F={f} with 0"
    return None


def _agreed_frontier(cfg: Config, s: State, g: int) -> int:
    """Rank 0's committed F as it reported it in generation g (F_g if it never did)."""
    posted = [a[2] for a in s.store.arrivals if a[0] == g and a[1] == 0]
    return posted[0] if posted else cfg.frontier_at(g)


def replicas_validated(cfg: Config, s: State) -> str | None:
    """S8: no rank resumes (L1) from a generation in which the replicas of R disagreed: phase 6's
    cross-replica check stands between a corrupt S_app and the release."""
    for g, r, _p, _d, replicas_ok, _rb in sorted(s.resumed):
        if not replicas_ok:
            bad = [m for m, rk in enumerate(s.ranks) if rk.corrupt]
            return f"rank {r} resumed from generation {g} while the replicas of R disagree (corrupt: {bad})"
    return None


# Hot swap (issue 13).  Every predicate below holds trivially without spares (its history is empty).

def spare_state_exact(cfg: Config, s: State) -> str | None:
    """S9: a spare that took a dead rank d's identity resumes (L1) from that generation g holding
    exactly d's S_app at the committed frontier F of g, bit for bit: d's parameter and optimizer
    shard (its replicate group's) at optimizer step F, its replicas' bits (not corrupt), RNG and
    data cursor at F (nothing consumed past it), no gradients (history ``swapped``, recorded by
    RankResume)."""
    if not s.swapped:
        return None
    for g, d, shard, tau, ahead, grads, corrupt in sorted(s.swapped):
        f = _agreed_frontier(cfg, s, g)
        want = cfg.group_of(d)
        if shard != want or tau != f or ahead != 0 or grads or corrupt:
            return (f"the spare that took rank {d}'s identity resumed from generation {g} with shard {shard}, "
                    f"optimizer step {tau}, RNG/cursor {ahead} step(s) past it, gradients {grads}, corrupt {corrupt}; "
                    f"rank {d}'s state at F={f} is shard {want} at step {f}, RNG/cursor at F, no gradients, its replicas' bits")
    return None


def one_holder(cfg: Config, s: State) -> str | None:
    """S10: no identity is held by two live processes: a process deposed from a rank's identity (a
    spare took it) never acts as that rank again while the rank's seat is alive -- a late-waking
    "dead" rank is fenced out by the identity's incarnation before it does anything."""
    if not s.deposed:
        return None
    for g, d, inc, awake in sorted(s.deposed):
        rk = s.ranks[d]
        if awake and rk.pc not in (PC_EXITED, PC_CRASHED, PC_RESTARTED):
            return (f"rank {d}'s identity is held by two live processes: incarnation {rk.inc} ({rk.pc}) and the "
                    f"deposed incarnation {inc} (deposed in generation {g}), which woke and was not fenced out")
    return None


def discard_leaves_no_trace(cfg: Config, s: State) -> str | None:
    """S11: a discarded step leaves no trace: a live rank that discarded its uncommitted step in
    generation g (history ``discarded``) holds, while still in g, no gradients (wrapper idle), RNG and
    data cursor at the committed frontier, and no optimizer update past it (tau = its F)."""
    if not s.discarded:
        return None
    for g, r in sorted(s.discarded):
        rk = s.ranks[r]
        if rk.gen != g or rk.pc in (PC_EXITED, PC_CRASHED, PC_RESTARTED):
            continue
        if rk.grads or rk.ahead != 0 or rk.tau != rk.frontier:
            return (f"rank {r} discarded its uncommitted step in generation {g} but still holds gradients {rk.grads}, "
                    f"RNG/cursor {rk.ahead} step(s) past F={rk.frontier}, optimizer step {rk.tau}")
    return None


def swap_qualified(cfg: Config, s: State) -> str | None:
    """S12: a death in training without a spare left or without a live replica is L2: no rank
    resumes (L1) from a generation g in which a rank d died unless a spare received d's state from a
    replica of d (a member of its replicate group; history ``transfers``), and the identities handed
    to spares never outnumber ``Config.spares``."""
    if not s.store.dead:
        return None
    if len(s.store.claims) > cfg.spares:
        return f"{len(s.store.claims)} identities were handed to spares but the job has {cfg.spares} spare(s)"
    for g, r, *_ in sorted(s.resumed):
        for gd, d in sorted(s.store.dead):
            if gd == g and (g, d, True) not in s.transfers:
                how = "from a rank that is not its replica" if (g, d, False) in s.transfers else "from nowhere"
                return (f"rank {r} resumed (L1) from generation {g} in which rank {d} died, but rank {d}'s state reached "
                        f"its spare {how}: no live replica, so this must be L2")
    return None


def exit_reasons(cfg: Config, s: State) -> str | None:
    """W2 (well-formedness of the model, not a protocol property): every exit carries one of the
    documented reasons."""
    for r, rk in enumerate(s.ranks):
        if rk.pc == PC_EXITED and rk.reason not in EXIT_REASONS:
            return f"rank {r} exited with undocumented reason {rk.reason!r}"
    return None


def generation_monotonic(cfg: Config, before: State, after: State) -> str | None:
    """W1 (well-formedness of the model, not a protocol property): no rank's generation decreases."""
    if before.ranks is after.ranks:
        return None
    for r, (a, b) in enumerate(zip(before.ranks, after.ranks, strict=True)):
        if b.gen < a.gen:
            return f"rank {r}'s generation went from {a.gen} back to {b.gen}"
    return None


#: The safety properties (spec/properties.md): each has a named mutant that breaks it (model/mutants.py).
INVARIANTS: tuple[Invariant, ...] = (
    Invariant("S1", "NoSplitBrain", no_split_brain),
    Invariant("S1.2", "ReleaseQuorum", release_quorum),
    Invariant("S2.2", "AgreedFrontier", agreed_frontier),
    Invariant("S2.3", "AgreementQuorum", agreement_quorum),
    Invariant("S3", "L1OnlyQualified", l1_only_qualified),
    Invariant("S4.2", "FencedRelease", fenced_release),
    Invariant("S5", "RebindComplete", rebind_complete),
    Invariant("S6", "StatePreserved", state_preserved),
    Invariant("S8", "ReplicasValidated", replicas_validated),
    # hot swap (issue 13).  S12 before S9: a swap without a live replica is first a wrong decision
    # (the first resume from that generation breaks S12; the spare's own resume breaks S9 too)
    Invariant("S12", "SwapNeedsReplica", swap_qualified),
    Invariant("S9", "SpareStateExact", spare_state_exact),
    Invariant("S10", "OneHolder", one_holder),
    Invariant("S11", "DiscardLeavesNoTrace", discard_leaves_no_trace),
    # model well-formedness: checked on every state, but true of the encoding, not of the protocol
    Invariant("W2", "ExitReasons", exit_reasons),
)

EDGE_INVARIANTS: tuple[EdgeInvariant, ...] = (
    EdgeInvariant("S2.1", "DecisionsStable", decisions_stable),
    EdgeInvariant("W1", "GenerationMonotonic", generation_monotonic),
)

#: ids of the safety properties proper (each must have a mutant that breaks it)
SAFETY_PROPERTIES = tuple(i.id for i in INVARIANTS + EDGE_INVARIANTS if i.id.startswith("S"))


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
