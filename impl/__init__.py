"""Reference PyTorch implementation of AccelPact; this top level is the protocol engine.

Layers (checked by import-linter in ``make lint``; pyproject.toml ``[tool.importlinter]``):

* the engine, the modules directly here: an episode as a table of model actions and its driver
  (``episode``), one effect per model action (``effects``), what starts an episode (``recovery``:
  ``attach`` -> ``Pact``; ``spare``: ``SpareEngine``), and what they stand on (``controlplane``,
  ``watchdog``, ``detector``, ``guard``, ``flag``, ``hooks``, ``trace``, ``rundir``, ``exitcodes``,
  ``deadlines``, ``threadname``).  It imports neither the launcher nor the test tooling;
* the torch runtime, ``accelpact.impl.runtime`` (groups, revoke, adapters, digests, checkpoints,
  the hot swap's transfers): it imports no protocol module of the engine;
* the launcher and the public API, ``accelpact.impl.launch``, above both.

Nothing in ``accelpact.impl`` imports ``accelpact.testing``: test hooks reach the engine as an
argument (:class:`~accelpact.impl.hooks.Hooks`) that the test tooling builds.  This package's names
load on first use (``accelpact/__init__.py`` says why), so ``import accelpact.impl`` loads no torch."""

from __future__ import annotations

import importlib

__all__ = ["attach", "Pact", "PactGroups", "RecoveryReport"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("accelpact.impl.recovery"), name)
    raise AttributeError(f"module 'accelpact.impl' has no attribute {name!r}")
