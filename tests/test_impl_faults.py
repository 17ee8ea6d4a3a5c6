"""Fault plans and the boundary guard (single process).

Spec ids: F1 (faults named by point and kind, each recorded before it takes effect, outcome
``info``), P2/C3 (the guard's record, not an error string, gives the failure phase; a dirty
boundary fails the guard).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from accelpact.model.faults import FAULT_ACTION  # noqa: E402 - after the importorskip of torch
from accelpact.testing.faults import FaultContext, FaultPlan, InjectedFault  # noqa: E402 - after the importorskip of torch
from accelpact.impl.guard import BoundaryGuard  # noqa: E402 - after the importorskip of torch
from accelpact.impl.trace import Trace  # noqa: E402 - after the importorskip of torch
from accelpact.model.protocol import ACTIONS  # noqa: E402 - after the importorskip of torch


def model_and_opt():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def test_fault_actions_are_model_actions():
    assert set(FAULT_ACTION.values()) <= set(ACTIONS)


def test_one_fault_vocabulary_table():
    """Issue 23: ``MODEL_KIND`` is the one translation of implementation kinds into the model's; every
    kind on each side is in it, and it agrees with each kind's model action."""
    from accelpact.model.faults import KINDS, MODEL_KIND, MODEL_ONLY_KINDS, model_kinds
    from accelpact.model.protocol import FAULT_KINDS as MODEL_FAULT_KINDS

    assert set(MODEL_KIND) == set(KINDS)
    assert set(MODEL_KIND.values()) | MODEL_ONLY_KINDS == set(MODEL_FAULT_KINDS)
    assert not set(MODEL_KIND.values()) & MODEL_ONLY_KINDS
    assert {k: ACTIONS[KINDS[k].action].fault_kind for k in KINDS} == MODEL_KIND
    assert model_kinds(["collective_timeout", "exception", "corrupt_state"]) == {"group_fail", "raise", "corrupt"}
    with pytest.raises(Exception, match="meteor"):
        model_kinds(["meteor"])


def test_every_vocabulary_of_fault_kinds_is_derived_from_the_one_table():
    """Issue 39: the model's kinds, the scenario kinds and their translation, and the soak's kinds are
    derived from model/faults.py ``FAULTS`` (the soak's ``cut_group`` is the scenario's
    ``collective_timeout`` is the model's ``group_fail``); every kind a fault names has an effect."""
    from accelpact.model import faults as F
    from accelpact.model import protocol
    from accelpact.testing import faults as injector
    from accelpact.testing.soak import schedule

    assert protocol.FAULT_KINDS is F.MODEL_KINDS
    assert schedule.SOAK_KINDS is F.SOAK_KINDS
    assert len({k.name for k in F.FAULTS}) == len(F.FAULTS), "a kind's name appears twice in the table"
    for k in F.FAULTS:
        if k.action is not None:
            assert ACTIONS[k.action].fault_kind == k.model, (k.name, k.action, k.model)
        assert (k.action is None) == (k.model is None), k.name
        assert set(k.points) <= set(F.FAULT_POINTS), k.name
    assert all(k.model is not None and k.action is not None for k in F.KINDS.values())
    assert set(injector.EFFECTS) == set(F.KINDS), "each kind a scenario may name takes effect in accelpact/testing/faults.py"
    assert F.SOAK_KIND["cut_group"] is F.KINDS["collective_timeout"] and F.MODEL_KIND["collective_timeout"] == "group_fail"
    assert F.SOAK_KIND["cut_link"] is F.KINDS["link_cut"] and F.MODEL_KIND["link_cut"] == "link"
    assert F.MODEL_KINDS == tuple(dict.fromkeys(k.model for k in F.FAULTS if k.model))
    assert set(schedule.SoakConfig().kinds) == set(F.SOAK_KINDS)


@pytest.mark.parametrize("bad,msg", [
    ({"step": 1, "at": "lunch", "kind": "crash"}, r"faults\[0\]\.at: 'lunch' is not one of"),
    ({"step": 1, "at": "agree", "kind": "meteor"}, r"faults\[0\]\.kind: 'meteor' is not one of"),
    ({"step": "1", "at": "agree", "kind": "crash"}, r"faults\[0\]\.step: must be an integer"),
    ({"step": 1, "at": "agree", "kind": "crash", "rank": 1}, "unknown field"),
    ({"step": 1, "at": "agree", "kind": "crash", "ranks": "1"}, r"faults\[0\]\.ranks: must be a list"),
])
def test_fault_plan_rejects_malformed(bad, msg):
    with pytest.raises(ValueError, match=msg):
        FaultPlan.from_list([bad])


