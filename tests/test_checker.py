"""Trace checker teeth (spec/trace-checking.md T1-T4): model-generated traces are accepted,
mutated ones (reordered, dropped, renamed, wrong decision, wrong state, truncated, extended)
are rejected, and a rejection explains itself.  Each tampering is rejected by the checks before the
search and by the search alone (``prechecks=False``), in small worlds and in a 64-rank one (8x8,
``conformance/checker_tamper.py``).  No timing is asserted (``accelpact bench check`` measures).
Pure Python: no processes, no torch."""

from __future__ import annotations

import random
from pathlib import Path
from dataclasses import replace

import pytest

from accelpact.conformance.checker import Abstraction, check_traces, project, write_dir
from accelpact.conformance.checker_tamper import TAMPERINGS
from accelpact.impl.rundir import RunDir
from accelpact.impl.trace import RankTrace, TraceError
from accelpact.impl.trace import load_traces as load_dir
from accelpact.model.protocol import all_actions, is_final
from accelpact.model.transitions import successors
from accelpact.model.state import PC_TRAIN, Config, initial_state

CONFIGS = [
    Config(max_faults=1),
    Config(max_faults=2),
    Config(max_faults=3),
    Config(group="world", max_faults=2),
    Config(nodes=4, ranks_per_node=2, max_faults=1),
]


#: configurations whose every run is released (one fault, at the committed boundary: L1)
L1_CONFIGS = [
    Config(max_faults=1, points=("boundary",)),
    Config(group="world", max_faults=1, points=("boundary",)),
    Config(nodes=4, ranks_per_node=2, max_faults=1, points=("boundary",)),
]


def walk(cfg: Config, rng: random.Random, limit: int = 400):
    """A random model run from the initial state to a final state after at least one fault."""
    s = initial_state(cfg)
    path = []
    acts = all_actions(cfg)
    for _ in range(limit):
        pending = s.store.failed is not None and any(rk.pc == PC_TRAIN and rk.gen == s.store.failed[0] for rk in s.ranks)
        if is_final(cfg, s) and s.faults > 0 and not pending:
            return path
        succ = list(successors(cfg, s, acts))
        if not succ:
            return None
        a, t = rng.choice(succ)
        path.append((a, s, t))
        s = t
    return None


def runs(n: int, seed: int = 0, l1_only: bool = False):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        cfg = CONFIGS[len(out) % len(CONFIGS)] if not l1_only else L1_CONFIGS[len(out) % len(L1_CONFIGS)]
        p = walk(cfg, rng)
        if p is None:
            continue
        assert not (l1_only and p[-1][2].supervisor), "an L1 configuration produced an L2 run"
        out.append((cfg, p))
    return out


def _renumber(recs):
    return [replace(r, seq=i) for i, r in enumerate(recs)]


def _with(traces, r, recs, end="keep"):
    out = dict(traces)
    tr = traces[r]
    out[r] = RankTrace(r, _renumber(recs), tr.header, tr.end if end == "keep" else end)
    return out


@pytest.mark.timeout(120)
def test_model_generated_traces_are_accepted():
    """T1: every projected model run is accepted and the whole trace is consumed."""
    for cfg, p in runs(40):
        tr = project(cfg, p)
        v = check_traces(cfg, tr)
        assert v.accepted, v.message


@pytest.mark.timeout(120)
def test_l1_and_l2_runs_both_covered():
    kinds = {bool(p[-1][2].supervisor) for _cfg, p in runs(40)}
    assert kinds == {True, False}


@pytest.fixture(params=[True, False], ids=["prechecked", "search-only"])
def prechecks(request) -> bool:
    """Every tampering must be rejected by the checks before the search and by the search alone."""
    return request.param


def _check(cfg, traces, prechecks: bool):
    """check_traces, with or without the checks before the search; a rejection must be the
    search's own verdict, not its node budget running out."""
    v = check_traces(cfg, traces, prechecks=prechecks)
    assert "budget" not in v.message, v.message
    return v


def _rank_with(tr, pred):
    for r, t in sorted(tr.items()):
        idx = [i for i, rec in enumerate(t.records) if pred(rec)]
        if idx:
            return r, idx
    return None, []


