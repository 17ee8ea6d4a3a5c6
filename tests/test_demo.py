"""``accelpact demo`` (impl/launch/demo.py): flag validation without running anything, no torch at import,
and one bounded end-to-end run.

Spec ids: I1 (L1 continuation bit-identical to the reference), C4.2 (zero replay in L1), C5.1 (the
in-flight path exits 70), C5.2 / I5 (L2 restarts, replays F - C and ends equal to the reference).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.impl.launch import demo


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="accelpact demo")
    demo.add_arguments(p)
    return p


@pytest.mark.parametrize("argv", [
    ["--wrapper", "fsdp3"],
    ["--backend", "mpi"],
    ["--fault-at", "boundary"],      # the L2 path is in flight; the boundary is the L1 path's point
    ["--fault-kind", "meteor"],
    ["--nodes", "0"],
    ["--steps", "many"],
])
def test_bad_flags_are_argparse_errors(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--steps", "4", "--fault-step", "4"], "--fault-step 4 must be in [1, --steps)"),
    (["--steps", "4", "--fault-step", "0"], "--fault-step 0"),
    (["--nodes", "1", "--ranks-per-node", "1", "--wrapper", "ddp"], "at least 2 ranks"),
    (["--nodes", "1", "--ranks-per-node", "4"], "--nodes >= 2"),
    (["--checkpoint-every", "-1"], "--checkpoint-every"),
])
def test_cross_flag_validation_returns_2_before_launching(argv, needle: str, tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    from accelpact.impl.launch import launch

    def launched(*args, **kwargs):
        raise AssertionError("a launcher was called for flags that must be rejected first")

    for name in ("run_torchrun", "run_local", "run_reference"):
        monkeypatch.setattr(launch, name, launched)
    args = _parser().parse_args(argv + ["--out", str(tmp_path / "out")])
    assert demo.run(args) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_demo_module_does_not_import_torch() -> None:
    code = "import sys, accelpact.impl.launch.demo, accelpact.bench.recovery; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(900)
@pytest.mark.parametrize("topology", [
    ["--nodes", "2", "--ranks-per-node", "1", "--wrapper", "ddp"],
    pytest.param([], marks=pytest.mark.nightly(
        "the demo's default job, FSDP1 on 2x2 (about 110 s of CPU): DDP on 2x1 runs every path of the same demo every time"))],
    ids=["ddp-2x1", "default"])
def test_demo_end_to_end(tmp_path: Path, topology: list) -> None:
    """I1/C4.2/C5.1/C5.2/I5: the whole demo, small: every path (L1, L2, hot swap, discard) ends
    bit-identical to the reference; L1, the swap and the discard without a restart."""
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "accelpact.cli", "demo", *topology, "--layers", "1", "--steps", "5", "--fault-step", "3",
         "--out", str(out), "--timeout", "240", "--quiet"],
        capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["l1"]["ok"] and summary["l1"]["restarts"] == 0
    assert [e["replayed_steps"] for e in summary["l1"]["episodes"]] == [0]
    assert summary["l2"]["ok"] and summary["l2"]["restarts"] == 1
    l2 = summary["l2"]["episodes"][0]
    assert l2["exit_codes"] == [70] and l2["resumed_from"] == 2 and l2["replayed_steps"] == 3 - 2
    for path in ("swap", "discard"):
        assert summary[path]["ok"] and summary[path]["restarts"] == 0, (path, summary[path])
    assert (out / "timeline.png").stat().st_size > 0
