"""The hypothesis state machine (model/stateful.py) over worlds up to 4x4.

Safety S1-S7 as @invariant, S4.1 per rule, L2/L3 by the fault-free drain in teardown.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from accelpact.model.protocol import Action
from accelpact.model.transitions import step
from accelpact.model.contract import default_envelope, without_discard
from accelpact.model.state import PC_TRAIN, Config, initial_state
from accelpact.model.stateful import configs, drain, drain_bound, make_machine

# drawn worlds (1..4 nodes x 1..4 ranks, R replicate or world, 1..3 faults)
TestDrawnWorlds = make_machine().TestCase
TestDrawnWorlds = pytest.mark.timeout(600)(TestDrawnWorlds)

# the largest world, fixed
TestFourByFour = make_machine(Config(nodes=4, ranks_per_node=4, max_faults=3)).TestCase
TestFourByFour.settings = settings(settings.default, max_examples=15)
TestFourByFour = pytest.mark.timeout(600)(TestFourByFour)


@given(configs())
@settings(max_examples=30)
def test_drawn_configs_are_valid_worlds(cfg):
    assert 2 <= len(cfg.world) <= 16 and 1 <= len(cfg.affected) <= len(cfg.world)
    assert 1 <= cfg.max_faults <= 3


def test_drain_recovers_a_boundary_failure_in_bound():
    """L1: a boundary failure drained without faults ends with every rank training in generation 1."""
    cfg = Config(nodes=3, ranks_per_node=2, max_faults=1)
    s = step(cfg, initial_state(cfg), Action("FaultGroupFail", None, "boundary"))
    final, taken, err = drain(cfg, s)
    assert err is None, err
    assert all(rk.pc == PC_TRAIN and rk.gen == 1 for rk in final.ranks)
    assert 0 < len(taken) <= drain_bound(cfg)


def test_drain_discards_an_in_flight_step_and_resumes():
    """P17: a failure in forward (observed in backward) is discarded in place: every rank resumes in
    generation 1 at F, nothing replayed."""
    cfg = Config(max_faults=1)
    s = step(cfg, initial_state(cfg), Action("FaultGroupFail", None, "forward"))
    final, _taken, err = drain(cfg, s)
    assert err is None, err
    assert all(rk.pc == PC_TRAIN and rk.gen == 1 and rk.tau == cfg.frontier and rk.replayed == 0 for rk in final.ranks)
    assert {r for _g, r in final.discarded} == set(cfg.world)


def test_drain_restarts_after_an_in_flight_failure_without_discard():
    """L2: an in-flight failure where the envelope has no discard ends in a supervisor restart (replay F - C)."""
    cfg = Config(max_faults=1, envelope=without_discard(default_envelope(), "no rebuild"))
    s = step(cfg, initial_state(cfg), Action("FaultGroupFail", None, "forward"))
    final, _taken, err = drain(cfg, s)
    assert err is None and final.supervisor == "restarted"


def test_drain_reports_a_deadlock():
    """L3: under the linger mutant a crash leaves the survivor waiting; the drain must say so."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=2, mutant="linger")
    s = initial_state(cfg)
    for a in (Action("FaultGroupFail", None, "boundary"), Action("FaultCrash", 0)):
        s = step(cfg, s, a)
    _final, _taken, err = drain(cfg, s)
    assert err is not None and "no final state" in err
