"""What the model says a scenario may end in (spec/scenario-format.md "Endings", F4).

:func:`model_outcomes` searches the scripted state space of a scenario (:mod:`.mapping`) and
returns its :class:`Outcome`: the reachable outcomes (``L1``, ``L2``), the exit reasons of the L2
endings, and optionally the per-rank abstract traces (:func:`rank_traces`).  It is computed from
the model, never from the implementation; the generator classifies candidates with it and the
runner judges a real run by it.  (Not to be confused with :func:`accelpact.model.explore.explore`,
the model checker's exhaustive search of a configuration.)

Pure Python, no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from ..model.forget import forget_past
from ..model.protocol import Action, all_actions, is_final
from ..model.transitions import successors
from ..model.state import PC_TRAIN, Config, State, initial_state
from ..model.symmetry import Symmetry
from .checker import _LOCAL, _in_failed_group, _inside_episode, resume_alone
from .mapping import Script, model_config, script_for
from .scenario import Scenario, ScenarioError

__all__ = [
    "Outcome", "check_expectation", "classify_final", "model_outcomes", "rank_traces",
    "scenario_final", "scripted_successors",
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the model says a scenario may end in."""

    outcomes: frozenset[str]            # subset of {"L1", "L2"}
    reasons: frozenset[str]             # exit reasons of L2 endings
    states: int                         # scripted states explored
    deadlocks: int                      # non-final states without a successor (must be 0)
    rank_actions: Mapping[int, frozenset[tuple[str, ...]]] = field(default_factory=dict, compare=False, hash=False)

    @property
    def outcome_class(self) -> str:
        """"L1", "L2:<reasons>", or "L1|L2:<reasons>" -- the classifier the generator groups by."""
        parts = []
        if "L1" in self.outcomes:
            parts.append("L1")
        if "L2" in self.outcomes:
            parts.append("L2:" + "+".join(sorted(self.reasons)))
        return "|".join(parts)


def scripted_successors(cfg: Config, script: Script, node: tuple[State, frozenset[int]], actions: tuple[Action, ...] | None = None):
    """Successors of (state, fired) with Fault* actions filtered by the script."""
    s, fired = node
    for a, t in successors(cfg, s, actions if actions is not None else all_actions(cfg)):
        if a.name.startswith("Fault"):
            i = script.allowed(s, a, fired)
            if i is None:
                continue
            yield a, (t, fired | {i})
        else:
            yield a, (t, fired)


def _moves(cfg: Config, acts: tuple[Action, ...]) -> tuple[tuple[tuple[Action, ...], ...], tuple[Action, ...]]:
    """The action instances of each rank (indexed by rank) and those of no rank (job-wide: a group's
    failure with ``failing="one"``, the store's loss, the supervisor's restart), each in ``acts``' order."""
    per: list[list[Action]] = [[] for _ in cfg.world]
    job: list[Action] = []
    for a in acts:
        (job if a.rank is None else per[a.rank]).append(a)
    return tuple(tuple(x) for x in per), tuple(job)


def _alone(cfg: Config, s: State, r: int, a: Action, corrupt: bool, quiet: bool) -> bool:
    """Whether rank r's enabled step ``a`` may be taken alone (:func:`_ample`): a local step
    (:data:`~accelpact.conformance.checker._LOCAL`: it touches only the rank's own variables and
    history, and no other step's enabledness reads them), but the guard while a FaultCorrupt can still
    strike (the guard ends its window) and a resume that may disable the store's loss
    (:func:`~accelpact.conformance.checker.resume_alone`); or, once every scripted fault has fired
    (``quiet``), the observation of a rank outside the episode's failed groups (it reads the revoke
    or its own failure flag and writes nothing a peer reads: the trace checker takes it alone too)."""
    name = a.name
    if name == "RankGuard":
        return not corrupt
    if name == "RankResume":
        return resume_alone(cfg, s, r)
    if name in _LOCAL:
        return True
    return name == "RankObserve" and quiet and _inside_episode(s, r) and not _in_failed_group(cfg, s, r)


def _ample(cfg: Config, script: Script, node: tuple[State, frozenset[int]], moves, corrupt: bool) -> list:
    """The successors of ``node`` the reduced outcome search takes (partial-order reduction): the
    steps of the first rank whose every enabled step may be taken alone (:func:`_alone`), if some
    rank has such steps only, else every successor.  Every other rank's and job-wide step commutes
    with them (tests/test_checker_soundness.py checks the pairs on random runs), so every ending
    reachable from the node is reachable through them (an ample set; the model's runs are finite:
    no cycle can postpone them for ever).  A rank's steps are computed rank by rank: a node with
    such a rank costs that rank's enabledness, not the world's."""
    per_rank, job = moves
    s, fired = node
    quiet = len(fired) == len(script.faults)
    out: list = []
    for r, acts in enumerate(per_rank):
        xs = list(scripted_successors(cfg, script, node, acts))
        if xs and all(_alone(cfg, s, r, a, corrupt, quiet) for a, _t in xs):
            return xs
        out += xs
    out += scripted_successors(cfg, script, node, job)
    return out


def classify_final(s: State) -> str:
    return "L2" if s.supervisor else "L1"


