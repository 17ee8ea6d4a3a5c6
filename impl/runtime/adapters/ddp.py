"""DDP adapter: ``ddp.process_group`` plus the C++ Reducer, which no Python walk can see.

Writing only the Python attribute fails on the next backward (spec/torch-facts.md). For a group with
the same members the adapter writes the attribute and swaps the Reducer's pointer
(``reducer._update_process_group``), keeping the bucket layout so training continues
bit-identically; for a different size it uses ``DistributedDataParallel._update_process_group``
(which also resets the Reducer and rebuilds buckets). ``new_pg`` must be a c10d
``ProcessGroup`` (see ``make_gloo_group``). Ordering: rebind only at a committed boundary,
when no reduction is in flight.
"""
from __future__ import annotations

from typing import Any, Sequence

from .base import Adapter, adopt_group_name, wraps_with
from .walker import ATTR, RefSite


class DDPAdapter(Adapter):
    name = "ddp"

    @staticmethod
    def matches(module: Any) -> int:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return wraps_with(module, DDP)

    def in_place_problem(self, module: Any) -> str | None:
        """None where the Reducer has its reset (``_reset_state``, torch 2.1+): DDP is discarded in
        place (:meth:`reset_iter_state`)."""
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        for m in module.modules():
            if isinstance(m, DDP) and not callable(getattr(getattr(m, "reducer", None), "_reset_state", None)):
                return f"torch {torch.__version__}: DDP's Reducer has no _reset_state (torch 2.1+)"
        return None

    def shed(self, module: Any, optimizer: Any) -> None:
        """As :meth:`Adapter.shed`, and the Reducer: its buckets hold a flat copy of every gradient (the
        size of the parameters) for as long as it lives.  Its last owners are the wrapper
        (``reducer``) and DDP's C++ logger (``logger``, which keeps it shared); with both dropped the
        Reducer is destroyed, which also removes its autograd hooks.  The old wrapper cannot run
        afterwards (it is never run again)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        super().shed(module, optimizer)
        for m in module.modules():
            if isinstance(m, DDP):
                m.logger = None
                m.reducer = None

    def reset_iter_state(self, module: Any) -> None:
        """The Reducer's state of an aborted iteration, reset (``Reducer._reset_state``, what
        ``DistributedDataParallel._update_process_group`` calls).  A backward whose bucket all-reduce
        failed raises from the Reducer's final callback after it cleared its own flags, but a failure
        that ends the backward earlier (a communication hook or an autograd hook that raises, as an
        aborted NCCL communicator's enqueue does) leaves ``expect_autograd_hooks_`` and
        ``require_finalize_`` set, C++ state that Python cannot read: the next forward would refuse to
        run ("Expected to have finished reduction in the prior iteration").  The reset clears them, and
        also asks for one more bucket rebuild: the rerun's backward records the order its gradients
        become ready and the next forward rebuilds the buckets from it (a broadcast of rank 0's layout
        on the new group), the same layout as the first rebuild made from the same graph.  Bit-identity
        after it: tests/test_inflight_three_calls.py (several buckets)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        for m in module.modules():
            if isinstance(m, DDP):
                m._has_rebuilt_buckets = False
                m.reducer._reset_state()

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
                ddp = s.owner
                if new_pg.size() == old_pg.size():
                    # Same members: swap the pointer only. ``_update_process_group`` also calls
                    # ``reducer._reset_state()``, which forces a bucket rebuild; a different bucket
                    # layout changes gloo's all-reduce chunking and broke bit-identity at 8 ranks
                    # (max diff 3.7e-9 on one parameter, measured).
                    ddp.__dict__["process_group"] = new_pg
                    ddp.reducer._update_process_group(new_pg)
                else:  # membership changed: buckets must be rebuilt for the new world size
                    ddp._update_process_group(new_pg)
                n += 1
            else:
                n += self._write_sites([s], old_pg, new_pg)
        adopt_group_name(old_pg, new_pg)
        return n
