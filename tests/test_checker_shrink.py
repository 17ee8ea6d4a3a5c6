"""The trace checker judges runs that shrink, grow and refill (issue 41, spec/protocol.md P19;
spec/trace-checking.md "Shrink, grow and refill").

The traces are the model's own runs projected as the engine records them (``checker.project``): the
spec's ``shrink-run`` (2x2 HSDP: a death, node 0's replica out, rank 0 idle as a spare, a keeper's
refill, a grow back) and a run of the pinned ``2x1-ddp-shrink-refill-f1`` found by a breadth-first
search of the model (a death, a shrink, a refill, a grow).  Expected verdicts come from the model:
an honest projection is accepted, with the death logged or taken silently (a SIGKILL from outside)
and the configuration read off the headers; each tampering (a share, a dropped RankLeave, a RankShrink
where no rank died) is rejected naming the record.  Pure Python, no torch.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from accelpact.conformance.checker import (
    TraceChecker,
    abstraction_from_records,
    config_from_headers,
    elastic_from_headers,
    project,
)
from accelpact.impl.trace import RankTrace, Record, TraceError
from accelpact.model.explore import MANIFEST_CONFIGS
from accelpact.model.protocol import Action, all_actions, initial_state, is_final
from accelpact.model.state import PC_TRAIN, Config
from accelpact.model.transitions import enabled, step, successors

ROOT = Path(__file__).resolve().parents[1]
HSDP = Config(max_faults=1, shrink=True, refill=True, faults=frozenset({"crash"}), points=("boundary",))
DDP = MANIFEST_CONFIGS["2x1-ddp-shrink-refill-f1"][0]


def _spec_run() -> list[tuple[Action, object, object]]:
    """The ``shrink-run`` block of spec/protocol.md section 14, replayed in the model."""
    text = (ROOT / "spec" / "protocol.md").read_text()
    (block,) = re.findall(r"```shrink-run\n(.*?)```", text[text.index("## 14. Shrink, grow and refill"):], flags=re.S)
    s, path = initial_state(HSDP), []
    for tok in " ".join(block.strip().splitlines()[:-1]).split():
        name, arg = re.fullmatch(r"(\w+)\(([^)]*)\)", tok).groups()
        rank, _, rest = arg.partition(",")
        a = Action(name, int(rank), rest or None)
        assert enabled(HSDP, s, a), tok
        t = step(HSDP, s, a)
        path.append((a, s, t))
        s = t
    return path


def _ddp_grow_run() -> list[tuple[Action, object, object]]:
    """The shortest model run of 2x1-ddp-shrink-refill-f1 that ends with the job grown back, every rank
    training (breadth-first: deterministic)."""
    acts = all_actions(DDP)
    s0 = initial_state(DDP)
    parent: dict = {s0: None}
    todo = deque([s0])
    while todo:
        s = todo.popleft()
        if s.store.grown and is_final(DDP, s) and all(rk.pc == PC_TRAIN for rk in s.ranks):
            path = []
            while parent[s] is not None:
                p, a = parent[s]
                path.append((a, p, s))
                s = p
            return path[::-1]
        for a, t in successors(DDP, s, acts):
            if t not in parent:
                parent[t] = (s, a)
                todo.append(t)
    raise AssertionError("no grown final state")


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Config, dict[int, RankTrace]]]:
    return {"spec": (HSDP, project(HSDP, _spec_run())), "ddp": (DDP, project(DDP, _ddp_grow_run()))}


def _renumber(tr: RankTrace, recs: list[Record]) -> RankTrace:
    return RankTrace(tr.rank, [replace(rec, seq=i) for i, rec in enumerate(recs)], tr.header, tr.end)


def _unlogged(traces: dict[int, RankTrace]) -> dict[int, RankTrace]:
    """As the engine writes a SIGKILL from outside: no record of the death."""
    return {r: _renumber(tr, [rec for rec in tr.records if not rec.action.startswith("Fault")]) for r, tr in traces.items()}


def _index(tr: RankTrace, action: str, nth: int = 0) -> int:
    return [i for i, rec in enumerate(tr.records) if rec.action == action][nth]


def test_the_projection_records_what_the_engine_records(runs):
    """As impl/effects.py and impl/recovery.py write them: no KeeperRefill (keepers are not traced); the
    grow is every rank's RankStartGrow (pc observed, the vacant identities); each RankResume says its
    share and the active replicas; the header says the opt-in."""
    cfg, tr = runs["spec"]
    names = [rec.action for t in tr.values() for rec in t.records]
    assert "KeeperRefill" not in names and names.count("RankStartGrow") == 2 and names.count("RankShrink") == 1
    grow = tr[3].records[_index(tr[3], "RankStartGrow")]
    assert grow.state["pc"] == "observed" and grow.detail["vacant"] == [0, 1]
    first = tr[2].records[_index(tr[2], "RankResume")]
    assert first.state["share"] == [0, 1] and first.state["active"] == [1]
    later = tr[0].records[_index(tr[0], "RankResume")]
    assert later.state["share"] == [0] and later.state["active"] == [0, 1]
    assert tr[2].records[_index(tr[2], "RankShrink")].detail == {"leaving": [0, 1], "replicas": [0]}
    assert tr[0].records[_index(tr[0], "RankLeave")].detail == {"leaving": [0, 1]}
    assert tr[0].header["shrink"] is True and tr[0].header["micro_batches"] == 2 and "refill" not in tr[0].header


@pytest.mark.parametrize("name", ["spec", "ddp"])
def test_model_runs_are_accepted(runs, name):
    """The projection is accepted under the model's configuration (the keeper's refill inferred), and,
    with the death unlogged, under the configuration read off the headers with silent faults."""
    cfg, tr = runs[name]
    v = TraceChecker(cfg, tr, silent_faults=False).check()
    assert v.accepted, v.message
    assert any("KeeperRefill" in step_ for step_ in v.path), v.path  # the unlogged refill, inferred
    assert v.nodes < 40 * sum(len(t.records) for t in tr.values()), v.nodes
    un = _unlogged(tr)
    head = config_from_headers(un)
    assert (head.shrink, head.micro_batches, head.refill) == (True, cfg.total_micro_batches, True)
    v = TraceChecker(head, un, silent_faults=True, abstraction=abstraction_from_records(un)).check()
    assert v.accepted, v.message
    assert v.nodes < 40 * sum(len(t.records) for t in un.values()), v.nodes


@pytest.mark.parametrize("name", ["spec", "ddp"])
def test_without_the_refill_the_grow_is_not_explained(runs, name):
    """The grow needs the keeper's spare: a header that says ``"refill": false`` (or a model without
    refill) rejects the same traces at the grow."""
    cfg, tr = runs[name]
    v = TraceChecker(cfg.with_(refill=False), tr, silent_faults=False).check()
    assert not v.accepted
    assert any("RankStartGrow" in u for u in v.unmatched.values()), v.message
    no = {r: RankTrace(r, t.records, {**t.header, "refill": False}, t.end) for r, t in tr.items()}
    assert "refill" not in elastic_from_headers(no)


@pytest.mark.parametrize("prechecks", [True, False])
@pytest.mark.parametrize("name", ["spec", "ddp"])
def test_a_changed_share_is_rejected(runs, name, prechecks):
    cfg, tr = runs[name]
    r = 3 if name == "spec" else 1
    i = _index(tr[r], "RankResume")
    rec = tr[r].records[i]
    bad = [m for m in range(cfg.total_micro_batches) if [m] != rec.state["share"]][:1]
    recs = list(tr[r].records)
    recs[i] = replace(rec, state={**rec.state, "share": bad})
    v = TraceChecker(cfg, {**tr, r: _renumber(tr[r], recs)}, silent_faults=False, prechecks=prechecks).check()
    assert not v.accepted
    assert f"r{r}#{i} RankResume" in v.unmatched.get(r, ""), v.message
    assert "share=" in v.message, v.message


@pytest.mark.parametrize("prechecks", [True, False])
def test_a_removed_rank_leave_is_rejected(runs, prechecks):
    """Rank 0 of the spec run stays in the job (no RankLeave) yet a grow later takes its identity."""
    cfg, tr = runs["spec"]
    i = _index(tr[0], "RankLeave")
    recs = [rec for k, rec in enumerate(tr[0].records) if k != i]
    v = TraceChecker(cfg, {**tr, 0: _renumber(tr[0], recs)}, silent_faults=False, prechecks=prechecks).check()
    assert not v.accepted
    assert f"r0#{i} SpareJoin" in v.unmatched.get(0, ""), v.message


@pytest.mark.parametrize("prechecks", [True, False])
@pytest.mark.parametrize("name", ["spec", "ddp"])
def test_a_shrink_where_no_rank_died_is_rejected(runs, name, prechecks):
    """A RankShrink inserted into the grow's episode (its seats were vacant: nobody died there)."""
    cfg, tr = runs[name]
    r = 3 if name == "spec" else 1
    i = _index(tr[r], "RankStartGrow") + 1
    grow = tr[r].records[i - 1]
    fake = replace(grow, action="RankShrink", state={"pc": grow.state["pc"], "frontier": grow.state["frontier"]},
                   detail={"leaving": [0], "replicas": [0]})
    recs = list(tr[r].records)
    recs.insert(i, fake)
    v = TraceChecker(cfg, {**tr, r: _renumber(tr[r], recs)}, silent_faults=False, prechecks=prechecks).check()
    assert not v.accepted
    assert f"r{r}#{i} RankShrink" in v.unmatched.get(r, ""), v.message


