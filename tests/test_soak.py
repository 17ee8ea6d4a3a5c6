"""The chaos soak (issue 28, accelpact/testing/soak): its schedule, its judge on tampered histories,
and short real soaks (one must be green, one with a seeded engine bug must fail naming the seed
and the episode).

The unit tests build a soak's run folder from a model run (``checker.project`` of one boundary
repair: the records a faithful implementation writes) with result files and final snapshots, so
the judge is exercised without processes.  The real soaks are multi-process and slow; each is
bounded by pytest's timeout and by the soak's own launch bound, and reaps every process it started.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from accelpact import cli
from accelpact.impl.rundir import RunDir
from accelpact.testing.soak import judge as J
from accelpact.testing.soak.schedule import SOAK_KINDS, Schedule, SoakConfig, SoakError, SoakFault, draw, load, unavailable_kinds

# ----------------------------------------------------------------------------------------- schedule


def test_same_seed_same_schedule() -> None:
    cfg = SoakConfig(minutes=10, seed=7, spares=1)
    a, b = draw(cfg), draw(cfg)
    assert a.to_json() == b.to_json()
    assert len(a.faults) >= 15
    assert draw(replace(cfg, seed=8)).to_json()["faults"] != a.to_json()["faults"]


def test_schedule_draws_every_available_kind_and_faults_during_recovery() -> None:
    cfg = SoakConfig(minutes=30, seed=3, spares=2, launcher="restarting")
    sched = draw(cfg)
    kinds = {f.kind for f in sched.faults}
    assert kinds == set(SOAK_KINDS) - set(sched.skipped)
    assert "partition" in sched.skipped and "store_loss" not in sched.skipped
    assert any(f.trigger == "recovery" for f in sched.faults)
    assert [f.index for f in sched.faults] == list(range(len(sched.faults)))
    # a straggler stays below the hang threshold, a stop or held GIL lasts past the detector's bound
    assert all(f.duration_s is not None and f.duration_s < 5.0 for f in sched.faults if f.kind == "slow")
    assert all(f.duration_s is not None and f.duration_s > 1.0 for f in sched.faults if f.kind in ("stop", "gil_hang"))


def test_torchrun_skips_the_store_and_a_job_without_spares_skips_their_crash() -> None:
    why = unavailable_kinds(SoakConfig(spares=0))
    assert "torchrun" in why["store_loss"] and "--spares 0" in why["crash_spare"]
    sched = draw(SoakConfig(minutes=5, spares=0))
    assert not {f.kind for f in sched.faults} & {"store_loss", "crash_spare", "partition"}


def test_replay_file_round_trips(tmp_path: Path) -> None:
    sched = draw(SoakConfig(minutes=4, seed=11)).with_steps(321)
    path = sched.save(tmp_path / "schedule.json")
    back = load(path)
    assert back == sched
    assert back.to_json() == json.loads(path.read_text())
    assert back.config.steps == 321


def test_the_soak_opts_in_to_micro_batches_by_default_and_an_old_schedule_replays_without() -> None:
    """Issue 41: by default a step is as many micro-batches as the job has replicas (one per node for the
    hybrid wrappers, one per rank for DDP); 0 opts out; a schedule saved before the flag existed ran
    without micro-batches and replays so."""
    assert SoakConfig().micro_batch_count == 2 and SoakConfig(wrapper="ddp").micro_batch_count == 4
    assert SoakConfig(micro_batches=0).check().micro_batch_count == 0
    assert SoakConfig(micro_batches=6).check().micro_batch_count == 6
    raw = draw(SoakConfig(minutes=3, seed=2)).to_json()
    assert raw["config"]["micro_batches"] is None
    del raw["config"]["micro_batches"]
    assert SoakConfig.from_json(raw["config"]).micro_batch_count == 0


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["faults"][0].update(kind="meteor"), "faults[0].kind"),
    (lambda d: d["faults"][1].update(index=5), "faults[1].index"),
    (lambda d: d["config"].update(minutes=-3), "--minutes"),
    (lambda d: d.update(seed=99), "seed"),
    (lambda d: d.update(format="other/1"), "not a soak schedule"),
])
def test_a_bad_replay_file_names_the_field(tmp_path: Path, edit, field: str) -> None:
    raw = draw(SoakConfig(minutes=3, seed=2)).to_json()
    edit(raw)
    p = tmp_path / "schedule.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(SoakError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load(p)


@pytest.mark.parametrize("argv, flag", [
    (["--minutes", "0"], "--minutes"),
    (["--seed", "-1"], "--seed"),
    (["--wrapper", "zero3"], "--wrapper"),
    (["--nodes", "1"], "--nodes"),
    (["--spares", "99"], "--spares"),
    (["--launcher", "slurm"], "--launcher"),
    (["--kinds", "crash,meteor"], "--kinds"),
    (["--checkpoint-every", "0"], "--checkpoint-every"),
    (["--steps", "3"], "--steps"),
    (["--fault-every", "1"], "--fault-every"),
    (["--seeded-bug", "typo"], "--seeded-bug"),
    (["--micro-batches", "1"], "--micro-batches"),  # fewer than the 2 replicas of the default 2x2 hybrid job
    (["--replay", "/nonexistent/schedule.json"], "--replay"),
])
def test_bad_flags_exit_2_naming_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["soak", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and "error" in err


def test_replay_refuses_a_flag_that_would_change_the_schedule(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = draw(SoakConfig(minutes=3)).save(tmp_path / "schedule.json")
    assert cli.main(["soak", "--replay", str(path), "--seed", "4", "--spares", "2"]) == 2
    err = capsys.readouterr().err
    assert "--seed" in err and "--spares" in err and "--replay" in err


def test_schedule_describes_each_fault() -> None:
    f = SoakFault(index=3, kind="cut_group", at_s=42, rank=1, group="R")
    assert f.describe() == "#3 cut_group rank 1's R group at t+42s"
    assert "during the episode" in SoakFault(index=4, kind="crash", trigger="recovery").describe()


# --------------------------------------------------------------------------------- the judge, offline

WORLD = 4


def _history(tmp_path: Path) -> tuple[Path, Path, list[dict]]:
    """A soak's run folder holding one honest boundary repair (attempt 0, generation 0), its result
    files and final snapshots, a reference with the same snapshots, and the strike that caused it."""
    torch = pytest.importorskip("torch")
    from accelpact.conformance.checker import project, scheduled_repair, write_dir
    from accelpact.model.state import Config

    cfg = Config(nodes=2, ranks_per_node=2, affected_local=1, max_faults=1, frontier=5, checkpoint=0)
    t0 = 10**12
    traces = project(cfg, scheduled_repair(cfg), t0=t0)
    run, ref = RunDir(tmp_path / "run"), RunDir(tmp_path / "ref")
    write_dir(traces, run.path)
    ref.path.mkdir()
    for r in range(WORLD):
        run.result(0, r).write_text(json.dumps({"outcome": "finished", "exit_code": 0, "frontier": 9}))
        run.steps(0, r).write_text("".join(json.dumps({"step": s, "loss": 1.0, "t": s}) + "\n" for s in range(9)))
        snap = {"params": {"w": torch.arange(4.0) + r}, "step": 9}
        torch.save(snap, run.final(r))
        torch.save(snap, ref.final(r))
    strikes = [{"index": 0, "kind": "cut_group", "trigger": "time", "met": True, "t_ns": t0 - 500_000_000, "identity": 1,
                "detail": {"group": "replicate", "r": True}}]
    return run.path, ref.path, strikes


def _judge(run: Path, ref: Path, strikes: list[dict], **kw) -> J.Verdict:
    return J.judge(run, seed=5, world=WORLD, spares=0, strikes=strikes, reference=ref, **kw)


def _check(v: J.Verdict, name: str) -> J.Check:
    return next(c for c in v.checks if c.name == name)


def test_judge_is_green_on_an_honest_history(tmp_path: Path) -> None:
    run, ref, strikes = _history(tmp_path)
    v = _judge(run, ref, strikes)
    assert v.green, v.failures()
    assert [(e.name, e.outcome, e.faults) for e in v.episodes] == [("a0/g0", "L1", [0])]
    assert v.episodes[0].lost_s == 0.5  # from the strike to the last RankResume


def _rewrite(run: Path, rank: int, keep) -> None:
    p = RunDir(run).trace(0, rank)
    lines = p.read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    out, seq = [], 0
    for rec in recs:
        if rec.get("type") == "action":
            if not keep(rec):
                continue
            rec["seq"] = seq
            seq += 1
        out.append(json.dumps(rec))
    p.write_text("\n".join(out) + "\n")


def test_judge_fails_a_trace_with_a_record_dropped_naming_seed_and_episode(tmp_path: Path) -> None:
    run, ref, strikes = _history(tmp_path)
    _rewrite(run, 2, lambda rec: rec["action"] != "RankArrive")  # renumbered: a model-level tampering
    v = _judge(run, ref, strikes)
    assert not v.green
    c = _check(v, "traces")
    assert not c.ok and c.episodes == ["a0/g0"]
    assert any(line.startswith("seed 5: traces FAILED (episode a0/g0)") for line in v.failures())


def test_judge_fails_a_trace_with_a_gap(tmp_path: Path) -> None:
    run, ref, strikes = _history(tmp_path)
    p = RunDir(run).trace(0, 3)
    lines = p.read_text().splitlines()
    p.write_text("\n".join(lines[:3] + lines[4:]) + "\n")  # seq no longer gap-free
    v = _judge(run, ref, strikes)
    assert not v.green and "unusable" in _check(v, "traces").detail


def test_judge_fails_a_final_state_that_differs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    run, ref, strikes = _history(tmp_path)
    snap = torch.load(RunDir(run).final(1), weights_only=False)
    snap["params"]["w"][2] += 1e-6
    torch.save(snap, RunDir(run).final(1))
    v = _judge(run, ref, strikes)
    c = _check(v, "bit_identical")
    assert not c.ok and "rank 1" in c.detail and not v.green


def test_judge_fails_a_generation_where_only_some_ranks_resumed(tmp_path: Path) -> None:
    run, ref, strikes = _history(tmp_path)
    _rewrite(run, 0, lambda rec: rec["action"] != "RankResume")
    v = _judge(run, ref, strikes)
    c = _check(v, "all_or_none")
    assert not c.ok and c.episodes == ["a0/g0"] and v.episodes[0].outcome == "split"


def _shrunk_history(tmp_path: Path, rel: float = 1e-6) -> tuple[Path, Path, list[dict]]:
    """Issue 41: a DDP job of 3 ranks opted in to micro-batches, rank 1 SIGKILLed with no spare idle: the
    survivors 0 and 2 shrink (RankShrink; RankResume names replicas [0, 2] active) and finish; rank 1's
    trace has its header only, its result still says running (killed).  The finals of 0 and 2 equal each
    other and differ from the reference by ``rel`` (relative, in the parameters and the optimizer
    state): the same micro-batches summed in another order; step, cursor and RNG equal."""
    torch = pytest.importorskip("torch")
    run, ref = RunDir(tmp_path / "run"), RunDir(tmp_path / "ref")
    run.path.mkdir(parents=True)
    ref.path.mkdir(parents=True)
    t0 = 10**12
    head = {"type": "header", "format": "accelpact-trace/1", "world": 3, "nodes": 1, "ranks_per_node": 3,
            "group": "world", "own_group": [0, 1, 2], "attempt": 0, "wrapper": "ddp", "spares": 0, "shrink": True,
            "micro_batches": 6}
    for r in range(3):
        lines = [{**head, "rank": r}]
        if r != 1:
            acts = [("RankObserve", {"pc": "observed", "point": "backward", "frontier": 4, "tau": 4})]
            acts += [("RankShrink", {"pc": "observed", "frontier": 4})] if r == 0 else []
            acts += [("RankResume", {"pc": "train", "gen": 1, "point": "", "share": [0, 2, 4] if r == 0 else [1, 3, 5],
                                     "active": [0, 2]})]
            lines += [{"type": "action", "seq": i, "rank": r, "action": a, "gen": 0, "t_ns": t0 + i * 1000, "state": st}
                      for i, (a, st) in enumerate(acts)]
        run.trace(0, r).write_text("".join(json.dumps(x) + "\n" for x in lines))
        run.steps(0, r).write_text("".join(json.dumps({"step": s, "loss": 1.0, "t": s}) + "\n" for s in range(9 if r != 1 else 4)))
        w = torch.arange(1.0, 5.0)
        snap = {"params": {"w": w.clone()}, "optimizer": {"state": {0: {"step": torch.tensor(9.0), "exp_avg": w / 10}}},
                "step": 9, "cursor": 9, "rng": torch.arange(3, dtype=torch.uint8)}
        torch.save(snap, ref.final(r))
        if r == 1:
            run.result(0, r).write_text(json.dumps({"outcome": "running", "exit_code": None, "frontier": 4}))
            continue
        moved = {**snap, "params": {"w": w * (1 + rel)},
                 "optimizer": {"state": {0: {"step": torch.tensor(9.0), "exp_avg": w / 10 * (1 + rel)}}}}
        torch.save(moved, run.final(r))
        run.result(0, r).write_text(json.dumps({"outcome": "finished", "exit_code": 0, "frontier": 9,
                                                "active_replicas": [0, 2]}))
    return run.path, ref.path, []


def _largest(detail: str) -> float:
    import re

    m = re.search(r"largest relative difference ([0-9.e+-]+) ", detail)
    assert m, detail
    return float(m.group(1))


def _judge3(run: Path, ref: Path) -> J.Verdict:
    return J.judge(run, seed=5, world=3, spares=0, strikes=[], reference=ref)


def test_judge_a_shrink_is_no_split_and_its_state_is_compared_within_the_tolerance(tmp_path: Path) -> None:
    """Issue 41: the episode that took replica 1 out is a ``shrink`` (every identity of the replicas its
    RankResume names active resumed), the job finished on them (rank 1 dead, excused), and the final
    states, which differ from the reference by floating-point order only, pass ``bit_identical`` within
    the stated tolerance, with the largest relative difference reported."""
    run, ref, _ = _shrunk_history(tmp_path)
    v = _judge3(run, ref)
    assert [(e.name, e.outcome) for e in v.episodes] == [("a0/g0", "shrink")]
    for name in ("all_or_none", "finished", "bit_identical"):
        assert _check(v, name).ok, (name, _check(v, name).detail)
    detail = _check(v, "bit_identical").detail
    assert 0.9e-6 < _largest(detail) < 1.1e-6 and "5 steps since the first shrink at step 4" in detail, detail
    assert "ranks [1] out of training at the end" in detail


def test_judge_after_a_shrink_fails_a_state_beyond_the_tolerance_or_replicas_that_differ(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    run, ref, _ = _shrunk_history(tmp_path / "far", rel=1e-2)  # 5 steps since the shrink: the bound is 2.5e-4
    c = _check(_judge3(run, ref), "bit_identical")
    assert not c.ok and 0.9e-2 < _largest(c.detail) < 1.1e-2 and "tolerance 0.00025" in c.detail, c.detail
    run, ref, _ = _shrunk_history(tmp_path / "apart")
    snap = torch.load(RunDir(run).final(2), weights_only=False)
    snap["params"]["w"][0] += 1e-6  # still within the tolerance of the reference, but not rank 0's twin
    torch.save(snap, RunDir(run).final(2))
    c = _check(_judge3(run, ref), "bit_identical")
    assert not c.ok and "the replicas of one shard differ" in c.detail and "rank 2 vs rank 0" in c.detail, c.detail
    run, ref, _ = _shrunk_history(tmp_path / "step")
    snap = torch.load(RunDir(run).final(0), weights_only=False)
    snap["cursor"] = 8  # a cursor is never a matter of floating-point order
    torch.save(snap, RunDir(run).final(0))
    c = _check(_judge3(run, ref), "bit_identical")
    assert not c.ok and "cursor" in c.detail, c.detail


def test_judge_a_shrunk_generation_where_an_active_rank_did_not_resume_is_split(tmp_path: Path) -> None:
    run, ref, _ = _shrunk_history(tmp_path)
    _rewrite(run, 2, lambda rec: rec["action"] != "RankResume")
    v = _judge3(run, ref)
    c = _check(v, "all_or_none")
    assert not c.ok and v.episodes[0].outcome == "split" and "ranks [2] did not" in v.episodes[0].note


def test_judge_a_job_that_ended_shrunk_must_finish_every_active_rank(tmp_path: Path) -> None:
    run, ref, _ = _shrunk_history(tmp_path)
    RunDir(run).result(0, 2).write_text(json.dumps({"outcome": "running", "exit_code": None, "frontier": 8}))
    assert not _check(_judge3(run, ref), "finished").ok


def test_judge_fails_a_straggler_that_started_an_episode(tmp_path: Path) -> None:
    run, ref, strikes = _history(tmp_path)
    slow = [{"index": 0, "kind": "slow", "trigger": "time", "met": True, "t_ns": strikes[0]["t_ns"], "identity": 1,
             "duration_s": 1.0}]
    v = _judge(run, ref, slow)
    assert not _check(v, "straggler").ok
    # the same episode with a real fault struck beside the sleep is not the straggler's
    v = _judge(run, ref, slow + [{**strikes[0], "index": 1}])
    assert _check(v, "straggler").ok


def test_judge_fails_growth_across_episodes(tmp_path: Path) -> None:
    run, ref, strikes = _history(tmp_path)
    row = {"t_ns": 1, "attempt": 0, "identity": 2, "pid": 4242, "episodes_before": 1, "threads": 30, "fds": 90, "listeners": 6}
    start = {**row, "t_ns": 0, "episodes_before": 0, "threads": 20, "fds": 50, "listeners": 5}  # a worker from the start
    grown = [start, row, {**row, "t_ns": 2, "episodes_before": 3, "fds": 93}]
    v = _judge(run, ref, strikes, samples=grown)
    c = _check(v, "no_leaks")
    assert not c.ok and "fds 90 -> 93" in c.detail
    assert _check(_judge(run, ref, strikes, samples=[start, row, {**row, "t_ns": 2, "episodes_before": 3}]), "no_leaks").ok
    # a spare (first sampled after the episode it joined in): its baseline follows its first repair
    joined = {**row, "pid": 4343, "listeners": 5}
    spare = [joined, {**joined, "t_ns": 2, "episodes_before": 2, "listeners": 6}, {**joined, "t_ns": 3, "episodes_before": 3, "listeners": 6}]
    assert _check(_judge(run, ref, strikes, samples=spare), "no_leaks").ok
    spare[-1] = {**spare[-1], "listeners": 7}
    c = _check(_judge(run, ref, strikes, samples=spare), "no_leaks")
    assert not c.ok and "listeners 6 -> 7" in c.detail, c.detail
    # samples that carry the threads' kernel names (live.proc_counts) say which threads grew
    named = [{**start, "names": {"python": 10}}, {**row, "names": {"python": 12, "retire": 1}},
             {**row, "t_ns": 2, "episodes_before": 3, "threads": 32, "names": {"python": 12, "retire": 1, "reaper": 2}}]
    c = _check(_judge(run, ref, strikes, samples=named), "no_leaks")
    assert not c.ok and "threads 30 -> 32" in c.detail and "(threads that grew: reaper +2)" in c.detail, c.detail


def test_judge_reads_each_interval_at_its_floor(tmp_path: Path) -> None:
    """What an episode holds for a while (a group held by an op of the abandoned step until its
    collective timeout, K6) shows in the interval's first sample and is gone from a later one; what
    one sample catches in passing (soak, stop 40: a checkpoint file being written, +1 file fd) is gone
    from the next: the judge reads each interval at its floor (the injector samples each interval
    again every RESAMPLE_S).  A growth held through a whole later interval is a leak."""
    run, ref, strikes = _history(tmp_path)
    row = {"t_ns": 1, "attempt": 0, "identity": 2, "pid": 4242, "episodes_before": 1, "threads": 30, "fds": 90, "listeners": 6}
    start = {**row, "t_ns": 0, "episodes_before": 0, "threads": 20, "fds": 50, "listeners": 5}
    held = {**row, "t_ns": 2, "episodes_before": 2, "threads": 37, "fds": 95, "listeners": 8}
    freed = {**held, "t_ns": 3, "threads": 30, "fds": 90, "listeners": 6}
    assert _check(_judge(run, ref, strikes, samples=[start, row, held, freed]), "no_leaks").ok
    # churn: one sample of the interval shows more, the next does not
    assert _check(_judge(run, ref, strikes, samples=[start, row, freed, {**held, "t_ns": 4}, {**freed, "t_ns": 5}]),
                  "no_leaks").ok
    # a growth held through a later interval, whatever an earlier sample said
    c = _check(_judge(run, ref, strikes, samples=[start, row, freed, {**held, "t_ns": 4},
                                                   {**held, "t_ns": 5, "episodes_before": 3}]), "no_leaks")
    assert not c.ok and "listeners 6 -> 8" in c.detail, c.detail
    # the floor of each fd kind: a file fd in one sample, a socket in another, is no growth of either
    kinds = [start, {**row, "fd_kinds": {"file": 4, "socket:store": 86}},
             {**row, "t_ns": 5, "episodes_before": 2, "fds": 91, "fd_kinds": {"file": 5, "socket:store": 86}},
             {**row, "t_ns": 6, "episodes_before": 2, "fds": 91, "fd_kinds": {"file": 4, "socket:store": 87}}]
    assert _check(_judge(run, ref, strikes, samples=kinds), "no_leaks").ok
    kinds[-1] = {**kinds[-1], "fds": 92, "fd_kinds": {"file": 5, "socket:store": 87}}  # the file held throughout
    c = _check(_judge(run, ref, strikes, samples=kinds), "no_leaks")
    assert not c.ok and "fds 90 -> 91" in c.detail and "(fds that grew: file +1)" in c.detail, c.detail
    # the baseline is its interval's floor too: a transient in it does not hide a later growth
    c = _check(_judge(run, ref, strikes, samples=[start, {**row, "fds": 99}, {**row, "t_ns": 2},
                                                   {**row, "t_ns": 5, "episodes_before": 2, "fds": 91}]), "no_leaks")
    assert not c.ok and "fds 90 -> 91" in c.detail, c.detail
    # samples that carry fd kinds (live.fd_kinds) say what kind of fd grew
    c = _check(_judge(run, ref, strikes, samples=[start, {**row, "fd_kinds": {"socket": 40, "pipe": 2}},
                                                   {**row, "t_ns": 5, "episodes_before": 2, "fds": 91,
                                                    "fd_kinds": {"socket": 41, "pipe": 2}}]), "no_leaks")
    assert not c.ok and "(fds that grew: socket +1)" in c.detail, c.detail


def test_judge_reads_an_interval_before_its_first_fault(tmp_path: Path) -> None:
    """Soak, stop 40: a cut struck in steady training closed a gloo pair of two ranks, and the
    injector sampled them again before their episode began: the interval's last sample held one
    connection fewer, and the next interval's (the pair rebuilt) read as growth.  An interval is read
    from its samples before the first fault struck in it; a growth before that is still a leak."""
    run, ref, strikes = _history(tmp_path)
    row = {"t_ns": 10, "attempt": 0, "identity": 2, "pid": 4242, "episodes_before": 1, "threads": 30, "fds": 90,
           "listeners": 6}
    start = {**row, "t_ns": 0, "episodes_before": 0}
    cut = {"index": 7, "kind": "cut_group", "trigger": "time", "met": True, "t_ns": 25, "identity": 1}
    after_cut = {**row, "t_ns": 30, "fds": 89}
    rebuilt = {**row, "t_ns": 50, "episodes_before": 2}
    assert _check(_judge(run, ref, strikes + [cut], samples=[start, row, after_cut, rebuilt]), "no_leaks").ok
    # without the fault's time the sample after it is the interval's last: the growth it shows is read
    c = _check(_judge(run, ref, strikes, samples=[start, row, after_cut, rebuilt]), "no_leaks")
    assert not c.ok and "fds 89 -> 90" in c.detail, c.detail
    # a growth before the first fault is read: the sample after the fault does not hide it
    c = _check(_judge(run, ref, strikes + [cut], samples=[start, row, {**row, "t_ns": 20, "fds": 88}, after_cut,
                                                           {**rebuilt, "fds": 91}]), "no_leaks")
    assert not c.ok and "fds 88 -> 91" in c.detail, c.detail
    # a fault not met (it never struck) does not count
    missed = {**cut, "met": False}
    c = _check(_judge(run, ref, strikes + [missed], samples=[start, row, after_cut, rebuilt]), "no_leaks")
    assert not c.ok and "fds 89 -> 90" in c.detail, c.detail


def test_fd_kinds_tells_sockets_pipes_and_files_apart(tmp_path: Path) -> None:
    import os
    import socket

    from accelpact.testing.soak.live import fd_kinds

    before = fd_kinds(os.getpid())
    r, w = os.pipe()
    a, b = socket.socketpair()
    fh = open(tmp_path / "f", "w")
    try:
        after = fd_kinds(os.getpid())
    finally:
        os.close(r), os.close(w), a.close(), b.close(), fh.close()
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    assert grew == {"pipe": 2, "socket": 2, "file": 1}, grew


def test_fd_kinds_names_a_tcp_socket_by_what_it_is_connected_to() -> None:
    """A listener, a connection to a store's port, any other connection, and one whose peer closed
    (CLOSE_WAIT: this process still holds what the other side let go) are four kinds."""
    import os
    import socket

    from accelpact.testing.soak.live import fd_kinds

    def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
        return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)
                if after.get(k, 0) != before.get(k, 0)}

    store, other = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    opened = [store, other]
    try:
        port = store.getsockname()[1]
        before = fd_kinds(os.getpid(), [port])
        c1 = socket.create_connection(("127.0.0.1", port))
        s1, _ = store.accept()
        c2 = socket.create_connection(("127.0.0.1", other.getsockname()[1]))
        s2, _ = other.accept()
        opened += [c1, s1, c2, s2]
        after = fd_kinds(os.getpid(), [port])
        # c1 -> the store's port; s1, c2, s2: other connections (s1's remote port is c1's, not the store's)
        assert grew(before, after) == {"socket:store": 1, "socket:peer": 3}, grew(before, after)
        s2.close()
        deadline = time.monotonic() + 10
        while fd_kinds(os.getpid(), [port]).get("socket:CLOSE_WAIT", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        last = fd_kinds(os.getpid(), [port])
        assert grew(after, last) == {"socket:peer": -2, "socket:CLOSE_WAIT": 1}, grew(after, last)
        assert last.get("socket:listen", 0) >= 2
    finally:
        for x in opened:
            x.close()


def test_proc_counts_names_the_engines_threads() -> None:
    """The engine's threads carry kernel names (impl/threadname.py), which the soak's samples count."""
    import os
    import threading

    from accelpact.impl.threadname import EngineThread, kernel_name
    from accelpact.testing.soak.live import proc_counts

    assert kernel_name("accelpact-watchdog-revoke") == "watchdog-revoke"
    assert kernel_name("accelpact-detector-r12345678901") == "detector-r12345"  # 15 bytes at most
    stop = threading.Event()
    t = EngineThread(target=stop.wait, name="accelpact-soak-probe", daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while (proc_counts(os.getpid()) or {}).get("names", {}).get("soak-probe") != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        c = proc_counts(os.getpid())
        assert c is not None and c["names"].get("soak-probe") == 1, c
        assert c["threads"] == sum(c["names"].values())
    finally:
        stop.set()
        t.join(5)


def test_judge_fails_an_undocumented_exit_unless_it_is_a_known_bug(tmp_path: Path) -> None:
    """An attempt that ended in a restart with every rank exiting 1 and no record (known bug K1 when
    it happened at a checkpoint step): listed as known, or failed with --strict; at another step: failed."""
    run, ref, strikes = _history(tmp_path)
    for r in range(WORLD):  # attempt 0 ends, after its repair, with exit 1 at frontier 10; attempt 1 finishes
        res = json.loads(RunDir(run).result(0, r).read_text())
        RunDir(run).result(0, r).write_text(json.dumps({**res, "outcome": "exited", "exit_code": 1, "frontier": 10,
                                                         "t_exit": 1.0}))
        RunDir(run).result(1, r).write_text(json.dumps({"outcome": "finished", "exit_code": 0, "frontier": 12}))
    v = _judge(run, ref, strikes, checkpoint_every=5)
    assert _check(v, "exits").ok and v.known == ["K1 at a0/g1"], v.failures()
    assert not _check(_judge(run, ref, strikes, checkpoint_every=5, strict=True), "exits").ok
    assert not _check(_judge(run, ref, strikes, checkpoint_every=3), "exits").ok


def test_a_partial_boundary_flag_is_a_behaviour_of_the_model() -> None:
    """Soak K5 (30-minute soak seed 1, 2026-12-04, a7/g0), its traces kept in tests/data: rank 2 was
    SIGKILLed as the boundary of step 6833 ended.  The boundary's failure flag (an all-reduce over W)
    had completed on ranks 0 and 3, which went on into the next step and observed the death in
    forward; rank 1's copy failed and it observed at the boundary.  Every rank stood at 6833, the
    spare joined at 6833 and the swap released (L1).  The model's death at the boundary allows that
    partial flag (P16.0, ``_death_observable``); before, every survivor had to observe at one point
    and the checker rejected the episode ("point 'boundary' but the model has 'backward'")."""
    from accelpact.impl.trace import load_traces

    from accelpact.conformance.checker import check_told_nothing

    trs = load_traces(Path(__file__).parent / "data" / "soak-k5-partial-flag")[7]
    v = check_told_nothing(trs)
    assert v.accepted, v.message
    seen = {r: [(x.state.get("point"), x.state.get("frontier")) for x in t.records if x.gen == 0 and x.action == "RankObserve"]
            for r, t in trs.items()}
    assert seen == {0: [("forward", 6833)], 1: [("boundary", 6833)], 2: [], 3: [("forward", 6833)]}


# ------------------------------------------------------------------- restarts: cause and time lost
#
# Run folders written as the worker and the engine write them.  The record shapes are a real run's
# (`accelpact bench goodput --quick`'s L2 attempt, 2026-12-05): a header per rank; FaultGroupFail,
# RankObserve {cause: in_flight}, RankReject {why, guard} on the faulted rank; RankExit {abort} on
# the other; end records {outcome: exited, code, reason}; result files {outcome, exit_code, t_exit,
# frontier, t_start}; steps files {step, loss, t} (time.monotonic(), the traces' t_ns clock in s).

S = 1_000_000_000


def _header(a: int, r: int, world: int = WORLD) -> dict:
    return {"type": "header", "format": "accelpact-trace/1", "rank": r, "world": world, "nodes": 2,
            "ranks_per_node": world // 2, "group": "replicate", "own_group": [r % 2, r % 2 + 2][: world // 2],
            "affected": [0, 2][: world // 2], "attempt": a, "scenario": "soak-seed7", "seed": 0, "backend": "gloo",
            "frontier_at_start": 0, "wrapper": "fsdp1-hybrid", "generation_at_start": 0, "spares": 2}


def _act(r: int, seq: int, action: str, t_s: float, state: dict | None = None, detail: dict | None = None,
         gen: int = 0, outcome: str = "ok") -> dict:
    return {"type": "action", "seq": seq, "rank": r, "action": action, "gen": gen, "outcome": outcome,
            "t_ns": int(round(t_s * S)), "state": state or {}, "detail": detail or {}}


def _write_trace(run: RunDir, a: int, r: int, acts: list[tuple], end: dict | None = None, world: int = WORLD) -> None:
    """acts: (action, t_s, state, detail[, outcome]) in the rank's order."""
    lines = [_header(a, r, world)]
    for i, x in enumerate(acts):
        lines.append(_act(r, i, x[0], x[1], x[2], x[3], outcome=x[4] if len(x) > 4 else "ok"))
    if end is not None:
        lines.append({"type": "end", "rank": r, **end})
    run.path.mkdir(parents=True, exist_ok=True)
    run.trace(a, r).write_text("".join(json.dumps(x) + "\n" for x in lines))


