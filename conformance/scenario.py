"""Scenario files: schema, validation, and the mapping onto the model (spec/scenario-format.md).

A scenario is the public, implementation-independent description of one conformance run:
a world shape, a workload, and a list of injected faults.  This module turns it into a
model :class:`~accelpact.model.state.Config` plus a :class:`Script` that constrains which
``Fault*`` actions may fire where, and computes from the model (never from the
implementation) the reachable outcomes of the scenario.

The script filters successors; the model itself is unchanged.  Pure Python, no torch.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..impl.faults import Fault  # one definition: what a scenario names is what the engine injects (no torch)
from ..model.symmetry import Symmetry
from ..model.protocol import Action, all_actions, is_final, successors
from ..model.state import (
    PC_AGREED,
    PC_ARRIVED,
    PC_CRASHED,
    PC_EXITED,
    PC_GUARDED,
    PC_OBSERVED,
    PC_READY,
    PC_REBOUND,
    PC_REPLACED,
    PC_TRAIN,
    PC_VALIDATED,
    Config,
    State,
    initial_state,
)

SCENARIO_FIELDS = ("name", "topology", "workload", "faults", "expect")
WRAPPERS = ("fsdp1-hybrid", "fsdp2-hybrid", "ddp")
IN_FLIGHT = ("forward", "backward", "optimizer")
TRIGGER_POINTS = IN_FLIGHT + ("boundary",)
RECOVERY_POINTS = ("guard", "agree", "replace", "rebind", "validate", "release")
POINTS = TRIGGER_POINTS + RECOVERY_POINTS
KINDS = ("collective_timeout", "crash", "hang", "exception", "frontier_mismatch", "dirty_guard")
OUTCOMES = ("L1", "L2")

#: Which kinds are meaningful where (anything else is a validation error naming the fix).
ALLOWED_KINDS: dict[str, tuple[str, ...]] = {
    **{p: ("collective_timeout", "crash", "hang", "exception") for p in IN_FLIGHT},
    "boundary": ("collective_timeout", "crash", "hang", "exception", "frontier_mismatch", "dirty_guard"),
    "guard": ("crash", "hang", "exception", "frontier_mismatch", "dirty_guard"),
    "agree": ("crash", "hang", "exception", "frontier_mismatch"),
    **{p: ("crash", "hang", "exception") for p in ("replace", "rebind", "validate", "release")},
}

#: The model fault action each injected kind becomes on its rank(s).
KIND_ACTION = {
    "crash": "FaultCrash",
    "hang": "FaultHang",
    "exception": "FaultRaise",
    "frontier_mismatch": "FaultMismatch",
    "dirty_guard": "FaultDirtyGuard",
}


class ScenarioError(ValueError):
    """A scenario file or mapping is malformed; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Topology:
    nodes: int
    ranks_per_node: int

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True, slots=True)
class Workload:
    wrapper: str
    layers: int
    steps: int
    seed: int
    checkpoint_every: int

    def key(self) -> tuple:
        """What makes two reference (fault-free) runs identical: used to cache references."""
        return (self.wrapper, self.layers, self.steps, self.seed, self.checkpoint_every)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    topology: Topology
    workload: Workload
    faults: tuple[Fault, ...]
    expect: str | None = None   # "L1" | "L2" | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "topology": {"nodes": self.topology.nodes, "ranks_per_node": self.topology.ranks_per_node},
            "workload": {
                "wrapper": self.workload.wrapper,
                "layers": self.workload.layers,
                "steps": self.workload.steps,
                "seed": self.workload.seed,
                "checkpoint_every": self.workload.checkpoint_every,
            },
            "faults": [f.to_json() for f in self.faults],
        }
        if self.expect is not None:
            out["expect"] = {"outcome": self.expect}
        return out

    def dumps(self) -> str:
        """Canonical text (sorted nothing, fixed field order, trailing newline): deterministic corpus."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    @property
    def group(self) -> str:
        return "world" if self.workload.wrapper == "ddp" else "replicate"

    @property
    def episode_steps(self) -> tuple[int, ...]:
        """The steps whose trigger fault starts a recovery episode, in order: episode g is generation g."""
        return tuple(sorted({f.step for f in self.faults if f.at in TRIGGER_POINTS}))

    @property
    def frontier(self) -> int:
        """F: the committed step at which the first trigger fault strikes."""
        return self.episode_steps[0]

    @property
    def checkpoint(self) -> int:
        """C: the last checkpoint at or before F (step 0 counts: the initial state is durable)."""
        every = self.workload.checkpoint_every
        return (self.frontier // every) * every


# --------------------------------------------------------------------------------------
# Validation

def _int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ScenarioError(f"{where}: must be {bound}, got {value}")
    return value


def _obj(where: str, value: Any, required: Iterable[str], optional: Iterable[str] = ()) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: must be an object, got {type(value).__name__}")
    req, opt = tuple(required), tuple(optional)
    extra = set(value) - set(req) - set(opt)
    if extra:
        raise ScenarioError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {list(req + opt)}")
    missing = [k for k in req if k not in value]
    if missing:
        raise ScenarioError(f"{where}: missing required field(s) {missing}")
    return value


def scenario_from_mapping(data: Any, *, source: str = "<scenario>") -> Scenario:
    """Validate and build a scenario; every error names the field, what was wrong and the fix."""
    data = _obj(source, data, ("name", "topology", "workload", "faults"), ("expect",))
    name = data["name"]
    if not isinstance(name, str) or not name or any(c.isspace() or c == "/" for c in name):
        raise ScenarioError(f"{source}.name: must be a non-empty string without spaces or '/', got {name!r}")
    t = _obj(f"{source}.topology", data["topology"], ("nodes", "ranks_per_node"))
    topo = Topology(_int(f"{source}.topology.nodes", t["nodes"], 1, 16), _int(f"{source}.topology.ranks_per_node", t["ranks_per_node"], 1, 16))
    w = _obj(f"{source}.workload", data["workload"], ("wrapper", "layers", "steps", "seed", "checkpoint_every"))
    if w["wrapper"] not in WRAPPERS:
        raise ScenarioError(f"{source}.workload.wrapper: {w['wrapper']!r} is not one of {list(WRAPPERS)}")
    work = Workload(
        w["wrapper"],
        _int(f"{source}.workload.layers", w["layers"], 1, 256),
        _int(f"{source}.workload.steps", w["steps"], 1),
        _int(f"{source}.workload.seed", w["seed"], 0),
        _int(f"{source}.workload.checkpoint_every", w["checkpoint_every"], 1),
    )
    group = "world" if work.wrapper == "ddp" else "replicate"
    if not isinstance(data["faults"], list) or not data["faults"]:
        raise ScenarioError(f"{source}.faults: must be a non-empty list of fault objects (a scenario without faults tests nothing)")
    faults = []
    for i, raw in enumerate(data["faults"]):
        where = f"{source}.faults[{i}]"
        f = _obj(where, raw, ("step", "at", "kind", "ranks"), ("group",))
        step = _int(f"{where}.step", f["step"], 0, work.steps - 2)
        if f["at"] not in POINTS:
            raise ScenarioError(f"{where}.at: {f['at']!r} is not one of {list(POINTS)}")
        if f["kind"] not in KINDS:
            raise ScenarioError(f"{where}.kind: {f['kind']!r} is not one of {list(KINDS)}")
        if f["kind"] not in ALLOWED_KINDS[f["at"]]:
            raise ScenarioError(
                f"{where}: kind {f['kind']!r} cannot be injected at {f['at']!r}; allowed there: {list(ALLOWED_KINDS[f['at']])}"
            )
        ranks = f["ranks"]
        if not isinstance(ranks, list) or not ranks:
            raise ScenarioError(f"{where}.ranks: must be a non-empty list of ranks in [0, {topo.world})")
        for j, r in enumerate(ranks):
            _int(f"{where}.ranks[{j}]", r, 0, topo.world - 1)
        if len(set(ranks)) != len(ranks):
            raise ScenarioError(f"{where}.ranks: duplicate rank in {ranks}")
        g = f.get("group", group)
        if g != group:
            raise ScenarioError(f"{where}.group: wrapper {work.wrapper!r} recovers the {group!r} group; got {g!r} (omit it or use {group!r})")
        faults.append(Fault(step, f["at"], f["kind"], tuple(sorted(ranks)), g))
    expect = None
    if "expect" in data:
        e = _obj(f"{source}.expect", data["expect"], ("outcome",))
        if e["outcome"] not in OUTCOMES:
            raise ScenarioError(f"{source}.expect.outcome: must be one of {list(OUTCOMES)}, got {e['outcome']!r}")
        expect = e["outcome"]
    sc = Scenario(name, topo, work, tuple(faults), expect)
    _check_consistency(sc, source)
    return sc


def _check_consistency(sc: Scenario, source: str) -> None:
    steps = set(sc.episode_steps)
    if not steps:
        raise ScenarioError(f"{source}.faults: needs at least one fault at {list(TRIGGER_POINTS)} to start a recovery")
    for i, f in enumerate(sc.faults):
        if f.at in RECOVERY_POINTS and f.step not in steps:
            raise ScenarioError(
                f"{source}.faults[{i}]: a fault at {f.at!r} needs a fault at 'boundary' (or in flight) at the same step {f.step} "
                "to start the recovery it strikes in; add one"
            )
    for s in steps:
        points = {f.at for f in sc.faults if f.step == s and f.at in TRIGGER_POINTS}
        if len(points) > 1:
            raise ScenarioError(f"{source}.faults: step {s} has trigger faults at several points {sorted(points)}; R fails once per step, pick one")
    if sc.group == "replicate" and sc.topology.ranks_per_node > 1:
        locs = {r % sc.topology.ranks_per_node for r in _group_ranks(sc)}
        if len(locs) > 1:
            raise ScenarioError(
                f"{source}.faults: the ranks of the trigger faults lie in different replicate groups (local indices {sorted(locs)}); "
                "the model recovers one replicate group R: use ranks with the same rank % ranks_per_node"
            )


def _group_ranks(sc: Scenario) -> list[int]:
    """The ranks whose collective on R fails: collective_timeout/exception faults at a trigger
    point, or, when there is none, the ranks of the first trigger fault."""
    ranks = [r for f in sc.faults if f.at in TRIGGER_POINTS and f.kind in ("collective_timeout", "exception") for r in f.ranks]
    return ranks or [r for f in sc.faults if f.at in TRIGGER_POINTS for r in f.ranks]


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read scenario file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{p}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return scenario_from_mapping(data, source=p.name)


# --------------------------------------------------------------------------------------
# Mapping onto the model

#: pcs in which a recovery-phase fault may strike a rank, per point, for (member of R, non-member).
WINDOWS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "boundary": ((PC_TRAIN,), (PC_TRAIN,)),
    "guard": ((PC_OBSERVED,), (PC_OBSERVED,)),
    "agree": ((PC_GUARDED, PC_ARRIVED), (PC_GUARDED, PC_ARRIVED)),
    "replace": ((PC_AGREED,), (PC_AGREED,)),
    "rebind": ((PC_REPLACED,), (PC_AGREED,)),
    "validate": ((PC_REBOUND,), (PC_AGREED,)),
    "release": ((PC_VALIDATED, PC_READY), (PC_AGREED, PC_READY)),
}
#: Narrower windows for the kinds whose model action is enabled only in some pcs.
KIND_WINDOWS = {"dirty_guard": (PC_TRAIN, PC_OBSERVED), "frontier_mismatch": (PC_TRAIN, PC_OBSERVED, PC_GUARDED)}


def surfaces(point: str | None) -> tuple[str | None, ...]:
    """Where a failure injected at ``point`` can be observed: an in-flight failure surfaces at the
    next collective on R, which may lie in a later in-flight phase (a group broken in forward is
    typically noticed by the backward all-reduce); a boundary failure at the boundary."""
    if point in IN_FLIGHT:
        return IN_FLIGHT[IN_FLIGHT.index(point):]
    return (point,)


@dataclass(frozen=True, slots=True)
class ScriptedFault:
    """One model fault action the script allows: its action, rank, generation and pc window."""

    action: str            # FaultGroupFail | FaultCrash | ...
    rank: int | None       # None for FaultGroupFail
    arg: str | None        # the point for FaultGroupFail
    gen: int               # the episode (generation) it belongs to
    pcs: tuple[str, ...]   # the rank's pc must be one of these


@dataclass(frozen=True, slots=True)
class Script:
    """Which Fault* actions may fire where; each fires at most once (counted per state)."""

    faults: tuple[ScriptedFault, ...]

    def allowed(self, s: State, a: Action, fired: frozenset[int]) -> int | None:
        """Index of the scripted fault that action ``a`` fires in state ``s``, or None if not allowed."""
        for i, f in enumerate(self.faults):
            if i in fired or f.action != a.name:
                continue
            if f.rank is None:
                if a.arg in surfaces(f.arg) and s.ranks[0].gen == f.gen:
                    return i
                continue
            if f.rank != a.rank:
                continue
            rk = s.ranks[f.rank]
            if rk.gen == f.gen and rk.pc in f.pcs:
                return i
        return None


def model_config(sc: Scenario) -> Config:
    """The model instance of a scenario (see module doc; spec/scenario-format.md "Mapping")."""
    rpn = sc.topology.ranks_per_node
    local = 0
    if sc.group == "replicate" and rpn > 1:
        local = _group_ranks(sc)[0] % rpn
    return Config(
        nodes=sc.topology.nodes,
        ranks_per_node=rpn,
        affected_local=local,
        group=sc.group,
        max_faults=len(script_for(sc).faults),
        frontier=sc.frontier,
        checkpoint=sc.checkpoint,
        profile=sc.workload.wrapper,
    )


def script_for(sc: Scenario) -> Script:
    """Translate each scenario fault into the model fault actions it stands for."""
    episodes = {s: g for g, s in enumerate(sc.episode_steps)}
    world = sc.topology.world
    rpn = sc.topology.ranks_per_node
    if sc.group == "world" or rpn == 1:
        members = set(range(world))
    else:
        local = _group_ranks(sc)[0] % rpn
        members = {n * rpn + local for n in range(sc.topology.nodes)}
    out: list[ScriptedFault] = []
    for s in sc.episode_steps:
        g = episodes[s]
        point = next(f.at for f in sc.faults if f.step == s and f.at in TRIGGER_POINTS)
        out.append(ScriptedFault("FaultGroupFail", None, point, g, ()))
    for f in sc.faults:
        g = episodes[f.step]
        if f.kind in ("collective_timeout",):
            continue  # the group failure itself
        if f.kind == "exception" and f.at in TRIGGER_POINTS:
            continue  # the failing step/collective raises: that is the group failure
        action = KIND_ACTION[f.kind]
        for r in f.ranks:
            if f.at in IN_FLIGHT:
                pcs: tuple[str, ...] = (PC_TRAIN,)
            elif f.kind in KIND_WINDOWS:
                pcs = KIND_WINDOWS[f.kind]
            else:
                pcs = WINDOWS[f.at][0 if r in members else 1]
            out.append(ScriptedFault(action, r, None, g, pcs))
    return Script(tuple(out))


# --------------------------------------------------------------------------------------
# Model outcomes

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


def forget_past(s: State) -> State:
    """Drop store and history entries of generations every rank has left.

    With fenced keys (every configuration without the ``no-fence`` mutant) no action reads an
    entry of an older generation, so the projection preserves enabledness and endings; it keeps
    the outcome search linear in the number of successive episodes instead of exponential
    (which rank happened to arrive last in episode 1 does not matter in episode 2).
    """
    low = min(rk.gen for rk in s.ranks)
    if low == 0:
        return s
    st = s.store
    st = replace(
        st,
        revoked=frozenset(g for g in st.revoked if g >= low),
        arrivals=frozenset(a for a in st.arrivals if a[0] >= low),
        last_arriver=tuple(a for a in st.last_arriver if a[0] >= low),
        agree=tuple(a for a in st.agree if a[0] >= low),
        ready=frozenset(a for a in st.ready if a[0] >= low),
        last_ready=tuple(a for a in st.last_ready if a[0] >= low),
        release=tuple(a for a in st.release if a[0] >= low),
    )
    return replace(
        s,
        store=st,
        resumed=frozenset(x for x in s.resumed if x[0] >= low),
        agreed=frozenset(x for x in s.agreed if x[0] >= low),
    )


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


def explore(sc: Scenario, *, max_states: int = 400_000, traces: bool = False) -> Outcome:
    """BFS over the scripted state space; the outcomes of every reachable scenario ending.

    With ``traces`` the per-rank abstract traces (sequences of non-fault actions of each rank on
    paths to an ending) are collected too; that needs a DFS over paths, so keep it to small cases.
    """
    cfg = model_config(sc)
    script = script_for(sc)
    acts = all_actions(cfg)
    # Symmetry reduction is sound only when no scripted fault names a rank (the script would
    # otherwise tell symmetric ranks apart).
    sym = Symmetry(cfg) if all(f.rank is None for f in script.faults) else None
    start = (initial_state(cfg), frozenset())
    seen = {start}
    queue = deque([start])
    outcomes: set[str] = set()
    reasons: set[str] = set()
    deadlocks = 0
    while queue:
        node = queue.popleft()
        succ = list(scripted_successors(cfg, script, node, acts))
        if scenario_final(cfg, script, node):
            outcomes.add(classify_final(node[0]))
            if node[0].supervisor:
                reasons.update(rk.reason for rk in node[0].ranks if rk.reason)
                reasons.add(node[0].store.abort) if node[0].store.abort else None
            continue
        if not succ and not is_final(cfg, node[0]):
            deadlocks += 1
        for _a, (t, f) in succ:
            t = forget_past(t)
            t = (sym.canonical(t) if sym is not None else t, f)
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


def affected(sc: Scenario) -> tuple[int, ...]:
    return model_config(sc).affected


__all__ = [
    "Fault", "Outcome", "Scenario", "ScenarioError", "Script", "ScriptedFault", "Topology", "Workload",
    "check_expectation", "explore", "load_scenario", "model_config", "rank_traces", "scenario_from_mapping",
    "script_for", "scripted_successors", "scenario_final",
]
