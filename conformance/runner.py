"""Run one scenario against the real implementation and judge it with three oracles.

1. Outcome: the observed outcome is one the model allows (and ``expect`` if given).
   L1: every rank released at F in attempt 0, nothing replayed, no restart, and the final
   per-rank snapshots are bit-identical to the uninterrupted reference run.  L2: every
   surviving rank of attempt 0 exited with one rejection/abort code, torchrun restarted the
   job from checkpoint C, it finished, and the final snapshots are bit-identical.
2. Trace: the checker (:mod:`.checker`) accepts attempt 0's traces under the scenario's script.
3. Deadlines: every rank that exited did so within the bound after the first fault (``t_ns``).

The run is the scenario's typed job (:meth:`Scenario.job`; a seeded bug is its ``seeded_bug``
field, nothing else); its files are read through :class:`~accelpact.impl.rundir.RunDir`.  The
reference run is cached per workload (``impl.launch.run_reference``).  Every process is reaped by
the launcher; every wait is bounded (``timeout_s``).  No torch import at module level (the snapshots are
compared by :func:`accelpact.impl.launch.snapshots.compare_runs`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..impl.exitcodes import ExitCode
from ..model.faults import KINDS
from ..impl.launch.snapshots import compare_runs
from ..impl.rundir import RunDir
from ..impl.trace import TraceError, load_traces
from .checker import Abstraction, TraceChecker, check_told_nothing, engine_contract, with_elastic
from .mapping import model_config, script_for
from .outcomes import model_outcomes
from .scenario import CONFORMANCE_COLLECTIVE_TIMEOUT_S, Scenario
from ..impl.launch import launch
from ..impl.runtime.backends import backend
from ..model.contract import default_envelope, save_envelope, unqualified_notice

#: the fail-stop exit codes (spec/implementation.md "Exit codes"; impl/exitcodes.py)
ABORT_CODES = frozenset(int(c) for c in ExitCode)
DEFAULT_CACHE = Path(os.environ.get("ACCELPACT_REF_CACHE", Path.home() / ".cache" / "accelpact" / "refs"))


@dataclass
class Report:
    """The verdict on one run.  ``outcome``: ``L1``, ``L2`` (attempt 0 ended in a fail-stop exit and a
    restart followed), ``exit`` (attempt 0 ended in a fail-stop exit and no restart was launched:
    the model allowed only L1, so the run had plain processes), or ``none`` (no outcome was
    observed: the run did not finish, or its result files are incomplete).  ``timed_out``: the
    launch ran past its bound."""

    scenario: str
    expected: list[str]
    outcome: str = "none"
    timed_out: bool = False
    conforms: bool = False
    replayed_steps: int | None = None
    bit_identical: bool | None = None
    trace_ok: bool | None = None
    deadlines_ok: bool | None = None
    phases_s: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    trace_message: str = ""
    wall_s: float = 0.0
    out: str = ""
    #: the envelope file the ranks decided with, when not the shipped default (a candidate or trial one)
    envelope: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "outcome": self.outcome, "expected": self.expected, "conforms": self.conforms,
            "timed_out": self.timed_out,
            "replayed_steps": self.replayed_steps, "bit_identical": self.bit_identical, "trace_ok": self.trace_ok,
            "deadlines_ok": self.deadlines_ok, "phases_s": self.phases_s, "problems": self.problems,
            "wall_s": round(self.wall_s, 3), "out": self.out, "envelope": self.envelope,
        }

    def summary(self) -> str:
        verdict = "CONFORMS" if self.conforms else "DOES NOT CONFORM"
        lines = [f"{self.scenario}: {verdict} (observed {self.outcome}, model allows {'/'.join(self.expected)})",
                 f"  replayed_steps={self.replayed_steps} bit_identical={self.bit_identical} trace_ok={self.trace_ok} "
                 f"deadlines_ok={self.deadlines_ok} wall={self.wall_s:.1f}s"]
        if self.envelope:
            lines.append(f"  envelope: {self.envelope}")
        if self.phases_s:
            lines.append("  phases: " + " ".join(f"{k}={v * 1e3:.1f}ms" for k, v in self.phases_s.items()))
        lines += [f"  problem: {p}" for p in self.problems]
        if self.trace_ok is False:
            lines.append(self.trace_message)
        return "\n".join(lines)


def abstraction_for(sc: Scenario) -> Abstraction:
    """Real frontier of episode g = the number of committed steps when its fault struck: step + 1
    at the boundary (step ``step`` has committed), ``step`` in flight (it has not)."""
    return Abstraction({g: s + 1 if sc.trigger_point(s) == "boundary" else s for g, s in enumerate(sc.episode_steps)})


def check_run_traces(sc: Scenario, out: Path) -> tuple[bool, str]:
    """Oracle 2: attempt 0 against the scripted model; later attempts must be fault-free runs; and
    every attempt told nothing (:func:`~accelpact.conformance.checker.check_told_nothing`, the one
    checker ``accelpact check-trace`` runs on a user's run).
    :class:`TraceError` when the files are unusable (missing, torn, a rank without a trace)."""
    runs = sorted(load_traces(out).items())
    cfg = model_config(sc, **(engine_contract(runs[0][1]) if runs else {}))
    if runs:  # a job that opted in to shrink, or whose keepers refilled the pool (issue 41): as its headers say
        cfg = with_elastic(cfg, runs[0][1])
    msgs = []
    ok = True
    for attempt, traces in runs:
        if attempt == 0:
            v = TraceChecker(cfg, traces, script=script_for(sc), abstraction=abstraction_for(sc)).check()
        else:
            v = TraceChecker(cfg.with_(max_faults=0), traces).check()
        # and as a user's run is checked, told nothing of the scenario (spec/trace-checking.md, "A run told nothing")
        blind = check_told_nothing(traces)
        ok = ok and v.accepted and blind.accepted
        msgs.append(f"attempt {attempt}: {v.message}")
        msgs.append(f"attempt {attempt}, told nothing: {blind.message}")
    return ok, "\n".join(msgs)


def _trace_times(out: Path, attempt: int, world: int) -> tuple[int | None, dict[int, int]]:
    """The first injected fault's ``t_ns`` in ``attempt`` and each exited rank's end ``t_ns``."""
    run = RunDir(out)
    first_fault = None
    last: dict[int, int] = {}
    for r in range(world):
        for rec in run.records(attempt, r):
            t = rec.get("t_ns")
            if not isinstance(t, int):
                continue
            if rec.get("type") == "action" and str(rec.get("action", "")).startswith("Fault"):
                first_fault = t if first_fault is None else min(first_fault, t)
            if rec.get("type") == "end" and rec.get("outcome") == "exited":
                last[r] = t
    return first_fault, last


def candidate_envelope(backend_name: str, path: Path) -> Path | None:
    """Where the shipped default envelope has no entry for ``backend_name``'s platform (every platform
    but ``cpu-gloo``: ``cuda-nccl``), the envelope a run of the corpus there decides with: the
    default's cells for that platform (``contract.default_envelope(platform=...)``), written to
    ``path``.  None where the shipped default covers the platform.

    The corpus is what qualifies a platform (``accelpact qualify`` runs each cell under the same
    cells, its trial envelope): under the shipped default an unqualified platform's every failure is
    L2, so no scenario would test the in-place repair there, and every one expecting L1 would fail on
    the envelope, not on the engine.  The report names the file (``Report.envelope``); the traces'
    headers carry it, and the checker models it (``checker.engine_contract``)."""
    platform = backend(backend_name).platform
    if unqualified_notice(default_envelope(), platform) is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    save_envelope(default_envelope(platform=platform), path)
    return path


def run_scenario(sc: Scenario, *, backend: str = "gloo", out: str | Path | None = None, deadline_s: float = 8.0,
                 timeout_s: float = 300.0, cache_dir: str | Path | None = None, seeded_bug: str | None = None,
                 torchrun_args: dict | None = None, envelope: str | Path | None = None) -> Report:
    """Run ``sc`` for real and apply the three oracles (module doc).  Bounded by ``timeout_s`` per launch.
    ``envelope``: the envelope file the job's ranks decide with (None: the shipped default where it
    covers the backend's platform, else the platform's candidate envelope, :func:`candidate_envelope`;
    ``accelpact qualify`` passes a cell's trial envelope)."""
    t0 = time.monotonic()
    model = model_outcomes(sc)
    rep = Report(sc.name, sorted(model.outcomes))
    world = sc.topology.world
    out = Path(out) if out is not None else Path(f"/tmp/accelpact-conformance/{sc.name}")
    rep.out = str(out)
    job = sc.job(out, backend=backend, deadline_s=deadline_s, seeded_bug=seeded_bug)
    if envelope is None:
        envelope = candidate_envelope(backend, out.with_name(f"{out.name}.envelope.json"))
    if envelope is not None:
        rep.envelope = str(envelope)
        job = job.replace(envelope=str(envelope))
    ref = launch.run_reference(job, cache_dir or DEFAULT_CACHE, timeout_s=timeout_s, launcher="local")
    if any(KINDS[f.kind].job_wide for f in sc.faults):
        # the store itself is lost: each attempt's store is served by a process of its own, killed
        # from outside, and the restart rendezvouses on a fresh one (torchrun's agent hosts its store)
        res = launch.run_restarting(job, world, timeout_s=timeout_s)
    elif "L2" in model.outcomes:
        kw = dict(torchrun_args or {})
        res = launch.run_torchrun(job, world, max_restarts=kw.pop("max_restarts", 1), timeout_s=timeout_s, **kw)
    else:
        res = launch.run_local(job, world, timeout_s=timeout_s)
    rep.timed_out = bool(res.timed_out)
    if res.timed_out:
        rep.problems.append(f"the run did not finish within {timeout_s}s (hang); log tail:\n{res.log_tail(1500)}")
    a0 = res.attempt(0)
    attempts = res.attempts
    # ---- oracle 1: outcome
    if len(attempts) <= 1 and a0 and all(r.get("outcome") == "finished" for r in a0.values()) and len(a0) == world:
        rep.outcome = "L1"
        rep.replayed_steps = max(int(r.get("replayed_steps") or 0) for r in a0.values())
        if rep.replayed_steps:
            rep.problems.append(f"L1 replayed {rep.replayed_steps} steps (must be 0)")
        if any(r.get("resumed_from") is not None for r in a0.values()):
            rep.problems.append("L1 run resumed from a checkpoint")
        gens = {int(r.get("generation") or 0) for r in a0.values()}
        # one generation per repair; a link cut whose break no collective crossed in its episode is met
        # by a later flag, save or fence: at most one more episode per cut (spec/protocol.md P18.3)
        latent = sum(1 for f in sc.faults if KINDS[f.kind].pair)
        want = range(len(sc.episode_steps), len(sc.episode_steps) + latent + 1)
        if len(gens) != 1 or next(iter(gens)) not in want:
            rep.problems.append(f"ranks ended in generation(s) {sorted(gens)}, expected {len(sc.episode_steps)} (one per repair)"
                                + (f" plus at most {latent} for a link cut met later" if latent else ""))
        for ep in launch.l1_episodes(res):
            for k, v in ep["phases_s"].items():
                rep.phases_s[k] = rep.phases_s.get(k, 0.0) + v
        for k, v in _swap_phases(a0).items():
            rep.phases_s[k] = rep.phases_s.get(k, 0.0) + v
    elif len(attempts) >= 2:
        rep.outcome = "L2"
        codes = {r: r_.get("exit_code") for r, r_ in a0.items()}
        abort_codes = {c for c in codes.values() if c is not None}
        crashed = any(f.kind == "crash" for f in sc.faults)
        # torchrun kills every worker once one died (SIGKILL): survivors then have no exit code
        if (not abort_codes and not crashed) or len(abort_codes) > 1 or not abort_codes <= ABORT_CODES:
            rep.problems.append(f"attempt 0 exit codes {codes}: every surviving rank must exit with one abort code {sorted(ABORT_CODES)}")
        last = res.attempt(attempts[-1])
        # C: the last checkpoint at or before the step of the episode that aborted (any episode
        # of the scenario may be the one; earlier ones may have been repaired in place)
        every = sc.workload.checkpoint_every
        allowed_c = {(s // every) * every for s in sc.episode_steps}
        # a restart with no checkpoint yet (C = 0) starts from the initial state: resumed_from None
        resumed = {r_.get("resumed_from") or 0 for r_ in last.values()}
        if len(resumed) != 1 or not resumed <= allowed_c:
            rep.problems.append(f"restart resumed from {sorted(map(str, resumed))}, expected one last checkpoint C in {sorted(allowed_c)}")
        rep.replayed_steps = max(int(r_.get("replayed_steps") or 0) for r_ in last.values())
        if not all(r_.get("outcome") == "finished" for r_ in last.values()) or len(last) != world:
            rep.problems.append("the restarted job did not finish on every rank")
        for ep in launch.l2_episodes(res):
            if ep.get("exit_to_ready_s") is not None:
                rep.phases_s["exit_to_ready"] = ep["exit_to_ready_s"]
            if ep.get("fault_to_frontier_s") is not None:
                rep.phases_s["fault_to_frontier"] = ep["fault_to_frontier_s"]
    elif not res.timed_out and any(r_.get("outcome") == "exited" for r_ in a0.values()):
        # a fail-stop exit under plain processes (the model allowed only L1): nothing restarted it
        rep.outcome = "exit"
        codes = {r: r_.get("exit_code") for r, r_ in sorted(a0.items())}
        rep.problems.append(f"attempt 0 ended in a fail-stop exit (exit codes {codes}) and no restart followed")
    else:
        rep.problems.append(f"neither L1 nor L2: attempts {attempts}, results {[(k, v.get('outcome'), v.get('exit_code')) for k, v in sorted(res.results.items())]}")
    if rep.outcome not in model.outcomes:
        rep.problems.append(f"observed {rep.outcome} but the model allows only {sorted(model.outcomes)}")
    if sc.expect and rep.outcome != sc.expect:
        rep.problems.append(f"observed {rep.outcome} but the scenario expects {sc.expect}")
    if rep.outcome in ("L1", "L2"):
        eq, why = compare_runs(ref, out, world)
        rep.bit_identical = eq
        if not eq:
            rep.problems.append(f"final state differs from the reference: {why}")
    # ---- oracle 2: traces
    _check_traces(rep, sc, out)
    # ---- oracle 3: deadlines (every rank that exited did so within the bound after the fault)
    first, ends = _trace_times(out, 0, world)
    bound = 3 * deadline_s + 10.0  # a wait per decision (agree, validate, release) plus slack for a loaded machine
    if any(f.kind == "hang" and f.at == "boundary" for f in sc.faults):
        # a rank hung at the boundary, its progress level with its peers', is found by no detector verdict:
        # its peers' failure flag gives up at the collective timeout, as on a slow healthy rank's (issue 40)
        bound += CONFORMANCE_COLLECTIVE_TIMEOUT_S
    late = {r: (t - first) / 1e9 for r, t in ends.items() if first is not None and (t - first) / 1e9 > bound}
    rep.deadlines_ok = not late and not res.timed_out
    if late:
        rep.problems.append(f"rank(s) ended later than {bound:.0f}s after the fault: {late}")
    rep.conforms = not rep.problems
    rep.wall_s = time.monotonic() - t0
    return rep


#: a hot swap's phases (its record's ``durations_ms``) under the names of a repair's (``replace``
#: builds every group anew: the repair's ``rebuild``)
_SWAP_PHASE_NAMES = {"agree": "agree", "replace": "rebuild", "rebind": "rebind", "validate": "validate", "release": "release"}


def _swap_phases(results: dict[int, dict]) -> dict[str, float]:
    """Each hot swap's phase durations (seconds, the slowest rank's, summed over the swaps) and
    their ``total``, from the ranks' result files."""
    per: dict[tuple[int, str], float] = {}
    for res in results.values():
        for sw in res.get("swaps") or []:
            for k, ms in (sw.get("durations_ms") or {}).items():
                if k in _SWAP_PHASE_NAMES:
                    key = (int(sw.get("generation", 0)), _SWAP_PHASE_NAMES[k])
                    per[key] = max(per.get(key, 0.0), float(ms) / 1e3)
    out: dict[str, float] = {}
    for (_g, k), v in per.items():
        out[k] = out.get(k, 0.0) + v
    if out:
        out["total"] = sum(out.values())
    return out


def _check_traces(rep: Report, sc: Scenario, out: Path) -> None:
    """Oracle 2 into ``rep``."""
    try:
        rep.trace_ok, rep.trace_message = check_run_traces(sc, out)
    except TraceError as exc:
        rep.trace_ok, rep.trace_message = False, f"trace files unusable: {exc}"
        rep.problems.append(rep.trace_message)
    else:
        if not rep.trace_ok:
            rep.problems.append("the trace checker rejects the run (see below)")
