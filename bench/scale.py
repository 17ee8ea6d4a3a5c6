"""``accelpact bench scale``: what an episode and a fault-free step cost per rank as W grows, counted
by instrumentation, then a cost model with published per-operation figures to 1,024 and 16,384 ranks
beside a modelled torchrun restart of the same job.

For each W (``--worlds``, default 4,8,16,32,64; ``--quick`` 4,8) one job of real processes on
loopback (:func:`accelpact.impl.launch.launch.run_local`: the launcher hosts the store) runs the
thin workload (``fsdp1-hybrid``, 1 layer) in the HSDP shape 2 replicas x W/2 shards (R = replicate
groups of 2; ``Topology(2, W/2)``) with one spare when a swap is asked for, and plays one episode of
each kind (``--episodes``, default ``repair,link,discard,swap``) three steps apart after two
fault-free warm-up steps:

* ``repair``: the replicate group of the last local index breaks at the boundary (``collective_timeout``
  on both its members, as conformance ``2x2-fsdp1-repair``): L1 repair in place;
* ``link``: every connection between rank 0 and rank W/2 is cut at the boundary (``link_cut``, as
  ``2x2-fsdp1-link-r0-r2-boundary``);
* ``discard``: the same replicate group breaks in forward (``inflight-forward``): the step is discarded
  in place and every group rebuilt (the worker's ``rebuild=``);
* ``swap``: rank W-1 is SIGKILLed at the boundary (``crash``, ``spare1-boundary-crash``): the spare takes
  its identity.

Every rank runs with ``ACCELPACT_COUNT=<dir>`` (:mod:`accelpact.impl.runtime.counting`) and this
module's worker (:func:`worker_main`: the harness's worker with one snapshot after every
``Training.boundary``), so each process leaves ``counts-p<pid>.ndjson``: the cumulative counts after
each committed step.  A step's cost is the delta between two snapshots; an episode's is the delta
over its window (the step it struck and the next, where the retired groups go and the new ones first
serve) minus twice the rank's median fault-free step.  Counted per rank: process-group creations,
new sockets (connections), store operations (the engine's, main thread; background threads and the
test harness's fault fences apart), collectives and their sequential rounds (gloo's algorithms,
``counting.GLOO_ROUNDS``), wall time.

The growth class of each count from W = 8 up (constant / log / linear / quadratic, least squares,
:func:`growth_class`), the cost model (:data:`CONSTANTS`, each with its source: spec/scale-costs.md)
and a verdict per criterion of issue 40 are printed, written as JSON (``--json``) and drawn
(``--plot``).  The verdicts report what this tree does; nothing is assumed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import common
from accelpact.impl.flag import FLAG_METHOD_ENV
from accelpact.impl.launch import launch
from accelpact.impl.launch import training as _training
from accelpact.impl.launch.job import Job, Topology, Workload
from accelpact.impl.runtime import counting
from accelpact.testing import worker as _worker

__all__ = ["CONSTANTS", "add_arguments", "growth_class", "measure_world", "model_episode_s", "model_restart_s",
           "model_step_s", "run", "worker_main"]

EPISODE_KINDS = ("repair", "link", "discard", "swap")
DEFAULT_WORLDS = "4,8,16,32,64"
WARMUP = 2          # fault-free steps before the first episode
GAP = 3             # steps from one episode to the next (the episode's step, the next, one fault-free)
STEP_BUDGET_S = 1.0  # the fault-free step the control cost is set against (issue 40)

#: Per-operation figures of the cost model, each with its source (spec/scale-costs.md).  The two
#: loopback figures are measured by this benchmark in this run (:func:`measure_primitives`) and
#: replace the defaults below; on a datacenter network they are larger (the model is then optimistic
#: for AccelPact's terms and the comparison with the restart, whose figures are published ones, favours
#: AccelPact less than it seems).
CONSTANTS: dict[str, dict[str, Any]] = {
    "store_ops_per_s": {"value": 79_700.0, "unit": "ops/s",
                        "source": "one TCPStore on this kind of machine, `accelpact bench controlplane` (bench/README.md, "
                                  "'Control plane vs W')"},
    "store_rtt_s": {"value": 100e-6, "unit": "s", "source": "one store round trip, loopback: measured by this benchmark "
                                                             "(default until measured)"},
    "hop_s": {"value": 100e-6, "unit": "s", "source": "one gloo point-to-point exchange of a few bytes, loopback: measured "
                                                       "by this benchmark (default until measured)"},
    "connect_s": {"value": 100e-6, "unit": "s", "source": "one TCP connect + accept, loopback: measured by this benchmark "
                                                           "(default until measured)"},
    "group_create_s": {"value": 0.0, "unit": "s",
                       "source": "a group of constant size (<= 8): its store operations and connections are counted and "
                                 "priced apart, no further term"},
    "gloo_init_fixed_s": {"value": {2048: 18.0, 4096: 25.0, 8192: 85.0}, "unit": "s per full-W gloo group",
                          "source": "pytorch/gloo#408 (Meta): gloo full-mesh init with multi_get and rank-as-sequence, "
                                    "18 / 25 / 85 s at 2k / 4k / 8k ranks; log-log inter/extrapolated"},
    "gloo_init_s": {"value": {2048: 82.0, 4096: 393.0, 8192: 3300.0}, "unit": "s per full-W gloo group",
                    "source": "pytorch/gloo#408 (Meta): gloo full-mesh init over a TCPStore, 82 s / 393 s / ~55 min at "
                              "2k / 4k / 8k ranks (torch as shipped)"},
    "nccl_init_large_s": {"value": 150.0, "unit": "s", "source": "NVIDIA/nccl#1156: 2.5-minute ncclCommInitRank at large "
                                                                  "scale (reference only, not in the totals: this job is gloo)"},
    "restart_fixed_s": {"value": 2.6, "unit": "s",
                        "source": "torchrun restart exit-to-ready on 2 CPU ranks (agent restart, imports, rendezvous), "
                                  "bench/README.md goodput"},
    "replay_s": {"value": 0.0, "unit": "s",
                 "source": "replay since the last checkpoint and its load: 0 here (a lower bound for the restart; FT-HSDP, "
                           "arXiv 2602.00277, reports a 10 min stall at ~100k GPUs)"},
}


# ---------------------------------------------------------------------------------------- the worker

def worker_main(argv: list[str] | None = None) -> int:
    """``python -m accelpact.bench.scale --worker --job J``: :mod:`accelpact.testing.worker` with a
    counting snapshot after every ``Training.boundary`` (this benchmark's side, nothing in impl)."""
    orig = _training.Training.boundary

    def boundary(self, loss=None):
        out = orig(self, loss)
        counting.snapshot("boundary", frontier=self.frontier, rank=getattr(self.job, "rank", None),
                          reports=len(getattr(self, "reports", ()) or ()), swaps=len(getattr(self, "swaps", ()) or ()))
        return out

    _training.Training.boundary = boundary  # type: ignore[method-assign]  # this worker's snapshot after each boundary
    return _worker.main(argv)


# ------------------------------------------------------------------------------------------ the job

def _schedule(kinds: list[str]) -> dict[str, int]:
    """The step of each episode: after WARMUP fault-free steps, GAP apart, in ``kinds`` order."""
    return {k: WARMUP + 1 + GAP * i for i, k in enumerate(kinds)}


def _faults(kinds: list[str], world: int) -> list[dict[str, Any]]:
    m = world // 2
    pair = [m - 1, world - 1]  # the replicate group of the last local index
    at = _schedule(kinds)
    table = {
        "repair": {"at": "boundary", "kind": "collective_timeout", "ranks": pair, "group": "replicate"},
        "link": {"at": "boundary", "kind": "link_cut", "ranks": [0, m], "group": "replicate"},
        "discard": {"at": "forward", "kind": "collective_timeout", "ranks": pair, "group": "replicate"},
        "swap": {"at": "boundary", "kind": "crash", "ranks": [world - 1], "group": "replicate"},
    }
    return [{"step": at[k], **table[k]} for k in kinds]


def _launch(world: int, kinds: list[str], out: Path, timeout: float) -> tuple[Any, Path]:
    """One job (module doc) under :func:`run_local`, every rank counting into ``out/counts``."""
    counts = out / "counts"
    if counts.exists():
        for p in counts.glob("counts-p*.ndjson"):
            p.unlink()
    spares = 1 if "swap" in kinds else 0
    steps = WARMUP + 1 + GAP * len(kinds) + 1
    job = Job(topology=Topology(2, world // 2, spares=spares), workload=Workload("fsdp1-hybrid", 1, steps, 0, 0),
              out=str(out / "run"), scenario=f"bench-scale-{world}", backend="gloo", trace=False, deadline_s=30.0,
              # W + 1 processes on a few shared cores: a heartbeat thread can wait for a core longer than
              # the detector's 0.8 s default (conformance/scenario.py does the same); counts, not detection speed
              collective_timeout_s=60.0, dead_after_s=5.0).replace(faults=_faults(kinds, world))
    saved_env = {k: os.environ.get(k) for k in ("ACCELPACT_COUNT", "TORCH_CPP_LOG_LEVEL", FLAG_METHOD_ENV)}
    saved_mod = launch.WORKER_MODULE
    os.environ["ACCELPACT_COUNT"] = str(counts)
    # the failure flag and the commit fence as a large world runs them (recursive doubling above
    # flag.RING_MAX_WORLD ranks): measured on every W, so the fit is the algorithm the scale runs
    os.environ[FLAG_METHOD_ENV] = "doubling"
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    launch.WORKER_MODULE = "accelpact.bench.scale"  # this module's worker (worker_main), by run_local's own spawn
    try:
        res = launch.run_local(job, timeout_s=timeout)
    finally:
        launch.WORKER_MODULE = saved_mod
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return res, counts


# ----------------------------------------------------------------------------------------- analysis

def _sum(counts: dict[str, int], category: str, *, origins: tuple[str, ...] | None = None, thread: str | None = None,
         exclude_origins: tuple[str, ...] = ()) -> int:
    total = 0
    for key, v in counts.items():
        parts = key.split("/")
        if parts[0] != category or len(parts) < 4:
            continue
        origin, th = parts[1], parts[2]
        if origins is not None and origin not in origins:
            continue
        if origin in exclude_origins:
            continue
        if thread == "main" and th != "main":
            continue
        if thread == "background" and th == "main":
            continue
        total += v
    return total


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """The metrics between two snapshots (``a`` before ``b``) of one process."""
    ca, cb = a["counts"], b["counts"]
    d = {k: cb.get(k, 0) - ca.get(k, 0) for k in set(ca) | set(cb)}
    d = {k: v for k, v in d.items() if v}
    eng = ("engine", "native", "other")
    return {
        "groups": _sum(d, "groups", exclude_origins=("harness",)),
        "groups_wide": sum(v for k, v in d.items() if k.startswith("groups/") and k.endswith(f"@{b['world']}")),
        "connections": b["sockets_new"],
        "store_ops": _sum(d, "store", origins=eng, thread="main"),
        # the ones that wait for the store's answer (``set`` does not): what lies on the step's path
        "store_rtts": _sum({k: v for k, v in d.items() if not k.endswith("/set")}, "store", origins=eng, thread="main"),
        "store_ops_background": _sum(d, "store", origins=eng, thread="background"),
        "store_ops_harness": _sum(d, "store", origins=("harness",)),
        "collectives": _sum(d, "coll", origins=eng),
        "rounds": _sum(d, "rounds", origins=eng),
        "collectives_workload": _sum(d, "coll", origins=("workload",)),
        "rounds_workload": _sum(d, "rounds", origins=("workload",)),
        "wall_s": b["t"] - a["t"],
        "store_ops_background_per_s": _sum(d, "store", origins=eng, thread="background") / max(1e-9, b["t"] - a["t"]),
    }


METRICS = ("groups", "groups_wide", "connections", "store_ops", "store_rtts", "store_ops_background", "store_ops_harness", "collectives",
           "rounds", "collectives_workload", "rounds_workload", "wall_s",
           "store_ops_background_per_s")


def _read(counts: Path, world: int) -> list[list[dict[str, Any]]]:
    """Each process's snapshots, in order (``world`` added to each record)."""
    out = []
    for p in sorted(counts.glob("counts-p*.ndjson")):
        recs = []
        for line in p.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            r["world"] = world
            recs.append(r)
        if recs:
            out.append(recs)
    return out


def analyse(procs: list[list[dict[str, Any]]], kinds: list[str]) -> dict[str, Any]:
    """Per-rank step and episode costs (module doc) from every process's snapshots."""
    at = _schedule(kinds)
    window = {s for k in kinds for s in (at[k], at[k] + 1)}
    steps_per_proc: list = []
    episodes_per_proc: dict[str, list] = {k: [] for k in kinds}
    spare_first: list[dict[str, float]] = []
    for recs in procs:
        by_f = {r["frontier"]: r for r in recs if r.get("label") == "boundary"}
        deltas = {f - 1: _delta(by_f[f - 1], by_f[f]) for f in sorted(by_f) if f - 1 in by_f}
        free = [d for s, d in deltas.items() if s >= WARMUP and s not in window]
        if not free:
            continue
        med = {m: statistics.median(d[m] for d in free) for m in METRICS}
        steps_per_proc.append(med)
        for k in kinds:
            s = at[k]
            if s in deltas and s + 1 in deltas:
                episodes_per_proc[k].append({m: deltas[s][m] + deltas[s + 1][m] - 2 * med[m] for m in METRICS})
        first = min(by_f)
        if first > WARMUP + 1:  # a spare that took an identity: its first committed step
            spare_first.append({"frontier": first, "connections_open": by_f[first]["sockets_open"]})

    def summarise(rows: list[dict[str, float]]) -> dict[str, Any]:
        return {m: common.stats([r[m] for r in rows]) for m in METRICS} | {"ranks": len(rows)}

    return {"step": summarise(steps_per_proc), "episodes": {k: summarise(v) for k, v in episodes_per_proc.items()},
            "spares": spare_first}


def measure_world(world: int, kinds: list[str], out: Path, timeout: float = 900.0) -> dict[str, Any]:
    """One job at ``world`` ranks with ``kinds`` episodes; the per-rank counts (module doc)."""
    if world < 4 or world % 2:
        raise ValueError(f"W={world}: the HSDP shape 2 x W/2 needs an even W >= 4")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    res, counts = _launch(world, kinds, out, timeout)
    procs = _read(counts, world)
    row: dict[str, Any] = {"world": world, "shape": f"2x{world // 2}", "kinds": kinds, "ok": bool(res.ok()),
                           "returncode": res.returncode, "timed_out": res.timed_out, "log": str(res.log),
                           "wall_s": time.monotonic() - t0, "processes": len(procs)}
    row.update(analyse(procs, kinds))
    rss = [max(r["rss_kb"] for r in recs) for recs in procs]
    row["rss_kb_per_rank"] = common.stats(rss)
    row["rss_gb_total"] = sum(rss) / 2**20
    init = [recs[0] for recs in procs if recs and recs[0].get("frontier") == 1]
    row["init_groups_wide"] = statistics.median(
        sum(v for k, v in r["counts"].items() if k.startswith("groups/") and k.endswith(f"@{world}")) for r in init) if init else None
    reports = [len(v.get("reports") or []) for v in (res.final() or {}).values()] if hasattr(res, "final") else []
    row["l1_reports_max"] = max(reports, default=None)
    if not row["ok"]:
        row["error"] = f"rc={res.returncode} timed_out={res.timed_out}; see {res.log}"
    return row


# ------------------------------------------------------------------------------------ growth classes

CLASSES = {"constant": lambda w: 0.0, "log": lambda w: math.log2(w), "linear": lambda w: float(w),
           "quadratic": lambda w: float(w) ** 2}


def growth_class(ws: list[float], ys: list[float], tol: float = 0.15) -> str:
    """The class of ``ys`` over ``ws``: ``constant`` when every point is within ``tol`` of the median
    (or within 1 of it: counts are integers), else the best least-squares fit ``a + b f(W)`` (b > 0)
    among log, linear and quadratic; ``constant`` also when no fit rises; ``?`` with < 2 points; with
    exactly 2 points, the exponent e of y ~ W^e (< 0.15 constant, < 0.6 log, < 1.5 linear, else quadratic)."""
    pts = [(w, y) for w, y in zip(ws, ys, strict=True) if y is not None]
    if len(pts) < 2:
        return "?"
    vals = [y for _, y in pts]
    med = statistics.median(vals)
    if max(abs(y - med) for y in vals) <= max(1.0, tol * abs(med)):
        return "constant"
    if len(pts) == 2:  # two points fit any a + b f(W) exactly: classify by the exponent of y ~ W^e instead
        (w1, y1), (w2, y2) = sorted(pts)
        if y1 <= 0 or y2 <= 0:
            return "linear" if y2 > y1 else "constant"
        e = math.log(y2 / y1) / math.log(w2 / w1)
        return "constant" if e < 0.15 else "log" if e < 0.6 else "linear" if e < 1.5 else "quadratic"
    best, best_sse = "constant", None
    for name in ("log", "linear", "quadratic"):
        f = CLASSES[name]
        xs = [f(w) for w, _ in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(vals)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx == 0:
            continue
        b = sum((x - mx) * (y - my) for x, y in zip(xs, vals, strict=True)) / sxx
        a = my - b * mx
        sse = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, vals, strict=True))
        if b > 0 and (best_sse is None or sse < best_sse * 0.999):
            best, best_sse = name, sse
    return best


# ---------------------------------------------------------------------------------------- the model

def _loglog(points: dict[int, float], n: float) -> float:
    """Log-log inter/extrapolation through the published ``points`` (size -> seconds)."""
    xs = sorted(points)
    if n <= xs[0]:
        a, b = xs[0], xs[1]
    elif n >= xs[-1]:
        a, b = xs[-2], xs[-1]
    else:
        a = max(x for x in xs if x <= n)
        b = min(x for x in xs if x > n) if n not in xs else a
        if a == b:
            return points[a]
    slope = math.log(points[b] / points[a]) / math.log(b / a)
    return points[a] * (n / a) ** slope


def gloo_init_s(n: float, fixed: bool = True) -> float:
    """A full-mesh gloo group over ``n`` ranks, from pytorch/gloo#408's figures (module CONSTANTS)."""
    return _loglog(CONSTANTS["gloo_init_fixed_s" if fixed else "gloo_init_s"]["value"], n)


def model_episode_s(counts: dict[str, float], world: int) -> dict[str, float]:
    """A per-rank episode's modelled time at ``world`` ranks from its per-rank counts (``groups``,
    ``groups_wide``: groups over all of W, ``connections``, ``store_ops``, ``rounds``):

    groups_wide x gloo_init_fixed(W) + (groups - groups_wide) x group_create_s + connections x connect_s
    + store_ops x store_rtt_s + rounds x hop_s + store_ops_mean x W / store_ops_per_s (every rank's
    operations served by the one store, one after another; ``store_ops``: the worst rank's, the
    latency on its critical path; ``store_ops_mean``: the mean rank's, times W the store's load)."""
    c = {k: v["value"] for k, v in CONSTANTS.items()}
    wide = counts.get("groups_wide", 0.0)
    terms = {
        "wide_groups_s": wide * gloo_init_s(world),
        "groups_s": (counts.get("groups", 0.0) - wide) * c["group_create_s"],
        "connections_s": counts.get("connections", 0.0) * c["connect_s"],
        "store_latency_s": counts.get("store_ops", 0.0) * c["store_rtt_s"],
        "rounds_s": counts.get("rounds", 0.0) * c["hop_s"],
        "store_serial_s": counts.get("store_ops_mean", counts.get("store_ops", 0.0)) * world / c["store_ops_per_s"],
    }
    terms["total_s"] = sum(terms.values())
    return terms


def model_restart_s(world: int, wide_groups: float = 1.0) -> dict[str, float]:
    """A torchrun restart of the same job: restart_fixed_s + replay_s + the job's groups over all of W
    built again (``wide_groups`` of them, as this job's init builds them, counted), each at gloo#408's
    figure *with* its fixes (the same curve an episode's wide groups are priced at: a fair comparison;
    torch as shipped, ``unfixed_pg_init_s``, is far slower)."""
    c = {k: v["value"] for k, v in CONSTANTS.items()}
    pg = wide_groups * gloo_init_s(world, fixed=True)
    return {"pg_init_s": pg, "fixed_s": c["restart_fixed_s"], "replay_s": c["replay_s"],
            "total_s": pg + c["restart_fixed_s"] + c["replay_s"], "wide_groups": wide_groups,
            "unfixed_pg_init_s": wide_groups * gloo_init_s(world, fixed=False)}


def model_step_s(counts: dict[str, float], world: int, step_s: float = STEP_BUDGET_S,
                 background_per_s: float = 0.0) -> dict[str, float]:
    """A fault-free step's control cost on its critical path: the store round trips it waits for
    (``store_rtts`` x store_rtt_s; a ``set`` is not answered) and the control collectives' rounds
    (``rounds`` x hop_s), stretched by the one store's queue: its utilization rho = (every rank's
    store operations of a step, ``store_ops_mean``, answered or not, plus the background threads'
    ``background_per_s`` x ``step_s``) x W / (store_ops_per_s x ``step_s``), the wait of an M/M/1
    queue 1 / (1 - rho) (infinite at rho >= 1: the store cannot keep up)."""
    c = {k: v["value"] for k, v in CONSTANTS.items()}
    per_rank = counts.get("store_ops_mean", counts.get("store_ops", 0.0)) + background_per_s * step_s
    rho = per_rank * world / (c["store_ops_per_s"] * step_s)
    latency = counts.get("store_rtts", counts.get("store_ops", 0.0)) * c["store_rtt_s"] + counts.get("rounds", 0.0) * c["hop_s"]
    terms = {"store_latency_s": counts.get("store_rtts", counts.get("store_ops", 0.0)) * c["store_rtt_s"],
             "rounds_s": counts.get("rounds", 0.0) * c["hop_s"], "store_utilization": rho,
             "total_s": latency / (1.0 - rho) if rho < 1.0 else math.inf}
    return terms


def _extrapolate(ws: list[int], ys: list[float | None], cls: str, target: int) -> float | None:
    """``ys`` at ``target`` by its growth class (least squares over the measured points from W=8)."""
    pts = [(w, y) for w, y in zip(ws, ys, strict=True) if y is not None]
    if not pts:
        return None
    if cls in ("constant", "?") or len(pts) < 2:
        return max(0.0, max(y for _, y in pts))  # the largest measured: a constant's worst point
    f = CLASSES[cls]
    xs, vals = [f(w) for w, _ in pts], [y for _, y in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(vals)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, vals, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return max(0.0, my - b * mx + b * f(target))


def measure_primitives(rtt_n: int = 200) -> dict[str, float]:
    """This machine's loopback store round trip, TCP connect and gloo 2-rank exchange (medians, s)."""
    import datetime
    import socket

    import torch
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", master.port, None, False, timeout=datetime.timedelta(seconds=30))
    rtt = []
    for _ in range(rtt_n):
        t = time.perf_counter()
        client.add("rtt", 1)
        rtt.append(time.perf_counter() - t)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    conn = []
    for _ in range(50):
        t = time.perf_counter()
        s = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        conn.append(time.perf_counter() - t)
        s.close()
        a.close()
    srv.close()
    pgs: list = [None, None]

    def build(r: int) -> None:
        pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore("hop", client if r else master), r, 2, datetime.timedelta(seconds=30))

    builders = [threading.Thread(target=build, args=(r,)) for r in range(2)]
    for th in builders:
        th.start()
    for th in builders:
        th.join()
    hops: list[float] = []

    def pingpong(r: int) -> None:
        x = torch.zeros(8, dtype=torch.int64)
        for _ in range(rtt_n):
            t = time.perf_counter()
            if r == 0:
                pgs[0].send([x], 1, 5).wait()
                pgs[0].recv([x], 1, 6).wait()
                hops.append((time.perf_counter() - t) / 2)
            else:
                pgs[1].recv([x], 0, 5).wait()
                pgs[1].send([x], 0, 6).wait()

    players = [threading.Thread(target=pingpong, args=(r,)) for r in range(2)]
    for th in players:
        th.start()
    for th in players:
        th.join()
    return {"store_rtt_s": statistics.median(rtt), "connect_s": statistics.median(conn), "hop_s": statistics.median(hops)}


# ------------------------------------------------------------------------------------------- run

def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "scale")
    p.add_argument("--worlds", default=None, help=f"comma-separated W, even, >= 4 (default {DEFAULT_WORLDS}; quick 4,8)")
    p.add_argument("--episodes", default=",".join(EPISODE_KINDS), help="episode kinds, in order (default %(default)s)")
    p.add_argument("--timeout", type=float, default=1200.0, help="bound on each job, seconds")
    p.add_argument("--max-rss-gb", type=float, default=16.0,
                   help="skip a W whose projected RSS (from the largest W run so far) exceeds this (default %(default)s)")


