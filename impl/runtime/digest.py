"""Replica state checks for phase 6 Validate (``RankValidate``): replicas of R hold identical shards.

What is checked, in a deterministic order (:func:`_leaves`): this rank's parameter storage by name
(FSDP1 flat-param shards, FSDP2 DTensor local shards, DDP parameters); the optimizer state by
parameter-group order and parameter position, state keys sorted; non-tensor values (``step`` counts,
hyper-parameters) by ``repr``.  Shapes and dtypes are part of it, so a reshaped or recast tensor
never matches the original.

* :func:`state_checksum` (what phase 6 compares): a small int64 vector computed with torch ops on
  each tensor's own device (no copy of the state to the host), compared bit for bit across replicas
  by one all-gather.  Exact, not a float sum: every tensor's bits are read as integers and summed
  modulo 2**64, so every single-bit flip changes it (see :func:`state_checksum`).
* :func:`state_digest`: sha256 of the same state on the host (the state copied to the CPU): the
  offline identity of a snapshot (tests, tools); not used by the engine.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterator

__all__ = ["LANES", "checksum_hex", "state_checksum", "state_digest"]

#: Lanes of :func:`state_checksum`: the layout hash, the sum lane, the position-weighted lane.
LANES = 3
#: Elements per block of the on-device reduction (8 bytes of scratch an element).  The CPU: 4 MB of
#: scratch, which stays in cache across the block's copy and two reductions (faster than larger
#: blocks, which spill out of cache); an accelerator: 64 MB, so a large state takes few
#: kernel launches.
_BLOCK = 1 << 23
_BLOCK_CPU = 1 << 19
#: Row length of a block seen as a matrix (row sums and column sums give the position weights).
_ROW = 1024
_MASK = (1 << 64) - 1


def _local(t: Any) -> Any:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _leaves(module: Any, optimizer: Any = None) -> Iterator[tuple[str, Any]]:
    """(label, value) of everything the replicas must agree on; a value is a tensor (its local
    shard) or a non-tensor leaf (compared by ``repr``)."""
    import torch

    def walk(label: str, v: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(v, torch.Tensor):
            yield label, v
        elif isinstance(v, dict):
            for k in sorted(v, key=repr):
                yield from walk(f"{label}.{k}", v[k])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                yield from walk(f"{label}[{i}]", x)
        else:
            yield label, v

    for name, p in module.named_parameters():
        yield f"param:{name}", p
    if optimizer is not None:
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                yield from walk(f"optim:{gi}:{pi}", dict(optimizer.state.get(p, {})))
            yield from walk(f"hparams:{gi}", {k: v for k, v in group.items() if k != "params"})


def _label(h: "hashlib._Hash", label: str, v: Any) -> Any:
    """Feed ``label`` and the layout of ``v`` (dtype, shape) or its ``repr`` to ``h``; the local
    tensor, detached, or None for a non-tensor."""
    import torch

    if isinstance(v, torch.Tensor):
        t = _local(v).detach()
        h.update(f"{label}|{t.dtype}|{tuple(t.shape)}|".encode())
        return t
    h.update(f"{label}={v!r};".encode())
    return None


def state_digest(module: Any, optimizer: Any = None) -> bytes:
    """32-byte sha256 of local parameter shards and optimizer state (+ step counts), on the host."""
    import torch

    h = hashlib.sha256(b"accelpact-digest/1")
    for label, v in _leaves(module, optimizer):
        t = _label(h, label, v)
        if t is not None and t.numel():
            h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def _int_view(t: Any) -> Any:
    """The tensor's bits as a flat integer tensor of its element size (no copy when contiguous)."""
    import torch

    flat = t.contiguous().reshape(-1)
    size = flat.element_size()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return flat.view(ints[size] if size in ints else torch.int64)  # wider (complex128): 8-byte words


