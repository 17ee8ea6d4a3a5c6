"""Trace checking: do recorded per-rank traces describe a behaviour of the model?

In the style of etcd raft's and CCF's trace validation (spec/trace-checking.md):

* each rank's records are totally ordered (by ``seq``, which must be gap-free);
* the cross-rank interleaving is *searched*: BFS over nodes (model state, per-rank cursor,
  scripted faults fired), memoised, so the first node found at any progress is reached by a
  shortest model path;
* a record matches a model action with the same name and rank that is enabled in the node's
  state and whose post-state agrees with the record's ``state`` fields under the abstraction
  function (:class:`Abstraction`);
* ``SupervisorRestart`` and, with a scenario script, the ``Fault*`` actions the script allows
  may also happen as silent (unlogged) steps, at most ``silent_bound`` in a row;
* the traces are accepted only if EVERY rank's trace is consumed to its end and each rank's
  ``end`` record agrees with the model (etcd's TraceMatched): a matcher that stops early must
  not report success.

On rejection the :class:`Verdict` explains: the first unmatched record per rank, the model
states the search could have been in, the actions the model allowed there, and the shortest
model path to the last match.  ``t_ns`` is never used for ordering.  Pure Python, no torch.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ..model.contract import IN_FLIGHT_PHASES
from ..model.protocol import Action, actions_for, all_actions, successors, true_lookup
from ..model.state import (
    PC_CRASHED,
    PC_EXITED,
    PC_TRAIN,
    Config,
    State,
    initial_state,
)
from ..impl.trace import FORMAT as TRACE_FORMAT
from ..impl.controlplane import comm_generation, comm_name
from ..impl.rundir import RunDir
from ..impl.trace import RankTrace, Record, TraceError
from .mapping import Script, surfaces

STATE_FIELDS = ("pc", "gen", "frontier", "tau", "point", "comm", "refs_stale", "reason")


@dataclass(frozen=True, slots=True)
class Abstraction:
    """Maps implementation values onto model values.

    ``bases[g]`` is the real committed step at which the failure of generation g struck: the
    model's F (``cfg.frontier``) stands for it, and F+1 (a rank one step ahead) for base+1.
    Without an entry for g the real value is compared with the model's directly.
    """

    bases: Mapping[int, int] = field(default_factory=dict)

    def step(self, cfg: Config, gen: int, real: int) -> int:
        base = self.bases.get(gen)
        return real if base is None else cfg.frontier + (real - base)


def config_from_headers(traces: Mapping[int, RankTrace], *, frontier: int | None = None, checkpoint: int = 0,
                        max_faults: int | None = None, profile: str | None = None) -> Config:
    """A model config from the trace headers (when no scenario file is at hand)."""
    h = next(iter(traces.values())).header
    nodes, rpn = int(h["nodes"]), int(h["ranks_per_node"])
    group = h.get("group", "replicate")
    affected = list(h.get("affected") or [])
    local = affected[0] % rpn if affected and group == "replicate" and rpn > 1 else 0
    if frontier is None:
        obs = [x for tr in traces.values() for rec in tr.records if rec.action == "RankObserve"
               for x in (rec.state.get("frontier"),) if isinstance(x, int)]
        frontier = min(obs) if obs else 1
    if max_faults is None:
        max_faults = count_fault_records(traces) + 1
    cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=local, group=group, max_faults=max_faults,
                 frontier=frontier, checkpoint=min(checkpoint, frontier))
    return cfg.with_(profile=profile or h["profile"]) if profile or h.get("profile") else cfg


def count_fault_records(traces: Mapping[int, RankTrace]) -> int:
    """Distinct model faults logged: one per FaultGroupFail generation, one per other Fault record."""
    groups = {rec.gen for tr in traces.values() for rec in tr.records if rec.action == "FaultGroupFail"}
    others = sum(1 for tr in traces.values() for rec in tr.records if rec.action.startswith("Fault") and rec.action != "FaultGroupFail")
    return len(groups) + others


# --------------------------------------------------------------------------------------
# Matching one record

def _refs_stale(rk) -> int:
    return sum(1 for ref in rk.refs if ref != rk.comm)


#: Actions that touch only the acting rank's variables (and history) and whose effect no other
#: enabled action's enabledness reads: RankGuard (observed -> guarded), RankReplace (agreed ->
#: replaced), and the reads of a decision that stands (a written decision never changes, S2.1):
#: RankAwaitAgreement (arrived -> agreed) and RankResume (ready -> train in g+1; validation counts a
#: member as joined in both).  Not RankRebind or RankValidate: they can complete a peer's validation
#: and so disable its RankTimeout.
_LOCAL = ("RankGuard", "RankReplace", "RankAwaitAgreement", "RankResume")


def _in_failed_group(cfg: Config, s: State, r: int) -> bool:
    """Rank r's group failed in its current generation (it is a member of that episode's R)."""
    f = s.store.failed
    return f is not None and f[0] == s.ranks[r].gen and cfg.group_of(r) in f[2]


def disagreement(cfg: Config, abst: Abstraction, pre: State, a: Action, post: State, rec: Record) -> str | None:
    """None when ``rec`` is a faithful record of model step pre --a--> post, else what differs."""
    r = rec.rank
    if rec.gen != pre.ranks[r].gen:
        return f"record gen {rec.gen} but the rank was in generation {pre.ranks[r].gen}"
    rk = post.ranks[r]
    for k, v in rec.state.items():
        if k == "pc":
            if v != rk.pc:
                return f"pc {v!r} but the model has {rk.pc!r}"
        elif k == "gen":
            if v != rk.gen:
                return f"state.gen {v} but the model has {rk.gen}"
        elif k in ("frontier", "tau"):
            if v is None:
                continue
            mv = getattr(rk, k)
            if abst.step(cfg, pre.ranks[r].gen, int(v)) != mv:
                return f"{k}={v} maps to {abst.step(cfg, pre.ranks[r].gen, int(v))} but the model has {mv}"
        elif k == "point":
            # The contract rejects every in-flight phase alike (C3 rule 1, before the envelope), so
            # the model keeps one in-flight point per failure; real peers observe it wherever they
            # are in the step (one can still be in backward when the failing rank is in optimizer).
            if (v or "") != rk.point and not (v in IN_FLIGHT_PHASES and rk.point in IN_FLIGHT_PHASES):
                return f"point {v!r} but the model has {rk.point!r}"
        elif k == "comm":
            # the record names the real group (its c10d name, controlplane.comm_name), never a
            # bare counter: the generation is read from the name
            gen = comm_generation(v)
            if gen is None:
                return f"comm {v!r} does not name a communicator (expected its c10d name, e.g. {comm_name('accelpact/', 1, 'replicate')!r})"
            if gen != rk.comm:
                return f"comm {v!r} is generation {gen}'s communicator but the model has generation {rk.comm}'s"
        elif k == "refs_stale":
            if v is not None and (int(v) == 0) != (_refs_stale(rk) == 0):
                return f"refs_stale={v} but the model has {_refs_stale(rk)} stale of {len(rk.refs)}"
        elif k == "reason":
            if (v or "") != rk.reason:
                return f"reason {v!r} but the model has {rk.reason!r}"
    g = pre.ranks[r].gen
    d = rec.detail
    if a.name == "RankDecideAgreement" and "decision" in d:
        if d["decision"] != true_lookup(post.store.agree, g):
            return f"decision {d['decision']!r} but the model decided {true_lookup(post.store.agree, g)!r}"
    if a.name == "RankDecideRelease" and "decision" in d:
        if d["decision"] != true_lookup(post.store.release, g):
            return f"decision {d['decision']!r} but the model decided {true_lookup(post.store.release, g)!r}"
    if a.name == "RankArrive" and "last" in d:
        if bool(d["last"]) != ((g, r) in post.store.last_arriver):
            return f"last={d['last']} but the model says {(g, r) in post.store.last_arriver}"
    # A store add and its record are one action (the exit claim is held across both), so the
    # counter a record reports is exactly the model's count after that step.
    if a.name == "RankArrive" and "count" in d:
        n = sum(1 for x in post.store.arrivals if x[0] == g)
        if int(d["count"]) != n:
            return f"count={d['count']} (the store's arrival counter) but the model has {n} arrivals in generation {g}"
    if a.name == "RankReady" and "count" in d:
        n = sum(1 for x in post.store.ready if x[0] == g)
        if int(d["count"]) != n:
            return f"count={d['count']} (the store's release-vote counter) but the model has {n} votes in generation {g}"
    if a.name == "RankReady" and "last" in d:
        if bool(d["last"]) != ((g, r) in post.store.last_ready):
            return f"last={d['last']} but the model says {(g, r) in post.store.last_ready}"
    return None


# --------------------------------------------------------------------------------------
# The search

@dataclass(frozen=True, slots=True)
class Node:
    state: State
    cursors: tuple[int, ...]
    fired: frozenset[int]
    silent: int
    #: search hint, not part of the node's identity: an index into the checker's ``t_ns``-ordered
    #: list of all records at or before which every record is consumed or still ahead
    pos: int = field(default=0, compare=False, hash=False)


@dataclass
class Verdict:
    accepted: bool
    message: str
    nodes: int = 0
    path: list[str] = field(default_factory=list)        # a model path (action strings) to acceptance / last match
    unmatched: dict[int, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.accepted


class TraceChecker:
    """Checks the traces of one attempt against one model configuration (see module doc)."""

    def __init__(self, cfg: Config, traces: Mapping[int, RankTrace], *, script: Script | None = None,
                 abstraction: Abstraction | None = None, silent_bound: int = 4, max_nodes: int = 500_000,
                 restarted: bool = False, silent_faults: bool | None = None) -> None:
        self.cfg = cfg
        self.world = cfg.world
        missing = [r for r in self.world if r not in traces]
        if missing:
            raise TraceError(f"no trace for rank(s) {missing} of a {len(self.world)}-rank world")
        self.traces = {r: traces[r] for r in self.world}
        self.recs = {r: traces[r].records for r in self.world}
        #: every record as (t_ns, rank, index in its rank's trace), in t_ns order: the search's guide
        self.events = sorted((rec.t_ns, r, i) for r in self.world for i, rec in enumerate(self.recs[r]))
        self.script = script
        self.abst = abstraction or Abstraction()
        self.silent_bound = silent_bound
        self.max_nodes = max_nodes
        self.restarted = restarted
        self.actions = all_actions(cfg)
        self.by_rank: dict[tuple[str, int], list[Action]] = {}
        for a in self.actions:
            if a.rank is not None:
                self.by_rank.setdefault((a.name, a.rank), []).append(a)
        # Silent Fault* steps: with a script, those it allows (an unlogged injected fault, e.g. a
        # SIGKILL before the record reached the disk); without one only when asked, because
        # unconstrained silent faults can explain away almost any trace.
        if silent_faults is None:
            silent_faults = script is not None
        self.silent = tuple(a for a in self.actions if (silent_faults and a.name.startswith("Fault")) or a.name == "SupervisorRestart")

    # -- successors --------------------------------------------------------------------

    def _script_ok(self, node: Node, a: Action) -> tuple[bool, frozenset[int]]:
        if not a.name.startswith("Fault") or self.script is None:
            return True, node.fired
        i = self.script.allowed(node.state, a, node.fired)
        return (i is not None), (node.fired | {i} if i is not None else node.fired)

    def _match(self, node: Node, r: int):
        """Successors that consume rank r's next record."""
        rec = self.recs[r][node.cursors[r]]
        cursors = node.cursors[:r] + (node.cursors[r] + 1,) + node.cursors[r + 1:]
        s = node.state
        if rec.action == "FaultGroupFail":
            point = rec.detail.get("point")
            f = s.store.failed
            group = self.cfg.group_of(r)
            if (f is not None and f[0] == s.ranks[r].gen and (point is None or f[1] in surfaces(point))
                    and (self.cfg.failing == "one" or group in f[2])):
                # a second member logging the same group failure: no model step
                yield None, Node(s, cursors, node.fired, 0), None
                return
            # failing="one": the one group's failure; "any": the failure of the logging rank's group,
            # acted by that group's representative
            actor = None if self.cfg.failing == "one" else self.cfg.members(group)[0]
            cands = [Action("FaultGroupFail", actor, p) for p in self.cfg.points if point is None or p in surfaces(point)]
        else:
            cands = self.by_rank.get((rec.action, r), [])
        table = actions_for(self.cfg)
        for a in cands:
            spec = table[a.name]
            if not spec.enabled(self.cfg, s, a.rank, a.arg):
                continue
            ok, fired = self._script_ok(node, a)
            if not ok:
                continue
            t = spec.step(self.cfg, s, a.rank, a.arg)
            if a.name == "FaultGroupFail":
                why = None if rec.gen == s.ranks[r].gen else f"record gen {rec.gen} but the rank was in {s.ranks[r].gen}"
            else:
                why = disagreement(self.cfg, self.abst, s, a, t, rec)
            yield a, Node(t, cursors, fired, 0), why

    def _silent(self, node: Node):
        if node.silent >= self.silent_bound:
            return
        for a, t in successors(self.cfg, node.state, self.silent):
            ok, fired = self._script_ok(node, a)
            if ok:
                yield a, Node(t, node.cursors, fired, node.silent + 1)

    def _local(self, node: Node, r: int) -> bool:
        """Rank r's next record is of a purely local action (see :meth:`_eager`)."""
        c = node.cursors[r]
        if c >= len(self.recs[r]):
            return False
        name = self.recs[r][c].action
        return name in _LOCAL or (name == "RankObserve" and not _in_failed_group(self.cfg, node.state, r))

    def _eager(self, node: Node) -> list[tuple[Node, str]]:
        """Partial-order reduction: a matching record of a purely local action is taken alone.

        RankGuard, RankReplace and a non-member's RankObserve read and write only the acting
        rank's own variables, and no other action's enabledness or effect reads the pcs they
        move between (observed/guarded, agreed/replaced, train/observed within an episode), so
        they commute with every other step: taking them first preserves every accepting path
        (a persistent set of size one).  This keeps rejections affordable at 8 ranks.
        """
        for r in self.world:
            if self._local(node, r):
                for a, t, why in self._match(node, r):
                    if why is None:
                        return [(t, f"eager {a}")]
        return []

    # -- acceptance --------------------------------------------------------------------

    def _done(self, node: Node) -> str | None:
        """None when every trace is consumed and each rank's end agrees with the model."""
        for r in self.world:
            if node.cursors[r] != len(self.recs[r]):
                return f"rank {r} has unconsumed records"
        s = node.state
        for r in self.world:
            rk = s.ranks[r]
            end = self.traces[r].end
            if end is None:
                # Every exit path writes the end record (exitcodes.exit_now, Pact.close); only a
                # signal leaves none: the rank's own SIGKILL (crashed), or torchrun killing a worker
                # that the protocol had not ended (hung or crashed: no exit reason) for its restart.
                if not (rk.pc == PC_CRASHED or (s.supervisor and not rk.reason)):
                    return (f"rank {r}'s trace stops without an end record while the model has it {rk.pc} "
                            "(only a rank killed by a signal may lack one: truncated?)")
                continue
            out = end.get("outcome")
            if out == "released" and not (rk.pc == PC_TRAIN and not rk.hung):
                return f"rank {r} ends 'released' but the model has it {rk.pc}"
            if out == "exited" and rk.pc not in (PC_EXITED,) and not s.supervisor:
                return f"rank {r} ends 'exited' but the model has it {rk.pc}"
            if out == "exited" and s.supervisor and rk.reason == "" and rk.pc != PC_EXITED:
                return f"rank {r} ends 'exited' but the model never ended it"
        return None

    def _frontier(self, node: Node):
        """Each rank's next record, in ``t_ns`` order, read off the ordered list of all records from
        the node's hint on (amortised O(1) a node on the honest path, not O(|W|))."""
        cur = node.cursors
        pos = node.pos
        while pos < len(self.events) and cur[self.events[pos][1]] > self.events[pos][2]:
            pos += 1  # consumed: the next node may start after it
        for i in range(pos, len(self.events)):
            _ts, r, idx = self.events[i]
            if cur[r] == idx:
                yield pos, r

    def _lazy_successors(self, node: Node):
        """The successors of ``node`` one at a time, records in ``t_ns`` order first, each computed
        only when the search asks for it: on the honest path the search takes the first one, so a
        node costs one model step instead of one per rank (what makes 1,024-rank traces affordable).

        Partial-order reduction as in :meth:`_eager`: when the first record in ``t_ns`` order is of
        a purely local action and matches, it is the only successor (a persistent set of size one)."""
        first = True
        for pos, r in self._frontier(node):
            matches = [(a, t) for a, t, why in self._match(node, r) if why is None]
            for a, t in matches:
                yield replace(t, pos=pos), str(a) if a else f"(r{r} logs the group failure again)"
            if first and matches and self._local(node, r):
                return
            first = False
        for a, t in self._silent(node):
            yield replace(t, pos=node.pos), f"silent {a}"

    def _successors(self, node: Node, reasons: dict | None = None) -> list[tuple[Node, str, int]]:
        """(next node, edge label, t_ns of the consumed record or a large number for silent steps)."""
        nexts = [(t, label, 0) for t, label in self._eager(node)]
        if not nexts:
            for r in self.world:
                if node.cursors[r] < len(self.recs[r]):
                    rec = self.recs[r][node.cursors[r]]
                    for a, t, why in self._match(node, r):
                        if why is not None:
                            if reasons is not None:
                                reasons.setdefault((r, node.cursors[r]), f"{a}: {why}")
                            continue
                        nexts.append((t, str(a) if a else f"(r{r} logs the group failure again)", rec.t_ns))
            nexts.extend((t, f"silent {a}", 1 << 62) for a, t in self._silent(node))
        return nexts

    def _guided(self, start: Node) -> tuple[Node | None, dict]:
        """Depth-first search that tries records in ``t_ns`` order first.

        Only a heuristic for speed: the search is exhaustive (memoised), so the verdict does not
        depend on timestamps; with honest timestamps it walks straight to the end.
        """
        parent: dict[Node, tuple[Node | None, str]] = {start: (None, "")}
        total = sum(len(v) for v in self.recs.values())
        stack = [(start, self._lazy_successors(start))]
        while stack:
            node, succ = stack[-1]
            if sum(node.cursors) == total and self._done(node) is None:
                return node, parent
            for t, label in succ:
                if t not in parent:
                    if len(parent) >= self.max_nodes:
                        return None, parent
                    parent[t] = (node, label)
                    stack.append((t, self._lazy_successors(t)))
                    break
            else:
                stack.pop()
        return None, parent

    def check(self) -> Verdict:
        start = Node(initial_state(self.cfg), tuple(0 for _ in self.world), frozenset(), 0)
        hit, seen = self._guided(start)
        if hit is not None:
            return Verdict(True, f"accepted: {sum(hit.cursors)} records of {len(self.world)} ranks match the model",
                           len(seen), self._path(seen, hit))
        return self._bfs(start)

    def _bfs(self, start: Node) -> Verdict:
        """Breadth-first search: shortest model paths, and the diagnostics of a rejection."""
        parent: dict[Node, tuple[Node | None, str]] = {start: (None, "")}
        queue = deque([start])
        best: list[Node] = [start]
        best_progress = 0
        reasons: dict[tuple[int, int], str] = {}
        last_done_problem = None
        while queue:
            node = queue.popleft()
            problem = self._done(node)
            if problem is None:
                return Verdict(True, f"accepted: {sum(node.cursors)} records of {len(self.world)} ranks match the model",
                               len(parent), self._path(parent, node))
            if all(node.cursors[r] == len(self.recs[r]) for r in self.world):
                last_done_problem = problem
            prog = sum(node.cursors)
            if prog > best_progress:
                best_progress, best = prog, [node]
            elif prog == best_progress and len(best) < 8:
                best.append(node)
            for t, label, _ts in self._successors(node, reasons):
                if t not in parent:
                    if len(parent) >= self.max_nodes:
                        return Verdict(False, f"rejected: search budget of {self.max_nodes} nodes exhausted "
                                              f"(raise max_nodes; furthest progress {best_progress} records)", len(parent))
                    parent[t] = (node, label)
                    queue.append(t)
        return self._reject(parent, best, reasons, last_done_problem)

    def _path(self, parent, node) -> list[str]:
        out = []
        while node is not None:
            prev, label = parent[node]
            if label:
                out.append(label)
            node = prev
        return out[::-1]

    def _reject(self, parent, best: list[Node], reasons, done_problem) -> Verdict:
        lines = ["rejected: no interleaving of the traces is a behaviour of the model"]
        if done_problem:
            lines.append(f"  all records matched, but at the end: {done_problem}")
        node = best[0]
        unmatched = {}
        lines.append(f"  furthest match: {sum(node.cursors)} of {sum(len(v) for v in self.recs.values())} records")
        for r in self.world:
            c = node.cursors[r]
            if c < len(self.recs[r]):
                rec = self.recs[r][c]
                why = reasons.get((r, c), "no model action of that name is enabled for the rank there")
                unmatched[r] = str(rec)
                lines.append(f"  rank {r}: first unmatched {rec}  -- {why}")
            else:
                lines.append(f"  rank {r}: consumed ({len(self.recs[r])} records)")
        lines.append("  model states it could have been in:")
        for b in best[:4]:
            pcs = " ".join(f"r{i}:{rk.pc}/g{rk.gen}{'/hung' if rk.hung else ''}{'/raised' if rk.raised else ''}" for i, rk in enumerate(b.state.ranks))
            allowed = [str(a) for a, _ in successors(self.cfg, b.state, self.actions)]
            lines.append(f"    {pcs} abort={b.state.store.abort or '-'}; model allows: {', '.join(allowed) or 'nothing'}")
        path = self._path(parent, node)
        lines.append("  shortest model path to the last match: " + (" -> ".join(path) or "(initial state)"))
        return Verdict(False, "\n".join(lines), len(parent), path, unmatched)