def _fmt_counts(s: dict[str, Any]) -> str:
    return common.fmt(s["median"], digits=1) + " / " + common.fmt(s["max"], digits=1) if s["n"] else "-"


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        worlds = common.parse_list(args.worlds or ("4,8" if args.quick else DEFAULT_WORLDS))
        kinds = [k for k in (x.strip() for x in args.episodes.split(",")) if k]
    except ValueError as exc:
        print(f"accelpact bench scale: error: {exc}", file=sys.stderr)
        return 2
    bad = [k for k in kinds if k not in EPISODE_KINDS] + [str(w) for w in worlds if w < 4 or w % 2]
    if bad or not kinds or len(set(kinds)) != len(kinds):
        print(f"accelpact bench scale: error: episodes from {EPISODE_KINDS} (each once), worlds even >= 4; bad: {bad}", file=sys.stderr)
        return 2
    if "swap" in kinds and kinds[-1] != "swap":  # the crashed rank's counts end with it: the swap goes last
        kinds = [k for k in kinds if k != "swap"] + ["swap"]
    out = Path(args.out).resolve()
    print("scale: measuring loopback primitives (store RTT, TCP connect, gloo exchange)", flush=True)
    prim = measure_primitives()
    for k, v in prim.items():
        CONSTANTS[k]["value"] = v
        CONSTANTS[k]["source"] = CONSTANTS[k]["source"].replace(" (default until measured)", "")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for w in sorted(worlds):
        if rows and rows[-1]["processes"]:
            per = rows[-1]["rss_gb_total"] / rows[-1]["processes"]
            proj = per * (w + (1 if "swap" in kinds else 0))
            if proj > args.max_rss_gb:
                skipped.append(f"W={w}: projected RSS {proj:.1f} GB > --max-rss-gb {args.max_rss_gb}")
                print(f"scale: skip {skipped[-1]}", flush=True)
                continue
        print(f"scale: W={w} (2x{w // 2}{', +1 spare' if 'swap' in kinds else ''}): episodes {','.join(kinds)}", flush=True)
        try:
            rows.append(measure_world(w, kinds, out / f"w{w}", args.timeout))
        except Exception as exc:  # noqa: BLE001 - a world that failed is reported, the others still count
            rows.append({"world": w, "ok": False, "error": f"{type(exc).__name__}: {exc}", "processes": 0})
        r = rows[-1]
        print(f"scale: W={w}: ok={r['ok']} {r.get('wall_s', 0):.0f} s, RSS {r.get('rss_gb_total', 0):.2f} GB"
              + (f"; {r['error']}" if not r["ok"] else ""), flush=True)
    good = [r for r in rows if r.get("step") and r["step"]["store_ops"]["n"]]  # a world that left counts
    report = _report(good, kinds)
    _print(good, kinds, report)
    if getattr(args, "plot", None) and good:
        _plot(args.plot, good, kinds, report)
    headline = {"episode_s_16384": report["worst_episode_16384_s"], "restart_s_16384": report["restart"]["16384"]["total_s"],
                "step_control_pct_16384": report["step"]["16384"]["pct_of_1s"],
                "largest_world": max((r["world"] for r in good), default=None),
                "verdicts_pass": sum(1 for v in report["verdicts"] if v["pass"]), "verdicts": len(report["verdicts"])}
    common.write_result(args, "scale", {"worlds": worlds, "episodes": kinds, "layout": "fsdp1-hybrid 2 x W/2, R = replicate "
                                        "groups of 2", "constants": CONSTANTS, "skipped": skipped},
                        {"rows": rows, "report": report}, headline,
                        {} if good else {k: "no world completed" for k in headline}, t0)
    return 0 if rows and all(r["ok"] for r in rows) else 1


