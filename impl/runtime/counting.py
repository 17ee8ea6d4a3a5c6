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
* **collectives and point-to-point operations**: every ``torch.distributed.ProcessGroup`` method
  through which a Python caller reaches a group's backend (:data:`GLOO_ROUNDS`, one row each) is
  wrapped and counted under its own name per group size, ``coll/<origin>/<thread>/<method>@<n>``, with
  the sequential rounds of gloo's algorithm for it (``rounds/...``, :func:`rounds`).  The names are
  the methods ``torch.distributed``'s functions call, not the functions': on torch 2.13 and 2.14
  ``dist.all_gather_into_tensor`` (and ``_all_gather_base``) reach ``all_gather_single``,
  ``dist.reduce_scatter_tensor`` (and ``_reduce_scatter_base``) ``reduce_scatter_single``, the
  ``_coalescing_manager`` ``all_gather_single_coalesced`` / ``reduce_scatter_single_coalesced`` /
  ``allreduce_coalesced``, ``dist.all_gather`` and ``all_gather_object`` ``allgather``,
  ``dist.broadcast`` and ``broadcast_object_list`` ``broadcast``, ``dist.send`` / ``isend`` ``send``,
  ``dist.recv`` / ``irecv`` ``recv`` (``recv_anysource`` without a source), ``batch_isend_irecv``
  one ``send`` / ``recv`` per entry on gloo (no coalescing there), ``dist.all_to_all_single``
  ``all_to_all_single``.  FSDP2 (``fully_shard``) all-gathers with ``all_gather_single`` and
  reduce-scatters with ``reduce_scatter_single``; FSDP1 reduce-scatters with ``reduce_scatter_single``
  and all-gathers with ``all_gather_single``, or with ``allgather`` (into a list of chunks) when its
  flat parameter is on CPU, as on gloo; HSDP's replicate all-reduce is ``allreduce``; the engine's
  failure flag, commit fence and hot swap are ``allreduce`` / ``send`` / ``recv``.  Deprecated aliases
  (``_allgather_base``, ``_reduce_scatter_base``, ``allgather_into_tensor_coalesced``,
  ``reduce_scatter_tensor_coalesced``) are wrapped too, for a caller that names them directly;
  torch's own functions do not.  A method of the table that this torch does not bind is skipped.

  **Not seen** (nothing Python can wrap): what C++ issues on a group, which never passes through the
  Python ``ProcessGroup`` object: DDP's Reducer (its gradient all-reduces, and at construction the
  parameter-shape check and the module-state broadcast, ``_broadcast_coalesced``: a DDP step with the
  default reduction counts nothing; one with a Python comm hook counts what the hook calls, as the
  workload's ``ddp_per_gradient`` hook's ``allreduce``), functional collectives
  (``torch.ops._c10d_functional``: DTensor redistribution, compiled code), collectives called on a
  bare backend (``ProcessGroupGloo`` without its ``ProcessGroup``), and the backends' internal
  messages.
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
from typing import Any, Callable

from . import sockets as _sockets

__all__ = [
    "ENV", "GLOO_ROUNDS", "CountingStore", "count_group", "counts", "enabled", "install", "rounds", "snapshot",
    "socket_inodes", "wrap_store",
]

#: the switch: a folder for the per-process snapshot files
ENV = "ACCELPACT_COUNT"


def _log2ceil(n: int) -> int:
    return max(0, (n - 1).bit_length())


def _ring(n: int) -> int:
    return n - 1


def _ring_allreduce(n: int) -> int:
    return 2 * (n - 1)


def _two(n: int) -> int:
    return 2


def _one(n: int) -> int:
    return 1


def _zero(n: int) -> int:
    return 0


