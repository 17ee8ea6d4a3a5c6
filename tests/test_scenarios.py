"""Scenario schema and validation (conformance/scenario.py), the scenario -> model mapping
(conformance/mapping.py) and the model's outcomes (conformance/outcomes.py): spec/scenario-format.md
F1-F4.  Pure: no processes, no torch."""

from __future__ import annotations

import copy
import json

import pytest

from accelpact.conformance.generate import SCENARIO_DIR, generate
from accelpact.conformance.mapping import failing_group, model_config, script_for
from accelpact.conformance.outcomes import model_outcomes
from accelpact.conformance.scenario import ScenarioError, load_scenario, scenario_from_job, scenario_from_mapping
from accelpact.model.faults import FAULT_POINTS, KINDS, TRIGGER_POINTS, Fault, FaultError
from accelpact.impl.launch.job import FieldError, Job, JobError
from accelpact.model.state import PC_ARRIVED, PC_GUARDED, PC_OBSERVED, PC_REBOUND, PC_REPLACED, PC_TRAIN

BASE = {
    "name": "t",
    "topology": {"nodes": 2, "ranks_per_node": 2},
    "workload": {"wrapper": "fsdp1-hybrid", "layers": 2, "steps": 8, "seed": 0, "checkpoint_every": 3},
    "faults": [{"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [1, 3], "group": "replicate"}],
}


def mk(**over):
    d = copy.deepcopy(BASE)
    for k, v in over.items():
        d[k] = v
    return d


def with_fault(extra, **over):
    d = mk(**over)
    d["faults"] = d["faults"] + extra
    return d


@pytest.mark.parametrize("data, field", [
    (mk(name=""), "name"),
    (mk(topology={"nodes": 0, "ranks_per_node": 2}), "topology.nodes"),
    (mk(workload={**BASE["workload"], "wrapper": "zero3"}), "workload.wrapper"),
    (mk(workload={**BASE["workload"], "steps": "8"}), "workload.steps"),
    (mk(faults=[]), "faults"),
    (mk(faults=[{**BASE["faults"][0], "at": "lunch"}]), "faults[0].at"),
    (mk(faults=[{**BASE["faults"][0], "kind": "meteor"}]), "faults[0].kind"),
    (mk(faults=[{**BASE["faults"][0], "ranks": [9]}]), "faults[0].ranks[0]"),
    (mk(faults=[{**BASE["faults"][0], "step": 7}]), "faults[0].step"),
    (mk(faults=[{**BASE["faults"][0], "group": "world"}]), "faults[0].group"),
    (mk(expect={"outcome": "L3"}), "expect.outcome"),
    (mk(extra=1), "unknown field"),
    (with_fault([{"step": 5, "at": "agree", "kind": "collective_timeout", "ranks": [2]}]), "cannot be injected at 'agree'"),
    (with_fault([{"step": 4, "at": "agree", "kind": "crash", "ranks": [2]}]), "needs a fault at 'boundary'"),
    (with_fault([{"step": 5, "at": "boundary", "kind": "corrupt_state", "ranks": [2]}]), "strikes only members"),
    (mk(faults=[{**BASE["faults"][0], "ranks": [1, 1]}]), "duplicate rank"),
    (mk(faults=[{**BASE["faults"][0], "attempt": 1}]), "faults[0].attempt"),
    (mk(faults=[{**BASE["faults"][0], "weather": "rain"}]), "faults[0]: unknown field"),
    (mk(workload={**BASE["workload"], "checkpoint_every": 0}), "workload.checkpoint_every"),
    (mk(workload={k: v for k, v in BASE["workload"].items() if k != "seed"}), "workload: missing required field(s) ['seed']"),
    (mk(topology={"nodes": 17, "ranks_per_node": 2}), "topology.nodes"),
    (with_fault([{"step": 5, "at": "forward", "kind": "crash", "ranks": [3]}]), "several points"),
    (mk(faults=[{"step": 5, "at": "guard", "kind": "crash", "ranks": [3]}]), "needs at least one fault at"),
])
def test_validation_names_the_field(data, field):
    """F1: every malformed field is reported by name, with what to do instead."""
    with pytest.raises(ScenarioError) as exc:
        scenario_from_mapping(data)
    assert field in str(exc.value)


@pytest.mark.parametrize("at", FAULT_POINTS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kinds_allowed_per_point_come_from_the_fault_table(at, kind):
    """F1: where a kind may strike is the kind table's (model/faults.py), checked by Fault.parse,
    the one fault validator; the scenario adds only its own rules (a trigger at the fault's step)."""
    trigger_at = at if at in TRIGGER_POINTS else "boundary"
    ranks = (1, 3) if KINDS[kind].pair else (3,)   # a link names its two ends
    d = mk(faults=[{"step": 5, "at": trigger_at, "kind": "collective_timeout", "ranks": [1, 3]},
                   {"step": 5, "at": at, "kind": kind, "ranks": list(ranks)}])
    if at in KINDS[kind].points:
        sc = scenario_from_mapping(d)
        assert sc.faults[1] == Fault(5, at, kind, ranks, "replicate")
    else:
        with pytest.raises(ScenarioError, match=rf"faults\[1\]: kind '{kind}' cannot be injected at '{at}'"):
            scenario_from_mapping(d)


def test_fault_errors_are_scenario_errors():
    """A FaultError from Fault.parse reaches the caller as a ScenarioError (a FieldError) with its message."""
    with pytest.raises(ScenarioError) as exc:
        scenario_from_mapping(mk(faults=[{**BASE["faults"][0], "at": "lunch"}]))
    assert isinstance(exc.value, FieldError) and not isinstance(exc.value, FaultError)
    assert str(exc.value).startswith("<scenario>.faults[0].at: 'lunch' is not one of")


def test_roundtrip_and_defaults():
    sc = scenario_from_mapping(mk())
    assert scenario_from_mapping(json.loads(sc.dumps())) == sc
    assert sc.frontier == 5 and sc.checkpoint == 3 and sc.group == "replicate"
    # a fault's group defaults to the wrapper's R: world for ddp
    ddp = scenario_from_mapping(mk(workload={**BASE["workload"], "wrapper": "ddp"},
                                   faults=[{"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [2]}]))
    assert ddp.group == "world" and ddp.faults[0].group == "world"


def test_scenario_job_is_the_typed_job(tmp_path):
    """The one way a scenario becomes a run: Scenario.job; the seeded bug travels only as its field."""
    sc = scenario_from_mapping(mk())
    job = sc.job(tmp_path / "run", backend="gloo", deadline_s=5.0, seeded_bug="skip-rebind")
    assert isinstance(job, Job)
    assert (job.scenario, job.topology, job.workload, job.faults) == (sc.name, sc.topology, sc.workload, sc.faults)
    assert (job.out, job.backend, job.trace, job.deadline_s, job.seeded_bug) == (str(tmp_path / "run"), "gloo", True, 5.0, "skip-rebind")
    assert sc.job(tmp_path).seeded_bug is None
    assert Job.parse(json.loads(json.dumps(job.to_json()))) == job
    assert scenario_from_job(job) == sc
    with pytest.raises(JobError, match="seeded_bug"):
        sc.job(tmp_path, seeded_bug="nonsense")
    with pytest.raises(JobError, match="backend"):
        sc.job(tmp_path, backend="mpi")


def test_model_config_mapping():
    """F2: Config from the scenario: world, R from the failing ranks, F, C, group, fault budget."""
    cfg = model_config(scenario_from_mapping(mk()))
    assert (cfg.nodes, cfg.ranks_per_node, cfg.affected, cfg.frontier, cfg.checkpoint, cfg.group) == (2, 2, (1, 3), 5, 3, "replicate")
    assert cfg.max_faults == 1
    d = mk(faults=[{"step": 2, "at": "boundary", "kind": "collective_timeout", "ranks": [0, 2]}])
    assert model_config(scenario_from_mapping(d)).affected == (0, 2)
    ddp = mk(workload={**BASE["workload"], "wrapper": "ddp"}, faults=[{"step": 5, "at": "boundary", "kind": "crash", "ranks": [2]}])
    cfg = model_config(scenario_from_mapping(ddp))
    assert cfg.group == "world" and cfg.affected == (0, 1, 2, 3) and cfg.max_faults == 2


def test_groups_failing_together_are_one_episode_with_any_groups():
    """Two replicate groups failing at one boundary: one episode (one generation) whose R is both;
    the model instance lets any group fail (failing="any"), one FaultGroupFail per group."""
    sc = scenario_from_mapping(mk(faults=[{**BASE["faults"][0], "ranks": [0, 3]}]))
    assert sc.episode_groups(5) == (0, 1) and sc.episode_members(5) == frozenset({0, 1, 2, 3})
    cfg = model_config(sc)
    assert cfg.failing == "any"
    assert [(f.action, f.rank, f.arg, f.gen) for f in script_for(sc).faults] == [
        ("FaultGroupFail", 0, "boundary", 0), ("FaultGroupFail", 1, "boundary", 0)]
    # alternating groups in successive episodes: also "any", each episode its own group
    alt = scenario_from_mapping(mk(faults=[{**BASE["faults"][0], "step": 2, "ranks": [0, 2]},
                                           {**BASE["faults"][0], "step": 5, "ranks": [1, 3]}]))
    assert model_config(alt).failing == "any"
    assert [(f.rank, f.gen) for f in script_for(alt).faults] == [(0, 0), (1, 1)]
    # the same single group every time: the classic instance
    assert model_config(scenario_from_mapping(mk())).failing == "one"


def test_failing_group_is_the_topology_group():
    """R is the failing ranks' group of the wrapper's kind (Topology.group), in one place."""
    assert failing_group(scenario_from_mapping(mk())) == (1, 3)
    d = mk(topology={"nodes": 4, "ranks_per_node": 2},
           faults=[{"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [0, 4]}])
    assert failing_group(scenario_from_mapping(d)) == (0, 2, 4, 6)
    ddp = mk(workload={**BASE["workload"], "wrapper": "ddp"}, faults=[{"step": 5, "at": "boundary", "kind": "crash", "ranks": [2]}])
    assert failing_group(scenario_from_mapping(ddp)) == (0, 1, 2, 3)
    # without a failure fault (only a crash at the boundary), R is the crashed rank's group
    crash = mk(faults=[{"step": 5, "at": "boundary", "kind": "crash", "ranks": [2]}])
    assert failing_group(scenario_from_mapping(crash)) == (0, 2)
    assert model_config(scenario_from_mapping(crash)).affected == (0, 2)


def test_script_windows():
    """F3: recovery-phase faults fire only in their pc window; members and non-members differ."""
    d = with_fault([{"step": 5, "at": "agree", "kind": "crash", "ranks": [2]},
                    {"step": 5, "at": "validate", "kind": "hang", "ranks": [3, 0]}])
    script = script_for(scenario_from_mapping(d))
    assert len(script.faults) == 4
    by = {(f.action, f.rank): f for f in script.faults}
    assert by[("FaultGroupFail", None)].arg == "boundary"
    assert by[("FaultCrash", 2)].pcs == (PC_GUARDED, PC_ARRIVED)
    assert by[("FaultHang", 3)].pcs == (PC_REBOUND,)        # member of R: before validation
    assert by[("FaultHang", 0)].pcs == (PC_REPLACED,)       # outside R: its groups over W rebuilt (P18.3), while the members rebind
    boundary_crash = script_for(scenario_from_mapping(with_fault([{"step": 5, "at": "boundary", "kind": "crash", "ranks": [3]}])))
    assert [(f.action, f.rank, f.arg, f.gen, f.pcs) for f in boundary_crash.faults] == [
        ("FaultGroupFail", None, "boundary", 0, ()), ("FaultCrash", 3, None, 0, (PC_TRAIN,))]
    # the kinds whose model action is enabled in fewer pcs keep the kind table's window
    mismatch = script_for(scenario_from_mapping(with_fault([{"step": 5, "at": "agree", "kind": "frontier_mismatch", "ranks": [2]}])))
    assert mismatch.faults[1].pcs == KINDS["frontier_mismatch"].windows == (PC_TRAIN, PC_OBSERVED, PC_GUARDED)
    # an exception at the trigger point is the group failure itself: no separate fault action
    exc = script_for(scenario_from_mapping(mk(faults=[{**BASE["faults"][0], "kind": "exception"}])))
    assert [(f.action, f.arg) for f in exc.faults] == [("FaultGroupFail", "boundary")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("faults, outcome", [
    ([], "L1"),
    ([{"step": 5, "at": "agree", "kind": "crash", "ranks": [3]}], "L2:deadline"),
    ([{"step": 5, "at": "guard", "kind": "dirty_guard", "ranks": [2]}], "L2:rejected"),
    ([{"step": 5, "at": "guard", "kind": "frontier_mismatch", "ranks": [2]}], "L2:mismatch"),
])
def test_outcome_classes(faults, outcome):
    """F4: expected outcomes come from the model."""
    o = model_outcomes(scenario_from_mapping(with_fault(faults)))
    assert o.outcome_class == outcome and o.deadlocks == 0


def test_in_flight_discarded_or_mismatched_by_model():
    """P17: a cut in backward is discarded in place (L1): under the commit fence (P17.2) no rank commits
    a step a peer abandoned, so the mismatch a partial collective once allowed is gone; inside
    optimizer.step() it is rejected."""
    d = mk(faults=[{"step": 5, "at": "backward", "kind": "collective_timeout", "ranks": [1, 3]}])
    assert model_outcomes(scenario_from_mapping(d)).outcome_class == "L1"
    d = mk(faults=[{"step": 5, "at": "optimizer", "kind": "exception", "ranks": [1]}])
    assert model_outcomes(scenario_from_mapping(d)).outcome_class == "L2:rejected"


def test_rank_traces_of_the_repair():
    """Per-rank abstract traces from the model: a non-member never rebinds, but replaces the groups over
    all of W (P18.3) before it votes."""
    o = model_outcomes(scenario_from_mapping(mk()), traces=True)
    assert o.rank_actions[0] and o.rank_actions[1]
    assert all("RankRebind" not in t for t in o.rank_actions[0])
    assert all(t.index("RankReplace") < t.index("RankReady") for t in o.rank_actions[0] if "RankReady" in t)
    assert all("RankRebind" in t and t[-1] == "RankResume" for t in o.rank_actions[1])


def test_checked_in_corpus_is_valid_and_expected():
    files = sorted(SCENARIO_DIR.glob("*.json"))
    assert len(files) >= 20
    names = set()
    for p in files:
        sc = load_scenario(p)
        assert sc.name == p.stem
        names.add(sc.name)
    for must in ("2x2-fsdp1-repair", "2x2-fsdp1-inflight-forward", "2x2-fsdp1-inflight-backward", "2x2-fsdp1-reject-optimizer",
                 "2x2-fsdp1-guard-dirty-guard-r2", "2x2-fsdp1-guard-frontier-mismatch-r2", "2x2-fsdp1-successive-repairs",
                 "2x2-ddp-ten-repairs", "4x2-fsdp1-repair"):
        assert must in names


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.nightly("ten minutes of model search on a loaded 2-core machine")
def test_checked_in_corpus_equals_generated():
    """The corpus is what the model generates (python -m accelpact.conformance.generate --check).
    Every run checks the cheaper half of this: each checked-in scenario is one of the generator's
    candidates, written as the generator writes it (test_checked_in_corpus_is_the_generators_text)."""
    files = generate()
    existing = {p.stem: p.read_text() for p in SCENARIO_DIR.glob("*.json")}
    assert existing == files, "corpus out of date: run `python -m accelpact.conformance.generate`"


def test_checked_in_corpus_is_the_generators_text():
    """Each checked-in scenario is one of the generator's candidates, written as it writes them, but
    for ``expect`` (the model's outcome, which the nightly test_checked_in_corpus_equals_generated
    recomputes with the choice of one representative per cell and outcome class)."""
    from dataclasses import replace

    from accelpact.conformance.generate import candidates

    cands = {sc.name: sc for _cell, sc in candidates()}
    paths = sorted(SCENARIO_DIR.glob("*.json"))
    assert paths
    for path in paths:
        sc = load_scenario(path)
        assert path.stem in cands, f"{path.name} is no candidate of the generator: run `python -m accelpact.conformance.generate`"
        assert replace(cands[path.stem], expect=sc.expect).dumps() == path.read_text(), \
            f"{path.name} differs from the generator's text: run `python -m accelpact.conformance.generate`"


def test_cli_modules_do_not_import_torch():
    """The CLI dispatcher imports these at startup: torch must load only inside run()."""
    import subprocess
    import sys

    code = ("import sys\nimport accelpact.conformance.cli_run, accelpact.conformance.cli_check, "
            "accelpact.conformance.cli_qualify, accelpact.conformance.runner, accelpact.conformance.checker, "
            "accelpact.conformance.scenario, accelpact.conformance.mapping, accelpact.conformance.outcomes, "
            "accelpact.conformance.generate\n"
            "assert 'torch' not in sys.modules, 'torch imported at module level'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_in_flight_failure_is_observed_where_r_is_next_used():
    """A group broken in forward (HSDP: forward uses no collective on R) is noticed by backward's
    all-reduce: the script fires the failure where it struck, the model observes it where R is used."""
    from accelpact.model.protocol import Action
    from accelpact.model.transitions import enabled, step
    from accelpact.model.state import initial_state

    sc = scenario_from_mapping(mk(faults=[{"step": 5, "at": "forward", "kind": "collective_timeout", "ranks": [1, 3]}]))
    script, cfg = script_for(sc), model_config(sc)
    s = initial_state(cfg)
    assert script.allowed(s, Action("FaultGroupFail", None, "forward"), frozenset()) == 0
    assert script.allowed(s, Action("FaultGroupFail", None, "backward"), frozenset()) is None
    s = step(cfg, s, Action("FaultGroupFail", None, "forward"))
    assert enabled(cfg, s, Action("RankObserve", 1, "backward"))
    assert not enabled(cfg, s, Action("RankObserve", 1, "forward")) and not enabled(cfg, s, Action("RankObserve", 1, "boundary"))


def test_fsdp2_failure_during_the_optimizer_step_is_repaired():
    """Issue 9: R broken while FSDP2's optimizer step runs (which uses no collective on R) is met by
    the boundary probe after the commit: the model allows L1 only."""
    sc = scenario_from_mapping(mk(workload={**BASE["workload"], "wrapper": "fsdp2-hybrid"},
                                  faults=[{"step": 5, "at": "optimizer", "kind": "collective_timeout", "ranks": [1, 3]}]))
    assert model_outcomes(sc).outcome_class == "L1"


@pytest.mark.timeout(120)
def test_qualify_admits_l1_only_where_every_trial_conformed(tmp_path, monkeypatch):
    """C4 evidence: a boundary cell with a failed trial is L2-only; passing cells carry evidence."""
    import argparse

    from accelpact.conformance import cli_qualify, runner
    from accelpact.model.contract import load_envelope

    calls = []

    class Rep:
        def __init__(self, ok):
            self.conforms, self.problems = ok, ([] if ok else ["synthetic failure"])

    def fake(sc, **kw):
        calls.append(sc.name)
        # fsdp2's boundary cell fails its second trial
        return Rep(not (sc.name == "2x2-fsdp2-repair" and len(calls) % 2 == 0))

    monkeypatch.setattr(runner, "run_scenario", fake)
    out = tmp_path / "env.json"
    ns = argparse.Namespace(backend="gloo", trials=2, out=str(out), wrappers="fsdp1-hybrid,fsdp2-hybrid",
                            phases="boundary,forward", work=str(tmp_path / "w"))
    assert cli_qualify.run(ns) == 1
    env = {(e.key.profile, e.key.phase): e for e in load_envelope(out).entries}
    assert env[("fsdp1-hybrid", "boundary")].actions == ("L1", "L2")
    assert env[("fsdp2-hybrid", "boundary")].actions == ("L2",)
    assert env[("fsdp2-hybrid", "boundary")].evidence["passes"] == 1
    assert env[("fsdp1-hybrid", "forward")].actions == ("L1", "L2")  # a discard in place (P17)
    assert env[("fsdp1-hybrid", "boundary")].evidence["trials"] == 2
    assert "torch" in env[("fsdp1-hybrid", "boundary")].evidence["platform"]
