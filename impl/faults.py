"""Fault injection at named points of the step and of the six phases (spec/implementation.md).

A ``FaultPlan`` is built from fault dicts::

    {"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [1], "group": "replicate"}

The engine calls ``plan.at(point, step, rank)`` at every point and ``plan.apply(fault, ctx)``
for each fault returned.  Every injected fault first writes its ``Fault*`` trace record
(outcome ``info``: its effect is still to come), then takes effect with a real mechanism:

* ``collective_timeout``: the named group breaks on ``ranks``: its connected sockets are
  shut down (:func:`revoke.hard_close`), the mechanism that breaks a gloo group for real
  (gloo's ``set_timeout`` does not shorten an op already configured, and ``abort()`` does
  nothing to gloo).  The victim's next op on it fails at once; its peers stay blocked until
  the victim publishes the revoke.
* ``crash``: SIGKILL self.  ``hang``: the main thread sleeps forever (the watchdog still runs).
* ``exception``: raise :class:`InjectedFault` inside the phase.
* ``frontier_mismatch``: this rank reports F+1 at the control barrier.
* ``dirty_guard``: leave a ``.grad`` on a parameter and mark the wrapper busy.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["Fault", "FaultPlan", "InjectedFault", "FAULT_POINTS", "FAULT_KINDS", "FAULT_ACTION"]

FAULT_POINTS = ("forward", "backward", "optimizer", "boundary", "guard", "agree", "replace", "rebind", "validate", "release")
FAULT_KINDS = ("collective_timeout", "crash", "hang", "exception", "frontier_mismatch", "dirty_guard")
#: the model action each kind is recorded as
FAULT_ACTION = {
    "collective_timeout": "FaultGroupFail",
    "crash": "FaultCrash",
    "hang": "FaultHang",
    "exception": "FaultRaise",
    "frontier_mismatch": "FaultMismatch",
    "dirty_guard": "FaultDirtyGuard",
}


class InjectedFault(RuntimeError):
    """Raised by an injected ``exception`` fault (never by real code)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: at `step`, point `at`, of `kind`, on `ranks` (`group`: which group a
    `collective_timeout` breaks).  The same type serves the engine's plan and the scenario format."""

    step: int
    at: str
    kind: str
    ranks: tuple[int, ...] = ()
    group: str = "replicate"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Fault":
        unknown = set(d) - {"step", "at", "kind", "ranks", "group"}
        if unknown:
            raise ValueError(f"fault {d}: unknown field(s) {sorted(unknown)}; allowed: step, at, kind, ranks, group")
        if d.get("at") not in FAULT_POINTS:
            raise ValueError(f"fault {d}: 'at' must be one of {FAULT_POINTS}")
        if d.get("kind") not in FAULT_KINDS:
            raise ValueError(f"fault {d}: 'kind' must be one of {FAULT_KINDS}")
        if not isinstance(d.get("step"), int):
            raise ValueError(f"fault {d}: 'step' must be an int (the step at which it strikes)")
        ranks = d.get("ranks", ())
        if not isinstance(ranks, (list, tuple)) or not all(isinstance(r, int) for r in ranks):
            raise ValueError(f"fault {d}: 'ranks' must be a list of ints")
        return cls(d["step"], d["at"], d["kind"], tuple(ranks), d.get("group", "replicate"))

    def to_json(self) -> dict[str, Any]:
        """The fault dict (the scenario format's and the job's): every field, fixed order."""
        return {"step": self.step, "at": self.at, "kind": self.kind, "ranks": list(self.ranks), "group": self.group}


@dataclass(slots=True)
class FaultContext:
    """What a fault may touch: filled in by the engine."""

    trace: Any
    rank: int
    gen: int
    state: dict
    groups: dict  # group name -> revoke.SocketRecord of this rank's group of that name
    guard: Any = None
    module: Any = None


@dataclass(slots=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()
    fired: list[Fault] = field(default_factory=list)

    @classmethod
    def from_list(cls, items: Iterable[dict[str, Any]] | None) -> "FaultPlan":
        return cls(tuple(Fault.from_dict(d) for d in (items or ())))

    def at(self, point: str, step: int, rank: int) -> list[Fault]:
        """The faults that strike ``rank`` at ``point`` of ``step`` (each fires once)."""
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}; one of {FAULT_POINTS}")
        hit = [f for f in self.faults if f.at == point and f.step == step and (not f.ranks or rank in f.ranks) and f not in self.fired]
        self.fired.extend(hit)
        return hit

    def scheduled(self, point: str, step: int) -> bool:
        """Whether any rank has a fault at ``point`` of ``step`` (the same answer on every rank:
        the plan is the job's, not this rank's)."""
        return any(f.at == point and f.step == step for f in self.faults)

    def apply(self, fault: Fault, ctx: FaultContext) -> dict[str, Any]:
        """Write the fault's trace record, then make it happen.  Returns effects the engine
        must apply itself (``{"frontier_delta": 1}``)."""
        from . import revoke

        action = FAULT_ACTION[fault.kind]
        if fault.kind == "exception" and fault.at in ("forward", "backward", "optimizer", "boundary"):
            # raised by the training step itself: this *is* the failure that starts the episode
            # (model: FaultGroupFail at that point), not an exception inside recovery (FaultRaise)
            action = "FaultGroupFail"
        # the record's state holds only what the model's Fault* step changes for this rank
        state: dict[str, Any] = {}
        detail = {"point": fault.at, "kind": fault.kind, "step": fault.step}
        if fault.kind == "frontier_mismatch":
            state.update(frontier=ctx.state.get("frontier", 0) + 1, tau=ctx.state.get("tau", 0) + 1)
        if fault.kind == "crash":
            state["pc"] = "crashed"
        if fault.kind == "collective_timeout":
            detail["group"] = fault.group
        ctx.trace.action(action, ctx.gen, "info", state, detail)
        if fault.kind == "collective_timeout":
            rec = ctx.groups.get(fault.group)
            if rec is None:
                raise ValueError(f"collective_timeout: rank {ctx.rank} has no group named {fault.group!r}; "
                                 f"known: {sorted(ctx.groups)}")
            revoke.hard_close(rec)
            # Shutting down our own connections fails the peers' pending operations at once, but
            # an operation this rank posts next may still wait for its own timeout (measured under
            # load): the injecting rank treats the group as failed without entering it.
            return {"group_failed": fault.group}
        if fault.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # not reached
        if fault.kind == "hang":
            while True:
                time.sleep(3600)
        if fault.kind == "exception":
            raise InjectedFault(f"injected exception at {fault.at} of step {fault.step} on rank {ctx.rank}")
        if fault.kind == "frontier_mismatch":
            return {"frontier_delta": 1}
        if fault.kind == "dirty_guard":
            import torch

            for p in ctx.module.parameters() if ctx.module is not None else ():
                p.grad = torch.zeros_like(p)
                break
            if ctx.guard is not None:
                ctx.guard.mark_busy(f"injected dirty_guard at {fault.at}")
            return {}
        return {}
