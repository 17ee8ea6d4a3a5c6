"""Issue 42: the oracle states what each mechanism guarantees, L1 where it was due, and final states
without an unobserved failure; the manifest covers every fault point of each mechanism.

Spec ids (spec/properties.md): S19 `FenceStopsCommit` (the commit fence), S20 `ValidationMembership`
and S8 `ReplicasValidated` over every group history `failures` names (the validation collective), S21
`TransferOnRebuiltGroup` (the state transfer), L4 `L1WhereDue` (an L2 ending has a recorded cause), L5
`ProbeDetects` (the probe on R), L6 `FailureObserved` (the failure flag: no final state holds an unobserved
failure); S2.2 judged on every row the reference rank posted.  Each has a named mutant (model/mutants.py),
caught by exhaustive search on a fast manifest configuration here; the same mutants are caught on their
smallest configurations by BFS and, but for the three final-state ones, by hypothesis
(tests/test_model_mutants.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from accelpact.model.explore import MANIFEST_CONFIGS, _Search, explore
from accelpact.model.invariants import (
    EDGE_INVARIANTS,
    FINAL_INVARIANTS,
    INVARIANTS,
    agreed_frontier,
    failure_observed,
    l1_where_due,
    probe_detects,
)
from accelpact.model.mutants import MUTANTS
from accelpact.model.state import PC_RESTARTED, PC_TRAIN, Config, State, initial_state

#: property id -> (its named mutant, the fast manifest configuration whose exhaustive search catches it)
GUARANTEES: dict[str, tuple[str, str]] = {
    "S19": ("fence-skips-rank", "2x2-fence-f1"),
    "S8": ("validate-r-only", "2x2-f1"),
    "S20": ("validation-wrong-membership", "2x1-ddp-f1"),
    "S21": ("transfer-before-spare-rebuilt", "2x1-ddp-spare2-crash-f1"),
    "L4": ("spare-stale-view", "2x1-ddp-spare2-crash-f1"),
    "L5": ("probe-swallowed", "2x1-ddp-f1"),
    "L6": ("flag-ignores-link", "2x2-links-f1"),
}


def test_every_new_property_is_registered_once_with_its_mutant():
    ids = {i.id: i for i in INVARIANTS + EDGE_INVARIANTS + FINAL_INVARIANTS}
    assert {"S19", "S20", "S21", "L4", "L5", "L6"} <= set(ids)
    assert len(ids) == len(INVARIANTS + EDGE_INVARIANTS + FINAL_INVARIANTS), "an id registered twice"
    assert {i.id for i in FINAL_INVARIANTS} == {"L4", "L5", "L6"}
    for pid, (mutant, cfg_name) in GUARANTEES.items():
        assert pid in MUTANTS[mutant].expect, (pid, mutant)
        assert MANIFEST_CONFIGS[cfg_name][1], f"{cfg_name} must be a fast manifest configuration"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pid", list(GUARANTEES))
def test_named_mutant_is_caught_by_its_property_on_a_manifest_configuration(pid):
    """Exhaustive search of the pinned configuration with the mutant: the first violation reported is the
    property's own (BFS: the shortest counterexample breaks it), with a concrete path from the start."""
    mutant, cfg_name = GUARANTEES[pid]
    r = explore(MANIFEST_CONFIGS[cfg_name][0].with_(mutant=mutant))
    assert r.violations, f"{mutant} passes every property on {cfg_name}"
    first = r.violations[0]
    assert first.property == pid, f"{mutant} on {cfg_name}: first violated {first.property}: {first.message}"
    assert first.counterexample is not None and len(first.counterexample) >= 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cfg_name", sorted({c for _m, c in GUARANTEES.values()}))
def test_the_spec_satisfies_every_new_property_on_the_same_configurations(cfg_name):
    r = explore(MANIFEST_CONFIGS[cfg_name][0])
    assert r.ok and r.complete, [v.format() for v in r.violations]


# ---- judged from recorded facts: hand-built states -----------------------------------------------------

_CFG = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1)  # F = 3


def test_agreed_frontier_is_judged_on_every_row_the_reference_posted():
    """S2.2: a reference rank that posted two frontiers in g leaves no F to agree on, whichever of them the
    passing rank reported (the verdict used to be the first row a frozenset happened to yield)."""
    s = initial_state(_CFG)
    one = s.with_store(arrivals=frozenset({(0, 0, 3, 0), (0, 1, 3, 0)}))
    assert agreed_frontier(_CFG, replace(one, agreed=frozenset({(0, 1, 3)}))) is None
    assert "F=3" in agreed_frontier(_CFG, replace(one, agreed=frozenset({(0, 1, 4)})))
    two = s.with_store(arrivals=frozenset({(0, 0, 3, 0), (0, 0, 4, 0), (0, 1, 3, 0)}))
    for f in (3, 4):
        assert "[3, 4]" in agreed_frontier(_CFG, replace(two, agreed=frozenset({(0, 1, f)})))
    # the same rows, built in the other order, give the same verdict
    owt = s.with_store(arrivals=frozenset([(0, 1, 3, 0), (0, 0, 4, 0), (0, 0, 3, 0)]))
    for f in (3, 4):
        assert agreed_frontier(_CFG, replace(owt, agreed=frozenset({(0, 1, f)}))) == \
            agreed_frontier(_CFG, replace(two, agreed=frozenset({(0, 1, f)})))


