"""``accelpact bench memory`` (issue 43 item 3): the worker's per-step peak-memory record
(``Workload.memory``, :mod:`accelpact.testing.memory`) and the benchmark's summariser
(:func:`accelpact.bench.memory.summarize`).

The summariser is checked as a pure function on windows built here, whose ratios are known by
construction (a steady peak of 200 MB over a base of 100 MB, an episode of 300 MB: ratio 1.5, state
ratio 2); the record through one real launch (DDP 1x2, a tiny model, a discard in backward and a repair
at a boundary), against what the job's faults promise: one window per step in order, each peak at least
the resident size it ends with, the discarded step's window and the repaired step's flagged.  Memory
figures are measured by the benchmark, never asserted here.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from accelpact.bench import memory as bench_memory
from accelpact.bench.memory import MemoryBenchError, episode_plan, summarize
from accelpact.impl.launch.job import FieldError, Job, JobError, Topology, Workload
from accelpact.impl.rundir import RunDir

BASE, STEADY = 100.0, 200.0


def _step(pid: int, step: int, peak: float, episode: str | None = None, gen: int = 0, **extra) -> dict:
    return {"pid": pid, "window": "step", "step": step, "gen_start": gen, "gen": gen + (episode is not None),
            "discarded": episode in ("discard", "swap"), "report": episode == "repair", "episode": episode,
            "dead": extra.pop("dead", []), "sources": extra.pop("sources", {}), "peak_rss_mb": peak, "rss_mb": peak - 10,
            **extra}


def _head(pid: int, first: str = "attach", step: int = 0, spare: int | None = None, peak: float = 150.0) -> list[dict]:
    return [{"pid": pid, "window": "base", "rss_mb": BASE, "peak_rss_mb": BASE, "spare": spare},
            {"pid": pid, "window": first, "step": step, "gen": 0, "spare": spare, "peak_rss_mb": peak, "rss_mb": peak}]


def _discard_rank(pid: int, episode_peak: float = 300.0) -> list[dict]:
    """Steps 0..7, the discard in step 4 (its window 300 MB), the rerun of step 4 (250 MB: the window
    right after the episode, no steady state), fault-free windows of 200 MB; step 0 (999 MB) is no
    steady state either; steps 5..7 (220 MB) are the drift.  Live tensors: 100 MB before, 140 MB after."""
    rows = _head(pid)
    rows.append(_step(pid, 0, 999.0))
    rows += [_step(pid, s, STEADY, tensor_mb=100.0) for s in (1, 2, 3)]
    rows.append(_step(pid, 4, episode_peak, "discard", tensor_mb=500.0))
    rows.append(_step(pid, 4, 250.0, gen=1, tensor_mb=500.0))
    rows += [_step(pid, s, 220.0, gen=1, tensor_mb=140.0) for s in (5, 6, 7)]
    return rows


DISCARD = [{"step": 4, "kind": "discard", "victims": []}]


def test_the_episode_window_is_the_discarded_step_and_the_ratios_follow_from_it() -> None:
    s = summarize({0: _discard_rank(10), 1: _discard_rank(11, episode_peak=330.0)}, DISCARD)
    by_rank = {p["rank"]: p for p in s["processes"]}
    for rank, peak in ((0, 300.0), (1, 330.0)):
        p = by_rank[rank]
        assert p["steady"] == STEADY and p["steady_from"] == "before" and p["steady_n"] == 3  # steps 1..3
        assert p["drift"] == pytest.approx(220.0 / STEADY)  # steps 5..7 (the rerun of 4 is left out)
        assert p["steady_all"] == pytest.approx(210.0)  # 200, 200, 200, 220, 220, 220
        assert p["tensor_growth_mb"] == pytest.approx(40.0)  # what the episode left alive
        (e,) = p["episodes"]
        assert (e["step"], e["kind"], e["role"], e["window"]) == (4, "discard", "survivor", "step")
        assert e["peak_mb"] == peak
        assert e["ratio"] == pytest.approx(peak / STEADY)
        assert e["state_ratio"] == pytest.approx((peak - BASE) / (STEADY - BASE))
        assert e["after_ratio"] == pytest.approx(250.0 / STEADY)
    assert s["max_ratio"] == pytest.approx(330.0 / STEADY)
    assert s["max_state_ratio"] == pytest.approx(230.0 / 100.0)
    assert s["roles"]["survivor"]["processes"] == 2


def test_a_later_episode_is_measured_against_both_steady_states() -> None:
    """Two discards: 200 MB before the first, 250 MB between them (what the first left behind), the
    second's window 350 MB: 1.75 against the job's steady state, 1.4 against the one just before it."""
    rows = _head(10) + [_step(10, 0, 999.0)] + [_step(10, s, STEADY) for s in (1, 2, 3)]
    rows += [_step(10, 4, 300.0, "discard"), _step(10, 4, 999.0, gen=1)] + [_step(10, s, 250.0, gen=1) for s in (5, 6, 7)]
    rows += [_step(10, 8, 350.0, "discard", gen=1), _step(10, 8, 999.0, gen=2)] + [_step(10, s, 250.0, gen=2) for s in (9, 10)]
    (p,) = summarize({0: rows}, DISCARD + [{"step": 8, "kind": "discard", "victims": []}])["processes"]
    first, second = p["episodes"]
    assert (first["ratio"], first["local_ratio"]) == (pytest.approx(1.5), pytest.approx(1.5))
    assert (second["ratio"], second["local_ratio"]) == (pytest.approx(350.0 / STEADY), pytest.approx(350.0 / 250.0))
    assert second["local_state_ratio"] == pytest.approx((350.0 - BASE) / (250.0 - BASE))
    assert p["drift"] == pytest.approx(250.0 / STEADY)


def test_a_missing_episode_window_is_a_clear_error() -> None:
    """The window read before the discard's episode (the worker recording the step as fault-free)."""
    rows = _discard_rank(11)
    seeded = [r for r in rows if not (r.get("step") == 4 and r.get("episode"))]
    with pytest.raises(MemoryBenchError, match=r"rank 1 \(pid 11\): no window holds the discard at step 4"):
        summarize({0: _discard_rank(10), 1: seeded}, DISCARD)
    flagged_none = copy.deepcopy(rows)
    for r in flagged_none:
        if r.get("step") == 4 and r.get("episode"):
            r["episode"] = None
    with pytest.raises(MemoryBenchError, match="no window holds the discard at step 4"):
        summarize({0: _discard_rank(10), 1: flagged_none}, DISCARD)
    with pytest.raises(MemoryBenchError, match="holds a discard, not the repair"):
        summarize({0: _discard_rank(10)}, [{"step": 4, "kind": "repair", "victims": []}])
    with pytest.raises(MemoryBenchError, match="its windows end at step 3"):
        summarize({0: [r for r in rows if r.get("step", 0) < 4]}, DISCARD)
    with pytest.raises(MemoryBenchError, match="no episode expected"):
        summarize({0: rows}, [])
    with pytest.raises(MemoryBenchError, match="no base or attach/join line"):
        summarize({0: rows[2:]}, DISCARD)


