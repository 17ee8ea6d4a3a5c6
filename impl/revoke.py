"""Revoke a process group: make every pending and future op on it fail within milliseconds.

gloo has no working abort (``abort()``/``shutdown()``/``destroy_process_group`` leave a
gloo group usable, see spec/torch-facts.md).  What breaks a gloo group for real is
its connected sockets closing.  So we record a group's sockets when it is built: the
socket inodes that appear in ``/proc/self/fd`` across construction, kept only if they are
connected TCP sockets (``getpeername`` on a duplicate succeeds: :func:`connected_tcp`).  The
group's LISTEN socket is never kept: shutting it down aborts the process.  (Reading
``/proc/net/tcp{,6}`` for the ESTABLISHED ones, as before, cost 7.7 ms per group build here, in
phase 4 of every repair, because the kernel formats every TCP socket of the namespace; the tests
keep it as the independent check, :func:`established_inodes`.)

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
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from .runtime.backends import backend as _backend

__all__ = ["REVOKED_TIMEOUT_S", "SocketRecord", "aborted", "recorded", "record_group", "hard_close", "socket_inodes", "established_inodes", "connected_tcp"]

T = TypeVar("T")
_TCP_ESTABLISHED = "01"


def socket_inodes() -> dict[int, int]:
    """fd -> socket inode for this process."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            link = os.readlink(f"/proc/self/fd/{fd}")
        except (ValueError, OSError):
            continue
        if link.startswith("socket:["):
            out[fd] = int(link[len("socket:["):-1])
    return out


def established_inodes() -> set[int]:
    """Inodes of ESTABLISHED TCP sockets (v4 and v6) in this network namespace."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    cols = line.split()
                    if len(cols) > 9 and cols[3] == _TCP_ESTABLISHED:
                        found.add(int(cols[9]))
        except OSError:
            continue
    return found


def connected_tcp(fd: int) -> bool:
    """Whether ``fd`` is a connected TCP socket (v4 or v6): a duplicate of it has a peer.  A
    listening socket has none (``ENOTCONN``); closing the duplicate leaves the socket as it was."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
            return False
        s.getpeername()
        return True
    except OSError:
        return False
    finally:
        s.close()


@dataclass(slots=True)
class SocketRecord:
    """The connected sockets of one group (fd, inode); for NCCL a weak reference to the group
    (abort goes through it).  Holding a record never keeps the group alive."""

    backend: str
    sockets: tuple[tuple[int, int], ...] = ()
    group_ref: Any = field(default=None, repr=False)
    closed: bool = False
    #: gloo: a weak reference to the group's gloo backend (not the group: the adapters' walker would
    #: count a reference to the group as a stale one), whose timeout a revoke shortens
    backend_ref: Any = field(default=None, repr=False)

    @property
    def group(self):
        return self.group_ref() if self.group_ref is not None else None


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def recorded(build: Callable[[], T], backend: str = "gloo") -> tuple[T, SocketRecord]:
    """Run ``build()`` (which constructs one process group) and record its new connected sockets."""
    before = set(socket_inodes().items())
    group = build()
    after = socket_inodes()
    new = tuple(sorted((fd, ino) for fd, ino in after.items() if (fd, ino) not in before and connected_tcp(fd)))
    # gloo needs only the sockets and its backend: no reference to the group at all (not even a weak
    # one, which the adapters' reference walker would count as a stale cached reference after a repair)
    aborts = _backend(backend).revoke == "abort"
    return group, SocketRecord(backend=backend, sockets=new, group_ref=_weak(group) if aborts else None,
                               backend_ref=None if aborts else _weak(_gloo_backend(group)))


def _gloo_backend(group: Any) -> Any:
    """``group``'s gloo backend (a bare backend is its own), or None."""
    try:
        import torch

        return group._get_backend(torch.device("cpu"))
    except (AttributeError, RuntimeError, TypeError):
        return group if hasattr(group, "set_timeout") else None


def record_group(group, backend: str = "nccl") -> SocketRecord:
    """A record for a group whose sockets we cannot see (NCCL): abort goes through the group."""
    return SocketRecord(backend=backend, sockets=(), group_ref=_weak(group))


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
#: peer's step revoke (an FSDP reduce-scatter in backward) then held its rank past the episode's
#: arrival deadline (tests/test_episode_leaks.py met it 2 times in 8).  A revoked group is replaced and
#: never used again, so its later ops may fail within this bound instead.
REVOKED_TIMEOUT_S = 1.0


def _shorten(record: SocketRecord) -> None:
    """Give ``record``'s gloo backend the timeout :data:`REVOKED_TIMEOUT_S` for its later ops
    (``ProcessGroupGloo::setTimeout`` sets the options' and every context's timeout, which each new op
    takes; spec/torch-facts.md)."""
    raw = record.backend_ref() if record.backend_ref is not None else None
    if raw is None:
        return
    try:
        raw.set_timeout(datetime.timedelta(seconds=REVOKED_TIMEOUT_S))
    except (AttributeError, RuntimeError, TypeError):
        pass  # a group being destroyed: nothing will be posted on it
