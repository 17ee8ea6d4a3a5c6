"""The recovery engine: ``attach`` -> ``Pact``; ``Pact.step()`` and ``Pact.boundary()``.

This module reads like ``model/protocol.py``: one method per model action, in the same
order, each writing one trace record named as the model names it, with the post-state in
model vocabulary (``pc``, ``gen``, ``frontier``, ``tau``, ``point``, ``comm``,
``refs_stale``, ``reason``).

Ordering requirements (the step loop, spec/implementation.md):

* ``with pact.step(step):`` wraps forward, backward and ``optimizer.step()``; an exception
  inside it is an in-flight failure: RankObserve, RankReject (the contract says L2) and a
  job-wide abort, so every rank exits 70 (the others through their watchdog).
* ``pact.boundary(loss)`` is called after the optimizer step committed and the grads were
  cleared, before the next forward.  It runs the post-commit collective on R, then the
  failure-flag all-reduce on the control group (all of W), and on a non-zero flag the six
  phases.  Every rank of W enters recovery together.
* Any exception or expired deadline in phases 2-6 writes the abort (the phase's decision
  key and the job key) and exits at once with the reason's code (RankFail / RankTimeout).

The failure flag has one element per group of R's kind (``PactGroups.count``; one for DDP),
so that every rank learns *which* replicate group failed: its members rebuild it,
everybody else only votes.

Test-only hooks (:mod:`accelpact.impl.hooks`, passed at attach, never read from the environment)
run at the named points between actions (fault injection); a seeded bug (:mod:`accelpact.testing.seeded`)
replaces engine methods on the instance at attach, and nothing here branches on one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import queue
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from accelpact.model.contract import (DEFAULT_OBJECTIVE, DEFAULT_PLATFORM, DEFAULT_PROFILE, DISCARD_PHASES, ObservationKey,
                                      decide, default_envelope, unqualified_notice, without_discard)
from accelpact.model.state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    PC_AGREED,
    PC_ARRIVED,
    PC_EXITED,
    PC_GUARDED,
    PC_JOINED,
    PC_OBSERVED,
    PC_READY,
    PC_REBOUND,
    PC_REPLACED,
    PC_TRAIN,
    PC_VALIDATED,
    REASON_DEADLINE,
    REASON_EXCEPTION,
    REASON_MISMATCH,
    REASON_REJECTED,
)

from . import revoke as _revoke
from .runtime.adapters import adapter_for
from .runtime.backends import backend_of, is_comm_failure, wait_bounded
from .controlplane import ControlPlane, swap_prefix, swap_rebuilt_key
from .detector import Detector
from .exitcodes import claim_exit, code_for, exit_now, holding_exit
from .guard import BoundaryGuard
from .hooks import NO_HOOKS, Hooks
from .runtime import hotswap as _swap
from .deadlines import DEFAULT_DEADLINE_S, default_step_deadline
from .runtime.replace import ReplacementStrategy, choose_strategy
from .trace import NullTrace
from .watchdog import Watchdog
from .threadname import EngineThread

__all__ = ["attach", "Pact", "PactGroups", "RecoveryReport", "RebindError", "SpareEngine", "ValidationError"]


class RebindError(RuntimeError):
    """Phase 5: references to the old communicator remain after rebinding."""


class ValidationError(RuntimeError):
    """Phase 6: the validation collective or the replica digests disagree."""


class RevokedWhilePending(RuntimeError):
    """An op on R was still pending ``REVOKE_GRACE_S`` after R was revoked: the op is abandoned
    and the failure observed (phase 1), as if the op had raised."""


#: Grace between R's revoke (its sockets shut down by the watchdog) and giving up on an op on R
#: that is still pending.  Normally the op fails within milliseconds of the shutdown; but a gloo op
#: on sockets that were cut while no op was pending (the fault's own rank) may stay blocked, in
#: 5-8 repairs of 100 for 50 ms or more (measured: ``accelpact bench repair``, 2x2, an unloaded
#: machine), some until the group's timeout (5 of 16 runs of ``test_ten_repairs_no_leak`` had one),
#: and the repair then waits this grace out.  R is revoked (it failed, and is being replaced), so
#: nothing is lost by abandoning its op early: the slowest of 100 repairs took 1,089 ms at 1.0 s,
#: 216 ms at 0.2 s, 113 ms at 0.05 s and 59 ms at 0.02 s.  The grace counts from when the revoke
#: took effect here (the watcher's shutdown).  An abandoned op goes to a reaper thread that holds its group until the op ends;
#: :meth:`Pact.wait_retired` waits for the reapers too (graces under 0.2 s once showed as +4 fds in
#: ``test_ten_repairs_no_leak`` under load, when it did not: the reaper had not let go yet).
REVOKE_GRACE_S = 0.02
#: How often a pending op on R looks for R's revoke (the watcher's record, else the store key): the
#: first look after one interval, so a healthy op (about 1 ms) makes no store round trip.
REVOKE_CHECK_S = 0.02

#: With spares: how long the failure detector's suspicion of a peer waits for the keeper's death
#: notice (after asking it to depose the peer: a stopped process is killed first) before it ends the job.
NOTICE_WAIT_S = 3.0


def _reap(box: list, done: threading.Event) -> None:
    """Hold an abandoned op's group until the op ends (its own timeout at the latest): dropping
    the last reference to a gloo group joins its worker threads, which would block the caller.
    ``box`` = [work, group], emptied here (a thread's ``args`` tuple would hold them until the thread
    ends, after ``done``); ``done`` is set once the op ended and the references went
    (:meth:`Pact.wait_retired`)."""
    try:
        box[0].wait()
    except Exception:  # noqa: BLE001 - the op failed, as expected of an abandoned op
        pass
    finally:
        _drop(box, done)


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


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """One repair.  Durations in ns; measured, never asserted."""

    generation: int            # the generation that was repaired (the pact now runs in generation + 1)
    member: bool               # this rank rebuilt R
    observe_ns: int            # boundary collective start -> failure observed (phase 1)
    agree_ns: int              # guard + contract + frontier agreement (phases 2-3)
    rebuild_ns: int            # phase 4
    rebind_ns: int             # phase 5
    validate_ns: int           # phase 6 validation
    release_ns: int            # release vote -> resume
    retire_ns: int             # dropping the old communicator
    total_ns: int              # observed -> resumed
    refs_rebound: int
    revoke_to_observe_ns: int  # this rank's revoke hard-close -> observed (-1: observed directly, before the revoke)


class _Exited(BaseException):
    """Never escapes: exit paths end the process."""


def _group_name(pg) -> str:
    """A process group's c10d name."""
    return str(pg.group_name)


#: Issue 26: how much sooner than R's NCCL collective timeout a wait on R gives up: more than two
#: of NCCL's watchdog polls (``kWatchdogThreadSleepMillis``, 100 ms), so the engine's own timeout
#: raises before the watchdog can abort the communicator and leave the work completing normally.
NCCL_WATCHDOG_MARGIN_S = 0.25


def _state_checksum(module, optimizer, device):
    """Phase 6's replica check of this rank's state, on ``device`` (:func:`digest.state_checksum`)."""
    from .runtime.digest import state_checksum

    return state_checksum(module, optimizer, device)


@dataclass(slots=True)
class _Episode:
    """One recovery episode of this rank (generation ``g``): what the phase actions pass on."""

    g: int
    member: bool                      # this rank is in a failed group: it rebuilds R
    failed: tuple[int, ...]           # indices of the failed groups of R's kind
    t_boundary: int                   # boundary collective start (ns)
    t_observed: int                   # failure observed (ns)
    error: BaseException | None
    revoke_to_observe_ns: int = -1
    frontier: int = 0
    last_arriver: bool = False
    last_ready: bool = False
    #: R's generation-(g+1) communicator between phases 4 and the resume.  The old one is never
    #: kept here: the episode is reachable from the module (guard hooks -> pact), and phase 5's
    #: check would find it as a stale reference.
    new_pg: Any = None
    refs_rebound: int = 0
    durations: dict[str, int] = field(default_factory=dict)
    #: a hot swap's facts (None: the classic repair)
    swap: "_Swap | None" = None


@dataclass(slots=True)
class _Swap:
    """What a hot swap's actions pass on along its episode (``_Episode.swap``).  ``job``: the
    :class:`~accelpact.impl.launch.api.TrainingJob` whose groups the swap rebuilds; ``rebuild``: the
    user's factory ``(job, extra) -> (module, optimizer)``; ``extra``/``rng``: the state published
    at F; ``old``: a survivor's committed module and optimizer (moved into the rebuilt ones, then
    dropped); ``held``: a survivor's old R (the engine holds it, not the job)."""

    role: str                         # "survivor" or "spare"
    point: str                        # where the death struck
    dead: tuple[int, ...]
    job: Any
    rebuild: Callable[[Any, Any], tuple[Any, Any]]
    extra: Any
    rng: Any
    old: tuple[Any, Any] | None = None
    held: tuple = ()
    decision: str = ""
    claims: dict[int, int] = field(default_factory=dict)
    module: Any = None
    optimizer: Any = None
    kind: str = ""
    sources: dict[int, int] = field(default_factory=dict)


