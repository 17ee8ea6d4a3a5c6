"""The fault vocabulary: points, kinds, the ``Fault`` record and its one validator; the injector.

This module is the one home of everything a fault *is* (spec/implementation.md, "Where things go").
Adding a fault kind is one entry in :data:`KINDS` (its model action, where it may strike, the pc
windows the scenario mapping gives it) plus its effect function below; the scenario schema, the
job schema, the scenario-to-model mapping and the injector all read the table.

A fault is ``{"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [1],
"group": "replicate", "attempt": 0}``: at the ``at`` point of ``step`` in torchrun attempt
``attempt``, on ``ranks`` (omitted or empty: every rank), ``group`` naming the group a
``collective_timeout`` breaks.

The injector (:class:`FaultPlan`) is called by the engine's :class:`~accelpact.impl.hooks.Hooks`
at named points; every injected fault first writes its ``Fault*`` trace record (outcome ``info``:
its effect is still to come), then takes effect with a real mechanism:

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

No torch import at module level: the schema is used by torch-free code (scenarios, the model CLI).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from accelpact.model.contract import IN_FLIGHT_PHASES
from accelpact.model.state import PC_GUARDED, PC_OBSERVED, PC_TRAIN

__all__ = [
    "FAULT_ACTION", "FAULT_KINDS", "FAULT_POINTS", "Fault", "FaultContext", "pid_key", "FaultError", "FaultKind", "FaultPlan",
    "IN_FLIGHT", "MODEL_KIND", "MODEL_ONLY_KINDS", "model_kinds", "InjectedFault", "KINDS", "RECOVERY_POINTS", "TRIGGER_POINTS",
]

# --------------------------------------------------------------------------------------------- points
#: In flight: inside ``with pact.step(...)`` (forward, backward, ``optimizer.step()``), as the contract names them.
IN_FLIGHT: tuple[str, ...] = tuple(IN_FLIGHT_PHASES)
#: Where a failure of R can start a recovery episode.
TRIGGER_POINTS: tuple[str, ...] = IN_FLIGHT + ("boundary",)
#: Inside the six phases (a fault there needs a trigger at the same step to start the recovery it strikes in).
RECOVERY_POINTS: tuple[str, ...] = ("guard", "agree", "replace", "rebind", "validate", "release")
FAULT_POINTS: tuple[str, ...] = TRIGGER_POINTS + RECOVERY_POINTS


class FaultError(ValueError):
    """A fault is malformed; the message names the field (``faults[2].at``) and what to write."""


class InjectedFault(Exception):
    """Raised by an injected ``exception`` fault: an ordinary error (a bug), not a communication
    failure; the engine classifies it as it would any such error."""


# ---------------------------------------------------------------------------------------------- kinds
@dataclass(frozen=True, slots=True)
class FaultKind:
    """One fault kind: its model action, where it may strike, and how it takes effect.

    ``failure``: at a trigger point this kind *is* the failure of R that starts the episode (the
    model's ``FaultGroupFail``), not a separate fault action.  ``windows``: the pcs in which the
    model's action for it is enabled, when narrower than the point's window (None: the point's).
    ``members_only``: it can strike only members of the failing group R (the model's action is
    enabled only there).  ``breaks_group``: it acts on the group its fault names (``Fault.group``).
    """

    name: str
    action: str
    points: tuple[str, ...]
    effect: Callable[["Fault", "FaultContext"], None]
    failure: bool = False
    windows: tuple[str, ...] | None = None
    members_only: bool = False
    breaks_group: bool = False
    job_wide: bool = False   # its model action has no actor (the store's loss): the rank only triggers it
    pair: bool = False       # it names exactly two ranks, the ends of a link (``ranks: [a, b]``, a < b, two nodes)
    doc: str = ""


def _group_fail(fault: "Fault", ctx: "FaultContext") -> None:
    import threading

    from ..impl import revoke

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
    """Where a rank's process publishes its pid for the test injector (:class:`~accelpact.impl.hooks.FaultInjector`)."""
    return f"{prefix}inject/pid/{rank}"


def _link_cut(fault: "Fault", ctx: "FaultContext") -> None:
    """Every TCP connection between ranks ``a`` and ``b`` is shut down, from ``a``'s side (a shutdown
    acts on the shared socket: both ends fail), as a broken link between their nodes does: every
    group the two share fails (their replicate group if they share one, the world, default, control
    and checkpoint groups), each keeps its connections to everyone else and to the store.  By another
    thread, complete before the rank goes on; the engine is not told which groups broke."""
    import datetime
    import threading

    from .inject import cut_link

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


def _nccl_timeout(fault: "Fault", ctx: "FaultContext") -> None:
    """NCCL only: the group's boundary collective queued behind a device spin longer than its timeout
    (a genuine NCCL timeout, :mod:`accelpact.testing.nccl_timeout`; elsewhere a FaultError naming why)."""
    from .nccl_timeout import nccl_timeout

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
    from .inject import GIL_HANG_SIGNAL

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
    from ..impl.launch.launch import STORE_PID_ENV

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
    import subprocess

    hub, link = os.environ.get(NETNS_HUB_ENV), os.environ.get(NETNS_LINK_ENV)
    if hub and link:
        subprocess.run(["ip", "-n", hub, "link", "set", link, "down"], check=True, timeout=30, capture_output=True)
        return
    os.kill(os.getpid(), signal.SIGSTOP)


_RAISE_POINTS = TRIGGER_POINTS + RECOVERY_POINTS

#: kind -> FaultKind: the one table of fault kinds.
KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("collective_timeout", "FaultGroupFail", TRIGGER_POINTS, _group_fail, failure=True, breaks_group=True,
              doc="the group's connections are shut down: its collectives fail"),
    FaultKind("nccl_timeout", "FaultGroupFail", ("boundary",), _nccl_timeout, failure=True, breaks_group=True,
              doc="NCCL only: the group's boundary collective queued behind a device spin longer than its timeout"),
    # a physical fault (issue 25, P18.2): its model action is its own, not the group failure it causes
    FaultKind("link_cut", "FaultLinkCut", TRIGGER_POINTS, _link_cut, pair=True,
              doc="every connection between two ranks on two nodes is shut down: every group across the link fails"),
    FaultKind("crash", "FaultCrash", FAULT_POINTS, _crash, doc="SIGKILL of the rank"),
    FaultKind("hang", "FaultHang", FAULT_POINTS, _hang, doc="the rank's main thread stops making progress"),
    # a stopped process and a held GIL are, to the protocol, a crash: the rank takes no step and its
    # watchdog cannot run (model FaultCrash); they differ from it in that the process lives on
    FaultKind("stop", "FaultCrash", ("boundary", "agree", "validate"), _stop,
              doc="SIGSTOP of the rank: every thread stops; peers' detectors declare it dead"),
    FaultKind("gil_hang", "FaultCrash", ("boundary", "agree", "validate"), _gil_hang,
              doc="the rank's main thread holds the GIL forever: no Python thread runs"),
    FaultKind("exception", "FaultRaise", _RAISE_POINTS, _raise, failure=True,
              doc="an exception raised at the point (in flight or at the boundary: the failure of the step)"),
    FaultKind("frontier_mismatch", "FaultMismatch", ("boundary", "guard", "agree"), _mismatch,
              windows=(PC_TRAIN, PC_OBSERVED, PC_GUARDED), doc="the rank reports F+1 at the agreement"),
    FaultKind("dirty_guard", "FaultDirtyGuard", ("boundary", "guard"), _dirty_guard,
              windows=(PC_TRAIN, PC_OBSERVED), doc="a stale gradient and a busy wrapper at the guard check"),
    FaultKind("corrupt_state", "FaultCorrupt", ("boundary",), _corrupt_state, windows=(PC_TRAIN, PC_OBSERVED),
              members_only=True, doc="one bit of the rank's local parameter shard flipped after the commit: replicas disagree"),
    FaultKind("store_loss", "FaultStoreLoss", RECOVERY_POINTS, _store_loss, job_wide=True,
              doc="the process serving the control-plane store is killed (SIGKILL): every store operation fails"),
    # a silent partition: to its peers a rank that takes no further step and sends nothing, its sockets
    # open (no reset): the model's FaultCrash, as stop (spec/scenario-format.md, "partition")
    FaultKind("partition", "FaultCrash", ("boundary", "agree", "validate"), _partition,
              doc="a silent network partition of the rank: its link down, every frame dropped, no reset"),
)}
FAULT_KINDS: tuple[str, ...] = tuple(KINDS)
#: the model action each kind is recorded as (outside a trigger point)
FAULT_ACTION: dict[str, str] = {k.name: k.action for k in KINDS.values()}
#: The one translation between the two fault vocabularies (issue 23): implementation/scenario kind ->
#: the model's fault kind (``model.protocol.FAULT_KINDS``, ``Config.faults``, ``ActionSpec.fault_kind``).
#: ``tests/test_impl_faults.py`` checks that every kind on each side is mapped and that it agrees with
#: the kind's model action; ``MODEL_ONLY_KINDS`` are the model's kinds no injector makes.
MODEL_KIND: dict[str, str] = {
    "collective_timeout": "group_fail", "crash": "crash", "hang": "hang", "stop": "crash", "gil_hang": "crash",
    "exception": "raise", "frontier_mismatch": "mismatch", "dirty_guard": "dirty_guard", "corrupt_state": "corrupt",
    "store_loss": "store_loss", "link_cut": "link", "nccl_timeout": "group_fail", "partition": "crash",
}
#: the model's fault kinds with no implementation kind (network-level message faults of the model)
MODEL_ONLY_KINDS: frozenset[str] = frozenset({"delay", "drop"})


