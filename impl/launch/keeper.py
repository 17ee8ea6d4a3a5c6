"""The keeper: one rank's process as the launcher sees it, so that one rank's death is not the job's.

``python -m accelpact.impl.launch.keeper_entry -- CMD [ARGS...]`` (the ``--`` may be left out) runs ``CMD`` as
this rank's worker; users start it through ``accelpact launch`` (:mod:`accelpact.impl.launch.cli_launch`).  The
paths users were told before, ``-m accelpact.impl.launch.keeper`` and ``-m accelpact.impl.keeper``, still work
for one release and print a deprecation line (:func:`deprecated`).

Why it exists (hot swap; spec/hotswap.md).  torchrun's elastic agent
(``torch/distributed/elastic/agent/server/api.py``, ``SimpleElasticAgent._invoke_run``) polls its
worker group, and as soon as *any* worker has exited non-zero the group is ``FAILED``: the agent
stops every worker of the group (``_stop_workers``: SIGTERM, then SIGKILL, to each worker's process
group) and starts them all again (``_restart_workers``), or gives up when no restart is left.  A
crashed rank would thereby end its survivors before a spare could take its place.  The keeper sits
between the agent and the training process: the agent sees the keeper, the keeper sees the worker.

* No spares (``ACCELPACT_SPARES_PER_NODE`` and ``ACCELPACT_SPARES`` unset or ``0``): the keeper ``exec``\\ s
  the command, so there is no extra process and nothing differs from running the command directly.
* Spares per node (issue 43; :class:`~accelpact.impl.runtime.hotswap.SpareLayout`):
  ``ACCELPACT_SPARES_PER_NODE=K`` (``accelpact launch --spares K``) makes the last ``K`` processes of
  each node spares (``LOCAL_RANK >= LOCAL_WORLD_SIZE - K``).  The keeper gives its worker the identity
  of its slot: ``RANK`` = ``node * (LOCAL_WORLD_SIZE - K) + LOCAL_RANK`` for a training process, ``W +
  k`` for spare ``k = node * K + j`` (W the training ranks), with ``ACCELPACT_SPARES`` = the job's total
  ``S`` (what :func:`accelpact.init` reads) and the launcher's own ``RANK`` in
  ``ACCELPACT_LAUNCHER_RANK``; ``LOCAL_RANK`` (the device), ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``
  stay the launcher's.  Everything below speaks of that ``RANK``.  ``ACCELPACT_SPARES=N`` alone
  (deprecated) still names the spares of a one-node job, the last ``N`` ranks, which is the same
  thing; on several nodes it is refused (exit 2).
* Otherwise the command runs as a child in the keeper's process group (the agent's kill of the group
  reaches it directly); SIGTERM and SIGINT sent to the keeper are forwarded to it.

  - The child exits 0: the keeper exits 0.
  - The child exits with a code > 0 (a fail-stop exit: 70, 71, 72, 73, 1, ...): the keeper exits
    with that code at once, so torchrun sees exactly what it would see without the keeper and an
    L2 restart happens exactly as without it.
  - The child is killed by a signal (a crash) and this is a training rank
    (``RANK < W = WORLD_SIZE - ACCELPACT_SPARES``): the keeper posts a *death notice* on the job's store
    (:func:`post_death`, under ``attempt{n}/``, n the job's attempt: :mod:`accelpact.impl.launch.attempts`) and stays alive, so the agent
    sees nothing.  The survivors and a spare take over (:mod:`accelpact.impl.runtime.hotswap`).  The keeper
    then waits for the job's end on :data:`ABORT_KEY`: the value :data:`CLOSED` (the job finished
    without this process) -> exit 0; any other value (an abort reason: ``deadline``, ``rejected``,
    ``exception``, ...: the job fails as a whole, L2) -> exit ``128 + signal``.  The wait is bounded
    by ``ACCELPACT_KEEPER_WAIT_S`` (seconds, default 86400) and ends early, also with
    ``128 + signal``, if the store cannot be reached.
  - A spare's own death (``RANK >= WORLD_SIZE - ACCELPACT_SPARES``, spare ``k = RANK - (WORLD_SIZE -
    ACCELPACT_SPARES)``): if a claim had given it a rank's identity (``swap/assign/{k}``), that rank
    died: its death notice, as above; if it died idle, it is posted gone (``swap/spare-gone/{k}``: no
    claim takes it) and the job goes on with one spare fewer until the refill below.  Either way
    torchrun sees nothing (:func:`spare_died`).
  - A worker holding a rank's identity that a survivor's failure detector declared dead or hung (it
    may only be stopped: SIGSTOP, a held GIL) is *deposed*: the survivor sets
    ``swap/depose/{rank}/{since}`` for the identity's current holder
    (:func:`~accelpact.impl.controlplane.depose_key`), this keeper, polling it, kills the worker
    (SIGKILL), and its death is posted as above: a spare takes its identity.  A spare's keeper
    watches the key of the identity a claim assigned its worker, once assigned.
  - If the keeper itself was asked to stop (SIGTERM/SIGINT, e.g. the agent stopping the group), a
    child killed by a signal is no crash: exit ``128 + signal``, no notice.
  - *Refill* (spec/hotswap.md, "Refill"): once a death is posted (a training rank's, a swapped-in
    spare's, an idle spare's) and the job has not ended, the keeper starts the same command again as a
    fresh spare in the dead worker's place (:func:`refill`): spare ``k`` = ``ACCELPACT_SPARES + n - 1``
    for the n-th refill of the job's attempt (``swap/refill-ids``, so indices stay unique), launcher
    ``RANK`` = ``WORLD_SIZE - ACCELPACT_SPARES + k`` (how :func:`accelpact.init` tells a spare and its
    index), ``LOCAL_RANK`` the dead worker's (its device); its node (this keeper's) is recorded
    (``swap/spare-node/{k}``) so that a claim for a rank of this node takes it first.  The spare enters the pool claims read
    (``swap/refills``) when it says it is ready (a byte on the pipe named by :data:`READY_FD_ENV`,
    :func:`spare_ready`, once it built its model; an incoming claim before then would wait for its
    start), or, gone, when it died before.  The keeper then keeps that spare as it kept its first worker,
    and its exit code is that spare's.  ``ACCELPACT_REFILL=0`` turns refill off.  A keeper that is gone
    (its node lost) refills nothing.

Every non-zero exit the keeper decides on its own prints one line on stderr saying why.  A malformed
``ACCELPACT_SPARES_PER_NODE``, ``ACCELPACT_SPARES``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE`` or ``ACCELPACT_KEEPER_WAIT_S`` exits 2 naming the variable.

With spares, every keeper imports torch's store client in a background thread while its worker runs
(so a notice is posted within milliseconds of the death); without spares it imports nothing.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping, MutableMapping, Sequence

from ..controlplane import (ABORT_KEY, CLOSED, DEATHS_KEY, REFILL_IDS_KEY, REFILLS_KEY, STARTS_KEY, assign_key, death_key,
                            depose_key, parse_assignment, spare_gone_key, spare_node_key)
from ..runtime.hotswap import LAUNCHER_RANK_ENV, SPARES_ENV, SPARES_PER_NODE_ENV, LayoutError, SpareLayout  # torch-free
from . import attempts

__all__ = ["ABORT_KEY", "CLOSED", "DEATHS_KEY", "DEPRECATION", "LAUNCHER_RANK_ENV", "READY_FD_ENV", "REFILL_ENV", "SPARES_ENV",
           "SPARES_PER_NODE_ENV", "WAIT_ENV", "PoolEntry", "death_key", "deprecated", "lay_out", "main", "post_death", "refill",
           "spare_died", "spare_ready", "wait_for_end"]

#: Environment variables (:mod:`accelpact.impl.runtime.hotswap`): ``SPARES_PER_NODE_ENV``, the spares of
#: each node (0 or unset, and no ``SPARES_ENV``: no keeper process at all); ``SPARES_ENV``, the job's total
#: as the worker reads it (deprecated on the launcher's side); ``LAUNCHER_RANK_ENV``, the worker's
#: launcher ``RANK`` (its own ``RANK`` is its identity).
#: Environment variable: after posting a death notice, how long (seconds) the keeper waits for the
#: job's end at most.
WAIT_ENV = "ACCELPACT_KEEPER_WAIT_S"
DEFAULT_WAIT_S = 86400.0
#: Environment variable: ``0`` turns refill off (a dead worker's keeper then waits for the job's end);
#: unset or ``1``: on.
REFILL_ENV = "ACCELPACT_REFILL"
#: Environment variable a keeper sets for a spare it started (refill): the file descriptor of the pipe
#: on which the spare writes one byte once it is ready to take an identity (:func:`spare_ready`).
READY_FD_ENV = "ACCELPACT_SPARE_READY_FD"

#: Store keys, under the attempt's namespace (``attempt{n}/``): their one
#: home is :mod:`accelpact.impl.controlplane` (``DEATHS_KEY``: the count of death notices posted,
#: notice n at ``death_key(n)``; ``ABORT_KEY``: the job-wide abort key; ``CLOSED``: its value when the
#: job ended normally).

#: How often the keeper looks at the abort key while it waits for the job's end.
POLL_S = 0.1
#: The timeout of the keeper's store connection (connect and every request).
STORE_TIMEOUT_S = 30.0

EXIT_USAGE = 2
EXIT_NOT_FOUND = 127


def post_death(store: Any, rank: int) -> int:
    """Post a death notice for ``rank`` on ``store`` (already prefixed with the attempt's namespace):
    ``n = add(DEATHS_KEY, 1)`` then ``set(death_key(n), str(rank))``.  Returns n."""
    n = int(store.add(DEATHS_KEY, 1))
    store.set(death_key(n), str(rank))
    return n


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def wait_for_end(store: Any, timeout_s: float, poll_s: float = POLL_S) -> str:
    """Wait until :data:`ABORT_KEY` holds a value on ``store``; return it ("" when ``timeout_s``
    passed first).  Polls with ``check`` (no store wait that times out, so nothing is logged while
    it waits); a store error propagates (the store cannot be reached)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if store.check([ABORT_KEY]):
            value = _s(store.get(ABORT_KEY))
            if value:
                return value
        left = deadline - time.monotonic()
        if left <= 0:
            return ""
        time.sleep(min(poll_s, left))


class UsageError(Exception):
    """A malformed environment variable or command line: exit 2."""


def _env_int(env: Mapping[str, str], name: str, lo: int, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise UsageError(f"{name} is not set; the keeper needs it (torchrun and run_local set it)")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer") from None
    if value < lo:
        raise UsageError(f"{name}={raw!r} must be >= {lo}")
    return value


def _env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise UsageError(f"{name}={raw!r} must be a number of seconds > 0")
    return value


def _command(argv: Sequence[str]) -> list[str]:
    cmd = list(argv)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given to the keeper: accelpact launch [torchrun options] --spares N -- script.py [ARGS...]")
    return cmd


#: who this keeper is, once :func:`lay_out` numbered its first worker on several nodes (the launcher's RANK and
#: the identity it started as: "rank R" or "spare k"); empty: the launcher's RANK is the rank
_WHO: list[str] = []


def _say(msg: str) -> None:
    who = _WHO[0] if _WHO else f"rank {os.environ.get('RANK', '?')}"
    try:
        print(f"accelpact keeper (pid {os.getpid()}, {who}): {msg}", file=sys.stderr, flush=True)
    except OSError:  # stderr gone: the exit code still says it
        pass


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _job_store(env: Mapping[str, str]) -> Any:
    """The job's store (no namespace); KeyError/ValueError if MASTER_ADDR/MASTER_PORT are unusable,
    a store error if it cannot be reached."""
    from datetime import timedelta

    import torch.distributed as dist

    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    return dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))


