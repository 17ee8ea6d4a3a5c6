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
from pathlib import Path

import pytest

pytest.importorskip("torch")

from accelpact.impl.exitcodes import ExitCode, code_for  # noqa: E402 - after the importorskip of torch
from accelpact.impl.trace import NullTrace, Trace  # noqa: E402 - after the importorskip of torch
from accelpact.model.state import EXIT_REASONS  # noqa: E402 - after the importorskip of torch


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


# ---- rank functions (run in spawned ranks by accelpact.testing) --------------------------------------

def blocked_in_collective(ctx, gloo_timeout_s: float) -> None:
    """Rank 0 issues an all-reduce its peer (rank 2) never joins (gloo timeout ``gloo_timeout_s``) and
    blocks waiting for it; rank 1 sleeps.  Ranks 0 and 1 each set ``wd/armed{rank}`` once their
    watchdog runs (rank 0: after issuing the collective); both must be ended by their watchdog when
    the test writes the abort key.  A marker file is written if the collective ever returns or raises
    (it must not).  Rank 2, the collective's other member, runs no watchdog and outlives rank 0: a
    member that exits first closes its sockets, and rank 0's collective would then raise "connection
    closed" before its watchdog read the abort (seen once in three runs when rank 1 was that member)."""
    import torch
    import torch.distributed as dist

    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.trace import Trace, trace_path
    from accelpact.impl.watchdog import Watchdog

    if ctx.rank != 1:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("blk", ctx.store), ctx.rank // 2, 2,
                                   datetime.timedelta(seconds=gloo_timeout_s))
    if ctx.rank == 2:
        _wait_until_gone(int(ctx.store.get("wd/pid0").decode()), timeout_s=gloo_timeout_s)
        os._exit(0)
    cp = ControlPlane(ctx.store, ctx.rank, 2, prefix="wd/")
    trace = Trace(trace_path(ctx.out, 0, ctx.rank), ctx.rank, {"world": 2})
    Watchdog(cp, trace=trace, gen_of=lambda: 7).start()
    if ctx.rank == 0:
        ctx.store.set("wd/pid0", str(os.getpid()))
        work = pg.allreduce([torch.ones(1)])  # issued; the peer never joins
        ctx.store.set("wd/armed0", "1")
        try:
            work.wait()
            (ctx.out / "collective-returned").write_text("returned")
        except RuntimeError as exc:
            (ctx.out / "collective-returned").write_text(f"raised {exc}")
    else:
        ctx.store.set("wd/armed1", "1")
        time.sleep(gloo_timeout_s * 2)  # the sleeping rank under test (not synchronisation)
    os._exit(5)


