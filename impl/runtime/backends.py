"""Collective backends: the one table (spec/implementation.md, "Where things go"), and every device
decision of the engine.

Every decision that differs between gloo and NCCL is a field or a method of :class:`Backend`: the
contract's platform name, the device tensors live on, how many devices a world needs, whether this
machine can run it, the process environment its error handling needs, how a group of it is built,
registered with c10d, aborted and waited on.  The engine calls these generically: the gloo path runs
the same code as the NCCL path, and the NCCL-specific lines are the few branches on ``revoke`` /
``device_type`` below (listed, with the torch 2.13 sources they were read against, in spec/nccl.md).
Adding a backend is one entry in :data:`BACKENDS`.  Importing this module does not import torch.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import counting
from .sockets import record_group, record_sockets

__all__ = ["BACKENDS", "BACKEND_NAMES", "BLOCKING_WAIT_VARS", "CONNECT_FLOOR_S", "NCCL2_ENV", "NCCL_ENV", "ONE_GPU_ENV", "Backend",
           "backend", "backend_error", "backend_of", "blocking_wait_problem", "detector_defaults", "for_device",
           "nccl_version_problem", "prebuilt_env_problem", "one_gpu_env", "one_gpu_mode", "process_groups", "recorded_errors",
           "wait_bounded"]

#: Groups aborted through :meth:`Backend.abort` (weakly held: a freed group leaves the set), so
#: that the revoke watcher and phase 4 may both abort R's old communicator and it is aborted once.
_ABORTED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_ABORTED_LOCK = threading.Lock()

#: Polling of :func:`wait_bounded` once a work's future has completed but the work has not (an NCCL
#: work's future completes when it is enqueued): first pause, doubled up to the last.
_POLL_FIRST_S = 0.0002
_POLL_MAX_S = 0.01

#: The least connect timeout a group build gives each of its backend's connect attempts (s,
#: :attr:`Backend.connect_attempts`): a live member that reaches the rendezvous late (a loaded
#: machine) is still waited for this long, so a build's bound is ``max(budget, attempts x floor)``.
CONNECT_FLOOR_S = 2.0


@dataclass(frozen=True, slots=True)
class Backend:
    """One collective backend.  ``platform``: the observation key's platform (spec/contract.md);
    ``device_type``: where its collectives' tensors live; ``revoke``: how a group of it is revoked
    (``sockets``: its connected sockets shut down, :mod:`accelpact.impl.runtime.revoke`; ``abort``: its
    communicator aborted, :meth:`abort`)."""

    name: str
    platform: str
    device_type: str
    revoke: str
    #: Whether ``work.wait(timeout)`` that times out leaves the op pending and its group untouched,
    #: so a wait can be sliced into blocking waits with a check between slices (gloo: it raises
    #: "timed out" and the op completes later with the right result, spec/torch-facts.md;
    #: NCCL: a timed-out wait aborts the communicator).  :func:`wait_bounded` uses it.
    sliced_wait: bool = False
    #: The failure detector's default heartbeat silence before a peer is DEAD on this backend (s;
    #: :func:`detector_defaults`).  Gloo: 0.8 (spec/detection.md, TTD <= 1.0 s).  NCCL: 5.0, because
    #: ``Work.is_completed`` is bound without releasing the GIL and ``WorkNCCL::isCompleted`` queries a CUDA
    #: event (``cudaEventQuery``), which torch's own comment says can hang while another thread holds the CUDA
    #: context lock: for that long no Python thread of the rank runs, its detector thread included, and its
    #: peers would read the silence as death (spec/nccl.md rows 16, 19).
    detector_dead_after_s: float = 0.8
    #: The floor of the derived hang threshold (s): ``max(floor, HANG_K x median step time)``; the same on
    #: every backend for now (a GIL stall stops the heartbeat too, so it is DEAD's bound that must cover it).
    detector_hang_floor_s: float = 5.0
    #: How many times its connect timeout a group build can wait on a member that died after publishing
    #: its address (gloo: the pair connect is retried, and a side waiting to be dialled raises "Connect
    #: timeout" after 5 x its timeout, spec/torch-facts.md, while the constructor holds the GIL, so no
    #: watchdog thread can step in; see bench/README.md, K4).
    #: :meth:`build_group` divides its budget by it.
    connect_attempts: int = 1

    # ---- torch-free ------------------------------------------------------------------------------
    @property
    def backend_config(self) -> str:
        """The c10d backend config string of a group of this backend (``cpu:gloo``, ``cuda:nccl``):
        what ``new_group(backend=name)`` registers in ``_world.pg_backend_config``."""
        return f"{self.device_type}:{self.name}"

    def unavailable(self, world: int) -> str | None:
        """Why a ``world``-rank job on this backend cannot run on this machine (None: it can)."""
        if self.device_type == "cpu":
            return None
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if one_gpu_mode():  # every rank on device 0 (ONE_GPU_ENV)
            if have < 1:
                return f"backend {self.name} ({ONE_GPU_ENV}=1) needs a CUDA device; this machine has none"
        elif have < world:
            return f"backend {self.name} needs one CUDA device per rank ({world}); this machine has {have}"
        return self.error_query_problem()

    def error_query_problem(self) -> str | None:
        """Why this torch build cannot tell the engine that a group of this backend failed silently (None:
        it can, or the backend never fails silently).  NCCL in ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` aborts a
        failed group from its watchdog and raises nothing; the boundary reads ``get_error()`` of every
        training group (:func:`recorded_errors`) before it lets a step stand.  That binding is
        ``ProcessGroupNCCL``'s own (``.def("get_error", &::c10d::ProcessGroupNCCL::getError, ...)`` in
        torch/csrc/distributed/c10d/init.cpp, under ``#ifdef USE_C10D_NCCL``; pytorch/pytorch#144498, torch
        2.7): the base ``Backend`` binding has none, whatever ``_distributed_c10d.pyi`` declares (spec/nccl.md
        row 17).  A torch without it would let a corrupted step stand: :meth:`unavailable` refuses the job."""
        if self.revoke != "abort":
            return None
        import torch
        import torch.distributed as dist

        if why := nccl_version_problem(torch.__version__, os.environ, nccl2_class=hasattr(dist, "ProcessGroupNCCL2")):
            return why
        cls = getattr(dist, "ProcessGroupNCCL", None)
        if cls is None:
            return f"backend {self.name}: torch {torch.__version__} was built without NCCL (no ProcessGroupNCCL)"
        if not callable(getattr(cls, "get_error", None)):
            return (f"backend {self.name}: torch {torch.__version__}'s ProcessGroupNCCL has no get_error() (added in torch "
                    "2.7, pytorch/pytorch#144498); with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 NCCL's watchdog aborts a "
                    "failed group without raising, and without get_error() accelpact cannot tell that a step ran on "
                    "an aborted communicator: install torch>=2.7 (spec/nccl.md row 17)")
        return None

    # ---- the process -----------------------------------------------------------------------------
    def prepare_process(self, local_rank: int):
        """Before any process group of this process is built: the environment the backend's
        error handling needs and this rank's device.  Returns the ``torch.device`` the job's model,
        batches and collectives use.  Gloo: the CPU.  NCCL: ``cuda:{local_rank}`` made current, and
        the variables of :data:`NCCL_ENV` set (each overriding an inherited value, torchrun's
        ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` included: see :data:`NCCL_ENV`).  A blocking wait
        (:data:`BLOCKING_WAIT_VARS` set to anything but 0) is refused, not overridden: a RuntimeError
        naming the variable (:func:`blocking_wait_problem`)."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        if why := blocking_wait_problem(os.environ):
            raise RuntimeError(why)
        for k, v in NCCL_ENV.items():
            # torchrun's local agent passes TORCH_NCCL_ASYNC_ERROR_HANDLING=1 to its workers unless the
            # agent's own environment sets it (elastic/agent/server/local_elastic_agent.py,
            # LocalElasticAgent._start_workers: os.getenv(..., str(1))); ProcessGroupNCCL reads these
            # variables in its constructor (getCvarInt/getCvarBool), so setting them here, before
            # init_process_group, decides the mode of every NCCL group this process builds.
            os.environ[k] = v
        one_gpu = one_gpu_env(local_rank)  # empty unless ONE_GPU_ENV=1: then every rank on device 0
        os.environ.update(one_gpu)
        device = torch.device(self.device_type, 0 if one_gpu else local_rank)
        torch.cuda.set_device(device)
        return device

    def init_kwargs(self, device) -> dict:
        """Extra keyword arguments of ``init_process_group``/``new_group`` on this backend: NCCL binds
        the device (``device_id``: eager connect, so a missing member shows up when the group is
        built, and ``new_group`` splits from the bound default group)."""
        return {} if self.device_type == "cpu" else {"device_id": device}

    @property
    def device(self):
        """This process's device for the backend's collectives: the CPU, or the current CUDA device
        (:meth:`prepare_process` made ``cuda:{local_rank}`` current)."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, torch.cuda.current_device())

    def device_for(self, pg):
        """The device a tensor for a collective on ``pg`` must be on: the group's bound device
        (``bound_device_id``: set by ``device_id=`` and by :meth:`build_group`), else :attr:`device`."""
        bound = getattr(pg, "bound_device_id", None)
        return bound if bound is not None else self.device

    def place(self, t, pg=None):
        """``t`` on the device of a collective on ``pg`` (:meth:`device_for`; without a group,
        :attr:`device`); no copy when it is there already."""
        return t.to(self.device_for(pg) if pg is not None else self.device)

    # ---- groups ------------------------------------------------------------------------------------
    def timeout_of(self, pg) -> float | None:
        """The collective timeout of ``pg`` in seconds (its backend's ``options._timeout``: the
        training timeout it was built with); None when the group does not say (a test double)."""
        import torch

        try:
            raw = pg._get_backend(torch.device(self.device_type))
        except (AttributeError, RuntimeError, TypeError):
            raw = pg  # a bare backend (ProcessGroupGloo/ProcessGroupNCCL), or not a group at all
        td = getattr(getattr(raw, "options", None), "_timeout", None)
        return td.total_seconds() if isinstance(td, datetime.timedelta) else None

    def set_timeout(self, pg, timeout_s: float) -> None:
        """Make ``timeout_s`` the collective timeout of ``pg``'s later works: its backend's ``set_timeout``
        (``Backend::setTimeout``; ``ProcessGroupNCCL::setTimeout`` sets ``options_->timeout``, which each new
        work takes, spec/nccl.md row 11).  For groups accelpact did not build (a user's ``DeviceMesh``),
        whose timeout is the mesh's (10 min for NCCL by default), not ``collective_timeout_s``."""
        import torch

        try:
            raw = pg._get_backend(torch.device(self.device_type))
        except (AttributeError, RuntimeError, TypeError):
            raw = pg  # a bare backend
        raw.set_timeout(datetime.timedelta(seconds=timeout_s))

    def build_group(self, store, group_rank: int, size: int, *, name: str, global_ranks: Sequence[int], device=None,
                    connect_timeout_s: float, timeout_s: float):
        """A c10d ``ProcessGroup`` of this backend built by the members only (as ``new_group`` builds
        one, but without a collective over the default group): ``(group, revoke record)``.

        ``store``: a store namespaced for this group (its generation's prefix fences it from every
        older one).  ``connect_timeout_s`` bounds building it (gloo's full-mesh connect, whose retries
        get ``max(connect_timeout_s / connect_attempts, CONNECT_FLOOR_S)`` each; NCCL's store
        exchange); ``timeout_s`` is its collective timeout from then on (the training timeout).
        ``device``: NCCL's bound device (default :attr:`device`): the group is bound to it and its
        communicator connected eagerly (``eager_connect_single_device``), so a missing member makes
        the build fail, not the group's first collective.  The group is named ``name`` but not
        registered with c10d (:meth:`register`; a rebind moves the old group's name to it).
        The revoke record: the group's connected sockets (gloo, recorded while it is built, so no
        other thread may create sockets meanwhile) or a weak reference for its abort (NCCL)."""
        import torch
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import GroupName

        connect = datetime.timedelta(seconds=max(connect_timeout_s / self.connect_attempts, min(CONNECT_FLOOR_S, connect_timeout_s)))
        bt = getattr(dist.ProcessGroup.BackendType, self.name.upper())
        raw: Any  # ProcessGroupGloo | ProcessGroupNCCL
        if self.device_type == "cpu":
            dev = torch.device("cpu")
            raw, rec = record_sockets(lambda: dist.ProcessGroupGloo(store, group_rank, size, connect), self.name, aborts=False)
        else:
            dev = device if device is not None else self.device
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = connect
            opts.global_ranks_in_group = list(global_ranks)
            opts.group_name = GroupName(name)
            raw = dist.ProcessGroupNCCL(store, group_rank, size, opts)
        pg = dist.ProcessGroup(store, group_rank, size)
        if self.device_type != "cpu":
            pg.bound_device_id = dev  # before _register_backend: it hands the bound device to the backend
        pg._set_default_backend(bt)
        pg._register_backend(torch.device(self.device_type), bt, raw)
        pg._set_group_name(GroupName(name))
        pg._set_group_desc(name)
        if self.revoke == "abort":
            raw.eager_connect_single_device(dev)  # ncclCommInitRank now, bounded by the store exchange
            rec = record_group(pg, self.name)
        else:  # the bare backend's Python object dies with this call: a revoke reaches it through pg
            rec.bind(pg)
        raw.set_timeout(datetime.timedelta(seconds=timeout_s))  # later ops: the training timeout
        counting.count_group(pg, self.name)  # bench scale (ACCELPACT_COUNT only)
        return pg, rec

    def register(self, pg, name: str, global_ranks: Sequence[int], store=None):
        """Register ``pg`` with c10d under ``name`` as a group of this backend (``pg_map`` backend
        ``name``, config :attr:`backend_config`, the global-to-group rank mapping), so that
        ``get_process_group_ranks``, ``_resolve_process_group`` (functional collectives, DTensor,
        DeviceMesh) find it.  Raises ValueError if another group holds the name."""
        import torch.distributed.distributed_c10d as c10d
        from torch.distributed.distributed_c10d import GroupName

        w = c10d._world
        try:  # c10d's own name registry: O(1), where a scan of ``pg_names`` grows with every group of the job
            holder = c10d._resolve_process_group(GroupName(name))
        except RuntimeError:  # not registered
            holder = None
        if holder is not None and holder is not pg:
            raise ValueError(f"process-group name {name!r} is already registered; use a per-generation name (e.g. '{name}@g2')")
        mapping = {g: i for i, g in enumerate(global_ranks)}
        helper = getattr(c10d, "_register_pg_in_world", None)
        if helper is not None:
            helper(pg, self.name, store, GroupName(name), self.backend_config, rank_mapping=mapping)
        else:  # older torch: the same bookkeeping by hand
            w.pg_map[pg] = (self.name, store)
            w.pg_names[pg] = GroupName(name)
            w.pg_group_ranks[pg] = mapping
            w.pg_backend_config[pg] = self.backend_config
            c10d._register_process_group(GroupName(name), pg)
        return pg

    def abort(self, pg) -> bool:
        """Abort ``pg``'s communicator, this group only and once (a second call does nothing), and
        keep its c10d registration (name, ranks): a rebind moves the name to the new group, and
        until then name-based lookups still resolve.  ``ProcessGroup.abort()`` aborts the group's
        backends; NCCL's waits for ``ncclCommAbort`` up to the group's timeout (DistBackendError
        beyond).  Never ``_abort_process_group``: it unregisters the group and drops its name,
        and on the default group aborts every group and clears every registry.  Returns whether an
        abort was issued: False for a ``sockets`` backend (gloo's abort leaves the group usable;
        its revoke is its sockets) and for an already aborted group."""
        if self.revoke != "abort" or pg is None:
            return False
        with _ABORTED_LOCK:
            if pg in _ABORTED:
                return False
            _ABORTED.add(pg)
        pg.abort()
        return True

    def abort_all(self, pgs: Sequence[Any]) -> int:
        """Abort several groups' communicators together, each once (:meth:`abort`'s rules): on NCCL
        inside one ``ncclGroupStart``/``ncclGroupEnd`` bracket, as torch's ``_abort_process_group``
        does for the world, because serial ``ncclCommAbort`` calls of one process can deadlock each
        other (pytorch#119797, pytorch#173815, NVIDIA/nccl#1013).  Returns how many were aborted."""
        if self.revoke != "abort":
            return 0
        with _ABORTED_LOCK:
            todo = [pg for pg in {id(pg): pg for pg in pgs if pg is not None}.values() if pg not in _ABORTED]
            _ABORTED.update(todo)
        if not todo:
            return 0
        bracket = _group_bracket(todo[0], self.device_type) if len(todo) > 1 else None
        if bracket is not None:
            bracket._group_start()
        try:
            for pg in todo:
                pg.abort()
        finally:
            if bracket is not None:
                bracket._group_end()
        return len(todo)

    def drain(self, device, timeout_s: float) -> bool:
        """Whether the work queued on ``device``'s current stream finished within ``timeout_s``: an
        event recorded on that stream, polled until the deadline (no ``torch.cuda.synchronize()``:
        a device-wide sync blocks, unbounded, behind a hung collective kernel of another stream).
        The CPU: True at once."""
        if self.device_type == "cpu" or getattr(device, "type", "cpu") == "cpu":
            return True
        import torch

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(device))
        deadline = time.monotonic() + timeout_s
        pause = _POLL_FIRST_S
        while not ev.query():
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
        return True


