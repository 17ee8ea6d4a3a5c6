"""Reference PyTorch implementation of AccelPact (torch is imported lazily by the modules that need it)."""

from __future__ import annotations

__all__ = ["attach", "Pact", "PactGroups", "RecoveryReport"]


def __getattr__(name):
    if name in __all__:
        from . import recovery

        return getattr(recovery, name)
    raise AttributeError(f"module 'accelpact.impl' has no attribute {name!r}")
