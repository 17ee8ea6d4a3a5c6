"""The exhaustive search on several cores: :class:`ParallelSearch`, the same BFS as
:class:`accelpact.model.engine.Search`, with the states partitioned among forked workers by hash.

Each worker owns the canonical states whose hash is its index modulo the number of workers: it
alone numbers them, keeps them, checks every invariant on them once, and expands them.  The search
goes level by level.  At a level, each worker expands its states of that level; a successor it owns
is looked up (and, if new, added and checked) at once, one it does not own is sent to its owner at
the end of the level; the owner looks it up (adding and checking it if new) and answers with its
number, which fills the sender's successor row.  A worker's rows are its states' distinct
successors in the order the sequential search lists them (the first action reaching each), so the
merged graph is the sequential search's graph up to the numbering of the states: the same states,
transitions, edges, levels and sinks, and every edge invariant is checked on every step by the
worker that took it.  ``tests/test_model_explore.py`` compares the two on whole configurations.

What it costs: each state sent to its owner is pickled and unpickled once, and the workers wait
for each other at every level.  A state travels as tuples of its fields (``_REDUCE``): each
distinct Rank and Store is rebuilt once per worker from a table, not field by field from a pickled
dataclass.  The first version (pickled dataclasses, the collector running) was slower than one
worker (``explore`` of 2x2-f2 in 49.9 s against 35.6 s).  Measured on this two-core machine with the tuples (search only,
the model before an exit forgot what the rank held, spec/protocol.md P11.5;
the same graph): 2x2-f2 27.9 s against 34.5 s with one worker (1.24x), 3x2-f1 3.8 s against 5.1 s
(1.34x).  Each worker spends about a third of its time in the exchange (receiving, looking up,
adding and checking the peer's states, and waiting for it).  A partition that keeps most
successors with their parent's owner (by the fault count, the failed groups and rank 0) halves
the states sent (14% of the edges cross instead of 50%) but splits the levels unevenly (312,490
states against 196,356 on 2x2-f2): 26.1 s on 2x2-f2, 4.0 s on 3x2-f1, no better overall, so the
partition stays by hash.  The nightly profile runs two workers; ``accelpact explore`` one.

Numbering: during the search a state is named by a worker-local id ``i`` as ``i * W + w``; when
the search ends, the states are renumbered ``base[w] + i`` (worker 0's first, in the order each
worker numbered them) and the graph arrays are merged in that numbering.  The other workers stay
alive until :meth:`ParallelSearch.close`, answering for their states (counterexamples replay the
states on a path; the liveness checks read the sinks).
"""

from __future__ import annotations

import copyreg
import io
import multiprocessing
import pickle
import threading
from array import array
from dataclasses import fields
from operator import attrgetter
from typing import Any, Callable

from .engine import Found, Search, paused_gc
from .protocol import is_final
from .state import Config, Rank, State, Store, initial_state

__all__ = ["ParallelSearch"]

#: states sent per message at a level's exchange (bounds the pickled buffer; memo per message)
_CHUNK = 20_000
#: flags per state, sent back at the end: bit 0 the store is aborted or down, bit 1 a final sink
_ABORTED, _FINAL = 1, 2


# -- the messages: states as tuples of their fields, parts shared ---------------------------------
#
# A pickled dataclass is rebuilt a field at a time: measured alone, a chunk of states costs about
# 19 us a state to pickle and rebuild that way, about 7 us as tuples of field values with each
# distinct Rank and Store rebuilt once per worker (a table, as the search's own interning).  The
# tables are bounded like the protocol's memos.

_RANK_FIELDS = attrgetter(*(f.name for f in fields(Rank) if f.init))
_STORE_FIELDS = attrgetter(*(f.name for f in fields(Store) if f.init))
_STATE_FIELDS = attrgetter(*(f.name for f in fields(State) if f.init and f.name != "ranks" and f.name != "store"))
_TABLE_LIMIT = 1 << 17
_ranks: dict[tuple, Rank] = {}
_stores: dict[tuple, Store] = {}


def _shared(table: dict[tuple, Any], cls: type, values: tuple) -> Any:
    obj = table.get(values)
    if obj is None:
        if len(table) >= _TABLE_LIMIT:
            table.clear()
        obj = table[values] = cls(*values)
    return obj


def _rank(values: tuple) -> Rank:
    return _shared(_ranks, Rank, values)


def _store(values: tuple) -> Store:
    return _shared(_stores, Store, values)


