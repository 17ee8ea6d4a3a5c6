"""Revoke: hard-closing a gloo group's connected sockets unblocks its peers in milliseconds.

Spec ids: S6 (a revoke reaches every member of R blocked in a collective), P1 (phase 1:
members publish revoke; the watchdog performs it).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import weakref

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.runtime import revoke  # noqa: E402 - after the importorskip of torch


def revoke_peers(ctx, gloo_timeout_s: float) -> None:
    """Every rank but the last issues an all-reduce on a recorded gloo group (long gloo timeout)
    and blocks on it; the last rank publishes the revoke of the group instead of joining, once
    every peer has issued its collective (``rv/issued`` counted through the store).  The peers
    must be unblocked by their watchdog's hard close."""
    import torch.distributed as dist

    from accelpact.impl.runtime import revoke
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.watchdog import Watchdog

    pg, rec = revoke.recorded(lambda: dist.ProcessGroupGloo(dist.PrefixStore("rv", ctx.store), ctx.rank, ctx.world,
                                                           datetime.timedelta(seconds=gloo_timeout_s)))
    listening = [fd for fd, ino in revoke.socket_inodes().items() if ino not in revoke.established_inodes()]
    (ctx.out / f"record-r{ctx.rank}.json").write_text(json.dumps({"sockets": [list(x) for x in rec.sockets],
                                                                  "non_established_fds": listening}))
    cp = ControlPlane(ctx.store, ctx.rank, ctx.world, prefix="rv/")
    wd = Watchdog(cp, gen_of=lambda: 0).start()
    wd.watch(0, "replicate", rec)
    peers = ctx.world - 1
    if ctx.rank == peers:
        ctx.store.wait(["rv/all-issued"], datetime.timedelta(seconds=60))
        cp.publish_revoke(0, "replicate")
        os._exit(0)
    work = pg.allreduce([torch.ones(1)])  # issued; the last rank never joins
    if ctx.store.add("rv/issued", 1) == peers:
        ctx.store.set("rv/all-issued", "1")
    try:
        work.wait()
        outcome = "returned"
    except RuntimeError as exc:
        outcome = f"raised: {exc}"
    (ctx.out / f"outcome-r{ctx.rank}.json").write_text(json.dumps({"outcome": outcome,
                                                                   "revocations": len(wd.revocations)}))
    wd.stop()
    os._exit(0)


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_revoke_unblocks_peers_blocked_in_collective(ranks, tmp_path):
    """Ranks 0-2 block in an all-reduce with a 45 s gloo timeout; rank 3 publishes the revoke
    (after all three issued it) instead of joining.  Each blocked rank's watchdog hard-closes the
    group's sockets and the collective raises a connection error, not its gloo timeout."""
    run = ranks.run(revoke_peers, 4, timeout_s=40, gloo_timeout_s=45.0)
    assert run.codes == {0: 0, 1: 0, 2: 0, 3: 0}, run.explain()
    outcomes = [json.loads((tmp_path / f"outcome-r{r}.json").read_text()) for r in range(3)]
    for r, res in enumerate(outcomes):
        assert res["outcome"].startswith("raised"), (r, res)
        # a closed connection, not the gloo timeout, ended the collective
        assert "timed out" not in res["outcome"].lower() and "timeout" not in res["outcome"].lower(), (r, res)
    # a watchdog performed the revoke (a peer whose connections a faster peer's hard close
    # already broke may be unblocked before its own watchdog acts)
    assert sum(res["revocations"] for res in outcomes) >= 1, outcomes
    for r in range(4):
        rec = json.loads((tmp_path / f"record-r{r}.json").read_text())
        assert len(rec["sockets"]) >= 1, "the group's connected sockets were recorded"
        assert not {fd for fd, _ in rec["sockets"]} & set(rec["non_established_fds"]), "never a LISTEN socket"