def _wait_until_gone(pid: int, timeout_s: float) -> None:
    """Until process ``pid`` has exited (gone, or a zombie its parent has not reaped yet), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)


def store_host(ctx) -> None:
    """Rank 0 hosts a second store and exits once rank 1's watchdog watches it; rank 1's watchdog
    must then exit DEADLINE (the store is lost)."""
    import torch.distributed as dist

    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.trace import Trace, trace_path
    from accelpact.impl.watchdog import Watchdog
    from accelpact.testing import HOST, client_store

    if ctx.rank == 0:
        inner = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
        ctx.store.set("inner_port", str(inner.port))
        ctx.store.wait(["client_ready"], datetime.timedelta(seconds=60))
        os._exit(0)  # takes the inner store down
    inner = client_store(int(ctx.store.get("inner_port")))
    cp = ControlPlane(inner, ctx.rank, ctx.world, prefix="lost/")
    trace = Trace(trace_path(ctx.out, 0, ctx.rank), ctx.rank, {"world": ctx.world})
    Watchdog(cp, trace=trace).start()
    ctx.store.set("client_ready", "1")
    time.sleep(60)  # the idle rank under test: only its watchdog may end it
    os._exit(5)


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_watchdog_exits_rank_blocked_in_gloo_collective(ranks, tmp_path):
    """S6: the abort key ends a rank whose main thread is blocked in a gloo collective (and a
    sleeping one), with the abort reason's code, before the collective returned or timed out.

    Ordering through the store: the abort is written only after rank 0 issued its collective and
    both watchdogs run (``wd/armed{r}``); each RankExit is recorded after the abort was written."""
    gloo_timeout_s = 45.0
    with ranks.start(blocked_in_collective, 3, timeout_s=40, gloo_timeout_s=gloo_timeout_s) as launch:
        launch.wait_keys(["wd/armed0", "wd/armed1"])
        t_abort = time.monotonic_ns()
        launch.store.compare_set("wd/abort", "", "rejected")
        run = launch.wait()
    assert run.codes == {0: 70, 1: 70, 2: 0}, run.explain()
    # the collective neither returned nor raised (its gloo timeout never fired) before the exit
    assert not (tmp_path / "collective-returned").exists(), (tmp_path / "collective-returned").read_text()
    for r in range(2):
        recs = run.trace(r)
        assert recs[-2]["action"] == "RankExit" and recs[-2]["state"] == {"pc": "exited", "reason": "rejected"}
        assert recs[-2]["gen"] == 7
        assert recs[-1]["type"] == "end" and recs[-1]["code"] == 70
        assert recs[-2]["t_ns"] >= t_abort


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_watchdog_exits_deadline_when_store_is_lost(ranks):
    """S7: the control-plane store's host dies; the watchdog exits DEADLINE (72)."""
    run = ranks.run(store_host, 2, timeout_s=50)
    assert run.codes == {0: 0, 1: 72}, run.explain()
    recs = run.trace(1)
    # the model's RankLoseStore: the store is gone, so no abort can be written or read
    assert recs[-2]["action"] == "RankLoseStore" and recs[-2]["state"]["reason"] == "deadline"
    assert "error" in recs[-2]["detail"]


def succession(ctx) -> None:
    """A watchdog retired (stopped, detached) and its successor started with ``succeed=``: one abort
    thread for both, acting for the successor (its RankExit carries generation 2) when the test writes
    the abort key."""
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.trace import Trace, trace_path
    from accelpact.impl.watchdog import Watchdog

    cp = ControlPlane(ctx.store, ctx.rank, ctx.world, prefix="wd/")
    trace = Trace(trace_path(ctx.out, 0, ctx.rank), ctx.rank, {"world": ctx.world})
    old = Watchdog(cp, trace=trace, gen_of=lambda: 1).start()
    old.stop()
    old.detach()
    new = Watchdog(cp, trace=trace, gen_of=lambda: 2).start(succeed=old)
    aborts = [t for t in threading.enumerate() if t.name == "accelpact-watchdog-abort" and t.is_alive()]
    (ctx.out / f"abort-threads-r{ctx.rank}").write_text(f"{len(aborts)} {new._abort is old._abort}")
    ctx.store.set(f"wd/armed{ctx.rank}", "1")
    time.sleep(60)  # the idle rank under test: only its watchdog may end it
    os._exit(5)


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_a_retired_watchdogs_abort_thread_is_taken_over(ranks, tmp_path):
    """Soak, stop 38: a retired engine's abort thread waited out its 30 s slice beside its successor's
    (the leak check counted it).  The successor takes it over: one abort thread, and the abort ends
    the rank as the successor's (generation 2)."""
    with ranks.start(succession, 1, timeout_s=40) as launch:
        launch.wait_keys(["wd/armed0"])
        launch.store.compare_set("wd/abort", "", "rejected")
        run = launch.wait()
    assert run.codes == {0: 70}, run.explain()
    assert (tmp_path / "abort-threads-r0").read_text() == "1 True"
    recs = run.trace(0)
    assert recs[-2]["action"] == "RankExit" and recs[-2]["gen"] == 2