def _restarted_after_mismatch(rows: set[tuple[int, int, int, int]]) -> State:
    s = initial_state(_CFG)
    s = s.with_store(arrivals=frozenset(rows), agree=((0, "abort:mismatch"),), abort="mismatch")
    return replace(s, supervisor="restarted", ranks=tuple(replace(rk, pc=PC_RESTARTED) for rk in s.ranks))


def test_l1_where_due_reads_the_cause_of_an_l2_ending_from_the_agreements_rows():
    """L4: an L2 by mismatch is explained by a rank ahead of F (it committed a step the others did not);
    a rank behind F (a stale view) is not; another abort reason or a lost store is a cause of its own."""
    ahead = _restarted_after_mismatch({(0, 0, 3, 0), (0, 1, 4, 0)})
    assert l1_where_due(_CFG, ahead) is None
    behind = _restarted_after_mismatch({(0, 0, 3, 0), (0, 1, 2, 0)})
    assert "(1, 2)" in l1_where_due(_CFG, behind) and "L1 was due" in l1_where_due(_CFG, behind)
    assert l1_where_due(_CFG, behind.with_store(abort="deadline")) is None
    assert l1_where_due(_CFG, behind.with_store(down=True)) is None
    assert l1_where_due(_CFG, replace(behind, supervisor="")) is None  # not an ending yet


def test_final_state_properties_find_an_unobserved_failure():
    """L5 and L6 on a state every rank trains in, the failure of generation 0 recorded and unobserved."""
    s = initial_state(_CFG)
    struck = replace(s.with_store(failed=(0, "boundary", frozenset({0}))), failures=frozenset({(0, 0)}))
    assert "probe on R never reported" in probe_detects(_CFG, struck)
    assert "nobody observed it" in failure_observed(_CFG, struck)
    resumed = replace(struck, ranks=tuple(replace(rk, pc=PC_TRAIN, gen=1) for rk in struck.ranks))
    assert probe_detects(_CFG, resumed) is None and failure_observed(_CFG, resumed) is None
    aborted = struck.with_store(abort="deadline")  # not at rest: L2 is judged by L4 and L2
    assert probe_detects(_CFG, aborted) is None and failure_observed(_CFG, aborted) is None


# ---- the manifest covers every fault point of each mechanism ------------------------------------------

def _failed(s: State) -> tuple[int, str, frozenset[int]] | None:
    return s.store.failed


def _fence_at(point: str):
    def fact(cfg: Config, s: State) -> bool:  # struck there on R's kind; the step discarded in place
        f = _failed(s)
        return cfg.fence and f is not None and f[1] == point and bool(f[2]) and any(g == f[0] for g, _r in s.discarded)
    return fact


def _probe_at(point: str):
    def fact(cfg: Config, s: State) -> bool:  # a member of the failed group observed it at its boundary probe
        f = _failed(s)
        return (f is not None and f[1] == point and not s.store.dead
                and any(rk.seen == "boundary" and rk.gen == f[0] and cfg.group_of(r) in f[2] for r, rk in enumerate(s.ranks)))
    return fact


def _flag_over_w(cfg: Config, s: State) -> bool:  # a cut no group of R's kind crosses, met by the flag
    f = _failed(s)
    return f is not None and not f[2] and f[0] in s.store.wide_revoked


def _partial_flag(cfg: Config, s: State) -> bool:  # P16.0: a death during the flag, a survivor already in backward
    f = _failed(s)
    return (f is not None and f[1] == "boundary" and any(g == f[0] for g, _d in s.store.dead)
            and any(rk.gen == f[0] and rk.seen in ("forward", "backward") for rk in s.ranks))


def _validated_after(point: str):
    def fact(cfg: Config, s: State) -> bool:
        f = _failed(s)
        return f is not None and f[1] == point and any(g == f[0] for g, _gi, _eq in s.validated)
    return fact


def _validated_beyond_record(cfg: Config, s: State) -> bool:  # a group rebuilt though not in the store's record
    f = _failed(s)
    return f is not None and any(g == f[0] and gi not in f[2] for g, gi, _eq in s.validated)


def _transfer_at(point: str):
    def fact(cfg: Config, s: State) -> bool:
        f = _failed(s)
        return f is not None and f[1] == point and any(g == f[0] and ok for g, _d, ok in s.transfers)
    return fact


