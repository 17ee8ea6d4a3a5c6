"""The public API's one error: it was used in a way it cannot work; the message says what to do instead."""

from __future__ import annotations

__all__ = ["ApiError"]


class ApiError(RuntimeError):
    """The public API was used in a way it cannot work; the message says what to do instead."""