def _write_steps(run: RunDir, a: int, times: dict[int, float], ranks: range, skew: float = 0.001) -> None:
    """Rank r commits each step ``skew * r`` seconds after rank 0 (ranks commit a step apart by
    microseconds to milliseconds in real runs)."""
    run.path.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        run.steps(a, r).write_text("".join(json.dumps({"step": st, "loss": 3.9, "t": t + skew * r}) + "\n"
                                           for st, t in sorted(times.items())))


def _write_result(run: RunDir, a: int, r: int, **fields) -> None:
    run.path.mkdir(parents=True, exist_ok=True)
    run.result(a, r).write_text(json.dumps({"attempt": a, "rank": r, "outcome": "running", "exit_code": None, **fields}))


def _parse(lines: list[dict]):
    from accelpact.impl.trace import parse_trace

    return parse_trace([json.dumps(x) for x in lines], "synthetic").records


#: the SIGSTOP-in-a-save restart (a 3-minute soak): the last commit of attempt 0 (step 99, rank 3),
#: the stop struck in the save of checkpoint 100 just after it, the survivors' exit 1 once the save's
#: group timed out, and attempt 1's first commit of step 100 (rank 0), after it replayed 50..99
T_LAST = 909.9 + 0.001 * 3
T_STOP = 909.95
T_EXIT = 1023.95
T_BACK = T_LAST + 131.0


