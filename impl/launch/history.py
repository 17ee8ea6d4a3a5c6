"""A run's history read back from its run folder: its recovery episodes, each with its outcome.

Shared by ``accelpact report`` (:mod:`.report`) and the soak's judge (``accelpact.testing.soak.judge``, which
adds what only a soak knows: the faults it struck, the checks).  An episode is a generation of an attempt
with recovery records (its outcome: ``L1`` a repair at the boundary, ``swap`` a hot swap, ``discard`` a step
discarded in place, ``shrink``/``grow`` (issue 41), ``L2`` no rank resumed and the job restarted, ``failed``
none resumed and no restart followed, ``split`` some resumed), or an attempt that ended in a restart
without any (``L2``, point ``(unrecorded)``).  Torch-free: it reads the traces
(:func:`accelpact.impl.trace.load_traces`), result and steps files (:class:`~accelpact.impl.rundir.RunDir`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..rundir import RunDir
from ..trace import RankTrace, load_traces

__all__ = ["EXITS", "RESUMED", "SWAP_ACTIONS", "Episode", "episodes_of", "step_times"]

#: actions that end a rank's part in an attempt (the job is going to a restart: L2)
EXITS = ("RankReject", "RankTimeout", "RankExpire", "RankSuspect", "RankFail", "RankExit", "RankLoseStore")
SWAP_ACTIONS = ("RankClaimSpare", "SpareJoin", "RankTransferState")
#: the outcomes of an episode every rank in training came out of (no restart)
RESUMED = ("L1", "swap", "discard", "shrink", "grow")


@dataclass
class Episode:
    """One recovery episode: a generation of an attempt with recovery records, or an attempt that
    ended in a restart without any."""

    attempt: int
    gen: int
    outcome: str                     # L1 | swap | discard | L2 | failed | split
    t_start_ns: int
    t_end_ns: int | None = None      # the last RankResume (L1/swap/discard); the first commit past the fault (L2)
    t_last_ns: int | None = None     # its last record (or the attempt's last exit): the end of the episode itself
    point: str = ""                  # where it was observed (RankObserve's point), or "detector"
    frontier: int | None = None
    reasons: list[str] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    exit_codes: dict[int, Any] = field(default_factory=dict)
    faults: list[int] = field(default_factory=list)   # strikes attributed to it
    lost_s: float | None = None
    note: str = ""
    swapping: bool = False           # a hot swap was under way (claims, a spare joined, a discard)
    frontiers: list[int] = field(default_factory=list)   # every frontier observed in it
    known: str | None = None         # a known bug it shows (KNOWN_BUGS)
    cause: str = ""                  # an L2's: its restart's cause (restarts.CAUSES, or "unknown: ...")

    @property
    def name(self) -> str:
        return f"a{self.attempt}/g{self.gen}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["name"] = self.name
        return d



def _gens(tr: RankTrace) -> set[int]:
    return {rec.gen for rec in tr.records}


def step_times(run: RunDir, attempt: int, world: int) -> dict[int, dict[int, float]]:
    """rank -> step -> time (monotonic s) of each committed step of ``attempt``."""
    out: dict[int, dict[int, float]] = {}
    for r in range(world):
        p = run.steps(attempt, r)
        rows: dict[int, float] = {}
        if p.exists():
            for line in p.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    rows[int(rec["step"])] = float(rec["t"])
                except (ValueError, KeyError, TypeError):
                    continue
        out[r] = rows
    return out


def _results(run: RunDir) -> dict[tuple[int, int], dict]:
    """(attempt, rank) -> the rank's result file (:meth:`RunDir.results`)."""
    return run.results()


def _replica_ranks(traces: Mapping[int, RankTrace], replicas: Iterable[int]) -> set[int]:
    """The identities of ``replicas`` (issue 41; :func:`accelpact.impl.shrink.replica_ranks`): a replica is a
    rank when R is the world group (DDP), else a node's shard group (the traces' headers say which)."""
    head = next((tr.header for tr in traces.values() if tr.header.get("group")), {})
    if head.get("group") == "world":
        return {int(x) for x in replicas}
    rpn = int(head.get("ranks_per_node") or 1)
    return {int(n) * rpn + local for n in replicas for local in range(rpn)}


def _active_ranks(traces: Mapping[int, RankTrace], g: int) -> set[int] | None:
    """The identities in training after generation ``g``'s episode: the ranks of the replicas its
    ``RankResume`` records name as active (a job that opted in to micro-batches); None when they name
    none (every identity of the job)."""
    for tr in traces.values():
        for rec in tr.records:
            if rec.gen == g and rec.action == "RankResume" and isinstance(rec.state.get("active"), list):
                return _replica_ranks(traces, rec.state["active"])
    return None



