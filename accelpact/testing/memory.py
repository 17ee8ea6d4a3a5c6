"""Peak resident memory per step of a worker (issue 43): what ``Workload.memory`` turns on.

Linux keeps a process's peak resident set size (``VmHWM`` in ``/proc/self/status``) and lets the
process reset it to the current resident size (writing ``5`` to ``/proc/self/clear_refs``).  The
worker (:func:`accelpact.testing.worker.run_job`) resets it as each step opens and reads it as the
step closes, so each line of ``memory-a{attempt}-r{rank}.ndjson`` (:meth:`RunDir.memory`) holds the
peak of one window, whatever happened in it: the step, and an episode if one ran in it.  The lines,
one JSON object each, append-only, every one naming its process (``pid``):

* ``{"window": "base", "rss_mb", "peak_rss_mb"}``: the resident size before the model is built
  (torch, gloo, the groups, the interpreter), and the peak until then;
* ``{"window": "attach", ...}`` (a training rank) or ``{"window": "join", ...}`` (a spare that took
  this identity): the peak from the process's start through ``attach``; a spare's holds its warm-up
  build, its own build and the state it received, its ``step`` the frontier it joined at;
* ``{"window": "step", "step", "gen_start", "gen", "discarded", "report", "episode", "dead", "sources",
  "peak_rss_mb", "rss_mb", "tensor_mb"}``: one window from the step's opening (before ``run.step``) to its close
  (after ``run.boundary``, or where a discarded step ``continue``\\s); ``episode`` names what ran in it
  (``repair``: a report at the boundary; ``discard``: the step discarded in place, nobody dead;
  ``swap``: a rank died and a spare took its identity; ``episode``: the generation moved otherwise;
  None: a fault-free step), ``dead`` the ranks a swap replaced, ``sources`` the live rank that sent each
  one's state (dead rank, as a string -> rank), and ``tensor_mb``: the bytes of the CPU tensors alive
  as the window closes (every distinct storage of a tensor the garbage collector tracks: the model's,
  the optimizer's, gradients, copies an episode keeps; not what C++ alone holds, such as DDP's buckets),
  counted after the peak was read, so the count is outside the window.

Megabytes are MiB (``kB`` of ``/proc`` / 1024).  Torch is imported only to count tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

__all__ = ["MemoryLog", "MemoryProbeError", "read_status", "reset_peak", "tensor_mb"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MemoryProbeError(RuntimeError):
    """This platform cannot measure a window's peak (no ``/proc/self/clear_refs``, ``VmHWM``)."""


def read_status() -> tuple[float, float]:
    """(peak, current) resident set size of this process in MiB (``VmHWM``, ``VmRSS``)."""
    try:
        text = _STATUS.read_text()
    except OSError as exc:
        raise MemoryProbeError(f"workload.memory: cannot read {_STATUS} ({exc.strerror}); the peak-memory record "
                               "needs Linux") from None
    kb: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            kb[key] = int(rest.split()[0])
    if len(kb) != 2:
        raise MemoryProbeError(f"workload.memory: {_STATUS} has no VmHWM/VmRSS; the peak-memory record needs Linux")
    return kb["VmHWM"] / 1024, kb["VmRSS"] / 1024