def _sigstop_in_save(tmp_path: Path) -> tuple[Path, list[dict]]:
    run = RunDir(tmp_path / "run")
    _write_steps(run, 0, {st: 900.0 + 0.1 * st for st in range(100)}, range(WORLD))
    replay = {st: 1031.0 + 0.1 * (st - 50) for st in range(50, 100)}
    _write_steps(run, 1, {**replay, **{st: T_BACK + 0.1 * (st - 100) for st in range(100, 110)}}, range(WORLD))
    for r in range(WORLD):
        _write_trace(run, 0, r, [])           # no record: the save's error escaped the pact (K1)
        _write_trace(run, 1, r, [], {"outcome": "released", "t_ns": int((T_BACK + 2) * S), "gen": 0, "frontier": 110})
        if r == 2:  # the stopped rank, killed by torchrun
            _write_result(run, 0, r, frontier=100, t_start=899.0)
        else:
            _write_result(run, 0, r, outcome="exited", exit_code=1, frontier=100, t_start=899.0, t_exit=T_EXIT + 0.01 * r)
        _write_result(run, 1, r, outcome="finished", exit_code=0, frontier=110, t_start=1025.0, t_exit=T_BACK + 2,
                      start_step=50, replayed_steps=50)
    stop = {"index": 0, "kind": "stop", "trigger": "time", "met": True, "t_ns": int(T_STOP * S),
            "t_end_ns": int((T_STOP + 2.4) * S), "attempt": 0, "identity": 2, "during": "", "duration_s": 2.4,
            "detail": {}}
    return run.path, [stop]


