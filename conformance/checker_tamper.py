"""Tampered traces, for the trace checker's teeth at any scale (tests/test_checker.py) and for its
rejection benchmark (``accelpact bench check``).

Each tampering takes the traces of a model run of one boundary repair (:func:`repair_traces`, or of
an abort, :func:`abort_traces`) and changes one thing a faulty implementation (or a faulty log)
could: a record reordered, dropped, renamed, a wrong decision, count, ``last`` flag, communicator
or frontier, a trace cut short, an end record missing, a record too many.  The traces it returns
are no behaviour of the model; ``expect`` is a piece of the rejection's explanation.
Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..impl.controlplane import PREFIX, comm_name
from ..impl.trace import RankTrace, Record
from ..model.protocol import Action
from ..model.transitions import actions_for
from ..model.state import Config, State, initial_state
from .checker import project, scheduled_repair

__all__ = ["TAMPERINGS", "Tampering", "abort_traces", "repair_config", "repair_traces", "scheduled_abort", "tamper"]

Traces = dict[int, RankTrace]


def repair_config(nodes: int, ranks_per_node: int) -> Config:
    """The configuration of ``accelpact bench check``: R is the last local index's replicate group."""
    return Config(nodes=nodes, ranks_per_node=ranks_per_node, affected_local=ranks_per_node - 1, max_faults=1,
                  points=("boundary",))


def repair_traces(cfg: Config) -> Traces:
    """The traces of one boundary repair of R, rank by rank (checker.scheduled_repair + project)."""
    return project(cfg, scheduled_repair(cfg))


def scheduled_abort(cfg: Config, victim: int) -> list[tuple[Action, State, State]]:
    """A model run of an abort (L2), without a search: R fails at the boundary, every rank observes
    it, ``victim``'s guard fails (FaultDirtyGuard: ``cfg.max_faults`` >= 2), it rejects (abort:
    rejected) and every other rank exits on the job's abort (RankExit)."""
    s = initial_state(cfg)
    path: list[tuple[Action, State, State]] = []

    def do(a: Action) -> None:
        nonlocal s
        spec = actions_for(cfg)[a.name]
        if not spec.enabled(cfg, s, a.rank, a.arg):
            raise ValueError(f"scheduled_abort: {a} is not enabled")
        t = spec.step(cfg, s, a.rank, a.arg)
        path.append((a, s, t))
        s = t

    members = list(cfg.affected)
    do(Action("FaultGroupFail", None if cfg.failing == "one" else members[0], "boundary"))
    for r in members + [r for r in cfg.world if r not in members]:
        do(Action("RankObserve", r, "boundary"))
    do(Action("FaultDirtyGuard", victim))
    do(Action("RankReject", victim))
    for r in cfg.world:
        if r != victim:
            do(Action("RankExit", r))
    return path


def abort_traces(cfg: Config, victim: int = 0) -> Traces:
    """The traces of :func:`scheduled_abort` (``cfg``: e.g. ``repair_config(...).with_(max_faults=2)``)."""
    return project(cfg, scheduled_abort(cfg, victim))


# --------------------------------------------------------------------------------------
# Tamperings

def _renumber(recs: list[Record]) -> list[Record]:
    return [replace(r, seq=i) for i, r in enumerate(recs)]


_KEEP: dict[str, Any] = {"type": "keep"}


def _with(traces: Traces, r: int, recs: list[Record], end: dict[str, Any] | None = _KEEP) -> Traces:
    """The traces with rank r's records replaced (renumbered) and, unless kept, its end record."""
    out = dict(traces)
    tr = traces[r]
    out[r] = RankTrace(r, _renumber(recs), tr.header, tr.end if end is _KEEP else end)
    return out


def _where(traces: Traces, action: str, *, rank: Callable[[int, list[Record]], bool] = lambda r, recs: True,
           pick: Callable[[Record], bool] = lambda rec: True) -> tuple[int, int]:
    """The first (rank, index) of a record of ``action``, scanning ranks from the middle of the world
    (a rank that is neither the first nor the last to act)."""
    ranks = sorted(traces)
    mid = len(ranks) // 2
    for r in ranks[mid:] + ranks[:mid]:
        recs = traces[r].records
        if not rank(r, recs):
            continue
        for i, rec in enumerate(recs):
            if rec.action == action and pick(rec):
                return r, i
    raise ValueError(f"no {action} record to tamper with")


def _member(cfg: Config) -> Callable[[int, list[Record]], bool]:
    return lambda r, recs: r in cfg.affected


def _set(traces: Traces, r: int, i: int, **changes) -> Traces:
    recs = list(traces[r].records)
    recs[i] = replace(recs[i], **changes)
    return _with(traces, r, recs)


def t_reorder(cfg: Config, tr: Traces) -> Traces:
    """A member's RankAwaitAgreement and RankReplace swapped."""
    r, i = _where(tr, "RankAwaitAgreement", rank=_member(cfg))
    recs = list(tr[r].records)
    recs[i], recs[i + 1] = recs[i + 1], recs[i]
    return _with(tr, r, recs)


def t_drop(cfg: Config, tr: Traces) -> Traces:
    """A member's RankRebind missing."""
    r, i = _where(tr, "RankRebind", rank=_member(cfg))
    return _with(tr, r, tr[r].records[:i] + tr[r].records[i + 1:])


