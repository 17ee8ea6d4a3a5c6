"""The exhaustive search's engine: breadth-first search over canonical states, with an int graph.

:class:`Search` numbers states in BFS order and keeps, per state, only ints in arrays: its BFS
parent and the action from it (shortest counterexamples), its level, and its distinct successors
in compressed sparse rows (``off``/``dst``/``lab``: the successors of ``i`` are
``dst[off[i]:off[i + 1]]``, reached first by action ``actions[lab[e]]``).  The states themselves are
kept once, in BFS order, with their parts shared: equal ranks, stores and history sets of
different states are one object (interned when a state is first seen).

The graph properties (sinks, acyclicity, terminal strongly connected components, the longest path
of a DAG) are computed here on those arrays, iteratively, in O(states + edges): networkx's
``DiGraph`` costs about a kilobyte per node and edge, which is what limited the search to a few
hundred thousand states.  ``tests/test_model_explore.py`` checks each function against networkx
(random graphs and model graphs) and the whole exploration against a plain networkx search.

Nothing here changes what is checked: every reachable state is checked against every invariant
and every step against every edge invariant, by the functions of :mod:`accelpact.model.invariants`,
on the states of :mod:`accelpact.model.protocol`'s transition functions.
"""

from __future__ import annotations

import gc
from array import array
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from .invariants import EDGE_INVARIANTS, INVARIANTS
from .protocol import ACTIONS, Action, all_actions, is_final
from .transitions import actions_for, enabled, step
from .state import Config, State, initial_state
from .symmetry import Symmetry

__all__ = ["Search", "acyclic_order", "cycle_node", "longest_path", "sinks", "terminal_cycles"]

