"""The episode driver and the effects' decisions, in one process against fakes (no rank is spawned).

What is expected comes from the model's tables (``impl/episode.py`` holds them against the model in
``tests/test_engine_table.py``) and from the protocol's rules (spec/protocol.md P18.3, P18.4), not
from the code under test: the fakes record what the driver did, in order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types

import pytest

from accelpact.impl.effects import Effects
from accelpact.impl.episode import Done, Episode, Exited, Step, drive


class _Engine:
    """What ``drive`` needs of an engine; every call is logged."""

    def __init__(self, effects: dict) -> None:
        self.log: list = []
        self.hooks = types.SimpleNamespace(written=lambda: self.log.append("written"))
        for name, fn in effects.items():
            setattr(self, name, fn)

    def _at(self, point):
        self.log.append(("point", point))

    @contextlib.contextmanager
    def _hold(self):
        self.log.append("hold")
        try:
            yield
        finally:
            self.log.append("release")

    def _record(self, action, enters, done):
        self.log.append(("record", action, enters, done.outcome))

    def _exit_on_abort(self, reason):
        self.log.append(("exit", reason))
        raise Exited

    def _fail(self, exc):
        self.log.append(("fail", type(exc).__name__))
        raise Exited


def _ep(member=True):
    return Episode(0, member, (0,), 0, 0, None)


def test_a_held_steps_effect_written_and_record_are_inside_one_hold():
    eng = _Engine({"_a": lambda ep: Done({"x": 1}), "_b": lambda ep: None})
    drive(eng, _ep(), (Step("agree", "RankArrive", "_a", "arrived", held=True), Step(None, "RankDecideAgreement", "_b", None, held=True)))
    assert eng.log == [("point", "agree"), "hold", "written", ("record", "RankArrive", "arrived", "ok"), "release",
                       "hold", "release"]  # a step not performed writes no record


def test_members_steps_are_skipped_outside_the_failed_groups_but_their_point_still_runs():
    eng = _Engine({"_r": lambda ep: Done()})
    drive(eng, _ep(member=False), (Step("rebind", "RankRebind", "_r", "rebound", members=True),))
    assert eng.log == [("point", "rebind")]


def test_an_abort_decision_is_recorded_then_the_rank_exits_on_it():
    eng = _Engine({"_d": lambda ep: Done({"decision": "abort:mismatch"}, outcome="fail", exit="mismatch")})
    with pytest.raises(Exited):
        drive(eng, _ep(), (Step(None, "RankDecideAgreement", "_d", None, held=True),))
    assert eng.log == ["hold", "written", ("record", "RankDecideAgreement", None, "fail"), ("exit", "mismatch"), "release"]


def test_any_exception_of_an_effect_is_the_fail_stop_exit_and_raising_mode_propagates_it():
    def boom(ep):
        raise RuntimeError("peer gone")

    eng = _Engine({"_x": boom, "_y": lambda ep: Done()})
    steps = (Step("replace", "RankReplace", "_x", "replaced"), Step(None, "RankRebind", "_y", "rebound"))
    with pytest.raises(Exited):
        drive(eng, _ep(), steps)
    assert eng.log == [("point", "replace"), ("fail", "RuntimeError")]  # nothing after the failed step
    with pytest.raises(RuntimeError, match="peer gone"):
        drive(_Engine({"_x": boom}), _ep(), steps[:1], raising=True)


def test_each_phase_is_timed_once():
    ep = _ep()
    drive(_Engine({"_a": lambda ep: Done()}), ep, (Step("guard", "RankGuard", "_a", "guarded"), Step("agree", "RankArrive", "_a", "arrived"),
                                                   Step(None, "RankAwaitAgreement", "_a", "agreed")))
    assert set(ep.durations) == {"guard", "agree"}


def _control(world, revoked=()):
    return types.SimpleNamespace(world_size=world, last_expired=False,
                                 await_agreement=lambda g, until: "commit", decided_by=lambda *a: True,
                                 revoked=lambda g, key: key in revoked)


def _await_as(groups, control):
    eng = types.SimpleNamespace(deadline_s=5.0, groups=groups, control=control)
    ep = Episode(0, False, None, 0, 0, None)
    Effects._await_agreement(eng, ep)
    return ep


def test_after_a_wide_failure_r_over_all_of_w_failed_with_it():
    """P18.3/P18.4: the flag or a save failed (a link cut); DDP's R is a group over all of W, which the
    cut breaks whether or not a collective on it crossed the link yet."""
    ddp = types.SimpleNamespace(name="world", key="world", count=1, index=0, members=(0, 1, 2, 3))
    ep = _await_as(ddp, _control(4))
    assert ep.failed == (0,) and ep.member


def test_after_a_wide_failure_a_replicate_group_failed_only_where_its_revoke_stands():
    hsdp = types.SimpleNamespace(name="replicate", key="replicate1", count=2, index=1, members=(1, 3))
    ep = _await_as(hsdp, _control(4, revoked={"replicate0"}))
    assert ep.failed == (0,) and not ep.member
    ep = _await_as(hsdp, _control(4, revoked={"replicate1"}))
    assert ep.failed == (1,) and ep.member


def test_an_observation_is_recorded_once_per_generation():
    log = []
    eng = types.SimpleNamespace(gen=3, _observed_gen=-1, frontier=5, tau=5, _hold=contextlib.nullcontext,
                                _record=lambda action, enters, done: log.append((action, enters, done.detail["cause"])))
    Effects._observe(eng, "boundary", None, cause="boundary")
    Effects._observe(eng, "boundary", RuntimeError("x"), cause="flag")
    eng.gen = 4
    Effects._observe(eng, "backward", RuntimeError("y"), cause="discard")
    assert log == [("RankObserve", "observed", "boundary"), ("RankObserve", "observed", "discard")]


def test_a_repair_rebuilds_the_groups_over_w_only_where_their_failure_was_learned():
    """P18.3 (issue 40): which groups over W failed is read from generation g's revoke log after the
    agreement (the wide revoke, published by a rank whose flag, save or fence failed), never assumed:
    a repair of a replicate group keeps them; a repair after a wide failure rebuilds them."""
    @dataclasses.dataclass(frozen=True)
    class _Groups:  # the fields of PactGroups the repair reads and replaces
        name: str = "replicate"
        key: str = "replicate1"
        count: int = 2
        index: int = 1
        members: tuple = (1, 3)
        control: str = "old-control"
        others: dict = dataclasses.field(default_factory=dict)

    hsdp = _Groups()
    built = []

    def replace(revoked):
        ep = _await_as(hsdp, _control(4, revoked=revoked))
        eng = types.SimpleNamespace(wide=lambda g: built.append(g) or (["default", "control", "checkpoint"], "new-control", {}),
                                    groups=hsdp, _pg=None, rank=1, control=types.SimpleNamespace(store=None),
                                    deadline_s=5.0, strategy=types.SimpleNamespace(replace=lambda *a, **k: types.SimpleNamespace(group_name="accelpact/g1/replicate1")),
                                    _new_members=lambda ep: ((1, 3), "replicate1"))
        return Effects._replace(eng, ep)

    done = replace({"replicate1"})
    assert built == [] and done.detail["wide"] is False and "wide" not in done.state
    assert done.detail["groups"] == ["replicate1"]
    done = replace({"replicate1", "wide"})
    assert built == [1] and done.detail["wide"] is True and done.state["wide"] == 1
    assert done.detail["groups"] == ["replicate1", "default", "control", "checkpoint"]
