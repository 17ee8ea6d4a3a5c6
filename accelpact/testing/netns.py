"""Silent partitions: each rank in its own network namespace, joined by veth pairs to a bridge.

::

    with netns.Fabric(2) as fab:                      # 2 namespaces + a hub namespace with a bridge
        ps.start(fab.cmd_prefix(0) + [python, "server.py", fab.addr(0)])
        ps.start(fab.cmd_prefix(1) + [python, "client.py", fab.addr(0)])
        fab.partition(1)                              # rank 1's link goes down: silence, no RST
        fab.heal(1)

Layout (spec/detection.md): a *hub* namespace holds a bridge ``br0`` and one veth end ``r{i}``
per rank; rank ``i``'s namespace holds the other end, ``eth0``, with address ``10.a.b.(i+1)/24``
(``a.b`` random per fabric), and ``lo`` up.  :meth:`Fabric.partition` sets ``r{i}`` down in the
hub: the rank's ``eth0`` loses carrier and every frame to or from it is dropped; no ICMP, no RST
is generated, so a TCP connection across it sees no error on either end: sends are buffered,
reads and retransmissions just time out.  :meth:`Fabric.heal` sets it up again and TCP's
retransmission resumes the connection (after its current backoff).

With ``host=True`` the fabric also gets a veth into *this* (the root) namespace, address
``10.a.b.254`` (:attr:`Fabric.host_addr`), so a process here (a test hosting the c10d store) is
reachable from every rank; that is the only change it makes outside its own namespaces.

Names are unique per fabric (``ap-{tag}-{i}``, ``ap-{tag}-hub``, a random tag), so concurrent
tests do not clash; every namespace (and with it every veth) is deleted when the block is left,
also on an error.  Needs root and ``ip`` (iproute2): :func:`available` says why not.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import platform
import secrets
import shutil
import subprocess
from typing import Sequence

__all__ = ["Fabric", "FabricError", "available", "exists"]

_IP_TIMEOUT_S = 30.0


class FabricError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its stderr."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FabricError(f"{' '.join(cmd)}: {exc}") from None
    if check and res.returncode != 0:
        raise FabricError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    return res


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None when namespaces, veth pairs and a bridge can be made here, else the reason (cached)."""
    if platform.system() != "Linux":
        return f"network namespaces need Linux (this is {platform.system()})"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or skip)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"ap-probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except FabricError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("-n", probe, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", probe, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb")
    except FabricError as exc:
        return f"cannot create a bridge or a veth pair in a namespace: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _pick_subnet() -> tuple[int, int]:
    """A random 10.a.b.0/24 that no route of this namespace overlaps (only the host link uses it here)."""
    routes = _ip("-4", "route", "show", check=False).stdout.split()
    nets = []
    for word in routes:
        try:
            nets.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for _ in range(64):
        a, b = 128 + secrets.randbelow(127), secrets.randbelow(255)
        net = ipaddress.ip_network(f"10.{a}.{b}.0/24")
        if not any(net.overlaps(n) for n in nets if n.version == 4 and n.prefixlen > 0):
            return a, b
    raise FabricError("no free 10.x.y.0/24 subnet found")


