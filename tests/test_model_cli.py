"""``accelpact explore`` flags (model/cli.py): every configuration pinned in model/manifest.json can be
explored from the command line (issue 23)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from accelpact.cli import main as cli_main
from accelpact.model.cli import add_arguments, config_from_args
from accelpact.model.explore import MANIFEST_CONFIGS, NIGHTLY_CONFIGS, config_summary, load_manifest


def _pinned() -> list[tuple[str, dict[str, Any]]]:
    data = load_manifest()
    return [(name, entry["config"]) for section in ("configs", "nightly") for name, entry in data.get(section, {}).items()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(p)
    return p


def _argv(fields: dict[str, Any], parser: argparse.ArgumentParser) -> list[str]:
    """The explore flags for a manifest configuration: field ``x_y`` is flag ``--x-y``; a field the CLI
    lacks fails here, so a new Config field pinned in the manifest needs its flag."""
    argv: list[str] = []
    for key, value in fields.items():
        flag = "--" + key.replace("_", "-")
        assert flag in parser._option_string_actions, f"manifest field {key!r} has no explore flag {flag}"
        if value is None or value == "all":   # mutant: none; faults: all (the defaults)
            continue
        argv += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    return argv


@pytest.mark.parametrize(("name", "fields"), _pinned(), ids=[n for n, _ in _pinned()])
def test_every_manifest_config_parses_from_the_cli(name, fields):
    parser = _parser()
    cfg = config_from_args(parser.parse_args(_argv(fields, parser)))
    assert config_summary(cfg) == fields
    expected = MANIFEST_CONFIGS[name][0] if name in MANIFEST_CONFIGS else NIGHTLY_CONFIGS[name]
    assert cfg == expected


def test_cli_explores_with_a_spare(capsys):
    argv = ["explore", "--nodes", "2", "--ranks-per-node", "1", "--max-faults", "1", "--spares", "1",
            "--faults", "crash", "--points", "boundary", "--json"]
    assert cli_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["spares"] == 1 and out["ok"] and out["complete"] and out["states"] > 0


def test_cli_rejects_bad_new_flags(capsys):
    assert cli_main(["explore", "--spares", "-1"]) == 2
    assert cli_main(["explore", "--uses-r", "backward"]) == 2     # the boundary probe is always a use of R
    assert cli_main(["explore", "--uses-r", "boundary,lunch"]) == 2
    assert cli_main(["explore", "--advance", "-1"]) == 2
    assert cli_main(["explore", "--checkpoint-every", "-2"]) == 2
