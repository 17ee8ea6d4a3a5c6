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
from .fsdp2 import FSDP2Adapter
from .walker import RebindError, RefSite, find_references, walk, write_site
from ..wrappers import matching

__all__ = [
    "Adapter", "GenericAdapter", "FSDP1Adapter", "FSDP2Adapter", "DDPAdapter", "RebindCheck", "RebindError",
    "RefSite", "adapter_for", "find_references", "walk", "write_site", "read_site", "site_set",
    "make_gloo_group", "register_group", "unregister_group", "adopt_group_name",
]


def adapter_for(module: Any) -> Adapter:
    """The adapter of the wrapper that wraps ``module`` (each wrapper's adapter class of
    :data:`accelpact.impl.runtime.wrappers.WRAPPERS` says how it matches, :meth:`Adapter.matches`:
    a wrapped root before a wrapped submodule, ties in the table's order:
    :func:`accelpact.impl.runtime.wrappers.matching`); anything else gets the walker-backed
    ``GenericAdapter``."""
    found = matching(module)
    return found[0].adapter_class()() if found else GenericAdapter()
