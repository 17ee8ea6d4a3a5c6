"""Exit codes of a fail-stop exit (spec/implementation.md "Exit codes").

Every rank of a job exits with the code of the job-wide abort reason, so a rejection
makes every rank exit 70.  Codes are distinct from crash codes (signals, 1, 2) so that
a supervisor and a test can tell a protocol exit from a crash.

``exit_now`` is the only way the engine ends a process: it claims a process-wide exit
lock first (the main thread and the watchdog thread may race to exit; the loser blocks
until the process is gone, so exactly one ``RankExit``/``RankFail``/... record is
written), then flushes the trace and stderr and calls ``os._exit`` (never a normal
interpreter teardown, which can turn gloo errors into SIGABRT).
"""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import os
import sys
import threading
import time
from typing import Callable

from accelpact.model.state import REASON_DEADLINE, REASON_EXCEPTION, REASON_MISMATCH, REASON_REJECTED

__all__ = ["ExitCode", "code_for", "claim_exit", "exit_now", "holding_exit", "release_exit"]


class ExitCode(enum.IntEnum):
    REJECTED = 70   # contract said L2 (in-flight failure, failed guard, key outside envelope)
    MISMATCH = 71   # frontier agreement found a different (F, g)
    DEADLINE = 72   # a wait on peers expired (includes a lost control-plane store)
    EXCEPTION = 73  # an exception inside phases 2-6

    @property
    def reason(self) -> str:
        return _REASON_OF[self]


_CODE_OF = {
    REASON_REJECTED: ExitCode.REJECTED,
    REASON_MISMATCH: ExitCode.MISMATCH,
    REASON_DEADLINE: ExitCode.DEADLINE,
    REASON_EXCEPTION: ExitCode.EXCEPTION,
}
_REASON_OF = {v: k for k, v in _CODE_OF.items()}


def code_for(reason: str) -> ExitCode:
    """The exit code of a model exit reason; accepts ``abort:<reason>`` decision values too."""
    r = reason[len("abort:"):] if reason.startswith("abort:") else reason
    try:
        return _CODE_OF[r]
    except KeyError:
        raise ValueError(f"unknown exit reason {reason!r}; expected one of {sorted(_CODE_OF)}") from None


# Reentrant: the main thread may hold the claim across a store write and its record
# (``holding_exit``) and, inside that, decide to exit itself (``exit_now`` claims again).
_EXIT_LOCK = threading.RLock()


def claim_exit(blocking: bool = True) -> bool:
    """Claim the right to end the process.  Whoever claims first exits; an exit never
    releases the claim, so another thread's claim (blocking) waits until ``os._exit`` ends it."""
    if blocking:
        _EXIT_LOCK.acquire()
        return True
    return _EXIT_LOCK.acquire(blocking=False)


def release_exit() -> None:
    """Give back a claim taken before an outcome was known (see ``holding_exit``).  Must be
    called by the thread that claimed, once per claim, and only when it will not exit."""
    _EXIT_LOCK.release()


@contextlib.contextmanager
def holding_exit():
    """Hold the exit claim across one model action: a control-plane write and its trace record.

    A peer may act on the write at once, e.g. decide on a count that includes us and write
    the job abort; without the claim our watchdog could end the process between the write
    and the record, leaving a trace in which a peer acted on a step we never recorded.
    Never hold it across a wait on peers: the watchdog could not exit meanwhile."""
    claim_exit()
    try:
        yield
    finally:
        release_exit()


def exit_now(code: int, reason: str, trace=None, *, record: Callable[[], None] | None = None, claimed: bool = False) -> None:
    """Write ``record()`` (the final action record), the trace's end record and a stderr line,
    then ``os._exit(code)``.  Call with ``claimed=True`` if the caller already holds the lock."""
    if not claimed:
        claim_exit()
    try:
        if record is not None:
            record()
        if trace is not None:
            trace.end("exited", code=int(code), reason=reason)
    except Exception as exc:  # noqa: BLE001 - never let a trace error turn a fail-stop exit into a crash
        print(f"accelpact: trace write failed during exit: {exc!r}", file=sys.stderr)
    try:
        print(f"accelpact: rank pid {os.getpid()} exiting with code {int(code)} ({reason}) at t={time.monotonic():.3f}",
              file=sys.stderr, flush=True)
        if reason == REASON_DEADLINE:  # something waited past its bound: say where every thread was
            print("accelpact: the threads of this rank as it exits (a deadline expired: where was it waiting?)",
                  file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stdout.flush()
    finally:
        os._exit(int(code))