def _state(ranks: tuple[Rank, ...], store: Store, rest: tuple) -> State:
    return State(ranks, store, *rest)


_REDUCE = copyreg.dispatch_table.copy()
_REDUCE[Rank] = lambda rk: (_rank, (_RANK_FIELDS(rk),))
_REDUCE[Store] = lambda st: (_store, (_STORE_FIELDS(st),))
_REDUCE[State] = lambda s: (_state, (s.ranks, s.store, _STATE_FIELDS(s)))


def _dumps(message: Any) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _REDUCE
    p.dump(message)
    return buf.getvalue()


class _Link:
    """One worker's pipes to one peer: it sends on ``out`` and receives on ``inc``.  A send runs in
    a thread of its own, so that two workers sending large levels to each other never both block."""

    def __init__(self, out, inc) -> None:
        self.out, self.inc = out, inc

    def send_all(self, messages: list[Any]) -> threading.Thread:
        def push() -> None:
            for m in messages:
                self.out.send_bytes(_dumps(m))
            self.out.send_bytes(b"")

        t = threading.Thread(target=push, daemon=True)
        t.start()
        return t

    def receive(self):
        """Yield the peer's messages until its end marker."""
        while True:
            m = self.inc.recv_bytes()
            if not m:
                return
            yield pickle.loads(m)


class _Worker:
    """One partition of the search: a :class:`Search` holding the states this worker owns, with
    successors named by global ids (``local * W + w``)."""

    def __init__(self, cfg: Config, symmetry: bool, w: int, nw: int, link: _Link) -> None:
        self.s = Search(cfg, symmetry)
        self.w, self.nw, self.link = w, nw, link
        self.flags = bytearray()
        self.peer_states = 0      # the other worker's count at the last exchange (for progress)
        self.peer_transitions = 0
        self.level_now = 0

    def gid(self, i: int) -> int:
        return i * self.nw + self.w

    def _new(self, c: State, parent: int, via: int, lvl: int, found: list[Found]) -> int:
        s = self.s
        j = s._add(c, parent, via, lvl)
        self.flags.append(_ABORTED if (c.store.abort or c.store.down) else 0)
        bad = s.check_state(c)
        if bad:
            found.append((bad, self.gid(j), None, None))
        return j

    def run(self, stop: bool, progress: Callable[[Any], None] | None, view: Any) -> list[Found]:
        with paused_gc():
            return self._run(stop, progress, view)

    def _run(self, stop: bool, progress: Callable[[Any], None] | None, view: Any) -> list[Found]:
        s, w, nw = self.s, self.w, self.nw
        cfg = s.cfg
        found: list[Found] = []
        s0 = s.canon(initial_state(cfg))
        lo = hi = 0
        if hash(s0) % nw == w:
            self._new(s0, -1, -1, 0, found)
            hi = 1
        index, states, off, dst, lab = s.index, s.states, s.off, s.dst, s.lab
        canon = s.sym.canonical if s.sym is not None else None
        moves = s.moves
        lvl = 0
        expanded = 0
        while True:
            if found and stop:
                hi = lo  # expand nothing more; still take part in the exchange below
            lvl += 1
            self.level_now = lvl - 1
            rows: list[list[tuple[int, int]]] = []
            out: list[tuple[int, int, State]] = []
            holes: list[tuple[int, int]] = []
            for i in range(lo, hi):
                st = states[i]
                row: list[tuple[int, int]] = []
                for k, a, t, broken in moves(st):
                    found.extend((what, self.gid(i), a, t) for what in broken)
                    c = t if canon is None else canon(t)
                    if hash(c) % nw == w:
                        j = index.get(c)
                        if j is None:
                            j = self._new(c, self.gid(i), k, lvl, found)
                        row.append((j * nw + w, k))
                    else:
                        holes.append((len(rows), len(row)))
                        row.append((-1, k))
                        out.append((self.gid(i), k, c))
                rows.append(row)
                expanded += 1
                if progress is not None and not expanded & 0xFFFF:
                    view.transitions = s.transitions + self.peer_transitions
                    progress(view)
            # the exchange: my states for the peer, the peer's for me; then the numbers back
            sender = self.link.send_all([out[x:x + _CHUNK] for x in range(0, len(out), _CHUNK)])
            answer = array("i")
            for chunk in self.link.receive():
                for parent, k, c in chunk:
                    j = index.get(c)
                    if j is None:
                        j = self._new(c, parent, k, lvl, found)
                    answer.append(j * nw + w)
            sender.join()
            sender = self.link.send_all([answer.tobytes()])
            got = array("i")
            for buf in self.link.receive():
                got.frombytes(buf)
            sender.join()
            for (ri, pos), g in zip(holes, got, strict=True):
                rows[ri][pos] = (g, rows[ri][pos][1])
            # the rows, as the sequential search writes them: distinct successors, first action
            for i, row in zip(range(lo, hi), rows, strict=True):
                seen: set[int] = set()
                for g, k in row:
                    if g not in seen:
                        seen.add(g)
                        dst.append(g)
                        lab.append(k)
                off.append(len(dst))
                if not row and is_final(cfg, states[i]):
                    self.flags[i] |= _FINAL
            del rows, out, holes
            # the level's totals: go on while either worker found new states
            new = len(states) - hi
            sender = self.link.send_all([(new, bool(found), len(states), s.transitions)])
            (peer_new, peer_found, self.peer_states, self.peer_transitions), = list(self.link.receive())
            sender.join()
            if (stop and (found or peer_found)) or not (new or peer_new):
                while len(off) < len(states) + 1:  # after a stop: rows for the states not expanded (empty)
                    off.append(len(dst))
                return found
            lo, hi = hi, len(states)


