"""Wrapper adapters: discover every cached reference to a process group once, rebind it fast,
verify with the generic walker (model action ``RankRebind``, invariant S5).

    adapter = adapter_for(module)
    sites = adapter.discover(module, old_pg)
    adapter.rebind(module, sites, old_pg, new_pg)
    check = adapter.verify(module, sites, old_pg, new_pg)   # RebindCheck(ok, stale, total, detail)
"""
from __future__ import annotations

from typing import Any

from .base import (Adapter, GenericAdapter, RebindCheck, adopt_group_name, make_gloo_group, read_site,
                   register_group, site_set, unregister_group)
from .ddp import DDPAdapter
from .fsdp1 import FSDP1Adapter
from .fsdp2 import FSDP2Adapter, is_fsdp2
from .walker import RebindError, RefSite, find_references, walk, write_site

__all__ = [
    "Adapter", "GenericAdapter", "FSDP1Adapter", "FSDP2Adapter", "DDPAdapter", "RebindCheck", "RebindError",
    "RefSite", "adapter_for", "find_references", "walk", "write_site", "read_site", "site_set",
    "make_gloo_group", "register_group", "unregister_group", "adopt_group_name",
]


def adapter_for(module: Any) -> Adapter:
    """Pick the adapter for a wrapped model: FSDP1 root (or any FSDP1 inside), FSDP2 ``fully_shard``
    state, DDP; anything else gets the walker-backed ``GenericAdapter``."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:
        return GenericAdapter()
    if not hasattr(module, "modules"):
        return GenericAdapter()
    if isinstance(module, DDP):
        return DDPAdapter()
    if isinstance(module, FSDP) or any(isinstance(m, FSDP) for m in module.modules()):
        return FSDP1Adapter()
    if is_fsdp2(module):
        return FSDP2Adapter()
    if any(isinstance(m, DDP) for m in module.modules()):
        return DDPAdapter()
    return GenericAdapter()
