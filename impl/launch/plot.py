"""Timeline plot of a demo (or any set of runs): one panel per run, one lane per rank.

Per lane: a dot at every committed step (``t_steps`` from the result files), the recovery actions
from the traces (model action names, coloured by phase), the injected fault (red x), exits
(black square) and the torchrun restart gap.  The shaded span is fault-to-frontier.
matplotlib with the Agg backend (no display); writes a PNG.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..rundir import RunDir
from .history import Episode, step_times

if TYPE_CHECKING:
    from .launch import LaunchResult

__all__ = ["COLOURS", "OUTCOMES", "episode_timeline", "timeline"]

#: episode outcomes (impl/launch/history.py) in the order tables list them, and their colours
OUTCOMES = ("L1", "swap", "discard", "shrink", "grow", "L2", "failed", "split")
COLOURS = {"L1": "tab:green", "swap": "tab:blue", "discard": "tab:cyan", "shrink": "tab:orange", "grow": "tab:olive",
           "L2": "tab:red", "failed": "black", "split": "magenta"}

_PHASE_COLOUR = {
    "RankObserve": "tab:orange", "RankGuard": "tab:olive", "RankReject": "tab:red",
    "RankArrive": "tab:purple", "RankDecideAgreement": "tab:purple", "RankAwaitAgreement": "tab:purple",
    "RankReplace": "tab:blue", "RankRebind": "tab:cyan", "RankValidate": "tab:green",
    "RankReady": "tab:brown", "RankDecideRelease": "tab:brown", "RankResume": "tab:pink",
    "RankExit": "black", "RankFail": "black", "RankTimeout": "black",
}


def timeline(runs: list[tuple[str, "LaunchResult", float | None, float | None]], path: str | os.PathLike) -> Path:
    """Draw ``runs`` = [(title, LaunchResult, t_fault_s, t_frontier_s), ...] into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(12.5, 2.2 + 1.6 * len(runs)), squeeze=False)
    for ax, (title, res, t_fault, t_front) in zip(axes[:, 0], runs, strict=True):
        starts = [float(r["t_start"]) for r in res.results.values() if r.get("t_start")]
        t0: float = min(starts) if starts else 0.0
        ranks = sorted({r for (_, r) in res.results})
        seen_labels: set[str] = set()
        for (attempt, rank), r in sorted(res.results.items()):
            y = rank
            ts = sorted(float(t) for t in (r.get("t_steps") or {}).values())
            ax.plot([t - t0 for t in ts], [y] * len(ts), "o", ms=3, color="tab:gray" if attempt else "0.35",
                    label=None if "step" in seen_labels else "committed step")
            seen_labels.add("step")
            for rec in RunDir(res.out).records(attempt, rank):
                if rec.get("type") != "action":
                    continue
                name, t = rec["action"], rec["t_ns"] / 1e9 - t0
                if name.startswith("Fault"):
                    ax.plot(t, y, "x", color="red", ms=9, mew=2, label=None if "fault" in seen_labels else "fault")
                    seen_labels.add("fault")
                elif name in _PHASE_COLOUR:
                    ax.plot(t, y + 0.18, "|", color=_PHASE_COLOUR[name], ms=10, mew=2,
                            label=None if name in seen_labels else name)
                    seen_labels.add(name)
            if r.get("outcome") == "exited" and r.get("t_exit"):
                ax.plot(r["t_exit"] - t0, y, "s", color="black", ms=5,
                        label=None if "exit" in seen_labels else f"exit {r.get('exit_code')}")
                seen_labels.add("exit")
        if t_fault is not None and t_front is not None:
            ax.axvspan(t_fault - t0, t_front - t0, color="tab:red", alpha=0.12)
            ax.text(t_fault - t0, len(ranks) - 0.45, f" fault->frontier {t_front - t_fault:.3f} s", fontsize=8)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
        ax.set_ylim(-0.6, len(ranks) - 0.2)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    axes[-1, 0].set_xlabel("seconds since the run's first worker started")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def episode_timeline(path: str | os.PathLike, out: str | os.PathLike, episodes: Sequence[Episode], world: int, t0_ns: int,
                     faults: Sequence[tuple[str, int]] = (), title: str = "") -> Path | None:
    """A run's history as a PNG (``accelpact report`` and the soak): above, every attempt's committed steps
    against time (seconds since ``t0_ns``, the clock of the traces and the steps files) with each episode as a
    span coloured by its outcome (its name and outcome written over it); below, the faults ``faults`` =
    [(kind, t_ns), ...] as markers, one row per kind.  None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return None

    run = RunDir(out)
    fig, (ax, axf) = plt.subplots(2, 1, figsize=(13, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    last = max([e.attempt for e in episodes] + [0])
    a = 0
    while a <= 1000:
        rows = step_times(run, a, world)
        if not any(rows.values()) and a > last:
            break
        pts = sorted((t, s) for r in rows.values() for s, t in r.items())
        if pts:
            ax.plot([(t * 1e9 - t0_ns) / 1e9 for t, _ in pts], [s for _, s in pts], ".", ms=3 if len(pts) < 2000 else 1.5,
                    label=f"attempt {a}")
        a += 1
    top = ax.get_ylim()[1]
    for e in episodes:
        x0 = (e.t_start_ns - t0_ns) / 1e9
        x1 = ((e.t_end_ns or e.t_last_ns or e.t_start_ns) - t0_ns) / 1e9
        c = COLOURS.get(e.outcome, "grey")
        for axis in (ax, axf):
            axis.axvspan(x0, max(x1, x0 + 0.3), color=c, alpha=0.25, lw=0)
        if len(episodes) <= 40:
            ax.text(x0, top, f" {e.name} {e.outcome}", fontsize=7, rotation=90, va="top", ha="right", color=c)
    kinds = sorted({k for k, _ in faults})
    for i, k in enumerate(kinds):
        xs = [(t - t0_ns) / 1e9 for kk, t in faults if kk == k]
        axf.plot(xs, [i] * len(xs), "v" if k != "slow" else "o", ms=7, label=k)
    axf.set_yticks(range(len(kinds)), kinds, fontsize=7)
    axf.set_ylim(-0.7, max(len(kinds), 1) - 0.3)
    if not kinds:
        axf.text(0.5, 0.5, "no fault recorded in the traces", transform=axf.transAxes, ha="center", va="center", fontsize=8)
    axf.set_xlabel("seconds since the run's first record")
    axf.set_ylabel("faults")
    ax.set_ylabel("committed step")
    handles = [Patch(color=COLOURS[o], alpha=0.4, label=o) for o in OUTCOMES if any(e.outcome == o for e in episodes)]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0][:6], fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    ax.set_title(title or "episodes (spans, by outcome) and faults (markers)", fontsize=10, loc="left")
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
