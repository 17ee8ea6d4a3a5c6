"""The step loop around the attached engine: :class:`Training`, what ``Session.attach`` returns.

``with run.step(step):`` wraps forward, backward and ``optimizer.step()``; ``run.boundary(loss)``
closes the step at the committed boundary (the engine's repair, then the checkpoint when due).  An
episode that rebuilds the model (a hot swap, a discard in place) is the engine's: it asks this loop
for the state published at F as it begins (:meth:`Training._begin`) and hands it the rebuilt model
when it released (:meth:`Training._continue`), and the step it discarded comes again.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey

from ..controlplane import PREFIX, WIDE_ENTRY, ControlPlane, progress_key
from ..episode import Rebuild
from ..recovery import PactGroups, attach
from ..runtime import hotswap
from ..runtime.checkpoint import CheckpointError, SaveFailed
from ..runtime.retire import collect_off_path
from ..runtime.wrappers import wrapper, wrapper_of
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
    _notices: Any = None
    _watcher: Any = None
    _published: Any = None
    #: the step :meth:`step` opened that no :meth:`boundary` has closed yet (None: none open)
    _open: int | None = None
    #: an episode rebuilt the model: the boundaries until the retired generation's cycles are collected
    #: (:func:`accelpact.impl.runtime.retire.collect_off_path`; at the second: at the first, some of the old
    #: generation's groups are still reachable, tests/test_episode_leaks.py)
    _collect_due: int = 0

    # ---- the engine --------------------------------------------------------------------------
    def _engage(self, model: Any, optimizer: Any, *, generation: int, frontier: int, trace: Any) -> None:
        """Attach an engine of ``generation`` to ``model``/``optimizer`` at ``frontier`` (at attach,
        and after a hot swap or a discard, on the model it rebuilt)."""
        job, s = self.job, self.job.settings
        wrap = wrapper_of(model)
        self.wrapper = wrap.name
        pg = pact_groups(job.topology, job.rank, wrap.name, job.groups.control, job.groups.training, job.groups.records)
        control = ControlPlane(job.attempt_store, job.rank, job.world, prefix=PREFIX)
        platform, envelope = job.contract
        key = ObservationKey(platform, wrap.name, "boundary", DEFAULT_OBJECTIVE)
        if job.spares and self._notices is None:
            self._notices = hotswap.Notices(job.attempt_store)
            self._notices.handled(self._notices.count())
        rebuild = Rebuild(job, self.rebuild, begin=self._begin, then=self._continue) if self.rebuild is not None else None
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
        optimizer.register_step_post_hook(_progress_hook(job.store, progress_key(job.attempt, job.rank),
                                                         self.pact))
        # from here the engine owns R: keeping the generation-0 communicator here would keep it alive
        # (threads, sockets) after a repair retires it; job.replicate_group asks the engine
        job.groups.training.pop(pg.name, None)
        if job.spares:
            self._publish()
        elif self.rebuild is not None:
            self._keep_for_discard()
        if job.spares:
            pact = self.pact
            self._watcher = hotswap.SwapWatcher(
                job.attempt_store, lambda: [*{id(r): r for r in pact.group_records().values()}.values(), job.groups.control_record],
                seen=self._notices.seen).start()

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
        while self.pact.frontier < total:
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

    def boundary(self, loss: Any = None):
        """After the commit: the engine's boundary (a repair, if any, happens here and its
        :class:`~accelpact.impl.recovery.RecoveryReport` is returned), then the checkpoint when due.
        After a discarded step: nothing (None)."""
        self._open = None
        if self.discarded:
            return None
        if self._collect_due:  # the second commit after a rebuild: the old generation is unreachable by then
            self._collect_due -= 1
            if not self._collect_due:
                collect_off_path()
        if self.job.spares:
            self._publish()
        elif self.rebuild is not None:
            self._keep_for_discard()
        report = self.pact.boundary(loss)  # None after a hot swap here (a death noticed at the boundary)
        frontier = self.pact.frontier
        if self.checkpoints is not None and self.checkpoints.due(frontier):
            cursor = self.extra_state() if self.extra_state is not None else None
            report = self._save(frontier, cursor) or report
        return report

    def _save(self, frontier: int, cursor: Any):
        """The checkpoint of ``frontier``; a save that meets a failed group over all of W is the
        engine's observation at the boundary (spec/protocol.md P18.4): every rank repairs (the
        checkpoint group is rebuilt with the other groups over W) and saves again.  Returns the
        repair's report, if there was one (a rank that died in the save is swapped instead)."""
        report = None
        for _try in range(SAVE_TRIES):
            pact = self.pact
            try:
                took = self.checkpoints.save(frontier, pact.module, pact.optimizer, cursor=cursor, tag=pact.gen,
                                             abandoned=lambda p=pact: p.control.revoked(p.gen, WIDE_ENTRY))
            except SaveFailed as exc:
                failed = exc
                report = pact.repair_after_save(exc) or report
                continue
            self.saved.append((frontier, took))
            return report
        raise CheckpointError(f"checkpoint of step {frontier}: every one of {SAVE_TRIES} saves failed, each repaired in "
                              f"place; the last: {failed}") from failed

    # ---- an episode that rebuilds the model -----------------------------------------------------
    def _publish(self) -> None:
        """What a spare taking this identity needs at F (RNG, extra state); kept locally for the discard."""
        extra = copy.deepcopy(self.extra_state()) if self.extra_state is not None else None
        self._published = hotswap.publish_state(self.job.attempt_store, self.job.rank, self.pact.frontier, extra)

    def _keep_for_discard(self) -> None:
        """Without spares, what a discard in place needs at F (P17), kept locally: the RNG state and a
        copy of the extra state (the data cursor), taken at each committed boundary."""
        extra = copy.deepcopy(self.extra_state()) if self.extra_state is not None else None
        self._published = {"rng": torch.get_rng_state(), "extra": extra, "frontier": self.pact.frontier}

    def _begin(self) -> dict:
        """``Rebuild.begin``: as the engine's episode begins, the death-notice watcher of the old
        generation stops, and the state published at F is handed over (``extra``, ``rng``)."""
        if self._watcher is not None:
            self._watcher.stop(join=False)
        published = self._published or {}
        return {"extra": copy.deepcopy(published.get("extra")), "rng": published.get("rng")}

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


def pact_groups(topo, rank: int, wrapper_name: str, control_group, groups: Mapping[str, Any], records: dict):
    """The engine's :class:`~accelpact.impl.recovery.PactGroups` of this rank: R is its group of the
    wrapper's kind (``Wrapper.recovers``) in ``groups`` (kind -> group); the others' socket records
    are kept (by name) for fault injection."""
    kind = wrapper(wrapper_name).recovers
    return PactGroups(control=control_group, affected=groups[kind], members=topo.group(kind, rank),
                      record=records[kind], name=kind, index=topo.group_index(kind, rank),
                      count=len(topo.groups_of_kind(kind)), others={k: v for k, v in records.items() if k != kind})
