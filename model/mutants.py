"""Deliberately broken protocol variants: each one replaces actions in the action table.

A mutant never edits :mod:`accelpact.model.protocol`: it is a table in which some actions are
replaced by broken ones (``Config.mutant`` selects it; :func:`accelpact.model.transitions.actions_for`
returns it).  The spec reads clean, and each mutant is read here, in one place, as "the spec, except
that this action does that".  The exploration must reject every one of them: each safety property
has at least one mutant that breaks it, caught by the exhaustive search and by hypothesis
(``tests/test_model_mutants.py``); ``expect`` names the properties a counterexample may break
(any one of them counts as caught).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Callable, Mapping

from .contract import IN_FLIGHT_PHASES, decide
from . import hotswap
from .batches import share
from . import protocol as _protocol
from .protocol import (
    ACTIONS,
    ActionSpec,
    _abort,
    _active,
    _count_ready,
    _crash_episode,
    _decision_key,
    _detector_sees_dead,
    _exit,
    _gone,
    _in_episode,
    _member,
    _peers,
    _rebuilds,
    _send_state,
    _shard_of,
    _spares_to_load,
    _via_store,
    true_lookup,
)
from .state import (DECISION_COMMIT, DECISION_RELEASE, DEPOSED_ACTING, DEPOSED_AWAKE, PC_AGREED, PC_ARRIVED, PC_GUARDED, PC_OBSERVED,
                    PC_READY, PC_REBOUND, PC_REPLACED, PC_TRAIN, PC_VALIDATED, REASON_DEADLINE, REASON_MISMATCH, RECOVERY_PCS, SHARD_NONE, Config,
                    State, Store)

__all__ = ["MUTANTS", "Mutant", "get", "table"]

Enabled = Callable[[Config, State, "int | None", "str | None"], bool]
Step = Callable[[Config, State, "int | None", "str | None"], State]


@dataclass(frozen=True, slots=True)
class Mutant:
    """A broken variant: ``replace`` maps action names to a function of the correct ActionSpec
    returning the broken one."""

    name: str
    bug: str
    expect: tuple[str, ...]
    replace: Mapping[str, Callable[[ActionSpec], ActionSpec]]


def _never(cfg, s, r, arg) -> bool:
    return False


def _disabled(spec: ActionSpec) -> ActionSpec:
    return replace(spec, enabled=_never)


def _step(fn: Callable[[ActionSpec], Step]) -> Callable[[ActionSpec], ActionSpec]:
    return lambda spec: replace(spec, step=fn(spec))


def _enabled(fn: Callable[[ActionSpec], Enabled]) -> Callable[[ActionSpec], ActionSpec]:
    return lambda spec: replace(spec, enabled=fn(spec))


# ---- early-release: the first vote decides the release --------------------------------------------
def _ready_first_vote_decides(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        t = spec.step(cfg, s, r, arg)
        g = s.ranks[r].gen
        if _count_ready(t, g) == 1 and (g, r) not in t.store.last_ready:
            t = t.with_store(last_ready=t.store.last_ready + ((g, r),))
        return t
    return step


# ---- skip-agreement: a rank passes phase 3 as soon as it posted (F, g) ----------------------------
def _arrive_and_pass(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        rk = s.ranks[r]
        s = s.with_store(arrivals=s.store.arrivals | {(rk.gen, r, rk.frontier, rk.gen)})
        s = s.with_rank(r, pc=PC_AGREED)
        return replace(s, agreed=s.agreed | {(rk.gen, r, rk.frontier)})
    return step


# ---- partial-rebind: only the first cached reference is rebound ----------------------------------
def _rebind_first_only(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        before = s.ranks[r].refs
        t = spec.step(cfg, s, r, arg)
        return t.with_rank(r, refs=t.ranks[r].refs[:1] + before[1:])
    return step


# ---- admit-inflight / ignore-guard: the contract judged on the wrong inputs ---------------------------
def _contract_with(point_of: Callable[[str], str], guards_ok: Callable[[bool], bool], want: bool) -> Callable[[ActionSpec], Enabled]:
    def make(spec: ActionSpec) -> Enabled:
        def enabled(cfg, s, r, arg):
            rk = s.ranks[r]
            if rk.pc != PC_OBSERVED or not _active(s, r):
                return False
            d = decide(cfg.envelope, cfg.key(point_of(rk.point)), guards_ok=guards_ok(not rk.dirty))
            return d.preserve == want
        return enabled
    return make


def _as_boundary(point: str) -> str:
    return "boundary" if point in IN_FLIGHT_PHASES else point


def _same(point: str) -> str:
    return point


def _always(ok: bool) -> bool:
    return True


def _as_given(ok: bool) -> bool:
    return ok


# ---- timeout-leaves-decision-open: the split brain -----------------------------------------------
def _timeout_without_decision(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        return _exit(cfg, _abort(s, REASON_DEADLINE), r, REASON_DEADLINE)
    return step


# ---- overwrite-decision: an abort overwrites the decision instead of compare_set -------------------
def _overwrite(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        which = _decision_key(s.ranks[r].pc)
        g = s.ranks[r].gen
        t = spec.step(cfg, s, r, arg)
        value = f"abort:{t.ranks[r].reason}"
        pairs = tuple(p for p in getattr(t.store, which) if p[0] != g) + ((g, value),)
        return t.with_store(**{which: pairs})
    return step


# ---- skip-validation: members pass phase 6 without the collective or the digests ------------------
def _validate_alone(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        return s.ranks[r].pc == PC_REBOUND and _active(s, r)
    return enabled


# ---- no-frontier-check: the agreement compares generations but not frontiers -----------------------
def _decide_without_frontiers(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        g = s.ranks[r].gen
        rows = [a for a in s.store.arrivals if a[0] == g]
        value = DECISION_COMMIT if all(a[3] == g for a in rows) else f"abort:{REASON_MISMATCH}"
        t = s.with_store(agree=s.store.agree + ((g, value),) if true_lookup(s.store.agree, g) is None else s.store.agree)
        return t if value == DECISION_COMMIT else _abort(t, REASON_MISMATCH)
    return step


# ---- report-published-frontier: a rank that committed in the episode reports the F before it ------
def _observe_reporting_published(spec: ActionSpec) -> Step:
    def step(cfg, s, r, point):
        t = spec.step(cfg, s, r, point)
        f = s.store.failed
        if point == "boundary" and f is not None and f[1] in IN_FLIGHT_PHASES:
            # it committed the step the failure struck in (tau F+1) but reports F, as published at
            # its last boundary before the failure
            t = t.with_rank(r, frontier=t.ranks[r].frontier - 1)
        return t
    return step


# ---- stale-release: a rank resumes on a release decided in any generation -----------------------
def _resume_on_any_release(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        rk = s.ranks[r]
        return (rk.pc == PC_READY and _active(s, r) and _count_ready(s, rk.gen) == len(cfg.world)
                and any(v == DECISION_RELEASE for _g, v in s.store.release))
    return enabled


# ---- reload-on-resume: "in-process restart": resuming reloads the last checkpoint ------------------
def _resume_from_checkpoint(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        t = spec.step(cfg, s, r, arg)
        f = t.ranks[r].tau
        c = cfg.checkpoint_at(f)
        return t.with_rank(r, tau=c, replayed=f - c)
    return step


# ---- no-fence: store keys without the generation -------------------------------------------------
def _blind(st: Store, g: int) -> Store:
    """The store as a rank in generation ``g`` sees it when keys carry no generation: every key's
    entries, whatever generation wrote them, are under the one key (the first write stands)."""
    return replace(
        st,
        revoked=frozenset({g}) if st.revoked else frozenset(),
        wide_revoked=frozenset({g}) if st.wide_revoked else frozenset(),
        arrivals=frozenset((g, r, f, gr) for _g, r, f, gr in st.arrivals),
        agree=tuple((g, v) for _g, v in st.agree),
        ready=frozenset((g, r) for _g, r in st.ready),
        release=tuple((g, v) for _g, v in st.release),
    )


def _unfenced(spec: ActionSpec) -> ActionSpec:
    """Run a rank's action against :func:`_blind`; what it writes lands in the real store."""
    if spec.actor != "rank":
        return spec

    def enabled(cfg, s, r, arg):
        return spec.enabled(cfg, replace(s, store=_blind(s.store, s.ranks[r].gen)), r, arg)

    def step(cfg, s, r, arg):
        g = s.ranks[r].gen
        view = _blind(s.store, g)
        t = spec.step(cfg, replace(s, store=view), r, arg)
        new, old = t.store, s.store
        merged = replace(
            old,
            failed=new.failed,
            abort=new.abort,
            revoked=old.revoked | (new.revoked - view.revoked),
            wide_revoked=old.wide_revoked | (new.wide_revoked - view.wide_revoked),
            arrivals=old.arrivals | (new.arrivals - view.arrivals),
            last_arriver=old.last_arriver + new.last_arriver[len(view.last_arriver):],
            agree=old.agree + new.agree[len(view.agree):],
            ready=old.ready | (new.ready - view.ready),
            last_ready=old.last_ready + new.last_ready[len(view.last_ready):],
            release=old.release + new.release[len(view.release):],
        )
        return replace(t, store=merged)

    return replace(spec, enabled=enabled, step=step)