def _attempt_store(env: Mapping[str, str], store: Any = None) -> Any:
    """The job's store (``store``, or a new client) under the namespace of this rank's latest attempt
    (``attempt{n}/``, :func:`accelpact.impl.launch.attempts.current`: the attempt its worker counted,
    the same on every agent, which torchrun's restart count is not).  Asked anew each time: before the
    worker counted its start it names the previous attempt."""
    import torch.distributed as dist

    store = store if store is not None else _job_store(env)
    return dist.PrefixStore(f"attempt{attempts.current(store, env)}", store)


def _post(env: Mapping[str, str], sig: int, post: Callable[[Any], str],
          connected: Sequence[Any] = ()) -> tuple[Any, str] | int:
    """A worker died by ``sig``: ``post(store)`` says so on the store (under the attempt's namespace;
    returns what it posted, for stderr).  Returns ``(that store, what)``, or the exit code ``128 +
    sig`` when nothing could be posted (said on stderr).  ``connected``: a store client already made
    (the depose watcher's), so the notice needs no new connection: survivors wait for it only so long."""
    code = 128 + sig
    try:
        s = _attempt_store(env, connected[0] if connected else None)
    except (KeyError, ValueError) as exc:
        _say(f"worker killed by {_signame(sig)}; nothing posted: MASTER_ADDR/MASTER_PORT unusable ({exc!r}); "
             f"exiting {code}")
        return code
    except Exception as exc:  # noqa: BLE001 - any store failure (connect, reset, timeout) means nothing posted
        _say(f"worker killed by {_signame(sig)}; could not reach the store ({exc}); exiting {code}")
        return code
    try:
        what = post(s)
    except Exception as exc:  # noqa: BLE001 - any store failure (reset, timeout) means nothing posted
        _say(f"worker killed by {_signame(sig)}; could not post on the store ({exc}); exiting {code}")
        return code
    return s, what


