"""Safety properties as predicates on one state (spec/properties.md: S1-S21, and W1-W2 for the model
itself), and properties of final states (L4-L6).

Kept apart from the actions, as in tlaplus/Examples: each invariant returns ``None``
when it holds, or a sentence saying what is wrong.

The oracle shares no code with the protocol (issue 24): this module imports from the model only the
state's types and constants (:mod:`accelpact.model.state`; ``tests/test_model_oracle.py`` enforces
it), and every judgement is computed here from plain facts (the store's raw entries, the ranks'
fields, history facts, the envelope's raw entries), never through a helper the actions call
(``true_lookup``, ``_member``, ``_replicas_agree``, ``Envelope.lookup``, ``decide``): a bug in such a
helper cannot then pass both the protocol and its judge.  Edge properties (generation
monotonicity) take the pair of states around one step.  Liveness properties (L1-L3)
are properties of the whole state graph and live in :mod:`accelpact.model.explore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    DEPOSED_ACTING,
    EXIT_REASONS,
    PC_CRASHED,
    PC_EXITED,
    PC_LEFT,
    PC_READY,
    PC_REBOUND,
    PC_RESTARTED,
    PC_TRAIN,
    PC_VALIDATED,
    REASON_MISMATCH,
    SHARD_NONE,
    SHARD_OWN,
    STEP_ORDER,
    Config,
    State,
)

#: the program counters of a seat no live process holds (the oracle's own list)
_GONE = (PC_EXITED, PC_CRASHED, PC_RESTARTED)

#: the points of a step inside it (not at the committed boundary): the oracle's own reading of STEP_ORDER
_IN_FLIGHT = tuple(p for p in STEP_ORDER if p != "boundary")
#: the in-flight points whose step has committed nothing (the optimizer has not run): the oracle's
#: own list, from the step's order (not the contract's ``DISCARD_PHASES``, which the protocol reads)
_DISCARDABLE = STEP_ORDER[:STEP_ORDER.index("optimizer")]


def _out_at(s: State, g: int) -> frozenset[int]:
    """The replicas out of the data-parallel dimension in generation ``g`` (P19), from history alone:
    every replica that left (``shrunk``) in a generation up to g and did not come back (``grown``)
    since; within one generation a grow (which opens it) comes before a shrink."""
    if not s.store.shrunk:
        return frozenset()
    out: set[int] = set()
    for gg, kind, i in sorted([(gg, 0, i) for gg, i in s.store.grown] + [(gg, 1, i) for gg, i in s.store.shrunk]):
        if gg > g:
            break
        if kind:
            out.add(i)
        else:
            out.discard(i)
    return frozenset(out)


def _dp(cfg: Config, s: State, g: int) -> list[int]:
    """The ranks in the data-parallel dimension in generation ``g``: every rank of W whose replica
    is not out (:func:`_out_at`)."""
    out = _out_at(s, g)
    return [r for r in cfg.world if cfg.replica_of(r) not in out]


def _decided(pairs: tuple[tuple[int, str], ...], gen: int) -> str | None:
    """The first value written under generation ``gen`` in a decision key's raw entries (the
    oracle's own reading of the store; not the protocol's ``true_lookup``)."""
    return next((v for g, v in pairs if g == gen), None)


def _qualifies_l1(cfg: Config, phase: str, died: bool = False, spare: bool = False, replica: bool = False) -> bool:
    """Some raw envelope entry has exactly this key (the job's platform, profile, objective; the
    failure phase; the hot-swap facts) and lists L1 (read field by field, not by ``Envelope.lookup``)."""
    for e in cfg.envelope.entries:
        k = e.key
        if (k.platform == cfg.platform and k.profile == cfg.profile and k.phase == phase and k.objective == cfg.objective
                and bool(k.died) == died and bool(k.spare) == spare and bool(k.replica) == replica and "L1" in e.actions):
            return True
    return False


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
    for g, r, *_ in sorted(s.resumed):  # sorted: the rank named does not depend on the set's order
        resumed.setdefault(g, r)
    for g, r, reason, released in sorted(s.exits):
        if not released and g in resumed:
            return (f"rank {resumed[g]} resumed from generation {g} (L1) while rank {r} exited in generation {g} "
                    f"with reason {reason!r} before its release was decided (L2)")
    return None


def release_quorum(cfg: Config, s: State) -> str | None:
    """S1.2: a rank resumes from generation g only after every rank of W in the data-parallel
    dimension (every rank, unless a shrink took a replica out, P19) posted its release vote in g."""
    for g, r, *_ in sorted(s.resumed):
        world = set(_dp(cfg, s, g))
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
            now = _decided(new, g)
            if now != v:
                return f"the {name} decision of generation {g} changed from {v!r} to {now!r}"
    return None


def agreed_frontier(cfg: Config, s: State) -> str | None:
    """S2.2: every rank that passed phase 3 in generation g reported rank 0's committed F, as rank 0
    posted it in g (without rank 0's post there is nothing the agreement could have compared with);
    the lowest rank in the data-parallel dimension where a shrink took rank 0's replica out (P19).
    Judged on every frontier rank 0 posted in g (the store's raw rows, as a set): a pass needs them all
    to be its F, so a reference that posted two different frontiers has no F to agree on, and no
    verdict depends on the order in which a set is read."""
    for g, r, f in sorted(s.agreed):
        ref = min(_dp(cfg, s, g), default=0)
        posted = _posted(s, g, ref)
        if not posted:
            return f"rank {r} passed agreement in generation {g} with F={f}, but rank {ref} never posted its F in generation {g}"
        if posted != (f,):
            what = f"F={posted[0]}" if len(posted) == 1 else f"the frontiers {list(posted)} (two rows: no one F)"
            return f"rank {r} passed agreement in generation {g} with F={f}, but rank {ref}'s committed frontier is {what}"
    return None


def _posted(s: State, g: int, r: int) -> tuple[int, ...]:
    """The frontiers rank ``r`` posted in generation ``g`` (the store's raw rows), sorted and distinct."""
    return tuple(sorted({a[2] for a in s.store.arrivals if a[0] == g and a[1] == r}))


def agreement_quorum(cfg: Config, s: State) -> str | None:
    """S2.3: a rank passes phase 3 in generation g only after every rank of W posted (F, g) in g
    and the decision written in g is commit (every rank in the data-parallel dimension, P19)."""
    for g, r, _f in sorted(s.agreed):
        world = set(_dp(cfg, s, g))
        posted = {a[1] for a in s.store.arrivals if a[0] == g and a[3] == g}
        if posted != world:
            return f"rank {r} passed agreement in generation {g} but only ranks {sorted(posted)} of {sorted(world)} posted (F, {g})"
        if _decided(s.store.agree, g) != DECISION_COMMIT:
            return f"rank {r} passed agreement in generation {g} without a commit decided in generation {g}"
    return None


def l1_only_qualified(cfg: Config, s: State) -> str | None:
    """S3: L1 (resume) only at a committed boundary, with passing guards, for a key the envelope
    qualifies for L1: the full key, with the point at which the rank observed the failure (history
    ``resumed``, from ``Rank.seen``: not the ``boundary`` a discard rewrote its point to) and the
    hot-swap facts of the generation (a rank died in it: ``Store.dead``; a spare claimed for each dead
    rank: ``Store.claims``; each one's state received from a replica: history ``transfers``).  In
    flight only where a rank died (a swap after a discard, if the envelope lists that key).  Judged from
    the envelope's raw entries and the guard flags directly, never by the contract's ``decide`` or
    ``Envelope.lookup`` (which the protocol calls)."""
    for g, r, point, dirty in sorted(s.resumed):
        dead = [d for gd, d in s.store.dead if gd == g]
        died = bool(dead)
        if point in _IN_FLIGHT and not died and (point not in _DISCARDABLE or (g, r) not in s.discarded):
            how = "without discarding its uncommitted step" if point in _DISCARDABLE else "inside optimizer.step()"
            return f"rank {r} resumed (L1) from generation {g} after a failure in flight ({point}) {how}"
        if dirty:
            return f"rank {r} resumed (L1) from generation {g} with a failed guard (outstanding gradients or a busy wrapper)"
        # a dead rank whose replica left in g (a shrink, P19) is qualified where a swap is: the key with
        # a spare and a replica; only in a job that counts its step in micro-batches
        out = _out_at(s, g)
        kept = [d for d in dead if cfg.replica_of(d) not in out]
        if len(kept) < len(dead) and not cfg.shrink:
            return f"rank {r} resumed (L1) from generation {g} after a shrink, in a job that does not count its step in micro-batches"
        spare = died and all(any(gc == g and dc == d for gc, dc, _i in s.store.claims) for d in kept)
        replica = died and all((g, d, True) in s.transfers for d in kept)
        if not _qualifies_l1(cfg, point, died, spare, replica):
            facts = f"; died={died}, spare={spare}, replica={replica}" if died else ""
            return (f"rank {r} resumed (L1) from generation {g} but the envelope does not qualify "
                    f"({cfg.platform}, {cfg.profile}, {point}, {cfg.objective}{facts}) for L1")
    return None


def fenced_release(cfg: Config, s: State) -> str | None:
    """S4.2: a rank resumes from generation g only on a release decided in generation g."""
    for g, r, *_ in sorted(s.resumed):
        if _decided(s.store.release, g) != DECISION_RELEASE:
            return f"rank {r} resumed from generation {g} but no release was decided in generation {g} (stale decision)"
    return None


def rebind_complete(cfg: Config, s: State) -> str | None:
    """S5: a rank resumes from generation g holding the communicator it must (generation g+1's if
    its group failed in g; otherwise the one built after the last generation in which its group
    failed, generation 0's if it never did), and every cached reference names that one.  Judged on
    every rank that trains in a generation > 0, with the groups that failed in each generation read
    from history ``failures`` (``Store.failed`` keeps only the latest episode), not through the
    protocol's ``_member``."""
    for r, rk in enumerate(s.ranks):
        if rk.pc != PC_TRAIN or rk.gen == 0:
            continue
        grp = cfg.group_of(r)
        last = max((g for g, gi in s.failures if gi == grp and g < rk.gen), default=-1)
        want = last + 1
        if rk.comm != want or any(ref != want for ref in rk.refs):
            why = (f"its group failed in generation {last}, the last before {rk.gen}" if last >= 0
                   else "its group never failed")
            return (f"rank {r} trains in generation {rk.gen} with communicator {rk.comm} and references "
                    f"{list(rk.refs)}: it must hold generation {want}'s ({why}) and every reference must name it")
    return None


def state_preserved(cfg: Config, s: State) -> str | None:
    """S6: L1 resumes at the agreed F with S_app unchanged and zero replay: a rank training in a
    generation > 0 has tau = F (rank 0's committed frontier), replayed nothing, and its RNG and data
    cursor at F with no gradients (``ahead = 0``, ``grads`` false: the next batch is the one after F).  (The L2 half,
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
        if rk.ahead != 0 or rk.grads:
            return (f"rank {r} resumed (L1) at F={f} with its RNG/data cursor {rk.ahead} step(s) past F and gradients "
                    f"{rk.grads}: L1 must resume with the cursor at F and no gradients")
    return None


def _agreed_frontier(cfg: Config, s: State, g: int) -> int:
    """Rank 0's committed F as it reported it in generation g (F_g if it never did); the lowest rank in
    the data-parallel dimension where a shrink took rank 0's replica out (P19).  Should it have posted
    two frontiers (S2.2 rejects any pass then), the lowest: never the first a set happens to yield."""
    ref = min(_dp(cfg, s, g), default=0)
    posted = _posted(s, g, ref)
    return posted[0] if posted else cfg.frontier_at(g)


def replicas_validated(cfg: Config, s: State) -> str | None:
    """S8: no release is decided in a generation in which the replicas of R disagreed: phase 6's
    cross-replica check stands between a corrupt S_app and the release.  For every generation g whose
    release is decided (the store's raw entries), every group that history ``failures`` records as
    failed in g (the store's record names only the groups of R's kind that broke; a step abandoned in
    flight or a death breaks every group, and each is rebuilt) completed its validation collective
    (history ``validated``; who took part in it is S20's, judged from the ranks).  Judged too on every
    state in which g's release is decided and g's failure entry is still the store's (the state right
    after RankDecideRelease is one): the members of g's failed groups still in g (not exited: an exited
    process holds nothing) are not corrupt, and the members of each group hold one shard (their
    group's, or the one a spare received) at one optimizer step.  The oracle's own digest
    comparison, from the ranks' fields: not the protocol's ``_replicas_agree``."""
    for g, gi in sorted(s.failures):
        if _decided(s.store.release, g) == DECISION_RELEASE and not any(gv == g and gg == gi for gv, gg, _eq in s.validated):
            return (f"the release of generation {g} was decided but group {gi}, which failed in generation {g} (history "
                    "failures) and was rebuilt, never completed its validation collective (history validated)")
    f = s.store.failed
    if f is None or _decided(s.store.release, f[0]) != DECISION_RELEASE:
        return None
    g = f[0]
    for gi in sorted(f[2]):
        held: dict[tuple[int, int], list[int]] = {}
        out = _out_at(s, g)
        for m in cfg.members(gi):
            rk = s.ranks[m]
            if rk.gen != g or rk.pc in (PC_EXITED, PC_RESTARTED, PC_LEFT) or cfg.replica_of(m) in out:
                continue
            if rk.corrupt:
                return f"the release of generation {g} was decided while rank {m} of failed group {gi} holds a corrupt S_app"
            held.setdefault((gi if rk.shard == SHARD_OWN else rk.shard, rk.tau), []).append(m)
        if len(held) > 1:
            return (f"the release of generation {g} was decided while the replicas of failed group {gi} disagree "
                    f"(shard, optimizer step -> ranks: {held})")
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
    "dead" rank (``RankFenced(rank, wake)``: a stage the spec reaches) is fenced out by the identity's
    incarnation at its first store operation, before it does anything (history ``deposed``: a woken
    process that went on past that operation is ``DEPOSED_ACTING``)."""
    if not s.deposed:
        return None
    for g, d, inc, stage in sorted(s.deposed):
        rk = s.ranks[d]
        if stage == DEPOSED_ACTING and rk.pc not in _GONE:
            return (f"rank {d}'s identity is held by two live processes: incarnation {rk.inc} ({rk.pc}) and the "
                    f"deposed incarnation {inc} (deposed in generation {g}), which woke and was not fenced out")
    return None


def identity_conserved(cfg: Config, s: State) -> str | None:
    """S13: one holder per identity and incarnation, and the spare pool conserved.  From the store's raw
    claims (``g{g}/spare/{rank}``), the dead ranks, the pool (``Store.spares``), history ``joins`` and each
    seat's incarnation: a claim names a rank that died in training in that generation, at most one claim
    per dead identity and generation, each incarnation of an identity claimed once and one above the
    identity's previous one; every claim took one spare from the pool (claims + spares left = the job's
    spares); every join took a claimed incarnation, at most one per claim; and a live seat is held by
    the identity's latest joined incarnation (0, the original process, when no spare joined)."""
    st = s.store
    if not (st.claims or s.joins or s.pooled or st.spares != cfg.spares):
        return None
    # what entered the pool besides the job's spares (P19): a survivor of a leaving replica, a keeper's
    # fresh spare for a dead process (once each, for a process that died in training)
    for kind, g, r in sorted(s.pooled):
        if kind == "refill" and (g, r) not in st.dead:
            return f"a keeper started a spare for rank {r} in generation {g}, but rank {r} did not die in training in it"
    if len(st.claims) + st.spares != cfg.spares + len(s.pooled):
        return (f"the spare pool is not conserved: {len(st.claims)} claim(s) and {st.spares} spare(s) left, "
                f"but the job has {cfg.spares} spare(s) and {len(s.pooled)} entered the pool since")
    per_rank: dict[int, list[tuple[int, int]]] = {}
    for g, d, inc in sorted(st.claims):
        if (g, d) not in st.dead:
            return f"a spare was claimed for rank {d} in generation {g}, but rank {d} did not die in training in it"
        per_rank.setdefault(d, []).append((g, inc))
    for d, rows in per_rank.items():
        gens = [g for g, _inc in rows]
        if len(set(gens)) != len(gens):
            return f"rank {d}'s identity was claimed twice in one generation: (generation, incarnation) {rows}"
        incs = [inc for _g, inc in rows]  # by generation
        if incs != list(range(1, len(incs) + 1)):
            return (f"rank {d}'s identity was claimed at incarnations {incs} over generations {gens}: each claim "
                    "must take the next incarnation, once")
    joined: dict[int, int] = {}
    for g, d, inc in sorted(s.joins):
        if (g, d, inc) not in st.claims:
            return f"a spare joined as rank {d} at incarnation {inc} in generation {g} without that claim"
        if joined.get(d, -1) >= inc:
            return f"two spares joined as rank {d} at incarnation {inc}"
        joined[d] = inc
    for d, rk in enumerate(s.ranks):
        if rk.pc not in _GONE and rk.pc != PC_LEFT and rk.inc != joined.get(d, 0):
            return (f"rank {d}'s seat is held by incarnation {rk.inc} ({rk.pc}), but its latest joined incarnation "
                    f"is {joined.get(d, 0)}")
    return None


def discard_leaves_no_trace(cfg: Config, s: State) -> str | None:
    """S11: a discarded step leaves no trace: a live rank that discarded its uncommitted step in
    generation g (history ``discarded``) holds, while still in g, no gradients (wrapper idle), RNG and
    data cursor at the committed frontier, and no optimizer update past it (tau = its F)."""
    if not s.discarded:
        return None
    for g, r in sorted(s.discarded):
        rk = s.ranks[r]
        if rk.gen != g or rk.pc in (PC_EXITED, PC_CRASHED, PC_RESTARTED, PC_LEFT):
            continue
        if rk.grads or rk.ahead != 0 or rk.tau != rk.frontier:
            return (f"rank {r} discarded its uncommitted step in generation {g} but still holds gradients {rk.grads}, "
                    f"RNG/cursor {rk.ahead} step(s) past F={rk.frontier}, optimizer step {rk.tau}")
    return None


def no_resume_past_discard(cfg: Config, s: State) -> str | None:
    """S14: no rank resumes past a step another rank discarded.  In a generation g in which some rank
    discarded its uncommitted step (history ``discarded``), a rank that resumed from g (training in
    g+1, before g+1's own failure struck) holds the optimizer step (``tau``) of every rank that
    discarded in g and is still in g or resumed with it: one that committed the discarded step
    meanwhile (a partial collective let its backward end, and it ran ``optimizer.step()``) must not
    train on beside ranks that rerun it, whatever frontier it reported.  Judged from the ranks' own
    optimizer steps, not from what phase 3 compared."""
    if not s.discarded:
        return None
    struck = s.store.failed[0] if s.store.failed is not None else None

    def settled(r: int, gen: int) -> bool:  # resumed into gen, its next failure not struck yet
        rk = s.ranks[r]
        return rk.pc == PC_TRAIN and rk.gen == gen and struck != gen

    for g in sorted({g for g, _r in s.discarded}):
        held = {d: s.ranks[d].tau for gd, d in s.discarded
                if gd == g and (settled(d, g + 1) or (s.ranks[d].gen == g and s.ranks[d].pc not in (PC_EXITED, PC_RESTARTED, PC_LEFT)))}
        for r in range(len(s.ranks)):
            if not settled(r, g + 1):
                continue
            for d, tau in sorted(held.items()):
                if s.ranks[r].tau != tau:
                    return (f"rank {r} resumed from generation {g} at optimizer step {s.ranks[r].tau} while rank {d} "
                            f"discarded the step after {tau} in g and reruns it: {r} trains on past a step {d} discarded")
    return None


def swap_qualified(cfg: Config, s: State) -> str | None:
    """S12: a death in training without a spare left or without a live replica is L2: no rank
    resumes (L1) from a generation g in which a rank d died unless a spare received d's state from a
    replica of d (a member of its replicate group; history ``transfers``), and the identities handed
    to spares never outnumber ``Config.spares``."""
    if not s.store.dead:
        return None
    if len(s.store.claims) > cfg.spares + len(s.pooled):
        return (f"{len(s.store.claims)} identities were handed to spares but the job has {cfg.spares} spare(s) and "
                f"{len(s.pooled)} entered the pool since")
    for g, r, *_ in sorted(s.resumed):
        out = _out_at(s, g)
        for gd, d in sorted(s.store.dead):
            if gd == g and cfg.replica_of(d) not in out and (g, d, True) not in s.transfers:
                how = "from a rank that is not its replica" if (g, d, False) in s.transfers else "from nowhere"
                return (f"rank {r} resumed (L1) from generation {g} in which rank {d} died, but rank {d}'s state reached "
                        f"its spare {how}: no live replica, so this must be L2")
    return None


def wide_replaced(cfg: Config, s: State) -> str | None:
    """S15: no rank trains on holding a group over all of W whose failure was learned.  A rank training
    in generation g' holds the control plane's groups over all of W (control, checkpoint, default,
    world) of a generation past every generation g < g' whose wide revoke was published (the store's
    ``wide_revoked``: a failure flag or a checkpoint save failed under some rank in g, P18.4), so its next
    failure flag, checkpoint save or default-group collective does not meet a failure the job already
    knew of.  A break nothing met yet (a link cut the episode did not learn of) is not judged here: it
    is met later and starts an episode of its own (P18.3).  Judged from the rank's ``wide`` and the
    store's raw log of wide revokes, not from who the protocol thought rebuilt."""
    if not s.store.wide_revoked:
        return None
    for r, rk in enumerate(s.ranks):
        if rk.pc != PC_TRAIN:
            continue
        learned = [g for g in s.store.wide_revoked if g < rk.gen]
        if learned and rk.wide <= max(learned):
            return (f"rank {r} trains in generation {rk.gen} holding the groups over all of W of generation {rk.wide}, "
                    f"but their failure was learned in generation {max(learned)} (its wide revoke was published) "
                    "and they were not rebuilt")
    return None


def no_healthy_rebuilt(cfg: Config, before: State, after: State) -> str | None:
    """S16: an episode costs what failed, not what exists.  A rank rebuilds its groups over all of W
    (its ``wide`` rises within one generation g, from w, the generation they were built in) only
    where one of them failed: a link failed in a generation in [w, g] (history ``Store.wide``: every
    group over W crosses every link, P18.2), or a rank of W died in g (``Store.dead``: a hot swap puts
    a spare in every group over W, P16) or is gone (exited, crashed) or hangs in g (a member of every
    group over W is lost), or g's step was discarded in flight (history ``discarded``: every group was
    left with collectives in flight, P17.1).  Judged from those recorded facts on the step itself,
    never through the protocol's ``_rebuilds``."""
    if before.ranks is after.ranks:
        return None
    for r, (a, b) in enumerate(zip(before.ranks, after.ranks, strict=True)):
        if a is b or b.wide <= a.wide or a.gen != b.gen or b.pc in _GONE:
            continue
        g, w = a.gen, a.wide
        if any(w <= gl <= g for gl in after.store.wide):
            continue
        if any(gd == g for gd, _d in after.store.dead) or any(gd == g for gd, _q in after.discarded):
            continue
        if any(pk.gen == g and (pk.pc in (PC_EXITED, PC_CRASHED) or pk.hung) for q, pk in enumerate(before.ranks) if q != r):
            continue
        return (f"rank {r} rebuilt its groups over all of W in generation {g} (built in generation {w}, now {b.wide}), "
                f"but none of them failed: no link failed in generations {w}..{g}, no rank died, is gone or hangs in "
                f"generation {g}, and no step was discarded in it")
    return None


# Shrink and grow (issue 41, P19).  Every predicate below holds trivially without them (its history is empty).

def _position(cfg: Config, r: int) -> int:
    """Rank r's place within its replica (its shard of S_app): the oracle's own reading, from the replicas' ranks."""
    i = cfg.replica_of(r)
    return r - min(q for q in cfg.world if cfg.replica_of(q) == i)


def batch_conserved(cfg: Config, s: State) -> str | None:
    """S17: every micro-batch of every step is processed exactly once across the replicas that train
    it, whatever their count.  From history ``shares`` (the micro-batches each rank resumed to
    process in every step from generation g on) and the step's micro-batch count M alone (the
    config's, or one per replica of the job): for each generation and each place in a replica, no
    micro-batch is counted by two replicas nor lies outside 0..M-1, the ranks of one replica process
    the same ones, and once every replica in the data-parallel dimension in g (the store's ``shrunk``,
    ``grown``) has resumed, their shares cover all M."""
    if not s.shares:
        return None
    m = cfg.micro_batches or len({cfg.replica_of(r) for r in cfg.world})
    by: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
    for g, r, share in sorted(s.shares):
        if any(not 0 <= b < m for b in share):
            return f"rank {r} resumed from generation {g} to process micro-batches {list(share)}, outside the step's 0..{m - 1}"
        seen = by.setdefault((g, _position(cfg, r)), {})
        i = cfg.replica_of(r)
        for j, other in seen.items():
            if j != i and set(other) & set(share):
                return (f"micro-batch(es) {sorted(set(other) & set(share))} of every step from generation {g} on are "
                        f"processed by replica {j} and by replica {i} (rank {r}): counted twice")
        peers = [q for gg, q, sh in s.shares if gg == g and q != r and cfg.replica_of(q) == i and sh != share]
        if peers:
            return f"ranks {r} and {peers[0]} of replica {i} resumed from generation {g} to process different micro-batches"
        seen[i] = share
    for (g, _pos), seen in sorted(by.items()):
        want = {cfg.replica_of(q) for q in _dp(cfg, s, g)}
        if set(seen) == want:
            got = sorted(b for share in seen.values() for b in share)
            if got != list(range(m)):
                missing = sorted(set(range(m)) - set(got))
                return (f"the replicas {sorted(want)} training from generation {g} on process micro-batches {got} of "
                        f"every step: {missing} of the step's {m} are never processed")
    return None


def shards_held(cfg: Config, s: State) -> str | None:
    """S18: a job that trains on holds every shard.  No generation's shrink takes out every replica
    holding a shard (the store's ``shrunk`` and ``grown`` keys); and in a state where no abort stands, the store
    answers, the supervisor restarted nothing and no training rank is inside an episode (every rank
    trains past its generation's failure or belongs to a replica out), every group of R's kind (a
    shard of S_app, held by one member per replica) has a member training.  A shrink takes a replica
    out only where every shard keeps a live one."""
    for g, _i in sorted(s.store.shrunk):
        out = _out_at(s, g)
        for gi in range(len(cfg._members)):
            if all(cfg.replica_of(m) in out for m in cfg.members(gi)):
                return (f"in generation {g} the replicas {sorted(out)} are out of the data-parallel dimension: no "
                        f"replica left holds shard {gi} (ranks {list(cfg.members(gi))}); it must end L2")
    if s.supervisor or s.store.abort or s.store.down:
        return None
    f = s.store.failed
    gens = [rk.gen for rk in s.ranks if rk.pc == PC_TRAIN]
    if not gens:
        return None  # nobody trains: the supervisor restarts the job
    out = _out_at(s, max(gens))
    for r, rk in enumerate(s.ranks):
        if rk.pc == PC_TRAIN:
            if f is not None and f[0] == rk.gen:
                return None  # an episode under way
        elif cfg.replica_of(r) not in out:
            return None  # a rank of the job still to be found dead, or in an episode
    for gi in range(len(cfg._members)):
        if not any(s.ranks[m].pc == PC_TRAIN for m in cfg.members(gi)):
            return (f"the job trains on with no rank holding shard {gi} (ranks {list(cfg.members(gi))}: "
                    f"{', '.join(s.ranks[m].pc for m in cfg.members(gi))}): it must end L2")
    return None


# Issue 42: what each mechanism guarantees (the commit fence, the validation collective, the state
# transfer; the probe and the failure flag at the final states below), and L1 where it was due.

def fence_stops_commit(cfg: Config, s: State) -> str | None:
    """S19: the commit fence (``Config.fence``, P17.2) holds every rank before its commit: in the
    generation g of the store's failure record, struck in forward or backward on a group of R's kind
    (the raw ``Store.failed``: its point and its groups), no rank of g observed it at the boundary
    (``Rank.seen``), that is past the optimizer step it would have committed.  A failure over the groups
    of W alone (a link no group of R's kind crosses) or a death at the boundary is outside the fence's
    promise (P18.4, P16.0).  Judged from the record and each rank's own observation point."""
    f = s.store.failed
    if not cfg.fence or f is None or f[1] not in _DISCARDABLE or not f[2]:
        return None
    g = f[0]
    for r, rk in enumerate(s.ranks):
        if rk.gen == g and rk.seen == "boundary":
            return (f"rank {r} observed generation {g}'s failure at the boundary, past its commit, although it struck in "
                    f"{f[1]} on group(s) {sorted(f[2])} of a job with the commit fence: the fence must hold every rank "
                    "before optimizer.step()")
    return None


#: the program counters of phase 6 (the oracle's own list): a member taking part in its group's validation
_PHASE6 = (PC_REBOUND, PC_VALIDATED, PC_READY)


def validation_membership(cfg: Config, before: State, after: State) -> str | None:
    """S20: a group's validation collective runs over the group's whole membership on the new
    communicator.  On the step that records the collective of group gi in generation g as completed
    (history ``validated`` gains (g, gi, _): judged from the ranks, not by trusting that record), every
    member of gi in the data-parallel dimension in g (its replica not out: the store's ``shrunk`` and
    ``grown`` keys) stands in phase 6 of g (rebound, validated or ready), active (not hung, no
    exception propagating), holding state (a spare after its transfer) and generation g+1's
    communicator: no member is missing, none is on a stale group.  (Its cached references are S5's.)"""
    if before.validated is after.validated:
        return None
    for g, gi, _eq in sorted(after.validated - before.validated):
        out = _out_at(after, g)
        for m in cfg.members(gi):
            if cfg.replica_of(m) in out:
                continue
            rk = before.ranks[m]
            if rk.gen != g or rk.pc not in _PHASE6 or rk.hung or rk.raised or rk.shard == SHARD_NONE or rk.comm != g + 1:
                return (f"group {gi}'s validation collective of generation {g} completed while its member {m} stood "
                        f"outside it (pc {rk.pc}, generation {rk.gen}, communicator {rk.comm}, hung {rk.hung}, shard "
                        f"{rk.shard}): the collective ran over the wrong membership")
    return None


def transfer_on_rebuilt_group(cfg: Config, before: State, after: State) -> str | None:
    """S21: the state transfer (P16.3) moves a dead rank's S_app on the rebuilt group of R's kind, into
    a spare that holds none: on the step that records a transfer into rank d's spare in generation g
    (history ``transfers`` gains (g, d, _)), the spare stood rebound in g on generation g+1's
    communicator with every reference naming it, and held no state yet (``SHARD_NONE``).  (What it
    received is S9's: the replicas' bits at F.)"""
    if before.transfers is after.transfers:
        return None
    for g, d, _ok in sorted(after.transfers - before.transfers):
        rk = before.ranks[d]
        if (rk.gen != g or rk.pc != PC_REBOUND or rk.comm != g + 1 or any(ref != g + 1 for ref in rk.refs)
                or rk.shard != SHARD_NONE):
            return (f"rank {d}'s spare received its state in generation {g} while it stood at pc {rk.pc} in generation "
                    f"{rk.gen} with communicator {rk.comm}, references {list(rk.refs)}, shard {rk.shard}: the transfer must "
                    f"run on the rebuilt group, once the spare rebuilt and rebound it (generation {g + 1}'s), into a spare "
                    "holding nothing")
    return None


def l1_where_due(cfg: Config, s: State) -> str | None:
    """L4: L1 where it was due.  A run that ends L2 (the supervisor restarted it: a final state) has a
    recorded cause: the store was lost (``Store.down``), no rank wrote an abort (every process died or
    hung), or the first abort (``Store.abort``) is a deadline (a peer stalled or gone), an exception
    (one raised, or digests that differ) or the contract's rejection (whose L1 side S3 judges); or it is
    the agreement's mismatch in a generation g where some rank posted (the store's raw rows of g) a
    frontier past F_g (it committed a step the others did not: a partial collective without the fence,
    a death inside the optimizer step, the run's mismatch fault) or a row of another generation.  A
    mismatch whose rows differ only by a frontier below F_g (a rank, or a spare, posting a view older
    than the step every rank committed) ended L2 where every fault allowed L1."""
    if not s.supervisor or s.store.down or s.store.abort != REASON_MISMATCH:
        return None
    for g, v in s.store.agree:
        if v != f"abort:{REASON_MISMATCH}":
            continue
        f = cfg.frontier_at(g)
        rows = sorted((r, fr, gr) for gg, r, fr, gr in s.store.arrivals if gg == g)
        if any(fr > f or gr != g for _r, fr, gr in rows):
            return None
        behind = [(r, fr) for r, fr, _gr in rows if fr < f]
        if behind:
            return (f"the job ended L2 by a frontier mismatch in generation {g} although no rank committed past F={f}: "
                    f"rank(s) {behind} posted (rank, F) below the step every rank committed (a stale view); L1 was due")
    return None


# Properties of final states (sinks of the search: spec/properties.md "Final states").  Each judges a
# state in which the protocol has nothing left to do and no abort or restart stands.

def _at_rest(s: State) -> bool:
    """The job ended L1 (or never failed): no restart, no abort, the store answers."""
    return not (s.supervisor or s.store.abort or s.store.down)


def probe_detects(cfg: Config, s: State) -> str | None:
    """L5: the probe on R detects its group's failure.  In a final state without abort or restart, no
    member of a group of R's kind that failed in generation g (history ``failures``) still trains, not
    hung, in g: it observed the failure at the latest at its boundary probe and recovered past it."""
    if not _at_rest(s):
        return None
    for g, gi in sorted(s.failures):
        for m in cfg.members(gi):
            rk = s.ranks[m]
            if rk.pc == PC_TRAIN and not rk.hung and rk.gen <= g:
                return (f"rank {m} of group {gi}, which failed in generation {g} (history failures), trains on in generation "
                        f"{rk.gen} in a final state: its probe on R never reported the failure")
    return None


def failure_observed(cfg: Config, s: State) -> str | None:
    """L6: final states hold no unobserved failure; the failure flag (an all-reduce over W, P18.4)
    reports what no probe can, a group over W that failed.  In a final state without abort or
    restart, no rank still trains, not hung, in the generation of the store's failure record
    (``Store.failed``): every rank observed it and recovered past it."""
    f = s.store.failed
    if f is None or not _at_rest(s):
        return None
    for r, rk in enumerate(s.ranks):
        if rk.pc == PC_TRAIN and not rk.hung and rk.gen <= f[0]:
            return (f"rank {r} trains on in generation {rk.gen} in a final state that still holds generation {f[0]}'s "
                    f"failure ({f[1]}, groups {sorted(f[2])}): nobody observed it")
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
    # hot swap (issue 13).  S12 before S9: a swap without a live replica is first a wrong decision
    # (the first resume from that generation breaks S12; the spare's own resume breaks S9 too).  Both
    # before S3 and S6, which judge the same resumes more coarsely (S3 the full key, with the
    # replica fact; S6 the cursor of every L1 resume), so a counterexample names the sharper one
    Invariant("S12", "SwapNeedsReplica", swap_qualified),
    Invariant("S9", "SpareStateExact", spare_state_exact),
    Invariant("S3", "L1OnlyQualified", l1_only_qualified),
    Invariant("S4.2", "FencedRelease", fenced_release),
    Invariant("S5", "RebindComplete", rebind_complete),
    # issue 27 (P17): before S6, which judges every L1 resume's optimizer step against rank 0's F
    Invariant("S14", "NoResumePastDiscard", no_resume_past_discard),
    # issue 42: the commit fence holds every rank before its commit (before S6 and S14, which see the commit later)
    Invariant("S19", "FenceStopsCommit", fence_stops_commit),
    Invariant("S6", "StatePreserved", state_preserved),
    Invariant("S8", "ReplicasValidated", replicas_validated),
    Invariant("S10", "OneHolder", one_holder),
    Invariant("S13", "IdentityConserved", identity_conserved),
    Invariant("S11", "DiscardLeavesNoTrace", discard_leaves_no_trace),
    # issue 25 (P18): the groups over all of W cross every link; a failure learned is repaired
    Invariant("S15", "WideReplaced", wide_replaced),
    # issue 41 (P19): shrink and grow keep the global batch and every shard
    Invariant("S17", "BatchConserved", batch_conserved),
    Invariant("S18", "ShardsHeld", shards_held),
    # model well-formedness: checked on every state, but true of the encoding, not of the protocol
    Invariant("W2", "ExitReasons", exit_reasons),
)

EDGE_INVARIANTS: tuple[EdgeInvariant, ...] = (
    EdgeInvariant("S2.1", "DecisionsStable", decisions_stable),
    # issue 40 (P18.3): an episode rebuilds what failed, not what exists
    EdgeInvariant("S16", "NoHealthyRebuilt", no_healthy_rebuilt),
    # issue 42: the validation collective and the state transfer, judged from the ranks on the step itself
    EdgeInvariant("S20", "ValidationMembership", validation_membership),
    EdgeInvariant("S21", "TransferOnRebuiltGroup", transfer_on_rebuilt_group),
    EdgeInvariant("W1", "GenerationMonotonic", generation_monotonic),
)

#: Properties of final states (issue 42): checked on every sink of a search that the final-state rule
#: accepts (``explore``), each with a named mutant.
FINAL_INVARIANTS: tuple[Invariant, ...] = (
    # an L2 ending (a restart) has a recorded cause
    Invariant("L4", "L1WhereDue", l1_where_due),
    Invariant("L5", "ProbeDetects", probe_detects),
    Invariant("L6", "FailureObserved", failure_observed),
)

#: ids of the safety properties proper (each must have a mutant that breaks it)
SAFETY_PROPERTIES = tuple(i.id for i in INVARIANTS + EDGE_INVARIANTS if i.id.startswith("S"))


def _violated(invariants, cfg: Config, s: State) -> list[tuple[Invariant, str]]:
    return [(inv, msg) for inv in invariants for msg in (inv.check(cfg, s),) if msg is not None]


def check_state(cfg: Config, s: State) -> list[tuple[Invariant, str]]:
    """All violated invariants of one state, with their messages."""
    return _violated(INVARIANTS, cfg, s)


def check_final(cfg: Config, s: State) -> list[tuple[Invariant, str]]:
    """All violated final-state properties of ``s``, a state the search found final (a sink)."""
    return _violated(FINAL_INVARIANTS, cfg, s)


def check_edge(cfg: Config, before: State, after: State) -> list[tuple[EdgeInvariant, str]]:
    out = []
    for inv in EDGE_INVARIANTS:
        msg = inv.check(cfg, before, after)
        if msg is not None:
            out.append((inv, msg))
    return out
