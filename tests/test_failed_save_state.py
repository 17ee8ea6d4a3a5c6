"""A save whose state-dict gather failed leaves FSDP1 as a completed state dict would (soak K10).

The 10-minute soak of 2026-12-06 (seed 2, bench/README.md K10) cut a group under a checkpoint save:
the save failed (``SaveFailed``), the engine repaired, and the next boundary's guard found "FSDP1 handle
of <root> in SUMMON_FULL_PARAMS" and rejected (exit 70, L2 where the model repairs).  FSDP1's state-dict
hooks open each unit's unshard context in the pre-hook and close it in the post-hook; a collective that
raised in between (or inside the context's all-gather) leaves it open.  ``Adapter.abandon_state_dict``,
which the checkpoint manager calls on every ``SaveFailed``, closes what was left open.

Here two ranks build an FSDP1 model, train a step, and gather its state dict (``get_state_dict``, as the
save does) with the group's connections shut down from outside the gather (a revoke's socket shutdown):
the gather raises.  Judged from torch's own state, not through the engine: every unit and handle IDLE,
no unshard context left, the local shards ``torch.equal`` to what they were before the gather.  Without
the call the units are left busy (the first check, made before it, pins that the fault really leaves
them so).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.multiproc


def gather_cut(ctx, through: str) -> None:
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import TrainingState
    from torch.distributed.fsdp._flat_param import HandleTrainingState
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from accelpact.impl.runtime import revoke
    from accelpact.impl.runtime.adapters import adapter_for
    from accelpact.impl.runtime.checkpoint import CheckpointManager

    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = FSDP(inner, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), use_orig_params=False,
                 device_id=torch.device("cpu"))  # as the workload builds it (impl/launch/workload.py)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    units = [m for m in model.modules() if isinstance(m, FSDP)]
    before = [u._handle.flat_param._local_shard.clone() for u in units if u._handle is not None]
    dist.barrier()

    def busy() -> list[str]:
        out = []
        for i, u in enumerate(units):
            if u.training_state != TrainingState.IDLE:
                out.append(f"unit {i} {u.training_state.name}")
            if u._handle is not None and u._handle._training_state != HandleTrainingState.IDLE:
                out.append(f"handle {i} {u._handle._training_state.name}")
            if getattr(u, "_unshard_params_ctx", None):
                out.append(f"unit {i} context open")
        return out

    revoke.hard_close(ctx.group_record)  # both ranks: every connection of the group shut down
    left: list[str] = []
    fixed = -1
    try:
        if through == "manager":  # the engine's path: the save calls the adapter on SaveFailed itself
            CheckpointManager(ctx.out / "ckpt", every=1, rank=ctx.rank, world=ctx.world, store=ctx.store,
                              group=dist.distributed_c10d._get_default_group()).save(1, model, opt)
        else:
            get_state_dict(model, opt)
        raised = None
    except RuntimeError as exc:  # SaveFailed is one
        raised = repr(exc)[:200]
    if through == "adapter":
        left = busy()
        fixed = adapter_for(model).abandon_state_dict(model)
    after = [u._handle.flat_param._local_shard for u in units if u._handle is not None]
    (ctx.out / f"r{ctx.rank}.json").write_text(json.dumps({
        "raised": raised, "left": left, "fixed": fixed, "busy": busy(),
        "shards_equal": len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True)),
        "sharded": all(u._handle.flat_param.data_ptr() == u._handle.flat_param._local_shard.data_ptr()
                       for u in units if u._handle is not None)}))
    os._exit(0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("through", ["adapter", "manager"])
def test_a_state_dict_gather_cut_part_way_leaves_fsdp1_idle_and_its_shards_as_they_were(ranks, tmp_path, through):
    """``adapter``: the gather alone, then ``abandon_state_dict``; ``manager``: ``CheckpointManager.save``
    as the engine calls it, which must call it on its ``SaveFailed``."""
    run = ranks.run(gather_cut, 2, init_group=True, timeout_s=90, through=through)
    assert run.codes == {0: 0, 1: 0}, run.explain()
    for r in (0, 1):
        res = json.loads((tmp_path / f"r{r}.json").read_text())
        assert res["raised"], res  # the gather failed: the group's connections were shut down
        if through == "adapter":
            assert res["left"], res  # and it left FSDP1 busy: what the guard rejected in the soak
            assert res["fixed"] >= 1, res
        else:
            assert "SaveFailed" in res["raised"], res
        assert res["busy"] == [], res
        assert res["shards_equal"] and res["sharded"], res