def _wait_end(s: Any, sig: int, what: str, wait_s: float) -> int:
    """After a posted death with no worker to keep: wait for the job's end on ``s``: ``closed`` -> 0,
    an abort reason, a lost store or no end within ``wait_s`` -> ``128 + sig``."""
    code = 128 + sig
    _say(f"worker killed by {_signame(sig)}: {what}; waiting for the job's end")
    try:
        value = wait_for_end(s, wait_s)
    except Exception as exc:  # noqa: BLE001 - a lost store ends the wait: the job cannot finish through it
        _say(f"worker killed by {_signame(sig)} ({what}); the store became unreachable while "
             f"waiting for the job's end ({exc}); exiting {code}")
        return code
    if value == CLOSED:
        return 0
    if not value:
        _say(f"worker killed by {_signame(sig)} ({what}); the job did not end within "
             f"{WAIT_ENV}={wait_s:g}s; exiting {code}")
        return code
    _say(f"worker killed by {_signame(sig)} ({what}); the job aborted ({value!r}); exiting {code}")
    return code


def spare_died(store: Any, k: int) -> str:
    """Spare ``k``'s worker died.  If a claim had assigned it an identity (``swap/assign/{k}``: it
    holds, or was taking, that rank's place), that rank died: post its death notice.  Otherwise it
    died idle: post it gone (:func:`~accelpact.impl.controlplane.spare_gone_key`), so that no claim
    takes it and the job goes on with one spare fewer.  Returns what was posted."""
    if store.check([assign_key(k)]):
        identity = parse_assignment(_s(store.get(assign_key(k))))[0]
        return f"spare {k} held rank {identity}: death notice {post_death(store, identity)} posted"
    store.set(spare_gone_key(k), "1")
    return f"spare {k} died idle: posted gone"


