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
        # the one fault table and every vocabulary of kinds derived from it (model, scenario, soak)
        r"^(FAULTS|FAULT_KINDS|KINDS|MODEL_KINDS|MODEL_KIND|SOAK_KINDS)\s*[:=]": "model/faults.py",
        r"^FAULT_POINTS\s*[:=]": "model/faults.py",
        r"^SEEDED_BUGS\s*[:=]": "accelpact/testing/seeded.py",
        # a file name built or globbed in code (a quote right before it); prose in docstrings may name them
        r"[\"'](trace-a|result-a|final-r|job\.json)": "impl/rundir.py",
    }
    #: the one test that spells a home's names on purpose: its expected values, independent of the home
    checks = {"impl/rundir.py": {"tests/test_rundir.py"}}
    for pattern, home in homes.items():
        hits = _grep(pattern)
        where = {h.split(":")[0] for h in hits} - checks.get(home, set())
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


def test_the_implementation_never_imports_the_test_tooling() -> None:
    """Test hooks reach the engine through ``impl/hooks.py`` ``Hooks``, which the test tooling builds and
    passes at attach: no module of ``accelpact.impl`` imports ``accelpact.testing``, at its top or inside
    a function (the harness's rank program is ``accelpact.testing.worker``, which the launcher names)."""
    files = sorted((ROOT / "impl").rglob("*.py"))
    hits = _grep(r"^\s*(from|import)\s+(accelpact\.testing\b|\.{2,}testing\b|\.{2,}\s+import\s+testing\b)", files)
    hits += _grep(r"^\s*from\s+(accelpact|\.{2,})\s+import\s+.*\btesting\b", files)
    assert not hits, "impl imports the test tooling:\n" + "\n".join(hits)


def test_seeded_bugs_replace_methods_and_nothing_branches_on_them() -> None:
    """Issue 23: a seeded bug is a table entry of replaced engine/control-plane methods
    (accelpact/testing/seeded.py); no engine module asks which bug is on, and every replaced name exists on the
    class it replaces (a renamed method would leave the bug silently inert)."""
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.recovery import Pact
    from accelpact.impl.spare import SpareEngine
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


# ---- imports: every import of the package's own modules at module top, and no cycle -----------------------
#: import root -> its folder (pyproject.toml package-dir)
PACKAGE_DIRS = {"accelpact": "accelpact", "accelpact.model": "model", "accelpact.impl": "impl",
                "accelpact.conformance": "conformance", "accelpact.bench": "bench"}
#: the most function-local imports of the package's own modules the project may hold outside tests/
LOCAL_IMPORT_LIMIT = 20


def _package_modules() -> dict[str, Path]:
    """Module name -> file of every module of the package (test modules and conftest left out: nothing
    imports them)."""
    out: dict[str, Path] = {}
    for root, folder in PACKAGE_DIRS.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            parts = list(p.relative_to(ROOT / folder).with_suffix("").parts)
            if root == "accelpact" and parts[0] in PACKAGE_DIRS.values():
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(x.startswith("test_") or x == "conftest" for x in parts):
                continue
            out[".".join([root, *parts])] = p
    return out


def _own_imports(name: str, path: Path, modules: dict[str, Path]):
    """``(imported module, line, in a function)`` for every import statement of ``name`` (``path``) that
    names a module of the package, wherever it stands (in a function, under ``if TYPE_CHECKING``).  As
    grimp reads them: ``from a import b`` imports ``a.b`` when that is a module, else ``a``."""
    import ast

    tree = ast.parse(path.read_text())
    in_function = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(fn) if n is not fn}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, node.lineno, id(node) in in_function


def test_no_import_cycle_among_the_packages_modules() -> None:
    """The package's modules import each other without a cycle, counting the imports inside functions
    (which hide a cycle from whoever reads the top of a module) and those under ``if TYPE_CHECKING``;
    the layers themselves are import-linter's contracts (pyproject.toml, ``make lint``)."""
    import networkx as nx

    modules = _package_modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target, line, _ in _own_imports(name, path, modules):
            graph.add_edge(name, target, where=f"{path.relative_to(ROOT)}:{line}")
    cycles = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            cycles.append(" -> ".join(f"{a} ({graph.edges[a, b]['where']})" for a, b in cycle) + f" -> {cycle[0][0]}")
    assert not cycles, "import cycles among the package's modules:\n" + "\n".join(cycles)


def test_the_package_imports_its_own_modules_at_module_top() -> None:
    """A function-local import of the package's own modules hides a cycle or a layer violation; the one
    lazy mechanism is a table of module names loaded with importlib (the ``accelpact`` docstring).  Fewer
    than :data:`LOCAL_IMPORT_LIMIT` are left, tests/ aside."""
    modules = _package_modules()
    files = {**{str(p): p for p in sorted((ROOT / "examples").rglob("*.py"))}, **{str(p): p for p in modules.values()}}
    names = {str(p): n for n, p in modules.items()}
    local = sorted({(str(p.relative_to(ROOT)), line): target for key, p in files.items()
                    for target, line, in_function in _own_imports(names.get(key, p.stem), p, modules) if in_function}.items())
    assert len(local) < LOCAL_IMPORT_LIMIT, (f"{len(local)} function-local import statements of the package's own modules "
                                             f"(at most {LOCAL_IMPORT_LIMIT - 1}); move them to the module's top:\n"
                                             + "\n".join(f"{f}:{line}: imports {target}" for (f, line), target in local))


def test_the_model_and_the_command_line_load_without_torch_or_the_implementation() -> None:
    """``import accelpact``, every module of ``accelpact.model`` and ``accelpact explore``'s parser load
    neither torch nor ``accelpact.impl``."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys\n"
            "import accelpact, accelpact.cli, accelpact.model\n"
            "for m in pkgutil.iter_modules(accelpact.model.__path__):\n"
            "    importlib.import_module('accelpact.model.' + m.name)\n"
            "accelpact.cli.build_parser(); accelpact.cli.build_parser('explore')\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('accelpact.impl')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_every_module_a_lazy_table_names_loads_and_has_what_its_loader_takes() -> None:
    """The lazy tables (the ``accelpact`` docstring) name modules by string, which no import checks: each
    subcommand and benchmark module defines ``add_arguments`` and ``run``, and each public name of
    ``accelpact`` is defined where ``_PUBLIC`` says."""
    import importlib

    import accelpact
    from accelpact.bench.cli import REGISTRY
    from accelpact.cli import COMMANDS

    for module in [m for m, _help in COMMANDS.values()] + list(REGISTRY.values()):
        mod = importlib.import_module(module)
        assert callable(getattr(mod, "add_arguments", None)) and callable(getattr(mod, "run", None)), module
    for name, module in accelpact._PUBLIC.items():
        assert getattr(importlib.import_module(module), name) is getattr(accelpact, name), name
