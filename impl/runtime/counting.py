"""Counting instrumentation for ``accelpact bench scale``: off unless ``ACCELPACT_COUNT=<dir>`` is set.

With the variable unset every entry point is a no-op that returns its argument (:func:`wrap_store`,
:func:`count_group`) or nothing (:func:`snapshot`), so a production rank pays one dictionary lookup
at init and one ``if`` per group build.  With it set, this process counts, by instrumentation:

* **store operations**: :func:`wrap_store` returns a :class:`CountingStore`, a Python subclass of
  ``torch.distributed.Store`` that delegates every method to the real store and counts it by kind.
  c10d's pybind trampoline forwards ``set``, ``get``, ``add``, ``compare_set``, ``wait`` (both
  overloads), ``check``, ``multi_get``, ``multi_set`` and ``append`` from C++ to Python, so a
  ``dist.PrefixStore(prefix, counting_store)`` handed to gloo's rendezvous counts gloo's own gets and
  sets for real.  It does not forward ``delete_key``, ``num_keys``, ``clone``, ``list_keys``,
  ``barrier`` or the queue operations (torch 2.13: "pure virtual" or "not implemented" when reached
  through a ``PrefixStore``): a ``PrefixStore`` over a counting store must not be cloned, which is
  why :func:`init` wraps the job's raw store and its attempt store separately, each over the real
  connection (a Python-level ``clone`` of a counting store is counted and returns a counting clone).
* **process-group creations**: :func:`count_group`, one line in ``Backend.build_group`` (every
  group an episode builds) and in ``groups._new_group`` (``dist.new_group`` at init; a non-member's
  ``NON_GROUP_MEMBER`` result is counted apart).
* **collectives**: the ``torch.distributed.ProcessGroup`` methods every Python-level collective goes
  through (``dist.all_reduce`` -> ``group.allreduce``, FSDP's ``all_gather_into_tensor`` ->
  ``group._allgather_base``, the engine's flag -> ``group.allreduce`` / ``send`` / ``recv``) are
  wrapped and counted per (operation, group size), with the sequential rounds of gloo's algorithm
  (:data:`GLOO_ROUNDS`).  Not covered: collectives issued from C++ (DDP's Reducer, functional
  collectives through ``torch.ops._c10d_functional``), and the backends' own internal messages.
* **connections**: new socket inodes (``/proc/self/fd/* -> socket:[N]``) between two snapshots:
  real sockets, whatever opened them (gloo pairs, store clients).  A socket opened and closed between
  two snapshots is not seen.

Every count is keyed by its origin: the first Python frame outside torch and this module decides
``engine`` (``accelpact.impl``), ``workload`` (``accelpact.impl.launch.workload``), ``harness``
(``accelpact.testing``, ``accelpact.bench``: fault fences, injection) or ``native`` (no Python frame),
and by thread (``main`` or the thread's name without its number): background threads (the
detector's heartbeat, the watchdog's slices) are time-driven, the main thread's work step-driven.

:func:`snapshot` appends one JSON line (the cumulative counts, the socket deltas, RSS, time) to
``<dir>/counts-p<pid>.ndjson``: a line per snapshot survives a SIGKILL, which an at-exit file
would not (workers leave through ``os._exit``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from typing import Any

from . import sockets as _sockets

__all__ = [
    "ENV", "GLOO_ROUNDS", "CountingStore", "count_group", "counts", "enabled", "install", "rounds", "snapshot",
    "socket_inodes", "wrap_store",
]

#: the switch: a folder for the per-process snapshot files
ENV = "ACCELPACT_COUNT"

#: sequential rounds (message steps on the critical path) of one gloo collective over a group of n,
#: from gloo's algorithms as torch 2.13 calls them (spec/scale-costs.md, "Rounds per collective")
GLOO_ROUNDS: dict[str, str] = {
    "allreduce": "2(n-1): ring (gloo/allreduce.cc: UNSPECIFIED -> ring)",
    "allreduce_coalesced": "2(n-1): ring",
    "allgather": "n-1: ring (gloo/allgather.cc)",
    "_allgather_base": "n-1: ring",
    "allgather_coalesced": "n-1: ring",
    "allgather_into_tensor_coalesced": "n-1: ring",
    "reduce_scatter": "2(n-1): torch's gloo reduce_scatter is a ring all-reduce then a local slice",
    "_reduce_scatter_base": "2(n-1): as reduce_scatter (ProcessGroupGloo::reduce_scatter_tensor_coalesced)",
    "reduce_scatter_tensor_coalesced": "2(n-1): as reduce_scatter",
    "broadcast": "ceil(log2 n): binomial tree (gloo/broadcast.cc)",
    "barrier": "ceil(log2 n): dissemination barrier (gloo/barrier.cc)",
    "send": "1 per send (a point-to-point message; recv is its other end, 0)",
    "recv": "0 (counted at the send)",
    "alltoall": "n-1", "alltoall_base": "n-1", "gather": "n-1", "scatter": "n-1", "reduce": "n-1",
}


def _log2ceil(n: int) -> int:
    return max(0, (n - 1).bit_length())


def rounds(op: str, n: int) -> int:
    """Sequential rounds of ``op`` over a group of ``n`` (:data:`GLOO_ROUNDS`); 0 for n <= 1."""
    if n <= 1 or op == "recv":
        return 0
    if op == "send":
        return 1
    if op in ("broadcast", "barrier"):
        return _log2ceil(n)
    if op.startswith("allreduce") or "reduce_scatter" in op:
        return 2 * (n - 1)
    return n - 1


# ------------------------------------------------------------------------------------------ state

_lock = threading.Lock()
_counts: dict[str, int] = {}
_installed = False
_seen_sockets: set[int] = set()
_last_sockets: set[int] = set()
_t0 = time.monotonic()


def enabled() -> bool:
    """Whether counting is on in this process (``ACCELPACT_COUNT`` names a folder)."""
    return bool(os.environ.get(ENV))


def counts() -> dict[str, int]:
    """A copy of this process's cumulative counts, keyed ``category/origin/thread/what``."""
    with _lock:
        return dict(_counts)