def episodes_of(out: str | Path, world: int, traces: Mapping[int, Mapping[int, RankTrace]] | None = None) -> list[Episode]:
    """Every episode of the run folder ``out`` (see :class:`Episode`), in order."""
    run = RunDir(out)
    if traces is None:
        traces = load_traces(out)
    results = _results(run)
    attempts = sorted({a for a, _ in results} | set(traces))
    eps: list[Episode] = []
    for a in attempts:
        trs = traces.get(a, {})
        has_next = any(x > a for x in attempts)
        gens = sorted(set().union(*(_gens(tr) for tr in trs.values()))) if trs else []
        last_gen = max(gens) if gens else None
        for g in gens:
            recs = [rec for tr in trs.values() for rec in tr.records if rec.gen == g]
            acts = {rec.action for rec in recs}
            resumed = sorted(r for r, tr in trs.items() if any(rec.gen == g and rec.action == "RankResume" for rec in tr.records))
            obs = sorted((rec for rec in recs if rec.action in ("RankObserve", "RankDiscardStep")), key=lambda x: x.t_ns)
            fronts = [int(x) for rec in obs for x in (rec.state.get("frontier"),) if isinstance(x, int)]
            ep = Episode(a, g, "", min(rec.t_ns for rec in recs), frontier=min(fronts) if fronts else None,
                         resumed=resumed, t_last_ns=max(rec.t_ns for rec in recs))
            first = min(recs, key=lambda x: x.t_ns)
            ep.point = (obs[0].state.get("point") or "") if obs and obs[0].action == "RankObserve" else (
                "detector" if first.action == "RankSuspect" else first.action)
            ep.reasons = sorted({str(rec.state.get("reason")) for rec in recs if rec.action in EXITS and rec.state.get("reason")})
            ep.swapping = bool(acts & {*SWAP_ACTIONS, "RankDiscardStep"})
            ep.frontiers = sorted({int(x) for rec in recs for x in (rec.state.get("frontier"),) if isinstance(x, int)})
            # issue 41: a job that opted in names the replicas in training in each RankResume; the
            # identities out of them (a dead rank not replaced, its benched shard-group peers) do not resume
            expected = _active_ranks(trs, g)
            everyone = set(resumed) == expected if expected is not None else len(resumed) == len(trs)
            if everyone and trs:
                ep.outcome = ("shrink" if "RankShrink" in acts or "RankLeave" in acts else "grow" if "RankStartGrow" in acts
                              else "discard" if "RankDiscardStep" in acts else ("swap" if acts & set(SWAP_ACTIONS) else "L1"))
                ep.t_end_ns = max(rec.t_ns for rec in recs if rec.action == "RankResume")
                if expected is not None and len(expected) < len(trs):
                    ep.note = f"ranks {sorted(set(trs) - expected)} out of training (shrunk)"
            elif not resumed:
                ep.outcome = "L2" if has_next and g == last_gen else "failed"
                if g != last_gen:
                    ep.note = "no rank resumed, yet the attempt has later generations"
            else:
                ep.outcome = "split"
                ep.note = f"ranks {resumed} resumed, ranks {sorted((expected or set(trs)) - set(resumed))} did not"
            eps.append(ep)
        # an attempt that ended without any episode record (an uncaught error, a crash the job never
        # recorded): still an L2 episode of the history
        ended_unrecorded = has_next and (last_gen is None or any(e.attempt == a and e.gen == last_gen and e.outcome != "L2"
                                                                 for e in eps))
        if ended_unrecorded:
            t_exits = [int(v["t_exit"] * 1e9) for (x, _), v in results.items() if x == a and v.get("t_exit")]
            g = (last_gen + 1) if last_gen is not None else 0
            ep = Episode(a, g, "L2", min(t_exits) if t_exits else 0, point="(unrecorded)", t_last_ns=max(t_exits, default=0),
                         note="the attempt ended in a restart with no recovery record of its end")
            eps.append(ep)
    # exit codes; an L2's end and time lost are its restart's (restarts.py: the steps' own timestamps),
    # set by the judge once the faults are attributed
    for ep in eps:
        if ep.outcome == "L2":
            ep.exit_codes = {r: v.get("exit_code") for (x, r), v in sorted(results.items()) if x == ep.attempt and r < world}
    return eps



#: the soak's former name of :func:`step_times`
_steps = step_times
