"""The benchmark suite (bench/): every quick benchmark runs end to end and writes the JSON it
promises; the summary quotes figures from results files and never invents one.

Nothing here asserts a time: speed is measured by ``accelpact bench``, never tested.  The checks are
on keys and types (a median is a non-negative finite number, a missing figure is null with a reason).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.cli import main as cli_main
from accelpact.impl.rundir import RunDir
from accelpact.impl.runtime.wrappers import WRAPPER_NAMES

FIGURES = ("repair_total_ms_median_2x2", "repair_total_ms_max_100", "rebind_us_median_L32", "phase5_ms_median_L32",
           "guard_overhead_pct", "l2_over_l1_fault_to_frontier", "torchft_over_accelpact_fault_to_frontier",
           "control_plane_ms_W1024", "step_control_ms_W1024")
QUICK = ("explore", "check", "rebind", "validate", "transfer", "controlplane", "leaks", "repair", "guard", "goodput")


def _number(x, where: str) -> float:
    assert isinstance(x, (int, float)) and not isinstance(x, bool), f"{where}: {x!r} is not a number"
    assert math.isfinite(x), f"{where}: {x!r} is not finite"
    return float(x)


def _stats(s, where: str) -> None:
    """A statistics block of bench/common.py: n, median, p90, p99, max, ordered."""
    assert {"n", "median", "p90", "p99", "max"} <= set(s), f"{where}: {sorted(s)}"
    assert isinstance(s["n"], int) and s["n"] >= 1, f"{where}: n={s['n']!r}"
    med, p90, p99, top = (_number(s[k], f"{where}.{k}") for k in ("median", "p90", "p99", "max"))
    assert 0 <= med <= top and p90 <= p99 <= top, f"{where}: {s}"


def _doc(folder: Path, name: str) -> dict:
    doc = json.loads((folder / f"{name}.json").read_text())
    assert doc["benchmark"] == name
    assert doc["quick"] is True
    assert isinstance(doc["meta"]["created"], str) and isinstance(doc["meta"]["cpus"], int)
    assert isinstance(doc["config"], dict) and isinstance(doc["headline"], dict) and isinstance(doc["headline_reasons"], dict)
    for key, value in doc["headline"].items():  # a figure is a number, a list of numbers, a name, or null with a reason
        if value is None:
            assert isinstance(doc["headline_reasons"].get(key), str) and doc["headline_reasons"][key], (name, key)
        elif isinstance(value, list):
            [_number(v, f"{name}.headline.{key}") for v in value]
        elif not isinstance(value, str):
            _number(value, f"{name}.headline.{key}")
    return doc


@pytest.mark.multiproc
@pytest.mark.timeout(420)
@pytest.mark.nightly('every benchmark, quick (about 110 s): benchmarks are measured, not tested; flags are checked every time')
def test_bench_all_quick_writes_every_result_and_the_summary_reads_them(tmp_path: Path) -> None:
    """``accelpact bench all --quick`` (what CI runs) exits 0 and writes one JSON per benchmark
    with the expected keys and sane types; ``summary --json`` prints the nine headline figures as
    its last line, each a number with its source or null with its reason."""
    res = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "bench", "all", "--quick", "--results", str(res)],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    index = json.loads((res / "all.json").read_text())
    ran = {r["benchmark"]: r for r in index["runs"]}
    assert set(QUICK) <= set(ran) and all(ran[n]["rc"] == 0 for n in QUICK), index
    assert ran["recovery"]["rc"] is None and "goodput" in ran["recovery"]["note"]

    explore = json.loads((res / "explore.json").read_text())
    assert explore["benchmark"] == "explore" and explore["results"][0]["reduced"]["states"] > 0
    check = json.loads((res / "check.json").read_text())
    assert check["benchmark"] == "check" and check["results"]

    rebind = _doc(res, "rebind")
    assert {r["wrapper"] for r in rebind["results"]} == set(WRAPPER_NAMES)  # the default: every wrapper of the table
    for r in rebind["results"]:
        assert r["verified"] is True and isinstance(r["sites"], int) and r["sites"] >= 1
        for k in ("discover_ms", "rebind_us", "verify_ms", "phase5_bare_ms", "phase5_ms", "verify_attached_ms"):
            _stats(r[k], f"rebind.{r['wrapper']}.{k}")
    assert rebind["headline"]["rebind_us_median_L32"] is None  # the quick run has no L=32

    transfer = _doc(res, "transfer")
    for r in transfer["results"]:
        assert r["ok"] is True, r  # the spare's state equals the replica's after every transfer
        _stats(r["ms"], f"transfer.{r['size_mb']}")
    validate = _doc(res, "validate")
    for r in validate["results"]:
        assert r["ok"] is True and r["state_bytes"] > 0
        for k in ("allreduce", "digest", "allgather", "total", "digest_nocopy"):
            _stats(r["ms"][k], f"validate.{r['size_mb']}.{k}")

    cp = _doc(res, "controlplane")
    kinds = {r["kind"] for r in cp["results"]["rows"]}
    assert kinds == {"threads", "processes"}
    for r in cp["results"]["rows"]:
        _stats(r["total_ms"], f"controlplane.W{r['world']}.total_ms")
        # every rank arrives and votes: at least 2 adds and 1 set per rank, one multi_get per recovery
        ops = r["ops_by_kind_per_recovery"]
        assert ops["add"] >= 2 * r["world"] and ops["set"] >= r["world"] and ops["multi_get"] == 1, ops
        if r["kind"] == "processes":
            _stats(r["flag_ms"], f"controlplane.W{r['world']}.flag_ms")
            _stats(r["doubling_ms"], f"controlplane.W{r['world']}.doubling_ms")
    # the latency at W=1024 is modelled from the W=2 samples as log2(1024) = 10 exchanges of the
    # engine's doubling flag plus the progress set; the measured per-rank figure needs the W=1024
    # flag simulation, which the quick run does not make: null, with the reason
    w2 = next(r for r in cp["results"]["rows"] if r["kind"] == "processes" and r["world"] == 2)
    want = 10 * w2["doubling_ms"]["median"] + w2["progress_set_ms"]["median"]
    assert cp["headline"]["step_control_latency_ms_W1024_modelled"] == pytest.approx(want)
    assert cp["headline"]["step_control_ms_W1024"] is None
    assert "1024" in cp["headline_reasons"]["step_control_ms_W1024"]
    flags = cp["results"]["flag_sim"]
    assert [f["world"] for f in flags] == [4, 16] and all(f["algorithm"] == "ring" for f in flags)
    for f in flags:
        _stats(f["cpu_ms_per_rank"], f"controlplane.flag{f['world']}.cpu")
        assert f["cpu_ms_per_rank"]["n"] == f["iters"] * f["world"]
    _number(cp["headline"]["store_ops_per_s_max"], "store_ops_per_s_max")

    leaks = _doc(res, "leaks")
    for rk in leaks["results"]["ddp"]["ranks"]:
        assert rk["generation"] == 10 and len(rk["rows"]) == 11
        assert all(isinstance(rk["growth_first_to_last"][k], (int, float)) for k in ("threads", "fds", "groups", "rss_mb"))

    repair = _doc(res, "repair")
    (row,) = repair["results"]
    assert row["world"] == "2x2" and row["ok"] is True and row["repairs"] == row["repairs_asked"]
    for ph in ("observe", "agree", "rebuild", "rebind", "validate", "release", "retire", "total"):
        _stats(row["phases_ms"][ph], f"repair.{ph}")
    _number(repair["headline"]["repair_total_ms_median_2x2"], "repair_total_ms_median_2x2")
    assert repair["headline"]["repair_total_ms_max_100"] is None  # 3 repairs, not 100

    guard = _doc(res, "guard")
    _stats(guard["results"]["on_ms"], "guard.on")
    _stats(guard["results"]["off_ms"], "guard.off")
    lo, hi = guard["results"]["overhead_ci95_pct"]
    assert lo <= hi
    assert guard["results"]["repairs"] == [0, 0]  # fault-free

    goodput = _doc(res, "goodput")
    acc = goodput["results"]["accelpact"]
    assert acc["complete"] is True
    f2f = acc["l1"]["fault_to_frontier_s"]  # recovery.summarize: n, median, p90, max
    assert f2f["n"] == 1 and 0 < _number(f2f["median"], "goodput.l1.median") <= _number(f2f["max"], "goodput.l1.max")
    assert acc["l1"]["replayed_steps"] == [0] and acc["l2"]["replayed_steps"] == [1]
    _number(goodput["headline"]["l2_over_l1_fault_to_frontier"], "l2_over_l1")
    assert goodput["headline"]["torchft_over_accelpact_fault_to_frontier"] is None  # off in the quick run
    # the quick plan: one fault at checkpoint age 1; L2 replays exactly that age, L1 nothing
    assert goodput["results"]["plan"]["ages"] == [1] and list(goodput["results"]["by_age"]) == ["1"]
    assert [e["replayed_steps"] for e in acc["l2"]["episodes"]] == [1]
    _stats(acc["l1"]["fault_to_detect_s"], "goodput.l1.detect")
    _stats(acc["l2"]["exit_to_ready_s"], "goodput.l2.exit_to_ready")

    out = subprocess.run([sys.executable, "-m", "accelpact.cli", "bench", "summary", "--json", "--results", str(res)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    figs = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(figs) == set(FIGURES)
    for name, f in figs.items():
        if f["value"] is None:
            assert f["source"] is None and isinstance(f["reason"], str) and f["reason"], (name, f)
        else:
            _number(f["value"], name)
            # the file, shown relative to the working directory (tmp_path), then how it was run
            assert f["source"].startswith("results/") and "quick run" in f["source"], (name, f)
    assert figs["repair_total_ms_median_2x2"]["value"] is not None
    # measured only with the W=1024 flag simulation (a full run): the quick run says why it has none
    assert figs["step_control_ms_W1024"]["value"] is None and "flag simulation" in figs["step_control_ms_W1024"]["reason"]


# ---- single-process: the summary and the flags ---------------------------------------------------------

def _write(folder: Path, name: str, headline: dict, reasons: dict | None = None, quick: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"benchmark": name, "quick": quick, "meta": {"created": "then"},
                                                     "config": {}, "results": [], "headline": headline,
                                                     "headline_reasons": reasons or {}}))


def test_summary_without_results_is_all_null_with_reasons(tmp_path: Path, capsys) -> None:
    assert cli_main(["bench", "summary", "--json", "--results", str(tmp_path / "none")]) == 0
    figs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figs) == set(FIGURES)
    assert all(f["value"] is None and "not measured yet" in f["reason"] for f in figs.values())


def test_summary_prefers_the_first_folder_and_passes_reasons_on(tmp_path: Path, capsys) -> None:
    full, quick = tmp_path / "full", tmp_path / "quick"
    _write(full, "repair", {"repair_total_ms_median_2x2": 50.0, "repair_total_ms_max_100": None},
           {"repair_total_ms_max_100": "only 20 repairs"})
    _write(quick, "repair", {"repair_total_ms_median_2x2": 70.0, "repair_total_ms_max_100": 90.0}, quick=True)
    _write(quick, "goodput", {"l2_over_l1_fault_to_frontier": None}, {"l2_over_l1_fault_to_frontier": "incomplete"}, quick=True)
    _write(quick, "recovery", {"l2_over_l1_fault_to_frontier": 88.0}, quick=True)
    assert cli_main(["bench", "summary", "--json", "--results", str(full), "--results", str(quick)]) == 0
    figs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figs["repair_total_ms_median_2x2"]["value"] == 50.0 and "full run" in figs["repair_total_ms_median_2x2"]["source"]
    # the full run had no 100-repair figure; the quick folder's is taken, and says so
    assert figs["repair_total_ms_max_100"]["value"] == 90.0 and "quick run" in figs["repair_total_ms_max_100"]["source"]
    # goodput had none: recovery's is the fallback
    assert figs["l2_over_l1_fault_to_frontier"]["value"] == 88.0 and "recovery.json" in figs["l2_over_l1_fault_to_frontier"]["source"]
    assert figs["guard_overhead_pct"]["value"] is None and "guard.json" in figs["guard_overhead_pct"]["reason"]


@pytest.mark.parametrize("argv", [
    ["bench", "all", "--only", "nope"],
    ["bench", "rebind", "--layers", "two"],
    ["bench", "rebind", "--wrappers", "fsdp3"],
    ["bench", "validate", "--sizes-mb", "0"],
    ["bench", "controlplane", "--sim-worlds", "1"],
    ["bench", "repair", "--worlds", "1x4"],
    ["bench", "repair", "--worlds", "2x2,4x2", "--repairs", "1,2,3"],
    ["bench", "leaks", "--wrappers", "fsdp3"],
    ["bench", "guard", "--blocks", "1"],
    ["bench", "goodput", "--repeat", "0"],
    ["bench", "goodput", "--ages", "0,5"],
    ["bench", "goodput", "--ages", "5,5"],
    ["bench", "goodput", "--ages", "one"],
    ["bench", "goodput", "--step-s", "-1"],
    ["bench", "transfer", "--sizes-mb", "0"],
])
def test_bad_flags_exit_2_before_running_anything(argv: list[str], capsys) -> None:
    assert cli_main(argv) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("ages, repeat", [([1], 1), ([1, 5, 10, 20], 2), ([20, 3, 7], 3), ([2], 4)])
def test_goodput_fault_plan_puts_each_age_behind_a_checkpoint(ages: list[int], repeat: int) -> None:
    """Every fault strikes A steps after the last checkpoint (a multiple of k) and after the
    previous fault, so each L2 restart replays exactly A steps; the job runs past the last."""
    from accelpact.bench.goodput import fault_plan

    k, plan, steps = fault_plan(ages, repeat)
    assert len(plan) == len(ages) * repeat
    assert sorted(a for _, a in plan) == sorted(ages * repeat)
    for s, a in plan:
        assert s - (s // k) * k == a, (s, a, k)  # the checkpoint before s is s - a
        assert s // k >= 1  # a checkpoint exists before every fault
    steps_only = [s for s, _ in plan]
    assert steps_only == sorted(set(steps_only))
    assert steps > steps_only[-1]


def test_bench_modules_do_not_import_torch() -> None:
    mods = ", ".join(f"accelpact.bench.{m}" for m in ("cli", "common", "all", "summary", "validate", "transfer", "controlplane",
                                                       "repair", "goodput"))
    code = f"import sys, {mods}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_statistics_helpers() -> None:
    from accelpact.bench import common

    s = common.stats([3.0, 1.0, 2.0, None])
    assert s["n"] == 3 and s["median"] == 2.0 and s["max"] == 3.0 and s["p90"] == 3.0
    assert common.stats([])["median"] is None
    lo, hi = common.bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert 1.0 <= lo <= 3.0 <= hi <= 5.0


def _goodput_l2_run(path: Path) -> None:
    """The L2 run folder of a real `accelpact bench goodput --quick` (2026-12-05), its files as the
    worker and the engine wrote them (timestamps as recorded): an exception in backward of step 3
    on rank 1, every rank exits 70, torchrun restarts, attempt 1 resumes from checkpoint 2, replays
    step 2, and commits step 3 first on rank 1 at 28653.320223569."""
    from accelpact.impl.rundir import RunDir

    run = RunDir(path)
    path.mkdir(parents=True)
    steps = {(0, 0): [(0, 28648.333410064), (1, 28648.531816222), (2, 28648.607165799)],
             (0, 1): [(0, 28648.334820909), (1, 28648.52982707), (2, 28648.607185993)],
             (1, 0): [(2, 28653.210819029), (3, 28653.324325735), (4, 28653.363298658)],
             (1, 1): [(2, 28653.210823618), (3, 28653.320223569), (4, 28653.363308765)]}
    for (a, r), rows in steps.items():
        run.steps(a, r).write_text("".join(json.dumps({"step": s, "loss": 3.9, "t": t}) + "\n" for s, t in rows))
    head = {"type": "header", "format": "accelpact-trace/1", "world": 2, "nodes": 1, "ranks_per_node": 2, "group": "world",
            "own_group": [0, 1], "scenario": "bench-goodput-l2", "seed": 0, "backend": "gloo", "frontier_at_start": 0,
            "wrapper": "ddp", "generation_at_start": 0, "spares": 0, "platform": "cpu-gloo"}
    exited = {"pc": "exited", "reason": "rejected"}
    traces = {
        (0, 0): [{"type": "note", "rank": 0, "note": "revoke", "t_ns": 28648633469812, "gen": 0, "group": "world"},
                 {"type": "action", "seq": 0, "rank": 0, "action": "RankExit", "gen": 0, "outcome": "fail",
                  "t_ns": 28648633869762, "state": exited, "detail": {"abort": "rejected"}},
                 {"type": "end", "rank": 0, "outcome": "exited", "t_ns": 28648633907341, "code": 70, "reason": "rejected"}],
        (0, 1): [{"type": "action", "seq": 0, "rank": 1, "action": "FaultGroupFail", "gen": 0, "outcome": "info",
                  "t_ns": 28648631093744, "state": {}, "detail": {"point": "backward", "kind": "exception", "step": 3}},
                 {"type": "action", "seq": 1, "rank": 1, "action": "RankObserve", "gen": 0, "outcome": "ok",
                  "t_ns": 28648632184985, "state": {"pc": "observed", "point": "backward", "frontier": 3, "tau": 3},
                  "detail": {"cause": "in_flight", "in_flight": True,
                             "error": "InjectedFault('injected exception at backward of step 3 on rank 1')"}},
                 {"type": "action", "seq": 2, "rank": 1, "action": "RankReject", "gen": 0, "outcome": "fail",
                  "t_ns": 28648633176927, "state": exited,
                  "detail": {"why": "guard failed: not a clean committed boundary",
                             "guard": ["step is at 'backward', not at the committed boundary"]}},
                 {"type": "end", "rank": 1, "outcome": "exited", "t_ns": 28648633751816, "code": 70, "reason": "rejected"}],
        (1, 0): [{"type": "end", "rank": 0, "outcome": "released", "t_ns": 28653372340476, "gen": 0, "frontier": 5}],
        (1, 1): [{"type": "end", "rank": 1, "outcome": "released", "t_ns": 28653372340476, "gen": 0, "frontier": 5}],
    }
    for (a, r), recs in traces.items():
        run.trace(a, r).write_text("".join(json.dumps(x) + "\n" for x in [{**head, "rank": r, "attempt": a}, *recs]))
    for r, t_exit in ((0, 28648.633974878), (1, 28648.633854925)):
        run.result(0, r).write_text(json.dumps({"attempt": 0, "rank": r, "outcome": "exited", "exit_code": 70, "t_exit": t_exit,
                                                "frontier": 3, "start_step": 0, "replayed_steps": 0, "t_start": 28646.7}))
        run.result(1, r).write_text(json.dumps({"attempt": 1, "rank": r, "outcome": "finished", "exit_code": 0, "frontier": 5,
                                                "start_step": 2, "resumed_from": 2, "replayed_steps": 1, "t_start": 28650.6,
                                                "t_exit": 28653.377}))


def test_goodput_reports_each_restart_in_the_soaks_terms(tmp_path: Path) -> None:
    """`accelpact bench goodput`'s L2 restarts as the soak reports one: the cause read off the records
    (an exception in backward: the guard fails on a step in flight), the time lost from the last
    commit before the fault (step 2, rank 1) to the first commit past it (step 3, rank 1), split at
    the last exit, and the steps replayed, which agree with the workers' own count."""
    from accelpact.bench.goodput import restart_report

    _goodput_l2_run(tmp_path / "l2")
    rep = restart_report(tmp_path / "l2", 2, [1])
    (r,) = rep["restarts"]
    assert (r["age"], r["cause"], r["last_step"], r["replayed_steps"], r["resumed_at"]) == (1, "in_flight", 2, 1, 2)
    assert r["fault_from"] == "record FaultGroupFail (rank 1)" and r["exit_codes"] == {"0": 70, "1": 70}
    assert r["lost_s"] == pytest.approx(28653.320223569 - 28648.607185993, abs=1e-3)
    assert r["before_s"] == pytest.approx(28648.633974878 - 28648.607185993, abs=1e-3)
    assert r["after_s"] == pytest.approx(28653.320223569 - 28648.633974878, abs=1e-3)
    assert rep["restarts_replayed_agree"] is True
    assert rep["restart_totals"]["by_cause"] == {"in_flight": {"restarts": 1, "lost_s": r["lost_s"], "replayed_steps": 1}}
    _stats(rep["lost_s"], "goodput.restart.lost_s")
    # a worker's count that disagrees with the steps files is said
    p = RunDir(tmp_path / "l2").result(1, 0)
    p.write_text(json.dumps({**json.loads(p.read_text()), "replayed_steps": 2}))
    assert restart_report(tmp_path / "l2", 2, [1])["restarts_replayed_agree"] is False
