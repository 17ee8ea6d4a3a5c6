"""The torchft side of ``accelpact bench goodput``: two replica groups of one rank each, one fault.

Runs under an interpreter that has ``torchft`` (``--torchft-python`` of the goodput benchmark; never
imported by the rest of the package)::

    python -m accelpact.bench.torchft_run launch --steps 12 --fault-steps 4,8 --out DIR

``launch`` hosts a torchft ``LighthouseServer`` (min 2 replicas, 100 ms quorum tick) and starts two
``replica`` processes.  Each replica hosts its own TCPStore, builds the workload's model
(:mod:`accelpact.impl.launch.workload`, the same ``CharLM`` and batches as AccelPact's DDP job), reduces
each gradient through ``Manager.allreduce`` over a ``torchft.ProcessGroupGloo`` and steps through
``torchft.optim.OptimizerWrapper``, with a synchronous quorum at every step (``zero_grad``).
(``torchft.ddp.DistributedDataParallel`` is not used: with torchft 0.2.0 on torch 2.13 its comm hook
fails ``assert fut._fut`` when the all-reduce errors, so a failed step raises instead of being
discarded.)

The fault is AccelPact's ``collective_timeout`` at the boundary: after step ``s - 1`` committed
(``s`` in ``--fault-steps``), replica 1 shuts down the connected sockets of its current gloo communicator
(:func:`accelpact.impl.runtime.revoke.hard_close` on the sockets recorded while ``configure`` built it).
torchft sees the failure in the next step's gradient all-reduce, votes not to commit, and
reconfigures at the next quorum.  Each replica writes, per step: quorum start, quorum ready (the
replica group can train again), end, committed; and the duration of every ``configure``.
``--pad-s`` sleeps at the start of every step (after the quorum), as AccelPact's workload pads its
steps (``WorkloadSpec.pad_s``): the step's device time.
``launch`` prints one JSON object with, per fault: ``fault_to_detect_s`` = the fault until the
step it failed ended on both replicas (not committed), ``fault_to_frontier_s`` = the fault until both
replicas are ready again (quorum and ``configure`` done) for the step the fault interrupted, and
``fault_to_commit_s`` = until that step is committed on both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from accelpact.impl.launch import workload
from accelpact.impl.runtime import revoke

__all__ = ["main"]


def replica(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    torch.set_num_threads(1)
    rid = args.replica_id
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=args.timeout))
    configures: list[float] = []
    records: list[Any] = []
    original = pg.configure

    def configure(*a: Any, **k: Any) -> None:
        t = time.monotonic()
        _, rec = revoke.recorded(lambda: original(*a, **k))
        configures.append(time.monotonic() - t)
        records.append(rec)

    pg.configure = configure  # record the sockets each configure() opens (the fault closes them)
    spec = workload.WorkloadSpec(wrapper="ddp", layers=args.layers)
    torch.manual_seed(spec.seed)
    model = workload.CharLM(workload.vocab_size(), spec)
    optim = torch.optim.AdamW(model.parameters(), lr=spec.lr, foreach=False)
    manager = Manager(pg=pg, min_replica_size=2, load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                                                              optim.load_state_dict(sd["optim"])),
                      state_dict=lambda: {"model": model.state_dict(), "optim": optim.state_dict()},
                      replica_id=str(rid), store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, use_async_quorum=False, init_sync=False,
                      timeout=timedelta(seconds=args.timeout), quorum_timeout=timedelta(seconds=args.timeout),
                      connect_timeout=timedelta(seconds=30))
    opt = OptimizerWrapper(manager, optim)
    cursor = workload.DataCursor(spec.seed, spec.batch, spec.seq, dp_index=rid, dp_size=2)
    rows = []
    faults: list[float] = []
    pending = sorted(args.fault_steps) if rid == args.victim else []
    iters = 0
    while manager.current_step() < args.steps and iters < 3 * args.steps:
        iters += 1
        t0 = time.monotonic()
        opt.zero_grad()  # start_quorum: synchronous, reconfigures the gloo group when the quorum changed
        t_ready = time.monotonic()
        step = manager.current_step()
        if args.pad_s:
            time.sleep(args.pad_s)  # the step's device time, as AccelPact's workload pads it (WorkloadSpec.pad_s)
        x, y = cursor.batch(step)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        # one all-reduce per gradient through the manager (as AccelPact's DDP workload reduces each
        # gradient on its own); an error is recorded by the manager and the step is not committed
        works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
        for w in works:
            w.wait()
        opt.step()  # should_commit, then the optimizer step if committed
        committed = manager.current_step() > step
        rows.append({"step": step, "t_start": t0, "t_ready": t_ready, "t_end": time.monotonic(), "committed": committed,
                     "quorum_id": manager._quorum_id})
        if committed and pending and manager.current_step() == pending[0]:
            pending.pop(0)
            faults.append(time.monotonic())  # the boundary after step fault_step - 1 committed
            revoke.hard_close(records[-1])
    manager.shutdown(wait=False)
    Path(args.out).write_text(json.dumps({"replica": rid, "rows": rows, "faults": faults, "configure_s": configures,
                                          "final_step": manager.current_step()}))
    sys.stdout.flush()
    os._exit(0)


def _span(t_fault: float, ends: list[float | None], replicas: int) -> float | None:
    """The fault until the last replica's ``ends``; None unless both replicas have one."""
    got = [e for e in ends if e is not None]
    return (max(got) - t_fault) if replicas == 2 and len(got) == 2 else None


