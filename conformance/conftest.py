"""pytest options for the conformance suite (spec/scenario-format.md, "Running").

``pytest conformance/`` runs the fast subset with real processes on gloo; ``--full`` runs the whole
corpus; ``--scenario SUBSTR`` filters by name; ``--backend NAME`` (one of
:data:`accelpact.impl.runtime.backends.BACKEND_NAMES`) skips each scenario with the backend's reason when
this machine cannot run it (``Backend.unavailable``, e.g. too few GPUs for nccl); ``--world-size N`` keeps only scenarios of that world size;
``--torchrun-args "k=v,..."`` passes ``run_torchrun`` keyword arguments (e.g. ``monitor_interval=0.5``).
Works under pytest-xdist (each scenario writes to its own tmp folder; the reference cache is per
worker via ``ACCELPACT_REF_CACHE`` or the session tmp folder).

``--backend nccl`` follows this machine's GPUs (one per rank):

* none: every scenario skips with that reason, and so does the world-size-1 check;
* 1-3: the corpus has no scenario that small (every one is 2x2 or 4x2: each skips with its reason);
  what runs is the world-size-1 check, ``test_conformance.py::nccl-world-size-1``: one NCCL rank
  through the real engine (replace, rebind, validate, release on CUDA tensors, the guard's stream
  drain), ``python -m accelpact.bench.gpu_check`` in a child process;
* 4 or more: the whole corpus, as with ``--full`` (unless ``--scenario`` narrows it; a scenario
  wider than the machine skips with its reason), and the world-size-1 check.

One-GPU mode (opt-in: ``ACCELPACT_NCCL_ONE_GPU=1``, :data:`accelpact.impl.runtime.backends.ONE_GPU_ENV`;
``python -m accelpact.bench.gpu_conformance`` sets it): every rank of a scenario on ``cuda:0``, each
with its own ``NCCL_HOSTID`` (:func:`accelpact.impl.runtime.backends.one_gpu_env`, set by
``Backend.prepare_process`` in the rank before its first NCCL group); ``Backend.unavailable`` then
asks for one GPU, so the fast subset (or ``--full``) runs on a machine with one.  The header says
when the mode is on.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from accelpact.impl.runtime.backends import BACKEND_NAMES, ONE_GPU_ENV, one_gpu_mode  # torch-free

#: GPUs at which ``--backend nccl`` selects the whole corpus (its scenarios have 4 or 8 ranks).
FULL_CORPUS_GPUS = 4
#: Bound on the world-size-1 check's child process (seconds).
GPU_CHECK_TIMEOUT_S = 570  # gpu_check caps itself at 540 s (its --timeout default)
_GPUS = pytest.StashKey[int]()


def pytest_addoption(parser):
    g = parser.getgroup("accelpact conformance")
    g.addoption("--backend", default="gloo", choices=BACKEND_NAMES, help="collective backend for the real runs")
    g.addoption("--world-size", type=int, default=None, help="only scenarios with this many ranks")
    g.addoption("--scenario", default=None, help="only scenarios whose name contains this substring")
    g.addoption("--torchrun-args", default="", help="comma-separated k=v keyword arguments for run_torchrun")
    g.addoption("--full", action="store_true", help="run the whole corpus, not only the fast subset")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_configure(config):
    """``--backend nccl``: count the GPUs once; at ``FULL_CORPUS_GPUS`` or more select the whole corpus."""
    if config.getoption("--backend") != "nccl":
        return
    n = _gpus()
    config.stash[_GPUS] = n
    if n >= FULL_CORPUS_GPUS and not config.getoption("--scenario"):
        config.option.full = True


def pytest_report_header(config):
    if config.getoption("--backend") == "nccl" and one_gpu_mode():
        return [f"accelpact: {ONE_GPU_ENV}=1: every NCCL rank on cuda:0, a distinct NCCL_HOSTID per rank"]
    return []


def pytest_collect_file(file_path, parent):
    """``--backend nccl``: the world-size-1 check, collected beside the scenarios of test_conformance.py."""
    if file_path.name == "test_conformance.py" and parent.config.getoption("--backend") == "nccl":
        return GpuCheckFile.from_parent(parent, path=file_path)
    return None


class GpuCheckFile(pytest.File):
    def collect(self):
        yield GpuCheckItem.from_parent(self, name="nccl-world-size-1")


class GpuCheckItem(pytest.Item):
    """One NCCL rank through the real engine (:mod:`accelpact.bench.gpu_check`), in a child process."""

    def runtest(self) -> None:
        if self.config.stash.get(_GPUS, 0) < 1:
            pytest.skip("--backend nccl: this machine has no CUDA device; the world-size-1 check needs one")
        if self.config.getoption("--scenario"):
            pytest.skip("--scenario given: the world-size-1 check runs only without it")
        proc = subprocess.run([sys.executable, "-m", "accelpact.bench.gpu_check"], capture_output=True, text=True,
                              timeout=GPU_CHECK_TIMEOUT_S)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        assert lines, f"gpu_check printed no JSON (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        res = json.loads(lines[-1])
        if res.get("skipped"):
            pytest.skip(f"gpu_check: {res['skipped']}")
        assert proc.returncode == 0 and res.get("ok") is True, json.dumps(res, indent=1)[-6000:]

    def reportinfo(self):
        return self.path, None, self.name