def test_a_restart_after_a_stop_in_a_checkpoint_save_loses_what_the_steps_say(tmp_path: Path) -> None:
    """A 3-minute soak met a SIGSTOP during a checkpoint save: training stood still 131 s from the
    last commit to the first commit of the next attempt past it, yet the judge counted 17.3 s (from
    the first exit: the stop, 114 s before it, was past the 75 s attribution window) and its exit
    check said "slowest 0.0 s" (measured from that first exit).  The time lost is the steps files'
    own span; the exits are timed from the stop."""
    out, strikes = _sigstop_in_save(tmp_path)
    v = J.judge(out, seed=7, world=WORLD, spares=2, strikes=strikes, check_snapshots=False, checkpoint_every=50)
    (rst,) = v.restarts
    assert rst.lost_s == pytest.approx(T_BACK - T_LAST, abs=2e-3) and rst.lost_s == pytest.approx(131.0, abs=2e-3)
    assert rst.before_s == pytest.approx(T_EXIT + 0.03 - T_LAST, abs=2e-3)
    assert rst.after_s == pytest.approx(T_BACK - T_EXIT - 0.03, abs=2e-3)
    assert (rst.last_step, rst.resumed_at, rst.replayed_steps, rst.back_attempt) == (99, 50, 50, 1)
    assert rst.cause == "checkpoint_save" and rst.faults == [0] and rst.fault_from == "strike #0 stop", rst
    (ep,) = [e for e in v.episodes if e.outcome == "L2"]
    assert ep.lost_s == rst.lost_s and ep.faults == [0] and ep.cause == "checkpoint_save"
    from accelpact.testing.soak.report import summary_counts

    counts = summary_counts(v)
    assert counts["by_outcome"]["L2"]["lost_s"] == rst.lost_s
    assert counts["restarts"]["lost_s"] == rst.lost_s and counts["restarts"]["replayed_steps"] == 50
    assert counts["restarts"]["by_cause"] == {"checkpoint_save": {"restarts": 1, "lost_s": rst.lost_s, "replayed_steps": 50}}
    # the exits are timed from the stop: 114 s, K1's (a survivor waits out the save's group), listed as known
    exits = _check(v, "exits")
    assert exits.ok and "K1 at a0/g0" in v.known, exits.detail
    assert "known K1 exits (slowest 114.0s, a0/g0)" in exits.detail, exits.detail
    strict = _check(J.judge(out, seed=7, world=WORLD, spares=2, strikes=strikes, check_snapshots=False,
                            checkpoint_every=50, strict=True), "exits")
    assert not strict.ok and "a0/g0: rank 0 exited 114.0s after the fault" in strict.detail, strict.detail
    doc = v.to_json()
    assert doc["restarts"][0]["lost_s"] == rst.lost_s and doc["restart_totals"]["lost_s"] == rst.lost_s
    # the summary prints it: cause, the stop behind it, time lost and its parts, steps replayed, the totals
    from rich.console import Console

    from accelpact.testing.soak.report import print_restarts

    con = Console(record=True, width=250)
    print_restarts(con, v.restarts, v.strikes)
    text = con.export_text()
    assert "a0->a1" in text and "checkpoint_save" in text and "#0 stop" in text and "131.0s" in text, text
    assert "114.1s" in text and "16.9s" in text, text
    assert "1 restart(s): 131.0s of training lost (each moment once), 50 steps replayed; by cause: checkpoint_save 1" in text


