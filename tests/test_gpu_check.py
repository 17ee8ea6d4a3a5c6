"""The one-GPU commands (spec/nccl.md, "Running on one lent GPU") on a CPU machine: the one-GPU
mode's environment (``ACCELPACT_NCCL_ONE_GPU``), both commands' skip without CUDA, and the
backend-neutral sub-checks of ``gpu_check`` on gloo (a check of the script, not of NCCL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from accelpact.bench import gpu_check, gpu_conformance
from accelpact.impl.runtime import backends as B

ONE_GPU_VARS = ("NCCL_HOSTID", "NCCL_NET", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")


def _clean_env(monkeypatch) -> None:
    """Every variable prepare_process may write, absent now and restored (absent) after the test."""
    for k in (*B.NCCL_ENV, *ONE_GPU_VARS, B.ONE_GPU_ENV):
        monkeypatch.setenv(k, "x")  # records the original state, so that teardown restores it
        monkeypatch.delenv(k)


def test_one_gpu_env_only_in_one_gpu_mode():
    assert not B.one_gpu_mode({}) and B.one_gpu_env(0, {}) == {}
    for other in ("0", "", "true", "yes"):
        assert not B.one_gpu_mode({B.ONE_GPU_ENV: other}) and B.one_gpu_env(2, {B.ONE_GPU_ENV: other}) == {}
    on = {B.ONE_GPU_ENV: "1"}
    envs = [B.one_gpu_env(r, on) for r in range(8)]
    assert all(set(e) == set(ONE_GPU_VARS) for e in envs)
    assert len({e["NCCL_HOSTID"] for e in envs}) == 8, "NCCL_HOSTID must differ per rank"
    assert all(e["NCCL_NET"] == "Socket" and e["NCCL_P2P_DISABLE"] == "1" and e["NCCL_SHM_DISABLE"] == "1" for e in envs)
    assert B.one_gpu_env(3, on) == B.one_gpu_env(3, on), "derived from the rank alone"


def test_prepare_process_one_gpu_mode_and_inert_without(monkeypatch):
    _clean_env(monkeypatch)
    current = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(d))
    nccl = B.backend("nccl")
    assert nccl.prepare_process(3) == torch.device("cuda", 3) and current == [torch.device("cuda", 3)]
    assert not any(k in os.environ for k in ONE_GPU_VARS), "the mode is off: no NCCL_* variable written"
    assert B.backend("gloo").prepare_process(3) == torch.device("cpu")
    monkeypatch.setenv(B.ONE_GPU_ENV, "1")
    assert B.backend("gloo").prepare_process(3) == torch.device("cpu")
    assert not any(k in os.environ for k in ONE_GPU_VARS), "gloo is untouched by the mode"
    hostids = []
    for rank in (0, 4):
        assert nccl.prepare_process(rank) == torch.device("cuda", 0)
        assert {k: os.environ[k] for k in ONE_GPU_VARS} == B.one_gpu_env(rank)
        hostids.append(os.environ["NCCL_HOSTID"])
    assert current[-2:] == [torch.device("cuda", 0)] * 2 and len(set(hostids)) == 2
    assert {k: os.environ.get(k) for k in B.NCCL_ENV} == B.NCCL_ENV


def test_unavailable_asks_one_gpu_in_one_gpu_mode(monkeypatch):
    _clean_env(monkeypatch)
    nccl = B.backend("nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    # a CUDA build's ProcessGroupNCCL, with its get_error binding (Backend.error_query_problem)
    monkeypatch.setattr(torch.distributed, "ProcessGroupNCCL", type("PG", (), {"get_error": lambda self: None}),
                        raising=False)
    assert "one CUDA device per rank (5)" in (nccl.unavailable(5) or "")
    monkeypatch.setenv(B.ONE_GPU_ENV, "1")
    assert nccl.unavailable(5) is None and nccl.unavailable(1) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert B.ONE_GPU_ENV in (nccl.unavailable(2) or "")
    assert B.backend("gloo").unavailable(5) is None


@pytest.mark.parametrize("module", ["accelpact.bench.gpu_check", "accelpact.bench.gpu_conformance"])
def test_gpu_commands_skip_without_cuda(module):
    if torch.cuda.is_available():
        pytest.skip(f"this machine has CUDA: run `python -m {module}` itself")
    proc = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["ok"] is None and "no CUDA" in res["skipped"]


def test_gpu_conformance_command_and_outcomes():
    quick = gpu_conformance.pytest_command("quick", None, 1)
    assert "--backend=nccl" in quick and "-n" not in quick
    assert [a for a in quick if "test_scenario_conforms[" in a] == [
        f"conformance/test_conformance.py::test_scenario_conforms[{n}]" for n in gpu_conformance.QUICK]
    assert any("spare" in n for n in gpu_conformance.QUICK)
    fast = gpu_conformance.pytest_command("fast", None, 2)
    assert fast[-3:] == ["conformance/", "-k", "test_scenario_conforms"] and fast[fast.index("-n") + 1] == "2"
    one = gpu_conformance.pytest_command("fast", "spare1", 1)
    assert "--scenario=spare1" in one
    # on the first lent GPU "--scenario -repair" reached pytest as two arguments and pytest refused it
    assert "--scenario=-repair" in gpu_conformance.pytest_command("fast", "-repair", 1)
    text = "\n".join([
        "conformance/test_conformance.py::test_scenario_conforms[2x2-ddp-repair] PASSED [ 25%]",
        "[gw1] [ 50%] FAILED conformance/test_conformance.py::test_scenario_conforms[2x2-fsdp1-repair]",
        "conformance/test_conformance.py::test_scenario_conforms[2x2-fsdp2-repair] SKIPPED (why) [ 75%]",
        "conformance/test_conformance.py::nccl-world-size-1 PASSED",
    ])
    assert gpu_conformance.parse_outcomes(text) == {"2x2-ddp-repair": "PASSED", "2x2-fsdp1-repair": "FAILED",
                                                    "2x2-fsdp2-repair": "SKIPPED"}


def test_gpu_check_table_is_bounded():
    assert set(gpu_check.SUBCHECKS) == {"watchdog_timeout", "ddp_repair", "real_timeout_repair", "fsdp2_boundary",
                                        "swap_blob_exchange", "state_checksum", "device_rng_rerun"}
    assert sum(bound for _, bound, _, _ in gpu_check.SUBCHECKS.values()) < 540 < 600


@pytest.mark.multiproc
def test_gpu_check_neutral_subchecks_on_gloo(tmp_path):
    """The sub-checks that run on any backend, here on gloo and the CPU: the script works end to end
    (the NCCL-only ones report themselves not run); evidence about NCCL needs a GPU."""
    proc = subprocess.run([sys.executable, "-m", "accelpact.bench.gpu_check", "--backend", "gloo", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=240)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and res["ok"] is True, json.dumps(res, indent=1)[-4000:] + proc.stderr[-2000:]
    sub = res["subchecks"]
    assert all(sub[n]["ok"] is None for n in ("watchdog_timeout", "ddp_repair", "real_timeout_repair"))
    for name in ("fsdp2_boundary", "swap_blob_exchange", "state_checksum", "device_rng_rerun"):
        assert sub[name]["ok"] is True and all(sub[name]["checks"].values()), name


def test_get_error_binding_is_reported_without_a_device():
    """The one-line check of spec/nccl.md row 17 that gpu_check's JSON carries (``get_error_bound``): on
    this CPU build there is no ProcessGroupNCCL, the base Backend binds no get_error (torch 2.14 binds one,
    whose default says SUCCESS: spec/nccl.md, "Versions"), and an NCCL job would be refused with the reason."""
    b = gpu_check.get_error_binding()
    assert b["Backend"] is (B._minor(torch.__version__) >= (2, 14))
    if not hasattr(torch.distributed, "ProcessGroupNCCL"):
        assert b["ProcessGroupNCCL"] is None and "without NCCL" in b["problem"]


def test_the_real_timeout_fault_is_nccl_only(tmp_path):
    """``accelpact.testing.nccl_timeout``: on gloo it refuses with the reason, never stalls anything."""
    from accelpact.impl.runtime.revoke import SocketRecord
    from accelpact.testing import nccl_timeout as nt
    from accelpact.model.faults import Fault, FaultError
    from accelpact.testing.faults import FaultContext

    assert "NCCL only" in (nt.unavailable("gloo") or "")
    if torch.cuda.is_available():
        assert nt.unavailable("nccl") is None
    ctx = FaultContext(None, 0, 0, {}, {"replicate": SocketRecord(backend="gloo")})
    with pytest.raises(FaultError, match="NCCL only"):
        nt.nccl_timeout(Fault(1, "boundary", "collective_timeout", (0,), "replicate"), ctx)
    with pytest.raises(FaultError, match="no NCCL group named 'shard'"):
        nt.nccl_timeout(Fault(1, "boundary", "collective_timeout", (0,), "shard"), ctx)
