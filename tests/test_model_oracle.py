"""Issue 24: the oracle (model/invariants.py) shares nothing with the protocol.

It imports from the model only the state's types and constants (model/state.py), so that no helper
the actions call (``true_lookup``, ``_member``, ``_replicas_agree``, ``Envelope.lookup``, ``decide``)
can judge its own mistakes; and each helper-replacement mutant (model/mutants.py) is caught.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from accelpact.model.explore import explore
from accelpact.model.mutants import MUTANTS
from accelpact.model.state import Config

INVARIANTS_PY = Path(__file__).resolve().parents[1] / "model" / "invariants.py"
#: what the oracle may import from the model: the state's types and constants, nothing else
ALLOWED_MODEL_MODULES = {"state"}
#: names the protocol's helpers go by: none may appear in the oracle
PROTOCOL_HELPERS = ("true_lookup", "_member", "_replicas_agree", "_failed_members", "_digests_agree", "lookup", "decide",
                    # the hot swap's (model/hotswap.py): S10 and S13 read the raw claims instead
                    "claim_of", "unclaimed", "dead_in", "live_replicas", "excused")


def _imports(tree: ast.AST) -> list[tuple[str, int, list[str]]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, 0, [a.name]) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level, [a.name for a in node.names]))
    return out


def test_oracle_imports_only_state_types_and_the_stdlib():
    tree = ast.parse(INVARIANTS_PY.read_text())
    bad = []
    for module, level, names in _imports(tree):
        if level:  # relative: a model module
            if module not in ALLOWED_MODEL_MODULES:
                bad.append(f"from {'.' * level}{module} import {', '.join(names)}")
        elif module != "__future__" and module.split(".")[0] not in sys.stdlib_module_names:
            bad.append(f"import {module} ({', '.join(names)})")
    assert not bad, f"model/invariants.py may import only model.state and the stdlib, found: {bad}"


def test_oracle_calls_no_protocol_helper():
    tree = ast.parse(INVARIANTS_PY.read_text())
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    assert not called & set(PROTOCOL_HELPERS), sorted(called & set(PROTOCOL_HELPERS))


_DDP2 = dict(nodes=2, ranks_per_node=1, affected_local=0)


def test_helper_mutants_are_caught_by_the_independent_oracle():
    """A helper replaced for the protocol is caught: the oracle judged from facts, not from the helper."""
    cases = {
        "weak-replicas-agree": Config(**_DDP2, max_faults=2, faults=frozenset({"group_fail", "corrupt"}), points=("boundary",)),
        "shrunk-member": Config(**_DDP2, max_faults=1),
        # hot swap: the claim's and the fence's helpers (hotswap.unclaimed, hotswap.claim_of)
        "double-claim": Config(**_DDP2, max_faults=1, spares=2, faults=frozenset({"crash"}), points=("boundary",)),
        "fence-reads-next-generation": Config(**_DDP2, max_faults=1, spares=1, faults=frozenset({"crash"}), points=("boundary",)),
    }
    for name, cfg in cases.items():
        r = explore(cfg.with_(mutant=name))
        assert r.violated() & set(MUTANTS[name].expect), (name, sorted(r.violated()))
        assert explore(cfg).ok, name


def test_rebind_is_judged_from_the_failures_history_after_the_store_moved_on():
    """S5 reads which groups failed in each generation from history ``failures``: once the next
    episode overwrote ``Store.failed``, a member of the group that failed in generation 0 still must
    hold generation 1's communicator (the old oracle skipped every rank then)."""
    from dataclasses import replace

    from accelpact.model.invariants import rebind_complete
    from accelpact.model.state import PC_TRAIN, initial_state

    cfg = Config(max_faults=2)  # 2x2, R = {1, 3}
    s = initial_state(cfg)
    ranks = tuple(replace(rk, pc=PC_TRAIN, gen=1, comm=1 if r in (1, 3) else 0, refs=(1, 1) if r in (1, 3) else (0, 0))
                  for r, rk in enumerate(s.ranks))
    s = replace(s, ranks=ranks, failures=frozenset({(0, 1), (1, 1)})).with_store(failed=(1, "boundary", frozenset({1})))
    assert rebind_complete(cfg, s) is None
    stale = s.with_rank(3, comm=0, refs=(0, 0))
    assert "must hold generation 1's (its group failed in generation 0" in rebind_complete(cfg, stale)
    assert "never failed" in rebind_complete(cfg, s.with_rank(0, comm=1, refs=(1, 1)))
    assert "every reference" in rebind_complete(cfg, s.with_rank(1, refs=(1, 0)))