def launch(args: argparse.Namespace) -> int:
    from torchft._torchft import LighthouseServer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000, quorum_tick_ms=100,
                                  heartbeat_timeout_ms=args.heartbeat_ms)
    t0 = time.monotonic()
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for rid in (0, 1):
        cmd = [sys.executable, "-m", "accelpact.bench.torchft_run", "replica", "--replica-id", str(rid),
               "--lighthouse", lighthouse.address(), "--steps", str(args.steps), "--fault-steps", ",".join(map(str, args.fault_steps)),
               "--victim", "1", "--layers", str(args.layers), "--pad-s", str(args.pad_s), "--timeout", str(args.timeout),
               "--out", str(out / f"replica-{rid}.json")]
        log = open(out / f"replica-{rid}.log", "wb")  # noqa: SIM115 - closed with the process below
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    timed_out = False
    for p, log in procs:
        try:
            p.wait(timeout=max(1.0, args.bound - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            p.kill()
            p.wait()
        log.close()
    lighthouse.shutdown()
    res: dict[str, Any] = {"timed_out": timed_out, "codes": [p.returncode for p, _ in procs], "wall_s": time.monotonic() - t0}
    reps = []
    for rid in (0, 1):
        f = out / f"replica-{rid}.json"
        if f.exists():
            reps.append(json.loads(f.read_text()))
    res["replicas"] = reps
    t_faults = sorted(t for r in reps for t in r.get("faults", []))
    res["faults"] = []
    for i, t_fault in enumerate(t_faults):
        t_next = t_faults[i + 1] if i + 1 < len(t_faults) else float("inf")
        ready, commit, detect = [], [], []
        for r in reps:
            after = [x for x in r["rows"] if t_fault < x["t_end"] < t_next]
            failed = [x for x in after if not x["committed"]]
            detect.append(failed[0]["t_end"] if failed else None)
            retry = next((x for x in after if failed and x["t_start"] >= failed[0]["t_end"]), None)
            done = next((x for x in after if x["committed"]), None)
            ready.append(retry["t_ready"] if retry else None)
            commit.append(done["t_end"] if done else None)
        res["faults"].append({
            "t_fault": t_fault, "failed_steps": len(reps) and max(sum(1 for x in r["rows"] if t_fault < x["t_end"] < t_next
                                                                         and not x["committed"]) for r in reps),
            "fault_to_detect_s": _span(t_fault, detect, len(reps)),
            "fault_to_frontier_s": _span(t_fault, ready, len(reps)), "fault_to_commit_s": _span(t_fault, commit, len(reps))})
    ok_rows = [x["t_end"] - x["t_start"] for r in reps for x in r["rows"] if x["committed"] and x["step"] > 1]
    res["step_s"] = sorted(ok_rows)[len(ok_rows) // 2] if ok_rows else None
    res["configure_s"] = [c for r in reps for c in r["configure_s"]]
    res["final_steps"] = [r.get("final_step") for r in reps]
    print(json.dumps(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelpact.bench.torchft_run")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("launch", "replica"):
        q = sub.add_parser(name)
        q.add_argument("--steps", type=int, default=12)
        q.add_argument("--fault-steps", type=lambda t: [int(x) for x in t.split(",") if x], default=[6])
        q.add_argument("--layers", type=int, default=2)
        q.add_argument("--pad-s", type=float, default=0.0)
        q.add_argument("--timeout", type=float, default=30.0)
        q.add_argument("--out", required=True)
        if name == "launch":
            q.add_argument("--heartbeat-ms", type=int, default=1000)
            q.add_argument("--bound", type=float, default=300.0)
        else:
            q.add_argument("--replica-id", type=int, required=True)
            q.add_argument("--lighthouse", required=True)
            q.add_argument("--victim", type=int, default=1)
    args = p.parse_args(argv)
    return launch(args) if args.cmd == "launch" else replica(args)


if __name__ == "__main__":
    sys.exit(main())