#: How often a training rank's keeper looks for a request to depose its worker: the request comes
#: after a detector's declaration (0.8 s or more of silence) and the survivor waits ``NOTICE_WAIT_S``
#: (3 s) for the death, so a quarter second costs nothing, and keeps the store's load low (one
#: ``check`` per keeper every 0.25 s, beside the workers' heartbeats).
DEPOSE_POLL_S = 0.25


def _watch_depose(env: Mapping[str, str], rank: int, proc: subprocess.Popen, done: threading.Event,
                  connected: list, poll_s: float = DEPOSE_POLL_S, spare: int | None = None) -> None:
    """A worker that holds a rank's identity may be deposed (``depose_key``: a survivor's failure
    detector declared it dead or hung while the job has spares): kill it (SIGKILL ends a stopped
    process too), so that its death is posted as any other and a spare takes its identity.  A
    training rank's worker holds ``rank`` from generation 0; spare ``spare``'s worker holds none until
    a claim of generation ``g`` assigns it one (``swap/assign/{spare}``), and from then on the key
    watched is that identity's for holder ``g + 1`` (a swapped-in spare is deposed as the rank it
    holds; see bench/README.md, K7).  Polls until ``done``; the store client it made goes into ``connected`` (the
    death notice reuses it)."""
    store = None
    key = depose_key(rank, 0) if spare is None else None  # a spare's: once a claim assigned it an identity
    assigned = assign_key(spare) if spare is not None else ""
    while not done.wait(poll_s):
        try:
            if store is None:
                store = _job_store(env)
                connected[:] = [store]
            mine = _attempt_store(env, store)
            if key is None:
                if not mine.check([assigned]):
                    continue
                identity, g, _point = parse_assignment(_s(mine.get(assigned)))
                key = depose_key(identity, g + 1)
            if not mine.check([key]):
                continue
            by = _s(mine.get(key))
        except Exception:  # noqa: BLE001 - the store is not up yet, or was lost: the next poll retries
            store = None
            connected.clear()
            continue
        _say(f"worker deposed: rank {by}'s failure detector declared it dead or hung while a spare is idle; "
             "killing it (SIGKILL)")
        proc.kill()
        return