def reset_peak() -> None:
    """Reset this process's peak resident size to its current one (the start of a window)."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError as exc:
        raise MemoryProbeError(f"workload.memory: cannot write {_CLEAR_REFS} ({exc.strerror}): the kernel does not "
                               "let this process reset its peak resident size (Linux >= 4.0)") from None


def tensor_mb() -> float:
    """The CPU tensors alive in this process, in MiB: each distinct storage once (a view, a flat
    parameter's shards and a DTensor's local tensor count their storage), garbage not yet collected
    included (nothing is collected here)."""
    import gc

    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        # the type, never isinstance: isinstance asks an object its __class__, and some module-level proxies
        # (torch.distributed's deprecated names) warn when asked
        if not issubclass(type(obj), torch.Tensor):
            continue
        for t in (obj, getattr(obj, "_local_tensor", None)):  # a DTensor holds its shard in _local_tensor
            if not isinstance(t, torch.Tensor):  # (a tensor's type, or None, by now)
                continue
            try:  # an undefined tensor has no device; sparse, nested and wrapper subclasses have no storage
                if t.device.type != "cpu":
                    continue
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError, TypeError):
                continue
    return sum(seen.values()) / 2**20


def _episode(report: Any, swaps: list[Any], gen_start: int, gen: int) -> tuple[str | None, list[int], dict[str, int]]:
    """What ran in a window: ``repair``, ``swap``, ``discard``, ``episode`` (the generation moved
    otherwise) or None; the ranks a swap replaced, and which live rank sent each one's state."""
    dead = sorted({int(r) for sw in swaps for r in (getattr(sw, "dead", None) or [])})
    sources = {str(d): int(s) for sw in swaps for d, s in (getattr(sw, "sources", None) or {}).items()}
    if report is not None:
        return "repair", dead, sources
    if dead:
        return "swap", dead, sources
    if swaps:
        return "discard", dead, sources
    return ("episode" if gen != gen_start else None), dead, sources


class MemoryLog:
    """One process's windows (see the module doc).  Made before the model is built (it records the
    base there and checks that the platform can measure: :class:`MemoryProbeError` otherwise); its
    lines go to ``path`` once the process knows its identity (:meth:`open`)."""

    def __init__(self) -> None:
        if not os.access(_CLEAR_REFS, os.W_OK):  # refused here, before anything is built
            raise MemoryProbeError(f"workload.memory: {_CLEAR_REFS} is not writable: the kernel does not let this "
                                   "process reset its peak resident size (Linux >= 4.0 needed)")
        self.pid = os.getpid()
        self.base_peak_mb, self.base_mb = read_status()
        self._file: TextIO | None = None
        self._gen = 0
        self._swaps = 0

    def _write(self, row: dict[str, Any]) -> None:
        assert self._file is not None, "MemoryLog.open first"
        self._file.write(json.dumps({"pid": self.pid, **row}) + "\n")

    def open(self, path: Path, *, joined: bool, step: int, gen: int, spare: int | None = None) -> None:
        """Start writing to ``path``: the base line, then the window from the process's start through
        ``attach`` (``joined``: a spare that took this identity at frontier ``step``)."""
        peak, rss = read_status()
        self._file = open(path, "a", buffering=1)
        self._write({"window": "base", "rss_mb": self.base_mb, "peak_rss_mb": self.base_peak_mb, "spare": spare})
        self._write({"window": "join" if joined else "attach", "step": step, "gen": gen, "spare": spare,
                     "peak_rss_mb": peak, "rss_mb": rss, "tensor_mb": tensor_mb()})

    def begin(self, gen: int, swaps: int) -> None:
        """A step opens: its window starts (``gen``: the engine's generation, ``swaps``: how many swap
        records the rank holds, to tell what the window held when it closes)."""
        self._gen, self._swaps = gen, swaps
        reset_peak()

    def end(self, step: int, *, gen: int, swaps: list[Any], discarded: bool, report: Any = None) -> dict[str, Any]:
        """The step closed (after the boundary, or discarded): its window's line (returned too).
        ``swaps``: every swap record the rank holds (those past :meth:`begin`'s count ran in it)."""
        peak, rss = read_status()
        episode, dead, sources = _episode(report, list(swaps[self._swaps:]), self._gen, gen)
        row = {"window": "step", "step": step, "gen_start": self._gen, "gen": gen, "discarded": discarded,
               "report": report is not None, "episode": episode, "dead": dead, "sources": sources, "peak_rss_mb": peak,
               "rss_mb": rss, "tensor_mb": tensor_mb()}
        self._write(row)
        return row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
