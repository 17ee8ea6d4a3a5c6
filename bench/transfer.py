"""``accelpact bench transfer``: a hot swap's state transfer (``RankTransferState``) versus shard size.

Two processes (gloo, loopback): rank 0 is the live replica, rank 1 the spare.  Both hold a model
built the same way (one flat float32 parameter of S/12 elements and its AdamW state after one step:
S bytes in all); the spare's values differ.  Each repetition runs what the swap runs
(:func:`accelpact.impl.runtime.hotswap.transfer`): the manifest's size and bytes, then every state tensor
broadcast from the replica, and the spare's :func:`~accelpact.impl.runtime.hotswap.import_state` into its
model.  After each, the spare's state checksum must equal the replica's (``ok``).

Reported per size: median, p90, p99 and max of the transfer (the slower rank) and the throughput.
Nothing is asserted: speed is measured, never tested.  No torch import at module level.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import common
from .validate import _state
from accelpact.impl.runtime.digest import state_checksum
from accelpact.impl.runtime.hotswap import transfer

__all__ = ["add_arguments", "run", "transfer_rank"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_common(p, "transfer")
    p.add_argument("--sizes-mb", default=None, help="comma-separated shard sizes in MB (default 1,4,16,64,256; quick 1,4)")
    p.add_argument("--repeat", type=int, default=None, help="transfers per size (default 7; quick 3)")
    p.add_argument("--timeout", type=float, default=900.0, help="bound on the measuring processes, seconds")


def transfer_rank(ctx, sizes_mb: list[float], repeat: int) -> list[dict]:
    """Rank function (rank 0 the replica, rank 1 the spare): per size, per repetition, seconds."""
    import torch
    import torch.distributed as dist

    rows = []
    for mb in sizes_mb:
        module, opt, state_bytes = _state(mb)
        times, ok = [], True
        for _ in range(repeat):
            if ctx.rank == 1:  # the spare's own values differ from the replica's before each transfer
                with torch.no_grad():
                    module.flat.add_(1.0)
            dist.barrier()
            t0 = time.perf_counter()
            moved = transfer(ctx.group, (0, 1), 0, ctx.rank, module, opt, torch.device("cpu"), 600.0)
            times.append(time.perf_counter() - t0)
            mine = state_checksum(module, opt, torch.device("cpu"))
            outs = [torch.empty_like(mine) for _ in range(2)]
            ctx.group.allgather([outs], [mine]).wait()
            ok = ok and torch.equal(outs[0], outs[1])
        rows.append({"size_mb": mb, "state_bytes": state_bytes, "bytes_moved": moved, "seconds": times, "ok": ok})
        del module, opt
    return rows


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        sizes = common.parse_list(args.sizes_mb, float) if args.sizes_mb else ([1, 4] if args.quick else [1, 4, 16, 64, 256])
    except ValueError as exc:
        print(f"accelpact bench transfer: error: --sizes-mb: {exc}", file=sys.stderr)
        return 2
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 7)
    if repeat < 1 or not sizes or any(s <= 0 for s in sizes):
        print("accelpact bench transfer: error: --repeat >= 1 and sizes > 0 MB", file=sys.stderr)
        return 2
    print(f"transfer: shard sizes {sizes} MB, {repeat} transfers each, replica -> spare (gloo, loopback)", flush=True)
    try:
        per_rank = common.rank_values(transfer_rank, 2, args.out, timeout_s=args.timeout, sizes_mb=sizes, repeat=repeat)
    except common.BenchError as exc:
        print(f"accelpact bench transfer: {exc}", file=sys.stderr)
        return 1
    rows: list[dict[str, Any]] = []
    for i, mb in enumerate(sizes):
        rr = [pr[i] for pr in per_rank]
        secs = [max(r["seconds"][j] for r in rr) for j in range(repeat)]
        st = common.stats(secs, 1e3)
        med = st["median"]
        rows.append({"size_mb": mb, "state_bytes": rr[0]["state_bytes"], "bytes_moved": rr[0]["bytes_moved"],
                     "ms": st, "mb_per_s": (rr[0]["bytes_moved"] / 2**20) / (med / 1e3) if med else None,
                     "ok": all(r["ok"] for r in rr)})
    common.print_table("hot swap state transfer (replica -> spare) versus shard size, gloo CPU: milliseconds (slower rank)",
                       ["state MB", "moved MB", "median", "p90", "p99", "max", "MB/s", "ok"],
                       [[f"{r['state_bytes'] / 2**20:.1f}", f"{r['bytes_moved'] / 2**20:.1f}", common.fmt(r["ms"]["median"]),
                         common.fmt(r["ms"]["p90"]), common.fmt(r["ms"]["p99"]), common.fmt(r["ms"]["max"]),
                         common.fmt(r["mb_per_s"]), r["ok"]] for r in rows])
    if getattr(args, "plot", None):
        xs = [r["state_bytes"] / 2**20 for r in rows]
        common.line_plot(args.plot, "hot swap: state transfer versus shard size (median, slower rank; band: p99)",
                         "shard + optimizer state (MB)", "milliseconds",
                         {"transfer": (xs, [r["ms"]["median"] for r in rows])},
                         bands={"transfer": (xs, [r["ms"]["p99"] for r in rows])}, logx=True, logy=True)
    big = rows[-1]
    headline: dict[str, Any] = {"transfer_ms_median_largest": big["ms"]["median"], "transfer_largest_state_mb": big["size_mb"],
                                "transfer_mb_per_s_largest": big["mb_per_s"]}
    common.write_result(args, "transfer", {"sizes_mb": sizes, "repeat": repeat, "ranks": 2,
                                           "state": "one flat float32 parameter + AdamW exp_avg, exp_avg_sq"},
                        rows, headline, None, t0)
    return 0 if all(r["ok"] for r in rows) else 1