_RETIRE_QUEUE: "queue.SimpleQueue[tuple[list | None, threading.Event]]" = queue.SimpleQueue()
_RETIRE_LOCK = threading.Lock()
_RETIRER: threading.Thread | None = None


def _drop(box: list | None, done: threading.Event) -> None:
    """Empty ``box`` (a group's destructor runs here, if this was its last reference), or, for None,
    collect the interpreter's reference cycles (:func:`collect_off_path`); then set ``done``, even if
    a destructor raised (it must end neither the thread nor a wait on ``done``)."""
    try:
        if box is None:
            gc.collect()
        else:
            box.clear()
    except Exception:  # noqa: BLE001 - a destructor's error must not end the retiring or reaping thread
        pass
    done.set()


def _retirer() -> None:
    while True:
        _drop(*_RETIRE_QUEUE.get())


def start_retirer() -> None:
    """Start this process's retiring thread (``accelpact-retire``) unless it runs.  Every engine calls
    it at attach: started on first use instead (a repair's phase 5, a swap's), it appeared in a rank's
    thread count only at the first episode that retired a group, which the soak's leak check read as
    growth between two later episodes (30-minute soak, stop 37: "threads 38 -> 39" in six processes,
    each once)."""
    global _RETIRER
    with _RETIRE_LOCK:
        if _RETIRER is None or not _RETIRER.is_alive():
            _RETIRER = EngineThread(target=_retirer, name="accelpact-retire", daemon=True)
            _RETIRER.start()


def _retire_off_path(box: list) -> threading.Event:
    """Drop the references in ``box`` (a replaced communicator) on the retiring thread (one per
    process, started at attach, :func:`start_retirer`; a queue put costs microseconds, where starting a thread per
    repair cost 0.1-0.4 ms in phase 5).  Destroying a gloo ``ProcessGroup`` tears down its pairs
    and worker threads: 20-25 ms per group between two processes here, with the GIL released (the
    main thread stalls 0.15 ms), which inside phase 5 sat on the repair's critical path.  If
    something else still holds the group (a reaped work, a socket record), it is destroyed where
    that reference goes, as before.  Returns the event set once ``box`` was emptied."""
    start_retirer()
    done = threading.Event()
    _RETIRE_QUEUE.put((box, done))
    return done


def collect_off_path() -> threading.Event:
    """Collect reference cycles on the retiring thread; the event is set once done.  Called once after
    an episode that rebuilt the model (a hot swap, a discard), at the second boundary of the new
    generation (``Training.boundary``; at the first, some of the old generation's groups are still
    reachable): the retired engine, its guard's hooks and the old wrapper
    refer to each other, so they, and through the wrapper every group of the old generation (its
    threads, sockets, listening sockets), are freed only by a collection of the cycles; the
    interpreter's own came 25-40 s later in the 30-minute soak (stop 39: 3 listening sockets, 9
    threads and 15 fds held that long after every episode).  Contrast :func:`_retire_off_path`, which
    drops a replaced communicator that nothing else holds."""
    start_retirer()
    done = threading.Event()
    _RETIRE_QUEUE.put((None, done))
    return done


#: The watchdogs of engines retired by a swap or a discard: stopped and detached, their threads leave at
#: the end of their store waits' slices.  A job that ends within a slice of its last episode must wake
#: them, or a thread still inside a C++ store wait at the interpreter's teardown aborts the process
#: ("terminate called without an active exception", exit -6; Watchdog.wake_and_join).  Weak: a
#: watchdog whose threads ended is gone (a strong list kept every retired engine and its groups).
_RETIRED_WATCHDOGS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def retired_watchdogs() -> list:
    """The retired engines' watchdogs (see :data:`_RETIRED_WATCHDOGS`), for the job's end."""
    return list(_RETIRED_WATCHDOGS)


#: Threads of the engine that the job's end need not wait for: the retiring thread idles in a queue's
#: get (it never returns into C++ code) once the queue is drained.
_IDLE_AT_END = ("accelpact-retire",)


def settle_threads(timeout_s: float = 10.0) -> list[str]:
    """At the job's normal end, after every watchdog was stopped and woken: wait (at most
    ``timeout_s`` in all) until the retiring thread dropped every replaced group and every other
    ``accelpact-*`` thread of this process ended (a suspended engine's detector, a swap watcher, a
    reaper holding an abandoned op); the names of those still running after that.

    Why: a daemon thread still inside a C++ call when the interpreter finalizes (a group's destructor,
    a store wait, an op's wait) is ended by ``pthread_exit`` once the call returns, and the forced
    unwind through torch's C++ frames aborts the process ("terminate called without an active
    exception", exit -6)."""
    deadline = time.monotonic() + timeout_s
    _retire_off_path([]).wait(timeout_s)  # a sentinel: set once every box queued before it was dropped
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and t.daemon and t.name.startswith("accelpact-") and t.name not in _IDLE_AT_END:
            t.join(max(0.0, deadline - time.monotonic()))
    return sorted(t.name for t in threading.enumerate()
                  if t is not me and t.daemon and t.is_alive() and t.name.startswith("accelpact-")
                  and t.name not in _IDLE_AT_END)