def model_kinds(kinds: Iterable[str]) -> frozenset[str]:
    """The model's fault kinds (``Config.faults``) of implementation kinds; raises FaultError on an unknown one."""
    unknown = sorted(set(kinds) - set(MODEL_KIND))
    if unknown:
        raise FaultError(f"fault kinds {unknown} are not among {list(FAULT_KINDS)}")
    return frozenset(MODEL_KIND[k] for k in kinds)


# ---------------------------------------------------------------------------------------------- Fault
FAULT_FIELDS = ("step", "at", "kind", "ranks", "group", "attempt")


def _int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultError(f"{where}: must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise FaultError(f"{where}: must be {f'>= {lo}' if hi is None else f'in [{lo}, {hi}]'}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault (see the module doc).  The same type serves the engine's plan, the job
    and the scenario format; :meth:`parse` is its one validator."""

    step: int
    at: str
    kind: str
    ranks: tuple[int, ...] = ()
    group: str = "replicate"
    attempt: int = 0

    @classmethod
    def parse(cls, raw: Any, where: str = "fault", *, world: int | None = None, steps: int | None = None,
              groups: Iterable[str] | None = None) -> "Fault":
        """Validate one fault mapping.  ``world``/``steps`` bound ``ranks``/``step`` when known;
        ``groups``: the group names a ``collective_timeout`` may break.  Errors name the field."""
        if not isinstance(raw, Mapping):
            raise FaultError(f"{where}: must be an object with fields {list(FAULT_FIELDS)}, got {type(raw).__name__}")
        unknown = set(raw) - set(FAULT_FIELDS)
        if unknown:
            raise FaultError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {list(FAULT_FIELDS)}")
        for k in ("step", "at", "kind"):
            if k not in raw:
                raise FaultError(f"{where}: missing required field {k!r}")
        step = _int(f"{where}.step", raw["step"], 0, None if steps is None else steps - 1)
        at, kind = raw["at"], raw["kind"]
        if at not in FAULT_POINTS:
            raise FaultError(f"{where}.at: {at!r} is not one of {list(FAULT_POINTS)}")
        if kind not in KINDS:
            raise FaultError(f"{where}.kind: {kind!r} is not one of {list(FAULT_KINDS)}")
        if at not in KINDS[kind].points:
            allowed = [k for k, fk in KINDS.items() if at in fk.points]
            raise FaultError(f"{where}: kind {kind!r} cannot be injected at {at!r}; allowed there: {allowed}")
        ranks = raw.get("ranks", [])
        if not isinstance(ranks, (list, tuple)):
            raise FaultError(f"{where}.ranks: must be a list of ranks (omit it for every rank), got {ranks!r}")
        for j, r in enumerate(ranks):
            _int(f"{where}.ranks[{j}]", r, 0, None if world is None else world - 1)
        if len(set(ranks)) != len(ranks):
            raise FaultError(f"{where}.ranks: duplicate rank in {list(ranks)}")
        known = tuple(groups) if groups is not None else None
        group = raw.get("group", known[0] if known else "replicate")
        # only a kind that breaks a group names one that must exist; for the others it is ignored
        if not isinstance(group, str) or (KINDS[kind].breaks_group and known is not None and group not in known):
            raise FaultError(f"{where}.group: {group!r} is not a group this job can break; use one of {list(known or ())}")
        attempt = _int(f"{where}.attempt", raw.get("attempt", 0), 0)
        if KINDS[kind].pair and len(ranks) != 2:
            raise FaultError(f"{where}.ranks: kind {kind!r} names the two ends of the link, e.g. [0, 2]; got {list(ranks)}")
        return cls(step, at, kind, tuple(sorted(ranks)), group, attempt)

    @classmethod
    def parse_flag(cls, text: str, where: str = "--fault") -> "Fault":
        """A fault written as a command-line flag: ``KIND@POINT:STEP[:RANKS[:GROUP]]``, RANKS a
        comma-separated list (empty: every rank); e.g. ``collective_timeout@boundary:3:0,2`` (R's
        sockets cut on ranks 0 and 2 at step 3's boundary) or ``crash@backward:4:1``.  Validated by
        :meth:`parse`; errors name the flag and show the format."""
        form = "KIND@POINT:STEP[:RANKS[:GROUP]], e.g. collective_timeout@boundary:3:0,2"
        if not isinstance(text, str):
            raise FaultError(f"{where}: must be a string {form}, got {text!r}")
        kind, at_sign, rest = text.strip().partition("@")
        parts = rest.split(":")
        if not at_sign or not kind or len(parts) < 2 or len(parts) > 4:
            raise FaultError(f"{where}: {text!r} is not {form}")
        raw: dict[str, Any] = {"kind": kind, "at": parts[0]}
        try:
            raw["step"] = int(parts[1])
            if len(parts) > 2 and parts[2].strip():
                raw["ranks"] = [int(r) for r in parts[2].split(",")]
        except ValueError:
            raise FaultError(f"{where}: {text!r}: STEP and RANKS must be integers ({form})") from None
        if len(parts) > 3:
            raw["group"] = parts[3]
        return cls.parse(raw, f"{where} {text!r}")

    def to_json(self) -> dict[str, Any]:
        """The fault dict (the scenario format's and the job's): fixed field order; ``attempt``
        only when not 0."""
        out: dict[str, Any] = {"step": self.step, "at": self.at, "kind": self.kind, "ranks": list(self.ranks),
                               "group": self.group}
        if self.attempt:
            out["attempt"] = self.attempt
        return out

    def targets(self, world: int) -> tuple[int, ...]:
        """The ranks it strikes: ``ranks``, or every rank when empty."""
        return self.ranks or tuple(range(world))

    def strikes(self, rank: int) -> bool:
        return not self.ranks or rank in self.ranks

    @property
    def is_trigger(self) -> bool:
        """At a trigger point: the fault's step starts a recovery episode."""
        return self.at in TRIGGER_POINTS

    @property
    def is_failure(self) -> bool:
        """This fault is the failure of R itself (the model's FaultGroupFail), not a separate fault."""
        return self.is_trigger and KINDS[self.kind].failure

    @property
    def action(self) -> str:
        """The model action this fault is recorded as."""
        return "FaultGroupFail" if self.is_failure else KINDS[self.kind].action


def parse_faults(items: Any, where: str = "faults", **bounds: Any) -> tuple[Fault, ...]:
    """A list of fault mappings (or Faults) -> Faults, each validated with :meth:`Fault.parse`."""
    if items is None:
        return ()
    if not isinstance(items, (list, tuple)):
        raise FaultError(f"{where}: must be a list of fault objects, got {type(items).__name__}")
    return tuple(f if isinstance(f, Fault) else Fault.parse(f, f"{where}[{i}]", **bounds) for i, f in enumerate(items))


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
        KINDS[fault.kind].effect(fault, ctx)
