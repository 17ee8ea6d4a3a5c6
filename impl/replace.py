"""Phase 4 (RankReplace): build R's communicator for generation g+1.

* ``ReplaceAndRebind`` (torch 2.13): a fresh ``ProcessGroupGloo`` (or ``ProcessGroupNCCL``)
  over ``PrefixStore(f"{prefix}g{g_next}/pg/{name}", store)``: only the members of R take
  part and the per-generation prefix fences it from every older group.  Cached references
  then have to be rebound (phase 5).  For NCCL the old communicator is aborted.
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

__all__ = ["as_process_group", "ReplacementStrategy", "ReplaceAndRebind", "NativeReconfigure", "choose_strategy", "ReplaceError"]


class ReplaceError(RuntimeError):
    """The new communicator could not be built (a member is gone or the deadline passed)."""


def _backend_name(pg) -> str:
    try:
        return str(pg.name()).lower()
    except Exception:  # noqa: BLE001 - name() is unavailable on some wrapped groups: ask c10d
        try:
            import torch.distributed as dist

            return str(dist.get_backend(pg)).lower()
        except Exception:  # noqa: BLE001 - not a c10d group at all: assume gloo, the only other backend
            return "gloo"


def as_process_group(backend, store, group_rank: int, size: int, kind: str, name: str):
    """Wrap a raw ``ProcessGroupGloo``/``ProcessGroupNCCL`` backend in a c10d ``ProcessGroup``,
    as ``dist.new_group`` does (DDP's reducer and FSDP accept only a ``ProcessGroup``).
    The group is not registered with c10d's world: wrappers that resolve groups by name
    (FSDP2/DeviceMesh) are handled by their adapter."""
    import torch
    import torch.distributed as dist

    from .backends import backend as _backend

    b = _backend(kind)
    bt = getattr(dist.ProcessGroup.BackendType, b.name.upper())
    device = torch.device(b.device_type)
    pg = dist.ProcessGroup(store, group_rank, size)
    pg._set_default_backend(bt)
    pg._register_backend(device, bt, backend)
    from torch.distributed.distributed_c10d import GroupName

    pg._set_group_name(GroupName(name))
    return pg


class ReplacementStrategy(abc.ABC):
    needs_rebind: bool = True

    def __init__(self, prefix: str = "accelpact/") -> None:
        self.prefix = prefix
        self.last_record: _revoke.SocketRecord | None = None

    def store_prefix(self, g_next: int, name: str) -> str:
        """The generation's communicator name and store prefix (:func:`controlplane.comm_name`)."""
        from .controlplane import comm_name

        return comm_name(self.prefix, g_next, name)

    @abc.abstractmethod
    def replace(self, old_pg, g_next: int, members: tuple[int, ...], my_rank: int, store, timeout: float, name: str = "replicate"):
        """Return R's communicator for generation ``g_next``.  ``members`` are global ranks
        of R in group-rank order; ``timeout`` (seconds) bounds construction and later ops."""


class ReplaceAndRebind(ReplacementStrategy):
    needs_rebind = True

    def replace(self, old_pg, g_next, members, my_rank, store, timeout, name="replicate"):
        import torch.distributed as dist

        if my_rank not in members:
            raise ValueError(f"replace: rank {my_rank} is not a member of R={members}; only members rebuild R")
        group_rank = members.index(my_rank)
        td = datetime.timedelta(seconds=timeout)
        prefix_store = dist.PrefixStore(self.store_prefix(g_next, name), store)
        backend = _backend_name(old_pg) if old_pg is not None else "gloo"
        try:
            if "nccl" in backend:
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = td
                backend_obj = dist.ProcessGroupNCCL(prefix_store, group_rank, len(members), opts)
                new_pg = as_process_group(backend_obj, prefix_store, group_rank, len(members), "nccl", self.store_prefix(g_next, name))
                rec = _revoke.record_group(new_pg, "nccl")
                if old_pg is not None:
                    _revoke.hard_close(_revoke.record_group(old_pg, "nccl"))
            else:
                backend_obj, rec = _revoke.recorded(lambda: dist.ProcessGroupGloo(prefix_store, group_rank, len(members), td))
                new_pg = as_process_group(backend_obj, prefix_store, group_rank, len(members), "gloo", self.store_prefix(g_next, name))
                del backend_obj
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
            new_pg, rec = _revoke.recorded(lambda: (fn(**kwargs), old_pg)[1])
        except RuntimeError as exc:
            raise ReplaceError(f"reconfigure of {name} for generation {g_next} failed: {exc}") from exc
        self.last_record = rec
        return new_pg


def choose_strategy(pg, prefix: str = "accelpact/") -> ReplacementStrategy:
    """Native reconfigure when the group has it (capability check), else replace-and-rebind."""
    return NativeReconfigure(prefix) if NativeReconfigure.available(pg) else ReplaceAndRebind(prefix)
