"""Test-only hooks: the one interface through which test tooling reaches into a running engine.

The engine (:mod:`accelpact.impl.recovery`) calls :meth:`Hooks.point` at each named point of the
step and of the six phases (``forward`` ... ``release``, :data:`accelpact.model.faults.FAULT_POINTS`),
between model actions, never inside one, and :meth:`Hooks.arm` once, at attach.  By default
(:data:`NO_HOOKS`) nothing happens at either.  Test tooling provides a :class:`Hooks` in one way:
the ``hooks=`` argument of ``attach`` (the engine's and the public API's); the test harness builds
them (:func:`accelpact.testing.faults.hooks_for`), the engine never imports it:

* ``injector``: a callable ``(point, pact)`` run at each point (the harness's fault injector fires
  a job's faults there);
* ``install``: a callable ``install(engine=..., control=...)`` run at attach on the rank's engine and
  its control plane: it may replace their methods on those instances (a seeded bug, a deliberately
  broken engine that the conformance suite must reject);
* ``write_to_record_s``: a sleep between each control-plane write and its trace record, to widen
  the window that the exit claim closes (the seeded bug ``unheld-records`` shows why it matters).

No environment variable carries any of this: a hook is an argument, set once at attach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Hooks", "NO_HOOKS"]


@dataclass(frozen=True, slots=True)
class Hooks:
    """See the module doc.  Immutable: fixed at attach."""

    injector: Callable[[str, Any], None] | None = None
    install: Callable[..., None] | None = None
    write_to_record_s: float = 0.0

    def __post_init__(self) -> None:
        if self.injector is not None and not callable(self.injector):
            raise ValueError(f"injector must be a callable (point, pact) or None, got {self.injector!r}")
        if self.install is not None and not callable(self.install):
            raise ValueError(f"install must be a callable install(engine=..., control=...) or None, got {self.install!r}")
        if not self.write_to_record_s >= 0:
            raise ValueError(f"write_to_record_s must be >= 0 seconds, got {self.write_to_record_s!r}")

    def arm(self, *, engine: Any, control: Any) -> None:
        """At attach, once per engine: run ``install`` on the engine and its control plane."""
        if self.install is not None:
            self.install(engine=engine, control=control)

    def point(self, name: str, pact: Any) -> None:
        """Run the injector at point ``name`` (between two actions).  It returns nothing: what a
        fault does, it does to the rank (a signal, a cut connection, a flipped bit), and the engine
        meets the consequences as it would a real fault's."""
        if self.injector is not None:
            self.injector(name, pact)

    def written(self) -> None:
        """Between a control-plane write and its trace record."""
        if self.write_to_record_s:
            time.sleep(self.write_to_record_s)


NO_HOOKS = Hooks()
