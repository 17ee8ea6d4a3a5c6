"""Watchdog, trace writer and exit codes.

Spec ids: S6 (every rank exits on the job abort, hung or blocked), S7 (a lost control plane
ends the rank with DEADLINE), T1 (trace records: model action names, gap-free seq).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _mp  # noqa: E402

pytest.importorskip("torch")

from accelpact.impl.exitcodes import ExitCode, code_for  # noqa: E402
from accelpact.impl.trace import NullTrace, Trace  # noqa: E402
from accelpact.model.state import EXIT_REASONS  # noqa: E402


def test_exit_codes_map_model_reasons():
    assert [code_for(r) for r in EXIT_REASONS] == [70, 71, 72, 73]
    assert code_for("abort:deadline") is ExitCode.DEADLINE
    assert ExitCode.MISMATCH.reason == "mismatch"
    with pytest.raises(ValueError, match="unknown exit reason"):
        code_for("crashed")


def test_trace_records_are_gap_free_under_threads(tmp_path):
    """T1: seq is gap-free in file order even with the watchdog thread writing concurrently."""
    tr = Trace(tmp_path / "t.ndjson", 2, {"world": 4, "scenario": "unit"})

    def spam():
        for _ in range(200):
            tr.action("RankArrive", 0, "ok", {"pc": "arrived"}, {"count": 1})

    ts = [threading.Thread(target=spam) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    tr.end("released", gen=0)
    tr.action("RankReady", 0)  # ignored after the end record
    recs = [json.loads(x) for x in (tmp_path / "t.ndjson").read_text().splitlines()]
    assert recs[0]["type"] == "header" and recs[0]["format"] == "accelpact-trace/1" and recs[0]["rank"] == 2
    assert [r["seq"] for r in recs[1:-1]] == list(range(800))
    assert recs[-1]["type"] == "end"
    with pytest.raises(ValueError, match="not a model action"):
        tr.action("RankDance", 0)
    NullTrace().action("anything", 0)  # off: no validation, no cost


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_watchdog_exits_rank_blocked_in_gloo_collective(tmp_path):
    """S6: the abort key ends a rank whose main thread is blocked in a gloo collective (and a
    sleeping one), with the abort reason's code, before the collective could time out."""
    store = _mp.master_store()
    result: dict = {}

    def abort_when_armed():
        c = _mp.client_store(store.port)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not c.check(["wd/armed"]) or int(c.add("wd/armed", 0)) < 2):
            time.sleep(0.05)
        time.sleep(0.5)  # rank 0 is inside the all-reduce by now
        result["t_abort"] = time.monotonic_ns()
        c.compare_set("wd/abort", "", "rejected")

    cfg = {"gloo_timeout_s": 45.0}
    t = threading.Thread(target=abort_when_armed, daemon=True)
    t.start()
    run = _mp.launch(_mp.blocked_in_collective_worker, 2, cfg, tmp_path, timeout=40, store=store)
    t.join(5)
    assert run.codes == {0: 70, 1: 70}, run.codes
    assert not (tmp_path / "collective-returned").exists(), "the collective returned before the watchdog exited"
    for r in range(2):
        recs = run.trace(r)
        assert recs[-2]["action"] == "RankExit" and recs[-2]["state"] == {"pc": "exited", "reason": "rejected"}
        assert recs[-2]["gen"] == 7
        assert recs[-1]["type"] == "end" and recs[-1]["code"] == 70
        assert recs[-2]["t_ns"] >= result["t_abort"]
    assert run.wall_s < cfg["gloo_timeout_s"]


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_watchdog_exits_deadline_when_store_is_lost(tmp_path):
    """S7: the control-plane store's host dies; the watchdog exits DEADLINE (72)."""
    run = _mp.launch(_mp.store_host_worker, 2, {}, tmp_path, timeout=50)
    assert run.codes == {0: 0, 1: 72}, run.codes
    recs = run.trace(1)
    assert recs[-2]["action"] == "RankExit" and recs[-2]["state"]["reason"] == "deadline"
    assert "store_lost" in recs[-2]["detail"]
