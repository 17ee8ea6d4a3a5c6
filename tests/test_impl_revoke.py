"""Revoke: hard-closing a gloo group's connected sockets unblocks its peers in milliseconds.

Spec ids: S6 (a revoke reaches every member of R blocked in a collective), P1 (phase 1:
members publish revoke; the watchdog performs it).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _mp  # noqa: E402

torch = pytest.importorskip("torch")

from accelpact.impl import revoke  # noqa: E402


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_revoke_unblocks_peers_blocked_in_collective(tmp_path):
    """Ranks 0-2 block in an all-reduce with a 45 s gloo timeout; rank 3 publishes the revoke
    instead of joining.  Each blocked rank's watchdog hard-closes the group's sockets and the
    collective raises long before the gloo timeout (ordering: raised, and the launch ended first)."""
    store = _mp.master_store()
    cfg = {"gloo_timeout_s": 45.0}

    def go():
        c = _mp.client_store(store.port)
        end = time.monotonic() + 60
        while time.monotonic() < end and (not c.check(["rv/armed"]) or int(c.add("rv/armed", 0)) < 4):
            time.sleep(0.05)
        c.set("rv/go", "1")

    t = threading.Thread(target=go, daemon=True)
    t.start()
    run = _mp.launch(_mp.revoke_worker, 4, cfg, tmp_path, timeout=40, store=store)
    t.join(5)
    assert run.codes == {0: 0, 1: 0, 2: 0, 3: 0}, run.codes
    for r in range(3):
        res = json.loads((tmp_path / f"outcome-r{r}.json").read_text())
        assert res["outcome"].startswith("raised"), res
        assert res["blocked_s"] < cfg["gloo_timeout_s"]
        print("rank", r, "unblocked after", round(res["blocked_s"], 3), "s")
    assert sum(json.loads((tmp_path / f"outcome-r{r}.json").read_text())["revocations"] for r in range(3)) >= 1
    for r in range(4):
        rec = json.loads((tmp_path / f"record-r{r}.json").read_text())
        assert len(rec["sockets"]) >= 1, "the group's connected sockets were recorded"
        assert not {fd for fd, _ in rec["sockets"]} & set(rec["non_established_fds"]), "never a LISTEN socket"


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