VERDICT_METRICS = ("groups", "connections", "store_ops", "rounds")
_UNFITTED = ("wall_s", "store_ops_background_per_s")


def _report(rows: list[dict[str, Any]], kinds: list[str]) -> dict[str, Any]:
    big = [r for r in rows if r["world"] >= 8] or rows  # the fit starts at W=8 (W=4: one rank per replica pair side)
    ws = [r["world"] for r in big]
    judged = bool(ws) and min(ws) <= 8 and max(ws) >= 64
    classes: dict[str, dict[str, str]] = {}
    verdicts: list[dict[str, Any]] = []
    models: dict[str, dict[str, Any]] = {}
    for k in ["step", *kinds]:
        pick = (lambda r, k=k: r["step"]) if k == "step" else (lambda r, k=k: r["episodes"][k])
        classes[k] = {m: growth_class(ws, [pick(r)[m]["max"] for r in big]) for m in METRICS if m not in _UNFITTED}
        counts_at = {}
        for target in (1024, 16384):
            counts_at[target] = {m: _extrapolate(ws, [pick(r)[m]["max"] for r in big], classes[k][m], target) or 0.0
                                 for m in ("groups", "groups_wide", "connections", "store_ops", "store_rtts", "rounds")}
            mean_ops = [pick(r)["store_ops"]["mean"] for r in big]
            counts_at[target]["store_ops_mean"] = _extrapolate(ws, mean_ops, growth_class(ws, mean_ops), target) or 0.0
            if classes[k]["groups_wide"] == "constant":  # a wide group's count does not grow: it is per episode
                counts_at[target]["groups_wide"] = max((pick(r)["groups_wide"]["max"] or 0.0) for r in big) if big else 0.0
        bg = max((r["step"]["store_ops_background_per_s"]["median"] or 0.0 for r in big), default=0.0)
        models[k] = {str(t): (model_step_s(counts_at[t], t, background_per_s=bg) if k == "step" else
                              model_episode_s(counts_at[t], t)) | {"counts": counts_at[t]}
                     for t in counts_at}
        if k != "step" and ws:
            for m in VERDICT_METRICS:
                want = ("constant", "log") if m == "rounds" else ("constant",)
                verdicts.append({"criterion": f"{k}: per-rank {m} per episode {'O(log W)' if m == 'rounds' else 'flat'} "
                                              f"from W={min(ws)} to W={max(ws)}", "measured_class": classes[k][m],
                                 "pass": (classes[k][m] in want) if judged else None,
                                 "values": {r["world"]: pick(r)[m]["max"] for r in big}})
    init_wide = max((r.get("init_groups_wide") or 0 for r in rows), default=0) or 1
    restart = {str(t): model_restart_s(t, init_wide) for t in (1024, 16384)}
    worst = max((models[k]["16384"]["total_s"] for k in kinds), default=None)
    bg_rate = max((r["step"]["store_ops_background_per_s"]["median"] or 0.0 for r in big), default=0.0)
    step = {str(t): models["step"][str(t)] | {"pct_of_1s": 100 * models["step"][str(t)]["total_s"] / STEP_BUDGET_S,
                                              "background_store_ops_per_s_per_rank": bg_rate,
                                              "background_store_load": bg_rate * t / CONSTANTS["store_ops_per_s"]["value"]}
            for t in (1024, 16384)}
    if kinds:
        verdicts.append({"criterion": "modelled episode at 16,384 ranks <= 5 s (worst kind)", "value_s": worst,
                         "pass": worst is not None and worst <= 5.0})
        verdicts.append({"criterion": "modelled episode at 16,384 <= 1/10 of the modelled torchrun restart",
                         "value_ratio": (worst / restart["16384"]["total_s"]) if worst is not None else None,
                         "pass": worst is not None and worst <= restart["16384"]["total_s"] / 10})
    verdicts.append({"criterion": "fault-free step's control cost modelled at 16,384 <= 0.5 % of a 1 s step",
                     "value_pct": step["16384"]["pct_of_1s"], "pass": step["16384"]["pct_of_1s"] <= 0.5})
    if not judged:
        for v in verdicts:
            v["note"] = f"fitted on W {ws} only: the criteria need W=8..64 measured"
    return {"classes": classes, "models": models, "restart": restart, "step": step, "worst_episode_16384_s": worst,
            "restart_wide_groups": init_wide, "verdicts": verdicts, "fit_worlds": ws}


