"""What a state remembers that no step reads any more: the quotient that the trace checker's
episode cut starts the next episode from (spec/trace-checking.md, "Episodes"), and that the
outcome search of a scenario keeps its successive episodes linear with
(``conformance/outcomes.py`` ``model_outcomes``).

After an episode every live rank trains in a later generation, and the finished episodes leave
facts that no step reads:

* where the failure struck and which groups failed (``Store.failed``'s point and groups): every
  step reads them only for a rank in that generation (``f[0] == rank.gen``);
* the generations whose link cut broke the groups over all of W (``Store.wide``): a rank's groups
  are broken only when a cut came at or after the generation it built them in (``Rank.wide``),
  so a cut before the generation every rank of the job is in and built its groups in breaks
  none of them any more;
* the store's entries of a generation every rank has left (``low``, the least generation of any
  rank, a dead one's included): the revokes, counters, last adders and decisions.  Every key is
  fenced by its generation (P0), and a step reads only its own rank's generation's (or, for a
  rank ready in g - 1, g - 1's release, still >= ``low``);
* the history of those generations (``State.resumed``, ``agreed``, ``exits``, ``validated``,
  ``witnessed``): written by steps, read by none but the validation (its own generation) and an
  observation (its episode's witness).

:func:`forget_past` forgets all of them; two states it maps alike have the same steps, to states
it maps alike (tests/test_checker_episodes.py checks this on every reachable state of the
configurations it names, and that a seeded over-forgetting is caught).  It is not a model step:
a search that judges the properties (``model/explore.py``) never calls it, as they judge
history.  With a mutant (``Config.mutant``: ``no-fence`` reads another generation's keys) only
the first two are forgotten.  Pure Python.
"""

from __future__ import annotations

from .state import Config, State

__all__ = ["forget_past"]


def forget_past(cfg: Config, s: State) -> State:
    """``s`` with the finished episodes' facts that no step reads any more set to one value
    (module doc); ``s`` itself when there are none."""
    store = s.store
    changes: dict = {}
    f = store.failed
    gens = [rk.gen for rk in s.ranks]
    low = min(gens)
    if f is not None and f[0] < low and (f[1], f[2]) != ("", frozenset()):
        changes["failed"] = (f[0], "", frozenset())
    if store.wide:
        wide_low = min(min(rk.wide, rk.gen) for rk in s.ranks)
        keep = frozenset(w for w in store.wide if w >= wide_low)
        if keep != store.wide:
            changes["wide"] = keep
    if low == 0 or cfg.mutant is not None:
        return s.with_store(**changes) if changes else s
    old = _old_store(store, low)
    if old:
        changes.update(old)
    t = s.with_store(**changes) if changes else s
    history = _old_history(s, low)
    return t.with_(**history) if history else t


def _old_store(store, low: int) -> dict:
    """The store's fields with entries of generations before ``low``, without them."""
    out: dict = {}
    for name in ("revoked", "arrivals", "ready"):
        x = getattr(store, name)
        if x and min(e if isinstance(e, int) else e[0] for e in x) < low:
            out[name] = frozenset(e for e in x if (e if isinstance(e, int) else e[0]) >= low)
    for name in ("last_arriver", "agree", "last_ready", "release"):
        x = getattr(store, name)
        if x and any(e[0] < low for e in x):
            out[name] = tuple(e for e in x if e[0] >= low)
    return out


def _old_history(s: State, low: int) -> dict:
    """The history sets with entries of generations before ``low``, without them."""
    out: dict = {}
    for name in ("resumed", "agreed", "exits", "validated"):
        x = getattr(s, name)
        if x and any(e[0] < low for e in x):
            out[name] = frozenset(e for e in x if e[0] >= low)
    if s.witnessed and min(s.witnessed) < low:
        out["witnessed"] = frozenset(g for g in s.witnessed if g >= low)
    return out
