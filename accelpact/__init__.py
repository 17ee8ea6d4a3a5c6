"""AccelPact: zero-replay in-process recovery at a committed optimizer boundary.

``accelpact.init`` is the public API for your own training script (:mod:`accelpact.impl.launch.api`;
README, "Use it in your training script").  ``accelpact.model`` is the pure executable model (no
torch); ``accelpact.impl`` is the reference torch implementation that mirrors it;
``accelpact.conformance`` checks the second against the first.

Importing ``accelpact`` does not import torch: :func:`init` loads the API on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelpact.impl.launch.api import ApiError, Settings, Training, TrainingJob

__version__ = "0.1.0"
__all__ = ["ApiError", "Settings", "Training", "TrainingJob", "init"]


def init(backend: str | None = None, **kwargs: Any) -> TrainingJob:
    """Build this rank's job: see :func:`accelpact.impl.launch.api.init`."""
    from accelpact.impl.launch.api import init as _init

    return _init(backend, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("ApiError", "Settings", "Training", "TrainingJob"):
        from accelpact.impl.launch import api

        return getattr(api, name)
    raise AttributeError(f"module 'accelpact' has no attribute {name!r}")
