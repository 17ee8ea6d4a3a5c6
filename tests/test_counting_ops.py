"""``impl/runtime/counting.py`` counts every operation that reaches a process group through Python,
under the name of the ``ProcessGroup`` method it reaches, checked on a real 2-rank gloo group.

The independent source is this test's own recorder: in each rank, before counting wraps anything,
every ``ProcessGroup`` method except those this test lists as local (:data:`LOCAL`: accessors, setup,
teardown) is wrapped by a recorder that notes each call.  Each phase (one ``torch.distributed``
function, one FSDP2 step, one FSDP1 step, DDP) is then run, and counting's per-method counts over the
phase must equal the recorder's, at group size 2, with the rounds of gloo's algorithms as this test
computes them for n = 2 (:data:`ROUNDS_AT_2`).  A second source for the FSDP steps: the number of FSDP
units (one reduce-scatter per unit per backward; an all-gather per unit in forward, at most one more
per unit in backward).  DDP's default reduction runs in C++: the recorder sees nothing, counting
counts nothing, and the gradients are averaged all the same (what the module doc says it cannot
see); a Python comm hook's all-reduces are seen and counted, one per gradient.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from accelpact.impl.runtime import counting  # noqa: E402 - after the torch skip

pytestmark = pytest.mark.multiproc

#: ProcessGroup attributes that do not communicate (this test's judgment, from torch 2.13 / 2.14's
#: bindings): the recorder leaves them alone
LOCAL = frozenset({
    "size", "rank", "name", "group_name", "group_desc", "bound_device_id", "boxed", "unbox", "_get_backend",
    "_get_backend_name", "_device_types", "_register_backend", "_set_default_backend", "_set_group_name",
    "_set_group_desc", "_id", "_backend_id", "_pybind11_conduit_v1_", "get_group_store", "_has_hooks",
    "_get_sequence_number_for_group", "_set_sequence_number_for_group", "_enable_collectives_timing",
    "_register_on_completion_hook", "_wait_for_pending_works", "_start_coalescing", "_end_coalescing", "abort",
    "shutdown", "set_timeout", "split_group", "merge_remote_group", "use_pg_for_symm_mem_rendezvous", "get_backend",
    "supports_reconfigure", "supports_window", "reconfigure", "get_reconfigure_handle", "new_window",
    "_add_ephemeral_timeout", "register_abort_hook", "unregister_abort_hook", "register_pre_hook",
    "unregister_pre_hook", "register_post_hook", "unregister_post_hook",
})

#: gloo's sequential rounds over 2 ranks, per method (ring all-gather n-1 = 1; the all-reduce behind
#: gloo's reduce-scatter 2(n-1) = 2; binomial broadcast / dissemination barrier ceil(log2 n) = 1;
#: monitored barrier: to rank 0 and back = 2; a send 1, a receive 0)
ROUNDS_AT_2 = {"allgather": 1, "all_gather_single": 1, "all_gather_single_coalesced": 1, "allgather_coalesced": 1,
               "reduce_scatter_single": 2, "reduce_scatter_single_coalesced": 2, "allreduce": 2, "allreduce_coalesced": 2,
               "broadcast": 1, "barrier": 1, "monitored_barrier": 2, "send": 1, "recv": 0, "recv_anysource": 0,
               "all_to_all_single": 1, "gather": 1, "scatter": 1, "reduce": 1}

ALL_GATHERS = {"allgather", "all_gather_single", "_allgather_base", "allgather_coalesced", "all_gather_single_coalesced",
               "allgather_into_tensor_coalesced"}
REDUCE_SCATTERS = {"reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_single_coalesced",
                   "reduce_scatter_tensor_coalesced"}
FSDP_UNITS = 2  # the models below: one inner unit (the first Linear) and the root


def count_ops(ctx) -> dict:
    """A rank: the recorder, then counting, then each phase; per phase what each saw."""
    import collections
    import datetime
    import warnings

    import torch
    import torch.distributed as dist
    from torch import nn

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor and FSDP1 are deprecated on 2.13
    seen: collections.Counter = collections.Counter()
    phase = [""]
    cls = dist.ProcessGroup
    for name in dir(cls):
        attr = getattr(cls, name)
        if name.startswith("__") or name[:1].isupper() or name in LOCAL or not callable(attr) or isinstance(attr, type):
            continue

        def rec(self, *args, _name=name, _orig=attr, **kwargs):
            seen[(phase[0], _name)] += 1
            return _orig(self, *args, **kwargs)

        setattr(cls, name, rec)
    assert counting.enabled()
    counting.install()  # over the recorder: both see every call

    out: dict = {}

    def measure(label, fn) -> None:
        before = counting.counts()
        phase[0] = label
        try:
            fn()
        finally:
            phase[0] = ""
        after = counting.counts()
        counted: collections.Counter = collections.Counter()
        sizes, rounds = set(), 0
        for key, v in after.items():
            d = v - before.get(key, 0)
            if not d:
                continue
            if key.startswith("coll/"):
                op, n = key.rsplit("/", 1)[1].rsplit("@", 1)
                counted[op] += d
                sizes.add(int(n))
            elif key.startswith("rounds/"):
                rounds += d
        out[label] = {"seen": {n: c for (p, n), c in seen.items() if p == label}, "counted": dict(counted),
                      "sizes": sorted(sizes), "rounds": rounds}

    me, peer = ctx.rank, 1 - ctx.rank
    t = torch.ones(4)

    def p2p(send_first: int, fn_send, fn_recv):
        def run():
            if me == send_first:
                fn_send()
            else:
                fn_recv()
        return run

    measure("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(8), t))
    measure("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4)))
    measure("all_gather", lambda: dist.all_gather([torch.empty(4), torch.empty(4)], t))
    measure("all_gather_object", lambda: dist.all_gather_object([None, None], {"rank": me}))
    measure("broadcast", lambda: dist.broadcast(t, 0))
    measure("barrier", lambda: dist.barrier())
    measure("monitored_barrier", lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=30)))
    measure("send/recv", p2p(0, lambda: dist.send(t, 1), lambda: dist.recv(t, 0)))
    measure("isend/irecv", p2p(1, lambda: dist.isend(t, 0).wait(), lambda: dist.irecv(t, 1).wait()))
    measure("recv from any source", p2p(0, lambda: dist.send(t, 1), lambda: dist.recv(t)))

    def batch():
        ops = [dist.P2POp(dist.isend, torch.ones(2), peer), dist.P2POp(dist.irecv, torch.empty(2), peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    measure("batch_isend_irecv", batch)
    measure("all_reduce", lambda: dist.all_reduce(t))

    def coalesced_all_gather():
        with dist._coalescing_manager():
            dist.all_gather_into_tensor(torch.empty(4), torch.ones(2))
            dist.all_gather_into_tensor(torch.empty(6), torch.ones(3))

    def coalesced_reduce_scatter():
        with dist._coalescing_manager():
            dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4))

    measure("coalesced all_gather_into_tensor", coalesced_all_gather)
    measure("coalesced reduce_scatter_tensor", coalesced_reduce_scatter)
    measure("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4)))
    measure("gather", lambda: dist.gather(t, [torch.empty(4), torch.empty(4)] if me == 0 else None, dst=0))
    measure("scatter", lambda: dist.scatter(t, [torch.ones(4), torch.ones(4)] if me == 0 else None, src=0))
    measure("reduce", lambda: dist.reduce(t, 0))

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    x = torch.full((3, 4), float(me + 1))  # a different batch per rank

    # FSDP2 on a 2-rank mesh: the block, then the root (FSDP_UNITS)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ctx.world,))
    m2 = model()
    fully_shard(m2[0], mesh=mesh)
    fully_shard(m2, mesh=mesh)
    measure("fsdp2 step", lambda: m2(x).sum().backward())

    # FSDP1: the same two units
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    cpu = torch.device("cpu")
    m1 = model()
    m1[0] = FSDP(m1[0], device_id=cpu)
    m1 = FSDP(m1, device_id=cpu)
    measure("fsdp1 step", lambda: m1(x).sum().backward())

    # DDP, default reduction (C++), and with a Python comm hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    local = model()
    local(x).sum().backward()
    holder: dict = {}
    measure("ddp construction", lambda: holder.setdefault("ddp", DDP(model())))
    ddp = holder["ddp"]
    measure("ddp step", lambda: ddp(x).sum().backward())
    grads = [p.grad.detach().clone() for p in ddp.parameters()]
    locals_ = [p.grad.detach().clone() for p in local.parameters()]
    averaged, differ = [], []
    for g, mine in zip(grads, locals_, strict=True):  # each rank's local gradient, gathered outside the phases
        both = [torch.empty_like(mine), torch.empty_like(mine)]
        dist.all_gather(both, mine)
        averaged.append(torch.allclose(g, (both[0] + both[1]) / 2))
        differ.append(not torch.equal(both[0], both[1]))
    out["ddp grads"] = {"averaged over the ranks": all(averaged), "local ones differ": any(differ),
                        "parameters": len(grads)}

    def per_gradient(state, bucket):
        for grad in bucket.gradients():
            dist.all_reduce(grad)
        buf = bucket.buffer()
        buf.div_(ctx.world)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut

    hooked = DDP(model())
    hooked.register_comm_hook(None, per_gradient)
    measure("ddp step, Python comm hook", lambda: hooked(x).sum().backward())
    return out


@pytest.mark.timeout(150)
def test_every_operation_through_python_is_counted_under_its_own_name(ranks, tmp_path):
    run = ranks.run(count_ops, 2, init_group=True, timeout_s=120, env={counting.ENV: str(tmp_path / "counts")})
    for rank, out in enumerate(run.values()):
        grads = out.pop("ddp grads")
        for label, ph in out.items():
            seen, counted = ph["seen"], ph["counted"]
            where = f"rank {rank}, {label}: recorder saw {seen}, counting counted {counted}"
            assert counted == seen, where
            if seen:
                assert ph["sizes"] == [2], where
                assert ph["rounds"] == sum(ROUNDS_AT_2[op] * n for op, n in seen.items()), (where, ph["rounds"])
            elif not label.startswith("ddp"):
                raise AssertionError(f"{where}: the phase reached no ProcessGroup method")
        for fsdp in ("fsdp2 step", "fsdp1 step"):
            c = out[fsdp]["counted"]
            gathers = sum(n for op, n in c.items() if op in ALL_GATHERS)
            scatters = sum(n for op, n in c.items() if op in REDUCE_SCATTERS)
            assert scatters == FSDP_UNITS and FSDP_UNITS <= gathers <= 2 * FSDP_UNITS, (rank, fsdp, c)
        # DDP's Reducer is C++: nothing reaches Python, yet the gradients were averaged over the ranks
        assert out["ddp construction"]["seen"] == {} and out["ddp step"]["seen"] == {}, out
        assert grads["averaged over the ranks"] and grads["local ones differ"], grads
        # a Python comm hook: one all-reduce per gradient, seen and counted
        assert out["ddp step, Python comm hook"]["counted"] == {"allreduce": grads["parameters"]}, out


def test_rounds_of_the_single_tensor_and_coalesced_methods():
    """gloo's algorithms behind the methods torch 2.13 / 2.14 call (computed here for n = 8 and 1,024)."""
    for n in (8, 1024):
        assert counting.rounds("all_gather_single", n) == n - 1            # ring all-gather
        assert counting.rounds("all_gather_single_coalesced", n) == n - 1  # one flattened ring all-gather
        assert counting.rounds("reduce_scatter_single", n) == 2 * (n - 1)  # a ring all-reduce, then a slice
        assert counting.rounds("reduce_scatter_single_coalesced", n) == 2 * (n - 1)
        assert counting.rounds("all_to_all_single", n) == n - 1
        assert counting.rounds("monitored_barrier", n) == 2                # to rank 0 and back
        assert counting.rounds("recv_anysource", n) == 0                   # counted at the send
    assert counting.rounds("all_gather_single", 1) == 0
    with pytest.raises(ValueError, match="all_gather_into_tensor"):
        counting.rounds("all_gather_into_tensor", 8)                       # a function's name, not a method's
