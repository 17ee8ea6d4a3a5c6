"""The record of a process group a revoke goes through (:mod:`accelpact.impl.runtime.revoke`): the
connected sockets it opened while it was built and a weak reference to its gloo backend (whose
timeout a revoke shortens), or a weak reference to the group (a backend revoked by an abort, NCCL).

The sockets are those that appear in ``/proc/self/fd`` across the group's construction, kept only
if they are connected TCP sockets (:func:`connected_tcp`); the group's LISTEN socket is never kept
(shutting it down aborts the process).  Ordering: build the group inside :func:`record_sockets` with
no other thread creating sockets at the same time.  Torch-free at import; knows no backend table
(the caller says whether the group's backend aborts).

The gloo backend's reference: ``ProcessGroup._get_backend`` hands out a pybind11 wrapper of the C++
backend that lives only while Python refers to it, so a weak reference to what it returns dies
with the caller's temporary.  :data:`_GLOO_BACKENDS` keeps that wrapper for as long as the group's
own Python object lives (weakly keyed by the group), and the record refers to the wrapper weakly:
the record keeps neither the group nor its backend alive.
"""

from __future__ import annotations

import os
import socket
import sys
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
    #: count a reference to the group as a stale one), whose timeout a revoke shortens; alive as long
    #: as the group's Python object (:meth:`bind`)
    backend_ref: Any = field(default=None, repr=False)

    @property
    def group(self):
        return self.group_ref() if self.group_ref is not None else None

    def bind(self, group: Any) -> None:
        """Make ``group``'s gloo backend the one whose timeout a revoke of this record shortens
        (:attr:`backend_ref`).  ``group``: a c10d ``ProcessGroup`` (its gloo backend is kept while the
        group's Python object lives), or a bare ``ProcessGroupGloo`` that its caller holds.  For a
        record made before its group existed (:meth:`Backend.build_group` records the bare backend it
        then registers in a new ``ProcessGroup``).  A group without a gloo backend leaves None."""
        self.backend_ref = _backend_ref(group)


#: group -> its gloo backend's Python wrapper, held as long as the group's Python object lives (the
#: module docstring): what a record's :attr:`SocketRecord.backend_ref` refers to
_GLOO_BACKENDS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _default_group() -> Any:
    """The default process group, or None (not initialised, or torch.distributed never imported:
    then no group exists yet; importing it here would make this module import torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.distributed_c10d._get_default_group()


def record_sockets(build: Callable[[], T], backend: str, *, aborts: bool) -> tuple[T, SocketRecord]:
    """Run ``build()`` (which constructs one process group of ``backend``) and record its new connected
    sockets.  ``aborts``: the backend's revoke is an abort, so the record keeps a weak reference to the
    group; otherwise a weak reference to its gloo backend (whose timeout a revoke shortens:
    :meth:`SocketRecord.bind`).  A ``build`` that returns None and creates the default group
    (``init_process_group``) recorded the default group: on NCCL its record refers to it, so a wide
    revoke aborts it (before, the record referred to nothing and the default group was never aborted)."""
    had_default = _default_group() is not None
    before = set(socket_inodes().items())
    group = build()
    after = socket_inodes()
    new = tuple(sorted((fd, ino) for fd, ino in after.items() if (fd, ino) not in before and connected_tcp(fd)))
    # gloo needs only the sockets and its backend: no reference to the group at all (not even a weak
    # one, which the adapters' reference walker would count as a stale cached reference after a repair)
    built = _default_group() if group is None and not had_default else group
    rec = SocketRecord(backend=backend, sockets=new, group_ref=_weak(built) if aborts else None)
    if not aborts:
        rec.bind(built)
    return group, rec


def _backend_ref(group: Any) -> Any:
    """A weak reference to ``group``'s gloo backend (a bare backend is its own; the caller holds it),
    alive as long as ``group``'s Python object (:data:`_GLOO_BACKENDS`); None if it has none."""
    if group is None:
        return None
    get = getattr(group, "_get_backend", None)
    if get is None:  # a bare backend (ProcessGroupGloo), or not a group at all
        return _weak(group) if hasattr(group, "set_timeout") else None
    try:
        import torch

        raw = get(torch.device("cpu"))
    except (AttributeError, RuntimeError, TypeError):  # no CPU backend (an NCCL group)
        return None
    if not hasattr(raw, "set_timeout"):
        return None
    try:
        _GLOO_BACKENDS[group] = raw
    except TypeError:  # a group that cannot be weakly referenced: no reference that outlives this call
        return None
    return _weak(raw)


def record_group(group, backend: str = "nccl") -> SocketRecord:
    """A record for a group whose sockets we cannot see (NCCL): abort goes through the group."""
    return SocketRecord(backend=backend, sockets=(), group_ref=_weak(group))
