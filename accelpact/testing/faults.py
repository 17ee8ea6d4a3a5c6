"""The fault injector: how each fault kind takes effect in a rank, and the test hooks that fire them.

The vocabulary (points, kinds, the ``Fault`` record and its validator) is :mod:`accelpact.model.faults`;
this module gives each kind a scenario or a job may name its effect (:data:`EFFECTS`), and fires a
job's faults at the engine's named points through the one interface tests have into the engine,
:class:`~accelpact.impl.hooks.Hooks` (:class:`FaultInjector`, :func:`hooks_for`, :func:`fault_hooks`).
Every injected fault first writes its ``Fault*`` trace record (outcome ``info``: its effect is still
to come), then takes effect with a real mechanism:

* ``collective_timeout``: the named group breaks on ``ranks``: a thread of the injector shuts its
  connected sockets down (:func:`revoke.hard_close`), the mechanism that breaks a gloo group for
  real; the rank then meets a real failed collective (the engine is not told).
* ``link_cut``: every connection between two ranks (``ranks: [a, b]``) is shut down, as a broken link
  between their nodes: every group across it fails, whatever its kind (:func:`inject.cut_link`).
* ``crash``: SIGKILL self.  ``hang``: the main thread sleeps forever (the watchdog still runs).
* ``exception``: raise :class:`InjectedFault` (an ordinary error, not a communication failure) at the point.
* ``frontier_mismatch``: the rank's guard counts one more committed step (F+1, tau+1).
* ``dirty_guard``: leave a ``.grad`` on a parameter and mark the wrapper busy.

No effect returns anything for the engine to apply, and the engine never learns that a fault was
scheduled: it meets what a real fault leaves behind.

No torch import at module level.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from accelpact.model.faults import FAULT_POINTS, KINDS, Fault, FaultError, parse_faults

from ..impl.runtime import revoke
from ..impl.hooks import Hooks
from ..impl.launch.launch import STORE_PID_ENV
from . import seeded
from .inject import GIL_HANG_SIGNAL, cut_link
from .nccl_timeout import nccl_timeout

__all__ = [
    "EFFECTS", "FENCED_POINTS", "FaultContext", "FaultInjector", "FaultPlan", "InjectedFault", "fault_hooks", "hooks_for",
    "pid_key",
]


class InjectedFault(Exception):
    """Raised by an injected ``exception`` fault: an ordinary error (a bug), not a communication
    failure; the engine classifies it as it would any such error."""


# -------------------------------------------------------------------------------------------- effects
def _group_fail(fault: "Fault", ctx: "FaultContext") -> None:
    rec = ctx.groups.get(fault.group)
    if rec is None:
        raise FaultError(f"collective_timeout: rank {ctx.rank} has no group named {fault.group!r}; known: {sorted(ctx.groups)}")
    # The cut comes from another thread, as a link failure comes from outside the rank's code path,
    # and is complete before the rank goes on: its next collective on the group meets it (a peer's
    # op fails at once; this rank's own op on its shut-down sockets usually does too, and otherwise
    # the peers' revoke ends it REVOKE_GRACE_S after: gloo may notice a cut made while no op was
    # pending only at its timeout, about one run in a dozen, spec/detection.md).  A cut delayed
    # until the op is pending comes too late at the boundary: the all-reduce takes about 1 ms.
    cut = threading.Thread(target=revoke.hard_close, args=(rec,), name="accelpact-fault-cut", daemon=True)
    cut.start()
    cut.join(timeout=10)


def pid_key(prefix: str, rank: int) -> str:
    """Where a rank's process publishes its pid for the test injector (:class:`FaultInjector`)."""
    return f"{prefix}inject/pid/{rank}"


def _link_cut(fault: "Fault", ctx: "FaultContext") -> None:
    """Every TCP connection between ranks ``a`` and ``b`` is shut down, from ``a``'s side (a shutdown
    acts on the shared socket: both ends fail), as a broken link between their nodes does: every
    group the two share fails (their replicate group if they share one, the world, default, control
    and checkpoint groups), each keeps its connections to everyone else and to the store.  By another
    thread, complete before the rank goes on; the engine is not told which groups broke."""
    a, b = fault.ranks
    if ctx.rank != a:
        return
    ctx.store.wait([pid_key(ctx.prefix, b)], datetime.timedelta(seconds=60))
    peer = int(ctx.store.get(pid_key(ctx.prefix, b)))
    done: list = []
    cut = threading.Thread(target=lambda: done.append(cut_link(os.getpid(), peer, allow_self=True)),
                           name="accelpact-fault-cut", daemon=True)
    cut.start()
    cut.join(timeout=10)
    if not done or not done[0]:
        raise FaultError(f"link_cut: rank {a} found no connection to rank {b} (pid {peer}) to cut")