def post_after_revoke(ctx, gloo_timeout_s: float) -> None:
    """Both ranks build a recorded gloo group (timeout ``gloo_timeout_s``) and complete one all-reduce;
    rank 0 revokes it (hard close, no op pending), then both post another all-reduce on it.  Each
    writes how its op ended, how long it took and the group's timeout after the revoke."""
    import time

    import torch.distributed as dist

    from accelpact.impl.runtime import revoke

    raw, rec = revoke.recorded(lambda: dist.ProcessGroupGloo(dist.PrefixStore("pr", ctx.store), ctx.rank, ctx.world,
                                                            datetime.timedelta(seconds=gloo_timeout_s)))
    raw.allreduce([torch.ones(1)]).wait()
    ctx.store.add("pr/ready", 1)
    ctx.store.wait(["pr/ready"], datetime.timedelta(seconds=30))
    if ctx.rank == 0:
        revoke.hard_close(rec)
        ctx.store.set("pr/revoked", "1")
    ctx.store.wait(["pr/revoked"], datetime.timedelta(seconds=30))
    t0 = time.monotonic()
    try:
        raw.allreduce([torch.ones(1)]).wait()
        outcome = "returned"
    except RuntimeError as exc:
        outcome = f"raised: {exc}"
    (ctx.out / f"posted-r{ctx.rank}.json").write_text(json.dumps({
        "outcome": outcome, "seconds": time.monotonic() - t0, "closed": rec.closed,
        "timeout_s": raw.options._timeout.total_seconds()}))
    os._exit(0)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_an_op_posted_on_a_revoked_group_fails_within_the_revoked_timeout(ranks, tmp_path):
    """A revoked gloo group's later ops take :data:`revoke.REVOKED_TIMEOUT_S`, not its own 60 s: an op
    posted on sockets shut down while none was pending can otherwise stay blocked until the group's
    timeout (spec/torch-facts.md), and a rank stuck so misses its episode.  Rank 0 revokes with no op
    pending; both ranks then post an all-reduce: each raises (a closed connection, or at worst the
    short timeout), and rank 0's group now carries the short timeout."""
    run = ranks.run(post_after_revoke, 2, timeout_s=100, gloo_timeout_s=60.0)
    assert run.codes == {0: 0, 1: 0}, run.explain()
    res = [json.loads((tmp_path / f"posted-r{r}.json").read_text()) for r in range(2)]
    assert res[0]["closed"] and res[0]["timeout_s"] == revoke.REVOKED_TIMEOUT_S, res[0]
    for r, x in enumerate(res):
        assert x["outcome"].startswith("raised"), (r, x)
    assert res[0]["seconds"] < 30.0, f"rank 0's op on its revoked group took {res[0]['seconds']:.1f} s (group timeout 60 s)"


