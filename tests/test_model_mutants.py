"""Every deliberately broken protocol (model/mutants.py) must be caught by BOTH drivers.

BFS on the smallest configuration that exposes the mutant (<= 2x2, <= 3 faults) must report a
counterexample violating one of ``Mutant.expect`` (deadlock/L2 for linger), and the hypothesis
state machine (ci profile) must fail on the same configuration.  The correct protocol passes
both on the same configurations.  Spec ids: S1 (early-release), S2.2/S2.3 (skip-agreement),
S2.3 (no-fence), S5 (partial-rebind), S3 (admit-inflight, ignore-guard), S1 (timeout-leaves-decision-open),
S2.1 (overwrite-decision), S8 (skip-validation), S2.2 (no-frontier-check), S4.2 (stale-release),
S6 (reload-on-resume), S10 (no-identity-fence, fence-reads-next-generation), S13 (claim-keeps-pool, double-claim), S14 (report-published-frontier), S15 (replace-r-only), S16 (rebuild-everything), S17 (fixed-share),
S18 (shrink-last-replica), S13 (refill-double-count), L2/L3 (linger,
no-step-deadline, wait-on-lost-store).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from accelpact.model.explore import MANIFEST_CONFIGS, explore
from accelpact.model.invariants import SAFETY_PROPERTIES
from accelpact.model.mutants import MUTANTS, get, table
from accelpact.model.protocol import ACTIONS
from accelpact.model.state import Config
from accelpact.model.stateful import make_machine

_DDP2 = dict(nodes=2, ranks_per_node=1, affected_local=0)

_BOUNDARY = ("boundary",)


def _with(*kinds: str) -> dict:
    return dict(faults=frozenset({"group_fail", *kinds}), points=_BOUNDARY)


#: the smallest configuration exposing each mutant (found by search; all <= 2x2, <= 3 faults)
SMALLEST: dict[str, Config] = {
    "early-release": Config(**_DDP2, max_faults=1),
    "skip-agreement": Config(**_DDP2, max_faults=1),
    "no-fence": Config(**_DDP2, max_faults=2, **_with()),
    "partial-rebind": Config(**_DDP2, max_faults=1),
    "admit-inflight": Config(**_DDP2, max_faults=1, points=("forward",)),
    "ignore-guard": Config(**_DDP2, max_faults=2, **_with("dirty_guard")),
    "timeout-leaves-decision-open": Config(**_DDP2, max_faults=2, **_with("delay")),
    "overwrite-decision": Config(**_DDP2, max_faults=2, **_with("hang")),
    "skip-validation": Config(**_DDP2, max_faults=2, **_with("corrupt")),
    "no-frontier-check": Config(**_DDP2, max_faults=2, **_with("mismatch")),
    "stale-release": Config(**_DDP2, max_faults=2, **_with()),
    "reload-on-resume": Config(**_DDP2, max_faults=1),
    "linger": Config(**_DDP2, max_faults=2, faults=frozenset({"group_fail", "crash"})),
    "wait-on-lost-store": Config(**_DDP2, max_faults=2, **_with("store_loss")),
    # every rank hung needs a group failure plus one hang per rank: 3 faults on 2 ranks
    "no-step-deadline": Config(nodes=1, ranks_per_node=2, affected_local=1, max_faults=3,
                               faults=frozenset({"group_fail", "hang"})),
}

# Hot swap (issue 13, spec/protocol.md P16): one crash in training and one spare.  S9
# (transfer-from-stale-replica), S10 (no-identity-fence), S11 (keep-partial-grads, discard-keeps-cursor),
# S12 (swap-without-replica: 1x2, whose replicate groups have one rank each, so a dead rank has no replica).
_CRASH = dict(max_faults=1, spares=1, faults=frozenset({"crash"}))
SMALLEST.update({
    "transfer-from-stale-replica": Config(**_DDP2, **_CRASH, points=("backward",)),
    "no-identity-fence": Config(**_DDP2, **_CRASH, points=_BOUNDARY),
    "keep-partial-grads": Config(**_DDP2, **_CRASH, points=("backward",)),
    "discard-keeps-cursor": Config(**_DDP2, **_CRASH, points=("forward",)),
    "swap-without-replica": Config(nodes=1, ranks_per_node=2, affected_local=1, **_CRASH, points=_BOUNDARY),
})

# Issue 24: a helper the protocol calls replaced (the oracle shares none), a history fact written wrong.
SMALLEST.update({
    "weak-replicas-agree": Config(**_DDP2, max_faults=2, **_with("corrupt")),
    "shrunk-member": Config(**_DDP2, max_faults=1),
    "resume-skips-batch": Config(**_DDP2, max_faults=1),
    "transfer-fact-always-replica": Config(nodes=1, ranks_per_node=2, affected_local=1, **_CRASH, points=_BOUNDARY),
    # S13: one holder per identity and incarnation, the spare pool conserved (double-claim: a second
    # spare must be left for the second claim)
    "fence-reads-next-generation": Config(**_DDP2, **_CRASH, points=_BOUNDARY),
    "claim-keeps-pool": Config(**_DDP2, **_CRASH, points=_BOUNDARY),
    "double-claim": Config(**_DDP2, **{**_CRASH, "spares": 2}, points=_BOUNDARY),
})

# Issue 27 (P17): in-flight discard.  S14 needs two replicate groups, one whose members discard and
# one whose members committed the step (with one group, phase 6's digests already stop the release).
SMALLEST.update({
    "report-published-frontier": Config(nodes=2, ranks_per_node=2, affected_local=0, max_faults=1,
                                        points=("backward", "boundary")),
})

# Issue 25 (P18): a link failure breaks the groups over all of W; DDP 2x1 has one pair of nodes.
SMALLEST.update({
    "replace-r-only": Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1, failing="any",
                             links=True, faults=frozenset({"link"})),
})

# Issue 40 (P18.3): an episode rebuilds what failed; a plain repair of R rebuilds no group over W.
SMALLEST.update({
    "rebuild-everything": Config(**_DDP2, max_faults=1),
})

# Issue 41 (P19): shrink, grow, refill.  S17 (fixed-share: one death, DDP 2x1, the replica left keeps its
# half of the step), S18 (shrink-last-replica: 2x2, one death in each replica), S13 (refill-double-count).
_SHRINK = dict(shrink=True, faults=frozenset({"crash"}), points=_BOUNDARY)
SMALLEST.update({
    "fixed-share": Config(**_DDP2, group="world", max_faults=1, **_SHRINK),
    "shrink-last-replica": Config(max_faults=2, **_SHRINK),
    "refill-double-count": Config(**_DDP2, group="world", max_faults=1, refill=True, **_SHRINK),
})

# Issue 42: each mechanism's guarantee and L1 where it was due (tests/test_model_guarantees.py).  L1
# where due, the probe's and the flag's are properties of final states (L4-L6), judged on the search's sinks.
SMALLEST.update({
    "fence-skips-rank": Config(**_DDP2, group="world", max_faults=1, fence=True, faults=frozenset({"group_fail"}),
                               points=("backward",)),
    "spare-stale-view": Config(**_DDP2, **_CRASH, points=_BOUNDARY),
    "validate-r-only": Config(max_faults=1, faults=frozenset({"group_fail"}), points=("backward",)),
    "validation-wrong-membership": Config(**_DDP2, max_faults=1),
    "transfer-before-spare-rebuilt": Config(**_DDP2, **_CRASH, points=_BOUNDARY),
    "probe-swallowed": Config(**_DDP2, max_faults=1),
    "flag-ignores-link": Config(max_faults=1, failing="any", links=True, faults=frozenset({"link"}), points=_BOUNDARY),
})

#: Mutants caught only at a final state (a sink of the search, L4-L6): the hypothesis machine checks
#: state and edge properties and, at its end, the final-state rule, not the final states' properties.
FINAL_STATE_ONLY = ("spare-stale-view", "probe-swallowed", "flag-ignores-link")


def _hypothesis_settings(**more) -> settings:
    # the loaded profile (ci by default), without shrinking: we only need "found", and
    # shrinking a state machine costs far more than finding the bug
    return settings(settings.default, phases=(Phase.explicit, Phase.reuse, Phase.generate), **more)


#: Hunting a mutant stops at the first failure; the deepest ones (a delay after a vote, a hang
#: after the agreement) need a few hundred runs of the swarm machine (model/stateful.py).  Measured:
#: ``timeout-leaves-decision-open`` is found after 200-300 runs in a fresh process, and needed more
#: than 500 in a pytest process that had run tests/test_impl_controlplane.py first (the same
#: derandomized profile); 2000 leaves a margin and costs nothing where the mutant is found early.
HUNT_EXAMPLES = 2000


def test_every_mutant_has_a_configuration():
    assert set(SMALLEST) == set(MUTANTS)
    with pytest.raises(ValueError, match="choose one of: early-release"):
        get("nope")


def test_every_safety_property_is_broken_by_a_named_mutant():
    """No property holds by construction: for each S property some mutant's shortest counterexample
    violates exactly it (BFS stops at the first violation, so this is the property it breaks first)."""
    broken: dict[str, list[str]] = {}
    for name, cfg in SMALLEST.items():
        for prop in explore(cfg.with_(mutant=name)).violated():
            broken.setdefault(prop, []).append(name)
    missing = [p for p in SAFETY_PROPERTIES if p not in broken]
    assert not missing, f"safety properties no mutant breaks: {missing} (broken: {broken})"


def test_mutants_replace_actions_and_leave_the_spec_alone():
    """A mutant is a table of replaced actions: the spec's table is untouched, and the mutant's
    table differs from it exactly in the actions the mutant names."""
    for name, m in MUTANTS.items():
        t = table(name)
        assert set(t) == set(ACTIONS)
        changed = {a for a in ACTIONS if t[a] is not ACTIONS[a]}
        assert changed and changed <= set(m.replace), (name, changed)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(MUTANTS))
def test_bfs_catches_mutant(name):
    cfg = SMALLEST[name].with_(mutant=name)
    assert cfg.nodes * cfg.ranks_per_node <= 4 and cfg.max_faults <= 3
    r = explore(cfg)
    expect = set(MUTANTS[name].expect)
    caught = r.violated() & expect
    assert caught, f"mutant {name!r} NOT caught by BFS: violated {sorted(r.violated())}, expected one of {sorted(expect)}"
    v = next(v for v in r.violations if v.property in caught)
    assert v.counterexample is not None and len(v.counterexample) >= 1
    assert v.counterexample.states[0] == r.counterexample.states[0]


#: Issue 24: the fast manifest configuration (model/manifest.json, ``MANIFEST_CONFIGS``) on which
#: exhaustive search catches each mutant: the pinned configurations themselves have the teeth, not
#: only the hand-picked smallest ones above.  Found by trying every fast configuration in turn; a
#: mutant none of them caught got a configuration of its own (1x2-spare1-f1: a dead rank without a
#: replica; 1x2-hang-f3: every rank hung; 2x1-ddp-spare2-crash-f1: a second spare left).
CAUGHT_ON_MANIFEST: dict[str, str] = {
    "early-release": "2x1-ddp-f1", "skip-agreement": "2x1-ddp-f1", "no-fence": "2x1-ddp-spare1-f2",
    "partial-rebind": "2x1-ddp-f1", "admit-inflight": "2x1-ddp-f1", "ignore-guard": "2x1-ddp-f2",
    "timeout-leaves-decision-open": "2x1-ddp-f2", "overwrite-decision": "2x1-ddp-f2", "skip-validation": "2x1-ddp-f2",
    "no-frontier-check": "2x1-ddp-f2", "stale-release": "2x1-ddp-f2", "reload-on-resume": "2x1-ddp-f1",
    "linger": "2x1-ddp-f1", "wait-on-lost-store": "2x1-ddp-f2", "no-step-deadline": "1x2-hang-f3",
    "transfer-from-stale-replica": "2x1-ddp-spare1-f2", "no-identity-fence": "2x1-ddp-spare1-f2",
    "keep-partial-grads": "2x1-ddp-spare1-f2", "discard-keeps-cursor": "2x1-ddp-spare1-f2",
    "swap-without-replica": "1x2-spare1-f1", "weak-replicas-agree": "2x1-ddp-f2", "shrunk-member": "2x1-ddp-f1",
    "resume-skips-batch": "2x1-ddp-f1", "transfer-fact-always-replica": "1x2-spare1-f1",
    "fence-reads-next-generation": "2x1-ddp-spare1-f2", "claim-keeps-pool": "2x1-ddp-spare1-f2",
    "double-claim": "2x1-ddp-spare2-crash-f1", "report-published-frontier": "2x2-f1",
    "replace-r-only": "2x1-ddp-links-f2", "rebuild-everything": "2x1-ddp-f1",
    "fixed-share": "2x1-ddp-shrink-refill-f1", "shrink-last-replica": "2x2-shrink-crash-f2",
    "refill-double-count": "2x1-ddp-shrink-refill-f1",
    "fence-skips-rank": "2x2-fence-f1", "spare-stale-view": "2x1-ddp-spare2-crash-f1", "validate-r-only": "2x2-f1",
    "validation-wrong-membership": "2x1-ddp-f1", "transfer-before-spare-rebuilt": "2x1-ddp-spare2-crash-f1",
    "probe-swallowed": "2x1-ddp-f1", "flag-ignores-link": "2x2-links-f1",
}


def test_every_mutant_is_caught_on_a_fast_manifest_configuration_named():
    assert set(CAUGHT_ON_MANIFEST) == set(MUTANTS)
    assert all(MANIFEST_CONFIGS[n][1] for n in CAUGHT_ON_MANIFEST.values()), "each must be a fast configuration"


@pytest.mark.timeout(300)
@pytest.mark.nightly("30 searches of the pinned configurations (about 95 s); make test catches every mutant on its "
                     "smallest configuration, by BFS and by hypothesis")
@pytest.mark.parametrize("name", list(MUTANTS))
def test_bfs_catches_mutant_on_the_manifest(name):
    cfg = MANIFEST_CONFIGS[CAUGHT_ON_MANIFEST[name]][0].with_(mutant=name)
    r = explore(cfg)
    caught = r.violated() & set(MUTANTS[name].expect)
    assert caught, (f"mutant {name!r} NOT caught by BFS on {CAUGHT_ON_MANIFEST[name]}: violated {sorted(r.violated())}, "
                    f"expected one of {sorted(MUTANTS[name].expect)}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", [n for n in MUTANTS if n not in FINAL_STATE_ONLY])
def test_hypothesis_catches_mutant(name):
    cfg = SMALLEST[name].with_(mutant=name)
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(make_machine(cfg), settings=_hypothesis_settings(max_examples=HUNT_EXAMPLES))
    msg = str(info.value)
    expect = MUTANTS[name].expect
    words = [e for e in expect if e in msg] + (["deadlock", "final state"] if name in ("linger", "no-step-deadline") else [])
    assert any(w in msg for w in words), f"mutant {name!r}: hypothesis failed for another reason: {msg[:400]}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.nightly(
    "1x2 with three faults (about 12 s): test_every_rank_hung_is_no_deadlock searches the same configuration with the "
    "correct protocol")) if n == "no-step-deadline" else n for n in MUTANTS])
def test_correct_protocol_passes_both_on_the_same_configuration(name):
    cfg = SMALLEST[name]
    r = explore(cfg)
    assert r.ok and r.complete, [v.format() for v in r.violations]
    run_state_machine_as_test(make_machine(cfg), settings=_hypothesis_settings())