def test_fault_fires_once_at_its_point_step_and_ranks():
    plan = FaultPlan.from_list([{"step": 2, "at": "agree", "kind": "frontier_mismatch", "ranks": [1]}])
    assert plan.at("agree", 2, 0) == []
    assert plan.at("agree", 1, 1) == []
    assert plan.at("guard", 2, 1) == []
    hit = plan.at("agree", 2, 1)
    assert len(hit) == 1 and hit[0].kind == "frontier_mismatch"
    assert plan.at("agree", 2, 1) == []
    with pytest.raises(ValueError, match="unknown fault point"):
        plan.at("nowhere", 2, 1)


def _ctx(tmp_path, **kw):
    tr = Trace(tmp_path / "f.ndjson", 1, {})
    base = dict(trace=tr, rank=1, gen=3, state={"pc": "guarded", "frontier": 5, "tau": 5}, groups={})
    base.update(kw)
    return FaultContext(**base), tmp_path / "f.ndjson"


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()][1:]


def test_exception_fault_is_recorded_before_it_raises(tmp_path):
    plan = FaultPlan.from_list([{"step": 0, "at": "rebind", "kind": "exception"}])
    ctx, path = _ctx(tmp_path)
    with pytest.raises(InjectedFault, match="rebind"):
        plan.apply(plan.at("rebind", 0, 1)[0], ctx)
    (rec,) = _records(path)
    assert (rec["action"], rec["outcome"], rec["gen"], rec["detail"]["point"]) == ("FaultRaise", "info", 3, "rebind")


def test_frontier_mismatch_reports_f_plus_one(tmp_path):
    """The fault acts on the rank's own counters (its guard commits one step more); it hands the
    engine nothing to apply."""
    m, opt = model_and_opt()
    guard = BoundaryGuard(m, opt, frontier=5)
    plan = FaultPlan.from_list([{"step": 0, "at": "agree", "kind": "frontier_mismatch"}])
    ctx, path = _ctx(tmp_path, guard=guard)
    assert plan.apply(plan.at("agree", 0, 1)[0], ctx) is None
    assert (guard.frontier, guard.tau) == (6, 6)
    (rec,) = _records(path)
    assert rec["action"] == "FaultMismatch" and rec["state"]["frontier"] == 6 and rec["state"]["tau"] == 6


def test_no_fault_kind_hands_the_engine_an_effect():
    """Issue 10: the engine never learns that a fault was scheduled: no effect returns anything, the
    injector's hook returns nothing, and the engine's source never names the injector's classes."""
    import inspect

    from accelpact.testing import faults
    from accelpact.impl import hooks, recovery

    for name, effect in faults.EFFECTS.items():
        assert inspect.signature(effect).return_annotation in (None, "None"), name
    assert inspect.signature(hooks.Hooks.point).return_annotation in (None, "None")
    src = inspect.getsource(recovery)
    for name in ("InjectedFault", "FaultPlan", "FaultInjector", "group_failed", "frontier_delta"):
        assert name not in src, f"impl/recovery.py names {name}: the engine must not know about injected faults"


def test_collective_timeout_needs_a_known_group(tmp_path):
    plan = FaultPlan.from_list([{"step": 0, "at": "boundary", "kind": "collective_timeout", "group": "shard"}])
    ctx, _ = _ctx(tmp_path, groups={"replicate": None})
    with pytest.raises(ValueError, match="no group named 'shard'"):
        plan.apply(plan.at("boundary", 0, 1)[0], ctx)


def test_guard_tracks_points_and_commits():
    """The guard's record is the failure phase: forward, backward, optimizer; commit -> boundary."""
    m, opt = model_and_opt()
    seen = []
    g = BoundaryGuard(m, opt, frontier=5, on_point=seen.append)
    assert (g.point, g.tau, g.frontier) == ("boundary", 5, 5)
    loss = m(torch.randn(3, 4)).sum()
    assert g.point == "backward"
    assert not g.check().ok  # mid-step
    loss.backward()
    opt.step()
    assert seen == ["forward", "backward", "optimizer"]
    assert (g.point, g.tau, g.frontier) == ("boundary", 6, 6)
    rep = g.check()
    assert not rep.ok and "hold .grad" in rep.reasons[0]  # grads not cleared yet
    opt.zero_grad(set_to_none=True)
    assert g.check().ok
    g.remove()
    m(torch.randn(3, 4))
    assert g.point == "boundary"  # hooks removed


def test_dirty_guard_fault_fails_the_guard(tmp_path):
    m, opt = model_and_opt()
    g = BoundaryGuard(m, opt)
    plan = FaultPlan.from_list([{"step": 0, "at": "guard", "kind": "dirty_guard"}])
    ctx, path = _ctx(tmp_path, guard=g, module=m)
    assert g.check().ok
    plan.apply(plan.at("guard", 0, 1)[0], ctx)
    rep = g.check()
    assert not rep.ok
    assert any("hold .grad" in r for r in rep.reasons) and any("marked busy" in r for r in rep.reasons)
    assert _records(path)[0]["action"] == "FaultDirtyGuard"