#: NCCL error handling the protocol needs, set by :meth:`Backend.prepare_process` before any NCCL group
#: is built.  Read against torch 2.13's ProcessGroupNCCL.hpp (the variable names) and ProcessGroupNCCL.cpp
#: (what they do; spec/nccl.md lists the functions):
#:
#: * ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (CleanUpOnly): on a failed or timed-out work the NCCL
#:   watchdog aborts the group's communicators and does not rethrow, so the process lives and the
#:   error reaches Python as ``DistBackendError`` from ``work.wait(timeout)`` (:func:`wait_bounded`).
#:   The default, 3 (SkipCleanUp), and 1 (TearDown, what torchrun's agent passes its workers unless set
#:   in the agent's own environment) rethrow in the watchdog thread and end the process before the
#:   engine can observe anything.
#: * ``TORCH_NCCL_DUMP_ON_TIMEOUT=0``: with the default (on), the monitor thread of each rank's first
#:   group polls the ``exception_dump`` key that any rank's watchdog writes on a failure
#:   (``broadcastDumpSignal``, into the *underlying* store: it escapes every PrefixStore, so it also
#:   reaches later attempts and generations) and then, after its heartbeat timeout, kills its own healthy
#:   process.  Off: the key is still written, and nobody reads it.
#: * ``TORCH_NCCL_ENABLE_MONITORING=0`` (the name is the same in 2.13): the heartbeat monitor does not
#:   kill the process (``terminateProcess``) when a watchdog thread made no progress for
#:   ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``; the engine's own watchdog and step deadline bound a hang.
#: * ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=0``: after detecting a failure the NCCL watchdog sleeps four
#:   times this value (default 15 s: a minute) before it aborts the communicators, whatever the dump
#:   setting, and a dropped group's destructor joins that watchdog: without this, retiring R's failed
#:   communicator could block the rank for a minute.
NCCL_ENV: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0",
}