def _print(rows: list[dict[str, Any]], kinds: list[str], report: dict[str, Any]) -> None:
    cols = ["W", "what", "groups", "wide groups", "connections", "store ops (main)", "store ops (bg)", "collectives",
            "rounds", "harness store ops", "wall s"]
    table = []
    for r in rows:
        for k in ["step", *kinds]:
            s = r["step"] if k == "step" else r["episodes"][k]
            table.append([r["world"], "fault-free step" if k == "step" else k, *[_fmt_counts(s[m]) for m in (
                "groups", "groups_wide", "connections", "store_ops", "store_ops_background", "collectives", "rounds",
                "store_ops_harness")], common.fmt(s["wall_s"]["max"], digits=3)])
    common.print_table("per rank, counted (median / max over ranks; an episode = its two-step window minus two median "
                       "fault-free steps)", cols, table)
    common.print_table("growth class of the per-rank max from W=8 (" + ", ".join(map(str, report["fit_worlds"])) + ")",
                       ["what", *[m for m in METRICS if m not in _UNFITTED]],
                       [[k, *[report["classes"][k][m] for m in METRICS if m not in _UNFITTED]] for k in report["classes"]])
    mrows = []
    for k, by_t in report["models"].items():
        for t, m in by_t.items():
            mrows.append([f"{k} @ {int(t):,}", *[common.fmt(m.get(x), digits=4) for x in (
                "wide_groups_s", "connections_s", "store_latency_s", "rounds_s", "store_serial_s", "total_s")]])
    for t, m in report["restart"].items():
        mrows.append([f"torchrun restart @ {int(t):,}", common.fmt(m["pg_init_s"], digits=4), "-", "-", "-", "-",
                      common.fmt(m["total_s"], digits=4)])
    common.print_table("cost model, seconds (constants and sources: spec/scale-costs.md; JSON config.constants)",
                       ["what", "wide groups", "connections", "store latency", "rounds", "store serialised", "total"], mrows)
    common.print_table("verdicts (issue 40, 'Done when')", ["criterion", "measured", "verdict"],
                       [[v["criterion"], v.get("measured_class") or common.fmt(v.get("value_s", v.get("value_ratio", v.get("value_pct"))), digits=4),
                         {True: "PASS", False: "FAIL", None: "NOT JUDGED"}[v["pass"]] + (f" ({v['note']})" if v.get("note") else "")]
                        for v in report["verdicts"]])


