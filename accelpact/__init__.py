"""AccelPact: zero-replay in-process recovery at a committed optimizer boundary.

``accelpact.init`` is the public API for your own training script (:mod:`accelpact.impl.launch.api`;
README, "Use it in your training script").  ``accelpact.model`` is the pure executable model (no
torch); ``accelpact.impl`` is the reference torch implementation that mirrors it;
``accelpact.conformance`` checks the second against the first.

Imports: every module of the package imports the package's modules it uses at its top.  The one
exception is loading on first use through a table of module names (``importlib``): this package's
public names (:data:`_PUBLIC`: importing ``accelpact`` or ``accelpact.model`` loads neither the
implementation nor torch), the command line's subcommands (:data:`accelpact.cli.COMMANDS`) and
the benchmarks (:data:`accelpact.bench.cli.REGISTRY`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelpact.impl.launch.api import ApiError, Session, Settings, Training, init

__version__ = "0.1.0"
__all__ = ["ApiError", "Session", "Settings", "Training", "init"]

#: public name -> the module that defines it, imported on first use of the name
_PUBLIC: dict[str, str] = {name: "accelpact.impl.launch.api" for name in __all__}


def __getattr__(name: str) -> Any:
    """``accelpact.init`` (:func:`accelpact.impl.launch.api.init`) and the API's types, loaded on first use."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'accelpact' has no attribute {name!r}")
