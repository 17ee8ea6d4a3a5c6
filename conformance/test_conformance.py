"""Every corpus scenario run for real against the model (spec/scenario-format.md R1-R3):
oracles outcome (O1), trace checker (O2) and deadlines (O3).  Seeded bugs are rejected (R4).

Default: the fast subset FAST (one of each outcome class that matters most) on gloo; ``--full``
runs the whole corpus.  Each test is bounded (pytest-timeout) and every process is reaped by the
launcher (impl/launch.py).
"""

from __future__ import annotations

import os

import pytest

from accelpact.conformance.generate import SCENARIO_DIR
from accelpact.conformance.scenario import load_scenario

#: the default subset: L1 for each wrapper, each in-flight rejection class once, a crash, a hang,
#: an exception, a frontier mismatch, a dirty guard, and successive repairs in one job.
FAST = (
    "2x2-fsdp1-repair",
    "2x2-fsdp2-repair",
    "2x2-ddp-repair",
    "2x2-fsdp1-reject-forward",
    "2x2-fsdp1-agree-crash-r3",
    "2x2-fsdp1-validate-hang-r3",
    "2x2-fsdp1-rebind-exception-r3",
    "2x2-fsdp1-guard-frontier-mismatch-r2",
    "2x2-fsdp1-guard-dirty-guard-r2",
    "2x2-fsdp1-successive-repairs",
)
SEEDED_BUGS = ("skip-rebind", "early-release", "no-fence")

#: Non-conformances the suite found in the implementation, reported to its owners; non-strict
#: xfail so that a fix turns them into passes (XPASS) without a change here.  Remove on fix.
#: Empty: the boundary-injection race, the non-member phase 4-6 faults, the phase 4/6 timeout
#: classification, the double RankTimeout and the write-then-record race (a peer's job abort ending
#: a rank between a control-plane write and its record; seen as "RankArrive: last=True but the model
#: says False" in boundary-frontier-mismatch-r2/r3) found by this suite were fixed in impl/.
KNOWN_IMPL_ISSUES: dict[str, str] = {}
ALL = sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def _selected(config) -> list[str]:
    names = ALL if config.getoption("--full") else [n for n in ALL if n in FAST]
    sub = config.getoption("--scenario")
    if sub:
        names = [n for n in ALL if sub in n]
    return names


def pytest_generate_tests(metafunc):
    if "scenario_name" in metafunc.fixturenames:
        metafunc.parametrize("scenario_name", _selected(metafunc.config))


def _torchrun_args(config) -> dict:
    out = {}
    for item in filter(None, config.getoption("--torchrun-args").split(",")):
        k, _, v = item.partition("=")
        out[k.strip()] = float(v) if v.replace(".", "", 1).isdigit() else v
    return out


@pytest.fixture
def backend_ok(request):
    backend = request.config.getoption("--backend")
    if backend == "nccl":
        torch = pytest.importorskip("torch")
        if torch.cuda.device_count() < 4:
            pytest.skip(f"--backend nccl: the 2x2 scenarios need 4 GPUs, found {torch.cuda.device_count()}")
    return backend


@pytest.fixture(scope="session")
def ref_cache(tmp_path_factory):
    env = os.environ.get("ACCELPACT_REF_CACHE")
    return env or str(tmp_path_factory.getbasetemp() / "refs")


@pytest.mark.multiproc
@pytest.mark.timeout(900)
def test_scenario_conforms(scenario_name, backend_ok, ref_cache, tmp_path, request):
    """R1-R3: the run conforms (outcome allowed by the model, bit-identical, trace accepted, deadlines held)."""
    from accelpact.conformance.runner import run_scenario

    if scenario_name in KNOWN_IMPL_ISSUES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_IMPL_ISSUES[scenario_name], strict=False))
    sc = load_scenario(SCENARIO_DIR / f"{scenario_name}.json")
    ws = request.config.getoption("--world-size")
    if ws is not None and sc.topology.world != ws:
        pytest.skip(f"--world-size {ws}: scenario has {sc.topology.world} ranks")
    rep = run_scenario(sc, backend=backend_ok, out=tmp_path / "run", cache_dir=ref_cache, timeout_s=240,
                       torchrun_args=_torchrun_args(request.config))
    assert rep.conforms, rep.summary()


@pytest.mark.multiproc
@pytest.mark.timeout(900)
@pytest.mark.parametrize("bug", SEEDED_BUGS)
def test_seeded_bug_rejected(bug, backend_ok, ref_cache, tmp_path, request):
    """R4: with a seeded bug the suite (oracles + checker) rejects the run of the plain repair."""
    from accelpact.conformance.runner import run_scenario

    if request.config.getoption("--scenario"):
        pytest.skip("--scenario given: seeded-bug demonstrations run only on the default selection")
    sc = load_scenario(SCENARIO_DIR / "2x2-fsdp1-repair.json")
    rep = run_scenario(sc, backend=backend_ok, out=tmp_path / "run", cache_dir=ref_cache, timeout_s=240, seeded_bug=bug)
    assert not rep.conforms, f"seeded bug {bug!r} went unnoticed:\n{rep.summary()}"
    print(rep.summary())
