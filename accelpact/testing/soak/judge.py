"""The soak's judge: the whole history of one soak, read back from its run folder.

What the judge reads: every attempt's traces (:func:`accelpact.impl.trace.load_traces`, a swapped
identity's incarnations joined), the result and steps files (exit codes, exit times, the step each
attempt committed and when), the injector's strikes and samples, and the fault-free reference's
final snapshots.  What it decides (each a :class:`Check`; the soak is green when every one passes):

``finished``      the job finished: the last attempt's ranks all ``finished``, the launcher's exit
                  status 0, no timeout.  A job that opted in to micro-batches (issue 41) and ended
                  shrunk: every rank of the replicas active at the end (its result's
                  ``active_replicas``) finished; the others left (benched) or died, with no grow after.
``bit_identical`` every rank's final snapshot ``torch.equal`` to the fault-free run of the same
                  steps (:func:`accelpact.impl.launch.snapshots.compare_runs`: parameters, optimizer
                  state, RNG, step, data cursor).  When the history has a shrink (issue 41), the steps
                  trained shrunk summed the same micro-batches in another order: equal to the
                  uninterrupted run only up to floating-point order.  Then a final state that is not
                  ``torch.equal`` passes when its parameters and its optimizer state are each within
                  :func:`shrink_tolerance` of the reference's (``||a - b|| / ||b||`` over all of a rank's
                  floating tensors of the kind; the bound grows with the steps trained since the first
                  shrink, :data:`SHRINK_TOLERANCE_PER_STEP`), everything else (step, cursor, RNG,
                  AdamW's step counts, shapes, keys) is equal, and every shard's replicas are
                  ``torch.equal`` to each other; the largest relative difference is reported.  Without
                  a shrink: ``torch.equal``, as before.
``traces``        every attempt's records are a behaviour of the model, as ``accelpact check-trace``
                  judges a run it was told nothing about
                  (:func:`accelpact.conformance.checker.check_told_nothing`: the job's shape from the
                  headers, any fault of the model unlogged within each episode's budget, the search
                  cut at the episodes, the pool of spares carried from one episode to the next); a
                  rejection names the attempt and the episode (generation) it is in.
``all_or_none``   in every generation every identity resumed, or none did (a job that opted in to
                  micro-batches: every identity of the replicas its ``RankResume`` records name as
                  active; an episode that took a replica out is a ``shrink``, one that brought the
                  vacant identities back a ``grow``).
``exits``         in every attempt that ended in a restart, every rank that exited by itself did so
                  with a documented code (70-73; 143: stopped by torchrun) within its bound after
                  the fault (the earliest struck at the episode, else its first record: 3 x the
                  phase deadline + 10 s, the conformance runner's O3); the slowest exit is reported
                  from the same instant, a known bug's apart.
``no_leaks``      no worker's threads, fds or listening sockets (one per gloo group) grew from its
                  first interval after a repair of its own (a spare: not the episode it joined in) to
                  its last, each interval (between two closed episodes) read at its floor: the fewest
                  of each (each thread name, each fd kind) over its samples taken before the
                  interval's first fault struck (the injector samples it again every ``RESAMPLE_S``).
                  What a process holds throughout steady training is what a leak grows; what one
                  sample shows and a later one does not is churn (a checkpoint file being written, a
                  retired engine's store connection until it is collected), and what the next fault
                  did is not steady training (a cut's sockets closed before its episode begins).  A
                  growth names the threads that grew, by kernel name (the engine's own carry theirs,
                  ``impl/threadname.py``), and the fds that grew, by kind (``live.fd_kinds``).
``straggler``     no straggler (``slow``) started an episode or was suspected.

Beside the checks, every restart (:mod:`.restarts`): its cause, from the records, the exit codes and
the faults struck at it, and the time it lost, from the last commit before the fault to the first
commit past it (the steps files' own timestamps); an L2 episode's time lost is its restart's.

Failures name the soak's seed and the episode (attempt and generation).  Torch is imported only
to compare the snapshots.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ...impl.rundir import RunDir
from ...impl.trace import RankTrace, TraceError, load_traces
from ...conformance.checker import TOLD_NOTHING_NODES, check_told_nothing
from ...conformance.checker import Verdict as Verdict_
from ...impl.launch.snapshots import compare_snapshots
# the history (episodes and their outcomes) is the launcher's, shared with `accelpact report` (issue 44)
from ...impl.launch.history import RESUMED, Episode, _replica_ranks, _results, episodes_of
from ...impl.launch.history import EXITS as EXITS, SWAP_ACTIONS as SWAP_ACTIONS, _steps as _steps
from ...impl.launch.restarts import Restart, commits, restarts
from ...impl.launch.restarts import summary as restarts_summary

__all__ = ["Check", "Episode", "Verdict", "episodes_of", "judge"]

#: exit codes a survivor of an L2 episode may end with: the documented fail-stop codes, and 143
#: (SIGTERM's 128 + 15: torchrun stopping the others once one exited; the worker's handler exits so)
ABORT_CODES = (70, 71, 72, 73)
SUPERVISOR_STOP = (143,)
#: growth tolerated from the first sample after an episode to the last (threads, fds, listening sockets)
LEAK_TOLERANCE = {"threads": 0, "fds": 0, "listeners": 0}
#: the gloo groups a rank holds (accelpact.init: default, control, checkpoint, shard, replicate, world),
#: each with one listening socket: what a hot swap rebuilds
GROUPS_PER_RANK = 6
#: a straggler's window: from the sleep's start to its end plus this
STRAGGLER_SLACK_S = 2.0
#: a strike is the cause of the first episode that begins within this after it
ATTRIBUTE_S = 75.0
SIMULTANEOUS_S = 0.5
#: issue 41: the largest relative difference (``||a - b|| / ||b||`` over a rank's parameters, and over its
#: optimizer state) a final state may have from the fault-free reference when the history has a shrink, per
#: step trained since the first shrink, and its floor: the shrunk steps sum the same micro-batches in another
#: order, and training carries the difference on and grows it.  Measured (the soak's 2-layer workload in one
#: process, the micro-batches summed in another order from step 20 on; bench/README.md, "Chaos soak: shrink
#: and grow"): 2.1e-5 80 steps later, 4.3e-3 after 480, 1.6e-2 after 980, 5.3e-2 after 1,980, 9.5e-2 after
#: 2,979: at most 3.2e-5 per step; the bound is 5e-5 per step.  It is weak over a long soak's thousands of steps (a whole lost step moves
#: the parameters by about lr = 1e-3): what stays exact after a shrink is checked exactly (every shard's
#: replicas equal to each other; step, cursor, RNG and every non-floating value equal to the reference's).
SHRINK_TOLERANCE_PER_STEP = 5e-5
SHRINK_TOLERANCE_MIN = 1e-4

@dataclass(frozen=True)
class KnownBug:
    """An engine bug the soak found and reported (bench/README.md, "Chaos soak"), recognised by its
    signature so that a soak that meets it again says so instead of failing on it (``strict``: fail)."""

    id: str
    check: str
    what: str


KNOWN_BUGS: dict[str, KnownBug] = {b.id: b for b in (
    KnownBug("K1", "exits", "an error in the checkpoint save at the boundary (Training.boundary -> checkpoint.save: a "
             "peer's death during the DCP save, or a cut of the default group FSDP1's optim_state_dict gathers on) "
             "escapes the pact: every rank exits 1 with no trace record and no hot swap; torchrun restarts (L2)"),
    KnownBug("K3", "no_leaks", "an episode that rebuilds the model (a hot swap, a discard) kept the old wrapper alive "
             "through autograd's C++ side after a backward that raised, and with it its shard and replicate groups "
             "(about 2 listening sockets, their threads and fds, per episode).  Its holders are fixed (stop 36: the "
             "post-backward hook state; stop 37: the unsharded parameter views, FSDP1Adapter.release), and "
             "tests/test_episode_leaks.py asserts every unit is freed; listed until a long soak meets no more"),
    KnownBug("K2", "traces", "a hot swap whose spare arrives one step behind the survivors: the dead rank committed "
             "step F+1 and died before its boundary published F+1 for its spare (Training._publish), so the spare "
             "posts F; the agreement aborts with mismatch (71, L2, safe) and the trace checker rejects the episode "
             "(the model's spare takes the F its identity committed); or a death inside the commit fence itself, "
             "which some survivors complete and commit (a partial fence: mismatch, 71), not yet in the model"),
)}


def _known(ep: "Episode", check: str, *, checkpoint_every: int, frontiers: list[int]) -> str | None:
    """The known bug ``ep`` shows for ``check``, if any (see :data:`KNOWN_BUGS`)."""
    if check == "exits" and ep.outcome == "L2" and ep.point == "(unrecorded)":
        codes = {c for c in ep.exit_codes.values() if c is not None}
        if codes == {1} and frontiers and checkpoint_every and all(f % checkpoint_every == 0 for f in frontiers):
            return "K1"
    if check == "traces" and ep.outcome == "L2" and ep.reasons == ["mismatch"] and ep.swapping and frontiers \
            and max(frontiers) - min(frontiers) == 1:
        return "K2"
    return None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    episodes: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    seed: int
    checks: list[Check]
    episodes: list[Episode]
    strikes: list[dict]
    told_nothing: dict[int, str] = field(default_factory=dict)
    attempts: int = 0
    known: list[str] = field(default_factory=list)   # "K1 at a2/g0": known bugs met (not counted unless strict)
    restarts: list[Restart] = field(default_factory=list)   # every restart: cause, time lost, steps replayed

    @property
    def green(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        """One line per failed check, naming the seed and the episodes."""
        out = []
        for c in self.checks:
            if not c.ok:
                eps = f" (episode {', '.join(c.episodes)})" if c.episodes else ""
                out.append(f"seed {self.seed}: {c.name} FAILED{eps}: {c.detail}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "green": self.green, "attempts": self.attempts,
                "checks": [asdict(c) for c in self.checks], "episodes": [e.to_json() for e in self.episodes],
                "strikes": self.strikes, "told_nothing": {str(k): v for k, v in self.told_nothing.items()},
                "known": self.known, "restarts": [r.to_json() for r in self.restarts],
                "restart_totals": restarts_summary(self.restarts),
                "failures": self.failures()}


# ----------------------------------------------------------------------------------- the history

def _relative(a: Any, b: Any, path: str, sums: dict[str, list[float]]) -> str:
    """Walk two snapshots: every floating tensor of one dimension or more adds ``||a - b||^2`` and
    ``||b||^2`` to ``sums`` under its top-level key (``params``, ``optimizer``); everything else (keys,
    shapes, dtypes, scalars such as AdamW's step, RNG, step, cursor) must be equal
    (:func:`compare_snapshots`).  Returns the first difference of the latter, '' if none."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point() and a.dim() >= 1 \
            and a.dtype == b.dtype and a.shape == b.shape:
        row = sums.setdefault(path.split("[", 2)[1].split("]")[0].strip("'") if "[" in path else path, [0.0, 0.0])
        row[0] += float((a.double() - b.double()).pow(2).sum())
        row[1] += float(b.double().pow(2).sum())
        return ""
    if isinstance(a, dict) and isinstance(b, dict) and list(a.keys()) == list(b.keys()):
        return next((w for k in a if (w := _relative(a[k], b[k], f"{path}[{k!r}]", sums))), "")
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return next((w for i, (x, y) in enumerate(zip(a, b, strict=True)) if (w := _relative(x, y, f"{path}[{i}]", sums))), "")
    ok, why = compare_snapshots(a, b, path)
    return "" if ok else why


def _holders(traces: Mapping[int, RankTrace], ranks: Iterable[int]) -> list[list[int]]:
    """``ranks`` grouped by the shard they hold: every rank holds the whole model when R is the world
    group (DDP); otherwise the ranks of one local index, one per replica (HSDP)."""
    head = next((tr.header for tr in traces.values() if tr.header.get("group")), {})
    rpn = int(head.get("ranks_per_node") or 1)
    world_r = head.get("group") == "world"
    out: dict[int, list[int]] = {}
    for r in sorted(ranks):
        out.setdefault(0 if world_r else r % rpn, []).append(r)
    return list(out.values())


def shrink_tolerance(steps_since: int) -> float:
    """The relative difference allowed ``steps_since`` steps after the first shrink (see
    :data:`SHRINK_TOLERANCE_PER_STEP`)."""
    return max(SHRINK_TOLERANCE_MIN, SHRINK_TOLERANCE_PER_STEP * max(0, steps_since))


def compare_final(reference: str | Path, out: str | Path, ranks: Iterable[int], shrunk: Sequence[str],
                  first_shrink: int = 0, holders: Sequence[Sequence[int]] = ()) -> tuple[bool, str]:
    """The ``bit_identical`` check (module doc) over ``ranks``: ``torch.equal`` to the reference's final
    snapshots, or, when the history has a shrink (``shrunk``: its episodes; ``first_shrink``: the earliest
    frontier one struck at), within :func:`shrink_tolerance` of the steps trained since of them,
    and then every shard's holders (``holders``: ranks that hold the same shard, one per replica)
    ``torch.equal`` to each other (the shrunk steps' order is the same on every replica: a replica that
    received a wrong state in a grow, or missed a step, differs from the others)."""
    import torch

    ref, run = RunDir(reference), RunDir(out)
    ranks = sorted(ranks)
    worst: tuple[float, int, str] = (0.0, -1, "")
    exact = 0
    last_step = 0
    for r in ranks:
        if not run.final(r).exists():
            return False, f"rank {r} wrote no final snapshot ({run.final(r)})"
        a = torch.load(run.final(r), weights_only=False)
        b = torch.load(ref.final(r), weights_only=False)
        last_step = max(last_step, int(b.get("step") or 0) if isinstance(b, dict) else 0)
        ok, why = compare_snapshots(a, b, f"rank {r}")
        if ok:
            exact += 1
            continue
        if not shrunk:
            return False, why
        sums: dict[str, list[float]] = {}
        other = _relative(a, b, f"rank {r}", sums)
        if other:
            return False, f"{other} (the history has shrink(s) {list(shrunk)}: only floating-point order may differ)"
        for kind, (num, den) in sums.items():
            rel = (num / den) ** 0.5 if den else (0.0 if not num else float("inf"))
            if rel > worst[0]:
                worst = (rel, r, kind)
    if exact == len(ranks):
        return True, f"all {len(ranks)} ranks torch.equal (params, optimizer state, RNG, step, cursor)" + (
            f" (the history has shrink(s) {list(shrunk)}; the steps trained shrunk were not kept)" if shrunk else "")
    for group in holders:
        group = [r for r in group if r in ranks]
        for r in group[1:]:
            ok, why = compare_snapshots(torch.load(run.final(r), weights_only=False),
                                        torch.load(run.final(group[0]), weights_only=False), f"rank {r} vs rank {group[0]}")
            if not ok:
                return False, f"the replicas of one shard differ after shrink(s) {list(shrunk)}: {why}"
    rel, r, kind = worst
    since = last_step - first_shrink
    tolerance = shrink_tolerance(since)
    say = (f"largest relative difference {rel:.3g} (rank {r}, {kind}) against the fault-free reference, "
           f"tolerance {tolerance:.3g} ({since} steps since the first shrink at step {first_shrink} x "
           f"{SHRINK_TOLERANCE_PER_STEP:g}, at least {SHRINK_TOLERANCE_MIN:g}; shrink(s) {list(shrunk)}: the same "
           f"micro-batches summed in another order); "
           f"{exact} of {len(ranks)} ranks torch.equal; steps, cursors, RNG and every non-floating value equal"
           + (f"; every shard's replicas torch.equal to each other ({[list(g) for g in holders]})" if holders else ""))
    return rel <= tolerance, say


def _attribute(eps: list[Episode], strikes: list[dict], commit_ns: Sequence[int] = ()) -> None:
    """Each struck fault to the episode it caused: struck during an episode (from its first record to
    its last), that one; else the first episode to begin within :data:`ATTRIBUTE_S` after it, or
    later with no step committed in between (``commit_ns``: every commit's time, sorted: the job
    stood still from the fault to the episode, e.g. a survivor blocked in a checkpoint save waiting
    out its group's timeout before it exits, K1), unless another fault struck in
    between (the later one is then its cause: this one went unnoticed, e.g. a cut of a group nobody
    used, an idle spare's death, a straggler).  An in-place episode's time lost runs from the latest
    fault attributed to it that struck before it began (else its first record) to its end; an L2's
    is its restart's (:mod:`.restarts`), set by the judge."""
    met = sorted((s for s in strikes if s.get("met") and s.get("t_ns") is not None), key=lambda s: s["t_ns"])

    def still(t0: int, t1: int) -> bool:  # no commit in (t0, t1]
        i = bisect.bisect_right(commit_ns, t0)
        return bool(commit_ns) and (i == len(commit_ns) or commit_ns[i] > t1)

    for i, s in enumerate(met):
        t = s["t_ns"]
        inside = [e for e in eps if e.t_start_ns - 50_000_000 <= t <= (e.t_last_ns or e.t_start_ns)]
        # the next fault struck apart from this one (two struck within SIMULTANEOUS_S are one cause)
        nxt = next((o["t_ns"] for o in met[i + 1:] if o["t_ns"] > t + SIMULTANEOUS_S * 1e9), None)
        after = sorted((e for e in eps if t - 50_000_000 <= e.t_start_ns
                        and (e.t_start_ns <= t + ATTRIBUTE_S * 1e9 or still(t, e.t_start_ns))
                        and (nxt is None or e.t_start_ns < nxt)), key=lambda e: e.t_start_ns)
        pick = inside[:1] or after[:1]
        for e in pick:
            e.faults.append(int(s["index"]))
            s["episode"] = e.name
    for e in eps:
        causes = [s["t_ns"] for s in strikes if s.get("episode") == e.name and s.get("t_ns") is not None
                  and s["t_ns"] <= e.t_start_ns + 50_000_000]
        t0 = max(causes) if causes else e.t_start_ns
        if e.t_end_ns is not None and e.outcome != "L2":
            e.lost_s = round((e.t_end_ns - min(t0, e.t_start_ns)) / 1e9, 3)


# ----------------------------------------------------------------------------------- the checker

def _out_of_model(strike: Mapping[str, Any]) -> bool:
    """A fault the model does not have (spec/fault-model.md, "Out of scope": failures of the shard
    groups or the control group other than through R): a cut of a group that is not R
    (``detail.r``, set by the injector), or of every connection between two ranks (the control
    group's among them); a store loss in steady training (the model's strikes during an episode)."""
    if strike.get("kind") == "cut_link":
        return True
    if strike.get("kind") == "store_loss":  # the model's FaultStoreLoss strikes during an episode only
        return not strike.get("during")
    return strike.get("kind") == "cut_group" and not (strike.get("detail") or {}).get("r")


def _what_grew(first: Mapping[str, Any], last: Mapping[str, Any]) -> str:
    """Which threads, by kernel name, and which fds, by kind, there were more of in ``last`` than in
    ``first`` (samples of ``live.proc_counts``; empty for samples without them)."""
    out = ""
    for field_, what in (("names", "threads"), ("fd_kinds", "fds")):
        a, b = first.get(field_) or {}, last.get(field_) or {}
        grew = {n: b[n] - a.get(n, 0) for n in sorted(b) if b[n] > a.get(n, 0)}
        if grew:
            out += f" ({what} that grew: {', '.join(f'{n} +{k}' for n, k in grew.items())})"
    return out


def _before_first_fault(samples: list[dict], struck: list[int]) -> list[dict]:
    """An interval's samples (in time order) taken before the first of ``struck`` (sorted strike
    times) after its first sample: the first sample always."""
    i = bisect.bisect_right(struck, samples[0]["t_ns"])
    return samples if i == len(struck) else [x for x in samples if x["t_ns"] < struck[i]]


def _floor(samples: list[dict]) -> dict:
    """One interval's samples (``live.proc_counts`` rows, in time order) read as their floor: its last
    row with each count (threads, fds, listeners, each thread name and fd kind) the fewest seen.  Where
    every sample has its fds by kind, the fds are the sum of the kinds' floors: a file fd caught in
    one sample and a socket in another are no growth of either, nor of their sum."""
    out = dict(samples[-1])
    for k in LEAK_TOLERANCE:
        out[k] = min(x[k] for x in samples)
    for field_ in ("names", "fd_kinds"):
        keys = {n for x in samples for n in (x.get(field_) or {})}
        out[field_] = {n: min((x.get(field_) or {}).get(n, 0) for x in samples) for n in sorted(keys)}
    if all(x.get("fd_kinds") for x in samples):
        out["fds"] = min(out["fds"], sum(out["fd_kinds"].values()))
    return out


def check_attempts(out: str | Path, max_nodes: int = TOLD_NOTHING_NODES) -> dict[int, Verdict_]:
    """``accelpact check-trace DIR``'s verdict on each attempt of the soak's run folder
    (:func:`accelpact.conformance.checker.check_told_nothing`)."""
    return {attempt: check_told_nothing(traces, max_nodes=max_nodes) for attempt, traces in sorted(load_traces(out).items())}


# ----------------------------------------------------------------------------------- the judge

def judge(out: str | Path, *, seed: int, world: int, spares: int, strikes: Iterable[dict], samples: Iterable[dict] = (),
          reference: str | Path | None = None, launch: Mapping[str, Any] | None = None, deadline_s: float = 20.0,
          told_nothing_budget: int = TOLD_NOTHING_NODES, check_snapshots: bool = True, checkpoint_every: int = 0,
          strict: bool = False) -> Verdict:
    """The verdict on the soak whose job ran in ``out`` (module doc).  A failure that shows a known
    bug (:data:`KNOWN_BUGS`) is listed in ``Verdict.known`` and, unless ``strict``, not counted."""
    strikes = [dict(s) for s in strikes]
    samples = [dict(s) for s in samples]
    run = RunDir(out)
    checks: list[Check] = []
    try:
        traces = load_traces(out)
    except TraceError as exc:
        return Verdict(seed, [Check("traces", False, f"trace files unusable: {exc}")], [], strikes)
    eps = episodes_of(out, world, traces)
    _attribute(eps, strikes, sorted(int(c.t * 1e9) for c in commits(out, world)))
    # every restart: its cause and the time it lost, from the steps' own timestamps (restarts.py)
    behind = {e.attempt: [s for s in strikes if s.get("episode") == e.name] for e in eps if e.outcome == "L2"}
    rst = restarts(out, world, traces=traces, faults=behind, checkpoint_every=checkpoint_every)
    of = {r.attempt: r for r in rst}
    for e in eps:
        if e.outcome == "L2" and e.attempt in of:
            rs_ = of[e.attempt]
            e.cause, e.lost_s = rs_.cause, rs_.lost_s
            e.t_end_ns = None if rs_.t_back is None else int(rs_.t_back * 1e9)
    results = _results(run)
    attempts = sorted({a for a, _ in results})
    v = Verdict(seed, checks, eps, strikes, attempts=len(attempts), restarts=rst)

    # finished
    last = {r: res for (a, r), res in results.items() if attempts and a == attempts[-1] and r < world}
    # issue 41: a job that ended shrunk: the ranks of the replicas active at the end (their results say
    # which) finished; the others left (benched) or died with no grow after
    final_ranks: set[int] = set(range(world))
    at_end: list[list[int]] = [x["active_replicas"] for x in last.values() if x.get("outcome") == "finished"
                               and isinstance(x.get("active_replicas"), list)]
    if at_end and attempts and traces.get(attempts[-1]):
        final_ranks = _replica_ranks(traces[attempts[-1]], at_end[0])
    fin = bool(last) and final_ranks <= set(last) and all(last[r].get("outcome") == "finished" for r in final_ranks)
    launch = dict(launch or {})
    rc_ok = launch.get("returncode", 0) == 0 and not launch.get("timed_out")
    stalled = launch.get("stalled")
    last_ep = [e.name for e in eps if attempts and e.attempt == attempts[-1]][-1:] or ([f"a{attempts[-1]}"] if attempts else [])
    checks.append(Check("finished", fin and rc_ok and not stalled, (
        f"the job stalled and was ended: {stalled}" if stalled else
        f"attempt {attempts[-1] if attempts else '-'}: outcomes {sorted({str(x.get('outcome')) for x in last.values()})}, "
        f"launcher rc {launch.get('returncode')}, timed out {bool(launch.get('timed_out'))}"),
        last_ep if (stalled or not fin) else []))

    # bit identity (within the stated tolerance when a shrink took the job's steps out of their order)
    if check_snapshots and reference is not None:
        shrinks = [e for e in eps if e.outcome == "shrink"]
        shrunk = [e.name for e in shrinks]
        first_shrink = min((e.frontier for e in shrinks if e.frontier is not None), default=0)
        last_traces = traces.get(attempts[-1], {}) if attempts else {}
        eq, why = compare_final(reference, out, final_ranks, shrunk, first_shrink=first_shrink,
                                holders=_holders(last_traces, final_ranks))
        if final_ranks != set(range(world)):
            why += f"; ranks {sorted(set(range(world)) - final_ranks)} out of training at the end (shrunk): not compared"
        checks.append(Check("bit_identical", eq, why))
    elif check_snapshots:
        checks.append(Check("bit_identical", False, "no reference run to compare with"))

    # traces: every attempt, whole, as check-trace judges a run it was told nothing about
    bad: list[str] = []
    msgs: list[str] = []
    scope: list[str] = []
    verdicts = check_attempts(out, told_nothing_budget)
    for attempt, tv in verdicts.items():
        if tv.accepted:
            continue
        ep = next((e for e in eps if e.attempt == attempt and e.gen == tv.gen), None)
        name = ep.name if ep is not None else f"a{attempt}" + (f"/g{tv.gen}" if tv.gen is not None else "")
        kinds = [s for s in strikes if ep is not None and s.get("episode") == ep.name]
        if ep is not None and ep.outcome == "L2" and kinds and all(_out_of_model(s) for s in kinds):
            ep.note = (ep.note + "; " if ep.note else "") + "trace outside the model's scope (a failure of a group other than R)"
            scope.append(name)
        elif ep is not None and not strict and (k := _known(ep, "traces", checkpoint_every=checkpoint_every,
                                                            frontiers=ep.frontiers)):
            ep.known = k
            v.known.append(f"{k} at {ep.name}")
        else:
            bad.append(name)
            msgs.append(f"attempt {attempt} ({name}): {tv.message}")
    accepted = sum(1 for tv in verdicts.values() if tv.accepted)
    checks.append(Check("traces", not bad, "\n".join(msgs) if msgs else
                        f"{accepted} of {len(verdicts)} attempts accepted whole by the trace checker told nothing"
                        + (f"; {len(scope)} L2 episode(s) of faults outside the model's scope (spec/fault-model.md, "
                           f"'Out of scope') not judged by it: {scope}" if scope else ""),
                        bad))
    v.told_nothing = {a: (tv.message.splitlines()[0] if tv.message else ("accepted" if tv.accepted else "rejected"))
                      for a, tv in verdicts.items()}

    # all or none
    split = [e for e in eps if e.outcome in ("split",) or (e.outcome == "failed")]
    checks.append(Check("all_or_none", not split, "; ".join(f"{e.name}: {e.outcome} ({e.note})" for e in split)
                        or "every generation: all ranks resumed or none did", [e.name for e in split]))

    # exits within bound, with documented codes
    bound = 3 * deadline_s + 10.0
    late, undocumented = [], []
    slowest: list[tuple[float, str, str | None]] = []   # (seconds from the fault, episode, known bug)
    for e in eps:
        if e.outcome != "L2":
            continue
        causes = [s["t_ns"] for s in strikes if s.get("episode") == e.name and s.get("t_ns") is not None]
        t0 = min([e.t_start_ns, *causes]) if e.t_start_ns else (min(causes) if causes else None)
        # the frontier of each rank that exited 1: where its last boundary (and its checkpoint) was
        fronts = [int(x["frontier"]) for (a, _r), x in results.items() if a == e.attempt and x.get("exit_code") == 1
                  and isinstance(x.get("frontier"), int)]
        k = None if strict else _known(e, "exits", checkpoint_every=checkpoint_every, frontiers=fronts)
        if k:
            e.known = k
            v.known.append(f"{k} at {e.name}")
        for r, code in e.exit_codes.items():
            res = results.get((e.attempt, r), {})
            if code is None:
                continue  # killed (our SIGKILL, torchrun's, a keeper's): no exit of its own
            if code not in ABORT_CODES and code not in SUPERVISOR_STOP and not k:
                undocumented.append(f"{e.name}: rank {r} exited {code}")
            t_exit = res.get("t_exit")
            if t0 and t_exit:
                slowest.append((t_exit - t0 / 1e9, e.name, k))
            if t0 and t_exit and t_exit - t0 / 1e9 > bound:
                # an error outside the pact (K1: a survivor blocked in the save waits out its group's
                # timeout) has no bound of the pact's: listed with the bug, counted with --strict
                if k:
                    continue
                late.append(f"{e.name}: rank {r} exited {t_exit - t0 / 1e9:.1f}s after the fault (bound {bound:.0f}s)")
    # the slowest exit, from the fault (as the bound is): the known bugs' named apart
    worst = max(((x, n) for x, n, kb in slowest if not kb), default=None)
    worst_k = max(((x, n, kb) for x, n, kb in slowest if kb), default=None)
    checks.append(Check("exits", not late and not undocumented, "; ".join(late + undocumented) or (
        f"every survivor of {sum(1 for e in eps if e.outcome == 'L2')} restarts exited with 70-73 (or 143) within "
        f"{bound:.0f}s of the fault" + (f" (slowest {worst[0]:.1f}s, {worst[1]})" if worst is not None else "")
        + (f"; but the known {worst_k[2]} exits (slowest {worst_k[0]:.1f}s, {worst_k[1]})" if worst_k is not None else "")),
        sorted({x.split(':')[0] for x in late + undocumented})))

    # leaks
    grown = []
    struck = sorted(int(s["t_ns"]) for s in strikes if s.get("met") and s.get("t_ns"))
    by_pid: dict[int, list[dict]] = {}
    for s in samples:
        by_pid.setdefault(int(s["pid"]), []).append(s)
    measured = 0
    for pid, rows in by_pid.items():
        # the baseline follows the process's first repair: the first episode allocates what every later one
        # reuses (tests/test_episode_leaks.py: listening sockets 6, 7, 7, 7).  A spare's first sample follows
        # the episode it joined in, which is no repair of its own: its baseline is the next one
        spare = not any(x["episodes_before"] == 0 for x in rows)
        intervals: dict[tuple[int, int], list[dict]] = {}
        for x in sorted(rows, key=lambda x: x["t_ns"]):
            intervals.setdefault((int(x["attempt"]), int(x["episodes_before"])), []).append(x)
        settled = [_floor(_before_first_fault(xs, struck)) for key, xs in intervals.items() if key[1] >= 1]
        rows = sorted(settled, key=lambda x: x["t_ns"])[1 if spare else 0:]
        if len(rows) < 2:
            continue
        measured += 1
        first, lastrow = rows[0], rows[-1]
        what = [f"{k} {first[k]} -> {lastrow[k]}" for k, tol in LEAK_TOLERANCE.items() if lastrow[k] - first[k] > tol]
        if not what:
            continue
        line = (f"rank {first['identity']} (pid {pid}, attempt {first['attempt']}): {', '.join(what)} over closed "
                f"episodes {first['episodes_before']}..{lastrow['episodes_before']}{_what_grew(first, lastrow)}")
        # the episodes closed between the two samples (each closed one is a generation, in order)
        between = [e for e in eps if e.attempt == first["attempt"] and e.outcome in RESUMED
                   and first["episodes_before"] <= e.gen < lastrow["episodes_before"]]
        swaps = sum(1 for e in between if e.outcome in ("swap", "discard", "shrink", "grow"))
        if not strict and swaps and 0 < lastrow["listeners"] - first["listeners"] <= GROUPS_PER_RANK * swaps:
            v.known.append(f"K3 at a{first['attempt']} rank {first['identity']} ({', '.join(what)} over {swaps} swap(s))")
            continue
        grown.append(line)
    k3 = sum(1 for k in v.known if k.startswith("K3"))
    checks.append(Check("no_leaks", not grown, "; ".join(grown) or (
        (f"{measured} worker(s) sampled after 2+ episodes: no growth of threads, fds or listening sockets"
         + (f" but K3's (a hot swap's retired groups, listed as known) in {k3}" if k3 else ""))
        if measured else "no worker lived through 2 episodes (nothing to compare)")))

    # the straggler
    false = []
    for s in strikes:
        if s.get("kind") != "slow" or not s.get("met"):
            continue
        t0, t1 = s["t_ns"], s["t_ns"] + int(((s.get("duration_s") or 0) + STRAGGLER_SLACK_S) * 1e9)
        others = [o for o in strikes if o is not s and o.get("met") and o.get("t_ns") and t0 - 5e9 <= o["t_ns"] <= t1]
        hit = [e.name for e in eps if t0 <= e.t_start_ns <= t1]
        suspected = [rec for a, trs in traces.items() for tr in trs.values() for rec in tr.records
                     if rec.action == "RankSuspect" and t0 <= rec.t_ns <= t1
                     and rec.detail.get("suspect") == s.get("identity")]
        if (hit and not others) or suspected:
            false.append(f"fault #{s['index']} (slow {s.get('duration_s')}s on rank {s.get('identity')}): "
                         f"episode(s) {hit} began, {len(suspected)} RankSuspect of it")
    n_slow = sum(1 for s in strikes if s.get("kind") == "slow" and s.get("met"))
    checks.append(Check("straggler", not false, "; ".join(false) or f"{n_slow} straggler(s): no episode, no suspicion"))
    return v