def _nccl_timeout_fault(fault: "Fault", ctx: "FaultContext") -> None:
    """NCCL only: the group's boundary collective queued behind a device spin longer than its timeout
    (a genuine NCCL timeout, :mod:`accelpact.testing.nccl_timeout`; elsewhere a FaultError naming why)."""
    nccl_timeout(fault, ctx)


def _crash(fault: "Fault", ctx: "FaultContext") -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached


def _stop(fault: "Fault", ctx: "FaultContext") -> None:
    """SIGSTOP self: every thread stops (the watchdog and the heartbeat too); only a peer's failure
    detector can notice, and only the supervisor's SIGKILL ends it."""
    os.kill(os.getpid(), signal.SIGSTOP)


def _gil_hang(fault: "Fault", ctx: "FaultContext") -> None:
    """Raise the harness's GIL-hang signal (accelpact/testing/inject.py, installed by the worker): at the main
    thread's next bytecode its handler holds the GIL forever, so no other Python thread (watchdog,
    heartbeat) runs either."""
    os.kill(os.getpid(), GIL_HANG_SIGNAL)


def _hang(fault: "Fault", ctx: "FaultContext") -> None:
    while True:
        time.sleep(3600)


def _raise(fault: "Fault", ctx: "FaultContext") -> None:
    raise InjectedFault(f"injected exception at {fault.at} of step {fault.step} on rank {ctx.rank}")


def _mismatch(fault: "Fault", ctx: "FaultContext") -> None:
    """The rank committed one step more than its peers: its guard counts F+1 (and tau+1)."""
    ctx.guard.tau += 1
    ctx.guard.frontier += 1


def _dirty_guard(fault: "Fault", ctx: "FaultContext") -> None:
    import torch

    for p in ctx.module.parameters() if ctx.module is not None else ():
        p.grad = torch.zeros_like(p)
        break
    if ctx.guard is not None:
        ctx.guard.mark_busy(f"injected dirty_guard at {fault.at}")


def _corrupt_state(fault: "Fault", ctx: "FaultContext") -> None:
    """Flip one bit of the first element of this rank's local shard of its first parameter, in
    place (silent data corruption after the commit: its replicas now disagree)."""
    import torch

    p = next(iter(ctx.module.parameters()))
    local = p.to_local() if hasattr(p, "to_local") else p
    with torch.no_grad():
        bits = local.data.view(torch.int32 if local.element_size() == 4 else torch.int16).reshape(-1)
        bits[0] ^= 1 << 10


def _store_loss(fault: "Fault", ctx: "FaultContext") -> None:
    """SIGKILL the process serving the job's store (the loss of the store's host): its pid comes
    from the launcher (:func:`accelpact.impl.launch.launch.run_restarting`)."""
    pid = os.environ.get(STORE_PID_ENV)
    if not pid:
        raise FaultError(f"store_loss: the job's store is not served by a process of its own ({STORE_PID_ENV} unset); "
                         "launch it with accelpact.impl.launch.launch.run_restarting")
    os.kill(int(pid), signal.SIGKILL)


#: Set by a launcher that runs each rank in a network namespace of its own (accelpact/testing/netns.py
#: ``Fabric``): the hub namespace holding the bridge, and this rank's veth end on it.
NETNS_HUB_ENV = "ACCELPACT_NETNS_HUB"
NETNS_LINK_ENV = "ACCELPACT_NETNS_LINK"


def _partition(fault: "Fault", ctx: "FaultContext") -> None:
    """A silent partition of the rank: every frame to and from it dropped, no reset, its store
    connection included.  On a network fabric (the launcher names the rank's link: NETNS_HUB_ENV,
    NETNS_LINK_ENV) the rank's veth is set down in the hub (netns.Fabric.partition).  Without one
    (the conformance runner starts every rank in one namespace) it is what the peers see of it:
    silence on every connection with the sockets left open, so the rank stops itself (SIGSTOP), as
    ``stop`` does; to the protocol both are a rank that takes no further step (spec/scenario-format.md)."""
    hub, link = os.environ.get(NETNS_HUB_ENV), os.environ.get(NETNS_LINK_ENV)
    if hub and link:
        subprocess.run(["ip", "-n", hub, "link", "set", link, "down"], check=True, timeout=30, capture_output=True)
        return
    os.kill(os.getpid(), signal.SIGSTOP)



