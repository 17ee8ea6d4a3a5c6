"""Checks done before the search (spec/trace-checking.md "Before the search"): necessary conditions
of "some interleaving of these traces is a behaviour of the model", each in time linear in the
records, each rejection naming the rank, the record and what the model would have needed.

* Per rank (a projection check): a rank's record sequence must be a path of that rank's local
  automaton, :data:`LOCAL_STEPS`.  A rank's own variables (pc, generation, communicator and cached
  references, failure point, exit reason) change only by the rank's own actions, which are all
  logged (only ``Fault*`` and ``SupervisorRestart`` may be silent, and after a crash or a restart
  a rank takes no step), so the pre-state of each record is the post-state of the rank's previous
  record, and what every record's ``state`` claims can be compared with it exactly.
* Across ranks (the store is one linearizable server): each add to a counter returns a distinct
  value, the counter reaches |W| once per generation, a decision is written once (by the last
  arriver / voter, after all |W| adds) and a read of a decision needs its write.
* End records: ``released`` needs a training rank, ``exited`` an exited one; a rank without one was
  killed by a signal (crashed, or torchrun's restart, impossible if any rank was released).

Sound by construction only for the model it encodes: ``tests/test_checker_soundness.py`` replays random
model runs (every fault kind, both failing modes) against :data:`LOCAL_STEPS` and checks that every
projected model run passes, so a model change that breaks an assumption here fails a test.  An
action missing from :data:`LOCAL_STEPS` is not checked (its rank's later records neither).  With a
model mutant (``Config.mutant``) the caller skips these checks: a mutant may change any step.
Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..impl.controlplane import comm_generation
from ..model.faults import KINDS
from ..impl.trace import RankTrace, Record
from ..model.contract import IN_FLIGHT_PHASES
from ..model.protocol import ACTIONS
from ..model.state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    PC_AGREED,
    PC_ARRIVED,
    PC_CRASHED,
    PC_EXITED,
    PC_GUARDED,
    PC_JOINED,
    PC_LEFT,
    PC_OBSERVED,
    PC_READY,
    PC_REBOUND,
    PC_REPLACED,
    PC_TRAIN,
    PC_VALIDATED,
    REASON_DEADLINE,
    REASON_EXCEPTION,
    REASON_MISMATCH,
    REASON_REJECTED,
    RECOVERY_PCS,
    Config,
)

__all__ = ["Finding", "LOCAL_STEPS", "EXIT_REASON", "precheck"]

_ALIVE = frozenset((PC_TRAIN,) + RECOVERY_PCS)
_RECOVERY = frozenset(RECOVERY_PCS)

#: fault action -> the pcs it may strike in, where the fault-kind table narrows it (accelpact/model/faults.py)
_WINDOWS: dict[str, frozenset[str]] = {k.action: frozenset(k.windows) for k in KINDS.values()
                                       if k.windows is not None and k.action is not None}

#: an entry's pre-pcs are the model's own: ``ActionSpec.pcs`` (model/protocol.py)
_MODEL = "model"

#: action -> (pcs the acting rank may be in before it (None: any), its pc after it (None: unchanged)).
#: The pre-pcs of the rank actions are the model's ``ActionSpec.pcs`` (``_MODEL``: one table, not a
#: copy; the ones without are read off ``model/protocol.py``'s enabled functions); the post-pcs are read
#: off its step functions.  ``tests/test_checker_soundness.py`` checks every step of random model runs
#: against it.  ``FaultGroupFail`` is logged by a member of the failed group, not acted by it (a
#: second member's record of the same failure is no model step at all), so it constrains nothing
#: here; nor does a job-wide fault (no actor: ``FaultStoreLoss``).
_STEPS: dict[str, tuple[frozenset[str] | str | None, str | None]] = {
    "RankObserve": (_MODEL, PC_OBSERVED),
    "RankRevokeWide": (_MODEL, None),  # publishes the wide revoke; the rank observes next (P18.4)
    "RankGuard": (_MODEL, PC_GUARDED),
    "RankReject": (_MODEL, PC_EXITED),
    "RankArrive": (_MODEL, PC_ARRIVED),
    "RankDecideAgreement": (_MODEL, None),
    "RankAwaitAgreement": (_MODEL, PC_AGREED),
    "RankReplace": (_MODEL, PC_REPLACED),
    "RankRebind": (_MODEL, PC_REBOUND),
    "RankValidate": (_MODEL, PC_VALIDATED),
    "RankReady": (_MODEL, PC_READY),
    "RankDecideRelease": (_MODEL, None),
    "RankResume": (_MODEL, PC_TRAIN),
    "RankTimeout": (_MODEL, PC_EXITED),
    "RankExpire": (_MODEL, PC_EXITED),
    "RankFail": (_MODEL, PC_EXITED),
    "RankExit": (_MODEL, PC_EXITED),
    "RankLoseStore": (_MODEL, PC_EXITED),
    "RankSuspect": (_MODEL, PC_EXITED),
    "FaultGroupFail": (None, None),
    "FaultLinkCut": (None, None),   # logged by an end of the link, acted by no rank (P18.2)
    "FaultStoreLoss": (None, None),
    "FaultCrash": (_ALIVE, PC_CRASHED),
    "FaultHang": (_ALIVE, None),
    "FaultRaise": (_RECOVERY, None),
    # the narrower windows of these three are the fault-kind table's (accelpact/model/faults.py FaultKind.windows)
    "FaultMismatch": (_WINDOWS["FaultMismatch"], None),
    "FaultDirtyGuard": (_WINDOWS["FaultDirtyGuard"], None),
    "FaultCorrupt": (_WINDOWS["FaultCorrupt"], None),
    "FaultDelay": (_ALIVE - {PC_READY}, None),
    "FaultDrop": (frozenset({PC_OBSERVED, PC_GUARDED, PC_AGREED, PC_REPLACED, PC_REBOUND, PC_VALIDATED}), None),
    # hot swap (spec/protocol.md P16; the engine's swap actions in impl/recovery.py write these records)
    "RankDiscardStep": (_MODEL, None),
    "RankClaimSpare": (_MODEL, None),
    "SpareJoin": (_MODEL, PC_JOINED),
    "RankTransferState": (_MODEL, None),  # changes the spare's rank, not its own
    "RankFenced": (None, None),                            # a deposed process, outside the seats
    # shrink, grow, refill (spec/protocol.md P19; impl/effects.py, impl/recovery.py write the rank records)
    "RankShrink": (_MODEL, None),     # writes the dead ranks' replicas out; the decider's pc stays
    "RankLeave": (_MODEL, PC_LEFT),
    # the model's leaves the opener training; the engine's record is the opener's (or a peer's)
    # observation of the grow too (pc observed, checker.Steps): _walk reads which from the record
    "RankStartGrow": (_MODEL, None),
    "KeeperRefill": (None, None),     # a keeper's step, never logged: it changes the pool, no rank
}


def _pre(action: str, pre: frozenset[str] | str | None) -> frozenset[str] | None:
    if pre != _MODEL:
        return pre  # type: ignore[return-value]  # not the _MODEL sentinel: a frozenset or None
    pcs = ACTIONS[action].pcs
    if pcs is None:
        raise AssertionError(f"LOCAL_STEPS[{action!r}]: the model's ActionSpec.pcs is None (any pc); say the pcs here")
    return pcs


LOCAL_STEPS: dict[str, tuple[frozenset[str] | None, str | None]] = {a: (_pre(a, pre), post) for a, (pre, post) in _STEPS.items()}

#: the exit reason each exit action sets (RankExit: the store's abort, whatever it is)
EXIT_REASON: dict[str, str | None] = {
    "RankReject": REASON_REJECTED, "RankTimeout": REASON_DEADLINE, "RankExpire": REASON_DEADLINE,
    "RankFail": REASON_EXCEPTION, "RankLoseStore": REASON_DEADLINE, "RankSuspect": REASON_DEADLINE, "RankExit": None,
}

#: records whose ``state`` the search never compares with the model (see checker._match)
_UNCHECKED_STATE = frozenset({"FaultGroupFail"})

_AGREEMENT_DECISIONS = (DECISION_COMMIT, f"abort:{REASON_MISMATCH}")


@dataclass(frozen=True, slots=True)
class Finding:
    """Why the traces cannot be a behaviour of the model: ``record`` (index ``index`` of rank
    ``rank``'s trace), or the rank's end record when ``record`` is None."""

    rank: int
    index: int | None
    record: Record | None
    why: str

    def line(self, end: Mapping[str, Any] | None = None) -> str:
        if self.record is not None:
            return f"  rank {self.rank}: first unmatched {self.record}  -- {self.why}"
        what = f"end record {dict(end)}" if end is not None else "no end record"
        return f"  rank {self.rank}: {what}  -- {self.why}"


#: ``_Rank.point`` of a spare from its SpareJoin to its RankResume: the point is the transfer's
#: (a record of the sender's), so its own records do not constrain it
_ANY_POINT = "*"


def _point_class(p: Any) -> str:
    """In-flight points are one class (checker.disagreement): the contract rejects them alike."""
    p = p or ""
    return "in-flight" if p in IN_FLIGHT_PHASES else str(p)


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class _Rank:
    """One rank's local state, as far as its own records determine it."""

    __slots__ = ("pc", "gen", "comm", "refs", "point", "reason", "opaque")

    def __init__(self) -> None:
        self.pc: str = PC_TRAIN
        self.gen = 0
        self.comm = 0          # generation of the communicator held for its group
        self.refs = 0          # generation every cached reference names (they move together)
        #: the failure point since the rank's RankObserve: "" before (and after its RankResume);
        #: None: observed, point not yet claimed by a record; else the class of the claimed point
        self.point: str | None = ""
        self.reason = ""
        self.opaque = False    # an action not in LOCAL_STEPS: nothing more is known of this rank


def _walk(cfg: Config, r: int, recs: list[Record], silent_crash: bool = False) -> tuple[_Rank, Finding | None]:
    """Rank r's records as a path of its local automaton; the first record that is not.  ``silent_crash``:
    the rank may have died without a record (a SIGKILL from outside: a ``FaultCrash`` the checker may
    take silently), so a record that needs it crashed (a spare's ``SpareJoin`` of its identity) may
    follow any record."""
    rk = _Rank()
    for i, rec in enumerate(recs):
        a = rec.action
        if a not in LOCAL_STEPS:
            rk.opaque = True
            return rk, None
        pre, post = LOCAL_STEPS[a]

        def bad(why: str, rec: Record = rec, i: int = i) -> tuple[_Rank, Finding]:
            return rk, Finding(r, i, rec, why)

        if a == "SpareJoin" and cfg.shrink and rec.gen > rk.gen and (rk.pc in (PC_CRASHED, PC_LEFT) or silent_crash):
            # a grow (P19.3) stands the vacant identity dead in its own generation: a spare (or the
            # identity's own idle process, which left) joins there, generations after the seat emptied
            rk.gen, rk.pc = rec.gen, PC_CRASHED
        if a == "SpareJoin" and cfg.shrink and rk.pc == PC_LEFT:
            rk.pc = PC_CRASHED  # the grow's vacant seat: its own idle process may take it back
        if rec.gen != rk.gen:
            return bad(f"record gen {rec.gen} but the rank is in generation {rk.gen} "
                       f"({rk.gen} RankResume record(s) before it)")
        if pre is not None and rk.pc not in pre and silent_crash and PC_CRASHED in pre and rk.pc in _ALIVE:
            rk.pc = PC_CRASHED  # the unlogged death a spare's identity follows
        if pre is not None and rk.pc not in pre:
            prev = f"after r{r}#{i - 1} {recs[i - 1].action}" if i else "at the start of its trace"
            return bad(f"{a} needs the rank {' or '.join(sorted(pre))}, but it is {rk.pc} {prev}")
        # the rank's post-state
        gen0 = rk.gen
        if post is not None:
            rk.pc = post
        if a == "RankResume":
            rk.gen += 1
            rk.point = ""
        elif a in ("RankObserve", "RankDiscardStep"):
            rk.point = None  # a discard moves the rank back to the committed boundary
        elif a == "RankStartGrow" and rec.state.get("pc") == PC_OBSERVED:
            rk.pc, rk.point = PC_OBSERVED, None  # the engine's record is also the rank's observation of the grow
        elif a == "SpareJoin":
            rk.point = _ANY_POINT  # a peer's RankTransferState sets it: not this trace's to tell
        elif a == "RankReplace" and "comm" in rec.state:  # R's (or every group's); else only the groups over W
            rk.comm = gen0 + 1
        elif a == "RankRebind":
            rk.refs = gen0 + 1
        if a in EXIT_REASON:
            rk.reason = EXIT_REASON[a] or "?"  # RankExit: the store's abort (compared across ranks)
        if a in _UNCHECKED_STATE:
            continue
        for k, v in rec.state.items():
            why = _claim(rk, a, k, v)
            if why:
                return bad(why)
        why = _detail(cfg, a, rec.detail)
        if why:
            return bad(why)
    return rk, None


def _claim(rk: _Rank, action: str, k: str, v: Any) -> str | None:
    """A record's claim about its rank's post-state, against the local state (checker.disagreement)."""
    if k == "pc":
        if v != rk.pc:
            return f"pc {v!r} but {action} leaves the rank {rk.pc!r}"
    elif k == "gen":
        if v != rk.gen:
            return f"state.gen {v} but the rank is in generation {rk.gen} after {action}"
    elif k == "comm":
        gen = comm_generation(v)
        if gen is None:
            return f"comm {v!r} does not name a communicator (expected its c10d name)"
        if gen != rk.comm:
            return (f"comm {v!r} is generation {gen}'s communicator but the rank holds generation {rk.comm}'s "
                    f"({'its RankReplace' if rk.comm else 'no RankReplace'} before)")
    elif k == "refs_stale":
        n = _int(v)
        if v is not None and n is not None and (n == 0) != (rk.refs == rk.comm):
            return (f"refs_stale={v} but its references name generation {rk.refs}'s communicator "
                    f"and it holds generation {rk.comm}'s")
    elif k == "point":
        if rk.point == _ANY_POINT:
            pass
        elif rk.point == "":
            if v:
                return f"point {v!r} but the rank has observed no failure in generation {rk.gen}"
        elif not v:
            return f"point {v!r} but the rank observed a failure in generation {rk.gen}"
        elif rk.point is None:
            rk.point = _point_class(v)
        elif _point_class(v) != rk.point:
            return f"point {v!r} but the rank's earlier records of generation {rk.gen} say {rk.point}"
    elif k == "reason":
        if rk.reason == "?":  # RankExit: any abort reason, the same on every rank (compared later)
            if not v:
                return f"reason {v!r}: {action} exits on the store's abort, which names a reason"
        elif (v or "") != rk.reason:
            return f"reason {v!r} but {action} leaves the rank with reason {rk.reason!r}"
    return None


def _detail(cfg: Config, action: str, d: Mapping[str, Any]) -> str | None:
    """What one record's ``detail`` says that no model step can produce, whatever the interleaving."""
    if action == "RankDecideAgreement" and "decision" in d and d["decision"] not in _AGREEMENT_DECISIONS:
        return f"decision {d['decision']!r}: the last arriver writes one of {list(_AGREEMENT_DECISIONS)}"
    if action == "RankDecideRelease" and "decision" in d and d["decision"] != DECISION_RELEASE:
        return f"decision {d['decision']!r}: the last voter writes {DECISION_RELEASE!r} (the key is empty when it may decide)"
    if action in ("RankArrive", "RankReady") and "count" in d:
        n, w = _int(d["count"]), len(cfg.world)
        if n is None or not 0 <= n <= w:
            return f"count={d['count']!r}: the store's counter of a {w}-rank world counts 0..{w}"
        # with a shrink (P19.1) the barriers count the data-parallel dimension, not W: the search judges
        if "last" in d and not cfg.shrink and bool(d["last"]) != (n == w):
            return (f"last={d['last']} with count={n}: the add that brings the counter to |W| = {w} is the last "
                    "(and only that one)")
    return None


def precheck(cfg: Config, traces: Mapping[int, RankTrace], *,
             silent_possible: Callable[[str, int], bool]) -> list[Finding]:
    """Findings that reject ``traces`` without a search (empty: the search decides).

    ``silent_possible(action, rank)``: whether the checker may take that ``Fault*`` action as an
    unlogged step (a crash without its record, a lost write)."""
    world = cfg.world
    out: list[Finding] = []
    final: dict[int, _Rank] = {}
    for r in world:
        rk, finding = _walk(cfg, r, traces[r].records, silent_possible("FaultCrash", r))
        final[r] = rk
        if finding:
            out.append(finding)
    if out:
        return out
    out.extend(_across(cfg, traces, silent_possible))
    if out:
        return out
    return _ends(cfg, traces, final, silent_possible)


def _across(cfg: Config, traces: Mapping[int, RankTrace], silent_possible: Callable[[str, int], bool]) -> list[Finding]:
    world, w = cfg.world, len(cfg.world)
    by: dict[tuple[str, int], list[tuple[int, int, Record]]] = {}
    exits: list[tuple[int, int, Record]] = []
    drops = any(silent_possible("FaultDrop", r) for r in world)
    for r in world:
        for i, rec in enumerate(traces[r].records):
            by.setdefault((rec.action, rec.gen), []).append((r, i, rec))
            if rec.action == "FaultDrop":
                drops = True
            if rec.action == "RankExit" and rec.state.get("reason"):
                exits.append((r, i, rec))
    out: list[Finding] = []
    gens = sorted({g for (_a, g) in by})
    for g in gens:
        for add, decide, read in (("RankArrive", "RankDecideAgreement", "RankAwaitAgreement"),
                                  ("RankReady", "RankDecideRelease", "RankResume")):
            adds = by.get((add, g), [])
            what = "arrival" if add == "RankArrive" else "release-vote"
            lasts = [x for x in adds if "last" in x[2].detail and bool(x[2].detail["last"])]
            if len(lasts) > 1:
                r, i, rec = lasts[1]
                out.append(Finding(r, i, rec, f"last=true, and {lasts[0][2]} says so too: the {what} counter reaches "
                                              f"|W| once in generation {g}"))
            if not drops:  # no write is lost: every add counts, and returns the counter after it
                seen: dict[int, Record] = {}
                for r, i, rec in adds:
                    n = _int(rec.detail.get("count"))
                    if n is None:
                        continue
                    if not 1 <= n <= len(adds):
                        out.append(Finding(r, i, rec, f"count={n}, but {len(adds)} ranks' records add to the {what} counter "
                                                      f"of generation {g}: it counts 1..{len(adds)}"))
                    elif n in seen:
                        out.append(Finding(r, i, rec, f"count={n}, as {seen[n]} says: each add to the store's {what} "
                                                      "counter returns a distinct value"))
                    seen.setdefault(n, rec)
            decides = by.get((decide, g), [])
            if len(decides) > 1:
                r, i, rec = decides[1]
                out.append(Finding(r, i, rec, f"{decide} again in generation {g} (first {decides[0][2]}): the decision "
                                              "is written once, by the rank whose add completed the count, on an empty key"))
            if decides:
                r, i, rec = decides[0]
                mine = [x for x in adds if x[0] == r]
                if mine and "last" in mine[0][2].detail and not mine[0][2].detail["last"]:
                    out.append(Finding(r, i, rec, f"{decide} by rank {r}, whose {mine[0][2]} says last=false: only the "
                                                  "last to add decides"))
                missing = sorted(set(world) - {x[0] for x in adds})
                if missing and not cfg.shrink:  # a shrink's barrier counts the data-parallel dimension only
                    out.append(Finding(r, i, rec, f"{decide} needs the {what}s of all {w} ranks in generation {g}, "
                                                  f"but rank(s) {_few(missing)} record no {add} there"))
            reads = by.get((read, g), [])
            if reads and not decides:
                r, i, rec = reads[0]
                out.append(Finding(r, i, rec, f"{read} reads a decision of generation {g} that no {decide} record wrote "
                                              "(only the last to add writes it)"))
            elif reads and read == "RankAwaitAgreement" and decides[0][2].detail.get("decision", DECISION_COMMIT) != DECISION_COMMIT:
                r, i, rec = decides[0]
                out.append(Finding(r, i, rec, f"decision {rec.detail['decision']!r}, but {reads[0][2]} read "
                                              f"{DECISION_COMMIT!r}: the decision is written once"))
    reasons = {rec.state.get("reason") for _r, _i, rec in exits}
    if len(reasons) > 1:
        r, i, rec = next(x for x in exits if x[2].state.get("reason") != exits[0][2].state.get("reason"))
        out.append(Finding(r, i, rec, f"RankExit with reason {rec.state.get('reason')!r}, but {exits[0][2]} exits on "
                                      f"{exits[0][2].state.get('reason')!r}: the job's abort key is written once"))
    return out


def _ends(cfg: Config, traces: Mapping[int, RankTrace], final: Mapping[int, _Rank],
          silent_possible: Callable[[str, int], bool]) -> list[Finding]:
    """checker.TraceChecker._done, as far as each rank's own records determine its final state."""
    released = [r for r in cfg.world if (traces[r].end or {}).get("outcome") == "released"]
    out: list[Finding] = []
    for r in cfg.world:
        rk, end = final[r], traces[r].end
        if rk.opaque:
            continue
        out_ = end.get("outcome") if end is not None else None
        if end is None:
            if rk.pc == PC_EXITED:
                out.append(Finding(r, None, None, f"the rank exited (reason {rk.reason!r}) and every exit path writes "
                                                  "the end record: only a rank killed by a signal lacks one (truncated?)"))
            elif rk.pc != PC_CRASHED and not silent_possible("FaultCrash", r) and released:
                out.append(Finding(r, None, None, f"the trace stops with the rank {rk.pc}; only a rank killed by a signal "
                                                  f"lacks an end record: neither crashed (no FaultCrash) nor killed for a "
                                                  f"restart (rank {released[0]} was released) (truncated?)"))
        elif out_ == "left" and rk.pc != PC_LEFT:
            out.append(Finding(r, None, None, f"left, but its last record leaves the rank {rk.pc} (only a RankLeave "
                                              "leaves a rank idle as a spare)"))
        elif out_ == "released" and rk.pc != PC_TRAIN:
            out.append(Finding(r, None, None, f"released, but its last record leaves the rank {rk.pc} (the model "
                                              "releases a rank by its RankResume)"))
        elif out_ == "exited" and rk.pc != PC_EXITED:
            out.append(Finding(r, None, None, f"exited, but its last record leaves the rank {rk.pc} (no exit action)"))
    return out


def _few(xs: list[int], n: int = 8) -> str:
    return ", ".join(map(str, xs[:n])) + (f" and {len(xs) - n} more" if len(xs) > n else "")