def _swap_windows(join_peak: float = 180.0) -> dict[int, list[dict]]:
    """DDP 1x2: rank 1 (pid 21) dies in step 4; spare 0 (pid 22) joins as rank 1 at F = 4 (its window
    from its start through the join: ``join_peak``), then runs steps 4..9 at 240 MB (its first, 4, is no
    steady state); rank 0 (pid 20) sent the state (its window of step 4: 320 MB, the swap)."""
    r0 = _head(20) + [_step(20, 0, 999.0)] + [_step(20, s, STEADY) for s in (1, 2, 3)]
    r0.append(_step(20, 4, 320.0, "swap", dead=[1], sources={"1": 0}))
    r0 += [_step(20, 4, 260.0, gen=1)] + [_step(20, s, STEADY, gen=1) for s in range(5, 10)]
    r1 = _head(21) + [_step(21, 0, 999.0)] + [_step(21, s, STEADY) for s in (1, 2, 3)]
    r1 += _head(22, first="join", step=4, spare=0, peak=join_peak)
    r1 += [_step(22, 4, 400.0, gen=1)] + [_step(22, s, 240.0, gen=1) for s in range(5, 10)]
    return {0: r0, 1: r1}


def test_a_swap_names_its_roles_and_the_spare_is_measured_against_its_own_steady_state() -> None:
    s = summarize(_swap_windows(), [{"step": 4, "kind": "swap", "victims": [1]}])
    procs = {p["pid"]: p for p in s["processes"]}
    assert procs[21]["episodes"] == [] and procs[21]["died_at"] == 4  # the victim: nothing of it after its death
    (src,) = procs[20]["episodes"]
    assert (src["role"], src["peak_mb"], src["ratio"]) == ("source", 320.0, pytest.approx(320.0 / STEADY))
    (spare,) = procs[22]["episodes"]
    assert (spare["role"], spare["window"], spare["peak_mb"]) == ("spare", "join", 180.0)
    assert procs[22]["steady"] == 240.0  # steps 5..9; its first (4, 400 MB) left out
    assert spare["ratio"] == pytest.approx(180.0 / 240.0)
    assert spare["after_ratio"] == pytest.approx(400.0 / 240.0)
    assert set(s["roles"]) == {"source", "spare"}
    # the 2x2 layout: a rank neither receiving nor sending is a bystander
    w = _swap_windows()
    w[2] = _head(30) + [_step(30, 0, 999.0)] + [_step(30, st, STEADY) for st in (1, 2, 3)] + \
        [_step(30, 4, 210.0, "swap", dead=[1], sources={"1": 0})] + [_step(30, st, STEADY, gen=1) for st in range(4, 8)]
    assert summarize(w, [{"step": 4, "kind": "swap", "victims": [1]}])["roles"]["bystander"]["ratio"] == \
        pytest.approx(210.0 / STEADY)