#: The names ``ProcessGroupNCCL`` reads for its blocking wait (installed torch 2.13
#: ProcessGroupNCCL.hpp: ``TORCH_NCCL_BLOCKING_WAIT = {"TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"}``,
#: read in the constructor into ``blockingWait_``).  With it on, the constructor starts no watchdog
#: thread for errors to be recorded by, so ``get_error()`` stays SUCCESS after a failed collective and
#: the engine's checks (:func:`recorded_errors`) are blind (spec/nccl.md, "BLOCKING_WAIT").  Refused by
#: name (:func:`blocking_wait_problem`), not pinned: a value the user chose is never changed silently.
BLOCKING_WAIT_VARS: tuple[str, ...] = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")

#: torch's switch between ProcessGroupNCCL (legacy) and ProcessGroupNCCL2 for ``backend="nccl"``
#: (pytorch/pytorch#191272: ``1`` selects nccl2; #192281, torch 2.15: unset selects nccl2 too, ``0`` and
#: the backend name ``nccl-legacy`` select the legacy class).  spec/nccl.md, "Versions".
NCCL2_ENV = "TORCH_DIST_USE_NCCL2"

def blocking_wait_problem(env) -> str | None:
    """Why NCCL groups built in ``env`` would run with a blocking wait the engine cannot check (None:
    they would not).  ``TORCH_NCCL_BLOCKING_WAIT`` / ``NCCL_BLOCKING_WAIT`` set to anything but ``0`` (or
    empty): ``ProcessGroupNCCL`` then waits in ``wait()`` up to the work's timeout and runs no watchdog
    that records errors, so ``get_error()`` says SUCCESS after a failure and every commit check of the
    engine passes a corrupted step (a cluster's env file often sets it)."""
    bad = [f"{k}={env.get(k)}" for k in BLOCKING_WAIT_VARS if env.get(k) not in (None, "", "0")]
    if not bad:
        return None
    return (f"{', '.join(bad)} is set: with NCCL's blocking wait no watchdog records a failed collective, so "
            f"get_error() always says SUCCESS and accelpact cannot tell a step that ran on a failed NCCL communicator "
            f"from a good one. Unset {' and '.join(BLOCKING_WAIT_VARS)} (or set them to 0) in the job's environment "
            f"(e.g. on the torchrun command line or in the cluster's env file); accelpact bounds every wait itself "
            f"(spec/nccl.md, \"BLOCKING_WAIT\")")