@pytest.mark.timeout(120)
def test_reordered_records_rejected(prechecks):
    """T2: swapping two adjacent protocol records of one rank is not a model behaviour."""
    tried = 0
    for cfg, p in runs(30, seed=1):
        tr = project(cfg, p)
        for r, t in sorted(tr.items()):
            recs = t.records
            for i in range(len(recs) - 1):
                a, b = recs[i], recs[i + 1]
                if a.action.startswith("Fault") or b.action.startswith("Fault") or a.action == b.action:
                    continue
                mutated = _with(tr, r, recs[:i] + [b, a] + recs[i + 2:])
                v = _check(cfg, mutated, prechecks)
                assert not v.accepted, f"reordered {a} / {b} accepted"
                tried += 1
                break
    assert tried >= 20


@pytest.mark.timeout(120)
def test_dropped_record_rejected(prechecks):
    """Dropping a protocol record of a released run (where every step is needed) is caught.
    (In an aborted run a dropped record can leave a genuine model behaviour: the watchdog may
    end a rank at any point, so only released runs are used here.)"""
    tried = 0
    for cfg, p in runs(15, seed=2, l1_only=True):
        tr = project(cfg, p)
        r, idx = _rank_with(tr, lambda rec: not rec.action.startswith("Fault"))
        i = idx[len(idx) // 2]
        recs = tr[r].records
        v = _check(cfg, _with(tr, r, recs[:i] + recs[i + 1:]), prechecks)
        assert not v.accepted, f"dropping {recs[i]} accepted"
        tried += 1
    assert tried == 15


@pytest.mark.timeout(120)
def test_renamed_action_rejected(prechecks):
    swap = {"RankGuard": "RankReject", "RankReject": "RankGuard", "RankArrive": "RankReady", "RankAwaitAgreement": "RankResume",
            "RankReplace": "RankRebind", "RankRebind": "RankValidate", "RankValidate": "RankReady", "RankReady": "RankArrive",
            "RankResume": "RankAwaitAgreement", "RankObserve": "RankGuard"}
    tried = 0
    for cfg, p in runs(15, seed=3, l1_only=True):
        tr = project(cfg, p)
        r, idx = _rank_with(tr, lambda rec: rec.action in swap)
        if r is None:
            continue
        i = idx[0]
        recs = list(tr[r].records)
        recs[i] = replace(recs[i], action=swap[recs[i].action])
        v = _check(cfg, _with(tr, r, recs), prechecks)
        assert not v.accepted, f"renaming {tr[r].records[i]} to {recs[i].action} accepted"
        tried += 1
    assert tried == 15


@pytest.mark.timeout(120)
def test_wrong_decision_rejected(prechecks):
    """A decide record claiming the other decision, or an arrive claiming the wrong 'last'."""
    tried = 0
    for cfg, p in runs(40, seed=4) + runs(40, seed=4, l1_only=True):
        tr = project(cfg, p)
        r, idx = _rank_with(tr, lambda rec: rec.action in ("RankDecideAgreement", "RankArrive"))
        if r is None:
            continue
        recs = list(tr[r].records)
        rec = recs[idx[0]]
        if rec.action == "RankDecideAgreement":
            d = "abort:mismatch" if rec.detail["decision"] == "commit" else "commit"
            recs[idx[0]] = replace(rec, detail={**rec.detail, "decision": d})
        else:
            recs[idx[0]] = replace(rec, detail={**rec.detail, "last": not rec.detail["last"]})
        v = _check(cfg, _with(tr, r, recs), prechecks)
        assert not v.accepted, f"wrong decision in {recs[idx[0]]} accepted"
        tried += 1
    assert tried >= 10


@pytest.mark.timeout(120)
def test_wrong_state_field_rejected(prechecks):
    """The abstraction function has teeth: a frontier one step off, stale refs claimed clean."""
    tried = 0
    for cfg, p in runs(30, seed=5):
        tr = project(cfg, p)
        r, idx = _rank_with(tr, lambda rec: "frontier" in rec.state)
        recs = list(tr[r].records)
        rec = recs[idx[0]]
        recs[idx[0]] = replace(rec, state={**rec.state, "frontier": rec.state["frontier"] + 7})
        assert not _check(cfg, _with(tr, r, recs), prechecks).accepted
        tried += 1
    assert tried == 30


@pytest.mark.timeout(120)
def test_truncated_rank_rejected(prechecks):
    """etcd TraceMatched: a rank whose trace stops early (no end record) in a released run is rejected."""
    for cfg, p in [x for x in runs(12, seed=6, l1_only=True) if len(x[0].world) == 4]:
        tr = project(cfg, p)
        r = max(tr, key=lambda k: len(tr[k].records))
        recs = tr[r].records
        v = _check(cfg, _with(tr, r, recs[: len(recs) // 2], end=None), prechecks)
        assert not v.accepted
        # dropping only the end record is caught too
        assert not _check(cfg, _with(tr, r, recs, end=None), prechecks).accepted


@pytest.mark.timeout(120)
def test_extra_record_rejected(prechecks):
    """A record after the model's run ended cannot be consumed: the checker must not ignore it."""
    for cfg, p in [x for x in runs(12, seed=7, l1_only=True) if len(x[0].world) == 4]:
        tr = project(cfg, p)
        r = 0
        recs = tr[r].records
        extra = replace(recs[-1], seq=len(recs))
        assert not _check(cfg, _with(tr, r, recs + [extra]), prechecks).accepted


@pytest.mark.timeout(60)
def test_rejection_explains():
    cfg, p = runs(1, seed=8, l1_only=True)[0]
    tr = project(cfg, p)
    recs = tr[1].records
    i = next(i for i, rec in enumerate(recs) if rec.action == "RankRebind")
    bad = _with(tr, 1, recs[:i] + recs[i + 1:])
    # before the search: rank 1's own records are no path of its local steps, and the rejection
    # says which record, and what the model needed there
    v = check_traces(cfg, bad)
    assert not v.accepted and v.nodes == 0
    for needle in (f"first unmatched r1#{i} RankValidate", "needs the rank rebound", "after r1#"):
        assert needle in v.message, v.message
    assert 1 in v.unmatched
    # the search alone rejects it too, with the model's view of where it got stuck
    v = check_traces(cfg, bad, prechecks=False)
    assert not v.accepted
    for needle in ("first unmatched", "RankValidate", "model allows", "model path to the furthest match"):
        assert needle in v.message, v.message
    assert 1 in v.unmatched


@pytest.mark.timeout(60)
def test_abstraction_maps_real_steps():
    """Real frontiers are compared through Abstraction.bases (model F stands for the real step)."""
    cfg, p = runs(1, seed=9, l1_only=True)[0]
    tr = project(cfg, p)
    shifted = {}
    for r, t in tr.items():
        recs = [replace(rec, state={**rec.state, **({"frontier": rec.state["frontier"] + 40} if "frontier" in rec.state else {}),
                                    **({"tau": rec.state["tau"] + 40} if "tau" in rec.state else {})}) for rec in t.records]
        shifted[r] = RankTrace(r, recs, t.header, t.end)
    assert not check_traces(cfg, shifted).accepted
    assert check_traces(cfg, shifted, abstraction=Abstraction({0: cfg.frontier + 40})).accepted


@pytest.mark.timeout(60)
def test_files_roundtrip_and_errors(tmp_path):
    cfg, p = runs(1, seed=10)[0]
    tr = project(cfg, p)
    write_dir(tr, tmp_path)
    loaded = load_dir(tmp_path)[0]
    assert [rec.action for rec in loaded[1].records] == [rec.action for rec in tr[1].records]
    assert check_traces(cfg, loaded).accepted
    f = RunDir(tmp_path).trace(0, 1)
    lines = f.read_text().splitlines()
    f.write_text("\n".join([lines[0]] + lines[2:]) + "\n")  # seq gap
    with pytest.raises(TraceError, match="gap-free"):
        load_dir(tmp_path)
    with pytest.raises(TraceError, match="no trace"):
        load_dir(tmp_path / "nothing")


@pytest.mark.timeout(60)
def test_check_trace_cli(tmp_path, capsys):
    """`accelpact check-trace DIR`: exit 0 on a faithful trace, 1 on a mutated one, 2 on no traces."""
    import argparse

    from accelpact.conformance import cli_check

    cfg, p = [x for x in runs(3, seed=11, l1_only=True) if len(x[0].world) == 4][0]
    tr = project(cfg, p)
    write_dir(tr, tmp_path / "good")
    ns = argparse.Namespace(dir=str(tmp_path / "good"), scenario=None)
    assert cli_check.run(ns) == 0
    recs = tr[1].records
    i = next(i for i, rec in enumerate(recs) if rec.action == "RankRebind")
    write_dir(_with(tr, 1, recs[:i] + recs[i + 1:]), tmp_path / "bad")
    assert cli_check.run(argparse.Namespace(dir=str(tmp_path / "bad"), scenario=None)) == 1
    assert "first unmatched" in capsys.readouterr().out
    assert cli_check.run(argparse.Namespace(dir=str(tmp_path / "none"), scenario=None)) == 2


@pytest.mark.timeout(120)
def test_observation_point_abstraction(prechecks):
    """T2: in-flight points are one class (a peer observes an optimizer-time failure while still in
    backward: accepted), but an in-flight failure observed as a boundary one is rejected."""
    tried = 0
    for cfg, p in runs(60, seed=11):
        tr = project(cfg, p)
        hits = [(r, i) for r, t in sorted(tr.items()) for i, rec in enumerate(t.records)
                if rec.action == "RankObserve" and rec.state.get("point") in ("forward", "backward", "optimizer")]
        if not hits:
            continue
        r, i = hits[0]
        recs = list(tr[r].records)
        other = {"forward": "backward", "backward": "optimizer", "optimizer": "backward"}[recs[i].state["point"]]
        recs[i] = replace(recs[i], state={**recs[i].state, "point": other})
        assert _check(cfg, _with(tr, r, recs), prechecks).accepted
        recs[i] = replace(recs[i], state={**recs[i].state, "point": "boundary"})
        assert not _check(cfg, _with(tr, r, recs), prechecks).accepted
        tried += 1
    assert tried >= 5


@pytest.mark.timeout(120)
def test_comm_must_name_the_real_group(prechecks):
    """RankReplace's ``comm`` names the new communicator (its c10d name, read back by
    ``controlplane.comm_generation``): a bare counter, or the name of another generation's group,
    is rejected."""
    from accelpact.impl.controlplane import comm_name

    tried = 0
    for cfg, p in runs(9, seed=11, l1_only=True):
        tr = project(cfg, p)
        r, idx = _rank_with(tr, lambda rec: rec.action == "RankReplace" and "comm" in rec.state)  # a member of R
        recs = list(tr[r].records)
        rec = recs[idx[0]]
        gen = rec.gen + 1
        assert rec.state["comm"] == comm_name("accelpact/", gen, cfg.group)
        for bad in (gen, comm_name("accelpact/", gen + 1, cfg.group), "original"):
            recs[idx[0]] = replace(rec, state={**rec.state, "comm": bad})
            assert not _check(cfg, _with(tr, r, recs), prechecks).accepted, f"comm={bad!r} accepted"
        tried += 1
    assert tried == 9


@pytest.mark.timeout(120)
def test_counts_must_equal_the_models(prechecks):
    """A store add and its record are one action: the reported counter is exactly the model's."""
    tried = 0
    for cfg, p in runs(12, seed=12, l1_only=True):
        tr = project(cfg, p)
        r, idx = _rank_with(tr, lambda rec: rec.action in ("RankArrive", "RankReady") and not rec.detail["last"])
        if r is None:
            continue
        recs = list(tr[r].records)
        rec = recs[idx[0]]
        recs[idx[0]] = replace(rec, detail={**rec.detail, "count": rec.detail["count"] + 1})
        assert not _check(cfg, _with(tr, r, recs), prechecks).accepted, f"count+1 in {rec} accepted"
        tried += 1
    assert tried >= 6


@pytest.mark.timeout(120)
def test_missing_end_only_for_a_rank_killed_by_a_signal(prechecks):
    """Every exit path writes an end record; only a SIGKILLed (crashed) rank, or a worker torchrun
    killed for its restart, may lack one.  An exited rank without one is rejected."""
    tried = 0
    for cfg, p in runs(40, seed=13):
        tr = project(cfg, p)
        final = p[-1][2]
        exited = [r for r in tr if final.ranks[r].reason and tr[r].end is not None]
        if not exited:
            continue
        r = exited[0]
        assert _check(cfg, tr, prechecks).accepted
        assert not _check(cfg, _with(tr, r, tr[r].records, end=None), prechecks).accepted
        tried += 1
    assert tried >= 3


def test_a_corrupt_line_is_a_rejection_not_a_truncation(tmp_path):
    """Only the unterminated last line of a file (a write cut short by a kill) may be dropped; a
    line that is not JSON anywhere else rejects the trace."""
    cfg, p = runs(1, seed=14, l1_only=True)[0]
    write_dir(project(cfg, p), tmp_path)
    f = RunDir(tmp_path).trace(0, 1)
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:3] + ['{"type": "action", "seq"'] + lines[3:]) + "\n")
    with pytest.raises(TraceError, match="not JSON"):
        load_dir(tmp_path)
    f.write_text("\n".join(lines) + "\n" + '{"type": "action", "se')  # unterminated: a torn write
    assert [rec.action for rec in load_dir(tmp_path)[0][1].records] == \
        [rec.action for rec in project(cfg, p)[1].records]
    f.write_text("\n".join(lines) + "\n" + '{"type": "action", "se' + "\n")  # terminated garbage
    with pytest.raises(TraceError, match="not JSON"):
        load_dir(tmp_path)


@pytest.mark.timeout(240)
def test_checker_scales_with_the_world_not_its_interleavings(tmp_path):
    """A one-repair run of 1,024 ranks (32 nodes x 32) is accepted, searching one node per record:
    the search follows the records' t_ns order (repaired by the store's order) and takes every step
    that commutes with the rest alone; a tampered one is rejected in one walk too.  (Times are
    measured by ``accelpact bench check``, never asserted here.)"""
    from accelpact.conformance.checker import scheduled_repair

    for nodes, rpn in ((4, 4), (32, 32)):
        cfg = Config(nodes=nodes, ranks_per_node=rpn, affected_local=rpn - 1, max_faults=1, points=("boundary",))
        tr = project(cfg, scheduled_repair(cfg))
        v = check_traces(cfg, tr)
        records = sum(len(t.records) for t in tr.values())
        assert v.accepted, v.message
        assert v.nodes == records + 1
    v = check_traces(cfg, TAMPERINGS["frontier"].apply(cfg, tr), prechecks=False)
    assert not v.accepted and v.nodes <= records + 1, v.message
    # and the benchmark runs end to end (tiny worlds), timing the rejection of every tampering
    import json

    from accelpact.cli import main as cli_main

    assert cli_main(["bench", "check", "--worlds", "2x2,4x2", "--repeat", "1", "--json", str(tmp_path / "c.json")]) == 0
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [r["world"] for r in doc["results"]] == ["2x2", "4x2"]
    assert {(r["world"], r["tampering"]) for r in doc["rejections"] if r["prechecks"]} == \
        {(w, t) for w in ("2x2", "4x2") for t in TAMPERINGS}
    assert all(r["rejected_by"] in ("prechecks", "search", "search only") and r["max_s"] >= 0 for r in doc["rejections"])
    assert cli_main(["bench", "check", "--worlds", "4by4"]) == 2
    assert cli_main(["bench", "check", "--worlds", "2x2", "--tamper", "no-such-tampering"]) == 2


# --------------------------------------------------------------------------------------
# The same teeth at scale: a 64-rank world (8 nodes x 8), model runs of one repair and of one abort
# (conformance/checker_tamper.py), each tampering rejected with its reason, before the search and
# by the search alone.  (Rejection time versus ranks: ``accelpact bench check``, never asserted.)

LARGE = (8, 8)


@pytest.fixture(scope="module")
def large():
    """(config, traces) of each base run of the large world, built once."""
    out = {}
    for t in TAMPERINGS.values():
        if t.on not in out:
            out[t.on] = t.base(*LARGE)
    return out


@pytest.mark.timeout(120)
def test_large_model_runs_are_accepted(large):
    for cfg, tr in large.values():
        records = sum(len(t.records) for t in tr.values())
        v = check_traces(cfg, tr)
        assert v.accepted, v.message
        assert v.nodes == records + 1  # one search node per record: no interleaving explored


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_tampering_rejected_at_scale(name, large, prechecks):
    """Each kind of tampering the small-world tests reject, on a 64-rank trace: rejected, saying why;
    the search alone rejects it too, within its budget (a walk, not a search of interleavings)."""
    t = TAMPERINGS[name]
    cfg, tr = large[t.on]
    bad = t.apply(cfg, tr)
    v = _check(cfg, bad, prechecks)
    assert not v.accepted, f"{name} ({t.doc}) accepted"
    assert "budget" not in v.message, v.message
    if prechecks:
        assert t.expect in v.message, v.message
    assert v.nodes <= 2 * sum(len(x.records) for x in tr.values()) + 2, f"{name}: {v.nodes} search nodes"
    changed = [r for r in tr if bad[r].records != tr[r].records or bad[r].end != tr[r].end
               or [x.state for x in bad[r].records] != [x.state for x in tr[r].records]
               or [x.detail for x in bad[r].records] != [x.detail for x in tr[r].records]]
    assert len(changed) == 1
    r = changed[0]
    if prechecks and t.names_rank:
        assert f"rank {r}:" in v.message, v.message


@pytest.mark.timeout(120)
def test_corrupt_line_rejected_at_scale(tmp_path, large):
    """A line that is not JSON in one of 64 files rejects the run folder (T0)."""
    cfg, tr = large["repair"]
    write_dir(tr, tmp_path)
    f = RunDir(tmp_path).trace(0, 37)
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:3] + ['{"type": "action", "seq"'] + lines[3:]) + "\n")
    with pytest.raises(TraceError, match="not JSON"):
        load_dir(tmp_path)