def _ending(*acts: tuple) -> list:
    """Records of an ending episode across ranks: (rank, action, t_s, state, detail[, outcome])."""
    seqs: dict[int, int] = {}
    lines = []
    for x in acts:
        r = x[0]
        lines.append(_act(r, seqs.get(r, 0), x[1], x[2], x[3], x[4], outcome=x[5] if len(x) > 5 else "ok"))
        seqs[r] = seqs.get(r, 0) + 1
    out = []
    for r in sorted(seqs):
        out += _parse([_header(0, r)] + [x for x in lines if x["rank"] == r])
    return out


OBS_DEATH = ({"pc": "observed", "point": "boundary", "frontier": 700, "tau": 700}, {"cause": "death", "dead": [1], "error": None})
EXITED_70 = {"pc": "exited", "reason": "rejected"}


def _reject(why: str, t: float = 1000.2) -> list:
    return _ending((0, "RankObserve", 1000.0, *OBS_DEATH), (2, "RankObserve", 1000.01, *OBS_DEATH),
                   (0, "RankReject", t, EXITED_70, {"why": why, "guard": []}, "fail"),
                   (2, "RankExit", t + 0.01, EXITED_70, {"abort": "rejected"}, "fail"))


@pytest.mark.parametrize("recs, codes, kw, cause", [
    # the goodput bench's real L2 (an exception in backward): the guard fails on a step in flight
    (_ending((1, "FaultGroupFail", 1000.0, {}, {"point": "backward", "kind": "exception", "step": 3}, "info"),
             (1, "RankObserve", 1000.001, {"pc": "observed", "point": "backward", "frontier": 3, "tau": 3},
              {"cause": "in_flight", "in_flight": True, "error": "InjectedFault('injected exception')"}),
             (1, "RankReject", 1000.002, EXITED_70, {"why": "guard failed: not a clean committed boundary",
                                                     "guard": ["step is at 'backward', not at the committed boundary"]}, "fail"),
             (0, "RankExit", 1000.003, EXITED_70, {"abort": "rejected"}, "fail")), {0: 70, 1: 70}, {}, "in_flight"),
    (_reject("guard failed: not a clean committed boundary"), {0: 70, 1: None, 2: 70, 3: 70}, {}, "guard_failed"),
    (_reject("a rank died and no spare is left to take its identity"), {0: 70, 1: None, 2: 70, 3: 70}, {}, "no_spare"),
    (_reject("rank(s) [1] died and no spare is left to take their identity"), {0: 70, 1: None, 2: 70, 3: 70}, {}, "no_spare"),
    (_reject("a rank died and none of its replicas lives: its shard exists nowhere else"), {0: 70, 1: None, 2: 70, 3: 70}, {},
     "replicas_lost"),
    (_reject("key (cpu-gloo, hsdp, boundary, loss) is outside the envelope"), {0: 70, 1: 70, 2: 70, 3: 70}, {},
     "outside_envelope"),
    (_reject("a rank died while the survivors were in optimizer: the update may be half applied"),
     {0: 70, 1: None, 2: 70, 3: 70}, {}, "in_flight"),
    (_ending((0, "RankLoseStore", 1000.0, {"pc": "exited", "reason": "deadline"}, {"error": "RuntimeError: Connection reset"},
              "fail"), (1, "RankLoseStore", 1000.1, {"pc": "exited", "reason": "deadline"}, {"error": "x"}, "fail")),
     {0: 72, 1: 72}, {}, "store_lost"),
    (_ending((0, "RankArrive", 1000.0, {"pc": "arrived", "frontier": 700, "tau": 700}, {"count": 1, "last": False}),
             (3, "RankArrive", 1000.1, {"pc": "arrived", "frontier": 701, "tau": 701}, {"count": 2, "last": True}),
             (3, "RankDecideAgreement", 1000.2, {"pc": "exited", "reason": "mismatch"}, {"decision": "abort:mismatch"}, "fail"),
             (0, "RankExit", 1000.3, {"pc": "exited", "reason": "mismatch"}, {"abort": "mismatch"}, "fail")),
     {0: 71, 3: 71}, {}, "mismatch"),
    (_ending((0, "RankSuspect", 1000.0, {"pc": "exited", "reason": "deadline"},
              {"pc": "train", "decision": "abort:deadline", "suspect": 2, "kind": "dead", "detected_at_ns": 1}, "fail"),
             (1, "RankExit", 1000.1, {"pc": "exited", "reason": "deadline"}, {"abort": "deadline"}, "fail")),
     {0: 72, 1: 72, 2: 143, 3: 72}, {}, "suspected"),
    (_ending((0, "RankObserve", 1000.0, *OBS_DEATH),
             (0, "RankTimeout", 1021.0, {"pc": "exited", "reason": "deadline"}, {"decision": "abort:deadline"}, "fail")),
     {0: 72, 1: None, 2: 72, 3: 72}, {}, "deadline"),
    # the same, with a crash struck during the episode (the injector's `during`): a fault during a repair
    (_ending((0, "RankObserve", 1000.0, *OBS_DEATH),
             (0, "RankTimeout", 1021.0, {"pc": "exited", "reason": "deadline"}, {"decision": "abort:deadline"}, "fail")),
     {0: 72, 1: None, 2: None, 3: 72},
     {"faults": [{"index": 4, "kind": "crash", "met": True, "t_ns": int(1000.5 * S), "during": "attempt 0: episode open "
                  "(r0 RankArrive)"}]}, "fault_during_repair"),
    # a crash struck before the episode is not one during it
    (_ending((0, "RankObserve", 1000.0, *OBS_DEATH),
             (0, "RankTimeout", 1021.0, {"pc": "exited", "reason": "deadline"}, {"decision": "abort:deadline"}, "fail")),
     {0: 72, 1: None, 2: 72, 3: 72}, {"faults": [{"index": 3, "kind": "crash", "met": True, "t_ns": int(999.9 * S),
                                                  "during": ""}]}, "deadline"),
    (_ending((2, "RankFail", 1000.0, {"pc": "exited", "reason": "exception"}, {"error": "ValidationError: digest"}, "fail")),
     {0: 73, 1: 73, 2: 73, 3: 73}, {}, "exception"),
    ([], {0: 1, 1: 1, 2: None, 3: 1}, dict(frontiers=[100, 100, 100], checkpoint_every=50), "checkpoint_save"),
    ([], {0: 1, 1: 1, 2: None, 3: 1}, dict(frontiers=[100, 100, 100], checkpoint_every=30), "uncaught_error"),
    ([], {0: None, 1: 143, 2: 143, 3: 143}, {}, "killed"),
    ([], {0: 72, 1: 72}, {"faults": [{"index": 2, "kind": "store_loss", "met": True, "t_ns": 1, "during": "x"}]}, "store_lost"),
])
def test_a_restart_is_named_by_its_recorded_cause(recs: list, codes: dict, kw: dict, cause: str) -> None:
    from accelpact.impl.launch.restarts import CAUSES, classify

    got, detail = classify(recs, codes, **kw)
    assert got == cause and got in CAUSES, (got, detail)
    assert detail and "exit codes" in detail


