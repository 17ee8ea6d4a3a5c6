"""The episode: one recovery of one rank, as a table of (point, model action) steps, and the one driver.

An episode (a repair at the boundary, a hot swap, a discard in place, a repair after a failed save)
is a row of :class:`Step` s.  Each step names the test hooks' point that opens its phase (None: the
phase goes on), the model action it performs (``model/protocol.py`` ``ACTIONS``), the pc the rank
stands at once it performed it, and the engine's effect: a method that does the action's I/O and
hands back what the record says (:class:`Done`), or None when the rank does not perform the action
in this episode (not the last arriver, not a member of a failed group, nobody died).

:func:`drive` alone runs a table: the hook point, the effect (inside the exit claim for an action
that writes to the control plane: a peer may act on the write at once, so the write and its record
are one action), the action's one trace record, and the exit path: any exception ends the rank
(fail-stop: ``RankFail`` or ``RankTimeout``, :meth:`~accelpact.impl.effects.Effects._fail`).  No
other code writes the record of an action of these tables.

``tests/test_engine_table.py`` holds every table against the model: each action is one of
``ACTIONS``, the effects are defined in ``ACTIONS``' order, and each step is taken only from a pc at
which the model enables its action.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from accelpact.model.state import (PC_AGREED, PC_ARRIVED, PC_GUARDED, PC_JOINED, PC_OBSERVED, PC_READY, PC_REBOUND,
                                   PC_REPLACED, PC_TRAIN, PC_VALIDATED)

__all__ = ["Done", "Episode", "episode_line", "Left", "Rebuild", "RecoveryReport", "REPAIR", "SPARE_SWAP", "Step", "SWAP", "SwapFacts", "drive"]


@dataclass(frozen=True, slots=True)
class Step:
    """One row of an episode's table.

    ``point``: the hooks' point run before this step (a phase's first step), None inside a phase.
    ``action``: the model action.  ``effect``: the name of the engine's method ``(episode) -> Done |
    None``.  ``enters``: the rank's pc once it performed the action (the record's ``pc``; None: the
    pc it stood at).  ``held``: the effect writes to the control plane, so the effect and the record
    run inside the exit claim (:func:`accelpact.impl.exitcodes.holding_exit`; never a wait on peers).
    ``members``: only a member of a failed group performs it (a repair rebinds and validates R only
    where R was rebuilt)."""

    point: str | None
    action: str
    effect: str
    enters: str | None
    held: bool = False
    members: bool = False


@dataclass(slots=True)
class Done:
    """What an effect hands the driver for the action's record: ``state`` beyond the pc (model
    vocabulary: ``frontier``, ``tau``, ``comm``, ``refs_stale``, ``wide``, ``gen``, ``point``),
    ``detail`` (the implementation's facts), ``outcome`` and the generation the record is filed
    under (None: the engine's)."""

    detail: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    outcome: str = "ok"
    gen: int | None = None
    #: the job's abort reason this decision wrote: after the record the rank exits on it (RankExit)
    exit: str | None = None


_AGREE = (
    Step("agree", "RankArrive", "_arrive", PC_ARRIVED, held=True),
    Step(None, "RankDecideAgreement", "_decide_agreement", None, held=True),
    Step(None, "RankAwaitAgreement", "_await_agreement", PC_AGREED),
)
_RELEASE = (
    Step("release", "RankReady", "_ready", PC_READY, held=True),
    Step(None, "RankDecideRelease", "_decide_release", None, held=True),
    Step(None, "RankResume", "_resume", PC_TRAIN),
)

#: A repair at the committed boundary (spec/protocol.md phases 2-6): every rank of W agrees and
#: builds the groups over W; the members of a failed group rebuild R, rebind and validate it.
REPAIR: tuple[Step, ...] = (
    Step("guard", "RankGuard", "_guard", PC_GUARDED),
    *_AGREE,
    Step("replace", "RankReplace", "_replace", PC_REPLACED),
    Step("rebind", "RankRebind", "_rebind", PC_REBOUND, members=True),
    Step("validate", "RankValidate", "_validate", PC_VALIDATED, members=True),
    *_RELEASE,
)

#: A survivor's hot swap (P16) or discard in place (P17, nobody dead): the claims, the step in flight
#: discarded, then every group of the job rebuilt in g+1, the model rebuilt on them, the state sent
#: to each spare by a live replica, every replica validated, the release.
SWAP: tuple[Step, ...] = (
    Step("guard", "RankClaimSpare", "_claim_spares", None, held=True),
    Step(None, "RankDiscardStep", "_discard_step", PC_OBSERVED),
    Step(None, "RankGuard", "_guard", PC_GUARDED),
    *_AGREE,
    Step("replace", "RankReplace", "_replace", PC_REPLACED),
    Step("rebind", "RankRebind", "_rebind", PC_REBOUND),
    Step("validate", "RankTransferState", "_transfer_state", None),
    Step(None, "RankValidate", "_validate", PC_VALIDATED),
    *_RELEASE,
)

#: A spare's part of a hot swap, once it joined as the dead identity (``SpareJoin``, pc ``joined``).
SPARE_SWAP: tuple[Step, ...] = tuple(s for s in SWAP if s.action not in ("RankClaimSpare", "RankDiscardStep", "RankGuard"))

#: The pc each table starts from.
STARTS: dict[str, str] = {"REPAIR": PC_OBSERVED, "SWAP": PC_OBSERVED, "SPARE_SWAP": PC_JOINED}


@dataclass(frozen=True, slots=True)
class Rebuild:
    """How an episode that rebuilds the model (a hot swap, a discard in place) gets its model and hands
    it on; given at :func:`attach` (without it a death or a failure in forward or backward is L2).

    ``job``: the training job whose groups the episode rebuilds, every one in generation g+1
    (:meth:`accelpact.impl.runtime.groups.JobGroups.rebuild_all`).  ``build(job, extra)``: the user's
    factory, building the wrapped model and its optimizer on the job's current groups.
    ``begin()``: called as the episode begins (before any of its actions): what watches the old
    generation stops, and the state published at F comes back (``{"extra": ..., "rng": ...}``).
    ``then(module, optimizer, record)``: called once the episode released and this engine retired:
    attaches the engine of generation g+1 to the rebuilt model (``record``: the
    :class:`~accelpact.impl.runtime.hotswap.SwapRecord`, its generation g and frontier F)."""

    job: Any
    build: Callable[[Any, Any], tuple[Any, Any]]
    begin: Callable[[], dict]
    then: Callable[[Any, Any, Any], None]
    #: issue 41: called once this rank's replica left the data-parallel dimension (``RankLeave``) and the
    #: engine stopped, with the ranks that left and whether this rank idles on the bench (a death's
    #: shrink: a grow may recall it) rather than ending (a requested shrink)
    left: Callable[[Any, bool], None] | None = None


@dataclass(slots=True)
class SwapFacts:
    """What a hot swap's (or a discard's) steps pass on (``Episode.swap``).  ``job``: the training job
    whose groups the swap rebuilds; ``rebuild``: the user's factory ``(job, extra) -> (module,
    optimizer)``; ``extra``/``rng``: the state published at F; ``old``: a survivor's committed module
    and optimizer (moved into the rebuilt ones, then dropped); ``held``: a survivor's old R."""

    role: str                         # "survivor" or "spare"
    point: str                        # where the death (or the failure) struck
    dead: tuple[int, ...]
    job: Any
    rebuild: Callable[[Any, Any], tuple[Any, Any]]
    extra: Any
    rng: Any
    old: tuple[Any, Any] | None = None
    held: tuple = ()
    decision: str = ""
    claims: dict[int, int] = field(default_factory=dict)
    module: Any = None
    optimizer: Any = None
    kind: str = ""
    sources: dict[int, int] = field(default_factory=dict)
    #: issue 41: "" (a swap, or a discard with nobody dead), "shrink" (``dead`` leave the data-parallel
    #: dimension: no spare, a live replica of each), "grow" (``dead`` are vacant identities that spares take)
    mode: str = ""
    #: the ranks in training in g+1 (None: every rank of the topology); set by the decision
    active: tuple[int, ...] | None = None


@dataclass(slots=True)
class Episode:
    """One recovery episode of this rank (generation ``g``): what the steps pass on."""

    g: int
    member: bool                      # this rank is in a failed group: it rebuilds R
    failed: tuple[int, ...] | None    # indices of the failed groups of R's kind (None: read after the agreement)
    t_boundary: int                   # boundary collective start (ns)
    t_observed: int                   # failure observed (ns)
    error: BaseException | None
    revoke_to_observe_ns: int = -1
    frontier: int = 0
    last_arriver: bool = False
    last_ready: bool = False
    #: R's generation-(g+1) communicator between phase 4 and the resume (never the old one: the
    #: episode is reachable from the module, and phase 5's check would find it as a stale reference)
    new_pg: Any = None
    refs_rebound: int = 0
    durations: dict[str, int] = field(default_factory=dict)
    #: a hot swap's or a discard's facts (None: a repair)
    swap: SwapFacts | None = None
    #: the groups over all of W failed in generation ``g`` (their wide revoke stands: a failure flag,
    #: a save or the commit fence failed under some rank), read after the agreement: a repair
    #: rebuilds them only then (P18.3); None until read
    wide_failed: bool | None = None


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """One repair.  Durations in ns; measured, never asserted."""

    generation: int            # the generation that was repaired (the pact now runs in generation + 1)
    member: bool               # this rank rebuilt R
    observe_ns: int            # boundary collective start -> failure observed (phase 1)
    agree_ns: int              # guard + contract + frontier agreement (phases 2-3)
    rebuild_ns: int            # phase 4
    rebind_ns: int             # phase 5
    validate_ns: int           # phase 6 validation
    release_ns: int            # release vote -> resume
    retire_ns: int             # dropping the old communicator
    total_ns: int              # observed -> resumed
    refs_rebound: int
    revoke_to_observe_ns: int  # this rank's revoke hard-close -> observed (-1: observed directly, before the revoke)


class Left(BaseException):
    """This rank's replica left the data-parallel dimension (a shrink's ``RankLeave``): the episode
    ends here for it; the engine stops and the training loop ends on this rank (``Pact._rebuild``).
    A BaseException: the driver's fail-stop path (``except Exception``) must not take it for a failure."""

    def __init__(self, leaving: tuple[int, ...]) -> None:
        super().__init__(f"ranks {list(leaving)} left the data-parallel dimension")
        self.leaving = leaving


class Exited(BaseException):
    """Never escapes: an exit path ends the process (``os._exit``); raised only where a test's fake
    exit returns."""


def episode_line(ep: Episode) -> str:
    """The one line a resumed episode prints (issue 44: a quiet log, one clear line per episode)."""
    ms = (time.monotonic_ns() - ep.t_observed) / 1e6 if ep.t_observed else 0.0
    sw = ep.swap
    if sw is None:
        failed = "" if ep.failed is None else f" {list(ep.failed)}"
        what = f"failed replicate group(s){failed} repaired in place (L1)"
    elif sw.mode == "shrink":
        what = f"rank(s) {list(sw.dead)} gone, their replica left training (shrink)"
    elif sw.mode == "grow":
        what = f"vacant rank(s) {list(sw.dead)} taken by spares (grow)"
    elif sw.dead:
        what = f"rank(s) {list(sw.dead)} replaced by a spare (hot swap), step {ep.frontier} discarded and rerun"
    else:
        what = f"step {ep.frontier} discarded in place after a failure in {sw.point or 'the step'} and rerun"
    return f"accelpact: episode g{ep.g} at frontier F={ep.frontier}: {what}; every rank resumed after {ms:.0f} ms"


def _say_resumed(engine: Any, ep: Episode) -> None:
    """One line on stderr for the whole job: printed by the lowest rank the episode counted."""
    members = getattr(getattr(engine, "control", None), "members", None) or (0,)
    if getattr(engine, "rank", None) == min(members):
        print(episode_line(ep), file=sys.stderr, flush=True)


def drive(engine: Any, ep: Episode, steps: tuple[Step, ...], *, raising: bool = False) -> None:
    """Run ``steps`` for ``ep`` on ``engine``: before a phase's first step the hooks' point (a fault
    strikes between actions, as the model's ``Fault*`` actions do); each step's effect, and, when it
    performed the action, its one record (inside the exit claim for a ``held`` step); each phase's
    duration in ``ep.durations``.  Any exception ends the rank (fail-stop, ``engine._fail``), or,
    ``raising``, propagates (a step run alone, outside any episode: ``Pact.rebind``).

    ``engine`` provides ``_at(point)``, ``_hold()``, ``_record(action, enters, done)``,
    ``_exit_on_abort(reason)``, ``_fail(exc)`` and one method per step's ``effect``."""
    phase, t = None, time.monotonic_ns()
    try:
        for step in steps:
            if step.point is not None:
                if phase is not None:
                    ep.durations[phase] = time.monotonic_ns() - t
                engine._at(step.point)
                phase, t = step.point, time.monotonic_ns()
            if step.members and not ep.member:
                continue
            effect = getattr(engine, step.effect)
            if step.held:
                with engine._hold():
                    done = effect(ep)
                    if done is not None:
                        engine.hooks.written()
                        engine._record(step.action, step.enters, done)
                        if done.exit is not None:
                            engine._exit_on_abort(done.exit)
            else:
                done = effect(ep)
                if done is not None:
                    engine._record(step.action, step.enters, done)
        if phase is not None:
            ep.durations[phase] = time.monotonic_ns() - t
        if steps and steps[-1].action == "RankResume" and not raising:
            _say_resumed(engine, ep)
    except Exited:
        raise
    except Exception as exc:  # noqa: BLE001 - any exception in an episode's steps ends the rank (fail-stop)
        if raising:
            raise
        engine._fail(exc)
