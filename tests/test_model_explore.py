"""Exhaustive exploration (model/explore.py, model/symmetry.py, model/cli.py, bench/).

Spec ids: safety S1-S7 (every state), S4.1 (every edge), liveness L1 (boundary faults recover),
L2 (bounded exit after an abort), L3 (no deadlock, no livelock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelpact.cli import main as cli_main
from accelpact.model.contract import default_envelope
from accelpact.model.explore import (
    MANIFEST_CONFIGS,
    _Search,
    exit_bound_limit,
    explore,
    load_manifest,
    manifest_drift,
    manifest_modes,
)
from accelpact.model.invariants import EDGE_INVARIANTS, INVARIANTS
from accelpact.model.transitions import enabled, step
from accelpact.model.state import Config, initial_state
from accelpact.model.symmetry import Symmetry, apply, rank_classes

SMALL = Config(max_faults=1)
DDP = Config(nodes=2, ranks_per_node=1, affected_local=0, group="world", max_faults=1)


@pytest.mark.timeout(300)
def test_correct_protocol_2x2_one_fault_holds_everything():
    """S1-S7, S4.1, L1, L2, L3 hold on 2x2 with one fault; the counts are the pinned ones."""
    r = explore(SMALL, symmetry=False)
    assert r.ok, [v.format() for v in r.violations]
    assert r.complete and r.liveness == {"L1": True, "L2": True, "L3": True}
    assert (r.states, r.transitions, r.depth) == (14086, 41436, 43)
    assert r.deadlocks == 0 and r.livelocks == 0 and r.sinks > 0
    assert r.invariants_checked == r.states * len(INVARIANTS) + r.transitions * len(EDGE_INVARIANTS)
    assert 0 < r.exit_bound <= r.exit_bound_limit == exit_bound_limit(SMALL)


@pytest.mark.timeout(300)
def test_graph_is_a_networkx_digraph_labelled_with_actions():
    r = explore(DDP, keep_graph=True)
    g = r.graph
    assert g.number_of_nodes() == r.states and g.number_of_edges() == r.edges
    for u, v, data in list(g.edges(data=True))[:50]:
        a = data["action"]
        s = g.nodes[u]["state"]
        assert enabled(DDP, s, a)
        assert Symmetry(DDP).canonical(step(DDP, s, a)) == g.nodes[v]["state"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", [SMALL, DDP, Config(group="world", max_faults=1), Config(nodes=3, ranks_per_node=1, affected_local=0, group="world", max_faults=1),
                                 pytest.param(Config(nodes=3, max_faults=1, failing="any", faults=frozenset({"group_fail"}),
                                                     points=("boundary",)),
                                              marks=pytest.mark.nightly("3x2, about 45 s; the four smaller worlds run every time"))],
                         ids=["2x2", "2x1-ddp", "2x2-world", "3x1-ddp", "3x2-any-groups"])
def test_symmetry_reduction_agrees_with_full_search(cfg):
    """Reduced and unreduced searches give the same verdicts, depth and exit bound; reduced is not larger."""
    red, full = explore(cfg, symmetry=True), explore(cfg, symmetry=False)
    assert red.ok == full.ok and red.violated() == full.violated()
    assert red.liveness == full.liveness
    assert (red.depth, red.exit_bound) == (full.depth, full.exit_bound)
    assert red.states <= full.states
    if any(len(c) > 1 for c in rank_classes(cfg)):
        assert red.states < full.states, "a configuration with interchangeable ranks must shrink"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant", ["early-release", "no-fence", "partial-rebind"])
def test_symmetry_reduction_agrees_on_mutant_verdicts(mutant):
    cfg = Config(max_faults=2, faults=frozenset({"group_fail"}), points=("boundary",), mutant=mutant)
    red, full = explore(cfg, symmetry=True), explore(cfg, symmetry=False)
    assert red.violated() == full.violated() and not red.ok
    # the shortest counterexample has the same length either way (symmetry keeps distances)
    assert len(red.counterexample) == len(full.counterexample)


def test_rank_classes_default_world():
    assert rank_classes(Config()) == ((0,), (1, 3), (2,))
    assert rank_classes(Config(nodes=3)) == ((0,), (1, 3, 5), (2, 4))
    assert rank_classes(DDP) == ((0,), (1,))
    # any group may fail: a group's members are interchangeable (rank 0 apart), groups are not
    assert rank_classes(Config(nodes=3, failing="any")) == ((0,), (2, 4), (1, 3, 5))


@pytest.mark.timeout(300)
@pytest.mark.nightly("2x2, two failures of any group, about 30 s; failing='any' is searched in make test by "
                     "tests/test_model_links.py and tests/test_checker_soundness.py")
def test_several_groups_fail_in_one_episode_and_each_episode_chooses():
    """failing="any": two groups failing at one boundary are repaired in one generation (every rank
    resumes in generation 1 after two FaultGroupFail steps), and a second episode may fail another
    group; the correct protocol holds every property there too."""
    cfg = Config(max_faults=2, failing="any", faults=frozenset({"group_fail"}), points=("boundary",))
    r = explore(cfg, keep_graph=True)
    assert r.ok and r.complete, [v.format() for v in r.violations]
    finals = [d["state"] for _n, d in r.graph.nodes(data=True) if not r.graph.out_degree(_n)]
    both_at_once = [s for s in finals if s.store.failed is not None and s.store.failed[2] == frozenset({0, 1})
                    and all(rk.gen == 1 for rk in s.ranks)]
    one_then_other = [s for s in finals if all(rk.gen == 2 for rk in s.ranks)]
    assert both_at_once and one_then_other


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg,perms", [
    (Config(max_faults=1), ({1: 3, 3: 1},)),
    pytest.param(Config(nodes=3, max_faults=1, failing="any", points=("boundary",)), ({1: 3, 3: 1}, {2: 4, 4: 2}, {1: 5, 5: 3, 3: 1}),
                 marks=pytest.mark.nightly("3x2, about 17 s; 2x2 and 4x1 run every time")),
    (Config(nodes=4, ranks_per_node=1, affected_local=0, group="world", max_faults=1),
     ({1: 2, 2: 1}, {1: 3, 3: 2, 2: 1}, {1: 2, 2: 3, 3: 1})),
], ids=["2x2", "3x2-any", "4x1-ddp"])
def test_canonical_form_is_invariant_under_class_permutations(cfg, perms):
    """Permuting ranks inside their class (store and history included) never changes the canonical state."""
    sym = Symmetry(cfg)
    search = _Search(cfg, symmetry=False)
    search.run(stop=True)
    checked = moved = 0
    for s in search.states[:: max(1, len(search.states) // 500)]:
        c = sym.canonical(s)
        assert sym.canonical(c) == c
        moved += c != s
        for perm in perms:
            assert sym.canonical(apply(s, perm)) == c
            checked += 1
    assert checked > 100 and moved > 0


@pytest.mark.timeout(300)
def test_counterexample_is_shortest_concrete_and_printed_tlc_style():
    cfg = Config(max_faults=1, mutant="partial-rebind")
    r = explore(cfg)
    assert r.violated() == {"S5"} and not r.complete
    cex = r.counterexample
    s = initial_state(cfg)
    assert cex.states[0] == s
    for a, nxt in zip(cex.actions, cex.states[1:], strict=True):
        assert enabled(cfg, s, a)
        s = step(cfg, s, a)
        assert s == nxt
    # shortest: no state violating S5 is closer to the initial state in the unreduced graph
    full = _Search(cfg, symmetry=False)
    (what, node, _a, _t), = full.run(stop=True)
    assert what[0] == "S5" and full.level[node] == len(cex)
    text = r.violations[0].format()
    assert "1: <Initial state>" in text and "2: FaultGroupFail(boundary)" in text
    assert "rank[1].pc: replaced -> rebound" in text or "rank[3].pc: replaced -> rebound" in text
    assert "refs: (0, 0) -> (" in text


@pytest.mark.timeout(300)
def test_continue_collects_more_than_one_violation():
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=1, mutant="partial-rebind")
    r = explore(cfg, stop_on_violation=False)
    assert r.complete and len(r.violations) > 1 and "S5" in r.violated()


@pytest.mark.timeout(300)
def test_l1_fails_when_the_envelope_does_not_qualify_the_boundary():
    """L1: with an envelope lacking this profile every boundary failure is an L2 restart, so L1 must fail."""
    cfg = Config(max_faults=1, envelope=default_envelope(profiles=("ddp",)))
    r = explore(cfg)
    assert r.liveness["L1"] is False and "L1" in r.violated()
    assert r.liveness["L3"] is True and r.liveness["L2"] is True
    full = explore(cfg, symmetry=False)
    assert full.liveness == r.liveness and full.violated() == r.violated() and full.states > r.states


@pytest.mark.timeout(300)
def test_deadlock_is_reported_with_a_path():
    """L3: the linger mutant leaves survivors waiting forever."""
    cfg = Config(nodes=2, ranks_per_node=1, affected_local=0, max_faults=2, faults=frozenset({"group_fail", "crash"}), mutant="linger")
    r = explore(cfg)
    assert "deadlock" in r.violated() and r.liveness["L3"] is False
    assert r.deadlocks > 0 and len(r.counterexample) >= 2


@pytest.mark.timeout(300)
def test_every_rank_hung_is_no_deadlock():
    """L2/L3 with RankExpire (protocol.md P10.5): a group failure and every rank hung used to be a
    deadlock (nobody left to time out).  The step deadline ends them; without it (mutant
    no-step-deadline) the same budget deadlocks with every rank hung."""
    cfg = Config(nodes=1, ranks_per_node=2, affected_local=1, max_faults=3, faults=frozenset({"group_fail", "hang"}))
    r = explore(cfg)
    assert r.ok and r.liveness == {"L1": True, "L2": True, "L3": True}, [v.format() for v in r.violations]
    assert r.deadlocks == 0
    stuck = explore(cfg.with_(mutant="no-step-deadline"))
    assert stuck.deadlocks > 0
    last = stuck.counterexample.states[-1]
    assert all(rk.hung for rk in last.ranks), last


@pytest.mark.timeout(240)
@pytest.mark.nightly("minutes each")
@pytest.mark.parametrize("name", [n for n, (_cfg, fast) in MANIFEST_CONFIGS.items() if not fast])
def test_manifest_slow_configuration_has_not_drifted(name):
    """The pinned numbers of a configuration too slow for every run (4x2-f1 was found 24 times off
    when this check did not exist)."""
    entry = load_manifest()["configs"][name]
    assert not manifest_drift(name, entry), "the model changed: update the manifest if intended"


#: Pinned states (both modes together) above which a fast configuration's every-run check explores
#: the symmetry mode alone; its full search is checked by ``make nightly`` (ACCELPACT_NIGHTLY=1), and
#: the two modes' agreement by test_symmetry_reduction_agrees_with_full_search on smaller worlds.
FULL_MODES_UP_TO = 150_000


def _fast_modes(name: str, entry: dict) -> tuple[str, ...]:
    modes = manifest_modes(name)
    if os.environ.get("ACCELPACT_NIGHTLY") == "1":
        return modes
    return modes if sum(entry[m]["states"] for m in modes if m in entry) <= FULL_MODES_UP_TO else ("symmetry",)


def test_manifest_names_every_configuration():
    assert set(load_manifest()["configs"]) == set(MANIFEST_CONFIGS), \
        "manifest and MANIFEST_CONFIGS disagree: run `accelpact explore --update-manifest`"


#: Fast configurations whose every-run check costs more than it adds to ``make test`` (20-35 s each
#: on 2 cores): ``make nightly`` checks their pins; each mutant they catch is caught in ``make test``
#: on its smallest configuration (tests/test_model_mutants.py).
NIGHTLY_PINS = {"2x2-spare1-f1": "189k states with symmetry (about 33 s)", "2x2-store-f2": "30k states and store loss (about 20 s)"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.nightly(NIGHTLY_PINS[n])) if n in NIGHTLY_PINS else n
                                  for n, (_cfg, fast) in MANIFEST_CONFIGS.items() if fast])
def test_manifest_fast_configuration_has_not_drifted(name):
    """The pinned state-space sizes (model/manifest.json) of a fast configuration still hold."""
    entry = load_manifest()["configs"][name]
    assert entry["fast"], f"{name}: MANIFEST_CONFIGS calls it fast, the manifest does not: run `accelpact explore --update-manifest`"
    assert all(entry[m]["ok"] for m in manifest_modes(name)), f"{name}: pinned as violating"
    drift = manifest_drift(name, entry, modes=_fast_modes(name, entry))
    assert not drift, "the model changed: update the manifest with `accelpact explore --update-manifest` if intended:\n" + "\n".join(drift)


def test_cli_exit_codes(capsys):
    assert cli_main(["explore", "--nodes", "2", "--ranks-per-node", "1", "--max-faults", "1"]) == 0
    out = capsys.readouterr().out
    assert "distinct states" in out and "L2 bounded exit" in out and "all properties hold" in out
    assert cli_main(["explore", "--nodes", "2", "--ranks-per-node", "1", "--max-faults", "1", "--mutant", "skip-agreement"]) == 1
    assert "S2.3" in capsys.readouterr().out
    assert cli_main(["explore", "--mutant", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--mutant" in err and "early-release" in err and "linger" in err
    assert cli_main(["explore", "--faults", "crash,meteor"]) == 2
    assert "meteor" in capsys.readouterr().err
    assert cli_main(["explore", "--method", "dfs"]) == 2
    assert cli_main(["explore", "--group", "pipeline"]) == 2


def test_cli_json_and_hypothesis(capsys):
    assert cli_main(["explore", "--nodes", "2", "--ranks-per-node", "1", "--max-faults", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["states"] > 0 and data["liveness"]["L3"] is True
    assert cli_main(["explore", "--method", "hypothesis", "--nodes", "2", "--ranks-per-node", "1",
                     "--max-faults", "1", "--mutant", "skip-agreement", "--max-examples", "30", "--no-shrink"]) == 1
    assert "S2.3" in capsys.readouterr().out


def test_explore_cli_does_not_import_torch():
    code = "import sys, accelpact.model.cli, accelpact.model.explore, accelpact.model.stateful, accelpact.bench.cli, accelpact.bench.explore; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_bench_dispatcher(capsys):
    assert cli_main(["bench", "nope"]) == 2
    assert "explore" in capsys.readouterr().err
    assert cli_main(["bench", "explore", "--repeat", "1", "--configs", "3x1-ddp-f1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["results"]
    assert row["reduced"]["states"] < row["unreduced"]["states"]
    assert cli_main(["bench", "explore", "--configs", "9x9"]) == 2


@pytest.mark.nightly("make nightly's own runner; it expands 65,536 states of 2x2-f3 before its first stop (about 40 s)")
def test_nightly_profile_stops_at_its_budget_and_says_how_far_it_got(tmp_path, capsys):
    """``make nightly``'s runner: a configuration still running at the budget is stopped there (not
    left to run for hours and fill memory), reported with the states and BFS level it reached and
    no verdict, and the profile fails (exit 1)."""
    from accelpact.model.engine_nightly import main as nightly_main

    out = tmp_path / "nightly.json"
    rc = nightly_main(["--configs", "2x2-f3", "--budget", "0.5", "--quiet", "--json", str(out)])
    assert rc == 1
    row = json.loads(out.read_text())["results"][0]
    assert row["name"] == "2x2-f3" and "numbers" not in row
    assert row["over_budget"]["states"] >= 1 << 16  # the first progress call, after 65,536 expanded states
    assert row["over_budget"]["level"] >= 1
    assert "did not finish within the budget of 0.5 s: stopped at" in capsys.readouterr().out
    assert nightly_main(["--configs", "2x2-f9"]) == 2  # an unknown configuration is refused by name
