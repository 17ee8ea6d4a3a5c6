"""``accelpact bench scale``: the counting instrumentation (impl/runtime/counting.py) in one process,
the cost model's arithmetic against hand-computed values from the cited constants, and one small
real run (W=4, one episode kind).

The counting store is checked against a real ``TCPStore`` and ``HashStore``: each count equals the
operations issued, and gloo's rendezvous through ``PrefixStore(prefix, counting)`` is counted for
real, its number checked against an independent source (the keys it leaves in the store).  The
socket counter is checked against sockets this test opens itself.
"""

from __future__ import annotations

import datetime
import json
import math
import socket
import threading

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402 - after the torch skip

from accelpact.impl.runtime import counting  # noqa: E402 - after the torch skip


@pytest.fixture
def counting_on(tmp_path, monkeypatch):
    monkeypatch.setenv(counting.ENV, str(tmp_path / "counts"))
    before = counting.counts()
    yield tmp_path / "counts"
    del before


def _delta(before: dict, after: dict, prefix: str) -> dict:
    out = {}
    for k, v in after.items():
        if k.startswith(prefix) and v != before.get(k, 0):
            out[k.rsplit("/", 1)[1]] = out.get(k.rsplit("/", 1)[1], 0) + v - before.get(k, 0)
    return out


def test_off_by_default_returns_its_argument(monkeypatch):
    monkeypatch.delenv(counting.ENV, raising=False)
    s = dist.HashStore()
    assert counting.wrap_store(s) is s
    assert counting.count_group(("pg", "rec"), "gloo") == ("pg", "rec")
    assert counting.snapshot("x") is None


@pytest.mark.parametrize("kind", ["hash", "tcp"])
def test_counting_store_counts_each_operation_issued(counting_on, kind):
    if kind == "hash":
        real = dist.HashStore()
    else:
        real = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    cs = counting.wrap_store(real)
    assert counting.real_store(cs) is real
    before = counting.counts()
    issued = {"set": 3, "get": 2, "add": 4, "check": 1, "wait": 2, "multi_get": 1, "multi_set": 1, "compare_set": 1,
              "append": 1}
    for i in range(3):
        cs.set(f"k{i}", "v")
    for _ in range(2):
        assert cs.get("k0") == b"v"
    for _ in range(4):
        cs.add("n", 1)
    assert cs.check(["k1"])
    cs.wait(["k1"])
    cs.wait(["k2"], datetime.timedelta(seconds=5))
    assert cs.multi_get(["k0", "k1"]) == [b"v", b"v"]
    cs.multi_set(["a", "b"], ["1", "2"])
    cs.compare_set("a", "1", "9")
    cs.append("k0", "w")
    got = _delta(before, counting.counts(), "store/")
    assert got == issued
    # the independent source: the store itself holds what the counted calls did
    assert int(real.add("n", 0)) == 4 and real.get("a") == b"9" and real.get("k0") == b"vw"
    # through a PrefixStore (the C++ trampoline forwards these to the Python overrides)
    before = counting.counts()
    ps = dist.PrefixStore("p", cs)
    ps.set("x", "1")
    ps.get("x")
    ps.add("y", 2)
    ps.wait(["x"], datetime.timedelta(seconds=5))
    ps.multi_get(["x"])
    assert _delta(before, counting.counts(), "store/") == {"set": 1, "get": 1, "add": 1, "wait": 1, "multi_get": 1}
    assert real.get("p/x") == b"1"


def test_gloo_rendezvous_through_a_counting_store_is_counted(counting_on):
    """Two gloo ranks (threads) build a group through PrefixStore(prefix, counting): the sets are one
    per rank (its address), checked against the keys the rendezvous left in the real store."""
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    stores = [counting.wrap_store(dist.TCPStore("127.0.0.1", master.port, None, False,
                                                timeout=datetime.timedelta(seconds=30))) for _ in range(2)]
    before = counting.counts()
    keys0 = master.num_keys()
    pgs: list = [None, None]

    def build(r: int) -> None:
        pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore("rdv", stores[r]), r, 2, datetime.timedelta(seconds=20))

    threads = [threading.Thread(target=build, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(pgs)
    got = _delta(before, counting.counts(), "store/")
    assert got.get("set", 0) >= 2, got                              # at least its address, per rank
    assert got.get("get", 0) + got.get("multi_get", 0) >= 2, got    # each reads its peer's
    # the independent source: every counted set left one new key in the real store
    assert master.num_keys() - keys0 == got.get("set", 0) + sum(1 for k in ("add",) if got.get(k)), got


def test_socket_counter_sees_new_sockets(counting_on):
    base = counting.socket_inodes()
    socks = [socket.socket() for _ in range(3)]
    try:
        now = counting.socket_inodes()
        mine = {s.fileno() for s in socks}
        assert len(now - base) == 3 == len(mine)
        rec = counting.snapshot("a")
        socks.append(socket.socket())
        rec2 = counting.snapshot("b")
        assert rec is not None and rec2 is not None
        assert rec2["sockets_new"] == 1 and rec2["sockets_open"] == rec["sockets_open"] + 1
        lines = (counting_on / f"counts-p{__import__('os').getpid()}.ndjson").read_text().splitlines()
        assert [json.loads(x)["label"] for x in lines][-2:] == ["a", "b"]
    finally:
        for s in socks:
            s.close()


def test_collectives_are_counted_with_rounds(counting_on):
    counting.install()
    store = dist.HashStore()
    pg = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=10))
    wrapper = dist.ProcessGroup(store, 0, 1)
    wrapper._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, pg)
    wrapper._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    before = counting.counts()
    t = torch.zeros(2)
    wrapper.allreduce([t]).wait()
    wrapper.broadcast([t]).wait()
    got = _delta(before, counting.counts(), "coll/")
    assert got == {"allreduce@1": 1, "broadcast@1": 1}
    assert counting.rounds("allreduce", 8) == 14 and counting.rounds("allgather", 8) == 7
    assert counting.rounds("broadcast", 1024) == 10 and counting.rounds("barrier", 5) == 3
    assert counting.rounds("send", 64) == 1 and counting.rounds("recv", 64) == 0


