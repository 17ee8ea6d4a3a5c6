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
PROTOCOL_HELPERS = ("true_lookup", "_member", "_replicas_agree", "_failed_members", "_digests_agree", "lookup", "decide")


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
    }
    for name, cfg in cases.items():
        r = explore(cfg.with_(mutant=name))
        assert r.violated() & set(MUTANTS[name].expect), (name, sorted(r.violated()))
        assert explore(cfg).ok, name
