"""Silent partitions (accelpact/testing/netns.py): two processes in their own network namespaces, one TCP
connection across the bridge; a partition makes it silent (no error, reads time out), heal
restores it.  Skips with the reason where namespaces cannot be made (not root, no ``ip``)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from accelpact.testing import netns
from accelpact.impl.launch.launch import worker_env

pytestmark = pytest.mark.skipif(netns.available() is not None, reason=f"network namespaces: {netns.available()}")

#: a peer driven line by line on stdin: "send WORD", "recv TIMEOUT_S"; answers one line each
_PEER = r"""
import socket, sys
role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "server":
    srv = socket.create_server((host, port))
    print("listening", flush=True)
    srv.settimeout(60)
    c, _ = srv.accept()
else:
    c = socket.create_connection((host, port), timeout=30)
print("connected", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "send":
        try:
            c.sendall(cmd[1].encode())
            print("sent", flush=True)
        except OSError as e:
            print("send-error", type(e).__name__, flush=True)
    elif cmd[0] == "recv":
        c.settimeout(float(cmd[1]))
        try:
            data = c.recv(100)
            print("recv", data.decode() if data else "<eof>", flush=True)
        except socket.timeout:
            print("recv-timeout", flush=True)
        except OSError as e:
            print("recv-error", type(e).__name__, flush=True)
"""


class Peer:
    """A peer process (its own session; killed and reaped by :func:`peers`)."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=worker_env(),
                                     start_new_session=True)
        self.buf = b""

    def line(self, timeout_s: float) -> str:
        fd, end = self.proc.stdout.fileno(), time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return "<no answer>"
            chunk = os.read(fd, 4096)
            if not chunk:
                return "<exited>"
            self.buf += chunk
        out, _, self.buf = self.buf.partition(b"\n")
        return out.decode().strip()

    def ask(self, command: str, timeout_s: float = 30.0) -> tuple[str, float]:
        """Send one command; its answer and how long it took."""
        t0 = time.monotonic()
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()
        return self.line(timeout_s), time.monotonic() - t0


@contextlib.contextmanager
def peers():
    started: list[Peer] = []
    try:
        yield lambda cmd: started.append(Peer(cmd)) or started[-1]
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.proc.pid, signal.SIGKILL)
        for p in started:
            p.proc.wait(timeout=30)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_partition_is_silent_and_heal_restores_the_connection() -> None:
    quiet_s = 2.0
    with netns.Fabric(2) as fab, peers() as start:
        server = start(fab.cmd_prefix(0) + [sys.executable, "-c", _PEER, "server", fab.addr(0), "40000"])
        assert server.line(60) == "listening"
        client = start(fab.cmd_prefix(1) + [sys.executable, "-c", _PEER, "client", fab.addr(0), "40000"])
        assert client.line(60) == "connected" and server.line(30) == "connected"
        assert client.ask("send hello")[0] == "sent"
        assert server.ask("recv 20")[0] == "recv hello"

        fab.partition(1)
        assert fab.partitioned() == {1}
        sent, _ = client.ask("send during")  # buffered: no error
        back, _ = server.ask("send back")
        got_s, waited_s = server.ask(f"recv {quiet_s}")
        got_c, waited_c = client.ask(f"recv {quiet_s}")
        assert (sent, back) == ("sent", "sent"), "a send across a silent partition must not fail"
        assert (got_s, got_c) == ("recv-timeout", "recv-timeout"), \
            f"both ends must just time out (no RST, no error): server {got_s!r}, client {got_c!r}"

        fab.heal(1)
        t_heal = time.monotonic()
        got_s, _ = server.ask("recv 30")
        got_c, _ = client.ask("recv 30")
        assert (got_s, got_c) == ("recv during", "recv back"), "after heal, TCP retransmission delivers what was sent"
        resumed = time.monotonic() - t_heal
        print(f"partition: sends ok, recv timed out after {waited_s:.2f} s / {waited_c:.2f} s on both ends (silent); "
              f"heal: buffered data delivered {resumed:.2f} s after heal (TCP retransmission backoff)")


