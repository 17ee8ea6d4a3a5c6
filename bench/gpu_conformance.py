"""``python -m accelpact.bench.gpu_conformance``: the conformance suite on NCCL, every rank on one GPU.

NCCL refuses two ranks of one communicator on one device when they look like one host (``init.cc``'s
duplicate-GPU check compares host hashes and bus ids); a distinct ``NCCL_HOSTID`` per rank makes each
rank a node of its own, talking over NET/Socket on loopback (../shared/notes/nccl-one-gpu.md).  With
``ACCELPACT_NCCL_ONE_GPU=1`` (:data:`accelpact.impl.runtime.backends.ONE_GPU_ENV`, the one place it is named)
:meth:`accelpact.impl.runtime.backends.Backend.prepare_process` puts every rank on ``cuda:0`` and sets
:func:`accelpact.impl.runtime.backends.one_gpu_env` before the first NCCL group, and
:meth:`~accelpact.impl.runtime.backends.Backend.unavailable` asks for one GPU, not one per rank.  This command
sets that variable for its children and runs, in order:

1. ``preflight`` (bound 120 s): two ranks on ``cuda:0`` (:func:`pair`), an NCCL default group and a
   ``new_group`` split, an all-reduce on each.  Checks: both on ``cuda:0``, distinct host ids, the
   sums.  If it fails, the suite is not run (every scenario would fail the same way).
2. ``pytest conformance/ --backend=nccl -k test_scenario_conforms`` on ``--subset``: ``fast`` (the
   default: conformance/test_conformance.py's ``FAST``, which holds the 2x2 repairs of each wrapper,
   the rejections, and five hot-swap scenarios with spares) or ``quick`` (:data:`QUICK`: the three
   wrappers' plain repair and one spare scenario), or ``--scenario SUBSTR`` (the suite's filter).
   ``--workers N`` runs it under pytest-xdist.

Bounded by ``--timeout`` (default 540 s, all of it together): past it pytest gets SIGINT (its
process sets kill their ranks), then SIGKILL.  Prints one JSON object (the last line): ``ok``, the
preflight's observations, pytest's exit code and the outcome of each scenario.  Exit codes: **0**
the preflight passed and every selected scenario passed; **1** anything failed, none ran, or the
bound was reached; **0** with ``{"ok": null, "skipped": reason}`` on a machine without CUDA (as
:mod:`accelpact.bench.gpu_check`).  spec/nccl.md, "Running on one lent GPU".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from accelpact.impl.runtime.backends import ONE_GPU_ENV, backend, wait_bounded
from accelpact.testing import run_ranks

__all__ = ["EXIT_FAILED", "QUICK", "main", "pair", "parse_outcomes", "pytest_command"]

EXIT_FAILED = 1
#: ``--subset quick``: one plain repair per wrapper and one hot swap onto a spare (5 processes).
QUICK = ("2x2-ddp-repair", "2x2-fsdp1-repair", "2x2-fsdp2-repair", "2x2-fsdp1-spare1-backward-crash-r1")
PREFLIGHT_S = 120.0
_NAME = re.compile(r"::test_scenario_conforms\[(?P<name>[^\]]+)\]")
_WORD = re.compile(r"\b(PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b")


def pair(ctx) -> dict:
    """The preflight's rank: ``prepare_process(rank)`` in one-GPU mode, NCCL groups, all-reduces."""
    import datetime

    import torch
    import torch.distributed as dist

    be = backend("nccl")
    dev = be.prepare_process(ctx.rank)
    td = datetime.timedelta(seconds=60)
    dist.init_process_group("nccl", store=dist.PrefixStore("pg/", ctx.store), rank=ctx.rank, world_size=ctx.world,
                            timeout=td, **be.init_kwargs(dev))
    t = torch.full((1,), float(ctx.rank + 1), device=dev)
    dist.all_reduce(t)
    g = dist.new_group(list(range(ctx.world)), backend="nccl", timeout=td, device_id=dev)
    u = torch.ones(1, device=dev)
    wait_bounded(g.allreduce([u]), 60.0)
    res = {"device": str(dev), "hostid": os.environ.get("NCCL_HOSTID"), "net": os.environ.get("NCCL_NET"),
           "default_sum": float(t[0]), "split_sum": float(u[0]),
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None}
    return res  # no destroy_process_group: the harness ends the rank with os._exit


