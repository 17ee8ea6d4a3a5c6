"""FSDP2 HSDP (``fully_shard`` on a 2-D DeviceMesh) under torchrun, repaired in place by AccelPact.

    torchrun --standalone --nproc-per-node 4 examples/fsdp2_hsdp.py --replicas 2 --out runs/fsdp2
    torchrun --standalone --nproc-per-node 4 examples/fsdp2_hsdp.py --replicas 2 --out runs/fsdp2-cut \\
        --fault collective_timeout@boundary:3:0,2      # cut replicate group 0's sockets at step 3

The model is replicated ``--replicas`` times (default: once per node), each replica sharded over
its ranks.  With ``--fault``, the named ranks' replicate-group connections are shut down from a
thread outside this script's code at the named point; AccelPact replaces the group and training
goes on from the same step (L1).  ``crash@backward:4:1`` SIGKILLs rank 1 instead: every rank exits,
torchrun restarts them (``--max-restarts 1``) and they resume from the last committed checkpoint.
With spares (hot swap), the same crash costs no restart: a spare takes rank 1's identity, its shard
comes from rank 3 (its replica), every rank reruns step 4 (the keeper hides the death from torchrun)::

    accelpact launch --standalone --nproc-per-node 5 --spares 1 -- \\
        examples/fsdp2_hsdp.py --replicas 2 --fault crash@backward:4:1

(``--spares 1``: the last of torchrun's 5 workers is a spare; every worker runs behind the keeper.)
"""
from common import batch, make_model, parse_args, save_final
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

import accelpact
from accelpact.testing.faults import fault_hooks  # --fault: tests and demos only


def build(job, extra):
    """The wrapped model and its optimizer on the job's current groups: at attach, and again on every
    rank when a hot swap rebuilds the groups (with spares); AccelPact moves the state into them."""
    model = make_model(job.device)
    for block in model:
        fully_shard(block, mesh=job.mesh)  # ("replicate", "shard"): shard in a replica, replicate across
    fully_shard(model, mesh=job.mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)


def main() -> None:
    args = parse_args(__doc__, "runs/example-fsdp2")
    job = accelpact.init(replicas=args.replicas, trace_dir=args.out)
    run = job.attach(rebuild=build, checkpoint_dir=f"{args.out}/ckpt", checkpoint_every=args.checkpoint_every,
                     hooks=fault_hooks(job, args.fault))
    if run is None:  # a spare the job never needed
        return

    for step in run.steps(args.steps):  # from the last committed checkpoint after a restart
        x, y = batch(step, job.rank, job.device)
        loss = None
        with run.step(step):
            loss = nn.functional.mse_loss(run.module(x), y)
            loss.backward()
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        if run.discarded:  # a rank died in this step and a spare took its place: the step comes again
            print(f"rank {job.rank}: step {step}: rank(s) {run.swaps[-1].dead} replaced by a spare, step rerun")
            continue
        report = run.boundary(loss.detach())  # a failed replicate group is repaired here
        if report is not None:
            print(f"rank {job.rank}: step {step}: replicate group repaired in {report.total_ns / 1e6:.1f} ms")

    save_final(f"{args.out}/final-r{job.rank}.pt", run.module, run.optimizer)
    job.close()


if __name__ == "__main__":
    main()
