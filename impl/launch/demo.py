"""``accelpact demo``: the whole job end to end under torchrun, on Gloo CPU by default.

Five launches of the same small HSDP transformer (2 nodes x 2 ranks by default):

(a) the uninterrupted reference;
(b) L1: a committed-boundary failure of a replicate group (its sockets are shut down at the
    boundary of ``--fault-step``), repaired in place (agree, replace, rebind, validate, release),
    zero replay, then training continues; final state compared bit for bit with (a);
(c) L2: an in-flight failure (``--fault-at`` backward by default) of the same step: the contract
    rejects it, every rank exits 70, torchrun restarts all workers, they reload the last committed
    DCP checkpoint C and replay F - C steps; final state compared with (a);
(d) crash, hot-swapped: the same job with one spare process; the same rank is SIGKILLed in
    ``--fault-at`` of the same step; its keeper posts the death, a spare takes its identity and
    receives its shard from a live replica, the survivors discard the uncommitted step and everyone
    reruns it: no restart, zero lost steps; final state compared with (a);
(e) a broken link in flight, discarded in place: every connection between that rank and its replica
    on the next node is cut in ``--fault-at`` of the same step (every group across the link fails:
    its replicate group, the world, default, control and checkpoint groups); every rank abandons
    the step, every group is rebuilt, the model moved into a fresh wrapper, the step rerun with the
    same batch: no restart, one step rerun, nothing committed replayed; final state compared with (a).

Progress is printed while the runs go (steps, loss, the phase of any recovery, read from the
result and trace files the workers write).  The report gives per-phase repair times, replayed steps
per path, fault-to-frontier of L1 versus L2, and where the traces and the timeline plot are.
Exit status 0 only if every path ends bit-identical to the reference (and L1, the swap and the
discard needed no restart).

No torch import at module level (``accelpact --help`` must not pay for it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from ...model.faults import IN_FLIGHT
from ..rundir import RunDir
from ..runtime.backends import BACKEND_NAMES, backend
from ..runtime.wrappers import WRAPPER_NAMES, wrapper
from .job import Job, Topology, Workload
from .launch import LaunchError, l1_episodes, l2_episodes, run_reference, run_torchrun, swap_episodes
from .plot import timeline
from .snapshots import compare_runs

__all__ = ["add_arguments", "run", "validate_args", "DemoArgumentError"]

#: the fault kinds the L2 path may use in flight (both are rejected by the contract: C3 rule 1)
INFLIGHT_KINDS = ("exception", "crash")


class DemoArgumentError(ValueError):
    """A flag combination the demo cannot run; the message says which flag and what to use."""


def _positive(name: str):
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {v}")
        return v
    return conv


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=_positive("--nodes"), default=2, help="simulated nodes (default 2)")
    p.add_argument("--ranks-per-node", type=_positive("--ranks-per-node"), default=2, help="ranks per node (default 2)")
    p.add_argument("--wrapper", choices=WRAPPER_NAMES, default="fsdp1-hybrid", help="data-parallel wrapper")
    p.add_argument("--layers", type=_positive("--layers"), default=2, help="transformer blocks (default 2)")
    p.add_argument("--steps", type=_positive("--steps"), default=8, help="optimizer steps per run (default 8)")
    p.add_argument("--fault-step", type=int, default=5, help="step whose boundary (L1) / in-flight point (L2) fails")
    p.add_argument("--fault-at", choices=IN_FLIGHT, default="backward", help="in-flight point of the L2 failure")
    p.add_argument("--fault-kind", choices=INFLIGHT_KINDS, default="exception", help="kind of the L2 failure")
    p.add_argument("--checkpoint-every", type=int, default=2, help="durable DCP checkpoint every N steps (default 2)")
    p.add_argument("--checkpoint", choices=("sync", "async"), default="sync",
                   help="how the checkpoints are taken: attach(checkpoint=...) (default sync)")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="gloo", help="collective backend (default gloo, CPU)")
    p.add_argument("--out", default="runs/demo", help="output folder for results, traces, checkpoints, plot")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each launch in seconds (default 300)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def validate_args(args: argparse.Namespace) -> None:
    """Cross-flag checks argparse cannot express; raises :class:`DemoArgumentError`."""
    if not 1 <= args.fault_step < args.steps:
        raise DemoArgumentError(f"--fault-step {args.fault_step} must be in [1, --steps) = [1, {args.steps}); "
                                f"e.g. --fault-step {max(1, args.steps // 2)}")
    if args.checkpoint_every < 0:
        raise DemoArgumentError(f"--checkpoint-every must be >= 0 (0: no checkpoints, L2 replays from step 0), "
                                f"got {args.checkpoint_every}")
    world = args.nodes * args.ranks_per_node
    if world < 2:
        raise DemoArgumentError("the demo needs at least 2 ranks (--nodes x --ranks-per-node >= 2): "
                                "a failure of a group needs a peer to survive it")
    if wrapper(args.wrapper).recovers == "replicate" and args.nodes < 2:
        raise DemoArgumentError(f"--wrapper {args.wrapper} replicates across nodes: use --nodes >= 2 "
                                "(or --wrapper ddp)")
    if world > 16:
        raise DemoArgumentError(f"{world} ranks is more than this demo launches on one machine (max 16)")
    if args.timeout <= 0:
        raise DemoArgumentError(f"--timeout must be > 0 seconds, got {args.timeout}")


def _base_job(args: argparse.Namespace, out: Path, scenario: str, faults: list[dict], spares: int = 0) -> Job:
    return Job(topology=Topology(args.nodes, args.ranks_per_node, spares=spares),
               workload=Workload(args.wrapper, args.layers, args.steps, 0, args.checkpoint_every,
                                 checkpoint=getattr(args, "checkpoint", "sync")),
               out=str(out), scenario=scenario, backend=args.backend, trace=True,
               # a collective timeout below the deadline: an op a revoke left blocked (bench/README.md
               # "K6") fails within the peers' wait at the arrival, so the episode is still repaired in place
               deadline_s=30.0, collective_timeout_s=15.0,
               # the demo shows repairs, not detection: on a few shared cores a rank's heartbeat can be
               # descheduled past the detector's 0.8 s default (spec/detection.md), a false "dead" that
               # ends an episode at the deadline (seen: path (e) under the test suite's load).  Its
               # deaths are crashes, which the keeper's notice reports whatever this threshold.
               dead_after_s=5.0).replace(faults=faults)


class _Progress(threading.Thread):
    """Polls a run's result and trace files and prints a line whenever something moved."""

    def __init__(self, label: str, out: Path, steps: int, console) -> None:
        super().__init__(daemon=True)
        self.label, self.out, self.steps, self.console = label, out, steps, console
        self.stop = threading.Event()
        self._last = ""
        self._repairs = 0

    def _line(self) -> str:
        run = RunDir(self.out)
        res = run.results()
        if not res:
            return f"[{self.label}] starting workers ..."
        attempt = max(a for a, _ in res)
        cur = {r: v for (a, r), v in res.items() if a == attempt}
        frontier = min((v.get("frontier") or 0) for v in cur.values())
        losses = [v["losses"].get(str(frontier - 1)) for v in cur.values() if v.get("losses")]
        loss = next((x for x in losses if x is not None), None)
        outcomes = sorted({str(v.get("outcome")) for v in cur.values()})
        phase = ""
        for r in sorted(cur):
            recs = run.records(attempt, r)
            rec = recs[-1] if recs else {}
            if rec.get("type") == "action" and rec.get("action") != "RankResume":
                phase = f" | rank {r}: {rec['action']}"
                break
        reports = max((len(v.get("reports") or []) for v in cur.values()), default=0)
        if reports > self._repairs:
            rep = max((v["reports"][-1] for v in cur.values() if v.get("reports")), key=lambda r: r.get("total_ns", 0))
            self._repairs = reports
            phase = (f" | repaired generation {rep.get('generation')} in place: {rep.get('total_ns', 0) / 1e6:.1f} ms, "
                     f"{rep.get('refs_rebound')} references rebound, 0 steps replayed")
        codes = sorted({int(v["exit_code"]) for v in cur.values() if v.get("exit_code")})
        extra = f" exit {codes}" if codes else ""
        ls = f" loss {loss:.3f}" if isinstance(loss, (int, float)) else ""
        return (f"[{self.label}] attempt {attempt} step {frontier}/{self.steps}{ls} "
                f"({'/'.join(str(o) for o in outcomes)}{extra}){phase}")

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                line = self._line()
            except Exception:  # noqa: BLE001 - progress is best effort; files are being rewritten
                continue
            if line != self._last:
                self._last = line
                self.console.print(line, highlight=False)