@pytest.mark.parametrize("recs, codes, says", [
    (_reject("a reason the soak never met"), {0: 70, 2: 70}, "RankReject 'a reason the soak never met'"),
    ([], {0: 70, 1: 70}, "exit codes r0: 70, r1: 70; no record of the episode"),
    (_ending((0, "RankExit", 1000.0, EXITED_70, {"abort": "rejected"}, "fail")), {0: 70}, "no record of who decided it"),
])
def test_a_restart_of_no_known_cause_says_what_was_recorded(recs: list, codes: dict, says: str) -> None:
    from accelpact.impl.launch.restarts import CAUSES, Restart, classify
    from accelpact.impl.launch.restarts import summary as restarts_summary

    got, _ = classify(recs, codes)
    assert got.startswith("unknown: ") and says in got and got not in CAUSES, got
    assert restarts_summary([Restart(3, got)])["unknown"] == [f"a3: {got}"]
    # reported, never hidden: the summary names it
    from rich.console import Console

    from accelpact.testing.soak.report import print_restarts

    con = Console(record=True, width=400)
    print_restarts(con, [Restart(3, got)])
    assert f"restart of unknown cause: a3: {got}" in con.export_text()


def _chain(tmp_path: Path) -> RunDir:
    """Attempt 0 times out after step 9; attempt 1 resumes at 5 and fails at step 7 (its replay); attempt
    2 resumes at 5 again and passes step 9 at 126 s."""
    run = RunDir(tmp_path / "run")
    timeout = ("RankTimeout", None, {"pc": "exited", "reason": "deadline"}, {"decision": "abort:deadline"}, "fail")
    _write_steps(run, 0, {st: 100.0 + st for st in range(10)}, range(2))
    _write_steps(run, 1, {5: 115.0, 6: 116.0, 7: 117.0}, range(2))
    _write_steps(run, 2, {st: 116.0 + st for st in range(5, 12)}, range(2))
    for r in range(2):
        obs = ("RankObserve", 109.5, {"pc": "observed", "point": "boundary", "frontier": 10, "tau": 10}, {"cause": "flag"})
        _write_trace(run, 0, r, [obs, (timeout[0], 111.0 + r, *timeout[2:])], {"outcome": "exited", "code": 72}, world=2)
        fail = ("RankFail", 118.0, {"pc": "exited", "reason": "exception"}, {"error": "RuntimeError: x"}, "fail")
        _write_trace(run, 1, r, [(obs[0], 117.5, *obs[2:]), fail], {"outcome": "exited", "code": 73}, world=2)
        _write_trace(run, 2, r, [], {"outcome": "released"}, world=2)
        _write_result(run, 0, r, outcome="exited", exit_code=72, frontier=10, t_start=99.0, t_exit=111.0 + r)
        _write_result(run, 1, r, outcome="exited", exit_code=73, frontier=8, t_start=113.0, t_exit=118.0)
        _write_result(run, 2, r, outcome="finished", exit_code=0, frontier=12, t_start=119.0, t_exit=128.0)
    return run