def engine_groups_revoked(ctx, group_timeout_s: float, wait_s: float) -> None:
    """Both ranks build gloo groups as the engine builds them, each with the timeout ``group_timeout_s``:
    the default group (``init_process_group`` inside :func:`revoke.recorded`, as ``accelpact.init``), a
    ``new_group`` (the control and checkpoint groups at init), a :meth:`Backend.build_group` group (every
    rebuilt group), and a ``new_group`` given :func:`revoke.record_group` (a user's mesh group).  Rank 0
    revokes each through :func:`revoke.hard_close` of its record with the sockets left out (the op below
    can then end only by its timeout, as one on a pair that never sees its peer's shutdown: K6), then
    posts an all-reduce on each; rank 1 never joins them and stays until rank 0 is done (its exit would
    close the connections).  Rank 0 writes, per group, how its op ended within ``wait_s`` (a wait bound
    far below ``group_timeout_s``) and the group's timeout read back from torch."""
    import dataclasses
    import time

    import torch.distributed as dist

    from accelpact.impl.runtime import revoke
    from accelpact.impl.runtime.backends import backend

    be, td = backend("gloo"), datetime.timedelta(seconds=group_timeout_s)
    _, default_rec = revoke.recorded(lambda: dist.init_process_group(
        "gloo", store=dist.PrefixStore("eg", ctx.store), rank=ctx.rank, world_size=ctx.world, timeout=td))
    groups = {"default": (dist.distributed_c10d._get_default_group(), default_rec)}
    groups["new_group"] = revoke.recorded(lambda: dist.new_group(list(range(ctx.world)), backend="gloo", timeout=td))
    groups["build_group"] = be.build_group(dist.PrefixStore("eg/built", ctx.store), ctx.rank, ctx.world, name="eg/built",
                                           global_ranks=list(range(ctx.world)), connect_timeout_s=30.0,
                                           timeout_s=group_timeout_s)
    mesh_like = dist.new_group(list(range(ctx.world)), backend="gloo", timeout=td)
    groups["record_group"] = (mesh_like, revoke.record_group(mesh_like, "gloo"))
    for pg, _ in groups.values():  # every group works, and the peer is connected on each
        pg.allreduce([torch.ones(1)]).wait()
    ctx.store.add("eg/ready", 1)
    ctx.store.wait(["eg/ready"], datetime.timedelta(seconds=30))
    while ctx.store.add("eg/ready", 0) < ctx.world:
        time.sleep(0.01)
    if ctx.rank != 0:
        ctx.store.wait(["eg/done"], datetime.timedelta(seconds=wait_s + 60))
        os._exit(0)
    before = {k: be.timeout_of(pg) for k, (pg, _) in groups.items()}
    works = {}
    for k, (pg, rec) in groups.items():
        revoke.hard_close(dataclasses.replace(rec, sockets=()))  # the revoke, less its socket shutdown
        works[k] = pg.allreduce([torch.ones(1)])  # posted after the revoke; rank 1 never joins it
    deadline = time.monotonic() + wait_s
    out = {}
    for k, work in works.items():
        try:
            work.wait(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            outcome = "returned"
        except RuntimeError as exc:
            outcome = f"raised: {exc}"
        out[k] = {"outcome": outcome, "completed": work.is_completed(), "before": before[k],
                  "after": be.timeout_of(groups[k][0])}
    (ctx.out / "engine-groups.json").write_text(json.dumps(out))
    ctx.store.set("eg/done", "1")
    os._exit(0)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_revoke_shortens_the_timeout_of_every_kind_of_group_the_engine_builds(ranks, tmp_path):
    """The revoke gives every group the engine revokes :data:`revoke.REVOKED_TIMEOUT_S`, not only a bare
    ``ProcessGroupGloo``: the default group, a ``new_group``, a :meth:`Backend.build_group` group and one
    recorded with :func:`revoke.record_group`, each built with a 300 s timeout.  An all-reduce posted on
    each after its revoke, which the peer never joins, fails by its timeout (raised, the op completed)
    within the 30 s the test waits, and torch reads the short timeout back.  With the record's weak
    reference to a temporary backend wrapper (the defect), each op is still pending when the wait ends."""
    run = ranks.run(engine_groups_revoked, 2, timeout_s=100, group_timeout_s=300.0, wait_s=30.0)
    assert run.codes == {0: 0, 1: 0}, run.explain()
    res = json.loads((tmp_path / "engine-groups.json").read_text())
    assert set(res) == {"default", "new_group", "build_group", "record_group"}, res
    for kind, x in res.items():
        assert x["before"] == 300.0, (kind, x)  # built with the group timeout, read back from torch
        assert x["after"] == revoke.REVOKED_TIMEOUT_S, (kind, x)
        assert x["completed"] and x["outcome"].startswith("raised"), (kind, x)  # the op ended, not the wait
        assert "timed out" in x["outcome"].lower(), (kind, x)  # by its timeout: the peer never joined


def test_hard_close_skips_reused_fd():
    """An fd recorded for a freed group that now names another socket is left alone."""
    a, b = socket.socketpair()
    try:
        rec = revoke.SocketRecord("gloo", ((a.fileno(), os.fstat(a.fileno()).st_ino + 1),))
        assert revoke.hard_close(rec) == 0
        a.send(b"x")
        assert b.recv(1) == b"x"  # still connected
        rec2 = revoke.SocketRecord("gloo", ((a.fileno(), os.fstat(a.fileno()).st_ino),))
        assert revoke.hard_close(rec2) == 1
        assert b.recv(1) == b""  # peer sees the shutdown
        a.fileno()  # the recorded fd itself is still open (only the dup was closed)
        os.fstat(a.fileno())
    finally:
        a.close()
        b.close()



def test_connected_tcp_tells_connected_tcp_sockets_from_the_rest():
    """What the record keeps: connected TCP sockets only; never a listener (shutting a group's LISTEN
    socket down aborts the process), a unix socket, a pipe or a closed fd.  Checked against the
    kernel's own table (/proc/net/tcp), and the socket is left working."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        est = revoke.established_inodes()
        for s in (client, server):
            assert revoke.connected_tcp(s.fileno())
            assert os.fstat(s.fileno()).st_ino in est
        assert not revoke.connected_tcp(listener.fileno())
        assert os.fstat(listener.fileno()).st_ino not in est
        assert not revoke.connected_tcp(a.fileno())
        assert not revoke.connected_tcp(r)
        closed = os.dup(r)
        os.close(closed)
        assert not revoke.connected_tcp(closed)
        client.sendall(b"x")  # the check's duplicate was closed, the socket is still connected
        assert server.recv(1) == b"x"
    finally:
        for s in (client, server, listener, a, b):
            s.close()
        os.close(r)
        os.close(w)


class _FakeNCCLBackend:
    def __init__(self, log):
        self.log = log

    def _group_start(self):
        self.log.append("start")

    def _group_end(self):
        self.log.append("end")


class _FakeGroup:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def _get_backend(self, device):
        assert str(device) == "cuda"
        return _FakeNCCLBackend(self.log)

    def abort(self):
        self.log.append(f"abort {self.name}")


def test_a_ranks_nccl_groups_are_aborted_together_in_one_bracket_each_once():
    """Serial ncclCommAbort calls of one process can deadlock (pytorch#119797, NVIDIA/nccl#1013):
    a revoke that closes several NCCL groups aborts them inside one group start/end, as torch's
    _abort_process_group does for the world; a group already aborted is not aborted again."""
    log: list[str] = []
    a, b, c = (_FakeGroup(n, log) for n in "abc")
    recs = [revoke.SocketRecord(backend="nccl", group_ref=weakref.ref(g)) for g in (a, b, c)]
    revoke.hard_close_all([recs[0], None, recs[1], recs[2], recs[1]])
    assert log == ["start", "abort a", "abort b", "abort c", "end"]
    assert all(r.closed for r in recs)
    log.clear()
    revoke.hard_close_all(recs)
    assert log == []


def test_a_single_nccl_group_is_aborted_without_a_bracket():
    log: list[str] = []
    g = _FakeGroup("x", log)
    revoke.hard_close_all([revoke.SocketRecord(backend="nccl", group_ref=weakref.ref(g))])
    assert log == ["abort x"]


def default_group_recorded_as_an_abort_backend(ctx) -> None:
    """One rank builds the default group inside :func:`sockets.record_sockets` as an ``abort`` backend
    records it (NCCL's path in ``accelpact.init``; gloo here, only the record is read) and writes whether
    the record refers to the default group c10d installed."""
    import torch.distributed as dist

    from accelpact.impl.runtime.sockets import record_sockets

    group, rec = record_sockets(lambda: dist.init_process_group(
        "gloo", store=dist.PrefixStore("dg", ctx.store), rank=ctx.rank, world_size=ctx.world), "nccl", aborts=True)
    default = dist.distributed_c10d._get_default_group()
    (ctx.out / "default-record.json").write_text(json.dumps(
        {"returned": group is not None, "refers": rec.group is default, "ref": rec.group_ref is not None}))
    os._exit(0)


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_an_nccl_default_group_built_by_the_engine_is_what_its_record_aborts(ranks, tmp_path):
    """``init_process_group`` returns None, so the record of the default group the engine builds must
    find the group c10d installed: on NCCL a wide revoke aborts it through that reference (a peer held in
    FSDP1's state-dict gathers on it wakes).  The defect: a weak reference to the build's None, so the
    record referred to nothing and the default group was never aborted."""
    run = ranks.run(default_group_recorded_as_an_abort_backend, 1, timeout_s=40)
    assert run.codes == {0: 0}, run.explain()
    res = json.loads((tmp_path / "default-record.json").read_text())
    assert res == {"returned": False, "refers": True, "ref": True}, res
