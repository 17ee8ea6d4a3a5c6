"""The watchdog: ends this rank when the job aborts, and revokes R when a peer says so.

Why a thread and ``os._exit``: Python signal handlers do not run while the main thread
is blocked in a gloo collective, but ``os._exit`` from another thread ends the process
within a millisecond (spec/torch-facts.md).  Each watcher thread has its own
store connection (``store.clone()``), so a blocked ``wait`` never delays the main
thread's store ops.  Every wait is a bounded slice, re-armed in a loop; the store waits end by their
key being set (``controlplane.KEY_WAIT_S``: a slice that expires makes torch log a ``waitForInput``
warning, so a fault-free run's slices must not expire).

Three daemon threads per rank:

* abort watcher: ``wait([abort])``; on the key, writes ``RankExit`` (model action) with the
  winning reason and ``os._exit(code)``.  If the store is lost (``DistNetworkError`` or any
  error other than a wait timeout) it exits ``DEADLINE``.  Its exit waits for any action the
  main thread is recording (``exitcodes.holding_exit``): a trace never ends between a
  control-plane write and its record.
* revoke watcher: ``wait([g{g}/revoke/{group}])`` for the group this rank is a member of
  in the current generation; on the key it calls :func:`revoke.hard_close` so the main
  thread's pending op on that group fails in milliseconds.
* step deadline (``arm``/``disarm``, model ``RankExpire``): armed when a step starts and disarmed
  when its boundary returns.  If it expires the main thread is taken to be hung: the watchdog
  writes ``abort:deadline`` into the decision of the rank's phase (if still open) and the job
  abort, and exits 72.  Peers time out on a hung rank; this covers the case where nobody is left
  to: every rank hung.  Unlike the abort watcher it acts on no store key, only on time.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
from typing import Any, Callable

from accelpact.model.state import PC_EXITED, PC_TRAIN, REASON_DEADLINE

from .controlplane import CLOSED, KEY_WAIT_S, RETIRED, STEP_REVOKE, WIDE_ENTRY
from .runtime import revoke as _revoke
from .exitcodes import claim_exit, code_for, exit_now, release_exit
from .trace import NullTrace
from .threadname import EngineThread

__all__ = ["Watchdog"]


def _s(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


class _AbortWatch:
    """The thread that waits on the attempt's abort key, for a succession of watchdogs.

    The abort key is the attempt's, not a generation's: when a swap or a discard retires an engine,
    the next engine's watchdog takes over its predecessor's thread (:meth:`adopt`) instead of
    starting one of its own beside it: otherwise each retired engine's abort thread would wait out its
    store slice (up to ``slice_s``) after its stop, a thread and a store connection per retired engine.
    ``owner`` is read under ``lock`` each time the thread acts; the thread ends as
    soon as it finds its owner stopped and nobody adopted it (``ended``), after which :meth:`adopt`
    refuses and the new watchdog starts a thread of its own."""

    def __init__(self, owner: "Watchdog", store: Any, key: str, slice_s: float) -> None:
        self.store, self.key, self.slice_s = store, key, slice_s
        self.lock = threading.Lock()
        self.owner = owner
        self.ended = False
        self.thread = EngineThread(target=self._run, name="accelpact-watchdog-abort", daemon=True)

    def adopt(self, owner: "Watchdog") -> bool:
        """Make ``owner`` the watchdog this thread acts for; False if the thread has ended (or was
        watching another key)."""
        with self.lock:
            if self.ended or owner.control.abort_key != self.key:
                return False
            self.owner = owner
            return True

    def _current(self) -> "Watchdog | None":
        """The owner to act for, or None (and ``ended``) if it stopped and nobody adopted the thread."""
        with self.lock:
            if self.owner._stop.is_set():
                self.ended = True
                return None
            return self.owner

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self.lock:
                self.ended = True

    def _loop(self) -> None:
        """The wait itself holds no reference to the owner: an adopted thread's predecessor (a retired
        engine's watchdog, with its two store connections) is freed at its retire, not at the end of
        the slice this thread was waiting in when it was adopted.  The owner is looked up again at each action."""
        import torch.distributed as dist

        while self._current() is not None:
            try:
                self.store.wait([self.key], datetime.timedelta(seconds=self.slice_s))
            except dist.DistStoreError:
                continue  # slice expired: re-arm
            except Exception as exc:  # noqa: BLE001 - store lost (DistNetworkError, connection reset, ...)
                if (wd := self._current()) is None:
                    return
                print(f"accelpact watchdog: control-plane store lost ({exc!r}); exiting DEADLINE", file=sys.stderr)
                wd.lose_store(exc)
                return
            if self._current() is None:
                return
            try:
                reason = _s(self.store.get(self.key))
            except Exception as exc:  # noqa: BLE001 - store lost between wait and get
                if (wd := self._current()) is not None:
                    wd.lose_store(exc)
                return
            if reason == CLOSED:
                return  # the job ended normally (wake_and_join), not an abort
            claim_exit()
            if (wd := self._current()) is None:  # stopped meanwhile (normal end): never exit after stop()
                release_exit()
                return
            wd.exit_with(reason, claimed=True)
            return


class Watchdog:
    """Started by ``attach``; ``stop()`` before a normal end of the job (then a lost store
    at shutdown is not an error).

    ``gen_of`` returns the rank's current generation (for the ``RankExit`` record).
    """

    def __init__(self, control, *, trace=None, gen_of: Callable[[], int] = lambda: 0,
                 pc_of: Callable[[], str] = lambda: PC_TRAIN, slice_s: float = KEY_WAIT_S, revoke_slice_s: float = 5.0,
                 step_records: Callable[[], list] | None = None, wide_records: Callable[[], list] | None = None,
                 key_wait_s: float = KEY_WAIT_S) -> None:
        self.control = control
        #: the socket records of every training group of this rank (closed on a step revoke)
        self.step_records = step_records
        #: the socket records of this rank's groups over all of W (closed on a wide or a step revoke)
        self.wide_records = wide_records
        self.trace = trace if trace is not None else NullTrace()
        self.gen_of = gen_of
        self.pc_of = pc_of
        self._step_cv = threading.Condition()
        self._step_deadline: float | None = None
        self._step_budget = 0.0
        self.slice_s = slice_s
        self.revoke_slice_s = revoke_slice_s  # the thread waits (events, condition, after a lost store)
        #: the revoke watcher's store wait on its generation's log: ended by a revoke or ``retired``
        #: (:meth:`wake_revoke`, :meth:`wake_and_join`, the release), so a quiet log's slice never expires
        self.key_wait_s = key_wait_s
        self._stop = threading.Event()
        self._target_lock = threading.Lock()
        self._target: tuple[int, str, _revoke.SocketRecord] | None = None
        #: the records of the watched generation's other groups, taken when it was watched: (every
        #: training group, the groups over W).  A revoke of generation g closes g's groups only: read
        #: late (a loaded machine), a step revoke must not close the groups the episode built for g+1,
        #: or the rerun step fails on them and is discarded a second time
        self._snapshot: tuple[tuple, tuple] = ((), ())
        self._target_changed = threading.Event()
        self._wake: tuple[int, str] | None = None  # the watched (generation, group) once detached
        self.revocations: list[tuple[int, str, int, int]] = []  # (gen, group, sockets closed, t_ns)
        #: (gen, sockets closed, t_ns): when this thread closed generation gen's groups over W (a wide or
        #: a step revoke); the failure flag's wait reads it (``Pact._wait_unless_revoked``, ``wide=True``)
        self.wide_revocations: list[tuple[int, int, int]] = []
        self._abort: _AbortWatch | None = None  # made at start: adopted from a predecessor, or its own
        self._revoke_store = control.store.clone()
        self._expire_control = control.on_store(control.store.clone())
        self._threads = [
            EngineThread(target=self._revoke_loop, name="accelpact-watchdog-revoke", daemon=True),
            EngineThread(target=self._expire_loop, name="accelpact-watchdog-expire", daemon=True),
        ]

    def start(self, succeed: "Watchdog | None" = None) -> "Watchdog":
        """Start the threads.  ``succeed``: the watchdog of the engine this one replaces (a swap's or a
        discard's, already stopped): its abort thread is taken over if it still runs (:class:`_AbortWatch`)."""
        prev = succeed._abort if succeed is not None else None
        if prev is not None and prev.adopt(self):
            self._abort = prev
            self._threads.insert(0, prev.thread)
        else:
            self._abort = _AbortWatch(self, self.control.store.clone(), self.control.abort_key, self.slice_s)
            self._threads.insert(0, self._abort.thread)
            self._abort.thread.start()
        for t in self._threads[1:]:
            t.start()
        return self

    def stop(self) -> None:
        """Stop watching (normal end of job).  The daemon threads leave at the end of their
        current wait slice and never exit the process after this call."""
        # under the exit claim: an abort read just before this call either exits first (this call
        # then waits for the process to end, its RankExit recorded) or sees the stop and leaves;
        # without it the abort watcher could exit after the trace ended, leaving no exit record
        claim_exit()
        try:
            self._stop.set()
            self._target_changed.set()
            self.disarm()
        finally:
            release_exit()

    def detach(self) -> None:
        """After :meth:`stop`, for an engine a swap or a discard retired: drop every reference to that
        engine (its generation and pc are kept as values; its socket records and its groups' callbacks
        go), so that its groups are destroyed as soon as nothing else holds them, not when the
        threads' last store-wait slice ends.  :meth:`wake_and_join` still wakes the threads."""
        g, pc = self.gen_of(), self.pc_of()
        self.gen_of = lambda: g
        self.pc_of = lambda: pc
        self.step_records = None
        self.wide_records = None
        with self._target_lock:
            if self._target is not None:
                self._wake = self._target[:2]
            self._target = None
            self._snapshot = ((), ())
            self._target_changed.set()

    def wake_revoke(self) -> None:
        """After :meth:`stop` and :meth:`detach` of an engine retired once its generation was released
        (a swap's, a discard's): retire that generation's revoke log (``ControlPlane.retire_revoke``:
        a standing revoke is left as it is), so the revoke thread leaves now instead of at the end of
        its slice (``revoke_slice_s``); its peers' retired watchers of that generation leave with it.
        A store error is ignored: the thread then leaves at its slice's end, as without this call."""
        with self._target_lock:
            target = self._wake
        if target is None:
            return
        try:
            self.control.retire_revoke(target[0], target[1])
        except Exception:  # noqa: BLE001 - store lost: the abort thread handles it; this one leaves at its slice
            pass

    def wake_and_join(self, timeout_s: float = 5.0) -> bool:
        """After :meth:`stop` on *every* rank (the caller's barrier makes it so): end the threads'
        store waits now instead of at the end of their slices, and join them; True when all ended.

        Why: a daemon thread still inside a C++ store wait when the interpreter finalizes is ended
        by ``pthread_exit`` once the wait returns, and the forced unwind through torch's C++ frames
        aborts the process ("terminate called without an active exception", exit -6).  The abort key is written ``closed`` only if no abort stands (single
        assignment), which no stopped watchdog acts on; the revoke key of the watched generation is
        retired, which watchers ignore."""
        with self._target_lock:
            target = self._target[:2] if self._target is not None else self._wake
        try:
            self.control.store.compare_set(self.control.abort_key, "", CLOSED)
            if target is not None:
                self.control.retire_revoke(target[0], target[1])
        except Exception:  # noqa: BLE001 - store gone at the end: the waits fail on their own
            pass
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # ---- step deadline -------------------------------------------------------------------------
    def arm(self, budget_s: float | None) -> None:
        """Start the step deadline: unless :meth:`disarm` is called within ``budget_s`` seconds
        the rank exits 72 (``RankExpire``).  ``None`` leaves it disarmed."""
        with self._step_cv:
            self._step_deadline = None if budget_s is None else time.monotonic() + budget_s
            self._step_budget = budget_s or 0.0
            self._step_cv.notify()

    def disarm(self) -> None:
        with self._step_cv:
            self._step_deadline = None
            self._step_cv.notify()

    def _expire_loop(self) -> None:
        while not self._stop.is_set():
            with self._step_cv:
                due = self._step_deadline
                wait = self.revoke_slice_s if due is None else due - time.monotonic()
                if wait > 0:
                    self._step_cv.wait(min(wait, self.revoke_slice_s))
                    continue
                self._step_deadline = None  # one expiry per arming
            if not self._stop.is_set():
                self._expire()

    def _expire(self) -> None:
        """RankExpire (model ``_st_expire``): the main thread made no progress within the step
        deadline (see :meth:`_declare_deadline`)."""
        self._declare_deadline("RankExpire", lambda pc, dec: {"pc": pc, "decision": dec, "step_deadline_s": self._step_budget})

    # ---- failure detector ------------------------------------------------------------------
    def suspect(self, peer: int, kind: str, detected_at_ns: int) -> None:
        """RankSuspect (model ``_st_suspect``): the failure detector declared ``peer`` dead (its
        heartbeat stopped: crashed, stopped, or its GIL held) or hung (alive, no progress while this
        rank waits on it).  The job cannot resume with it, so this rank ends the job now rather than
        at a deadline (see :meth:`_declare_deadline`); every survivor's watchdog follows."""
        self._declare_deadline("RankSuspect", lambda pc, dec: {"pc": pc, "decision": dec, "suspect": peer, "kind": kind,
                                                              "detected_at_ns": detected_at_ns})

    def _declare_deadline(self, action: str, detail: Callable[[str, str], dict]) -> None:
        """The one way this thread ends the job on its own: write ``abort:deadline`` into the
        phase's decision and the job abort, record ``action`` (``RankExpire``/``RankSuspect``) and
        exit 72.  Only the first to declare on a decision writes it; if an abort already stands, or
        another abort decided this phase, the abort watcher ends this rank instead (RankExit); a
        lost store is the abort watcher's too (RankLoseStore)."""
        claim_exit()
        cp = self._expire_control
        g, pc = self.gen_of(), self.pc_of()
        which = cp.decision_for(pc)
        try:
            if cp.read_abort() or not cp.first_expirer(g, which):
                release_exit()
                return
            dec = cp.write_abort_decision(g, which, REASON_DEADLINE)
        except Exception:  # noqa: BLE001 - store lost: the abort watcher exits (RankLoseStore)
            release_exit()
            return
        if dec.startswith("abort:") and dec != f"abort:{REASON_DEADLINE}":
            release_exit()  # another abort decided this phase: its job abort follows (RankExit)
            return

        def record() -> None:
            self.trace.action(action, g, "fail", {"pc": PC_EXITED, "reason": REASON_DEADLINE}, detail(pc, dec))
            cp.abort(REASON_DEADLINE)

        exit_now(code_for(REASON_DEADLINE), REASON_DEADLINE, self.trace, record=record, claimed=True)

    # ---- revoke target ---------------------------------------------------------------------
    def watch(self, g: int, group: str, record: _revoke.SocketRecord | None) -> None:
        """Watch ``g{g}/revoke/{group}``; ``record`` is the group's socket record (None: not a member)."""
        steps = tuple(self.step_records()) if self.step_records is not None else ()
        wide = tuple(self.wide_records()) if self.wide_records is not None else ()
        with self._target_lock:
            self._target = (g, group, record) if record is not None else None
            self._snapshot = (steps, wide)
            self._target_changed.set()

    # ---- exits ---------------------------------------------------------------------------------
    def exit_on_abort(self, hint: str, before: Callable[[], None] | None = None) -> None:
        """Exit with the job's abort reason (writing ``hint`` first if no abort stands yet).
        Used by the main thread when it reads (or decided) an abort decision.  ``before`` runs
        once the exit is claimed, before the abort is written (the rank's own action record)."""
        claim_exit()
        if before is not None:
            before()
        try:
            reason = self.control.abort(hint)
        except Exception:  # noqa: BLE001 - store lost: exit with our own reason
            reason = hint
        self.exit_with(reason, claimed=True)

    def exit_with(self, reason: str, *, claimed: bool = False, detail: dict | None = None) -> None:
        """RankExit: record the exit on the job's abort ``reason`` and end the process with its
        code (an unknown reason exits DEADLINE).  ``claimed=True`` if the caller holds the claim."""
        try:
            code = code_for(reason)
        except ValueError:
            code = code_for(REASON_DEADLINE)
        g = self.gen_of()

        def record() -> None:
            self.trace.action("RankExit", g, "fail", {"pc": PC_EXITED, "reason": code.reason}, detail or {"abort": reason})

        exit_now(code, reason, self.trace, record=record, claimed=claimed)

    def lose_store(self, exc: BaseException, *, claimed: bool = False) -> None:
        """RankLoseStore (model ``_st_lose_store``): the store is unreachable (its server is gone),
        so no abort can be written or read: exit 72 on our own."""
        g = self.gen_of()

        def record() -> None:
            self.trace.action("RankLoseStore", g, "fail", {"pc": PC_EXITED, "reason": REASON_DEADLINE},
                              {"error": f"{type(exc).__name__}: {exc}"[:300]})

        exit_now(code_for(REASON_DEADLINE), REASON_DEADLINE, self.trace, record=record, claimed=claimed)

    def _revoke_loop(self) -> None:
        """Read generation g's revoke log (``ControlPlane.revlog_key``) entry by entry, g being the
        watched generation: an entry naming this rank's group closes R; a step revoke (P17) closes
        every group of the rank; ``wide`` (P18.4) closes its groups over W; ``retired`` ends g (its
        release was decided).  Each wait is a ``store.wait`` slice of ``key_wait_s`` (an hour): a revoke
        wakes it within a store round trip, ``retired`` when its generation is released, when a retired
        engine is woken (:meth:`wake_revoke`) and at the job's end (:meth:`wake_and_join`); so in a
        fault-free run no slice expires and torch logs no ``waitForInput`` warning."""
        import torch.distributed as dist

        done: set[int] = set()          # generations whose log ended (released)
        pos: dict[int, int] = {}        # generation -> the next log entry to read (from 1)
        while not self._stop.is_set():
            with self._target_lock:
                target = self._target
                steps, wide = self._snapshot
                self._target_changed.clear()
            if target is None or target[0] in done:
                self._target_changed.wait(self.revoke_slice_s)
                continue
            g, group, record = target
            n = pos.get(g, 1)
            key = self.control.revlog_key(g, n)
            try:
                self._revoke_store.wait([key], datetime.timedelta(seconds=self.key_wait_s))
            except dist.DistStoreError:
                continue
            except Exception:  # noqa: BLE001 - store lost: the abort watcher handles it
                if self._stop.is_set():
                    return
                time.sleep(self.revoke_slice_s)  # store lost: the abort watcher exits the process
                continue
            try:
                value = _s(self._revoke_store.get(key))
            except Exception:  # noqa: BLE001 - store lost between wait and get: the abort watcher handles it
                continue
            pos[g] = n + 1
            with self._target_lock:
                current = self._target
            if current is None or current[0] != g:
                continue  # the generation moved on while we waited: not a revoke of the current one
            if value == RETIRED:
                done.add(g)  # generation g was released
                continue
            entry, sep, suffix = value.partition("/")
            step = sep + suffix == STEP_REVOKE
            mine = entry == group or step
            others: list = []
            if step:
                # an in-flight failure that will be discarded (P17): every group of this rank may have
                # an op of the abandoned step pending; all of them are rebuilt, so all are closed now
                others += steps
            if step or entry == WIDE_ENTRY:
                # a group over all of W failed (P18.4), or every group is rebuilt (P17): a peer may be
                # blocked in the failure flag or a checkpoint save on it
                others += wide
            # one call: an NCCL rank's communicators are aborted together, never one after another
            closed = _revoke.hard_close_all(([record] if mine else []) + [o for o in others if o is not record])
            if mine:
                self.revocations.append((g, group, closed, time.monotonic_ns()))
            if step or entry == WIDE_ENTRY:
                self.wide_revocations.append((g, closed, time.monotonic_ns()))
            self.trace.note("revoke", gen=g, group=entry, sockets=closed, recorded=len(record.sockets))
