"""``accelpact soak``: one long training job under a seeded storm of external faults, then the judge.

    accelpact soak --minutes 10 --seed 1 [--wrapper fsdp1-hybrid|fsdp2-hybrid|ddp] [--nodes 2 --ranks-per-node 2]
                   [--spares 1] [--launcher torchrun|restarting] [--out runs/soak]
    accelpact soak --replay runs/soak/schedule.json

1. The schedule is drawn from the seed (or read back with ``--replay``), printed, and saved to
   ``OUT/schedule.json`` before anything runs.
2. The step count: ``--steps``, the schedule's (a replay), or chosen from a measured step time
   (a short fault-free run) so that training alone takes about half of ``--minutes``; it is saved
   into the schedule.
3. The fault-free reference of that many steps (cached, ``--ref-cache``).
4. The job (``OUT/run``): torchrun (``--launcher torchrun``; each rank behind the keeper when
   ``--spares`` > 0), or ``launch.run_restarting`` (a store process per attempt, so the store can be
   lost), with as many restarts as there are faults; meanwhile this process strikes the schedule
   (:class:`~accelpact.testing.soak.injector.Injector`) for ``--minutes`` from the first committed
   step, then lets the job finish.
5. The judge (:mod:`accelpact.testing.soak.judge`); the summary; ``OUT/soak.json`` (everything);
   ``OUT/timeline.png``.

Exit status: 0 the judge is green, 1 red (each failure names the seed and the episode), 2 a bad
flag (the message names it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .schedule import SOAK_KINDS, LAUNCHERS, SoakConfig, SoakError, draw, load, unavailable_kinds
from .injector import Injector
from .judge import _steps, judge
from .live import Live
from .report import print_schedule, print_summary, summary_counts, timeline
from ..netns import available as netns_available
from ...conformance.runner import DEFAULT_CACHE
from ...impl.launch.job import Job, Topology, Workload
from ...impl.launch.launch import LaunchError, run_local, run_reference, run_restarting, run_torchrun
from ...impl.rundir import RunDir

__all__ = ["add_arguments", "config_from_args", "run", "soak"]

#: the share of --minutes that training alone should take (the rest: recovery, restarts, replays)
TRAIN_SHARE = 0.5
CALIBRATION_STEPS = 40


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SoakConfig()
    p.add_argument("--minutes", type=float, default=None, help=f"how long faults are struck (default {d.minutes:g})")
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed (default 0)")
    p.add_argument("--wrapper", default=None, help="a wrapper of impl/runtime/wrappers.py: fsdp1-hybrid (default), fsdp1-zero2, fsdp2-hybrid or ddp")
    p.add_argument("--nodes", type=int, default=None, help=f"simulated nodes (default {d.nodes})")
    p.add_argument("--ranks-per-node", type=int, default=None, help=f"ranks per node (default {d.ranks_per_node})")
    p.add_argument("--spares", type=int, default=None, help=f"spare processes for hot swap (default {d.spares})")
    p.add_argument("--launcher", default=None, help=f"one of {', '.join(LAUNCHERS)} (default torchrun; "
                                                       "restarting: the store can be killed)")
    p.add_argument("--layers", type=int, default=None, help=f"transformer blocks (default {d.layers})")
    p.add_argument("--checkpoint-every", type=int, default=None, help=f"DCP checkpoint period in steps (default {d.checkpoint_every})")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: from a measured step time)")
    p.add_argument("--fault-every", type=float, default=None, help=f"mean seconds between faults (default {d.fault_every_s:g})")
    p.add_argument("--recovery-share", type=float, default=None, help="share of faults struck during an episode (default 0.2)")
    p.add_argument("--kinds", default=None, help=f"comma-separated fault kinds (default all: {','.join(SOAK_KINDS)})")
    p.add_argument("--deadline", type=float, default=None, help="each recovery phase's wait on peers, seconds (default 20)")
    p.add_argument("--collective-timeout", type=float, default=None,
                   help=f"the training groups' collective timeout, seconds (default {d.collective_timeout_s:g}): what bounds "
                        "a gloo op a revoke cannot wake (bench/README.md, K6)")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="a step's micro-batches: the worker opts in to shrink and grow (a death with no spare idle "
                        "shrinks the job, no restart; README 'Shrink and grow'); default: the replica count; "
                        "0: not opted in (a death with no spare idle restarts the job)")
    p.add_argument("--checkpoint", choices=("sync", "async"), default=None,
                   help="how the worker's checkpoints are taken: attach(checkpoint=...) (default sync)")
    p.add_argument("--seeded-bug", default=None, help="run a deliberately broken engine (tests: the judge must fail)")
    p.add_argument("--replay", default=None, help="a saved schedule.json to run again (its seed, configuration and faults)")
    p.add_argument("--out", default="runs/soak", help="output folder (default runs/soak)")
    p.add_argument("--ref-cache", default=None, help="where fault-free references are cached (default ~/.cache/accelpact/refs)")
    p.add_argument("--timeout", type=float, default=None, help="bound on the job, seconds (default 3 x minutes + 15 min)")
    p.add_argument("--quiet", action="store_true", help="no per-fault lines while it runs")
    p.add_argument("--stall", type=float, default=300.0, help="seconds without a committed step, a record or an exit "
                                                                "after which the job is stalled: ended, judged red (default 300)")
    p.add_argument("--strict", action="store_true", help="a known engine bug the soak meets fails the judge too "
                                                         "(default: listed, not counted)")
    p.add_argument("--rejudge", default=None, metavar="DIR",
                   help="judge a finished soak's folder again (its soak.json) without running anything")


#: flag (its argparse dest) -> SoakConfig field: the same name, but for two that carry their unit
_FLAGS = {**{f: f for f in SoakConfig.__dataclass_fields__ if f not in ("fault_every_s", "deadline_s", "collective_timeout_s")},
          "fault_every": "fault_every_s", "deadline": "deadline_s", "collective_timeout": "collective_timeout_s"}


def config_from_args(args: argparse.Namespace) -> SoakConfig:
    """The configuration of the flags (SoakError names the flag of a bad value).  With ``--replay``
    the schedule's configuration is used and a flag that would change it is refused."""
    given = {f: getattr(args, a) for a, f in _FLAGS.items() if getattr(args, a, None) is not None}
    if "kinds" in given:
        given["kinds"] = tuple(k.strip() for k in str(given["kinds"]).split(",") if k.strip())
    if args.replay:
        shaping = sorted(f"--{a.replace('_', '-')}" for a in _FLAGS if getattr(args, a, None) is not None)
        if shaping:
            raise SoakError(f"--replay runs the schedule's own configuration: drop {', '.join(shaping)}")
        return load(args.replay).config
    return SoakConfig(**given).check()


