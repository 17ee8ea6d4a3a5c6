"""Seeded bugs: deliberately broken engines that the conformance suite must reject (its teeth).

As ``model/mutants.py`` replaces a model action, each seeded bug *replaces* methods of one rank's
engine (:class:`~accelpact.impl.recovery.Pact`, :class:`~accelpact.impl.spare.SpareEngine`)
or of its control plane (:class:`~accelpact.impl.controlplane.ControlPlane`) on that instance,
once, at attach (:func:`install`).  Nothing in the engine branches on a seeded bug: read the
engine for what it does, and this table for how each bug breaks it.

A bug is named in a job (``Job.seeded_bug``, read by the harness's rank program
:mod:`accelpact.testing.worker`) or by a test, never in the environment, and reaches the engine as
the installer of the test hooks (:func:`installer`, ``Hooks.install``): the engine names no bug.
Which oracle rejects each: ``conformance/test_conformance.py`` (``CAUGHT_BY_CHECKER``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
from dataclasses import dataclass
from typing import Any, Callable

from accelpact.impl.episode import Done

__all__ = ["NAMES", "SEEDED_BUGS", "SeededBug", "check", "install", "installer"]


@dataclass(frozen=True)
class SeededBug:
    """One seeded bug: ``engine`` and ``control`` map a method (or attribute) name to its
    replacement, a function of the instance (bound at install) or, for ``_hold``, a value."""

    doc: str
    engine: dict[str, Any]
    control: dict[str, Callable[..., Any]]


# ---- replacements of the engine's (recovery.Pact) helpers ----------------------------------------
def _rebind_sites_unchecked(self: Any, old_pg: Any, new_pg: Any) -> tuple[int, int]:
    """skip-rebind: no reference is rebound, and the stale ones found are not an error."""
    check = self.adapter.verify_sites(self.sites, old_pg, new_pg)
    return int(check.stale), int(check.total)


def _validate_nothing(self: Any, ep: Any) -> Done:
    """skip-validation: a repair's RankValidate recorded without the collective or the replicas'
    digests (a swap's validation is left as it is)."""
    if ep.swap is not None:
        return type(self)._validate(self, ep)
    return Done({"digest": "", "duration_ns": 0})


def _members_along_wrong_axis(self: Any, ep: Any) -> tuple[tuple[int, ...], str]:
    """wrong-members: the mesh read along the wrong axis (this rank's position in every failed group)."""
    members = self.groups.members
    p = members.index(self.rank)
    return tuple(members[p] - self.groups.index + j for j in ep.failed), f"{self.groups.name}-at{p}"


def _claim_recorded_by_every_survivor(self: Any, ep: Any) -> Done | None:
    """claim-per-survivor: every survivor performs RankClaimSpare, not only the one whose claim stood:
    two claims of one dead identity, as the trace tells it."""
    done = type(self)._claim_spares(self, ep)
    if done is None and ep.swap.dead:
        return Done({"claims": {d: None for d in ep.swap.dead}, "decision": ep.swap.decision})
    return done


def _validate_before_transfer(steps: tuple) -> tuple:
    """validate-before-transfer: the swap's table with RankValidate before RankTransferState (the
    spare's digest is its freshly built model's)."""
    i = next(k for k, s in enumerate(steps) if s.action == "RankTransferState")
    transfer, validate = steps[i], steps[i + 1]
    return steps[:i] + (dataclasses.replace(validate, point=transfer.point), dataclasses.replace(transfer, point=None)) + steps[i + 2:]


def _ignore_backend_errors(self: Any, observed: bool) -> None:
    """ignore-backend-errors: the boundary never reads the training groups' ``get_error()``, so a step
    whose collective NCCL's watchdog aborted silently (``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``) stands."""


def _commit_whatever(self: Any) -> None:
    """ignore-backend-errors: ``optimizer.step()`` commits whatever the step's groups recorded or whether
    they were aborted (``Pact._before_commit`` does nothing)."""


# ---- replacements of the control plane's -----------------------------------------------------------
def _key_unfenced(self: Any, g: int, name: str) -> str:
    """no-fence: keys not namespaced by the generation."""
    return f"{self.prefix}{name}"


def _agrees_on_frontier_only(self: Any, row: tuple[int, int], ref: tuple[int, int], g: int) -> bool:
    """no-fence: a frontier report agrees whatever generation it names."""
    return row[0] == ref[0]


def _quorum_of_one(self: Any) -> int:
    """early-release: the first release vote is taken as the last."""
    return 1


SEEDED_BUGS: dict[str, SeededBug] = {
    "skip-rebind": SeededBug("phase 5 skips the rebind and does not fail on stale references",
                             engine={"_rebind_sites": _rebind_sites_unchecked}, control={}),
    "early-release": SeededBug("the first release vote decides", engine={}, control={"release_quorum": _quorum_of_one}),
    "no-fence": SeededBug("control-plane keys not namespaced by the generation", engine={},
                          control={"key": _key_unfenced, "agrees": _agrees_on_frontier_only}),
    "unheld-records": SeededBug("a control-plane write and its trace record are not one action",
                                engine={"_hold": contextlib.nullcontext}, control={}),
    "skip-validation": SeededBug("phase 6 records its success without the collective or the digests",
                                 engine={"_validate": _validate_nothing}, control={}),
    "claim-per-survivor": SeededBug("hot swap: every survivor records a claim of the dead identity's spare",
                                    engine={"_claim_spares": _claim_recorded_by_every_survivor}, control={}),
    "validate-before-transfer": SeededBug("hot swap: phase 6 validates the new group before the spare holds its state",
                                          engine={"SWAP_STEPS": _validate_before_transfer}, control={}),
    "wrong-members": SeededBug("phase 4 builds R's new communicator with the wrong membership (phase 6 must catch it)",
                               engine={"_new_members": _members_along_wrong_axis}, control={}),
    "ignore-backend-errors": SeededBug("the engine ignores the backends' recorded errors (get_error()) and aborts, before "
                                       "the commit and at the boundary: a step on a silently aborted NCCL communicator stands",
                                       engine={"_fail_on_backend_errors": _ignore_backend_errors,
                                               "_before_commit": _commit_whatever}, control={}),
}


#: the seeded bugs' names, in the table's order
NAMES: tuple[str, ...] = tuple(SEEDED_BUGS)


def check(name: str | None) -> None:
    """ValueError unless ``name`` is a seeded bug or None."""
    if name is not None and name not in SEEDED_BUGS:
        raise ValueError(f"seeded_bug {name!r} is not a seeded bug; use one of {tuple(SEEDED_BUGS)} or None")


def installer(name: str | None) -> Callable[..., None] | None:
    """What the test hooks call at attach to install seeded bug ``name`` (``Hooks.install``:
    ``install(engine=..., control=...)``); None for None.  ValueError, naming the seeded bugs, for
    a name that is not one."""
    check(name)
    return None if name is None else functools.partial(install, name)


def install(name: str | None, *, engine: Any = None, control: Any = None) -> None:
    """Replace, on these instances, what seeded bug ``name`` replaces (None: nothing).  ``_hold``
    is replaced by value, and with it the control plane's exit claim on an expired wait
    (``ControlPlane.claims_exit``) goes: both are the hold of one write and its record."""
    check(name)
    if name is None:
        return
    bug = SEEDED_BUGS[name]
    if engine is not None:
        for attr, fn in bug.engine.items():
            if attr == "_hold":
                engine._hold = fn
                engine.control.claims_exit = False
            elif attr.isupper():  # an episode table: replaced by what fn makes of the engine's own
                setattr(engine, attr, fn(getattr(engine, attr)))
            elif hasattr(type(engine), attr):
                setattr(engine, attr, types.MethodType(fn, engine))
    if control is not None:
        for attr, fn in bug.control.items():
            setattr(control, attr, types.MethodType(fn, control))