_NO_FENCE = {name: _unfenced for name, spec in ACTIONS.items() if spec.actor == "rank"}


# ---- hot swap (issue 13) ---------------------------------------------------------------------------

# transfer-from-stale-replica: a replica sends its state before it is back at the committed boundary
def _transfer_any_time(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        return spec.enabled(cfg, s, r, arg) or (
            s.ranks[r].pc in (PC_OBSERVED, PC_GUARDED, PC_ARRIVED) and _via_store(s, r) and not s.store.abort
            and bool(_spares_to_load(cfg, s, r)))
    return enabled


# no-identity-fence: a deposed holder that woke is not checked against its identity's incarnation at
# its first store operation: it goes on acting as the rank
def _wake_unfenced(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        if arg == _protocol.WAKE:
            return spec.step(cfg, s, r, arg)
        entry = min(e for e in s.deposed if e[1] == r and e[3] == DEPOSED_AWAKE)
        return replace(s, deposed=(s.deposed - {entry}) | {(*entry[:3], DEPOSED_ACTING)})
    return step


# keep-partial-grads / discard-keeps-cursor: the discard forgets part of the uncommitted step
def _discard_keeping(**kept) -> Callable[[ActionSpec], Step]:
    def make(spec: ActionSpec) -> Step:
        def step(cfg, s, r, arg):
            return spec.step(cfg, s, r, arg).with_rank(r, **kept)
        return step
    return make


# swap-without-replica: the claim ignores whether a replica lives; a non-replica sends the state
def _claim_without_replica(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        rk = s.ranks[r]
        if not _via_store(s, r) or s.store.abort or not (rk.pc in RECOVERY_PCS or (rk.pc == PC_TRAIN and _in_episode(s, r))):
            return False
        todo = hotswap.unclaimed(s, rk.gen, cfg) if _crash_episode(s, rk.gen) else ()
        f = s.store.failed
        return bool(todo) and s.store.spares >= len(todo) and cfg.observable(f[1])[0] in hotswap.SWAP_POINTS
    return enabled


def _orphans(cfg: Config, s: State, p: int) -> tuple[int, ...]:
    """Spares in p's generation waiting for the state of a rank that has no live replica."""
    g = s.ranks[p].gen
    return tuple(d for d in cfg.world if s.ranks[d].pc == PC_REBOUND and s.ranks[d].shard == SHARD_NONE
                 and s.ranks[d].gen == g and not hotswap.live_replicas(cfg, s, d))


def _transfer_from_anyone(spec: ActionSpec) -> ActionSpec:
    def enabled(cfg, s, r, arg):
        return spec.enabled(cfg, s, r, arg) or (s.ranks[r].pc in (PC_REBOUND, PC_VALIDATED, PC_READY) and _active(s, r) and not s.store.abort
                                                and s.ranks[r].shard != SHARD_NONE and bool(_orphans(cfg, s, r)))

    def step(cfg, s, r, arg):
        return _send_state(cfg, s, r, _spares_to_load(cfg, s, r) + _orphans(cfg, s, r))

    return replace(spec, enabled=enabled, step=step)

# ---- issue 24: a helper replaced for the protocol, a history fact written wrong --------------------
# The oracle (model/invariants.py) shares no helper with the protocol, so a bug in one of the helpers
# the actions call must be caught by a property that judges from plain facts.  A helper mutant runs
# every action with the protocol module's helper swapped for a broken one (the spec's module is
# restored after each call: the model is single-threaded per process; engine_parallel forks).

def _with_helper(helper: str, broken: Callable, module: ModuleType = _protocol) -> Callable[[ActionSpec], ActionSpec]:
    def make(spec: ActionSpec) -> ActionSpec:
        def swapped(fn):
            def call(cfg, s, r, arg):
                good = getattr(module, helper)
                setattr(module, helper, broken)
                try:
                    return fn(cfg, s, r, arg)
                finally:
                    setattr(module, helper, good)
            return call
        return replace(spec, enabled=swapped(spec.enabled), step=swapped(spec.step))
    return make


def _helper_everywhere(helper: str, broken: Callable, module: ModuleType = _protocol) -> dict[str, Callable[[ActionSpec], ActionSpec]]:
    return {name: _with_helper(helper, broken, module) for name in ACTIONS}


# weak-replicas-agree: the digest comparison ignores the bits (a corrupt replica compares equal)
def _replicas_agree_ignoring_bits(cfg: Config, s: State, members: tuple[int, ...]) -> bool:
    seen: dict[int, tuple[int, int]] = {}
    for m in members:
        mine = (_shard_of(cfg, s, m), s.ranks[m].tau)
        if seen.setdefault(cfg.group_of(m), mine) != mine:
            return False
    return True


# shrunk-member: R loses every member but its group's first: the others neither replace nor rebind
def _member_first_only(cfg: Config, s: State, r: int) -> bool:
    f = s.store.failed
    return (f is not None and f[0] == s.ranks[r].gen and cfg.group_of(r) in f[2]
            and _peers(cfg, r)[0] == r)


# resume-skips-batch: resuming moves the data cursor one batch on (the step after F is skipped)
def _resume_past_cursor(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        return spec.step(cfg, s, r, arg).with_rank(r, ahead=1)
    return step


# transfer-fact-always-replica: the history fact ``transfers`` says "from a replica" whoever sent
# (with swap-without-replica's bug): S12 reads the wrong fact, and S9 must still catch the shard
def _send_claiming_replica(cfg: Config, s: State, p: int, spares: tuple[int, ...]) -> State:
    t = _send_state(cfg, s, p, spares)
    g = s.ranks[p].gen
    return t.with_(transfers=frozenset((gg, d, True) if gg == g and d in spares else (gg, d, ok)
                                       for gg, d, ok in t.transfers))


def _transfer_claiming_replica(spec: ActionSpec) -> ActionSpec:
    broken = _transfer_from_anyone(spec)

    def step(cfg, s, r, arg):
        return _send_claiming_replica(cfg, s, r, _spares_to_load(cfg, s, r) + _orphans(cfg, s, r))

    return replace(broken, step=step)


# claim-keeps-pool: the claim hands the identity to a spare without taking it from the pool
def _claim_keeping_pool(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        return spec.step(cfg, s, r, arg).with_store(spares=s.store.spares)
    return step


# double-claim: helper hotswap.unclaimed reads no claim: every dead rank of the generation is "not
# claimed yet", so a second survivor claims it again (and takes another spare)
def _unclaimed_ignoring_claims(s: State, gen: int, cfg: Config | None = None) -> tuple[int, ...]:
    return hotswap.dead_in(s, gen)


# fence-reads-next-generation: helper hotswap.claim_of, for the fence, reads the identity's key of the
# generation after the deposed one (g{g+1}/spare/{rank}, empty): the woken process finds no later incarnation
_claim_of = hotswap.claim_of


def _claim_of_next_generation(s: State, gen: int, r: int) -> int | None:
    return _claim_of(s, gen + 1, r)


# ---- replace-r-only: phase 4 rebuilds R's failed groups alone (issue 25, P18.3) ------------------------
def _replace_keeping_wide(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        before = s.ranks[r].wide
        return spec.step(cfg, s, r, arg).with_rank(r, wide=before)
    return step


# ---- rebuild-everything: phase 4 rebuilds the groups over all of W on every rank in every episode (issue 40) -----
def _replace_rebuilding_wide(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        return spec.step(cfg, s, r, arg).with_rank(r, wide=s.ranks[r].gen + 1)
    return step


# ---- shrink and grow (issue 41, P19) -----------------------------------------------------------------
# fixed-share: a replica keeps its own share of the step after a shrink (the global batch shrinks with the job)
def _resume_with_fixed_share(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        t = spec.step(cfg, s, r, arg)
        if not cfg.shrink:
            return t
        g = s.ranks[r].gen
        mine = share(cfg.replica_of(r), cfg.replicas, cfg.total_micro_batches)
        return t.with_(shares=frozenset(e for e in t.shares if e[:2] != (g, r)) | {(g, r, mine)})
    return step


# shrink-last-replica: the shrink asks only whether each dead rank has a live replica, not whether one stays
def _shrink_without_keeping_shards(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        return cfg.shrink and not s.store.spares and cfg.replica_of(r) not in s.store.out and _detector_sees_dead(cfg, s, r)
    return enabled


# refill-double-count: a keeper's fresh spare is counted twice in the pool
def _refill_counting_twice(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        t = spec.step(cfg, s, r, arg)
        return t.with_store(spares=t.store.spares + 1)
    return step


# ---- issue 42: a mechanism that silently stops doing its job -------------------------------------------

# fence-skips-rank: the commit fence does not guard the job's last rank: after a failure of a group of R's
# kind in forward or backward it may finish its step, commit it, and observe the failure at the boundary
# (as in a job without the fence); the others discard
_UNFENCED: dict[Config, Config] = {}


def _observe_past_the_fence(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, point):
        if spec.enabled(cfg, s, r, point):
            return True
        if not cfg.fence or point != "boundary" or r != len(cfg.world) - 1:
            return False
        bare = _UNFENCED.get(cfg)
        if bare is None:
            bare = _UNFENCED[cfg] = cfg.with_(fence=False)
        return spec.enabled(bare, s, r, point)
    return enabled


# spare-stale-view: a claimed spare takes its identity with the view of the commit before the last one:
# it posts at the control barrier a frontier one episode old
def _join_with_stale_view(spec: ActionSpec) -> Step:
    def step(cfg, s, r, arg):
        t = spec.step(cfg, s, r, arg)
        stale = t.ranks[r].frontier - max(cfg.advance, 1)
        return t.with_rank(r, frontier=stale, tau=stale)
    return step


# validate-r-only: phase 6 validates only the groups the store's failure record names (R's); a group
# rebuilt because the episode rebuilds every group (a step abandoned in flight, a death) is released
# without its validation collective
def _ready_without_validation(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        if spec.enabled(cfg, s, r, arg):
            return True
        rk, f = s.ranks[r], s.store.failed
        return (rk.pc == PC_REBOUND and _via_store(s, r) and f is not None and f[0] == rk.gen
                and cfg.group_of(r) not in f[2] and _rebuilds(cfg, s, r))
    return enabled


# validation-wrong-membership: helper _dp_peers (whom a rank's validation collective waits for and whose
# digests it compares) returns the ranks of the rank's own replica instead of its group's members
def _dp_peers_of_own_replica(cfg: Config, s: State, r: int) -> tuple[int, ...]:
    return cfg.replica_ranks(cfg.replica_of(r))


# transfer-before-spare-rebuilt: a replica broadcasts its state as soon as it has rebuilt and rebound,
# not waiting for the spare to rebuild the new group (the spare still stands on its old view)
def _transfer_before_spare_rebuilt(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, arg):
        if spec.enabled(cfg, s, r, arg):
            return True
        spares = _spares_to_load(cfg, s, r)
        return (s.ranks[r].pc == PC_REBOUND and _active(s, r) and s.ranks[r].shard != SHARD_NONE and bool(spares)
                and all(s.ranks[d].pc in (PC_ARRIVED, PC_AGREED, PC_REPLACED, PC_REBOUND) and _active(s, d) for d in spares))
    return enabled


# probe-swallowed: the boundary probe's failed collective on R is swallowed: a member of the failed group
# observes a boundary failure only through a revoke some other rank published
def _observe_without_probe(spec: ActionSpec) -> Enabled:
    def enabled(cfg, s, r, point):
        if not spec.enabled(cfg, s, r, point):
            return False
        f = s.store.failed
        return not (point == "boundary" and f is not None and f[1] == "boundary" and not s.store.dead
                    and _member(cfg, s, r) and s.ranks[r].gen not in s.store.revoked)
    return enabled


# flag-ignores-link: helper _flag_fails does not see a broken link: the failure flag over W fails only under
# a gone or hung peer or a published wide revoke, so a link no group of R's kind crosses is never observed
def _flag_fails_ignoring_links(cfg: Config, s: State, r: int) -> bool:
    return s.ranks[r].gen in s.store.wide_revoked or any(_gone(cfg, s, q) or pk.hung for q, pk in enumerate(s.ranks))


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("early-release", "the release is decided by the first vote instead of the last", ("S1", "S1.2"),
               {"RankReady": _step(_ready_first_vote_decides)}),
        Mutant("skip-agreement", "a rank passes phase 3 without waiting for the agreed decision", ("S2.2", "S2.3"),
               {"RankArrive": _step(_arrive_and_pass)}),
        Mutant("no-fence", "store keys are not namespaced by generation: stale decisions are read", ("S2.3", "S4.2", "S2.1"),
               _NO_FENCE),
        Mutant("partial-rebind", "rebinding updates only the first cached reference", ("S5",),
               {"RankRebind": _step(_rebind_first_only)}),
        Mutant("admit-inflight", "the contract admits L1 for in-flight (forward/backward/optimizer) failures", ("S3",),
               {"RankGuard": _enabled(_contract_with(_as_boundary, _as_given, True)),
                "RankReject": _enabled(_contract_with(_as_boundary, _as_given, False))}),
        Mutant("ignore-guard", "the contract decides without the guard (outstanding gradients, a busy wrapper pass)", ("S3",),
               {"RankGuard": _enabled(_contract_with(_same, _always, True)),
                "RankReject": _enabled(_contract_with(_same, _always, False))}),
        Mutant("timeout-leaves-decision-open",
               "a rank whose wait expires writes the job abort and exits 72 but leaves its phase's decision key open",
               ("S1",), {name: _step(_timeout_without_decision) for name in ("RankTimeout", "RankSuspect")}),
        Mutant("overwrite-decision", "an abort overwrites its phase's decision (a plain set instead of compare_set)",
               ("S2.1", "S1"), {name: _step(_overwrite) for name in ("RankTimeout", "RankSuspect", "RankExpire", "RankFail",
                                                                     "RankReject")}),
        Mutant("skip-validation", "members of R pass phase 6 alone: no validation collective, no digest comparison",
               ("S20", "S8"), {"RankValidate": _enabled(_validate_alone)}),
        Mutant("no-frontier-check", "the agreement decides commit without comparing every F with rank 0's", ("S2.2", "S6", "S14"),
               {"RankDecideAgreement": _step(_decide_without_frontiers)}),
        Mutant("stale-release", "once every vote is in, a rank resumes on a release decided in any generation", ("S4.2",),
               {"RankResume": _enabled(_resume_on_any_release)}),
        Mutant("reload-on-resume", "resuming reloads the last checkpoint in place (replays F - C) instead of keeping S_app",
               ("S6",), {"RankResume": _step(_resume_from_checkpoint)}),
        Mutant("linger", "survivors keep waiting instead of exiting on an abort, an expired deadline or a suspected peer",
               ("deadlock", "L2"), {name: _disabled for name in ("RankTimeout", "RankSuspect", "RankExpire", "RankExit")}),
        Mutant("wait-on-lost-store", "a rank whose store operation fails keeps retrying: nobody exits when the store is lost",
               ("deadlock", "L2"), {"RankLoseStore": _disabled}),
        Mutant("no-step-deadline", "the watchdog has no step deadline: a hung rank exits only on the abort key",
               ("deadlock", "L2"), {"RankExpire": _disabled}),
        # hot swap (issue 13)
        Mutant("transfer-from-stale-replica",
               "a replica sends its state to the spare before it discarded its uncommitted step (RNG and cursor past F)",
               ("S21", "S9"), {"RankTransferState": _enabled(_transfer_any_time)}),
        Mutant("no-identity-fence", "a deposed holder that wakes is not fenced out by its identity's incarnation: it acts as the rank again",
               ("S10",), {"RankFenced": _step(_wake_unfenced)}),
        Mutant("keep-partial-grads", "discarding the uncommitted step leaves its gradients (the wrapper is not back to idle)",
               ("S11",), {"RankDiscardStep": _step(_discard_keeping(grads=True))}),
        Mutant("discard-keeps-cursor", "discarding the uncommitted step leaves the RNG and data cursor past F",
               ("S11",), {"RankDiscardStep": _step(_discard_keeping(ahead=1))}),
        Mutant("swap-without-replica",
               "a spare is claimed although no replica of the dead rank lives, and a rank of another replicate group sends the state",
               ("S12", "S9"), {"RankClaimSpare": _enabled(_claim_without_replica), "RankTransferState": _transfer_from_anyone}),
        # issue 24: helpers replaced for the protocol, and a history fact written wrong
        Mutant("weak-replicas-agree",
               "helper _replicas_agree (phase 6's digests) ignores a corrupt replica's bits",
               ("S8",), _helper_everywhere("_replicas_agree", _replicas_agree_ignoring_bits)),
        Mutant("shrunk-member",
               "helper _member (who is in R) counts only the first member of each failed group: the others keep the broken communicator",
               ("S5", "S20"), _helper_everywhere("_member", _member_first_only)),
        Mutant("resume-skips-batch", "resuming (L1) moves the RNG and data cursor one step past F: a batch is skipped",
               ("S6",), {"RankResume": _step(_resume_past_cursor)}),
        Mutant("transfer-fact-always-replica",
               "swap-without-replica, and the history fact transfers records every sender as a replica of the dead rank",
               ("S9",), {"RankClaimSpare": _enabled(_claim_without_replica),
                         "RankTransferState": _transfer_claiming_replica}),
        Mutant("fence-reads-next-generation",
               "helper hotswap.claim_of, for the fence, reads the next generation's identity key: a woken deposed process finds no later incarnation and acts",
               ("S10",), {"RankFenced": _with_helper("claim_of", _claim_of_next_generation, hotswap)}),
        # issue 24: one holder per identity and incarnation, the spare pool conserved (S13)
        Mutant("claim-keeps-pool", "claiming a spare for a dead rank does not take it from the pool (Store.spares)",
               ("S13",), {"RankClaimSpare": _step(_claim_keeping_pool)}),
        # issue 27 (P17): in-flight discard
        Mutant("report-published-frontier",
               "a rank that committed the step an in-flight failure struck in (its backward completed) reports the "
               "frontier it published before that step, so phase 3 passes it beside ranks that discard the step",
               ("S14", "S6"), {"RankObserve": _step(_observe_reporting_published)}),
        # issue 25 (P18): a link failure breaks every group over all of W
        Mutant("replace-r-only",
               "phase 4 rebuilds only the failed groups of R's kind: the control, checkpoint and default groups, which "
               "cross every link, stay on the broken one",
               ("S15",), {"RankReplace": _step(_replace_keeping_wide)}),
        # issue 40 (P18.3): an episode costs what failed, not what exists
        Mutant("rebuild-everything",
               "phase 4 rebuilds the groups over all of W on every rank in every episode, whether or not any of them "
               "failed (O(W^2) connections per episode at scale)",
               ("S16",), {"RankReplace": _step(_replace_rebuilding_wide)}),
        Mutant("double-claim",
               "helper hotswap.unclaimed ignores the claims: a dead identity is claimed again by another survivor",
               ("S13",), _helper_everywhere("unclaimed", _unclaimed_ignoring_claims, hotswap)),
        # issue 41 (P19): shrink, grow, refill
        Mutant("fixed-share",
               "after a shrink each replica keeps its own share of the step (torchft's behaviour): the micro-batches of "
               "the replica that left are never processed, the global batch shrinks with the job",
               ("S17",), {"RankResume": _step(_resume_with_fixed_share)}),
        Mutant("shrink-last-replica",
               "the shrink asks only that no spare is idle, not that every shard keeps a live replica in a replica that "
               "stays: two deaths in two replicas take both out",
               ("S18",), {"RankShrink": _enabled(_shrink_without_keeping_shards)}),
        Mutant("refill-double-count", "a keeper's fresh spare for a dead worker is counted twice in the pool",
               ("S13",), {"KeeperRefill": _step(_refill_counting_twice)}),
        # issue 42: each mechanism's guarantee, and L1 where it was due
        Mutant("fence-skips-rank",
               "the commit fence does not guard the last rank: after a failure of a group of R's kind in forward or "
               "backward it commits its step and observes at the boundary while the others discard (L2 by mismatch)",
               ("S19",), {"RankObserve": _enabled(_observe_past_the_fence)}),
        Mutant("spare-stale-view",
               "a claimed spare joins with the view of the commit before its identity's last one: it posts a frontier "
               "one episode old and the agreement aborts (L2 where the swap was L1)",
               ("L4",), {"SpareJoin": _step(_join_with_stale_view)}),
        Mutant("validate-r-only",
               "phase 6 validates only the groups the store's failure record names: a group rebuilt because the "
               "episode rebuilds every group (a step abandoned in flight, a death) is released without its validation",
               ("S8",), {"RankReady": _enabled(_ready_without_validation)}),
        Mutant("validation-wrong-membership",
               "helper _dp_peers (the validation collective's membership) returns the ranks of the rank's own "
               "replica, not its group's members: the collective completes and is recorded without the group",
               ("S20",), _helper_everywhere("_dp_peers", _dp_peers_of_own_replica)),
        Mutant("transfer-before-spare-rebuilt",
               "a replica broadcasts its state to the spare as soon as it rebound, before the spare rebuilt the new group",
               ("S21",), {"RankTransferState": _enabled(_transfer_before_spare_rebuilt)}),
        Mutant("probe-swallowed",
               "the boundary probe's failed collective on R is swallowed: a member observes a boundary failure of its "
               "group only through a revoke, which no one then publishes",
               ("L5",), {"RankObserve": _enabled(_observe_without_probe)}),
        Mutant("flag-ignores-link",
               "helper _flag_fails does not see a broken link: a link cut that no group of R's kind crosses is "
               "observed by no rank, and the job trains on",
               ("L6",), _helper_everywhere("_flag_fails", _flag_fails_ignoring_links)),
    )
}


def get(name: str) -> Mutant:
    """The mutant called ``name``; the error lists the valid names."""
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; choose one of: {', '.join(MUTANTS)}") from None


@functools.lru_cache(maxsize=None)
def table(name: str) -> dict[str, ActionSpec]:
    """The action table of mutant ``name``: :data:`ACTIONS` with its replacements."""
    m = get(name)
    unknown = set(m.replace) - set(ACTIONS)
    if unknown:
        raise ValueError(f"mutant {name!r} replaces unknown action(s) {sorted(unknown)}")
    return {n: (m.replace[n](spec) if n in m.replace else spec) for n, spec in ACTIONS.items()}
