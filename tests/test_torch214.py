"""torch 2.14's native ``ProcessGroup.reconfigure`` on gloo, and the engine's choice of strategy (issue 43
item 5; spec/nccl.md, "Versions").

torch 2.14 binds ``reconfigure(ReconfigureOptions)`` on every ``ProcessGroup`` and ``Backend``; whether
a group can do it is its ``supports_reconfigure`` (gloo: yes, on any gloo-only group, not only the
default one; the legacy ``ProcessGroupNCCL``: no).  What it does after a peer is gone is checked here on
real gloo processes on loopback, through :class:`~accelpact.impl.runtime.replace.NativeReconfigure`
(the engine's wrapper of it); that the engine does not choose it (it rebuilds R) is checked in process.

Runs only under torch >= 2.14 (``make test-torch214``; the default suite's torch 2.13 skips the module).
"""

from __future__ import annotations

import datetime
import os
import time

import pytest

torch = pytest.importorskip("torch")


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+", 1)[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


if _minor(torch.__version__) < (2, 14):
    pytest.skip(f"torch {torch.__version__} has no ProcessGroup.reconfigure (torch >= 2.14; make test-torch214 runs "
                "this module under torch 2.14.1)", allow_module_level=True)

import torch.distributed as dist  # noqa: E402 - after the module-level skip: torch < 2.14 stops above

from accelpact.impl.runtime import revoke  # noqa: E402 - after the module-level skip
from accelpact.impl.runtime.backends import backend  # noqa: E402 - after the module-level skip
from accelpact.impl.runtime.replace import (NativeReconfigure, ReplaceAndRebind, ReplaceError,  # noqa: E402 - after the skip
                                            choose_strategy)
from accelpact.testing import FAILURE_MARKERS  # noqa: E402 - after the module-level skip

#: R's collective timeout in these runs (the training timeout it is built with, as phase 4 builds R)
TRAINING_TIMEOUT_S = 4.0
#: the phase deadline handed to the replacement (bounds the handle exchange and the reconfiguration)
PHASE_DEADLINE_S = 10.0
PREFIX = "t214/"


def _engine_r(ctx, members: tuple[int, ...], tag: str):
    """R as the engine builds it (:meth:`Backend.build_group`: a ``ProcessGroupGloo`` in a c10d
    ``ProcessGroup`` over a prefix store of its own, the training timeout set)."""
    pg, _rec = backend("gloo").build_group(dist.PrefixStore(f"{PREFIX}{tag}/", ctx.store), members.index(ctx.rank),
                                           len(members), name=f"{PREFIX}{tag}", global_ranks=members,
                                           connect_timeout_s=30.0, timeout_s=TRAINING_TIMEOUT_S)
    return pg


def _together(ctx, key: str, n: int) -> None:
    """Wait (bounded) until ``n`` ranks have passed ``key``: the survivors' probes of a broken R end at
    different times (a closed connection at once, a pending receive at R's timeout)."""
    ctx.store.add(key, 1)
    deadline = datetime.timedelta(seconds=30)
    ctx.store.wait([key], deadline)
    for _ in range(300):
        if int(ctx.store.add(key, 0)) >= n:
            return
        ctx.store.wait([key], deadline)
        time.sleep(0.1)
    raise TimeoutError(f"{key}: fewer than {n} ranks arrived")


def _all_reduce(pg, value: float) -> float | str:
    """One all-reduce of ``value`` on ``pg``: the sum, or the error text."""
    t = torch.tensor([value])
    try:
        pg.allreduce([t]).wait()
    except RuntimeError as exc:
        return f"raised: {exc}"
    return float(t[0])


