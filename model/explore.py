"""Exhaustive breadth-first exploration of the protocol model (TLC/Stateright style).

The search builds a :class:`networkx.DiGraph` whose nodes are (canonical) states, numbered in
BFS order, and whose edges carry the :class:`~accelpact.model.protocol.Action` taken.  It checks

* every state invariant (``INVARIANTS``) on every state and every edge invariant (``EDGE_INVARIANTS``) on every step;
* L3: no deadlock (a non-final state without successor) and no livelock (a terminal strongly
  connected component, found with ``nx.condensation``, that is not final);
* the properties of final states (``invariants.FINAL_INVARIANTS``: L5, L6) on every final sink (the
  first violated one is reported, with the shortest path to the first sink, in BFS order, breaking it);
* L2 bounded exit: the subgraph of states where ``store.abort`` is set or the store is lost
  (``store.down``) is acyclic, all its sinks
  are final, and its longest path (in model steps) is within :func:`exit_bound_limit`;
* L1: with no fault other than ``FaultGroupFail(boundary)``, every sink is all-resumed (every rank
  training at generation ``faults`` >= 1).  L1 explores that sub-configuration separately.

A violation comes with the SHORTEST concrete counterexample from the initial state (BFS parent
pointers; with symmetry reduction the concrete path is re-derived by replaying actions), printed
TLC style: numbered states, the action of each step and only the variables it changed.

Why BFS plus networkx: BFS gives shortest counterexamples for free, and the graph algorithms
(condensation, DAG longest path) are networkx's, not hand-written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import networkx as nx

from .engine import Search, acyclic_order, cycle_node, longest_path, sinks, terminal_cycles
from .engine_parallel import ParallelSearch
from .invariants import check_final
from .protocol import Action
from .state import PC_TRAIN, Config, State

__all__ = [
    "Counterexample",
    "ExploreResult",
    "Violation",
    "all_resumed",
    "exit_bound_limit",
    "explore",
    "format_counterexample",
    "l1_config",
    "MANIFEST_CONFIGS",
    "NIGHTLY_CONFIGS",
    "load_manifest",
    "manifest_drift",
    "manifest_modes",
    "write_manifest",
]

#: Steps one rank can take in one generation after an abort is written: observe, guard,
#: arrive, decide agreement, await agreement, replace, rebind, validate, ready, decide release,
#: resume, and its exit (RankExit/RankTimeout/RankFail/RankReject): 12.
STEPS_PER_RANK = 12


def exit_bound_limit(cfg: Config) -> int:
    """L2's stated bound, in model steps, from the first abort to a final state.

    Once ``store.abort`` is set no new group failure can start, so each rank takes at most
    :data:`STEPS_PER_RANK` steps, every remaining fault costs one step, and the supervisor
    restart is one more: ``12 * |W| + max_faults + 1``; with spares (hot swap), plus two steps per
    spare: a deposed holder wakes (``RankFenced(rank, wake)``) and is fenced out at its first store
    operation (``RankFenced(rank)``) whether or not an abort stands.
    The search measures the real longest path and checks it against this bound.
    """
    return STEPS_PER_RANK * len(cfg.world) + cfg.max_faults + 1 + 2 * cfg.spares


def l1_config(cfg: Config) -> Config:
    """The sub-configuration of L1: only group failures at the committed boundary."""
    return cfg.with_(faults=frozenset({"group_fail"}), points=("boundary",))


def all_resumed(cfg: Config, s: State) -> bool:
    """L1's goal: no abort, no restart, every rank training, not hung, in the generation after the
    last episode (each episode of boundary group failures was recovered by one generation)."""
    if s.store.abort or s.supervisor:
        return False
    # one generation per episode: several groups failing at one boundary are one episode
    episodes = s.store.failed[0] + 1 if s.store.failed is not None else 0
    return all(rk.pc == PC_TRAIN and not rk.hung and rk.gen == episodes for rk in s.ranks)


# --------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Counterexample:
    """A concrete path from the initial state: ``states[i+1] = step(states[i], actions[i])``."""

    states: tuple[State, ...]
    actions: tuple[Action, ...]

    def __len__(self) -> int:
        return len(self.actions)

    def format(self) -> str:
        return format_counterexample(self)


@dataclass(frozen=True)
class Violation:
    """A violated property: an invariant id (``S1``...), ``deadlock``, ``livelock``, ``L1`` or ``L2``."""

    property: str
    name: str
    message: str
    counterexample: Counterexample | None = None

    def format(self) -> str:
        head = f"{self.property} {self.name} violated: {self.message}"
        if self.counterexample is None:
            return head
        return f"{head}\nShortest counterexample ({len(self.counterexample)} steps):\n{self.counterexample.format()}"


@dataclass
class ExploreResult:
    """What one exploration found; ``ok`` is True when every checked property holds."""

    config: Config
    symmetry: bool
    states: int = 0
    transitions: int = 0          # labelled steps (s, a, t), the TLC "states generated - 1"
    edges: int = 0                # distinct (s, t) edges of the graph
    depth: int = 0                # longest shortest path from the initial state (BFS levels - 1)
    invariants_checked: int = 0   # state-invariant checks + edge-invariant checks
    seconds: float = 0.0
    sinks: int = 0
    deadlocks: int = 0
    livelocks: int = 0
    exit_bound: int | None = None        # longest path in the abort subgraph (model steps)
    exit_bound_limit: int | None = None  # the stated bound it must not exceed
    complete: bool = True                # False when the search stopped at a violation
    liveness: dict[str, bool | None] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    graph: nx.DiGraph | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def counterexample(self) -> Counterexample | None:
        for v in self.violations:
            if v.counterexample is not None:
                return v.counterexample
        return None

    def violated(self) -> set[str]:
        return {v.property for v in self.violations}

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "config": {**config_summary(c), "spares": c.spares},   # every field the CLI sets, as the manifest pins them
            "symmetry": self.symmetry,
            "states": self.states,
            "transitions": self.transitions,
            "edges": self.edges,
            "depth": self.depth,
            "invariants_checked": self.invariants_checked,
            "seconds": round(self.seconds, 3),
            "sinks": self.sinks,
            "deadlocks": self.deadlocks,
            "livelocks": self.livelocks,
            "exit_bound": self.exit_bound,
            "exit_bound_limit": self.exit_bound_limit,
            "complete": self.complete,
            "liveness": self.liveness,
            "ok": self.ok,
            "violations": [
                {
                    "property": v.property,
                    "name": v.name,
                    "message": v.message,
                    "counterexample": None if v.counterexample is None else {
                        "steps": len(v.counterexample),
                        "actions": [str(a) for a in v.counterexample.actions],
                        "text": v.counterexample.format(),
                    },
                }
                for v in self.violations
            ],
        }


# --------------------------------------------------------------------------------------
# TLC-style printing


def _show(v: Any) -> str:
    if isinstance(v, str):
        return v if v else "''"
    if isinstance(v, frozenset):
        return repr(tuple(sorted(v)))
    return repr(v)


def _diff(before: State, after: State) -> list[str]:
    out = []
    for r, (a, b) in enumerate(zip(before.ranks, after.ranks, strict=True)):
        if a is b or a == b:
            continue
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if x != y and f.compare:  # not the cached hashes
                out.append(f"rank[{r}].{f.name}: {_show(x)} -> {_show(y)}")
    for f in fields(before.store):
        x, y = getattr(before.store, f.name), getattr(after.store, f.name)
        if x != y and f.compare:
            out.append(f"store.{f.name}: {_show(x)} -> {_show(y)}")
    for f in fields(before):
        if f.name in ("ranks", "store") or not f.compare:
            continue
        x, y = getattr(before, f.name), getattr(after, f.name)
        if x != y:
            out.append(f"{f.name}: {_show(x)} -> {_show(y)}")
    return out


def _describe(s: State) -> list[str]:
    lines = []
    for r, rk in enumerate(s.ranks):
        lines.append(f"rank[{r}]: pc={rk.pc} gen={rk.gen} frontier={rk.frontier} tau={rk.tau} comm={rk.comm} refs={rk.refs}")
    lines.append(f"store: {s.store}")
    lines.append(f"faults={s.faults} supervisor={s.supervisor!r}")
    return lines


def format_counterexample(cex: Counterexample) -> str:
    """Numbered states; after state 1 each shows its action and only the changed variables."""
    out = ["1: <Initial state>"]
    out += [f"   {line}" for line in _describe(cex.states[0])]
    for i, a in enumerate(cex.actions):
        out.append(f"{i + 2}: {a}")
        changes = _diff(cex.states[i], cex.states[i + 1])
        out += [f"   {line}" for line in changes] or ["   (no variable changed)"]
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# The search


class _Search(Search):
    """The engine's BFS (:class:`accelpact.model.engine.Search`), with counterexamples as
    :class:`Counterexample`."""

    def concrete(self, nodes: list[int]) -> Counterexample:
        """Replay a path of graph nodes from the concrete initial state (re-derived under symmetry)."""
        states, acts = self.replay(nodes)
        return Counterexample(tuple(states), tuple(acts))

    def counterexample(self, node: int, succ: State | None = None) -> Counterexample:
        """Concrete path to ``node``; with ``succ`` (an edge violation), plus the step into it."""
        cex = self.concrete(self.path_to(node))
        if succ is None:
            return cex
        a, y = self.replay_step(cex.states[-1], succ)
        return Counterexample(cex.states + (y,), cex.actions + (a,))


class _ParallelSearch(ParallelSearch, _Search):
    """:class:`accelpact.model.engine_parallel.ParallelSearch`, with counterexamples as :class:`Counterexample`."""


def _liveness(search: _Search, result: ExploreResult) -> None:
    """L3 (deadlocks, livelocks) and L2 (bounded exit) on a fully explored graph."""
    cfg = search.cfg
    states, off, dst = search.states, search.off, search.dst
    ends = sinks(off)
    result.sinks = len(ends)
    dead = [n for n in ends if not search.is_final_node(n)]
    result.deadlocks = len(dead)
    if dead:
        n = dead[0]  # BFS numbering: the smallest id has the shortest path
        rk = ", ".join(f"{r}:{x.pc}{'(hung)' if x.hung else ''}" for r, x in enumerate(states[n].ranks))
        result.violations.append(Violation(
            "deadlock", "NoDeadlock",
            f"{len(dead)} non-final state(s) without successor; the first: ranks {rk}, abort={states[n].store.abort!r}",
            search.concrete(search.path_to(n)),
        ))
    # issue 42: the properties of final states (model/invariants.py FINAL_INVARIANTS) on every final sink
    for n in ends:
        if search.is_final_node(n):
            for inv, msg in check_final(cfg, states[n]):
                result.violations.append(Violation(inv.id, inv.name, f"final state: {msg}", search.concrete(search.path_to(n))))
                break
            else:
                continue
            break
    # livelocks: terminal SCCs that are not a single final/sink state
    order, _indeg = acyclic_order(off, dst)
    live_bad = [] if len(order) == len(states) else [c[0] for c in terminal_cycles(off, dst)]
    del order
    result.livelocks = len(live_bad)
    if live_bad:
        n = min(live_bad)
        result.violations.append(Violation(
            "livelock", "NoLivelock",
            f"{len(live_bad)} terminal strongly connected component(s) that never reach a final state",
            search.concrete(search.path_to(n)),
        ))
    result.liveness["L3"] = not dead and not live_bad

    # L2: bounded exit once an abort is written (or the store is lost): the subgraph of those states
    aborted = search.aborted_mask()
    limit = exit_bound_limit(cfg)
    result.exit_bound_limit = limit
    l2_ok = True
    order, indeg = acyclic_order(off, dst, aborted)
    if not any(aborted):
        result.exit_bound = 0
    elif len(order) != aborted.count(1):
        l2_ok = False
        result.violations.append(Violation(
            "L2", "BoundedExit", "the post-abort subgraph has a cycle: an aborted job can run forever",
            search.concrete(search.path_to(cycle_node(off, dst, indeg, aborted))),
        ))
    else:
        path = longest_path(off, dst, order, aborted)
        result.exit_bound = len(path) - 1
        stuck = [n for n in range(len(states)) if aborted[n] and not any(aborted[v] for v in search.successors(n))
                 and not search.is_final_node(n)]
        if stuck:
            l2_ok = False
            result.violations.append(Violation(
                "L2", "BoundedExit",
                f"{len(stuck)} aborted state(s) never reach a final state (ranks keep waiting after the abort)",
                search.concrete(search.path_to(stuck[0])),
            ))
        elif result.exit_bound > limit:
            l2_ok = False
            result.violations.append(Violation(
                "L2", "BoundedExit",
                f"the longest post-abort path takes {result.exit_bound} steps, more than the bound {limit}",
                search.concrete(search.path_to(path[0]) + path[1:]),
            ))
    result.liveness["L2"] = l2_ok


def _l1(cfg: Config, symmetry: bool, result: ExploreResult) -> None:
    """L1: with only boundary group failures every sink is all-resumed (and nothing else is a sink)."""
    sub = l1_config(cfg)
    search = _Search(sub, symmetry)
    found = search.run(stop=True)
    if found:
        (pid, _name, msg), node, _act, succ = found[0]
        cex = search.counterexample(node, succ)
        result.liveness["L1"] = False
        result.violations.append(Violation("L1", "BoundaryRecovers", f"safety {pid} fails with boundary faults only: {msg}", cex))
        return
    ends = sinks(search.off)
    bad = [n for n in ends if not all_resumed(sub, search.states[n])]
    order, _indeg = acyclic_order(search.off, search.dst)
    cyclic = len(order) != len(search.states)
    result.liveness["L1"] = not bad and not cyclic and bool(ends)
    if bad:
        result.violations.append(Violation(
            "L1", "BoundaryRecovers",
            f"with only FaultGroupFail(boundary), {len(bad)} sink(s) are not all-resumed",
            search.concrete(search.path_to(bad[0])),
        ))
    elif cyclic:
        result.violations.append(Violation("L1", "BoundaryRecovers", "the boundary-only graph has a cycle: recovery may never finish"))


def explore(
    cfg: Config,
    *,
    symmetry: bool = True,
    stop_on_violation: bool = True,
    liveness: bool = True,
    keep_graph: bool = False,
    progress: Callable[[Search], None] | None = None,
    workers: int = 1,
) -> ExploreResult:
    """Explore every reachable state of ``cfg`` and check safety, then L3, L2 and L1.

    By default the search stops at the first safety violation (liveness is then not checked:
    ``complete`` is False).  ``keep_graph`` keeps the :class:`networkx.DiGraph` in the result
    (nodes: state ids in BFS order with attribute ``state``; edges: attribute ``action``).
    ``progress`` is called with the search every 65,536 expanded states.  ``workers`` > 1 runs
    the search in that many processes (:mod:`accelpact.model.engine_parallel`; the same graph).
    """
    if workers > 1:
        if keep_graph:
            raise ValueError("explore: keep_graph needs the states in one process; use workers=1")
        search: _Search = _ParallelSearch(cfg, symmetry, workers)
        try:
            return _explore(search, cfg, symmetry, stop_on_violation, liveness, keep_graph, progress)
        finally:
            search.close()  # type: ignore[attr-defined]  # a _ParallelSearch, typed as its base
    return _explore(_Search(cfg, symmetry), cfg, symmetry, stop_on_violation, liveness, keep_graph, progress)


def _explore(search: _Search, cfg: Config, symmetry: bool, stop_on_violation: bool, liveness: bool, keep_graph: bool,
             progress: Callable[[Search], None] | None) -> ExploreResult:
    t0 = time.perf_counter()
    found = search.run(stop_on_violation, progress)
    result = ExploreResult(config=cfg, symmetry=symmetry)
    for (pid, name, msg), node, _act, succ in found:
        result.violations.append(Violation(pid, name, msg, search.counterexample(node, succ)))
    result.complete = not (found and stop_on_violation)
    result.states = len(search.states)
    result.transitions = search.transitions
    result.edges = search.edges
    result.depth = search.depth
    result.invariants_checked = search.checks
    if result.complete:
        search.index.clear()  # the search is over: only the arrays and the states are needed now
        if liveness:
            _liveness(search, result)
            _l1(cfg, symmetry, result)
        if keep_graph:
            result.graph = search.graph(states=True)
    result.seconds = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------------------
# The manifest: pinned state-space sizes per configuration (as tlaplus/Examples does)

MANIFEST_PATH = __import__("pathlib").Path(__file__).with_name("manifest.json")
MANIFEST_FORMAT = "accelpact-manifest/1"


def _ddp(nodes: int, faults: int) -> Config:
    return Config(nodes=nodes, ranks_per_node=1, affected_local=0, group="world", max_faults=faults)


#: name -> (configuration, fast): fast entries are recomputed by the test suite.
MANIFEST_CONFIGS: dict[str, tuple[Config, bool]] = {
    "2x2-f0": (Config(max_faults=0), True),
    "2x2-f1": (Config(max_faults=1), True),
    "2x2-f2": (Config(max_faults=2), False),
    "2x2-world-f1": (Config(group="world", max_faults=1), True),
    "2x1-ddp-f1": (_ddp(2, 1), True),
    "2x1-ddp-f2": (_ddp(2, 2), True),
    "3x1-ddp-f1": (_ddp(3, 1), True),
    "3x2-f1": (Config(nodes=3, max_faults=1), False),
    "4x2-f1": (Config(nodes=4, max_faults=1), False),
    # any group may fail, several at once: boundary group failures only (the other kinds multiply it)
    "2x2-any-f2": (Config(max_faults=2, failing="any", faults=frozenset({"group_fail"}), points=("boundary",)), False),
    # a partial collective: each rank observes a failure anywhere it next uses R (DDP: also forward)
    "2x2-points-f2": (Config(max_faults=2, faults=frozenset({"group_fail"})), False),
    "2x1-ddp-points-f2": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, faults=frozenset({"group_fail"}),
                                 uses_r=("forward", "backward", "boundary")), True),
    # the store is lost during an episode; F and C move between episodes
    "2x2-store-f2": (Config(max_faults=2, faults=frozenset({"group_fail", "store_loss"}), points=("boundary",),
                            checkpoint_every=2), True),
    # hot swap (issue 13): a rank dies in training and a spare takes its identity from a replica
    # (every fault kind with one spare; two deaths with two spares, FailBench F2: in 2x2 ranks r and
    # r+2 share their replicate group, in 3x1 DDP a replica survives)
    "2x2-spare1-f1": (Config(max_faults=1, spares=1), True),
    "2x1-ddp-spare1-f2": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, spares=1), True),
    # one node: each replicate group holds one rank, so a dead rank has no replica and the swap is
    # L2 (S12; mutant swap-without-replica)
    "1x2-spare1-f1": (Config(nodes=1, ranks_per_node=2, affected_local=1, max_faults=1, spares=1, faults=frozenset({"crash"}),
                             points=("boundary",)), True),
    # two spares, one death: a second spare is left for a second claim of the same identity (S13;
    # mutant double-claim)
    "2x1-ddp-spare2-crash-f1": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, spares=2,
                                       faults=frozenset({"crash"}), points=("boundary",)), True),
    # a group failure, then every rank hangs: only the step deadline ends them (mutant no-step-deadline)
    "1x2-hang-f3": (Config(nodes=1, ranks_per_node=2, affected_local=1, max_faults=3, faults=frozenset({"group_fail", "hang"})), True),
    # physical links (issue 25, P18): a cut fails every group across it; an episode rebuilds the groups
    # over all of W where a failed flag published the wide revoke (S15; mutant replace-r-only), and no
    # more (S16; mutant rebuild-everything, issue 40); 2x1-ddp-links-f2 also meets a latent break (a cut,
    # then the meeting: two units of the budget)
    "2x2-links-f1": (Config(max_faults=1, failing="any", links=True, fence=True, faults=frozenset({"link"}),
                            points=("boundary", "backward")), True),
    "2x1-ddp-links-f2": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=2, failing="any",
                                links=True, fence=True, faults=frozenset({"link", "group_fail", "crash"})), True),
    # the commit fence of a job that discards in place (issue 27, P17.2): a failure in forward or backward
    # stops every rank before its commit; with two faults, a death during the discard's episode too
    "2x2-fence-f1": (Config(max_faults=1, fence=True), True),
    "2x2-fence-f2": (Config(max_faults=2, fence=True, faults=frozenset({"group_fail", "crash"}), points=("backward",)), True),
    "3x1-ddp-spare2-crash-f2": (Config(nodes=3, ranks_per_node=1, affected_local=0, group="world", max_faults=2, spares=2,
                                       faults=frozenset({"crash"}), points=("backward",)), False),
    # shrink, grow and refill (issue 41, P19): a death with no spare idle takes its replica out and keeps
    # the global batch (S17; mutant fixed-share); the keeper refills the pool and a grow brings the
    # replica back from a live one (S13; mutant refill-double-count); two deaths in two replicas of 2x2
    # leave a shard without a replica: L2, never a shrink (S18; mutant shrink-last-replica)
    "2x1-ddp-shrink-refill-f1": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1,
                                        shrink=True, refill=True, faults=frozenset({"crash"})), True),
    "2x2-shrink-crash-f2": (Config(max_faults=2, shrink=True, faults=frozenset({"crash"}), points=("boundary",)), True),
    "2x2-shrink-refill-f1": (Config(max_faults=1, shrink=True, refill=True, faults=frozenset({"crash"}),
                                    points=("boundary",)), False),
    "3x1-ddp-shrink-refill-f1": (Config(nodes=3, ranks_per_node=1, affected_local=0, group="world", max_faults=1,
                                        shrink=True, refill=True, micro_batches=6, faults=frozenset({"crash"})), False),
    # issue 42: every fault point of each mechanism.  The configurations above that restrict deaths to the
    # boundary never instantiate the partial boundary flag (P16.0: a death during the failure flag, a
    # survivor whose copy completed observing in the next step's backward and discarding it): a swap at
    # every point with one spare, a second spare left (S13), no replica (S12), and a shrink in HSDP, each
    # with deaths at the boundary and in backward
    "2x1-ddp-spare1-crash-f1": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, spares=1,
                                       faults=frozenset({"crash"})), True),
    "2x1-ddp-spare2-crash-bb-f1": (Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, spares=2,
                                          faults=frozenset({"crash"}), points=("boundary", "backward")), True),
    "1x2-spare1-bb-f1": (Config(nodes=1, ranks_per_node=2, affected_local=1, max_faults=1, spares=1, faults=frozenset({"crash"}),
                                points=("boundary", "backward")), True),
    "2x2-shrink-crash-bb-f1": (Config(max_faults=1, shrink=True, faults=frozenset({"crash"}), points=("boundary", "backward")),
                               False),
}

#: The nightly profile (``make nightly``, :mod:`accelpact.model.engine_nightly`): millions of states
#: each, minutes and gigabytes, so they are pinned apart (the manifest's ``nightly`` section), only with
#: symmetry reduction (unreduced, 3x2 is up to 12 times larger), compared by ``make nightly``
#: (:mod:`accelpact.model.engine_nightly`), and rewritten by ``write_manifest`` only when named.
NIGHTLY_CONFIGS: dict[str, Config] = {
    "2x2-f3": Config(max_faults=3),
    "3x2-f2": Config(nodes=3, max_faults=2),
    # 2x2, two spares, two crashes at the boundary: millions of states (3.5 million with symmetry when
    # it was last pinned, before every episode rebuilt the groups over W, P18.3), so nightly
    "2x2-spare2-crash-f2": Config(max_faults=2, spares=2, faults=frozenset({"crash"}), points=("boundary",)),
}


#: Manifest configurations pinned with symmetry reduction only: unreduced, 4x2's eight ranks give
#: millions of states (up to 4! * 3! = 144 renamings of each), too many to recompute as a check.
#: A job that shrinks has no rank symmetry (a replica out is one node's ranks: ``symmetry.rank_classes``), so
#: both modes are one search: pinned once.
SYMMETRY_ONLY = frozenset({"4x2-f1", "2x1-ddp-shrink-refill-f1", "2x2-shrink-crash-f2", "2x2-shrink-refill-f1",
                           "3x1-ddp-shrink-refill-f1", "2x2-shrink-crash-bb-f1"})


def manifest_modes(name: str) -> tuple[str, ...]:
    """The pinned modes of an entry: ``symmetry`` and ``no_symmetry``; nightly ones and
    ``SYMMETRY_ONLY`` ones ``symmetry`` alone."""
    return ("symmetry",) if name in NIGHTLY_CONFIGS or name in SYMMETRY_ONLY else ("symmetry", "no_symmetry")


def config_summary(cfg: Config) -> dict[str, Any]:
    return {
        "nodes": cfg.nodes, "ranks_per_node": cfg.ranks_per_node, "affected_local": cfg.affected_local,
        "group": cfg.group, "failing": cfg.failing, "max_faults": cfg.max_faults, "faults": sorted(cfg.faults) or "all",
        "points": list(cfg.points), "uses_r": list(cfg.uses_r), "advance": cfg.advance,
        "checkpoint_every": cfg.checkpoint_every, "mutant": cfg.mutant,
        **({"spares": cfg.spares} if cfg.spares else {}),
        **({"links": True} if cfg.links else {}),
        **({"fence": True} if cfg.fence else {}),
        **({"shrink": True, "micro_batches": cfg.micro_batches} if cfg.shrink else {}),
        **({"refill": True} if cfg.refill else {}),
    }


def manifest_numbers(result: ExploreResult) -> dict[str, Any]:
    """The pinned numbers of one exploration (everything deterministic, no timings)."""
    return {
        "states": result.states,
        "transitions": result.transitions,
        "edges": result.edges,
        "depth": result.depth,
        "sinks": result.sinks,
        "exit_bound": result.exit_bound,
        "exit_bound_limit": result.exit_bound_limit,
        "ok": result.ok,
    }


def manifest_entry(name: str, progress: Callable[[Search], None] | None = None,
                   modes: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A fresh manifest entry of ``name``: its configuration and, for each of ``modes`` (default:
    :func:`manifest_modes`), the numbers of an exploration in that mode."""
    cfg, fast = (NIGHTLY_CONFIGS[name], False) if name in NIGHTLY_CONFIGS else MANIFEST_CONFIGS[name]
    entry: dict[str, Any] = {"config": config_summary(cfg), "fast": fast}
    for mode in modes or manifest_modes(name):
        entry[mode] = manifest_numbers(explore(cfg, symmetry=mode == "symmetry", progress=progress))
    return entry


