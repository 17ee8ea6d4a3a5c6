"""Issue 44, item 4: ``accelpact report RUN`` (impl/launch/report.py).

Fixture: two runs of ``accelpact demo`` (tests/data/report-demo: ``l2``, a failure in backward without
``rebuild=``: an L2 restart; ``swap``, rank 1 SIGKILLed in backward: a spare took its identity), their
traces, result and steps files as the demo wrote them.  The expected rows are read off those files here,
with json alone, not through the report's code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.impl.launch.report import ReportError, find_runs, read_run
from accelpact.impl.rundir import RunDir

DATA = Path(__file__).parent / "data" / "report-demo"


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _actions(run: Path) -> list[dict]:
    return [r for p in sorted(run.glob("*trace-a*-r*.ndjson")) for r in _lines(p) if r.get("type") == "action"]


def _commits(run: Path, attempt: int) -> list[dict]:
    return [r for p in sorted(run.glob(f"steps-a{attempt}-r*.ndjson")) for r in _lines(p)]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    out = tmp_path / "demo"
    shutil.copytree(DATA, out)
    return out


def test_an_l2_restart_row_matches_the_records(demo: Path) -> None:
    run = demo / "l2"
    acts = _actions(run)
    fault = next(r for r in acts if r["action"].startswith("Fault"))
    observe = next(r for r in acts if r["action"] == "RankObserve")
    a0, a1 = _commits(run, 0), _commits(run, 1)
    last_before = max(c["step"] for c in a0)                 # the last step attempt 0 committed
    resumed_at = min(c["step"] for c in a1)                  # where attempt 1 began again (its checkpoint)
    t_last = max(c["t"] for c in a0 if c["step"] == last_before)
    t_back = min(c["t"] for c in a1 if c["step"] > last_before)
    rep = read_run(run)
    assert [e.outcome for e in rep.episodes] == ["L2"]
    e = rep.episodes[0]
    assert (e.attempt, e.gen, e.frontier) == (0, 0, observe["state"]["frontier"])
    assert rep.replayed[e.name] == last_before - resumed_at + 1
    assert e.lost_s == pytest.approx(t_back - t_last, abs=1e-3)
    assert observe["state"]["point"] in rep.observed[e.name] and "InjectedFault" in rep.observed[e.name]
    assert [(f.kind, f.rank, f.episode) for f in rep.faults] == [(fault["action"], fault["rank"], "a0/g0")]
    assert rep.world == 4 and rep.attempts == 2


def test_a_hot_swap_row_matches_the_records(demo: Path) -> None:
    run = demo / "swap"
    acts = _actions(run)
    fault = next(r for r in acts if r["action"] == "FaultCrash")
    resumed = [r for r in acts if r["action"] == "RankResume"]
    joined = [r for r in acts if r["action"] == "SpareJoin"]
    assert joined, "the fixture's spare joined"
    rep = read_run(run)
    assert [e.outcome for e in rep.episodes] == ["swap"]
    e = rep.episodes[0]
    assert e.lost_s == pytest.approx((max(r["t_ns"] for r in resumed) - fault["t_ns"]) / 1e9, abs=1e-3)
    assert sorted(e.resumed) == sorted({r["rank"] for r in resumed}) == [0, 1, 2, 3]
    assert rep.replayed[e.name] == 0
    assert e.frontier == min(r["state"]["frontier"] for r in acts if r["action"] in ("RankObserve", "RankDiscardStep"))


def test_the_command_prints_the_tables_and_writes_each_runs_timeline(demo: Path) -> None:
    pytest.importorskip("matplotlib")
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "report", str(demo)], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, outcome in (("l2", "L2 restart"), ("swap", "L1 swap")):
        assert f"accelpact report {demo / name}" in proc.stdout and outcome in proc.stdout, proc.stdout
        png = demo / name / "report-timeline.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_a_fault_free_run_has_no_episode(tmp_path: Path) -> None:
    run = tmp_path / "quiet"
    shutil.copytree(DATA / "swap", run)
    for p in run.glob("spare*"):
        p.unlink()
    for p in RunDir(run).trace_files().values():  # keep each trace's header and nothing it recorded
        p.write_text(p.read_text().splitlines()[0] + "\n")
    rep = read_run(run)
    assert rep.episodes == [] and rep.faults == []


@pytest.mark.parametrize("make, says", [
    (lambda t: t / "missing", "no such folder"),
    (lambda t: (t / "empty").mkdir() or t / "empty", "empty"),
    (lambda t: ((t / "other").mkdir(), (t / "other" / "notes.txt").write_text("x"), t / "other")[-1],
     "holds no run's traces, result or steps files"),
    (lambda t: ((t / "f.txt").write_text("x"), t / "f.txt")[-1], "not a folder"),
])
def test_bad_input_is_named(tmp_path: Path, make, says) -> None:
    path = make(tmp_path)
    with pytest.raises(ReportError) as exc:
        find_runs(path)
    assert says in str(exc.value) and str(path) in str(exc.value), str(exc.value)
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "report", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and says in proc.stderr, proc.stdout + proc.stderr


def test_a_torn_trace_is_named(demo: Path) -> None:
    p = RunDir(demo / "swap").trace(0, 2)
    p.write_text(p.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(ReportError, match="its traces cannot be read"):
        read_run(demo / "swap")
