"""Test-only hooks: the one object through which tests reach into a running engine.

The engine (:mod:`accelpact.impl.recovery`) calls :meth:`Hooks.point` at each named point of the
step and of the six phases (``forward`` ... ``release``, :data:`accelpact.impl.faults.FAULT_POINTS`),
between model actions, never inside one.  By default nothing happens there.  Tests and the
conformance runner pass a :class:`Hooks` at ``attach(hooks=...)``:

* ``injector``: a callable ``(point, pact) -> effects`` run at each point; :class:`FaultInjector`
  fires a job's :class:`~accelpact.impl.faults.FaultPlan` there;
* ``seeded_bug``: one of :data:`SEEDED_BUGS`, a deliberately broken engine that the conformance
  suite must reject (its teeth), each a small branch named where it acts;
* ``write_to_record_s``: a sleep between each control-plane write and its trace record, to widen
  the window that the exit claim closes (``unheld-records`` shows why it matters).

No environment variable carries any of this: a hook is an argument, set once at attach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["FaultInjector", "Hooks", "NO_HOOKS", "SEEDED_BUGS"]

#: Seeded bugs (the conformance suite's teeth): ``skip-rebind`` (phase 5 skips the rebind and
#: does not fail on stale references), ``early-release`` (the first release vote decides),
#: ``no-fence`` (control-plane keys not namespaced by the generation), ``unheld-records`` (a
#: control-plane write and its trace record are not one action), ``skip-validation`` (phase 6
#: records its success without the collective or the replicas' digests).
SEEDED_BUGS = ("skip-rebind", "early-release", "no-fence", "unheld-records", "skip-validation")


@dataclass(frozen=True, slots=True)
class Hooks:
    """See the module doc.  Immutable: fixed at attach."""

    injector: Callable[[str, Any], dict[str, Any]] | None = None
    seeded_bug: str | None = None
    write_to_record_s: float = 0.0

    def __post_init__(self) -> None:
        if self.seeded_bug is not None and self.seeded_bug not in SEEDED_BUGS:
            raise ValueError(f"seeded_bug {self.seeded_bug!r} is not a seeded bug; use one of {SEEDED_BUGS} or None")
        if not self.write_to_record_s >= 0:
            raise ValueError(f"write_to_record_s must be >= 0 seconds, got {self.write_to_record_s!r}")

    def bug(self, name: str) -> bool:
        """Whether seeded bug ``name`` is on."""
        if name not in SEEDED_BUGS:
            raise ValueError(f"{name!r} is not a seeded bug; one of {SEEDED_BUGS}")
        return self.seeded_bug == name

    def point(self, name: str, pact: Any) -> dict[str, Any]:
        """Run the injector at point ``name``; its effects (``{}`` when there is none)."""
        return self.injector(name, pact) if self.injector is not None else {}

    def written(self) -> None:
        """Between a control-plane write and its trace record."""
        if self.write_to_record_s:
            time.sleep(self.write_to_record_s)


NO_HOOKS = Hooks()


@dataclass
class FaultInjector:
    """Fires a :class:`~accelpact.impl.faults.FaultPlan` at the engine's points (test-only).

    ``boundary``: a fault at the boundary strikes only once every rank has committed (a control-group
    all-reduce first), so that a peer still finishing the step's last backward collective does not see
    it in flight."""

    plan: Any
    fenced_points: tuple[str, ...] = ("boundary",)
    fired: list[Any] = field(default_factory=list)

    def __call__(self, point: str, pact: Any) -> dict[str, Any]:
        from .faults import FaultContext

        step = pact.step_index
        if point in self.fenced_points and self.plan.scheduled(point, step):
            import torch

            pact.groups.control.allreduce([torch.zeros(1)]).wait()
        faults = self.plan.at(point, step, pact.rank)
        effects: dict[str, Any] = {}
        for f in faults:
            self.fired.append(f)
            ctx = FaultContext(pact.trace, pact.rank, pact.gen, pact.model_view(), pact.group_records(), pact.guard,
                               pact.module)
            eff = self.plan.apply(f, ctx)
            effects["frontier_delta"] = effects.get("frontier_delta", 0) + eff.get("frontier_delta", 0)
            if "group_failed" in eff:
                effects["group_failed"] = eff["group_failed"]
        return effects
