"""External fault primitives: act on a target process, by pid, from outside its code path.

The code under test never knows: nothing here is called by the engine.  A test harness, a
conformance runner or an injector process calls these on a rank's pid, as a cluster's faults
strike (spec/detection.md).  Every function validates its pid first (:func:`check_pid`): a pid
that does not exist, has exited (zombie) or is this very process is a :class:`InjectError`
naming it, never a signal sent to the wrong process.

* :func:`crash`: SIGKILL.  The process is gone; the kernel closes its sockets (a peer's pending
  gloo op fails at once); its store writes stop.
* :func:`stop` / :func:`resume`: SIGSTOP / SIGCONT.  Every thread stops (a heartbeat too); the
  sockets stay open, so peers see only silence.
* :func:`gil_hang`: a signal to a harness-installed handler that calls libc ``nanosleep``
  through ``ctypes.PyDLL``: the main thread holds the GIL, so no Python thread of the process runs
  (heartbeat, watchdog); native threads (gloo's) still do.
* :func:`slow`: a straggler.  ``how="stop"``: SIGSTOP for ``seconds``, then SIGCONT (every thread
  freezes); ``how="sleep"``: a signal to a harness handler that ``time.sleep``s in the main thread
  (other Python threads, a heartbeat, go on).
* :func:`cut_links`: ``pidfd_getfd`` duplicates the target's TCP sockets into the injector,
  ``shutdown(SHUT_RDWR)`` on the dup acts on the shared socket: the selected connections fail on
  both ends (the peer reads EOF), the others (the store's) keep working.  :func:`cut_link`: every
  connection between two processes (a broken link between two ranks: every group they share).

Signal-driven primitives (:func:`gil_hang`, ``slow(how="sleep")``) need a handler that the
*harness* installs in the target at its start (:func:`install_handlers`); the injector checks the
target's caught-signal mask (``/proc/<pid>/status`` ``SigCgt``) before signalling, so an
uninstalled handler is an error, not the signal's default action (SIGUSR1/2 terminate).  The
duration travels in a small mailbox file (:func:`mailbox`), read and removed by the handler.  A
Python signal handler runs in the main thread at its next bytecode: while the main thread is blocked
inside a native call that does not return on a signal (a gloo collective) the hang or sleep starts
only once that call returns.

How a gloo group's sockets are told apart from the store's (measured, torch 2.13, loopback): every
TCP connection of a rank is either to the c10d store (the remote port is the store's port,
``MASTER_PORT``; on the store's host also accepted connections with that local port, and its own
client's) or a gloo pair.  Each gloo group listens on its own port on each member (a LISTEN socket
of the process, :func:`listening_ports`: one per group) and has one connected socket per peer,
from an ephemeral port of one member to the listening port of the other.  So:

* every gloo group of a rank: ``cut_links(pid, except_ports=[store_port])``;
* one group: ``cut_links(pid, any_ports=<that group's listening ports on its members>)``: a pair
  always has one end on a listening port of its group (``listening_ports`` before and after the
  group is built gives them);
* one peer: ``remote_hosts`` (one host per rank, as in :mod:`accelpact.testing.netns`) or the ports.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import platform
import signal
import sys
import socket
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

__all__ = [
    "InjectError", "TcpConn", "check_pid", "crash", "cut_link", "cut_links", "gil_hang", "link_connections", "handler_installed", "install_gil_hang_handler",
    "install_handlers", "install_sleep_handler", "is_stopped", "link_cut_available", "listening_ports", "mailbox", "resume",
    "select_connections", "slow", "stop", "tcp_connections", "tcp_state", "tcp_table", "GIL_HANG_SIGNAL", "SLEEP_SIGNAL",
    "STACKS_SIGNAL", "dump_stacks", "install_stacks_handler",
]

#: the signal a harness-installed handler answers with a GIL hang (:func:`install_gil_hang_handler`)
GIL_HANG_SIGNAL = signal.SIGUSR2
#: the signal a harness-installed handler answers with a main-thread sleep (:func:`install_sleep_handler`)
SLEEP_SIGNAL = signal.SIGUSR1
#: the signal a harness-installed handler answers with every thread's Python stack on stderr
#: (:func:`install_stacks_handler`; a diagnosis, never a fault): a realtime signal nothing else uses
STACKS_SIGNAL = signal.SIGRTMIN + 4

# pidfd_open / pidfd_getfd are numbered alike on x86_64 and aarch64 (asm-generic table, Linux >= 5.6)
_SYSCALLS = {"x86_64": (434, 438), "aarch64": (434, 438)}
_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


class InjectError(RuntimeError):
    """A fault could not be injected as asked; the message names the pid and what is wrong."""


# ------------------------------------------------------------------------------------------ validation

def _proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``/proc/<pid>/status``), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("State:"):
                    return line.split()[1]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return "?"


def check_pid(pid: object, *, what: str = "inject a fault into", allow_self: bool = False) -> int:
    """``pid`` as an int, or :class:`InjectError` naming it: not a positive integer, this process
    itself (unless ``allow_self``: inspection), no such process, or one that has exited (a zombie)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise InjectError(f"cannot {what} pid {pid!r}: a pid is a positive integer")
    if pid == os.getpid() and not allow_self:
        raise InjectError(f"cannot {what} pid {pid}: that is this process (the injector acts from outside)")
    state = _proc_state(pid)
    if state is None:
        raise InjectError(f"cannot {what} pid {pid}: no such process")
    if state in ("Z", "X"):
        raise InjectError(f"cannot {what} pid {pid}: the process has exited (state {state}, not yet reaped)")
    return pid


