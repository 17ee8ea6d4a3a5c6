"""What the three examples share and is not about AccelPact: flags, data, the final state file."""
import argparse

import torch
from torch import nn


def parse_args(doc: str, out: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--replicas", type=int, default=None, help="model replicas (default: one per node)")
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--out", default=out)
    p.add_argument("--fault", default=None, help="KIND@POINT:STEP[:RANKS[:GROUP]], e.g. collective_timeout@boundary:3:0,2 "
                   "(tests and demos: injected through accelpact.testing.faults.fault_hooks)")
    args = p.parse_args()
    torch.set_num_threads(1)
    return args


def make_model(device: torch.device, layers: int = 4, dim: int = 32) -> nn.Sequential:
    """Identical initial weights on every rank; one block per FSDP unit."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) for _ in range(layers)]
    return nn.Sequential(*blocks, nn.Linear(dim, 1)).to(device)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of ``step``: a function of (step, rank) only, so a resumed run sees the same data."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 32, generator=g)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


def save_final(path: str, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    """This rank's local parameters and optimizer state (shards as they are), for bit-identity checks."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

    state = {f"param.{n}": local(q) for n, q in model.named_parameters()}
    state.update({f"optim.{i}.{k}": local(v) for i, s in optim.state_dict()["state"].items()
                  for k, v in s.items() if torch.is_tensor(v)})
    torch.save(state, path)
