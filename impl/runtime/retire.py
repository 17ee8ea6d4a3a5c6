"""Retiring groups off the critical path: one retiring thread per process, reapers of abandoned ops,
and the wait for the engine's threads at a job's end.

Destroying a gloo ``ProcessGroup`` tears down its pairs and worker threads (tens of ms, GIL
released); a repair's phase 5 and a hot swap hand the replaced groups here instead of dropping them
inline.  Contrast :func:`collect_off_path`, which collects the reference cycles that keep a rebuilt
model's old generation alive.  Timings: bench/README.md, "Retiring groups".
"""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
import time

from typing import Any, Callable

from ..threadname import EngineThread

__all__ = ["collect_off_path", "reap", "retire_off_path", "settle_threads", "start_retirer", "trim_heap"]

_RETIRE_QUEUE: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
_RETIRE_LOCK = threading.Lock()
_RETIRER: threading.Thread | None = None

#: Threads of the engine that the job's end need not wait for: the retiring thread idles in a queue's
#: get (it never returns into C++ code) once the queue is drained.
_IDLE_AT_END = ("accelpact-retire",)


#: The pause a full collection announces to the failure detector (``Detector.quiet``): it holds the
#: GIL for hundreds of milliseconds with a model's objects (0.46 s for 240,000 objects on the 2-core
#: machine under load), longer than gloo's ``dead_after_s`` (0.8 s) once the machine is loaded more.
COLLECT_QUIET_S = 5.0


_LIBC: Any = None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``), after the
    collection that freed a rebuilt model's old generation: the allocator otherwise keeps those pages
    resident, and each episode would raise the rank's resident memory by the old wrapper's size for
    good (bench/README.md, "Episode memory": the drift).  The call releases the GIL (ctypes) and takes
    the heap's arena locks for its duration (milliseconds; once per episode, on this thread).  False
    where the C library has no ``malloc_trim`` (not glibc): nothing done."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _LIBC = False
    if _LIBC is False:
        return False
    _LIBC.malloc_trim(0)
    return True


def _drop(box: list | None, done: threading.Event, quiet: Callable[[float], Any] | None = None) -> None:
    """Empty ``box`` (a group's destructor runs here, if this was its last reference), or, for None,
    collect the interpreter's reference cycles (inside ``quiet(COLLECT_QUIET_S)`` when given); then set
    ``done``, even if a destructor raised (it must end neither the thread nor a wait on ``done``)."""
    try:
        if box is None:
            with quiet(COLLECT_QUIET_S) if quiet is not None else contextlib.nullcontext():
                gc.collect()
            trim_heap()
        else:
            box.clear()
    except Exception:  # noqa: BLE001 - a destructor's error must not end the retiring or reaping thread
        pass
    done.set()


def _retirer() -> None:
    while True:
        _drop(*_RETIRE_QUEUE.get())


def start_retirer() -> None:
    """Start this process's retiring thread (``accelpact-retire``) unless it runs.  Every engine calls
    it at attach, so that a rank's thread count is steady from attach on (a leak check compares it
    between episodes)."""
    global _RETIRER
    with _RETIRE_LOCK:
        if _RETIRER is None or not _RETIRER.is_alive():
            _RETIRER = EngineThread(target=_retirer, name="accelpact-retire", daemon=True)
            _RETIRER.start()


def retire_off_path(box: list) -> threading.Event:
    """Drop the references in ``box`` (a replaced communicator) on the retiring thread; returns the
    event set once ``box`` was emptied.  If something else still holds the group (a reaped work, a
    socket record), it is destroyed where that reference goes."""
    start_retirer()
    done = threading.Event()
    _RETIRE_QUEUE.put((box, done))
    return done


def collect_off_path(quiet: Callable[[float], Any] | None = None) -> threading.Event:
    """Collect reference cycles on the retiring thread; the event is set once done.  For an episode
    that rebuilt the model (a hot swap, a discard): the retired engine, its guard's hooks and the old
    wrapper refer to each other, so they, and through the wrapper every group of the old generation,
    are freed only by a collection of the cycles.  Call it once the old generation is unreachable
    (the second boundary of the new generation).  ``quiet``: the rank's ``Detector.quiet`` (the
    collection holds the GIL, so the heartbeat thread stands still: announced, peers do not take the
    pause for a death)."""
    start_retirer()
    done = threading.Event()
    _RETIRE_QUEUE.put((None, done, quiet))
    return done


def reap(work: object, group: object) -> threading.Event:
    """Hold an abandoned op's group on a reaper thread until the op ends (its own timeout at the
    latest): dropping the last reference to a gloo group joins its worker threads, which would block
    the caller.  Returns the event set once the op ended and the references went."""
    done = threading.Event()
    box = [work, group]
    del work, group
    EngineThread(target=_reap, args=(box, done), name="accelpact-reaper", daemon=True).start()
    return done


def _reap(box: list, done: threading.Event) -> None:
    """``box`` = [work, group], emptied here (a thread's ``args`` tuple would hold them until the
    thread ends, after ``done``)."""
    try:
        box[0].wait()
    except Exception:  # noqa: BLE001 - the op failed, as expected of an abandoned op
        pass
    finally:
        _drop(box, done)


def settle_threads(timeout_s: float = 10.0) -> list[str]:
    """At the job's normal end, after every watchdog was stopped and woken: wait (at most
    ``timeout_s`` in all) until the retiring thread dropped every replaced group and every other
    ``accelpact-*`` thread of this process ended; the names of those still running after that.

    A daemon thread still inside a C++ call when the interpreter finalizes (a group's destructor, a
    store wait, an op's wait) is ended by ``pthread_exit`` once the call returns, and the forced
    unwind through torch's C++ frames aborts the process (exit -6)."""
    deadline = time.monotonic() + timeout_s
    retire_off_path([]).wait(timeout_s)  # a sentinel: set once every box queued before it was dropped
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and t.daemon and t.name.startswith("accelpact-") and t.name not in _IDLE_AT_END:
            t.join(max(0.0, deadline - time.monotonic()))
    return sorted(t.name for t in threading.enumerate()
                  if t is not me and t.daemon and t.is_alive() and t.name.startswith("accelpact-")
                  and t.name not in _IDLE_AT_END)