def test_a_swap_whose_spare_never_joined_is_a_clear_error() -> None:
    w = _swap_windows()
    w[1] = [r for r in w[1] if r["pid"] != 22]
    with pytest.raises(MemoryBenchError, match="the swap at step 4: no process joined as its spare"):
        summarize(w, [{"step": 4, "kind": "swap", "victims": [1]}])


def test_the_plan_puts_each_kind_where_the_engine_runs_it() -> None:
    """A discard: R's sockets cut in backward (the worker passes rebuild=); a swap: a crash in backward,
    a spare each, each of another rank; a repair: R cut at the boundary."""
    faults, expected, steps, spares = episode_plan("discard", "fsdp1-hybrid", 2, 5, 5)
    assert [(f["step"], f["at"], f["kind"], f["ranks"], f["group"]) for f in faults] == \
        [(5, "backward", "collective_timeout", [1, 3], "replicate"), (10, "backward", "collective_timeout", [1, 3], "replicate")]
    assert (steps, spares) == (15, 0) and [e["step"] for e in expected] == [5, 10]
    faults, expected, steps, spares = episode_plan("swap", "ddp", 2, 4, 4)
    assert [(f["at"], f["kind"], f["ranks"]) for f in faults] == [("backward", "crash", [1]), ("backward", "crash", [0])]
    assert spares == 2 and [e["victims"] for e in expected] == [[1], [0]]
    faults, *_ = episode_plan("repair", "ddp", 1, 4, 4)
    assert [(f["at"], f["kind"], f["ranks"], f["group"]) for f in faults] == [("boundary", "collective_timeout", [1], "world")]
    with pytest.raises(ValueError, match="unknown episode kind 'meteor'"):
        episode_plan("meteor", "ddp", 1, 4, 4)


@pytest.mark.parametrize("argv,needle", [
    (["--kinds", "discard,meteor"], "--kinds: ['meteor']"),
    (["--wrappers", "fsdp3"], "--wrappers: ['fsdp3']"),
    (["--dim", "33"], "--dim must be an even width"),
    (["--episodes", "0"], "--episodes must be >= 1"),
    (["--warmup", "1"], "--warmup must be >= 3"),
    (["--gap", "2"], "--gap must be >= 3"),
    (["--episodes", "3", "--wrappers", "ddp"], "each swap kills another rank"),
    (["--retries", "-1"], "--retries must be >= 0"),
])
def test_bad_flags_are_refused_naming_the_flag(argv: list[str], needle: str, capsys) -> None:
    p = argparse.ArgumentParser()
    bench_memory.add_arguments(p)
    assert bench_memory.run(p.parse_args(argv)) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("field,value,needle", [
    ("dim", 33, "workload.dim: must be even"),
    ("dim", -2, r"workload.dim: must be in \[0, 16384\]"),
    ("dim", "wide", "workload.dim: must be an integer"),
    ("memory", 1, "workload.memory: must be true or false"),
])
def test_the_workload_fields_are_validated(tmp_path: Path, field: str, value, needle: str) -> None:
    raw = Job(topology=Topology(1, 2), workload=Workload(wrapper="ddp", steps=3), out=str(tmp_path)).to_json()
    raw["workload"][field] = value
    with pytest.raises(JobError, match=needle):
        Job.parse(raw)
    with pytest.raises(FieldError, match=needle):
        Workload.parse(raw["workload"])


