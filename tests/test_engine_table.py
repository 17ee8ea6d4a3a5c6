"""The engine is the model's table: every episode table of ``impl/episode.py`` held against ``model/protocol.py``.

The expected pc moves come from the model, not from the engine: a breadth-first walk of small
configurations records, for every rank action the model takes, the acting rank's pc before and
after.  Each engine step must be one of those moves, from every pc the rank can stand at when the
step comes (a step the rank may skip leaves the earlier pcs possible).  The effects are defined in
``ACTIONS``' order, so a reviewer reads ``impl/effects.py`` beside ``model/protocol.py`` action by
action.  Single-process and torch-light: no rank is spawned.
"""

from __future__ import annotations

import inspect
from collections import deque

import pytest

from accelpact.impl import effects, episode
from accelpact.impl.effects import Effects
from accelpact.model.protocol import ACTIONS
from accelpact.model.state import Config, initial_state
from accelpact.model.transitions import successors

#: small configurations whose reachable states take every rank action of an episode: a repair (HSDP
#: 2x2, one group failure), a discard in place (a failure in backward), a hot swap (a crash, a spare)
CONFIGS = (
    Config(max_faults=1, faults=frozenset({"group_fail"}), points=("boundary",)),
    Config(max_faults=1, faults=frozenset({"group_fail"}), points=("backward",)),
    Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=1, spares=1, faults=frozenset({"crash"}),
           points=("backward", "boundary")),
)
STATE_LIMIT = 60_000


def _model_moves() -> set[tuple[str, str, str]]:
    """(action, pc before, pc after) of the acting rank, for every rank action the model takes."""
    moves: set[tuple[str, str, str]] = set()
    for cfg in CONFIGS:
        start = initial_state(cfg)
        seen, todo = {start}, deque([start])
        while todo and len(seen) < STATE_LIMIT:
            s = todo.popleft()
            for a, t in successors(cfg, s):
                if ACTIONS[a.name].actor in ("rank", "spare") and a.rank is not None:
                    moves.add((a.name, s.ranks[a.rank].pc, t.ranks[a.rank].pc))
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
    return moves


@pytest.fixture(scope="module")
def moves() -> set[tuple[str, str, str]]:
    return _model_moves()


TABLES = {name: getattr(episode, name) for name in episode.STARTS}


def table_problems(steps: tuple[episode.Step, ...], start: str, moves: set[tuple[str, str, str]]) -> list[str]:
    """What in ``steps`` the model does not allow, walking from ``start`` as a member of a failed group
    (every ``members`` step taken) and as a rank outside it (none taken)."""
    return sorted({p for member in (True, False) for p in _walk(steps, start, moves, member)})


def _walk(steps: tuple[episode.Step, ...], start: str, moves: set[tuple[str, str, str]], member: bool) -> list[str]:
    problems = []
    possible = {start}
    for i, step in enumerate(steps):
        if step.members and not member:
            continue
        spec = ACTIONS.get(step.action)
        if spec is None:
            problems.append(f"step {i}: {step.action!r} is not a model action")
            continue
        if not hasattr(Effects, step.effect):
            problems.append(f"step {i}: the engine has no effect {step.effect!r} for {step.action}")
        after = set()
        for pc in sorted(possible):
            post = step.enters if step.enters is not None else pc
            if (step.action, pc, post) not in moves:
                problems.append(f"step {i} {step.action}: the model never moves a rank {pc} -> {post} by it")
            after.add(post)
        optional = step.effect in OPTIONAL
        possible = after | (possible if optional else set())
    return problems


#: effects that return None where the rank does not perform the action (not the last arriver, not the
#: claimer whose claim stood, nothing to discard, not the sender); read from the effects' annotations
OPTIONAL = {name for name, fn in inspect.getmembers(Effects, inspect.isfunction)
            if "None" in str(inspect.signature(fn).return_annotation)}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_step_of_each_episode_table_is_a_move_the_model_makes(name, moves):
    assert table_problems(TABLES[name], episode.STARTS[name], moves) == []


def test_the_tables_end_training_again(moves):
    for name, steps in TABLES.items():
        assert steps[-1].action == "RankResume" and steps[-1].enters == "train", name


def test_the_effects_are_defined_in_the_models_order():
    """Each model action's effect, by its first line in impl/effects.py, follows ``ACTIONS``' order."""
    effect_of = {s.action: s.effect for steps in TABLES.values() for s in steps}
    effect_of.update({"RankObserve": "_observe", "RankReject": "_reject", "RankTimeout": "_exit", "RankFail": "_fail"})
    lines = {a: inspect.getsourcelines(getattr(Effects, e))[1] for a, e in effect_of.items()}
    order = [a for a in ACTIONS if a in lines]
    assert sorted(order, key=lines.__getitem__) == order


def test_the_engines_own_exits_are_the_models_exits():
    for action in effects.EXITS.values():
        assert ACTIONS[action].actor == "rank", action


def test_a_dropped_renamed_or_reordered_step_is_caught(moves):
    """The check has teeth: the repair table with a step dropped, renamed or two steps swapped fails."""
    steps = episode.REPAIR
    dropped = steps[:1] + steps[2:]  # RankArrive gone: RankDecideAgreement from guarded
    renamed = tuple(s if s.action != "RankRebind" else episode.Step(s.point, "RankRebound", s.effect, s.enters, members=True)
                    for s in steps)
    swapped = steps[:4] + (steps[5], steps[4]) + steps[6:]  # RankRebind before RankReplace
    for broken in (dropped, renamed, swapped):
        assert table_problems(broken, episode.STARTS["REPAIR"], moves), broken
