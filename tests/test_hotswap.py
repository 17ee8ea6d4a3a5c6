"""Hot swap's building blocks (impl/runtime/hotswap.py), one process each: the state a spare receives, the
single-assignment claim and its pool, the death notices, the decision.  The end-to-end swaps (a real
SIGKILL, a spare taking the identity, bit-identical to an uninterrupted run) are the conformance
scenarios ``*-spare*`` (conformance/test_conformance.py) and tests/test_demo.py's path (d)."""

from __future__ import annotations

import datetime

import pytest
import torch

from accelpact.impl.runtime import hotswap
from accelpact.impl.launch.keeper import post_death


def _store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))


def _model_and_optim(seed: int, steps: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    model.register_buffer("seen", torch.zeros(2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    for i in range(steps):
        model(torch.randn(4, 6)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.seen += i
    return model, opt


def test_state_moves_bit_for_bit_into_a_model_built_the_same_way():
    """What a spare receives (export -> import into a fresh build) equals the source exactly: every
    parameter, buffer and optimizer state entry, in the optimizer's own order (its state_dict)."""
    src, src_opt = _model_and_optim(0, 3)
    dst, dst_opt = _model_and_optim(1, 0)  # other values, no optimizer state yet
    manifest, tensors = hotswap.export_state(src, src_opt)
    received = [t.clone() for t in tensors]  # what crosses the wire
    hotswap.import_state(dst, dst_opt, manifest, received)
    for (n, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    sa, sb = src_opt.state_dict(), dst_opt.state_dict()
    assert list(sa["state"]) == list(sb["state"])
    for i in sa["state"]:
        assert list(sa["state"][i]) == list(sb["state"][i])
        for k in sa["state"][i]:
            assert torch.equal(torch.as_tensor(sa["state"][i][k]), torch.as_tensor(sb["state"][i][k])), (i, k)
    assert sa["param_groups"] == sb["param_groups"]
    # one more step on both gives the same result: nothing of the state was left behind
    x = torch.randn(4, 6)
    for m, o in ((src, src_opt), (dst, dst_opt)):
        m(x).pow(2).sum().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(src.parameters(), dst.parameters(), strict=True))


def test_slots_match_the_manifest_and_a_wrong_build_is_refused():
    src, src_opt = _model_and_optim(0, 2)
    manifest, tensors = hotswap.export_state(src, src_opt)
    dst, dst_opt = _model_and_optim(1, 0)
    slots = hotswap.receive_slots(dst, dst_opt, manifest, torch.device("cpu"))
    assert [(t.dtype, t.shape) for t in slots] == [(t.dtype, t.shape) for t in tensors]
    other = torch.nn.Linear(6, 3)
    with pytest.raises(hotswap.SwapError, match="rebuild it as it was built"):
        hotswap.import_state(other, torch.optim.AdamW(other.parameters()), manifest, tensors)
    with pytest.raises(hotswap.SwapError, match="rebuild it as it was built"):
        hotswap.receive_slots(other, torch.optim.AdamW(other.parameters()), manifest, torch.device("cpu"))


def test_claim_is_single_assignment_and_the_pool_runs_out():
    """RankClaimSpare: only the first survivor to claim for a dead rank writes (and so records) the
    claim; every survivor reads the same spare; each dead rank takes its own; with the pool empty the
    claim stands as None (L2)."""
    store = _store()
    writes = [hotswap.claim_write(store, 0, 1, spares=2) for _ in range(3)]
    assert writes == [(True, 0), (False, None), (False, None)]
    assert [hotswap.claim_read(store, 0, 1, timeout_s=1) for _ in range(3)] == [0, 0, 0]
    assert store.get(hotswap.assign_key(0)).decode() == "1:0:"
    assert hotswap.claim_write(store, 0, 3, spares=2) == (True, 1)
    assert hotswap.claim_write(store, 0, 2, spares=2) == (True, None)
    assert hotswap.claim_read(store, 0, 2, timeout_s=1) is None
    assert not store.check([hotswap.assign_key(2)])
    # what a spare reads once told: the claims that name a spare
    assert hotswap.read_claims(store, 0, world=4) == {1: 0, 3: 1}
    # a later generation claims afresh, from what is left of the pool
    assert hotswap.claim_write(store, 1, 1, spares=2) == (True, None)


def test_spare_waits_for_its_assignment_or_the_end_of_the_job():
    store = _store()
    assert hotswap.wait_for_claim(store, 0, "accelpact/abort", timeout_s=0.2) == "deadline"
    store.set(hotswap.assign_key(0), "3:2:backward")
    assert hotswap.wait_for_claim(store, 0, "accelpact/abort", timeout_s=5) == (3, 2, "backward")
    store.set("accelpact/abort", "closed")
    assert hotswap.wait_for_claim(store, 1, "accelpact/abort", timeout_s=5) == "closed"


def test_notices_are_read_once_in_order():
    store = _store()
    notices = hotswap.Notices(store)
    assert notices.wait_new(grace_s=0.1, settle_s=0) == ()
    post_death(store, 3)
    post_death(store, 1)
    assert notices.wait_new(grace_s=1, settle_s=0) == (1, 3)
    notices.handled(notices.count())
    assert notices.wait_new(grace_s=0.1, settle_s=0) == ()
    post_death(store, 2)
    assert notices.wait_new(grace_s=1, settle_s=0) == (2,)


def test_a_death_a_peers_claim_absorbed_during_this_ranks_discard_is_handled_after_the_release():
    """A rank whose episode began as a discard (no notice yet) must not start a second episode after
    the release for a death a peer's swap absorbed meanwhile: the notices that follow, in order, of
    ranks claimed in the episode are handled; a later death of another rank is still new (found by
    the 3-minute soak of issue 41: a stale notice shrank a live replica)."""
    store = _store()
    notices = hotswap.Notices(store)
    seen = notices.count()  # the discard began: nothing noticed
    post_death(store, 2)  # rank 2 dies during the episode; a peer claims a spare for it
    assert hotswap.claim_write(store, 3, 2, spares=1) == (True, 0)  # spare 0 takes identity 2
    post_death(store, 0)  # rank 0 dies after voting ready: the next generation's failure
    notices.handled(seen)
    notices.handled_claimed(hotswap.read_claims(store, 3, world=4))
    assert notices.wait_new(grace_s=0.1, settle_s=0) == (0,)


def test_published_state_round_trips():
    store = _store()
    torch.manual_seed(5)
    torch.rand(3)
    rec = hotswap.publish_state(store, 2, 7, {"kappa": 7})
    back = hotswap.read_state(store, 2)
    assert back is not None and back["frontier"] == 7 and back["extra"] == {"kappa": 7}
    # the RNG at F (impl/runtime/rng.py): the CPU generator, and the CUDA one of the rank's device where there is one
    assert torch.equal(back["rng"]["cpu"], rec["rng"]["cpu"]) and torch.equal(back["rng"]["cpu"], torch.get_rng_state())
    assert back["rng"]["cuda"] is None or torch.cuda.is_available()
    assert hotswap.read_state(store, 0) is None


@pytest.mark.parametrize("point,spare,replica,level", [
    ("backward", True, True, "L1"), ("boundary", True, True, "L1"), ("forward", True, True, "L1"),
    ("optimizer", True, True, "L2"), ("backward", False, True, "L2"), ("backward", True, False, "L2"),
])
def test_the_engine_decides_with_the_models_function(point, spare, replica, level):
    """The survivor's decision is the model's (model/hotswap.py ``decide``), read against the default
    envelope: a swap only where a spare is left, a replica lives and the point can be discarded."""
    from accelpact.model import hotswap as model_swap
    from accelpact.model.contract import DEFAULT_OBJECTIVE, DEFAULT_PLATFORM, ObservationKey, default_envelope

    key = ObservationKey(DEFAULT_PLATFORM, "fsdp1-hybrid", point, DEFAULT_OBJECTIVE)
    dec = model_swap.decide(default_envelope(), key, True, died=True, spare=spare, replica=replica)
    assert dec.level == level, dec.reason


def test_the_swaps_validation_sees_a_transfer_that_left_something_behind():
    """Phase 6 after a swap compares the spare's state checksum with its replicas'
    (``hotswap.validate``, :func:`accelpact.impl.runtime.digest.state_checksum`): equal after a full
    transfer; different when the transfer drops the optimizer state, or one parameter's shard."""
    from accelpact.impl.runtime.digest import state_checksum

    cpu = torch.device("cpu")
    src, src_opt = _model_and_optim(0, 3)
    manifest, tensors = hotswap.export_state(src, src_opt)
    want = state_checksum(src, src_opt, cpu)

    dst, dst_opt = _model_and_optim(1, 0)
    hotswap.import_state(dst, dst_opt, manifest, [t.clone() for t in tensors])
    assert torch.equal(state_checksum(dst, dst_opt, cpu), want)

    no_optim = {**manifest, "state": {}}
    n_params = len(manifest["params"]) + len(manifest["buffers"])
    dst, dst_opt = _model_and_optim(1, 0)
    hotswap.import_state(dst, dst_opt, no_optim, [t.clone() for t in tensors[:n_params]])
    assert not torch.equal(state_checksum(dst, dst_opt, cpu), want)

    stale = [t.clone() for t in tensors]
    stale[0] = stale[0] + 1e-3  # one parameter's shard from another step
    dst, dst_opt = _model_and_optim(1, 0)
    hotswap.import_state(dst, dst_opt, manifest, stale)
    assert not torch.equal(state_checksum(dst, dst_opt, cpu), want)


class _Record:
    """The engine's collaborators of ``Pact._handle_suspect``, recorded: its trace notes and the
    watchdog's suspicions (the notices are the real ``hotswap.Notices`` on a real store)."""

    def __init__(self, store, seen: int = 0):
        import types

        from accelpact.impl.recovery import Pact

        self.notes: list[tuple] = []
        self.suspected: list[int] = []
        self.engine = types.SimpleNamespace(
            rank=2, notices=hotswap.Notices(store),
            trace=types.SimpleNamespace(note=lambda what, **kw: self.notes.append((what, kw["peer"]))),
            watchdog=types.SimpleNamespace(suspect=lambda peer, kind, t: self.suspected.append(peer)))
        self.engine.notices.seen = seen
        self.engine._noticed = lambda peer: Pact._noticed(self.engine, peer)
        self.handle = lambda peer: Pact._handle_suspect(self.engine, peer, "hung", 0)


def _depose_key(store, rank: int) -> str:
    """The key a depose of ``rank``'s current holder writes (what its keeper waits for)."""
    from accelpact.impl.controlplane import depose_key

    return depose_key(rank, hotswap.holder_since(store, rank))


def test_a_suspect_whose_death_is_noticed_is_excused_and_its_new_holder_never_deposed():
    """P16.6, demo swap failed once in three runs (issue 38): rank 1 was SIGKILLed and its notice
    posted; rank 2, still blocked in a collective with it, suspected identity 1 once a spare held it.
    A notice this rank has not handled names the suspect: excused at once, and no depose (which would
    kill the spare, the identity's new holder)."""
    store = _store()
    post_death(store, 1)
    rec = _Record(store)
    rec.handle(1)
    assert rec.notes == [("suspect-excused", 1)] and not rec.suspected
    assert not store.check([_depose_key(store, 1)]), "the identity's holder was deposed although its death was already noticed"


def test_a_suspect_not_yet_noticed_is_deposed_and_excused_once_its_keeper_posts(monkeypatch):
    """P16.0: a stopped or hung process is deposed (its keeper kills it and posts its death), then
    excused; a notice handled by an earlier swap (``seen``) names an earlier holder and excuses nobody."""
    import threading

    from accelpact.impl import recovery

    monkeypatch.setattr(recovery, "NOTICE_WAIT_S", 30.0)
    store = _store()
    post_death(store, 1)  # an earlier holder's death, handled by an earlier swap of this rank
    rec = _Record(store, seen=1)
    import torch.distributed as dist

    own = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=10))  # the keeper's
    keeper = threading.Thread(target=lambda: (own.wait([_depose_key(own, 1)]), post_death(own, 1)))
    keeper.start()
    rec.handle(1)
    keeper.join(10)
    assert rec.notes == [("depose", 1), ("suspect-excused", 1)] and not rec.suspected


def test_a_suspect_whose_keeper_never_posts_ends_the_job(monkeypatch):
    from accelpact.impl import recovery

    monkeypatch.setattr(recovery, "NOTICE_WAIT_S", 0.2)
    store = _store()
    rec = _Record(store)
    rec.handle(3)
    assert rec.notes == [("depose", 3)] and rec.suspected == [3]


class _CountingStore:
    """Counts every store operation a caller makes (a wrapper around a real TCPStore)."""

    def __init__(self, store):
        self.store, self.ops = store, 0

    def __getattr__(self, name):
        fn = getattr(self.store, name)

        def counted(*a, **k):
            self.ops += 1
            return fn(*a, **k)
        return counted


def test_the_store_barrier_waits_instead_of_polling_two_operations_per_rank_and_times_out_naming_the_count():
    """Issue 40: the swap's barrier is O(1) store operations per rank (the last to come sets the
    done key; the others block in one wait), not a 5 ms poll; short of world it times out."""
    import threading

    import torch.distributed as dist

    server = _store()
    world, stores, errors = 4, [], []

    def one(i):
        s = _CountingStore(dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10)))
        stores.append(s)
        try:
            hotswap.store_barrier(s, "b/rebuilt", world, 10.0, "rebuilt")
        except Exception as err:  # noqa: BLE001 - any failure of a rank is the test's finding
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(world)]
    for i, t in enumerate(threads):
        t.start()
        if i == 0:
            t.join(0.3)  # the first waits a while alone: a poll would have made ~60 requests by now
    for t in threads:
        t.join(20)
    assert not errors and len(stores) == world
    assert sorted(s.ops for s in stores) == [2] * world
    with pytest.raises(TimeoutError, match="only 1 of 2 ranks rebuilt within 0.3 s"):
        hotswap.store_barrier(server, "b/alone", 2, 0.3, "rebuilt")
