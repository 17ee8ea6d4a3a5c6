"""Revoke a process group: make every pending and future op on it fail within milliseconds.

gloo has no working abort (``abort()``/``shutdown()``/``destroy_process_group`` leave a
gloo group usable, see spec/torch-facts.md).  What breaks a gloo group for real is
its connected sockets closing.  So we record a group's sockets when it is built (:mod:`.sockets`): the
socket inodes that appear in ``/proc/self/fd`` across construction, kept only if they are
connected TCP sockets (``getpeername`` on a duplicate succeeds: :func:`connected_tcp`).  The
group's LISTEN socket is never kept: shutting it down aborts the process.  (``/proc/net/tcp{,6}``
is not read on the repair path: the kernel formats every TCP socket of the namespace for it, too
slow for every group build of phase 4; the tests keep it as the independent check,
:func:`established_inodes`.)

``hard_close`` shuts down a dup of each recorded fd (``SHUT_RDWR`` reaches the shared
socket, so the gloo thread blocked on it wakes with an error), after checking that the fd
still names the recorded inode (fds are reused once a group is freed; we must never touch
a stranger's socket).  NCCL groups are aborted, this group only, keeping its c10d registration
(:meth:`accelpact.impl.runtime.backends.Backend.abort`): a rebind moves the old group's name to the new one.

Ordering: construct the group inside :func:`recorded` with no other thread creating
sockets at the same time (the watchdog's store connection is made before).
"""

from __future__ import annotations

import datetime
import os
import socket
import stat
from typing import Callable, Sequence, TypeVar

from .backends import backend as _backend
from .sockets import SocketRecord, connected_tcp, established_inodes, record_sockets, socket_inodes
from .sockets import record_group as _record_group

__all__ = ["REVOKED_TIMEOUT_S", "SocketRecord", "aborted", "recorded", "record_group", "hard_close", "hard_close_all", "socket_inodes", "established_inodes", "connected_tcp"]

T = TypeVar("T")


def recorded(build: Callable[[], T], backend: str = "gloo") -> tuple[T, SocketRecord]:
    """Run ``build()`` (which constructs one process group of ``backend``, a name of
    :data:`~accelpact.impl.runtime.backends.BACKENDS`) and record its new connected sockets
    (:func:`~accelpact.impl.runtime.sockets.record_sockets`)."""
    return record_sockets(build, backend, aborts=_backend(backend).revoke == "abort")


def record_group(group, backend: str = "nccl") -> SocketRecord:
    """A record for a group whose sockets were not recorded (NCCL; a user's mesh): an abort goes through
    the group.  On a ``sockets`` backend (gloo) no socket is known, so its revoke can only give the
    group's later ops :data:`REVOKED_TIMEOUT_S` (:meth:`SocketRecord.bind`)."""
    rec = _record_group(group, backend)
    if _backend(backend).revoke != "abort":
        rec.bind(group)
    return rec


def aborted(record: SocketRecord | None) -> bool:
    """Whether ``record``'s group was revoked by an abort (NCCL): then a work on it that reports
    completion may have been cut short by the abort (an aborted NCCL communicator no longer reports
    errors to its works), and its result is not to be trusted.  A gloo revoke makes pending ops fail."""
    return record is not None and record.closed and _backend(record.backend).revoke == "abort"


def _same_socket(fd: int, inode: int) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_ino == inode


def hard_close_all(records: Sequence[SocketRecord | None]) -> int:
    """:func:`hard_close` of several groups at once: the communicators of an ``abort`` backend
    (NCCL) are aborted together in one bracket (:meth:`Backend.abort_all`: serial aborts can
    deadlock), the sockets of the others shut down.  Returns the sockets shut down."""
    recs = list({id(r): r for r in records if r is not None}.values())  # each once (records are unhashable)
    n = 0
    by_backend: dict[str, list[SocketRecord]] = {}
    for rec in recs:
        if _backend(rec.backend).revoke == "abort":
            if rec.group is not None and not rec.closed:
                by_backend.setdefault(rec.backend, []).append(rec)
        else:
            n += hard_close(rec)
    for name, batch in by_backend.items():
        for rec in batch:
            rec.closed = True
        try:
            _backend(name).abort_all([rec.group for rec in batch])
        except RuntimeError:  # DistBackendError: an abort outlived its group's timeout; revoked either way
            pass
    return n


def hard_close(record: SocketRecord) -> int:
    """Revoke: shut down the group's connected sockets (gloo) or abort its communicator (NCCL:
    :meth:`~accelpact.impl.runtime.backends.Backend.abort`, which keeps the group's c10d name and ranks).
    Returns the number of sockets shut down.  Idempotent; safe from any thread."""
    be = _backend(record.backend)
    if be.revoke == "abort":
        group = record.group
        if group is not None and not record.closed:
            record.closed = True
            try:
                be.abort(group)
            except RuntimeError:  # DistBackendError: ncclCommAbort outlived the group's timeout
                pass  # the group is revoked either way: aborted(record) is True, its results are not trusted
        return 0
    _shorten(record)  # first: an op posted once the sockets are down must already take the short timeout
    n = 0
    for fd, inode in record.sockets:
        try:
            dup = os.dup(fd)  # dup first, then check the dup: no window for fd reuse
        except OSError:
            continue
        if not _same_socket(dup, inode):
            os.close(dup)  # the group is gone and the fd was reused: not ours any more
            continue
        s = socket.socket(fileno=dup)
        try:
            s.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:
            pass
        finally:
            s.close()  # closes only the dup
    record.closed = True
    return n


#: A revoked gloo group's collective timeout.  An op already pending when its sockets are shut down
#: fails at once; but an op posted on them afterwards, while none was pending at the shutdown, can stay
#: blocked until the group's timeout (spec/torch-facts.md): a wrapper's collective posted just after a
#: peer's step revoke (an FSDP reduce-scatter in backward) would then hold its rank past the episode's
#: arrival deadline (see bench/README.md, K6).  A revoked group is replaced and
#: never used again, so its later ops may fail within this bound instead.
REVOKED_TIMEOUT_S = 1.0


def _shorten(record: SocketRecord) -> None:
    """Give ``record``'s gloo backend the timeout :data:`REVOKED_TIMEOUT_S` for its later ops
    (``ProcessGroupGloo::setTimeout`` sets the options' and every context's timeout, which each op
    posted afterwards takes; spec/torch-facts.md).  An op already posted keeps the timeout it was
    posted with (gloo's waits take theirs when they start).  The backend is reached through the
    record's weak reference, alive while the group's Python object is (:meth:`SocketRecord.bind`)."""
    raw = record.backend_ref() if record.backend_ref is not None else None
    if raw is None:
        return
    try:
        raw.set_timeout(datetime.timedelta(seconds=REVOKED_TIMEOUT_S))
    except (AttributeError, RuntimeError, TypeError):
        pass  # a group being destroyed: nothing will be posted on it