def test_restarts_in_a_chain_each_count_their_span_and_the_total_counts_a_moment_once(tmp_path: Path) -> None:
    from accelpact.impl.launch.restarts import restarts, total_lost_s

    run = _chain(tmp_path)
    a0, a1 = restarts(run.path, 2)
    # a0: the last commit before its first record (109.5 s) is step 9 at 109.001 (rank 1); step 10 comes at 126.0
    assert (a0.cause, a0.last_step, a0.fault_from) == ("deadline", 9, "first record RankObserve (rank 0)")
    assert a0.lost_s == pytest.approx(126.0 - 109.001, abs=1e-6) and a0.replayed_steps == 3 and a0.resumed_at == 5
    assert a0.before_s == pytest.approx(112.0 - 109.001, abs=1e-6) and a0.after_s == pytest.approx(126.0 - 112.0, abs=1e-6)
    # a1 failed in its replay: its last commit is its own step 7 (117.001), its last step still 9
    assert (a1.cause, a1.last_step, a1.replayed_steps, a1.back_attempt) == ("exception", 9, 5, 2)
    assert a1.lost_s == pytest.approx(126.0 - 117.001, abs=1e-6)
    assert a0.overlaps == [1] and a1.overlaps == [0]
    assert total_lost_s([a0, a1]) == pytest.approx(126.0 - 109.001, abs=1e-3)  # a1's span lies inside a0's


