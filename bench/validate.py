"""``accelpact bench validate``: phase 6 (validation) versus the local state size.

Two processes (replicas of R, gloo, loopback) hold identical state of S bytes: one flat parameter
of S/12 float32 plus its AdamW state (``exp_avg``, ``exp_avg_sq``: three tensors of the same size).
Each repetition runs what ``Pact._validate`` runs, part by part, on a two-rank group:

* ``allreduce``: the one-element all-reduce on the new group (it works, every member is in it);
* ``digest``: :func:`accelpact.impl.runtime.digest.state_checksum`, the engine's replica check (integer
  sums of each tensor's bits, reduced with torch ops on the tensor's own device: the size-dependent
  part);
* ``allgather``: the checksum vectors (3 int64) gathered and compared bit for bit;
* ``total``: the three, as ``RankValidate``'s ``duration_ns``.

Reported per size: median, p90, p99 and max of each part (per repetition the slower of the two
ranks), and the checksum's throughput.  Timed beside it on the same state, for comparison only
(the engine uses neither): ``sha256``, the host digest the engine used before
(:func:`accelpact.impl.runtime.digest.state_digest`: the state copied to the host, then hashed), and
``digest_nocopy``, that sha256 over each tensor's memory in place (no ``tobytes()`` copy).

``--local`` times only the checksum and the sha256 digest in this process, without ranks
(:func:`checksum_cost`; ``--device cuda`` on a GPU machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import common
from accelpact.impl.runtime.digest import state_checksum, state_digest

__all__ = ["add_arguments", "checksum_cost", "run", "validate_rank"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "validate")
    p.add_argument("--sizes-mb", default=None, help="comma-separated local state sizes in MB (default 1,4,16,64,256; quick 1,4)")
    p.add_argument("--repeat", type=int, default=None, help="validations per size (default 7; quick 3)")
    p.add_argument("--timeout", type=float, default=900.0, help="bound on the measuring processes, seconds")
    p.add_argument("--local", action="store_true", help="time only the checksum and the sha256 digest, in this process")
    p.add_argument("--device", default="cpu", help="--local: the device the state lives on (default cpu)")


def _digest_nocopy(module, optimizer) -> bytes:
    """The sha256 host digest without the per-tensor ``tobytes()`` copy (bench-only variant, for comparison)."""
    import hashlib

    import torch

    h = hashlib.sha256(b"accelpact-digest/1")

    def feed(label: str, t: torch.Tensor) -> None:
        t = t.detach().contiguous()
        h.update(f"{label}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # the buffer itself, no copy

    for name, p in module.named_parameters():
        feed(f"param:{name}", p)
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            for k, v in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(v, torch.Tensor):
                    feed(f"optim:{gi}:{pi}.{k}", v)
    return h.digest()


def _state(mb: float, device: str = "cpu"):
    """The measured state: one flat float32 parameter of S/12 elements and its AdamW state, after one step."""
    import torch

    n = max(1, int(mb * 2**20) // 12)
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.flat = torch.nn.Parameter(torch.randn(n, device=device))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=False)
    module.flat.grad = torch.ones(n, device=device)
    opt.step()
    opt.zero_grad(set_to_none=True)
    state_bytes = sum(t.numel() * t.element_size() for t in [module.flat] +
                      [v for v in opt.state[module.flat].values() if isinstance(v, torch.Tensor)])
    return module, opt, state_bytes


def validate_rank(ctx, sizes_mb: list[float], repeat: int) -> list[dict]:
    """Rank function (2 replicas): per size, per repetition, each part's seconds on this rank."""
    import torch
    import torch.distributed as dist

    pg = ctx.group
    n_ranks = ctx.world
    rows = []
    for mb in sizes_mb:
        module, opt, state_bytes = _state(mb)
        parts: dict[str, list[float]] = {"allreduce": [], "digest": [], "allgather": [], "total": [], "sha256": [],
                                         "digest_nocopy": []}
        ok = True
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            one = torch.ones(1)
            pg.allreduce([one]).wait()
            t1 = time.perf_counter()
            mine = state_checksum(module, opt, torch.device("cpu"))
            t2 = time.perf_counter()
            outs = [torch.empty_like(mine) for _ in range(n_ranks)]
            pg.allgather([outs], [mine]).wait()
            ok = ok and int(one[0]) == n_ranks and all(torch.equal(o, mine) for o in outs)
            t3 = time.perf_counter()
            state_digest(module, opt)
            t4 = time.perf_counter()
            _digest_nocopy(module, opt)
            t5 = time.perf_counter()
            for k, v in (("allreduce", t1 - t0), ("digest", t2 - t1), ("allgather", t3 - t2), ("total", t3 - t0),
                         ("sha256", t4 - t3), ("digest_nocopy", t5 - t4)):
                parts[k].append(v)
        rows.append({"size_mb": mb, "state_bytes": state_bytes, "parts_s": parts, "ok": ok})
        del module, opt
    return rows


