"""The transition relation the drivers use: a config's action table, enabledness, one step, and the
successors of a state.

The table is :data:`accelpact.model.protocol.ACTIONS`, or, with a mutant (``Config.mutant``), the
table in which :mod:`accelpact.model.mutants` replaced some actions.  Every driver (the search, the
hypothesis state machine, the trace checker) goes through these functions, never through
``ACTIONS`` directly, so that a mutant reaches all of them.
"""

from __future__ import annotations

from typing import Iterator

from .mutants import table
from .protocol import ACTIONS, Action, ActionSpec, all_actions
from .state import Config, State

__all__ = ["actions_for", "enabled", "step", "successors"]


def actions_for(cfg: Config) -> dict[str, ActionSpec]:
    """The action table of ``cfg``: :data:`~accelpact.model.protocol.ACTIONS`, or the mutant's table
    (:func:`accelpact.model.mutants.table`; ``ValueError`` for an unknown mutant)."""
    if cfg.mutant is None:
        return ACTIONS
    return table(cfg.mutant)


def enabled(cfg: Config, s: State, a: Action) -> bool:
    """Whether action ``a`` is enabled in ``s`` under ``cfg``'s table."""
    return actions_for(cfg)[a.name].enabled(cfg, s, a.rank, a.arg)


def step(cfg: Config, s: State, a: Action) -> State:
    """Apply an enabled action.  Raises ``ValueError`` if it is not enabled (a driver bug)."""
    spec = actions_for(cfg)[a.name]
    if not spec.enabled(cfg, s, a.rank, a.arg):
        raise ValueError(f"{a} is not enabled in this state")
    return spec.step(cfg, s, a.rank, a.arg)


def successors(cfg: Config, s: State, actions: tuple[Action, ...] | None = None) -> Iterator[tuple[Action, State]]:
    """``(action, next state)`` for every enabled action of ``actions`` (default: every action instance of
    ``cfg``, :func:`~accelpact.model.protocol.all_actions`), in that order."""
    table_ = actions_for(cfg)
    for a in actions if actions is not None else all_actions(cfg):
        spec = table_[a.name]
        if spec.enabled(cfg, s, a.rank, a.arg):
            yield a, spec.step(cfg, s, a.rank, a.arg)
