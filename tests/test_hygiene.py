"""House rules that a grep can check (issue "Put the house in order"): one home per concept, no
path hacks in tests, every lint suppression says why.  Each rule names the offending file and line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("accelpact", "model", "impl", "conformance", "bench", "tests")
           for p in sorted((ROOT / d).rglob("*.py"))]
THIS = Path(__file__).resolve()


def _grep(pattern: str, files=SOURCES) -> list[str]:
    rx = re.compile(pattern)
    return [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files if p.resolve() != THIS
            for n, line in enumerate(p.read_text().splitlines(), 1) if rx.search(line)]


def test_every_suppression_names_its_code_and_says_why() -> None:
    """``# noqa: CODE - why`` and ``# type: ignore[code]  # why``: a bare suppression hides the next bug too."""
    bad = [hit for hit in _grep(r"#\s*(noqa|type:\s*ignore)")
           if not re.search(r"#\s*noqa:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*\s+-\s+\S", hit)
           and not re.search(r"#\s*type:\s*ignore\[[\w,\- ]+\]\s*#\s*\S", hit)]
    assert not bad, "suppressions without a code and a reason:\n" + "\n".join(bad)


def test_no_test_edits_sys_path() -> None:
    hits = _grep(r"sys\.path\.(insert|append)|sys\.path\s*=", [p for p in SOURCES if "tests" in p.parts or "conformance" in p.parts])
    assert not hits, "tests import the package, never edit sys.path:\n" + "\n".join(hits)


def test_one_home_per_concept() -> None:
    """Wrappers, backends, fault kinds, run-folder file names and the trace format are each defined once."""
    homes = {
        r"^WRAPPERS\s*[:=]": "impl/runtime/wrappers.py",
        r"^BACKENDS\s*[:=]": "impl/runtime/backends.py",
        r"^(FAULT_KINDS|KINDS)\s*[:=]": "accelpact/testing/faults.py",
        r"^FAULT_POINTS\s*[:=]": "accelpact/testing/faults.py",
        r"^SEEDED_BUGS\s*[:=]": "accelpact/testing/seeded.py",
        # a file name built or globbed in code (a quote right before it); prose in docstrings may name them
        r"[\"'](trace-a|result-a|final-r|job\.json)": "impl/launch/rundir.py",
    }
    impl_side = [p for p in SOURCES if "model" not in p.relative_to(ROOT).parts[:1]]
    for pattern, home in homes.items():
        # the model has its own fault vocabulary (model.protocol.FAULT_KINDS: its Fault* actions),
        # which accelpact/testing/faults.py maps onto; only the implementation side is checked here
        hits = _grep(pattern, impl_side)
        where = {h.split(":")[0] for h in hits}
        assert where == {home}, f"{pattern!r} must be defined in {home} only; found:\n" + "\n".join(hits)


def test_trace_format_is_named_once_in_the_package() -> None:
    """The format string is defined in impl/trace.py; tests may spell it (the spec's value, checked
    independently), the package may not repeat it."""
    package = [p for p in SOURCES if "tests" not in p.relative_to(ROOT).parts and not p.name.startswith("test_")]
    where = {h.split(":")[0] for h in _grep(r"accelpact-trace/1\"", package)}
    assert where == {"impl/trace.py"}, where


def test_jobs_are_built_typed() -> None:
    """No job dict literal: a job is built through ``accelpact.impl.launch.job.Job`` (validated once)."""
    # (the model's own Config has a checkpoint period too: model/ is not a job's builder)
    hits = _grep(r"[\"']checkpoint_every[\"']\s*:", [p for p in SOURCES if p.name not in ("job.py",)
                                                       and p.relative_to(ROOT).parts[0] != "model"])
    hits = [h for h in hits if "scenario" not in h.split(":")[0]]  # the scenario schema's own parsing
    assert not hits, "job/workload dict literals outside impl/launch/job.py:\n" + "\n".join(hits)


#: files that still spell store keys themselves, each to move to impl/controlplane.py's constants
#: (none left).
STORE_KEY_PENDING: set[str] = set()


def test_store_keys_live_in_the_control_plane() -> None:
    """Every ``"accelpact/..."`` store key literal is in ``impl/controlplane.py`` (the store keys' one
    home: ``PREFIX``, ``ABORT_KEY``, ``death_key``, ...); elsewhere a key is imported from there."""
    files = [p for d in ("accelpact", "model", "impl", "conformance", "bench", "examples")
             for p in sorted((ROOT / d).rglob("*.py"))
             if str(p.relative_to(ROOT)) not in {"impl/controlplane.py", *STORE_KEY_PENDING}]
    hits = _grep(r"""(?<![\w.])[rfbRFB]{0,2}["']accelpact/""", files)
    assert not hits, "store keys spelled outside impl/controlplane.py (import its constants):\n" + "\n".join(hits)
    pending = _grep(r"""(?<![\w.])[rfbRFB]{0,2}["']accelpact/""", [ROOT / p for p in sorted(STORE_KEY_PENDING)])
    assert pending or not STORE_KEY_PENDING, f"{sorted(STORE_KEY_PENDING)} spell no key any more: empty STORE_KEY_PENDING"


