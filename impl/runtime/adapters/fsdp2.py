"""FSDP2 (``fully_shard``) adapter: mesh infos per parameter group and the DeviceMesh registry.

FSDP2 caches ``HSDPMeshInfo.replicate_process_group`` / ``.shard_process_group`` once per
parameter group (L+1 for L sharded blocks + root). The DeviceMesh holds group *names*
(``_dim_group_names``) resolved through c10d, plus a ``_pg_registry`` name -> group. Rebinding
keeps every name stable: the registry entry is rewritten under its key and the c10d name moves
from the old group to the new one (``adopt_group_name``), so ``mesh.get_group("replicate")``
returns the new communicator and the same sites can be rebound again in the next generation.
"""
from __future__ import annotations

from typing import Any

from .base import Adapter, wraps_with
from .fsdp1 import _mesh_sites
from .walker import ATTR, RefSite

_MESH_INFO_ATTRS = ("replicate_process_group", "shard_process_group", "reduce_scatter_process_group")
#: How long :meth:`FSDP2Adapter.reset_iter_state` waits for an all-gather still held from the aborted
#: iteration (its group revoked and aborted by then) before it drops the result anyway.
REVOKED_WORK_WAIT_S = 1.0


def fsdp2_states(module: Any) -> list[tuple[str, Any]]:
    """(module path, FSDPState) for every module carrying ``fully_shard`` state."""
    from torch.distributed.fsdp import FSDPModule

    return [(name, m._get_fsdp_state()) for name, m in module.named_modules() if isinstance(m, FSDPModule)]


