"""Workload (S_app): topology arithmetic, deterministic corpus/batches/init, snapshots compared
with torch.equal, and state digests (RankValidate: replicas equal, a perturbation changes it).
Multi-process training itself is covered by tests/test_adapters_{fsdp1,fsdp2,ddp}.py (S6)."""
import pytest
import torch

from accelpact.impl.launch import workload as W
from accelpact.impl.launch.snapshots import compare_snapshots
from accelpact.impl.runtime.digest import state_digest


def test_topology_partitions_ranks():
    t = W.Topology(4, 2)
    assert t.world == 8
    assert [t.node_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert t.shard_ranks(1) == [2, 3] and t.replicate_ranks(1) == [1, 3, 5, 7]
    shards = sorted(r for n in range(4) for r in t.shard_ranks(n))
    reps = sorted(r for l in range(2) for r in t.replicate_ranks(l))
    assert shards == reps == list(range(8))
    for r in range(8):  # a shard group and a replicate group meet in exactly one rank
        assert set(t.shard_ranks(t.node_of(r))) & set(t.replicate_ranks(t.local_of(r))) == {r}
    assert t.mesh_ranks() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="nodes"):
        W.Topology(0, 2)


def test_spec_validation_names_the_problem():
    with pytest.raises(ValueError, match="unknown wrapper"):
        W.WorkloadSpec(wrapper="fsdp3")
    with pytest.raises(ValueError, match="divisible"):
        W.WorkloadSpec(dim=30, heads=4)


def test_corpus_is_shipped_english_prose():
    text = W.load_corpus()
    assert len(text) > 3000 and text.count(" the ") > 50
    assert 20 < W.vocab_size() < 100


def test_cursor_batches_are_pure_functions_of_step_and_dp_index():
    a = W.DataCursor(seed=0, batch_size=4, seq=16, dp_index=0, dp_size=4)
    b = W.DataCursor(seed=0, batch_size=4, seq=16, dp_index=0, dp_size=4)
    x0, y0 = a.batch(3)
    x1, y1 = b.batch(3)
    assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # next-char targets
    assert not torch.equal(a.batch(3, dp_index=1)[0], x0)  # data-parallel workers read different data
    assert not torch.equal(a.batch(4)[0], x0)
    assert not torch.equal(W.DataCursor(1, 4, 16, 0, 4).batch(3)[0], x0)
    assert x0.shape == (4, 16) and x0.dtype == torch.long


def test_model_init_is_deterministic_from_seed_and_trains():
    spec = W.WorkloadSpec(layers=2)
    torch.manual_seed(spec.seed)
    m1 = W.CharLM(W.vocab_size(), spec)
    torch.manual_seed(spec.seed)
    m2 = W.CharLM(W.vocab_size(), spec)
    for (n1, p1), (n2, p2) in zip(m1.named_parameters(), m2.named_parameters(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    x, y = W.DataCursor(0, 4, 16, 0, 1).batch(0)
    logits = m1(x)
    assert logits.shape == (4, 16, W.vocab_size())
    opt = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    first = None
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(m1(x).reshape(-1, W.vocab_size()), y.reshape(-1))
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert loss.item() < first


def _single_job():
    spec = W.WorkloadSpec(layers=1, wrapper="ddp")
    torch.manual_seed(spec.seed)
    m = W.CharLM(W.vocab_size(), spec)
    opt = torch.optim.AdamW(m.parameters(), lr=spec.lr)
    topo = W.Topology(1, 1)
    groups = W.Groups(topo=topo, rank=0, replicate=None, shard=None, world=None)
    return W.App(spec, topo, groups, m, opt, W.DataCursor(0, 4, 16, 0, 1))


def test_train_step_snapshot_and_compare():
    a, b = _single_job(), _single_job()
    for s in range(2):
        W.train_step(a, s)
        W.train_step(b, s)
    assert compare_snapshots(W.snapshot(a), W.snapshot(b)) == (True, "")
    assert a.step == a.cursor.kappa == 2
    with pytest.raises(ValueError, match="kappa=2"):
        W.train_step(a, 5)  # zero replay: no skipped or repeated step
    snap = W.snapshot(a)
    with torch.no_grad():
        next(a.module.parameters()).view(-1)[0] += 1
    ok, why = compare_snapshots(W.snapshot(a), snap)
    assert not ok and "['params']['pos']" in why
    W.train_step(b, 2)
    ok, why = compare_snapshots(W.snapshot(b), snap)
    assert not ok and "'step'" in why


def test_digest_equal_for_replicas_and_sensitive_to_every_part():
    a, b = _single_job(), _single_job()
    W.train_step(a, 0)
    W.train_step(b, 0)
    d = state_digest(a.module, a.optimizer)
    assert len(d) == 32 and d == state_digest(b.module, b.optimizer)
    assert state_digest(a.module) != d  # optimizer state is part of it
    st = a.optimizer.state[next(a.module.parameters())]
    st["exp_avg"].view(-1)[0] += 1e-6
    assert state_digest(a.module, a.optimizer) != d
    st["exp_avg"].view(-1)[0] -= 1e-6
    st["exp_avg"].copy_(b.optimizer.state[next(b.module.parameters())]["exp_avg"])
    assert state_digest(a.module, a.optimizer) == d
    st["step"] += 1  # step counts
    assert state_digest(a.module, a.optimizer) != d
