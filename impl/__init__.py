"""Reference PyTorch implementation of AccelPact; this top level is the protocol engine.

The engine (``recovery``, ``controlplane``, ``guard``, ``watchdog``, ``flag``, ``revoke``,
``detector``, ``exitcodes``, ``trace``, ``hooks``) mirrors ``accelpact.model``; the torch runtime
is ``accelpact.impl.runtime`` (imported lazily where torch is needed), the launcher and operations
``accelpact.impl.launch``, and the test tooling ``accelpact.testing`` (the engine imports
``accelpact.testing.seeded`` only where it installs a named seeded bug)."""

from __future__ import annotations

__all__ = ["attach", "Pact", "PactGroups", "RecoveryReport"]


def __getattr__(name):
    if name in __all__:
        from . import recovery

        return getattr(recovery, name)
    raise AttributeError(f"module 'accelpact.impl' has no attribute {name!r}")