def _bump(key: str, n: int = 1) -> None:
    with _lock:
        _counts[key] = _counts.get(key, 0) + n


_SKIP = ("torch.", "accelpact.impl.runtime.counting", "threading", "contextlib", "functools")
_THREAD_NUM = re.compile(r"[-_ ]?\d+$")


def _origin() -> str:
    """``origin/thread`` of the current call (module doc)."""
    f: Any = sys._getframe(2)
    name = ""
    while f is not None:
        name = f.f_globals.get("__name__", "") or ""
        if not (name == "torch" or name.startswith(_SKIP)):
            break
        f = f.f_back
        name = ""
    if not name:
        origin = "native"
    elif name.startswith(("accelpact.testing", "accelpact.bench", "__main__")):
        origin = "harness"
    elif name.startswith("accelpact.impl.launch.workload"):
        origin = "workload"
    elif name.startswith("accelpact"):
        origin = "engine"
    else:
        origin = "other"
    t = threading.current_thread()
    thread = "main" if t is threading.main_thread() else (_THREAD_NUM.sub("", t.name) or "thread")
    return f"{origin}/{thread}"


# ------------------------------------------------------------------------------------------ store

def _store_base() -> type:
    import torch.distributed as dist

    return dist.Store


class _Lazy:
    cls: type | None = None


def _counting_class() -> type:
    """:class:`CountingStore` is built on first use (no torch import at module level)."""
    if _Lazy.cls is not None:
        return _Lazy.cls
    base = _store_base()

    class CountingStore(base):  # type: ignore[misc, valid-type]  # torch.distributed.Store, resolved at run time
        """A ``torch.distributed.Store`` that counts every operation by kind, then delegates."""

        def __init__(self, real: Any) -> None:
            super().__init__()
            self.real = real

        def _c(self, op: str) -> None:
            _bump(f"store/{_origin()}/{op}")

        def set(self, key, value):
            self._c("set")
            return self.real.set(key, value)

        def get(self, key):
            self._c("get")
            return self.real.get(key)

        def add(self, key, value):
            self._c("add")
            return self.real.add(key, value)

        def compare_set(self, key, expected, desired):
            self._c("compare_set")
            return self.real.compare_set(key, expected, desired)

        def wait(self, keys, timeout=None):
            self._c("wait")
            return self.real.wait(keys) if timeout is None else self.real.wait(keys, timeout)

        def check(self, keys):
            self._c("check")
            return self.real.check(keys)

        def multi_get(self, keys):
            self._c("multi_get")
            return self.real.multi_get(keys)

        def multi_set(self, keys, values):
            self._c("multi_set")
            return self.real.multi_set(keys, values)

        def append(self, key, value):
            self._c("append")
            return self.real.append(key, value)

        def delete_key(self, key):
            self._c("delete_key")
            return self.real.delete_key(key)

        def num_keys(self):
            self._c("num_keys")
            return self.real.num_keys()

        def clone(self):
            self._c("clone")
            return type(self)(self.real.clone())

        def set_timeout(self, timeout):
            return self.real.set_timeout(timeout)

        @property
        def timeout(self):
            return self.real.timeout

        def __getattr__(self, name: str) -> Any:  # port, host, libuvBackend ...: the real store's
            if name == "real":
                raise AttributeError(name)
            return getattr(self.real, name)

    _Lazy.cls = CountingStore
    return CountingStore


