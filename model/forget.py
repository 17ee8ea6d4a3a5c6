"""What a state remembers that no step reads any more: the quotient the trace checker's episode
cut starts the next episode from (spec/trace-checking.md, "Episodes").

After an episode every live rank trains in a later generation, and two facts of the finished
episode only history still needs:

* where its failure struck and which groups failed (``Store.failed``'s point and groups): every
  step reads them only for a rank in that generation (``f[0] == rank.gen``);
* the generations whose link cut broke the groups over all of W (``Store.wide``): a rank's groups
  are broken only when a cut came at or after the generation it built them in (``Rank.wide``),
  so a cut before the generation every rank of the job is in and built its groups in breaks
  none of them any more.

:func:`forget_past` forgets both; two states it maps alike have the same steps, to
states it maps alike (tests/test_model_forget.py checks this on every reachable state of the
configurations it names).  It is not a model step and the oracle never sees it: what the
properties judge is history, which it keeps.  Pure Python.
"""

from __future__ import annotations

from .state import PC_CRASHED, PC_EXITED, PC_LEFT, PC_RESTARTED, Config, State

_GONE = (PC_EXITED, PC_CRASHED, PC_RESTARTED, PC_LEFT)


def forget_past(cfg: Config, s: State) -> State:
    """``s`` with the finished episodes' facts no step reads any more set to one value (module doc)."""
    del cfg  # the same for every configuration; kept for the callers' symmetry with the model's functions
    store = s.store
    changes: dict = {}
    f = store.failed
    gens = [rk.gen for rk in s.ranks]
    if f is not None and all(g > f[0] for g in gens) and (f[1], f[2]) != ("", frozenset()):
        changes["failed"] = (f[0], "", frozenset())
    if store.wide:
        low = min(min(rk.wide, rk.gen) for rk in s.ranks)
        keep = frozenset(w for w in store.wide if w >= low)
        if keep != store.wide:
            changes["wide"] = keep
    return s.with_store(**changes) if changes else s
