"""The data-parallel wrappers AccelPact recovers: the one table (spec/implementation.md, "Where things go").

Adding a wrapper is one entry in :data:`WRAPPERS`: its name (the contract's *profile*), the group
kind it treats as R (``replicate`` for HSDP, ``world`` for DDP), the adapter that rebinds its
cached references, and the function that wraps the workload's model with it.  Adapters and wrap
functions are named as ``module:attribute`` and imported on use, so this table is torch-free.
Two entries may share an adapter class (FSDP1's ``HYBRID_SHARD`` and ``_HYBRID_SHARD_ZERO2``): their
``unsupported`` functions tell them apart (:func:`wrapper_of`).  This module imports no adapter:
``adapters.adapter_for`` imports it (:func:`matching`), never the other way round.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["GROUP_KINDS", "WRAPPERS", "WRAPPER_NAMES", "Wrapper", "matching", "wrapper", "wrapper_of"]

#: The groups a job builds, by kind (``workload.build_groups``): a node's shard group, the replicate
#: group of one local index, and a dedicated all-ranks data-parallel group.
GROUP_KINDS = ("shard", "replicate", "world")


@dataclass(frozen=True, slots=True)
class Wrapper:
    """One wrapper.  ``recovers``: the kind of group R is for it; ``groups``: the kinds its
    training collectives use (a fault may break any of them); ``uses_r``: the points of a step at
    which it runs collectives on R, so where a failure of R is observed (the model's
    ``Config.uses_r``; the boundary probe is always one)."""

    name: str
    recovers: str
    groups: tuple[str, ...]
    adapter: str
    wrap: str
    doc: str = ""
    uses_r: tuple[str, ...] = ("backward", "boundary")
    #: ``module:function`` of ``(module) -> str | None``: why a model under this wrapper's class is
    #: not this wrapper (e.g. FSDP1 without HYBRID_SHARD, which may be another entry of the same
    #: adapter class); "" if the class says it all
    unsupported: str = ""

    def adapter_class(self) -> Any:
        return _resolve(self.adapter)

    def wrap_fn(self) -> Any:
        return _resolve(self.wrap)


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


WRAPPERS: dict[str, Wrapper] = {w.name: w for w in (
    # HSDP: R (the replicate group) carries backward's gradient all-reduce only; forward's all-gather
    # and the optimizer step (no gradient clipping) use the shard group or nothing
    Wrapper("fsdp1-hybrid", "replicate", ("shard", "replicate"), "accelpact.impl.runtime.adapters.fsdp1:FSDP1Adapter",
            "accelpact.impl.launch.workload:wrap_fsdp1", "FSDP1 FullyShardedDataParallel, HYBRID_SHARD over (shard, replicate)",
            unsupported="accelpact.impl.runtime.adapters.fsdp1:not_hybrid_shard"),
    # ZeRO-2 over the same two groups: the parameters stay unsharded from forward to the end of
    # backward (no second all-gather in backward); the gradients are reduce-scattered in the shard group
    # and all-reduced in R like HYBRID_SHARD's, so R is used at the same points
    Wrapper("fsdp1-zero2", "replicate", ("shard", "replicate"), "accelpact.impl.runtime.adapters.fsdp1:FSDP1Adapter",
            "accelpact.impl.launch.workload:wrap_fsdp1_zero2",
            "FSDP1 FullyShardedDataParallel, _HYBRID_SHARD_ZERO2 over (shard, replicate)",
            unsupported="accelpact.impl.runtime.adapters.fsdp1:not_hybrid_shard_zero2"),
    Wrapper("fsdp2-hybrid", "replicate", ("shard", "replicate"), "accelpact.impl.runtime.adapters.fsdp2:FSDP2Adapter",
            "accelpact.impl.launch.workload:wrap_fsdp2", "FSDP2 fully_shard on a 2-D (replicate, shard) DeviceMesh (HSDP)"),
    Wrapper("ddp", "world", ("world",), "accelpact.impl.runtime.adapters.ddp:DDPAdapter",
            "accelpact.impl.launch.workload:wrap_ddp", "DistributedDataParallel over the data-parallel world group",
            # forward too: the buffers' broadcast (broadcast_buffers=True) and step 1's bucket rebuild
            uses_r=("forward", "backward", "boundary")),
)}
WRAPPER_NAMES: tuple[str, ...] = tuple(WRAPPERS)


def wrapper(name: str) -> Wrapper:
    """The wrapper called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return WRAPPERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown wrapper {name!r}; use one of {list(WRAPPER_NAMES)}") from None


def matching(module: Any) -> tuple[Wrapper, ...]:
    """The entries whose adapter wraps ``module`` best (:meth:`Adapter.matches`: a wrapped root before
    a wrapped submodule, ties in the table's order), all of that one adapter class, in table order;
    () when none does (or this torch lacks a wrapper's class).  ``adapters.adapter_for`` takes the
    first one's adapter; :func:`wrapper_of` chooses among them."""
    if not hasattr(module, "modules"):
        return ()
    try:
        scored = [(w.adapter_class().matches(module), -i, w) for i, w in enumerate(WRAPPERS.values())]
    except ImportError:
        return ()
    score, _, best = max(scored, key=lambda x: (x[0], x[1]))
    if score <= 0:
        return ()
    cls = best.adapter_class()
    return tuple(w for w in WRAPPERS.values() if w.adapter_class() is cls)


def wrapper_of(module: Any) -> Wrapper:
    """The wrapper a user's wrapped ``module`` uses: among the entries of the adapter it needs
    (:func:`matching`), the first that its ``unsupported`` does not refuse; a ValueError that says
    why (the first entry's reason) or names the supported wrappers otherwise."""
    problems = []
    for w in matching(module):
        problem = _resolve(w.unsupported)(module) if w.unsupported else None
        if not problem:
            return w
        problems.append(problem)
    if problems:
        raise ValueError(problems[0])
    raise ValueError(f"{type(module).__name__} is not wrapped by a supported wrapper; wrap it with one of "
                     + "; ".join(f"{w.name} ({w.doc})" for w in WRAPPERS.values()))