def _minor(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.15.0+cu130", "2.16.0.dev20270101")."""
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def nccl_version_problem(version: str, env, *, nccl2_class: bool = False) -> str | None:
    """Why ``backend="nccl"`` on torch ``version`` in ``env`` is a combination accelpact has not checked
    (None: it is one it has).  The rows of spec/nccl.md were read against the legacy ``ProcessGroupNCCL``
    of torch 2.13: its mode-2 watchdog that aborts without ending the process, its
    ``get_error()``, ``abort()``, ``eager_connect_single_device``.  ``ProcessGroupNCCL2`` (torch 2.15's
    ``backend="nccl"`` unless :data:`NCCL2_ENV` is ``0``; ``1`` selects it on a 2.14 that has the switch)
    is a different implementation (pytorch/pytorch#188587): its watchdog aborted the process on a timeout
    when it landed (#191948), and none of those rows was read or run against it.  So nccl2 is refused;
    the legacy class is what accelpact runs (spec/nccl.md, "Versions").  ``nccl2_class``: this torch
    has ``torch.distributed.ProcessGroupNCCL2``."""
    use = env.get(NCCL2_ENV)
    major_minor = _minor(version)
    nccl2 = use == "1" or (use != "0" and major_minor >= (2, 15))
    if not nccl2:
        return None
    why = ("is set to 1" if use == "1" else "is unset, which on torch >= 2.15 means nccl2" if use is None
           else f"is {use!r}, not 0, which on torch >= 2.15 means nccl2")
    return (f"torch {version}: backend \"nccl\" would run ProcessGroupNCCL2 ({NCCL2_ENV} {why}"
            f"{'; this torch has ProcessGroupNCCL2' if nccl2_class else ''}), which accelpact has not been checked "
            f"against (its watchdog, get_error() and abort are not the legacy ProcessGroupNCCL's that spec/nccl.md "
            f"describes). Set {NCCL2_ENV}=0 in the job's environment (before init_process_group; torchrun passes it "
            f"on) so that \"nccl\" means the legacy ProcessGroupNCCL, or use torch 2.13")


#: Opt-in one-GPU mode (spec/nccl.md, "Running on one lent GPU"): with this variable ``1``,
#: :meth:`Backend.prepare_process` puts every NCCL rank of the machine on ``cuda:0`` and sets
#: :func:`one_gpu_env` (a distinct ``NCCL_HOSTID`` per rank, so that NCCL's duplicate-GPU check in
#: ``init.cc``, which compares host hashes and bus ids, sees one rank per "node"; every channel over
#: NET/Socket on loopback), and :meth:`Backend.unavailable` asks for one device, not one per rank.
#: Unset (or any other value): nothing here changes anything.  For testing on one GPU only.
ONE_GPU_ENV = "ACCELPACT_NCCL_ONE_GPU"


def one_gpu_mode(environ=None) -> bool:
    """Whether :data:`ONE_GPU_ENV` is ``1`` in ``environ`` (default ``os.environ``)."""
    return (os.environ if environ is None else environ).get(ONE_GPU_ENV) == "1"


def one_gpu_env(local_rank: int, environ=None) -> dict[str, str]:
    """The NCCL variables of rank ``local_rank`` in one-GPU mode (:data:`ONE_GPU_ENV`), set by
    :meth:`Backend.prepare_process` before the process's first NCCL group; ``{}`` outside it.
    ``LOCAL_RANK`` is distinct for every process of the machine (spares' are past the training
    ranks'), so is the host id derived from it."""
    if not one_gpu_mode(environ):
        return {}
    return {"NCCL_HOSTID": f"accelpact-one-gpu-rank{local_rank}", "NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1"}


#: Where a communicator's failure comes from, as its message names it (gloo's transport, c10d's
#: process groups, NCCL); a plain RuntimeError carries only that (gloo raises no DistError subclass:
#: "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer" on torch 2.13).
_COMM_MARKS = ("gloo", "c10d", "nccl", "processgroup", "connection closed by peer", "connection reset by peer")


class AbortedCommunicator(RuntimeError):
    """A step's collectives ran on a communicator that was aborted (a revoke, NCCL's watchdog) or whose
    backend recorded an error: an aborted NCCL communicator's works report completion without their
    error (spec/nccl.md rows 7, 17, 18), so the step's gradients are not trusted.  Raised before
    ``optimizer.step()`` commits (``Pact._before_commit``); a communicator's failure of the step."""


def is_comm_failure(exc: BaseException) -> bool:
    """``exc`` (or an exception it was raised from) is a communicator's failure: a
    ``torch.distributed.DistError`` (NCCL's ``DistBackendError``, a store error) or a RuntimeError
    whose message names the communication stack.  An application's own exception in forward or
    backward is not: rerunning the step would raise it again (P17 discards only communicator
    failures; anything else stays the contract's L2)."""
    import torch.distributed as dist

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (dist.DistError, AbortedCommunicator)):
            return True
        if isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _COMM_MARKS):
            return True
        e = e.__cause__ or e.__context__
    return False


