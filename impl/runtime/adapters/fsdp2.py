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


class FSDP2Adapter(Adapter):
    name = "fsdp2"

    @staticmethod
    def matches(module: Any) -> int:
        from torch.distributed.fsdp import FSDPModule

        return wraps_with(module, FSDPModule)

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
