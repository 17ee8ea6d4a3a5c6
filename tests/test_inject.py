"""External fault primitives (accelpact/testing/inject.py): each acts on a real process from outside it.

The target processes are plain ``python`` children (reaped by ``ProcessSet``) or ranks of a real
gloo group (``accelpact.testing``); the test process is the injector.  Measurements are printed
(``pytest -s``); assertions are on outcomes, with generous bounds only where a bound is the
requirement.
"""

from __future__ import annotations

import datetime
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelpact.testing import inject
from accelpact.impl.launch.launch import ProcessSet, worker_env

# ------------------------------------------------------------------------------------------- helpers

#: a target: installs the harness handlers, runs a background Python thread that counts into a
#: shared file (argv[1]), prints "ready", then idles in its main thread
_TARGET = r"""
import mmap, struct, sys, threading, time
from accelpact.testing import inject
if sys.argv[2] == "handlers":
    inject.install_handlers()
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 8)
def count():
    i = 0
    while True:
        i += 1
        m[0:8] = struct.pack("q", i)
        time.sleep(0.002)
threading.Thread(target=count, daemon=True).start()
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


class Target:
    """One target process and its shared counter (the background thread's progress)."""

    def __init__(self, ps: ProcessSet, tmp: Path, handlers: bool = True) -> None:
        self.path = tmp / f"counter-{len(ps.procs)}"
        self.path.write_bytes(b"\0" * 8)
        self.proc = ps.start([sys.executable, "-c", _TARGET, str(self.path), "handlers" if handlers else "none"],
                             env=worker_env(), stdout=subprocess.PIPE)
        line = _readline(self.proc, 60)
        assert line == "ready", f"target did not start: {line!r}"
        self.pid = self.proc.pid

    def count(self) -> int:
        with open(self.path, "rb") as fh:
            return struct.unpack("q", fh.read(8))[0]

    def progresses(self, within_s: float = 5.0) -> bool:
        """Whether the background thread's counter moves within ``within_s`` (bounded poll)."""
        c0, end = self.count(), time.monotonic() + within_s
        while time.monotonic() < end:
            if self.count() != c0:
                return True
            time.sleep(0.01)
        return False


_buffers: dict[int, bytes] = {}


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    """One line of ``proc``'s stdout within ``timeout_s`` ('' on timeout or EOF).  Reads the pipe's
    fd directly (a buffered reader could hold a second line where ``select`` cannot see it)."""
    assert proc.stdout is not None
    fd, key = proc.stdout.fileno(), proc.pid
    buf = _buffers.get(key, b"")
    end = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            _buffers[key] = buf
            return ""
        chunk = os.read(fd, 4096)
        if not chunk:
            _buffers[key] = buf
            return ""
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    _buffers[key] = rest
    return line.decode().strip()


def _wait_gone(path: Path, timeout_s: float) -> float:
    """Seconds until ``path`` disappears (the handler took its mailbox); fails after ``timeout_s``."""
    t0 = time.monotonic()
    while path.exists():
        assert time.monotonic() - t0 < timeout_s, f"{path} was never taken by the target's handler"
        time.sleep(0.001)
    return time.monotonic() - t0


def _no_such_pid() -> int:
    """A pid no process can have (above the kernel's pid_max)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


# --------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("bad", [0, -1, True, "12", 1.5, None])
def test_a_pid_must_be_a_positive_integer(bad) -> None:
    with pytest.raises(inject.InjectError, match="positive integer"):
        inject.crash(bad)


def test_every_primitive_names_a_missing_pid() -> None:
    pid = _no_such_pid()
    calls = [lambda: inject.crash(pid), lambda: inject.stop(pid), lambda: inject.resume(pid),
             lambda: inject.gil_hang(pid), lambda: inject.slow(pid, 1.0), lambda: inject.slow(pid, 1.0, how="sleep"),
             lambda: inject.cut_links(pid, except_ports=()), lambda: inject.tcp_connections(pid),
             lambda: inject.is_stopped(pid)]
    for call in calls:
        with pytest.raises(inject.InjectError, match=f"pid {pid}: no such process"):
            call()


def test_the_injector_never_targets_itself() -> None:
    with pytest.raises(inject.InjectError, match="this process"):
        inject.crash(os.getpid())


def test_bad_durations_and_modes_are_refused_before_any_signal() -> None:
    with pytest.raises(inject.InjectError, match="seconds must be a positive number"):
        inject.slow(os.getppid(), 0)
    with pytest.raises(inject.InjectError, match="seconds must be a positive number"):
        inject.gil_hang(os.getppid(), -1)
    with pytest.raises(inject.InjectError, match="how must be 'stop' or 'sleep'"):
        inject.slow(os.getppid(), 1.0, how="pause")


def test_selectors() -> None:
    c = [inject.TcpConn(3, 10, ("127.0.0.1", 5000), ("127.0.0.1", 29500), "ESTABLISHED"),
         inject.TcpConn(4, 11, ("127.0.0.1", 41000), ("127.0.0.1", 43000), "ESTABLISHED"),
         inject.TcpConn(5, 12, ("127.0.0.1", 43001), ("10.1.2.3", 52000), "ESTABLISHED")]
    assert [x.fd for x in inject.select_connections(c, except_ports=[29500])] == [4, 5]
    assert [x.fd for x in inject.select_connections(c, except_ports=())] == [3, 4, 5]
    assert [x.fd for x in inject.select_connections(c, remote_ports=[43000])] == [4]
    assert [x.fd for x in inject.select_connections(c, local_ports=[43001])] == [5]
    assert [x.fd for x in inject.select_connections(c, remote_hosts=["10.1.2.3"])] == [5]
    assert inject.select_connections(c, remote_ports=[43000], except_ports=[41000]) == []
    assert [x.fd for x in inject.select_connections(c, any_ports=[43000, 43001])] == [4, 5]  # a group's listeners
    with pytest.raises(inject.InjectError, match="IP addresses"):
        inject.select_connections(c, remote_hosts=["rank1"])
    with pytest.raises(inject.InjectError, match="give a selector"):
        inject.select_connections(c)
    with pytest.raises(inject.InjectError, match="must be TCP ports"):
        inject.select_connections(c, except_ports=[0])


def test_proc_net_addresses_are_decoded() -> None:
    assert inject._addr("0100007F:1F90") == ("127.0.0.1", 8080)
    assert inject._addr("0000000000000000FFFF00000100007F:74AF") == ("127.0.0.1", 29871)
    assert inject._addr("00000000000000000000000001000000:0016") == ("::1", 22)


# ------------------------------------------------------------------------------------ signal faults

@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_stop_resume_and_crash(tmp_path) -> None:
    with ProcessSet() as ps:
        t = Target(ps, tmp_path, handlers=False)
        inject.stop(t.pid)
        assert inject.is_stopped(t.pid)
        assert not t.progresses(0.5), "a SIGSTOPped process's threads must not run"
        inject.resume(t.pid)
        assert not inject.is_stopped(t.pid)
        assert t.progresses()
        inject.crash(t.pid)
        t.proc.wait(timeout=30)
        assert t.proc.returncode == -signal.SIGKILL
        with pytest.raises(inject.InjectError, match="no such process"):
            inject.crash(t.pid)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_zombie_is_named_as_exited(tmp_path) -> None:
    with ProcessSet() as ps:
        p = ps.start([sys.executable, "-c", "pass"], env=worker_env())
        end = time.monotonic() + 30
        while inject._proc_state(p.pid) != "Z":
            assert time.monotonic() < end, "the child never exited"
            time.sleep(0.01)
        with pytest.raises(inject.InjectError, match=f"pid {p.pid}: the process has exited"):
            inject.crash(p.pid)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_slow_by_stop_freezes_then_resumes(tmp_path) -> None:
    with ProcessSet() as ps:
        t = Target(ps, tmp_path, handlers=False)
        c0 = t.count()
        t0 = time.monotonic()
        inject.slow(t.pid, 0.5)  # blocking: SIGSTOP, 0.5 s, SIGCONT
        took = time.monotonic() - t0
        assert not inject.is_stopped(t.pid) and t.progresses()
        print(f"slow(stop, 0.5 s) returned after {took:.3f} s; counter {c0} -> {t.count()}")


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_signal_faults_need_the_harness_handler(tmp_path) -> None:
    """Without the harness's handler a SIGUSR2 would kill the target: refused, the target lives."""
    with ProcessSet() as ps:
        t = Target(ps, tmp_path, handlers=False)
        assert not inject.handler_installed(t.pid, inject.GIL_HANG_SIGNAL)
        with pytest.raises(inject.InjectError, match="does not catch SIGUSR2.*install_handlers"):
            inject.gil_hang(t.pid, 1.0)
        with pytest.raises(inject.InjectError, match="does not catch SIGUSR1"):
            inject.slow(t.pid, 1.0, how="sleep")
        assert t.proc.poll() is None and t.progresses()


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_gil_hang_stops_every_python_thread_and_sleep_does_not(tmp_path) -> None:
    """The GIL hang holds the GIL in a C call: the background thread's counter stands still while it
    lasts, then moves again; the sleep handler (a straggler) lets the background thread run."""
    hang_s, watch_s = 5.0, 1.0
    with ProcessSet() as ps:
        t = Target(ps, tmp_path)
        assert inject.handler_installed(t.pid, inject.GIL_HANG_SIGNAL)
        assert t.progresses()
        inject.gil_hang(t.pid, hang_s)
        t_start = time.monotonic()
        _wait_gone(inject.mailbox(t.pid, inject.GIL_HANG_SIGNAL), 30)
        time.sleep(0.05)  # the handler is past the mailbox: inside the C call
        c1 = t.count()
        time.sleep(watch_s)
        c2 = t.count()
        watched = time.monotonic() - t_start
        assert watched < hang_s - 0.5, f"the injector itself was descheduled ({watched:.1f} s): inconclusive, rerun"
        assert c1 == c2, f"a Python thread ran during the GIL hang: counter {c1} -> {c2}"
        assert t.progresses(hang_s + 10), "the background thread never ran again after the hang"
        print(f"GIL hang: counter stood at {c1} for {watch_s} s of a {hang_s} s hang, then moved")

        inject.slow(t.pid, 2.0, how="sleep")
        _wait_gone(inject.mailbox(t.pid, inject.SLEEP_SIGNAL), 30)
        c3 = t.count()
        time.sleep(0.5)
        c4 = t.count()
        assert c4 > c3, "the background thread must run while the main thread sleeps (a straggler, not a hang)"
        print(f"sleep straggler: background thread counted {c4 - c3} in 0.5 s")


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_dump_stacks_writes_every_thread_and_leaves_the_target_running(tmp_path) -> None:
    """A stalled job's diagnosis (the soak's stall guard): the target writes each thread's Python
    stack (faulthandler's format, read here, not the code's) and goes on; a target without the
    harness handler is not asked (the signal would kill it)."""
    with ProcessSet() as ps:
        t = Target(ps, tmp_path)
        assert inject.dump_stacks(t.pid)
        lines = []
        end = time.monotonic() + 30
        while time.monotonic() < end and not (any("in count" in x for x in lines) and any("in <module>" in x for x in lines)):
            lines.append(_readline(t.proc, 30))
        text = "\n".join(lines)
        assert "Thread 0x" in text and "in count" in text and "in <module>" in text, text
        assert t.proc.poll() is None and t.progresses()
        bare = Target(ps, tmp_path, handlers=False)
        assert not inject.dump_stacks(bare.pid)
        assert bare.proc.poll() is None


# ----------------------------------------------------------------------------------- link cut (plain)

_CLIENT = r"""
import socket, sys, time
a = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
b = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
print("connected", flush=True)
a.settimeout(60)
try:
    got = a.recv(10)
    print("a-recv", repr(got), flush=True)
except OSError as e:
    print("a-error", type(e).__name__, flush=True)
b.sendall(b"still")
print("b-sent", flush=True)
time.sleep(60)
"""


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_cut_links_shuts_down_only_the_selected_connections(tmp_path) -> None:
    """A child with two connections to this process; cut the one to port A from outside: the
    child's blocked recv on it wakes (EOF), this end reads EOF, and the other connection works."""
    if inject.link_cut_available():
        pytest.skip(inject.link_cut_available())
    la, lb = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    pa, pb = la.getsockname()[1], lb.getsockname()[1]
    with la, lb, ProcessSet() as ps:
        child = ps.start([sys.executable, "-c", _CLIENT, str(pa), str(pb)], env=worker_env(), stdout=subprocess.PIPE)
        la.settimeout(60)
        lb.settimeout(60)
        ca, _ = la.accept()
        cb, _ = lb.accept()
        with ca, cb:
            assert _readline(child, 60) == "connected"
            conns = inject.tcp_connections(child.pid)
            assert sorted(c.remote[1] for c in conns) == sorted([pa, pb]), conns
            assert inject.listening_ports(child.pid) == set()
            t0 = time.monotonic()
            cut = inject.cut_links(child.pid, except_ports=[pb])
            assert [c.remote[1] for c in cut] == [pa]
            assert _readline(child, 30) == "a-recv b''"  # the child's blocked recv woke with EOF
            woke = time.monotonic() - t0
            ca.settimeout(30)
            assert ca.recv(10) == b""  # this end of the cut connection reads EOF (FIN)
            assert _readline(child, 30) == "b-sent"
            cb.settimeout(30)
            assert cb.recv(10) == b"still"  # the spared connection works
            assert inject.cut_links(child.pid, remote_ports=[pa]) == []  # no longer ESTABLISHED
            print(f"link cut: the target's blocked recv woke {woke * 1e3:.1f} ms after cut_links started")


# ------------------------------------------------------------------------------------ link cut (gloo)

def gloo_cut_body(ctx, gloo_timeout_s: float) -> dict:
    """Rank function (world 2, default gloo group).  Both ranks block on the group (a receive from
    the other, which never sends) when the test cuts rank 1's gloo sockets from outside: both must
    fail; then each rank's next all-reduce must fail too, and the store still works.  (A rank
    with no operation pending at the cut was seen, once in about a dozen runs, to notice only at
    its next operation's gloo timeout: so both are blocked when the cut comes.)"""
    import torch
    import torch.distributed as dist

    store, rank = ctx.store, ctx.rank
    ctx.group._get_backend(torch.device("cpu")).set_timeout(datetime.timedelta(seconds=gloo_timeout_s))
    dist.all_reduce(torch.ones(1))  # the group works
    out: dict = {"rank": rank}

    def attempt(key: str, op) -> None:
        t0 = time.monotonic_ns()
        try:
            op()
            out[key] = None
        except RuntimeError as exc:
            out[key] = f"{type(exc).__name__}: {exc}"[:400]
            out[f"{key}_types"] = [c.__name__ for c in type(exc).__mro__]
        out[f"{key}_t0_ns"], out[f"{key}_t_ns"] = t0, time.monotonic_ns()

    pending = dist.irecv(torch.zeros(1), src=1 - rank)
    store.set(f"cut/pid/{rank}", str(os.getpid()))
    attempt("pending", pending.wait)
    attempt("next", lambda: dist.all_reduce(torch.ones(1)))
    # the store (control plane) still works: a write, a counter and a read of the peer's write
    store.set(f"cut/after/{rank}", "ok")
    out["count"] = int(store.add("cut/after-count", 1))
    out["peer"] = store.get(f"cut/after/{1 - rank}").decode()
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_cutting_a_ranks_gloo_sockets_fails_the_group_on_both_ranks_and_spares_the_store(ranks) -> None:
    if inject.link_cut_available():
        pytest.skip(inject.link_cut_available())
    with ranks.start(gloo_cut_body, 2, init_group=True, timeout_s=150, gloo_timeout_s=30.0) as r:
        r.wait_keys(["cut/pid/0", "cut/pid/1"], 90)
        pid1 = int(r.store.get("cut/pid/1"))
        before = inject.tcp_connections(pid1)
        gloo_ports = inject.listening_ports(pid1)
        t_cut = time.monotonic_ns()
        cut = inject.cut_links(pid1, except_ports=[r.port])
        t_done = time.monotonic_ns()
        run = r.wait()
    assert run.ok, run.explain()
    res = {x["rank"]: x for x in run.values()}
    assert cut, f"no gloo connection found among {before}"
    assert all(r.port not in c.ports() for c in cut), "the store's connection must be spared"
    spared = [c for c in before if c not in cut]
    assert spared and all(r.port in c.ports() for c in spared), f"only store connections may remain: {spared}"
    for rk in (0, 1):
        for key in ("pending", "next"):
            err = res[rk][key]
            assert err is not None, f"rank {rk}: the {key} operation succeeded after the cut"
            assert "RuntimeError" in res[rk][f"{key}_types"]
            assert "imed out" not in err, f"rank {rk}: the {key} operation failed by its timeout, not by the cut: {err}"
        assert res[rk]["peer"] == "ok" and res[rk]["count"] in (1, 2)

    def why(rk: int, key: str) -> str:
        return f"{res[rk][key + '_types'][0]}: {res[rk][key].split('] ', 1)[-1][:30]!r}"

    woke = {rk: (res[rk]["pending_t_ns"] - t_cut) / 1e6 for rk in (0, 1)}
    nxt = {rk: (res[rk]["next_t_ns"] - res[rk]["next_t0_ns"]) / 1e6 for rk in (0, 1)}
    print(f"gloo link cut: {len(cut)} socket(s) cut on rank 1 (gloo listens on {sorted(gloo_ports)}, store on {r.port}); "
          f"the pending receives failed {woke[0]:.1f} ms (rank 0, {why(0, 'pending')}) and {woke[1]:.1f} ms "
          f"(rank 1) after cut_links began (it took {(t_done - t_cut) / 1e6:.1f} ms, mostly reading /proc/<pid>/net/tcp); "
          f"the next all-reduce failed in {nxt[0]:.2f} / {nxt[1]:.2f} ms ({why(1, 'next')})")


def one_group_body(ctx) -> dict:
    """Rank function (world 2): a second gloo group ``g2`` whose listening port each rank publishes
    (its LISTEN sockets before and after building it); the test cuts only g2's pairs on rank 1.
    Both ranks are blocked in a receive on g2 when the cut comes; it fails, so does the next
    all-reduce on g2, and the default group's still works."""
    import torch
    import torch.distributed as dist

    store, rank = ctx.store, ctx.rank
    before = inject.listening_ports(os.getpid())
    g2 = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))
    mine = sorted(inject.listening_ports(os.getpid()) - before)
    dist.all_reduce(torch.ones(1), group=g2)
    pending = dist.irecv(torch.zeros(1), src=1 - rank, group=g2)  # blocked on g2 when the cut comes
    store.set(f"g2/listen/{rank}", ",".join(map(str, mine)))
    store.set(f"g2/pid/{rank}", str(os.getpid()))
    out: dict = {"rank": rank, "listen": mine}
    for key, op in (("pending", pending.wait), ("g2", lambda: dist.all_reduce(torch.ones(1), group=g2))):
        try:
            op()
            out[key] = "ok"
        except RuntimeError as exc:
            out[key] = str(exc).split("] ", 1)[-1][:80]
    t = torch.ones(1)
    dist.all_reduce(t)  # the default group was not cut
    out["default"] = float(t[0])
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_cutting_one_group_by_its_listening_ports_leaves_the_other_groups_working(ranks) -> None:
    if inject.link_cut_available():
        pytest.skip(inject.link_cut_available())
    with ranks.start(one_group_body, 2, init_group=True, timeout_s=150) as r:
        r.wait_keys(["g2/pid/0", "g2/pid/1", "g2/listen/0", "g2/listen/1"], 90)
        ports = {int(p) for k in ("g2/listen/0", "g2/listen/1") for p in r.store.get(k).decode().split(",") if p}
        cut = inject.cut_links(int(r.store.get("g2/pid/1")), any_ports=ports)
        run = r.wait()
    assert run.ok, run.explain()
    res = {x["rank"]: x for x in run.values()}
    assert len(ports) == 2 and all(len(x["listen"]) == 1 for x in res.values()), res
    assert len(cut) == 1 and set(cut[0].ports()) & ports
    assert all(x[k] != "ok" and "imed out" not in x[k] for x in res.values() for k in ("pending", "g2")), res
    assert all(x["default"] == 2.0 for x in res.values()), res
    print(f"one group cut (listening ports {sorted(ports)}): g2 failed on both ranks "
          f"({res[0]['g2'][:40]!r}), the default group still all-reduces")