def _signal(pid: int, sig: int, what: str) -> None:
    check_pid(pid, what=what)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise InjectError(f"cannot {what} pid {pid}: no such process") from None
    except PermissionError:
        raise InjectError(f"cannot {what} pid {pid}: not permitted (another user's process; run as its user or root)") from None


# ------------------------------------------------------------------------------------- signal faults

def crash(pid: int) -> None:
    """SIGKILL ``pid``: no handler runs, its sockets are closed by the kernel (peers see a reset or
    EOF at once); its store writes stop."""
    _signal(pid, signal.SIGKILL, "crash")


def _settle(pid: int, stopped: bool, within_s: float, what: str) -> None:
    """Wait (bounded) until ``pid``'s state says the signal took effect: a signal is delivered
    asynchronously, and a caller that reads the state at once must see the new one."""
    end = time.monotonic() + within_s
    while True:
        state = _proc_state(pid)
        if state is None or state in ("Z", "X") or (state == "T") == stopped:
            return
        if time.monotonic() >= end:
            raise InjectError(f"cannot {what} pid {pid}: still in state {state} {within_s} s after the signal")
        time.sleep(0.001)


def stop(pid: int, *, settle_s: float = 5.0) -> None:
    """SIGSTOP ``pid`` and wait (at most ``settle_s``) until it is stopped: every thread stops (a
    hang of the whole process); its sockets stay open, so peers see nothing but silence.  Undo
    with :func:`resume`."""
    _signal(pid, signal.SIGSTOP, "stop")
    _settle(pid, True, settle_s, "stop")


def resume(pid: int, *, settle_s: float = 5.0) -> None:
    """SIGCONT ``pid`` (after :func:`stop`) and wait (at most ``settle_s``) until it runs again."""
    _signal(pid, signal.SIGCONT, "resume")
    _settle(pid, False, settle_s, "resume")


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state ``T``)."""
    check_pid(pid, what="inspect", allow_self=True)
    return _proc_state(pid) == "T"


def handler_installed(pid: int, signum: int) -> bool:
    """Whether ``pid`` catches ``signum`` (bit ``signum - 1`` of ``SigCgt`` in ``/proc/<pid>/status``)."""
    check_pid(pid, what="inspect", allow_self=True)
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(signum) - 1) & 1)
    except OSError:
        pass
    return False


def mailbox(pid: int, signum: int) -> Path:
    """The file through which an injector passes a duration to ``pid``'s handler of ``signum``."""
    return Path(tempfile.gettempdir()) / "accelpact-inject" / f"{pid}-{int(signum)}"