class _Engine:
    """What every engine of a rank shares, survivor's and spare's: the trace records of model
    actions (``_act``), the write/record hold (``_hold``), the control-plane actions of phase 3 and
    of the release, and the one exit path of each kind (``_reject``, ``_decided_abort``, ``_fail``).
    The hot swap's actions (model ``RankClaimSpare`` ... ``RankTransferState``) are here too: a
    survivor (:class:`Pact`) and a spare (:class:`SpareEngine`) run the same episode.

    A subclass sets ``rank``, ``control``, ``trace``, ``hooks``, ``gen``, ``pc``, ``deadline_s``,
    ``watchdog``, ``_hold``, ``_episode`` and provides ``frontier`` and ``tau``."""

    rank: int
    control: ControlPlane
    trace: Any
    hooks: Hooks
    gen: int
    pc: str
    deadline_s: float
    watchdog: Watchdog
    _episode: "_Episode | None"
    #: the heartbeat detector, and R's collective timeout (s), that the straggler wait reads
    #: (:meth:`_await_stragglers`); a spare's engine has neither, and so never stretches its wait
    detector: Any = None
    collective_timeout_s: float | None = None

    @property
    def frontier(self) -> int:  # pragma: no cover - every engine defines it
        raise NotImplementedError

    @property
    def tau(self) -> int:  # pragma: no cover - every engine defines it
        raise NotImplementedError

    #: the write/record hold of one model action: exitcodes.holding_exit (a seeded bug may replace it)
    _hold: Callable[[], Any]

    # ---- plumbing -------------------------------------------------------------------------------
    def _arm(self) -> None:
        """Each control-plane write and its trace record form one model action (exitcodes.holding_exit),
        and an expired wait claims the exit before it writes the abort; then a seeded bug, if the hooks
        name one, replaces what it replaces (test-only, :mod:`accelpact.testing.seeded`)."""
        self._hold = holding_exit
        self.control.claims_exit = True
        if self.hooks.seeded_bug is not None:
            from ..testing import seeded  # test tooling: only when the hooks name a seeded bug

            seeded.install(self.hooks.seeded_bug, engine=self, control=self.control)

    def _st(self, pc: str, **more) -> dict:
        self.pc = pc
        return {"pc": pc, **more}

    def _act(self, action: str, state: dict, detail: dict | None = None, outcome: str = "ok", gen: int | None = None) -> None:
        self.trace.action(action, self.gen if gen is None else gen, outcome, state, detail)

    def _at(self, point: str) -> None:
        """Between actions: the hooks' point ``point`` (an external injector may act there; the
        engine applies nothing it says)."""
        self.hooks.point(point, self)

    def _at_point(self, point: str) -> None:
        """The guard's hooks (forward, backward, optimizer): the hooks' point, between actions."""
        self._at(point)

    # ---- Phase 3: RankArrive, RankDecideAgreement, RankAwaitAgreement -----------------------------
    def _arrive(self, ep: _Episode) -> None:
        """Report (F, g) at the control barrier.  Each store write is recorded under the exit claim
        (exitcodes.holding_exit): a peer may act on it at once, and our watchdog must not exit
        between write and record."""
        ep.frontier = self.frontier
        with self._hold():
            count, last = self.control.arrive(ep.g, ep.frontier)
            self.hooks.written()
            self._act("RankArrive", self._st(PC_ARRIVED, frontier=ep.frontier, tau=self.tau),
                      {"count": count, "last": last})
        ep.last_arriver = last

    def _decide_agreement(self, ep: _Episode) -> None:
        """The last arriver compares every (F, g) with rank 0's and decides commit or abort:mismatch."""
        if not ep.last_arriver:
            return
        with self._hold():
            dec = self.control.decide_agreement(ep.g)
            self.hooks.written()
            if dec != DECISION_COMMIT:  # mismatch: record, then the job abort, then exit (RankExit)
                self.watchdog.exit_on_abort(dec[len("abort:"):] if dec.startswith("abort:") else REASON_MISMATCH,
                                            before=lambda: self._act("RankDecideAgreement", {"pc": PC_ARRIVED},
                                                                     {"decision": dec}, outcome="fail"))
                raise _Exited
            self._act("RankDecideAgreement", {"pc": PC_ARRIVED}, {"decision": dec})

    def _await_agreement(self, ep: _Episode) -> None:
        """RankAwaitAgreement: the decision, or ``abort:deadline`` (RankTimeout) once the wait expires.
        The wait is ``deadline_s``, stretched for a step abandoned in flight (:meth:`_await_stragglers`)."""
        until = time.monotonic() + self.deadline_s
        if ep.swap is not None and ep.swap.point in DISCARD_PHASES:
            until = self._await_stragglers(ep, until)
        dec = self.control.await_agreement(ep.g, until)
        if dec != DECISION_COMMIT:
            self._decided_abort(dec, expired=self.control.last_expired)
        self._act("RankAwaitAgreement", self._st(PC_AGREED), {"decision": dec})

    def _await_stragglers(self, ep: _Episode, until: float) -> float:
        """When the agreement wait of an episode that abandoned a step in flight (a discard, or a swap
        from forward or backward) expires with peers still absent: the absent peers may be held in a
        collective of the abandoned step that the revoke did not wake (a gloo op on sockets shut down
        under it can stay blocked until its own timeout, K6 in bench/README.md); such a peer arrives
        once that collective times out.  So while every absent peer still beats
        (:meth:`~accelpact.impl.detector.Detector.beating`), the wait goes on, at most R's collective
        timeout past ``until``; a silent one (dead, stopped, its GIL held) ends it at ``until`` as
        before.  Decides nothing: returns when the caller's wait is to end (the RankTimeout, if
        any, is the caller's).  Contrast the release wait, which is never stretched: by then every
        rank has arrived, so none is held in the abandoned step."""
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
            absent = set(range(self.control.world_size)) - self.control.arrived(ep.g)
            if not absent and noted:
                # the straggler arrived just now: its decision (it is the last arriver) is due at once,
                # and is waited for as any decision is
                return time.monotonic() + self.deadline_s
            if not absent or self.detector.beating(absent) != absent:
                return time.monotonic()
            if not noted:
                self.trace.note("await-straggler", gen=ep.g, absent=sorted(absent), limit_s=round(limit - now, 3))
                noted = True
            until = min(time.monotonic() + 1.0, limit)

    # ---- Release: RankReady, RankDecideRelease, RankResume ---------------------------------------
    def _ready(self, ep: _Episode) -> None:
        with self._hold():
            count, last = self.control.ready(ep.g)
            self.hooks.written()
            self._act("RankReady", self._st(PC_READY), {"count": count, "last": last})
        ep.last_ready = last

    def _decide_release(self, ep: _Episode) -> None:
        """The last ready rank decides the release (every rank of W voted)."""
        if not ep.last_ready:
            return
        with self._hold():
            dec = self.control.decide_release(ep.g)
            self.hooks.written()
            self._act("RankDecideRelease", {"pc": PC_READY}, {"decision": dec},
                      outcome="ok" if dec == DECISION_RELEASE else "fail")

    def _await_release(self, ep: _Episode) -> None:
        dec = self.control.await_release(ep.g, time.monotonic() + self.deadline_s)
        if dec != DECISION_RELEASE:
            self._decided_abort(dec, expired=self.control.last_expired)

    # ---- exits (fail-stop) ----------------------------------------------------------------------
    def _which(self) -> str:
        return self.control.decision_for(self.pc)

    def _reject(self, why: str, guard_reasons=()) -> None:
        """RankReject: the contract says L2; abort the job (every rank exits 70)."""
        claim_exit()
        g, which = self.gen, self._which()

        def record():
            self._act("RankReject", {"pc": PC_EXITED, "reason": REASON_REJECTED},
                      {"why": why, "guard": list(guard_reasons)}, outcome="fail", gen=g)
            self._store_abort(g, which, REASON_REJECTED)

        exit_now(code_for(REASON_REJECTED), REASON_REJECTED, self.trace, record=record, claimed=True)
        raise _Exited

    def _decided_abort(self, dec: str, expired: bool) -> None:
        """A decision key says abort.  If our own wait expired we are the RankTimeout;
        otherwise a peer decided and we exit on the job abort (RankExit)."""
        reason = dec[len("abort:"):] if dec.startswith("abort:") else REASON_EXCEPTION
        if expired and reason == REASON_DEADLINE:
            claim_exit()
            g, which = self.gen, self._which()

            def record():
                self._act("RankTimeout", {"pc": PC_EXITED, "reason": REASON_DEADLINE}, {"decision": dec}, outcome="fail", gen=g)
                self._store_abort(g, which, REASON_DEADLINE)

            exit_now(code_for(REASON_DEADLINE), REASON_DEADLINE, self.trace, record=record, claimed=True)
        self.watchdog.exit_on_abort(reason)
        raise _Exited

    def _fail(self, exc: BaseException) -> None:
        """RankFail (exception in phases 2-6), or RankTimeout if a collective outlived the deadline."""
        claim_exit()
        g, which = self.gen, self._which()
        if not self.control.reachable():
            # the store is gone: no decision or abort can be read or written (model RankLoseStore)
            self.watchdog.lose_store(exc, claimed=True)
            raise _Exited
        # Building R's communicator (phase 4, pc "agreed") and the validation collective (phase
        # 6, pc "rebound") are waits on peers (model: RankTimeout there).  A communication error
        # in them -- a peer died or never came -- is that wait failing: deadline.  Our own errors
        # (stale references, digest mismatch, an injected exception) are exceptions.
        # The boundary's control-group all-reduce (pc "train") is such a wait too.
        # a communication failure (c10d raises RuntimeError subclasses, sockets OSError) is a wait
        # on peers failing; anything else is an error of the phase itself
        own_error = isinstance(exc, (RebindError, ValidationError, _swap.SwapError)) or not isinstance(exc, (RuntimeError, OSError))
        if not own_error:
            # a wait on peers failed: if a peer already aborted the job, this is that abort
            # reaching us (RankExit with its reason), not a new failure
            try:
                standing = self.control.read_abort()
            except Exception:  # noqa: BLE001 - store lost: no standing abort can be read
                standing = ""
            if standing:
                self.watchdog.exit_with(standing, claimed=True)  # records RankExit, os._exit
                raise _Exited
        # every rank builds the groups over all of W in phase 4 (P18.3): a rendezvous from "agreed" too
        timed_out = self.pc in (PC_TRAIN, PC_AGREED, PC_REBOUND) and not own_error
        if timed_out and not self._first_to_expire(g, which):
            # a peer's wait on the same decision failed first: its RankTimeout writes the abort (the
            # model has one timeout per decision, then no more: an abort stands); we exit on it
            standing = self.control.wait_abort(self.deadline_s)
            self.watchdog.exit_on_abort(standing or REASON_DEADLINE)  # RankExit (writes the abort if none came)
            raise _Exited
        reason = REASON_DEADLINE if timed_out else REASON_EXCEPTION
        action = "RankTimeout" if timed_out else "RankFail"

        def record():
            self._act(action, {"pc": PC_EXITED, "reason": reason}, {"error": f"{type(exc).__name__}: {exc}"[:500]},
                      outcome="fail", gen=g)
            self._store_abort(g, which, reason)

        exit_now(code_for(reason), reason, self.trace, record=record, claimed=True)
        raise _Exited

    def _first_to_expire(self, g: int, which: str) -> bool:
        """Whether this rank is the first whose wait on ``which`` of g failed (a store counter, as
        for an expired decision wait: ``ControlPlane.first_expirer``)."""
        try:
            return self.control.first_expirer(g, which)
        except Exception:  # noqa: BLE001 - store lost: nobody else can write the abort; it is ours
            return True

    def _store_abort(self, g: int, which: str, reason: str) -> None:
        try:
            self.control.write_abort_decision(g, which, reason)
            self.control.abort(reason)
        except Exception:  # noqa: BLE001 - store lost: peers' watchdogs exit DEADLINE on their own
            pass  # store lost: peers' watchdogs exit DEADLINE on their own

    # ---- hot swap: phases 3-6 of a swap episode (model "Hot swap"; spec/hotswap.md) -------------------
    # A survivor (Pact.swap) and a spare (SpareEngine.swap) run the same actions, in the order the
    # implementation is physically held to: the agreement over all of W (the spare arrives under the
    # dead identity), every group rebuilt in g+1 (each contains the dead rank), the model rebuilt on
    # them, the state sent by a live replica, validation, the release.

    def _run_swap(self, ep: _Episode) -> Any:
        """The swap's phase loop (as :meth:`Pact._recover` for a repair): the hooks' point before each
        phase, then its actions; any exception ends the rank (fail-stop).  Returns the
        :class:`~accelpact.impl.runtime.hotswap.SwapRecord`; the rebuilt model is on ``ep.swap``."""
        sw = ep.swap
        assert sw is not None
        phases = (
            ("agree", (self._arrive, self._decide_agreement, self._await_agreement)),
            ("replace", (self._replace_every_group,)),
            ("rebind", (self._rebuild_model,)),
            ("validate", (self._transfer_state, self._validate_replicas)),
            ("release", (self._ready, self._decide_release, self._await_release)),
        )
        try:
            for point, actions in phases:
                self._at(point)
                t = time.monotonic_ns()
                for action in actions:
                    action(ep)
                ep.durations[point] = time.monotonic_ns() - t
        except _Exited:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception in the swap's phases ends the rank (fail-stop)
            self._fail(exc)
        self._resume_swapped(ep)
        return _swap.SwapRecord(generation=ep.g, point=sw.point, dead=list(sw.dead), spares=dict(sw.claims),
                          sources=dict(sw.sources), frontier=ep.frontier, role=sw.role,
                          durations_ms={k: round(v / 1e6, 3) for k, v in ep.durations.items()},
                          t_resume=time.monotonic())

    def _replace_every_group(self, ep: _Episode) -> None:
        """RankReplace of a swap: every group of the job built anew in generation g+1 by its members
        (:func:`~accelpact.impl.runtime.hotswap.rebuild_groups`; the default, control and checkpoint groups
        and every training group contain the dead identity, so none can be kept).  ``comm``: the
        generation-(g+1) namespace all of them are built under."""
        sw = ep.swap
        assert sw is not None
        t = time.monotonic_ns()
        _swap.rebuild_groups(sw.job, ep.g + 1, sw.held)
        sw.held = ()
        self._act("RankReplace", self._st(PC_REPLACED, comm=swap_prefix(ep.g + 1), wide=ep.g + 1),
                  {"groups": sorted(sw.job.groups) + ["default", "control", "checkpoint"], "swap": True,
                   "duration_ns": time.monotonic_ns() - t})

    def _rebuild_model(self, ep: _Episode) -> None:
        """RankRebind of a swap: the model is built anew on the new groups (the user's ``rebuild``),
        so no reference to an old group can remain (``refs_stale`` 0); RNG back to F; a survivor moves
        its own committed state into it (the discarded step's runtime state stays with the old
        wrapper).  Then every rank of W waits until all have rebuilt (a spare's first build is slow:
        it is waited for under the phase deadline, not inside a transfer's collective)."""
        import torch

        from .runtime.wrappers import wrapper_of

        sw = ep.swap
        assert sw is not None
        t = time.monotonic_ns()
        sw.module, sw.optimizer = sw.rebuild(sw.job, sw.extra)
        sw.kind = wrapper_of(sw.module).recovers
        if sw.rng is not None:
            torch.set_rng_state(sw.rng)
        if sw.old is not None:
            manifest, tensors = _swap.export_state(*sw.old)
            _swap.import_state(sw.module, sw.optimizer, manifest, tensors)
            adapter_for(sw.old[0]).release(sw.old[0], keep=sw.module)  # what a failed backward left (soak K3)
            sw.old = None
        self._act("RankRebind", self._st(PC_REBOUND, refs_stale=0),
                  {"rebuilt": True, "duration_ns": time.monotonic_ns() - t})
        _swap.store_barrier(sw.job.attempt_store, swap_rebuilt_key(ep.g), sw.job.world, self.deadline_s, "rebuilt its model")

    def _transfer_state(self, ep: _Episode) -> None:
        """RankTransferState: for each dead identity, the first live member of its new group of R's
        kind broadcasts its state (:func:`~accelpact.impl.runtime.hotswap.transfer`); the spare loads it, other
        members receive and drop it.  Recorded by the sender."""
        sw = ep.swap
        assert sw is not None
        job, topo = sw.job, sw.job.topology
        done: set[tuple[int, ...]] = set()
        for d in sw.dead:
            members = topo.group(sw.kind, d)
            if self.rank not in members or members in done:
                continue
            done.add(members)
            src = [m for m in members if m not in sw.dead][0]
            sw.sources.update({x: src for x in members if x in sw.dead})
            holds = self.rank in sw.dead or self.rank == src  # the spare loads the state, the source sends it
            t = time.monotonic_ns()
            moved = _swap.transfer(job.groups[sw.kind], members, src, self.rank, sw.module if holds else None,
                             sw.optimizer if holds else None, job.device, self.deadline_s)
            if self.rank == src:
                self._act("RankTransferState", {"pc": self.pc},
                          {"to": [x for x in members if x in sw.dead], "bytes": moved,
                           "duration_ns": time.monotonic_ns() - t})

    def _validate_replicas(self, ep: _Episode) -> None:
        """RankValidate of a swap: on the new group of R's kind, the all-reduce that counts its members
        and every replica's state checksum compared (:func:`~accelpact.impl.runtime.hotswap.validate`)."""
        sw = ep.swap
        assert sw is not None
        t = time.monotonic_ns()
        digest = _swap.validate(sw.job.groups[sw.kind], sw.job.topology.group(sw.kind, self.rank), self.rank, sw.module,
                          sw.optimizer, self.deadline_s)
        self._act("RankValidate", self._st(PC_VALIDATED), {"digest": digest, "duration_ns": time.monotonic_ns() - t})

    def _resume_swapped(self, ep: _Episode) -> None:
        """RankResume of a swap: generation g+1 at F, on the rebuilt model (an engine of g+1 is
        attached to it by the caller; this one retires)."""
        self.gen = ep.g + 1
        self._episode = None
        self._act("RankResume", self._st(PC_TRAIN, gen=self.gen, point=""), {"from_gen": ep.g, "swap": True}, gen=ep.g)



