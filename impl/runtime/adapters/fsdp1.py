"""FSDP1 (``FullyShardedDataParallel``) adapter: the targeted list of cached group references.

One adapter for both hybrid strategies the wrapper table has (``fsdp1-hybrid``: HYBRID_SHARD,
``fsdp1-zero2``: _HYBRID_SHARD_ZERO2): they cache the same groups in the same places.

Measured (spec/torch-facts.md): HYBRID_SHARD with L wrapped layers + root caches the replicate group
2(L+1) times (``_inter_node_pg`` and the comm-hook ``DefaultState.process_group``, a ``__slots__``
attribute of ``_inter_node_state``) and the shard group 2(L+1)+1 times (``process_group``,
``FlatParamHandle.process_group``, one shared ``_ExecOrderData.process_group``). With
``device_mesh=`` the mesh's ``_pg_registry`` holds one more.

Ordering: call ``discover`` after the first forward when the target is the shard group (the
``_ExecOrderData`` reference appears then); the replicate group's sites exist from construction.
"""
from __future__ import annotations

from typing import Any

from .base import Adapter, wraps_with
from .walker import ATTR, KEY, SLOT, RefSite

_STATE_ATTRS = ("process_group", "_inter_node_pg")


#: the FSDP1 sharding strategies AccelPact recovers (each the ``unsupported`` test of one wrapper of
#: ``impl/runtime/wrappers.py``): both shard within a shard group and replicate over R
HYBRID_STRATEGIES = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


def strategy_problem(module: Any, wanted: str) -> str | None:
    """Why this FSDP1 model is not the wrapper of sharding strategy ``wanted`` (one of
    :data:`HYBRID_STRATEGIES`), or None.  AccelPact repairs R, the replicate group of a hybrid
    strategy (a replica holds every shard); FULL_SHARD, SHARD_GRAD_OP and NO_SHARD over one group have
    no replicate group to repair, so they are no FSDP1 wrapper of the table; a model whose units mix
    the two hybrid strategies is neither."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    used = sorted({m.sharding_strategy.name for m in module.modules() if isinstance(m, FSDP)})
    if used == [wanted]:
        return None
    bad = [name for name in used if name not in HYBRID_STRATEGIES]
    if bad:
        return (f"FSDP1 with sharding_strategy {', '.join(bad)} has no replicate group to repair in place; AccelPact "
                "recovers FSDP1 as HYBRID_SHARD or _HYBRID_SHARD_ZERO2 (ZeRO-2): wrap with "
                "sharding_strategy=ShardingStrategy.HYBRID_SHARD and process_group=(job.shard_group, job.replicate_group)")
    if len(used) > 1:
        return (f"FSDP1 units with sharding strategies {', '.join(used)} in one model: AccelPact recovers one "
                "hybrid strategy per model; wrap every unit with the same sharding_strategy")
    return f"FSDP1 with sharding_strategy {', '.join(used)} is not {wanted}"


def not_hybrid_shard(module: Any) -> str | None:
    """``fsdp1-hybrid``'s ``Wrapper.unsupported``: why ``module`` is not FSDP1 HYBRID_SHARD."""
    return strategy_problem(module, "HYBRID_SHARD")


def not_hybrid_shard_zero2(module: Any) -> str | None:
    """``fsdp1-zero2``'s ``Wrapper.unsupported``: why ``module`` is not FSDP1 _HYBRID_SHARD_ZERO2."""
    return strategy_problem(module, "_HYBRID_SHARD_ZERO2")


def _mesh_sites(mesh: Any, old_pg: Any, path: str, seen: set[int]) -> list[RefSite]:
    out: list[RefSite] = []
    if mesh is None:
        return out
    meshes = [mesh]
    root = getattr(mesh, "_get_root_mesh", None)
    if root is not None:
        meshes.append(root())
    for m in meshes:
        reg = m.__dict__.get("_pg_registry")
        if not isinstance(reg, dict) or id(reg) in seen:
            continue
        seen.add(id(reg))
        out += [RefSite(id(reg), KEY, k, reg, f"{path}._pg_registry[{k!r}]") for k, v in reg.items() if v is old_pg]
    return out