def _warm_import() -> None:
    try:
        import torch.distributed  # noqa: F401 - imported for its side effect: later imports are free
    except Exception:  # noqa: BLE001 - posting the notice imports it again and reports the failure
        pass


# ------------------------------------------------------------------------------------------ refill
def spare_ready(env: MutableMapping[str, str] | None = None) -> bool:
    """In a spare that a keeper started (refill): tell the keeper that this spare is ready to take an
    identity (it did what it does while idle), so that it enters the pool.  The variable
    :data:`READY_FD_ENV` leaves the environment and its pipe is closed, so nothing this process starts
    inherits them.  False where there is no such pipe: a spare the launcher started is in the pool
    from the job's start."""
    env = os.environ if env is None else env
    raw = env.pop(READY_FD_ENV, None)
    if not raw:
        return False
    try:
        fd = int(raw)
    except ValueError:
        return False
    try:
        os.write(fd, b"1")
        return True
    except OSError:  # the keeper is gone: nobody reads it, and no claim will come
        return False
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


class PoolEntry:
    """Refill: spare ``k``'s entry in the pool that claims read (``swap/refills``,
    :func:`~accelpact.impl.runtime.hotswap.pool_size`), made exactly once: when the spare says it is
    ready (:func:`spare_ready`), or, if it died before, as a spare already posted gone
    (:func:`spare_died` first), so that the pool's count still reaches the indices allocated after
    it."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.entered = False
        #: the spare said it was ready (its byte came on the pipe)
        self.ready = False
        #: set once the pipe was read: the byte, or the end of file of a spare that died first
        self.heard = threading.Event()
        #: the job's end (the abort key's value) when it came before any claim took this spare
        self.ended = ""
        self._lock = threading.Lock()

    def enter(self, store: Any) -> bool:
        """Count the spare into the pool on ``store`` (the attempt's) unless that was done; True when
        this call did it."""
        with self._lock:
            if self.entered:
                return False
            store.add(REFILLS_KEY, 1)
            self.entered = True
            return True


def refill(store: Any, job_store: Any, env: Mapping[str, str], spares: int,
           node: int | None = None) -> tuple[int, dict[str, str]] | None:
    """The next spare a keeper starts in a dead worker's place: ``(k, environment)``, or None when the
    job has ended (its abort key holds a value: nothing to refill for).  ``store``: the job's store
    under the attempt's namespace; ``job_store``: without it; ``env``: the keeper's own environment.

    ``k`` = ``spares + n - 1`` for the n-th refill of the attempt (``add`` on ``swap/refill-ids``:
    unique however many keepers refill at once).  The spare's launcher ``RANK`` is ``WORLD_SIZE -
    spares + k``, so :func:`accelpact.init` makes it spare ``k``; its start count (``starts/{RANK}``,
    :mod:`accelpact.impl.launch.attempts`) is brought to the attempt's number first, so that the start
    it counts names this attempt however many attempts passed without that ``RANK``.  ``node``: this
    keeper's node (spares per node), recorded as the new spare's before it can enter the pool, so that a
    claim for a rank of that node takes it first."""
    if store.check([ABORT_KEY]) and _s(store.get(ABORT_KEY)):
        return None
    k = spares + int(store.add(REFILL_IDS_KEY, 1)) - 1
    if node is not None:
        store.set(spare_node_key(k), str(node))
    launcher = _env_int(env, "WORLD_SIZE", 1) - spares + k
    attempt = attempts.current(job_store, env)
    key = STARTS_KEY.format(rank=launcher)
    have = int(job_store.add(key, 0))
    if have < attempt:
        job_store.add(key, attempt - have)
    return k, {**env, "RANK": str(launcher)}


#: After a refilled spare's exit, how long the keeper waits for its ready pipe to be read (the byte or
#: the end of file is there already: the spare held the only write end).
READY_READ_S = 2.0


def _watch_ready(env: Mapping[str, str], fd: int, entry: PoolEntry) -> None:
    """Read the refilled spare's one byte (ready) and enter it into the pool; an end of file (the
    spare died first) enters nothing: the keeper settles it after posting it gone."""
    try:
        with os.fdopen(fd, "rb", buffering=0) as r:
            got = r.read(1)
    except OSError:
        got = b""
    entry.ready = bool(got)
    entry.heard.set()
    if not got:
        return
    try:
        if entry.enter(_attempt_store(env)):
            _say(f"spare {entry.k} is ready: in the pool")
    except Exception as exc:  # noqa: BLE001 - the store lost: the job cannot claim it anyway
        _say(f"spare {entry.k} is ready but could not enter the pool ({exc})")


def _watch_end(env: Mapping[str, str], proc: subprocess.Popen, entry: PoolEntry, done: threading.Event,
               poll_s: float = DEPOSE_POLL_S) -> None:
    """A spare this keeper started (refill) still starting or idle when the job ends (its abort key
    holds a value) and no claim took it: kill it (it would only start up to read that end), noting the
    end in ``entry.ended``.  Polls until ``done``."""
    store = None
    while not done.wait(poll_s):
        try:
            if store is None:
                store = _attempt_store(env)
            if not store.check([ABORT_KEY]) or store.check([assign_key(entry.k)]):
                continue
            value = _s(store.get(ABORT_KEY))
        except Exception:  # noqa: BLE001 - the store is not up yet, or was lost: the next poll retries
            store = None
            continue
        if value:
            entry.ended = value
            proc.kill()
            return


def run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """The keeper's logic; returns its exit code (never returns when it ``exec``\\ s)."""
    env = os.environ if env is None else env
    cmd = _command(argv)
    layout, env, node = lay_out(env)
    spares = layout.spares if layout is not None else 0
    # ACCELPACT_KEEP=1 (issue 41): keep the worker without spares too, so that its death is posted and a
    # job that opted in to micro-batches shrinks instead of torchrun restarting every rank
    if spares == 0 and env.get("ACCELPACT_KEEP", "") in ("", "0"):
        try:
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            _say(f"cannot run {cmd[0]!r}: {exc.strerror}")
            return EXIT_NOT_FOUND
    rank = _env_int(env, "RANK", 0)
    world = _env_int(env, "WORLD_SIZE", 1)
    wait_s = _env_seconds(env, WAIT_ENV, DEFAULT_WAIT_S)
    refilling = _env_int(env, REFILL_ENV, 0, default=1) > 0
    # the worker kept now: this rank's own (a training rank's, or a spare the launcher started), then
    # each spare this keeper started in a dead worker's place
    spare: int | None = None if rank < world - spares else rank - (world - spares)
    if layout is not None and layout.nodes > 1:
        first = f"rank {rank}" if spare is None else f"spare {spare}"
        _WHO[:] = [f"launcher RANK {env[LAUNCHER_RANK_ENV]}, started as {first}"]
    child_env: Mapping[str, str] = env
    entry: PoolEntry | None = None  # the kept worker's pool entry, when this keeper started it
    first_sig = 0  # the signal that killed the first worker that died here
    # every keeper, a spare's too (a spare holding a rank's identity dies as that rank): import torch's
    # store client while the worker runs (about a second on a loaded node), so that a death is posted
    # within milliseconds of it: survivors wait for the notice before they act
    threading.Thread(target=_warm_import, name="accelpact-keeper-warm", daemon=True).start()
    while True:
        rc, stopping, connected = _keep(cmd, env, child_env, rank, spare, entry)
        started = rc is not None
        if entry is not None and entry.ended:  # the job ended before any claim took the spare started here
            return 0 if entry.ended == CLOSED else 128 + first_sig
        if rc is None:
            if entry is None:
                return EXIT_NOT_FOUND
            rc = -signal.SIGKILL  # a refill that could not start: posted gone below, as a spare dead idle
        if rc >= 0:
            return rc  # 0, or a fail-stop exit: torchrun sees it unchanged
        sig = -rc
        first_sig = first_sig or sig
        if stopping:
            _say(f"worker ended by {_signame(sig)} after the keeper was asked to stop ({_signame(stopping[0])}); "
                 f"exiting {128 + sig}")
            return 128 + sig
        posted = _post(env, sig, functools.partial(_posted_death, rank, spare, entry), connected)
        if isinstance(posted, int):
            return posted
        s, what = posted
        nxt = None
        if entry is not None:
            entry.heard.wait(READY_READ_S)  # the pipe's writer is gone with the spare: its byte or its end is there
        if entry is not None and not (started and entry.ready):
            # a spare that could not start, or died before it was ready: started again it could fail
            # again, forever; the pool stays one short
            what += f"; spare {entry.k} died before it was ready: not replaced"
        elif refilling:
            try:
                nxt = refill(s, s.underlying_store if hasattr(s, "underlying_store") else _job_store(env), env, spares,
                             node=node)
            except Exception as exc:  # noqa: BLE001 - the store lost: the job cannot go on through it
                _say(f"worker killed by {_signame(sig)} ({what}); could not start a spare in its place ({exc})")
        if nxt is None:
            return _wait_end(s, sig, what, wait_s)
        spare, child_env = nxt
        entry = PoolEntry(spare)
        _say(f"worker killed by {_signame(sig)} ({what}); starting spare {spare} in its place "
             f"(RANK={child_env['RANK']})")


