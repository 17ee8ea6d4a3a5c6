"""Issue 44, item 2: ``accelpact launch``, the stable launcher (impl/launch/cli_launch.py), and the keeper's old
module paths, which still work for one release and print a deprecation line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.impl.launch.cli_launch import ENTRY_MODULE, LaunchUsage, plan


def test_torchrun_options_pass_through_and_each_rank_runs_the_keeper() -> None:
    p = plan(["--standalone", "--nproc-per-node", "5", "--max-restarts=1", "--spares", "1", "--",
              "examples/fsdp2_hsdp.py", "--replicas", "2"], python="PY")
    assert p.cmd == ["PY", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "5", "--max-restarts=1",
                     "-m", ENTRY_MODULE, "--", "PY", "examples/fsdp2_hsdp.py", "--replicas", "2"]
    assert p.env == {"ACCELPACT_SPARES_PER_NODE": "1"}  # --spares counts per node (issue 43)
    assert "the last 1 process(es) of each node are spares" in p.summary()


@pytest.mark.parametrize("rest, worker", [
    (["train.py", "-x"], ["PY", "train.py", "-x"]),
    (["-m", "pkg.train", "-x"], ["PY", "-m", "pkg.train", "-x"]),
    (["python3", "train.py"], ["python3", "train.py"]),
])
def test_what_each_rank_runs(rest, worker) -> None:
    p = plan(["--nproc-per-node", "2", "--", *rest], python="PY")
    assert p.worker == worker and p.cmd[-len(worker):] == worker
    assert p.env == {}  # no spares, no keep: the keeper execs the command


def test_keep_and_spares_set_the_keepers_environment() -> None:
    p = plan(["--nnodes", "2", "--nproc-per-node", "3", "--spares=2", "--keep", "--", "t.py"], python="PY")
    assert p.env == {"ACCELPACT_SPARES_PER_NODE": "2", "ACCELPACT_KEEP": "1"}
    assert "--spares=2" not in p.cmd and "--keep" not in p.cmd


@pytest.mark.parametrize("argv, says", [
    (["--standalone", "t.py"], "put '--' between"),
    (["--standalone", "--"], "no command after '--'"),
    (["--spares", "x", "--", "t.py"], "--spares must be an integer >= 0, got 'x'"),
    (["--spares", "-1", "--", "t.py"], "--spares must be an integer >= 0, got -1"),
    (["--nproc-per-node", "2", "--spares", "2", "--", "t.py"], "leaves no training rank"),
    (["--nproc-per-node", "4", "-m", "--", "t.py"], "torchrun's -m is the launcher's own"),
    (["--", "-m"], "names no module"),
])
def test_a_bad_command_line_is_named(argv, says) -> None:
    with pytest.raises(LaunchUsage, match=None) as exc:
        plan(argv)
    assert says in str(exc.value), str(exc.value)


def test_the_command_line_exits_2_naming_the_problem() -> None:
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "launch", "--standalone", "--spares", "x", "--", "t.py"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--spares must be an integer" in proc.stderr, proc.stderr


@pytest.mark.parametrize("module", ["accelpact.impl.launch.keeper", "accelpact.impl.keeper"])
def test_the_old_keeper_paths_still_run_and_print_their_deprecation(module: str) -> None:
    """What last week's README (``-m accelpact.impl.keeper``) and this one's (``-m accelpact.impl.launch.keeper``)
    told users: the command still runs, its exit code comes through, one line names ``accelpact launch``."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ACCELPACT_")}
    proc = subprocess.run([sys.executable, "-m", module, "--", sys.executable, "-c", "print('ran'); raise SystemExit(5)"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 5 and proc.stdout.strip() == "ran", (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if "deprecated" in ln]
    assert len(lines) == 1 and f"-m {module}" in lines[0] and "accelpact launch" in lines[0], proc.stderr


def test_the_launchers_own_keeper_entry_prints_no_deprecation() -> None:
    proc = subprocess.run([sys.executable, "-m", ENTRY_MODULE, "--", sys.executable, "-c", "raise SystemExit(3)"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "deprecated" not in proc.stderr, proc.stderr


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.nightly("the hot-swap example through `accelpact launch --spares 1` (about 20 s, and a reference run): "
                     "`accelpact launch` runs every time in test_examples' test_an_idle_spares_death_costs_nothing")
def test_accelpact_launch_runs_the_hot_swap_example(tmp_path: Path) -> None:
    """The README's hot-swap command through ``accelpact launch``: 4 ranks and 1 spare, rank 1 SIGKILLed in
    step 4's backward; a spare takes its place, zero restarts, bit-identical to a fault-free run, the trace accepted."""
    pytest.importorskip("torch")
    from accelpact.testing.examples import assert_bit_identical, assert_trace_accepted, torchrun

    ref = tmp_path / "reference"
    torchrun("fsdp2_hsdp.py", ref, "--replicas", "2")
    out = tmp_path / "swap"
    text = torchrun("fsdp2_hsdp.py", out, "--replicas", "2", "--fault", "crash@backward:4:1", nproc=5, spares=1)
    assert "accelpact launch: torchrun" in text and "deprecated" not in text, text[-2000:]
    assert "replaced by a spare (hot swap)" in text, text[-3000:]
    assert text.count("replaced by a spare, step rerun") == 3, text[-3000:]
    assert_bit_identical(ref, out, 4)
    assert_trace_accepted(out)
