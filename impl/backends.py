"""Collective backends: the one table (spec/implementation.md, "Where things go").

Every decision that differs between gloo and NCCL starts here: the contract's platform name, the
device tensors live on, how many devices a world needs, and whether this machine can run it.
Adding a backend is one entry in :data:`BACKENDS`.  Torch is imported only by :meth:`Backend.unavailable`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BACKENDS", "BACKEND_NAMES", "Backend", "backend"]


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