def _post(pid: int, signum: int, seconds: float | None, what: str) -> None:
    check_pid(pid, what=what)
    if not handler_installed(pid, signum):
        raise InjectError(f"cannot {what} pid {pid}: it does not catch {signal.Signals(signum).name}; the harness must call "
                          f"accelpact.testing.inject.install_handlers() in the target at its start")
    box = mailbox(pid, signum)
    box.parent.mkdir(parents=True, exist_ok=True)
    tmp = box.with_name(f".{box.name}.{os.getpid()}.tmp")
    tmp.write_text("forever" if seconds is None else repr(float(seconds)))
    os.replace(tmp, box)
    try:
        _signal(pid, signum, what)
    except BaseException:
        box.unlink(missing_ok=True)
        raise


def _duration(seconds: float | None, what: str, allow_forever: bool) -> float | None:
    if seconds is None and allow_forever:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise InjectError(f"{what}: seconds must be a positive number{' or None (forever)' if allow_forever else ''}, "
                          f"got {seconds!r}")
    return float(seconds)


def gil_hang(pid: int, seconds: float | None = None, *, signum: int = GIL_HANG_SIGNAL) -> None:
    """Make ``pid``'s main thread hold the GIL for ``seconds`` (None: until the process is killed),
    so that none of its Python threads runs (its heartbeat and watchdog threads included).  Needs
    :func:`install_gil_hang_handler` in the target; returns once the signal is sent (the hang starts
    at the target's next bytecode; :func:`mailbox` disappears when it starts)."""
    _post(pid, signum, _duration(seconds, "gil_hang", True), "GIL-hang")


def slow(pid: int, seconds: float, *, how: str = "stop", signum: int = SLEEP_SIGNAL) -> None:
    """A straggler: ``pid`` makes no progress for ``seconds``, then goes on.

    ``how="stop"``: SIGSTOP, wait ``seconds`` here (blocking the caller), SIGCONT (also if the
    wait is interrupted).  Every thread stops, so a heartbeat stops too: to a failure detector a
    stop longer than its dead timeout is indistinguishable from a crash.
    ``how="sleep"``: the harness's :func:`install_sleep_handler` makes the main thread
    ``time.sleep(seconds)``; returns at once.  Other Python threads keep running (the GIL is
    released), so a heartbeat goes on: a straggler as a slow step looks to its peers.
    """
    secs = float(_duration(seconds, "slow", False) or 0.0)
    if how == "stop":
        stop(pid)
        try:
            time.sleep(secs)
        finally:
            try:
                resume(pid)
            except InjectError:
                pass  # it died meanwhile: nothing to resume
    elif how == "sleep":
        _post(pid, signum, secs, "slow down")
    else:
        raise InjectError(f"slow: how must be 'stop' or 'sleep', got {how!r}")


# ----------------------------------------------------------------------- handlers (installed by the harness)

def _read_box(signum: int, default: float | None) -> float | None:
    box = mailbox(os.getpid(), signum)
    try:
        text = box.read_text().strip()
        box.unlink()
    except OSError:
        return default
    if text == "forever":
        return None
    try:
        return float(text)
    except ValueError:
        return default


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _gil_holding_sleep() -> Callable[[float], None]:
    """libc ``nanosleep`` through ``ctypes.PyDLL``: a foreign call that keeps the GIL held (a
    ``CDLL`` call or ``time.sleep`` releases it; a pure-Python busy loop gives it up every switch
    interval).  Resolved once, at install, so the handler itself does no lookup."""
    fn = ctypes.PyDLL(None).nanosleep
    fn.argtypes = [ctypes.POINTER(_Timespec), ctypes.POINTER(_Timespec)]
    fn.restype = ctypes.c_int

    def sleep(seconds: float) -> None:
        whole = int(seconds)
        req = _Timespec(whole, int((seconds - whole) * 1e9))
        fn(ctypes.byref(req), None)

    return sleep


