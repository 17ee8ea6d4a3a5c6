"""The boundary guard: where the step is, and whether this rank is at a clean committed boundary.

Mirrors ``Rank.point``/``Rank.tau``/``Rank.frontier``/``Rank.dirty`` of the model.  The
failure phase used by the contract comes from this record (which hook ran last), never from
an error string:

* forward pre-hook  -> ``forward``
* forward post-hook -> ``backward`` (the next thing to run is the backward)
* optimizer step pre-hook  -> ``optimizer``
* optimizer step post-hook -> commit: ``tau += 1``, ``F = tau``, ``boundary``

``check()`` is phase 2 (RankGuard): point is ``boundary`` and ``tau == F``; no parameter
holds a ``.grad`` (the loop must ``zero_grad(set_to_none=True)`` before the boundary);
the wrapper is idle, as far as torch lets us see it:

* FSDP1: every ``FullyShardedDataParallel`` has ``training_state == IDLE`` and every flat
  param handle ``_training_state == IDLE``;
* FSDP2: every ``FSDPState`` has ``_training_state == IDLE``;
* DDP: the reducer's pending work is C++ state not visible from Python; at the boundary
  the optimizer step has returned, which implies the backward's reduction finished, so the
  check is the grads-cleared and point checks above;
* the step's device work drained: on each non-CPU device holding parameters, an event recorded on
  its current stream (the stream the step ran on) must complete within ``sync_timeout_s``
  (:meth:`accelpact.impl.runtime.backends.Backend.drain`); past it the guard fails (L2).  Not a
  device-wide ``torch.cuda.synchronize()``: that waits, unbounded, behind a hung collective kernel
  of R on another stream until the revoke's abort lands.  CPU: nothing to drain.

Two drains, two bounds.  The check above is phase 2 of an episode: bounded by ``sync_timeout_s``, the
phase deadline.  The commit's drain (:meth:`BoundaryGuard.undrained` without an argument, called by the
engine as ``optimizer.step()`` starts) is a wait of a fault-free step: a step whose device work is
only long (a backlog of kernels, a slow peer's collective still running) is not a failure, so it is
bounded by ``commit_drain_s``, the training groups' collective timeout
(:func:`accelpact.impl.deadlines.step_wait_bound`), never by the phase deadline.  A kernel that never
ends behind a dead or hung peer ends earlier than that: the detector's verdict or a revoke aborts its
communicator (NCCL's abort completes its kernels), and the collective's own timeout aborts it at the
latest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .deadlines import step_wait_bound
from .runtime import backends as _backends

__all__ = ["BoundaryGuard", "GuardReport", "POINTS", "SYNC_TIMEOUT_S"]

POINTS = ("boundary", "forward", "backward", "optimizer")
#: Default bound on draining the step's device work at the guard check (phase 2, seconds); the engine
#: passes its phase deadline.
SYNC_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class GuardReport:
    ok: bool
    reasons: tuple[str, ...] = ()


class BoundaryGuard:
    """Installs hooks on ``module`` and ``optimizer``; ``remove()`` uninstalls them.

    ``on_point(point)`` (optional) is called after the point changes (fault injection);
    ``sync_timeout_s`` bounds draining the step's device work in :meth:`check` (phase 2: the phase
    deadline); ``commit_drain_s`` bounds the commit's drain (:meth:`undrained` without an argument: a
    wait of the fault-free step, the training groups' collective timeout; None:
    :data:`~accelpact.impl.deadlines.DEFAULT_COLLECTIVE_TIMEOUT_S`, see the module doc)."""

    def __init__(self, module, optimizer, *, frontier: int = 0, on_point: Callable[[str], None] | None = None,
                 sync_timeout_s: float = SYNC_TIMEOUT_S, before_commit: Callable[[], None] | None = None,
                 commit_drain_s: float | None = None) -> None:
        self.module = module
        #: called as ``optimizer.step()`` starts, before the point moves to ``optimizer``: an exception
        #: it raises stops the commit and is a failure of ``backward`` (nothing is updated yet)
        self.before_commit = before_commit
        self.sync_timeout_s = sync_timeout_s
        #: the commit drain's bound: a fault-free step's wait, never the phase deadline
        self.commit_drain_s = step_wait_bound(commit_drain_s)
        self.optimizer = optimizer
        self.tau = frontier
        self.frontier = frontier
        self.point = "boundary"
        self.busy_marks: list[str] = []
        self.on_point = on_point
        self._handles = [
            module.register_forward_pre_hook(self._pre_forward),
            module.register_forward_hook(self._post_forward),
            optimizer.register_step_pre_hook(self._pre_step),
            optimizer.register_step_post_hook(self._post_step),
        ]

    def _set(self, point: str) -> None:
        self.point = point
        if self.on_point is not None:
            self.on_point(point)

    def _pre_forward(self, module, args):
        self._set("forward")

    def _post_forward(self, module, args, output):
        self._set("backward")

    def _pre_step(self, optimizer, args, kwargs):
        if self.before_commit is not None:
            self.before_commit()
        self._set("optimizer")

    def _post_step(self, optimizer, args, kwargs):
        self.tau += 1
        self.frontier = self.tau
        self.point = "boundary"  # commit: no injection point between commit and the boundary call

    def mark_busy(self, why: str) -> None:
        """Fault injection (``dirty_guard``): make the wrapper look busy."""
        self.busy_marks.append(why)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def check(self) -> GuardReport:
        """Phase 2: is this rank at a clean committed boundary?"""
        reasons: list[str] = []
        if self.point != "boundary":
            reasons.append(f"step is at {self.point!r}, not at the committed boundary")
        if self.tau != self.frontier:
            reasons.append(f"tau={self.tau} != F={self.frontier}")
        with_grad = [n for n, p in self.module.named_parameters() if p.grad is not None]
        if with_grad:
            reasons.append(f"{len(with_grad)} parameter(s) still hold .grad (first: {with_grad[0]}); "
                           "call optimizer.zero_grad(set_to_none=True) before the boundary")
        reasons.extend(self._wrapper_busy())
        reasons.extend(f"wrapper marked busy: {w}" for w in self.busy_marks)
        reasons.extend(self.undrained(self.sync_timeout_s))
        return GuardReport(not reasons, tuple(reasons))

    def undrained(self, timeout_s: float | None = None) -> list[str]:
        """The devices whose current stream still had the step's work queued after ``timeout_s`` (None:
        ``commit_drain_s``, the commit's bound; :meth:`check` passes ``sync_timeout_s``)."""
        bound = self.commit_drain_s if timeout_s is None else timeout_s
        devices = {p.device for p in self.module.parameters() if p.device.type != "cpu"}
        return [f"the step's work on {d} did not finish within {bound} s (a kernel is still queued, "
                "e.g. a hung collective): not a clean boundary"
                for d in sorted(devices, key=str) if not _backends.for_device(d).drain(d, bound)]

    def _wrapper_busy(self) -> list[str]:
        out: list[str] = []
        for name, m in self.module.named_modules():
            ts = getattr(m, "training_state", None)  # FSDP1
            if ts is not None and getattr(ts, "name", "IDLE") != "IDLE":
                out.append(f"FSDP1 {name or '<root>'} training_state={ts.name}")
            for h in getattr(m, "_all_handles", ()) or ():
                hts = getattr(h, "_training_state", None)
                if hts is not None and getattr(hts, "name", "IDLE") != "IDLE":
                    out.append(f"FSDP1 handle of {name or '<root>'} in {hts.name}")
            get_state = getattr(m, "_get_fsdp_state", None)  # FSDP2
            if callable(get_state):
                try:
                    st = get_state()
                except Exception:  # noqa: BLE001 - a wrapper's private state accessor; unknown state reads as idle-unknown
                    st = None
                ts2 = getattr(st, "_training_state", None)
                if ts2 is not None and getattr(ts2, "name", "IDLE") != "IDLE":
                    out.append(f"FSDP2 {name or '<root>'} state={ts2.name}")
        return out
