"""Durable checkpoints for the L2 path (model: the checkpoint C that ``SupervisorRestart`` resumes from).

A checkpoint of step n lives in ``<root>/step-{n}/``:

* the model and optimizer, saved with DCP (``get_state_dict`` -> ``dcp.save``), sharded as the
  wrapper holds them (FSDP1/FSDP2/DDP alike);
* ``rank{r}.pt`` per rank: the CPU RNG state (``rng``), the CUDA RNG state of the rank's device
  (``cuda_rng``, where CUDA is available; a file without it, or with None, has no CUDA state: older
  checkpoints load as before), the data cursor and the step (these are per-rank and not part of the
  DCP state dict);
* ``COMMITTED``: a JSON marker written by rank 0 *only after every rank acknowledged* (through the
  control-plane store) that its DCP shard and its per-rank file are on disk.  The marker is written
  to a temp file, fsynced and renamed, so it is either absent or complete.  It holds the step, the
  world size, the ``tag`` of the try that committed (the engine's generation) and the time.

Why the marker: a rank killed mid-save leaves a folder that looks like a checkpoint.  Loading it
would resume from a state that no rank ever had.  :func:`latest_committed` ignores every folder
without a valid marker, so a crash mid-save falls back to the previous committed checkpoint.

Ordering requirements: call :meth:`CheckpointManager.save` on every rank at the same step, after
the optimizer step committed (at the boundary), through a *healthy* process group (DCP runs
collectives on it; never through a communicator that failed).  Call :meth:`load` on every rank
after the job is built and before the first training step.

Asynchronous saves (``mode="async"``, ``attach(checkpoint="async")``): :meth:`CheckpointManager.launch`
takes the same checkpoint with ``torch.distributed.checkpoint.async_save``.  At the boundary, on the
caller's thread, it gathers the state dict (FSDP1's collectives included), *stages* it (DCP's
``BlockingAsyncStager`` copies every tensor, DTensor and ShardedTensor into fresh, pageable CPU
memory, and deep-copies any other value, before async_save returns, so the next step may mutate the
parameters and the optimizer state at once) and serializes the per-rank file (RNG and data cursor as
they are at the boundary).  Memory: one CPU copy of this rank's share of the model and optimizer
state, as ``get_state_dict`` returns it (FSDP: its shards; DDP: the whole replica; AdamW: about three
times the parameters' bytes), plus the rank file, held from the launch until the background save
ends, then freed (nothing is cached between saves); at most one save is in flight.  The rest runs
off the training thread: DCP's planning, writes and collectives on async_save's executor thread,
then, on this module's ``accelpact-ckpt-finish`` thread, the per-rank file, the acknowledgement and
(rank 0) the marker, exactly as a synchronous save does them.  Durable means the
same in both modes: the marker, written only after every rank's DCP write completed (its future) and
every rank acknowledged; a save still in flight when a rank dies is not durable, and an L2 restart
resumes from the previous committed checkpoint.

Which group, and when it is waited for.  The background save runs its collectives on the checkpoint
group of the generation it was launched in (``group`` at the launch, held by the save).  Every
episode rebuilds that group (``JobGroups.rebuild_wide`` in a repair, ``rebuild_all`` in a swap or a
discard) and retires the old one, so a save must never be in flight when an episode begins: the
caller waits for it (:meth:`CheckpointManager.finish`) at the next boundary before the engine's
boundary (which may repair), as an episode in a step begins (``Rebuild.begin``) and at the job's end
(``impl/launch/training.py``).  While it runs, ``abandoned()`` is asked once per
:data:`ACK_SLICE_S` (a peer's failed save, a death notice, a peer's withdrawal of this save), and
``interrupt()`` makes a collective blocked on a dead or stopped peer fail at once, as in a synchronous
save.  A failure of the background save is its outcome, never raised on the training thread before
:meth:`~CheckpointManager.finish`: the rank withdraws its acknowledgement (every rank then reads the
same outcome, the acknowledgement protocol's) and :meth:`~CheckpointManager.finish` raises it.

torch is imported inside functions so that ``latest_committed`` works without torch.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar, cast

from ..deadlines import step_wait_bound
from ..threadname import EngineThread
from . import rng as _rng
from .backends import recorded_errors

__all__ = [
    "MODES",
    "Abandon",
    "CheckpointError",
    "CheckpointManager",
    "PendingSave",
    "Restored",
    "SaveFailed",
    "committed_steps",
    "latest_committed",
    "step_dir",
]

T = TypeVar("T")

MARKER = "COMMITTED"
#: how a checkpoint is taken (``attach(checkpoint=...)``): ``sync`` (``dcp.save`` at the boundary) or
#: ``async`` (``dcp.async_save``: staged at the boundary, written in the background; module doc)
MODES = ("sync", "async")
#: One slice of the acknowledgement wait (seconds): how soon ``abandoned()`` is seen, and how many
#: store requests a long wait costs (one ``wait`` and one ``abandoned()`` per slice per rank).
ACK_SLICE_S = 1.0
#: What a rank that gives up the acknowledgement wait adds to the count (``_withdraw``): more than any
#: world, so the count says both how many acknowledged and whether a withdrawal came first.
WITHDRAWN = 1 << 32
_STEP_RE = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Abandon:
    """Why a save is abandoned, as ``abandoned()`` says it (:meth:`CheckpointManager.save`): ``why`` in
    words, ``dead``: the ranks whose death or deposition ended it (none for a peer's failed save)."""

    why: str
    dead: tuple[int, ...] = ()


class SaveFailed(RuntimeError):
    """A save that cannot complete: it met a failed collective (its own, or a peer's: the save was
    abandoned: a group over all of W failed under it, spec/protocol.md P18.4), or a rank of W died or
    was deposed during it (``dead``: those ranks, from the death notices).  Nothing is committed; the
    engine repairs the groups (or swaps the dead ranks) and the caller saves the same step again."""

    def __init__(self, message: str, dead: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.dead = tuple(dead)


def _abandon(why: Any) -> Abandon:
    """What ``abandoned()`` returned, as an :class:`Abandon` (any other truthy value: a peer's save failed)."""
    return why if isinstance(why, Abandon) else Abandon("a peer's save failed")


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved, committed or loaded (the message says which and why)."""


class _SaveGuard:
    """While the save's collectives run (they have no slice to look between): a thread that asks
    ``abandoned()`` once per :data:`ACK_SLICE_S` and, the first time it answers, records the answer
    (:attr:`fired`) and calls ``interrupt()``, so that a collective blocked on a dead or stopped peer
    fails now instead of at its group's timeout.  :meth:`stop` ends the thread (within a slice) and
    returns what fired, if anything."""

    def __init__(self, abandoned: Callable[[], Any], interrupt: Callable[[], Any], slice_s: float = ACK_SLICE_S) -> None:
        self.abandoned, self.interrupt, self.slice_s = abandoned, interrupt, slice_s
        self.fired: Any = None
        self._stop = threading.Event()
        self._thread = EngineThread(target=self._run, name="accelpact-save-guard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> Any:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.slice_s * 10)
        return self.fired

    def _run(self) -> None:
        while not self._stop.wait(self.slice_s):
            try:
                why = self.abandoned()
            except Exception:  # noqa: BLE001 - store lost: the watchdog ends the rank (RankLoseStore)
                continue
            if why:
                self.fired = why
                self.interrupt()
                return


def _guarded(collectives: Callable[[], T], guard: "_SaveGuard | None", step: int, abandoned_in: str, failed_in: str) -> T:
    """Run a save's ``collectives`` under its ``guard`` (started first, stopped after, whatever
    happens): a failure is :class:`SaveFailed`, naming the dead ranks where the guard had fired."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        if guard is not None:
            guard.start()
        return collectives()
    except (RuntimeError, CheckpointException) as exc:  # CheckpointException is a BaseException
        if guard is not None and guard.stop() is not None:
            why = _abandon(guard.fired)
            raise SaveFailed(f"checkpoint step {step}: abandoned in its {abandoned_in}: {why.why} ({exc!r})"[:600],
                             why.dead) from None
        raise SaveFailed(f"checkpoint step {step}: a collective of the {failed_in} failed: {exc!r}"[:600]) from None
    finally:
        if guard is not None:
            guard.stop()


def _is_timeout(exc: BaseException) -> bool:
    """A ``store.wait`` that ran out of time (torch: ``DistStoreError`` "Wait timeout ..." on TCPStore,
    a ``RuntimeError`` "...timeout..." elsewhere), not a lost store."""
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step-{step}"


def _read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "step" in data and "world" in data else None


def committed_steps(root: str | os.PathLike, world: int | None = None) -> list[int]:
    """Steps of every folder under ``root`` that has a valid commit marker (ascending).

    With ``world`` given, checkpoints written by a different world size are ignored too.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        m = _STEP_RE.match(child.name)
        if not m or not child.is_dir():
            continue
        marker = _read_marker(child)
        if marker is None or int(marker["step"]) != int(m.group(1)):
            continue
        if world is not None and int(marker["world"]) != world:
            continue
        steps.append(int(m.group(1)))
    return sorted(steps)


def latest_committed(root: str | os.PathLike, world: int | None = None) -> int | None:
    """The newest committed checkpoint step under ``root``, or None; uncommitted folders are ignored."""
    steps = committed_steps(root, world)
    return steps[-1] if steps else None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or all of it (temp + fsync + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _process_group_errors() -> dict[str, str]:
    """Group name -> recorded error of every process group of this process (c10d's ``pg_map``: the
    default group, the checkpoint group, the user's; :func:`accelpact.impl.runtime.backends.recorded_errors`).
    Gloo groups never have one (their failures raise)."""
    return recorded_errors({})


def _module_device(module) -> Any:
    """The device of ``module``'s first parameter or buffer when it is a CUDA device (whose generator a
    GPU dropout draws from), else None."""
    for t in (*module.parameters(), *module.buffers()):
        dev = getattr(t, "device", None)
        return dev if getattr(dev, "type", "cpu") == "cuda" else None
    return None


def _optim_key_order(optimizer) -> list[list[str]]:
    """Per parameter (in param_groups order), the order of its optimizer-state keys.

    ``set_state_dict`` rebuilds each state dict in its own key order (FSDP1: alphabetical), while
    the optimizer created it lazily ('step', 'exp_avg', ...).  Values are equal either way, but a
    restored state must be the saved state, order included, for snapshot comparisons to hold.
    """
    order = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            order.append(list(optimizer.state.get(p, {}).keys()))
    return order


def _restore_optim_key_order(optimizer, order: list[list[str]] | None) -> None:
    if not order:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(params) != len(order):
        raise CheckpointError(f"checkpoint holds optimizer state for {len(order)} parameters, the optimizer has "
                              f"{len(params)}: the model differs from the one that was saved")
    for p, keys in zip(params, order, strict=True):
        st = optimizer.state.get(p)
        if st is None or set(st) != set(keys):
            continue
        optimizer.state[p] = {k: st[k] for k in keys}


@dataclass(eq=False)
class PendingSave:
    """A save in flight (:meth:`CheckpointManager.launch`): its step, the try's ``tag``, its folder,
    this rank's serialized per-rank file, async_save's future, what it asks (``abandoned``) and does
    (``interrupt``) while it runs, and, once ``done`` is set, its outcome: ``took`` (seconds from the
    launch to the commit) or ``error`` (:class:`SaveFailed` or :class:`CheckpointError`)."""

    step: int
    tag: int
    folder: Path
    rank_file: bytes
    future: Any
    abandoned: Callable[[], Any]
    interrupt: Callable[[], Any] | None
    t0: float
    staged_s: float
    took: float | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    thread: Any = None


@dataclass(frozen=True)
class Restored:
    """What :meth:`CheckpointManager.load` put back: the step C and this rank's data cursor."""

    step: int
    cursor: Any
    path: str


class CheckpointManager:
    """Save every ``every`` steps to ``root/step-{n}`` and commit only when all ranks finished.

    ``store`` is the control-plane store (a c10d Store, already namespaced per attempt); it carries
    the per-step acknowledgements ``ckpt/step-{n}/done``.  ``group`` is the healthy process group
    DCP runs its collectives on (None: the default world group).  ``commit_timeout_s`` bounds every
    rank's wait for the acknowledgements (None: the default collective timeout, 600 s: a wait of a
    fault-free step, :func:`accelpact.impl.deadlines.step_wait_bound`; pass the training groups'
    collective timeout); on expiry nothing is committed and :class:`CheckpointError` is raised (the
    previous committed checkpoint stays the one to resume from).
    """

    def __init__(self, root: str | os.PathLike, *, every: int, rank: int, world: int, store=None, group=None,
                 commit_timeout_s: float | None = None, group_errors: Callable[[], dict[str, str]] | None = None,
                 device: Any = None, mode: str = "sync") -> None:
        if every < 0:
            raise ValueError(f"CheckpointManager: every must be >= 0 (0 disables checkpoints), got {every}")
        if mode not in MODES:
            raise ValueError(f"CheckpointManager: mode={mode!r}: must be one of {list(MODES)}")
        if world > 1 and store is None:
            raise ValueError("CheckpointManager: a store is needed to acknowledge saves when world > 1")
        self.root = Path(root)
        self.every = every
        self.rank = rank
        self.world = world
        self.store = store
        self.group = group
        self.commit_timeout_s = step_wait_bound(commit_timeout_s)
        #: what each save asks once its collectives returned (group name -> recorded error): every process
        #: group of the process (:func:`accelpact.impl.runtime.backends.recorded_errors` over c10d's groups);
        #: injectable for tests
        self.group_errors = group_errors if group_errors is not None else _process_group_errors
        #: the rank's device, whose CUDA RNG state the rank file keeps (None: the module's, else the current one)
        self.device = device
        #: ``sync`` (:meth:`save`) or ``async`` (:meth:`launch` then :meth:`finish`): which one the
        #: training loop takes at a due boundary (the manager itself serves both)
        self.mode = mode
        #: the save in flight (:meth:`launch`), until :meth:`finish` read its outcome
        self.pending: PendingSave | None = None
        self.timings: list[dict] = []

    def due(self, step: int) -> bool:
        """True when ``step`` (a committed frontier) should be checkpointed."""
        return self.every > 0 and step > 0 and step % self.every == 0

    # ------------------------------------------------------------------ save
    def save(self, step: int, module, optimizer, cursor: Any = None, *, tag: int = 0,
             abandoned: Callable[[], Any] | None = None, interrupt: Callable[[], Any] | None = None) -> float:
        """Save step ``step`` on this rank, acknowledge it, wait until every rank acknowledged (or the
        save was abandoned), and (rank 0) commit it.  Returns seconds taken.

        ``tag``: which try of this step (the engine's generation: a save abandoned in generation g is
        taken again in g+1, and counts its acknowledgements apart).  ``abandoned()``: falsy while the
        save may go on; else why it cannot (an :class:`Abandon`; any other truthy value reads as a
        peer's failed save): a peer's save failed (the engine's wide revoke, P18.4), or a rank of W died
        or was deposed (a keeper's death notice).  It is polled once per :data:`ACK_SLICE_S`, by a guard
        thread while the save's collectives run and by the acknowledgement wait after them; once it
        answers, ``interrupt()`` (given: shut down the sockets of the groups the save runs on) makes a
        collective blocked on the dead or stopped peer fail at once.  A failed collective of the save,
        or an abandoned save, raises :class:`SaveFailed` (with the dead ranks, if any)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        t0 = time.perf_counter()
        folder = step_dir(self.root, step)
        folder.mkdir(parents=True, exist_ok=True)
        guard = _SaveGuard(abandoned, interrupt) if self.world > 1 and abandoned is not None and interrupt is not None \
            else None
        def collectives() -> None:
            # FSDP1's optim_state_dict runs collectives of its own (broadcast_object_list on the default
            # group): a failure there is the save's failure too (see bench/README.md, K1)
            model_sd, optim_sd = get_state_dict(module, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder), process_group=self.group)

        _guarded(collectives, guard, step, "collectives", "save")
        # NCCL in TORCH_NCCL_ASYNC_ERROR_HANDLING=2 aborts a failed collective's communicator from its
        # watchdog and raises nothing: DCP's and FSDP1's collectives (the default group, the checkpoint
        # group) may have "returned" garbage.  Every process group's recorded error is read before the
        # save is written (spec/nccl.md row 25); one found is a failed collective of the save
        if bad := self.group_errors():
            raise SaveFailed(f"checkpoint step {step}: a collective of the save failed silently: process group(s) "
                             f"{bad} recorded an error (NCCL's watchdog aborted them without raising); nothing of "
                             f"this save is committed"[:600])
        # the guard may have interrupted the groups just as the collectives completed: the save goes on,
        # and the acknowledgements decide (one outcome on every rank, _acknowledge_and_commit)
        t_dcp = time.perf_counter()
        _atomic_write(folder / f"rank{self.rank}.pt", self._rank_file(step, module, optimizer, cursor))
        self._acknowledge_and_commit(step, folder, tag, abandoned)
        t1 = time.perf_counter()
        self.timings.append({"step": step, "mode": "sync", "dcp_s": t_dcp - t0, "total_s": t1 - t0})
        return t1 - t0

    def _rank_file(self, step: int, module, optimizer, cursor: Any) -> bytes:
        """This rank's ``rank{r}.pt`` as bytes: step, rank, world, the RNG states (CPU, and CUDA of the
        rank's device), the data cursor and the optimizer's key order, as they are now."""
        import torch

        rng = _rng.capture(self.device if self.device is not None else _module_device(module))
        local = {"step": step, "rank": self.rank, "world": self.world, "rng": rng["cpu"], "cuda_rng": rng["cuda"],
                 "cursor": cursor, "optim_key_order": _optim_key_order(optimizer)}
        buf = io.BytesIO()
        torch.save(local, buf)
        return buf.getvalue()

    # ------------------------------------------------------------------ async save
    def launch(self, step: int, module, optimizer, cursor: Any = None, *, tag: int = 0,
               abandoned: Callable[[], Any] | None = None, interrupt: Callable[[], Any] | None = None,
               stage_interrupt: Callable[[], Any] | None = None) -> float:
        """Start the save of step ``step`` with ``dcp.async_save`` and return once it is staged (seconds
        taken; the module doc says what runs where and what the staging copy costs).  Collective at the
        boundary like :meth:`save` (FSDP1's state-dict gathers run here, on the caller's thread); the
        rest runs in the background until :meth:`finish` reads its outcome, which every rank must call
        before any episode rebuilds the groups and before the next launch.

        ``tag``, ``abandoned()`` and ``interrupt()`` as for :meth:`save`; while the background save
        runs, ``abandoned()`` also answers when a peer withdrew this save (its background save failed),
        and the first answer calls ``interrupt()`` (give one that shuts down only the group the save
        runs on: the training thread is using the others).  While the state dict is gathered here (FSDP1's
        collectives, on the default group) a guard asks ``abandoned()`` as :meth:`save`'s does and calls
        ``stage_interrupt()`` (the groups over W, as :meth:`save`'s ``interrupt``).  A failure here, before
        anything runs in the background, raises :class:`SaveFailed` at once, as :meth:`save` does; a
        failure in the background is the save's outcome (:meth:`finish`)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import BlockingAsyncStager
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self.pending is not None:
            raise CheckpointError(f"checkpoint step {step}: the save of step {self.pending.step} is still in flight; "
                                  "finish() it first (one save in flight at a time)")
        t0 = time.perf_counter()
        folder = step_dir(self.root, step)
        folder.mkdir(parents=True, exist_ok=True)
        guard = _SaveGuard(abandoned, stage_interrupt) \
            if self.world > 1 and abandoned is not None and stage_interrupt is not None else None
        model_sd, optim_sd = _guarded(lambda: get_state_dict(module, optimizer), guard, step,
                                      "state-dict gather", "state-dict gather")
        if bad := self.group_errors():  # as in save(): NCCL's watchdog may have aborted FSDP1's gathers silently
            raise SaveFailed(f"checkpoint step {step}: a collective of the state-dict gather failed silently: process "
                             f"group(s) {bad} recorded an error; nothing of this save is committed"[:600])
        rank_file = self._rank_file(step, module, optimizer, cursor)
        # staged synchronously (a copy to CPU) before async_save returns: from here the training may change
        # the parameters and the optimizer state.  BlockingAsyncStager, not async_save's default stager:
        # it copies FSDP1's ShardedTensors too (the default one asks a ShardedTensor for its data_ptr)
        future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder),
                                process_group=self.group, async_stager=BlockingAsyncStager())
        del model_sd, optim_sd
        t_staged = time.perf_counter()
        p = PendingSave(step=step, tag=tag, folder=folder, rank_file=rank_file, future=future,
                        abandoned=self._watch(step, tag, abandoned), interrupt=interrupt, t0=t0, staged_s=t_staged - t0)
        p.thread = EngineThread(target=self._finish_in_background, args=(p,), name="accelpact-ckpt-finish", daemon=True)
        self.pending = p
        p.thread.start()
        return p.staged_s

    def finish(self) -> float | None:
        """Wait for the save in flight (:meth:`launch`) to end, on every rank at the same point; None when
        none is.  Returns its seconds from the launch to the commit (it is durable: every rank
        acknowledged, rank 0 wrote the marker), or raises its failure: :class:`SaveFailed` (a collective
        of the save failed, or the save was abandoned: a peer's failed save, a death, a peer's
        withdrawal) or :class:`CheckpointError` (the acknowledgements' bound passed).  Every rank reads
        the same outcome.  The wait is bounded by the save's own bounds: its collectives by the
        checkpoint group's timeout (sooner through ``interrupt()``), its acknowledgements by
        ``commit_timeout_s``."""
        p = self.pending
        if p is None:
            return None
        p.done.wait()
        p.thread.join()
        self.pending = None
        if p.error is not None:
            raise p.error
        assert p.took is not None
        self.timings.append({"step": p.step, "mode": "async", "stage_s": p.staged_s, "total_s": p.took})
        return p.took

    def _watch(self, step: int, tag: int, abandoned: Callable[[], Any] | None) -> Callable[[], Any]:
        """What a background save asks: ``abandoned()`` (the caller's), else whether a peer withdrew
        this try (its ``gone`` key: its own background save failed, :meth:`_give_up`)."""
        gone = self._keys(step, tag)[2]

        def watched() -> Any:
            why = abandoned() if abandoned is not None else None
            if why:
                return why
            if self.world > 1 and self.store.check([gone]):
                return Abandon(f"a peer withdrew the save of step {step} (its save failed)")
            return None

        return watched

    def _finish_in_background(self, p: PendingSave) -> None:
        """The background save's second half (module doc): DCP's outcome, then the per-rank file, the
        acknowledgement and the commit; its outcome on ``p``."""
        try:
            p.took = self._complete(p)
        except BaseException as exc:  # noqa: BLE001 - any failure (DCP's CheckpointException is a BaseException) is the save's outcome, raised by finish()
            p.error = exc if isinstance(exc, (SaveFailed, CheckpointError)) else \
                SaveFailed(f"checkpoint step {p.step}: the background save failed: {exc!r}"[:600])
        finally:
            p.done.set()

    def _complete(self, p: PendingSave) -> float:
        """Wait for async_save's future (asking ``abandoned()`` once per slice: the first answer calls
        ``interrupt()``), then as :meth:`save` after its DCP write.  A failure withdraws this rank from
        the try first (:meth:`_give_up`), so that no peer waits for its acknowledgement."""
        fired: Any = None
        while not concurrent.futures.wait([p.future], timeout=ACK_SLICE_S).done:
            if fired is not None or p.interrupt is None or self.world == 1:
                continue
            try:
                why = p.abandoned()
            except Exception:  # noqa: BLE001 - store lost: the watchdog ends the rank (RankLoseStore)
                continue
            if why:
                fired = why
                p.interrupt()
        try:
            p.future.result()
        except BaseException as exc:  # noqa: BLE001 - CheckpointException is a BaseException: every failure of DCP's save
            self._give_up(p)
            if fired is not None:
                why = _abandon(fired)
                raise SaveFailed(f"checkpoint step {p.step}: abandoned in its collectives: {why.why} ({exc!r})"[:600],
                                 why.dead) from None
            raise SaveFailed(f"checkpoint step {p.step}: a collective of the background save failed: {exc!r}"[:600]) from None
        if bad := self.group_errors():
            self._give_up(p)
            raise SaveFailed(f"checkpoint step {p.step}: a collective of the save failed silently: process group(s) "
                             f"{bad} recorded an error; nothing of this save is committed"[:600])
        _atomic_write(p.folder / f"rank{self.rank}.pt", p.rank_file)
        self._acknowledge_and_commit(p.step, p.folder, p.tag, p.abandoned)
        return time.perf_counter() - p.t0

    def _give_up(self, p: PendingSave) -> None:
        """A rank whose background save failed before its acknowledgement withdraws the try (adds
        :data:`WITHDRAWN`; its own acknowledgement is missing, so the try is withdrawn on every rank and
        ``gone`` is set): a peer waiting for the acknowledgements, or blocked in a collective with this
        rank, sees it within a slice (:meth:`_watch`)."""
        if self.world == 1:
            return
        key, everyone, gone = self._keys(p.step, p.tag)
        try:
            self._withdraw(key, everyone, gone, time.monotonic())
        except Exception:  # noqa: BLE001 - store lost: the watchdog ends the rank (RankLoseStore)
            pass

    @staticmethod
    def _keys(step: int, tag: int) -> tuple[str, str, str]:
        """The acknowledgement count of one try, its "every rank acknowledged" key and its "withdrawn" key."""
        return f"ckpt/step-{step}/g{tag}/done", f"ckpt/step-{step}/g{tag}/all", f"ckpt/step-{step}/g{tag}/gone"

    def owe(self, generation: int, step: int) -> None:
        """Say on the store that the checkpoint of ``step`` is owed after the episode of ``generation``
        (a save that was lost, or one being taken again, when that episode began): a spare that takes a
        rank's identity in it reads it (:meth:`owed`) and takes that save with the survivors."""
        if self.store is not None:
            self.store.set(f"ckpt/owed/g{generation}", str(step))

    def owed(self, generation: int) -> int | None:
        """The step whose checkpoint is owed after the episode of ``generation`` (:meth:`owe`), or None."""
        key = f"ckpt/owed/g{generation}"
        if self.store is None or not self.store.check([key]):
            return None
        return int(self.store.get(key).decode())

    def _acknowledge_and_commit(self, step: int, folder: Path, tag: int = 0, abandoned: Any = None) -> None:
        """Every rank adds 1 to ``ckpt/step-{n}/g{tag}/done`` and waits until every rank did (every
        rank finished the same save: one that met a failed collective makes the others' saves
        abandoned, :class:`SaveFailed`, so all of W repair and save again together); rank 0 then writes
        the marker.

        ``add`` is a round trip (unlike ``set``), so a returned count proves the store recorded it.

        Store traffic is O(1) per rank, whatever the world (at 1,024 ranks a poll of the count every
        5 ms was ~205k requests/s against one TCPStore): the rank whose ``add`` returns ``world`` (the
        last acknowledger) sets ``.../all``; every other rank blocks in ``store.wait`` on that key, in
        slices of :data:`ACK_SLICE_S`, so one acknowledgement costs one ``add`` and, while the wait
        lasts, one ``wait`` and one ``abandoned()`` call per slice.

        One outcome on every rank.  A rank that gives the wait up (abandoned, or past the bound)
        withdraws the save by adding :data:`WITHDRAWN` to the same count (:meth:`_withdraw`): the save
        stands if and only if the last acknowledgement came before the first withdrawal, which both the
        last acknowledger's ``add`` and every withdrawer's ``add`` read from the count.  A withdrawn
        save is withdrawn on every rank (a later last acknowledger finds the count past ``world``,
        sets ``.../gone`` and fails too); a save every rank acknowledged stands on every rank, also on
        one whose own wait gave up a moment too late (a rank that died just after its acknowledgement).

        Bounds.  A slow peer is waited for: the save of a fault-free step is bounded by
        ``commit_timeout_s`` (default: the training groups' collective timeout,
        :func:`accelpact.impl.deadlines.step_wait_bound`, never the recovery's phase deadline), past
        which :class:`CheckpointError` is raised and nothing is committed.  A failed peer ends the wait
        within a slice through ``abandoned()``: the engine passes "the wide revoke of this generation
        stands" (a rank whose save met a failed collective published it) and, with spares, "a keeper
        posted a death notice" (a crash, or a stopped or hung rank that the failure detector declared
        and its keeper deposed): :class:`SaveFailed`, naming the dead ranks.  Without spares a peer
        the failure detector declares dead or hung ends this process itself (the watchdog exits every
        survivor, ``RankSuspect``), so the wait ends with it."""
        if self.world > 1:
            key, everyone, gone = self._keys(step, tag)
            count = int(self.store.add(key, 1))
            if count == self.world:
                self.store.set(everyone, str(count))
            elif count > self.world:  # a peer withdrew the save before this acknowledgement
                acks = count % WITHDRAWN
                if acks == self.world:  # the last acknowledgement: the peers still deciding read it here
                    self.store.set(gone, "1")
                why = _abandon(abandoned() if abandoned is not None else None)
                raise SaveFailed(f"checkpoint step {step}: abandoned at {acks}/{self.world} acknowledgements: a peer "
                                 f"withdrew it ({why.why})", why.dead)
            else:
                self._await_everyone(step, key, everyone, gone, abandoned)
        if self.rank != 0:
            return
        missing = [r for r in range(self.world) if not (folder / f"rank{r}.pt").exists()]
        if missing:
            raise CheckpointError(f"checkpoint step {step}: ranks {missing} acknowledged but their rank files are missing in {folder}")
        marker = {"step": step, "world": self.world, "tag": tag, "time": time.time()}
        _atomic_write(folder / MARKER, json.dumps(marker).encode())

    def _await_everyone(self, step: int, key: str, everyone: str, gone: str, abandoned: Any) -> None:
        """Block until ``everyone`` is set (the last acknowledger's), in slices: each slice one
        ``store.wait``; between slices ``abandoned()`` and the bound, either of which withdraws the save
        (see :meth:`_acknowledge_and_commit`)."""
        import datetime

        deadline = time.monotonic() + self.commit_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left > 0:
                try:
                    self.store.wait([everyone], datetime.timedelta(seconds=min(ACK_SLICE_S, left)))
                    return
                except Exception as exc:  # noqa: BLE001 - a wait's timeout (DistStoreError/RuntimeError); a lost store is re-raised below
                    if not _is_timeout(exc):
                        raise
            why = abandoned() if abandoned is not None else None
            if not why and time.monotonic() < deadline:
                continue
            acks = self._withdraw(key, everyone, gone, deadline)
            if acks is None:  # every rank acknowledged before the first withdrawal: the save stands
                return
            if why:
                reason = _abandon(why)
                raise SaveFailed(f"checkpoint step {step}: abandoned at {acks}/{self.world} acknowledgements: {reason.why}",
                                 reason.dead)
            raise CheckpointError(
                f"checkpoint step {step}: only {acks}/{self.world} ranks acknowledged within "
                f"{self.commit_timeout_s}s; not committing it (resume uses the previous committed checkpoint)")

    def _withdraw(self, key: str, everyone: str, gone: str, deadline: float) -> int | None:
        """Withdraw the save (add :data:`WITHDRAWN` to the count): the acknowledgements counted before
        it, or None when the save stands (every rank acknowledged before the first withdrawal).  Read
        from this ``add``: fewer than ``world`` acknowledgements: withdrawn (this rank sets ``gone`` for
        the peers that withdraw after the last acknowledgement); all of them and this the first
        withdrawal: the save stands; all of them after an earlier withdrawal: the last acknowledger's
        key says which came first (``everyone`` or ``gone``), awaited until ``deadline``."""
        withdrawals, acks = divmod(int(self.store.add(key, WITHDRAWN)), WITHDRAWN)
        if acks < self.world:
            self.store.set(gone, "1")
            return acks
        if withdrawals == 1:
            return None
        while True:
            if self.store.check([everyone]):
                return None
            if self.store.check([gone]) or time.monotonic() >= deadline:
                return acks
            time.sleep(0.01)

    # ------------------------------------------------------------------ load
    def load(self, step: int, module, optimizer) -> Restored:
        """Load committed checkpoint ``step`` into ``module``/``optimizer`` and restore this rank's RNG.

        Refuses an uncommitted folder: the marker is the only proof that every rank finished it.
        """
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        folder = step_dir(self.root, step)
        marker = _read_marker(folder)
        if marker is None:
            raise CheckpointError(f"{folder} has no valid {MARKER} marker: it was never committed by all ranks; "
                                  f"resume from latest_committed({str(self.root)!r}) instead")
        if int(marker["world"]) != self.world:
            raise CheckpointError(f"{folder} was written by world size {marker['world']}, this job has {self.world}; "
                                  "relaunch with the same topology")
        model_sd, optim_sd = get_state_dict(module, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(folder), process_group=self.group)
        set_state_dict(module, optimizer, model_state_dict=cast(Any, state["model"]), optim_state_dict=cast(Any, state["optim"]))
        local = torch.load(folder / f"rank{self.rank}.pt", weights_only=False)
        if local["step"] != step or local["rank"] != self.rank:
            raise CheckpointError(f"{folder}/rank{self.rank}.pt holds step {local['step']} rank {local['rank']}, "
                                  f"expected step {step} rank {self.rank}")
        # a file without "cuda_rng" (saved before it was kept) or with None (no CUDA where it was saved):
        # the CPU state only
        _rng.restore({"cpu": local["rng"], "cuda": local.get("cuda_rng")},
                     self.device if self.device is not None else _module_device(module))
        _restore_optim_key_order(optimizer, local.get("optim_key_order"))
        return Restored(step=step, cursor=local["cursor"], path=str(folder))