@pytest.mark.timeout(120)
def test_clock_skew_only_costs_no_verdict(large):
    """``t_ns`` is each host's monotonic clock: ranks of different hosts are not comparable.  With
    every node's clock shifted at random (hours apart), the honest run is still accepted in one walk
    (the store's order repairs the guide: checker.TraceChecker._guide), and a tampered one rejected."""
    cfg, tr = large["repair"]
    rng = random.Random(5)
    shift = {n: rng.randrange(-10**13, 10**13) for n in range(cfg.nodes)}
    skewed = {r: RankTrace(r, [replace(rec, t_ns=rec.t_ns + shift[r // cfg.ranks_per_node]) for rec in t.records], t.header, t.end)
              for r, t in tr.items()}
    v = check_traces(cfg, skewed)
    assert v.accepted, v.message
    assert v.nodes == sum(len(t.records) for t in tr.values()) + 1
    bad = TAMPERINGS["frontier"].apply(cfg, skewed)
    assert not check_traces(cfg, bad).accepted


# ------------------------------------------------------------------ the engine's contract, from the headers

def _k5_traces(**header):
    """The soak K5 traces (tests/data: a swap released in place, L1, on cpu-gloo) with ``header``
    fields set on every rank's header."""
    import dataclasses

    from accelpact.impl.trace import load_traces

    trs = load_traces(Path(__file__).parent / "data" / "soak-k5-partial-flag")[7]
    return {r: dataclasses.replace(t, header={**t.header, **header}) for r, t in trs.items()}


def _episode_ok(trs) -> tuple[bool, str]:
    from accelpact.conformance.checker import check_told_nothing

    v = check_told_nothing(trs)
    return v.accepted, v.message


def test_the_checker_models_the_contract_the_engine_had():
    """The trace header's ``platform`` and ``envelope`` (written by the job: ``Session.contract``)
    are the model's.  A swap released in place is accepted under an envelope that qualifies the
    platform, and rejected when the headers say the engine ran on ``cuda-nccl`` under the shipped
    envelope (which has no ``cuda-nccl`` entry: every failure there is L2, so no L1 swap).  Found on
    the first lent GPU (stop 38): the NCCL corpus's engines rejected (L2, their envelope) and the
    checker, assuming ``cpu-gloo``, demanded L1."""
    from accelpact.conformance.checker import engine_contract
    from accelpact.model.contract import default_envelope

    shipped = default_envelope().to_json()
    ok, msg = _episode_ok(_k5_traces(platform="cpu-gloo", envelope=shipped))
    assert ok, msg
    ok, msg = _episode_ok(_k5_traces(platform="cuda-nccl", envelope=default_envelope(platform="cuda-nccl").to_json()))
    assert ok, msg
    ok, msg = _episode_ok(_k5_traces(platform="cuda-nccl", envelope=shipped))
    assert not ok and "RankGuard" in msg, msg
    got = engine_contract(_k5_traces(platform="cuda-nccl", envelope=shipped))
    assert got["platform"] == "cuda-nccl" and got["envelope"] == default_envelope()


def test_a_malformed_or_split_contract_in_the_headers_is_named():
    from accelpact.conformance.checker import engine_contract
    from accelpact.impl.trace import TraceError
    from accelpact.model.contract import default_envelope

    assert engine_contract(_k5_traces()) == {}  # headers that do not say: the model's defaults
    with pytest.raises(TraceError, match="'platform' must be a non-empty string"):
        engine_contract(_k5_traces(platform=3, envelope=default_envelope().to_json()))
    with pytest.raises(TraceError, match="entries"):
        engine_contract(_k5_traces(platform="cuda-nccl", envelope={"format": "accelpact-envelope/1"}))
    trs = _k5_traces(platform="cpu-gloo", envelope=default_envelope().to_json())
    trs[1].header["platform"] = "cuda-nccl"
    with pytest.raises(TraceError, match="different contracts"):
        engine_contract(trs)
