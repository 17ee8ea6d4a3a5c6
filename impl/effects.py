"""The engine's effects: one method per model action this rank performs, in ``model/protocol.py``'s order.

Read beside ``ACTIONS``: ``_observe`` is ``RankObserve``, ``_discard_step`` is ``RankDiscardStep``,
``_guard`` is ``RankGuard``, ``_reject`` is ``RankReject`` ... ``_transfer_state`` is
``RankTransferState``.  An effect does the action's I/O and hands back what its record says
(:class:`~accelpact.impl.episode.Done`), or None when this rank does not perform the action; the
episode driver (:func:`~accelpact.impl.episode.drive`) writes the record.  The actions that end the
rank (``RankReject``, ``RankTimeout``, ``RankFail``) write their record in :meth:`Effects._exit`, the
one exit path of the engine; the watchdog's (``RankExpire``, ``RankSuspect``, ``RankExit``,
``RankLoseStore``) are its own (:mod:`accelpact.impl.watchdog`).  ``SpareJoin`` is the spare's
(:meth:`accelpact.impl.spare.SpareEngine.join`).  ``RankFenced`` has no effect here:
spec/protocol.md, "Differences from the model".

A repair (``Episode.swap`` None) and a hot swap or discard share each action: where they differ (a
repair rebuilds R, a swap every group; a repair rebinds R's references, a swap rebuilds the model),
the effect branches on the episode.  A shrink and a grow (issue 41, :mod:`accelpact.impl.shrink`) are
the swap's episode too (``SwapFacts.mode``): a shrink's decision (``RankShrink``) leaves the dead
ranks' replicas out of g+1 and claims nothing (a live rank of a leaving replica: ``RankLeave``); a
grow claims a spare, or the identity's own benched holder, for each vacant identity.  Every count and
group of the episode is over the ranks of g+1 (``SwapFacts.active``; the control plane's ``members``).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from typing import Any, Callable

import torch

from accelpact.model import hotswap as model_swap
from accelpact.model.contract import DISCARD_PHASES, ObservationKey, decide
from accelpact.model.state import (DECISION_COMMIT, DECISION_RELEASE, PC_AGREED, PC_EXITED, PC_LEFT, PC_OBSERVED,
                                   PC_REBOUND, PC_TRAIN, REASON_DEADLINE, REASON_EXCEPTION, REASON_MISMATCH,
                                   REASON_REJECTED)

from .controlplane import WIDE_ENTRY, ControlPlane, swap_prefix, swap_rebuilt_key
from . import shrink as _shrink
from .episode import Done, Episode, Exited, Left
from .exitcodes import claim_exit, code_for, exit_now, holding_exit
from .hooks import Hooks
from .runtime import hotswap as _swap
from .runtime import rng as _rng
from .runtime.adapters import adapter_for, adopt_group_name
from .runtime.backends import backend_of, wait_bounded
from .runtime.digest import checksum_hex, state_checksum
from .runtime.retire import retire_off_path
from .runtime.wrappers import wrapper_of
from .watchdog import Watchdog

__all__ = ["EXITS", "Effects", "RebindError", "ValidationError"]


class RebindError(RuntimeError):
    """Phase 5: references to the old communicator remain after rebinding."""


class ValidationError(RuntimeError):
    """Phase 6: the validation collective or the replica digests disagree."""


def rebuild_in_place(job: Any, extra: Any) -> tuple[Any, Any]:
    """The ``Rebuild.build`` of a job attached without ``rebuild=`` whose wrapper resets in place
    (:meth:`accelpact.impl.runtime.adapters.base.Adapter.in_place_problem` is None: FSDP2): a marker,
    never called.  A discard's ``RankRebind`` then keeps the wrapper and the optimizer: it resets the
    wrapper's iteration state and rebinds every reference to the groups it rebuilt
    (:meth:`Effects._rebind_in_place`)."""
    raise AssertionError("rebuild_in_place is a marker: Effects._rebind keeps the wrapper instead of calling it")


#: The exits the engine records itself: the model's exit reason -> its action.
EXITS: dict[str, str] = {REASON_REJECTED: "RankReject", REASON_DEADLINE: "RankTimeout", REASON_EXCEPTION: "RankFail"}


def _group_name(pg: Any) -> str:
    """A process group's c10d name (the checker reads the generation from it)."""
    return str(pg.group_name)


