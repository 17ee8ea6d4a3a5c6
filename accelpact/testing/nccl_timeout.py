"""A genuine NCCL timeout, made on the device (issue 26 item 5): the fault effect :func:`nccl_timeout`.

``collective_timeout`` breaks a group from outside (gloo: its sockets shut down; NCCL: its communicator
aborted), so on NCCL it never meets NCCL's own timeout path.  This effect makes the real one: on the
struck rank it queues ``torch.cuda._sleep`` (a kernel that spins for a number of GPU clock cycles) on
the current stream for longer than the group's collective timeout, right before the engine's boundary
all-reduce on that group (the fault point ``boundary`` is between placing the probe's tensor and
enqueuing the all-reduce).  NCCL's stream waits for the current stream, so the all-reduce's kernel
cannot start: the work outlives its timeout on the struck rank, and on every other member the
collective waits for the stalled peer and outlives it too.  What happens next is NCCL's and the
engine's own: the boundary wait's ``work.wait(timeout)`` raises (or NCCL's watchdog, mode 2, aborts the
communicator and ``get_error()`` says TIMEOUT), and the engine repairs R in place.  The spin ends a
little after the timeout (:data:`SPIN_MARGIN_S`), inside the guard's bounded drain (``deadline_s``).

NCCL only: on any other backend, or a torch without ``torch.cuda._sleep``, the effect raises
:class:`~accelpact.model.faults.FaultError` with the reason (:func:`unavailable`), and callers skip.

The fault kind ``nccl_timeout`` (``model/faults.py`` ``KINDS``; to the model R failing at the
boundary, ``FaultGroupFail``, as ``collective_timeout`` is; its effect in ``accelpact.testing.faults.EFFECTS``) runs it; so do ``python -m
accelpact.bench.gpu_check`` (sub-check ``real_timeout_repair``) and ``accelpact qualify --real-timeout``.
No torch import at module level.
"""

from __future__ import annotations

from typing import Any

from accelpact.model.faults import FaultError

from ..impl.runtime.backends import backend, backend_of

__all__ = ["KIND", "SPIN_MARGIN_S", "cycles_per_second", "nccl_timeout", "stall", "unavailable"]

#: The fault kind's name in ``model/faults.py`` ``KINDS``.
KIND = "nccl_timeout"
#: How much longer than the group's collective timeout the device spins (s): more than NCCL's watchdog
#: poll (100 ms) and the engine's margin (``NCCL_WATCHDOG_MARGIN_S``, 0.25 s), far less than the guard's
#: drain bound (``deadline_s``).
SPIN_MARGIN_S = 2.0

_CALIBRATED: dict[str, float] = {}


def unavailable(backend_name: str) -> str | None:
    """Why a genuine NCCL timeout cannot be made on ``backend_name`` here (None: it can)."""
    be = backend(backend_name)
    if be.revoke != "abort" or be.device_type != "cuda":
        return (f"{KIND} is NCCL only: it stalls the device stream under an NCCL collective until NCCL's own timeout "
                f"fires; backend {be.name} has neither (use collective_timeout there)")
    import torch

    if not hasattr(torch.cuda, "_sleep"):
        return f"{KIND}: torch {torch.__version__} has no torch.cuda._sleep (the spin kernel)"
    return None


def cycles_per_second(device) -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep`` on ``device``, measured once per device with
    CUDA events (clamped to [1e8, 1e10]: a measurement off by orders of magnitude must not make a
    spin of hours or of nothing)."""
    import torch

    key = str(device)
    if key not in _CALIBRATED:
        with torch.cuda.device(device):
            torch.cuda._sleep(1000)  # the first launch's cost out of the measurement
            torch.cuda.synchronize(device)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.cuda._sleep(int(2e8))
            e1.record()
            e1.synchronize()
        _CALIBRATED[key] = min(max(2e8 / max(e0.elapsed_time(e1) / 1000.0, 1e-6), 1e8), 1e10)
    return _CALIBRATED[key]


def stall(device, seconds: float) -> int:
    """Queue a spin of about ``seconds`` on ``device``'s current stream (returns at once); the cycles."""
    import torch

    cycles = int(cycles_per_second(device) * seconds)
    with torch.cuda.device(device):
        torch.cuda._sleep(cycles)
    return cycles


def nccl_timeout(fault: Any, ctx: Any) -> None:
    """The effect (see the module doc): the group ``fault.group`` of this rank (``ctx.groups``: revoke
    records; an NCCL record holds the group) gets its next collective queued behind a spin of its
    collective timeout plus :data:`SPIN_MARGIN_S`.  Raises ``FaultError`` where it cannot be made."""
    rec = ctx.groups.get(fault.group)
    pg = getattr(rec, "group", None)
    if pg is None:
        raise FaultError(f"{KIND}: rank {ctx.rank} has no NCCL group named {fault.group!r} (known: {sorted(ctx.groups)}); "
                         f"{unavailable(getattr(rec, 'backend', 'gloo')) or ''}".rstrip("; "))
    be = backend_of(pg)
    why = unavailable(be.name)
    if why:
        raise FaultError(why)
    timeout = be.timeout_of(pg)
    if not timeout:
        raise FaultError(f"{KIND}: group {fault.group!r} does not say its collective timeout")
    stall(be.device_for(pg), timeout + SPIN_MARGIN_S)