def test_fabric_addresses_names_and_teardown() -> None:
    with netns.Fabric(3) as fab:
        names = [fab.netns(i) for i in range(3)]
        assert all(netns.exists(n) for n in names + [fab.hub])
        assert len({fab.addr(i) for i in range(3)}) == 3 and all(a.startswith("10.") for a in map(fab.addr, range(3)))
        assert fab.cmd_prefix(2) == ["ip", "netns", "exec", names[2]]
        out = subprocess.run(fab.cmd_prefix(0) + ["ip", "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True,
                             text=True, timeout=30).stdout
        assert f"{fab.addr(0)}/24" in out
        with pytest.raises(ValueError, match="rank index"):
            fab.addr(3)
    assert not any(netns.exists(n) for n in names + [fab.hub])


def test_teardown_on_error_and_unique_names() -> None:
    with pytest.raises(KeyError), netns.Fabric(1) as a, netns.Fabric(1) as b:
        made = [a.netns(0), b.netns(0), a.hub, b.hub]
        assert len(set(made)) == 4 and all(map(netns.exists, made))
        raise KeyError("boom")
    assert not any(map(netns.exists, made))
    with pytest.raises(netns.FabricError, match="not set up"):
        netns.Fabric(1).addr(0)
    with pytest.raises(ValueError, match="n must be"):
        netns.Fabric(0)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_host_link_reaches_a_rank_and_is_removed() -> None:
    with netns.Fabric(1, host=True) as fab, peers() as start:
        dev = fab.host_dev
        server = start(fab.cmd_prefix(0) + [sys.executable, "-c", _PEER, "server", fab.addr(0), "40001"])
        assert server.line(60) == "listening"
        import socket

        with socket.create_connection((fab.addr(0), 40001), timeout=30) as c:
            assert server.line(30) == "connected"
            c.sendall(b"fromhost")
            assert server.ask("recv 20")[0] == "recv fromhost"
    assert subprocess.run(["ip", "link", "show", dev], capture_output=True, timeout=30).returncode != 0


#: a rank on the fabric: a detector on the test's store (reached through the host link), a loop that
#: ticks until ``done``, its suspects written back
_RANK = r"""
import datetime, json, os, sys, time
import torch.distributed as dist
from accelpact.impl.detector import Detector
host, port, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=120))
cb = store.clone()
det = Detector(store, rank, 2, on_suspect=lambda p, k, t: cb.set(f"suspect/{rank}/{p}", f"{k}:{t}")).start()
store.set(f"ready/{rank}", str(os.getpid()))
while not store.check(["done"]):
    time.sleep(0.05)
    det.tick()
store.set(f"res/{rank}", json.dumps({"suspects": {p: s.kind for p, s in det.suspects.items()}, "closed": det.close(),
                                     "store_errors": det.store_errors}))
"""


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_detector_declares_a_partitioned_rank_dead_and_the_healed_rank_suspects_nobody() -> None:
    import datetime
    import json

    import torch.distributed as dist

    from accelpact.impl.launch.launch import ProcessSet

    with netns.Fabric(2, host=True) as fab, ProcessSet() as ps:
        store = dist.TCPStore(fab.host_addr, 0, None, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
        procs = [ps.start(fab.cmd_prefix(r) + [sys.executable, "-c", _RANK, fab.host_addr, str(store.port), str(r)],
                          env=worker_env()) for r in range(2)]
        store.wait(["ready/0", "ready/1"], datetime.timedelta(seconds=90))
        time.sleep(1.0)
        t0 = time.monotonic_ns()
        fab.partition(1)
        store.wait(["suspect/0/1"], datetime.timedelta(seconds=30))
        kind, t_ns = store.get("suspect/0/1").decode().split(":")
        ttd = (int(t_ns) - t0) / 1e9
        fab.heal(1)
        store.set("done", "1")
        store.wait(["res/0", "res/1"], datetime.timedelta(seconds=90))
        res = {r: json.loads(store.get(f"res/{r}")) for r in range(2)}
        assert not ps.wait(60), "ranks did not finish"
    assert [p.returncode for p in procs] == [0, 0]
    assert kind == "dead" and ttd < 5.0, f"{kind} after {ttd:.2f} s"
    assert res[0]["suspects"] == {"1": "dead"} and res[1]["suspects"] == {}, res
    assert res[0]["closed"] and res[1]["closed"]
    print(f"TTD partition (rank 1's link down, silent): {ttd:.3f} s, declared {kind}; after heal rank 1 suspected "
          f"nobody (its store calls blocked while partitioned; store errors counted: {res[1]['store_errors']})")