def load_manifest(path: Any = None) -> dict[str, Any]:
    import json

    with open(path or MANIFEST_PATH, encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path or MANIFEST_PATH}: format is {data.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    return data


def write_manifest(names: list[str] | None = None, path: Any = None, fresh: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Recompute ``names`` (default: every MANIFEST_CONFIGS entry; nightly ones only when named) and
    write the manifest, keeping the other entries.  ``fresh``: entries already computed (by
    :func:`manifest_entry`), written as they are."""
    import json

    target = path or MANIFEST_PATH
    try:
        data = load_manifest(target)
    except (FileNotFoundError, ValueError):
        data = {"format": MANIFEST_FORMAT, "configs": {}}
    for name in names or list(MANIFEST_CONFIGS):
        section = "nightly" if name in NIGHTLY_CONFIGS else "configs"
        data.setdefault(section, {})[name] = fresh[name] if fresh and name in fresh else manifest_entry(name)
    data["configs"] = {k: data["configs"][k] for k in MANIFEST_CONFIGS if k in data["configs"]}
    if "nightly" in data:
        data["nightly"] = {k: data["nightly"][k] for k in NIGHTLY_CONFIGS if k in data["nightly"]}
    with open(target, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False)
        fh.write("\n")
    return data


def manifest_drift(name: str, pinned: dict[str, Any], fresh: dict[str, Any] | None = None,
                   modes: tuple[str, ...] | None = None) -> list[str]:
    """Differences between the pinned entry and a fresh exploration (``fresh``: one already made),
    as readable lines, over ``modes`` (default: every pinned mode, :func:`manifest_modes`)."""
    modes = modes or manifest_modes(name)
    fresh = fresh if fresh is not None else manifest_entry(name, modes=modes)
    out = []
    for mode in modes:
        if mode not in pinned:
            out.append(f"{name} [{mode}]: not pinned")
            continue
        for key, want in pinned[mode].items():
            got = fresh[mode].get(key)
            if got != want:
                out.append(f"{name} [{mode}] {key}: pinned {want}, now {got}")
    return out
