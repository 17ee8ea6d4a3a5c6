"""The contract an engine decides with travels in its trace headers, and the conformance corpus runs an
unqualified platform under that platform's candidate envelope (found on the first lent GPU, stop 38:
every NCCL scenario's engine said L2 under the shipped envelope, which has no ``cuda-nccl`` entry, and
the checker, which assumed ``cpu-gloo``, rejected the RankReject records)."""

from __future__ import annotations

import json

import pytest

from accelpact.conformance.runner import candidate_envelope
from accelpact.model.contract import Envelope, default_envelope, load_envelope, save_envelope


def test_the_candidate_envelope_of_an_unqualified_platform(tmp_path):
    """gloo's platform is in the shipped envelope: no candidate.  NCCL's is not: the default's cells
    for ``cuda-nccl``, written where asked."""
    assert candidate_envelope("gloo", tmp_path / "gloo.json") is None
    assert not (tmp_path / "gloo.json").exists()
    path = candidate_envelope("nccl", tmp_path / "nccl.json")
    assert path == tmp_path / "nccl.json"
    env = load_envelope(path)
    assert env == default_envelope(platform="cuda-nccl")
    assert {e.key.platform for e in env.entries} == {"cuda-nccl"}


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_a_run_under_an_envelope_without_its_platform_is_modelled_as_it_ran(tmp_path):
    """A real 2x2 DDP repair on gloo whose envelope qualifies only ``cuda-nccl``: the engine's guard
    says L2 (RankReject, exit 70), the scenario's expected L1 is not met, and the trace checker,
    reading the platform and envelope from the headers, accepts the traces (before, it modelled
    ``cpu-gloo`` under the shipped envelope and rejected the RankReject)."""
    pytest.importorskip("torch")
    from accelpact.conformance.runner import run_scenario
    from accelpact.conformance.scenario import load_scenario
    from accelpact.conformance.generate import SCENARIO_DIR
    from accelpact.impl.rundir import RunDir

    env = tmp_path / "nccl-only.json"
    save_envelope(Envelope(default_envelope(platform="cuda-nccl").entries), env)
    sc = load_scenario(SCENARIO_DIR / "2x2-ddp-repair.json")
    rep = run_scenario(sc, backend="gloo", out=tmp_path / "run", cache_dir=tmp_path / "refs", timeout_s=240, envelope=env)
    assert rep.outcome == "exit" and not rep.conforms, rep.summary()
    assert rep.trace_ok is True, rep.summary()
    assert any("expects L1" in p for p in rep.problems), rep.summary()
    assert rep.envelope == str(env)
    headers = [json.loads(RunDir(tmp_path / "run").trace(0, r).read_text().splitlines()[0]) for r in range(4)]
    assert {h["platform"] for h in headers} == {"cpu-gloo"}
    assert all(h["envelope"] == load_envelope(env).to_json() for h in headers)