class Fabric:
    """``n`` rank namespaces on one bridge (see the module doc).  Use as a context manager."""

    def __init__(self, n: int, *, host: bool = False) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 250:
            raise ValueError(f"Fabric: n must be an integer in [1, 250], got {n!r}")
        self.n = n
        self.host = host
        self.tag = secrets.token_hex(3)
        self.hub = f"ap-{self.tag}-hub"
        self.names = [f"ap-{self.tag}-{i}" for i in range(n)]
        self.host_dev = f"ap{self.tag}h"
        self._net: tuple[int, int] | None = None
        self._made: list[str] = []
        self._down: set[int] = set()

    # ---- addresses and commands -------------------------------------------------------------------
    def _check(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n:
            raise ValueError(f"Fabric: rank index must be in [0, {self.n - 1}], got {i!r}")
        if self._net is None:
            raise FabricError("Fabric: not set up (use it as a context manager)")
        return i

    @property
    def subnet(self) -> str:
        if self._net is None:
            raise FabricError("Fabric: not set up (use it as a context manager)")
        return f"10.{self._net[0]}.{self._net[1]}.0/24"

    def addr(self, i: int) -> str:
        """Rank ``i``'s address (its ``eth0``)."""
        self._check(i)
        assert self._net is not None
        return f"10.{self._net[0]}.{self._net[1]}.{i + 1}"

    @property
    def host_addr(self) -> str:
        """This namespace's address on the fabric (``host=True`` only)."""
        if not self.host or self._net is None:
            raise FabricError("Fabric: no host link (create it with Fabric(n, host=True))")
        return f"10.{self._net[0]}.{self._net[1]}.254"

    def netns(self, i: int) -> str:
        """Rank ``i``'s namespace name."""
        self._check(i)
        return self.names[i]

    def cmd_prefix(self, i: int) -> list[str]:
        """Prepend to a command to run it in rank ``i``'s namespace (``ip netns exec`` execs it:
        the pid of the started process is the command's own)."""
        return ["ip", "netns", "exec", self.netns(i)]

    # ---- faults -------------------------------------------------------------------------------------
    def partition(self, i: int) -> None:
        """Cut rank ``i`` off silently: its link on the bridge goes down (frames dropped, no RST)."""
        self._check(i)
        _ip("-n", self.hub, "link", "set", f"r{i}", "down")
        self._down.add(i)

    def heal(self, i: int) -> None:
        """Undo :meth:`partition`."""
        self._check(i)
        _ip("-n", self.hub, "link", "set", f"r{i}", "up")
        self._down.discard(i)

    def partitioned(self) -> set[int]:
        return set(self._down)

    # ---- life cycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "Fabric":
        why = available()
        if why:
            raise FabricError(f"Fabric: {why}")
        try:
            self._net = _pick_subnet()
            a, b = self._net
            _ip("netns", "add", self.hub)
            self._made.append(self.hub)
            _ip("-n", self.hub, "link", "add", "name", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                _ip("netns", "add", name)
                self._made.append(name)
                _ip("-n", self.hub, "link", "add", "name", f"r{i}", "type", "veth", "peer", "name", "eth0", "netns", name)
                _ip("-n", self.hub, "link", "set", f"r{i}", "master", "br0")
                _ip("-n", self.hub, "link", "set", f"r{i}", "up")
                _ip("-n", name, "addr", "add", f"10.{a}.{b}.{i + 1}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
            if self.host:
                _ip("link", "add", "name", self.host_dev, "type", "veth", "peer", "name", "host", "netns", self.hub)
                self._made.append(f"link:{self.host_dev}")
                _ip("-n", self.hub, "link", "set", "host", "master", "br0")
                _ip("-n", self.hub, "link", "set", "host", "up")
                _ip("addr", "add", f"10.{a}.{b}.254/24", "dev", self.host_dev)
                _ip("link", "set", self.host_dev, "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> list[str]:
        """Delete everything this fabric made (rank namespaces, the hub, the host link); the
        errors, if any (never raises: it runs on the way out of an error too).  Idempotent."""
        errors: list[str] = []
        for item in reversed(self._made):
            if item.startswith("link:"):
                res = _ip("link", "del", item[5:], check=False)
                # deleting the hub namespace already removed the pair
                if res.returncode != 0 and "Cannot find device" not in res.stderr:
                    errors.append(res.stderr.strip())
            else:
                res = _ip("netns", "del", item, check=False)
                if res.returncode != 0:
                    errors.append(res.stderr.strip())
        self._made.clear()
        self._down.clear()
        return errors

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Fabric(n={self.n}, tag={self.tag!r}, subnet={self.subnet if self._net else None})"


def exists(name: str) -> bool:
    """Whether a network namespace called ``name`` exists (tests check the teardown with it)."""
    return name in _list()


def _list() -> Sequence[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
