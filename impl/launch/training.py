"""The step loop around the attached engine: :class:`Training`, what ``Session.attach`` returns.

``with run.step(step):`` wraps forward, backward and ``optimizer.step()``; ``run.boundary(loss)``
closes the step at the committed boundary (the engine's repair, then the checkpoint when due).  An
episode that rebuilds the model (a hot swap, a discard in place) is the engine's: it asks this loop
for the state published at F as it begins (:meth:`Training._begin`) and hands it the rebuilt model
when it released (:meth:`Training._continue`), and the step it discarded comes again.

Asynchronous checkpoints (``attach(checkpoint="async")``; :mod:`accelpact.impl.runtime.checkpoint`):
at a due boundary the save is staged and launched (:meth:`Training._save`, ``how="launch"``) and
the next step runs while it is written.  Ordering: a save in flight is waited for (its outcome read,
:meth:`Training._drain`) before anything can rebuild the groups it runs on: at the next boundary,
before the engine's boundary (a repair there, or a swap, rebuilds the checkpoint group); as an
episode in a step begins (:meth:`Training._begin`); at ``job.close()`` (:meth:`Training.settle_checkpoint`).
A lost save (it failed, or was abandoned) is not durable and is never an exception out of
``run.boundary``: the checkpoint is taken again, synchronously (``how="retake"``), after the engine's
boundary (or after the release of the episode it overlapped), of the frontier then, with the sync
path's repair-and-save-again on a failure of its own.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey

from ..controlplane import PREFIX, WIDE_ENTRY, ControlPlane, progress_key
from ..episode import Rebuild
from ..recovery import PactGroups, attach
from ..runtime import hotswap, revoke
from ..runtime import rng as _rng
from ..runtime.checkpoint import Abandon, CheckpointError, SaveFailed
from ..runtime.retire import collect_off_path
from ..runtime.wrappers import wrapper, wrapper_of
from .. import shrink as _shrink
from .errors import ApiError

__all__ = ["SAVE_TRIES", "Training", "pact_groups"]


def _progress_hook(store: Any, key: str, pact: Any) -> Callable[..., None]:
    """The optimizer's post-step hook that publishes F at the commit.  It holds the engine weakly: a
    swap or a discard retires the engine, and an old optimizer the user still holds must not keep it,
    and through it every group of its generation, alive (bench/README.md, K3)."""
    engine = weakref.ref(pact)

    def publish(*_: Any) -> None:
        p = engine()
        if p is not None:
            store.set(key, str(p.guard.frontier))

    return publish


#: saves of one checkpoint, each after an in-place repair of the groups its failed collective met (P18.4)
SAVE_TRIES = 3


@dataclass(eq=False)
class Training:
    """The attached engine and the step loop around it.  ``pact``: the engine
    (:class:`accelpact.impl.recovery.Pact`: ``reports``, ``gen``, ``frontier``); a hot swap replaces
    it (and the model: :attr:`module`, :attr:`optimizer`) with one of the next generation."""

    job: Any                         # the Session (impl/launch/api.py)
    pact: Any
    checkpoints: Any
    start_step: int
    resumed_from: int | None
    restored_extra: Any
    extra_state: Callable[[], Any] | None
    wrapper: str
    rebuild: Callable[[Any, Any], tuple[Any, Any]] | None = None
    hooks: Any = None
    spare_index: int | None = None
    #: steps whose checkpoint this rank saved: (step, seconds)
    saved: list = field(default_factory=list)
    #: hot swaps this rank took part in (:class:`accelpact.impl.runtime.hotswap.SwapRecord`)
    swaps: list = field(default_factory=list)
    #: the step just run was discarded by a hot swap: :meth:`boundary` does nothing and
    #: :meth:`steps` yields the same step again
    discarded: bool = False
    #: issue 41: this rank's replica left the data-parallel dimension (a shrink): :meth:`steps` ends,
    #: :meth:`boundary` does nothing, and ``job.close()`` ends the process (exit 0) without a collective
    left: bool = False
    #: a death's shrink benched this live rank: :meth:`steps` idles until a grow recalls it (then it
    #: trains again in the generation the grow built) or the job ends
    benched: bool = False
    _notices: Any = None
    _watcher: Any = None
    _progress: Any = None
    _published: Any = None
    #: the step :meth:`step` opened that no :meth:`boundary` has closed yet (None: none open)
    _open: int | None = None
    #: an episode rebuilt the model: the boundaries until the retired generation's cycles are collected
    #: (:func:`accelpact.impl.runtime.retire.collect_off_path`; at the second: at the first, some of the old
    #: generation's groups are still reachable, tests/test_episode_leaks.py)
    _collect_due: int = 0
    #: an async save lost as an episode in a step began (:meth:`_begin`): the step it was of, taken
    #: again once that episode released (:meth:`step`)
    _owed: int | None = None

    # ---- the engine --------------------------------------------------------------------------
    def _engage(self, model: Any, optimizer: Any, *, generation: int, frontier: int, trace: Any) -> None:
        """Attach an engine of ``generation`` to ``model``/``optimizer`` at ``frontier`` (at attach,
        and after a hot swap or a discard, on the model it rebuilt)."""
        job, s = self.job, self.job.settings
        wrap = wrapper_of(model)
        self.wrapper = wrap.name
        pg = pact_groups(job.topology, job.rank, wrap.name, job.groups.control, job.groups.training, job.groups.records,
                         active=job.groups.active)
        # the control plane counts the ranks in training (all of W unless the job shrank, issue 41)
        control = _shrink.ActiveControlPlane(job.attempt_store, job.rank, job.world, prefix=PREFIX,
                                             members=job.groups.members(range(job.world)))
        platform, envelope = job.contract
        key = ObservationKey(platform, wrap.name, "boundary", DEFAULT_OBJECTIVE)
        total = getattr(job, "_micro_batches", None)
        if total and total < _shrink.replicas_of(job.topology, wrap.recovers):
            raise ApiError(f"attach: micro_batches={total} is fewer than the job's "
                           f"{_shrink.replicas_of(job.topology, wrap.recovers)} replicas ({wrap.name}: "
                           f"{'one per rank' if wrap.recovers == 'world' else 'one per shard group'}): every replica "
                           "needs at least one micro-batch")
        # a job that can shrink (micro_batches) needs the keepers' death notices as one with spares does
        watches = bool(job.spares or getattr(job, "_micro_batches", None))
        if watches and self._notices is None:
            self._notices = hotswap.Notices(job.attempt_store)
            self._notices.handled(self._notices.count())
        rebuild = Rebuild(job, self.rebuild, begin=self._begin, then=self._continue, left=self._left) \
            if self.rebuild is not None else None
        self.pact = attach(model, optimizer, groups=pg, control=control, trace=trace, deadline_s=s.deadline_s,
                           step_deadline_s=s.step_deadline_s, frontier=frontier, key=key, envelope=envelope,
                           hooks=self.hooks, detect=s.detect, dead_after_s=s.dead_after_s,
                           hang_threshold_s=s.hang_threshold_s, hang_floor_s=s.hang_floor_s, generation=generation,
                           notices=self._notices,
                           rebuild=rebuild, wide=job.rebuild_wide, wide_records=job.groups.wide_records,
                           predecessor=self.pact.watchdog if self.pact is not None and self.pact.closed else None)
        # F is published at the commit itself (the optimizer's post hook, after the guard's), not after
        # the boundary: a peer's abort can end this rank between its commit and the boundary, and an L2
        # restart replays up to the F the failure interrupted (the worker's result, the benchmarks)
        # (the hook holds the store and the pact, never this job: the job holds the training groups,
        # and phase 5's check would find them, through the module's hooks, as stale references)
        if self._progress is not None:  # a discard in place keeps the optimizer: one publisher at a time
            self._progress.remove()
        self._progress = optimizer.register_step_post_hook(_progress_hook(job.store, progress_key(job.attempt, job.rank),
                                                                          self.pact))
        # from here the engine owns R: keeping the generation-0 communicator here would keep it alive
        # (threads, sockets) after a repair retires it; job.replicate_group asks the engine
        job.groups.training.pop(pg.name, None)
        if job.spares:
            self._publish()
        elif self.rebuild is not None:
            self._keep_for_discard()
        if watches:
            pact = self.pact
            active = set(job.groups.members(range(job.world)))
            self._watcher = hotswap.SwapWatcher(
                job.attempt_store, lambda: [*{id(r): r for r in pact.group_records().values()}.values(), job.groups.control_record],
                seen=self._notices.seen, relevant=active.__contains__).start()

    @property
    def module(self) -> Any:
        """The wrapped model the engine is attached to (a hot swap rebuilds it)."""
        return self.pact.module

    @property
    def optimizer(self) -> Any:
        return self.pact.optimizer

    # ---- the step loop -----------------------------------------------------------------------
    def steps(self, total: int) -> Iterator[int]:
        """The steps still to run: ``start_step .. total - 1``; with spares or ``rebuild=``, always the
        step at the frontier F (a step a hot swap or a discard in place dropped comes again)."""
        if not self.job.spares and self.rebuild is None:
            yield from range(self.start_step, total)
            return
        while True:
            if self.left:
                if not self.benched or not self._recall():
                    return
                continue
            if self.pact.frontier >= total:
                return
            yield self.pact.frontier

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator["Training"]:
        """Context manager around forward, backward and ``optimizer.step()`` (see :meth:`Pact.step`).
        With spares, a rank's death in it is a hot swap; with ``rebuild=``, a communicator failure in
        forward or backward is discarded in place (spec/protocol.md P17): either way the engine runs the
        episode, the engine of the next generation takes over (:meth:`_continue`), the step is discarded
        (``discarded``) and :meth:`steps` yields it again.
        Every step not discarded must be closed by :meth:`boundary` before the next one opens (the
        commit: without it nothing is repaired or checkpointed); opening one otherwise is an
        :class:`ApiError`."""
        if self._open is not None and not self.discarded:
            # without a boundary nothing is ever committed: no repair, no checkpoint, and the run
            # still exits 0; a discarded step (hot swap) comes again without one, legitimately
            raise ApiError(f"run.step({step}): step {self._open} was never closed by run.boundary(loss): write "
                           "run.boundary(loss) after each `with run.step(step):` block (the committed boundary, "
                           "where repairs and checkpoints happen; without it no checkpoint is ever written)")
        self.discarded = False
        self._open = step
        pact = self.pact
        with pact.step(step):
            yield self
        self.discarded = self.pact is not pact  # an episode rebuilt the model: the step comes again
        owed, self._owed = self._owed, None
        if owed is not None and not self.left and self.job.groups.active is None:
            # an async save in flight was lost as this step's episode began (_begin): taken again now,
            # after the release, by every rank (a spare in a dead rank's identity too: _save_on_join)
            self._save(owed, self.extra_state() if self.extra_state is not None else None, how="retake")

    def boundary(self, loss: Any = None):
        """After the commit: the engine's boundary (a repair, if any, happens here and its
        :class:`~accelpact.impl.recovery.RecoveryReport` is returned), then the checkpoint when due.
        After a discarded step: nothing (None)."""
        self._open = None
        if self.discarded or self.left:
            return None
        if self._collect_due:  # the second commit after a rebuild: the old generation is unreachable by then
            self._collect_due -= 1
            if not self._collect_due:
                detector = getattr(self.pact, "detector", None)  # the collection's pause is announced to peers
                collect_off_path(quiet=detector.quiet if detector is not None else None)
        if self.job.spares:
            self._publish()
        elif self.rebuild is not None:
            self._keep_for_discard()
        # an async save in flight ends before the engine's boundary, which may rebuild its group; a lost
        # one is owed in this generation before that boundary's episode, if any, can swap in a spare
        lost = self._drain(rearm=True)
        if lost is not None:
            self.checkpoints.owe(self.pact.gen, self.pact.frontier)
        report = self.pact.boundary(loss)  # None after a hot swap here (a death noticed at the boundary)
        if self.left:  # a requested shrink took this rank's replica out at this boundary
            return None
        frontier = self.pact.frontier
        # a shrunk job saves no checkpoint (issue 41): the last one, of the whole job, stays the one an L2
        # restart resumes from (every rank's state is in it); saving resumes once the job grew back
        if self.checkpoints is not None and self.job.groups.active is None:
            if lost is not None:  # every rank read the same outcome: every rank takes it again, now
                cursor = self.extra_state() if self.extra_state is not None else None
                report = self._save(frontier, cursor, how="retake") or report
            elif self.checkpoints.due(frontier):
                cursor = self.extra_state() if self.extra_state is not None else None
                report = self._save(frontier, cursor, how="launch" if self.checkpoints.mode == "async" else "sync") \
                    or report
        return report

    def _save(self, frontier: int, cursor: Any, how: str = "sync"):
        """The checkpoint of ``frontier``: ``how`` is ``sync`` (the whole save here), ``launch`` (an
        async save staged and launched here, its outcome read at the next boundary: :meth:`_drain`) or
        ``retake`` (a lost async save taken again, synchronously; before each try it is said on the
        store as owed in the try's generation, so that a spare taking a rank's identity in the episode
        of a failed try takes it too: :meth:`_save_on_join`).  A fault during the save (for a launch,
        during its staging) is an episode like any other.  A save
        that meets a failed group over all of W is the engine's observation at the boundary
        (spec/protocol.md P18.4): every rank repairs (the checkpoint group is rebuilt with the other
        groups over W) and saves again.  A rank of W that dies during the save (a crash; a stopped or
        hung rank, once the failure detector declared it and its keeper deposed it) ends every wait of
        the save within a slice of the keeper's death notice (:meth:`_save_abandoned`,
        :meth:`_save_interrupt`); then, with a spare idle, it is swapped as a death at the boundary
        is (:meth:`~accelpact.impl.recovery.Pact.repair_after_save`), and every rank, the spare in the dead
        rank's identity included, takes the save again after the release, in the next generation.
        Without a spare, in a job that can shrink, the replica shrinks instead, and a shrunk job saves
        nothing (as at any boundary).  Returns the repair's report, if there was one (None after a swap
        or a shrink)."""
        report = None
        for _try in range(SAVE_TRIES):
            pact = self.pact
            try:
                if how == "launch":
                    self.checkpoints.launch(frontier, pact.module, pact.optimizer, cursor=cursor, tag=pact.gen,
                                            abandoned=self._save_abandoned(pact), stage_interrupt=self._save_interrupt,
                                            interrupt=self._checkpoint_interrupt(self.job.groups.checkpoint_record))
                    return report  # self.saved gets it once its outcome is read (_drain)
                if how == "retake":
                    self.checkpoints.owe(pact.gen, frontier)
                took = self.checkpoints.save(frontier, pact.module, pact.optimizer, cursor=cursor, tag=pact.gen,
                                             abandoned=self._save_abandoned(pact), interrupt=self._save_interrupt)
            except SaveFailed as exc:
                failed = exc
                report = pact.repair_after_save(exc) or report
                if self.left or self.job.groups.active is not None:  # the episode shrank the job
                    return report
                continue
            self.saved.append((frontier, took))
            return report
        raise CheckpointError(f"checkpoint of step {frontier}: every one of {SAVE_TRIES} saves failed, each repaired in "
                              f"place; the last: {failed}") from failed

    def _drain(self, rearm: bool = False) -> BaseException | None:
        """Wait for the async save in flight, if any, and read its outcome (the same on every rank:
        :meth:`accelpact.impl.runtime.checkpoint.CheckpointManager.finish`): None when it committed (or
        none was in flight), else its failure (:class:`SaveFailed`, :class:`CheckpointError`), which
        the caller turns into a retake, never into an exception.  Called by every rank at the same
        points (module doc), always before an episode rebuilds the checkpoint group the save runs on.
        The wait is not the step's: the step deadline is disarmed for it (``rearm``: armed again after
        it, for the boundary's own collectives that follow)."""
        ck = self.checkpoints
        if ck is None or ck.pending is None:
            return None
        step = ck.pending.step
        self.pact.watchdog.disarm()
        try:
            took = ck.finish()
        except (SaveFailed, CheckpointError) as exc:
            return exc
        finally:
            if rearm:
                self.pact.watchdog.arm(self.pact.step_deadline_s)
        self.saved.append((step, took))
        return None

    def settle_checkpoint(self) -> None:
        """At ``job.close()``, on every rank before its last collectives: the async save in flight is
        waited for; a lost one is taken again there, synchronously (:meth:`_save`), of the last F."""
        lost = self._drain()
        if lost is not None and not self.left and self.job.groups.active is None and self.checkpoints is not None:
            self._save(self.pact.frontier, self.extra_state() if self.extra_state is not None else None, how="retake")

    def _save_on_join(self, point: str, generation: int) -> None:
        """A spare that took a dead rank's identity in the episode of ``generation`` (at F, ``point``):
        the save its survivors take after that release, which it must take with them (every save is
        collective).  A save owed after that episode (:meth:`accelpact.impl.runtime.checkpoint.CheckpointManager.owe`:
        a lost async save, or a retake whose try the death failed) is taken again synchronously, as the
        survivors do; else a death at the boundary of a due F leaves the survivors going on to that
        boundary's checkpoint (sync, or launched in async mode), which this identity never reached."""
        ck, frontier = self.checkpoints, self.pact.frontier
        if ck is None or self.job.groups.active is not None:
            return
        if ck.mode == "async" and ck.owed(generation) == frontier:
            how = "retake"
        elif point == "boundary" and ck.due(frontier):
            how = "launch" if ck.mode == "async" else "sync"
        else:
            return
        self._save(frontier, self.extra_state() if self.extra_state is not None else None, how=how)

    @staticmethod
    def _checkpoint_interrupt(record: Any) -> Callable[[], None]:
        """A background save's ``interrupt()``: the sockets of the checkpoint group it runs on (``record``,
        that group's, taken at the launch) shut down, so that a collective of the save blocked on a dead
        or stopped peer fails at once.  Only that group: the training thread is using the others."""
        def interrupt() -> None:
            if record is not None:
                revoke.hard_close_all([record])

        return interrupt

    def _save_abandoned(self, pact: Any) -> Callable[[], Any]:
        """The save's ``abandoned()`` in ``pact``'s generation (two store requests a call): a peer's save
        failed (the wide revoke of the generation stands), or, in a job that reads the keepers' death
        notices (spares, or one that can shrink), a notice this rank has not handled was posted: its
        worker crashed, or was deposed (killed by its keeper) after a survivor's failure detector
        declared it dead or hung.  Otherwise a declared rank ends every survivor through its watchdog
        (``RankSuspect``)."""
        notices = self._notices

        def abandoned() -> Any:
            if pact.control.revoked(pact.gen, WIDE_ENTRY):
                return Abandon(f"a peer's save failed (the wide revoke of generation {pact.gen} stands)")
            if notices is not None:
                n = notices.count()
                if n > notices.seen:
                    dead = tuple(sorted(set(notices.read(n))))
                    return Abandon(f"rank(s) {list(dead)} died or were deposed during the save (death notice)", dead)
            return None

        return abandoned

    def _save_interrupt(self) -> None:
        """The save's ``interrupt()``: the sockets of the groups over all of W shut down (the default,
        control and checkpoint groups: DCP's collectives, FSDP1's state-dict gathers), so a collective
        of the save blocked on a dead or stopped peer fails at once.  The episode that follows (a swap,
        a repair) builds every one of them anew."""
        revoke.hard_close_all(self.job.groups.wide_records())

    # ---- an episode that rebuilds the model -----------------------------------------------------
    def _publish(self) -> None:
        """What a spare taking this identity needs at F (RNG, extra state); kept locally for the discard."""
        extra = copy.deepcopy(self.extra_state()) if self.extra_state is not None else None
        self._published = hotswap.publish_state(self.job.attempt_store, self.job.rank, self.pact.frontier, extra,
                                                device=getattr(self.job, "device", None))

    def _keep_for_discard(self) -> None:
        """Without spares, what a discard in place needs at F (P17), kept locally: the RNG state (the CPU
        generator and the CUDA generator of the rank's device, :func:`accelpact.impl.runtime.rng.capture`)
        and a copy of the extra state (the data cursor), taken at each committed boundary.  Kept as it
        is while F does not move (after a discard the loop sets its loader back only once the step
        exits), and at attach after an L2 restart the extra state is the checkpoint's
        (``restored_extra``: the loop sets its loader from it only after ``attach`` returns)."""
        frontier, kept = self.pact.frontier, getattr(self, "_published", None)
        if kept is not None and kept.get("frontier") == frontier:
            return
        if kept is None and getattr(self, "resumed_from", None) is not None:
            extra = copy.deepcopy(self.restored_extra)
        else:
            extra = copy.deepcopy(self.extra_state()) if self.extra_state is not None else None
        self._published = {"rng": _rng.capture(getattr(self.job, "device", None)), "extra": extra, "frontier": frontier}

    def _begin(self) -> dict:
        """``Rebuild.begin``: as the engine's episode begins, the death-notice watcher of the old
        generation stops, and the state published at F is handed over (``extra``, ``rng``).  An async
        save still in flight (launched at the boundary of F, in a step's episode) is waited for first:
        the episode rebuilds the checkpoint group it runs on.  A peer blocked in it on a dead or stopped
        rank fails within a slice of the death notice or of a peer's withdrawal; one that completes
        stands.  If it was lost, it is owed after this episode (:meth:`CheckpointManager.owe`, read by
        a spare taking an identity in it) and taken again once the episode released (:meth:`step`)."""
        if self._watcher is not None:
            self._watcher.stop(join=False)
        ck = self.checkpoints
        if ck is not None and ck.pending is not None:
            frontier, gen = ck.pending.step, self.pact.gen
            if self._drain() is not None:
                self._owed = frontier
                try:
                    ck.owe(gen, frontier)
                except Exception:  # noqa: BLE001 - store lost: the watchdog ends the rank (RankLoseStore)
                    pass
        published = self._published or {}
        return {"extra": copy.deepcopy(published.get("extra")), "rng": published.get("rng")}

    def _left(self, leaving: Any, bench: bool = False) -> None:
        """``Rebuild.left``: this rank's replica left the data-parallel dimension (``RankLeave``) and its
        engine stopped: no step runs here (``left``).  ``bench`` (a death's shrink benched this live
        rank): it idles as a spare of its own identity (:func:`accelpact.impl.shrink.bench`), which a
        grow may recall (:meth:`_recall`); otherwise (a requested shrink) the training ends on this rank
        and its trace is closed."""
        self.left, self.benched = True, bench
        if self._watcher is not None:
            self._watcher.stop(join=False)
        if bench:
            _shrink.bench(self.job.attempt_store, self.job.rank)
            return
        try:
            self.pact.trace.end("left", gen=self.pact.gen, frontier=self.pact.frontier)
        except Exception:  # noqa: BLE001 - a trace that cannot be written loses its end record only
            pass

    def _recall(self) -> bool:
        """A benched rank idles (:func:`accelpact.impl.shrink.wait_recall`) until a grow claims its
        identity, then takes part in the grow as a spare of its own identity would: ``SpareJoin``, the
        swap's steps (every group built anew, the model rebuilt, its state received from a live
        replica, validated, released: :class:`accelpact.impl.spare.SpareEngine`), and trains on in the
        next generation (True).  False: the job ended meanwhile (``closed``); an abort ends the process
        with its code, as it ends an idle spare."""
        from ..controlplane import ABORT_KEY
        from ..exitcodes import code_for, exit_now
        from ..spare import SpareEngine

        job = self.job
        got = _shrink.wait_recall(job.attempt_store, job.rank, ABORT_KEY, job.settings.spare_wait_s)
        if isinstance(got, str):
            if got == "closed":
                try:
                    self.pact.trace.end("left", gen=self.pact.gen, frontier=self.pact.frontier)
                except Exception:  # noqa: BLE001 - a trace that cannot be written loses its end record only
                    pass
                return False
            exit_now(code_for(got if got in ("rejected", "mismatch", "deadline", "exception") else "deadline"), got, None)
            return False  # never reached: exit_now ends the process
        g, point = got
        assert self.rebuild is not None  # a job that can shrink was attached with rebuild=
        published = hotswap.read_state(job.attempt_store, job.rank)
        if published is None:
            raise hotswap.SwapError(f"rank {job.rank}: recalled from the bench, but nobody published its state at F")
        trace = self.pact.trace
        engine = SpareEngine(job, control=ControlPlane(job.attempt_store, job.rank, job.world, prefix=PREFIX), spare=-1,
                             generation=g, published=published, trace=trace, hooks=self.hooks,
                             deadline_s=job.settings.deadline_s)
        engine.join()
        n = self._notices.count() if self._notices is not None else 0
        module, optimizer, record = engine.swap(point=point, rebuild=self.rebuild, extra=copy.deepcopy(published["extra"]))
        if self._notices is not None:  # deaths noticed while benched were the survivors' episodes, not this one's
            self._notices.handled(n)
        self.left = self.benched = False
        self.discarded = False
        self._open = None
        self.swaps.append(record)
        if self.checkpoints is not None:
            self.checkpoints = job._checkpoints(self.checkpoints.root, self.checkpoints.every)
        self.pact = None  # the retired engine is no predecessor: the recall's own engine watched the episode
        self._engage(module, optimizer, generation=g + 1, frontier=int(published["frontier"]), trace=trace)
        self._collect_due = 2
        return True

    # ---- issue 41: micro-batches --------------------------------------------------------------------
    @property
    def total_micro_batches(self) -> int | None:
        """The step's micro-batch count given at attach (``micro_batches=``); None: not opted in."""
        return getattr(self.job, "_micro_batches", None)

    @property
    def active_replicas(self) -> tuple[int, ...]:
        """The replicas in the data-parallel dimension now (ascending; all of them unless the job shrank)."""
        kind = wrapper(self.wrapper).recovers
        return _shrink.active_replicas(self.job.topology, kind, self.job.groups.active)

    @property
    def replica(self) -> int:
        """This rank's replica: the rank for DDP, its shard group's index for HSDP."""
        return _shrink.replica_of(self.job.topology, wrapper(self.wrapper).recovers, self.job.rank)

    @property
    def replica_slot(self) -> tuple[int, int]:
        """``(position, size)`` of this rank within its replica: ``(0, 1)`` for DDP; under HSDP its place
        in its shard group and the group's size.  A replica processes a micro-batch as one data-parallel
        unit: under HSDP each of its ranks reads its own slice of it (slice ``position`` of ``size``; the
        shard group's reduce-scatter averages them), never the whole micro-batch on every rank."""
        kind = wrapper(self.wrapper).recovers
        if kind == "world":
            return 0, 1
        ranks = _shrink.replica_ranks(self.job.topology, kind, self.replica)
        return list(ranks).index(self.job.rank), len(ranks)

    def micro_batches(self, step: int) -> tuple[int, ...]:
        """The global micro-batch indices (``0 .. micro_batches - 1``) this rank processes in ``step``:
        its replica's share among the active replicas (:func:`accelpact.model.batches.share`).  Every
        micro-batch of a step is processed exactly once across the active replicas, whatever their
        number; read your data by (step, micro-batch index), never by rank; under HSDP each rank of the
        replica reads its slice of each micro-batch (:attr:`replica_slot`).  The same for every step
        of a generation: ``step`` names the step asked about (a discarded step, rerun after a shrink,
        gets the new share)."""
        from accelpact.model.batches import share

        total = self.total_micro_batches
        if not total:
            raise ApiError("run.micro_batches(step): the job did not opt in: pass micro_batches=M to job.attach")
        del step  # the share depends on the replicas active now, not on the step's number
        return share(self.replica, self.active_replicas, total)

    @property
    def loss_weight(self) -> float:
        """The factor on the sum of this rank's micro-batch losses (:func:`accelpact.model.batches.loss_weight`):
        ``active / micro_batches``, so that the gradient the wrapper averages over the active replicas is
        the mean over the step's ``micro_batches`` micro-batches."""
        from accelpact.model.batches import loss_weight

        total = self.total_micro_batches
        if not total:
            raise ApiError("run.loss_weight: the job did not opt in: pass micro_batches=M to job.attach")
        return loss_weight(self.active_replicas, total)

    def no_sync(self, last: bool) -> Any:
        """Context for one micro-batch's forward and backward: on all but the ``last`` micro-batch of a
        step the gradients accumulate locally (DDP and FSDP1: ``module.no_sync()``; FSDP2:
        ``set_requires_gradient_sync(False)``), and the last one reduces their sum once."""
        module = self.module
        if last:
            if hasattr(module, "set_requires_gradient_sync"):
                module.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
            module.set_requires_gradient_sync(False)
            return contextlib.nullcontext()
        if hasattr(module, "no_sync"):
            return module.no_sync()
        return contextlib.nullcontext()

    def _continue(self, module: Any, optimizer: Any, record: Any) -> None:
        """``Rebuild.then``: the episode released (the engine of generation g retired): the engine of
        g+1 is attached to the model it rebuilt, at F, and the checkpoints move onto the new groups."""
        self.swaps.append(record)
        if self.checkpoints is not None:
            self.checkpoints = self.job._checkpoints(self.checkpoints.root, self.checkpoints.every)
        self._engage(module, optimizer, generation=record.generation + 1, frontier=record.frontier, trace=self.pact.trace)
        self._collect_due = 2

    @property
    def frontier(self) -> int:
        return self.pact.frontier

    @property
    def reports(self) -> list:
        return self.pact.reports


def pact_groups(topo, rank: int, wrapper_name: str, control_group, groups: Mapping[str, Any], records: dict,
                active: Any = None):
    """The engine's :class:`~accelpact.impl.recovery.PactGroups` of this rank: R is its group of the
    wrapper's kind (``Wrapper.recovers``) in ``groups`` (kind -> group); the others' socket records
    are kept (by name) for fault injection.  ``active``: the ranks in training (a shrunk job's; None:
    all): R's members are its active ones."""
    kind = wrapper(wrapper_name).recovers
    members = tuple(m for m in topo.group(kind, rank) if active is None or m in active)
    return PactGroups(control=control_group, affected=groups[kind], members=members,
                      record=records[kind], name=kind, index=topo.group_index(kind, rank),
                      count=len(topo.groups_of_kind(kind)), others={k: v for k, v in records.items() if k != kind})