def backend_error(pg) -> str | None:
    """The error a group's accelerator backend has recorded (``Backend::getError``: ``ProcessGroupNCCL``
    keeps ``error_`` (ErrorType TIMEOUT / COMM_ERROR / REMOTE_ERROR) when its watchdog saw a failed or
    timed-out work): its name, or None for SUCCESS or a CPU group.  In
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` the watchdog aborts the communicators of such a group and
    raises nothing in Python: this is how a caller can still see it.

    Where the binding is (spec/nccl.md row 17): ``pg._get_backend(cuda)`` returns the most derived bound
    class (pybind11 downcasts a polymorphic ``Backend``), a ``ProcessGroupNCCL``, whose own ``get_error``
    is bound since torch 2.7; under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` it is a ``_ProcessGroupWrapper``,
    whose ``get_error`` asks the wrapped backend (and its ``wrapped_pg`` is tried too).  The base
    ``Backend`` class has no ``get_error`` at runtime (the .pyi declares one).  On a build with no
    binding anywhere nothing can be read and this returns None: :meth:`Backend.unavailable` refuses an
    NCCL job on such a build (:meth:`Backend.error_query_problem`)."""
    import torch

    be = backend_of(pg)
    if be.device_type == "cpu":
        return None
    try:
        raw = pg._get_backend(torch.device(be.device_type))
    except (AttributeError, RuntimeError, TypeError):
        raw = pg  # a bare backend (ProcessGroupNCCL), or a test double
    return _read_error(raw)[1]