def check_traces(cfg: Config, traces: Mapping[int, RankTrace], **kw) -> Verdict:
    return TraceChecker(cfg, traces, **kw).check()


# --------------------------------------------------------------------------------------
# Model-generated traces (for tests and for documentation examples)

def project(cfg: Config, path: list[tuple[Action, State, State]], *, t0: int = 0) -> dict[int, RankTrace]:
    """Per-rank records of a model run (pre, action, post), as a faithful implementation logs it.

    FaultGroupFail is logged by the first member of R; SupervisorRestart is not logged.
    """
    recs: dict[int, list[Record]] = {r: [] for r in cfg.world}
    logger = cfg.affected[0]  # failing="one": FaultGroupFail has no actor; "any": its representative logs it
    for i, (a, pre, post) in enumerate(path):
        r = a.rank if a.rank is not None else (logger if a.name == "FaultGroupFail" else None)
        if r is None:
            continue
        rk = post.ranks[r]
        state = {"pc": rk.pc, "gen": rk.gen, "frontier": rk.frontier, "tau": rk.tau, "point": rk.point, "reason": rk.reason}
        if a.name in ("RankReplace", "RankRebind"):  # as the implementation records them
            comm = comm_name("accelpact/", rk.comm, cfg.group) if rk.comm > 0 else "original"
            state.update(comm=comm, refs_stale=_refs_stale(rk))
        g = pre.ranks[r].gen
        detail: dict[str, Any] = {}
        if a.name == "FaultGroupFail":
            detail["point"] = a.arg
            state = {}
        elif a.name == "RankDecideAgreement":
            detail["decision"] = true_lookup(post.store.agree, g)
        elif a.name == "RankDecideRelease":
            detail["decision"] = true_lookup(post.store.release, g)
        elif a.name in ("RankArrive", "RankReady"):
            detail["last"] = (g, r) in (post.store.last_arriver if a.name == "RankArrive" else post.store.last_ready)
            rows = post.store.arrivals if a.name == "RankArrive" else post.store.ready
            detail["count"] = sum(1 for x in rows if x[0] == g)
        recs[r].append(Record(r, len(recs[r]), a.name, g, "ok", t0 + i, state, detail))
    final = path[-1][2] if path else initial_state(cfg)
    out = {}
    for r in cfg.world:
        rk = final.ranks[r]
        header = {"type": "header", "format": TRACE_FORMAT, "rank": r, "world": len(cfg.world), "nodes": cfg.nodes,
                  "ranks_per_node": cfg.ranks_per_node, "group": cfg.group, "affected": list(cfg.affected), "attempt": 0}
        end = None
        if rk.pc == PC_TRAIN and not rk.hung:
            end = {"type": "end", "outcome": "released"}
        elif rk.pc == PC_EXITED or (final.supervisor and rk.reason):
            end = {"type": "end", "outcome": "exited", "reason": rk.reason}
        out[r] = RankTrace(r, recs[r], header, end)
    return out