def _child(cfg: Config, symmetry: bool, w: int, nw: int, out, inc, req, stop: bool) -> None:
    """A worker process: search, send back the arrays, then answer for its states until closed."""
    worker = _Worker(cfg, symmetry, w, nw, _Link(out, inc))
    try:
        found = worker.run(stop, None, None)
        s = worker.s
        s.index.clear()
        req.send({
            "found": found, "n": len(s.states), "transitions": s.transitions, "checks": s.checks,
            "parent": s.parent.tobytes(), "via": s.via.tobytes(), "level": s.level.tobytes(),
            "off": s.off.tobytes(), "dst": s.dst.tobytes(), "lab": s.lab.tobytes(), "flags": bytes(worker.flags),
        })
        while True:
            ids = req.recv()
            if ids is None:
                return
            req.send([s.states[i] for i in ids])
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        try:
            req.send({"error": f"{type(exc).__name__}: {exc}"})
        except OSError:
            pass


class _States:
    """The merged search's states, in the merged numbering: worker 0's are here; the others' are
    fetched from their workers when read (and kept)."""

    def __init__(self, mine: list[State], base: list[int], conns: list[Any]) -> None:
        self.mine, self.base, self.conns = mine, base, conns
        self.total = base[-1]
        self.cache: dict[int, State] = {}

    def __len__(self) -> int:
        return self.total

    def _where(self, n: int) -> tuple[int, int]:
        for w in range(len(self.base) - 2, -1, -1):
            if n >= self.base[w]:
                return w, n - self.base[w]
        raise IndexError(n)

    def fetch(self, nodes: list[int]) -> None:
        """Fetch these states from their workers in one message per worker."""
        want: dict[int, list[int]] = {}
        for n in nodes:
            if n >= self.base[1] and n not in self.cache:
                w, i = self._where(n)
                want.setdefault(w, []).append(i)
        for w, ids in want.items():
            self.conns[w].send(ids)
            for i, st in zip(ids, self.conns[w].recv(), strict=True):
                self.cache[self.base[w] + i] = st

    def __getitem__(self, n: int) -> State:
        if not 0 <= n < self.total:
            raise IndexError(n)
        if n < self.base[1]:
            return self.mine[n]
        if n not in self.cache:
            self.fetch([n])
        return self.cache[n]

    def __iter__(self):
        raise TypeError("the states of a parallel search live in its workers: read them by index")


