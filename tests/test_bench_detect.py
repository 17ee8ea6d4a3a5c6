"""``accelpact bench detect --quick`` (bench/detect.py): one crash and one straggler trial on a real
2x2 job, faults injected from outside the workers; the JSON has the promised shape, the crash was
observed by a survivor (a TTD) and the straggler was suspected by nobody and finished.

No timing threshold: speed is measured by the benchmark, never tested.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from accelpact.bench import detect


def _number_or_none(x: object, where: str) -> None:
    if x is not None:
        assert isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x), f"{where}: {x!r}"


def test_flags_are_checked() -> None:
    p = argparse.ArgumentParser()
    detect.add_arguments(p)
    cfg = detect._config(p.parse_args(["--quick"]))
    assert cfg["kinds"] == ["crash", "straggler"] and cfg["trials"] == 1
    assert detect.check_config(cfg) is None

    def problem(*argv: str) -> str:
        return str(detect.check_config(detect._config(p.parse_args(list(argv)))))

    assert "unknown kind" in problem("--kinds", "crash,meteor")
    assert "--trials" in problem("--trials", "0")
    assert "nothing to run" in problem("--kinds", "none")
    assert detect.run(p.parse_args(["--kinds", "meteor"])) == 2


@pytest.mark.multiproc
@pytest.mark.timeout(300)
@pytest.mark.nightly('a benchmark (about 40 s); crash and straggler detection run every time in tests/test_detector.py')
def test_quick_detects_the_crash_and_spares_the_straggler(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    detect.add_arguments(p)
    out = tmp_path / "detect.json"
    code = detect.run(p.parse_args(["--quick", "--json", str(out), "--out", str(tmp_path / "runs")]))
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "detect" and doc["quick"] is True
    assert isinstance(doc["meta"]["created"], str) and isinstance(doc["config"], dict)
    summary = doc["summary"]
    assert set(summary["ttd_ms_median"]) == {"crash", "straggler"}
    assert isinstance(summary["false_positives"], int)
    for key in ("ttd_ms_median", "ttd_detector_ms_median", "outcome_ms_median"):
        for kind, v in summary[key].items():
            _number_or_none(v, f"summary.{key}.{kind}")

    trials = {t["kind"]: t for t in doc["results"]["trials"]}
    assert set(trials) == {"crash", "straggler"}
    crash, straggler = trials["crash"], trials["straggler"]
    # the crash: injected, and some survivor observed it (gloo, a peer's abort or the detector)
    assert crash["error"] is None, crash
    assert crash["ttd_ms"] is not None and summary["ttd_ms_median"]["crash"] is not None, crash
    assert crash["first_observation"]["rank"] != crash["victim"]
    assert crash["codes"][crash["victim"]] == -9 and crash["survivors_exited"] is True
    # the straggler: slept, nobody suspected anyone, the job finished normally
    assert straggler["error"] is None, straggler
    assert straggler["sleeps"] >= 1
    assert straggler["suspects"] == [] and straggler["false_positives"] == 0
    assert straggler["finished"] is True and straggler["codes"] == [0, 0, 0, 0], straggler
    assert summary["false_positives"] == 0
    for s in doc["results"]["kinds"].values():
        assert s["n"] == 1 and {"median", "p90", "max"} <= set(s["ttd_ms"]) and {"median", "p90", "max"} <= set(s["outcome_ms"])
    assert code == 0