def test_the_workload_fields_leave_other_jobs_files_as_they_were(tmp_path: Path) -> None:
    job = Job(topology=Topology(1, 2), workload=Workload(wrapper="ddp", steps=3), out=str(tmp_path))
    assert "dim" not in job.to_json()["workload"] and "memory" not in job.to_json()["workload"]
    on = job.replace(workload=Workload(wrapper="ddp", steps=3, dim=64, memory=True))
    assert on.to_json()["workload"]["dim"] == 64 and on.to_json()["workload"]["memory"] is True
    assert Job.parse(on.to_json()) == on


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_the_worker_records_one_window_per_step_with_the_episodes_in_theirs(tmp_path: Path) -> None:
    """DDP 1x2, a tiny model: R's sockets cut in backward of step 2 (discarded in place: the worker
    passes ``rebuild=``) and at the boundary of step 4 (an L1 repair).  Each rank's file: the base and
    attach lines, then one window per step run, in order (step 2 twice: discarded, then again), each
    peak at least the resident size it ends with; the discarded window holds the discard (the
    generation moved in it), the window of step 4 holds the repair, every other window none."""
    pytest.importorskip("torch")
    from accelpact.impl.launch.launch import run_local

    steps = 6
    job = Job(topology=Topology(1, 2), workload=Workload(wrapper="ddp", layers=1, steps=steps, memory=True),
              out=str(tmp_path / "run"), scenario="test-memory", deadline_s=30.0, collective_timeout_s=60.0).replace(
        faults=[{"step": 2, "at": "backward", "kind": "collective_timeout", "ranks": [0, 1], "group": "world"},
                {"step": 4, "at": "boundary", "kind": "collective_timeout", "ranks": [1], "group": "world"}])
    res = run_local(job, timeout_s=90)
    assert res.ok(), res.log_tail(3000)
    run = RunDir(job.out)
    assert sorted(run.memory_files()) == [(0, 0), (0, 1)]
    for rank in (0, 1):
        rows = [json.loads(line) for line in run.memory(0, rank).read_text().splitlines()]
        assert [r["window"] for r in rows[:2]] == ["base", "attach"]
        assert len({r["pid"] for r in rows}) == 1
        windows = rows[2:]
        assert [r["window"] for r in windows] == ["step"] * (steps + 1)
        assert [r["step"] for r in windows] == [0, 1, 2, 2, 3, 4, 5]
        assert all(r["peak_rss_mb"] >= r["rss_mb"] > 0 for r in rows), rows
        assert all(0 < r["tensor_mb"] < r["rss_mb"] for r in rows[1:]), rows  # the model's tensors, within the process
        assert rows[1]["peak_rss_mb"] >= rows[0]["rss_mb"]  # attach's window holds the build, from the process's start
        flagged = [(r["step"], r["episode"], r["discarded"], r["report"]) for r in windows if r["episode"]]
        assert flagged == [(2, "discard", True, False), (4, "repair", False, True)], windows
        assert [r["gen"] - r["gen_start"] for r in windows] == [0, 0, 1, 0, 0, 1, 0]
    s = summarize(bench_memory.read_windows(job.out), [{"step": 2, "kind": "discard", "victims": []},
                                                       {"step": 4, "kind": "repair", "victims": []}])
    assert {(e["step"], e["kind"]) for p in s["processes"] for e in p["episodes"]} == {(2, "discard"), (4, "repair")}