class Pact(_Engine):
    """The attached engine of one rank.  Create with :func:`attach`.

    Read beside ``model/protocol.py``: one method per model action of this rank (``_observe`` is
    ``RankObserve``, ``_guard`` is ``RankGuard``/``RankReject``, ... ``_resume`` is ``RankResume``),
    each writing the trace record of its action.  :meth:`_recover` is the phase loop around them:
    the test hooks' point before each phase, and the phase's duration."""

    def __init__(self, module, optimizer, *, groups: PactGroups, control: ControlPlane, trace=None, envelope=None,
                 key: ObservationKey | None = None, deadline_s: float = DEFAULT_DEADLINE_S, adapter=None, frontier: int = 0,
                 strategy: ReplacementStrategy | None = None, step_deadline_s: float | None = None,
                 hooks: Hooks | None = None, detect: bool = True, dead_after_s: float | None = None,
                 hang_threshold_s: float | None = None, generation: int = 0, notices: Any = None,
                 discard: bool = False, wide: Callable[[int], tuple[list[str], Any, dict]] | None = None,
                 wide_records: Callable[[], list] | None = None, predecessor: Any = None) -> None:
        if control.rank not in groups.members:
            raise ValueError(f"attach: rank {control.rank} is not in its own group's members {groups.members}")
        self.module = module
        self.optimizer = optimizer
        self.control = control
        self.rank = control.rank
        self.trace = trace if trace is not None else NullTrace()
        self.envelope = envelope if envelope is not None else default_envelope()
        #: the step in flight can be discarded in place (P17): the caller rebuilds the wrapper (its
        #: runtime state of the abandoned step) through :meth:`swap`; without it forward and backward are L2
        self.discard = discard
        #: phase 4 of every episode on every rank (P18.3): builds the groups over all of W of a generation,
        #: returning (their names, the new control group, socket records by group name); None: none to build
        self.wide = wide
        if not discard:
            self.envelope = without_discard(self.envelope, "no in-place discard: the job was attached without rebuild=")
        self.key = key or ObservationKey(DEFAULT_PLATFORM, DEFAULT_PROFILE, "boundary", DEFAULT_OBJECTIVE)
        notice = unqualified_notice(self.envelope, self.key.platform)
        if notice:  # an unqualified platform: every failure there is L2; say so once, at attach
            print(f"accelpact: {notice}", file=sys.stderr, flush=True)
        self.deadline_s = deadline_s
        backend = backend_of(groups.affected)
        #: R's collective timeout (s; None: the group does not say): how long an op of an abandoned step
        #: can hold a peer that still beats (:meth:`_await_agreement`)
        self.collective_timeout_s = backend.timeout_of(groups.affected)
        if step_deadline_s is None:  # the one rule (job.default_step_deadline), R's collective timeout as it was built
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
        self._episode: _Episode | None = None  # the recovery in progress
        self._observed_gen = -1  # the generation whose failure this rank last recorded (RankObserve)
        self._retiring: list[threading.Event] = []  # replaced communicators being destroyed (phase 5)
        self._pg = groups.affected
        self._record: _revoke.SocketRecord | None = groups.record
        # keep no second reference to R's communicator: after a repair the adapters' walker would
        # find it (the guard's hooks make the pact reachable from the module) and the old group
        # could never be freed
        self.groups = dataclasses.replace(groups, affected=None)
        self._arm()
        self.adapter = adapter if adapter is not None else adapter_for(module)
        self.strategy = strategy or choose_strategy(self._pg, control.prefix)
        self.sites: list = []
        self._sites_settled = False  # re-discovered once after the first step (wrappers cache lazily)
        self.guard = BoundaryGuard(module, optimizer, frontier=frontier, on_point=self._at_point, sync_timeout_s=deadline_s,
                                   before_commit=self._before_commit)
        self.sites = self._discover()  # at attach: rebinding reuses them (and the first boundary settles them)
        self.watchdog = Watchdog(control, trace=self.trace, gen_of=lambda: self.gen, pc_of=lambda: self.pc,
                                 step_records=lambda: list(self.group_records().values()), wide_records=wide_records)
        # the failure detector (heartbeats on the control plane, impl/detector.py): a dead or hung
        # peer ends the job at once (RankSuspect) instead of at a deadline; built before any thread
        # starts (its store connection must not race the socket records of revoke.recorded)
        # its default bounds are the backend's (spec/nccl.md rows 19-20: NCCL's is_completed holds the GIL)
        self.detector = Detector(control.store, self.rank, control.world_size, prefix=control.prefix,
                                 on_suspect=self._on_suspect, dead_after_s=dead_after_s,
                                 hang_threshold_s=hang_threshold_s, backend=backend.name, epoch=generation) if detect else None
        self.watchdog.start(succeed=predecessor)  # a retired engine's abort thread is taken over
        start_retirer()  # now, not at the first retired group: the rank's thread count is steady from attach
        if self.detector is not None:
            self.detector.set_progress(frontier)
            self.detector.start()
        self.watchdog.watch(self.gen, self.groups.key, self._record)
        self._closed = False

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
        return {self.groups.name: self._record, self.groups.key: self._record, **self.groups.others}

    def _key(self, point: str) -> ObservationKey:
        return ObservationKey(self.key.platform, self.key.profile, point, self.key.objective)

    # ---- the step loop -----------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, step: int):
        """Wraps forward, backward and ``optimizer.step()``.  An exception inside is an in-flight
        failure: with spares and a death notice, a hot swap (P16); in forward or backward of an engine
        that can discard (``discard``) and where the envelope says L1, a discard in place (P17:
        :class:`~accelpact.impl.runtime.hotswap.SwapNeeded` with no dead rank, run by :meth:`swap`);
        otherwise the contract rejects it and every rank exits 70.  Arms the watchdog's step deadline
        (``step_deadline_s``), which :meth:`boundary` disarms."""
        self._step = step
        self.watchdog.arm(self.step_deadline_s)
        try:
            yield self
        except Exception as exc:  # noqa: BLE001 - any error in the step is an in-flight failure (C3 rule 1)
            point = self.guard.point if self.guard.point != "boundary" else "forward"
            self._swap_if_died(point, exc)
            self._discard_if_qualified(point, exc)
            self._observe_in_flight(point, exc)

    def boundary(self, loss) -> RecoveryReport | None:
        """After the commit: the post-commit collective on R, the failure flag on W, and on a
        failure anywhere in R the six phases.  Returns the report of a repair, else None."""
        t0 = time.monotonic_ns()
        if self.detector is not None:
            self.detector.set_progress(self.guard.frontier)  # committed: a peer still behind is awaited
        observed, err = self._probe(loss)
        self._fail_on_backend_errors(observed)
        t_obs = time.monotonic_ns()
        if observed:
            # a member observes before any effect of its observation (revoke, flag) reaches a peer
            self._observe(self.gen, member=True, failed=(self.groups.index,), error=err)
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
        """Issue 26 item 1 (NCCL): as ``optimizer.step()`` starts, a step whose collectives ran on a
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
        already committed: replicas then differ (first lent GPU, stop 38: every boundary repair of the
        NCCL corpus failed its validation, "replica checksums differ").  Past the bound the step's
        results are not known: :class:`AbortedCommunicator` as above."""
        from .runtime.backends import AbortedCommunicator, recorded_errors

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
        import torch

        from .flag import or_allreduce

        control = self.groups.control
        or_allreduce(control, torch.zeros(1, dtype=torch.int64),
                     wait=lambda work: self._wait_unless_revoked(work, "the commit fence", group=control))

    def _fail_on_backend_errors(self, observed: bool) -> None:
        """Issue 26: with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 NCCL's watchdog aborts a group whose work
        failed and raises nothing, so a step whose shard-group collective failed could stand.  Any
        training group whose backend recorded an error (:func:`backends.recorded_errors`; R left out
        when its probe failed: that is the boundary's own, repairable failure) is an in-flight failure
        of the step: the contract rejects it (L2, exit 70)."""
        from .runtime.backends import recorded_errors

        skip = (self.groups.name, self.groups.key) if observed else ()
        if bad := recorded_errors(self.group_records(), skip=skip):
            exc = RuntimeError(f"NCCL recorded an error on group(s) {bad} during the step (aborted by its watchdog, "
                               "TORCH_NCCL_ASYNC_ERROR_HANDLING=2): the step's result is not trusted")
            # with spares, a peer's death (a keeper's notice) is what failed the group: the commit drained
            # the step's device work and found no error (_before_commit), so the step stands and the dead
            # rank is swapped at the boundary (first lent GPU, stop 38: a stopped rank's deposition failed
            # the shard group and the survivors rejected, L2, where the model swaps)
            self._swap_if_died("boundary", exc)
            # a collective of the step failed: an in-flight failure (RankObserve, RankReject: exit 70),
            # observed only now; which point of the step is not known, and every in-flight point is L2
            self._observe_in_flight("backward", exc)

    def _probe(self, loss) -> tuple[bool, BaseException | None]:
        """The post-commit collective on R (it carries the loss, on R's device): (failed, its error)."""
        import torch

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
            raise _Exited from exc

    def _failure_flag(self, observed: bool) -> list[int] | None:
        """The failure flag OR-ed over W (control group, :func:`accelpact.impl.flag.or_allreduce`:
        O(log W) rounds on large worlds): which groups of R's kind failed; None when the flag itself
        failed (P18.4: observed, and the failed groups are read from their revoke keys after the
        agreement, :meth:`_read_failed`)."""
        import torch

        from .flag import or_allreduce

        flag = torch.zeros(self.groups.count, dtype=torch.int64)
        if observed:
            flag[self.groups.index] = 1
        try:
            or_allreduce(self.groups.control, flag)
        except RuntimeError as exc:
            # the out-of-band control group failed under this rank: a broken link crosses it, or a peer
            # it waits on is gone (a death with a spare left is a hot swap): an observation (P18.4)
            self._swap_if_died("boundary", exc)
            self._observe_wide(exc)
            return None
        return [i for i, v in enumerate(flag.tolist()) if v]

    def _wait_unless_revoked(self, work, what: str, group: Any = None) -> None:
        """Wait for an op on R (or on ``group``, the control group for the commit fence); raise its
        error, or :class:`RevokedWhilePending` if R was revoked in this generation (by a peer's step
        revoke too: it is published under R's keys) and the op is still pending ``REVOKE_GRACE_S``
        later (the op and its group go to a reaper thread), or if it completed on a communicator the
        revoke aborted (NCCL: its result is not trusted, :func:`revoke.aborted`).

        :func:`backends.wait_bounded` polls the op's completion, not its future (an NCCL op's future
        completes when the op is enqueued); on gloo it blocks in ``work.wait`` slices of
        ``REVOKE_CHECK_S`` instead (:attr:`Backend.sliced_wait`: the fault-free path is one blocking
        wait, 0.13 ms cheaper per step than waking on the future).  Bounded: past the group's own
        collective timeout plus ``REVOKE_GRACE_S`` the wait gives up with the op's timeout error
        (NCCL: ``DistBackendError``; gloo's op fails at its timeout before that)."""
        seen = None  # when R's revoke took effect here (the watcher's shutdown), or this wait first saw its key

        def revoke_check() -> None:
            nonlocal seen
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
        record = self._record if group is None else None
        be = backend_of(pg)
        timeout = be.timeout_of(pg)
        budget = (timeout or self.deadline_s) + REVOKE_GRACE_S
        if be.revoke == "abort" and timeout:
            # issue 26: NCCL's watchdog (every 100 ms) aborts a timed-out group silently (mode 2) and the
            # work's wait then returns normally; end the wait first (spec/nccl.md row 17; the boundary
            # also reads get_error after the probe, _fail_on_backend_errors)
            budget = max(timeout - NCCL_WATCHDOG_MARGIN_S, REVOKE_GRACE_S)
        try:
            try:
                # raises the op's own error, if any
                wait_bounded(work, budget, check=revoke_check, check_every_s=REVOKE_CHECK_S, sliced=be.sliced_wait)
            except RevokedWhilePending:
                reaped = threading.Event()
                self._retiring.append(reaped)
                EngineThread(target=_reap, args=([work, pg], reaped), name="accelpact-reaper", daemon=True).start()
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
            dead = self.notices.wait_new()
        except Exception:  # noqa: BLE001 - store lost: the usual path (RankLoseStore)
            return
        if not dead:
            return
        self.watchdog.disarm()
        if self._observed_gen != self.gen:  # a member at the boundary has recorded it already
            self._act("RankObserve", self._st(PC_OBSERVED, point=point, frontier=self.guard.frontier, tau=self.guard.tau),
                      {"error": repr(exc)[:300], "dead": list(dead), "swap": True})
            self._observed_gen = self.gen
        raise _swap.SwapNeeded(point, dead, exc) from exc

    def _on_suspect(self, peer: int, kind: str, detected_at_ns: int) -> None:
        """The detector's suspicion, handled on a thread of its own (:meth:`_handle_suspect`).  The
        detector calls this from its heartbeat thread, and the handling may wait ``NOTICE_WAIT_S`` for
        a keeper's notice: a heartbeat held that long reads as this rank's death to its peers, whose
        detectors then declare it in turn (soak K7: the stopped rank, once resumed, declared the
        three that had declared it and deposed a healthy one)."""
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
        self._closed = True
        self.watchdog.stop()
        self.watchdog.detach()  # its threads keep it until their slices end; they must not keep this engine
        self.watchdog.wake_revoke()  # generation g was released: its revoke thread leaves now
        _RETIRED_WATCHDOGS.add(self.watchdog)  # woken and joined at the job's end (retired_watchdogs)
        self.guard.remove()
        self._pg = None

    def swap(self, need: Any, *, job: Any, rebuild: Callable[[Any, Any], tuple[Any, Any]], extra: Any,
             rng: Any) -> tuple[Any, Any, Any]:
        """A survivor's hot swap after ``need`` (:class:`~accelpact.impl.runtime.hotswap.SwapNeeded`: the ranks
        that died, and where; its ``RankObserve`` is recorded): the contract on the dead-rank key
        (``RankReject`` if L2), ``RankClaimSpare``, ``RankDiscardStep`` of a step in flight,
        ``RankGuard``, then the swap's phases (:meth:`_run_swap`) on ``job``'s groups and the model
        ``rebuild(job, extra)`` builds, RNG ``rng``.  Returns the rebuilt module and optimizer and the
        :class:`~accelpact.impl.runtime.hotswap.SwapRecord`; this engine is retired (the caller attaches one
        of generation g+1 to the rebuilt model).  Any failure ends the rank, and with it the job (L2)."""
        self.suspend()
        t = time.monotonic_ns()
        sw = _Swap(role="survivor", point=need.point, dead=tuple(sorted(need.dead)), job=job, rebuild=rebuild,
                   extra=extra, rng=rng, old=(self.module, self.optimizer), held=(self._pg,))
        ep = _Episode(self.gen, True, tuple(range(self.groups.count)), t, t, need.error, swap=sw)
        self._episode = ep
        try:
            self._at("guard")
            self._decide_swap(ep)
            self._claim_spares(ep)
            self._discard_step(ep)
            self._guard_swapped(ep)
        except _Exited:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception in phase 2 ends the rank (fail-stop)
            self._fail(exc)
        record = self._run_swap(ep)
        module, optimizer = sw.module, sw.optimizer
        sw.module = sw.optimizer = None
        self.retire()
        return module, optimizer, record

    def _decide_swap(self, ep: _Episode) -> None:
        """The contract on the dead-rank key (:func:`accelpact.model.hotswap.decide`: died, a spare in
        the job, a live replica of every dead rank in its group of R's kind): L2 is ``RankReject``."""
        from accelpact.model import hotswap as model_swap

        sw = ep.swap
        assert sw is not None
        if not sw.dead:  # a communicator failure in flight with every rank alive (P17): the plain key
            dec = decide(self.envelope, self._key(sw.point), True)
            if not dec.preserve:
                self._reject(dec.reason)
            sw.decision = dec.level
            return
        topo = sw.job.topology
        replica = all(any(m not in sw.dead for m in topo.group(self.groups.name, d)) for d in sw.dead)
        spare = _swap.pool_covers(self.control.store, ep.g, sw.dead, sw.job.spares)
        dec = model_swap.decide(self.envelope, self._key(sw.point), True, died=True, spare=spare, replica=replica)
        if not dec.preserve:
            self._reject(dec.reason)
        sw.decision = dec.level

    def _claim_spares(self, ep: _Episode) -> None:
        """RankClaimSpare: for each dead rank, the first survivor to claim takes a spare from the pool
        and tells it (:func:`~accelpact.impl.runtime.hotswap.claim_write`, single assignment); its writes and
        record are one action under the hold, and only a rank whose claim stood records it (the
        model's one claim for each dead identity).  Every survivor then reads the claims that stand;
        a dead rank left without a spare is the contract's L2 (``RankReject``)."""
        sw = ep.swap
        assert sw is not None
        if not sw.dead:  # nobody died: no identity to hand over
            return
        store = self.control.store
        with self._hold():
            mine = {}
            for d in sw.dead:
                first, k = _swap.claim_write(store, ep.g, d, sw.job.spares, sw.point)
                if first and k is not None:
                    mine[d] = k
            self.hooks.written()
            if mine:
                self._act("RankClaimSpare", {"pc": self.pc}, {"claims": mine, "decision": sw.decision})
        claims = {d: _swap.claim_read(store, ep.g, d, self.deadline_s) for d in sw.dead}
        missing = [d for d, k in claims.items() if k is None]
        if missing:
            self._reject(f"rank(s) {missing} died and no spare is left to take their identity")
        sw.claims = {d: int(k) for d, k in claims.items() if k is not None}

    def _discard_step(self, ep: _Episode) -> None:
        """RankDiscardStep (a death inside forward or backward): the step's gradients are dropped and
        the rank stands at the committed boundary F again; the wrapper's runtime state of the step
        stays with the old wrapper, which :meth:`_rebuild_model` replaces, and RNG and data cursor
        come back to F there.  Nothing to discard after a commit (the optimizer or the boundary)."""
        from accelpact.model.hotswap import DISCARDABLE

        sw = ep.swap
        assert sw is not None
        if sw.point not in DISCARDABLE:
            return
        self.optimizer.zero_grad(set_to_none=True)
        self._act("RankDiscardStep", self._st(PC_OBSERVED, point="boundary", frontier=self.frontier),
                  {"from": sw.point})

    def _guard_swapped(self, ep: _Episode) -> None:
        """RankGuard of a swap: at the committed boundary (nothing uncommitted is kept: a step in
        flight was discarded) and the contract said L1 (:meth:`_decide_swap`)."""
        sw = ep.swap
        assert sw is not None
        self._act("RankGuard", self._st(PC_GUARDED), {"decision": sw.decision, "swap": True})

    def rebind(self, new_pg: Any) -> int:
        """Phase 5 alone (``RankRebind``) onto ``new_pg``, outside any episode: for the phase-5
        benchmark (``accelpact bench rebind``), which measures it in an attached engine.  Returns the
        references rebound; a stale one is a :class:`RebindError`."""
        ep = _Episode(self.gen, True, (self.groups.index,), 0, 0, None, new_pg=new_pg)
        self._rebind(ep)
        return ep.refs_rebound

    # ---- the phase loop --------------------------------------------------------------------------
    def _recover(self, failed: list[int] | None, t0: int, t_obs: int, err: BaseException | None) -> RecoveryReport:
        """Phases 2-6 and the release, in the order of spec/protocol.md.  Before each phase the
        hooks' point of that name runs (a fault strikes *between* actions, as the model's Fault*
        actions do); outside R a rank waits in ``replaced`` while R is rebuilt, so the points of
        phases 5-6 strike it there.  Any exception or expired wait ends the rank (fail-stop).
        ``failed`` None: the failure flag failed (P18.4): the failed groups of R's kind are read from
        their revoke keys after the agreement (:meth:`_read_failed`)."""
        ep = _Episode(self.gen, failed is not None and self.groups.index in failed, tuple(failed or ()), t0, t_obs, err)
        ep.revoke_to_observe_ns = self._revoke_latency(ep)
        self._episode = ep
        if self._observed_gen != ep.g:
            # a member whose own probe failed recorded its RankObserve at the boundary, before its flag;
            # a rank outside the failed groups, or a member whose probe passed while a peer's failed,
            # learns of the failure from the flag and records it now (a member then publishes R's revoke)
            self._observe(ep.g, member=ep.member, failed=ep.failed, error=None)
        agree: tuple = (self._arrive, self._decide_agreement, self._await_agreement)
        if failed is None:
            agree += (self._read_failed,)
        phases = (
            ("guard", (self._guard,)),
            ("agree", agree),
            ("replace", (self._replace,)),
            ("rebind", (self._rebind_member,)),
            ("validate", (self._validate_member,)),
            ("release", (self._ready, self._decide_release, self._await_release)),
        )
        try:
            for point, actions in phases:
                self._at(point)
                t = time.monotonic_ns()
                for action in actions:
                    action(ep)
                ep.durations[point] = time.monotonic_ns() - t
        except _Exited:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception in phases 2-6 ends the rank (fail-stop)
            self._fail(exc)
        t_ret = time.monotonic_ns()
        self._resume(ep)
        self._episode = None
        t_end = time.monotonic_ns()
        d = ep.durations
        return RecoveryReport(
            generation=ep.g, member=ep.member, observe_ns=t_obs - t0, agree_ns=d["guard"] + d["agree"],
            rebuild_ns=d["replace"], rebind_ns=d["rebind"], validate_ns=d["validate"], release_ns=d["release"],
            retire_ns=t_end - t_ret, total_ns=t_end - t_obs, refs_rebound=ep.refs_rebound,
            revoke_to_observe_ns=ep.revoke_to_observe_ns,
        )

    def _revoke_latency(self, ep: _Episode) -> int:
        """This rank's revoke hard-close -> observed (-1: observed directly, before the revoke reached it)."""
        if ep.member and ep.error is not None:
            revs = [r for r in self.watchdog.revocations if r[0] == ep.g]
            if revs and ep.t_observed >= revs[0][3]:
                return ep.t_observed - revs[0][3]
        return -1

    # ---- Phase 1: RankObserve -------------------------------------------------------------------
    def _observe(self, g: int, *, member: bool, failed: tuple[int, ...], error: BaseException | None) -> None:
        """RankObserve at the boundary.  A member of a failed group (its collective on R failed)
        records it first and then publishes R's revoke, so that peers blocked on R wake up: the
        record precedes every effect of the observation (the revoke, its failure flag), as in the
        model a peer can only learn of a failure that a member observed.  If the store is gone
        the publish ends the rank by RankLoseStore, after its RankObserve.  A rank outside the
        failed groups records it once the failure flag told it which groups failed."""
        with self._hold():
            self._act("RankObserve", self._st(PC_OBSERVED, point="boundary", frontier=self.frontier,
                                              tau=self.guard.tau),
                      {"member": member, "failed_groups": list(failed),
                       "error": repr(error)[:200] if error else None})
            self._observed_gen = g
        if member:
            self._publish_revoke_or_lose_store(g)  # after its record: no write-to-record window here

    def _observe_wide(self, exc: BaseException) -> None:
        """RankObserve at the boundary through a failed group over all of W (P18.4): the failure flag,
        or a checkpoint save after a boundary that found nothing.  A standing abort is what reached us
        (``RankExit``).  Otherwise the rank records its observation, if it has not observed this
        generation's failure yet, and publishes the wide revoke (every watcher closes its groups over
        W: a peer blocked in the flag or the save wakes up); which groups of R's kind failed is read
        after the agreement (:meth:`_read_failed`)."""
        g = self.gen
        try:
            standing = self.control.read_abort()
        except Exception as err:  # noqa: BLE001 - store lost: RankLoseStore
            claim_exit()
            self.watchdog.lose_store(err, claimed=True)
            raise _Exited from err
        if standing:
            self.watchdog.exit_with(standing)  # RankExit on the abort that ended the collective
            raise _Exited
        self.watchdog.disarm()
        if self._observed_gen != g:
            with self._hold():
                self._act("RankObserve", self._st(PC_OBSERVED, point="boundary", frontier=self.frontier, tau=self.guard.tau),
                          {"member": None, "wide": True, "error": repr(exc)[:200]})
                self._observed_gen = g
        try:
            self.control.publish_wide_revoke(g)
        except Exception as err:  # noqa: BLE001 - store lost: RankLoseStore (after its RankObserve)
            if self.control.reachable():
                raise
            claim_exit()
            self.watchdog.lose_store(err, claimed=True)
            raise _Exited from err

    def repair_after_save(self, exc: BaseException) -> RecoveryReport:
        """A checkpoint save at the boundary failed (P18.4): a group over all of W failed after a
        boundary that found nothing.  The observation (:meth:`_observe_wide`), then the episode's
        phases as at the boundary (:meth:`_recover`): every group that failed is rebuilt, the
        checkpoint group with the other groups over W.  Returns the repair's report; the caller saves
        again on the new checkpoint group."""
        t0 = time.monotonic_ns()
        self.watchdog.arm(self.step_deadline_s)
        self._swap_if_died("boundary", exc)
        self._observe_wide(exc)
        report = self._recover(None, t0, time.monotonic_ns(), exc)
        self.reports.append(report)
        self.watchdog.disarm()
        return report

    def _discard_if_qualified(self, point: str, exc: BaseException) -> None:
        """RankObserve of an in-flight failure that the contract lets this rank discard (P17: forward
        or backward, the envelope's cell L1, ``discard``): records it, publishes the step's revoke on
        every group of R's kind (each rank's watcher then closes all of its training groups, so a
        peer blocked in any collective of the abandoned step wakes up), and raises
        :class:`~accelpact.impl.runtime.hotswap.SwapNeeded` with no dead rank: the training loop runs
        the episode (:meth:`swap`: discard, agreement, every group rebuilt, validation, release).
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
        with self._hold():
            self._act("RankObserve", self._st(PC_OBSERVED, point=point, frontier=self.guard.frontier, tau=self.guard.tau),
                      {"error": repr(exc)[:300], "in_flight": True, "discard": True})
            self._observed_gen = g
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
        g = self.gen
        with self._hold():
            try:
                self.control.publish_revoke(g, self.groups.key)  # peers blocked on R wake up
            except Exception:  # noqa: BLE001 - store lost: the watchdog exits DEADLINE
                pass
            self._act("RankObserve", self._st(PC_OBSERVED, point=point, frontier=self.guard.frontier, tau=self.guard.tau),
                      {"error": repr(exc)[:300], "in_flight": True})
            report = self.guard.check()
            decision = decide(self.envelope, self._key(point), report.ok)
            self._reject(decision.reason, report.reasons)

    # ---- Phase 2: RankGuard / RankReject ----------------------------------------------------------
    def _guard(self, ep: _Episode) -> None:
        """Guard check (no outstanding gradients, wrapper idle, tau == F), then the contract on K."""
        report = self.guard.check()
        decision = decide(self.envelope, self._key("boundary"), report.ok)
        if not decision.preserve:
            self._reject(decision.reason, report.reasons)
        self._act("RankGuard", self._st(PC_GUARDED), {"decision": decision.level, "why": decision.reason})

    # ---- Phase 4: RankReplace --------------------------------------------------------------------
    def _replace(self, ep: _Episode) -> None:
        """Every rank: the groups over all of W for generation g+1 (P18.3: a broken link inside R
        crosses them too, and nothing tells a link from R's communicator alone).  A member of a failed
        group first builds R's generation-(g+1) communicator with the same members (replacement
        strategy); every member of R builds in that order, so no rendezvous waits on a rank that
        waits on it."""
        t = time.monotonic_ns()
        state: dict[str, Any] = {}
        built: list[str] = []
        if ep.member:
            members, key = self._new_members(ep)
            ep.new_pg = self.strategy.replace(self._pg, ep.g + 1, members, self.rank, self.control.store,
                                              self.deadline_s, name=key)
            # the record names the real group object: its c10d name (controlplane.comm_name), which the
            # checker reads the generation from
            state["comm"] = _group_name(ep.new_pg)
            built.append(key)
        built += self._replace_wide(ep.g + 1)
        self._act("RankReplace", self._st(PC_REPLACED, **state, wide=ep.g + 1),
                  {"groups": built, "duration_ns": time.monotonic_ns() - t})

    def _replace_wide(self, g_next: int) -> list[str]:
        """The groups over all of W built for ``g_next`` (the job's :meth:`TrainingJob.rebuild_wide`);
        this engine's control group becomes the new one.  Nothing without a job (a bare engine)."""
        if self.wide is None:
            return []
        names, control, records = self.wide(g_next)
        self.groups = dataclasses.replace(self.groups, control=control, others={**self.groups.others, **records})
        return names

    def _new_members(self, ep: _Episode) -> tuple[tuple[int, ...], str]:
        """R's members in g+1 (the same as in g) and its name in store keys."""
        return self.groups.members, self.groups.key

    def _read_failed(self, ep: _Episode) -> None:
        """After the agreement of an episode whose failure flag failed (P18.4): the failed groups of R's
        kind are those whose revoke stands; every member of a failed group published its group's
        revoke before it arrived, and every rank has arrived."""
        keys = [self.groups.name if self.groups.count == 1 else f"{self.groups.name}{i}" for i in range(self.groups.count)]
        ep.failed = tuple(i for i, k in enumerate(keys) if self.control.revoked(ep.g, k))
        ep.member = self.groups.index in ep.failed

    def _rebind_member(self, ep: _Episode) -> None:
        if ep.member:
            self._rebind(ep)

    def _validate_member(self, ep: _Episode) -> None:
        if ep.member:
            self._validate(ep)

    # ---- Phase 5: RankRebind ---------------------------------------------------------------------
    def _rebind(self, ep: _Episode) -> None:
        """Every cached reference to the old communicator names the new one (sites discovered once,
        at attach), verified: a stale reference is a :class:`RebindError`."""
        t = time.monotonic_ns()
        stale = 0
        # the engine's own reference moves first: it is one of the references to rebind
        old_pg, self._pg, self._record = self._pg, ep.new_pg, self.strategy.last_record
        if self.strategy.needs_rebind:
            stale, total = self._rebind_sites(old_pg, ep.new_pg)
            ep.refs_rebound = total - stale
        retiring = [old_pg]  # this frame's last reference: the old group is destroyed off the critical path
        del old_pg
        self._retiring = [ev for ev in self._retiring if not ev.is_set()] + [_retire_off_path(retiring)]
        self._act("RankRebind", self._st(PC_REBOUND, refs_stale=stale),
                  {"refs_rebound": ep.refs_rebound, "duration_ns": time.monotonic_ns() - t})

    def _rebind_sites(self, old_pg: Any, new_pg: Any) -> tuple[int, int]:
        """Rebind every known site from ``old_pg`` to ``new_pg`` and verify: (stale, total); a stale
        reference left is a :class:`RebindError`."""
        self.adapter.rebind(self.module, self.sites, old_pg, new_pg)
        check = self.adapter.verify_sites(self.sites, old_pg, new_pg)
        if not check.ok:
            raise RebindError(f"{int(check.stale)} of {check.total} cached references still name the old "
                              f"communicator after rebinding: {check.detail}")
        return int(check.stale), int(check.total)

    def _discover(self) -> list:
        """Every cached reference to R reachable from the module: the adapter's sites united with the
        generic walker's (which stops at the engine's own objects), so phase 5 can check them in
        O(sites).  Run at attach and once more after the first committed step, when the wrappers'
        lazily built state (FSDP's lazy init, DDP's reducer) exists."""
        from .runtime.adapters import find_references, site_set

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

    # ---- Phase 6: RankValidate -------------------------------------------------------------------
    def _validate(self, ep: _Episode) -> None:
        """An all-reduce on the new group, then every replica's state checksum compared (one
        all-gather), on the new group's device; each wait bounded by the phase deadline."""
        import torch

        from .runtime.digest import checksum_hex

        t = time.monotonic_ns()
        n = len(self.groups.members)
        device = backend_of(ep.new_pg).device_for(ep.new_pg)
        one = torch.ones(1, device=device)
        wait_bounded(ep.new_pg.allreduce([one]), self.deadline_s)
        if int(one[0]) != n:
            raise ValidationError(f"validation all-reduce on generation-{ep.g + 1} R gave {int(one[0])}, expected {n}")
        mine = _state_checksum(self.module, self.optimizer, device)
        outs = [torch.empty_like(mine) for _ in range(n)]
        wait_bounded(ep.new_pg.allgather([outs], [mine]), self.deadline_s)
        differing = [self.groups.members[i] for i, o in enumerate(outs) if not torch.equal(o, mine)]
        if differing:
            raise ValidationError(f"replica checksums differ from rank {self.rank}'s on rank(s) {differing}: "
                                  "replicas of R do not hold identical shards; restart from the checkpoint (L2)")
        self._act("RankValidate", self._st(PC_VALIDATED),
                  {"digest": checksum_hex(mine), "duration_ns": time.monotonic_ns() - t})

    def _resume(self, ep: _Episode) -> None:
        """RankResume: generation g+1, R's communicator swapped, the old one dropped."""
        ep.new_pg = None
        self.gen = ep.g + 1
        self.watchdog.watch(self.gen, self.groups.key, self._record)
        self.control.retire_revoke(ep.g, self.groups.key)
        self._act("RankResume", self._st(PC_TRAIN, gen=self.gen, point=""), {"from_gen": ep.g}, gen=ep.g)

    # ---- end -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Normal end of training: stop the watchdog, remove the hooks, end the trace."""
        if self._closed:
            return
        self._closed = True
        if self.detector is not None:
            self.detector.close(leave=True)
        self.watchdog.stop()
        self.guard.remove()
        self.trace.end("released", gen=self.gen, frontier=self.guard.frontier)


class SpareEngine(_Engine):
    """A spare's engine for the one episode in which it takes a dead rank's identity: ``SpareJoin``
    (:meth:`join`), then the swap's phases 3-6 as that rank (:meth:`swap`, the same actions a
    survivor runs).  Afterwards the identity trains under a :class:`Pact` of generation g+1 attached
    to the model the episode built; this engine stops.  ``job``: the
    :class:`~accelpact.impl.launch.api.TrainingJob`, already under the dead identity (``job.rank``);
    ``published``: what that rank published at its last commit (F, RNG, extra state).

    Unlike a survivor it has no fault points (a fault plan names the job's ranks at their steps; this
    process held no rank until now) and no step deadline; its watchdog ends it on the job's abort."""

    def __init__(self, job: Any, *, control: ControlPlane, spare: int, generation: int, published: dict,
                 trace=None, hooks: Hooks | None = None, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.job = job
        self.rank = job.rank
        self.control = control
        self.trace = trace if trace is not None else NullTrace()
        self.hooks = hooks if hooks is not None else NO_HOOKS
        self.gen = generation
        self.pc = PC_JOINED
        self.deadline_s = deadline_s
        self.spare = spare
        self.published = published
        self._episode = None
        self._arm()
        self.watchdog = Watchdog(control, trace=self.trace, gen_of=lambda: self.gen, pc_of=lambda: self.pc)

    @property
    def frontier(self) -> int:
        """F of the identity taken: what its predecessor published at its last commit."""
        return int(self.published["frontier"])

    @property
    def tau(self) -> int:
        return self.frontier

    def _at(self, point: str) -> None:
        """No fault points on a spare (see the class doc)."""

    def join(self) -> None:
        """SpareJoin: this process holds the dead rank's identity in its generation, with no state
        yet; then its watchdog runs.  If the job already aborted, it never took the identity: it
        exits on the abort with no record as that rank (the model's SpareJoin needs no abort)."""
        with self._hold():
            reason = self.control.read_abort()
            if not reason:
                self._act("SpareJoin", self._st(PC_JOINED), {"spare": self.spare, "identity": self.rank})
        if reason:
            exit_now(code_for(reason), f"spare {self.spare}: the job aborted ({reason}) before it took rank "
                     f"{self.rank}'s identity", None)
        self.watchdog.start()

    def swap(self, *, point: str, rebuild: Callable[[Any, Any], tuple[Any, Any]], extra: Any) -> tuple[Any, Any, Any]:
        """The swap's phases as the identity taken (:meth:`_Engine._run_swap`), with the claims of the
        episode as they stand; returns the rebuilt module, optimizer and the swap's record."""
        claims = _swap.read_claims(self.control.store, self.gen, self.job.world)
        t = time.monotonic_ns()
        sw = _Swap(role="spare", point=point, dead=tuple(sorted(claims)), job=self.job, rebuild=rebuild, extra=extra,
                   rng=self.published.get("rng"), claims=claims)
        ep = _Episode(self.gen, True, (), t, t, None, swap=sw)
        self._episode = ep
        record = self._run_swap(ep)
        self.watchdog.stop()
        module, optimizer = sw.module, sw.optimizer
        sw.module = sw.optimizer = None
        return module, optimizer, record


def attach(module, optimizer, *, groups: PactGroups, control: ControlPlane, trace=None, envelope=None,
           key: ObservationKey | None = None, deadline_s: float = DEFAULT_DEADLINE_S, adapter=None, frontier: int = 0,
           strategy: ReplacementStrategy | None = None, step_deadline_s: float | None = None,
           hooks: Hooks | None = None, detect: bool = True, dead_after_s: float | None = None,
           hang_threshold_s: float | None = None, generation: int = 0, notices: Any = None,
           discard: bool = False, wide: Callable[[int], tuple[list[str], Any, dict]] | None = None,
           wide_records: Callable[[], list] | None = None, predecessor: Any = None) -> Pact:
    """Discover R's cached references once, install the guard, start the watchdog.  ``predecessor``:
    the retired engine's watchdog (after a swap or a discard), whose abort thread the new one takes
    over (``Watchdog.start(succeed=)``).  ``discard``: the
    caller can rebuild the wrapper (:meth:`Pact.swap`), so a failure in forward or backward is
    discarded in place where the envelope says L1 (P17); without it those cells are L2.

    ``deadline_s`` bounds each wait on peers in phases 2-6; ``step_deadline_s`` bounds a whole step
    (forward to the end of its boundary) before the watchdog takes the rank for hung and exits
    72: default :func:`accelpact.impl.launch.job.default_step_deadline` of R's collective timeout and
    ``deadline_s``; ``math.inf`` turns it off.  ``hooks``: test-only
    (:class:`accelpact.impl.hooks.Hooks`: fault injection at named points, seeded bugs)."""
    return Pact(module, optimizer, groups=groups, control=control, trace=trace, envelope=envelope, key=key,
                deadline_s=deadline_s, adapter=adapter, frontier=frontier, strategy=strategy, hooks=hooks,
                step_deadline_s=step_deadline_s,
                detect=detect, dead_after_s=dead_after_s, hang_threshold_s=hang_threshold_s, generation=generation,
                notices=notices, discard=discard, wide=wide, wide_records=wide_records, predecessor=predecessor)