#: (what, node, action, concrete successor): what = (property id, name, message); action and
#: successor are set for an edge invariant, None for a state invariant
Found = tuple[tuple[str, str, str], int, "Action | None", "State | None"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused for a search: the search keeps millions of objects alive
    to its end, so the collector's full passes (each over every object alive) find nothing to free;
    the states are frozen dataclasses of tuples and frozensets, which form no cycles.  Reference
    counting still frees what it always frees (a duplicate successor, a copy)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: no broken edge invariant (shared: ``Search.moves`` copies before adding)
_NONE: list[tuple[str, str, str]] = []


class Search:
    """BFS over canonical states with parent pointers; the graph is kept as int arrays."""

    def __init__(self, cfg: Config, symmetry: bool) -> None:
        self.cfg = cfg
        self.sym = Symmetry(cfg) if symmetry else None
        self.actions = all_actions(cfg)
        table = actions_for(cfg)
        specs = [(k, a, table[a.name]) for k, a in enumerate(self.actions)]
        # Every fault action requires an unspent fault budget and no restart (protocol._fault_ok):
        # skipping them wholesale when that fails is a pure speed-up, not a semantic change.
        self.specs = tuple((k, a, sp.enabled, sp.step, a.rank, a.arg) for k, a, sp in specs if sp.actor != "fault")
        self.all_specs = self.specs + tuple((k, a, sp.enabled, sp.step, a.rank, a.arg) for k, a, sp in specs if sp.actor == "fault")
        # Where an instance can be enabled: its actor's program counters (ActionSpec.pcs), for the
        # protocol's own ``enabled`` only (a mutant's replacement is asked in every state).
        self._where: dict[int, tuple[int, frozenset[str]]] = {
            k: (a.rank, pcs) for k, a, sp in specs
            if a.rank is not None and (pcs := ACTIONS[a.name].pcs) is not None and sp.enabled is ACTIONS[a.name].enabled}
        #: (the ranks' program counters, faults possible) -> the instances that can be enabled, in
        #: ``self.actions`` order (the search visits successors in the same order with or without it)
        self._candidates: dict[tuple[tuple[str, ...], bool], tuple] = {}
        self.states: list[State] = []
        self.index: dict[State, int] = {}
        self.parent = array("i")       # BFS parent id (-1: the initial state)
        self.via = array("i")          # index in self.actions of the action from the parent
        self.level = array("i")        # BFS level (distance from the initial state)
        self.off = array("q", [0])     # CSR row offsets, one row per expanded state
        self.dst = array("i")          # distinct successors
        self.lab = array("i")          # the first action (index) that reached each successor
        self.transitions = 0
        self.checks = 0
        # interning tables: one object per distinct part (ranks, and each other compared field)
        # (ints and strings need no interning: small ones are shared already)
        self._parts = tuple(f for f in State.__dataclass_fields__.values()
                            if f.compare and f.name != "ranks" and f.type not in ("int", "str"))
        self._tables: dict[str, dict[Any, Any]] = {f.name: {} for f in self._parts}
        self._ranks: dict[Any, Any] = {}

    # -- bookkeeping --------------------------------------------------------------------

    def canon(self, s: State) -> State:
        return s if self.sym is None else self.sym.canonical(s)

    @property
    def edges(self) -> int:
        return len(self.dst)

    @property
    def reached(self) -> int:
        """States found so far (for progress reports)."""
        return len(self.states)

    @property
    def current_level(self) -> int:
        """The BFS level of the last state found (for progress reports)."""
        return self.level[-1] if self.level else 0

    def aborted_mask(self) -> bytearray:
        """Per state: 1 when the store holds an abort or is lost (L2's subgraph)."""
        return bytearray(1 if s.store.abort or s.store.down else 0 for s in self.states)

    def is_final_node(self, n: int) -> bool:
        """``protocol.is_final`` of state ``n``."""
        return is_final(self.cfg, self.states[n])

    @property
    def depth(self) -> int:
        return max(self.level) if self.level else 0

    def _intern(self, s: State) -> None:
        """Make each part of a new state the one shared object equal to it (an equal value: the
        state's hash and equality are unchanged; only memory is saved)."""
        put = object.__setattr__
        table = self._ranks
        ranks = s.ranks
        shared = tuple([table.setdefault(rk, rk) for rk in ranks])
        if any(a is not b for a, b in zip(shared, ranks, strict=True)):
            put(s, "ranks", shared)
        for f in self._parts:
            v = getattr(s, f.name)
            w = self._tables[f.name].setdefault(v, v)
            if w is not v:
                put(s, f.name, w)

    def _add(self, s: State, parent: int, via: int, level: int) -> int:
        i = len(self.states)
        self._intern(s)
        self.index[s] = i
        self.states.append(s)
        self.parent.append(parent)
        self.via.append(via)
        self.level.append(level)
        return i

    def candidates(self, pcs: tuple[str, ...], faults: bool) -> tuple:
        """The action instances that can be enabled when the ranks' program counters are ``pcs``
        (with the fault actions when ``faults``): every other one's ``enabled`` is false there."""
        key = (pcs, faults)
        got = self._candidates.get(key)
        if got is None:
            where = self._where
            got = self._candidates[key] = tuple(
                e for e in (self.all_specs if faults else self.specs)
                if e[0] not in where or pcs[where[e[0]][0]] in where[e[0]][1])
        return got

    def check_state(self, s: State) -> tuple[str, str, str] | None:
        cfg = self.cfg
        self.checks += len(INVARIANTS)
        for inv in INVARIANTS:
            msg = inv.check(cfg, s)
            if msg is not None:
                return inv.id, inv.name, msg
        return None

    # -- the search ---------------------------------------------------------------------

    def moves(self, s: State) -> Iterator[tuple[int, Action, State, list[tuple[str, str, str]]]]:
        """Every step from ``s``, in ``self.actions`` order: (the action's index, the action, the
        successor as the protocol returns it (not canonical), the edge invariants that step breaks:
        (id, name, message) each, usually none).  Counts the transitions and the checks.  Both
        searches (this one and :mod:`accelpact.model.engine_parallel`'s workers) expand through it."""
        cfg = self.cfg
        key = (tuple([rk.pc for rk in s.ranks]), s.faults < cfg.max_faults and not s.supervisor)
        n_edge = len(EDGE_INVARIANTS)
        for k, a, en, st, r, arg in self._candidates.get(key) or self.candidates(*key):
            if not en(cfg, s, r, arg):
                continue
            t = st(cfg, s, r, arg)
            self.transitions += 1
            self.checks += n_edge
            broken = _NONE
            for inv in EDGE_INVARIANTS:
                msg = inv.check(cfg, s, t)
                if msg is not None:
                    broken = [*broken, (inv.id, inv.name, msg)]
            yield k, a, t, broken

    def run(self, stop: bool, progress: Callable[[Search], None] | None = None) -> list[Found]:
        """Explore everything reachable; returns violations as (what, node, action, concrete successor).

        With ``stop`` it returns at the first violation (the states and edges found so far stay
        recorded).  ``progress`` is called every 2**16 expanded states.
        """
        with paused_gc():
            return self._run(stop, progress)

    def _run(self, stop: bool, progress: Callable[[Search], None] | None) -> list[Found]:
        cfg = self.cfg
        found: list[Found] = []
        s0 = self.canon(initial_state(cfg))
        self._add(s0, -1, -1, 0)
        bad = self.check_state(s0)
        if bad:
            found.append((bad, 0, None, None))
            if stop:
                return found
        states, index, off, dst, lab = self.states, self.index, self.off, self.dst, self.lab
        canon = self.sym.canonical if self.sym is not None else None
        moves = self.moves
        i = 0
        while i < len(states):
            s = states[i]
            lvl = self.level[i] + 1
            succ: dict[int, None] = {}
            for k, a, t, broken in moves(s):
                if broken:
                    if stop:  # the first broken property, as before Search.moves
                        found.append((broken[0], i, a, t))
                        off.append(len(dst))
                        return found
                    found.extend((what, i, a, t) for what in broken)
                c = t if canon is None else canon(t)
                got = index.get(c)
                new = got is None
                j = self._add(c, i, k, lvl) if got is None else got
                if j not in succ:
                    succ[j] = None
                    dst.append(j)
                    lab.append(k)
                if new:
                    bad = self.check_state(c)
                    if bad:
                        found.append((bad, j, None, None))
                        if stop:
                            off.append(len(dst))
                            return found
            off.append(len(dst))
            i += 1
            if progress is not None and not i & 0xFFFF:
                progress(self)
        return found

    # -- the graph ----------------------------------------------------------------------

    def successors(self, i: int) -> array:
        return self.dst[self.off[i]:self.off[i + 1]]

    def graph(self, states: bool = False):
        """The graph as a :class:`networkx.DiGraph` over ints (edges labelled ``action``; with
        ``states``, nodes carry ``state``).  For small graphs: tests, ``keep_graph``."""
        import networkx as nx

        g = nx.DiGraph()
        n = len(self.off) - 1
        g.add_nodes_from(range(len(self.states)))
        acts, off, dst, lab = self.actions, self.off, self.dst, self.lab
        g.add_edges_from((u, dst[e], {"action": acts[lab[e]]}) for u in range(n) for e in range(off[u], off[u + 1]))
        if states:
            nx.set_node_attributes(g, dict(enumerate(self.states)), "state")
        return g

    # -- counterexamples ----------------------------------------------------------------

    def path_to(self, j: int) -> list[int]:
        """Node ids of the BFS (shortest) path from the initial state to ``j``."""
        path = [j]
        while self.parent[j] >= 0:
            j = self.parent[j]
            path.append(j)
        path.reverse()
        return path

    def _replay(self, x: State, target: State) -> tuple[Action, State] | None:
        """The first action (in ``self.actions`` order) taking concrete ``x`` into ``target``'s orbit."""
        cfg = self.cfg
        for a in self.actions:
            if enabled(cfg, x, a):
                y = step(cfg, x, a)
                if self.canon(y) == target:
                    return a, y
        return None

    def replay(self, nodes: list[int]) -> tuple[list[State], list[Action]]:
        """Replay a path of graph nodes from the concrete initial state (re-derived under symmetry):
        ``states[k + 1] = step(states[k], actions[k])`` and ``canon(states[k])`` is node ``nodes[k]``."""
        x = initial_state(self.cfg)
        states, acts = [x], []
        for j in nodes[1:]:
            hit = self._replay(x, self.states[j])
            if hit is None:  # pragma: no cover - would mean the symmetry is unsound
                raise RuntimeError(f"cannot replay the counterexample into state #{j}: the symmetry reduction is unsound")
            a, x = hit
            states.append(x)
            acts.append(a)
        return states, acts

    def replay_step(self, x: State, succ: State) -> tuple[Action, State]:
        """The concrete step from ``x`` into the orbit of ``succ`` (an edge violation's successor)."""
        hit = self._replay(x, self.canon(succ))
        if hit is None:  # pragma: no cover
            raise RuntimeError("cannot replay the violating step: the symmetry reduction is unsound")
        return hit


# --------------------------------------------------------------------------------------
# Graph algorithms on compressed sparse rows: node u's successors are dst[off[u]:off[u+1]].
# ``keep`` (optional) is a bytes-like mask: the subgraph induced by the nodes u with keep[u].


def sinks(off: array) -> list[int]:
    """Nodes without successor."""
    return [u for u in range(len(off) - 1) if off[u] == off[u + 1]]


def _indegrees(off: array, dst: array, keep: bytes | bytearray | None) -> array:
    n = len(off) - 1
    indeg = array("i", bytes(4 * n))
    if keep is None:
        for v in dst:
            indeg[v] += 1
    else:
        for u in range(n):
            if keep[u]:
                for v in dst[off[u]:off[u + 1]]:
                    if keep[v]:
                        indeg[v] += 1
    return indeg


def acyclic_order(off: array, dst: array, keep: bytes | bytearray | None = None) -> tuple[array, array]:
    """Kahn's algorithm: (a topological order of the acyclic part, the remaining in-degrees).

    The (sub)graph is acyclic iff the order holds every (kept) node; otherwise the nodes left out
    (in-degree still > 0) are those on a cycle or reachable from one."""
    n = len(off) - 1
    indeg = _indegrees(off, dst, keep)
    if keep is None:
        stack = [u for u in range(n) if not indeg[u]]
    else:
        stack = [u for u in range(n) if keep[u] and not indeg[u]]
    order = array("i")
    push, pop, emit = stack.append, stack.pop, order.append
    while stack:
        u = pop()
        emit(u)
        for v in dst[off[u]:off[u + 1]]:
            if keep is None or keep[v]:
                d = indeg[v] - 1
                indeg[v] = d
                if not d:
                    push(v)
    return order, indeg


def cycle_node(off: array, dst: array, indeg: array, keep: bytes | bytearray | None = None) -> int:
    """A node on a cycle, given the in-degrees :func:`acyclic_order` left (some > 0).

    Every node left has a predecessor that is left too: walking predecessors from the smallest
    left node must repeat a node, and the first repeated one lies on a cycle."""
    n = len(off) - 1
    left = bytearray(1 if indeg[u] > 0 and (keep is None or keep[u]) else 0 for u in range(n))
    pred: dict[int, int] = {}
    for u in range(n):
        if left[u]:
            for v in dst[off[u]:off[u + 1]]:
                if left[v] and v not in pred:
                    pred[v] = u
    u = left.index(1)
    seen = set()
    while u not in seen:
        seen.add(u)
        u = pred[u]
    return u


def longest_path(off: array, dst: array, order: Iterable[int], keep: bytes | bytearray | None = None) -> list[int]:
    """A longest path (as nodes) of the DAG whose topological order is ``order``."""
    n = len(off) - 1
    dist = array("i", bytes(4 * n))
    prev = array("i", [-1]) * n
    best, end = -1, -1
    for u in order:
        du = dist[u]
        if du > best:
            best, end = du, u
        du += 1
        for v in dst[off[u]:off[u + 1]]:
            if (keep is None or keep[v]) and du > dist[v]:
                dist[v] = du
                prev[v] = u
    if end < 0:
        return []
    path = [end]
    while prev[path[-1]] >= 0:
        path.append(prev[path[-1]])
    path.reverse()
    return path


def terminal_cycles(off: array, dst: array) -> list[list[int]]:
    """The terminal strongly connected components (no edge leaves them) that contain a cycle (more
    than one node, or a self-loop): each is a set of states the search can never leave.  Tarjan's
    algorithm, iteratively; components sorted by their smallest node."""
    n = len(off) - 1
    index = array("i", [-1]) * n
    low = array("i", bytes(4 * n))
    comp = array("i", [-1]) * n
    onstack = bytearray(n)
    stack: list[int] = []
    comps: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, off[root])]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        onstack[root] = 1
        while work:
            u, e = work[-1]
            end = off[u + 1]
            while e < end:
                v = dst[e]
                e += 1
                if index[v] < 0:
                    work[-1] = (u, e)
                    index[v] = low[v] = counter
                    counter += 1
                    stack.append(v)
                    onstack[v] = 1
                    work.append((v, off[v]))
                    break
                if onstack[v] and index[v] < low[u]:
                    low[u] = index[v]
            else:
                work.pop()
                if work:
                    p = work[-1][0]
                    if low[u] < low[p]:
                        low[p] = low[u]
                if low[u] == index[u]:
                    c = len(comps)
                    members = []
                    while True:
                        w = stack.pop()
                        onstack[w] = 0
                        comp[w] = c
                        members.append(w)
                        if w == u:
                            break
                    comps.append(members)
    out = []
    for c, members in enumerate(comps):
        terminal, cyclic = True, len(members) > 1
        for u in members:
            for v in dst[off[u]:off[u + 1]]:
                if comp[v] != c:
                    terminal = False
                    break
                if v == u:
                    cyclic = True
            if not terminal:
                break
        if terminal and cyclic:
            out.append(sorted(members))
    out.sort()
    return out
