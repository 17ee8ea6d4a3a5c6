"""``bench/device_check.sh``: the one-GPU check from the repository alone (issue 43 item 6).  Here: it
exists, its bounds fit 8 minutes together and cover the inner commands' own bounds, and on a machine
without CUDA it skips cleanly (run for real: the skip comes before anything is installed, in seconds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "device_check.sh"


def _bounds() -> dict[str, int]:
    text = SCRIPT.read_text()
    return {k: int(v) for k, v in re.findall(r"^([A-Z_]+_S)=(\d+)$", text, re.M)}


def test_the_script_exists_and_its_bounds_fit_eight_minutes():
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK)
    b = _bounds()
    outer = b["INSTALL_S"] + b["GPU_CHECK_S"] + b["CONFORMANCE_S"]
    assert outer <= b["TOTAL_LIMIT_S"] == 480, b
    # each command's own bound inside its kill bound (gpu_conformance: 30 s of SIGINT grace after its own)
    assert b["GPU_CHECK_INNER_S"] < b["GPU_CHECK_S"] and b["CONFORMANCE_INNER_S"] + 30 < b["CONFORMANCE_S"], b
    text = SCRIPT.read_text()
    assert "pip install --no-build-isolation --no-deps --no-index -e ." in text
    assert "accelpact.bench.gpu_check --timeout \"$GPU_CHECK_INNER_S\"" in text
    assert "accelpact.bench.gpu_conformance --subset quick --timeout \"$CONFORMANCE_INNER_S\"" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: run bench/device_check.sh itself")
def test_without_a_gpu_it_skips_cleanly_before_installing_anything(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "ignored")}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped" in proc.stdout
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert report["ok"] is None and "no CUDA device" in report["skipped"], report
    assert report["bounds_s"]["total"] <= report["bounds_s"]["limit"] == 480
    assert not (tmp_path / "out" / "install.log").exists(), "nothing installed on a machine without a GPU"
    assert not (tmp_path / "ignored").exists(), "the folder given wins over $OUT"


def test_a_usage_error_is_exit_code_2(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr
