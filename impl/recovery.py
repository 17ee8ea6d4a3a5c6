"""The recovery engine: ``attach`` -> ``Pact``; ``Pact.step()`` and ``Pact.boundary()``.

Read beside ``model/protocol.py``: an episode is a table of (point, model action) steps
(:mod:`accelpact.impl.episode`: ``REPAIR``, ``SWAP``, ``SPARE_SWAP``) run by one driver, each action's
effect one method in the model's order (:mod:`accelpact.impl.effects`).  This module is what starts
an episode: the step loop, the boundary's probe and failure flag, the observation of a failure
(``RankObserve``) and the suspicion of a peer.

Ordering requirements (the step loop, spec/implementation.md):

* ``with pact.step(step):`` wraps forward, backward and ``optimizer.step()``; an exception
  inside it is an in-flight failure: a hot swap with spares and a death notice, a discard in place
  where the contract allows it, else RankObserve, RankReject and a job-wide abort (every rank exits
  70, the others through their watchdog).
* ``pact.boundary(loss)`` is called after the optimizer step committed and the grads were
  cleared, before the next forward.  It runs the post-commit collective on R, then the
  failure-flag all-reduce on the control group (all of W), and on a non-zero flag the repair.
  Every rank of W enters recovery together.
* Any exception or expired deadline in an episode writes the abort (the phase's decision key and
  the job key) and exits at once with the reason's code (RankFail / RankTimeout).
* In a job that opted in to micro-batches (issue 41): a death with no spare idle shrinks the job (the
  swap's episode, :mod:`accelpact.impl.shrink`); after each committed boundary a requested shrink, or
  a grow when a replica is out and the pool and the bench cover it (:meth:`Pact._change_membership`).

The failure flag has one element per group of R's kind (``PactGroups.count``; one for DDP), so that
every rank learns *which* replicate group failed: its members rebuild it, everybody else only votes.

Test-only hooks (:mod:`accelpact.impl.hooks`, passed at attach, never read from the environment) run
at the named points between actions; what a test installs through them (a seeded bug) replaces
engine methods on the instance at attach, and nothing here branches on one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from accelpact.model.contract import (DEFAULT_OBJECTIVE, DEFAULT_PLATFORM, DEFAULT_PROFILE, DISCARD_PHASES, ObservationKey,
                                      decide, default_envelope, unqualified_notice, without_discard)
from accelpact.model.state import PC_TRAIN

from .runtime import revoke as _revoke
from .controlplane import ControlPlane
from .deadlines import DEFAULT_DEADLINE_S, default_step_deadline
from .detector import Detector
from .effects import Effects, RebindError, ValidationError, rebuild_in_place
from . import shrink as _shrink
from .episode import REPAIR, SWAP, Episode, Exited, Left, Rebuild, RecoveryReport, SwapFacts, drive
from .exitcodes import claim_exit
from .flag import or_allreduce
from .guard import BoundaryGuard
from .hooks import NO_HOOKS, Hooks
from .runtime import hotswap as _swap
from .runtime.adapters import adapter_for, find_references, site_set
from .runtime.backends import AbortedCommunicator, backend_of, is_comm_failure, recorded_errors, wait_bounded
from .runtime.replace import ReplacementStrategy, choose_strategy
from .runtime.retire import reap, start_retirer
from .threadname import EngineThread
from .trace import NullTrace
from .watchdog import Watchdog

__all__ = ["attach", "Pact", "PactGroups", "RecoveryReport", "RebindError", "ValidationError", "retired_watchdogs",
           "swap_record"]


class RevokedWhilePending(RuntimeError):
    """An op on R was still pending ``REVOKE_GRACE_S`` after R was revoked: the op is abandoned
    and the failure observed (phase 1), as if the op had raised."""


#: Grace between R's revoke (its sockets shut down by the watchdog) and giving up on an op on R that
#: is still pending.  Normally the op fails within milliseconds of the shutdown, but a gloo op on
#: sockets cut while no op was pending may stay blocked until the group's timeout; R is being
#: replaced, so nothing is lost by abandoning its op early (the op and its group go to a reaper).
#: Counts from when the revoke took effect here (the watcher's shutdown).  Measurements that chose
#: it: bench/README.md, "Revoke grace".
REVOKE_GRACE_S = 0.02
#: How often a pending op on R looks for R's revoke (the watcher's record, else the store key): the
#: first look after one interval, so a healthy op (about 1 ms) makes no store round trip.
REVOKE_CHECK_S = 0.02

#: With spares: how long the failure detector's suspicion of a peer waits for the keeper's death
#: notice (after asking it to depose the peer: a stopped process is killed first) before it ends the job.
NOTICE_WAIT_S = 3.0

#: After an in-flight failure with spares: how long each wait for a death notice lasts before the
#: peers' heartbeats are read again (:meth:`Pact._await_notices`), and the most active ranks whose
#: heartbeats are read for it (beyond, the whole ``hotswap.NOTICE_GRACE_S`` is waited).
NOTICE_POLL_S = 0.2
BEAT_CHECK_MAX = 64

#: How much sooner than R's NCCL collective timeout a wait on R gives up: more than two of NCCL's
#: watchdog polls (100 ms), so the engine's own timeout raises before NCCL's watchdog can abort the
#: communicator and leave the work completing normally (spec/nccl.md).
NCCL_WATCHDOG_MARGIN_S = 0.25

@dataclass(frozen=True, slots=True)
class PactGroups:
    """The groups the engine works with on this rank.

    ``affected``: this rank's group of R's kind (its replicate group for HSDP, the whole
    world for DDP), ``members``: its global ranks in group-rank order, ``index``/``count``:
    which of the ``count`` groups of that kind it is.  ``control``: an out-of-band gloo group
    over all of W (never used by the wrapper).  ``record``: the socket record of ``affected``
    (from :func:`revoke.recorded`).  ``others``: name -> socket record of further groups
    (e.g. ``"shard"``), for fault injection.
    """

    control: Any
    affected: Any
    members: tuple[int, ...]
    record: _revoke.SocketRecord
    name: str = "replicate"
    index: int = 0
    count: int = 1
    others: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """The group's name in store keys: ``replicate1`` when there are several."""
        return self.name if self.count == 1 else f"{self.name}{self.index}"


#: The watchdogs of engines retired by a swap or a discard: stopped and detached, their threads leave at
#: the end of their store waits' slices.  A job that ends within a slice of its last episode must wake
#: them, or a thread still inside a C++ store wait at the interpreter's teardown aborts the process
#: (``Watchdog.wake_and_join``).  Weak: a watchdog whose threads ended is gone.
_RETIRED_WATCHDOGS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def retired_watchdogs() -> list:
    """The retired engines' watchdogs, for the job's end."""
    return list(_RETIRED_WATCHDOGS)