class Effects:
    """What every engine of a rank shares, a survivor's (:class:`~accelpact.impl.recovery.Pact`) and a
    spare's (:class:`~accelpact.impl.spare.SpareEngine`): the effects, the record and the exits.

    A subclass sets ``rank``, ``control``, ``trace``, ``hooks``, ``gen``, ``pc``, ``deadline_s`` and
    ``watchdog``, and provides ``frontier`` and ``tau``; a repair's effects also read the survivor's
    ``module``, ``optimizer``, ``guard``, ``groups``, ``strategy``, ``adapter``, ``sites``, ``envelope``,
    ``key`` and R (``_pg``, ``_record``)."""

    rank: int
    control: ControlPlane
    trace: Any
    hooks: Hooks
    gen: int
    pc: str
    deadline_s: float
    watchdog: Watchdog
    #: the heartbeat detector, and R's collective timeout (s), that the straggler wait reads; a spare's
    #: engine has neither, and so never stretches its wait
    detector: Any = None
    collective_timeout_s: float | None = None
    #: the generation whose failure this rank last recorded (RankObserve)
    _observed_gen: int = -1
    #: the write/record hold of one model action (a seeded bug may replace it)
    _hold: Callable[[], Any] = staticmethod(holding_exit)
    # a survivor's (Pact's), for a repair's and a discard's effects
    module: Any
    optimizer: Any
    guard: Any
    groups: Any
    strategy: Any
    adapter: Any
    sites: list
    envelope: Any
    key: ObservationKey
    wide: Any
    _pg: Any
    _r_record: Any
    _retiring: list
    _episode: Episode | None
    #: a discard in place, between ``RankReplace`` and ``RankRebind``: the groups of generation g the
    #: wrapper may hold (kind -> group), their c10d names and the job's DeviceMesh, as they were before
    #: the rebuild retired them (:meth:`_rebind_in_place` rebinds each to its successor)
    _in_place_old: tuple[dict, dict, Any] | None = None
    #: the engine's own objects, where a walk of the module for cached references stops (Pact's)
    _own_objects: Callable[[], tuple]

    @property
    def frontier(self) -> int:  # pragma: no cover - every engine defines it
        raise NotImplementedError

    @property
    def tau(self) -> int:  # pragma: no cover - every engine defines it
        raise NotImplementedError

    # ---- the driver's interface -----------------------------------------------------------------
    def _arm(self) -> None:
        """Each control-plane write and its trace record form one model action, and an expired wait
        claims the exit before it writes the abort; then the hooks install what they install (a test's
        seeded bug replaces engine or control-plane methods here)."""
        self.control.claims_exit = True
        self.hooks.arm(engine=self, control=self.control)

    def _record(self, action: str, enters: str | None, done: Done) -> None:
        """The one trace record of ``action``: the rank now stands at ``enters`` (None: where it stood)."""
        if enters is not None:
            self.pc = enters
        self.trace.action(action, self.gen if done.gen is None else done.gen, done.outcome, {"pc": self.pc, **done.state},
                          done.detail)

    def _at(self, point: str) -> None:
        """Between actions: the hooks' point ``point`` (an external injector may act there; the engine
        applies nothing it says)."""
        self.hooks.point(point, self)

    def _key(self, point: str) -> ObservationKey:
        return ObservationKey(self.key.platform, self.key.profile, point, self.key.objective)

    # ---- RankObserve -----------------------------------------------------------------------------
    def _observe(self, point: str, error: BaseException | None, **facts: Any) -> None:
        """RankObserve: the failure of this generation, recorded once (a later observation of the same
        generation's failure adds nothing).  The record precedes every effect of the observation (the
        revoke, the failure flag, a vote): a peer can only learn of a failure a member observed.
        ``facts`` say how it was observed (``cause``: ``boundary``, ``flag``, ``wide``, ``death``,
        ``discard``, ``in_flight``)."""
        with self._hold():
            if self._observed_gen == self.gen:
                return
            self._record("RankObserve", PC_OBSERVED,
                         Done({**facts, "error": repr(error)[:300] if error is not None else None},
                              {"point": point, "frontier": self.frontier, "tau": self.tau}))
            self._observed_gen = self.gen

    # ---- RankRevokeWide --------------------------------------------------------------------------
    def _revoke_wide(self, error: BaseException | None, cause: str) -> bool:
        """RankRevokeWide (P18.4): a group over all of W failed under this rank (its failure flag, or a
        checkpoint save after a boundary that found nothing; ``cause``: ``flag``, ``save``): publish the
        wide revoke of this generation (single assignment: every watcher then closes its groups over W,
        so a peer blocked in the flag or the save wakes up, and after the agreement every rank rebuilds
        them, ``_replace``).  Only the first writer records it; it precedes the rank's observation
        (a rank that observed through its probe on R before publishes after it).  Returns whether
        this rank wrote it.  A lost store propagates (the caller's RankLoseStore)."""
        with self._hold():
            wrote = self.control.publish_wide_revoke(self.gen)
            if wrote:
                self._record("RankRevokeWide", None,
                             Done({"cause": cause, "error": repr(error)[:300] if error is not None else None}))
        return wrote

    # ---- RankDiscardStep -------------------------------------------------------------------------
    def _discard_step(self, ep: Episode) -> Done | None:
        """A failure inside forward or backward: the step's gradients are dropped and the rank stands
        at the committed boundary F again; the wrapper's runtime state of the step stays with the old
        wrapper, which :meth:`_rebind` replaces, and RNG and data cursor come back to F there.
        Nothing to discard after a commit (the optimizer or the boundary)."""
        sw = ep.swap
        assert sw is not None
        if sw.point not in model_swap.DISCARDABLE:
            return None
        self.optimizer.zero_grad(set_to_none=True)
        return Done({"from": sw.point}, {"point": "boundary", "frontier": self.frontier})

    # ---- RankGuard (RankReject: _exit) -----------------------------------------------------------
    def _guard(self, ep: Episode) -> Done:
        """A repair: the guard check (no outstanding gradients, wrapper idle, tau == F), then the
        contract on K; L2 is ``RankReject``.  A swap: every dead identity's spare is read from the
        claims that stand (one left without a spare is L2), the contract having said L1 at the claim."""
        if ep.swap is None:
            report = self.guard.check()
            decision = decide(self.envelope, self._key("boundary"), report.ok)
            if not decision.preserve:
                self._reject(decision.reason, report.reasons)
            return Done({"decision": decision.level, "why": decision.reason})
        sw = ep.swap
        if sw.dead and sw.mode != "shrink":
            claims = {d: _swap.claim_read(self.control.store, ep.g, d, self.deadline_s) for d in sw.dead}
            missing = [d for d, k in claims.items() if k is None]
            if missing:
                self._reject(f"rank(s) {missing} {'vacant' if sw.mode == 'grow' else 'died'} and no spare is left to "
                             "take their identity")
            sw.claims = {d: int(k) for d, k in claims.items() if k is not None}
        if sw.mode:
            return Done({"decision": sw.decision, "swap": True, sw.mode: list(sw.dead),
                         "active": list(sw.active) if sw.active is not None else None})
        return Done({"decision": sw.decision, "swap": True})

    def _reject(self, why: str, guard_reasons=()) -> None:
        """RankReject: the contract says L2; abort the job (every rank exits 70)."""
        self._exit(REASON_REJECTED, {"why": why, "guard": list(guard_reasons)})

    # ---- RankArrive, RankDecideAgreement, RankAwaitAgreement --------------------------------------
    def _arrive(self, ep: Episode) -> Done:
        """Report (F, g) at the control barrier (held: a peer may decide on a count that includes us)."""
        ep.frontier = self.frontier
        if ep.swap is not None and ep.swap.role == "spare":
            self._adopt_active(ep)
        count, last = self.control.arrive(ep.g, ep.frontier)
        ep.last_arriver = last
        return Done({"count": count, "last": last}, {"frontier": ep.frontier, "tau": self.tau})

    def _decide_agreement(self, ep: Episode) -> Done | None:
        """The last arriver compares every (F, g) with rank 0's and decides commit or abort:mismatch;
        an abort is recorded, then the job abort written, then the rank exits (``Done.exit``: ``RankExit``)."""
        if not ep.last_arriver:
            return None
        dec = self.control.decide_agreement(ep.g)
        if dec == DECISION_COMMIT:
            return Done({"decision": dec})
        return Done({"decision": dec}, outcome="fail",
                    exit=dec[len("abort:"):] if dec.startswith("abort:") else REASON_MISMATCH)

    def _await_agreement(self, ep: Episode) -> Done:
        """The decision, or ``abort:deadline`` (RankTimeout) once the wait expires; the wait is
        ``deadline_s``, stretched for a step abandoned in flight (:meth:`_await_stragglers`).  After an
        episode whose failure flag failed, the failed groups of R's kind are those whose revoke stands
        (every member of a failed group published it before it arrived, and every rank has arrived),
        and R itself where it spans all of W."""
        until = time.monotonic() + self.deadline_s
        if ep.swap is not None and ep.swap.point in DISCARD_PHASES:
            until = self._await_stragglers(ep, until)
        dec = self.control.await_agreement(ep.g, until)
        if dec != DECISION_COMMIT:
            self._decided_abort(dec, expired=self.control.last_expired)
        if ep.failed is None:
            keys = [self.groups.name if self.groups.count == 1 else f"{self.groups.name}{i}" for i in range(self.groups.count)]
            # R over all of W (DDP) is one of the groups over W that failed: a link cut breaks it whether or
            # not a collective on it crossed the link yet (P18.3)
            over_w = len(self.groups.members) == len(getattr(self.control, "members", range(self.control.world_size)))
            ep.failed = tuple(i for i, k in enumerate(keys) if over_w or self.control.revoked(ep.g, k))
            ep.member = self.groups.index in ep.failed
        # which groups over W failed is learned, never assumed (P18.3): every rank whose flag, save or
        # fence failed published the wide revoke before it arrived, and every rank has arrived
        ep.wide_failed = ep.swap is None and self.control.revoked(ep.g, WIDE_ENTRY)
        return Done({"decision": dec})

    def _await_stragglers(self, ep: Episode, until: float) -> float:
        """When the agreement wait of an episode that abandoned a step in flight expires with peers
        still absent: an absent peer may be held in a collective of the abandoned step that the revoke
        did not wake (bench/README.md, K6); it arrives once that collective times out.  So while every
        absent peer still beats, the wait goes on, at most R's collective timeout past ``until``; a
        silent one ends it at ``until``.  Decides nothing: returns when the caller's wait is to end.
        Contrast the release wait, never stretched: by then every rank has arrived."""
        if self.detector is None or not self.collective_timeout_s:
            return until
        limit = until + self.collective_timeout_s
        noted = False
        while True:
            if self.control.decided_by(ep.g, "agree", until):
                return until
            now = time.monotonic()
            if now >= limit:
                return now
            absent = set(getattr(self.control, "members", range(self.control.world_size))) - self.control.arrived(ep.g)
            if not absent and noted:
                # the straggler arrived just now: its decision (it is the last arriver) is due at once
                return time.monotonic() + self.deadline_s
            if not absent or self.detector.beating(absent) != absent:
                return time.monotonic()
            if not noted:
                self.trace.note("await-straggler", gen=ep.g, absent=sorted(absent), limit_s=round(limit - now, 3))
                noted = True
            until = min(time.monotonic() + 1.0, limit)

    # ---- RankReplace -----------------------------------------------------------------------------
    def _replace(self, ep: Episode) -> Done:
        """The groups of generation g+1: what failed, never what exists.  A repair: a member of a failed
        group of R's kind builds R's communicator with the same members (every member of R in that
        order, so no rendezvous waits on a rank that waits on it); every rank builds the groups over
        all of W only where their failure was learned (``Episode.wide_failed``, P18.3: a broken link
        that no collective crossed yet is found by the first one that does, a later episode).  A swap
        or a discard: every group of the job (each contains the dead identity, or a collective of the
        abandoned step is in flight on it; ``comm``: the namespace they are built under)."""
        t = time.monotonic_ns()
        g_next = ep.g + 1
        if ep.swap is not None:
            if ep.swap.rebuild is rebuild_in_place:
                self._in_place_old = self._groups_held(ep)
            ep.swap.job.groups.rebuild_all(ep.swap.job.rank, g_next, ep.swap.held, active=ep.swap.active)
            ep.swap.held = ()
            return Done({"groups": sorted(ep.swap.job.groups.training) + ["default", "control", "checkpoint"], "swap": True,
                         "duration_ns": time.monotonic_ns() - t}, {"comm": swap_prefix(g_next), "wide": g_next})
        state: dict[str, Any] = {}
        built: list[str] = []
        if ep.member:
            members, key = self._new_members(ep)
            ep.new_pg = self.strategy.replace(self._pg, g_next, members, self.rank, self.control.store,
                                              self.deadline_s, name=key)
            state["comm"] = _group_name(ep.new_pg)
            built.append(key)
        if self.wide is not None and ep.wide_failed:
            names, control, records = self.wide(g_next)
            self.groups = dataclasses.replace(self.groups, control=control, others={**self.groups.others, **records})
            built += names
            state["wide"] = g_next
        return Done({"groups": built, "wide": bool(ep.wide_failed), "duration_ns": time.monotonic_ns() - t}, state)

    def _groups_held(self, ep: Episode) -> tuple[dict, dict, Any]:
        """Before a discard in place rebuilds every group: the training groups of generation g (R from
        the engine, which holds it apart from the job's record), their c10d names (the rebuild
        unregisters them) and the job's DeviceMesh."""
        import torch.distributed.distributed_c10d as c10d

        sw = ep.swap
        assert sw is not None
        old = dict(sw.job.groups.training)
        if self._pg is not None:
            old[self.groups.name] = self._pg
        names = {k: c10d._world.pg_names.get(pg) for k, pg in old.items()}
        return old, names, sw.job.groups.mesh

    def _new_members(self, ep: Episode) -> tuple[tuple[int, ...], str]:
        """R's members in g+1 (the same as in g) and its name in store keys."""
        return self.groups.members, self.groups.key

    # ---- RankRebind ------------------------------------------------------------------------------
    def _rebind(self, ep: Episode) -> Done:
        """A repair: every cached reference to the old communicator names the new one (sites
        discovered at attach), verified: a stale reference is a :class:`RebindError`; the old group is
        destroyed off the critical path.  A swap: the model is built anew on the new groups (the user's
        ``rebuild``), so no reference to an old group can remain; RNG back to F; a survivor moves its
        committed state into it; then every rank of W waits until all have rebuilt (a spare's first
        build is slow: :meth:`_transfer_state` waits for it under the phase deadline, not inside a transfer)."""
        t = time.monotonic_ns()
        if ep.swap is not None and ep.swap.rebuild is rebuild_in_place:
            return self._rebind_in_place(ep)
        if ep.swap is not None:
            sw = ep.swap
            if sw.old is not None:
                self._shed(*sw.old)
            sw.module, sw.optimizer = sw.rebuild(sw.job, sw.extra)
            sw.kind = wrapper_of(sw.module).recovers
            # RNG back to F: the CPU generator and the CUDA generator of this rank's device (rng.restore;
            # a spare restores the dead rank's state on its own device)
            _rng.restore(sw.rng, getattr(sw.job, "device", None))
            if sw.old is not None:
                # the old optimizer's state tensors become the new one's (adopt): the state is held once
                manifest, tensors = _swap.export_state(*sw.old)
                _swap.import_state(sw.module, sw.optimizer, manifest, tensors, adopt=True)
                del tensors
                adapter_for(sw.old[0]).release(sw.old[0], keep=sw.module)  # what a failed backward left
                sw.old = None
            return Done({"rebuilt": True, "duration_ns": time.monotonic_ns() - t}, {"refs_stale": 0})
        stale = 0
        # the engine's own reference moves first: it is one of the references to rebind
        old_pg, self._pg, self._r_record = self._pg, ep.new_pg, self.strategy.last_record
        if self.strategy.needs_rebind:
            stale, total = self._rebind_sites(old_pg, ep.new_pg)
            ep.refs_rebound = total - stale
        retiring = [old_pg]  # this frame's last reference: the old group is destroyed off the critical path
        del old_pg
        self._retiring = [ev for ev in self._retiring if not ev.is_set()] + [retire_off_path(retiring)]
        return Done({"refs_rebound": ep.refs_rebound, "duration_ns": time.monotonic_ns() - t}, {"refs_stale": stale})

    def _shed(self, module: Any, optimizer: Any) -> None:
        """A survivor's old wrapper, before its replacement is built beside it: what it holds beyond
        the committed state let go (:meth:`~accelpact.impl.runtime.adapters.base.Adapter.shed`), so the
        episode's peak memory is one model's working set plus one more copy of the parameters, not
        two models'.  Memory only: a wrapper whose shedding fails is dropped whole after the state
        moved, as before, and the rank says so on stderr (one line: the episode's peak is then higher)."""
        try:
            adapter_for(module).shed(module, optimizer)
        except Exception as exc:  # noqa: BLE001 - memory only: the committed state is read from the local shards either way
            print(f"accelpact: rank {self.rank}: the old wrapper kept its working memory through the rebuild "
                  f"(shedding it raised {type(exc).__name__}: {exc})", file=sys.stderr, flush=True)

    def _rebind_in_place(self, ep: Episode) -> Done:
        """``RankRebind`` of a discard in place (a job without ``rebuild=`` whose wrapper resets in
        place, spec/protocol.md P17.3): the same wrapper and optimizer go on.  The wrapper's state of
        the aborted iteration is dropped (:meth:`_reset_wrapper`); every cached reference to a group
        of generation g reachable from the module (the adapter's sites and the walker's, as a repair
        finds R's) names its successor of g+1, which takes its c10d name (DeviceMesh and DTensor
        resolve groups by name), verified: a stale reference is a :class:`RebindError`; the job's
        DeviceMesh is the module's again; RNG back to F; the old groups are let go off the critical
        path.  The committed state is the wrapper's own: nothing of a step abandoned before its commit
        fence touched the parameters or the optimizer state (P17.2), and ``RankDiscardStep`` dropped
        the gradients."""
        t = time.monotonic_ns()
        sw = ep.swap
        assert sw is not None and self._in_place_old is not None
        old, names, mesh = self._in_place_old
        self._in_place_old = None
        self._reset_wrapper(self.module)
        rebound = sum(self._rebind_group(kind, pg, sw.job.groups.training.get(kind), names.get(kind), mesh, ep.g)
                      for kind, pg in old.items())
        if mesh is not None:
            sw.job.groups.mesh = mesh  # job.mesh is the module's mesh, its registry on the new groups
        box = list(old.values())  # the last references to generation g's groups here: dropped off the path
        old.clear()
        self._retiring = [ev for ev in self._retiring if not ev.is_set()] + [retire_off_path(box)]
        _rng.restore(sw.rng, getattr(sw.job, "device", None))
        self._restore_extra(sw)
        sw.module, sw.optimizer, sw.old = self.module, self.optimizer, None
        sw.kind = wrapper_of(self.module).recovers
        ep.refs_rebound = rebound
        return Done({"rebuilt": False, "in_place": True, "refs_rebound": rebound,
                     "duration_ns": time.monotonic_ns() - t}, {"refs_stale": 0})

    def _rebind_group(self, kind: str, old_pg: Any, new_pg: Any, name: str | None, mesh: Any, g: int) -> int:
        """One group of a discard in place: every reference to ``old_pg`` reachable from the module (and
        in ``mesh``'s registry) rebound to ``new_pg``, which takes the c10d ``name`` ``old_pg`` had;
        the references rebound, or a :class:`RebindError` naming those left."""
        from .runtime.adapters import find_references, site_set

        if new_pg is None or new_pg is old_pg:
            return 0
        module, stop = self.module, self._own_objects()
        sites = list(self.adapter.discover(module, old_pg))
        known = site_set(sites)
        sites += [s for s in find_references(module, old_pg, stop=stop) if (s.owner_id, s.kind, s.key) not in known]
        if mesh is not None:  # the job's mesh, where the module does not reach it (its registry names the groups)
            known = site_set(sites)
            sites += [s for s in _mesh_registry_sites(mesh, old_pg) if (s.owner_id, s.kind, s.key) not in known]
        if sites:
            self.adapter.rebind(module, sites, old_pg, new_pg)
        adopt_group_name(old_pg, new_pg, name=name)
        check = self.adapter.verify_sites(sites, old_pg, new_pg)
        left = find_references(module, old_pg, stop=stop)
        if not check.ok or left:
            raise RebindError(f"discard in place: {int(check.stale) + len(left)} cached reference(s) still name the "
                              f"generation-{g} {kind} group after rebinding: {check.detail or [s.path for s in left[:6]]}")
        return len(sites)

    def _reset_wrapper(self, module: Any) -> None:
        """The wrapper's per-iteration state of the aborted forward or backward dropped, in place
        (:meth:`accelpact.impl.runtime.adapters.base.Adapter.reset_iter_state`; FSDP2:
        ``FSDPModule.reset_iter_state``)."""
        self.adapter.reset_iter_state(module)

    def _restore_extra(self, sw: Any) -> None:
        """A discard in place: ``run.restored_extra`` becomes the rank's extra state at F (what
        ``extra_state()`` returned at the last committed boundary), so that the loop, which has no
        ``rebuild(job, extra)`` to be handed it, sets its data loader back to F before the step comes
        again."""
        training = getattr(sw.job, "training", None)
        if sw.role == "survivor" and training is not None:
            training.restored_extra = copy.deepcopy(sw.extra)

    def _rebind_sites(self, old_pg: Any, new_pg: Any) -> tuple[int, int]:
        """Rebind every known site from ``old_pg`` to ``new_pg`` and verify: (stale, total); a stale
        reference left is a :class:`RebindError`."""
        self.adapter.rebind(self.module, self.sites, old_pg, new_pg)
        check = self.adapter.verify_sites(self.sites, old_pg, new_pg)
        if not check.ok:
            raise RebindError(f"{int(check.stale)} of {check.total} cached references still name the old "
                              f"communicator after rebinding: {check.detail}")
        return int(check.stale), int(check.total)

    # ---- RankValidate ----------------------------------------------------------------------------
    def _validate(self, ep: Episode) -> Done:
        """On the new group of R's kind, an all-reduce that counts its members, then every replica's
        state checksum compared (one all-gather), each wait bounded by the phase deadline; a difference
        is a :class:`ValidationError` (L2)."""
        t = time.monotonic_ns()
        if ep.swap is not None:
            sw = ep.swap
            members = tuple(sw.job.groups.members(sw.job.topology.group(sw.kind, self.rank)))
            digest = _swap.validate(sw.job.groups.training[sw.kind], members, self.rank, sw.module, sw.optimizer,
                                    self.deadline_s)
            return Done({"digest": digest, "duration_ns": time.monotonic_ns() - t})
        n = len(self.groups.members)
        device = backend_of(ep.new_pg).device_for(ep.new_pg)
        one = torch.ones(1, device=device)
        wait_bounded(ep.new_pg.allreduce([one]), self.deadline_s)
        if int(one[0]) != n:
            raise ValidationError(f"validation all-reduce on generation-{ep.g + 1} R gave {int(one[0])}, expected {n}")
        mine = state_checksum(self.module, self.optimizer, device)
        outs = [torch.empty_like(mine) for _ in range(n)]
        wait_bounded(ep.new_pg.allgather([outs], [mine]), self.deadline_s)
        differing = [self.groups.members[i] for i, o in enumerate(outs) if not torch.equal(o, mine)]
        if differing:
            raise ValidationError(f"replica checksums differ from rank {self.rank}'s on rank(s) {differing}: "
                                  "replicas of R do not hold identical shards; restart from the checkpoint (L2)")
        return Done({"digest": checksum_hex(mine), "duration_ns": time.monotonic_ns() - t})

    # ---- RankReady, RankDecideRelease, RankResume --------------------------------------------------
    def _ready(self, ep: Episode) -> Done:
        """Post the release vote (held: the last voter decides on a count that includes us)."""
        count, last = self.control.ready(ep.g)
        ep.last_ready = last
        return Done({"count": count, "last": last})

    def _decide_release(self, ep: Episode) -> Done | None:
        """The last ready rank decides the release (every rank of W voted)."""
        if not ep.last_ready:
            return None
        dec = self.control.decide_release(ep.g)
        return Done({"decision": dec}, outcome="ok" if dec == DECISION_RELEASE else "fail")

    def _resume(self, ep: Episode) -> Done:
        """Read the release (an abort decision, or an expired wait, ends the rank), then generation g+1
        at F.  A repair: R's new communicator is watched and its revoke retired.  A swap: on the rebuilt
        model (an engine of g+1 is attached to it; this one retires)."""
        dec = self.control.await_release(ep.g, time.monotonic() + self.deadline_s)
        if dec != DECISION_RELEASE:
            self._decided_abort(dec, expired=self.control.last_expired)
        t = time.monotonic_ns()
        self.gen = ep.g + 1
        self._episode = None
        facts = self._batch_facts(ep)
        if ep.swap is not None:
            return Done({"from_gen": ep.g, "swap": True}, {"gen": self.gen, "point": "", **facts}, gen=ep.g)
        ep.new_pg = None
        self.watchdog.watch(self.gen, self.groups.key, self._r_record)
        self.control.retire_revoke(ep.g, self.groups.key)
        ep.durations["resume"] = time.monotonic_ns() - t
        return Done({"from_gen": ep.g}, {"gen": self.gen, "point": "", **facts}, gen=ep.g)

    def _batch_facts(self, ep: Episode) -> dict[str, Any]:
        """Issue 41: in a job that opted in (micro-batches), what the RankResume record says of the
        generation it resumes in: this rank's micro-batch share and the active replicas."""
        rebuild = getattr(self, "rebuild", None)  # a survivor's repair: the job is its Rebuild's
        job = ep.swap.job if ep.swap is not None else getattr(rebuild, "job", None)
        total = getattr(job, "_micro_batches", None) if job is not None else None
        if not total or job is None:
            return {}
        from accelpact.model.batches import share

        kind = ep.swap.kind if ep.swap is not None and ep.swap.kind else self.groups.name
        topo = job.topology
        active = _shrink.active_replicas(topo, kind, job.groups.active)
        mine = _shrink.replica_of(topo, kind, job.rank)
        return {"share": list(share(mine, active, total)) if mine in active else [], "active": list(active)}

    # ---- the exits: RankTimeout, RankFail (and RankReject's, _reject) ---------------------------------
    def _exit(self, reason: str, detail: dict) -> None:
        """The one exit path of the engine's own exits (``EXITS``): claim the exit, record the reason's
        action, write the phase's abort decision and the job's abort, end the process with its code."""
        claim_exit()
        action = EXITS[reason]
        g, which = self.gen, self.control.decision_for(self.pc)

        def record() -> None:
            self._record(action, PC_EXITED, Done(detail, {"reason": reason}, outcome="fail", gen=g))
            try:
                self.control.write_abort_decision(g, which, reason)
                self.control.abort(reason)
            except Exception:  # noqa: BLE001 - store lost: peers' watchdogs exit DEADLINE on their own
                pass

        exit_now(code_for(reason), reason, self.trace, record=record, claimed=True)
        raise Exited

    def _exit_on_abort(self, reason: str) -> None:
        """RankExit on the job abort ``reason`` (written first if none stands): a decision this rank took."""
        self.watchdog.exit_on_abort(reason)
        raise Exited

    def _decided_abort(self, dec: str, expired: bool) -> None:
        """A decision key says abort.  If our own wait expired we are the RankTimeout; otherwise a peer
        decided and we exit on the job abort (RankExit)."""
        reason = dec[len("abort:"):] if dec.startswith("abort:") else REASON_EXCEPTION
        if expired and reason == REASON_DEADLINE:
            self._exit(REASON_DEADLINE, {"decision": dec})
        self.watchdog.exit_on_abort(reason)
        raise Exited

    def _fail(self, exc: BaseException) -> None:
        """An exception in an episode's steps: RankFail, or RankTimeout if it was a wait on peers that
        failed (building a group, a collective of phase 6, the boundary's flag: a communication error
        there is a peer that died or never came).  Our own errors (stale references, digests, an
        injected exception) are RankFail.  A store that is gone is RankLoseStore; an abort that already
        stands is RankExit on it."""
        claim_exit()
        if not self.control.reachable():
            self.watchdog.lose_store(exc, claimed=True)
            raise Exited
        own_error = isinstance(exc, (RebindError, ValidationError, _swap.SwapError)) or not isinstance(exc, (RuntimeError, OSError))
        if not own_error:
            try:
                standing = self.control.read_abort()
            except Exception:  # noqa: BLE001 - store lost: no standing abort can be read
                standing = ""
            if standing:
                self.watchdog.exit_with(standing, claimed=True)  # records RankExit, os._exit
                raise Exited
        timed_out = self.pc in (PC_TRAIN, PC_AGREED, PC_REBOUND) and not own_error
        if timed_out and not self._first_to_expire(self.gen, self.control.decision_for(self.pc)):
            # a peer's wait on the same decision failed first: its RankTimeout writes the abort (the
            # model has one timeout per decision, then no more: an abort stands); we exit on it
            standing = self.control.wait_abort(self.deadline_s)
            self.watchdog.exit_on_abort(standing or REASON_DEADLINE)  # RankExit (writes the abort if none came)
            raise Exited
        self._exit(REASON_DEADLINE if timed_out else REASON_EXCEPTION, {"error": f"{type(exc).__name__}: {exc}"[:500]})

    def _first_to_expire(self, g: int, which: str) -> bool:
        """Whether this rank is the first whose wait on ``which`` of g failed (a store counter)."""
        try:
            return self.control.first_expirer(g, which)
        except Exception:  # noqa: BLE001 - store lost: nobody else can write the abort; it is ours
            return True

    def _adopt_active(self, ep: Episode) -> None:
        """A spare joining a job whose episode leaves some ranks out of g+1 (a swap in a shrunk job):
        it counts and builds over the ranks the decision published (``{PREFIX}g{g}/active``)."""
        sw = ep.swap
        assert sw is not None
        active = _shrink.read_active(self.control.store, ep.g)
        if active is None:
            return
        sw.active = active
        c = self.control
        self.control = _shrink.ActiveControlPlane(c.store, c.rank, c.world_size, c.prefix, members=active,
                                                  claims_exit=c.claims_exit)

    def _leave(self, ep: Episode) -> None:
        """RankLeave: this rank's replica leaves the data-parallel dimension (a shrink): it records the
        action and leaves the episode (:class:`~accelpact.impl.episode.Left`); the engine stops
        (``Pact._rebuild``) and the training loop ends on this rank (``Training.left``)."""
        sw = ep.swap
        assert sw is not None
        self._record("RankLeave", PC_LEFT, Done({"leaving": list(sw.dead), "active": list(sw.active or ())},
                                                {"frontier": self.frontier}))
        raise Left(sw.dead)

    def _decide_shrink_or_swap(self, ep: Episode) -> Any:
        """The contract on a death (or a requested shrink, ``mode`` "shrink": the same decision with no
        spare): ``model.hotswap.decide`` with the facts, ``shrink`` where the job opted in
        (micro-batches).  A shrink fixes the ranks that leave (single assignment, every survivor the
        same) and the ranks of g+1."""
        sw = ep.swap
        assert sw is not None
        job = sw.job
        topo, kind = job.topology, self.groups.name
        active = tuple(job.groups.members(range(topo.world)))
        replica = all(any(m not in sw.dead and m in active for m in topo.group(kind, d)) for d in sw.dead)
        opted = bool(getattr(job, "_micro_batches", None))
        spare = False if sw.mode == "shrink" else _swap.pool_covers(self.control.store, ep.g, sw.dead, job.spares)
        dec = model_swap.decide(self.envelope, self._key(sw.point), True, died=True, spare=spare, replica=replica,
                                shrink=opted)
        if dec.preserve and getattr(dec, "shrink", False):
            leaving = sorted({r for d in sw.dead for r in _shrink.replica_ranks(topo, kind, _shrink.replica_of(topo, kind, d))})
            sw.dead, wrote = _shrink.shrink_decision(self.control.store, ep.g, leaving, self.deadline_s)
            sw.mode = "shrink"
            sw.active = tuple(r for r in active if r not in sw.dead)
            if wrote:  # RankShrink (the model's one write of the replicas out), by the survivor that decided
                self._record("RankShrink", None, Done({"leaving": list(sw.dead), "active": list(sw.active),
                                                       "replicas": sorted({_shrink.replica_of(topo, kind, d) for d in sw.dead})},
                                                      {"frontier": self.frontier}))
        elif sw.mode == "shrink":  # a requested shrink the contract does not allow: nothing leaves
            sw.mode = ""
        return dec

    # ---- RankClaimSpare --------------------------------------------------------------------------
    def _claim_spares(self, ep: Episode) -> Done | None:
        """The contract first (:func:`accelpact.model.hotswap.decide` on the dead-rank key: died, a spare
        in the pool, a live replica of every dead rank; with nobody dead the plain key of a discard):
        L2 is ``RankReject``.  Then for each dead rank the first survivor to claim takes a spare from
        the pool and tells it (single assignment); only a rank whose claim stood performs the action
        (the model's one claim for each dead identity).  Held: the claim and its record are one action."""
        sw = ep.swap
        assert sw is not None
        store = self.control.store
        if sw.mode == "grow":  # decided at the boundary (``shrink.grow_decision``): every vacant identity is claimed
            sw.decision, sw.active = "L1", None
        elif not sw.dead:  # a communicator failure in flight with every rank alive (P17): the plain key
            dec = decide(self.envelope, self._key(sw.point), True)
            if not dec.preserve:
                self._reject(dec.reason)
            sw.decision, sw.active = dec.level, sw.job.groups.active
        else:
            dec = self._decide_shrink_or_swap(ep)
            if not dec.preserve:
                self._reject(dec.reason)
            sw.decision = dec.level
            if sw.mode != "shrink":
                sw.active = sw.job.groups.active
        ranks = sw.active if sw.active is not None else tuple(range(sw.job.topology.world))
        if hasattr(self.control, "members"):
            self.control.members = tuple(ranks)
        if sw.active is not None:  # a spare told to join this episode builds over the same ranks
            _shrink.publish_active(store, ep.g, sw.active)
        if sw.mode == "shrink":
            if self.rank in sw.dead:
                self._leave(ep)
            return None  # nothing is claimed: the episode goes on without the leaving replicas
        mine = {}
        for d in sw.dead:
            publish: Callable[[], None] | None = None
            if sw.mode == "grow":  # the vacant identity's state at F: what the spare arrives with (F, RNG, extra)
                def publish(d: int = d) -> None:
                    _swap.publish_state(store, d, self.frontier, sw.extra)
            if sw.mode == "grow" and _shrink.benched_idle(store, d):  # its own benched holder comes back
                if _shrink.claim_bench(store, ep.g, d, sw.point, on_claim=publish):
                    mine[d] = -1
                continue
            first, k = _swap.claim_write(store, ep.g, d, sw.job.spares, sw.point, on_claim=publish)
            if first and k is not None:
                mine[d] = k
        return Done({"claims": mine, "decision": sw.decision, **({"grow": True} if sw.mode == "grow" else {})}) \
            if mine else None

    # ---- RankTransferState -----------------------------------------------------------------------
    def _transfer_state(self, ep: Episode) -> Done | None:
        """First every rank of W waits until all have rebuilt their model (a spare's first build is
        slow: it is waited for here, under the phase deadline, not inside a transfer's collective).
        Then the first live member of a dead identity's new group of R's kind sends its state point
        to point to each spare of the group, which loads it as it arrives (parameters into their
        storage, the optimizer state adopted: the state is never held twice); no other member takes
        part (:func:`~accelpact.impl.runtime.hotswap.transfer`).  The sender performs the action (a
        rank is in one group of R's kind: one transfer at most)."""
        sw = ep.swap
        assert sw is not None
        job, topo = sw.job, sw.job.topology
        _swap.store_barrier(job.attempt_store, swap_rebuilt_key(ep.g), len(job.groups.members(range(topo.world))),
                            self.deadline_s, "rebuilt its model")
        members = tuple(job.groups.members(topo.group(sw.kind, self.rank)))
        dead = [x for x in members if x in sw.dead]
        if not dead:
            return None
        src = [m for m in members if m not in sw.dead][0]
        sw.sources.update({x: src for x in dead})
        if self.rank not in dead and self.rank != src:
            return None  # a bystander of the transfer: nothing is sent to it
        t = time.monotonic_ns()
        moved = _swap.transfer(job.groups.training[sw.kind], members, src, self.rank, sw.module, sw.optimizer, job.device,
                               self.deadline_s, receivers=dead)
        return Done({"to": dead, "bytes": moved, "duration_ns": time.monotonic_ns() - t}) if self.rank == src else None


def _mesh_registry_sites(mesh: Any, old_pg: Any) -> list:
    """The entries of ``mesh``'s (and its root mesh's) group registry that hold ``old_pg``."""
    from .runtime.adapters.fsdp1 import _mesh_sites

    return _mesh_sites(mesh, old_pg, "job.mesh", set())