def test_seeded_bugs_replace_methods_and_nothing_branches_on_them() -> None:
    """Issue 23: a seeded bug is a table entry of replaced engine/control-plane methods
    (accelpact/testing/seeded.py); no engine module asks which bug is on, and every replaced name exists on the
    class it replaces (a renamed method would leave the bug silently inert)."""
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.recovery import Pact, SpareEngine
    from accelpact.testing.seeded import SEEDED_BUGS

    for name in ("recovery.py", "controlplane.py", "runtime/hotswap.py", "launch/api.py", "watchdog.py"):
        text = (ROOT / "impl" / name).read_text()
        assert ".bug(" not in text, f"impl/{name} branches on a seeded bug; replace a method in accelpact/testing/seeded.py instead"
        for bug in SEEDED_BUGS:
            assert f'"{bug}"' not in text, f"impl/{name} names seeded bug {bug!r}; its behaviour belongs in accelpact/testing/seeded.py"
    for bug, entry in SEEDED_BUGS.items():
        assert entry.engine or entry.control, bug
        for attr in entry.engine:
            assert attr in Pact.__annotations__ or any(hasattr(c, attr) for c in (Pact, SpareEngine)) or \
                attr in {a for c in Pact.__mro__ for a in getattr(c, "__annotations__", {})}, (bug, attr)
        for attr in entry.control:
            assert hasattr(ControlPlane, attr), (bug, attr)


def test_a_wrapper_is_one_table_entry() -> None:
    """Adding a wrapper (spec/implementation.md, "Where things go"): one WRAPPERS entry, whose name
    is a contract profile (model/contract.py PROFILES, the model's own generic ``hsdp`` besides) that
    the shipped envelope covers, and whose adapter class says how it matches a module (the adapter
    is chosen from the table, not from a chain of isinstance tests)."""
    import json

    from accelpact.impl.runtime.adapters import adapter_for
    from accelpact.impl.runtime.adapters.base import Adapter
    from accelpact.impl.runtime.wrappers import WRAPPERS
    from accelpact.model.contract import DEFAULT_PROFILE, PROFILES, default_envelope

    assert set(PROFILES) == {DEFAULT_PROFILE, *WRAPPERS}, "model/contract.py PROFILES and the wrapper table disagree"
    shipped = json.loads((ROOT / "model" / "envelopes" / "default.json").read_text())
    assert {e["profile"] for e in shipped["entries"]} == set(PROFILES), "model/envelopes/default.json covers other profiles"
    assert {e.key.profile for e in default_envelope().entries} == set(PROFILES)
    for w in WRAPPERS.values():
        cls = w.adapter_class()
        assert issubclass(cls, Adapter) and cls.matches is not Adapter.matches, f"{w.name}: its adapter must say how it matches"
    src = (ROOT / "impl" / "runtime" / "adapters" / "__init__.py").read_text()
    assert "isinstance" not in src, "adapter_for chooses from the wrapper table"
    assert adapter_for(object()).name == "generic"


def _nightly_tests() -> set[str]:
    """Test functions of tests/ marked ``nightly``: on the function, on one of its parameters, or through
    a module-level table whose value marks them (``NIGHTLY_PINS``)."""
    import ast

    names = set()
    for p in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(p.read_text())
        tables = {t.id for node in tree.body if isinstance(node, ast.Assign) and "nightly" in ast.unparse(node)
                  for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                marks = " ".join(ast.unparse(d) for d in node.decorator_list)
                if "mark.nightly" in marks or any(re.search(rf"\b{t}\b", marks) for t in tables):
                    names.add(node.name)
    return names


def test_every_nightly_test_is_in_the_table_of_what_runs_where() -> None:
    """Issue 38: a test that leaves ``make test`` is named in spec/implementation.md, "What runs where",
    beside what still runs its path in ``make test``."""
    text = (ROOT / "spec" / "implementation.md").read_text()
    table = text[text.index("## What runs where"):]
    nightly = _nightly_tests()
    assert "test_short_soak_is_green" in nightly and "test_bfs_catches_mutant_on_the_manifest" in nightly
    missing = sorted(n for n in nightly if f"`{n}" not in table)
    assert not missing, "nightly tests missing from spec/implementation.md \"What runs where\": " + ", ".join(missing)