def test_group_creation_counted(counting_on):
    before = counting.counts()
    counting.count_group(("pg", None), "gloo")
    counting.count_group(dist.GroupMember.NON_GROUP_MEMBER, "gloo")
    got = _delta(before, counting.counts(), "groups/")
    assert got == {"gloo@?": 1, "gloo-nonmember": 1}


# --------------------------------------------------------------------------------- the cost model

def test_growth_class_fit():
    from accelpact.bench import scale

    ws = [8, 16, 32, 64]
    assert scale.growth_class(ws, [5, 5, 5, 5]) == "constant"
    assert scale.growth_class(ws, [3 + 2 * math.log2(w) for w in ws]) == "log"
    assert scale.growth_class(ws, [4 + 3 * w for w in ws]) == "linear"
    assert scale.growth_class(ws, [w * w for w in ws]) == "quadratic"
    assert scale.growth_class([8, 16], [42, 78]) == "linear"      # two points: by the exponent (0.89)
    assert scale.growth_class([8, 16], [20, 30]) == "log"         # exponent 0.58


def test_cost_model_arithmetic_from_the_cited_constants():
    from accelpact.bench import scale

    c = scale.CONSTANTS
    # per-rank episode: 4 group creations, 6 connections, 30 store ops, 2 log2(W) rounds
    counts = {"groups": 4, "connections": 6, "store_ops": 30, "rounds": 2 * 14}
    got = scale.model_episode_s(counts, 16384)
    want = (4 * c["group_create_s"]["value"] + 6 * c["connect_s"]["value"]
            + 30 * c["store_rtt_s"]["value"] + 28 * c["hop_s"]["value"]
            + 30 * 16384 / c["store_ops_per_s"]["value"])
    assert got["total_s"] == pytest.approx(want)
    # the store term alone: 30 ops per rank, 16,384 ranks, one store at 79.7k ops/s
    assert got["store_serial_s"] == pytest.approx(30 * 16384 / 79_700)
    # a full-W gloo group at 16k ranks, log-log beyond gloo#408's fixed 25 s at 4k and 85 s at 8k: 85 * 85/25
    assert scale.gloo_init_s(16384) == pytest.approx(85.0 * 85.0 / 25.0)
    assert scale.gloo_init_s(4096) == pytest.approx(25.0) and scale.gloo_init_s(2048, fixed=False) == pytest.approx(82.0)
    # torchrun restart of a job whose init builds 3 groups over all of W
    r = scale.model_restart_s(16384, 3)
    assert r["pg_init_s"] == pytest.approx(3 * 289.0)
    assert r["total_s"] == pytest.approx(r["pg_init_s"] + c["restart_fixed_s"]["value"] + c["replay_s"]["value"])
    # the fault-free step: (answered store ops x RTT + rounds x hop) / (1 - rho), rho the one store's load:
    # 2 ops per rank per 1 s step (one a set, not waited for) plus 1 op/s of background, 16,384 ranks
    s = scale.model_step_s({"store_ops": 2, "store_rtts": 1, "rounds": 14}, 16384, background_per_s=1.0)
    rho = 3 * 16384 / c["store_ops_per_s"]["value"]
    assert s["store_utilization"] == pytest.approx(rho)
    assert s["total_s"] == pytest.approx((c["store_rtt_s"]["value"] + 14 * c["hop_s"]["value"]) / (1 - rho))
    # a store past its capacity: the step waits without bound
    assert scale.model_step_s({"store_ops": 2, "store_rtts": 1, "rounds": 14}, 16384, background_per_s=10.0)["total_s"] == math.inf


# ------------------------------------------------------------------------------------- a real run

@pytest.mark.multiproc
def test_small_real_run(tmp_path):
    from accelpact.bench import scale

    row = scale.measure_world(4, ["repair"], tmp_path / "w4", timeout=240.0)
    assert row["ok"], row.get("error")
    ep = row["episodes"]["repair"]
    assert ep["groups"]["max"] >= 1            # a repair builds groups
    assert ep["store_ops"]["max"] >= 1
    assert row["step"]["store_ops"]["median"] is not None
