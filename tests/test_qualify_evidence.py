"""Issue 26 item 5: what ``accelpact qualify`` records about where its trials ran (no processes, no GPU)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from accelpact.conformance import cli_qualify as Q
from accelpact.impl.runtime.backends import ONE_GPU_ENV
from accelpact.model.contract import DEFAULT_OBJECTIVE, ObservationKey


def _sc(name: str, nodes: int, per_node: int):
    return SimpleNamespace(name=name, topology=SimpleNamespace(nodes=nodes, ranks_per_node=per_node))


def _key(profile: str, platform: str = "cuda-nccl"):
    return ObservationKey(platform, profile, "boundary", DEFAULT_OBJECTIVE)


def test_nccl_evidence_records_topology_versions_and_transport():
    ev = Q.cell_evidence(_key("fsdp2-hybrid"), [_sc("2x2-fsdp2-repair", 2, 2)], backend_name="nccl", trials=4, passes=4,
                         torch_version="2.13.0", nccl="2.21.5", environ={"NCCL_SOCKET_IFNAME": "eth0"})
    assert ev["nodes"] == 2 and ev["ranks_per_node"] == 2 and ev["hosts"] == Q.QUALIFY_HOSTS == 1
    assert ev["backend"] == "nccl" and ev["torch"] == "2.13.0" and ev["nccl"] == "2.21.5"
    assert ev["transport"] == "NCCL_SOCKET_IFNAME=eth0"
    assert ev["inter_node"] is False  # two topology nodes, one host: nothing crossed a network
    assert ev["trials"] == 4 and ev["passes"] == 4 and ev["scenarios"] == ["2x2-fsdp2-repair"]
    assert "failures" not in ev


def test_nccl_transport_unknown_and_one_gpu_mode():
    assert Q.transport("nccl", {}) == Q.NCCL_TRANSPORT_UNKNOWN == "unknown: set by NCCL at init"
    t = Q.transport("nccl", {"NCCL_NET": "IB", "NCCL_HOSTID": "h1", "NCCL_SOCKET_IFNAME": "ib0"})
    assert t == "NCCL_NET=IB, NCCL_SOCKET_IFNAME=ib0, NCCL_HOSTID=h1"
    one = Q.transport("nccl", {ONE_GPU_ENV: "1"})
    assert "NCCL_NET=Socket" in one and "NCCL_HOSTID=accelpact-one-gpu-rank{LOCAL_RANK}" in one


def test_gloo_evidence_has_no_nccl_and_does_not_touch_cuda(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.cuda.nccl", raising=False)
    called = []
    monkeypatch.setattr(Q, "nccl_version", lambda: called.append(1) or "x")
    ev = Q.cell_evidence(_key("ddp", "cpu-gloo"), [_sc("2x2-ddp-repair", 2, 2)], backend_name="gloo", trials=1,
                         passes=1, torch_version="2.13.0", environ={})
    assert ev["nccl"] is None and not called and "torch.cuda.nccl" not in sys.modules
    assert ev["transport"] == "tcp loopback" and ev["backend"] == "gloo"
    assert Q.transport("gloo", {"GLOO_SOCKET_IFNAME": "eth1"}) == "tcp GLOO_SOCKET_IFNAME=eth1"


def test_nccl_version_is_none_on_a_cpu_build_or_looked_up():
    v = Q.nccl_version()
    assert v is None or isinstance(v, str)  # the CPU wheel: None
    ev = Q.cell_evidence(_key("ddp"), [_sc("s", 2, 1)], backend_name="nccl", trials=1, passes=0,
                         failures=["s trial 0: boom"], environ={})
    assert ev["nccl"] == v and ev["failures"] == ["s trial 0: boom"]


def test_single_node_hsdp_cell_is_marked_and_warned():
    ev = Q.cell_evidence(_key("fsdp1-hybrid"), [_sc("1x4", 1, 4)], backend_name="nccl", trials=1, passes=1,
                         nccl="2.21.5", hosts=4, environ={})
    assert ev["nodes"] == 1 and ev["inter_node"] is False
    w = Q.inter_node_warning(_key("fsdp1-hybrid"), ev)
    assert w is not None and "not qualified across nodes" in w


def test_multi_host_multi_node_is_inter_node_and_not_warned():
    ev = Q.cell_evidence(_key("hsdp"), [_sc("2x2", 2, 2)], backend_name="nccl", trials=1, passes=1, nccl="2.21.5",
                         hosts=2, environ={})
    assert ev["inter_node"] is True and Q.inter_node_warning(_key("hsdp"), ev) is None


def test_ddp_cells_are_not_warned():
    ev = Q.cell_evidence(_key("ddp"), [_sc("2x1", 2, 1)], backend_name="nccl", trials=1, passes=1, nccl="2", environ={})
    assert ev["inter_node"] is False and Q.inter_node_warning(_key("ddp"), ev) is None


def test_qualify_run_prints_the_warning_and_writes_the_evidence(tmp_path, monkeypatch, capsys):
    """``run`` with the scenarios faked (no processes): the HSDP cell's evidence and its warning."""
    import argparse

    from accelpact.conformance import runner
    from accelpact.impl.runtime import backends as B
    from accelpact.model.contract import load_envelope

    class Rep:
        conforms, problems = True, []

    monkeypatch.setattr(runner, "run_scenario", lambda sc, **kw: Rep())
    monkeypatch.setattr(B.Backend, "unavailable", lambda self, world: None)
    out = tmp_path / "env.json"
    ns = argparse.Namespace(backend="nccl", trials=1, out=str(out), wrappers="fsdp2-hybrid", phases="boundary",
                            swap_phases="", work=str(tmp_path / "w"), list=False)
    assert Q.run(ns) == 0
    assert "not qualified across nodes" in capsys.readouterr().out
    (entry,) = load_envelope(out).entries
    ev = entry.evidence
    assert ev["inter_node"] is False and ev["hosts"] == 1 and ev["backend"] == "nccl" and "transport" in ev
    assert ev["nodes"] == 2 and ev["ranks_per_node"] == 2 and "nccl" in ev and "torch" in ev
