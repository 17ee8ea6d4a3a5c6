"""Symmetry reduction: ranks that the protocol cannot tell apart are interchangeable.

Rank 0 is special (its F is the reference of the frontier agreement), members of the
affected group R are interchangeable among themselves, and so are the other ranks.  For
the default 2x2 world with R = {1, 3} the classes are {0}, {2}, {1, 3}.  With spares (hot swap)
any rank may die and be replaced from its replicas, so the classes are per group, as with
``failing="any"``; the spares themselves are a count (``Store.spares``), interchangeable by
construction, and a spare that took an identity is that rank.

A state is canonicalised by renaming rank ids inside their class, *including every rank
id in the store* (arrivals, last_arriver, ready, last_ready) and in the history sets
(resumed, agreed, exits, and the hot swap's deposed, discarded, transfers, swapped, joins; the store's dead
and claims).  Every store/history element names at most one rank, so a rank's full
"signature" (its own variables plus every element that mentions it, with the id removed,
plus its positions in the ordered tuples) determines it up to renaming: sorting each class
by signature gives a canonical representative in O(n log n), without enumerating the
class permutations.  Two ranks with equal signatures are exchanged by a renaming that maps
the state to itself, so ties cannot make the result depend on the input order.

Invariants, ``is_final`` and the enabledness of every action are invariant under these
renamings (the protocol refers to rank ids only through membership in R and ``rank == 0``),
which is what makes the reduced search sound.  ``tests/test_model_explore.py`` checks that
reduced and unreduced searches agree on every verdict.
"""

from __future__ import annotations

from dataclasses import replace

from .state import Config, Rank, State, _copier

__all__ = ["Symmetry", "rank_classes"]


def rank_classes(cfg: Config) -> tuple[tuple[int, ...], ...]:
    """The interchangeable classes of rank ids.  ``failing="one"``: {0}, members of R without 0, the
    rest without 0.  ``"any"``: {0}, and each group of R's kind without 0 (a group's members are
    interchangeable; groups are not permuted, which keeps the FaultGroupFail instances, one per
    group, fixed)."""
    if cfg.links or cfg.shrink or cfg.refill:
        # a link names two ranks on two nodes, and a replica out (P19) is one node's ranks: renaming within
        # a group would move a rank to another node (no renaming is sound: each rank its own class)
        return tuple((r,) for r in cfg.world)
    if cfg.failing == "any" or cfg.spares:
        groups = tuple(tuple(r for r in cfg.members(gi) if r != 0) for gi in range(len(cfg._members)))
        return tuple(c for c in ((0,), *groups) if c)
    members = set(cfg.affected)
    a = tuple(r for r in cfg.world if r != 0 and r in members)
    b = tuple(r for r in cfg.world if r != 0 and r not in members)
    return tuple(c for c in ((0,), a, b) if c)


def _rank_key(rk: Rank) -> tuple:
    return (
        rk.pc, rk.gen, rk.frontier, rk.tau, rk.point, rk.seen, rk.comm, rk.refs, rk.dirty, rk.hung,
        rk.delayed, rk.drop, rk.lost, rk.raised, rk.reason, rk.replayed, rk.corrupt, rk.grads, rk.ahead,
        rk.inc, rk.shard, rk.wide,
    )


