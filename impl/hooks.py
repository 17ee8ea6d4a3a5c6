"""Test-only hooks: the one object through which tests reach into a running engine.

The engine (:mod:`accelpact.impl.recovery`) calls :meth:`Hooks.point` at each named point of the
step and of the six phases (``forward`` ... ``release``, :data:`accelpact.testing.faults.FAULT_POINTS`),
between model actions, never inside one.  By default nothing happens there.  Tests and the
conformance runner pass a :class:`Hooks` at ``attach(hooks=...)``:

* ``injector``: a callable ``(point, pact) -> effects`` run at each point; :class:`FaultInjector`
  fires a job's :class:`~accelpact.testing.faults.FaultPlan` there;
* ``seeded_bug``: one of :data:`SEEDED_BUGS`, a deliberately broken engine that the conformance
  suite must reject (its teeth): engine methods replaced at attach (:mod:`accelpact.testing.seeded`);
* ``write_to_record_s``: a sleep between each control-plane write and its trace record, to widen
  the window that the exit claim closes (``unheld-records`` shows why it matters).

No environment variable carries any of this: a hook is an argument, set once at attach.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["FaultInjector", "Hooks", "NO_HOOKS"]  # and SEEDED_BUGS, loaded on use (__getattr__)



def _seeded_names() -> tuple[str, ...]:
    """The seeded bugs' names, from the test tooling (imported only when a hook names one)."""
    from ..testing.seeded import NAMES

    return tuple(NAMES)


def __getattr__(name: str) -> Any:
    if name == "SEEDED_BUGS":  # lazily: the engine does not import the test tooling at import
        return _seeded_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class Hooks:
    """See the module doc.  Immutable: fixed at attach."""

    injector: Callable[[str, Any], None] | None = None
    seeded_bug: str | None = None
    write_to_record_s: float = 0.0

    def __post_init__(self) -> None:
        if self.seeded_bug is not None and self.seeded_bug not in _seeded_names():
            raise ValueError(f"seeded_bug {self.seeded_bug!r} is not a seeded bug; use one of {_seeded_names()} or None")
        if not self.write_to_record_s >= 0:
            raise ValueError(f"write_to_record_s must be >= 0 seconds, got {self.write_to_record_s!r}")

    def bug(self, name: str) -> bool:
        """Whether seeded bug ``name`` is on."""
        if name not in _seeded_names():
            raise ValueError(f"{name!r} is not a seeded bug; one of {_seeded_names()}")
        return self.seeded_bug == name

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


@dataclass
class FaultInjector:
    """Fires a :class:`~accelpact.testing.faults.FaultPlan` at the engine's points (test-only).

    ``boundary`` and ``optimizer``: a fault there strikes only once every rank has reached the point
    (a barrier on the store, the injector's own channel: it touches none of the engine's groups), which is what the model's ``FaultGroupFail(point)`` means
    there: a peer still finishing the step's last backward collective would otherwise see it in
    flight (measured: DDP, a group cut by the first rank to reach its optimizer step)."""

    plan: Any
    fenced_points: tuple[str, ...] = ("optimizer", "boundary")
    fired: list[Any] = field(default_factory=list)
    #: a spare that took a rank's identity at F: the identity's faults up to step F struck its first
    #: process (one of them killed it), so only later steps' fire here; it still joins every fence
    after_first_step: bool = False
    _first: int | None = None
    #: step -> the generation in which this rank first ran it: a step discarded and rerun in a later
    #: generation (a discard in place, a hot swap) fires none of its faults again; they struck its
    #: first run (a fault names a step of the job's history, not each execution of it)
    _first_run: dict = field(default_factory=dict)
    _pid_published: bool = False

    def __call__(self, point: str, pact: Any) -> None:
        from ..testing.faults import FaultContext, pid_key

        if not self._pid_published:  # where a link_cut's other end finds this process
            pact.control.store.set(pid_key(pact.control.prefix, pact.rank), str(os.getpid()))
            self._pid_published = True
        step = pact.step_index
        if point in self.fenced_points and self.plan.scheduled(point, step):
            self._fence(point, step, pact)
        if self._first is None:
            self._first = step
        if self.after_first_step and step <= self._first:
            return
        if self._first_run.setdefault(step, pact.gen) != pact.gen:
            return
        for f in self.plan.at(point, step, pact.rank):
            self.fired.append(f)
            ctx = FaultContext(pact.trace, pact.rank, pact.gen, pact.model_view(), pact.group_records(), pact.guard,
                               pact.module, pact.control.store, pact.control.prefix)
            self.plan.apply(f, ctx)

    @staticmethod
    def _fence(point: str, step: int, pact: Any, timeout_s: float = 120.0) -> None:
        """Wait until every rank of W has reached ``point`` of ``step`` (a store counter)."""
        store, world = pact.control.store, pact.groups.control.size()
        key = f"{pact.control.prefix}inject/g{pact.gen}/{step}/{point}"
        store.add(key, 1)
        deadline = time.monotonic() + timeout_s
        while int(store.add(key, 0)) < world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fault fence at {point} of step {step}: not every rank arrived within {timeout_s}s")
            time.sleep(0.002)
