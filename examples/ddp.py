"""DistributedDataParallel under torchrun, repaired in place by AccelPact.

    torchrun --standalone --nproc-per-node 2 examples/ddp.py --out runs/ddp \\
        --fault collective_timeout@boundary:3:0:world      # cut rank 0's data-parallel group at step 3

DDP runs on ``job.world_group``, a data-parallel group over every rank that AccelPact built (the
default group stays free for its control traffic) and repairs.  See examples/fsdp2_hsdp.py for the flags.
"""
from common import batch, make_model, parse_args, save_final
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import accelpact
from accelpact.testing.faults import fault_hooks  # --fault: tests and demos only


def main() -> None:
    args = parse_args(__doc__, "runs/example-ddp")
    job = accelpact.init(replicas=args.replicas, trace_dir=args.out)
    model = DDP(make_model(job.device), process_group=job.world_group,
                device_ids=[job.device] if job.device.type == "cuda" else None)
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
        if run.discarded:  # a communicator failure in forward or backward: the step was discarded in place
            continue       # (its data comes from the step number alone: nothing to rewind)
        report = run.boundary(loss.detach())
        if report is not None:
            print(f"rank {job.rank}: step {step}: data-parallel group repaired in {report.total_ns / 1e6:.1f} ms")

    save_final(f"{args.out}/final-r{job.rank}.pt", model, optim)
    job.close()


if __name__ == "__main__":
    main()