def pytest_command(subset: str, scenario: str | None, workers: int) -> list[str]:
    """The pytest command line (run in the repository root)."""
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--backend=nccl"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if scenario:
        # one argument: a filter that begins with "-" ("-repair") is then not read as an option
        return cmd + ["conformance/", f"--scenario={scenario}", "-k", "test_scenario_conforms"]
    if subset == "quick":
        return cmd + [f"conformance/test_conformance.py::test_scenario_conforms[{n}]" for n in QUICK]
    return cmd + ["conformance/", "-k", "test_scenario_conforms"]


def parse_outcomes(text: str) -> dict[str, str]:
    """Scenario -> pytest outcome from ``pytest -v`` output (plain: ``nodeid OUTCOME``; under xdist:
    ``[gw0] [ 5%] OUTCOME nodeid``; the short summary: ``FAILED nodeid - why``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, word = _NAME.search(line), _WORD.search(line)
        if name and word:
            out[name.group("name")] = word.group(1)
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (pytest unwinds; each ProcessSet kills its ranks), then SIGKILL of pytest's group."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelpact.bench.gpu_conformance",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=540.0, help="bound on the whole command, seconds")
    parser.add_argument("--subset", default="fast", choices=("fast", "quick"), help="which scenarios (see the doc)")
    parser.add_argument("--scenario", default=None, help="only scenarios whose name contains this (overrides --subset)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (1: none)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({"ok": None, "skipped": f"torch is not installed ({exc})"}))
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print(json.dumps({"ok": None, "skipped": "no CUDA device on this machine: one-GPU NCCL conformance needs one GPU"}))
        return 0
    root = Path(__file__).resolve().parents[1]
    if not (root / "conformance" / "conftest.py").is_file():
        print(json.dumps({"ok": False, "explain": f"no conformance/ suite beside {root}: run from a source checkout"}))
        return EXIT_FAILED

    out = Path(args.out or tempfile.mkdtemp(prefix="accelpact-gpu-conformance-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    env = {**os.environ, ONE_GPU_ENV: "1"}
    summary: dict[str, Any] = {"ok": False, "one_gpu_env": ONE_GPU_ENV, "torch": torch.__version__,
                               "cuda": torch.version.cuda, "out": str(out)}
    # the rank function by its importable name (under ``python -m`` this module is __main__)
    import importlib

    rank_fn = importlib.import_module("accelpact.bench.gpu_conformance").pair
    run = run_ranks(rank_fn, 2, out / "preflight", timeout_s=min(PREFLIGHT_S, args.timeout), env={ONE_GPU_ENV: "1"})
    ranks = [r for r in (run.returns.get(0), run.returns.get(1)) if isinstance(r, dict)]
    pre_ok = run.ok and len(ranks) == 2
    if pre_ok:
        hostids = [r["hostid"] for r in ranks]
        pre_checks = {
            "every rank on cuda:0": all(r["device"] == "cuda:0" for r in ranks),
            "distinct NCCL_HOSTID": None not in hostids and len(set(hostids)) == 2,
            "all-reduces": all(r["default_sum"] == 3.0 and r["split_sum"] == 2.0 for r in ranks),
        }
        pre_ok = all(pre_checks.values())
        summary["preflight"] = {"ok": pre_ok, "ranks": ranks, "checks": pre_checks}
    else:
        summary["preflight"] = {"ok": False, "explain": run.explain(last=12), "hung": bool(run.hung)}
    summary["preflight"]["wall_s"] = round(time.monotonic() - t0, 2)
    if not pre_ok:
        summary["explain"] = "two NCCL ranks on cuda:0 did not work: the suite was not run"
        print(json.dumps(summary, default=str))
        return EXIT_FAILED
    cmd = pytest_command(args.subset, args.scenario, args.workers)
    summary["pytest"] = {"command": " ".join(cmd[1:])}
    log = out / "pytest.log"
    left = args.timeout - (time.monotonic() - t0)
    timed_out = False
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(max(left, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
    text = log.read_text(errors="replace")
    outcomes = parse_outcomes(text)
    counts: dict[str, int] = {}
    for o in outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    summary["pytest"].update({"returncode": proc.returncode, "timed_out": timed_out, "log": str(log),
                              "counts": counts, "scenarios": outcomes})
    if proc.returncode != 0 or timed_out:
        summary["pytest"]["tail"] = text[-4000:]
    summary["ok"] = (not timed_out and proc.returncode == 0 and counts.get("PASSED", 0) > 0
                     and not any(counts.get(k) for k in ("FAILED", "ERROR", "XPASS")))
    summary["wall_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(summary, default=str))
    return 0 if summary["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