class Pact(Effects):
    """The attached engine of one rank.  Create with :func:`attach`.

    Its episodes are tables (``REPAIR_STEPS``, ``SWAP_STEPS``: :mod:`accelpact.impl.episode`) run by
    the one driver over the effects of :class:`~accelpact.impl.effects.Effects`."""

    REPAIR_STEPS = REPAIR
    SWAP_STEPS = SWAP

    def __init__(self, module, optimizer, *, groups: PactGroups, control: ControlPlane, trace=None, envelope=None,
                 key: ObservationKey | None = None, deadline_s: float = DEFAULT_DEADLINE_S, adapter=None, frontier: int = 0,
                 strategy: ReplacementStrategy | None = None, step_deadline_s: float | None = None,
                 hooks: Hooks | None = None, detect: bool = True, dead_after_s: float | None = None,
                 hang_threshold_s: float | None = None, generation: int = 0, notices: Any = None,
                 rebuild: Rebuild | None = None, wide: Callable[[int], tuple[list[str], Any, dict]] | None = None,
                 wide_records: Callable[[], list] | None = None, predecessor: Any = None,
                 hang_floor_s: float | None = None) -> None:
        if control.rank not in groups.members:
            raise ValueError(f"attach: rank {control.rank} is not in its own group's members {groups.members}")
        self.module = module
        self.optimizer = optimizer
        self.control = control
        self.rank = control.rank
        self.trace = trace if trace is not None else NullTrace()
        self.envelope = envelope if envelope is not None else default_envelope()
        #: how an episode rebuilds the model (a hot swap, a discard in place, P16/P17; its ``build``
        #: :func:`~accelpact.impl.effects.rebuild_in_place`: a discard keeps the wrapper and resets it); None:
        #: forward and backward are L2 (the contract's cells narrowed), and so is a death
        self.rebuild = rebuild
        self.discard = rebuild is not None
        #: phase 4 of every episode on every rank (P18.3): builds the groups over all of W of a generation,
        #: returning (their names, the new control group, socket records by group name); None: none to build
        self.wide = wide
        if rebuild is None:
            self.envelope = without_discard(self.envelope, "no in-place discard: the job was attached without rebuild= "
                                                           "and its wrapper cannot reset an aborted step in place "
                                                           "(or discard_in_place is off)")
        self.key = key or ObservationKey(DEFAULT_PLATFORM, DEFAULT_PROFILE, "boundary", DEFAULT_OBJECTIVE)
        notice = unqualified_notice(self.envelope, self.key.platform)
        if notice:  # an unqualified platform: every failure there is L2; say so once, at attach
            print(f"accelpact: {notice}", file=sys.stderr, flush=True)
        self.deadline_s = deadline_s
        backend = backend_of(groups.affected)
        #: R's collective timeout (s; None: the group does not say): how long an op of an abandoned step
        #: can hold a peer that still beats (:meth:`_await_agreement`)
        self.collective_timeout_s = backend.timeout_of(groups.affected)
        if step_deadline_s is None:  # the one rule (deadlines.default_step_deadline), R's collective timeout as it was built
            step_deadline_s = default_step_deadline(self.collective_timeout_s, deadline_s)
        self.step_deadline_s = step_deadline_s
        self.hooks = hooks if hooks is not None else NO_HOOKS
        self.gen = generation
        self.pc = PC_TRAIN
        #: hot swap (jobs with spares): the keepers' death notices (:class:`accelpact.impl.runtime.hotswap.Notices`)
        self.notices = notices
        self.reports: list[RecoveryReport] = []
        self.last_loss: float | None = None
        self._step = frontier
        self._episode: Episode | None = None  # the recovery in progress
        self._observed_gen = -1  # the generation whose failure this rank last recorded (RankObserve)
        self._retiring: list[threading.Event] = []  # replaced communicators being destroyed (phase 5)
        self._pg = groups.affected
        self._r_record: _revoke.SocketRecord | None = groups.record
        # keep no second reference to R's communicator: after a repair the adapters' walker would
        # find it (the guard's hooks make the pact reachable from the module) and the old group
        # could never be freed
        self.groups = dataclasses.replace(groups, affected=None)
        self._arm()
        self.adapter = adapter if adapter is not None else adapter_for(module)
        self.strategy = strategy or choose_strategy(self._pg, control.prefix)
        self.sites: list = []
        self._sites_settled = False  # re-discovered once after the first step (wrappers cache lazily)
        self.guard = BoundaryGuard(module, optimizer, frontier=frontier, on_point=self._at, sync_timeout_s=deadline_s,
                                   commit_drain_s=self.collective_timeout_s, before_commit=self._before_commit)
        self.sites = self._discover()  # at attach: rebinding reuses them (and the first boundary settles them)
        self.watchdog = Watchdog(control, trace=self.trace, gen_of=lambda: self.gen, pc_of=lambda: self.pc,
                                 step_records=lambda: list(self.group_records().values()), wide_records=wide_records)
        # the failure detector (heartbeats on the control plane, impl/detector.py): a dead or hung
        # peer ends the job at once (RankSuspect) instead of at a deadline; built before any thread
        # starts (its store connection must not race the socket records of revoke.recorded)
        # its default bounds are the backend's (spec/nccl.md rows 19-20: NCCL's is_completed holds the GIL)
        self.detector = Detector(control.store, self.rank, control.world_size, prefix=control.prefix,
                                 on_suspect=self._on_suspect, dead_after_s=dead_after_s,
                                 hang_threshold_s=hang_threshold_s, backend=backend.name, epoch=generation,
                                 hang_floor_s=hang_floor_s,  # None: the backend's, raised to the collective timeout
                                 # a shrunk job (issue 41) watches its active ranks only: a rank out of training never beats
                                 peers=_active_peers(control, self.rank),
                                 collective_timeout_s=None if hang_floor_s is not None else self.collective_timeout_s,
                                 ) if detect else None
        self.watchdog.start(succeed=predecessor)  # a retired engine's abort thread is taken over
        start_retirer()  # now, not at the first retired group: the rank's thread count is steady from attach
        if self.detector is not None:
            self.detector.set_progress(frontier)
            self.detector.start()
        self.watchdog.watch(self.gen, self.groups.key, self._r_record)
        self.closed = False

    # ---- views for hooks and callers ----------------------------------------------------------
    @property
    def process_group(self):
        """R's current communicator on this rank (changes at each repair)."""
        return self._pg

    @property
    def step_index(self) -> int:
        """The step in progress (or the next one, at the boundary)."""
        return self._step

    @property
    def frontier(self) -> int:
        """F as this rank reports it: its committed steps."""
        return self.guard.frontier

    @property
    def tau(self) -> int:
        """The optimizer steps this rank has taken (tau; F at a committed boundary)."""
        return self.guard.tau

    def model_view(self) -> dict[str, Any]:
        """This rank's state in model vocabulary (``pc``, ``gen``, ``frontier``, ``tau``, ``point``)."""
        return {"pc": self.pc, "gen": self.gen, "frontier": self.frontier, "tau": self.guard.tau,
                "point": self.guard.point}

    def group_records(self) -> dict[str, Any]:
        """Group name -> socket record of this rank's groups (R under its name and its key)."""
        return {self.groups.name: self._r_record, self.groups.key: self._r_record, **self.groups.others}

    # ---- the step loop -----------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, step: int):
        """Wraps forward, backward and ``optimizer.step()``.  An exception inside is an in-flight
        failure: with spares and a death notice, a hot swap (P16); in forward or backward of an engine
        that can discard (``rebuild``: the user's, or the wrapper's reset in place) and where the envelope
        says L1, a discard in place (P17); either episode rebuilds the groups and hands the model (rebuilt,
        or the same one reset) on (``Rebuild.then``), and the exception ends here (the step is discarded).  Otherwise the contract rejects it and every rank exits 70.  Arms the
        watchdog's step deadline (``step_deadline_s``), which :meth:`boundary` disarms."""
        self._step = step
        self.watchdog.arm(self.step_deadline_s)
        try:
            yield self
        except Exception as exc:  # noqa: BLE001 - any error in the step is an in-flight failure (C3 rule 1)
            point = self.guard.point if self.guard.point != "boundary" else "forward"
            try:
                self._swap_if_died(point, exc)
                self._discard_if_qualified(point, exc)
                self._observe_in_flight(point, exc)
            except _swap.SwapNeeded as need:
                self._rebuild(need)

    def boundary(self, loss) -> RecoveryReport | None:
        """After the commit: the post-commit collective on R, the failure flag on W, and on a
        failure anywhere in R the repair.  Returns the report of a repair, else None (also after a hot
        swap of a rank whose death the boundary met: ``Rebuild.then`` handed the model on).  Then, in a
        job that opted in to micro-batches (issue 41), a requested shrink due at this F, or a grow when
        the job is shrunk and the spare pool covers every vacant identity (:meth:`_change_membership`)."""
        try:
            report = self._boundary(loss)
        except _swap.SwapNeeded as need:
            self._rebuild(need)
            return None
        try:
            self._change_membership()
        except _swap.SwapNeeded as need:
            self._rebuild(need)
        return report

    def _change_membership(self) -> None:
        """At a committed boundary of a job that opted in (``micro_batches``): a requested shrink
        (``shrink_at`` = (F, replica), a fault-free run's stand-in for a death: the replica leaves at F,
        tests compare a real death with it), else, when replicas are out and the spare pool covers
        every vacant identity, a grow (``RankStartGrow``; every rank opens it at the same boundary or
        none does: :func:`accelpact.impl.shrink.grow_decision`).  Either raises
        :class:`~accelpact.impl.runtime.hotswap.SwapNeeded` for :meth:`_rebuild`."""
        rb = self.rebuild
        job = rb.job if rb is not None else None
        if job is None or not getattr(job, "_micro_batches", None):
            return
        topo, kind, f = job.topology, self.groups.name, self.frontier
        active = tuple(job.groups.members(range(topo.world)))
        at = getattr(job, "_shrink_at", None)
        if at is not None and at[0] == f and at[1] in _shrink.active_replicas(topo, kind, active):
            leaving = _shrink.replica_ranks(topo, kind, at[1])
            self._observe("boundary", None, cause="shrink-request", leaving=list(leaving))
            raise _swap.SwapNeeded("boundary", leaving, None, mode="shrink")
        vacant = tuple(r for r in range(topo.world) if r not in active)
        if not vacant:
            return
        store = self.control.store
        if self.notices is not None:  # a benched rank that died meanwhile (its keeper's notice) is no longer idle
            for d in set(self.notices.read(self.notices.count())) - set(active):
                _shrink.bench_gone(store, d)
        # a vacant identity is covered by its own benched holder (RankLeave: alive, idle) or by a spare
        # of the pool (launched, or refilled by a keeper since)
        need = [d for d in vacant if not _shrink.benched_idle(store, d)]
        mine = not need or _swap.pool_covers(store, self.gen, need, job.spares)
        if not _shrink.grow_decision(self.control.store, self.gen, f, mine):
            return
        self.watchdog.disarm()
        with self._hold():
            from .episode import Done
            from accelpact.model.state import PC_OBSERVED

            self._record("RankStartGrow", PC_OBSERVED, Done({"vacant": list(vacant)},
                                                          {"point": "boundary", "frontier": f, "tau": self.tau}))
            self._observed_gen = self.gen
        raise _swap.SwapNeeded("boundary", vacant, None, mode="grow")

    def _boundary(self, loss) -> RecoveryReport | None:
        t0 = time.monotonic_ns()
        if self.detector is not None:
            self.detector.set_progress(self.guard.frontier)  # committed: a peer still behind is awaited
        observed, err = self._probe(loss)
        self._fail_on_backend_errors(observed)
        t_obs = time.monotonic_ns()
        if observed:
            # a member observes before any effect of its observation (revoke, flag) reaches a peer
            self._observe("boundary", err, cause="boundary", member=True, failed_groups=[self.groups.index])
            self._publish_revoke_or_lose_store(self.gen)
        failed = self._failure_flag(observed)
        if failed is not None and not failed:
            self.watchdog.disarm()
            if not self._sites_settled:  # once: what the wrappers built lazily in the first step
                self.sites, self._sites_settled = self._discover(), True
            return None
        report = self._recover(failed, t0, t_obs, err)
        self.reports.append(report)
        self.watchdog.disarm()
        return report

    def _before_commit(self) -> None:
        """NCCL: as ``optimizer.step()`` starts, a step whose collectives ran on a
        group this rank's revoke aborted in this generation (a hot swap's watcher, a peer's revoke), or
        on a group whose backend recorded an error, is not committed: :class:`AbortedCommunicator`, a
        failure of the step in ``backward`` (the death it follows is then swapped and the step
        discarded, P16.4; a communicator failure discarded in place, P17; else the contract's L2).  An
        aborted NCCL communicator's works report completion without their error, so the wrapper's
        own waits (the stream only) pass.  On gloo a revoked group's ops raise and this finds nothing.

        First the step's device work is drained (the guard's bounded drain of each device's current
        stream; nothing on the CPU): the wrapper's waits only order the streams, so without it the CPU
        commits while the gradients' collectives still run on the device, and an abort of their
        communicator after this check (the boundary's revoke, a peer's) cuts them short under a step
        already committed, and the replicas differ (bench/nccl-log.md).  Past the bound the step's
        results are not known: :class:`AbortedCommunicator` as above."""
        if undrained := self.guard.undrained():
            raise AbortedCommunicator(f"before the commit: {undrained[0]}; the step's collectives' results are not known")
        records = self.group_records()
        aborted = sorted({name for name, rec in records.items() if rec is not None and _revoke.aborted(rec)})
        errors = recorded_errors(records)
        if aborted or errors:
            raise AbortedCommunicator(f"the step's collectives ran on group(s) {aborted or errors} aborted or failed in "
                                      f"generation {self.gen} (NCCL): its gradients are not committed")
        if self.discard:
            self._fence()

    def _fence(self) -> None:
        """The commit fence (P17.2), in a job that discards in place: an all-reduce over all of W on the
        control group as ``optimizer.step()`` starts.  No rank completes it unless every rank entered it,
        and a rank enters only once its forward and backward completed: so when a failure in forward or
        backward makes any rank abandon its step, no rank commits it (its peers' fences fail, or their
        watchers close the control group on the abandoning rank's step revoke), and the discard can
        keep every rank at F.  Only a failure that strikes inside the fence itself can leave a partial
        commit, which the agreement's frontier comparison then ends (L2).  Cost: one small all-reduce
        over W per step (``accelpact bench guard --fence``).

        Its waits are bounded by the step's revoke (:meth:`_wait_unless_revoked`): a rank whose
        backward completed while a peer's failed may find its control-group sockets shut down by
        that peer's step revoke before it posts the fence, and a gloo op posted on sockets shut down
        while no op was pending can stay blocked until the group's timeout (spec/torch-facts.md):
        without the bound it missed the episode and the job ended at the arrival deadline (the
        demo's path (e) under CI's load)."""
        control = self.groups.control
        # gloo's all-reduce, whatever W: the flag's recursive doubling as the fence lets ranks commit
        # beside a discard in the generation after a discard in place (bench/README.md, K8: an open bug)
        or_allreduce(control, torch.zeros(1, dtype=torch.int64), method="ring",
                     wait=lambda work: self._wait_unless_revoked(work, "the commit fence", group=control))

    def _fail_on_backend_errors(self, observed: bool) -> None:
        """With TORCH_NCCL_ASYNC_ERROR_HANDLING=2 NCCL's watchdog aborts a group whose work
        failed and raises nothing, so a step whose shard-group collective failed could stand.  Any
        training group whose backend recorded an error (:func:`backends.recorded_errors`; R left out
        when its probe failed: that is the boundary's own, repairable failure), and any other group of
        the process (c10d's ``pg_map``: the default group, the user's NCCL groups) with a recorded error or
        whose failures cannot be read (``UNCHECKABLE``), is an in-flight failure of the step: the
        contract rejects it (L2, exit 70)."""
        skip = (self.groups.name, self.groups.key) if observed else ()
        if bad := recorded_errors(self.group_records(), skip=skip):
            exc = RuntimeError(f"NCCL recorded an error on group(s) {bad} during the step (aborted by its watchdog, "
                               "TORCH_NCCL_ASYNC_ERROR_HANDLING=2), or a group of the process cannot be checked "
                               "(UNCHECKABLE: what to do is in its entry): the step's result is not trusted")
            # with spares, a peer's death (a keeper's notice) is what failed the group: the commit drained
            # the step's device work and found no error (_before_commit), so the step stands and the dead
            # rank is swapped at the boundary, as the model swaps it (a stopped rank's deposition fails the
            # shard group: rejecting it would be L2)
            self._swap_if_died("boundary", exc)
            # a collective of the step failed: an in-flight failure (RankObserve, RankReject: exit 70),
            # observed only now; which point of the step is not known, and every in-flight point is L2
            self._observe_in_flight("backward", exc)

    def _probe(self, loss) -> tuple[bool, BaseException | None]:
        """The post-commit collective on R (it carries the loss, on R's device): (failed, its error)."""
        t = loss.detach().reshape(-1)[:1].float().clone() if loss is not None else torch.zeros(1)
        try:
            t = backend_of(self._pg).place(t, self._pg)
            self._at("boundary")
            self._wait_unless_revoked(self._pg.allreduce([t]), "the boundary all-reduce")
            self.last_loss = float(t[0]) / len(self.groups.members)
        except Exception as exc:  # noqa: BLE001 - any error at the post-commit collective is R's failure, observed
            return True, exc
        return False, None

    def _publish_revoke_or_lose_store(self, g: int) -> None:
        """Publish R's revoke of generation ``g``; if the store is gone, this rank's store operation
        failed: ``RankLoseStore`` (exit 72), as the watchdog's poll would end it a moment later
        (an uncaught store error here ended the rank with a crash code, 1)."""
        try:
            self.control.publish_revoke(g, self.groups.key)
        except Exception as exc:  # noqa: BLE001 - any store failure: the store is lost to this rank
            if self.control.reachable():
                raise
            claim_exit()
            self.watchdog.lose_store(exc, claimed=True)
            raise Exited from exc

    def _failure_flag(self, observed: bool) -> list[int] | None:
        """The failure flag OR-ed over W (control group, :func:`accelpact.impl.flag.or_allreduce`:
        O(log W) rounds on large worlds): which groups of R's kind failed; None when the flag itself
        failed (P18.4: observed, and the failed groups are read from their revoke keys after the
        agreement, ``Effects._await_agreement``)."""
        flag = torch.zeros(self.groups.count, dtype=torch.int64)
        if observed:
            flag[self.groups.index] = 1
        control = self.groups.control
        try:
            # the ring's all-reduce is bounded by the groups over W's revoke: an op pending when the watcher
            # shut the control group down is not always woken by it (K6, bench/README.md): without the bound
            # it held the rank past its peers' arrival deadline (conformance 2x2-fsdp1-link-r0-r3-boundary
            # under CI's load).  The doubling's sends and receives cannot be waited in slices (flag.py)
            or_allreduce(control, flag, wait=lambda work: self._wait_unless_revoked(work, "the failure flag", group=control,
                                                                                    wide=True))
        except RuntimeError as exc:
            # the out-of-band control group failed under this rank: a broken link crosses it, or a peer
            # it waits on is gone (a death with a spare left is a hot swap): an observation (P18.4)
            self._swap_if_died("boundary", exc)
            self._observe_wide(exc)
            return None
        return [i for i, v in enumerate(flag.tolist()) if v]

    def _wait_unless_revoked(self, work, what: str, group: Any = None, *, wide: bool = False) -> None:
        """Wait for an op on R (or on ``group``, the control group for the commit fence); raise its
        error, or :class:`RevokedWhilePending` if R was revoked in this generation (by a peer's step
        revoke too: it is published under R's keys) and the op is still pending ``REVOKE_GRACE_S``
        later (the op and its group go to a reaper thread), or if it completed on a communicator the
        revoke aborted (NCCL: its result is not trusted, :func:`revoke.aborted`).

        ``wide`` (the failure flag, on the control group): the revoke that ends the wait is this
        generation's wide or step revoke as this rank's watcher carried it out (it shut the groups over
        W down: ``Watchdog.wide_revocations``), never R's: a member's revoke of R is what the flag is
        there to spread, so the flag must complete beside it.  Read from the watcher alone, no store
        round trip: every rank of W waits in the flag each step, most of them for the slowest peer.

        :func:`backends.wait_bounded` polls the op's completion, not its future (an NCCL op's future
        completes when the op is enqueued); on gloo it blocks in ``work.wait`` slices of
        ``REVOKE_CHECK_S`` instead (:attr:`Backend.sliced_wait`: the fault-free path is one blocking
        wait, 0.13 ms cheaper per step than waking on the future).  Bounded: past the group's own
        collective timeout plus ``REVOKE_GRACE_S`` the wait gives up with the op's timeout error
        (NCCL: ``DistBackendError``; gloo's op fails at its timeout before that)."""
        seen = None  # when R's revoke took effect here (the watcher's shutdown), or this wait first saw its key

        def revoke_check() -> None:
            nonlocal seen
            if wide:
                if seen is None:
                    closed = [r[2] for r in self.watchdog.wide_revocations if r[0] == self.gen]
                    seen = closed[0] / 1e9 if closed else None
                if seen is not None and time.monotonic() - seen > REVOKE_GRACE_S:
                    raise RevokedWhilePending(f"{what} was still pending {REVOKE_GRACE_S} s after generation {self.gen}'s "
                                              "revoke of the groups over W")
                return
            if seen is None:
                mine = [r[3] for r in self.watchdog.revocations if r[0] == self.gen]
                if mine:
                    seen = mine[0] / 1e9  # time.monotonic_ns's clock is time.monotonic's
                elif self.control.revoked(self.gen, self.groups.key):
                    seen = time.monotonic()
            if seen is not None and time.monotonic() - seen > REVOKE_GRACE_S:
                raise RevokedWhilePending(f"{what} on {self.groups.key} was still pending {REVOKE_GRACE_S} s after "
                                          f"generation {self.gen}'s revoke")

        pg = self._pg if group is None else group
        record = self._r_record if group is None else None
        be = backend_of(pg)
        timeout = be.timeout_of(pg)
        budget = (timeout or self.deadline_s) + REVOKE_GRACE_S
        if be.revoke == "abort" and timeout:
            # NCCL's watchdog (every 100 ms) aborts a timed-out group silently (mode 2) and the
            # work's wait then returns normally; end the wait first (spec/nccl.md row 17; the boundary
            # also reads get_error after the probe, _fail_on_backend_errors)
            budget = max(timeout - NCCL_WATCHDOG_MARGIN_S, REVOKE_GRACE_S)
        try:
            try:
                # raises the op's own error, if any
                wait_bounded(work, budget, check=revoke_check, check_every_s=REVOKE_CHECK_S, sliced=be.sliced_wait)
            except RevokedWhilePending:
                self._retiring.append(reap(work, pg))
                raise
            if _revoke.aborted(record):
                raise RevokedWhilePending(f"{what} on {self.groups.key} completed on a communicator that generation "
                                          f"{self.gen}'s revoke aborted: its result is not trusted")
        finally:
            # the raised error's traceback keeps this frame: it must not keep the op (and through
            # it the old group's sockets and threads) alive until the next garbage collection
            del work, pg

    # ---- hot swap (spec/hotswap.md) ---------------------------------------------------------------
    def _swap_if_died(self, point: str, exc: BaseException) -> None:
        """With spares: if a keeper posted a death notice (waiting up to ``hotswap.NOTICE_GRACE_S``
        for one), record the observation (``RankObserve``) and raise :class:`~accelpact.impl.runtime.hotswap.SwapNeeded`
        for the training loop to run the swap; otherwise return (the failure takes its usual path)."""
        if self.notices is None:
            return
        try:
            dead = self._await_notices()
        except Exception:  # noqa: BLE001 - store lost: the usual path (RankLoseStore)
            return
        members = getattr(self.control, "members", None)
        if members is not None:  # a shrunk job: a rank out of training (it left) dies outside the job
            dead = tuple(d for d in dead if d in members)
        if not dead:
            return
        self.watchdog.disarm()
        self._observe(point, exc, cause="death", dead=list(dead))  # a member at the boundary has recorded it already
        raise _swap.SwapNeeded(point, dead, exc) from exc

    def _await_notices(self) -> tuple[int, ...]:
        """The death notices not yet handled, waiting for one only while a death could still be
        unnoticed.  Not at all once a peer's revoke of this generation stands: that peer observed the
        failure first and waited for the notices then (a keeper posts within milliseconds of a death);
        a revoke this rank wrote itself (a member's observation at the boundary) is no such sign.
        Otherwise up to ``hotswap.NOTICE_GRACE_S``, ended early once every active peer is seen beating
        after the failure (:meth:`Detector.beating`: a process that died publishes no heartbeat, so no
        notice is coming); a stopped or dead peer keeps the whole grace.  Beyond
        :data:`BEAT_CHECK_MAX` ranks the heartbeats are not read (the grace is waited out)."""
        notices = self.notices
        assert notices is not None
        by = self.control.revoked_by(self.gen, self.groups.key)
        if by is not None and by != self.rank:
            return notices.wait_new(grace_s=0.0)
        members = tuple(getattr(self.control, "members", range(self.control.world_size)))
        peers = [m for m in members if m != self.rank] if self.detector is not None and len(members) <= BEAT_CHECK_MAX else None
        deadline = time.monotonic() + _swap.NOTICE_GRACE_S
        while True:
            left = deadline - time.monotonic()
            dead = notices.wait_new(grace_s=max(0.0, min(left, NOTICE_POLL_S)))
            if dead or left <= 0:
                return dead
            if peers is not None and self.detector is not None and self.detector.beating(peers) >= set(peers):
                return notices.wait_new(grace_s=0.0)  # a notice posted while the beats were read

    def _on_suspect(self, peer: int, kind: str, detected_at_ns: int) -> None:
        """The detector's suspicion, handled on a thread of its own (:meth:`_handle_suspect`).  The
        detector calls this from its heartbeat thread, and the handling may wait ``NOTICE_WAIT_S`` for
        a keeper's notice: a heartbeat held that long reads as this rank's death to its peers, whose
        detectors then declare it in turn (bench/README.md, K7)."""
        EngineThread(target=self._handle_suspect, args=(peer, kind, detected_at_ns),
                         name=f"accelpact-suspect-{peer}", daemon=True).start()

    def _handle_suspect(self, peer: int, kind: str, detected_at_ns: int) -> None:
        """With spares, a peer whose death a keeper noticed is excused (a hot swap takes its
        identity, P16.6); one not yet noticed is deposed first (its keeper kills it: a stopped or
        hung process dies as a crashed one does, P16.0) and excused once its notice comes; otherwise,
        or if no notice comes within ``NOTICE_WAIT_S``, the watchdog ends the job (``RankSuspect``).

        Ordering: the notices are read before the depose.  A notice this rank has not handled yet
        names a dead holder whose identity a spare takes in the swap this rank is about to join (its
        main thread still blocked in a collective on the dead rank); deposing the identity then would
        kill that spare, its new holder."""
        if self.notices is not None:
            if self._noticed(peer):
                self.trace.note("suspect-excused", peer=peer, kind=kind)
                return
            try:
                if self.notices.depose(peer, self.rank):
                    self.trace.note("depose", peer=peer, kind=kind)
            except Exception:  # noqa: BLE001 - store lost: the watchdog's abort loop handles it
                pass
            # the keeper posts within milliseconds of the death
            deadline = time.monotonic() + NOTICE_WAIT_S
            while not self._noticed(peer):
                if time.monotonic() >= deadline:
                    self.watchdog.suspect(peer, kind, detected_at_ns)
                    return
                time.sleep(0.05)
            self.trace.note("suspect-excused", peer=peer, kind=kind)
            return
        self.watchdog.suspect(peer, kind, detected_at_ns)

    def _noticed(self, peer: int) -> bool:
        """A death notice this rank has not handled yet names ``peer``."""
        try:
            return peer in self.notices.read(self.notices.count())
        except Exception:  # noqa: BLE001 - store lost: the watchdog's abort loop handles it
            return False

    def suspend(self) -> None:
        """Before a hot swap or a discard: no step deadline and no failure detector (the episode's
        waits are bounded by the phase deadline); the watchdog still exits this rank on a job abort.
        The detector's last heartbeat says so (:data:`~accelpact.impl.detector.EPISODE`): a peer
        still in its step, whose observation comes later, must not declare this rank dead for its
        silence (a false ``RankSuspect`` that ends the job; the model allows none)."""
        self.watchdog.disarm()
        if self.detector is not None:
            self.detector.close(timeout_s=0, episode=True)

    def wait_retired(self, timeout_s: float = 10.0) -> bool:
        """Wait until the communicators that phase 5 replaced are destroyed (their threads and
        sockets gone: that happens off the repair's critical path, a few tens of ms after it) and
        every op abandoned on a revoked R has ended (its reaper then lets go of its group: a gloo op
        that stays blocked on sockets cut while no op was pending ends only at the group's collective
        timeout, so its thread and sockets are held that long; seen in 5 of 16 runs of
        ``test_ten_repairs_no_leak``); False if one is still held after ``timeout_s``.  For
        measurements of what a repair leaves behind; training need not call it."""
        deadline = time.monotonic() + timeout_s
        return all(ev.wait(max(deadline - time.monotonic(), 0.0)) for ev in self._retiring)

    def retire(self) -> None:
        """After a hot swap: this engine (generation g) gives way to the next one on the rebuilt model;
        its threads stop, its hooks go; the trace goes on."""
        self.closed = True
        self.watchdog.stop()
        self.watchdog.detach()  # its threads keep it until their slices end; they must not keep this engine
        self.watchdog.wake_revoke()  # generation g was released: its revoke thread leaves now
        _RETIRED_WATCHDOGS.add(self.watchdog)  # woken and joined at the job's end (retired_watchdogs)
        self.guard.remove()
        self._pg = None

    def _rebuild(self, need: Any) -> None:
        """A survivor's hot swap, or a discard in place, after ``need`` (the ranks that died, none for a
        discard, and where; its ``RankObserve`` is recorded): ``SWAP_STEPS`` (the contract on the
        dead-rank key, ``RankClaimSpare``, ``RankDiscardStep`` of a step in flight, ``RankGuard``, then
        every group of the job rebuilt in g+1, the model rebuilt on them by ``Rebuild.build`` from the
        state at F, or, a discard without ``rebuild=`` (``build`` is
        :func:`~accelpact.impl.effects.rebuild_in_place`), the same wrapper reset and rebound onto them,
        the spares' state sent, validation, the release); then this engine retires and
        ``Rebuild.then`` attaches the next one to the rebuilt (or reset) model.  Any failure ends the rank, and
        with it the job (L2)."""
        rb = self.rebuild
        assert rb is not None  # a death or a discard is an episode only where a rebuild was given
        seen = self.notices.count() if self.notices is not None else 0
        state = rb.begin()
        self.suspend()
        t = time.monotonic_ns()
        in_place = rb.build is rebuild_in_place  # the wrapper goes on: its state is reset, not moved (Effects._rebind)
        sw = SwapFacts(role="survivor", point=need.point, dead=tuple(sorted(need.dead)), job=rb.job, rebuild=rb.build,
                       extra=state.get("extra"), rng=state.get("rng"),
                       old=None if in_place else (self.module, self.optimizer), held=(self._pg,),
                       mode=getattr(need, "mode", ""))
        ep = Episode(self.gen, True, tuple(range(self.groups.count)), t, t, need.error, swap=sw)
        self._episode = ep
        try:
            drive(self, ep, self.SWAP_STEPS)
        except Left:
            # RankLeave (a shrink): this rank's replica left; its engine stops here and training ends on it
            sw.old = None
            self.retire()
            if self.notices is not None:
                self.notices.handled(seen)
            if rb.left is not None:
                # a death's shrink benches this live rank (it idles, a grow may recall it); a requested one ends it
                rb.left(sw.dead, getattr(need, "mode", "") != "shrink")
            return
        record = swap_record(ep)
        module, optimizer = sw.module, sw.optimizer
        sw.module = sw.optimizer = None
        self.retire()
        if self.notices is not None:
            self.notices.handled(seen)
            try:  # the deaths a peer's claim absorbed in this episode (a discard here, a swap there)
                self.notices.handled_claimed(_swap.read_claims(self.control.store, ep.g, rb.job.world))
            except Exception:  # noqa: BLE001 - store lost after the release: the next episode's observation
                pass
        rb.then(module, optimizer, record)

    def rebind(self, new_pg: Any) -> int:
        """Phase 5 alone (``RankRebind``) onto ``new_pg``, outside any episode: for the phase-5
        benchmark (``accelpact bench rebind``), which measures it in an attached engine.  Returns the
        references rebound; a stale one is a :class:`RebindError` (raised: no exit)."""
        ep = Episode(self.gen, True, (self.groups.index,), 0, 0, None, new_pg=new_pg)
        drive(self, ep, tuple(dataclasses.replace(s, point=None) for s in self.REPAIR_STEPS if s.action == "RankRebind"),
              raising=True)
        return ep.refs_rebound

    # ---- the repair ------------------------------------------------------------------------------
    def _recover(self, failed: list[int] | None, t0: int, t_obs: int, err: BaseException | None) -> RecoveryReport:
        """The repair (``REPAIR_STEPS``: phases 2-6 and the release, spec/protocol.md).  A rank outside
        the failed groups, or a member whose probe passed while a peer's failed, learns of the failure
        from the flag and observes it now (a member then publishes R's revoke).  ``failed`` None: the
        failure flag failed (P18.4): the failed groups are read after the agreement."""
        ep = Episode(self.gen, failed is not None and self.groups.index in failed,
                     tuple(failed) if failed is not None else None, t0, t_obs, err)
        ep.revoke_to_observe_ns = self._revoke_latency(ep)
        self._episode = ep
        if self._observed_gen != ep.g:
            self._observe("boundary", None, cause="flag", member=ep.member, failed_groups=list(ep.failed or ()))
            if ep.member:
                self._publish_revoke_or_lose_store(ep.g)
        drive(self, ep, self.REPAIR_STEPS)
        self._episode = None
        d = ep.durations
        return RecoveryReport(
            generation=ep.g, member=ep.member, observe_ns=t_obs - t0, agree_ns=d["guard"] + d["agree"],
            rebuild_ns=d["replace"], rebind_ns=d["rebind"], validate_ns=d["validate"],
            release_ns=d["release"] - d.get("resume", 0), retire_ns=d.get("resume", 0),
            total_ns=time.monotonic_ns() - t_obs, refs_rebound=ep.refs_rebound,
            revoke_to_observe_ns=ep.revoke_to_observe_ns,
        )

    def _revoke_latency(self, ep: Episode) -> int:
        """This rank's revoke hard-close -> observed (-1: observed directly, before the revoke reached it)."""
        if ep.member and ep.error is not None:
            revs = [r for r in self.watchdog.revocations if r[0] == ep.g]
            if revs and ep.t_observed >= revs[0][3]:
                return ep.t_observed - revs[0][3]
        return -1

    # ---- RankObserve's causes (the effect: Effects._observe) ---------------------------------------
    def _observe_wide(self, exc: BaseException, cause: str = "flag") -> None:
        """RankObserve at the boundary through a failed group over all of W (P18.4): the failure flag,
        or a checkpoint save after a boundary that found nothing.  A standing abort is what reached us
        (``RankExit``).  Otherwise the rank publishes the wide revoke (``RankRevokeWide`` if it wrote it
        first: every watcher closes its groups over W, so a peer blocked in the flag or the save wakes
        up), then records its observation if it has not observed this generation's failure yet; which
        groups of R's kind failed, and that the groups over W failed, is read after the agreement
        (``Effects._await_agreement``).  ``cause``: ``flag`` or ``save``."""
        try:
            standing = self.control.read_abort()
        except Exception as err:  # noqa: BLE001 - store lost: RankLoseStore
            claim_exit()
            self.watchdog.lose_store(err, claimed=True)
            raise Exited from err
        if standing:
            self.watchdog.exit_with(standing)  # RankExit on the abort that ended the collective
            raise Exited
        self.watchdog.disarm()
        try:
            self._revoke_wide(exc, cause)
        except Exited:
            raise
        except Exception as err:  # noqa: BLE001 - store lost: RankLoseStore
            if self.control.reachable():
                raise
            claim_exit()
            self.watchdog.lose_store(err, claimed=True)
            raise Exited from err
        self._observe("boundary", exc, cause="wide", member=None, wide=True)

    def repair_after_save(self, exc: BaseException) -> RecoveryReport | None:
        """A checkpoint save at the boundary failed (P18.4): a group over all of W failed after a
        boundary that found nothing.  The observation (:meth:`_observe_wide`), then the repair as at
        the boundary (:meth:`_recover`): every group that failed is rebuilt, the checkpoint group with
        the other groups over W.  Returns the repair's report; the caller saves again on the new
        checkpoint group.  A rank that died in the save, or was deposed during it (a keeper's death
        notice, which ended the save's waits: ``SaveFailed.dead``), is taken as a death at the boundary:
        the swap (or the shrink) that the episode decides, and None; the caller saves again after the
        release."""
        t0 = time.monotonic_ns()
        self.watchdog.arm(self.step_deadline_s)
        try:
            self._swap_if_died("boundary", exc)
        except _swap.SwapNeeded as need:
            self._rebuild(need)
            return None
        self._observe_wide(exc, "save")
        report = self._recover(None, t0, time.monotonic_ns(), exc)
        self.reports.append(report)
        self.watchdog.disarm()
        return report

    def _discard_if_qualified(self, point: str, exc: BaseException) -> None:
        """RankObserve of an in-flight failure that the contract lets this rank discard (P17: forward
        or backward, the envelope's cell L1, a ``rebuild`` given): records it, publishes the step's revoke on
        every group of R's kind (each rank's watcher then closes all of its training groups, so a
        peer blocked in any collective of the abandoned step wakes up), and raises
        :class:`~accelpact.impl.runtime.hotswap.SwapNeeded` with no dead rank: the training loop runs
        the episode (:meth:`_rebuild`: discard, agreement, every group rebuilt, validation, release).
        Returns where the contract says L2 (the caller then rejects)."""
        if not self.discard or point not in DISCARD_PHASES:
            return
        try:
            revoked = self.control.revoked(self.gen, self.groups.key)  # a peer observed a communicator failure
        except Exception:  # noqa: BLE001 - store lost: not a discard (the watchdog exits, RankLoseStore)
            return
        if not (is_comm_failure(exc) or revoked):
            return  # the application's own error (it would recur in the rerun): the contract's L2
        if not decide(self.envelope, self._key(point), True).preserve:  # the guard is checked after the discard
            return
        self.watchdog.disarm()
        g = self.gen
        self._observe(point, exc, cause="discard", in_flight=True)
        try:
            for i in range(self.groups.count):  # peers blocked on any group of the step wake up
                key = self.groups.name if self.groups.count == 1 else f"{self.groups.name}{i}"
                self.control.publish_revoke(g, key, step=True)
        except Exception:  # noqa: BLE001 - store lost: the watchdog exits DEADLINE (RankLoseStore)
            pass
        raise _swap.SwapNeeded(point, (), exc) from exc

    def _observe_in_flight(self, point: str, exc: BaseException) -> None:
        """RankObserve of an in-flight failure, then RankReject: the contract says L2 (C3 rule 1).
        Held from the revoke to the exit: the guard check and the contract are local (no wait on
        peers), and a peer's rejection must not end this rank between its RankObserve and the
        RankReject it is about to record (the model allows both; the record then says which)."""
        with self._hold():
            self._observe(point, exc, cause="in_flight", in_flight=True)
            try:
                self.control.publish_revoke(self.gen, self.groups.key)  # peers blocked on R wake up
            except Exception:  # noqa: BLE001 - store lost: the watchdog exits DEADLINE
                pass
            report = self.guard.check()
            decision = decide(self.envelope, self._key(point), report.ok)
            self._reject(decision.reason, report.reasons)

    # ---- phase 5's sites ---------------------------------------------------------------------------
    def _discover(self) -> list:
        """Every cached reference to R reachable from the module: the adapter's sites united with the
        generic walker's (which stops at the engine's own objects), so phase 5 can check them in
        O(sites).  Run at attach and once more after the first committed step, when the wrappers'
        lazily built state (FSDP's lazy init, DDP's reducer) exists."""
        sites = list(self.adapter.discover(self.module, self._pg))
        known = site_set(sites)
        sites += [s for s in find_references(self.module, self._pg, stop=self._own_objects())
                  if (s.owner_id, s.kind, s.key) not in known]
        return sites

    def _own_objects(self) -> tuple:
        """The engine's objects, where phase 5's walk stops: the guard's hooks make them reachable
        from the module, and behind them lie only the engine's own references (R's current
        communicator, moved first in :meth:`_rebind`; socket records; the store), never a cached
        reference of the wrapper's.  Walking them cost two to four orders of magnitude more than
        the module alone (bench/README.md, "Phase 5")."""
        return tuple(o for o in (self, getattr(self, "guard", None), getattr(self, "watchdog", None),
                                 getattr(self, "detector", None), self.control, self.trace, self.hooks, self.adapter,
                                 self.strategy, self.sites, self.envelope) if o is not None)

    # ---- end -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Normal end of training: stop the watchdog, remove the hooks, end the trace."""
        if self.closed:
            return
        self.closed = True
        if self.detector is not None:
            self.detector.close(leave=True)
        self.watchdog.stop()
        self.guard.remove()
        self.trace.end("released", gen=self.gen, frontier=self.guard.frontier)


