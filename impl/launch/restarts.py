"""What each restart of a job cost, and why it happened, read back from its run folder.

(Shared by ``accelpact report``, the soak and ``accelpact bench goodput``: it lives in the launcher's layer, which
all of them may import)

A restart is an attempt that ended and was followed by another (torchrun's restart, or
``launch.run_restarting``'s).  Everything here comes from what the run recorded; nothing is
inferred from a time window:

``cause``      one word of :data:`CAUSES` (a closed vocabulary), or ``unknown: <the facts>``: from
               the records that ended the attempt (the first record that decided the job's abort:
               ``RankReject`` and its ``why``, ``RankDecideAgreement``'s ``abort:<reason>``,
               ``RankTimeout``, ``RankSuspect``, ``RankExpire``, ``RankFail``, ``RankLoseStore``;
               ``RankExit`` on a peer's abort only where no such record is left), the ranks' exit
               codes (``impl/exitcodes.py``: 70-73; 1 an exception outside the pact; none: killed;
               143: stopped by torchrun) and, in a soak, the faults struck at it (a fault struck
               during the episode before its abort: ``fault_during_repair``).
``lost_s``     the time training stood still: from the last commit before the fault to the first
               commit, by a later attempt, of a step past the last step committed before it (the
               fault's frontier).  Both ends are the steps files' own timestamps
               (``steps-a{a}-r{r}.ndjson``: a line per committed step, written as it commits,
               ``time.monotonic()``: the clock of every trace record and of the soak's strikes).
               "Before the fault" is before it took hold: the first record of the episode that ended
               the attempt, else (no record) the attempt's first exit.  A fault that stops training
               takes hold at once (no commit between it and that instant); one that training
               outlived (``committed_after_fault`` steps: a latent break met at the next save or
               collective) is counted from the last of those commits: the steps it outlived were
               progress until then, and their replay lies inside the span.
``t_fault``    the fault itself: the earliest struck at the episode (the soak's strikes, an
               injected ``Fault*`` record), else the episode's first record, else the first exit.
``before_s``   its part until the attempt's last exit (the stall and the detection), and
``after_s``    its part after (the launcher's respawn, the checkpoint's reload, the replay).
``replayed``   the steps the next attempt committed again (at most the last step committed before
               the fault).

Restarts in a chain (the next attempt failed too before it passed the step) each count their own
span; :func:`total_lost_s` counts a moment once (the union of the spans).  Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..rundir import RunDir
from ..trace import RankTrace, Record, load_traces

__all__ = ["CAUSES", "Commit", "Restart", "cause_counts", "classify", "commits", "restarts", "total_lost_s"]

#: every cause a restart is named by (anything else is ``unknown: <detail>``)
CAUSES: dict[str, str] = {
    "no_spare": "a rank died and no spare was idle to take its identity (RankReject, 70)",
    "replicas_lost": "a rank died and every replica of its shard was lost with it (RankReject, 70)",
    "store_lost": "the control-plane store was lost (RankLoseStore, 72)",
    "fault_during_repair": "a fault struck while an episode was under way and ended it (a wait on the peers "
                           "expired, an error, a suspected peer)",
    "mismatch": "the frontier agreement found a different (F, g) (abort:mismatch, 71)",
    "in_flight": "a failure inside a step that could not be discarded in place (RankReject, 70)",
    "guard_failed": "the guard failed: not a clean committed boundary (RankReject, 70)",
    "outside_envelope": "the observation's key is outside the envelope, or qualified for L2 only (RankReject, 70)",
    "suspected": "the failure detector declared a peer dead or hung (RankSuspect, 72)",
    "deadline": "a wait on peers expired (RankTimeout, 72)",
    "step_deadline": "a step made no progress within the step deadline (RankExpire, 72)",
    "exception": "an exception inside a recovery phase (RankFail, 73)",
    "checkpoint_save": "an error in the checkpoint save escaped the pact: exit 1 at a checkpoint step, no record (K1)",
    "uncaught_error": "an error outside the pact: exit 1 (or a signal), no record",
    "killed": "no rank exited by itself with a record: killed, or stopped by the launcher (143)",
}
#: the records that decide a job's abort (their writer is the cause's witness; RankExit follows one)
DECIDING = ("RankReject", "RankLoseStore", "RankSuspect", "RankExpire", "RankTimeout", "RankFail")
#: the engine's causes a second fault can be behind (a struck fault during the episode, before it)
GENERIC = ("deadline", "suspected", "step_deadline", "exception")
#: exit code -> cause, for an attempt whose ranks left no record of why (impl/exitcodes.py)
BY_CODE = {71: "mismatch", 72: "deadline", 73: "exception"}
#: where two records are this close a strike still precedes the episode's first record
_EPS_NS = 50_000_000


@dataclass(frozen=True)
class Commit:
    """One committed step of one rank (a line of a steps file)."""

    t: float          # monotonic seconds
    step: int
    attempt: int
    rank: int


@dataclass
class Restart:
    """One restart: attempt ``attempt`` ended, ``attempt + 1`` followed (module doc)."""

    attempt: int
    cause: str
    detail: str = ""
    exit_codes: dict[int, Any] = field(default_factory=dict)
    faults: list[int] = field(default_factory=list)       # the soak's strikes behind it (their index)
    t_fault: float | None = None                          # monotonic s
    fault_from: str = ""                                  # what gave the fault's time
    last_step: int | None = None                          # the last step committed before the fault
    t_last_commit: float | None = None
    t_end: float | None = None                            # the attempt's last exit (or the next one's start)
    t_back: float | None = None                           # the first commit past last_step
    back_attempt: int | None = None
    lost_s: float | None = None
    before_s: float | None = None
    after_s: float | None = None
    replayed_steps: int = 0
    resumed_at: int | None = None                         # the first step the next attempt committed
    committed_after_fault: int = 0                        # steps the attempt still committed after the fault
    overlaps: list[int] = field(default_factory=list)     # other restarts (attempts) whose span meets this one's
    note: str = ""

    @property
    def name(self) -> str:
        return f"a{self.attempt}"

    @property
    def known(self) -> bool:
        return self.cause in CAUSES

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        return d


# ----------------------------------------------------------------------------------- the steps

def commits(out: str | Path, world: int, attempts: Iterable[int] | None = None) -> list[Commit]:
    """Every committed step of the run folder ``out`` (identities 0..world-1), in time order; a line
    still being written is left out."""
    run = RunDir(out)
    if attempts is None:
        attempts = sorted({a for a, _ in run.results()} | {a for a, _ in run.trace_files()} | set(_step_attempts(run)))
    rows: list[Commit] = []
    for a in attempts:
        for r in range(world):
            p = run.steps(a, r)
            if not p.exists():
                continue
            for line in p.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    rows.append(Commit(float(rec["t"]), int(rec["step"]), a, r))
                except (ValueError, KeyError, TypeError):
                    continue
    return sorted(rows, key=lambda c: (c.t, c.attempt, c.rank))


def _step_attempts(run: RunDir) -> set[int]:
    out = set()
    if run.path.is_dir():
        for p in run.path.glob("steps-a*-r*.ndjson"):
            try:
                out.add(int(p.name[len("steps-a"):].split("-r", 1)[0]))
            except ValueError:
                continue
    return out


# ----------------------------------------------------------------------------------- the cause

def ending_records(trs: Mapping[int, RankTrace]) -> list[Record]:
    """The records of the episode that ended an attempt: its last generation's, unless every
    identity resumed there (the attempt then ended with no record of it: none)."""
    recs = [rec for tr in trs.values() for rec in tr.records]
    if not recs:
        return []
    g = max(rec.gen for rec in recs)
    last = sorted((rec for rec in recs if rec.gen == g), key=lambda x: (x.t_ns, x.rank, x.seq))
    if all(any(rec.gen == g and rec.action == "RankResume" for rec in tr.records) for tr in trs.values()):
        return []
    return last


def _decision(rec: Record) -> str:
    return str(rec.detail.get("decision") or "")


def _deciding(recs: Sequence[Record]) -> Record | None:
    """The first record that decided the abort, else the first RankExit (a peer's abort it followed)."""
    for rec in recs:
        if rec.action in DECIDING or (rec.action in ("RankDecideAgreement", "RankDecideRelease")
                                      and _decision(rec).startswith("abort:")):
            return rec
    return next((rec for rec in recs if rec.action == "RankExit"), None)


def _rejection(why: str, recs: Sequence[Record]) -> str | None:
    w = why.lower()
    if "no spare" in w:
        return "no_spare"
    if "replicas lives" in w or "replica lives" in w:
        return "replicas_lost"
    if w.startswith("failure in flight") or "while the survivors were in" in w:
        return "in_flight"
    if w.startswith("guard failed"):
        # the guard fails on a step observed in flight (RankObserve's in_flight): the step's failure
        in_flight = any(rec.action == "RankObserve" and (rec.detail.get("in_flight") or rec.detail.get("cause") == "in_flight")
                        for rec in recs)
        return "in_flight" if in_flight else "guard_failed"
    if "outside the envelope" in w or "qualified for l2 only" in w:
        return "outside_envelope"
    return None


def _codes_text(codes: Mapping[int, Any]) -> str:
    return ", ".join(f"r{r}: {'killed' if c is None else c}" for r, c in sorted(codes.items()))


def classify(recs: Sequence[Record], exit_codes: Mapping[int, Any], *, faults: Sequence[Mapping[str, Any]] = (),
             frontiers: Sequence[int] = (), checkpoint_every: int = 0) -> tuple[str, str]:
    """(cause, detail) of one restart: ``recs`` the records of the episode that ended the attempt
    (:func:`ending_records`, in time order), ``exit_codes`` each identity's exit code (None: it
    exited by no code of its own), ``faults`` the soak's strikes behind it, ``frontiers`` the
    frontier each rank stood at when it exited 1 (a checkpoint step: the save).  The cause is a
    word of :data:`CAUSES`, or ``unknown: <the facts>``."""
    recs = sorted(recs, key=lambda x: (x.t_ns, x.rank, x.seq))
    codes = {r: c for r, c in exit_codes.items()}
    own = sorted({c for c in codes.values() if c is not None})
    struck = [s for s in faults if s.get("met") and s.get("t_ns") is not None]
    facts = f"exit codes {_codes_text(codes)}" if codes else "no exit codes"
    saving = any(rec.action == "RankRevokeWide" and rec.detail.get("cause") == "save" for rec in recs)
    where = " (in the checkpoint save)" if saving else ""
    dec = _deciding(recs)
    if dec is not None:
        reason = str(dec.state.get("reason") or "")
        what = f"{dec.action} by rank {dec.rank} at g{dec.gen}"
        cause: str | None
        if dec.action == "RankReject":
            why = str(dec.detail.get("why") or "")
            cause = _rejection(why, recs)
            what += f": {why}" if why else ""
            if cause is None:
                return f"unknown: RankReject {why!r}", f"{what}; {facts}"
        elif dec.action == "RankLoseStore":
            cause = "store_lost"
        elif dec.action == "RankSuspect":
            cause = "suspected"
            what += f": rank {dec.detail.get('suspect')} {dec.detail.get('kind') or ''}".rstrip()
        elif dec.action == "RankExpire":
            cause = "step_deadline"
        elif dec.action == "RankTimeout":
            cause = "deadline"
            what += f" ({dec.detail.get('decision') or dec.detail.get('error') or ''})".replace(" ()", "")
        elif dec.action == "RankFail":
            cause = "exception"
            what += f": {dec.detail.get('error') or ''}".rstrip(": ")
        elif dec.action in ("RankDecideAgreement", "RankDecideRelease"):
            r = _decision(dec)[len("abort:"):]
            cause = {"mismatch": "mismatch", "deadline": "deadline", "exception": "exception"}.get(r)
            what += f": {_decision(dec)}"
            if cause is None:
                return f"unknown: {dec.action} {_decision(dec)}", f"{what}; {facts}"
        else:  # RankExit only: the rank that decided left no record (killed, or its write was its last act)
            abort = str(dec.detail.get("abort") or reason)
            cause = {"mismatch": "mismatch", "deadline": "deadline", "exception": "exception"}.get(abort)
            what = f"RankExit on the job's abort {abort!r} (rank {dec.rank}), no record of who decided it"
            if cause is None:
                return f"unknown: {what}", facts
        during = [s for s in struck if s.get("during") and recs and recs[0].t_ns < s["t_ns"] <= dec.t_ns]
        if cause in GENERIC and during:
            s = during[0]
            return "fault_during_repair", (f"#{s.get('index')} {s.get('kind')} struck during the episode "
                                           f"({s.get('during')}), then {what}{where}; {facts}")
        return cause, f"{what}{where}; {facts}"
    # no record decided it
    if any(s.get("kind") == "store_loss" for s in struck):
        return "store_lost", f"the store's process killed (#{next(s.get('index') for s in struck if s.get('kind') == 'store_loss')}), no record; {facts}"
    seen = f"; first record {recs[0].action} by rank {recs[0].rank}" if recs else "; no record of the episode"
    if 1 in own and all(c in (1, 143) for c in own):
        at_ckpt = bool(frontiers) and checkpoint_every > 0 and all(f % checkpoint_every == 0 for f in frontiers)
        if at_ckpt:
            return "checkpoint_save", f"exit 1 at checkpoint frontier(s) {sorted(set(frontiers))}{seen}; {facts}"
        return "uncaught_error", f"exit 1 outside the pact{seen}; {facts}"
    if codes and all(c is None or c == 143 for c in codes.values()):
        return "killed", f"no rank exited with a code of its own{seen}; {facts}"
    mapped = {BY_CODE.get(c) for c in own if c not in (143,)}
    if len(mapped) == 1 and None not in mapped:
        return str(next(iter(mapped))), f"exit code(s) {own} with no deciding record{seen}; {facts}"
    return f"unknown: {facts}{seen}", f"{facts}{seen}"


# ----------------------------------------------------------------------------------- the restarts

def restarts(out: str | Path, world: int, *, traces: Mapping[int, Mapping[int, RankTrace]] | None = None,
             faults: Mapping[int, Sequence[Mapping[str, Any]]] | None = None, checkpoint_every: int = 0) -> list[Restart]:
    """Every restart of the run folder ``out`` (module doc).  ``faults``: attempt -> the soak's
    strikes behind the episode that ended it (``Strike.to_json`` rows: t_ns, index, kind, during)."""
    run = RunDir(out)
    if traces is None:
        traces = load_traces(out)
    faults = faults or {}
    results = run.results()
    attempts = sorted({a for a, _ in results} | set(traces) | _step_attempts(run))
    rows = commits(out, world, attempts)
    out_: list[Restart] = []
    for a in attempts:
        if not any(x > a for x in attempts):
            continue
        trs = traces.get(a, {})
        recs = ending_records(trs)
        res = {r: v for (x, r), v in results.items() if x == a and r < world}
        codes = {r: v.get("exit_code") for r, v in sorted(res.items())}
        fronts = [int(v["frontier"]) for v in res.values() if v.get("exit_code") == 1 and isinstance(v.get("frontier"), int)]
        mine = [dict(s) for s in faults.get(a, ())]
        cause, detail = classify(recs, codes, faults=mine, frontiers=fronts, checkpoint_every=checkpoint_every)
        rs = Restart(a, cause, detail, exit_codes=codes, faults=[int(s["index"]) for s in mine if s.get("index") is not None])
        # the fault: the earliest struck at it, before the episode's first record; else that record; else the first exit
        start_ns = recs[0].t_ns if recs else None
        cands = [(int(s["t_ns"]), f"strike #{s.get('index')} {s.get('kind')}") for s in mine
                 if s.get("met") and s.get("t_ns") is not None and (start_ns is None or s["t_ns"] <= start_ns + _EPS_NS)]
        cands += [(rec.t_ns, f"record {rec.action} (rank {rec.rank})") for rec in recs if rec.action.startswith("Fault")]
        exits = [float(v["t_exit"]) for v in res.values() if v.get("t_exit")]
        if cands:
            t_ns, rs.fault_from = min(cands)
            rs.t_fault = t_ns / 1e9
        elif recs:
            rs.t_fault, rs.fault_from = recs[0].t_ns / 1e9, f"first record {recs[0].action} (rank {recs[0].rank})"
        elif exits:
            rs.t_fault, rs.fault_from = min(exits), "first exit (no record, no fault known)"
        else:
            rs.fault_from = "none known"
        nxt = {r: v for (x, r), v in results.items() if x == a + 1}
        starts = [float(v["t_start"]) for v in nxt.values() if v.get("t_start")]
        rs.t_end = max(exits) if exits else (min(starts) if starts else None)
        # where the fault took hold: the episode's first record, else the first exit (no commit follows it)
        t_hold = recs[0].t_ns / 1e9 if recs else (min(exits) if exits else None)
        mine_rows = [c for c in rows if c.attempt <= a and (t_hold is None or c.t <= t_hold)]
        if rs.t_fault is not None:
            rs.committed_after_fault = len({c.step for c in rows if c.attempt == a and rs.t_fault < c.t <= (t_hold or c.t)})
        if not mine_rows:
            rs.note = "no step was committed before the fault"
        else:
            rs.last_step = max(c.step for c in mine_rows)
            rs.t_last_commit = max(c.t for c in mine_rows)
            past = [c for c in rows if c.attempt > a and c.step > rs.last_step]
            if past:
                first = past[0]  # rows are in time order
                rs.t_back, rs.back_attempt = first.t, first.attempt
                rs.lost_s = round(first.t - rs.t_last_commit, 3)
                if rs.t_end is not None:
                    rs.before_s = round(rs.t_end - rs.t_last_commit, 3)
                    rs.after_s = round(first.t - rs.t_end, 3)
            else:
                rs.note = f"no later attempt committed a step past {rs.last_step}"
            again = {c.step for c in rows if c.attempt == a + 1 and c.step <= rs.last_step}
            rs.replayed_steps = len(again)
        nxt_rows = [c.step for c in rows if c.attempt == a + 1]
        rs.resumed_at = min(nxt_rows) if nxt_rows else None
        if rs.committed_after_fault:
            rs.note = (rs.note + "; " if rs.note else "") + (f"training outlived the fault by {rs.committed_after_fault} "
                                                             "step(s): lost from the last of them")
        out_.append(rs)
    spans = {r.attempt: (r.t_last_commit, r.t_back) for r in out_ if r.t_last_commit is not None and r.t_back is not None}
    for r in out_:
        if r.attempt in spans:
            a0, b0 = spans[r.attempt]
            r.overlaps = [x for x, (a1, b1) in spans.items() if x != r.attempt and a1 < b0 and a0 < b1]
    return out_


def total_lost_s(rs: Iterable[Restart]) -> float:
    """The time lost to the restarts ``rs``, each moment once (the union of their spans)."""
    spans = sorted((r.t_last_commit, r.t_back) for r in rs if r.t_last_commit is not None and r.t_back is not None)
    total, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return round(total, 3)


def cause_counts(rs: Iterable[Restart]) -> dict[str, dict[str, Any]]:
    """cause -> {restarts, lost_s (each its own span), replayed_steps}."""
    out: dict[str, dict[str, Any]] = {}
    for r in rs:
        row = out.setdefault(r.cause, {"restarts": 0, "lost_s": 0.0, "replayed_steps": 0})
        row["restarts"] += 1
        row["lost_s"] = round(row["lost_s"] + (r.lost_s or 0.0), 3)
        row["replayed_steps"] += r.replayed_steps
    return out


def summary(rs: Sequence[Restart]) -> dict[str, Any]:
    """The totals of ``rs`` (what a report prints and its JSON holds)."""
    return {"restarts": len(rs), "lost_s": total_lost_s(rs),
            "lost_s_unmeasured": [r.name for r in rs if r.lost_s is None],
            "replayed_steps": sum(r.replayed_steps for r in rs),
            "by_cause": cause_counts(rs), "unknown": [f"{r.name}: {r.cause}" for r in rs if not r.known]}