def scheduled_repair(cfg: Config) -> list[tuple[Action, State, State]]:
    """A model run of one boundary repair of R (``cfg.affected``), rank by rank, without a search:
    the traces of a job of any size (with :func:`project`), for benchmarks and scaling tests."""
    s = initial_state(cfg)
    path: list[tuple[Action, State, State]] = []

    def do(a: Action) -> None:
        nonlocal s
        t = actions_for(cfg)[a.name].step(cfg, s, a.rank, a.arg)
        path.append((a, s, t))
        s = t

    world, members = list(cfg.world), list(cfg.affected)
    actor = None if cfg.failing == "one" else members[0]
    do(Action("FaultGroupFail", actor, "boundary"))
    for name, ranks in (("RankObserve", members + [r for r in world if r not in members]), ("RankGuard", world),
                        ("RankArrive", world), ("RankDecideAgreement", world[-1:]), ("RankAwaitAgreement", world),
                        ("RankReplace", members), ("RankRebind", members), ("RankValidate", members),
                        ("RankReady", world), ("RankDecideRelease", world[-1:]), ("RankResume", world)):
        for r in ranks:
            do(Action(name, r))
    return path


def write_dir(traces: Mapping[int, RankTrace], path: str | Path, attempt: int = 0) -> None:
    run = RunDir(path)
    run.path.mkdir(parents=True, exist_ok=True)
    for r, tr in traces.items():
        lines = [json.dumps(tr.header)] + [json.dumps(rec.to_json()) for rec in tr.records]
        if tr.end is not None:
            lines.append(json.dumps(tr.end))
        run.trace(attempt, r).write_text("\n".join(lines) + "\n")