def _active_peers(control: Any, rank: int) -> list[int] | None:
    """The detector's peers in a shrunk job (issue 41): the other active ranks (a rank out of training
    never beats); None (the detector's default) while every rank is in training."""
    members = tuple(getattr(control, "members", range(control.world_size)))
    return [m for m in members if m != rank] if len(members) < control.world_size else None


def swap_record(ep: Episode) -> _swap.SwapRecord:
    """What the run's result says of a swap (or a discard) this rank took part in."""
    sw = ep.swap
    assert sw is not None
    return _swap.SwapRecord(generation=ep.g, point=sw.point, dead=list(sw.dead), spares=dict(sw.claims),
                            sources=dict(sw.sources), frontier=ep.frontier, role=sw.role,
                            durations_ms={k: round(v / 1e6, 3) for k, v in ep.durations.items()},
                            t_resume=time.monotonic())


def attach(module, optimizer, *, groups: PactGroups, control: ControlPlane, trace=None, envelope=None,
           key: ObservationKey | None = None, deadline_s: float = DEFAULT_DEADLINE_S, adapter=None, frontier: int = 0,
           strategy: ReplacementStrategy | None = None, step_deadline_s: float | None = None,
           hooks: Hooks | None = None, detect: bool = True, dead_after_s: float | None = None,
           hang_threshold_s: float | None = None, generation: int = 0, notices: Any = None,
           rebuild: Rebuild | None = None, wide: Callable[[int], tuple[list[str], Any, dict]] | None = None,
           wide_records: Callable[[], list] | None = None, predecessor: Any = None,
           hang_floor_s: float | None = None) -> Pact:
    """Discover R's cached references once, install the guard, start the watchdog.  ``predecessor``:
    the retired engine's watchdog (after a swap or a discard), whose abort thread the new one takes
    over (``Watchdog.start(succeed=)``).  ``rebuild``: how an episode rebuilds the model
    (:class:`Rebuild`), so a failure in forward or backward is discarded in place where the envelope
    says L1 (P17) and a dead rank is swapped for a spare (P16); without it those cells are L2.

    ``deadline_s`` bounds each wait on peers in phases 2-6; ``step_deadline_s`` bounds a whole step
    (forward to the end of its boundary) before the watchdog takes the rank for hung and exits
    72: default :func:`accelpact.impl.deadlines.default_step_deadline` of R's collective timeout and
    ``deadline_s``; ``math.inf`` turns it off.  ``hooks``: test-only
    (:class:`accelpact.impl.hooks.Hooks`: fault injection at named points, seeded bugs)."""
    return Pact(module, optimizer, groups=groups, control=control, trace=trace, envelope=envelope, key=key,
                deadline_s=deadline_s, adapter=adapter, frontier=frontier, strategy=strategy, hooks=hooks,
                step_deadline_s=step_deadline_s,
                detect=detect, dead_after_s=dead_after_s, hang_threshold_s=hang_threshold_s, generation=generation,
                notices=notices, rebuild=rebuild, wide=wide, wide_records=wide_records, predecessor=predecessor,
                hang_floor_s=hang_floor_s)
