"""A swapped identity's trace is its incarnations' traces joined (impl/trace.py ``load_traces``):
the dead process's file, then each spare's, as the run folder holds them (impl/rundir.py).  The
model's own hot-swap run (spec/protocol.md, ``hotswap-run``), projected into traces and split where
the spare took rank 1's identity, is accepted; the same files with the spare's records torn, the
dead process's file missing, or an incarnation that did not die before its successor, are not.
Pure Python: no processes, no torch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from accelpact.conformance.checker import check_traces, project, write_dir
from accelpact.impl.rundir import RunDir
from accelpact.impl.trace import TraceError, load_traces
from accelpact.model.protocol import Action
from accelpact.model.transitions import step
from accelpact.model.state import Config, initial_state

ROOT = Path(__file__).resolve().parents[1]
CFG = Config(spares=1)


def _spec_run():
    text = (ROOT / "spec" / "protocol.md").read_text()
    (block,) = re.findall(r"```hotswap-run\n(.*?)```", text, flags=re.S)
    s, path = initial_state(CFG), []
    for tok in " ".join(block.strip().splitlines()[:-1]).split():
        name, rank, arg = re.fullmatch(r"(\w+)\((\d*)(?:,(\w+))?\)", tok).groups()
        a = Action(name, int(rank) if rank else None, arg)
        t = step(CFG, s, a)
        path.append((a, s, t))
        s = t
    return path


def _split_at_join(run: RunDir, rank: int, spare: int = 0) -> None:
    """Rewrite rank's trace as the run folder holds a swapped identity: the dead process's records
    up to its death, and the spare's own file from its SpareJoin, numbered from 0."""
    lines = run.trace(0, rank).read_text().splitlines()
    header, body = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    cut = next(i for i, rec in enumerate(body) if rec.get("action") == "SpareJoin")
    mine, theirs = body[:cut], body[cut:]
    run.trace(0, rank).write_text("\n".join(json.dumps(x) for x in [header, *mine]) + "\n")
    for i, rec in enumerate(theirs):
        if rec.get("type") == "action":
            rec["seq"] = i
    spare_header = {**header, "spare": spare}
    run.spare_trace(spare, 0, rank).write_text("\n".join(json.dumps(x) for x in [spare_header, *theirs]) + "\n")


@pytest.fixture
def swapped(tmp_path):
    """The spec's hot-swap run written as a real swap's run folder."""
    path = _spec_run()
    traces = project(CFG, path)
    write_dir(traces, tmp_path)
    run = RunDir(tmp_path)
    _split_at_join(run, 1)
    return run, path


def test_a_swapped_identity_is_joined_and_accepted(swapped):
    run, path = swapped
    assert set(run.spare_trace_files()) == {(0, 1)}
    traces = load_traces(run.path)[0]
    whole = project(CFG, path)
    assert [r.action for r in traces[1].records] == [r.action for r in whole[1].records]
    assert [r.seq for r in traces[1].records] == list(range(len(whole[1].records)))
    assert traces[1].records[0].action == "FaultCrash" and traces[1].end == whole[1].end
    v = check_traces(CFG, traces)
    assert v.accepted, v.message


def test_a_spare_whose_first_record_is_not_its_join_is_rejected(swapped):
    run, _path = swapped
    f = run.spare_trace(0, 0, 1)
    lines = f.read_text().splitlines()
    recs = [json.loads(x) for x in lines[1:]]
    recs[0], recs[1] = recs[1], recs[0]  # the spare arrives before it took the identity
    recs[0]["seq"], recs[1]["seq"] = 0, 1
    f.write_text("\n".join([lines[0], *(json.dumps(r) for r in recs)]) + "\n")
    v = check_traces(CFG, load_traces(run.path)[0])
    assert not v.accepted and "RankArrive" in v.message


def test_a_spare_without_the_identity_trace_is_unusable(swapped):
    run, _path = swapped
    run.trace(0, 1).unlink()
    with pytest.raises(TraceError, match="is missing"):
        load_traces(run.path)


def test_an_identity_handed_on_by_a_process_that_ended_is_unusable(swapped):
    run, _path = swapped
    f = run.trace(0, 1)
    f.write_text(f.read_text() + json.dumps({"type": "end", "rank": 1, "outcome": "released", "gen": 1}) + "\n")
    with pytest.raises(TraceError, match="only a process that died"):
        load_traces(run.path)