def test_a_shrink_in_a_run_without_a_death_is_rejected():
    """A fault-free 2x1 DDP run's traces with a RankShrink recorded: the model enables none."""
    fake = Record(0, 0, "RankShrink", 0, "ok", 0, {"pc": "train", "frontier": 1}, {"leaving": [1], "replicas": [1]})
    tr = {r: RankTrace(r, [fake] if r == 0 else [], {"type": "header", "nodes": 2, "ranks_per_node": 1, "group": "world",
                                                     "shrink": True, "micro_batches": 2}, {"type": "end", "outcome": "released"})
          for r in (0, 1)}
    v = TraceChecker(DDP, tr, silent_faults=False).check()
    assert not v.accepted and "r0#0 RankShrink" in v.unmatched.get(0, ""), v.message


def test_headers_that_disagree_or_are_malformed_are_named(runs):
    _cfg, tr = runs["ddp"]
    mixed = {r: RankTrace(r, t.records, {**t.header, "shrink": r == 0}, t.end) for r, t in tr.items()}
    with pytest.raises(TraceError, match="disagree on shrink"):
        config_from_headers(mixed)
    bad = {r: RankTrace(r, t.records, {**t.header, "micro_batches": 0}, t.end) for r, t in tr.items()}
    with pytest.raises(TraceError, match="micro_batches"):
        config_from_headers(bad)
    plain = {r: RankTrace(r, t.records, {k: v for k, v in t.header.items() if k not in ("shrink", "micro_batches")}, t.end)
             for r, t in tr.items()}
    # no opt-in: a refill only where more spares joined than the job had (the grow's one join, no spare)
    assert elastic_from_headers(plain) == {"refill": True}
    assert elastic_from_headers({r: RankTrace(r, t.records, {**t.header, "spares": 1}, t.end) for r, t in plain.items()}) == {}
    assert elastic_from_headers({r: RankTrace(r, [], t.header, t.end) for r, t in plain.items()}) == {}
