"""Phase 4 (RankReplace): build R's communicator for generation g+1.

* ``ReplaceAndRebind`` (torch 2.13): a fresh group of R's backend (:meth:`Backend.build_group`:
  ``ProcessGroupGloo`` or ``ProcessGroupNCCL`` in a c10d ``ProcessGroup``) over
  ``PrefixStore(f"{prefix}g{g_next}/pg/{name}", store)``: only the members of R take part and the
  per-generation prefix fences it from every older group.  It carries the old group's collective
  timeout (the training one: the phase deadline bounds only building it) and, on NCCL, the old
  group's device, connected eagerly, so that a missing member fails phase 4, not phase 6.  Before it
  is built the old communicator is aborted (NCCL: this group only, registration kept,
  :meth:`Backend.abort`; gloo: nothing, its revoke shut its sockets).  Cached references then have
  to be rebound (phase 5), which moves the old group's c10d name to the new one.
* ``NativeReconfigure``: when the build has an in-place ``ProcessGroup.reconfigure``
  (detected by capability, never by version string) the group object stays the same and
  nothing needs rebinding.

Old groups are released by dropping every reference: the engine keeps none after the
release, and :mod:`revoke` holds only a weak reference.  A freed gloo group's threads and
fds go away with its last reference.
"""

from __future__ import annotations

import abc
import datetime
import inspect

from . import revoke as _revoke
from ..controlplane import PREFIX, comm_name
from .backends import backend as _backend
from .backends import backend_of

__all__ = ["ReplacementStrategy", "ReplaceAndRebind", "NativeReconfigure", "choose_strategy", "ReplaceError"]


class ReplaceError(RuntimeError):
    """The new communicator could not be built (a member is gone or the deadline passed)."""


class ReplacementStrategy(abc.ABC):
    needs_rebind: bool = True

    def __init__(self, prefix: str = PREFIX) -> None:
        self.prefix = prefix
        self.last_record: _revoke.SocketRecord | None = None

    def store_prefix(self, g_next: int, name: str) -> str:
        """The generation's communicator name and store prefix (:func:`controlplane.comm_name`)."""
        return comm_name(self.prefix, g_next, name)

    @abc.abstractmethod
    def replace(self, old_pg, g_next: int, members: tuple[int, ...], my_rank: int, store, timeout: float, name: str = "replicate"):
        """Return R's communicator for generation ``g_next``.  ``members`` are global ranks
        of R in group-rank order; ``timeout`` (seconds, the phase deadline) bounds construction."""


class ReplaceAndRebind(ReplacementStrategy):
    needs_rebind = True

    def replace(self, old_pg, g_next, members, my_rank, store, timeout, name="replicate"):
        """The new group (module doc).  ``timeout`` (the phase deadline, seconds) bounds building it;
        its collectives get ``old_pg``'s collective timeout (``timeout`` when it has none)."""
        import torch.distributed as dist

        if my_rank not in members:
            raise ValueError(f"replace: rank {my_rank} is not a member of R={members}; only members rebuild R")
        be = backend_of(old_pg) if old_pg is not None else _backend("gloo")
        comm = self.store_prefix(g_next, name)
        try:
            if old_pg is not None:
                be.abort(old_pg)  # NCCL: its kernels are killed before a new communicator takes the device
            new_pg, rec = be.build_group(
                dist.PrefixStore(comm, store), members.index(my_rank), len(members), name=comm, global_ranks=members,
                device=be.device_for(old_pg) if old_pg is not None else None, connect_timeout_s=timeout,
                timeout_s=(be.timeout_of(old_pg) if old_pg is not None else None) or timeout)
        except RuntimeError as exc:
            raise ReplaceError(f"building R's generation-{g_next} communicator ({name}, members {members}) failed: {exc}") from exc
        self.last_record = rec
        return new_pg


class NativeReconfigure(ReplacementStrategy):
    """In-place reconfigure: same group object, new communicator inside (no rebind)."""

    needs_rebind = False

    @staticmethod
    def available(pg) -> bool:
        fn = getattr(pg, "reconfigure", None)
        return callable(fn)

    def replace(self, old_pg, g_next, members, my_rank, store, timeout, name="replicate"):
        import torch.distributed as dist

        fn = getattr(old_pg, "reconfigure", None)
        if not callable(fn):
            raise ReplaceError("this torch build has no ProcessGroup.reconfigure; use ReplaceAndRebind")
        prefix_store = dist.PrefixStore(self.store_prefix(g_next, name), store)
        params = inspect.signature(fn).parameters
        kwargs = {}
        for k, v in (("store", prefix_store), ("rank", members.index(my_rank)), ("size", len(members)),
                     ("timeout", datetime.timedelta(seconds=timeout)), ("generation", g_next)):
            if k in params:
                kwargs[k] = v
        try:
            new_pg, rec = _revoke.recorded(lambda: (fn(**kwargs), old_pg)[1], backend_of(old_pg).name)
        except RuntimeError as exc:
            raise ReplaceError(f"reconfigure of {name} for generation {g_next} failed: {exc}") from exc
        self.last_record = rec
        return new_pg


def choose_strategy(pg, prefix: str = PREFIX) -> ReplacementStrategy:
    """Native reconfigure when the group has it (capability check), else replace-and-rebind."""
    return NativeReconfigure(prefix) if NativeReconfigure.available(pg) else ReplaceAndRebind(prefix)
