"""Issue 43, item 4: spares per node (impl/runtime/hotswap.py ``SpareLayout``, the keeper's ``lay_out``,
``accelpact launch --spares K``, the default replica count of ``accelpact.init``).

A node's spare slots are its own: with K spares per node the last K processes of each node
(``LOCAL_RANK >= LOCAL_WORLD_SIZE - K``) are spares, and the training ranks are numbered node after node
(``node * training_per_node + local``), so replicas (one per node by default) and shard groups keep their
node boundaries.  A claim for a dead identity takes an idle spare of its home node first.

The expected identities are the spec's (spec/hotswap.md, "Spares per node"), written out by hand here for
small layouts; the node of each torchrun slot is torchrun's own numbering (``RANK = node *
nproc_per_node + LOCAL_RANK``).  The two-agent torchrun run is ``tests/test_spares_per_node_torchrun.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelpact.impl.controlplane import NEXT_KEY, assign_key, spare_gone_key, spare_node_key
from accelpact.impl.launch import keeper
from accelpact.impl.launch.cli_launch import LaunchUsage, plan
from accelpact.impl.launch.job import Topology
from accelpact.impl.launch.launch import ProcessSet, worker_env
from accelpact.impl.runtime import hotswap
from accelpact.impl.runtime.hotswap import LayoutError, SpareLayout


def _torchrun_env(node: int, local: int, nodes: int, nproc: int, **extra: str) -> dict[str, str]:
    """What torchrun sets for the process in slot (node, local) of ``nodes`` agents of ``nproc`` each."""
    return {"RANK": str(node * nproc + local), "LOCAL_RANK": str(local), "WORLD_SIZE": str(nodes * nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node), **extra}


#: (nodes, processes per node, spares per node) -> the worker RANK of each torchrun slot, node by node, by
#: the spec: training ranks node * T + local, spare k = node * K + j given RANK W + k (W = nodes * T)
EXPECTED = {
    (2, 3, 1): [[0, 1, 4], [2, 3, 5]],                       # 2x(2+1): W=4, spares 0 (node 0) and 1 (node 1)
    (3, 5, 2): [[0, 1, 2, 9, 10], [3, 4, 5, 11, 12], [6, 7, 8, 13, 14]],
    (1, 5, 1): [[0, 1, 2, 3, 4]],                            # one node: the launcher's own numbering
    (2, 2, 1): [[0, 2], [1, 3]],
}


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_each_nodes_last_slots_are_its_spares_and_training_ranks_are_numbered_node_after_node(shape) -> None:
    nodes, nproc, per = shape
    got = []
    for node in range(nodes):
        row = []
        for local in range(nproc):
            layout, env, at = keeper.lay_out(_torchrun_env(node, local, nodes, nproc,
                                                           ACCELPACT_SPARES_PER_NODE=str(per)))
            assert layout is not None and at == node
            assert env["ACCELPACT_SPARES"] == str(nodes * per) and env["ACCELPACT_LAUNCHER_RANK"] == str(node * nproc + local)
            assert env["LOCAL_RANK"] == str(local) and env["WORLD_SIZE"] == str(nodes * nproc)  # the device: unchanged
            row.append(int(env["RANK"]))
        got.append(row)
    assert got == EXPECTED[shape]


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_replicas_and_shard_groups_keep_their_node_boundaries(shape) -> None:
    """With the default of one replica per node (``Topology(nodes, training per node)``, the groups
    ``accelpact.init`` builds), every shard group's members sit on one node and every node's training
    slots hold exactly one replica."""
    nodes, nproc, per = shape
    layout = SpareLayout(nodes, nproc, per)
    home = {}
    for node in range(nodes):
        for local in range(nproc):
            rank, spare = layout.place(node, local)
            assert (rank is None) == (local >= nproc - per)  # the last `per` slots of the node
            if rank is not None:
                home[rank] = node
    topo = Topology(nodes, nproc - per)
    assert sorted(home) == list(range(topo.world))
    for members in topo.groups_of_kind("shard"):
        assert len({home[r] for r in members}) == 1, f"shard group {members} spans nodes {[home[r] for r in members]}"
    for members in topo.groups_of_kind("replicate"):
        assert sorted(home[r] for r in members) == list(range(nodes)), "a replicate group holds one rank of each node"


@pytest.mark.parametrize("env, says", [
    (_torchrun_env(0, 0, 2, 3, ACCELPACT_SPARES="2"), "ACCELPACT_SPARES=2 on a job of 2 nodes"),
    (_torchrun_env(0, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="3"), "ACCELPACT_SPARES_PER_NODE=3 leaves no training rank"),
    (_torchrun_env(0, 0, 1, 2, ACCELPACT_SPARES="2"), "ACCELPACT_SPARES=2 leaves no training rank"),
    (_torchrun_env(0, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="1", ACCELPACT_SPARES="1"), "ACCELPACT_SPARES=1 disagrees"),
    ({**_torchrun_env(0, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="1"), "WORLD_SIZE": "7"}, "LOCAL_WORLD_SIZE=3 does not divide"),
    ({**_torchrun_env(1, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="1"), "LOCAL_RANK": "1"}, "LOCAL_RANK='1' with RANK=3"),
    (_torchrun_env(0, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="one"), "ACCELPACT_SPARES_PER_NODE='one' is not an integer"),
])
def test_a_layout_the_launcher_cannot_hold_is_refused_naming_the_variable(env, says) -> None:
    with pytest.raises(keeper.UsageError) as exc:
        keeper.lay_out(env)
    assert says in str(exc.value), str(exc.value)


def test_a_layout_without_training_ranks_or_a_slot_outside_it_is_refused() -> None:
    with pytest.raises(LayoutError, match="leaves no training rank"):
        SpareLayout(2, 3, 3)
    with pytest.raises(LayoutError, match="outside 2 node"):
        SpareLayout(2, 3, 1).place(2, 0)


def test_without_spares_nothing_changes() -> None:
    env = _torchrun_env(1, 1, 2, 3)
    assert keeper.lay_out(env) == (None, env, None)
    assert keeper.lay_out({**env, "ACCELPACT_SPARES_PER_NODE": "0"})[0] is None


# ------------------------------------------------------------------------------------------- claims

def _store():
    import torch.distributed as dist

    return dist.HashStore()


def test_a_claim_takes_the_dead_ranks_own_nodes_spare_first_then_another_nodes() -> None:
    """2x(2+1): rank 3 (node 1) dies: node 1's spare (1) takes it, not the lower-numbered spare of node 0.
    Then rank 2 (node 1 too) dies: node 1's spare is spent, node 0's (0) takes it.  Then nothing is left."""
    layout = SpareLayout(2, 3, 1)
    store = _store()
    assert hotswap.pool_covers(store, 0, (3,), spares=2)
    assert hotswap.claim_write(store, 0, 3, spares=2, layout=layout) == (True, 1)
    assert store.get(assign_key(1)).decode() == "3:0:" and not store.check([assign_key(0)])
    # the depose key of rank 3 names its new holder, though spare 0 (a lower index) is still idle
    assert hotswap.holder_since(store, 3) == 1 and hotswap.holder_since(store, 2) == 0
    assert hotswap.pool_covers(store, 1, (2,), spares=2) and not hotswap.pool_covers(store, 1, (2, 0), spares=2)
    assert hotswap.claim_write(store, 1, 2, spares=2, layout=layout) == (True, 0)
    assert store.get(assign_key(0)).decode() == "2:1:"
    assert (hotswap.holder_since(store, 3), hotswap.holder_since(store, 2)) == (1, 2)
    assert not hotswap.pool_covers(store, 2, (0,), spares=2)
    assert hotswap.claim_write(store, 2, 0, spares=2, layout=layout) == (True, None)
    assert hotswap.read_claims(store, 1, world=4) == {2: 0} and hotswap.read_claims(store, 0, world=4) == {3: 1}


def test_a_refilled_spare_is_its_keepers_nodes_and_is_taken_for_that_node_first() -> None:
    """Spare 1 (node 1) took rank 3; node 1's keeper refills spare 2 there and records its node.  Rank 2
    (node 1) then dies: spare 2 takes it, though node 0's spare 0 has the lower index; a gone spare of the
    node is passed over for another node's."""
    layout = SpareLayout(2, 3, 1)
    store = _store()
    assert hotswap.claim_write(store, 0, 3, spares=2, layout=layout) == (True, 1)
    env = {"RANK": "5", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3"}
    k, child = keeper.refill(store, _store(), env, spares=2, node=1)
    assert k == 2 and child["RANK"] == "6" and store.get(spare_node_key(2)).decode() == "1"
    assert keeper.PoolEntry(k).enter(store)  # ready: in the pool
    assert hotswap.claim_write(store, 1, 2, spares=2, layout=layout) == (True, 2)
    assert int(store.add(NEXT_KEY, 0)) >= 3, "swap/next bounds every index taken"
    # node 0's rank 1 dies and node 0's spare 0 died idle: no spare of node 0 is left, and none elsewhere
    store.set(spare_gone_key(0), "1")
    assert hotswap.claim_write(store, 2, 1, spares=2, layout=layout) == (True, None)


def test_a_claim_reads_the_layout_its_keeper_gave_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``layout=`` the claim reads the worker's environment (what ``lay_out`` set): the engine
    calls it so."""
    _, env, _ = keeper.lay_out(_torchrun_env(0, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="1"))
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELPACT_SPARES", "ACCELPACT_SPARES_PER_NODE"):
        monkeypatch.setenv(name, env[name])
    store = _store()
    assert hotswap.claim_write(store, 0, 2, spares=2) == (True, 1)  # rank 2 is node 1's: node 1's spare


def test_one_node_or_no_layout_takes_spares_by_index() -> None:
    store = _store()
    assert hotswap.claim_write(store, 0, 3, spares=2, layout=SpareLayout(1, 6, 2)) == (True, 0)
    assert hotswap.claim_write(store, 0, 2, spares=2, layout=None) == (True, 1)


# ------------------------------------------------------------------------------------------- launch

def test_accelpact_launch_counts_spares_per_node() -> None:
    for opt in (["--spares", "1"], ["--spares-per-node=1"]):
        p = plan(["--nnodes", "2", "--nproc-per-node", "3", *opt, "--", "t.py"], python="PY")
        assert p.env == {"ACCELPACT_SPARES_PER_NODE": "1"} and "of each node are spares" in p.summary()
        assert not any(a.startswith("--spares") for a in p.cmd)
    with pytest.raises(LaunchUsage, match="leaves no training rank on a node of --nproc-per-node 3"):
        plan(["--nnodes", "2", "--nproc-per-node", "3", "--spares", "3", "--", "t.py"])


_SHOW = "import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))"


@pytest.mark.multiproc
def test_the_keeper_starts_its_worker_under_its_slots_identity(tmp_path: Path) -> None:
    """torchrun's slot (node 1, LOCAL_RANK 0) of 2x(2+1): the worker runs as rank 2 (node 1's first training
    rank), its device and the launcher's sizes unchanged, the launcher's RANK 3 kept beside it."""
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELPACT_SPARES", "ACCELPACT_LAUNCHER_RANK"]
    env = worker_env(_torchrun_env(1, 0, 2, 3, ACCELPACT_SPARES_PER_NODE="1", MASTER_ADDR="127.0.0.1",
                                   ACCELPACT_REFILL="0"))
    env.pop("ACCELPACT_SPARES", None)
    out = tmp_path / "out.json"
    with open(out, "wb") as f, ProcessSet() as ps:
        p = ps.start([sys.executable, "-m", "accelpact.impl.launch.keeper_entry", "--", sys.executable, "-c", _SHOW, *names],
                     env=env, stdout=f)
        assert ps.wait(60) is False and p.returncode == 0, out.read_text()
    got = json.loads(out.read_text().strip().splitlines()[-1])
    assert got == {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3", "ACCELPACT_SPARES": "2",
                   "ACCELPACT_LAUNCHER_RANK": "3"}


# ------------------------------------------------------------------------------------------- init

_INIT = """
import datetime, json, os, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
os.environ.update(json.loads(sys.argv[1]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
import accelpact
job = accelpact.init("gloo")
print(json.dumps({"replicas": job.replicas, "world": job.world, "spare": job.spare}), flush=True)
os._exit(0)
"""


@pytest.mark.multiproc
@pytest.mark.parametrize("nodes, nproc, per", [(2, 3, 1), (2, 9, 1), (1, 5, 1)])
def test_the_default_replica_count_is_one_per_node_with_spares(tmp_path: Path, nodes: int, nproc: int, per: int) -> None:
    """``accelpact.init`` on node 0's spare slot, in the environment its keeper gives it: the default
    replica count is the number of nodes (two 8+1 nodes: 2, not 1), the training world W."""
    _, env, _ = keeper.lay_out(_torchrun_env(0, nproc - 1, nodes, nproc, ACCELPACT_SPARES_PER_NODE=str(per)))
    given = {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELPACT_SPARES")}
    given["ACCELPACT_PG_TIMEOUT_S"] = "10"  # a slot wrongly made a training rank waits for its peers: 10 s, not 120
    base = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    proc = subprocess.run([sys.executable, "-c", _INIT, json.dumps(given)], capture_output=True, text=True, timeout=120,
                          env=base, cwd=os.getcwd())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"replicas": nodes, "world": nodes * (nproc - per), "spare": 0}