def install_gil_hang_handler(signum: int = GIL_HANG_SIGNAL, default_s: float | None = None) -> None:
    """Harness side of :func:`gil_hang`: call in the target's main thread at its start.  On
    ``signum`` the main thread holds the GIL inside one libc ``nanosleep`` for the mailbox's
    duration (``default_s`` when none was posted; None: forever, in one-hour calls).  Another signal
    caught meanwhile ends the C call early; the remainder is slept again, with the switch interval
    raised meanwhile so that no other thread runs between the two calls (as in a hang in C code)."""
    sleep = _gil_holding_sleep()

    def handler(sig: int, frame: object) -> None:
        seconds = _read_box(sig, default_s)
        end = None if seconds is None else time.monotonic() + seconds
        # between two C calls the interpreter would hand the GIL to a waiting thread after one switch
        # interval (a signal, e.g. the launcher's SIGTERM, ends a call): a real hang in C code never
        # does, so none of the process's Python threads may run until the hang ends
        interval = sys.getswitchinterval()
        sys.setswitchinterval(3600.0)
        try:
            while True:
                left = 3600.0 if end is None else end - time.monotonic()
                if left <= 0:
                    return
                sleep(left)
        finally:
            sys.setswitchinterval(interval)

    signal.signal(signum, handler)


def install_sleep_handler(signum: int = SLEEP_SIGNAL, default_s: float = 1.0) -> None:
    """Harness side of ``slow(how="sleep")``: on ``signum`` the main thread ``time.sleep``s for
    the mailbox's duration (``default_s`` when none was posted).  The GIL is released meanwhile."""

    def handler(sig: int, frame: object) -> None:
        seconds = _read_box(sig, default_s)
        end = time.monotonic() + (3600.0 * 24 if seconds is None else seconds)
        while (left := end - time.monotonic()) > 0:
            time.sleep(left)

    signal.signal(signum, handler)


def install_stacks_handler(signum: int = STACKS_SIGNAL) -> None:
    """Harness side of :func:`dump_stacks`: on ``signum`` faulthandler writes every thread's Python
    stack to stderr, from the signal handler itself (it needs neither the GIL nor the main thread, so a
    process whose main thread is blocked in C++ still answers)."""
    import faulthandler

    faulthandler.register(signum, file=sys.stderr, all_threads=True)


def dump_stacks(pid: int, signum: int = STACKS_SIGNAL) -> bool:
    """Ask ``pid`` (a harness that installed :func:`install_stacks_handler`) for its threads' stacks
    on its stderr.  True if it was asked; False if it is gone or does not catch ``signum``."""
    try:
        if not handler_installed(check_pid(pid, what="dump the stacks of"), signum):
            return False
        os.kill(pid, signum)
    except (InjectError, OSError):
        return False
    return True


def install_handlers(gil_signum: int = GIL_HANG_SIGNAL, sleep_signum: int = SLEEP_SIGNAL) -> None:
    """The harness handlers (GIL hang, sleep, stack dump); call once in the target's main thread at its start."""
    if threading.current_thread() is not threading.main_thread():
        raise InjectError("install_handlers: Python signal handlers can only be installed from the main thread")
    install_gil_hang_handler(gil_signum)
    install_sleep_handler(sleep_signum)
    install_stacks_handler()


# -------------------------------------------------------------------------------------------- link cut

@dataclass(frozen=True, slots=True)
class TcpConn:
    """A TCP socket of a process: its fd there, the socket inode, both ends and the TCP state."""

    fd: int
    inode: int
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str

    def ports(self) -> tuple[int, int]:
        return self.local[1], self.remote[1]


def _addr(hexaddr: str) -> tuple[str, int]:
    """``0100007F:1F90`` -> ("127.0.0.1", 8080); IPv6 (32 hex digits, four host-order words) likewise,
    a v4-mapped address shown as its IPv4 form."""
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[::-1])
    else:
        v6 = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        ip = v6.ipv4_mapped or v6
    return str(ip), int(port, 16)


def _socket_fds(pid: int) -> dict[int, int]:
    """inode -> fd of ``pid``'s sockets."""
    out: dict[int, int] = {}
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        raise InjectError(f"cannot list sockets of pid {pid}: no such process") from None
    except PermissionError:
        raise InjectError(f"cannot list sockets of pid {pid}: not permitted (another user's process)") from None
    for name in names:
        try:
            link = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out[int(link[8:-1])] = int(name)
    return out


def tcp_state(code: str) -> str:
    """The name of a ``/proc/net/tcp`` ``st`` column (``0A`` -> ``LISTEN``); an unknown code as is."""
    return _TCP_STATES.get(code, code)


