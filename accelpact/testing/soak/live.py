"""What a soak's injector sees of a live run, from outside its processes.

Everything here reads what the job writes anyway (its run folder, through
:class:`~accelpact.impl.rundir.RunDir`), what the kernel shows of its processes
(``/proc``) and what its store holds; nothing asks the workers anything.

* :class:`TraceTail` reads every trace file of the run folder incrementally (new files appear with
  every attempt and every spare that takes an identity) and says, per attempt and identity, what
  the last recorded action was: an identity whose last action is not ``RankResume`` is inside an
  episode (``RankObserve`` with no ``RankResume`` yet: the moment a fault *during recovery*
  strikes).
* :class:`Live` adds the result files (each process writes its pid there) and ``/proc``: the pid
  holding each identity in the current attempt, the idle spares, the store's port and (when the
  launcher serves it from a process of its own) the store's pid, and whether the job is in steady
  training (every identity alive, trained a step in this attempt, no episode open).
* :func:`discover_groups` reads the job's store: every gloo group publishes each member's listening
  address under its store prefix (``.../<prefix>/<group rank>``, a ``sockaddr_in``/``sockaddr_in6``: the family, then the
  port big-endian); joined with the listening ports of the live workers (``/proc/<pid>/net/tcp``),
  that names the members of every live group and its listening ports, which is what
  :func:`accelpact.testing.inject.cut_links` needs to cut one group (``any_ports``).

No torch import at module level (the store client imports it when first used).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ...impl.rundir import RunDir
from .. import inject
from ...impl.launch.launch import STORE_PID_ENV

__all__ = ["Group", "Live", "TraceTail", "discover_groups", "fd_kinds", "proc_counts", "proc_env", "pid_alive"]

#: the actions that close an identity's episode (it trains again, in the next generation; or, issue 41, its
#: replica left the job in a shrink and it idles on the bench until a grow recalls it: no episode of its own)
CLOSERS = frozenset({"RankResume", "RankLeave"})
_SPARE_TRACE = re.compile(r"^spare(\d+)-trace-a(\d+)-r(\d+)\.ndjson$")
_TRACE = re.compile(r"^trace-a(\d+)-r(\d+)\.ndjson$")


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    if not pid:
        return False
    try:
        inject.check_pid(int(pid), what="inspect", allow_self=True)
    except inject.InjectError:
        return False
    return True


def proc_env(pid: int) -> dict[str, str]:
    """``pid``'s environment (``/proc/<pid>/environ``); empty when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def proc_counts(pid: int, store_ports: Iterable[int] = ()) -> dict[str, Any] | None:
    """``pid``'s native threads (``/proc/<pid>/task``), open fds (``/proc/<pid>/fd``) and listening
    TCP sockets (one per gloo group it holds, plus none: a worker hosts no store); None if gone.
    ``names``: its threads counted by kernel name (``comm``: the engine's threads carry their own,
    ``impl/threadname.py``; torch's and gloo's theirs; other Python threads the interpreter's), so
    that a growth can say which threads grew; ``fd_kinds``: its fds by kind (:func:`fd_kinds`, the
    connections to a port of ``store_ports`` told apart)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        listeners = len(inject.listening_ports(pid))
    except (OSError, inject.InjectError):
        return None
    names: dict[str, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue  # the thread ended between the listing and the read
        names[name] = names.get(name, 0) + 1
    return {"threads": len(tids), "fds": fds, "listeners": listeners, "names": names,
            "fd_kinds": fd_kinds(pid, store_ports)}


def fd_kinds(pid: int, store_ports: Iterable[int] = ()) -> dict[str, int]:
    """``pid``'s open fds counted by what they are: ``pipe``, ``anon_inode:<kind>`` (eventfd,
    eventpoll, ...), ``/dev``, ``file``, and sockets by what they are connected to:
    ``socket:listen`` (a gloo group's listener), ``socket:store`` (a connection to a port of
    ``store_ports``: a store client, its clones among them), ``socket:peer`` (any other established
    TCP connection: a gloo pair), ``socket:<state>`` (a TCP socket in another state: ``CLOSE_WAIT``
    is one whose peer closed and this process did not) and ``socket`` (not TCP: a unix socket); so
    that a growth of fds says what grew."""
    kinds: dict[str, int] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return kinds
    tcp = _tcp_kinds(pid, frozenset(store_ports))
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed between the listing and the read
        if target.startswith("socket:["):
            kind = tcp.get(int(target[8:-1]), "socket")
        else:
            kind = (target.split(":", 1)[0] if target.startswith("pipe:")
                    else target.split("]", 1)[0].replace("[", "") if target.startswith("anon_inode:")
                    else "/dev" if target.startswith("/dev/") else "file")
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _tcp_kinds(pid: int, store_ports: frozenset[int]) -> dict[int, str]:
    """inode -> kind (:func:`fd_kinds`) of every TCP socket in ``pid``'s network namespace."""
    return {inode: ("socket:listen" if state == "LISTEN"
                    else ("socket:store" if remote[1] in store_ports else "socket:peer") if state == "ESTABLISHED"
                    else f"socket:{state}")
            for inode, _local, remote, state in inject.tcp_table(pid)}


