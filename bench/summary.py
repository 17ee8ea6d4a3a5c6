"""``accelpact bench summary``: the headline figures, read from the latest results files.

Nothing is rerun: each figure is read from the ``headline`` of a benchmark's results file
(``<dir>/<benchmark>.json`` as ``accelpact bench all`` writes them), looking in ``--results``
folders in order (default: ``bench/results/``, the full run, then ``runs/bench-quick/``, the quick
run).  Each figure says where it came from (``source``: the file, full or quick, when measured) or,
when no file measured it, why it is null (``reason``).  A figure is never computed here.

With ``--json`` the last line printed is one JSON object::

    {"repair_total_ms_median_2x2": {"value": 52.1, "unit": "ms", "source": "bench/results/repair.json (full run, ...)",
                                    "reason": null}, ...}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import common

__all__ = ["FIGURES", "add_arguments", "collect", "run"]

#: figure -> (unit, [(benchmark file, headline key), ...] in order of preference), what it is
FIGURES: dict[str, tuple[str, list[tuple[str, str]], str]] = {
    "repair_total_ms_median_2x2": ("ms", [("repair", "repair_total_ms_median_2x2")],
                                   "L1 repair total (observed -> resumed), median, FSDP1 2x2"),
    "repair_total_ms_max_100": ("ms", [("repair", "repair_total_ms_max_100")], "the slowest of 100 repairs at 2x2"),
    "rebind_us_median_L32": ("us", [("rebind", "rebind_us_median_L32")], "FSDP1, L=32: writing every cached reference (back to back; after a walker pass: rebind.json)"),
    "phase5_ms_median_L32": ("ms", [("rebind", "phase5_ms_median_L32")],
                             "FSDP1, L=32: the engine's phase 5 (rebind + check of the known sites), engine attached"),
    "guard_overhead_pct": ("%", [("guard", "guard_overhead_pct")], "fault-free step time, engine on vs off, paired"),
    "l2_over_l1_fault_to_frontier": ("x", [("goodput", "l2_over_l1_fault_to_frontier"),
                                           ("recovery", "l2_over_l1_fault_to_frontier")],
                                     "torchrun restart / in-place repair, fault to frontier, same run (goodput: at checkpoint age 1, the least replay)"),
    "torchft_over_accelpact_fault_to_frontier": ("x", [("goodput", "torchft_over_accelpact_fault_to_frontier")],
                                                 "torchft reconfigure / AccelPact L1, fault to frontier, same run (goodput: 1 s steps)"),
    "control_plane_ms_W1024": ("ms", [("controlplane", "control_plane_ms_W1024")],
                               "agreement + release, 1,024 simulated ranks on one TCPStore"),
    "step_control_ms_W1024": ("ms", [("controlplane", "step_control_ms_W1024")],
                              "fault-free per-step control-plane cost at W=1,024: a rank's CPU for the failure flag, simulated ranks, + the progress set"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", action="append", default=None, metavar="DIR",
                   help="results folder to read (repeatable, first wins; default bench/results then runs/bench-quick)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object, as the last line")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def collect(dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """Every figure of :data:`FIGURES`: value, unit, source, reason (see the module doc)."""
    out: dict[str, dict[str, Any]] = {}
    for fig, (unit, where, what) in FIGURES.items():
        entry: dict[str, Any] = {"value": None, "unit": unit, "source": None, "reason": None, "what": what}
        reasons: list[str] = []
        for d in dirs:
            for bench, key in where:
                path = d / f"{bench}.json"
                doc = _load(path)
                if doc is None:
                    continue
                head = doc.get("headline") or {}
                value = head.get(key)
                meta = doc.get("meta") or {}
                load = meta.get("loadavg")
                label = (f"{_shown(path)} ({'quick' if doc.get('quick') else 'full'} run, {meta.get('created', 'undated')}"
                         + (f", load {load[0]:.1f}" if isinstance(load, list) and load else "") + ")")
                if value is not None:
                    entry.update(value=value, source=label)
                    break
                why = (doc.get("headline_reasons") or {}).get(key) or "the run did not produce it"
                reasons.append(f"{label}: {why}")
            if entry["value"] is not None:
                break
        if entry["value"] is None:
            names = sorted({b for b, _ in where})
            entry["reason"] = "; ".join(reasons) if reasons else (
                f"not measured yet: no {' or '.join(n + '.json' for n in names)} in {', '.join(map(str, dirs))} "
                f"(run accelpact bench {names[0]} --json ... or accelpact bench all)")
        out[fig] = entry
    return out


def run(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.results] if args.results else [common.RESULTS_DIR, common.QUICK_DIR]
    figs = collect(dirs)
    common.print_table("headline figures (read from results files, not rerun)", ["figure", "value", "unit", "source or reason"],
                       [[k, "null" if v["value"] is None else common.fmt(v["value"]), v["unit"],
                         v["source"] or f"null: {v['reason']}"] for k, v in figs.items()])
    if args.json:
        print(json.dumps(figs), flush=True)
    return 0