def test_an_adopted_abort_thread_frees_its_predecessor_at_once():
    """Soak, stop 40: after every hot swap and discard each rank held two more store connections for
    up to 30 s (the retired watchdog's own two: the adopted abort thread's wait held its old owner
    until the slice ended), which the leak check read as growth.  Once its other threads have left, a
    retired watchdog is freed while the abort thread it handed over still waits in its slice."""
    import gc
    import weakref

    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.watchdog import Watchdog
    from accelpact.testing import HOST

    import torch.distributed as dist

    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    cp = ControlPlane(store, 0, 1, prefix="adopt/")
    old = Watchdog(cp, revoke_slice_s=0.2, slice_s=30.0).start()
    # the abort thread is inside its 30 s store wait, as in training: its innermost Python frame is
    # _loop (the wait is C++), not yet _current's
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(old._abort.thread.ident or -1)
        if frame is not None and frame.f_code.co_name == "_loop":
            break
        time.sleep(0.01)
    else:
        pytest.fail("the abort thread never reached its store wait")
    old.stop()
    old.detach()
    new = Watchdog(cp, revoke_slice_s=0.2, slice_s=30.0).start(succeed=old)
    try:
        assert new._abort is old._abort
        for t in old._threads[1:]:  # the old revoke and expire threads leave within their short slice
            t.join(5.0)
            assert not t.is_alive(), t.name
        gone = weakref.ref(old)
        del old
        gc.collect()
        assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
        assert new._abort.thread.is_alive()  # still in the slice it was adopted in
    finally:
        new.stop()
        assert new.wake_and_join(10.0)


def test_a_late_step_revoke_closes_its_own_generations_groups_only():
    """``accelpact bench goodput`` (full suite, stop 39): a rank's revoke thread read generation 0's
    step revoke 67 ms late, after the discard had built generation 1's groups, and closed those (the
    groups over W are read through the job, which by then named the new ones): the rerun step failed
    and was discarded a second time.  A revoke of generation g closes the groups g was watched with."""
    from accelpact.impl.runtime import revoke
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.watchdog import Watchdog
    from accelpact.testing import HOST

    import torch.distributed as dist

    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    cp = ControlPlane(store, 0, 2, prefix="late/")
    mine, old_w, new_w = (revoke.SocketRecord("gloo") for _ in range(3))
    current = {"wide": [old_w], "steps": [mine]}
    wd = Watchdog(cp, gen_of=lambda: 0, step_records=lambda: list(current["steps"]),
                  wide_records=lambda: list(current["wide"]), revoke_slice_s=0.2)
    wd.watch(0, "replicate", mine)
    current["wide"] = [new_w]   # the episode built generation 1's groups over W before the revoke was read
    wd.start()
    try:
        cp.publish_revoke(0, "replicate", step=True)
        deadline = time.monotonic() + 10
        while not wd.revocations and time.monotonic() < deadline:  # appended once the revoke's closes are done
            time.sleep(0.02)
        assert wd.revocations and mine.closed and old_w.closed, (wd.revocations, mine, old_w)
        assert not new_w.closed, "generation 0's revoke closed a group built for generation 1"
    finally:
        wd.stop()
        wd.wake_and_join(timeout_s=2)


def test_a_wide_revoke_closes_the_groups_over_w_and_is_recorded_for_the_flag():
    """A peer's wide revoke (its failure flag failed): the watcher closes this rank's groups over W, not
    R, and records when it did (``wide_revocations``), which bounds this rank's own wait in the flag
    (tests/test_flag_wait.py); R's list (``revocations``) stays empty."""
    from accelpact.impl.runtime import revoke
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.watchdog import Watchdog
    from accelpact.testing import HOST

    import torch.distributed as dist

    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    cp = ControlPlane(store, 0, 2, prefix="wide/")
    mine, wide = revoke.SocketRecord("gloo"), revoke.SocketRecord("gloo")
    wd = Watchdog(cp, gen_of=lambda: 0, step_records=lambda: [mine], wide_records=lambda: [wide], revoke_slice_s=0.2)
    wd.watch(0, "replicate", mine)
    wd.start()
    try:
        before = time.monotonic_ns()
        ControlPlane(store, 1, 2, prefix="wide/").publish_wide_revoke(0)  # the peer's
        deadline = time.monotonic() + 10
        while not wd.wide_revocations and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [(g, n) for g, n, _ in wd.wide_revocations] == [(0, 0)], wd.wide_revocations
        assert wd.wide_revocations[0][2] >= before
        assert wide.closed and not mine.closed and wd.revocations == []
    finally:
        wd.stop()
        wd.wake_and_join(timeout_s=2)