def _plot(path: str, rows: list[dict[str, Any]], kinds: list[str], report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = [r["world"] for r in rows]
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.5))
    for ax, m in zip(axes[:4], ("groups", "connections", "store_ops", "rounds"), strict=True):
        for k in ["step", *kinds]:
            ys = [(r["step"] if k == "step" else r["episodes"][k])[m]["max"] for r in rows]
            ax.plot(ws, ys, "o-", label=f"{k} ({report['classes'][k][m]})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("W (ranks)")
        ax.set_title(f"per-rank {m} (max over ranks)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[4]
    targets = [1024, 16384]
    labels = [*kinds, "step (control)", "torchrun restart"]
    for i, t in enumerate(targets):
        vals = [report["models"][k][str(t)]["total_s"] for k in kinds] + [report["step"][str(t)]["total_s"],
                                                                          report["restart"][str(t)]["total_s"]]
        ax.bar([j + i * 0.4 for j in range(len(labels))], vals, 0.4, label=f"W={t:,}")
    ax.axhline(5.0, color="red", ls="--", lw=0.8, label="5 s")
    ax.set_yscale("log")
    ax.set_xticks([j + 0.2 for j in range(len(labels))], labels, rotation=30, fontsize=7)
    ax.set_title("modelled seconds (published per-operation figures)", fontsize=9)
    ax.legend(fontsize=7)
    common.save_figure(fig, path, dpi=100)


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--worker"]
    if "--job" in argv:  # run_local spawns ``-m accelpact.bench.scale --job J``
        sys.exit(worker_main(argv))
    print("python -m accelpact.bench.scale --worker --job J (the rank program); the benchmark: accelpact bench scale",
          file=sys.stderr)
    sys.exit(2)
