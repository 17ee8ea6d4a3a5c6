"""Symmetry reduction: ranks that the protocol cannot tell apart are interchangeable.

Rank 0 is special (its F is the reference of the frontier agreement), members of the
affected group R are interchangeable among themselves, and so are the other ranks.  For
the default 2x2 world with R = {1, 3} the classes are {0}, {2}, {1, 3}.

A state is canonicalised by renaming rank ids inside their class, *including every rank
id in the store* (arrivals, last_arriver, ready, last_ready) and in the history sets
(resumed, agreed, exits).  Every store/history element names at most one rank, so a rank's full
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

from .state import Config, Rank, State

__all__ = ["Symmetry", "rank_classes"]


def rank_classes(cfg: Config) -> tuple[tuple[int, ...], ...]:
    """The interchangeable classes of rank ids.  ``failing="one"``: {0}, members of R without 0, the
    rest without 0.  ``"any"``: {0}, and each group of R's kind without 0 (a group's members are
    interchangeable; groups are not permuted, which keeps the FaultGroupFail instances, one per
    group, fixed)."""
    if cfg.failing == "any":
        groups = tuple(tuple(r for r in cfg.members(gi) if r != 0) for gi in range(len(cfg._members)))
        return tuple(c for c in ((0,), *groups) if c)
    members = set(cfg.affected)
    a = tuple(r for r in cfg.world if r != 0 and r in members)
    b = tuple(r for r in cfg.world if r != 0 and r not in members)
    return tuple(c for c in ((0,), a, b) if c)


def _rank_key(rk: Rank) -> tuple:
    return (
        rk.pc, rk.gen, rk.frontier, rk.tau, rk.point, rk.comm, rk.refs, rk.dirty, rk.hung,
        rk.delayed, rk.drop, rk.lost, rk.raised, rk.reason, rk.replayed, rk.corrupt,
    )


class Symmetry:
    """Canonicalisation of states of one configuration (see the module docstring)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.classes = rank_classes(cfg)
        #: only classes with two or more ranks can be permuted
        self.movable = tuple(c for c in self.classes if len(c) > 1)
        self.trivial = not self.movable

    def _signature(self, s: State, r: int) -> tuple:
        st = s.store
        return (
            _rank_key(s.ranks[r]),
            tuple(sorted((a[0], a[2], a[3]) for a in st.arrivals if a[1] == r)),
            tuple(i for i, (_g, x) in enumerate(st.last_arriver) if x == r),
            tuple(sorted(g for g, x in st.ready if x == r)),
            tuple(i for i, (_g, x) in enumerate(st.last_ready) if x == r),
            tuple(sorted((e[0], *e[2:]) for e in s.resumed if e[1] == r)),
            tuple(sorted((e[0], e[2]) for e in s.agreed if e[1] == r)),
            tuple(sorted((e[0], *e[2:]) for e in s.exits if e[1] == r)),
        )

    def permutation(self, s: State) -> dict[int, int] | None:
        """old id -> new id that canonicalises ``s``, or None when ``s`` is already canonical."""
        if self.trivial:
            return None
        perm: dict[int, int] = {}
        moved = False
        ranks = s.ranks
        for cls in self.movable:
            keys = [_rank_key(ranks[r]) for r in cls]
            if len(set(keys)) == len(keys):
                # the signature starts with the rank key: distinct keys already fix the order
                order = [r for _k, r in sorted(zip(keys, cls, strict=True))]
            else:
                order = sorted(cls, key=lambda r: self._signature(s, r))
            for new, old in zip(cls, order, strict=True):
                perm[old] = new
                moved = moved or new != old
        return perm if moved else None

    def canonical(self, s: State) -> State:
        """The canonical representative of ``s``'s orbit (``s`` itself when already canonical)."""
        perm = self.permutation(s)
        return s if perm is None else apply(s, perm)


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
    )
    return replace(
        s,
        ranks=tuple(ranks),
        store=store,
        resumed=frozenset((g, p(r), pt, d, ok, rb) for g, r, pt, d, ok, rb in s.resumed),
        exits=frozenset((g, p(r), why, rel) for g, r, why, rel in s.exits),
        agreed=frozenset((g, p(r), f) for g, r, f in s.agreed),
    )