def CountingStore(real: Any) -> Any:  # noqa: N802 - a constructor by its use
    """A counting store over ``real`` (module doc)."""
    return _counting_class()(real)


def real_store(store: Any) -> Any:
    """The store a counting store wraps (``store`` itself otherwise)."""
    return getattr(store, "real", store) if _Lazy.cls is not None and isinstance(store, _Lazy.cls) else store


def wrap_store(store: Any) -> Any:
    """``store`` counted when counting is on (and the collectives wrapped: :func:`install`); else ``store``."""
    if not enabled():
        return store
    install()
    return CountingStore(real_store(store))


# --------------------------------------------------------------------------------- groups, collectives

def count_group(obj: Any, backend: str = "") -> Any:
    """Count one process-group creation (``obj``: the group, or a tuple whose first item is it); returns ``obj``."""
    if not enabled():
        return obj
    pg = obj[0] if isinstance(obj, tuple) else obj
    member = pg is not None and type(pg).__name__ != "int" and repr(pg) != "GroupMember.NON_GROUP_MEMBER"
    try:
        import torch.distributed as dist

        member = member and pg is not dist.GroupMember.NON_GROUP_MEMBER
    except (ImportError, AttributeError):
        pass
    size = "?"
    if member:
        try:
            size = str(int(pg.size()))
        except (AttributeError, RuntimeError, TypeError, ValueError):
            pass
    _bump(f"groups/{_origin()}/{backend or 'unknown'}" + (f"@{size}" if member else "-nonmember"))
    return obj


_COLLECTIVES = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
                "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
                "reduce_scatter_tensor_coalesced", "broadcast", "barrier", "send", "recv", "alltoall", "alltoall_base",
                "gather", "scatter", "reduce")


def install() -> None:
    """Wrap the ``ProcessGroup`` collective methods (once per process; only when counting is on)."""
    global _installed
    if _installed or not enabled():
        return
    import torch.distributed as dist

    cls = dist.ProcessGroup
    for op in _COLLECTIVES:
        orig = getattr(cls, op, None)
        if orig is None:
            continue

        def wrapped(self, *args, _op=op, _orig=orig, **kwargs):
            try:
                n = int(self.size())
            except (RuntimeError, AttributeError):
                n = 0
            o = _origin()
            _bump(f"coll/{o}/{_op}@{n}")
            r = rounds(_op, n)
            if r:
                _bump(f"rounds/{o}/{_op}", r)
            return _orig(self, *args, **kwargs)

        setattr(cls, op, wrapped)
    _installed = True


# ---------------------------------------------------------------------------------------- sockets

def socket_inodes() -> set[int]:
    """The socket inodes this process holds open (:func:`accelpact.impl.runtime.sockets.socket_inodes`)."""
    return set(_sockets.socket_inodes().values())


def _rss_kb() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def snapshot(label: str, **info: Any) -> dict | None:
    """Append this process's cumulative counts, with the sockets opened since the previous snapshot,
    to ``<ACCELPACT_COUNT>/counts-p<pid>.ndjson``; the record (None when counting is off)."""
    global _last_sockets
    folder = os.environ.get(ENV)
    if not folder:
        return None
    now = socket_inodes()
    with _lock:
        new = now - _seen_sockets
        _seen_sockets.update(now)
        closed = len(_last_sockets - now)
        _last_sockets = now
        rec = {"label": label, **info, "pid": os.getpid(), "rank_env": os.environ.get("RANK"), "t": time.monotonic(),
               "t_rel": time.monotonic() - _t0, "counts": dict(_counts), "sockets_open": len(now),
               "sockets_new": len(new), "sockets_closed": closed, "rss_kb": _rss_kb()}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"counts-p{os.getpid()}.ndjson"), "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    return rec
