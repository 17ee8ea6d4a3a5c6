"""Bit identity of training states: the check behind every zero-replay claim.

:func:`compare_snapshots` compares two snapshots (:func:`accelpact.impl.launch.workload.snapshot`:
nested dicts, lists and tensors) with ``torch.equal`` on tensors and ``==`` on everything else;
:func:`compare_runs` compares every rank's final snapshot of two run folders (``RunDir.final``).
Importing this module does not import torch: a comparison that meets a tensor, or loads one, does.
"""

from __future__ import annotations

import sys
from typing import Any

from ..rundir import RunDir

__all__ = ["compare_runs", "compare_snapshots"]


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # no tensor can exist before torch is imported
    return torch is not None and isinstance(x, torch.Tensor)


def compare_snapshots(a: Any, b: Any, path: str = "snapshot") -> tuple[bool, str]:
    """``(equal, first_difference)``: ``torch.equal`` on tensors (dtype and shape first), the same keys in
    the same order on dicts, the same length on lists and tuples, the same type and ``==`` on anything
    else; the difference names its place under ``path``, '' when equal."""
    if _is_tensor(a) or _is_tensor(b):
        import torch

        if not (_is_tensor(a) and _is_tensor(b)):
            return False, f"{path}: tensor vs {type(b if _is_tensor(a) else a).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return False, f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if not torch.equal(a, b):
            diff = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "n/a"
            return False, f"{path}: values differ (max abs diff {diff})"
        return True, ""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a.keys()) != list(b.keys()):
            return False, f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            ok, why = compare_snapshots(a[k], b[k], f"{path}[{k!r}]")
            if not ok:
                return ok, why
        return True, ""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return False, f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            ok, why = compare_snapshots(x, y, f"{path}[{i}]")
            if not ok:
                return ok, why
        return True, ""
    if type(a) is not type(b) or a != b:
        return False, f"{path}: {a!r} vs {b!r}"
    return True, ""


def compare_runs(reference: Any, run: Any, world: int) -> tuple[bool, str]:
    """Every rank's final snapshot (``RunDir.final``) of run folder ``run`` against ``reference``'s:
    ``(equal, the first difference or a one-line summary)``; a rank of ``run`` without a final snapshot
    is a difference."""
    import torch

    ref, out = RunDir(reference), RunDir(run)
    for r in range(world):
        if not out.final(r).exists():
            return False, f"rank {r} wrote no final snapshot ({out.final(r)})"
        ok, why = compare_snapshots(torch.load(ref.final(r), weights_only=False), torch.load(out.final(r), weights_only=False),
                                    f"rank {r}")
        if not ok:
            return False, why
    return True, f"all {world} ranks torch.equal (params, optimizer state, RNG, step, cursor)"