#: every ``ProcessGroup`` method that communicates, as torch 2.13 / 2.14 bind them: (rounds over a group
#: of n, how gloo runs it).  Rounds are the sequential message steps on the critical path of gloo's
#: algorithm as torch calls it (spec/scale-costs.md, "Rounds per collective").
_OPS: dict[str, tuple[Callable[[int], int], str]] = {
    "allreduce": (_ring_allreduce, "2(n-1): ring (gloo/allreduce.cc: UNSPECIFIED -> ring)"),
    "allreduce_coalesced": (_ring_allreduce, "2(n-1): one ring all-reduce over the flattened tensors"),
    "allgather": (_ring, "n-1: ring (gloo/allgather.cc)"),
    "all_gather_single": (_ring, "n-1: c10d::_allgather_base_ -> ProcessGroupGloo::_allgather_base -> allgather, "
                                 "ring"),
    "_allgather_base": (_ring, "n-1: deprecated alias of all_gather_single"),
    "allgather_coalesced": (_ring, "n-1: one ring all-gather over the flattened inputs"),
    "all_gather_single_coalesced": (_ring, "n-1: ProcessGroupGloo::allgather_into_tensor_coalesced -> "
                                           "allgather_coalesced, one ring all-gather"),
    "allgather_into_tensor_coalesced": (_ring, "n-1: deprecated alias of all_gather_single_coalesced"),
    "reduce_scatter": (_ring_allreduce, "2(n-1): torch's gloo reduce_scatter is a ring all-reduce then a local slice"),
    "reduce_scatter_single": (_ring_allreduce, "2(n-1): c10d::_reduce_scatter_base_ -> ProcessGroupGloo::"
                                               "reduce_scatter_tensor_coalesced: a ring all-reduce, then the local "
                                               "slice"),
    "_reduce_scatter_base": (_ring_allreduce, "2(n-1): deprecated alias of reduce_scatter_single"),
    "reduce_scatter_single_coalesced": (_ring_allreduce, "2(n-1): one ring all-reduce per tensor, all queued at "
                                                         "once (k tensors: up to k x 2(n-1) if they do not "
                                                         "overlap; counted once)"),
    "reduce_scatter_tensor_coalesced": (_ring_allreduce, "2(n-1): deprecated alias of reduce_scatter_single_coalesced"),
    "broadcast": (_log2ceil, "ceil(log2 n): binomial tree (gloo/broadcast.cc)"),
    "barrier": (_log2ceil, "ceil(log2 n): dissemination barrier (gloo/barrier.cc)"),
    "monitored_barrier": (_two, "2: every rank to rank 0, rank 0 back to each (ProcessGroupGloo::monitoredBarrier; "
                                "rank 0 handles 2(n-1) messages)"),
    "send": (_one, "1 per send (a point-to-point message; recv is its other end, 0)"),
    "recv": (_zero, "0 (counted at the send)"),
    "recv_anysource": (_zero, "0 (counted at the send)"),
    "alltoall": (_ring, "n-1"),
    "alltoall_base": (_ring, "n-1"),
    "all_to_all_single": (_ring, "n-1: c10d::alltoall_base_ -> ProcessGroupGloo::alltoall_base"),
    "gather": (_ring, "n-1"),
    "gather_single": (_ring, "n-1: as gather (torch 2.14; gloo does not implement it and raises)"),
    "gather_into_tensor": (_ring, "n-1: as gather (torch 2.14)"),
    "scatter": (_ring, "n-1"),
    "reduce": (_ring, "n-1"),
}

#: the rounds of each operation over a group of n, as text (:data:`_OPS`)
GLOO_ROUNDS: dict[str, str] = {op: text for op, (_, text) in _OPS.items()}


def rounds(op: str, n: int) -> int:
    """Sequential rounds of ``op`` (a :data:`GLOO_ROUNDS` name) over a group of ``n``; 0 for n <= 1.
    ValueError for an operation not in the table."""
    entry = _OPS.get(op)
    if entry is None:
        raise ValueError(f"no rounds known for operation {op!r}; known: {', '.join(sorted(_OPS))}")
    return entry[0](n) if n > 1 else 0


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


def install() -> None:
    """Wrap the ``ProcessGroup`` methods of :data:`GLOO_ROUNDS` that this torch binds (once per process;
    only when counting is on)."""
    global _installed
    if _installed or not enabled():
        return
    import torch.distributed as dist

    cls = dist.ProcessGroup
    for op in _OPS:
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