#: scenario kind -> how it takes effect in the rank it strikes (every kind of ``accelpact.model.faults.KINDS``)
EFFECTS: dict[str, Callable[[Fault, "FaultContext"], None]] = {
    "collective_timeout": _group_fail, "nccl_timeout": _nccl_timeout_fault, "crash": _crash, "stop": _stop,
    "gil_hang": _gil_hang, "partition": _partition, "hang": _hang, "exception": _raise, "frontier_mismatch": _mismatch,
    "dirty_guard": _dirty_guard, "corrupt_state": _corrupt_state, "store_loss": _store_loss, "link_cut": _link_cut,
}


# ------------------------------------------------------------------------------------------- injector
@dataclass(slots=True)
class FaultContext:
    """What a fault may touch: filled in by the hook that fires it."""

    trace: Any
    rank: int
    gen: int
    state: dict
    groups: dict  # group name -> revoke.SocketRecord of this rank's group of that name
    guard: Any = None
    module: Any = None
    store: Any = None      # the control-plane store (the injector's own channel: where ranks publish their pids)
    prefix: str = ""


@dataclass(slots=True)
class FaultPlan:
    """The faults one attempt injects; each fires once, at its point, step and ranks."""

    faults: tuple[Fault, ...] = ()
    fired: list[Fault] = field(default_factory=list)

    @classmethod
    def from_list(cls, items: Iterable[Any] | None, attempt: int = 0) -> "FaultPlan":
        """The faults of ``attempt`` among ``items`` (mappings are validated)."""
        return cls(tuple(f for f in parse_faults(list(items or ())) if f.attempt == attempt))

    def at(self, point: str, step: int, rank: int) -> list[Fault]:
        """The faults that strike ``rank`` at ``point`` of ``step`` (each fires once)."""
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}; one of {FAULT_POINTS}")
        hit = [f for f in self.faults if f.at == point and f.step == step and f.strikes(rank) and f not in self.fired]
        self.fired.extend(hit)
        return hit

    def scheduled(self, point: str, step: int) -> bool:
        """Whether any rank has a fault at ``point`` of ``step`` (the same answer on every rank)."""
        return any(f.at == point and f.step == step for f in self.faults)

    def apply(self, fault: Fault, ctx: FaultContext) -> None:
        """Write the fault's trace record, then make it happen (nothing is left for the engine)."""
        # the record's state holds only what the model's Fault* step changes for this rank
        state: dict[str, Any] = {}
        detail: dict[str, Any] = {"point": fault.at, "kind": fault.kind, "step": fault.step}
        if fault.kind == "frontier_mismatch":
            state.update(frontier=ctx.state.get("frontier", 0) + 1, tau=ctx.state.get("tau", 0) + 1)
        if KINDS[fault.kind].action == "FaultCrash":
            state["pc"] = "crashed"
        if fault.kind == "collective_timeout":
            detail["group"] = fault.group
        if KINDS[fault.kind].pair:  # a link: one fault, recorded by its lower end, which acts it (the model's actor)
            if ctx.rank != fault.ranks[0]:
                return
            detail["peer"] = fault.ranks[1]
        ctx.trace.action(fault.action, ctx.gen, "info", state, detail)
        EFFECTS[fault.kind](fault, ctx)


#: where a fault strikes only once every rank has reached it (:class:`FaultInjector`)
FENCED_POINTS: tuple[str, ...] = ("optimizer", "boundary")