def _launch(label: str, job: Job, nproc: int, restarts: int, args, console):
    prog = None
    if not args.quiet:
        prog = _Progress(label, Path(job.out), args.steps, console)
        prog.start()
    try:
        return run_torchrun(job, nproc, max_restarts=restarts, timeout_s=args.timeout)
    finally:
        if prog is not None:
            prog.stop.set()
            prog.join(2)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    try:
        validate_args(args)
    except DemoArgumentError as exc:
        print(f"accelpact demo: error: {exc}", file=sys.stderr)
        return 2
    why = backend(args.backend).unavailable(args.nodes * args.ranks_per_node)
    if why:
        print(f"accelpact demo: error: {why}. Use --backend gloo.", file=sys.stderr)
        return 2

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nproc = args.nodes * args.ranks_per_node
    group = wrapper(args.wrapper).recovers
    victim = args.ranks_per_node - 1 if group == "replicate" else nproc - 1
    console.print(f"[bold]AccelPact demo[/bold]: {args.wrapper}, {args.nodes} nodes x {args.ranks_per_node} ranks, "
                  f"{args.backend}, {args.steps} steps, checkpoint every {args.checkpoint_every}; output in {out}")
    t_all = time.monotonic()

    # (a) reference
    ref_job = _base_job(args, out / "reference", "demo-reference", [])
    console.print("[bold](a)[/bold] uninterrupted reference")
    try:
        ref_dir = run_reference(ref_job, out / "refs", timeout_s=args.timeout)
    except LaunchError as exc:
        console.print(f"[red]reference failed[/red]: {exc}")
        return 1

    # (b) L1: committed-boundary failure of R, repaired in place
    console.print(f"[bold](b)[/bold] L1: {group} group of rank {victim} fails at the boundary of step {args.fault_step}")
    l1_job = _base_job(args, out / "l1", "demo-l1", [
        {"step": args.fault_step, "at": "boundary", "kind": "collective_timeout", "ranks": [victim], "group": group}])
    l1 = _launch("L1", l1_job, nproc, 0, args, console)

    # (c) L2: in-flight failure, rejection, torchrun restart, DCP reload, replay
    console.print(f"[bold](c)[/bold] L2: {args.fault_kind} in {args.fault_at} of step {args.fault_step} on rank {victim}")
    l2_job = _base_job(args, out / "l2", "demo-l2", [
        {"step": args.fault_step, "at": args.fault_at, "kind": args.fault_kind, "ranks": [victim], "group": group}])
    l2 = _launch("L2", l2_job, nproc, 1, args, console)

    # (d) crash, hot-swapped: a spare takes the dead rank's identity (the keeper keeps torchrun out)
    console.print(f"[bold](d)[/bold] crash, hot-swapped: SIGKILL in {args.fault_at} of step {args.fault_step} on rank "
                  f"{victim}, one spare")
    sw_job = _base_job(args, out / "swap", "demo-swap", [
        {"step": args.fault_step, "at": args.fault_at, "kind": "crash", "ranks": [victim]}], spares=1)
    sw = _launch("swap", sw_job, nproc, 1, args, console)

    # (e) a broken link in flight: the step discarded in place and rerun (P17, P18)
    peer = victim + args.ranks_per_node if victim + args.ranks_per_node < nproc else victim - args.ranks_per_node
    if args.nodes >= 2:
        cut = {"step": args.fault_step, "at": args.fault_at, "kind": "link_cut", "ranks": sorted((victim, peer))}
        what = f"link between rank {min(victim, peer)} and rank {max(victim, peer)} cut"
    else:  # one node: no network link; the group's connections are cut instead
        cut = {"step": args.fault_step, "at": args.fault_at, "kind": "collective_timeout", "ranks": [victim], "group": group}
        what = f"{group} group of rank {victim} cut"
    console.print(f"[bold](e)[/bold] discard in place: {what} in {args.fault_at} of step {args.fault_step}")
    dc_job = _base_job(args, out / "discard", "demo-discard", [cut])
    dc = _launch("discard", dc_job, nproc, 1, args, console)

    l1_ok, l1_why = compare_runs(ref_dir, l1.out, nproc)
    l1_ok = l1_ok and l1.ok() and l1.restarts == 0
    l2_ok, l2_why = compare_runs(ref_dir, l2.out, nproc)
    l2_ok = l2_ok and l2.ok() and l2.restarts == 1
    sw_ok, sw_why = compare_runs(ref_dir, sw.out, nproc)
    ep3 = swap_episodes(sw)
    sw_ok = sw_ok and sw.ok() and sw.restarts == 0 and len(ep3) == 1
    dc_ok, dc_why = compare_runs(ref_dir, dc.out, nproc)
    ep4 = swap_episodes(dc)
    dc_ok = dc_ok and dc.ok() and dc.restarts == 0 and len(ep4) == 1
    ep1 = l1_episodes(l1)
    ep2 = l2_episodes(l2)

    table = Table(title="L1 repair phases (max over ranks)")
    for col in ("generation", "agree", "retire", "rebuild", "rebind", "validate", "release", "total", "refs rebound"):
        table.add_column(col, justify="right")
    for e in ep1:
        ph = e["phases_s"]
        table.add_row(str(e["generation"]), *(_ms(ph[k]) for k in ("agree", "retire", "rebuild", "rebind", "validate",
                                                                   "release", "total")), str(e["refs_rebound"]))
    console.print(table)

    t1 = next((e["fault_to_frontier_s"] for e in ep1 if e["fault_to_frontier_s"] is not None), None)
    t2 = next((e["fault_to_frontier_s"] for e in ep2 if e["fault_to_frontier_s"] is not None), None)
    summary = Table(title="L1 (preserve) vs L2 (restart)")
    for col in ("path", "outcome", "exit codes", "restarts", "replayed steps", "fault -> frontier", "bit-identical"):
        summary.add_column(col)
    l1_codes = sorted({r.get("exit_code") for r in l1.results.values()}, key=str)
    summary.add_row("L1", "finished" if l1.ok() else "FAILED", str(l1_codes), str(l1.restarts),
                    "0" if ep1 else "-", _ms(t1), "yes" if l1_ok else "NO")
    l2_first = ep2[0] if ep2 else {}
    summary.add_row("L2", "finished" if l2.ok() else "FAILED", str(l2_first.get("exit_codes", "-")), str(l2.restarts),
                    f"{l2_first.get('replayed_steps', '-')} (C={l2_first.get('resumed_from', '-')})", _ms(t2),
                    "yes" if l2_ok else "NO")
    e3 = ep3[0] if ep3 else {}
    t3 = e3.get("fault_to_frontier_s")
    summary.add_row("swap", "finished" if sw.ok() else "FAILED", "[]", str(sw.restarts),
                    "0 (step discarded, rerun)" if e3 else "-", _ms(t3), "yes" if sw_ok else "NO")
    e4 = ep4[0] if ep4 else {}
    t4 = e4.get("fault_to_frontier_s")
    summary.add_row("discard", "finished" if dc.ok() else "FAILED", "[]", str(dc.restarts),
                    "0 (step discarded, rerun)" if e4 else "-", _ms(t4), "yes" if dc_ok else "NO")
    console.print(summary)
    if e3:
        console.print(f"swap: rank(s) {e3['dead']} died in {e3.get('point') or args.fault_at}; spare(s) {e3['spares']} took "
                      f"their identity; state from replica(s) {e3['sources']}; resumed at F={e3['frontier']}; phases "
                      + " ".join(f"{k}={v:.0f}ms" for k, v in e3["durations_ms"].items()))
    if t1 and t2:
        console.print(f"fault-to-frontier: L1 {_ms(t1)} vs L2 {_ms(t2)} ({t2 / t1:.0f}x) in this run")
    if t3 and t2:
        console.print(f"fault-to-frontier of a crash: swap {_ms(t3)} vs L2 {_ms(t2)} ({t2 / t3:.1f}x) in this run")
    if t4 and t2:
        console.print(f"fault-to-frontier in flight: discard {_ms(t4)} vs L2 {_ms(t2)} ({t2 / t4:.1f}x) in this run")
    console.print(f"L1 final state: {l1_why}")
    console.print(f"L2 final state: {l2_why}")
    console.print(f"swap final state: {sw_why}")
    console.print(f"discard final state: {dc_why}")

    plot = None
    try:
        l2_front = max((r.get("t_frontier") or 0 for (a, _), r in l2.results.items() if a == 1), default=None)
        l2_fault = min((r.get("t_fault") for (a, _), r in l2.results.items() if a == 1 and r.get("t_fault")), default=None)
        l1_front = l1_fault = None
        if ep1 and t1 is not None:
            l1_front = max(r.get("t_frontier") or 0 for r in l1.results.values())
            l1_fault = l1_front - t1
        plot = timeline([(f"L1: boundary failure of the {group} group, repaired in place", l1, l1_fault, l1_front),
                         (f"L2: {args.fault_kind} in {args.fault_at}, rejected (70), torchrun restart, replay",
                          l2, l2_fault, l2_front or None)], out / "timeline.png")
    except Exception as exc:  # noqa: BLE001 - the plot is a convenience; the verdict does not depend on it
        console.print(f"[yellow]timeline plot not written[/yellow]: {type(exc).__name__}: {exc}")
    summary_json = {"l1": {"ok": l1_ok, "why": l1_why, "episodes": ep1, "restarts": l1.restarts},
                    "l2": {"ok": l2_ok, "why": l2_why, "episodes": ep2, "restarts": l2.restarts},
                    "swap": {"ok": sw_ok, "why": sw_why, "episodes": ep3, "restarts": sw.restarts},
                    "discard": {"ok": dc_ok, "why": dc_why, "episodes": ep4, "restarts": dc.restarts},
                    "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                    "wall_s": time.monotonic() - t_all}
    (out / "summary.json").write_text(json.dumps(summary_json, indent=1, default=str))
    console.print(f"traces: {RunDir(l1.out).trace(0, 0).parent}, {RunDir(l2.out).trace(0, 0).parent} (one file per attempt and rank)")
    if plot:
        console.print(f"timeline: {plot}")
    console.print(f"summary: {out / 'summary.json'} ({summary_json['wall_s']:.0f} s)")
    if not (l1_ok and l2_ok and sw_ok and dc_ok):
        if not l1.ok():
            console.print(f"[red]L1 run did not finish in place[/red] (rc={l1.returncode}); log tail:\n{l1.log_tail(1500)}")
        if not l2.ok():
            console.print(f"[red]L2 run did not finish[/red] (rc={l2.returncode}); log tail:\n{l2.log_tail(1500)}")
        if not sw_ok:
            console.print(f"[red]hot swap did not finish in place[/red] (rc={sw.returncode}, restarts {sw.restarts}); "
                          f"log tail:\n{sw.log_tail(1500)}")
        if not dc_ok:
            console.print(f"[red]in-flight discard did not finish in place[/red] (rc={dc.returncode}, restarts "
                          f"{dc.restarts}); log tail:\n{dc.log_tail(1500)}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelpact demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
