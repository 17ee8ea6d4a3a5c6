"""Issue 26 item 6: the failure detector's defaults per backend, and spec/nccl.md's rows on NCCL's bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelpact.impl import detector as D
from accelpact.impl.runtime import backends as B

SPEC = Path(__file__).resolve().parents[1] / "spec" / "nccl.md"


def test_gloo_defaults_are_unchanged():
    assert B.detector_defaults("gloo") == (0.8, 5.0)
    assert B.detector_defaults("gloo") == (D.DEAD_AFTER_S, D.HANG_FLOOR_S)
    assert D.detector_defaults_for(None) == (D.DEAD_AFTER_S, D.HANG_FLOOR_S)


def test_nccl_dead_after_is_larger_and_covers_a_stalled_poll():
    dead, floor = B.detector_defaults("nccl")
    assert dead > B.detector_defaults("gloo")[0]
    assert dead >= 5.0 and floor == B.detector_defaults("gloo")[1]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend"):
        B.detector_defaults("mpi")


class _Store:
    def clone(self):
        return self


@pytest.mark.parametrize("backend", [None, "gloo", "nccl"])
def test_the_detector_takes_its_backends_defaults(backend, monkeypatch):
    monkeypatch.delenv(D.ENV_DEAD_AFTER, raising=False)
    det = D.Detector(_Store(), 0, 2, clone=False, backend=backend)
    dead, floor = D.detector_defaults_for(backend)
    assert det.dead_after_s == dead and det.hang_floor_s == floor


def test_explicit_and_env_settings_still_win(monkeypatch):
    monkeypatch.delenv(D.ENV_DEAD_AFTER, raising=False)
    assert D.Detector(_Store(), 0, 2, clone=False, backend="nccl", dead_after_s=1.5).dead_after_s == 1.5
    assert D.Detector(_Store(), 0, 2, clone=False, backend="nccl", hang_floor_s=7.0).hang_floor_s == 7.0
    monkeypatch.setenv(D.ENV_DEAD_AFTER, "2.5")
    assert D.Detector(_Store(), 0, 2, clone=False, backend="nccl").dead_after_s == 2.5


@pytest.mark.parametrize("phrase", [
    "**`Work.is_completed` holds the GIL while it polls**",
    'no `py::call_guard<py::gil_scoped_release>`',
    "finishedGPUExecutionInternal",
    "It can hang if another thread is holding the CUDA global context lock",
    "**NCCL 5.0 s**",
    "**The connection bounds**",
    "auto vec = store_->get(storeKey)",
    "TORCH_NCCL_USE_COMM_NONBLOCKING",
    'waitForFutureOrTimeout(fut, options_->timeout, "ProcessGroup abort"',
    "returns when `ncclCommAbort` does",
])
def test_spec_has_the_rows_on_bounds(phrase):
    assert phrase in SPEC.read_text()