def scenario_final(cfg: Config, script: Script, node: tuple[State, frozenset[int]]) -> bool:
    """A final model state that the scenario can end in: the supervisor restarted (L2), or every
    scripted fault fired and the protocol finished (L1).  An L1 ending that skipped a scripted
    fault is not an ending of this scenario: the injector fires deterministically."""
    s, fired = node
    if not is_final(cfg, s):
        return False
    if s.supervisor:
        return True
    failed = s.store.failed
    if failed is not None and any(rk.pc == PC_TRAIN and rk.gen == failed[0] for rk in s.ranks):
        return False  # a failure is pending that some rank has not observed yet
    return len(fired) == len(script.faults)


def model_outcomes(sc: Scenario, *, max_states: int = 400_000, traces: bool = False, reduce: bool = True) -> Outcome:
    """BFS over the scripted state space; the outcomes of every reachable scenario ending.

    ``reduce``: with partial-order reduction (:func:`_ample`): a 4x4 repair's 16 ranks cost their
    steps, not their interleavings; the state count then counts the reduced graph.

    With ``traces`` the per-rank abstract traces (sequences of non-fault actions of each rank on
    paths to an ending) are collected too; that needs a DFS over paths, so keep it to small cases.
    """
    cfg = model_config(sc)
    script = script_for(sc)
    acts = all_actions(cfg)
    # Symmetry reduction is sound only when no scripted fault names a rank (the script would
    # otherwise tell symmetric ranks apart).
    sym = Symmetry(cfg) if all(f.rank is None for f in script.faults) else None
    start: tuple[State, frozenset[int]] = (initial_state(cfg), frozenset())
    seen = {start}
    #: the successors met so far as the model made them (before the canonical form): most are met
    #: again by another interleaving, and a set lookup is far cheaper than the canonical form
    met: set[tuple[State, frozenset[int]]] = set()
    queue = deque([start])
    outcomes: set[str] = set()
    reasons: set[str] = set()
    deadlocks = 0
    corrupt = any(a.name == "FaultCorrupt" for a in acts) and any(f.action == "FaultCorrupt" for f in script.faults)
    moves = _moves(cfg, acts)
    while queue:
        node = queue.popleft()
        if scenario_final(cfg, script, node):
            outcomes.add(classify_final(node[0]))
            if node[0].supervisor:
                reasons.update(rk.reason for rk in node[0].ranks if rk.reason)
                if node[0].store.abort:
                    reasons.add(node[0].store.abort)
            continue
        succ = _ample(cfg, script, node, moves, corrupt) if reduce else list(scripted_successors(cfg, script, node, acts))
        if not succ and not is_final(cfg, node[0]):
            deadlocks += 1
        for _a, (t, f) in succ:
            raw = (forget_past(cfg, t), f)
            if raw in met or raw in seen:
                continue
            met.add(raw)
            t = (sym.canonical(raw[0]) if sym is not None else raw[0], f)
            if t not in seen:
                if len(seen) >= max_states:
                    raise ScenarioError(f"scenario {sc.name!r}: more than {max_states} model states; reduce the topology or faults")
                seen.add(t)
                queue.append(t)
    per_rank = rank_traces(sc) if traces else {}
    return Outcome(frozenset(outcomes), frozenset(reasons), len(seen), deadlocks, per_rank)


def rank_traces(sc: Scenario, limit: int = 20_000) -> dict[int, frozenset[tuple[str, ...]]]:
    """Per-rank abstract traces: the set of action-name sequences each rank takes on some path
    from the initial state to a scenario ending (faults included, as the injector logs them)."""
    cfg = model_config(sc)
    script = script_for(sc)
    acts = all_actions(cfg)
    world = cfg.world
    out: dict[int, set[tuple[str, ...]]] = {r: set() for r in world}
    # memo: node -> set of per-rank suffix tuples reachable to an ending
    memo: dict[tuple[State, frozenset[int]], frozenset[tuple[tuple[str, ...], ...]]] = {}

    def suffixes(node, depth=0):
        if node in memo:
            return memo[node]
        memo[node] = frozenset()  # cycles cannot reach an ending through themselves
        res: set[tuple[tuple[str, ...], ...]] = set()
        if scenario_final(cfg, script, node):
            res.add(tuple(() for _ in world))
        for a, t in scripted_successors(cfg, script, node, acts):
            for suf in suffixes(t, depth + 1):
                if a.rank is None:
                    res.add(suf)
                else:
                    lst = list(suf)
                    lst[a.rank] = (a.name,) + lst[a.rank]
                    res.add(tuple(lst))
            if len(res) > limit:
                raise ScenarioError(f"scenario {sc.name!r}: more than {limit} abstract trace combinations")
        memo[node] = frozenset(res)
        return memo[node]

    for combo in suffixes((initial_state(cfg), frozenset())):
        for r in world:
            out[r].add(combo[r])
    return {r: frozenset(v) for r, v in out.items()}


def check_expectation(sc: Scenario, outcome: Outcome) -> str | None:
    """None when the scenario's ``expect`` agrees with the model, else the reason it does not."""
    if outcome.deadlocks:
        return f"scenario {sc.name!r}: the model deadlocks in {outcome.deadlocks} scripted state(s)"
    if not outcome.outcomes:
        return f"scenario {sc.name!r}: the model reaches no ending under this script (faults that can never fire?)"
    if sc.expect is not None and outcome.outcomes != {sc.expect}:
        return f"scenario {sc.name!r}: expect.outcome={sc.expect} but the model reaches {sorted(outcome.outcomes)} ({outcome.outcome_class})"
    return None


