"""Collective backends: the one table (spec/implementation.md, "Where things go").

Every decision that differs between gloo and NCCL starts here: the contract's platform name, the
device tensors live on, how many devices a world needs, and whether this machine can run it.
Adding a backend is one entry in :data:`BACKENDS`.  Torch is imported only by :meth:`Backend.unavailable`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["BACKENDS", "BACKEND_NAMES", "NCCL_ENV", "Backend", "backend"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One collective backend.  ``platform``: the observation key's platform (spec/contract.md);
    ``device_type``: where its collectives' tensors live; ``revoke``: how a group of it is revoked
    (``sockets``: its connected sockets shut down; ``abort``: its communicator aborted)."""

    name: str
    platform: str
    device_type: str
    revoke: str

    def unavailable(self, world: int) -> str | None:
        """Why a ``world``-rank job on this backend cannot run on this machine (None: it can)."""
        if self.device_type == "cpu":
            return None
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world:
            return f"backend {self.name} needs one CUDA device per rank ({world}); this machine has {have}"
        return None

    def prepare_process(self, local_rank: int):
        """Before any process group of this process is built: the environment the backend's
        error handling needs and this rank's device.  Returns the ``torch.device`` the job's model,
        batches and collectives use.  Gloo: the CPU.  NCCL: ``cuda:{local_rank}`` made current, and
        the error-handling variables of :data:`NCCL_ENV` set (spec/torch-facts.md, "NCCL")."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        for k, v in NCCL_ENV.items():
            os.environ[k] = v  # overrides torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (see NCCL_ENV)
        device = torch.device(self.device_type, local_rank)
        torch.cuda.set_device(device)
        return device

    def init_kwargs(self, device) -> dict:
        """Extra keyword arguments of ``init_process_group``/``new_group`` on this backend: NCCL binds
        the device (eager connect, so a missing member shows up when the group is built)."""
        return {} if self.device_type == "cpu" else {"device_id": device}


#: NCCL error handling the protocol needs, set before any NCCL group is built (torch 2.13 reads them
#: when a group is created; spec/torch-facts.md "NCCL"):
#: * ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``: abort the failed communicator but do not kill the process
#:   (3, the default, and 1, torchrun's, kill the process before Observe can run);
#: * ``TORCH_NCCL_DUMP_ON_TIMEOUT=0`` and ``TORCH_NCCL_ENABLE_MONITORING=0``: one rank's timeout must
#:   not make the heartbeat monitor of healthy ranks kill them (the ``exception_dump`` store key
#:   escapes every PrefixStore, so it would also reach a later attempt).
NCCL_ENV: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_ENABLE_MONITORING": "0",
}


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("gloo", "cpu-gloo", "cpu", "sockets"),
    Backend("nccl", "cuda-nccl", "cuda", "abort"),
)}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)


def backend(name: str) -> Backend:
    """The backend called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {name!r}; use one of {list(BACKEND_NAMES)}") from None
