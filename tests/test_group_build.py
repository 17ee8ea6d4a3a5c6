"""A group build is bounded by the budget it is given, even when a member dies mid-rendezvous (soak K4).

A member that publishes its address and then dies holds gloo's full-mesh connect on the side that
waits to be dialled: the connect is retried and raises "Connect timeout" only after 5 x its timeout
(spec/torch-facts.md), inside a constructor that holds the GIL, so no watchdog thread can step in.
:meth:`accelpact.impl.runtime.backends.Backend.build_group` therefore gives each attempt its share of
the budget.  Which side of a gloo pair dials is decided by comparing the two addresses, so each
round kills a fresh member and the test keeps the first round in which the survivor waited to be
dialled (a survivor that dials is refused at once: that round proves nothing).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time

import pytest

pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402 - after the importorskip of torch

from accelpact.impl.runtime import backends as B  # noqa: E402 - after the importorskip of torch
from accelpact.testing import HOST, client_store  # noqa: E402 - after the importorskip of torch


def _publish_and_die(port: int, prefix: str) -> None:
    """Group rank 0: publish its address by starting the build, which fails after 1 s waiting for
    the survivor's (the constructor holds the GIL: no other thread of it runs meanwhile), then die
    (``os._exit``, as under SIGKILL) with its address left in the store."""
    store = client_store(port)
    try:
        dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), 0, 2, datetime.timedelta(seconds=1))
    except RuntimeError:
        pass
    os._exit(9 if store.check([f"{prefix}/0/0"]) else 3)  # ProcessGroupGloo's keys: "<device index>/<rank>"


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_build_with_a_member_dead_after_publishing_ends_within_its_budget():
    budget = 10.0  # 5 attempts of CONNECT_FLOOR_S: unbounded, gloo would wait 5 x 10 s
    gloo = B.backend("gloo")
    assert budget / gloo.connect_attempts >= B.CONNECT_FLOOR_S
    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    seen = []
    for i in range(10):
        prefix = f"k4-{i}"
        child = ctx.Process(target=_publish_and_die, args=(store.port, prefix))
        child.start()
        child.join(90)
        assert child.exitcode == 9, f"round {i}: the member exited {child.exitcode} before publishing"
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            gloo.build_group(dist.PrefixStore(prefix, store), 1, 2, name=prefix, global_ranks=[0, 1],
                             connect_timeout_s=budget, timeout_s=5.0)
        took = time.monotonic() - t0
        seen.append((took, str(err.value)[:160]))
        if "Connect timeout" in str(err.value):
            print(f"round {i}: the survivor waited to be dialled; the build raised after {took:.1f} s "
                  f"(budget {budget} s, gloo alone: ~{gloo.connect_attempts * budget:.0f} s)")
            assert took <= budget + 2.0, seen  # 2 s: slack for a loaded machine, 40 s short of gloo's own
            return
    pytest.fail(f"in 10 rounds the survivor never waited to be dialled (gloo picks the dialler by address): {seen}")
