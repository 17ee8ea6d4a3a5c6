"""The shrink/grow tests' training script (tests/test_shrink.py), a user of the public API only.

    ACCELPACT_KEEP=1 torchrun --standalone --nproc-per-node 3 -m accelpact.impl.launch.keeper -- \\
        python tests/shrink_app.py --out runs/shrink --steps 10 --micro-batches 6

DDP over ``job.world_group`` on the project's char-level LM (``impl/launch/workload.py``), opted in to
micro-batches: a step is ``--micro-batches`` micro-batches, each read by (step, micro-batch index),
never by rank; every rank processes its replica's share (``run.micro_batches``; under HSDP its slice of
each, ``run.replica_slot``), accumulates without
reducing on all but its last (``run.no_sync``) and weights its loss by ``run.loss_weight``.  A rank
still training at the end saves ``final-r{rank}.pt`` (its parameters and optimizer state); every rank
appends one line per committed step to ``steps-r{rank}.ndjson`` (the active replicas it trained with).
``--shrink-at STEP:REPLICA``: the fault-free reference's requested shrink (``attach(shrink_at=...)``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import accelpact
from accelpact.impl.launch import workload
from accelpact.impl.rundir import RunDir


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--micro-batches", type=int, default=6)
    p.add_argument("--shrink-at", default=None)
    p.add_argument("--wrapper", default="ddp", choices=("ddp", "fsdp2"))
    p.add_argument("--replicas", type=int, default=None, help="fsdp2: HSDP's replicas (shard groups)")
    p.add_argument("--pace", type=float, default=0.0, help="seconds slept after each committed step (outside the math)")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    job = accelpact.init(backend="gloo", trace_dir=str(out), replicas=args.replicas)
    spec = workload.WorkloadSpec(wrapper="ddp", layers=2, dim=32, heads=2, seq=16, batch=2, lr=1e-3, seed=0)
    data = workload.DataCursor(spec.seed, spec.batch, spec.seq, dp_index=0, dp_size=1)  # read by micro-batch index

    def build(j, extra):
        """The model on the job's current groups (at attach, and in every episode that rebuilds it)."""
        torch.manual_seed(spec.seed)
        if args.wrapper == "fsdp2":  # HSDP: a replica is a shard group (job.mesh: "replicate" x "shard")
            from torch.distributed.fsdp import fully_shard

            model = workload.CharLM(workload.vocab_size(), spec)
            for blk in model.layers:
                fully_shard(blk, mesh=j.mesh)
            model = fully_shard(model, mesh=j.mesh)
            return model, torch.optim.AdamW(model.parameters(), lr=spec.lr, foreach=False)
        model = DDP(workload.CharLM(workload.vocab_size(), spec), process_group=j.world_group)
        # each gradient reduced on its own: the sum does not depend on DDP's bucket layout
        model.register_comm_hook(model, workload._per_gradient_allreduce)
        return model, torch.optim.AdamW(model.parameters(), lr=spec.lr, foreach=False)

    run = job.attach(rebuild=build, micro_batches=args.micro_batches, shrink_at=args.shrink_at,
                     warmup=workload.vocab_size)
    if run is None:  # a spare the job never needed
        return
    for step in run.steps(args.steps):
        total = torch.zeros(())
        with run.step(step):
            mbs, weight = run.micro_batches(step), run.loss_weight
            pos, size = run.replica_slot  # HSDP: this rank's slice of each micro-batch (DDP: the whole one)
            model, optim = run.module, run.optimizer
            for i, m in enumerate(mbs):
                x, y = data.batch(step, dp_index=m * size + pos)
                with run.no_sync(last=i == len(mbs) - 1):
                    logits = model(x)
                    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) * weight
                    loss.backward()
                total += loss.detach()
            optim.step()
            optim.zero_grad(set_to_none=True)
        if run.discarded:  # a death in the step: it comes again with the new assignment
            continue
        active = list(run.active_replicas)
        run.boundary(total)
        with open(out / f"steps-r{job.rank}.ndjson", "a") as f:
            f.write(json.dumps({"step": step, "active": active, "share": list(mbs), "t": time.time()}) + "\n")
        time.sleep(args.pace)
    if not run.left:
        def local(t):  # a DTensor's local shard (FSDP2), a tensor itself
            return (t.to_local() if hasattr(t, "to_local") else torch.as_tensor(t)).detach().clone()

        state = {f"param.{n}": local(p) for n, p in run.module.named_parameters()}
        for i, st in enumerate(run.optimizer.state.values()):
            for k, v in st.items():
                state[f"optim.{i}.{k}"] = local(v)
        final = RunDir(out).final(job.rank)
        tmp = final.with_name("." + final.name)
        torch.save(state, tmp)
        os.replace(tmp, final)
    print(f"shrink_app rank {job.rank}: closing at {time.time():.2f}", file=sys.stderr, flush=True)
    job.close()
    print(f"shrink_app rank {job.rank}: closed at {time.time():.2f}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