def checksum_cost(sizes_mb: list[float], repeat: int = 5, device: str = "cpu") -> list[dict]:
    """In this process, no ranks: per local state size, the seconds of the engine's checksum
    (:func:`~accelpact.impl.runtime.digest.state_checksum`, on ``device``) and of the sha256 host digest
    (:func:`~accelpact.impl.runtime.digest.state_digest`) over the same state, ``repeat`` times each
    (on CUDA each timing ends with a synchronize, so it covers the device work)."""
    import torch

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    rows = []
    for mb in sizes_mb:
        module, opt, state_bytes = _state(mb, device)
        times: dict[str, list[float]] = {"checksum": [], "sha256": []}
        for _ in range(repeat):
            sync()
            t0 = time.perf_counter()
            state_checksum(module, opt)
            sync()
            t1 = time.perf_counter()
            state_digest(module, opt)
            t2 = time.perf_counter()
            times["checksum"].append(t1 - t0)
            times["sha256"].append(t2 - t1)
        rows.append({"size_mb": mb, "state_bytes": state_bytes, "device": device, "times_s": times})
        del module, opt
    return rows


def _run_local(args: argparse.Namespace, sizes: list[float], repeat: int, t0: float) -> int:
    rows = []
    for r in checksum_cost(sizes, repeat, args.device):
        ms = {k: common.stats(v, 1e3) for k, v in r["times_s"].items()}
        mb = r["state_bytes"] / 2**20
        rows.append({**r, "ms": ms, "checksum_mb_per_s": mb / (ms["checksum"]["median"] / 1e3),
                     "sha256_mb_per_s": mb / (ms["sha256"]["median"] / 1e3)})
    common.print_table(f"phase 6 replica check versus local state size, one process, {args.device}: milliseconds",
                       ["state MB", "checksum med", "p90", "max", "sha256 med", "p90", "max", "checksum MB/s", "sha256 MB/s"],
                       [[f"{r['state_bytes'] / 2**20:.1f}", common.fmt(r["ms"]["checksum"]["median"]),
                         common.fmt(r["ms"]["checksum"]["p90"]), common.fmt(r["ms"]["checksum"]["max"]),
                         common.fmt(r["ms"]["sha256"]["median"]), common.fmt(r["ms"]["sha256"]["p90"]),
                         common.fmt(r["ms"]["sha256"]["max"]), common.fmt(r["checksum_mb_per_s"]),
                         common.fmt(r["sha256_mb_per_s"])] for r in rows])
    big = rows[-1]
    common.write_result(args, "validate-local", {"sizes_mb": sizes, "repeat": repeat, "device": args.device,
                                                 "state": "one flat float32 parameter + AdamW exp_avg, exp_avg_sq"},
                        rows, {"checksum_ms_median_largest": big["ms"]["checksum"]["median"],
                               "checksum_mb_per_s_largest": big["checksum_mb_per_s"], "largest_state_mb": big["size_mb"]},
                        None, t0)
    return 0


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        sizes = common.parse_list(args.sizes_mb, float) if args.sizes_mb else ([1, 4] if args.quick else [1, 4, 16, 64, 256])
    except ValueError as exc:
        print(f"accelpact bench validate: error: --sizes-mb: {exc}", file=sys.stderr)
        return 2
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 7)
    if repeat < 1 or not sizes or any(s <= 0 for s in sizes):
        print("accelpact bench validate: error: --repeat >= 1 and sizes > 0 MB", file=sys.stderr)
        return 2
    if getattr(args, "local", False):
        return _run_local(args, sizes, repeat, t0)
    print(f"validate: state sizes {sizes} MB, {repeat} validations each, 2 replicas (gloo, loopback)", flush=True)
    try:
        per_rank = common.rank_values(validate_rank, 2, args.out, timeout_s=args.timeout, sizes_mb=sizes, repeat=repeat)
    except common.BenchError as exc:
        print(f"accelpact bench validate: {exc}", file=sys.stderr)
        return 1
    rows = []
    for i, mb in enumerate(sizes):
        rr = [pr[i] for pr in per_rank]
        parts = {k: [max(r["parts_s"][k][j] for r in rr) for j in range(repeat)] for k in rr[0]["parts_s"]}
        st = {k: common.stats(v, 1e3) for k, v in parts.items()}
        med = st["digest"]["median"]
        rows.append({"size_mb": mb, "state_bytes": rr[0]["state_bytes"], "ok": all(r["ok"] for r in rr),
                     "ms": st, "digest_mb_per_s": (rr[0]["state_bytes"] / 2**20) / (med / 1e3) if med else None,
                     "sha256_over_digest": (st["sha256"]["median"] / med) if med else None,
                     "nocopy_over_digest": (st["digest_nocopy"]["median"] / med) if med else None})
    common.print_table("phase 6 (validation) versus local state size, 2 replicas, CPU: milliseconds (slower rank); "
                       "digest = the engine's checksum",
                       ["state MB", "allreduce", "digest med", "p90", "p99", "max", "allgather", "total med", "p99", "max",
                        "digest MB/s", "sha256/digest", "no-copy sha256/digest", "ok"],
                       [[f"{r['state_bytes'] / 2**20:.1f}", common.fmt(r["ms"]["allreduce"]["median"]),
                         common.fmt(r["ms"]["digest"]["median"]), common.fmt(r["ms"]["digest"]["p90"]),
                         common.fmt(r["ms"]["digest"]["p99"]), common.fmt(r["ms"]["digest"]["max"]),
                         common.fmt(r["ms"]["allgather"]["median"]), common.fmt(r["ms"]["total"]["median"]),
                         common.fmt(r["ms"]["total"]["p99"]), common.fmt(r["ms"]["total"]["max"]),
                         common.fmt(r["digest_mb_per_s"]), common.fmt(r["sha256_over_digest"]),
                         common.fmt(r["nocopy_over_digest"]), r["ok"]] for r in rows])
    if getattr(args, "plot", None):
        xs = [r["state_bytes"] / 2**20 for r in rows]
        common.line_plot(args.plot, "phase 6 versus local state size (median, slower rank; dashed: p99)", "local state (MB)",
                         "milliseconds",
                         {"total": (xs, [r["ms"]["total"]["median"] for r in rows]),
                          "digest (the engine's checksum)": (xs, [r["ms"]["digest"]["median"] for r in rows]),
                          "sha256 host digest (before)": (xs, [r["ms"]["sha256"]["median"] for r in rows]),
                          "sha256 without copy (bench variant)": (xs, [r["ms"]["digest_nocopy"]["median"] for r in rows]),
                          "collectives": (xs, [r["ms"]["allreduce"]["median"] + r["ms"]["allgather"]["median"] for r in rows])},
                         bands={"total": (xs, [r["ms"]["total"]["p99"] for r in rows])}, logx=True, logy=True)
    big = rows[-1]
    headline: dict[str, Any] = {"validate_ms_median_largest": big["ms"]["total"]["median"], "largest_state_mb": big["size_mb"],
                                "digest_mb_per_s_largest": big["digest_mb_per_s"]}
    common.write_result(args, "validate", {"sizes_mb": sizes, "repeat": repeat, "replicas": 2,
                                           "state": "one flat float32 parameter + AdamW exp_avg, exp_avg_sq"},
                        rows, headline, None, t0)
    return 0 if all(r["ok"] for r in rows) else 1
