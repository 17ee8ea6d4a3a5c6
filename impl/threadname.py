"""The engine's threads under their own names in the kernel, for tools outside the process.

Python (3.11-3.13) names a ``threading.Thread`` for Python only: ``ps -L``, ``/proc/<pid>/task/*/comm``
and the soak's leak check (``accelpact.testing.soak.live.proc_counts``) see every Python thread under
the interpreter's name, so a thread that appeared between two samples cannot be told from another.
:class:`EngineThread` sets the thread's kernel name (Linux ``prctl(PR_SET_NAME)``, at most 15 bytes)
from its Python name, without the ``accelpact-`` prefix, as it starts: ``watchdog-revoke``,
``retire``, ``reaper``, ``detector-r2``.  Elsewhere (or if ``prctl`` is missing) it is a plain thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

__all__ = ["EngineThread", "kernel_name", "set_kernel_name"]

PREFIX = "accelpact-"
_PR_SET_NAME = 15
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True) if sys.platform.startswith("linux") else None


def kernel_name(name: str) -> str:
    """The kernel name of a thread called ``name``: the prefix dropped, cut to 15 bytes."""
    short = name[len(PREFIX):] if name.startswith(PREFIX) else name
    return short.encode()[:15].decode(errors="ignore")


def set_kernel_name(name: str) -> bool:
    """Name the calling thread ``kernel_name(name)`` in the kernel; False where that is not possible."""
    if _LIBC is None or not hasattr(_LIBC, "prctl"):
        return False
    return _LIBC.prctl(_PR_SET_NAME, ctypes.c_char_p(kernel_name(name).encode()), 0, 0, 0) == 0


class EngineThread(threading.Thread):
    """A ``threading.Thread`` that names itself in the kernel as it starts (module doc)."""

    def run(self) -> None:
        set_kernel_name(self.name)
        super().run()
