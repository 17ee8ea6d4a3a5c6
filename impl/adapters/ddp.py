"""DDP adapter: ``ddp.process_group`` plus the C++ Reducer, which no Python walk can see.

``DistributedDataParallel._update_process_group(new_pg)`` updates both (and forces a bucket
rebuild on the next backward); writing only the Python attribute fails on the next backward
(torch-facts). ``new_pg`` must be a c10d ``ProcessGroup`` (see ``make_gloo_group``).
Ordering: rebind only at a committed boundary (it resets the Reducer's per-iteration state).
"""
from __future__ import annotations

from typing import Any, Sequence

from .base import Adapter, adopt_group_name
from .walker import ATTR, RefSite


class DDPAdapter(Adapter):
    name = "ddp"

    def discover(self, module: Any, old_pg: Any, root_name: str = "model") -> list[RefSite]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        sites = []
        for name, m in module.named_modules():
            if isinstance(m, DDP) and m.__dict__.get("process_group") is old_pg:
                sites.append(RefSite(id(m), ATTR, "process_group", m, f"{root_name}.{name}.process_group" if name else f"{root_name}.process_group"))
        return sites

    def rebind(self, module: Any, sites: Sequence[RefSite], old_pg: Any, new_pg: Any) -> int:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not isinstance(new_pg, dist.ProcessGroup):
            raise TypeError(f"DDP's Reducer needs a c10d ProcessGroup, got {type(new_pg).__name__}; "
                            "wrap the gloo backend with adapters.make_gloo_group")
        n = 0
        for s in sites:
            if isinstance(s.owner, DDP) and s.key == "process_group":
                s.owner._update_process_group(new_pg)  # Python attribute + C++ Reducer
                n += 1
            else:
                n += self._write_sites([s], old_pg, new_pg)
        adopt_group_name(old_pg, new_pg)
        return n