def lay_out(env: Mapping[str, str]) -> tuple[SpareLayout | None, Mapping[str, str], int | None]:
    """Spares per node: ``(the job's layout, the environment of this keeper's worker, this keeper's
    node)`` from the launcher's environment; ``(None, env, None)`` without spares (nothing changes).
    With spares the worker's ``RANK`` is its slot's identity (:meth:`SpareLayout.worker_rank`),
    ``ACCELPACT_SPARES`` the job's total, ``ACCELPACT_SPARES_PER_NODE`` the spares of each node and
    ``ACCELPACT_LAUNCHER_RANK`` the launcher's ``RANK``; the rest is the launcher's.
    :class:`UsageError` names a malformed variable."""
    try:
        layout = SpareLayout.from_env(env)
        if layout is None:
            return None, env, None
        node, local = layout.slot_from_env(env)
        launcher = int(env["RANK"])
        rank = layout.worker_rank(node, local)
    except LayoutError as exc:
        raise UsageError(str(exc)) from None
    worker = {**env, "RANK": str(rank), SPARES_ENV: str(layout.spares), SPARES_PER_NODE_ENV: str(layout.per_node),
              LAUNCHER_RANK_ENV: str(launcher)}
    return layout, worker, node


def _posted_death(rank: int, spare: int | None, entry: PoolEntry | None, store: Any) -> str:
    """Post the death of the kept worker on ``store``: rank ``rank``'s notice (a training rank's
    worker), or what :func:`spare_died` posts for spare ``spare``; a refill that died before it was
    ready (``entry`` not counted yet) is then counted into the pool as gone.  Returns what was posted."""
    if spare is None:
        return f"death notice {post_death(store, rank)} posted"
    what = spare_died(store, spare)
    if entry is not None:
        entry.enter(store)
    return what