def tcp_connections(pid: int, states: Iterable[str] | None = ("ESTABLISHED",)) -> list[TcpConn]:
    """``pid``'s TCP sockets (v4 and v6) in the given states (None: any), from ``/proc/<pid>/fd``
    (fd -> ``socket:[inode]``) joined with ``/proc/<pid>/net/tcp{,6}`` (its network namespace)."""
    check_pid(pid, what="list the sockets of", allow_self=True)
    fds = _socket_fds(pid)
    want = None if states is None else set(states)
    found = [TcpConn(fds[inode], inode, local, remote, state) for inode, local, remote, state in tcp_table(pid)
             if inode in fds and (want is None or state in want)]
    return sorted(found, key=lambda c: c.fd)


def tcp_table(pid: int) -> list[tuple[int, tuple[str, int], tuple[str, int], str]]:
    """Every TCP socket (v4 and v6) of ``pid``'s network namespace (``/proc/<pid>/net/tcp{,6}``), as
    (inode, local address, remote address, state name); whichever process holds it."""
    rows = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) >= 10:
                rows.append((int(cols[9]), _addr(cols[1]), _addr(cols[2]), tcp_state(cols[3])))
    return rows


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` listens on (its gloo listeners; the store's, on the store's host)."""
    return {c.local[1] for c in tcp_connections(pid, ("LISTEN",))}


def _ports(name: str, ports: Iterable[int] | None) -> frozenset[int] | None:
    if ports is None:
        return None
    out = frozenset(ports)
    bad = [p for p in out if isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536]
    if bad:
        raise InjectError(f"cut_links: {name} must be TCP ports (1..65535), got {sorted(map(repr, bad))}")
    return out


def select_connections(conns: Iterable[TcpConn], *, remote_ports: Iterable[int] | None = None,
                       local_ports: Iterable[int] | None = None, any_ports: Iterable[int] | None = None,
                       except_ports: Iterable[int] | None = None,
                       remote_hosts: Iterable[str] | None = None) -> list[TcpConn]:
    """The connections matching every given selector: remote port in ``remote_ports``, local port in
    ``local_ports``, either end's port in ``any_ports``, remote address in ``remote_hosts``, and
    neither end's port in ``except_ports``.  At least one selector must be given
    (``except_ports=()`` selects every connection)."""
    rp, lp = _ports("remote_ports", remote_ports), _ports("local_ports", local_ports)
    ap, xp = _ports("any_ports", any_ports), _ports("except_ports", except_ports)
    try:
        hosts = None if remote_hosts is None else {str(ipaddress.ip_address(h)) for h in remote_hosts}
    except ValueError as exc:
        raise InjectError(f"cut_links: remote_hosts must be IP addresses: {exc}") from None
    if rp is None and lp is None and ap is None and xp is None and hosts is None:
        raise InjectError("cut_links: give a selector (remote_ports, local_ports, any_ports, remote_hosts or "
                          "except_ports; except_ports=() cuts every TCP connection)")
    out = []
    for c in conns:
        if rp is not None and c.remote[1] not in rp:
            continue
        if lp is not None and c.local[1] not in lp:
            continue
        if ap is not None and c.local[1] not in ap and c.remote[1] not in ap:
            continue
        if hosts is not None and c.remote[0] not in hosts:
            continue
        if xp is not None and (c.local[1] in xp or c.remote[1] in xp):
            continue
        out.append(c)
    return out


def link_cut_available() -> str | None:
    """None when :func:`cut_links` can work here, else the reason."""
    if platform.system() != "Linux":
        return f"link cut needs Linux pidfd_getfd (this is {platform.system()})"
    if platform.machine() not in _SYSCALLS:
        return f"pidfd syscall numbers unknown for {platform.machine()} (known: {sorted(_SYSCALLS)})"
    if not hasattr(os, "pidfd_open"):
        return "os.pidfd_open is missing (Python >= 3.9 on Linux >= 5.3 needed)"
    return None


def _pidfd_getfd(pidfd: int, fd: int, pid: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr = _SYSCALLS[platform.machine()][1]
    got = libc.syscall(ctypes.c_long(nr), ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0))
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_getfd(pid {pid}, fd {fd}): {os.strerror(err)}")
    return int(got)


def link_connections(pid: int, peer: int) -> list[TcpConn]:
    """``pid``'s ESTABLISHED TCP connections whose other end is a socket of process ``peer``: every
    connection of the link between them (one per group they share, on loopback or across hosts of one
    network namespace: a remote port is some socket's local port, and ``peer``'s are read off its own
    ``/proc`` entry)."""
    theirs = {c.local for c in tcp_connections(check_pid(peer, what="list the sockets of", allow_self=True), None)}
    return [c for c in tcp_connections(pid) if c.remote in theirs]


def cut_link(pid: int, peer: int, *, allow_self: bool = False) -> list[TcpConn]:
    """A broken link between two ranks' processes: every connection of ``pid`` to ``peer`` is shut down
    (:func:`link_connections`; ``SHUT_RDWR`` on one end fails both), so every group the two share
    fails, whichever kind (replicate, shard, world, the control plane's), while each keeps its
    connections to everyone else and to the store.  ``allow_self``: ``pid`` may be this process (a
    test harness's injector thread inside a rank; its own fds are duplicated directly)."""
    chosen = link_connections(pid, peer)
    ports = {c.remote[1] for c in chosen}
    if not ports:
        return []
    return cut_links(pid, remote_ports=ports, allow_self=allow_self,
                     only=lambda c: any(c.remote == x.remote and c.local == x.local for x in chosen))


def cut_links(pid: int, *, remote_ports: Iterable[int] | None = None, local_ports: Iterable[int] | None = None,
              any_ports: Iterable[int] | None = None, except_ports: Iterable[int] | None = None,
              remote_hosts: Iterable[str] | None = None, allow_self: bool = False,
              only: Callable[[TcpConn], bool] | None = None) -> list[TcpConn]:
    """Shut down (``SHUT_RDWR``) ``pid``'s ESTABLISHED TCP connections chosen by the selectors of
    :func:`select_connections`; returns those cut.  Never touches a LISTEN socket (shutting down
    gloo's listener aborts the process).

    From outside: ``pidfd_getfd`` duplicates the target's fd into this process (needs ptrace
    rights over it: CAP_SYS_PTRACE (root), or the same user with Yama ``ptrace_scope`` 0, or 1 when
    the target descends from the injector, as a launcher's ranks do); the dup is checked to be
    the same socket inode (an fd number can be reused between listing and dup), shut down (which
    acts on the shared socket: the target's blocked reads and writes fail, the peer reads EOF) and
    closed (only the dup).
    """
    why = link_cut_available()
    if why:
        raise InjectError(f"cannot cut links of pid {pid}: {why}")
    check_pid(pid, what="cut links of", allow_self=allow_self)
    chosen = select_connections(tcp_connections(pid), remote_ports=remote_ports, local_ports=local_ports,
                                any_ports=any_ports, except_ports=except_ports, remote_hosts=remote_hosts)
    chosen = [c for c in chosen if only is None or only(c)]
    if not chosen:
        return []
    own = pid == os.getpid()
    try:
        pidfd = -1 if own else os.pidfd_open(pid)
    except ProcessLookupError:
        raise InjectError(f"cannot cut links of pid {pid}: no such process") from None
    cut: list[TcpConn] = []
    try:
        for c in chosen:
            try:
                dup = os.dup(c.fd) if own else _pidfd_getfd(pidfd, c.fd, pid)
            except OSError as exc:
                if exc.errno in (1, 13):  # EPERM, EACCES
                    raise InjectError(f"cannot cut links of pid {pid}: {exc.strerror} (ptrace rights over it needed)") from None
                continue  # EBADF: closed meanwhile
            try:
                st = os.fstat(dup)
                if not (stat.S_ISSOCK(st.st_mode) and st.st_ino == c.inode):
                    continue  # the fd number now names another file: not ours to touch
                s = socket.socket(fileno=dup)
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    cut.append(c)
                except OSError:
                    pass  # already shut down / not connected any more
                finally:
                    s.detach()
            finally:
                os.close(dup)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return cut
