"""Trace checking: do recorded per-rank traces describe a behaviour of the model?

In the style of etcd raft's and CCF's trace validation (spec/trace-checking.md):

* each rank's records are totally ordered (by ``seq``, which must be gap-free);
* before any search, necessary conditions are checked in linear time
  (:mod:`accelpact.conformance.checker_precheck`): each rank's records must be a path of its own
  local automaton, and what the store linearizes (counters, single-assignment decisions) must be
  consistent across ranks; most tamperings are rejected there, naming rank, record and reason;
* the cross-rank interleaving is *searched*: a depth-first search over nodes (model state, per-rank
  cursor, scripted faults fired, silent-step count), memoised, guided by each record's ``t_ns``
  repaired by the order the store fixes (:meth:`TraceChecker._guide`), with partial-order
  reduction: a record whose step commutes with every step that can still happen is taken alone
  (always for purely local steps; for the shared steps once no fault can strike silently any more
  and no record they depend on is left, the store's counters ordering the adds), so the search is
  linear in the records on honest and on tampered traces alike;
* a record matches a model action with the same name and rank that is enabled in the node's
  state and whose post-state agrees with the record's ``state`` fields under the abstraction
  function (:class:`Abstraction`);
* ``SupervisorRestart`` and, with a scenario script, the ``Fault*`` actions the script allows
  may also happen as silent (unlogged) steps, at most ``silent_bound`` in a row;
* the traces are accepted only if EVERY rank's trace is consumed to its end and each rank's
  ``end`` record agrees with the model (etcd's TraceMatched): a matcher that stops early must
  not report success;
* told nothing (:func:`check_told_nothing`, a user's run), the run is cut at its episodes and each
  episode searched from the states the one before ends in (:class:`EpisodeSearch`), the searches
  chained lazily; one search (:class:`Search`) is one depth-first search of a stretch of records.

On rejection the :class:`Verdict` explains: the first unmatched record per rank (and why each
candidate action disagreed), the model states the search could have been in, the actions the model
allowed there, and a model path to the furthest match.  ``t_ns`` orders the search, never the
verdict.  Pure Python, no torch.
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, cast

from ..model.batches import share as batch_share
from ..model.forget import forget_past
from ..model.contract import EnvelopeError, IN_FLIGHT_PHASES, envelope_from_mapping, without_discard
from ..model.protocol import ACTIONS, Action, _replicas_in, all_actions, is_final, link_arg, true_lookup
from ..model.transitions import actions_for, enabled, successors
from ..model.state import (
    PC_CRASHED,
    PC_EXITED,
    PC_LEFT,
    PC_TRAIN,
    Config,
    Rank,
    State,
    initial_state,
)
from ..impl.trace import FORMAT as TRACE_FORMAT
from ..impl.controlplane import PREFIX, comm_generation, comm_name
from ..model.faults import KINDS
from ..impl.rundir import RunDir
from ..impl.trace import RankTrace, Record, TraceError
from .checker_precheck import Finding, precheck
from .mapping import Script, surfaces

#: model actions of job-wide fault kinds (no actor rank; the trace of the rank that triggered one logs it)
JOB_WIDE = frozenset(k.action for k in KINDS.values() if k.job_wide)

STATE_FIELDS = ("pc", "gen", "frontier", "tau", "point", "comm", "refs_stale", "reason", "wide")


@dataclass(frozen=True, slots=True)
class Abstraction:
    """Maps implementation values onto model values.

    ``bases[g]`` is the real committed step at which the failure of generation g struck: the
    model's F_g (``cfg.frontier_at(g)``: F moves between episodes) stands for it, and F_g+1 (a rank
    one step ahead) for base+1.
    Without an entry for g the real value is compared with the model's directly.
    """

    bases: Mapping[int, int] = field(default_factory=dict)

    def step(self, cfg: Config, gen: int, real: int) -> int:
        base = self.bases.get(gen)
        return real if base is None else cfg.frontier_at(gen) + (real - base)


def engine_contract(traces: Mapping[int, RankTrace]) -> dict[str, Any]:
    """The contract the engine decided with, as its trace headers say: ``platform`` (its backend's,
    ``cuda-nccl`` on NCCL) and ``envelope`` (the envelope's JSON), as :class:`Config` fields; empty for
    traces that do not say (written before they did: the model's defaults, ``cpu-gloo`` and the
    shipped envelope).  An NCCL run under the shipped envelope is then modelled as it ran: its
    platform is not qualified there, so each failure is L2 (RankReject), not the L1 a ``cpu-gloo``
    model would demand.  :class:`TraceError` when a header's contract is malformed or the ranks'
    headers disagree."""
    saying = [tr.header for tr in traces.values() if "platform" in tr.header or "envelope" in tr.header]
    if not saying:
        return {}
    said = {(str(h.get("platform")), json.dumps(h.get("envelope"), sort_keys=True)) for h in saying}
    if len(said) > 1:
        raise TraceError(f"the ranks' trace headers name {len(said)} different contracts (platform, envelope): "
                         "one job decides with one; were traces of different runs mixed in one folder?")
    platform, raw = saying[0].get("platform"), saying[0].get("envelope")
    if not isinstance(platform, str) or not platform:
        raise TraceError(f"trace header field 'platform' must be a non-empty string (e.g. 'cpu-gloo'), got {platform!r}")
    try:
        envelope = envelope_from_mapping(raw, source="trace header field 'envelope'")
    except EnvelopeError as exc:
        raise TraceError(str(exc)) from None
    return {"platform": platform, "envelope": envelope}


def config_from_headers(traces: Mapping[int, RankTrace], *, frontier: int | None = None, checkpoint: int = 0,
                        max_faults: int | None = None, profile: str | None = None) -> Config:
    """A model config from the trace headers (when no scenario file is at hand)."""
    h = next(iter(traces.values())).header
    nodes, rpn = int(h["nodes"]), int(h["ranks_per_node"])
    group = h.get("group", "replicate")
    affected = list(h.get("affected") or []) or _first_rebuilder(traces)
    local = affected[0] % rpn if affected and group == "replicate" and rpn > 1 else 0
    if frontier is None:
        obs = [x for tr in traces.values() for rec in tr.records if rec.action == "RankObserve"
               for x in (rec.state.get("frontier"),) if isinstance(x, int)]
        frontier = min(obs) if obs else 1
    if max_faults is None:
        # one more: a logged death in training without spares is, to the model, the group failure it
        # causes and the crash (FaultGroupFail, FaultCrash(rank))
        max_faults = count_fault_records(traces) + count_unlogged_faults(traces) + 1
    # the job's spares: the header's, which the engine always writes (the launcher's spares; a spare a
    # keeper refilled is no launcher spare: elastic_from_headers infers the refill); a trace without the
    # field: at least one per launcher spare that took an identity, as its incarnation's header says (a
    # benched rank recalled by a grow joins as itself, spare -1: no spare of the pool)
    spares = int(h["spares"] or 0) if "spares" in h else \
        len({s for tr in traces.values() for inc in tr.header.get("incarnations", ())
             for s in (inc.get("spare"),) if isinstance(s, int) and s >= 0})
    # a rank that observed through its failed failure flag (P18.4), or a logged link cut: the run met a
    # broken link, which the model has with Config.links (and failing groups of any index)
    links = nodes > 1 and any(rec.action in ("FaultLinkCut", "RankRevokeWide") or (rec.action == "RankObserve" and rec.detail.get("wide"))
                              for tr in traces.values() for rec in tr.records)
    cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=local, group=group, max_faults=max_faults,
                 frontier=frontier, checkpoint=min(checkpoint, frontier), spares=spares,
                 failing="any" if links else "one", links=links, **engine_contract(traces))
    if not h.get("discard"):  # attached without rebuild= (or a trace that does not say): the engine narrowed its envelope (P17)
        cfg = cfg.with_(envelope=without_discard(cfg.envelope, "the job was attached without rebuild="))
    else:  # it discards in place, behind the commit fence (P17.2)
        cfg = cfg.with_(fence=True)
    cfg = with_elastic(cfg, traces)  # shrink, grow, refill (issue 41): without the fence, see there
    return cfg.with_(profile=profile or h["profile"]) if profile or h.get("profile") else cfg


def elastic_from_headers(traces: Mapping[int, RankTrace]) -> dict[str, Any]:
    """Issue 41 (spec/protocol.md P19) as the trace headers say, as :class:`Config` fields.

    ``shrink`` and ``micro_batches``: the job opted in (``attach(micro_batches=M)``: the engine's header
    says ``"shrink": true, "micro_batches": M``).  ``refill``: a keeper may have started a fresh spare for
    a dead worker, which no trace records (keepers are not traced; ``KeeperRefill`` is an unlogged model
    step, :meth:`Search._refills`).  A header's ``"refill"`` (true/false) says it; a header
    without one: whenever the job had spares or opted in to shrink (a keeper refills by default,
    ``ACCELPACT_REFILL=1``) and the records need it: the job opted in to shrink (its grows take spares
    from the pool), or more spares joined (``SpareJoin`` records) than the job had.  A refill is
    optional in the model (it allows every run without one too), so assuming it loses no honest run;
    it is not assumed otherwise because the model has no refill beside the commit fence
    (:func:`with_elastic`), which every job with spares has.  :class:`TraceError` when the ranks' first headers disagree or a field is malformed."""
    firsts = [tr.header for tr in traces.values()]
    said = {(bool(h.get("shrink")), h.get("micro_batches"), h.get("refill")) for h in firsts}
    if len(said) > 1:
        raise TraceError(f"the ranks' trace headers disagree on shrink/micro_batches/refill {sorted(map(str, said))}: "
                         "one job opts in or not; were traces of different runs mixed in one folder?")
    shrink, m, refill = next(iter(said)) if said else (False, None, None)
    out: dict[str, Any] = {}
    if shrink:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise TraceError(f"trace header field 'micro_batches' must be an integer >= 1 with 'shrink', got {m!r}")
        out.update(shrink=True, micro_batches=m)
    if refill is not None and not isinstance(refill, bool):
        raise TraceError(f"trace header field 'refill' must be true or false, got {refill!r}")
    spares = max([int(h.get("spares") or 0) for h in firsts] or [0])
    joins = sum(1 for tr in traces.values() for rec in tr.records if rec.action == "SpareJoin")
    if refill if refill is not None else (shrink or (joins > spares)):
        out["refill"] = True
    return out


def with_elastic(cfg: Config, traces: Mapping[int, RankTrace]) -> Config:
    """``cfg`` with issue 41 as the headers say (:func:`elastic_from_headers`).  The model does not yet
    have shrink or refill beside the commit fence (``Config`` refuses both, P17.2 x P19), and a job that
    opted in attaches with ``rebuild=`` (so it discards behind the fence): such a job is modelled
    without the fence (a failure in forward or backward is then not stopped before its commit in the
    model; the deaths a shrink or a refill follows are judged exactly)."""
    elastic = elastic_from_headers(traces)
    if not elastic:
        return cfg
    return cfg.with_(fence=False, **elastic)


def abstraction_from_records(traces: Mapping[int, RankTrace]) -> Abstraction:
    """For a run told nothing (a user's): the real committed step at which each generation's failure
    struck, read off its ``RankObserve`` records (the least frontier reported: a rank that committed
    the step a failure struck in flight reports one more).  Episodes follow one another at whatever
    distance the run had (a save that fails at F and a failure in the next step, uncommitted, are two
    episodes at the same F), which the model's ``frontier_at`` (one step apart) stands for."""
    bases: dict[int, int] = {}
    for tr in traces.values():
        for rec in tr.records:
            f = rec.state.get("frontier")
            if rec.action in ("RankObserve", "RankStartGrow") and isinstance(f, int):  # a grow's record is its observation
                bases[rec.gen] = min(bases.get(rec.gen, f), f)
    return Abstraction(bases)


def _first_rebuilder(traces: Mapping[int, RankTrace]) -> list[int]:
    """R when the headers do not name it (a user's job does not know in advance which group will
    fail): the rank of the first ``RankReplace`` record that names R's new communicator (a member of the
    failed group; every rank's names the groups over W it built);
    empty when nothing was rebuilt."""
    recs = [(rec.t_ns, rank) for rank, tr in traces.items() for rec in tr.records
            if rec.action == "RankReplace" and "comm" in rec.state]  # a member rebuilt R (every rank rebuilds the groups over W)
    return [min(recs)[1]] if recs else []


def count_unlogged_faults(traces: Mapping[int, RankTrace]) -> int:
    """Faults a run may have met that no record names (a user's run: a SIGKILL, a SIGSTOP, a cut link
    from outside the job), each at most once: an episode (a generation with a ``RankObserve``) whose
    generation logs no fault (the group failure, or the death, that started it), and a rank whose
    trace ends without an ``end`` record and without a logged ``FaultCrash`` (it was killed: by a
    signal from outside, or by torchrun for a restart).  With the logged ones, the checker's budget
    for silent faults (:class:`TraceChecker` ``silent_faults``)."""
    logged = {rec.gen for tr in traces.values() for rec in tr.records if rec.action.startswith("Fault")}
    grows = {rec.gen for tr in traces.values() for rec in tr.records if rec.action == "RankStartGrow"}  # no fault started it
    episodes = {rec.gen for tr in traces.values() for rec in tr.records if rec.action == "RankObserve"} - logged - grows
    killed = sum(1 for tr in traces.values() if tr.end is None and not any(rec.action == "FaultCrash" for rec in tr.records))
    return len(episodes) + killed


#: ``RankObserve.detail.cause`` of a requested shrink (impl/recovery.py ``_change_membership``)
SHRINK_REQUEST = "shrink-request"


def requested_shrinks(traces: Mapping[int, RankTrace]) -> list[Record]:
    """The records of a requested shrink (``attach(shrink_at=(F, replica))`` or ``ACCELPACT_SHRINK_AT``:
    a replica asked to leave at a committed boundary with nobody dead; each rank's ``RankObserve`` with
    ``detail.cause`` ``shrink-request``), in rank order.  The model has no action for it (P19.1:
    ``RankShrink`` writes out the replicas of ranks that died; nothing opens an episode at a boundary
    but a fault or a grow), so no trace with one is a behaviour of the model: :meth:`TraceChecker.check`
    says so by name (``Verdict.outside``) instead of a search's generic rejection."""
    return [rec for r in sorted(traces) for rec in traces[r].records
            if rec.action == "RankObserve" and rec.detail.get("cause") == SHRINK_REQUEST]


def requested_shrink_verdict(asked: list[Record], why_not_joined: str = "") -> Verdict:
    """The named rejection of a run with a requested shrink (:func:`requested_shrinks`, not empty):
    outside the model, whatever else its records say; each rank's first such record is listed.
    ``why_not_joined``: the run's traces could not even be joined into one per identity (a spare took
    the identity of a rank whose requested leave ended its process, ``impl/trace.py`` ``load_traces``)."""
    leaving = sorted({int(q) for rec in asked for q in (rec.detail.get("leaving") or ()) if isinstance(q, int)})
    at = sorted({f for rec in asked for f in (rec.state.get("frontier"),) if isinstance(f, int)})
    first: dict[int, Record] = {}
    for rec in asked:
        first.setdefault(rec.rank, rec)
    lines = [f"rejected: outside the model: a requested shrink (attach(shrink_at=...) or ACCELPACT_SHRINK_AT): "
             f"the replica(s) of rank(s) {leaving} asked to leave at F={at[0] if len(at) == 1 else at} with no rank dead. "
             "spec/protocol.md P19 has no action for it (RankShrink writes out only the replicas of ranks that "
             "died, P19.1), so no trace of such a run is a behaviour of the model; check a run with a real death "
             "instead, whose shrink the model has"]
    lines += [f"  rank {r}: r{r}#{rec.seq} RankObserve gen={rec.gen} (detail.cause={SHRINK_REQUEST!r})"
              for r, rec in sorted(first.items())[:16]]
    if len(first) > 16:
        lines.append(f"  ... and {len(first) - 16} more ranks")
    if why_not_joined:
        lines.append(f"  (nor can the traces be joined per identity: {why_not_joined})")
    return Verdict(False, "\n".join(lines), 0, [], {r: str(rec) for r, rec in first.items()}, outside="requested-shrink")


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
#: and so disable its RankTimeout.  Exceptions (Search._safe): RankGuard ends the window of the
#: rank's own FaultCorrupt (which does not disable the guard), so it is not taken alone while that
#: fault can still strike silently; RankResume ends the episode, see :func:`resume_alone`.
_LOCAL = ("RankGuard", "RankReplace", "RankAwaitAgreement", "RankResume")

#: Interference classes of records: a shared step may be taken alone only when no record of the
#: classes it depends on is left to consume (:data:`_ALONE_UNLESS`).  Every record not named here and
#: not a plain repair step (:data:`_PLAIN`) is ``other``: a fault, a timeout, a rejection, a failure,
#: a lost store, or an action this table does not know.
CLASSES = ("group_fail", "exit", "observe", "validate", "other")
_CLASS_OF = {"FaultGroupFail": 0, "FaultLinkCut": 0, "RankExit": 1, "RankObserve": 2, "RankValidate": 3}
_PLAIN = frozenset(("RankGuard", "RankArrive", "RankDecideAgreement", "RankAwaitAgreement", "RankReplace", "RankRebind",
                    "RankReady", "RankDecideRelease", "RankResume"))
_OTHER = 4

#: Shared steps taken alone (partial-order reduction) once no fault can happen silently any more (none
#: allowed, or the fault budget spent) and no record of the listed classes is left.  Why each
#: commutes with every other step that can then happen, and disables none (a step that disables it
#: disables it for good, so such a path cannot consume its record: it is no accepting path):
#:
#: * RankArrive / RankReady: they do NOT commute with each other in one generation (the counter
#:   and the ``last`` flag depend on their order), but when a record reports its ``count`` and no
#:   other record of its generation the same, and no write can be lost (no FaultDrop), the record with count k
#:   matches only when k - 1 adds are in: no two are ever enabled together (``TraceChecker.ordered``:
#:   per record, when no other record of its generation reports its count).
#:   Nothing else reads the counter but the decision, enabled only after every add.
#: * a member's RankObserve at the point where the failure struck publishes the revoke (enabling
#:   non-members) and keeps satisfying every peer's condition (``_en_observe``); only another
#:   group's FaultGroupFail (every rank still training) depends on it.
#: * RankDecideAgreement / RankDecideRelease write a decision on an empty key: the other writers
#:   (a timeout, a rejection, a failure: ``other``) race with them; the reads are enabled by them.
#: * RankRebind completes a peer's validation: it disables only a peer's RankTimeout (``other``).
#: * RankValidate needs every peer in the validation: a peer's exit or fault removes one.
#: * RankExit (on the job's abort, which stays): the exiting rank leaves the validation and stops
#:   training (a member's observation past the failed collective needs a peer still training).
#:
#: Checked against the model by tests/test_checker_soundness.py on random runs (every pair of
#: enabled steps).
_ALONE_UNLESS: dict[str, tuple[int, ...]] = {
    "RankArrive": (), "RankReady": (), "RankObserve": (0,),
    "RankDecideAgreement": (_OTHER,), "RankDecideRelease": (_OTHER,), "RankRebind": (_OTHER,),
    "RankValidate": (_OTHER, 1), "RankExit": (_OTHER, 2, 3),
}
_COUNTED = ("RankArrive", "RankReady")

#: how many frontier records the search examines for a step it may take alone before it branches on
#: all of them (bounds a node's cost on large traces that are not quiet)
LOOKAHEAD = 256


def _inside_episode(s: Any, r: int) -> bool:
    """Rank r's generation has its episode started (``Store.failed``): outside one, its RankObserve
    (the commit fence meeting a latent break, P18.3) starts the episode, a step that is not local."""
    f = s.store.failed
    return f is not None and f[0] == s.ranks[r].gen


def _in_failed_group(cfg: Config, s: State, r: int) -> bool:
    """Rank r's group failed in its current generation (it is a member of that episode's R)."""
    f = s.store.failed
    return f is not None and f[0] == s.ranks[r].gen and cfg.group_of(r) in f[2]


def resume_alone(cfg: Config, s: State, r: int) -> bool:
    """RankResume leaves the episode: if rank r is the last live rank in it, the store's loss
    (FaultStoreLoss, which strikes only during an episode) can no longer happen after it."""
    if "FaultStoreLoss" not in actions_for(cfg) or s.faults >= cfg.max_faults or (cfg.faults and "store_loss" not in cfg.faults):
        return True
    g = s.ranks[r].gen
    return any(q != r and rk.gen == g and rk.pc not in (PC_EXITED, PC_CRASHED) for q, rk in enumerate(s.ranks))


def _held(pre: State, post: State, r: int) -> Rank:
    """Rank r as a record of step pre -> post describes it: as the model has it after the step, but
    an exit (or a leave) record reports what the process held as it exited, which the model's exited rank no
    longer holds (an exit keeps only pc, gen, reason and delayed: ``protocol._EXIT_FORGETS``)."""
    rk = post.ranks[r]
    if rk.pc not in (PC_EXITED, PC_LEFT) or pre.ranks[r].pc == rk.pc:
        return rk
    # a RankLeave (P19.3) forgets as an exit does (but the incarnation): its record reports what it held
    return replace(pre.ranks[r], pc=rk.pc, gen=rk.gen, reason=rk.reason, hung=False, raised=False)


def disagreement(cfg: Config, abst: Abstraction, pre: State, a: Action, post: State, rec: Record) -> str | None:
    """None when ``rec`` is a faithful record of model step pre --a--> post, else what differs."""
    r = rec.rank
    if rec.gen != pre.ranks[r].gen:
        return f"record gen {rec.gen} but the rank was in generation {pre.ranks[r].gen}"
    rk = _held(pre, post, r)
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
                return f"comm {v!r} does not name a communicator (expected its c10d name, e.g. {comm_name(PREFIX, 1, 'replicate')!r})"
            if gen != rk.comm:
                return f"comm {v!r} is generation {gen}'s communicator but the model has generation {rk.comm}'s"
        elif k == "refs_stale":
            if v is not None and (int(v) == 0) != (_refs_stale(rk) == 0):
                return f"refs_stale={v} but the model has {_refs_stale(rk)} stale of {len(rk.refs)}"
        elif k == "reason":
            if (v or "") != rk.reason:
                return f"reason {v!r} but the model has {rk.reason!r}"
        elif k == "wide":
            if v is not None and int(v) != rk.wide:
                return f"wide={v} (the generation of the groups over W it holds) but the model has {rk.wide}"
        elif k in ("share", "active") and a.name == "RankResume":
            why = _batch_disagreement(cfg, post, pre.ranks[r].gen, r, k, v)
            if why:
                return why
    g = pre.ranks[r].gen
    d = rec.detail
    if rec.action in ("RankShrink", "RankLeave", "RankStartGrow"):
        why = _elastic_disagreement(cfg, pre, post, g, rec)
        if why:
            return why
    if a.name == "RankClaimSpare" and isinstance(d.get("claims"), dict):
        # the identities it won (one compare_set each, impl/effects.py): some or all of the model's claim
        want = {q for gg, q, _inc in post.store.claims if gg == g}
        ids = _claim_ids(d["claims"])
        if ids is None or not ids <= want:
            return f"claims={d['claims']!r} but the model's claim in generation {g} is of identities {sorted(want)}"
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


def _claim_ids(claims: Mapping[Any, Any]) -> set[int] | None:
    """The identities a ``RankClaimSpare`` record's ``detail.claims`` names (its keys: the JSON of
    identity -> spare), None when one is not an identity."""
    try:
        ids = {int(k) for k in claims}
    except (TypeError, ValueError):
        return None
    return ids if all(i >= 0 for i in ids) else None


def _batch_disagreement(cfg: Config, post: State, g: int, r: int, k: str, v: Any) -> str | None:
    """A ``RankResume`` record's ``share`` (the micro-batches of every step its replica processes from
    F on) or ``active`` (the replicas in the data-parallel dimension) against the model's (P19.2:
    ``State.shares``, decided by generation g's release, ``model/batches.share``)."""
    if not cfg.shrink:
        return (f"{k}={v!r}, but the model counts no micro-batches: the job's trace headers do not say it opted in "
                "('shrink', 'micro_batches')")
    if k == "active":
        want = list(_replicas_in(cfg, post, g))
        return None if isinstance(v, list) and sorted(v) == want else \
            f"active={v!r} but the model has replicas {want} in the data-parallel dimension of generation {g}"
    got = [sh for gg, rr, sh in post.shares if gg == g and rr == r]
    want_share = list(got[0]) if got else list(batch_share(cfg.replica_of(r), _replicas_in(cfg, post, g), cfg.total_micro_batches))
    if not isinstance(v, list) or v != want_share:
        return (f"share={v!r} but the model has replica {cfg.replica_of(r)} process micro-batches {want_share} of "
                f"{cfg.total_micro_batches} (replicas {list(_replicas_in(cfg, post, g))} in generation {g})")
    return None


def _ranks_of(cfg: Config, replicas) -> list[int]:
    return sorted(q for i in replicas for q in cfg.replica_ranks(i))


def _elastic_disagreement(cfg: Config, pre: State, post: State, g: int, rec: Record) -> str | None:
    """What a shrink's, a leave's or a grow's record says of the replicas against the model (P19):
    ``RankShrink``: ``replicas`` (those it wrote out) and ``leaving`` (their ranks); ``RankLeave``:
    ``leaving`` (the ranks of the replicas out in its generation); ``RankStartGrow``: ``vacant`` (the
    identities the grow stands dead, to be claimed)."""
    d = rec.detail
    if rec.action == "RankShrink":
        out = sorted(i for gg, i in post.store.shrunk - pre.store.shrunk if gg == g)
        if "replicas" in d and sorted(d["replicas"] or ()) != out:
            return f"replicas={d['replicas']!r} but the model writes replica(s) {out} out"
        if "leaving" in d and sorted(d["leaving"] or ()) != _ranks_of(cfg, out):
            return f"leaving={d['leaving']!r} but the model's replica(s) {out} out are ranks {_ranks_of(cfg, out)}"
    elif rec.action == "RankLeave" and "leaving" in d:
        want = _ranks_of(cfg, {i for gg, i in post.store.shrunk if gg == g})
        if sorted(d["leaving"] or ()) != want:
            return f"leaving={d['leaving']!r} but the replicas out in generation {g} are ranks {want}"
    elif rec.action == "RankStartGrow" and "vacant" in d:
        grown = {i for gg, i in post.store.grown if gg == g}
        want = sorted(q for gg, q in post.store.dead if gg == g and cfg.replica_of(q) in grown)
        if sorted(d["vacant"] or ()) != want:
            return f"vacant={d['vacant']!r} but the model's grow in generation {g} stands ranks {want} dead (replica(s) {sorted(grown)})"
    return None


# --------------------------------------------------------------------------------------
# The search

@dataclass(frozen=True, slots=True)
class Steps:
    """Model steps that one record stands for, in order (the last is the record's own action): unlogged
    ``KeeperRefill`` steps the record needed before it (:meth:`Search._refills`), and the engine's
    ``RankStartGrow`` record, which is the model's ``RankStartGrow`` (by the rank that opened the grow)
    and that rank's ``RankObserve`` at the boundary, or the observation alone (a rank that found the
    grow open: every rank records ``RankStartGrow``, the grow's single assignment, impl/shrink.py
    ``grow_decision``)."""

    steps: tuple[Action, ...]

    @property
    def name(self) -> str:
        return self.steps[-1].name

    @property
    def rank(self) -> int | None:
        return self.steps[-1].rank

    @property
    def arg(self) -> str | None:
        return self.steps[-1].arg

    def __str__(self) -> str:
        return " -> ".join(map(str, self.steps))


@dataclass(frozen=True, slots=True)
class NoStep:
    """A record that stands for no model step: another record's step did what it says (a second
    detector's share of one episode's claims, :meth:`TraceChecker._claimed_already`)."""

    why: str

    def __str__(self) -> str:
        return self.why


@dataclass(frozen=True, slots=True)
class Node:
    state: State
    cursors: tuple[int, ...]
    fired: frozenset[int]
    silent: int
    #: search hints, not part of the node's identity: an index into the checker's ordered list of all
    #: records (:meth:`TraceChecker._guide`) at or before which every record is consumed or still
    #: ahead; how many records are consumed; how many are left of each class of :data:`CLASSES`
    #: (both functions of ``cursors``)
    pos: int = field(default=0, compare=False, hash=False)
    done: int = field(default=0, compare=False, hash=False)
    left: tuple[int, ...] = field(default=(0, 0, 0, 0, 0), compare=False, hash=False)


@dataclass
class Verdict:
    accepted: bool
    message: str
    nodes: int = 0
    path: list[str] = field(default_factory=list)        # a model path (action strings) to acceptance / last match
    unmatched: dict[int, str] = field(default_factory=dict)
    #: non-empty when the traces record something the model has no action for (not a disagreement
    #: with it): ``"requested-shrink"`` (:func:`requested_shrinks`)
    outside: str = ""
    #: the generation whose records the search could not match, when it searched generation by
    #: generation (:meth:`TraceChecker._check_episodes`)
    gen: int | None = None

    def __bool__(self) -> bool:
        return self.accepted


class TraceChecker:
    """Checks the traces of one attempt against one model configuration (see module doc): the traces
    and what the search needs to know of each record, the checks before the search, and the verdict.
    The search itself is a :class:`Search` of the whole run, or, told nothing, one
    :class:`EpisodeSearch` per episode (:meth:`_check_episodes`)."""

    def __init__(self, cfg: Config, traces: Mapping[int, RankTrace], *, script: Script | None = None,
                 abstraction: Abstraction | None = None, silent_bound: int = 4, max_nodes: int = 500_000,
                 restarted: bool = False, silent_faults: bool | None = None, prechecks: bool = True,
                 episodes: bool = False) -> None:
        self.cfg = cfg
        #: search episode by episode (:meth:`_check_episodes`, spec/trace-checking.md "Episodes"):
        #: for a run told nothing, whose fault budget is per episode
        self.episodes = episodes
        self.world = cfg.world
        missing = [r for r in self.world if r not in traces]
        if missing:
            raise TraceError(f"no trace for rank(s) {missing} of a {len(self.world)}-rank world")
        self.traces = {r: traces[r] for r in self.world}
        self.recs = {r: traces[r].records for r in self.world}
        self.total = sum(len(v) for v in self.recs.values())
        #: per record: its class (an index into :data:`CLASSES`), -1 for a plain repair step
        self.cls = {r: tuple(-1 if rec.action in _PLAIN else _CLASS_OF.get(rec.action, _OTHER) for rec in self.recs[r])
                    for r in self.world}
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
        # the search tries first the crash of a rank the records say died (:meth:`_silent`)
        self.killed = frozenset(r for r in self.world if self.traces[r].end is None)
        self.named_dead: dict[int, frozenset[int]] = {}
        for v in self.recs.values():
            for rec in v:
                dead = rec.detail.get("dead") if rec.action == "RankObserve" else None
                if rec.action == "SpareJoin":  # a spare took the identity in that generation: its holder died
                    dead = [rec.rank]
                if isinstance(dead, list):
                    self.named_dead[rec.gen] = self.named_dead.get(rec.gen, frozenset()) | {d for d in dead if isinstance(d, int)}
        #: a keeper's refill (P19.4): unlogged, inserted before a record's match where the model enables it (_refills)
        self.refill_actions = tuple(a for a in self.actions if a.name == "KeeperRefill")
        self.silent_faults = any(a.name.startswith("Fault") for a in self.silent)
        self.prechecks = prechecks and cfg.mutant is None
        # (RankArrive | RankReady, generation) whose records are ordered by the store's counter: each
        # reports its count, all distinct, and no write can be lost (see _ALONE_UNLESS)
        drops = any(rec.action == "FaultDrop" for v in self.recs.values() for rec in v) or \
            any(self._silent_possible("FaultDrop", r) for r in self.world)
        counts: dict[tuple[str, int, int], int] = {}
        for v in self.recs.values():
            for rec in v:
                c = rec.detail.get("count")
                if rec.action in _COUNTED and isinstance(c, int):
                    counts[(rec.action, rec.gen, c)] = counts.get((rec.action, rec.gen, c), 0) + 1
        #: (action, generation, count) of the adds no other record of that generation reports the
        #: count of: with no write lost, such a record matches only after exactly count - 1 adds
        self.ordered = frozenset() if drops or cfg.mutant is not None else frozenset(k for k, n in counts.items() if n == 1)
        #: per generation, the groups whose members' records name the next generation's communicator (a
        #: RankReplace or RankRebind: they rebuilt it, so their group failed), each with the points its
        #: members' RankObserve records of that generation name: the silent group failures the search
        #: tries first (:meth:`Search._silent`)
        rebuilt: dict[int, dict[int, set[str]]] = {}
        for r in self.world:
            for rec in self.recs[r]:
                comm = rec.state.get("comm")
                if rec.action in ("RankReplace", "RankRebind") and isinstance(comm, str) and comm_generation(comm) == rec.gen + 1:
                    rebuilt.setdefault(rec.gen, {}).setdefault(cfg.group_of(r), set())
        for r in self.world:
            for rec in self.recs[r]:
                seen = rebuilt.get(rec.gen, {}).get(cfg.group_of(r))
                if rec.action == "RankObserve" and seen is not None and isinstance(rec.state.get("point"), str):
                    seen.add(rec.state["point"])
        self.rebuilt = {g: {gi: frozenset(ps) for gi, ps in groups.items()} for g, groups in rebuilt.items()}

    def _silent_possible(self, name: str, r: int, cfg: Config | None = None) -> bool:
        """Whether ``name`` of rank ``r`` may be taken as a silent step (an unlogged fault) under ``cfg``
        (default: the checker's; a search's has its own fault budget)."""
        if not (cfg or self.cfg).max_faults or not any(a.name == name and a.rank in (r, None) for a in self.silent):
            return False
        return self.script is None or any(f.action == name and r in (f.rank, getattr(f, "by", None), None)
                                          for f in self.script.faults)

    @cached_property
    def events(self) -> list[tuple[int, int, int]]:
        """Every record as (key, rank, index in its rank's trace), in key order: the search's guide
        (:meth:`_guide`; built when the search first needs it, not for a rejection before it)."""
        return self._guide()

    def _guide(self) -> list[tuple[int, int, int]]:
        """Every record as (key, rank, index), sorted: the order the search tries records in.

        The key is the record's ``t_ns``, raised where the records themselves say that another
        record came before it (a Lamport clock seeded with ``t_ns``): each rank's previous record;
        the add that returned the previous count of the store's arrival / release-vote counter; the
        decision a read of it needs; every peer's RankRebind before a RankValidate.  Clocks of
        different hosts are unrelated (``t_ns`` is each host's monotonic clock), so without this a
        trace of many hosts would send the search the wrong way first.  Only a heuristic: the
        search is exhaustive, the verdict does not depend on it."""
        recs = self.recs
        after: dict[tuple[int, int], list[tuple[int, int]]] = {}
        by: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for r in self.world:
            for i, rec in enumerate(recs[r]):
                by.setdefault((rec.action, rec.gen), []).append((r, i))

        def edge(a: tuple[int, int], b: tuple[int, int]) -> None:
            after.setdefault(a, []).append(b)

        for (name, g), xs in by.items():
            if name in _COUNTED:
                counted = sorted((c, x) for x in xs for c in (recs[x[0]][x[1]].detail.get("count"),) if isinstance(c, int))
                for (_c, a), (_d, b) in zip(counted, counted[1:], strict=False):
                    edge(a, b)
            elif name in ("RankAwaitAgreement", "RankResume"):
                for d in by.get(("RankDecideAgreement" if name == "RankAwaitAgreement" else "RankDecideRelease", g), [])[:1]:
                    for x in xs:
                        edge(d, x)
            elif name == "RankValidate":
                rebinds = by.get(("RankRebind", g), [])
                for x in xs:
                    group = self.cfg.group_of(x[0])
                    for y in rebinds:
                        if self.cfg.group_of(y[0]) == group and y[0] != x[0]:
                            edge(y, x)
        key: dict[tuple[int, int], int] = {}
        indeg = {(r, i): int(i > 0) for r in self.world for i in range(len(recs[r]))}
        for bs in after.values():
            for b in bs:
                indeg[b] += 1
        ready = [(recs[r][0].t_ns, r, 0) for r in self.world if recs[r] and indeg[(r, 0)] == 0]
        heapq.heapify(ready)
        low: dict[tuple[int, int], int] = {}
        while ready:
            k, r, i = heapq.heappop(ready)
            key[(r, i)] = k
            nxt = after.get((r, i), [])
            if i + 1 < len(recs[r]):
                nxt = nxt + [(r, i + 1)]
            for b in nxt:
                low[b] = max(low.get(b, 0), k + 1)
                indeg[b] -= 1
                if indeg[b] == 0:
                    heapq.heappush(ready, (max(recs[b[0]][b[1]].t_ns, low[b]), b[0], b[1]))
        # a cycle (records that contradict each other): those keep their t_ns
        return sorted((key.get((r, i), rec.t_ns), r, i) for r in self.world for i, rec in enumerate(recs[r]))

    # -- successors --------------------------------------------------------------------

    def _claimed_already(self, s: State, r: int, rec: Record, cursors: tuple[int, ...]) -> bool:
        """A ``RankClaimSpare`` record whose identities (``detail.claims``' keys) the model's one
        ``RankClaimSpare`` of the rank's generation has claimed already, by a rank that could have made
        it (alive, in that generation, at a pc the action starts from).  The engine claims each dead
        (or vacant) identity by its own compare_set and records the claims it won (impl/effects.py
        ``_claim_spares``), so concurrent detectors may each win some (a real 2x2 HSDP grow: rank 2 the
        benched holder of identity 0, rank 3 a spare for identity 1); the model claims them all in one
        step (P16).  The record then stands for no step, as a second member's record of one group
        failure does.  Each identity is won by one compare_set, so by one record: a record naming an
        identity that a record already matched (``cursors``: every rank's records consumed so far) named
        too is two claims of one identity (the seeded bug ``claim-per-survivor``), never a share."""
        claims = rec.detail.get("claims")
        ids = _claim_ids(claims) if isinstance(claims, dict) else None
        if not ids:
            return False
        rk = s.ranks[r]
        g = rk.gen
        if rec.gen != g or rk.hung or rk.pc not in (ACTIONS["RankClaimSpare"].pcs or ()):
            return False
        if not ids <= {d for gg, d, _inc in s.store.claims if gg == g}:
            return False
        named = set()
        for q, c in zip(self.world, cursors, strict=True):
            for prev in self.recs[q][:c]:
                if prev.action == "RankClaimSpare" and prev.gen == g and isinstance(prev.detail.get("claims"), dict):
                    named |= _claim_ids(prev.detail["claims"]) or set()
        return not ids & named

    def _done(self, node: Node) -> str | None:
        """None when every trace is consumed and each rank's end agrees with the model."""
        for r in self.world:
            if node.cursors[r] != len(self.recs[r]):
                return f"rank {r} has unconsumed records"
        s = node.state
        # the supervisor's teardown (torchrun's agent stops every worker of the attempt once one of them
        # died or exited, whether it restarts the job or not): a survivor it killed writes no end record,
        # wherever the protocol had it (T4); the records before still had to match the model.  Not in an
        # attempt some rank finished ('released', 'left'): that one ended by itself, no teardown came
        torn = any(rk.pc in (PC_CRASHED, PC_EXITED) for rk in s.ranks) and not any(
            (self.traces[q].end or {}).get("outcome") in ("released", "left") for q in self.world)
        for r in self.world:
            rk = s.ranks[r]
            end = self.traces[r].end
            if end is None:
                # Every exit path writes the end record (exitcodes.exit_now, Pact.close); only a
                # signal leaves none: the rank's own SIGKILL (crashed), or torchrun killing a worker
                # that the protocol had not ended (hung or crashed: no exit reason) for its restart.
                if not (rk.pc == PC_CRASHED or (s.supervisor and not rk.reason) or (torn and not rk.reason)):
                    return (f"rank {r}'s trace stops without an end record while the model has it {rk.pc} "
                            "(only a rank killed by a signal may lack one: its own death, or the supervisor's teardown "
                            "once a peer died or exited; truncated?)")
                continue
            out = end.get("outcome")
            if out == "left":  # its replica left (P19.3): it idled as a spare until the job ended
                if rk.pc != PC_LEFT:
                    return f"rank {r} ends 'left' but the model has it {rk.pc} (only a rank whose replica left idles as a spare)"
                continue
            if out == "released" and not (rk.pc == PC_TRAIN and not rk.hung):
                return f"rank {r} ends 'released' but the model has it {rk.pc}"
            if out == "exited" and rk.pc not in (PC_EXITED,) and not s.supervisor:
                return f"rank {r} ends 'exited' but the model has it {rk.pc}"
            if out == "exited" and s.supervisor and rk.reason == "" and rk.pc != PC_EXITED:
                return f"rank {r} ends 'exited' but the model never ended it"
        return None

    def _left(self, lo: tuple[int, ...], hi: tuple[int, ...]) -> tuple[int, ...]:
        """How many records of each class of :data:`CLASSES` lie between cursors ``lo`` and ``hi``."""
        left = [0] * len(CLASSES)
        for r in self.world:
            for k in self.cls[r][lo[r]:hi[r]]:
                if k >= 0:
                    left[k] += 1
        return tuple(left)

    def check(self) -> Verdict:
        asked = requested_shrinks(self.traces)
        if asked:
            return requested_shrink_verdict(asked)
        if self.prechecks:
            findings = precheck(self.cfg, self.traces, silent_possible=self._silent_possible)
            if findings:
                return self._refute(findings)
        if self.episodes:
            cuts = episode_cuts(self.recs)
            if cuts:
                return self._check_episodes(cuts)
        zero = tuple(0 for _ in self.world)
        start = Node(initial_state(self.cfg), zero, frozenset(), 0, left=self._left(zero, tuple(len(self.recs[r]) for r in self.world)))
        search = Search(self, self.cfg, self.events, self.total, self.max_nodes)
        hit = next(search.run([start]), None)
        if hit is not None:
            return Verdict(True, f"accepted: {hit.done} records of {len(self.world)} ranks match the model",
                           len(search.parent), self._path(search.parent, hit))
        v = self._reject(search)
        best = search.best[0]
        v.gen = min((self.recs[r][best.cursors[r]].gen for r in self.world if best.cursors[r] < len(self.recs[r])),
                    default=None)
        return v

    def _check_episodes(self, cuts: list["Cut"]) -> Verdict:
        """The search of a run told nothing, episode by episode (spec/trace-checking.md, "Episodes").

        Generation g's records (an episode: from its observation to every live rank's resume or
        exit) are searched (:class:`EpisodeSearch`) from every state the search of the records before
        them ended in, and end in the states the next episode starts from: a run of E episodes costs
        E searches of one episode each, not one search of their product.  The searches are chained
        lazily: an episode's search starts from the first state the one before ends in, as soon as
        it is found, and asks for the next only when it cannot accept from those it has (an honest
        run is one walk per episode; a rejection still searches every episode from every state).
        Each episode has its own budget of faults (:func:`episode_budget`; the model state's count
        starts again at 0), inferred from its own records.  A path the chained searches accept is a
        path of the model (its episodes' paths concatenated, with the sum of their budgets); that
        every path of the model that matches the records can be so cut is the lemma in the spec (a
        rank's steps of generation g never depend on a peer's of a later generation)."""
        zero = tuple(0 for _ in self.world)
        s0 = initial_state(self.cfg)
        #: per episode: the nodes it starts from (drawn from the episode before as that one finds
        #: them), and the model path to each one's state (for the verdict)
        sources: list[_Replay] = [_Replay(iter([Node(s0, zero, frozenset(), 0)]))]
        paths: list[dict[State, list[str]]] = [{s0: []}]
        #: one fault more for an episode whose successor needs a fault struck inside it (the store's
        #: loss, which strikes only while an episode runs, met by a later generation's records: the
        #: one fault that does not commute past the cut, spec/trace-checking.md "Episodes")
        extra = [0] * len(cuts)
        chain: list[EpisodeSearch] = []
        spent: list[EpisodeSearch] = []  # every episode search made, for the node count
        k = 0
        while True:
            del chain[k:], sources[k + 1:], paths[k + 1:]
            for i in range(k, len(cuts)):
                ep = EpisodeSearch(self, i, cuts, sources[i], extra[i])
                chain.append(ep)
                spent.append(ep)
                if i + 1 < len(cuts):
                    paths.append({})
                    sources.append(_Replay(self._following(ep, paths[i], paths[i + 1])))
            hit = next(chain[-1].ends(), None)
            nodes = sum(len(s.parent) for ep in spent for s in ep.searches)
            if _TRACE_EPISODES:
                print(f"  {'accepted' if hit is not None else 'not accepted'}; every search so far:")
                for ep in spent:
                    for s in ep.searches:
                        print(f"    {ep.cut.name}: budget {s.cfg.max_faults}, {s.starts} start(s), {len(s.parent)} nodes, "
                              f"{s.ends} end(s)")
            if hit is not None:
                search = chain[-1].searches[-1]
                return Verdict(True, f"accepted: {hit.done} records of {len(self.world)} ranks match the model "
                                     f"(generation by generation: {len(cuts)} searches)", nodes,
                               self._whole(search.parent, hit, paths[-1]))
            # the episode that failed: the first whose searches found no end, from every state the one before ended in
            i = next((j for j, ep in enumerate(chain) if ep.used is None), len(chain) - 1)
            ep = chain[i]
            if i > 0 and not extra[i - 1] and any(self.recs[e[1]][e[2]].action == "RankLoseStore" for e in ep.events):
                # the store's loss strikes only while an episode runs (FaultStoreLoss): a rank that meets
                # it in this generation may have met one struck in the episode before, while it was
                # still in that one's last steps
                before = chain[i - 1]
                assert before.used is not None  # it found the ends episode i started from
                extra[i - 1] = before.used + 1 - cuts[i - 1].budget
                k = i - 1
                continue
            first = ep.searches[0]
            v = self._reject(first)
            lines = v.message.splitlines()
            lines[0] += (f" (in {ep.cut.name}, episode {i + 1} of {len(cuts)}, searched from {len(sources[i].items)} state(s) "
                         f"with {ep.low} to {ep.low + len(ep.searches) - 1} fault(s) of its own; shown: with {ep.low})")
            return Verdict(False, "\n".join(lines), nodes, self._whole(first.parent, first.best[0], paths[i]), v.unmatched,
                           gen=ep.cut.gen)

    def _following(self, ep: "EpisodeSearch", before: Mapping[State, list[str]], after: dict[State, list[str]]) -> Iterator[Node]:
        """The nodes the episode after ``ep`` starts from, drawn as ``ep`` finds them: each distinct state
        ``ep`` ends in, the finished episodes' facts that no step reads forgotten (model/forget.py), its
        fault count at 0.  ``after`` collects the model path to each (``before``: to ``ep``'s starts)."""
        for n in ep.ends():
            st = forget_past(self.cfg, n.state).with_(faults=0)
            if st not in after:
                after[st] = self._whole(ep.searches[-1].parent, n, before)
                yield Node(st, n.cursors, n.fired, 0, done=n.done)

    def _refute(self, findings: list[Finding]) -> Verdict:
        """A rejection by :func:`~accelpact.conformance.checker_precheck.precheck` (no search)."""
        lines = ["rejected: no interleaving of the traces is a behaviour of the model (found before the search: "
                 "a rank's records are not a path of its local steps, or what the store orders is inconsistent)"]
        lines += [f.line(self.traces[f.rank].end) for f in findings[:16]]
        if len(findings) > 16:
            lines.append(f"  ... and {len(findings) - 16} more")
        unmatched: dict[int, str] = {}
        for f in findings:
            if f.record is not None:
                unmatched.setdefault(f.rank, str(f.record))
        gens = [f.record.gen for f in findings if f.record is not None]
        return Verdict(False, "\n".join(lines), 0, [], unmatched, gen=min(gens) if gens else None)

    def _whole(self, parent, node, before: Mapping[State, list[str]]) -> list[str]:
        """The model path to ``node`` from the run's start: the path to its episode's start state
        (``before``), then :meth:`_path`."""
        root = node
        while parent[root][0] is not None:
            root = parent[root][0]
        return list(before.get(root.state, [])) + self._path(parent, node)

    def _path(self, parent, node) -> list[str]:
        out = []
        while node is not None:
            prev, label = parent[node]
            if label:
                out.append(label)
            node = prev
        return out[::-1]

    def _reject(self, search: "Search") -> Verdict:
        """The diagnostics of a rejection, read off the furthest nodes of ``search``."""
        parent, best, done_problem = search.parent, search.best, search.done_problem
        node = best[0]
        if search.exhausted:
            lines = [f"rejected: search budget of {search.limit} nodes exhausted (raise max_nodes; furthest progress "
                     f"{node.done} records)"]
        else:
            lines = ["rejected: no interleaving of the traces is a behaviour of the model"]
        if done_problem:
            lines.append(f"  all records matched, but at the end: {done_problem}")
        small = len(self.world) <= 16
        reasons: dict[tuple[int, int], str] = {}
        for b in best if small else best[:1]:
            for r in self.world:
                if b.cursors[r] < len(self.recs[r]):
                    for a, _t, why in search._match(b, r):
                        if why is not None:
                            reasons.setdefault((r, b.cursors[r]), f"{a}: {why}")
        unmatched = {}
        lines.append(f"  furthest match: {node.done} of {self.total} records")
        rows = []
        for r in self.world:
            c = node.cursors[r]
            if c < len(self.recs[r]):
                rec = self.recs[r][c]
                why = reasons.get((r, c), "no model action of that name is enabled for the rank there")
                unmatched[r] = str(rec)
                rows.append(((r, c) not in reasons, r, f"  rank {r}: first unmatched {rec}  -- {why}"))
            elif small:
                rows.append((False, r, f"  rank {r}: consumed ({len(self.recs[r])} records)"))
        if not small:  # large worlds: at most 16 lines, the records the guide puts first
            order = {(r, i): n for n, (_k, r, i) in enumerate(self.events)}
            rows.sort(key=lambda row: order.get((row[1], node.cursors[row[1]]), 0))
        lines += [row for _k, _r, row in rows[:16 if not small else None]]
        if not small and len(rows) > 16:
            lines.append(f"  ... and {len(rows) - 16} more ranks with unmatched records")
        lines.append("  model states it could have been in:")
        for b in best[:4 if small else 1]:
            if small:
                pcs = " ".join(f"r{i}:{rk.pc}/g{rk.gen}{'/hung' if rk.hung else ''}{'/raised' if rk.raised else ''}"
                               for i, rk in enumerate(b.state.ranks))
            else:
                tally: dict[str, int] = {}
                for rk in b.state.ranks:
                    k = f"{rk.pc}/g{rk.gen}{'/hung' if rk.hung else ''}{'/raised' if rk.raised else ''}"
                    tally[k] = tally.get(k, 0) + 1
                pcs = " ".join(f"{k} x{n}" for k, n in sorted(tally.items()))
            allowed = [str(a) for a in self.actions if enabled(search.cfg, b.state, a)]
            shown = ", ".join(allowed[:40]) + (f" and {len(allowed) - 40} more" if len(allowed) > 40 else "")
            lines.append(f"    {pcs} abort={b.state.store.abort or '-'}; model allows: {shown or 'nothing'}")
        path = self._path(parent, node)
        shown_path = path if len(path) <= 200 else path[:50] + [f"... {len(path) - 100} steps ..."] + path[-50:]
        lines.append("  model path to the furthest match: " + (" -> ".join(shown_path) or "(initial state)"))
        return Verdict(False, "\n".join(lines), len(parent), path, unmatched)


class Search:
    """One depth-first search, memoised, over a stretch of a run's records (spec/trace-checking.md,
    "The search"): ``events``, the records it consumes in the guide's order (the whole run's, or one
    episode's), under ``cfg`` (the checker's configuration, or an episode's with its own fault budget),
    from the start nodes :meth:`run` is given, sharing one memo (``parent``), at most ``limit`` nodes.
    ``cut``: a node that consumed ``target`` records is an end of the stretch (an episode's: the next
    one starts from it) and is not expanded; else it is accepted when every rank's end agrees with the
    model (:meth:`TraceChecker._done`).  What it reads of the records is the checker's
    (:class:`TraceChecker`)."""

    def __init__(self, checker: TraceChecker, cfg: Config, events: list[tuple[int, int, int]], target: int,
                 limit: int, *, cut: bool = False) -> None:
        self.ck = checker
        self.cfg = cfg
        self.events = events
        self.target = target
        self.limit = limit
        self.cut = cut
        # the checker's, read at every node
        self.recs, self.cls, self.world, self.script, self.abst = checker.recs, checker.cls, checker.world, checker.script, checker.abst
        self.by_rank, self.silent, self.silent_bound, self.ordered = checker.by_rank, checker.silent, checker.silent_bound, checker.ordered
        self.refill_actions, self.silent_faults = checker.refill_actions, checker.silent_faults
        #: the search's state: parent links (the memo), the furthest nodes, why the furthest complete
        #: node was not accepted, whether ``limit`` ran out; start nodes and ends met (for the record)
        self.parent: dict[Node, tuple[Node | None, str]] = {}
        self.best: list[Node] = []
        self.done_problem: str | None = None
        self.exhausted = False
        self.starts = 0
        self.ends = 0

    def _silent_possible(self, name: str, r: int) -> bool:
        """Whether ``name`` of rank ``r`` may be taken as a silent step under this search's budget."""
        return self.ck._silent_possible(name, r, self.cfg)

    def _script_ok(self, node: Node, a: Action) -> tuple[bool, frozenset[int]]:
        if not a.name.startswith("Fault") or self.script is None:
            return True, node.fired
        i = self.script.allowed(node.state, a, node.fired)
        return (i is not None), (node.fired | {i} if i is not None else node.fired)

    def _match(self, node: Node, r: int):
        """Successors that consume rank r's next record."""
        c = node.cursors[r]
        rec = self.recs[r][c]
        cursors = node.cursors[:r] + (c + 1,) + node.cursors[r + 1:]
        done, k, left = node.done + 1, self.cls[r][c], node.left
        if k >= 0:
            left = left[:k] + (left[k] - 1,) + left[k + 1:]
        s = node.state
        if rec.action == "FaultGroupFail":
            point = rec.detail.get("point")
            f = s.store.failed
            group = self.cfg.group_of(r)
            if (f is not None and f[0] == s.ranks[r].gen and (point is None or f[1] in surfaces(point))
                    and (self.cfg.failing == "one" or group in f[2])):
                # a second member logging the same group failure: no model step
                yield None, Node(s, cursors, node.fired, 0, done=done, left=left), None
                return
            # failing="one": the one group's failure; "any": the failure of the logging rank's group,
            # acted by that group's representative
            actor = None if self.cfg.failing == "one" else self.cfg.members(group)[0]
            cands = [Action("FaultGroupFail", actor, p) for p in self.cfg.points if point is None or p in surfaces(point)]
        elif rec.action == "FaultLinkCut":
            # logged by one end of the link (the model's actor, the lower rank), naming the other end
            point, peer = rec.detail.get("point"), rec.detail.get("peer")
            cands = [a for a in self.by_rank.get((rec.action, r), []) if a.arg is not None
                     and (peer is None or link_arg(a.arg)[0] == peer) and (point is None or link_arg(a.arg)[1] in surfaces(point))]
        elif rec.action in JOB_WIDE:
            # a job-wide fault (FaultStoreLoss) logged by the rank that triggered it: no actor
            cands = [Action(rec.action)]
        elif rec.action == "RankClaimSpare" and self.ck._claimed_already(s, r, rec, node.cursors):
            yield (NoStep(f"(r{r} records its share of generation {rec.gen}'s claims, all made by the model's RankClaimSpare)"),
                   Node(s, cursors, node.fired, 0, done=done, left=left), None)
            return
        else:
            cands = self.by_rank.get((rec.action, r), [])
        table = actions_for(self.cfg)
        plans: list[tuple[Action, ...]] = [(a,) for a in cands]
        if rec.action == "RankStartGrow" and self.cfg.shrink:
            # the engine's record of a grow: the opener's RankStartGrow and its observation, or the
            # observation alone of a rank that found the grow open in its generation (Steps)
            observe = Action("RankObserve", r, "boundary")
            plans.append((Action("RankStartGrow", r), observe))
            if any(gg == s.ranks[r].gen for gg, _i in s.store.grown):
                plans.append((observe,))
        for pre_steps, s0 in self._refills(s):
            for plan in plans:
                t, ok, fired = s0, True, node.fired
                for a in plan:
                    spec = table[a.name]
                    if not spec.enabled(self.cfg, t, a.rank, a.arg):
                        ok = False
                        break
                    if self.script is not None and a.name.startswith("Fault"):
                        i = self.script.allowed(t, a, fired)
                        if i is None:
                            ok = False
                            break
                        fired = fired | {i}
                    t = spec.step(self.cfg, t, a.rank, a.arg)
                if not ok:
                    continue
                a = plan[-1]
                if a.name == "FaultGroupFail":
                    why = None if rec.gen == s.ranks[r].gen else f"record gen {rec.gen} but the rank was in {s.ranks[r].gen}"
                else:
                    why = disagreement(self.cfg, self.abst, s, a, t, rec)
                label = a if len(plan) == 1 and not pre_steps else Steps(pre_steps + plan)
                yield label, Node(t, cursors, fired, 0, done=done, left=left), why

    def _refills(self, s: State) -> list[tuple[tuple[Action, ...], State]]:
        """The states a record may be matched from: ``s`` itself, and ``s`` after 1..n of the n
        ``KeeperRefill`` steps the model enables there (P19.4: a keeper starts a fresh spare for its dead
        worker, once per dead process; keepers write no trace).  A refill only adds a spare to the pool
        (``Store.spares``, history ``pooled``), commutes with every other step and is never disabled but
        by the job's end (its abort, the store's loss), after which nothing reads the pool: every
        accepting path can be reordered to take each refill just before the next step it enables or
        changes, i.e. as a prefix of a record's match.  Refills of different dead processes differ only
        in which one's refill is spent, so the first k (in the model's action order) stand for any k:
        n + 1 variants, not 2^n."""
        out: list[tuple[tuple[Action, ...], State]] = [((), s)]
        if not self.refill_actions:
            return out
        table = actions_for(self.cfg)
        spec = table["KeeperRefill"]
        pending = [a for a in self.refill_actions if spec.enabled(self.cfg, s, a.rank, a.arg)]
        t, taken = s, cast("tuple[Action, ...]", ())
        for a in pending:
            if not spec.enabled(self.cfg, t, a.rank, a.arg):
                continue
            t = spec.step(self.cfg, t, a.rank, a.arg)
            taken = taken + (a,)
            out.append((taken, t))
        return out

    def _silent(self, node: Node):
        if node.silent >= self.silent_bound:
            return
        # first the crash of a rank the records say died in its generation: a peer's RankObserve names it
        # dead (``detail.dead``), a spare joined as it, or its trace stops without an end record (a
        # SIGKILL from outside, unlogged).  Only an order (the search is exhaustive), but without it the search tried every
        # other silent fault first: real runs told nothing, a 2x2 HSDP shrink took 96,526 nodes (27 now),
        # three swaps with refills 144,457.  Then the failure of a group whose members' records name a
        # rebuilt communicator in that generation, at a point they observed (TraceChecker.rebuilt): told
        # nothing, a 64-rank run otherwise walked an episode under each other group's failure first
        s = node.state
        steps = sorted(successors(self.cfg, s, self.silent), key=lambda at: self._silent_order(at[0], s))
        for a, t in steps:
            ok, fired = self._script_ok(node, a)
            if ok:
                yield a, Node(t, node.cursors, fired, node.silent + 1, done=node.done, left=node.left)

    def _silent_order(self, a: Action, s: State) -> tuple[bool, bool, bool]:
        """The order :meth:`_silent` tries a silent step in (False first): the crash of a rank the records
        say died; the failure of a group the records say rebuilt its communicator, at a point its members
        observed; every other step, in the model's order."""
        ck = self.ck
        if a.name == "FaultCrash" and a.rank is not None:
            return (not (a.rank in ck.killed or a.rank in ck.named_dead.get(s.ranks[a.rank].gen, ())), True, True)
        if a.name == "FaultGroupFail" and ck.rebuilt:
            g = s.ranks[a.rank].gen if a.rank is not None else max(rk.gen for rk in s.ranks)
            points = ck.rebuilt.get(g, {}).get(self.cfg.group_of(a.rank if a.rank is not None else self.cfg.affected[0]))
            return (True, points is None, points is None or a.arg not in points)
        return (True, True, True)

    def _safe(self, node: Node, r: int, quiet: bool) -> bool:
        """Rank r's next record is of a step that commutes with every step that can still happen
        (:data:`_LOCAL`, :data:`_ALONE_UNLESS`); a member's RankObserve is decided per match
        (:meth:`_alone`)."""
        rec = self.recs[r][node.cursors[r]]
        name = rec.action
        if name in _LOCAL or (name == "RankObserve" and _inside_episode(node.state, r)
                              and not _in_failed_group(self.cfg, node.state, r)):
            if name == "RankGuard" and not quiet and self._silent_possible("FaultCorrupt", r):
                return False  # the guard ends the window of the rank's own silent FaultCorrupt
            return name != "RankResume" or resume_alone(self.cfg, node.state, r)
        unless = _ALONE_UNLESS.get(name)
        if name == "RankArrive" and self.cfg.shrink:
            # P19.1: with a shrink a death joins its episode only before anyone arrived: an arrival
            # disables a logged FaultCrash still to come (an ``other`` record)
            unless = (_OTHER,)
        if not quiet or unless is None or any(node.left[k] for k in unless):
            return False
        return name not in _COUNTED or (name, rec.gen, rec.detail.get("count")) in self.ordered

    def _quiet(self, node: Node) -> bool:
        """No fault can happen silently any more (so no silent step but the supervisor's restart,
        which no active rank's step is enabled with: moving a step never lengthens a silent run)."""
        if self.cfg.mutant is not None:
            return False
        s = node.state
        return not self.silent_faults or s.faults >= self.cfg.max_faults or bool(s.supervisor)

    def _alone(self, node: Node, r: int, matches: list) -> bool:
        """Whether the matches of rank r's (safe) next record may be taken alone: a member's
        RankObserve only at the point where the failure struck (:data:`_ALONE_UNLESS`)."""
        if self.recs[r][node.cursors[r]].action != "RankObserve" or not _in_failed_group(self.cfg, node.state, r):
            return True
        f = node.state.store.failed
        return f is not None and all(a is not None and a.arg in (None, f[1]) for a, _t in matches)

    def _frontier(self, node: Node):
        """Each rank's next record, in the guide's order (:meth:`_guide`), read off the ordered list
        of all records from the node's hint on (amortised O(1) a node on the honest path, not O(|W|))."""
        cur = node.cursors
        pos = node.pos
        events = self.events
        while pos < len(events) and cur[events[pos][1]] > events[pos][2]:
            pos += 1  # consumed: the next node may start after it
        for i in range(pos, len(events)):
            _ts, r, idx = events[i]
            if cur[r] == idx:
                yield pos, r

    @staticmethod
    def _label(a: Action | None, r: int) -> str:
        return str(a) if a else f"(r{r} logs the group failure again)"

    def _successors(self, node: Node):
        """The successors of ``node``, records in the guide's order, computed as the search asks
        for them: on the honest path the search takes the first one, so a node costs one model step
        instead of one per rank (what makes 1,024-rank traces affordable).

        Partial-order reduction: if some frontier record is *safe* (:meth:`_safe`: its step
        commutes with every step that can still happen, and a step that disables it disables it
        for good) and matches, its matches are the only successors (a persistent set).  Every
        accepting path consumes that record by one of them; moving that step to the front keeps
        the path's end, so no accepting path is lost.  Once no fault can strike any more, every
        record of a repair or an abort is safe where it matches: the search is a single walk, and a
        rejection costs one pass over the records, not one per interleaving."""
        quiet = self._quiet(node)
        frontier = self._frontier(node)
        deferred: list[tuple[int, int]] = []
        for pos, r in frontier:
            if self._safe(node, r, quiet):
                matches = [(a, t) for a, t, why in self._match(node, r) if why is None]
                if matches and self._alone(node, r, matches):
                    for a, t in matches:
                        yield Node(t.state, t.cursors, t.fired, t.silent, pos, t.done, t.left), self._label(a, r)
                    return
                if not matches:
                    continue  # not a successor here
            deferred.append((pos, r))
            if len(deferred) >= LOOKAHEAD:
                break
        for pos, r in deferred:
            for a, t, why in self._match(node, r):
                if why is None:
                    yield Node(t.state, t.cursors, t.fired, t.silent, pos, t.done, t.left), self._label(a, r)
        for pos, r in frontier:  # past the lookahead: every match, no reduction
            for a, t, why in self._match(node, r):
                if why is None:
                    yield Node(t.state, t.cursors, t.fired, t.silent, pos, t.done, t.left), self._label(a, r)
        for a, t in self._silent(node):
            yield Node(t.state, t.cursors, t.fired, t.silent, node.pos, t.done, t.left), f"silent {a}"

    def run(self, starts: Iterable[Node]) -> Iterator[Node]:
        """Depth-first search that tries records in the guide's order first, from each start node in
        turn (an episode's: drawn as the episode before finds them), sharing the memo; yields each end
        of the stretch (``cut``), or the accepting node and stops.

        The order is only a heuristic for speed: the search is exhaustive (memoised), so the verdict
        does not depend on timestamps; with honest timestamps it walks straight to the end.  It stops
        when ``limit`` nodes are met (``exhausted``); the caller reads the furthest nodes
        (``best``) and why the furthest complete node was not accepted (``done_problem``) off the
        search for a rejection's diagnostics."""
        parent, target, limit = self.parent, self.target, self.limit
        for start in starts:
            self.starts += 1
            if not self.best:
                self.best = [start]
            if start in parent:
                continue
            parent[start] = (None, "")
            stack = [(start, self._successors(start))]
            while stack:
                node, succ = stack[-1]
                if node.done == target:
                    if self.cut:
                        stack.pop()
                        self.ends += 1
                        yield node
                        continue
                    problem = self.ck._done(node)
                    if problem is None:
                        self.ends += 1
                        yield node
                        return
                    self.done_problem = self.done_problem or problem
                for t, label in succ:
                    if t not in parent:
                        if len(parent) >= limit:
                            self.exhausted = True
                            return
                        parent[t] = (node, label)
                        best = self.best
                        if t.done > best[0].done:
                            self.best = [t]
                        elif t.done == best[0].done and len(best) < 8:
                            best.append(t)
                        stack.append((t, self._successors(t)))
                        break
                else:
                    stack.pop()


class EpisodeSearch:
    """The search of one episode (spec/trace-checking.md, "Episodes"): generation ``cuts[index].gen``'s
    records, from the nodes ``starts`` holds (the states the episode before ended in, or the initial
    state), under the checker's configuration with the episode's own budget of faults.  The fewest
    faults its records need first (:func:`episode_budget`, plus ``extra``); one and then two more only
    where those find no end, never more than the whole run's budget, each deeper :class:`Search` with
    a quarter of the nodes (more faults, and so fewer steps taken alone: the exception).  ``used``: the
    budget its ends were found with, None while none was."""

    def __init__(self, checker: TraceChecker, index: int, cuts: list["Cut"], starts: "_Replay", extra: int = 0) -> None:
        self.ck = checker
        self.cut = cuts[index]
        self.last = index == len(cuts) - 1
        prev = cuts[index - 1].cursors if index else tuple(0 for _ in checker.world)
        #: the episode's records in the guide's order, and how many of each class
        self.events = [e for e in checker.events if prev[e[1]] <= e[2] < self.cut.cursors[e[1]]]
        self.left = checker._left(prev, self.cut.cursors)
        self.starts = starts
        self.low = self.cut.budget + extra
        self.searches: list[Search] = []
        self.used: int | None = None

    def ends(self) -> Iterator[Node]:
        """Each node the episode's search ends in (every record of the episode and before consumed), as
        it finds it; for the run's last episode, the accepting node (and no more)."""
        ck = self.ck
        low, most = self.low, ck.cfg.max_faults
        for budget in range(low, max(low + 1, min(low + 2, most)) + 1):
            search = Search(ck, ck.cfg.with_(max_faults=budget), self.events, sum(self.cut.cursors),
                            ck.max_nodes if not self.searches else ck.max_nodes // 4, cut=not self.last)
            self.searches.append(search)
            left = self.left
            for node in search.run(Node(n.state, n.cursors, n.fired, n.silent, n.pos, n.done, left) for n in self.starts):
                self.used = budget
                yield node
            if self.used is not None:
                return


class _Replay:
    """The items of an iterator, drawn once and kept: each pass over it yields those drawn so far, then
    draws more (an episode's start nodes, for each of its searches)."""

    def __init__(self, items: Iterator[Node]) -> None:
        self.items: list[Node] = []
        self._more: Iterator[Node] | None = items

    def __iter__(self) -> Iterator[Node]:
        i = 0
        while True:
            if i < len(self.items):
                yield self.items[i]
                i += 1
                continue
            if self._more is None:
                return
            try:
                self.items.append(next(self._more))
            except StopIteration:
                self._more = None
                return


@dataclass(frozen=True)
class Cut:
    """Where an episode's records end (:func:`episode_cuts`): every rank's cursor past its records of
    generation ``gen`` and before, and the episode's budget of faults (:func:`episode_budget`)."""

    gen: int
    cursors: tuple[int, ...]
    budget: int

    @property
    def name(self) -> str:
        return f"generation {self.gen}"


#: print each episode's searches (budget, start nodes, nodes, ends) while diagnosing a slow check
_TRACE_EPISODES = False


def episode_cuts(recs: Mapping[int, list[Record]]) -> list[Cut] | None:
    """The run cut at its episodes: one :class:`Cut` per generation some record names, in order
    (spec/trace-checking.md, "Episodes"); None when a rank's records go back to an earlier
    generation (no such cut exists: the whole run is searched at once, and rejected there)."""
    ranks = sorted(recs)
    for r in ranks:
        gens = [rec.gen for rec in recs[r]]
        if any(b < a for a, b in zip(gens, gens[1:], strict=False)):
            return None
    gens = sorted({rec.gen for r in ranks for rec in recs[r]})
    if not gens:
        return None
    out = []
    for g in gens:
        cursors = tuple(sum(1 for rec in recs[r] if rec.gen <= g) for r in ranks)
        out.append(Cut(g, cursors, episode_budget(recs, g)))
    return out


def episode_budget(recs: Mapping[int, list[Record]], g: int) -> int:
    """The faults generation ``g``'s episode may have met, logged or not (a run told nothing): its
    logged ``Fault*`` records; one unlogged fault that started it when none is logged and no grow
    opened it (a SIGKILL, a SIGSTOP, a cut from outside).  The search allows one more where the
    episode's records need it (:meth:`TraceChecker._check_episodes`: a death in training without a
    spare is, to the model, the crash and the group failure it causes)."""
    logged = sum(1 for v in recs.values() for rec in v if rec.gen == g and rec.action.startswith("Fault"))
    started = any(rec.gen == g and rec.action == "RankObserve" for v in recs.values() for rec in v)
    grow = any(rec.gen == g and rec.action == "RankStartGrow" for v in recs.values() for rec in v)
    return logged + int(started and not logged and not grow)


#: nodes each generation's search may visit for a run told nothing (a 10-minute soak's fifteen
#: episodes took 35,783 in all: bench/README.md, "Checking a run told nothing")
TOLD_NOTHING_NODES = 200_000


def check_told_nothing(traces: Mapping[int, RankTrace], *, max_nodes: int = TOLD_NOTHING_NODES) -> Verdict:
    """The verdict on one attempt of a run nobody told the checker anything about (a user's job, a
    soak, faults from outside): the one checker ``accelpact check-trace``, the soak's judge and the
    tests call (spec/trace-checking.md, "A run told nothing").  The job's shape from the trace
    headers (:func:`config_from_headers`: the world, the spares, the contract, shrink and refill),
    any group may fail (each rank's own group is in its header; a user's job does not know in
    advance which one will), each generation's frontier read off its own records
    (:func:`abstraction_from_records`), any fault of the model unlogged where the model allows it,
    within each episode's budget, and the search cut at the episodes (:func:`episode_cuts`)."""
    cfg = config_from_headers(traces).with_(failing="any")
    return TraceChecker(cfg, traces, silent_faults=True, abstraction=abstraction_from_records(traces), episodes=True,
                        max_nodes=max_nodes).check()


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
        if a.name in ("KeeperRefill", "RankStartGrow"):
            continue  # keepers write no trace; a grow is recorded by each rank's observation of it (below)
        r = a.rank if a.rank is not None else (logger if a.name == "FaultGroupFail" else None)
        if a.name == "FaultGroupFail" and post.store.failed is not None:
            # the rank that meets the failure logs it: one already training in the failure's
            # generation (a peer may still be reading the previous release), of the failed group
            g = post.store.failed[0]
            group = cfg.members(cfg.group_of(r)) if r is not None else cfg.affected
            r = next((q for q in list(group) + list(cfg.world) if pre.ranks[q].gen == g), r)
        if r is None and a.name in JOB_WIDE:
            # a job-wide fault (no actor) is logged by the rank that triggered it: here the first
            # rank inside the episode (the model's precondition), else rank 0
            f = pre.store.failed
            r = next((q for q in cfg.world if f is not None and pre.ranks[q].gen == f[0]
                      and pre.ranks[q].pc not in (PC_EXITED, PC_CRASHED)), 0)
        if r is None:
            continue
        rk = _held(pre, post, r)
        state = {"pc": rk.pc, "gen": rk.gen, "frontier": rk.frontier, "tau": rk.tau, "point": rk.point, "reason": rk.reason}
        # as the implementation records them: a RankReplace names R's new communicator only where it
        # built one (a member of a failed group); every rank's names the groups over W it built
        if a.name == "RankRebind" or (a.name == "RankReplace" and rk.comm != pre.ranks[r].comm):
            comm = comm_name(PREFIX, rk.comm, cfg.group) if rk.comm > 0 else "original"
            state.update(comm=comm, refs_stale=_refs_stale(rk))
        if a.name == "RankReplace":
            state["wide"] = rk.wide
        g = pre.ranks[r].gen
        detail: dict[str, Any] = {}
        name = a.name
        if cfg.shrink:
            # issue 41, as the engine records it (impl/effects.py, impl/recovery.py): a resume says the
            # share and the replicas of the generation it resumes from; a shrink and a leave name the
            # replicas out; every rank records its observation of a grow as RankStartGrow
            if name == "RankResume":
                (sh,) = [x for gg, rr, x in post.shares if gg == g and rr == r]
                state.update(share=list(sh), active=list(_replicas_in(cfg, post, g)))
            elif name == "RankShrink":
                out = sorted(i for gg, i in post.store.shrunk - pre.store.shrunk if gg == g)
                detail.update(leaving=_ranks_of(cfg, out), replicas=out)
            elif name == "RankLeave":
                detail["leaving"] = _ranks_of(cfg, {i for gg, i in post.store.shrunk if gg == g})
            elif name == "RankObserve" and any(gg == g for gg, _i in post.store.grown):  # the episode of g is a grow
                grown = {i for gg, i in post.store.grown if gg == g}
                name = "RankStartGrow"
                detail["vacant"] = sorted(q for gg, q in post.store.dead if gg == g and cfg.replica_of(q) in grown)
        if a.name == "FaultGroupFail":
            detail["point"] = a.arg
            state = {}
        elif a.name == "FaultLinkCut" and a.arg is not None:
            peer, point = link_arg(a.arg)
            detail.update(point=point, peer=peer)
            state = {}
        elif a.name == "RankDecideAgreement":
            detail["decision"] = true_lookup(post.store.agree, g)
        elif a.name == "RankDecideRelease":
            detail["decision"] = true_lookup(post.store.release, g)
        elif a.name in ("RankArrive", "RankReady"):
            detail["last"] = (g, r) in (post.store.last_arriver if a.name == "RankArrive" else post.store.last_ready)
            rows = post.store.arrivals if a.name == "RankArrive" else post.store.ready
            detail["count"] = sum(1 for x in rows if x[0] == g)
        recs[r].append(Record(r, len(recs[r]), name, g, "ok", t0 + i, state, detail))
    final = path[-1][2] if path else initial_state(cfg)
    traces: dict[int, RankTrace] = {}
    for r in cfg.world:
        rk = final.ranks[r]
        header = {"type": "header", "format": TRACE_FORMAT, "rank": r, "world": len(cfg.world), "nodes": cfg.nodes,
                  "ranks_per_node": cfg.ranks_per_node, "group": cfg.group, "affected": list(cfg.affected), "attempt": 0}
        if cfg.spares:
            header["spares"] = cfg.spares
        if cfg.shrink:  # as the engine's header says a job that opted in (impl/launch/api.py)
            header.update(shrink=True, micro_batches=cfg.total_micro_batches)
        if cfg.refill and not cfg.shrink:  # the headers' inference (elastic_from_headers) may not need it
            header["refill"] = True
        end = None
        if rk.pc == PC_LEFT:
            end = {"type": "end", "outcome": "left"}
        elif rk.pc == PC_TRAIN and not rk.hung:
            end = {"type": "end", "outcome": "released"}
        elif rk.pc == PC_EXITED or (final.supervisor and rk.reason):
            end = {"type": "end", "outcome": "exited", "reason": rk.reason}
        traces[r] = RankTrace(r, recs[r], header, end)
    return traces


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
    for r in members + [r for r in world if r not in members]:
        do(Action("RankObserve", r, "boundary"))
    for name, ranks in (("RankGuard", world),
                        ("RankArrive", world), ("RankDecideAgreement", world[-1:]), ("RankAwaitAgreement", world),
                        ("RankReplace", members), ("RankRebind", members), ("RankValidate", members),
                        ("RankReplace", [r for r in world if r not in members]),
                        ("RankReady", world), ("RankDecideRelease", world[-1:]), ("RankResume", world)):
        for r in ranks:
            do(Action(name, r))
    return path


#: model steps :func:`random_run` never takes: the failures of a wait, a detector or the watchdog (each
#: ends the job, L2), besides every fault and the supervisor's restart
_UNCALM = ("RankTimeout", "RankSuspect", "RankExpire")


def random_run(cfg: Config, rng: random.Random, *, episodes: int = 1,
               faults: Iterable[Action] | None = None) -> list[tuple[Action, State, State]]:
    """A model run of ``episodes`` recoveries in a random interleaving, without a search: whenever the
    job is between episodes (a final state, no restart, every rank past the last failure's generation)
    and episodes remain, one fault of ``faults``
    (default: every ``FaultGroupFail`` instance of ``cfg``) that the model enables there, chosen at
    random; else one enabled step of a rank's protocol (no fault, no restart, none of
    :data:`_UNCALM`) of a random rank, chosen at random, until no rank has one.  With :func:`project`:
    the traces of a job of any size whose ranks' records interleave as a real run's may, for benchmarks
    (``accelpact bench told-nothing``) and tests.  ``ValueError`` when no listed fault is enabled
    between two episodes."""
    table = actions_for(cfg)
    acts = all_actions(cfg)
    pool = tuple(faults) if faults is not None else tuple(a for a in acts if a.name == "FaultGroupFail")
    mine: list[list[Action]] = [[] for _ in cfg.world]
    for a in acts:
        if a.rank is not None and table[a.name].actor == "rank" and a.name not in _UNCALM:
            mine[a.rank].append(a)
    s = initial_state(cfg)
    path: list[tuple[Action, State, State]] = []
    ranks = list(cfg.world)
    left = episodes
    while True:
        f = s.store.failed
        if left and not s.supervisor and is_final(cfg, s) and (f is None or all(rk.gen > f[0] for rk in s.ranks)):
            can = [a for a in pool if table[a.name].enabled(cfg, s, a.rank, a.arg)]
            if not can:
                raise ValueError(f"random_run: none of the faults {[str(a) for a in pool]} is enabled between episodes")
            step = [rng.choice(can)]
            left -= 1
        else:
            rng.shuffle(ranks)
            step = next(([rng.choice(en)] for r in ranks
                         for en in ([a for a in mine[r] if table[a.name].enabled(cfg, s, a.rank, a.arg)],) if en), [])
            if not step:
                return path
        a = step[0]
        t = table[a.name].step(cfg, s, a.rank, a.arg)
        path.append((a, s, t))
        s = t


def write_dir(traces: Mapping[int, RankTrace], path: str | Path, attempt: int = 0) -> None:
    run = RunDir(path)
    run.path.mkdir(parents=True, exist_ok=True)
    for r, tr in traces.items():
        lines = [json.dumps(tr.header)] + [json.dumps(rec.to_json()) for rec in tr.records]
        if tr.end is not None:
            lines.append(json.dumps(tr.end))
        run.trace(attempt, r).write_text("\n".join(lines) + "\n")
