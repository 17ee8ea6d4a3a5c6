"""The independent reference of a job that counts its step in micro-batches (issue 41): the same
training in one process, without any wrapper or process group.

Each step the loss is the mean over the step's ``total`` micro-batches, read by (step, micro-batch
index) exactly as a job that opted in reads them (``run.micro_batches``), and torch's own autograd
and AdamW produce the expected state: what a job's shrink or grow must equal up to floating-point
order, whatever its replica count.
"""

from __future__ import annotations

import torch

from accelpact.impl.launch import workload

__all__ = ["mean_over_micro_batches"]


def mean_over_micro_batches(spec: workload.WorkloadSpec, steps: int, total: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``steps`` steps of ``spec``'s model in one process, each on the mean loss over ``total``
    micro-batches; returns the parameters by name (``named_parameters``) and each step's mean loss."""
    data = workload.DataCursor(spec.seed, spec.batch, spec.seq, dp_index=0, dp_size=1)
    torch.manual_seed(spec.seed)
    model = workload.CharLM(workload.vocab_size(), spec)
    optim = torch.optim.AdamW(model.parameters(), lr=spec.lr, foreach=False)
    losses: list[float] = []
    for step in range(steps):
        per = []
        for m in range(total):
            x, y = data.batch(step, dp_index=m)
            logits = model(x)
            per.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
        mean = torch.stack(per).mean()
        losses.append(float(mean.detach()))
        mean.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    return {n: p.detach() for n, p in model.named_parameters()}, losses