def is_fsdp2(module: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def fsdp2_roots(module: Any) -> list[Any]:
    """The root FSDP modules of ``module``: every ``FSDPModule`` no other one contains (the module the
    top-level ``fully_shard`` was applied to: ``module`` itself in the usual layout)."""
    from torch.distributed.fsdp import FSDPModule

    names = [name for name, m in module.named_modules() if isinstance(m, FSDPModule)]
    roots = [name for name in names if not any(o != name and (o == "" or name.startswith(o + ".")) for o in names)]
    return [module.get_submodule(name) for name in roots]


class FSDP2Adapter(Adapter):
    name = "fsdp2"

    @staticmethod
    def matches(module: Any) -> int:
        from torch.distributed.fsdp import FSDPModule

        return wraps_with(module, FSDPModule)

    def in_place_problem(self, module: Any) -> str | None:
        """None where torch has FSDP2's public recovery primitive, ``FSDPModule.reset_iter_state``
        (torch 2.13): a forward or backward aborted by a communicator failure is then discarded on
        the same wrapper (:meth:`reset_iter_state`)."""
        import torch
        from torch.distributed.fsdp import FSDPModule

        if not callable(getattr(FSDPModule, "reset_iter_state", None)):
            return (f"torch {torch.__version__} has no FSDPModule.reset_iter_state (FSDP2's reset after an aborted forward "
                    "or backward, torch 2.13)")
        return None

    def shed(self, module: Any, optimizer: Any) -> None:
        """As :meth:`Adapter.shed`, and the unsharded parameters a forward or backward in flight left
        gathered: the wrapper's own reset (:meth:`reset_iter_state`: pending all-gathers dropped,
        every parameter group resharded)."""
        self.reset_iter_state(module)
        super().shed(module, optimizer)

    def reset_iter_state(self, module: Any) -> None:
        """FSDP2's own recovery (``FSDPModule.reset_iter_state`` on every root: in-flight collectives'
        events waited for, every parameter group resharded, the iteration's trackers and training
        states cleared), with two things around it that the primitive leaves:

        * an all-gather issued asynchronously (``unshard(async_op=True)``, a prefetch) whose work is
          still held: torch waits on it unbounded (``work.wait()``); here its wait is bounded by
          ``REVOKED_WORK_WAIT_S`` (its group was revoked and aborted: it fails at once, or is
          abandoned to its group's retirement) and the result dropped before the reset;
        * the unsharded parameters' gradients: an aborted backward can leave autograd's gradient on
          an unsharded parameter (or FSDP2's accumulated one) whose post-backward never ran; the next
          backward would accumulate into it.  Both are cleared: the failed iteration's gradients
          are lost, as the primitive promises."""
        for _name, state in fsdp2_states(module):
            for pgroup in list(getattr(state, "_fsdp_param_groups", None) or ()):
                _drop_pending_all_gather(pgroup)
        for root in fsdp2_roots(module):
            root.reset_iter_state()
        for _name, state in fsdp2_states(module):
            for pgroup in list(getattr(state, "_fsdp_param_groups", None) or ()):
                for fp in getattr(pgroup, "fsdp_params", ()):
                    unsharded = fp.__dict__.get("_unsharded_param")
                    if unsharded is not None:
                        unsharded.grad = None
                    if getattr(fp, "unsharded_accumulated_grad", None) is not None:
                        fp.unsharded_accumulated_grad = None

    def discover(self, module: Any, old_pg: Any, root_name: str = "model") -> list[RefSite]:
        sites: list[RefSite] = []
        seen_info: set[int] = set()
        seen_reg: set[int] = set()
        for name, state in fsdp2_states(module):
            path = f"{root_name}.{name}" if name else root_name
            groups = list(getattr(state, "_fsdp_param_groups", None) or [])
            single = getattr(state, "_fsdp_param_group", None)
            if single is not None and single not in groups:
                groups.append(single)
            for gi, pgroup in enumerate(groups):
                gpath = f"{path}.<fsdp_state>._fsdp_param_groups[{gi}]"
                infos = [("mesh_info", getattr(pgroup, "mesh_info", None)),
                         ("post_forward_mesh_info", getattr(pgroup, "post_forward_mesh_info", None))]
                for fp in getattr(pgroup, "fsdp_params", ()):
                    infos += [("mesh_info", fp.__dict__.get("mesh_info")),
                              ("post_forward_mesh_info", fp.__dict__.get("post_forward_mesh_info"))]
                    sites += _mesh_sites(fp.__dict__.get("_spmd_mesh"), old_pg, f"{gpath}.<param>._spmd_mesh", seen_reg)
                for label, info in infos:
                    if info is None or id(info) in seen_info:
                        continue
                    seen_info.add(id(info))
                    d = info.__dict__
                    sites += [RefSite(id(info), ATTR, a, info, f"{gpath}.{label}.{a}") for a in _MESH_INFO_ATTRS if d.get(a) is old_pg]
                    sites += _mesh_sites(d.get("mesh"), old_pg, f"{gpath}.{label}.mesh", seen_reg)
                    sites += _mesh_sites(d.get("spmd_mesh"), old_pg, f"{gpath}.{label}.spmd_mesh", seen_reg)
        for pname, p in module.named_parameters():
            spec = p.__dict__.get("_spec")
            if spec is not None:
                sites += _mesh_sites(getattr(spec, "mesh", None), old_pg, f"{root_name}.{pname}._spec.mesh", seen_reg)
        return sites


def _drop_pending_all_gather(pgroup: Any) -> None:
    """A parameter group's all-gather of the aborted iteration, if one is still held: its work waited
    for at most ``REVOKED_WORK_WAIT_S`` (its error, if any, is the aborted step's, already observed)
    and the result dropped, so that ``reset_iter_state`` does not block on it."""
    import torch.distributed as dist

    result = getattr(pgroup, "_all_gather_result", None)
    if result is None:
        return
    work = getattr(result, "all_gather_work", None)
    if isinstance(work, dist.distributed_c10d.Work):
        from ..backends import wait_bounded

        try:
            wait_bounded(work, REVOKED_WORK_WAIT_S)
        except Exception:  # noqa: BLE001 - the aborted step's collective: its failure is already observed
            pass
    event = getattr(result, "all_gather_event", None)
    if event is not None:
        pgroup.device_handle.current_stream().wait_event(event)
    pgroup._all_gather_result = None