def _read_error(raw: Any) -> tuple[bool, str | None]:
    """Whether ``raw`` (or the backend it wraps, ``wrapped_pg``) answers ``get_error()``, and the error
    it recorded (None for ``SUCCESS``)."""
    for obj in (raw, getattr(raw, "wrapped_pg", None)):
        get = getattr(obj, "get_error", None)
        if get is None:
            continue
        try:
            err = get()
        except RuntimeError:  # Backend::getError's default: "Backend ... does not support getError"
            continue
        name = str(getattr(err, "name", err)).rsplit(".", 1)[-1]
        return True, (None if name == "SUCCESS" else name)
    return False, None


def process_groups() -> list[tuple[str, Any, str]]:
    """``(name, group, backend config)`` of every process group registered with c10d in this process,
    the default group first: ``torch.distributed``'s ``_world.pg_map`` (installed torch 2.13
    distributed_c10d.py: ``_World.pg_map``, "Mapping from ProcessGroup to backend name and store"),
    which ``init_process_group``, ``new_group``, ``DeviceMesh``, ``split_group`` and
    :meth:`Backend.register` all fill: the default group (FSDP1's ``optim_state_dict`` gathers on it), the
    user's groups (tensor parallel, metrics) and accelpact's own.  The config is ``_world.pg_backend_config``'s
    (``cuda:nccl``, ``cpu:gloo,cuda:nccl``), else the backend name of ``pg_map``.  The default group is
    named ``default (<its c10d name>)``.  Empty before ``init_process_group``."""
    import torch.distributed.distributed_c10d as c10d

    w = c10d._world
    default = w.default_pg
    out = []
    for pg in list(w.pg_map):
        name = str(w.pg_names.get(pg, f"unnamed@{id(pg):x}"))
        config = w.pg_backend_config.get(pg) or (w.pg_map.get(pg) or ("",))[0]
        out.append((f"default ({name})" if pg is default else name, pg, str(config)))
    out.sort(key=lambda t: t[1] is not default)
    return out


#: Backends whose failures reach the caller without a check of accelpact's: gloo raises a failed
#: collective's error from ``wait()`` in the thread that waits (spec/torch-facts.md).  Every other
#: backend of a registered group must be readable (:func:`_group_error`) or the check refuses it.
_RAISING_BACKENDS = ("gloo",)


def _config_backends(config: str) -> list[tuple[str, str]]:
    """``[(device type, backend name)]`` of a c10d backend config (``cpu:gloo,cuda:nccl`` ->
    ``[("cpu", "gloo"), ("cuda", "nccl")]``; a bare ``nccl`` -> ``[("cuda", "nccl")]``, a bare other name
    -> ``[("cpu", name)]``)."""
    out = []
    for part in str(config).lower().split(","):
        part = part.strip()
        if not part:
            continue
        dev, _, name = part.rpartition(":")
        name = name.strip()
        out.append((dev.strip() or ("cuda" if name == "nccl" else "cpu"), name))
    return out


def _group_error(pg: Any, config: str) -> str | None:
    """What a registered group's backends recorded: None (nothing, or only backends that raise their
    own failures), the ``ErrorType`` name of an NCCL backend's ``get_error()`` (``TIMEOUT``,
    ``COMM_ERROR``, ``REMOTE_ERROR``), or ``UNCHECKABLE: <why>`` for a backend whose silent failure
    accelpact cannot read (a backend other than gloo and NCCL, or an NCCL backend without ``get_error``)."""
    import torch

    for dev, name in _config_backends(config):
        if name in _RAISING_BACKENDS:
            continue
        if name != "nccl":
            return (f"UNCHECKABLE: its {dev} backend is {name!r}; accelpact reads the recorded errors of NCCL groups "
                    f"(get_error()) and relies on gloo raising, and cannot tell whether a {name} collective failed "
                    f"silently: build that group on nccl or gloo, or destroy it (destroy_process_group(group)) before "
                    f"training under accelpact")
        try:
            raw = pg._get_backend(torch.device(dev))
        except (AttributeError, RuntimeError, TypeError) as exc:
            return f"UNCHECKABLE: its {dev}:nccl backend cannot be read ({exc})"[:300]
        answers, got = _read_error(raw)
        if got is not None:
            return got
        if not answers:
            return (f"UNCHECKABLE: its NCCL backend ({type(raw).__name__}) has no get_error(), so a collective that "
                    f"NCCL's watchdog aborted silently (TORCH_NCCL_ASYNC_ERROR_HANDLING=2) cannot be seen: install "
                    f"torch>=2.7 (spec/nccl.md row 17)")
    return None