def test_a_restart_that_never_came_back_and_a_fault_training_outlived(tmp_path: Path) -> None:
    from accelpact.impl.launch.restarts import restarts

    run = _chain(tmp_path)
    for r in range(2):  # the job ended in attempt 1: nothing passed step 9
        run.steps(2, r).unlink()
        run.result(2, r).unlink()
        run.trace(2, r).unlink()
    (a0,) = restarts(run.path, 2)
    assert a0.lost_s is None and a0.t_back is None and "no later attempt committed a step past 9" in a0.note
    # a fault struck at 105.5 s that training outlived (steps 6..9 committed after it, until its episode
    # began at 109.5 s): those steps were progress; the stall runs from the last of them, and it is said
    run = _chain(tmp_path / "latent")
    a0, _ = restarts(run.path, 2, faults={0: [{"index": 1, "kind": "cut_group", "met": True, "t_ns": int(105.5 * S)}]})
    assert (a0.t_fault, a0.fault_from, a0.faults, a0.committed_after_fault) == (105.5, "strike #1 cut_group", [1], 4)
    assert a0.last_step == 9 and a0.lost_s == pytest.approx(126.0 - 109.001, abs=1e-6)
    assert "training outlived the fault by 4 step(s)" in a0.note


# ------------------------------------------------------------------------------------- real soaks

#: a short soak's configuration: 2x2 FSDP1, one spare, fixed steps (the fault-free reference is cached)
SHORT = ["--minutes", "1.5", "--nodes", "2", "--ranks-per-node", "2", "--spares", "1", "--steps", "900",
         "--fault-every", "15", "--quiet"]


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.nightly("a soak of minutes (about 190 s); its judge's rules run every time in this file's unit tests")
def test_short_soak_is_green(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = cli.main(["soak", "--seed", "3", *SHORT, "--out", str(tmp_path / "soak")])
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "soak" / "soak.json").read_text())
    verdict = summary["verdict"]
    assert rc == 0 and verdict["green"], "\n".join(verdict["failures"]) + "\n" + out[-6000:]
    assert summary["counts"]["faults_met"] >= 2
    assert verdict["episodes"], "the soak met no episode"
    assert (tmp_path / "soak" / "timeline.png").exists()
    assert Schedule is not None and load(tmp_path / "soak" / "schedule.json").config.steps == 900


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.nightly('a soak of minutes (about 300 s); the seeded bugs are caught every time by conformance/test_conformance.py')
def test_a_seeded_engine_bug_fails_a_short_soak_naming_the_seed_and_the_episode(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    """claim-per-survivor: in a hot swap every survivor records a claim of the dead identity's spare.
    The soak crashes a rank while a spare is idle; the judge's trace check must reject that episode."""
    rc = cli.main(["soak", "--seed", "4", *SHORT, "--kinds", "crash", "--seeded-bug", "claim-per-survivor",
                   "--out", str(tmp_path / "soak")])
    out = capsys.readouterr().out
    verdict = json.loads((tmp_path / "soak" / "soak.json").read_text())["verdict"]
    swaps = [e["name"] for e in verdict["episodes"] if e["outcome"] in ("swap", "discard")]
    assert rc == 1 and not verdict["green"], out[-4000:]
    traces = next(c for c in verdict["checks"] if c["name"] == "traces")
    assert not traces["ok"] and set(traces["episodes"]) & set(swaps), (traces, swaps)
    assert any(line.startswith("seed 4: traces FAILED (episode a") for line in verdict["failures"])
    assert "seed 4" in out and "JUDGE RED" in out


# ------------------------------------------------------------------------------ partition scenarios


def test_partition_is_a_scenario_kind_seen_by_the_model_as_a_crash() -> None:
    from accelpact.conformance.mapping import PARTITION_ACTION, script_for
    from accelpact.conformance.scenario import load_scenario
    from accelpact.conformance.generate import SCENARIO_DIR

    assert PARTITION_ACTION == "FaultCrash"
    for name in ("2x2-fsdp1-boundary-partition-r3", "2x2-fsdp1-spare1-boundary-partition-r1"):
        sc = load_scenario(SCENARIO_DIR / f"{name}.json")
        crashes = [f for f in script_for(sc).faults if f.action == "FaultCrash"]
        assert [f.rank for f in crashes] == [next(f for f in sc.faults if f.kind == "partition").ranks[0]]


@pytest.mark.parametrize("ranks, at, error", [
    ([0, 1, 2, 3], "boundary", "must leave some rank on the network"),
    ([], "boundary", "must leave some rank on the network"),
    ([3], "replace", "cannot be injected at 'replace'"),
])
def test_a_bad_partition_scenario_names_the_fault(ranks: list[int], at: str, error: str) -> None:
    from accelpact.conformance.scenario import ScenarioError, scenario_from_mapping
    from accelpact.impl.launch.job import Workload

    raw = {"name": "p", "topology": {"nodes": 2, "ranks_per_node": 2},
           "workload": Workload("fsdp1-hybrid", 2, 8, 0, 3).to_json(),
           "faults": [{"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [1, 3]},
                      {"step": 5, "at": at, "kind": "partition", "ranks": ranks}]}
    with pytest.raises(ScenarioError, match=r"faults\[1\]") as exc:
        scenario_from_mapping(raw)
    assert error in str(exc.value)


def test_a_job_without_progress_is_declared_stalled() -> None:
    """A hang (here: nothing moves at all) ends the soak red instead of waiting out the launch bound."""
    from accelpact.testing.soak import injector as I

    class FakeTail:
        files: dict = {}

    class FakeLive:
        attempt = 2
        tail = FakeTail()

        def results(self) -> dict:
            return {0: {"outcome": "exited", "exit_code": 1, "pid": None}}

        def frontier(self) -> int:
            return 650

        def finished(self) -> bool:
            return False

        def unsteady(self) -> str:
            return "attempt 2: rank 0 is exited"

        def idle_spares(self) -> dict:
            return {0: 4242}

    inj = I.Injector(draw(SoakConfig(minutes=1)), FakeLive(), None, stall_s=60)  # type: ignore[arg-type]  # a stand-in for Live
    inj._check_progress(0.0)
    inj._check_progress(59.0)
    assert inj.stalled is None
    with pytest.raises(I._Stalled):
        inj._check_progress(61.0)
    assert inj.stalled is not None and "idle spares still waiting: {0: 4242}" in inj.stalled