def _keep(cmd: Sequence[str], env: Mapping[str, str], child_env: Mapping[str, str], rank: int, spare: int | None,
          entry: PoolEntry | None) -> tuple[int | None, list[int], list]:
    """Run one worker and wait for it: ``(its return code or None when it could not start, the stop
    signals the keeper received meanwhile, the depose watcher's store client)``.  SIGTERM and SIGINT
    are forwarded to the worker while it lives; a worker this keeper started as a refill (``entry``)
    gets the ready pipe."""
    stopping: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        if proc is not None:
            proc.send_signal(signum)  # a no-op once the child is reaped (no pid reuse)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    read_fd = write_fd = -1
    launch_env = dict(child_env)
    if entry is not None:
        read_fd, write_fd = os.pipe()
        launch_env[READY_FD_ENV] = str(write_fd)
    try:
        proc = subprocess.Popen(list(cmd), env=launch_env, pass_fds=(write_fd,) if write_fd >= 0 else ())
    except OSError as exc:
        _say(f"cannot run {cmd[0]!r}: {exc.strerror}")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        return None, stopping, []
    if write_fd >= 0:
        os.close(write_fd)  # the spare holds the write end: its exit is the reader's end of file
        assert entry is not None
        threading.Thread(target=_watch_ready, args=(env, read_fd, entry), name="accelpact-keeper-ready",
                         daemon=True).start()
    if stopping:  # asked to stop before the child existed
        proc.send_signal(stopping[0])
    done = threading.Event()
    connected: list = []
    threading.Thread(target=_watch_depose, args=(env, rank, proc, done, connected), kwargs={"spare": spare},
                     name="accelpact-keeper-depose", daemon=True).start()
    if entry is not None:
        threading.Thread(target=_watch_end, args=(env, proc, entry, done), name="accelpact-keeper-end",
                         daemon=True).start()
    rc = proc.wait()
    done.set()
    # The child is gone: a stop request from now on ends the keeper as it would a plain worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return rc, stopping, connected


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        _say(str(exc))
        return EXIT_USAGE


#: printed once per node (``LOCAL_RANK`` 0) when a user runs this module's path directly (issue 44)
DEPRECATION = ("accelpact: `-m {module}` is deprecated and goes away in the next release: launch with "
               "`accelpact launch [torchrun options] --spares N -- script.py ...` (README, \"Hot swap\")")


def deprecated(module: str, env: Mapping[str, str] | None = None) -> None:
    """Say once per node that ``module``, a keeper path users were told, is deprecated (issue 44)."""
    env = os.environ if env is None else env
    if env.get("LOCAL_RANK", "0") in ("", "0"):
        print(DEPRECATION.format(module=module), file=sys.stderr, flush=True)


if __name__ == "__main__":
    deprecated("accelpact.impl.launch.keeper")
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: the warm-up thread may still be importing torch, and finalizing under
    # a daemon thread inside a C extension's import can hang
    os._exit(code)
