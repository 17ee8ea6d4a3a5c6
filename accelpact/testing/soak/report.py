"""The soak's summary (rich tables) and timeline (a matplotlib PNG).

The summary: the schedule (printed before the run), faults by kind and by where they struck, each
episode's outcome (L1 / swap / discard / shrink / grow / L2) and the training time it cost, each restart's cause,
time lost (last commit before the fault to the first commit past it) and steps replayed with their
totals, the outcome totals, and the judge's checks.  The timeline: committed steps against time for every attempt, every
episode as a span coloured by its outcome, every fault as a marker on its own row.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from ...impl.launch.plot import COLOURS as COLOURS, OUTCOMES, episode_timeline
from .judge import KNOWN_BUGS, Verdict
from ...impl.launch.restarts import Restart, total_lost_s
from ...impl.launch.restarts import summary as restarts_summary
from .schedule import Schedule

__all__ = ["print_restarts", "print_schedule", "print_summary", "summary_counts", "timeline"]



def print_schedule(console: Any, sched: Schedule) -> None:
    from rich.table import Table

    cfg = sched.config
    console.print(f"[bold]accelpact soak[/bold] seed {cfg.seed}: {cfg.minutes:g} min, {cfg.wrapper} {cfg.nodes}x"
                  f"{cfg.ranks_per_node}, {cfg.spares} spare(s), launcher {cfg.launcher}, "
                  f"{len(sched.faults)} faults scheduled" + (f", seeded bug {cfg.seeded_bug}" if cfg.seeded_bug else ""))
    for k, why in sorted(sched.skipped.items()):
        console.print(f"  skipped kind [yellow]{k}[/yellow]: {why}", highlight=False)
    t = Table(title=f"schedule (seed {cfg.seed})")
    for col in ("#", "kind", "trigger", "at", "target", "duration"):
        t.add_column(col)
    for f in sched.faults:
        target = {"cut_group": f"rank {f.rank} / {f.group}", "cut_link": f"{f.rank}<->{f.peer}",
                  "crash_spare": f"idle spare #{f.rank}", "store_loss": "store"}.get(f.kind, f"rank {f.rank}")
        t.add_row(str(f.index), f.kind, f.trigger, f"t+{f.at_s:.0f}s" if f.trigger == "time" else "in episode",
                  target, f"{f.duration_s:.1f}s" if f.duration_s else "")
    console.print(t)


def summary_counts(v: Verdict) -> dict[str, Any]:
    """Faults met by kind and by where they struck; episodes by outcome, with the time they cost."""
    met = [s for s in v.strikes if s.get("met")]
    by_kind = Counter(s["kind"] for s in met)
    where = Counter((s["kind"], "recovery" if s.get("during") else "training") for s in met)
    by_outcome: dict[str, dict[str, float]] = {}
    for e in v.episodes:
        row = by_outcome.setdefault(e.outcome, {"episodes": 0, "lost_s": 0.0})
        row["episodes"] += 1
        row["lost_s"] = round(row["lost_s"] + (e.lost_s or 0.0), 3)
    if "L2" in by_outcome and v.restarts:  # chained restarts share moments: each counted once
        by_outcome["L2"]["lost_s"] = total_lost_s(v.restarts)
    during = sum(1 for s in met if s.get("during"))
    return {"faults_met": len(met), "faults_scheduled": len(v.strikes), "kinds_met": len(by_kind),
            "by_kind": dict(by_kind), "where": {f"{k}@{w}": n for (k, w), n in sorted(where.items())},
            "during_recovery": during, "by_outcome": by_outcome, "restarts": restarts_summary(v.restarts)}


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s"


def print_restarts(console: Any, rs: list[Restart], strikes: list[dict] | None = None, title: str = "restarts") -> None:
    """Each restart: its cause, the faults behind it, the time lost (from the last commit before the
    fault to the first commit past it; before / after the attempt's last exit) and the steps
    replayed; then the totals, by cause, and every unknown cause named."""
    from rich.markup import escape
    from rich.table import Table

    if not rs:
        console.print(f"{title}: none", highlight=False)
        return
    kinds = {s.get("index"): s.get("kind") for s in strikes or ()}
    t = Table(title=f"{title}: time lost = first commit past the fault's last step - last commit before the fault")
    for col in ("restart", "cause", "faults", "last step", "time lost", "before exit", "after exit", "replayed",
                "resumed at", "detail"):
        t.add_column(col)
    for r in rs:
        faults = ", ".join(f"#{i} {kinds.get(i, '?')}" for i in r.faults)
        cause = r.cause if r.known else f"[yellow]{escape(r.cause)}[/yellow]"
        lost = _s(r.lost_s) + (f" (overlaps {', '.join(f'a{x}' for x in r.overlaps)})" if r.overlaps else "")
        t.add_row(f"a{r.attempt}->a{r.attempt + 1}", cause, faults, "-" if r.last_step is None else str(r.last_step), lost,
                  _s(r.before_s), _s(r.after_s), str(r.replayed_steps), "-" if r.resumed_at is None else str(r.resumed_at),
                  escape(((r.note + "; ") if r.note else "") + r.detail[:160]))
    console.print(t)
    tot = restarts_summary(rs)
    by = "; ".join(f"{c} {row['restarts']} ({row['lost_s']:.1f}s, {row['replayed_steps']} steps)"
                   for c, row in sorted(tot["by_cause"].items(), key=lambda kv: -kv[1]["restarts"]))
    console.print(escape(f"{tot['restarts']} restart(s): {tot['lost_s']:.1f}s of training lost (each moment once), "
                  f"{tot['replayed_steps']} steps replayed; by cause: {by}"
                  + (f"; time lost not measured for {tot['lost_s_unmeasured']}" if tot["lost_s_unmeasured"] else "")),
                  highlight=False)
    for u in tot["unknown"]:
        console.print(f"[yellow]restart of unknown cause[/yellow]: {escape(u)}", highlight=False)


def print_summary(console: Any, v: Verdict, sched: Schedule, wall_s: float, extra: Mapping[str, Any] | None = None) -> None:
    from rich.table import Table

    counts = summary_counts(v)
    t = Table(title="faults by kind and where they struck")
    for col in ("kind", "scheduled", "met", "in training", "during an episode", "not met (why)"):
        t.add_column(col)
    for kind in sorted({s["kind"] for s in v.strikes}):
        rows = [s for s in v.strikes if s["kind"] == kind]
        met = [s for s in rows if s.get("met")]
        why = Counter(s.get("why_not", "") for s in rows if not s.get("met"))
        t.add_row(kind, str(len(rows)), str(len(met)), str(sum(1 for s in met if not s.get("during"))),
                  str(sum(1 for s in met if s.get("during"))), "; ".join(f"{n}x {w}" for w, n in why.items()))
    console.print(t)

    e_t = Table(title="episodes")
    for col in ("episode", "outcome", "observed at", "F", "faults", "time lost", "note"):
        e_t.add_column(col)
    for e in v.episodes:
        faults = ", ".join(f"#{i} {next((s['kind'] for s in v.strikes if s['index'] == i), '?')}" for i in e.faults)
        e_t.add_row(e.name, e.outcome, e.point, "" if e.frontier is None else str(e.frontier), faults,
                    "-" if e.lost_s is None else f"{e.lost_s:.2f}s",
                    ((f"{e.cause}; " if e.cause else "") + e.note
                     + (f" exit codes {sorted({str(c) for c in e.exit_codes.values()})}" if e.exit_codes else ""))[:90])
    console.print(e_t)

    print_restarts(console, v.restarts, v.strikes)

    o_t = Table(title="outcomes")
    for col in ("outcome", "episodes", "training time lost", "mean"):
        o_t.add_column(col)
    for o in OUTCOMES:
        row = counts["by_outcome"].get(o)
        if row:
            o_t.add_row(o, str(row["episodes"]), f"{row['lost_s']:.1f}s", f"{row['lost_s'] / row['episodes']:.2f}s")
    console.print(o_t)

    c_t = Table(title=f"judge (seed {v.seed})")
    for col in ("check", "verdict", "detail"):
        c_t.add_column(col)
    for c in v.checks:
        c_t.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]FAILED[/red]", c.detail[:400])
    console.print(c_t)
    if v.known:
        console.print(f"[yellow]known engine bugs met (listed, not counted; --strict counts them)[/yellow]: "
                      f"{', '.join(v.known)}", highlight=False)
        for k in sorted({x.split()[0] for x in v.known}):
            console.print(f"  {k}: {KNOWN_BUGS[k].what}", highlight=False)
    tn = v.told_nothing
    if tn:
        acc = sum(1 for m in tn.values() if m.startswith("accepted"))
        console.print(f"check-trace told nothing: {acc} of {len(tn)} attempts accepted", highlight=False)
    console.print(f"{counts['faults_met']} of {counts['faults_scheduled']} faults met, {counts['kinds_met']} kinds, "
                  f"{counts['during_recovery']} during an episode; {len(v.episodes)} episodes over {v.attempts} attempt(s); "
                  f"wall {wall_s / 60:.1f} min", highlight=False)
    if v.green:
        console.print(f"[bold green]JUDGE GREEN[/bold green] (seed {v.seed})")
    else:
        console.print(f"[bold red]JUDGE RED[/bold red] (seed {v.seed})")
        for line in v.failures():
            console.print(f"  {line}", highlight=False, markup=False)


def timeline(path: str | Path, out: str | Path, v: Verdict, world: int, t0_ns: int, title: str = "") -> Path | None:
    """The timeline PNG (module doc; drawn by :func:`accelpact.impl.launch.plot.episode_timeline`, which
    ``accelpact report`` draws with too); None when matplotlib is missing."""
    return episode_timeline(path, out, v.episodes, world, t0_ns,
                            faults=[(s["kind"], s["t_ns"]) for s in v.strikes if s.get("met") and s.get("t_ns") is not None],
                            title=title or f"soak seed {v.seed}: episodes (spans) and faults (markers)")
