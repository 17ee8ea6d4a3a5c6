"""State digest for phase 6 Validate (``RankValidate``): replicas of R hold identical shards.

sha256 over this rank's parameter storage (FSDP1 flat-param shards, FSDP2 DTensor local shards,
DDP parameters) and the optimizer state, in a deterministic order: parameters by name; optimizer
state by parameter-group order and parameter position, state keys sorted; non-tensor values
(``step`` counts, hyper-parameters) by ``repr``. Shapes and dtypes are hashed with the bytes, so
a reshaped or recast tensor never collides with the original.
"""
from __future__ import annotations

import hashlib
from typing import Any


def _local(t: Any) -> Any:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _feed_tensor(h: "hashlib._Hash", label: str, t: Any) -> None:
    t = _local(t).detach()
    h.update(f"{label}|{t.dtype}|{tuple(t.shape)}|".encode())
    t = t.contiguous().cpu()
    if t.numel():
        h.update(t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes())


def _feed(h: "hashlib._Hash", label: str, v: Any) -> None:
    import torch

    if isinstance(v, torch.Tensor):
        _feed_tensor(h, label, v)
    elif isinstance(v, dict):
        for k in sorted(v, key=repr):
            _feed(h, f"{label}.{k}", v[k])
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _feed(h, f"{label}[{i}]", x)
    else:
        h.update(f"{label}={v!r};".encode())


def state_digest(module: Any, optimizer: Any = None) -> bytes:
    """32-byte sha256 of local parameter shards and optimizer state (+ step counts)."""
    h = hashlib.sha256(b"accelpact-digest/1")
    for name, p in module.named_parameters():
        _feed_tensor(h, f"param:{name}", p)
    if optimizer is not None:
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                st = optimizer.state.get(p, {})
                _feed(h, f"optim:{gi}:{pi}", dict(st))
            _feed(h, f"hparams:{gi}", {k: v for k, v in group.items() if k != "params"})
    return h.digest()