@dataclass
class FaultInjector:
    """Fires a :class:`FaultPlan` at the engine's points (``Hooks.injector``).

    ``boundary`` and ``optimizer``: a fault there strikes only once every rank has reached the point
    (a barrier on the store, the injector's own channel: it touches none of the engine's groups), which
    is what the model's ``FaultGroupFail(point)`` means there: a peer still finishing the step's last
    backward collective would otherwise see it in flight (measured: DDP, a group cut by the first rank
    to reach its optimizer step)."""

    plan: FaultPlan
    fenced_points: tuple[str, ...] = FENCED_POINTS
    fired: list[Fault] = field(default_factory=list)
    #: a spare that took a rank's identity at F: the identity's faults up to step F struck its first
    #: process (one of them killed it), so only later steps' fire here; it still joins every fence
    after_first_step: bool = False
    _first: int | None = None
    #: step -> the generation in which this rank first ran it: a step discarded and rerun in a later
    #: generation (a discard in place, a hot swap) fires none of its faults again; they struck its
    #: first run (a fault names a step of the job's history, not each execution of it)
    _first_run: dict = field(default_factory=dict)
    _pid_published: bool = False

    def __call__(self, point: str, pact: Any) -> None:
        if not self._pid_published:  # where a link_cut's other end finds this process
            pact.control.store.set(pid_key(pact.control.prefix, pact.rank), str(os.getpid()))
            self._pid_published = True
        step = pact.step_index
        if point in self.fenced_points and self.plan.scheduled(point, step):
            self._fence(point, step, pact)
        if self._first is None:
            self._first = step
        if self.after_first_step and step <= self._first:
            return
        if self._first_run.setdefault(step, pact.gen) != pact.gen:
            return
        for f in self.plan.at(point, step, pact.rank):
            self.fired.append(f)
            ctx = FaultContext(pact.trace, pact.rank, pact.gen, pact.model_view(), pact.group_records(), pact.guard,
                               pact.module, pact.control.store, pact.control.prefix)
            self.plan.apply(f, ctx)

    @staticmethod
    def _fence(point: str, step: int, pact: Any, timeout_s: float = 120.0) -> None:
        """Wait until every rank of W has reached ``point`` of ``step`` (a store counter)."""
        store, world = pact.control.store, pact.groups.control.size()
        key = f"{pact.control.prefix}inject/g{pact.gen}/{step}/{point}"
        store.add(key, 1)
        deadline = time.monotonic() + timeout_s
        while int(store.add(key, 0)) < world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fault fence at {point} of step {step}: not every rank arrived within {timeout_s}s")
            time.sleep(0.002)


# ---------------------------------------------------------------------------------------------- hooks
def hooks_for(faults: Iterable[Any] | None = (), *, attempt: int = 0, seeded_bug: str | None = None,
              fenced_points: tuple[str, ...] = FENCED_POINTS, after_first_step: bool = False,
              write_to_record_s: float = 0.0) -> Hooks:
    """A rank's test hooks, to pass at ``attach(hooks=...)``: the faults of torchrun attempt ``attempt``
    among ``faults`` (Faults or fault mappings, validated: :class:`~accelpact.model.faults.FaultError`)
    fired at the engine's points by a :class:`FaultInjector`; seeded bug ``seeded_bug`` installed at
    attach (:func:`accelpact.testing.seeded.installer`: ValueError naming the seeded bugs for an
    unknown name); a ``write_to_record_s`` sleep between each control-plane write and its record."""
    plan = FaultPlan.from_list(faults, attempt)
    injector = FaultInjector(plan, fenced_points, after_first_step=after_first_step) if plan.faults else None
    return Hooks(injector=injector, install=seeded.installer(seeded_bug), write_to_record_s=write_to_record_s)


def fault_hooks(job: Any, fault: str | Iterable[Any] | None) -> Hooks | None:
    """The hooks that inject a training script's ``--fault`` (tests and demos only):
    ``run = job.attach(model, optim, ..., hooks=fault_hooks(job, args.fault))``.

    ``job``: what ``accelpact.init`` returned (its world bounds the ranks; its attempt picks the
    faults that strike now; on a spare, a rank's faults strike only after the step at which the spare
    takes its identity: those before struck its first process); ``fault``: a flag
    ``KIND@POINT:STEP[:RANKS[:GROUP]]`` (:meth:`~accelpact.model.faults.Fault.parse_flag`), or fault
    mappings or Faults; None or empty: no hooks (None)."""
    if not fault:
        return None
    raw = [Fault.parse_flag(fault)] if isinstance(fault, str) else list(fault)
    faults = parse_faults([f.to_json() if isinstance(f, Fault) else f for f in raw], "faults", world=job.world,
                          groups=("shard", "replicate", "world"))
    return hooks_for(faults, attempt=job.attempt, after_first_step=job.spare is not None)