def reconfigure_after_a_death(ctx) -> dict:
    """Rank function (3 ranks): R over all three; rank 2 exits; the survivors see R fail, reconfigure it
    in place over (0, 1) (generation 1), revoke it through the new record, and reconfigure it again
    (generation 2, the same members: a repair of a cut)."""
    r_pg = _engine_r(ctx, (0, 1, 2), "r")
    out: dict = {"before": _all_reduce(r_pg, ctx.rank + 1.0), "supports": r_pg.supports_reconfigure}
    if ctx.rank == 2:
        ctx.store.set("t214/gone", "1")
        os._exit(0)
    ctx.store.wait(["t214/gone"], datetime.timedelta(seconds=30))
    out["after_death"] = _all_reduce(r_pg, 1.0)
    _together(ctx, "t214/probed", 2)
    strategy = NativeReconfigure(PREFIX)
    same = strategy.replace(r_pg, 1, (0, 1), ctx.rank, ctx.store, PHASE_DEADLINE_S, name="replicate")
    out["g1"] = {"same_object": same is r_pg, "size": r_pg.size(), "rank": r_pg.rank(),
                 "sum": _all_reduce(r_pg, ctx.rank + 1.0), "recorded": len(strategy.last_record.sockets),
                 "timeout_s": backend("gloo").timeout_of(r_pg)}
    _together(ctx, "t214/g1-done", 2)  # both survivors used generation 1 before either revokes it
    revoke.hard_close(strategy.last_record)
    out["after_revoke"] = _all_reduce(r_pg, 1.0)
    _together(ctx, "t214/revoked", 2)
    strategy.replace(r_pg, 2, (0, 1), ctx.rank, ctx.store, PHASE_DEADLINE_S, name="replicate")
    out["g2"] = {"size": r_pg.size(), "sum": _all_reduce(r_pg, ctx.rank + 1.0)}
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_gloo_reconfigure_after_a_peer_is_gone_keeps_the_group_and_shrinks_it_to_the_survivors(ranks):
    """After rank 2 of R's three members exits, R's collectives fail; torch 2.14's reconfigure, called by
    the two survivors with their handles, makes the *same* group object a 2-rank group whose all-reduce
    sums the survivors' contributions, with the training timeout kept and its new sockets recorded (a
    revoke through that record breaks it); a second reconfiguration (next generation, same members: a
    repair after a cut) works again."""
    run = ranks.run(reconfigure_after_a_death, 3, init_group=True, timeout_s=120)
    assert run.codes == {0: 0, 1: 0, 2: 0}, run.explain()
    expected_before = float(sum(r + 1 for r in range(3)))
    expected_after = float(sum(r + 1 for r in (0, 1)))
    for r in (0, 1):
        res = run.result(r)
        assert res is not None, run.explain()
        assert res["supports"] is True and res["before"] == expected_before, (r, res)
        assert isinstance(res["after_death"], str) and any(m in res["after_death"] for m in FAILURE_MARKERS), (r, res)
        g1 = res["g1"]
        assert g1["same_object"] and g1["size"] == 2 and g1["rank"] == r, (r, g1)
        assert g1["sum"] == expected_after, (r, g1)
        assert g1["recorded"] >= 1 and g1["timeout_s"] == TRAINING_TIMEOUT_S, (r, g1)
        assert isinstance(res["after_revoke"], str) and res["after_revoke"].startswith("raised"), (r, res)
        assert res["g2"] == {"size": 2, "sum": expected_after}, (r, res)


def reconfigure_with_a_dead_members_handle(ctx) -> dict:
    """Rank function (3 ranks): every member publishes its handle for generation 1, then rank 2 exits;
    the survivors reconfigure over all three (the dead member's handle included)."""
    r_pg = _engine_r(ctx, (0, 1, 2), "d")
    _all_reduce(r_pg, 1.0)
    strategy = NativeReconfigure(PREFIX)
    if ctx.rank == 2:
        exchange = dist.PrefixStore(strategy.store_prefix(1, "replicate"), ctx.store)
        exchange.set(NativeReconfigure.HANDLE_KEY.format(2), r_pg.get_reconfigure_handle())
        os._exit(0)
    try:
        strategy.replace(r_pg, 1, (0, 1, 2), ctx.rank, ctx.store, PHASE_DEADLINE_S, name="replicate")
    except ReplaceError as exc:
        return {"raised": str(exc)}
    return {"raised": None, "sum": _all_reduce(r_pg, 1.0)}


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_a_reconfigure_that_names_a_dead_member_fails_within_its_bound(ranks):
    """A dead member's handle in the list: gloo's rendezvous in the group's store never completes, and
    the call ends with :class:`ReplaceError` (``DistStoreError`` within the phase deadline), never a hang
    (the harness's own bound is the outer one)."""
    run = ranks.run(reconfigure_with_a_dead_members_handle, 3, init_group=True, timeout_s=120)
    assert run.codes == {0: 0, 1: 0, 2: 0}, run.explain()
    for r in (0, 1):
        res = run.result(r)
        assert res is not None and res["raised"], (r, res)
        assert "reconfigure of replicate for generation 1" in res["raised"], (r, res)


def test_every_group_has_the_method_but_support_decides_and_the_engine_rebuilds():
    """torch 2.14 binds ``reconfigure`` on every ``ProcessGroup`` (so the presence of the method says
    nothing); gloo supports it; a group without a backend cannot be asked.  The engine's strategy for R
    is ReplaceAndRebind whatever the group supports (replace.choose_strategy's docstring)."""
    store = dist.HashStore()
    real, _ = backend("gloo").build_group(dist.PrefixStore("x/", store), 0, 1, name="x", global_ranks=(0,),
                                          connect_timeout_s=5.0, timeout_s=10.0)
    bare = dist.ProcessGroup(store, 0, 1)  # no backend registered
    assert callable(getattr(real, "reconfigure", None)) and callable(getattr(bare, "reconfigure", None))
    assert real.supports_reconfigure is True
    with pytest.raises(RuntimeError):
        bare.supports_reconfigure  # noqa: B018 - the property's own error is what is checked
    assert NativeReconfigure.available(real) and not NativeReconfigure.available(bare)
    chosen = choose_strategy(real)
    assert type(chosen) is ReplaceAndRebind and chosen.needs_rebind
    assert NativeReconfigure.uuid("a/g1/pg/replicate") != NativeReconfigure.uuid("a/g2/pg/replicate")
    assert 0 <= NativeReconfigure.uuid("a/g1/pg/replicate") < 2 ** 63
