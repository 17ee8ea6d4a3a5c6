"""FSDP1 ``HYBRID_SHARD`` under torchrun, repaired in place by AccelPact.

    torchrun --standalone --nproc-per-node 4 examples/fsdp1_hybrid.py --replicas 2 --out runs/fsdp1 \\
        --fault collective_timeout@boundary:3:1,3      # cut replicate group 1's sockets at step 3

FSDP1 takes the (shard, replicate) pair of groups that ``accelpact.init`` built; the replicate group
is the one AccelPact repairs.  See examples/fsdp2_hsdp.py for the flags.
"""
from common import batch, make_model, parse_args, save_final
import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import accelpact
from accelpact.testing.faults import fault_hooks  # --fault: tests and demos only


def main() -> None:
    args = parse_args(__doc__, "runs/example-fsdp1")
    job = accelpact.init(replicas=args.replicas, trace_dir=args.out)
    model = FSDP(make_model(job.device), process_group=(job.shard_group, job.replicate_group),
                 sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_id=job.device,
                 auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    run = job.attach(model, optim, checkpoint_dir=f"{args.out}/ckpt", checkpoint_every=args.checkpoint_every,
                     hooks=fault_hooks(job, args.fault))

    for step in run.steps(args.steps):
        x, y = batch(step, job.rank, job.device)
        with run.step(step):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
        report = run.boundary(loss.detach())
        if report is not None:
            print(f"rank {job.rank}: step {step}: replicate group repaired in {report.total_ns / 1e6:.1f} ms")

    save_final(f"{args.out}/final-r{job.rank}.pt", model, optim)
    job.close()


if __name__ == "__main__":
    main()