def _was_aborted(pg: Any) -> bool:
    """Whether this process aborted ``pg`` (:meth:`Backend.abort`, :meth:`Backend.abort_all`)."""
    with _ABORTED_LOCK:
        try:
            return pg in _ABORTED
        except TypeError:  # an unhashable stand-in (a test double): never aborted here
            return False


def recorded_errors(records: dict, skip: Sequence[str] = (), groups: Sequence[tuple[str, Any, str]] | None = None,
                    ) -> dict[str, str]:
    """Group name -> recorded error of every group of the process that has one: what the commit (the
    boundary, ``Pact._before_commit``) and each checkpoint save consult before they let a step or a save
    stand (spec/nccl.md rows 17, 25).

    * The recorded groups (revoke records: ``record.group``): :func:`backend_error`, names in ``skip`` and
      already revoked (``closed``) records left out.
    * Every other group registered with c10d (``groups``: ``(name, group, backend config)``, default
      :func:`process_groups`): the default group and the user's own, whose NCCL failure in mode 2 would
      otherwise be silent (:func:`_group_error`; ``UNCHECKABLE: ...`` for a group whose failures cannot be
      read: the engine refuses to run beside it).  Left out: a group of a record (checked above, or
      skipped on purpose), a group this process aborted (:meth:`Backend.abort`: its revoke).

    Each group once."""
    out: dict[str, str] = {}
    seen: set[int] = set()
    for name, rec in records.items():
        pg = getattr(rec, "group", None) if rec is not None else None  # SocketRecord.group: weakly held (gloo: None)
        if pg is not None:
            if id(pg) in seen:
                continue
            seen.add(id(pg))
        if name in skip or rec is None or getattr(rec, "closed", False) or pg is None:
            continue
        err = backend_error(pg)
        if err is not None:
            out[name] = err
    for name, pg, config in (process_groups() if groups is None else groups):
        if pg is None or id(pg) in seen:
            continue
        seen.add(id(pg))
        if _was_aborted(pg):
            continue
        err = _group_error(pg, config)
        if err is not None:
            out[name if name not in out else f"{name}@{id(pg):x}"] = err
    return out


def prebuilt_env_problem(be: Backend, env, *, prebuilt: bool, what: str = "your process groups") -> str | None:
    """Why NCCL groups built before accelpact set :data:`NCCL_ENV` cannot serve the engine (None: they can).

    ``ProcessGroupNCCL`` reads ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` in its constructor (into
    ``asyncErrorHandling_``, ProcessGroupNCCL.hpp) and its heartbeat monitor and watchdog, built there
    too, read the dump, monitoring and dump-wait variables: a group keeps the mode of the environment
    it was built in, and setting the variables later (:meth:`Backend.prepare_process`) changes nothing
    for it.  A group built under torchrun's ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (or the default 3)
    ends the process from its watchdog thread on the first failed collective, before the engine can
    recover.  ``prebuilt``: the user's own ``init_process_group`` or ``mesh=`` built NCCL groups
    already; ``env``: the environment they were built in (the process's ``os.environ``, as it is now).
    Gloo, or nothing prebuilt: None.  On NCCL a blocking wait in ``env`` (:func:`blocking_wait_problem`)
    is refused whether or not groups were prebuilt: every NCCL group of the process would be unchecked."""
    if be.revoke != "abort":
        return None
    if why := blocking_wait_problem(env):
        return why
    if not prebuilt:
        return None
    wrong = {k: env.get(k) for k, v in NCCL_ENV.items() if env.get(k) != v}
    if not wrong:
        return None
    have = ", ".join(f"{k}={'(unset)' if v is None else v}" for k, v in wrong.items())
    need = " ".join(f"{k}={v}" for k, v in NCCL_ENV.items())
    return (f"{what} were built on NCCL with {have}; ProcessGroupNCCL reads these variables when a group is "
            f"constructed, so those groups would run in the wrong error-handling mode (a failed collective ends "
            f"the process from NCCL's watchdog instead of reaching accelpact). Either set {need} in the "
            f"environment before init_process_group / init_device_mesh (e.g. on the torchrun command line), or "
            f"let accelpact.init build the groups (do not call init_process_group yourself and do not pass mesh=)")


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("gloo", "cpu-gloo", "cpu", "sockets", sliced_wait=True, connect_attempts=5),
    Backend("nccl", "cuda-nccl", "cuda", "abort", detector_dead_after_s=5.0),
)}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)



def _group_bracket(pg: Any, device_type: str) -> Any:
    """The backend object of ``pg`` whose ``_group_start``/``_group_end`` bracket a batch of NCCL calls
    (torch's ``ProcessGroupNCCL``), or None where the group has none."""
    import torch

    try:
        be = pg._get_backend(torch.device(device_type))
    except RuntimeError:
        return None
    return be if hasattr(be, "_group_start") and hasattr(be, "_group_end") else None