class ParallelSearch(Search):
    """:class:`Search` run by ``workers`` forked processes (this one is worker 0).

    After :meth:`run` it reads as a :class:`Search` over the whole graph (``states``, ``parent``,
    ``via``, ``level``, ``off``/``dst``/``lab``, ``transitions``, ``checks``), in the merged
    numbering.  Call :meth:`close` when done with it (it ends the other workers).  ``progress`` is
    called with the search every 65,536 states this process expands; ``reached`` and
    ``transitions`` then count every worker's (the others' as of the last level).
    """

    def __init__(self, cfg: Config, symmetry: bool, workers: int = 2) -> None:
        if workers < 2:
            raise ValueError(f"ParallelSearch needs workers >= 2 (got {workers}); use Search for one")
        super().__init__(cfg, symmetry)
        self.workers = workers
        self._procs: list[Any] = []
        self._conns: list[Any] = [None]
        self._flags = bytearray()
        self._worker: _Worker | None = None

    @property
    def reached(self) -> int:
        if self._worker is not None:
            return len(self._worker.s.states) + self._worker.peer_states
        return len(self.states)

    @property
    def current_level(self) -> int:
        return self._worker.level_now if self._worker is not None else self.depth

    def run(self, stop: bool, progress: Callable[[Search], None] | None = None) -> list[Found]:
        if self.workers != 2:
            raise NotImplementedError("ParallelSearch exchanges states between two workers (the cores of this machine)")
        ctx = multiprocessing.get_context("fork")
        b_in, a_out = ctx.Pipe(duplex=False)   # worker 0 -> worker 1 (a Pipe is (reader, writer))
        a_in, b_out = ctx.Pipe(duplex=False)   # worker 1 -> worker 0
        req_here, req_there = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(self.cfg, self.sym is not None, 1, 2, b_out, b_in, req_there, stop), daemon=True)
        proc.start()
        self._procs.append(proc)
        self._conns.append(req_here)
        for c in (b_out, b_in, req_there):
            c.close()
        worker = self._worker = _Worker(self.cfg, self.sym is not None, 0, 2, _Link(a_out, a_in))
        try:
            found = worker.run(stop, progress, self)
            theirs = req_here.recv()
        except BaseException:
            self.close(kill=True)  # interrupted (a budget, ^C): the other worker waits at an exchange
            raise
        if "error" in theirs:
            self.close()
            raise RuntimeError(f"search worker 1 failed: {theirs['error']}")
        self._worker = None
        return self._merge(worker, theirs, found, stop)

    def _merge(self, mine: _Worker, theirs: dict[str, Any], found: list[Found], stop: bool) -> list[Found]:
        """Renumber: worker 0's states first, then worker 1's; merge the arrays."""
        m = mine.s
        n0, n1 = len(m.states), theirs["n"]
        base = [0, n0, n0 + n1]

        def glob(g: int) -> int:
            return g >> 1 if not g & 1 else n0 + (g >> 1)

        def renumber(a: array, out: array) -> None:
            step = 1 << 20
            for x in range(0, len(a), step):
                out.extend([-1 if g < 0 else (g >> 1 if not g & 1 else n0 + (g >> 1)) for g in a[x:x + step]])

        def load(key: str, code: str) -> array:
            a = array(code)
            a.frombytes(theirs[key])
            return a

        self.parent = array("i")
        renumber(m.parent, self.parent)
        renumber(load("parent", "i"), self.parent)
        self.via = m.via + load("via", "i")
        self.level = m.level + load("level", "i")
        self.dst = array("i")
        renumber(m.dst, self.dst)
        renumber(load("dst", "i"), self.dst)
        self.lab = m.lab + load("lab", "i")
        off1 = load("off", "q")
        shift = m.off[-1]
        self.off = m.off + array("q", [x + shift for x in off1[1:]])
        self._flags = mine.flags + bytearray(theirs["flags"])
        self.transitions = m.transitions + theirs["transitions"]
        self.checks = m.checks + theirs["checks"]
        self.states = _States(m.states, base, self._conns)  # type: ignore[assignment]  # a list-like view over the workers
        self.index = m.index
        out = [(what, glob(node), a, t) for what, node, a, t in found + theirs["found"]]
        # the shortest counterexample first (an edge violation's path is one step longer than its node's)
        out.sort(key=lambda f: (self.level[f[1]] + (f[3] is not None), f[1]))
        return out[:1] if stop else out

    def aborted_mask(self) -> bytearray:
        return bytearray(f & _ABORTED for f in self._flags)

    def is_final_node(self, n: int) -> bool:
        if self._flags[n] & _FINAL:
            return True
        if self.off[n] == self.off[n + 1]:
            return False  # a sink not marked final
        return is_final(self.cfg, self.states[n])

    def graph(self, states: bool = False):
        raise NotImplementedError("keep_graph needs the states in one process: use Search (workers=1)")

    def close(self, kill: bool = False) -> None:
        """End the other workers (they answer for their states until then); ``kill``: at once."""
        for conn in self._conns[1:]:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        for p in self._procs:
            if kill:
                p.terminate()
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
        self._procs, self._conns = [], [None]

    def __del__(self) -> None:
        if self._procs:
            self.close()
