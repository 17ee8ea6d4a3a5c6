"""A spare's engine: the one episode in which a spare process takes a dead rank's identity.

``SpareJoin`` (:meth:`SpareEngine.join`), then the swap's steps as that rank (``SPARE_SWAP``, the
same effects a survivor runs, :mod:`accelpact.impl.effects`).  Afterwards the identity trains under a
:class:`~accelpact.impl.recovery.Pact` of generation g+1 attached to the model the episode built.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from accelpact.model.state import PC_JOINED

from .controlplane import ControlPlane
from .deadlines import DEFAULT_DEADLINE_S
from .effects import Effects
from .episode import SPARE_SWAP, Done, Episode, SwapFacts, drive
from .exitcodes import code_for, exit_now
from .hooks import NO_HOOKS, Hooks
from .recovery import swap_record
from .runtime import hotswap as _swap
from .trace import NullTrace
from .watchdog import Watchdog

__all__ = ["SpareEngine"]


class SpareEngine(Effects):
    """A spare's engine for the one episode in which it takes a dead rank's identity: ``SpareJoin``
    (:meth:`join`), then the swap's phases 3-6 as that rank (:meth:`swap`, the same actions a
    survivor runs).  Afterwards the identity trains under a :class:`Pact` of generation g+1 attached
    to the model the episode built; this engine stops.  ``job``: the
    :class:`~accelpact.impl.launch.api.TrainingJob`, already under the dead identity (``job.rank``);
    ``published``: what that rank published at its last commit (F, RNG, extra state).

    Unlike a survivor it has no fault points (a fault plan names the job's ranks at their steps; this
    process held no rank until now) and no step deadline; its watchdog ends it on the job's abort."""

    SWAP_STEPS = SPARE_SWAP

    def __init__(self, job: Any, *, control: ControlPlane, spare: int, generation: int, published: dict,
                 trace=None, hooks: Hooks | None = None, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.job = job
        self.rank = job.rank
        self.control = control
        self.trace = trace if trace is not None else NullTrace()
        self.hooks = hooks if hooks is not None else NO_HOOKS
        self.gen = generation
        self.pc = PC_JOINED
        self.deadline_s = deadline_s
        self.spare = spare
        self.published = published
        self._episode = None
        self._arm()
        self.watchdog = Watchdog(control, trace=self.trace, gen_of=lambda: self.gen, pc_of=lambda: self.pc)

    @property
    def frontier(self) -> int:
        """F of the identity taken: what its predecessor published at its last commit."""
        return int(self.published["frontier"])

    @property
    def tau(self) -> int:
        return self.frontier

    def _at(self, point: str) -> None:
        """No fault points on a spare (see the class doc)."""

    def join(self) -> None:
        """SpareJoin: this process holds the dead rank's identity in its generation, with no state
        yet; then its watchdog runs.  If the job already aborted, it never took the identity: it
        exits on the abort with no record as that rank (the model's SpareJoin needs no abort)."""
        with self._hold():
            reason = self.control.read_abort()
            if not reason:
                self._record("SpareJoin", PC_JOINED, Done({"spare": self.spare, "identity": self.rank}))
        if reason:
            exit_now(code_for(reason), f"spare {self.spare}: the job aborted ({reason}) before it took rank "
                     f"{self.rank}'s identity", None)
        self.watchdog.start()

    def swap(self, *, point: str, rebuild: Callable[[Any, Any], tuple[Any, Any]], extra: Any) -> tuple[Any, Any, Any]:
        """The swap's phases as the identity taken (``SWAP_STEPS``), with the claims of the
        episode as they stand; returns the rebuilt module, optimizer and the swap's record."""
        claims = _swap.read_claims(self.control.store, self.gen, self.job.world)
        t = time.monotonic_ns()
        sw = SwapFacts(role="spare", point=point, dead=tuple(sorted(claims)), job=self.job, rebuild=rebuild,
                       extra=extra, rng=self.published.get("rng"), claims=claims)
        ep = Episode(self.gen, True, (), t, t, None, swap=sw)
        self._episode = ep
        drive(self, ep, self.SWAP_STEPS)
        record = swap_record(ep)
        self.watchdog.stop()
        module, optimizer = sw.module, sw.optimizer
        sw.module = sw.optimizer = None
        return module, optimizer, record