class FSDP1Adapter(Adapter):
    name = "fsdp1"

    @staticmethod
    def matches(module: Any) -> int:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return wraps_with(module, FSDP)

    def in_place_problem(self, module: Any) -> str | None:
        """FSDP1 is not discarded in place: it has no reset of an iteration that a failure aborted
        (torch 2.13 gives FSDP2 ``reset_iter_state``, nothing to FSDP1), and the state such a forward
        or backward leaves is private and spread over every unit: the units' ``training_state`` and
        their handles' ``_training_state``, the flat parameters left unsharded (and the original
        parameters left as views of them, :func:`_drop_unsharded_views`), the post-backward hooks
        registered on autograd's ``AccumulateGrad`` nodes that only the backward's final callback
        removes (``_post_backward_hook_state``), the root's queued-callback flag, the handles'
        prefetch flags and the execution-order record that FSDP1 checks every iteration
        (``_exec_order_data``).  Setting each by hand would be a reimplementation of FSDP1's own
        finalization, unchecked by torch; so a discard rebuilds the wrapper (``attach(rebuild=...)``)."""
        return ("FSDP1 has no reset of a forward or backward that a failure aborted (torch 2.13 has FSDP2's "
                "FSDPModule.reset_iter_state only): its per-iteration state (training states, unsharded flat parameters, "
                "post-backward hooks on autograd's nodes, prefetch flags, the execution-order record) is private, so a "
                "discard in place rebuilds the wrapper: attach(rebuild=...)")

    def shed(self, module: Any, optimizer: Any) -> None:
        """As :meth:`Adapter.shed`, and each unit's padded unsharded flat parameter (what a forward or
        backward in flight left gathered; its storage resized to 0, as FSDP's own reshard frees it)
        and the gradient shard a backward was accumulating (``_saved_grad_shard``).  The local shard
        (``_local_shard``, the committed parameters) is kept."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        super().shed(module, optimizer)
        for m in module.modules():
            handle = getattr(m, "_handle", None) if isinstance(m, FSDP) else None
            flat = getattr(handle, "flat_param", None) if handle is not None else None
            if flat is None:
                continue
            if hasattr(flat, "_saved_grad_shard"):
                delattr(flat, "_saved_grad_shard")
            full = getattr(flat, "_full_param_padded", None)
            shard = getattr(flat, "_local_shard", None)
            if full is not None and shard is not None and full.untyped_storage().data_ptr() != shard.untyped_storage().data_ptr():
                full.untyped_storage().resize_(0)

    def release(self, module: Any, keep: Any = None) -> int:
        """Break the cycles a backward that raised leaves through autograd's C++ side, which the
        garbage collector cannot traverse, so that the old wrapper and its groups are freed (soak K3;
        tests/test_episode_leaks.py).  Two of them:

        * FSDP1 registers its post-backward hook on each flat parameter's ``AccumulateGrad`` node and
          keeps ``(node, hook handle)`` on the parameter (``_post_backward_hook_state``) until the
          backward's final callback (``_finalize_params``) removes them.  A backward that raised never
          runs that callback, and the cycle parameter -> node -> hook -> ``FlatParamHandle`` -> parameter
          passes through the node's C++ hook list, which the garbage collector cannot traverse: the old
          wrapper and its shard and replicate groups outlived every discard and every swap of a death in
          backward.  Removed here as ``_finalize_params`` does.
        * Each unit's original parameters are, between its unshard and its reshard, plain tensor
          attributes of their modules: views of the flat parameter whose ``grad_fn`` leads to its
          ``AccumulateGrad`` node, which holds the flat parameter, whose ``_param_infos`` name the
          modules.  A backward that raised leaves them so (the root unit's views kept the whole
          inner model, every unit and their groups, alive: found with ``gc.get_referrers`` after the
          first fix).  The views are dropped (:func:`_drop_unsharded_views`)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        n = 0
        kept = {id(m) for m in keep.modules()} if keep is not None else set()
        for m in module.modules():
            handle = getattr(m, "_handle", None) if isinstance(m, FSDP) and id(m) not in kept else None
            flat = getattr(handle, "flat_param", None) if handle is not None else None
            if flat is None:
                continue
            for attr in ("_post_backward_hook_state", "_post_backward_hook_handle"):
                state = getattr(flat, attr, None)
                if state is None:
                    continue
                (state[-1] if isinstance(state, tuple) else state).remove()
                delattr(flat, attr)
                n += 1
            n += _drop_unsharded_views(flat, kept)
        return n

    def discover(self, module: Any, old_pg: Any, root_name: str = "model") -> list[RefSite]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        sites: list[RefSite] = []
        seen: set[int] = set()
        for name, m in module.named_modules():
            if not isinstance(m, FSDP):
                continue
            path = f"{root_name}.{name}" if name else root_name
            d = m.__dict__
            sites += [RefSite(id(m), ATTR, a, m, f"{path}.{a}") for a in _STATE_ATTRS if d.get(a) is old_pg]
            hook_state = d.get("_inter_node_state")
            if hook_state is not None and getattr(hook_state, "process_group", None) is old_pg:
                sites.append(RefSite(id(hook_state), SLOT if not hasattr(hook_state, "__dict__") else ATTR,
                                     "process_group", hook_state, f"{path}._inter_node_state.process_group"))
            handle = d.get("_handle")
            if handle is not None and handle.__dict__.get("process_group") is old_pg:
                sites.append(RefSite(id(handle), ATTR, "process_group", handle, f"{path}._handle.process_group"))
            eod = d.get("_exec_order_data")
            if eod is not None and id(eod) not in seen:
                seen.add(id(eod))
                if eod.__dict__.get("process_group") is old_pg:
                    sites.append(RefSite(id(eod), ATTR, "process_group", eod, f"{path}._exec_order_data.process_group"))
            sites += _mesh_sites(d.get("_device_mesh"), old_pg, f"{path}._device_mesh", seen)
        return sites


def _drop_unsharded_views(flat: Any, kept: set[int]) -> int:
    """Delete from their modules the plain tensor attributes FSDP1 set for ``flat``'s original
    parameters (views of it; a registered ``nn.Parameter`` is left alone, and so is a module whose
    ``id`` is in ``kept``): what a retired wrapper's :meth:`FSDP1Adapter.release` needs.  Returns how
    many were dropped."""
    import torch

    n = 0
    infos = [(i.module, i.param_name) for i in getattr(flat, "_param_infos", ())]
    infos += [(i.module, i.param_name) for i in getattr(flat, "_shared_param_infos", ())]
    for mod, name in infos:
        if id(mod) in kept:
            continue
        value = mod.__dict__.get(name)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            delattr(mod, name)
            n += 1
    return n