def t_drop_decision(cfg: Config, tr: Traces) -> Traces:
    """The agreement's RankDecideAgreement missing (the decider's pc does not move: only the reads
    of the decision show it)."""
    r, i = _where(tr, "RankDecideAgreement")
    return _with(tr, r, tr[r].records[:i] + tr[r].records[i + 1:])


def t_rename(cfg: Config, tr: Traces) -> Traces:
    """A RankGuard recorded as RankReject (an exit nobody else reacts to)."""
    r, i = _where(tr, "RankGuard")
    return _set(tr, r, i, action="RankReject")


def t_decision(cfg: Config, tr: Traces) -> Traces:
    """The agreement decided abort:mismatch while every rank read commit."""
    r, i = _where(tr, "RankDecideAgreement")
    rec = tr[r].records[i]
    return _set(tr, r, i, detail={**rec.detail, "decision": "abort:mismatch"})


def t_last(cfg: Config, tr: Traces) -> Traces:
    """A RankArrive that is not the last claiming last=true."""
    r, i = _where(tr, "RankArrive", pick=lambda rec: not rec.detail.get("last"))
    rec = tr[r].records[i]
    return _set(tr, r, i, detail={**rec.detail, "last": True})


def t_count(cfg: Config, tr: Traces) -> Traces:
    """A RankReady reporting the counter one too high."""
    r, i = _where(tr, "RankReady", pick=lambda rec: not rec.detail.get("last"))
    rec = tr[r].records[i]
    return _set(tr, r, i, detail={**rec.detail, "count": rec.detail["count"] + 1})


def t_comm(cfg: Config, tr: Traces) -> Traces:
    """A RankReplace naming the next generation's communicator."""
    r, i = _where(tr, "RankReplace")
    rec = tr[r].records[i]
    return _set(tr, r, i, state={**rec.state, "comm": comm_name(PREFIX, rec.gen + 2, cfg.group)})


def t_frontier(cfg: Config, tr: Traces) -> Traces:
    """A RankArrive reporting a frontier seven steps off (seen only by the search: which frontier a
    rank holds is the model's business, not a rank-local fact)."""
    r, i = _where(tr, "RankArrive")
    rec = tr[r].records[i]
    return _set(tr, r, i, state={**rec.state, "frontier": rec.state["frontier"] + 7})


def t_truncate(cfg: Config, tr: Traces) -> Traces:
    """A member's trace cut before its RankResume, without its end record."""
    r, i = _where(tr, "RankResume", rank=_member(cfg))
    return _with(tr, r, tr[r].records[:i], end=None)


def t_no_end(cfg: Config, tr: Traces) -> Traces:
    """A released rank's end record missing (only a rank killed by a signal lacks one)."""
    r, _i = _where(tr, "RankResume")
    return _with(tr, r, tr[r].records, end=None)


def t_extra(cfg: Config, tr: Traces) -> Traces:
    """A rank's last record written twice."""
    r, _i = _where(tr, "RankResume")
    recs = tr[r].records
    return _with(tr, r, recs + [recs[-1]])


def t_exited_no_end(cfg: Config, tr: Traces) -> Traces:
    """An exited rank's end record missing (on :func:`abort_traces`)."""
    r, _i = _where(tr, "RankExit")
    return _with(tr, r, tr[r].records, end=None)


@dataclass(frozen=True)
class Tampering:
    name: str
    apply: Callable[[Config, Traces], Traces]
    expect: str           # a piece of the rejection's explanation
    on: str = "repair"    # the run it tampers with: "repair" (repair_traces) or "abort" (abort_traces)
    #: whether the rejection names the tampered rank (a missing decision is seen by its readers, a
    #: duplicated count on either record of the pair)
    names_rank: bool = True

    def base(self, nodes: int, ranks_per_node: int) -> tuple[Config, Traces]:
        """The configuration and the untampered traces of a ``nodes`` x ``ranks_per_node`` world."""
        cfg = repair_config(nodes, ranks_per_node)
        if self.on == "abort":
            cfg = cfg.with_(max_faults=2)
            return cfg, abort_traces(cfg)
        return cfg, repair_traces(cfg)

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip().splitlines()[0]


TAMPERINGS: dict[str, Tampering] = {t.name: t for t in (
    Tampering("reorder", t_reorder, "RankReplace needs the rank agreed"),
    Tampering("drop", t_drop, "RankValidate needs the rank rebound"),
    Tampering("drop-decision", t_drop_decision, "no RankDecideAgreement record wrote", names_rank=False),
    Tampering("rename", t_rename, "pc 'guarded' but RankReject leaves the rank 'exited'"),
    Tampering("decision", t_decision, "read 'commit'"),
    Tampering("last", t_last, "the add that brings the counter to |W|"),
    Tampering("count", t_count, "returns a distinct value", names_rank=False),
    Tampering("comm", t_comm, "communicator but the rank holds"),
    Tampering("frontier", t_frontier, "maps to"),
    Tampering("truncate", t_truncate, "neither crashed"),
    Tampering("no-end", t_no_end, "only a rank killed by a signal lacks an end record"),
    Tampering("extra", t_extra, "record gen 0 but the rank is in generation 1"),
    Tampering("exited-no-end", t_exited_no_end, "every exit path writes the end record", on="abort"),
)}


def tamper(name: str, cfg: Config, traces: Traces) -> Traces:
    return TAMPERINGS[name].apply(cfg, traces)
