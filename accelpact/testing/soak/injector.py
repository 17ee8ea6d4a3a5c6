"""The soak's injector: strikes a schedule's faults on a live job from this process.

It runs in the soak driver, beside the launcher's thread, never in a worker: every fault is an
external primitive on a worker's pid (:mod:`accelpact.testing.inject`) or on the store's process,
found from what the job writes (:class:`~accelpact.testing.soak.live.Live`).  For each fault it
records a :class:`Strike`: when it struck (``time.monotonic_ns()``, the workers' clock: one
machine), what it struck, what the job was doing then (steady training, or which identity was in
which recovery action), or why it could not.

Between faults it samples every live training worker's threads, fds and listening sockets (one per
gloo group) once the job trains steadily again after an episode (:class:`Sample`): the judge looks
for growth across episodes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .. import inject
from .live import Live, links_between, pid_alive, proc_counts
from .schedule import Schedule, SoakFault

__all__ = ["Injector", "Sample", "Strike"]

#: after an episode closed, how long the job must have trained steadily before a leak sample (the
#: retired groups are destroyed off the repair's path, tens of ms later) and before the next fault
SETTLE_S = 1.5
#: while no episode closes, the leak sample of the interval is taken again this often: the judge reads
#: each interval at its floor (the fewest of each count over its samples before its first fault), so
#: what an episode holds for a while after it (a group held by an op of an abandoned step until its
#: collective timeout: see bench/README.md, K6) or what one sample catches in passing (a checkpoint file being written) is
#: not read as growth, while a real leak shows in every later sample
RESAMPLE_S = 10.0
#: how often the injector looks at the run while it waits for a time-triggered fault / for an episode
POLL_S = 0.05
#: after asking a stalled job's processes for their stacks (:func:`inject.dump_stacks`), how long
#: before they are ended: the dumps are written from a signal handler within milliseconds
STACKS_WAIT_S = 2.0
#: at least this long between two time-triggered faults (a late one does not follow the one before at once)
MIN_GAP_S = 3.0
POLL_RECOVERY_S = 0.005


@dataclass
class Strike:
    """What the injector did for one scheduled fault (``met``: it struck)."""

    index: int
    kind: str
    trigger: str
    met: bool = False
    t_ns: int | None = None          # when the primitive was called (monotonic ns)
    t_done_ns: int | None = None     # when it returned (a cut: after the /proc scan and the shutdowns)
    t_end_ns: int | None = None      # a stop's resume, a partition's heal (when it was undone)
    delay_s: float = 0.0             # how much later than scheduled (the job was recovering, or restarting)
    attempt: int | None = None
    identity: int | None = None
    pid: int | None = None
    target: str = ""
    during: str = ""                 # "" = steady training; else what the job was doing (an episode open)
    duration_s: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    why_not: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Sample:
    """A worker's threads, fds and listening sockets, sampled in steady training."""

    t_ns: int
    attempt: int
    identity: int
    pid: int
    episodes_before: int          # episodes of this attempt closed before the sample
    threads: int
    fds: int
    listeners: int
    names: dict[str, int] = field(default_factory=dict)   # threads by kernel name (live.proc_counts)
    fd_kinds: dict[str, int] = field(default_factory=dict)  # fds by kind (live.fd_kinds)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Injector:
    """Strikes ``schedule``'s faults on the job ``live`` watches (module doc)."""

    def __init__(self, schedule: Schedule, live: Live, topology: Any, *, log: Callable[[str], None] = print,
                 stall_s: float = 300.0) -> None:
        self.schedule = schedule
        self.cfg = schedule.config
        self.live = live
        self.topology = topology
        self.log = log
        self.strikes: list[Strike] = []
        self.samples: list[Sample] = []
        self.t0: float | None = None     # training started (monotonic s)
        self._timers: list[threading.Timer] = []
        self._sampled_at: tuple[int, int] = (-1, -1)   # (attempt, closed episodes) of the last sample
        self._sampled_t = 0.0                          # when it was taken (monotonic s)
        self._steady_since: float | None = None
        #: no committed step, no record, no attempt for this long: the job is stalled (:attr:`stalled`)
        self.stall_s = stall_s
        self.stalled: str | None = None
        self._progress: tuple = ()
        self._progress_at = time.monotonic()

    # ---- waiting ------------------------------------------------------------------------------
    def _check_progress(self, now: float) -> None:
        """Raise :class:`_Stalled` when the job made no progress (a committed step, a record, an exit,
        an attempt) for :attr:`stall_s`; :attr:`stalled` then says what every process was doing."""
        res = self.live.results()
        key = (self.live.attempt, self.live.frontier(), sum(len(f.records) for f in self.live.tail.files.values()),
               tuple(sorted((r, str(v.get("outcome"))) for r, v in res.items())))
        if key != self._progress:
            self._progress, self._progress_at = key, now
            return
        if now - self._progress_at < self.stall_s or self.live.finished():
            return
        alive = {r: (v.get("outcome"), v.get("exit_code"), v.get("pid") if pid_alive(v.get("pid")) else "gone")
                 for r, v in sorted(res.items())}
        spares = {k: pid for k, pid in sorted(self.live.idle_spares().items())}
        # what every stuck process was doing, in the launcher's log: each thread's Python stack
        pids = [int(p) for p in [v.get("pid") for v in res.values()] + list(spares.values()) if p is not None]
        asked = [pid for pid in pids if pid_alive(pid) and inject.dump_stacks(pid)]
        if asked:
            time.sleep(STACKS_WAIT_S)
        self.stalled = (f"no committed step, record or exit for {now - self._progress_at:.0f}s in attempt "
                        f"{self.live.attempt} ({self.live.unsteady() or 'steady'}); ranks (outcome, exit code, pid): "
                        f"{alive}; idle spares still waiting: {spares}"
                        + (f"; the Python stacks of pids {asked} are in the launcher's log" if asked else ""))
        raise _Stalled(self.stalled)

    def _tick(self) -> bool:
        """Poll the run; sample leaks when due; True when the job trains steadily (for SETTLE_S)."""
        self.live.poll()
        now = time.monotonic()
        self._check_progress(now)
        if self.live.steady():
            if self._steady_since is None:
                self._steady_since = now
        else:
            self._steady_since = None
        settled = self._steady_since is not None and now - self._steady_since >= SETTLE_S
        if settled:
            self._maybe_sample()
        return settled

    def _closed_episodes(self, attempt: int) -> int:
        gens = {r.get("gen") for r in self.live.tail.records(attempt) if r.get("action") == "RankResume"}
        return len(gens)

    def _maybe_sample(self) -> None:
        a = self.live.attempt
        key = (a, self._closed_episodes(a))
        if key == self._sampled_at and time.monotonic() - self._sampled_t < RESAMPLE_S:
            return
        self._sampled_at, self._sampled_t = key, time.monotonic()
        t = time.monotonic_ns()
        store = [p for p in (self.live.store_port(),) if p]
        for ident, pid in sorted(self.live.pids().items()):
            c = proc_counts(pid, store)
            if c is not None:
                self.samples.append(Sample(t, a, ident, pid, key[1], c["threads"], c["fds"], c["listeners"], c["names"],
                                           c.get("fd_kinds") or {}))

    def wait_training(self, timeout_s: float, done: Callable[[], bool]) -> bool:
        """Wait until every rank committed a step (training started); sets :attr:`t0`."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and not done():
            self.live.poll()
            if self.live.steady():
                self.t0 = time.monotonic()
                return True
            time.sleep(POLL_S)
        return False

    # ---- the run ------------------------------------------------------------------------------
    def run(self, until: float, done: Callable[[], bool]) -> list[Strike]:
        """Strike every fault of the schedule, in order, until the monotonic time ``until`` or the
        job's end (``done()``); afterwards keep sampling until the job ends.  Every later fault is
        recorded as not met, with why."""
        assert self.t0 is not None, "wait_training first"
        faults = list(self.schedule.faults)
        try:
            for i, f in enumerate(faults):
                if done() or time.monotonic() >= until:
                    why = "the job ended before it" if done() else "the soak's time ran out before it"
                    self.strikes.extend(Strike(g.index, g.kind, g.trigger, why_not=why) for g in faults[i:])
                    break
                s = self._time(f, until, done) if f.trigger == "time" else self._recovery(f, until, done)
                self.strikes.append(s)
                self.log(self._line(s))
            while not done():
                self._tick()
                time.sleep(POLL_S)
        except _Stalled:
            self.log(f"  the job is stalled: {self.stalled}")
            done_idx = {x.index for x in self.strikes}
            self.strikes.extend(Strike(g.index, g.kind, g.trigger, why_not="the job stalled before it")
                                for g in faults if g.index not in done_idx)
        self.close()
        return self.strikes

    def close(self) -> None:
        """Undo what is still pending (resume a stopped rank, heal a partition) at once."""
        for t in self._timers:
            if t.is_alive():
                t.cancel()
                fn = getattr(t, "function", None)
                if fn is not None:
                    try:
                        fn(*getattr(t, "args", ()))
                    except Exception:  # noqa: BLE001 - undoing is best effort: the process may be gone
                        pass
        self._timers.clear()

    def _time(self, f: SoakFault, until: float, done: Callable[[], bool]) -> Strike:
        assert self.t0 is not None
        at = self.t0 + f.at_s
        last = max((x.t_ns for x in self.strikes if x.t_ns is not None), default=0) / 1e9
        while not done() and time.monotonic() < until:
            settled = self._tick()
            if time.monotonic() >= max(at, last + MIN_GAP_S) and settled:
                s = self._strike(f)
                s.delay_s = round(max(0.0, time.monotonic() - at), 3)
                return s
            time.sleep(POLL_S)
        return Strike(f.index, f.kind, f.trigger, why_not="the job ended before it" if done() else
                      "the soak's time ran out while the job was not training steadily")

    def _recovery(self, f: SoakFault, until: float, done: Callable[[], bool]) -> Strike:
        prev = self.strikes[-1] if self.strikes else None
        if prev is None or not prev.met:
            return Strike(f.index, f.kind, f.trigger, why_not="the fault before it did not strike")
        end = min(until, time.monotonic() + f.window_s)
        attempt = self.live.attempt
        while not done() and time.monotonic() < end:
            self.live.tail.poll()
            ep = self.live.tail.open_episode(attempt, self.cfg.world)
            if ep and any(rec.get("t_ns", 0) >= (prev.t_ns or 0) for _, rec in ep):
                self.live.poll()
                return self._strike(f)
            if self.live.tail.attempts() and max(self.live.tail.attempts()) > attempt:
                break
            time.sleep(POLL_RECOVERY_S)
        return Strike(f.index, f.kind, f.trigger, why_not=f"no episode was open within {f.window_s:.0f}s of fault "
                                                          f"#{prev.index} (it ended before, or went straight to a restart)")

    # ---- striking -----------------------------------------------------------------------------
    def _strike(self, f: SoakFault) -> Strike:
        s = Strike(f.index, f.kind, f.trigger, attempt=self.live.attempt, duration_s=f.duration_s)
        s.during = self.live.unsteady()
        try:
            getattr(self, f"_do_{f.kind}")(f, s)
        except inject.InjectError as exc:
            s.met, s.why_not = False, f"the primitive refused: {exc}"
        except _NotNow as exc:
            s.met, s.why_not = False, str(exc)
        return s

    def _pid(self, ident: int) -> int:
        pid = self.live.pids().get(ident)
        if pid is None:
            raise _NotNow(f"rank {ident} has no live worker now ({self.live.unsteady() or 'steady'})")
        return pid

    def _target(self, f: SoakFault) -> int:
        """The identity a fault strikes: its own; during an episode, when that one has no live worker
        (the episode's own victim, typically), the next identity that has one."""
        pids = self.live.pids()
        if f.rank in pids or f.trigger != "recovery":
            return f.rank
        for d in range(1, self.cfg.world):
            if (f.rank + d) % self.cfg.world in pids:
                return (f.rank + d) % self.cfg.world
        return f.rank

    def _mark(self, s: SoakFault | Strike, ident: int | None, pid: int, target: str) -> None:
        assert isinstance(s, Strike)
        s.identity, s.pid, s.target = ident, pid, target
        s.t_ns = time.monotonic_ns()

    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        t = threading.Timer(delay_s, fn)
        t.daemon = True
        t.start()
        self._timers.append(t)

    def _do_crash(self, f: SoakFault, s: Strike) -> None:
        ident = self._target(f)
        pid = self._pid(ident)
        self._mark(s, ident, pid, f"rank {ident} (pid {pid})")
        inject.crash(pid)
        s.met, s.t_done_ns = True, time.monotonic_ns()

    def _do_crash_spare(self, f: SoakFault, s: Strike) -> None:
        idle = sorted(self.live.idle_spares().items())
        if not idle:
            raise _NotNow("no spare is idle now")
        k, pid = idle[f.rank % len(idle)]
        self._mark(s, None, pid, f"idle spare {k} (pid {pid})")
        s.detail["spare"] = k
        inject.crash(pid)
        s.met, s.t_done_ns = True, time.monotonic_ns()

    def _do_stop(self, f: SoakFault, s: Strike) -> None:
        ident = self._target(f)
        pid = self._pid(ident)
        self._mark(s, ident, pid, f"rank {ident} (pid {pid})")
        inject.stop(pid)
        s.met, s.t_done_ns = True, time.monotonic_ns()

        def resume() -> None:
            try:
                inject.resume(pid)
                s.detail["resumed"] = True
            except inject.InjectError as exc:
                s.detail["resumed"] = f"no: {exc}"  # deposed (its keeper killed it) or torchrun ended it
            s.t_end_ns = time.monotonic_ns()

        self._later(float(f.duration_s or 2.0), resume)

    def _do_gil_hang(self, f: SoakFault, s: Strike) -> None:
        ident = self._target(f)
        pid = self._pid(ident)
        self._mark(s, ident, pid, f"rank {ident} (pid {pid})")
        inject.gil_hang(pid, float(f.duration_s or 2.0))
        s.met, s.t_done_ns = True, time.monotonic_ns()
        s.t_end_ns = (s.t_ns or 0) + int(float(f.duration_s or 2.0) * 1e9)

    def _do_slow(self, f: SoakFault, s: Strike) -> None:
        pid = self._pid(f.rank)
        self._mark(s, f.rank, pid, f"rank {f.rank} (pid {pid})")
        inject.slow(pid, float(f.duration_s or 1.0), how="sleep")
        s.met, s.t_done_ns = True, time.monotonic_ns()
        s.t_end_ns = (s.t_ns or 0) + int(float(f.duration_s or 1.0) * 1e9)

    def _do_cut_group(self, f: SoakFault, s: Strike) -> None:
        label = self.cfg.recovers if f.group in (None, "R") else f.group
        ident = self._target(f)
        groups = [g for g in self.live.groups(self.topology) if g.label == label and ident in g.members]
        if not groups:
            raise _NotNow(f"rank {ident} has no live {label} group in the store now")
        g = max(groups, key=lambda x: (x.generation, x.prefix))
        pid = self._pid(ident)
        self._mark(s, ident, pid, f"rank {ident}'s {label} group {sorted(g.members)} (pid {pid})")
        cut = inject.cut_links(pid, any_ports=g.ports)
        s.t_done_ns = time.monotonic_ns()
        s.detail.update(group=label, r=label == self.cfg.recovers, members=sorted(g.members), prefix=g.prefix,
                        connections=len(cut))
        s.met = bool(cut)
        if not cut:
            s.why_not = "no connection of that group was open"

    def _do_cut_link(self, f: SoakFault, s: Strike) -> None:
        assert f.peer is not None
        ident = self._target(f)
        peer = f.peer if f.peer != ident else f.rank
        a, b = self._pid(ident), self._pid(peer)
        store = [p for p in (self.live.store_port(),) if p]
        ports = links_between(a, b, store)
        self._mark(s, ident, a, f"every connection between ranks {ident} and {peer} (pids {a}, {b})")
        cut = inject.cut_links(a, remote_ports=ports, except_ports=store) if ports else []
        s.t_done_ns = time.monotonic_ns()
        s.detail.update(peer=f.peer, connections=len(cut))
        s.met = bool(cut)
        if not cut:
            s.why_not = "no connection between them was open"

    def _do_store_loss(self, f: SoakFault, s: Strike) -> None:
        pid = self.live.store_pid()
        if pid is None:
            raise _NotNow("the launcher names no store process (ACCELPACT_STORE_PID)")
        self._mark(s, None, pid, f"the store's process (pid {pid})")
        inject.crash(pid)
        s.met, s.t_done_ns = True, time.monotonic_ns()

    def _do_partition(self, f: SoakFault, s: Strike) -> None:
        raise _NotNow("this launcher starts no rank in a network namespace of its own")

    @staticmethod
    def _line(s: Strike) -> str:
        if not s.met:
            return f"  fault #{s.index} {s.kind}: not met ({s.why_not})"
        where = f"during an episode ({s.during})" if s.during else "in steady training"
        late = f", {s.delay_s:.1f}s late" if s.delay_s >= 1 else ""
        return f"  fault #{s.index} {s.kind}: {s.target}, attempt {s.attempt}, {where}{late}"


class _Stalled(Exception):
    """The job made no progress for the injector's stall bound (:attr:`Injector.stalled` says how)."""


class _NotNow(Exception):
    """The fault cannot strike now (no such target); recorded as not met."""