@dataclass
class _File:
    path: Path
    attempt: int
    identity: int
    spare: int | None
    offset: int = 0
    partial: bytes = b""
    records: list[dict] = field(default_factory=list)
    header: dict | None = None
    end: dict | None = None
    inode: int = 0


class TraceTail:
    """Incremental reader of a run folder's trace files (see the module doc)."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.run = RunDir(out)
        self.files: dict[str, _File] = {}

    def poll(self) -> list[dict]:
        """Read what was appended since the last poll; returns the new action records."""
        new: list[dict] = []
        try:
            names = os.listdir(self.run.path)
        except OSError:
            return new
        for name in names:
            if name in self.files:
                continue
            m = _TRACE.match(name)
            s = _SPARE_TRACE.match(name)
            if m:
                self.files[name] = _File(self.run.path / name, int(m.group(1)), int(m.group(2)), None)
            elif s:
                self.files[name] = _File(self.run.path / name, int(s.group(2)), int(s.group(3)), int(s.group(1)))
        for name, f in list(self.files.items()):
            try:
                with open(f.path, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    if st.st_ino != f.inode or st.st_size < f.offset:  # a new file of that name: read it afresh
                        f = self.files[name] = _File(f.path, f.attempt, f.identity, f.spare, inode=st.st_ino)
                    fh.seek(f.offset)
                    chunk = fh.read()
            except OSError:
                if not f.path.exists():
                    del self.files[name]  # removed (the run folder was cleared)
                continue
            if not chunk:
                continue
            f.offset += len(chunk)
            data = f.partial + chunk
            lines = data.split(b"\n")
            f.partial = lines.pop()
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                kind = rec.get("type")
                if kind == "header":
                    f.header = rec
                elif kind == "end":
                    f.end = rec
                elif kind == "action":
                    rec["_attempt"] = f.attempt
                    f.records.append(rec)
                    new.append(rec)
        return new

    def attempts(self) -> list[int]:
        return sorted({f.attempt for f in self.files.values()})

    def records(self, attempt: int, identity: int | None = None) -> list[dict]:
        """The action records of ``attempt`` (of one identity, every incarnation), in time order."""
        recs = [r for f in self.files.values() if f.attempt == attempt and (identity is None or f.identity == identity)
                for r in f.records]
        return sorted(recs, key=lambda r: r.get("t_ns", 0))

    def open_episode(self, attempt: int, world: int) -> list[tuple[int, dict]]:
        """The identities of ``attempt`` inside an episode: their last action (by time) is not a
        ``RankResume`` (and the identity has not ended); (identity, that record) each."""
        out = []
        for r in range(world):
            fs = [f for f in self.files.values() if f.attempt == attempt and f.identity == r]
            if not fs:
                continue
            latest = max(fs, key=lambda f: (f.records[-1].get("t_ns", 0) if f.records else -1, f.spare is not None))
            if latest.end is not None or not latest.records:
                continue
            last = latest.records[-1]
            if last.get("action") not in CLOSERS:
                out.append((r, last))
        return out

    def ended(self, attempt: int) -> bool:
        """Whether some trace of ``attempt`` has an ``exited`` end record (the attempt is aborting)."""
        return any(f.attempt == attempt and f.end is not None and f.end.get("outcome") == "exited"
                   for f in self.files.values())


@dataclass(frozen=True)
class Group:
    """One live gloo group: its store prefix, a label (``replicate``, ``shard``, ``world``,
    ``control``, ``checkpoint``, ``default``, or the name a rebuilt group carries) and its members'
    listening ports (identity -> port)."""

    prefix: str
    label: str
    members: dict[int, int]
    generation: int = 0

    @property
    def ports(self) -> list[int]:
        return sorted(self.members.values())


_REBUILT = re.compile(r"g(\d+)/(?:pg|swap)/([A-Za-z_]+)")
_COUNTER = re.compile(r"/pg/\d+//(\d+)//")


def _classify(prefix: str, members: frozenset[int], topology: Any) -> tuple[str, int, int]:
    """(label, generation, order) of a group from its store prefix and members."""
    m = _REBUILT.search(prefix)
    if m:
        return m.group(2), int(m.group(1)), 0
    c = _COUNTER.search(prefix)
    order = int(c.group(1)) if c else 0
    for kind in ("shard", "replicate"):
        if members in {frozenset(g) for g in topology.groups_of_kind(kind)} and len(members) < topology.world:
            return kind, 0, order
    return "", 0, order


def discover_groups(store: Any, pids: dict[int, int], topology: Any, attempt: int | None = None) -> list[Group]:
    """Every live gloo group of the identities in ``pids`` (identity -> worker pid), read from the
    job's ``store`` (a client; see the module doc); ``attempt``: only that attempt's keys
    (``attempt{n}/``: torchrun's store keeps the earlier attempts').  The job's first groups are told apart by their
    creation order (``accelpact.init``: the default group, then control, checkpoint, the shard,
    replicate and world groups: the groups over every rank are, in that order, ``default``,
    ``control``, ``checkpoint`` and ``world``); a rebuilt group's prefix names it (``g{g}/pg/{name}``,
    ``g{g}/swap/{name}``)."""
    owner: dict[int, int] = {}
    for ident, pid in pids.items():
        try:
            for port in inject.listening_ports(pid):
                owner[port] = ident
        except inject.InjectError:
            continue
    found: dict[str, dict[int, int]] = {}
    try:
        keys = store.list_keys()
    except Exception:  # noqa: BLE001 - the store may be gone (a lost store): no group to cut
        return []
    # torchrun's store keeps every attempt's keys (a worker namespaces its own by attempt)
    mine = f"attempt{attempt}/"
    for key in keys:
        k = key.decode() if isinstance(key, (bytes, bytearray)) else str(key)
        if attempt is not None and not k.startswith(mine):
            continue
        if "/pg/" not in k and "/swap/" not in k:
            continue
        head, _, tail = k.rpartition("/")
        if not tail.isdigit():
            continue
        try:
            value = bytes(store.get(k))
        except Exception:  # noqa: BLE001 - a key deleted meanwhile
            continue
        for i in range(len(value) - 3):
            if value[i] in (2, 10) and value[i + 1] == 0:  # AF_INET, AF_INET6 (little-endian)
                port = int.from_bytes(value[i + 2:i + 4], "big")
                if port in owner:
                    found.setdefault(head, {})[owner[port]] = port
                    break
    groups = []
    world_like = []
    for prefix, members in found.items():
        label, gen, order = _classify(prefix, frozenset(members), topology)
        if not label and len(members) == topology.world:
            world_like.append((order, prefix, members))
            continue
        groups.append(Group(prefix, label or "other", dict(members), gen))
    # the groups over every rank of the first build, in creation order (no counter: the default group)
    names = ["default", "control", "checkpoint", "world"]
    world_like.sort()
    for i, (_order, prefix, members) in enumerate(world_like):
        label = names[i] if len(world_like) == len(names) else ("world" if i == len(world_like) - 1 else f"all-{i}")
        groups.append(Group(prefix, label, dict(members), 0))
    return groups


class Live:
    """The live state of one run folder (see the module doc)."""

    def __init__(self, out: str | os.PathLike, world: int, spares: int) -> None:
        self.run = RunDir(out)
        self.world = world
        self.spares = spares
        self.tail = TraceTail(out)
        self._results: dict[tuple[int, int], dict] = {}
        self._spare_results: dict[tuple[int, int], dict] = {}
        self._store: Any = None
        self._store_port: int | None = None

    # ---- reading ----------------------------------------------------------------------------
    def poll(self) -> list[dict]:
        """Refresh traces and result files; the new action records."""
        new = self.tail.poll()
        self._results = self._read_results()
        return new

    def _read_results(self) -> dict[tuple[int, int], dict]:
        """The result files only (:meth:`RunDir.results` also reads every steps file: too much to do
        every few milliseconds of a long run)."""
        out: dict[tuple[int, int], dict] = {}
        spare: dict[tuple[int, int], dict] = {}
        try:
            names = os.listdir(self.run.path)
        except OSError:
            return out
        for name in names:
            what = RunDir.result_name(name)
            if what is None:
                continue
            try:
                data = json.loads((self.run.path / name).read_text())
            except (OSError, ValueError):
                continue
            kind, attempt, index = what
            (out if kind == "rank" else spare)[(attempt, index)] = data
        self._spare_results = spare
        return out

    @property
    def attempt(self) -> int:
        """The current attempt: the highest one any process wrote a result for."""
        return max((a for a, _ in self._results), default=0)

    def results(self, attempt: int | None = None) -> dict[int, dict]:
        a = self.attempt if attempt is None else attempt
        return {r: v for (x, r), v in self._results.items() if x == a}

    def pids(self) -> dict[int, int]:
        """identity -> live worker pid of the current attempt."""
        out = {}
        for r, v in self.results().items():
            if r < self.world and pid_alive(v.get("pid")) and v.get("outcome") == "running":
                out[r] = int(v["pid"])
        return out

    def idle_spares(self) -> dict[int, int]:
        """spare index -> pid of the current attempt's idle spares."""
        a = self.attempt
        return {k: int(v["pid"]) for (x, k), v in self._spare_results.items()
                if x == a and v.get("outcome") == "spare-idle" and pid_alive(v.get("pid"))}

    def steady(self) -> bool:
        """Every identity of the current attempt alive, running (not stopped), past one step of this
        attempt, and no episode open."""
        return self.unsteady() == ""

    def unsteady(self) -> str:
        """Why the job is not in steady training ("" when it is)."""
        a = self.attempt
        res = self.results(a)
        for r in range(self.world):
            v = res.get(r)
            if v is None:
                return f"attempt {a}: rank {r} has no result file yet"
            if v.get("outcome") != "running":
                return f"attempt {a}: rank {r} is {v.get('outcome')}"
            if not pid_alive(v.get("pid")):
                return f"attempt {a}: rank {r}'s pid {v.get('pid')} is gone"
            if (v.get("frontier") or 0) <= (v.get("start_step") or 0):
                return f"attempt {a}: rank {r} has not committed a step yet"
            try:
                if inject.is_stopped(int(v["pid"])):
                    return f"attempt {a}: rank {r} is stopped"
            except inject.InjectError:
                return f"attempt {a}: rank {r} is gone"
        if self.tail.ended(a):
            return f"attempt {a} is ending"
        ep = self.tail.open_episode(a, self.world)
        if ep:
            open_ = ", ".join(f"r{r} {rec.get('action')}" for r, rec in ep)
            return f"attempt {a}: episode open ({open_})"
        return ""

    def frontier(self) -> int:
        return min(((v.get("frontier") or 0) for v in self.results().values()), default=0)

    def finished(self) -> bool:
        res = self.results()
        return len(res) >= self.world and all(v.get("outcome") == "finished" for r, v in res.items() if r < self.world)

    # ---- the store ----------------------------------------------------------------------------
    def store_address(self) -> tuple[str, int] | None:
        for pid in self.pids().values():
            env = proc_env(pid)
            if env.get("MASTER_PORT"):
                return env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"])
        return None

    def store_pid(self) -> int | None:
        """The pid of the process serving the store, when the launcher says (``ACCELPACT_STORE_PID``)."""
        for pid in self.pids().values():
            v = proc_env(pid).get(STORE_PID_ENV)
            if v and v.isdigit():
                return int(v)
        return None

    def store(self) -> Any:
        """A client of the current attempt's store (cached while the port stays the same), or None."""
        addr = self.store_address()
        if addr is None:
            return None
        if self._store is not None and self._store_port == addr[1]:
            return self._store
        from datetime import timedelta

        import torch.distributed as dist

        try:
            self._store = dist.TCPStore(addr[0], addr[1], is_master=False, timeout=timedelta(seconds=5))
        except Exception:  # noqa: BLE001 - unreachable (lost, restarting): no store now
            self._store = None
            return None
        self._store_port = addr[1]
        return self._store

    def groups(self, topology: Any) -> list[Group]:
        st = self.store()
        if st is None:
            return []
        try:
            return discover_groups(st, self.pids(), topology, self.attempt)
        except Exception:  # noqa: BLE001 - the store was lost meanwhile
            self._store = None
            return []

    def store_port(self) -> int | None:
        addr = self.store_address()
        return None if addr is None else addr[1]


def ports_of(pid: int) -> set[int]:
    """Every TCP port ``pid`` holds: its listening ports and the local ports of its connections."""
    return inject.listening_ports(pid) | {c.local[1] for c in inject.tcp_connections(pid)}


def links_between(a: int, b: int, store_ports: Iterable[int]) -> list[int]:
    """The remote ports of ``a``'s connections whose other end is a socket of ``b`` (not the store's)."""
    theirs = ports_of(b) - set(store_ports)
    return sorted({c.remote[1] for c in inject.tcp_connections(a) if c.remote[1] in theirs})