class Symmetry:
    """Canonicalisation of states of one configuration (see the module docstring).

    :meth:`canonical` is what the search calls once per transition, so it caches: the sort key of
    each distinct Rank, and the renaming of each distinct store and history set under each
    permutation (a state's parts are shared by many states, and renamed the same way again and
    again).  Each cache is bounded (cleared at ``_CACHE_LIMIT`` entries); the result is always
    equal to ``apply(s, permutation(s))``.
    """

    _CACHE_LIMIT = 1 << 17

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.classes = rank_classes(cfg)
        #: only classes with two or more ranks can be permuted
        self.movable = tuple(c for c in self.classes if len(c) > 1)
        self.trivial = not self.movable
        self._keys: dict[int, tuple[Rank, tuple]] = {}
        self._renamed: dict[tuple, object] = {}
        self._parts: dict[tuple, tuple] = {}

    def _key(self, rk: Rank) -> tuple:
        # keyed by id (cheaper than the Rank's hash); the entry holds the Rank, so that id cannot be
        # reused by another object while the entry exists, and the hit is checked by identity
        e = self._keys.get(id(rk))
        if e is None or e[0] is not rk:
            if len(self._keys) >= self._CACHE_LIMIT:
                self._keys.clear()
            e = self._keys[id(rk)] = (rk, _rank_key(rk))
        return e[1]

    def _signature(self, s: State, r: int) -> tuple:
        """Rank ``r``'s variables and every store/history element naming it (id removed).  Each
        part is cached per (part, rank): the same stores and history sets recur in many states.
        (The store's four parts form one tuple: same order as the flat tuple, as their length is fixed.)"""
        part = self._part
        return (
            self._key(s.ranks[r]),
            part(0, s.store, r, _store_signature),
            part(1, s.resumed, r, _set_signature),
            part(2, s.agreed, r, _set_signature),
            part(3, s.exits, r, _set_signature),
            part(4, s.deposed, r, _set_signature),
            part(5, s.discarded, r, _set_signature),
            part(6, s.transfers, r, _set_signature),
            part(7, s.swapped, r, _set_signature),
            part(8, s.joins, r, _set_signature),
        )

    def _part(self, tag: int, x, r: int, fn) -> tuple:
        if not x:
            return ()
        k = (tag, x, r)  # by value: a fresh history set equal to a seen one hits
        y = self._parts.get(k)
        if y is None:
            if len(self._parts) >= self._CACHE_LIMIT:
                self._parts.clear()
            y = self._parts[k] = fn(x, r)
        return y

    def permutation(self, s: State) -> dict[int, int] | None:
        """old id -> new id that canonicalises ``s``, or None when ``s`` is already canonical."""
        if self.trivial:
            return None
        perm: dict[int, int] = {}
        moved = False
        ranks = s.ranks
        key = self._key
        for cls in self.movable:
            if len(cls) == 2:
                ra, rb = ranks[cls[0]], ranks[cls[1]]
                if ra is not rb and key(ra) < key(rb):
                    continue  # distinct keys, already in order: nothing moves
                keys = [key(ra), key(rb)]
            else:
                keys = [key(ranks[r]) for r in cls]
                if all(a < b for a, b in zip(keys, keys[1:], strict=False)):
                    continue  # strictly increasing: distinct keys, already in order, nothing moves
            if len(set(keys)) == len(keys):
                # the signature starts with the rank key: distinct keys already fix the order
                order = [r for _k, r in sorted(zip(keys, cls, strict=True))]
            else:
                order = sorted(cls, key=lambda r: self._signature(s, r))
            for new, old in zip(cls, order, strict=True):
                perm[old] = new
                moved = moved or new != old
        if not moved:
            return None
        for cls in self.movable:  # the classes skipped above stay in place
            for r in cls:
                perm.setdefault(r, r)
        return perm

    def canonical(self, s: State) -> State:
        """The canonical representative of ``s``'s orbit (``s`` itself when already canonical)."""
        perm = self.permutation(s)
        return s if perm is None else self._apply(s, perm)

    def _rename(self, what: str, x, pk: tuple, fn):
        """``fn(x)``, cached by (what, x, permutation)."""
        if not x:
            return x  # an empty set or tuple names nobody
        k = (what, x, pk)
        y = self._renamed.get(k)
        if y is None:
            if len(self._renamed) >= self._CACHE_LIMIT:
                self._renamed.clear()
            y = self._renamed[k] = fn(x)
        return y

    def _apply(self, s: State, perm: dict[int, int]) -> State:
        """``apply(s, perm)`` with the renamed parts cached (equal result)."""
        pk = tuple(perm.items())
        ranks = list(s.ranks)
        for old, new in perm.items():
            ranks[new] = s.ranks[old]
        p = perm.get
        return _renamed(
            s,
            tuple(ranks),
            self._rename("store", s.store, pk, lambda st: _rename_store(st, p)),
            self._rename("resumed", s.resumed, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("exits", s.exits, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("agreed", s.agreed, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("deposed", s.deposed, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("discarded", s.discarded, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("transfers", s.transfers, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("swapped", s.swapped, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
            self._rename("joins", s.joins, pk, lambda x: frozenset((g, p(r, r), *e) for g, r, *e in x)),
        )


#: the history (and deposed) sets whose elements name a rank second, (gen, rank, ...), renamed by a permutation
_NAMED_SETS = ("resumed", "exits", "agreed", "deposed", "discarded", "transfers", "swapped", "joins")

#: ``replace(s, ranks=.., store=.., resumed=.., exits=.., agreed=.., deposed=.., ...)``, written out
_renamed = _copier(State, "ranks", "store", *_NAMED_SETS)


def _store_signature(st, r: int) -> tuple:
    return (
        tuple(sorted((a[0], a[2], a[3]) for a in st.arrivals if a[1] == r)),
        tuple(i for i, (_g, x) in enumerate(st.last_arriver) if x == r),
        tuple(sorted(g for g, x in st.ready if x == r)),
        tuple(i for i, (_g, x) in enumerate(st.last_ready) if x == r),
        tuple(sorted(g for g, x in st.dead if x == r)),
        tuple(sorted((g, inc) for g, x, inc in st.claims if x == r)),
    )


def _set_signature(x: frozenset, r: int) -> tuple:
    """The elements of a history set that name rank ``r`` (its id, the second item, removed), sorted."""
    return tuple(sorted((e[0], *e[2:]) for e in x if e[1] == r))


def _rename_store(st, p):
    """The store with every rank id renamed by ``p`` (a ``dict.get``; ids not in it are fixed)."""
    if not (st.arrivals or st.last_arriver or st.ready or st.last_ready or st.dead or st.claims):
        return st
    return replace(
        st,
        arrivals=frozenset((g, p(r, r), f, gg) for g, r, f, gg in st.arrivals),
        last_arriver=tuple((g, p(r, r)) for g, r in st.last_arriver),
        ready=frozenset((g, p(r, r)) for g, r in st.ready),
        last_ready=tuple((g, p(r, r)) for g, r in st.last_ready),
        dead=frozenset((g, p(r, r)) for g, r in st.dead),
        claims=frozenset((g, p(r, r), inc) for g, r, inc in st.claims),
    )


def apply(s: State, perm: dict[int, int]) -> State:
    """Rename rank ids by ``perm`` (old -> new; ids not in it are fixed) everywhere in ``s``."""
    def p(r: int) -> int:
        return perm.get(r, r)

    ranks = list(s.ranks)
    for old, new in perm.items():
        ranks[new] = s.ranks[old]
    st = s.store
    store = replace(
        st,
        arrivals=frozenset((g, p(r), f, gg) for g, r, f, gg in st.arrivals),
        last_arriver=tuple((g, p(r)) for g, r in st.last_arriver),
        ready=frozenset((g, p(r)) for g, r in st.ready),
        last_ready=tuple((g, p(r)) for g, r in st.last_ready),
        dead=frozenset((g, p(r)) for g, r in st.dead),
        claims=frozenset((g, p(r), inc) for g, r, inc in st.claims),
    )
    named = [frozenset((g, p(r), *e) for g, r, *e in getattr(s, name)) for name in _NAMED_SETS]
    return _renamed(s, tuple(ranks), store, *named)
