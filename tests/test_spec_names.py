"""Names cannot drift between model/, spec/ and tests/ (spec/README.md).

Every model name a reviewer must find in the spec (actions, pcs, exit reasons, invariant ids and
names, mutants, fault kinds) appears in the spec file that defines it, and every requirement id
(`S<n>`, `P<n>`, `C<n>`, with sub-ids such as `S2.1`, `P3.1`, `C6.3`) that a test cites is
defined somewhere in spec/.  Checks S1-S7 (properties.md), P1-P13 (protocol.md), C1-C6
(contract.md) by name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelpact.model import state
from accelpact.model.invariants import EDGE_INVARIANTS, INVARIANTS
from accelpact.model.mutants import MUTANTS
from accelpact.model.protocol import ACTIONS, FAULT_KINDS

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
ID = re.compile(r"(?<![A-Za-z0-9_])([SPC][0-9]+(?:\.[0-9]+)*)(?![A-Za-z0-9_])")


def _text(name: str) -> str:
    path = SPEC / name
    assert path.is_file(), f"spec/{name} is missing"
    return path.read_text()


def _all_spec() -> str:
    return "\n".join(p.read_text() for p in sorted(SPEC.glob("*.md")))


def _missing(names, text: str) -> list[str]:
    return [n for n in names if not re.search(rf"(?<![A-Za-z0-9_.-]){re.escape(n)}(?![A-Za-z0-9_])", text)]


def test_every_action_is_specified_in_protocol_md():
    missing = _missing(ACTIONS, _text("protocol.md"))
    assert not missing, f"model actions not named in spec/protocol.md: {missing}; add them to the phase and the action index"


def test_every_pc_and_exit_reason_is_in_protocol_md():
    pcs = [v for k, v in vars(state).items() if k.startswith("PC_") and isinstance(v, str)]
    assert len(pcs) >= 12, "expected the model's pcs (PC_* in model/state.py)"
    text = _text("protocol.md")
    missing = _missing([f"`{p}`" for p in pcs] + [f"`{r}`" for r in state.EXIT_REASONS], text)
    assert not missing, f"pcs / exit reasons not in spec/protocol.md: {missing}"


def test_every_invariant_id_and_name_is_in_properties_md():
    text = _text("properties.md")
    rows = [(inv.id, inv.name) for inv in INVARIANTS + EDGE_INVARIANTS]
    missing = [f"{i} {n}" for i, n in rows if not re.search(rf"\|\s*{re.escape(i)}\s*\|\s*`{n}`", text)]
    assert not missing, f"invariants without their row '| id | `Name`' in spec/properties.md: {missing}"


def test_properties_md_has_no_invariant_the_model_lacks():
    """A safety row in the spec must exist in model/invariants.py (no invented S ids)."""
    text = _text("properties.md")
    table = text[text.index("## Safety"):text.index("## Final states")]
    spec_ids = set(re.findall(r"^\|\s*([SW][0-9.]+)\s*\|", table, flags=re.M))
    model_ids = {inv.id for inv in INVARIANTS + EDGE_INVARIANTS}
    assert spec_ids == model_ids, f"spec-only: {sorted(spec_ids - model_ids)}, model-only: {sorted(model_ids - spec_ids)}"


def test_every_mutant_is_in_properties_md():
    missing = _missing([f"`{m}`" for m in MUTANTS], _text("properties.md"))
    assert not missing, f"mutants not named in spec/properties.md: {missing}"


def test_every_fault_kind_and_fault_action_is_in_fault_model_md():
    text = _text("fault-model.md")
    faults = [name for name, a in ACTIONS.items() if a.actor == "fault"]
    missing = _missing([f"`{k}`" for k in FAULT_KINDS] + faults, text)
    assert not missing, f"fault kinds / Fault* actions not in spec/fault-model.md: {missing}"
    kinds = {a.fault_kind for a in ACTIONS.values() if a.fault_kind}
    assert kinds == set(FAULT_KINDS), f"ACTIONS fault kinds {sorted(kinds)} differ from FAULT_KINDS {sorted(FAULT_KINDS)}"


def test_every_injected_kind_and_point_is_in_fault_model_md():
    """The fault table (model/faults.py: the kinds and points scenarios and jobs name) is specified."""
    from accelpact.model.faults import FAULT_POINTS, KINDS

    text = _text("fault-model.md")
    missing = _missing([f"`{k}`" for k in KINDS] + [f"`{p}`" for p in FAULT_POINTS], text)
    assert not missing, f"fault kinds / points not in spec/fault-model.md: {missing}"


#: the conformance modules spec/scenario-format.md and spec/trace-checking.md describe, and the
#: public names of each that the spec must name
CONFORMANCE_NAMES = {
    "scenario-format.md": {
        "scenario": ("Scenario", "ScenarioError", "scenario_from_mapping", "load_scenario"),
        "mapping": ("model_config", "script_for", "failing_group", "WINDOWS"),
        "outcomes": ("model_outcomes", "rank_traces", "check_expectation"),
        "generate": (),
        "runner": ("run_scenario", "abstraction_for"),
    },
    "trace-checking.md": {
        "checker": ("TraceChecker", "project"),
        "mapping": ("Script",),
    },
}


@pytest.mark.parametrize("spec_file", sorted(CONFORMANCE_NAMES))
def test_conformance_modules_and_functions_are_named_in_the_spec(spec_file):
    """The spec names each conformance module it describes (``conformance/<module>.py``) and its
    public functions, and every name exists in that module (no drift either way)."""
    import importlib

    text = _text(spec_file)
    for module, names in CONFORMANCE_NAMES[spec_file].items():
        assert f"conformance/{module}.py" in text, f"spec/{spec_file} does not name conformance/{module}.py"
        mod = importlib.import_module(f"accelpact.conformance.{module}")
        for name in names:
            assert hasattr(mod, name), f"conformance/{module}.py has no {name} (named by spec/{spec_file})"
        missing = _missing([f"`{n}" for n in names], text)
        assert not missing, f"spec/{spec_file} does not name {missing} of conformance/{module}.py"


def _spec_ids() -> set[str]:
    ids = set(ID.findall(_all_spec()))
    # a cited group id (S2, P3, C6) exists when one of its sub-ids does
    for i in list(ids):
        parts = i.split(".")
        ids.update(".".join(parts[:k]) for k in range(1, len(parts)))
    return ids


def test_spec_defines_the_numbered_rules():
    ids = _spec_ids()
    want = {f"P{n}" for n in range(1, 7)} | {f"C{n}" for n in range(1, 7)} | {"P3.1"}
    assert want <= ids, f"spec/ does not define {sorted(want - ids)}"


def test_every_id_cited_in_tests_exists_in_spec():
    ids = _spec_ids()
    cited: dict[str, set[str]] = {}
    files = sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "conformance").glob("test_*.py"))
    for path in files:
        for i in ID.findall(path.read_text()):
            cited.setdefault(i, set()).add(path.name)
    assert cited, "no S/P/C id cited in tests/: the citation rule is not being followed"
    unknown = {i: sorted(f) for i, f in cited.items() if i not in ids}
    assert not unknown, f"ids cited in tests but defined nowhere in spec/: {unknown}; fix the citation or add the rule to spec/"


def test_id_pattern_is_strict():
    """The extractor must not see ids inside identifiers or hex, and must keep sub-ids whole."""
    assert ID.findall("S2.1 and (P3) C6.3. x0C3 aS1 S1_x") == ["S2.1", "P3", "C6.3"]


def _parse_action(token: str):
    from accelpact.model.protocol import Action

    m = re.fullmatch(r"([A-Za-z]+)\(([^)]*)\)", token)
    assert m, f"spec/protocol.md model-run: {token!r} is not Name(arg)"
    name, arg = m.groups()
    assert name in ACTIONS, f"spec/protocol.md model-run: unknown action {name!r}"
    if name == "FaultGroupFail":
        return Action(name, None, arg)
    if not arg:
        return Action(name)
    rank, _, point = (x.strip() for x in arg.partition(","))
    return Action(name, int(rank), point or None)


def _model_runs() -> list[tuple[list[str], list[str]]]:
    blocks = re.findall(r"```model-run\n(.*?)```", _text("protocol.md"), flags=re.S)
    runs = []
    for block in blocks:
        lines = block.strip().splitlines()
        expect = [ln for ln in lines if ln.startswith("=>")]
        assert len(expect) == 1, "each model-run block ends with one '=> L1' or '=> L2 <reason>' line"
        tokens = " ".join(ln for ln in lines if not ln.startswith("=>")).split()
        runs.append((tokens, expect[0][2:].split()))
    return runs


def test_protocol_md_example_runs_replay_in_the_model():
    """The example runs of spec/protocol.md section 10 are real model behaviours (P1-P6, P10, P11,
    P13): each step enabled, S1-S7 hold on every state, the run ends final with the stated outcome."""
    from accelpact.model.invariants import check_edge, check_state
    from accelpact.model.protocol import initial_state, is_final
    from accelpact.model.transitions import enabled, step
    from accelpact.model.state import PC_RESTARTED, PC_TRAIN, Config

    runs = _model_runs()
    assert len(runs) >= 3, "spec/protocol.md should show an L1 run and two L2 runs"
    cfg = Config()
    for tokens, expect in runs:
        s = initial_state(cfg)
        for i, tok in enumerate(tokens):
            a = _parse_action(tok)
            assert enabled(cfg, s, a), f"model-run step {i} {tok} is not enabled after {tokens[:i]}"
            t = step(cfg, s, a)
            bad = check_state(cfg, t) + check_edge(cfg, s, t)
            assert not bad, f"model-run step {i} {tok} breaks {[(inv.id, msg) for inv, msg in bad]}"
            s = t
        assert is_final(cfg, s), f"model-run {tokens[0]}...: ends in a non-final state"
        if expect[0] == "L1":
            assert all(rk.pc == PC_TRAIN and rk.gen == 1 for rk in s.ranks), "L1 run must end with every rank training in g=1"
        else:
            assert expect[0] == "L2" and len(expect) == 2
            assert all(rk.pc == PC_RESTARTED and rk.replayed == cfg.frontier - cfg.checkpoint for rk in s.ranks)
            assert s.store.abort == expect[1], f"expected abort {expect[1]!r}, model says {s.store.abort!r}"
