"""The record of a process group a revoke goes through (:mod:`accelpact.impl.runtime.revoke`): the
connected sockets it opened while it was built (gloo), or a weak reference to it (a backend revoked
by an abort, NCCL).

The sockets are those that appear in ``/proc/self/fd`` across the group's construction, kept only
if they are connected TCP sockets (:func:`connected_tcp`); the group's LISTEN socket is never kept
(shutting it down aborts the process).  Ordering: build the group inside :func:`record_sockets` with
no other thread creating sockets at the same time.  Torch-free at import; knows no backend table
(the caller says whether the group's backend aborts).
"""

from __future__ import annotations

import os
import socket
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

__all__ = ["SocketRecord", "connected_tcp", "established_inodes", "record_group", "record_sockets", "socket_inodes"]

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


def record_sockets(build: Callable[[], T], backend: str, *, aborts: bool) -> tuple[T, SocketRecord]:
    """Run ``build()`` (which constructs one process group of ``backend``) and record its new connected
    sockets.  ``aborts``: the backend's revoke is an abort, so the record keeps a weak reference to the
    group; otherwise a weak reference to its gloo backend (whose timeout a revoke shortens)."""
    before = set(socket_inodes().items())
    group = build()
    after = socket_inodes()
    new = tuple(sorted((fd, ino) for fd, ino in after.items() if (fd, ino) not in before and connected_tcp(fd)))
    # gloo needs only the sockets and its backend: no reference to the group at all (not even a weak
    # one, which the adapters' reference walker would count as a stale cached reference after a repair)
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