def _tensor_sums(t: Any) -> tuple[Any, Any]:
    """(S, W) of one tensor as 0-d int64 tensors on its own device: S = sum of x_p, W = sum of
    (p + 1) * x_p over its elements x_p (its bits read as signed integers, sign-extended), both
    modulo 2**64.  Blocks of ``_BLOCK`` elements bound the scratch memory; a block seen as a matrix
    of rows of ``_ROW`` gives W from its row and column sums:
    (p + 1) = (block start) + ROW * row + (col + 1)."""
    import torch

    x = _int_view(t)
    dev = x.device
    n = x.numel()
    s = torch.zeros((), dtype=torch.int64, device=dev)
    w = torch.zeros((), dtype=torch.int64, device=dev)
    if n == 0:
        return s, w
    cap = min(_BLOCK_CPU if dev.type == "cpu" else _BLOCK, -(-n // _ROW) * _ROW)
    buf = torch.empty(cap, dtype=torch.int64, device=dev)
    rows_w = torch.arange(cap // _ROW, dtype=torch.int64, device=dev)
    cols_w = torch.arange(1, _ROW + 1, dtype=torch.int64, device=dev)
    for start in range(0, n, cap):
        m = min(cap, n - start)
        rows = -(-m // _ROW)
        b = buf[: rows * _ROW]
        b[:m].copy_(x[start:start + m])  # sign-extends to int64
        if rows * _ROW > m:
            b[m:].zero_()
        mat = b.view(rows, _ROW)
        r = mat.sum(1)
        c = mat.sum(0)
        blk = r.sum()
        s += blk
        w += blk * start + (r * rows_w[:rows]).sum() * _ROW + (c * cols_w).sum()
    return s, w


def _odd(i: int, salt: int) -> int:
    """An odd 64-bit multiplier for tensor ``i`` (splitmix64), as a signed int64: odd, so invertible
    modulo 2**64 (a change of one tensor's sum always changes the lane)."""
    z = (i * 0x9E3779B97F4A7C15 + salt) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z = (z ^ (z >> 31)) | 1
    return z - (1 << 64) if z >= 1 << 63 else z


def state_checksum(module: Any, optimizer: Any = None, device: Any = None) -> Any:
    """The replica check of phase 6: an int64 vector of :data:`LANES` on ``device`` (default: the
    first parameter's device), equal on two replicas exactly when their states agree, as far as a
    checksum can tell, bit for bit.

    Lane 0: the first 8 bytes of sha256 over the labels, dtypes, shapes and non-tensor values
    (host-side, a few bytes per tensor).  Lanes 1 and 2: sum over tensors t of m_t * S_t and of
    m'_t * W_t modulo 2**64 (:func:`_tensor_sums`; m_t, m'_t odd).  Every tensor is reduced with
    torch ops on its own device; only the 0-d results move to ``device``.

    Exactness: flipping bit b of one element changes that element's integer by 2**b (b < 64), so S_t
    by 2**b != 0 and lane 1 by m_t * 2**b != 0 modulo 2**64 (m_t is odd): every single-bit flip is
    caught.  Lane 2 weighs elements by position, so swapped elements are caught too.  It is a
    checksum against faults, not a cryptographic hash against an adversary."""
    import torch

    meta = hashlib.sha256(b"accelpact-checksum/1")
    sums: list[tuple[Any, Any]] = []
    for label, v in _leaves(module, optimizer):
        t = _label(meta, label, v)
        if t is not None:
            sums.append(_tensor_sums(t))
    if device is None:
        first = next(iter(module.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    lanes = torch.zeros(LANES, dtype=torch.int64, device=device)
    lanes[0] = int.from_bytes(meta.digest()[:8], "little", signed=True)
    if sums:
        s = torch.stack([a.to(device) for a, _ in sums])
        w = torch.stack([b.to(device) for _, b in sums])
        m1 = torch.tensor([_odd(i, 1) for i in range(len(sums))], dtype=torch.int64, device=device)
        m2 = torch.tensor([_odd(i, 2) for i in range(len(sums))], dtype=torch.int64, device=device)
        lanes[1] = (s * m1).sum()
        lanes[2] = (w * m2).sum()
    return lanes


def checksum_hex(lanes: Any) -> str:
    """The lanes as one hex string (16 digits a lane, two's complement), for trace records."""
    return "".join(f"{int(v) & _MASK:016x}" for v in lanes.tolist())
