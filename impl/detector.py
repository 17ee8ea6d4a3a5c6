"""Failure detector over the control plane: heartbeats through the c10d store (spec/detection.md).

Each rank runs one daemon thread (:class:`Detector`) that, every ``interval_s``:

1. publishes ``{prefix}hb/a{attempt}/{rank}`` = ``"{incarnation}:{counter}:{progress}"`` (``set``:
   not acknowledged, no round trip), ``counter`` incremented on every publish, ``progress`` the
   value the training loop or engine last gave :meth:`Detector.set_progress` / :meth:`Detector.tick`;
2. reads every watched peer's heartbeat with one ``multi_get`` (one round trip);
3. judges each peer:

* **DEAD** (:data:`DEAD`) when its heartbeat has not changed for ``dead_after_s`` of observed time,
  or it never published within ``startup_grace_s`` of the detector's start.  A crashed process
  (SIGKILL) stops publishing; so does a SIGSTOPped one and one whose main thread holds the GIL
  (every Python thread is stuck behind it): those are *dead or stopped*, and both lead to the
  same outcome: the job must not wait for them.
* **HUNG** (:data:`HUNG`) when its heartbeat still changes (the process is alive) but its progress
  counter has not changed for the hang threshold while this rank waits on it: explicitly
  (``with detector.awaiting([peer])``) or, by default, because this rank's own progress is ahead of
  the peer's (in lock-step data parallelism the rank ahead is the one waiting).  The threshold is
  ``hang_threshold_s`` if given, else ``$ACCELPACT_HANG_THRESHOLD_S``, else
  ``max(HANG_FLOOR_S, HANG_K x median own step time)`` (median of the last ``STEP_WINDOW`` step
  times; ``HANG_UNTIL_OBSERVED_S`` until ``MIN_STEP_SAMPLES`` are known: the first steps include
  warm-up), and, when the engine gives the training groups' collective timeout
  (``collective_timeout_s``), never less than it: a rank that is alive and computing (an evaluation
  or a checkpoint to a slow disk on one rank, a ``time.sleep`` in its forward) and a hung one look
  alike from outside, and a slow healthy step is no failure (spec/detection.md), so a peer is not
  judged hung before a collective of the step would have given up on it.  A dead or stopped process
  is found by its heartbeat (DEAD) in about a second regardless; an explicit threshold is used as given.
* A straggler (slow, but its progress advances within the threshold) is never declared.

"Observed time": a poll adds to a peer's silence (or stall) at most ``2 x interval_s``, however long
the gap since the previous poll.  So when the monitor itself was descheduled or stopped, or the
store answered late, the time it did not watch is not counted against its peers: a stopped monitor
resumes without declaring everyone dead.  The cost: detection takes longer by the time not watched.

Time to detect a crash at the defaults (interval 0.1 s, dead_after 0.8 s): the last heartbeat was
published at most one interval before the crash and seen at most one interval after it was
published; the silence reaches ``dead_after_s`` within one more interval: TTD <= dead_after +
2 x interval = 1.0 s (tests/test_detector.py checks it).  Those are gloo's defaults; the defaults
are per backend (``backend=``, :func:`detector_defaults_for`): on NCCL ``dead_after`` is 5.0 s (TTD <= 5.2 s),
since ``Work.is_completed`` polls a CUDA event while holding the GIL and such a query can stall behind
another thread's CUDA call, silencing every Python thread of the rank (spec/nccl.md row 19).

Each suspect is declared once: ``on_suspect(rank, kind, detected_at_ns)`` is called from the
detector's thread (``detected_at_ns`` is ``time.monotonic_ns()``, comparable across processes of
one machine) and the :class:`Suspect` is kept in :attr:`Detector.suspects`.  The detector never
kills or aborts anything itself: the callback decides (spec/detection.md, "Integration").  A
callback's exception is caught and printed; the detector goes on.

Fencing: keys are namespaced by ``attempt`` (and the store's own prefix); a value counts as alive
only when it *changes* after the detector first read it, and each detector publishes under a fresh
random incarnation, so a heartbeat left by a previous attempt or a previous process is never read
as fresh.

Cost: one ``set`` and one ``multi_get`` of the watched peers' keys per interval per rank:
``2 W / interval_s`` store requests per second in all, and per interval ``W x k`` values read, with
k the peers each rank watches: all others up to :data:`ALL_TO_ALL_MAX_WORLD` ranks, the ring's next
:data:`RING_WATCHERS` above (:func:`default_peers`; spec/detection.md, "Store load"), so the total is
O(W) at any world.

The thread has its own store connection (``store.clone()``, made in the constructor, before any
thread starts: it never races :func:`accelpact.impl.runtime.revoke.recorded`) with the operation timeout
``op_timeout_s``.  On torch 2.13 (spec/detection.md, "Stoppable"), a TCPStore call to a server that does not answer (the
store host SIGSTOPped, or this rank partitioned from it) blocks until the server answers, whatever
the timeout (the timeout only logs a warning); a dead server fails the call at once.  So
:meth:`Detector.close` joins for a bounded time and returns False if the thread is still inside
such a call (a daemon thread: it never holds the process up).  A blocked poll declares nothing,
and when it returns the time it was blocked is not observed time (above).  A store error is
counted (:attr:`Detector.store_errors`) and the poll skipped: losing the store is the watchdog's to
act on (it exits the rank).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import secrets
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from .controlplane import PREFIX, heartbeat_key
from .runtime.backends import detector_defaults
from .threadname import EngineThread

__all__ = [
    "ALL_TO_ALL_MAX_WORLD", "DEAD", "DONE", "EPISODE", "HUNG", "RING_WATCHERS", "Detector", "default_peers", "Suspect", "detector_defaults_for", "heartbeat_key", "resolve_hang_threshold",
    "INTERVAL_S", "DEAD_AFTER_S", "HANG_FLOOR_S", "HANG_K", "HANG_UNTIL_OBSERVED_S", "MIN_STEP_SAMPLES",
    "STEP_WINDOW", "STARTUP_GRACE_S", "OP_TIMEOUT_S", "ENV_HANG_THRESHOLD", "ENV_INTERVAL", "ENV_DEAD_AFTER",
]

DEAD = "dead"
HUNG = "hung"

#: heartbeat period (s)
INTERVAL_S = 0.1
#: observed heartbeat silence after which a peer is DEAD (s); TTD <= DEAD_AFTER_S + 2 x INTERVAL_S = 1.0 s
DEAD_AFTER_S = 0.8
#: the derived hang threshold is max(HANG_FLOOR_S, HANG_K x median step time)
HANG_FLOOR_S = 5.0
HANG_K = 10.0
#: the hang threshold until MIN_STEP_SAMPLES own step times are known (warm-up steps are slow)
HANG_UNTIL_OBSERVED_S = 30.0
MIN_STEP_SAMPLES = 3
#: how many recent step times the median is taken over
STEP_WINDOW = 32
#: a peer that never published within this time of the detector's start is DEAD (s)
STARTUP_GRACE_S = 30.0
#: timeout set on the detector's own store connection (s); the default join bound of close() builds on it
OP_TIMEOUT_S = 2.0

ENV_HANG_THRESHOLD = "ACCELPACT_HANG_THRESHOLD_S"
ENV_INTERVAL = "ACCELPACT_HB_INTERVAL_S"
ENV_DEAD_AFTER = "ACCELPACT_DEAD_AFTER_S"


#: the counter field of a last heartbeat published by a rank that ended normally (close(leave=True))
DONE = "done"
#: the counter field of a last heartbeat published by a rank whose engine entered an episode that
#: rebuilds it (close(episode=True), ``Pact.suspend``): its peers stop judging it, as they do a rank
#: that ended.  The episode's waits are bounded by the phase deadline, and a peer that has not yet
#: observed the failure must not read the silence that follows as a death (the model enables
#: ``RankSuspect`` only on a crashed, hung or delayed peer).
EPISODE = "episode"
#: the most silence a rank may announce (:meth:`Detector.quiet`) for a pause of its own Python threads
QUIET_MAX_S = 5.0


def _positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return v


def _setting(name: str, arg: float | None, env: str, default: float) -> float:
    """``arg`` if given, else ``$env`` if set, else ``default``; validated (the error names the source)."""
    if arg is not None:
        return _positive(name, arg)
    raw = os.environ.get(env)
    if raw not in (None, ""):
        return _positive(f"${env}", raw)
    return default


def detector_defaults_for(backend: str | None) -> tuple[float, float]:
    """``(dead_after_s, hang_floor_s)`` on ``backend`` (``impl/runtime/backends.py``
    :func:`~accelpact.impl.runtime.backends.detector_defaults`: NCCL's silence bound is longer, a GIL held
    by ``Work.is_completed``'s CUDA event query stops every Python thread, spec/nccl.md row 19); None:
    :data:`DEAD_AFTER_S`, :data:`HANG_FLOOR_S`."""
    if backend is None:
        return DEAD_AFTER_S, HANG_FLOOR_S
    return detector_defaults(backend)


def resolve_hang_threshold(step_times: Iterable[float], *, override: float | None = None, floor_s: float = HANG_FLOOR_S,
                           k: float = HANG_K, until_observed_s: float = HANG_UNTIL_OBSERVED_S,
                           min_samples: int = MIN_STEP_SAMPLES, collective_timeout_s: float | None = None) -> float:
    """The hang threshold: ``override`` if given, else ``max(floor_s, k x median(step_times))``, or
    ``max(floor_s, until_observed_s)`` while fewer than ``min_samples`` step times are known; a
    derived one is at least ``collective_timeout_s`` when given (a slow healthy rank is not hung)."""
    if override is not None:
        return override
    times = list(step_times)
    derived = max(floor_s, until_observed_s) if len(times) < min_samples else max(floor_s, k * statistics.median(times))
    return max(derived, collective_timeout_s or 0.0)


@dataclass(frozen=True, slots=True)
class Suspect:
    """A declared peer: ``kind`` :data:`DEAD` or :data:`HUNG`; ``observed_s``: the heartbeat silence
    (DEAD) or progress stall (HUNG) that decided it; ``threshold_s``: the bound it passed;
    ``progress``: the peer's last published progress (None: never seen)."""

    rank: int
    kind: str
    detected_at_ns: int
    observed_s: float
    threshold_s: float
    progress: int | None


@dataclass(slots=True)
class _Peer:
    value: bytes | None = None  # last heartbeat read (raw)
    progress: int | None = None
    silent_s: float = 0.0  # observed time since the heartbeat last changed
    stalled_s: float = 0.0  # observed time awaited since the progress last changed


#: Up to this many ranks every rank watches every other (a suspect is seen by all at once); above,
#: each watches the next :data:`RING_WATCHERS` ranks of the ring, so the store's load is O(W) in all,
#: not O(W^2) values per interval (issue 40; spec/detection.md "Store load").
ALL_TO_ALL_MAX_WORLD = 8
#: How many ranks watch each rank in the ring neighbourhood: two, so one death beside another is
#: still seen by a live watcher.
RING_WATCHERS = 2


def default_peers(rank: int, world: int) -> list[int]:
    """The ranks ``rank`` watches by default: every other rank up to :data:`ALL_TO_ALL_MAX_WORLD`
    ranks, else its :data:`RING_WATCHERS` successors on the ring (each rank is then watched by as
    many; a suspect one watcher finds is job-wide, since the suspicion is written to the store)."""
    if world <= ALL_TO_ALL_MAX_WORLD:
        return [p for p in range(world) if p != rank]
    return sorted({(rank + d) % world for d in range(1, RING_WATCHERS + 1)})


class Detector:
    """Heartbeat failure detector of one rank (see the module doc).

    ``store``: a c10d store (TCPStore or PrefixStore); the thread uses a clone of it.  ``peers``:
    the ranks to watch (default :func:`default_peers`: every other rank up to
    :data:`ALL_TO_ALL_MAX_WORLD` ranks, the ring's next :data:`RING_WATCHERS` above).  ``interval_s``/``dead_after_s``:
    argument, else ``$ACCELPACT_HB_INTERVAL_S``/``$ACCELPACT_DEAD_AFTER_S``, else the defaults.
    ``hang_threshold_s``: fixed threshold (else ``$ACCELPACT_HANG_THRESHOLD_S``, else derived).
    ``auto_await``: a peer whose progress is behind this rank's counts as awaited.
    ``clock``: monotonic seconds (tests pass a fake one and call :meth:`poll` themselves).
    ``backend``: the collective backend the rank trains on (``"gloo"``, ``"nccl"``): its defaults for
    ``dead_after_s`` and ``hang_floor_s`` (:func:`detector_defaults_for`; None: :data:`DEAD_AFTER_S`,
    :data:`HANG_FLOOR_S`, gloo's).  ``epoch``: the engine generation this detector belongs to
    (:func:`~accelpact.impl.controlplane.heartbeat_key`): detectors of one epoch read only each other,
    so a peer still rebuilding after a swap is awaited within the startup grace, never judged silent
    on its previous engine's last heartbeat.  ``collective_timeout_s``: the training groups' collective
    timeout (the engine passes it; None: not known): a derived hang threshold is never below it (a
    slow healthy rank is not hung, see the module doc); a given one is not changed.
    """

    def __init__(self, store: Any, rank: int, world: int, *, attempt: int = 0, prefix: str = PREFIX,
                 on_suspect: Callable[[int, str, int], None] | None = None, peers: Iterable[int] | None = None,
                 interval_s: float | None = None, dead_after_s: float | None = None,
                 hang_threshold_s: float | None = None, hang_floor_s: float | None = None, hang_k: float = HANG_K,
                 hang_until_observed_s: float = HANG_UNTIL_OBSERVED_S, startup_grace_s: float = STARTUP_GRACE_S,
                 op_timeout_s: float = OP_TIMEOUT_S, auto_await: bool = True,
                 clock: Callable[[], float] = time.monotonic, clone: bool = True, backend: str | None = None,
                 epoch: int = 0, collective_timeout_s: float | None = None) -> None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be a positive integer, got {world!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ValueError(f"rank must be an integer in [0, {world - 1}], got {rank!r}")
        watched = default_peers(rank, world) if peers is None else sorted(set(peers))
        bad = [p for p in watched if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < world or p == rank]
        if bad:
            raise ValueError(f"peers must be other ranks in [0, {world - 1}] (not {rank} itself), got {bad}")
        self.rank, self.world, self.attempt, self.prefix = rank, world, attempt, prefix
        self.peers: tuple[int, ...] = tuple(watched)
        self.interval_s = _setting("interval_s", interval_s, ENV_INTERVAL, INTERVAL_S)
        default_dead, default_floor = detector_defaults_for(backend)
        self.backend = backend
        self.dead_after_s = _setting("dead_after_s", dead_after_s, ENV_DEAD_AFTER, default_dead)
        env_hang = os.environ.get(ENV_HANG_THRESHOLD)
        self._hang_override = (_positive("hang_threshold_s", hang_threshold_s) if hang_threshold_s is not None
                               else _positive(f"${ENV_HANG_THRESHOLD}", env_hang) if env_hang not in (None, "") else None)
        self.hang_floor_s = _positive("hang_floor_s", default_floor if hang_floor_s is None else hang_floor_s)
        self.hang_k = _positive("hang_k", hang_k)
        self.hang_until_observed_s = _positive("hang_until_observed_s", hang_until_observed_s)
        self.startup_grace_s = _positive("startup_grace_s", startup_grace_s)
        self.collective_timeout_s = None if collective_timeout_s is None else _positive("collective_timeout_s", collective_timeout_s)
        self.op_timeout_s = _positive("op_timeout_s", op_timeout_s)
        self.auto_await = auto_await
        self.on_suspect = on_suspect
        self.clock = clock
        self.incarnation = secrets.token_hex(4)
        self.epoch = epoch
        self.key = heartbeat_key(rank, attempt, prefix, epoch)
        self._keys = {p: heartbeat_key(p, attempt, prefix, epoch) for p in self.peers}
        self.store = self._own_store(store) if clone else store

        self._lock = threading.Lock()
        self._progress = 0
        self._progress_t: float | None = None
        self._step_times: collections.deque[float] = collections.deque(maxlen=STEP_WINDOW)
        self._awaiting: frozenset[int] | None = None  # explicit (awaiting()); None: auto
        self._counter = 0
        self._quiet_ms = 0  # a pause announced by quiet(): published in the counter field (q{ms})
        self._state = {p: _Peer() for p in self.peers}
        self._started: float | None = None
        self._last_poll: float | None = None
        self.suspects: dict[int, Suspect] = {}
        self.left: set[int] = set()  # peers that ended normally or entered an episode (DONE, EPISODE)
        self.store_errors = 0
        self.last_store_error: str | None = None
        self.callback_errors: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: held by a poll over its store calls, and by close's last heartbeat: no heartbeat of the
        #: thread is published after the last one (the set is not acknowledged: two in flight could
        #: reach the store in either order)
        self._io = threading.Lock()

    def _own_store(self, store: Any) -> Any:
        own = store.clone() if hasattr(store, "clone") else store
        if hasattr(own, "set_timeout"):
            own.set_timeout(datetime.timedelta(seconds=self.op_timeout_s))
        return own

    # ---- training loop / engine side ----------------------------------------------------------------
    def set_progress(self, n: int) -> None:
        """This rank's progress counter (e.g. the committed step).  Each increase is also a step time
        sample for the derived hang threshold."""
        now = self.clock()
        with self._lock:
            prev, t_prev = self._progress, self._progress_t
            if n != prev:
                if t_prev is not None and n > prev:
                    self._step_times.append((now - t_prev) / (n - prev))
                self._progress, self._progress_t = int(n), now
            elif t_prev is None:
                self._progress_t = now

    def tick(self) -> None:
        """One more unit of progress (``set_progress(progress + 1)``)."""
        self.set_progress(self.progress + 1)

    @property
    def progress(self) -> int:
        return self._progress

    @contextlib.contextmanager
    def awaiting(self, ranks: Iterable[int] | None = None) -> Iterator["Detector"]:
        """While inside, this rank waits on ``ranks`` (None: every watched peer): only they can be
        declared HUNG (auto-await is off meanwhile)."""
        prev = self._awaiting
        self._awaiting = frozenset(self.peers if ranks is None else ranks)
        try:
            yield self
        finally:
            self._awaiting = prev

    def hang_threshold_s(self) -> float:
        """The hang threshold in force now (see the module doc).

        Takes no lock: the poll thread calls it, and it must never wait on a lock the main thread may
        hold (a main thread stopped inside :meth:`set_progress` by a signal handler or a hang would
        otherwise silence this rank's heartbeat, and its peers would declare it DEAD instead of HUNG).
        Copying the deque is atomic under the GIL."""
        times = _snapshot(self._step_times)
        return resolve_hang_threshold(times, override=self._hang_override, floor_s=self.hang_floor_s, k=self.hang_k,
                                      until_observed_s=self.hang_until_observed_s,
                                      collective_timeout_s=self.collective_timeout_s)

    # ---- the thread ---------------------------------------------------------------------------------
    def start(self) -> "Detector":
        if self._thread is not None:
            raise RuntimeError("Detector.start: already started")
        self._started = self.clock()
        self._thread = EngineThread(target=self._run, name=f"accelpact-detector-r{self.rank}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> str:
        """The heartbeat's value: incarnation, counter (with ``q{ms}`` while a pause is announced), progress."""
        quiet = f"q{self._quiet_ms}" if self._quiet_ms else ""
        return f"{self.incarnation}:{self._counter}{quiet}:{self._progress}"

    @contextlib.contextmanager
    def quiet(self, seconds: float):
        """Announce a pause of this rank's Python threads of up to ``seconds`` (at most
        :data:`QUIET_MAX_S`) for the block's duration: a heartbeat saying so is published before the
        block runs, and a peer allows that much silence before it judges the rank DEAD (and
        :meth:`beating` counts it as beating).  For work that holds the GIL on purpose, such as a full
        garbage collection after an episode (``retire.collect_off_path``: hundreds of milliseconds,
        above ``dead_after_s`` on a loaded machine); a stopped or dead process publishes nothing and is
        found as before.  Usable from any thread; a closed detector announces nothing."""
        ms = int(min(max(float(seconds), 0.0), QUIET_MAX_S) * 1000)
        announced = False
        if ms and not self._stop.is_set() and self._io.acquire(timeout=self.op_timeout_s):
            try:
                self._quiet_ms = ms
                self._counter += 1
                self.store.set(self.key, self._beat())
                announced = True
            except Exception:  # noqa: BLE001 - a lost store: the watchdog acts on it; the pause goes on unannounced
                self._quiet_ms = 0
            finally:
                self._io.release()
        try:
            yield
        finally:
            if announced:
                self._quiet_ms = 0  # the next poll publishes an ordinary heartbeat

    def close(self, timeout_s: float | None = None, *, leave: bool = False, episode: bool = False) -> bool:
        """Stop the thread and join it (at most ``timeout_s``, default ``op_timeout_s + 2 x
        interval_s + 1``); True when it ended, False when it is still blocked in a store call to an
        unresponsive store (see the module doc).  ``leave=True`` (a normal end of the job) first
        publishes a last heartbeat saying :data:`DONE`, so peers still finishing never suspect this
        rank; ``episode=True`` one saying :data:`EPISODE` (this engine is suspended for an episode that
        rebuilds it), so peers still training never read its silence as a death.  The last heartbeat
        waits at most ``op_timeout_s`` for a poll in progress and is skipped past that (the store is
        unresponsive: nobody reads it either).  Idempotent."""
        last = DONE if leave else EPISODE if episode else None
        first = not self._stop.is_set()
        self._stop.set()  # a poll that starts after this publishes nothing
        if last is not None and first and self._io.acquire(timeout=self.op_timeout_s):
            try:
                self.store.set(self.key, f"{self.incarnation}:{last}:{self._progress}")
            except Exception:  # noqa: BLE001 - store gone at the end: nobody is left to suspect us
                pass
            finally:
                self._io.release()
        t = self._thread
        if t is None:
            return True
        t.join(self.op_timeout_s + 2 * self.interval_s + 1.0 if timeout_s is None else timeout_s)
        return not t.is_alive()

    def beating(self, peers: Iterable[int], gap_s: float | None = None) -> set[int]:
        """Which of ``peers`` are alive by their heartbeats, judged now from two reads ``gap_s`` apart
        (default 3 x ``interval_s``) on this detector's own store connection, so a closed detector
        answers too: a heartbeat that moved between the reads, or one that says the peer's engine
        entered an episode (:data:`EPISODE`: it is on its way to the episode's barrier).  A peer that
        never published, ended (:data:`DONE`) or whose heartbeat stood still (dead, stopped, or a
        held GIL) is not beating.  Unlike :meth:`poll` this declares nothing."""
        keys = {p: self._keys.get(p) or heartbeat_key(p, self.attempt, self.prefix, self.epoch)
                for p in peers if p != self.rank and 0 <= p < self.world}  # watched or not: any rank's beat is readable
        ranks = list(keys)

        def read() -> dict[int, bytes]:
            seen = [p for p in ranks if self.store.check([keys[p]])]
            got = self.store.multi_get([keys[p] for p in seen]) if seen else []
            return {p: bytes(v) for p, v in zip(seen, got, strict=True)}

        first = read()
        time.sleep(3 * self.interval_s if gap_s is None else gap_s)
        second = read()
        return {p for p, raw in second.items()
                if _mark_of(raw) == EPISODE or _quiet_of(raw) > 0 or (_mark_of(raw) != DONE and first.get(p) not in (None, raw))}

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Detector":
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a lost or slow store: counted; the watchdog acts on a lost store
                self.store_errors += 1
                self.last_store_error = repr(exc)[:300]
                self._last_poll = None  # the time until the next good poll is not observed time
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    # ---- one poll -------------------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> list[Suspect]:
        """Publish this rank's heartbeat, read the peers', judge them; the suspects declared by this
        poll.  Called by the thread every interval (tests call it directly with a fake clock)."""
        if self._started is None:
            self._started = self.clock()
        with self._io:
            if self._stop.is_set():
                return []  # closed: its last heartbeat stands
            self._counter += 1
            self.store.set(self.key, self._beat())
            values = self._read()
        now = self.clock() if now is None else now
        credit = 0.0 if self._last_poll is None else min(max(now - self._last_poll, 0.0), 2 * self.interval_s)
        self._last_poll = now
        self.polls += 1
        threshold = self.hang_threshold_s()
        declared: list[Suspect] = []
        own = self._progress
        awaited = self._awaiting
        for p in self.peers:
            if p in self.suspects or p in self.left:
                continue
            st, raw = self._state[p], values.get(p)
            if raw is not None and _mark_of(raw) in (DONE, EPISODE):
                self.left.add(p)  # ended normally, or in an episode that rebuilds its engine
                continue
            if raw is None:  # never published
                if now - self._started >= self.startup_grace_s:
                    declared.append(self._declare(p, DEAD, now - self._started, self.startup_grace_s))
                continue
            if raw != st.value:
                first = st.value is None
                st.value, st.silent_s = raw, 0.0
                prog = _progress_of(raw)
                if prog != st.progress:
                    st.progress, st.stalled_s = prog, 0.0
                elif not first:
                    st.stalled_s = self._stall(st, p, own, awaited, credit)
            else:
                st.silent_s += credit
                allowed = max(self.dead_after_s, _quiet_of(raw))  # a pause the peer announced (quiet)
                if st.silent_s >= allowed:
                    declared.append(self._declare(p, DEAD, st.silent_s, allowed))
                    continue
                st.stalled_s = self._stall(st, p, own, awaited, credit)
            if st.stalled_s >= threshold:
                declared.append(self._declare(p, HUNG, st.stalled_s, threshold))
        return declared

    def _stall(self, st: _Peer, p: int, own: int, awaited: frozenset[int] | None, credit: float) -> float:
        waiting = (p in awaited) if awaited is not None else (self.auto_await and st.progress is not None and own > st.progress)
        return st.stalled_s + credit if waiting else 0.0

    def _read(self) -> dict[int, bytes]:
        """The watched peers' heartbeats: one ``multi_get`` of those already seen (a missing key would
        block it), plus a ``check`` of the unseen ones (startup only)."""
        gone = self.suspects.keys() | self.left
        seen = [p for p in self.peers if self._state[p].value is not None and p not in gone]
        unseen = [p for p in self.peers if self._state[p].value is None and p not in gone]
        if unseen:
            if self.store.check([self._keys[p] for p in unseen]):
                seen += unseen
            else:
                seen += [p for p in unseen if self.store.check([self._keys[p]])]
        if not seen:
            return {}
        got = self.store.multi_get([self._keys[p] for p in seen])
        return {p: bytes(v) for p, v in zip(seen, got, strict=True)}

    def _declare(self, p: int, kind: str, observed: float, threshold: float) -> Suspect:
        s = Suspect(p, kind, time.monotonic_ns(), observed, threshold, self._state[p].progress)
        self.suspects[p] = s
        if self.on_suspect is not None:
            try:
                self.on_suspect(p, kind, s.detected_at_ns)
            except Exception as exc:  # noqa: BLE001 - a failing callback must not stop the detector
                self.callback_errors.append(repr(exc)[:300])
                print(f"accelpact detector: on_suspect({p}, {kind!r}) raised {exc!r}", file=sys.stderr)
        return s

    def status(self) -> dict[int, dict[str, Any]]:
        """Per watched peer: last progress, observed silence and stall, and whether declared (debugging)."""
        return {p: {"progress": st.progress, "silent_s": round(st.silent_s, 3), "stalled_s": round(st.stalled_s, 3),
                    "suspect": self.suspects[p].kind if p in self.suspects else None} for p, st in self._state.items()}


def _snapshot(times: "collections.deque[float]") -> list[float]:
    """A copy of ``times`` without a lock; retried if a writer mutated it during the copy."""
    for _ in range(100):
        try:
            return list(times)
        except RuntimeError:  # "deque mutated during iteration"
            continue
    return []


def _mark_of(raw: bytes) -> str:
    """A heartbeat's counter field: a number, or a last heartbeat's :data:`DONE` / :data:`EPISODE`."""
    parts = raw.split(b":")
    return parts[1].decode(errors="replace") if len(parts) > 1 else ""


def _quiet_of(raw: bytes) -> float:
    """The pause a heartbeat announces (:meth:`Detector.quiet`), in seconds; 0.0 for none."""
    mark = _mark_of(raw)
    _, q, ms = mark.partition("q")
    if not q:
        return 0.0
    try:
        return min(int(ms), int(QUIET_MAX_S * 1000)) / 1000.0
    except ValueError:
        return 0.0


def _progress_of(raw: bytes) -> int | None:
    try:
        return int(raw.decode().rsplit(":", 1)[1])
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