def _transfer_after_partial_flag(cfg: Config, s: State) -> bool:
    return _partial_flag(cfg, s) and _transfer_at("boundary")(cfg, s)


#: (mechanism, fault point) -> (manifest configuration, the recorded fact a reachable state of it shows)
COVERAGE = {
    ("fence", "forward"): ("2x2-fence-f1", _fence_at("forward")),
    ("fence", "backward"): ("2x2-fence-f1", _fence_at("backward")),
    ("probe", "boundary"): ("2x1-ddp-f1", _probe_at("boundary")),
    ("probe", "backward, past a partial collective"): ("2x2-f1", _probe_at("backward")),
    ("flag", "boundary, a cut over W only"): ("2x2-links-f1", _flag_over_w),
    ("flag", "boundary, a death during the flag (P16.0)"): ("2x1-ddp-spare1-crash-f1", _partial_flag),
    ("flag", "boundary, a death during the flag, a second spare left"): ("2x1-ddp-spare2-crash-bb-f1", _partial_flag),
    ("flag", "boundary, a death during the flag, no replica"): ("1x2-spare1-bb-f1", _partial_flag),
    ("flag", "boundary, a death during the flag, a shrink"): ("2x2-shrink-crash-bb-f1", _partial_flag),
    ("validation", "boundary"): ("2x1-ddp-f1", _validated_after("boundary")),
    ("validation", "forward, every group rebuilt"): ("2x2-f1", _validated_beyond_record),
    ("validation", "a death"): ("2x1-ddp-spare1-crash-f1", _validated_after("backward")),
    ("transfer", "forward"): ("2x1-ddp-spare1-crash-f1", _transfer_at("forward")),
    ("transfer", "backward"): ("2x1-ddp-spare1-crash-f1", _transfer_at("backward")),
    ("transfer", "boundary"): ("2x1-ddp-spare1-crash-f1", _transfer_at("boundary")),
    ("transfer", "boundary, after a partial flag (P16.0)"): ("2x1-ddp-spare1-crash-f1", _transfer_after_partial_flag),
}

#: the fault points of each mechanism, from the spec (protocol.md P0, P16.0, P16.3, P17.2, P18.4)
MECHANISM_POINTS = {
    "fence": {"forward", "backward"},
    "probe": {"boundary", "backward"},
    "flag": {"boundary"},
    "validation": {"boundary", "forward", "death"},
    "transfer": {"forward", "backward", "boundary"},
}


def test_coverage_names_every_fault_point_of_each_mechanism_on_a_manifest_configuration():
    for mech, points in MECHANISM_POINTS.items():
        named = {p.split(",")[0].replace("a death", "death") for m, p in COVERAGE if m == mech}
        assert points <= named, f"{mech}: fault points {sorted(points - named)} have no manifest configuration"
    assert all(name in MANIFEST_CONFIGS for name, _fact in COVERAGE.values())


_SLOW = {name for name, _fact in COVERAGE.values() if not MANIFEST_CONFIGS[name][1]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.nightly("a slow manifest configuration (about a minute)"))
                                  if n in _SLOW else n for n in sorted({n for n, _f in COVERAGE.values()})])
def test_each_manifest_configuration_reaches_the_fault_points_it_covers(name):
    """A reachable state of the configuration shows the recorded fact of each (mechanism, point) it covers:
    the point is instantiated by its actions, not only named."""
    cfg = MANIFEST_CONFIGS[name][0]
    search = _Search(cfg, True)
    assert not search.run(stop=True)
    wanted = {key: fact for key, (n, fact) in COVERAGE.items() if n == name}
    missing = [key for key, fact in wanted.items() if not any(fact(cfg, s) for s in search.states)]
    assert not missing, f"{name} never reaches {missing}"


def test_a_configuration_with_deaths_at_the_boundary_only_never_reaches_the_partial_flag():
    """Why the ``-bb-`` and ``-crash-f1`` entries exist: restricted to deaths at the boundary, a search never
    instantiates ``RankObserve(r, backward)``, so the partial boundary flag (P16.0) is never explored."""
    name = "2x1-ddp-spare2-crash-f1"
    cfg = MANIFEST_CONFIGS[name][0]
    search = _Search(cfg, True)
    assert not search.run(stop=True)
    assert not any(_partial_flag(cfg, s) for s in search.states)
    assert any(_partial_flag(MANIFEST_CONFIGS["2x1-ddp-spare2-crash-bb-f1"][0], s)
               for s in _searched("2x1-ddp-spare2-crash-bb-f1"))


def _searched(name: str) -> list[State]:
    search = _Search(MANIFEST_CONFIGS[name][0], True)
    assert not search.run(stop=True)
    return list(search.states)