def _calibrate(cfg: SoakConfig, out: Path, timeout_s: float) -> float:
    """Median seconds per step of a short fault-free run of the soak's workload (no spares)."""
    job = Job(topology=Topology(cfg.nodes, cfg.ranks_per_node), workload=Workload(cfg.wrapper, cfg.layers, CALIBRATION_STEPS,
              0, 0, micro_batches=cfg.micro_batch_count), out=str(out), scenario="soak-calibration", trace=False)
    res = run_local(job, timeout_s=timeout_s)
    if not res.ok():
        raise LaunchError(f"the calibration run failed (rc {res.returncode}); see {res.log}")
    rows = _steps(RunDir(out), 0, cfg.world)
    ts = sorted(rows[0].items())
    dts = [b[1] - a[1] for a, b in zip(ts[10:], ts[11:], strict=False)]
    return statistics.median(dts) if dts else 0.1


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d))
    return out


def _kill_launch() -> None:
    """SIGKILL the process group of every child of this process (the launcher's: agent and workers)."""
    for c in _children(os.getpid()):
        try:
            os.killpg(c, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def soak(cfg: SoakConfig, out: Path, *, schedule: Any = None, ref_cache: str | None = None, timeout_s: float | None = None,
         console: Any = None, quiet: bool = False, strict: bool = False, stall_s: float = 300.0) -> tuple[Any, dict[str, Any]]:
    """Run one soak (module doc); returns (verdict, the summary written to ``out/soak.json``)."""
    from rich.console import Console

    console = console or Console()
    out.mkdir(parents=True, exist_ok=True)
    t_wall = time.monotonic()
    sched = schedule if schedule is not None else draw(cfg, unavailable_kinds(cfg, netns_why=netns_available()))
    cfg = sched.config
    sched_path = sched.save(out / "schedule.json")
    print_schedule(console, sched)
    console.print(f"schedule saved: {sched_path} (replay: accelpact soak --replay {sched_path})", highlight=False)

    bound = timeout_s or cfg.minutes * 60 * 3 + 900
    if cfg.steps is None:
        step_s = _calibrate(cfg, out / "calibration", 300)
        steps = max(30, int(cfg.minutes * 60 * TRAIN_SHARE / max(step_s, 1e-3)))
        console.print(f"measured {step_s * 1e3:.0f} ms per step: {steps} steps (about {TRAIN_SHARE:.0%} of "
                      f"{cfg.minutes:g} min of training)", highlight=False)
        sched = sched.with_steps(steps)
        cfg = sched.config
        sched.save(sched_path)
    assert cfg.steps is not None
    run_dir = out / "run"
    job = Job(topology=Topology(cfg.nodes, cfg.ranks_per_node, spares=cfg.spares),
              workload=Workload(cfg.wrapper, cfg.layers, cfg.steps, 0, cfg.checkpoint_every,
                                micro_batches=cfg.micro_batch_count, checkpoint=cfg.checkpoint), out=str(run_dir),
              scenario=f"soak-seed{cfg.seed}", trace=True, deadline_s=cfg.deadline_s,
              collective_timeout_s=cfg.collective_timeout_s, seeded_bug=cfg.seeded_bug)
    console.print(f"fault-free reference of {cfg.steps} steps ...", highlight=False)
    ref = run_reference(job, ref_cache or DEFAULT_CACHE, timeout_s=max(600.0, cfg.steps * 1.0))

    RunDir(run_dir).clear()
    restarts = len(sched.faults) + 3
    box: dict[str, Any] = {}

    def launch() -> None:
        try:
            if cfg.launcher == "torchrun":
                box["res"] = run_torchrun(job, max_restarts=restarts, timeout_s=bound)
            else:
                box["res"] = run_restarting(job, max_restarts=restarts, timeout_s=bound)
        except BaseException as exc:  # noqa: BLE001 - reported by the judge as an unfinished job
            box["error"] = exc

    live = Live(run_dir, cfg.world, cfg.spares)
    inj = Injector(sched, live, job.topology, log=(lambda s: None) if quiet else (lambda s: console.print(s, highlight=False)),
                   stall_s=stall_s)
    th = threading.Thread(target=launch, name="accelpact-soak-launch")
    mb = cfg.micro_batch_count
    console.print(f"job: {cfg.launcher}, {cfg.world} ranks + {cfg.spares} spare(s), up to {restarts} restarts, "
                  f"bounded by {bound:.0f}s; " + (f"{mb} micro-batches a step (shrink and grow, ACCELPACT_KEEP=1)"
                                                    if mb else "no micro-batches (no shrink)") + f"; output in {run_dir}",
                  highlight=False)
    th.start()
    try:
        done = lambda: not th.is_alive()  # noqa: E731 - a predicate
        if inj.wait_training(min(bound, 600.0), done):
            console.print(f"training started; striking for {cfg.minutes:g} min", highlight=False)
            inj.run(inj.t0 + cfg.minutes * 60.0, done)  # type: ignore[operator]  # t0 set by wait_training
        if inj.stalled:  # the judge says so; the processes the launcher would wait for are ended here
            console.print(f"[red]the job stalled[/red]: {inj.stalled}; ending it", highlight=False)
            _kill_launch()
        th.join(timeout=bound + 60)
    except BaseException:
        inj.close()
        _kill_launch()
        th.join(timeout=30)
        raise
    finally:
        inj.close()
    if th.is_alive():  # pragma: no cover - the launcher bounds itself
        _kill_launch()
        th.join(timeout=30)
    res = box.get("res")
    launch_info = {"returncode": getattr(res, "returncode", None), "timed_out": bool(getattr(res, "timed_out", True)),
                   "restarts": getattr(res, "restarts", None), "wall_s": getattr(res, "wall_s", None),
                   "error": repr(box["error"]) if "error" in box else None, "stalled": inj.stalled}
    strikes = [s.to_json() for s in inj.strikes]
    verdict = judge(run_dir, seed=cfg.seed, world=cfg.world, spares=cfg.spares, strikes=strikes,
                    samples=[x.to_json() for x in inj.samples], reference=ref, launch=launch_info, deadline_s=cfg.deadline_s,
                    checkpoint_every=cfg.checkpoint_every, strict=strict)
    wall = time.monotonic() - t_wall
    print_summary(console, verdict, sched, wall)
    t0_ns = int((inj.t0 or time.monotonic()) * 1e9)
    png = timeline(out / "timeline.png", run_dir, verdict, cfg.world, t0_ns)
    summary = {"schedule": str(sched_path), "config": cfg.to_json(), "launch": launch_info, "wall_s": round(wall, 1),
               "reference": str(ref), "strikes": strikes,
               "t0_ns": t0_ns, "counts": summary_counts(verdict), "verdict": verdict.to_json(),
               "samples": [x.to_json() for x in inj.samples], "timeline": str(png) if png else None}
    (out / "soak.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    console.print(f"summary: {out / 'soak.json'}" + (f"; timeline: {png}" if png else ""), highlight=False)
    return verdict, summary


def rejudge(out: Path, console: Any = None, strict: bool = False) -> Any:
    """The judge again on a finished soak's folder (``soak.json``: its strikes, samples, reference);
    the new verdict replaces the old one there (``rejudged``), with the timeline."""
    from rich.console import Console

    console = console or Console()
    try:
        saved = json.loads((out / "soak.json").read_text())
    except (OSError, ValueError) as exc:
        raise SoakError(f"--rejudge: {out / 'soak.json'} is not a soak summary ({exc})") from None
    sched = load(saved["schedule"])
    cfg = sched.config
    verdict = judge(out / "run", seed=cfg.seed, world=cfg.world, spares=cfg.spares, strikes=saved.get("strikes") or
                    saved["verdict"]["strikes"], samples=saved.get("samples") or (), reference=saved.get("reference"),
                    launch=saved.get("launch"), deadline_s=cfg.deadline_s, checkpoint_every=cfg.checkpoint_every,
                    strict=strict)

    print_summary(console, verdict, sched, float(saved.get("wall_s") or 0))
    timeline(out / "timeline.png", out / "run", verdict, cfg.world, int(saved.get("t0_ns") or 0))
    saved.update(verdict=verdict.to_json(), counts=summary_counts(verdict), strikes=verdict.strikes, rejudged=True)
    (out / "soak.json").write_text(json.dumps(saved, indent=1, default=str) + "\n")
    return verdict


def run(args: argparse.Namespace) -> int:
    if args.rejudge:
        try:
            return 0 if rejudge(Path(args.rejudge), strict=args.strict).green else 1
        except SoakError as exc:
            print(f"accelpact soak: error: {exc}", file=sys.stderr)
            return 2
    try:
        cfg = config_from_args(args)
        schedule = load(args.replay) if args.replay else None
        if args.timeout is not None and not args.timeout > 0:
            raise SoakError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        if not args.stall >= 30:
            raise SoakError(f"--stall must be a number of seconds >= 30, got {args.stall}")
    except SoakError as exc:
        print(f"accelpact soak: error: {exc}", file=sys.stderr)
        return 2
    verdict, _ = soak(cfg, Path(args.out), schedule=schedule, ref_cache=args.ref_cache, timeout_s=args.timeout,
                      quiet=args.quiet, strict=args.strict, stall_s=args.stall)
    return 0 if verdict.green else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelpact soak", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