def backend(name: str) -> Backend:
    """The backend called ``name``; a ValueError listing the known ones otherwise."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {name!r}; use one of {list(BACKEND_NAMES)}") from None


def detector_defaults(backend_name: str) -> tuple[float, float]:
    """``(dead_after_s, hang_floor_s)``: the failure detector's defaults on ``backend_name``
    (:attr:`Backend.detector_dead_after_s`, :attr:`Backend.detector_hang_floor_s`).  The hang threshold
    itself stays derived (``max(hang_floor_s, HANG_K x median step time)``, impl/detector.py); an explicit
    ``dead_after_s=`` / ``hang_threshold_s=`` or ``$ACCELPACT_DEAD_AFTER_S`` / ``$ACCELPACT_HANG_THRESHOLD_S``
    still wins.  A ValueError for an unknown backend."""
    be = backend(backend_name)
    return be.detector_dead_after_s, be.detector_hang_floor_s


def backend_of(pg) -> Backend:
    """The backend ``pg`` runs: its default backend's name (``ProcessGroup.name()``, else
    ``dist.get_backend``); gloo for an object that says nothing (a test double)."""
    name = ""
    try:
        name = str(pg.name()).lower()
    except Exception:  # noqa: BLE001 - name() is missing on some wrapped groups and on test doubles: ask c10d
        try:
            import torch.distributed as dist

            name = str(dist.get_backend(pg)).lower()
        except Exception:  # noqa: BLE001 - not a c10d group at all: gloo, the CPU backend
            name = ""
    for b in BACKENDS.values():
        if b.name in name and b.device_type != "cpu":
            return b  # a group with an accelerator backend (e.g. "cpu:gloo,cuda:nccl") runs it for its collectives
    return BACKENDS.get(name, BACKENDS["gloo"])


def for_device(device) -> Backend:
    """The backend whose collectives use ``device``'s type (the CPU: gloo)."""
    t = getattr(device, "type", str(device))
    for b in BACKENDS.values():
        if b.device_type == t:
            return b
    return BACKENDS["gloo"]


def wait_bounded(work, timeout_s: float, *, check: Callable[[], None] | None = None, check_every_s: float = 0.05,
                 sliced: bool = False) -> None:
    """Wait for a collective's ``work`` at most ``timeout_s`` seconds, on any backend; raise its error.

    ``sliced`` (only for a backend whose timed-out wait leaves the op pending, :attr:`Backend.sliced_wait`:
    gloo): block in ``work.wait(check_every_s)`` slices, ``check()`` between them; the fast path is one
    blocking wait in C++ that returns when the op does (cheaper than waiting through the future's
    callback and an event, which wakes a Python thread).

    Completion is polled with ``work.is_completed()``: an NCCL work's future completes when the work
    is enqueued, not when its kernel finishes, so waiting on the future returns at once (gloo's
    completes with the op: it wakes the wait without polling).  ``check()`` runs every
    ``check_every_s`` while the work is pending (first after one interval) and may raise to abandon
    the wait.  Then
    ``work.wait(timeout)``: it raises the op's error (NCCL: ``DistBackendError``, after aborting the
    communicator, also when the timeout passed, counted from the work's start; gloo: the op's
    ``RuntimeError``, or "Operation timed out!" without touching the group) and on NCCL makes the
    current stream wait for the kernel, so the result can be read."""
    if sliced:
        try:
            _wait_sliced(work, timeout_s, check, check_every_s)
        finally:
            del work
        return
    done = threading.Event()
    try:
        work.get_future().add_done_callback(lambda _f: done.set())
    except (AttributeError, RuntimeError):
        done.set()  # no future to wake on: poll
    start = time.monotonic()
    deadline = start + timeout_s
    next_check = start + check_every_s  # the first check after one interval: a healthy step's op makes no store round trip
    pause = _POLL_FIRST_S
    try:
        while not work.is_completed():
            now = time.monotonic()
            if check is not None and now >= next_check:
                check()
                next_check = now + check_every_s
            if now >= deadline:
                break  # the wait below times out (and raises)
            if done.is_set():  # the future completed before the work (NCCL: at enqueue): poll
                time.sleep(min(pause, max(deadline - now, 0.0)))
                pause = min(pause * 2, _POLL_MAX_S)
            else:
                done.wait(min(check_every_s, max(deadline - now, 0.0)))
        work.wait(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
    finally:
        del work  # a raised error's traceback keeps this frame: it must not keep the op (and its group) alive


def _wait_sliced(work, timeout_s: float, check: Callable[[], None] | None, slice_s: float) -> None:
    """:func:`wait_bounded`'s sliced form: blocking waits of ``slice_s`` (the last one up to the
    deadline), ``check()`` between them.  A wait that raised while the op is still pending was the
    slice's own timeout (the op goes on); once the op has completed, an unbounded ``work.wait()``
    returns its result or raises its error.
    Past ``timeout_s`` the last slice's timeout error is raised."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                work.wait(datetime.timedelta(seconds=max(min(slice_s, left), 0.001)))
                return
            except RuntimeError:
                if work.is_completed():  # it failed, or completed just after the slice ran out
                    work.wait()  # its own result: returns, or raises the op's error
                    return
                if time.monotonic() >= deadline:
                    raise  # past the bound: the timeout
            if check is not None:
                check()
    finally:
        del work  # as in wait_bounded: a raised error's traceback must not keep the op (and its group) alive
