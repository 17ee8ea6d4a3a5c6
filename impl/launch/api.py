"""The public API: adopt AccelPact in your own training script (``accelpact.init``).

Under torchrun (or anything that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT``)::

    import accelpact
    job = accelpact.init(backend="gloo", replicas=2)     # store, groups, control plane, trace folder
    model = FSDP(model, process_group=(job.shard_group, job.replicate_group),
                 sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_id=job.device)
    # or FSDP2:  fully_shard(block, mesh=job.mesh) ... ; or DDP(model, process_group=job.world_group)
    optim = torch.optim.AdamW(model.parameters())
    run = job.attach(model, optim, checkpoint_dir="ckpt", checkpoint_every=50)  # resumes from the last commit
    for step in run.steps(total):                       # from run.start_step (0, or C after a restart)
        with run.step(step):
            loss = train_step(step)                     # forward, backward, optimizer.step(), zero_grad
        run.boundary(loss)                              # the committed boundary: repairs happen here
    job.close()

What each call owns:

* :func:`init` reads the launcher's environment, makes the backend's decisions before any group
  exists (:meth:`accelpact.impl.runtime.backends.Backend.prepare_process`: the device, NCCL's error
  handling), connects to the launcher's store under the restart's namespace
  (``attempt{n}/``, n the job's attempt (attempts.py); torchrun's store keeps the previous attempt's keys),
  initialises the default group (unless you did), and builds, collectively and in one fixed order,
  the control group, the checkpoint group and the training groups: ``shard_group`` (the ranks of one
  replica), ``replicate_group`` (the ranks holding the same shard in every replica), ``world_group``
  (every rank, for DDP) and ``mesh`` (a 2-D ``DeviceMesh`` ("replicate", "shard") over the same
  groups, for FSDP2).  It is collective: every rank calls it.
* :meth:`Session.attach` finds the wrapper (FSDP1, FSDP2, DDP) and so R (the replicate group for
  HSDP, the world group for DDP), restores the latest *committed* DCP checkpoint if there is one
  (an L2 restart resumes there), and attaches the recovery engine (:class:`accelpact.impl.recovery.Pact`).
* :meth:`Training.boundary` runs the engine's boundary and then, when due, the checkpoint (through
  the dedicated gloo checkpoint group, never a communicator that may fail).

Your code and AccelPact (documented behaviour, spec/implementation.md "Public API"):

* An exception raised by your code inside ``with run.step(step):`` is an in-flight failure: the
  contract decides it (L2 by default): every rank exits 70 and torchrun restarts all of them from the
  last committed checkpoint.  An exception outside ``run.step`` is yours: AccelPact does not catch it
  (torchrun sees the rank fail and restarts everyone); the rank exits 1 after the traceback, never
  through the interpreter's teardown, which live process groups can turn into SIGABRT.
* Your own collectives: on groups AccelPact built for you (``shard_group``...) or your own.  Only R
  is repaired in place; a failure of any other group surfaces in your code as the backend's error.
  Collectives on R inside ``run.step`` are observed as failures of R at the next boundary.
* Settings come from arguments, else ``ACCELPACT_*`` environment variables, else defaults
  (:class:`Settings`); a malformed value is an error naming the variable.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import sys
import warnings
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from accelpact.model.contract import default_envelope, load_envelope

from ..controlplane import ABORT_KEY, PREFIX, ControlPlane, progress_key
from ..deadlines import DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_DEADLINE_S
from ..exitcodes import code_for, exit_now
from ..effects import rebuild_in_place
from ..recovery import retired_watchdogs
from ..spare import SpareEngine
from ..rundir import RunDir
from ..runtime import counting, hotswap, revoke
from ..runtime.backends import backend as _backend
from ..runtime.backends import prebuilt_env_problem
from ..runtime.checkpoint import CheckpointManager, latest_committed
from ..runtime.groups import JobGroups, build_job_groups, build_recorded_groups
from ..runtime.retire import settle_threads
from ..runtime.adapters import adapter_for
from ..runtime.wrappers import wrapper, wrapper_of
from ..trace import NullTrace, Trace
from . import attempts, workload
from .keeper import spare_ready  # torch-free
from .errors import ApiError
from .job import Topology
from .training import Training, pact_groups

__all__ = ["ApiError", "Settings", "Session", "Training", "build_recorded_groups", "init", "pact_groups"]


# ------------------------------------------------------------------------------------- settings
@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob of :func:`init`, each settable by argument or by ``ACCELPACT_<NAME>`` (an
    argument wins).  Times are seconds.

    ``backend``: ``gloo`` or ``nccl`` (default: nccl when CUDA is available, else gloo);
    ``replicas``: how many replicas of the model the world holds (HSDP's replicate degree;
    default ``WORLD_SIZE // LOCAL_WORLD_SIZE``: one replica per node; with one replica FSDP's replicate
    groups are single ranks and nothing is repaired in place: ``attach`` warns); ``deadline_s``: each phase's
    wait on peers; ``collective_timeout_s``: the training groups' collective timeout (what turns a
    peer that stops answering into an error, when the detector has not already acted);
    ``pg_timeout_s``: setup and checkpoint groups; ``trace_dir``: write the recovery trace there
    (``trace-a{attempt}-r{rank}.ndjson``; None: no trace); ``envelope``: an envelope file written by
    ``accelpact qualify`` (None: the default envelope); ``detect``: the heartbeat failure detector;
    ``dead_after_s`` / ``hang_threshold_s``: its thresholds (None: its defaults, spec/detection.md);
    ``hang_floor_s``: the least derived hang threshold (None: ``collective_timeout_s``, so that a rank
    slower than its peers by less than the collective timeout is a slow healthy rank, never hung; a
    job that wants hangs found sooner, and whose steps are never that uneven, sets it lower);
    ``spares``: how many of the launcher's processes are spares (the last ``spares`` ranks of
    ``WORLD_SIZE``; hot swap, spec/hotswap.md); ``spare_wait_s``: how long an unused spare idles;
    ``discard_in_place``: without ``rebuild=``, discard a communicator failure in forward or backward
    on the same wrapper where it can reset in place (FSDP2, DDP; spec/protocol.md P17.3), which costs
    the commit fence every step (P17.2: an all-reduce over W); false: such a failure is L2 and no fence
    runs."""

    backend: str | None = None
    replicas: int | None = None
    deadline_s: float = DEFAULT_DEADLINE_S
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # torch's NCCL default (deadlines.py)
    pg_timeout_s: float = 120.0
    step_deadline_s: float | None = None
    trace_dir: str | None = None
    envelope: str | None = None
    detect: bool = True
    discard_in_place: bool = True
    dead_after_s: float | None = None
    hang_threshold_s: float | None = None
    hang_floor_s: float | None = None
    spares: int = 0
    spare_wait_s: float = 7 * 86400.0

    @classmethod
    def resolve(cls, env: Mapping[str, str] | None = None, **given: Any) -> "Settings":
        """Arguments (``given``, None meaning unset) over ``ACCELPACT_*`` variables over defaults."""
        env = os.environ if env is None else env
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"accelpact.init: unknown setting(s) {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = f"ACCELPACT_{f.name.upper()}"
            if given.get(f.name) is not None:
                values[f.name] = _check(f.name, given[f.name], f.name)
            elif env.get(var, "") != "":
                values[f.name] = _check(f.name, env[var], var)
        return cls(**values)


def _check(name: str, value: Any, where: str) -> Any:
    """One setting, converted from its environment string when it is one; errors name ``where``."""
    try:
        if name in ("backend", "trace_dir", "envelope"):
            value = str(value)
            if name == "backend":
                _backend(value)
            return value
        if name in ("detect", "discard_in_place"):
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return str(value).lower() in ("1", "true", "yes", "on")
            raise ValueError("must be true or false (1/0)")
        if name in ("replicas", "spares"):
            n = int(value)
            low = 1 if name == "replicas" else 0
            if n < low or isinstance(value, bool) or float(value) != n:
                raise ValueError(f"must be an integer >= {low}")
            return n
        x = float(value)
        if not x > 0 or isinstance(value, bool):
            raise ValueError("must be a number of seconds > 0")
        return x
    except (TypeError, ValueError) as exc:
        raise ApiError(f"{where}={value!r}: {exc}") from None


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ApiError(f"{name} is not set: run under torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, "
                           "MASTER_ADDR, MASTER_PORT), or set them yourself")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(f"{name}={raw!r}: must be an integer") from None


# ------------------------------------------------------------------------------------- the job
@dataclass(eq=False)
class Session:
    """This rank's session of the job, from :func:`init` to :meth:`close`: its settings, identity
    (rank, attempt), store and groups, as :func:`init` built them.  Attach a model with :meth:`attach`.  ``shard_group``/``replicate_group``/``world_group``/``mesh``: the
    training groups to wrap your model with; ``device``: where its tensors belong."""

    settings: Settings
    rank: int
    world: int
    local_rank: int
    attempt: int
    replicas: int
    device: Any
    store: Any                       # the launcher's store (client)
    attempt_store: Any               # namespaced by the attempt
    topology: Any
    #: this rank's process groups, their socket records and generation: the one record of them, built
    #: at init and rebuilt in place by the engine's episodes (a spare's is empty until it takes an identity)
    groups: JobGroups = field(repr=False)
    training: "Training | None" = None
    #: spare processes in the job, and which one this process is (None: a training rank)
    spares: int = 0
    spare: int | None = None
    #: issue 41: the step's micro-batch count given at attach (None: the job did not opt in: a death
    #: with no spare left is L2 as before), and a requested shrink (step, replica) of a fault-free run
    _micro_batches: int | None = None
    _shrink_at: tuple[int, int] | None = None
    #: issue 44: how checkpoints are taken, ``attach(checkpoint=...)``: "sync" or "async"
    _checkpoint_mode: str = "sync"

    @property
    def backend(self) -> str:
        assert self.settings.backend is not None
        return self.settings.backend

    @property
    def control_group(self) -> Any:
        """The engine's out-of-band group over all of W (gloo): never the model's."""
        return self.groups.control

    @property
    def checkpoint_group(self) -> Any:
        """DCP's group over all of W (gloo): never a communicator that may fail."""
        return self.groups.checkpoint

    @property
    def generation(self) -> int:
        """The generation whose groups the job holds (a hot swap builds every group anew in g+1)."""
        return self.groups.generation

    def _group(self, kind: str) -> Any:
        """This rank's group of ``kind``: R's current communicator once attached (a repair replaces
        it; the job hands R to the engine at attach), the job's own otherwise (also the groups a hot
        swap just built, before the engine of the next generation takes R)."""
        if kind in self.groups.training:
            return self.groups.training[kind]
        t = self.training
        if t is not None and t.pact is not None and t.pact.groups.name == kind:
            return t.pact.process_group
        if self.spare is not None:
            raise ApiError(f"this process is spare {self.spare}: it holds no {kind} group until it takes a dead rank's "
                           "identity, inside attach. With spares, build the model in a function and pass it to attach: "
                           "job.attach(rebuild=build, ...), where build(job, extra) wraps the model on job's current groups "
                           "(job.mesh, job.shard_group, ...) and returns (model, optimizer); touch no group before attach")
        raise ApiError(f"this process holds no {kind} group (a spare holds none until it takes a rank's identity)")

    @property
    def shard_group(self) -> Any:
        """The ranks of this rank's replica (FSDP's shard group)."""
        return self._group("shard")

    @property
    def replicate_group(self) -> Any:
        """The ranks holding this rank's shard in every replica (HSDP's R)."""
        return self._group("replicate")

    @property
    def world_group(self) -> Any:
        """Every rank, as a training group of its own (DDP's R; the default group stays free)."""
        return self._group("world")

    @property
    def mesh(self) -> Any:
        """The 2-D ``DeviceMesh`` ("replicate", "shard") over the same groups, for FSDP2 (built on first
        use; no collective).  A repair rebinds it through the FSDP2 adapter when the model uses it."""
        if self.groups.mesh is None:
            # a shrunk job (issue 41) lays its mesh over the replicas still in training (whole rows leave)
            rows = [row for row in ([r for r in row if r in self.groups.members(row)] for row in self.topology.mesh_ranks())
                    if row]
            self.groups.mesh = DeviceMesh.from_group([self.replicate_group, self.shard_group], self.device.type,
                                                     mesh=rows, mesh_dim_names=("replicate", "shard"))
        return self.groups.mesh

    def rebuild_wide(self, g_next: int) -> tuple[list[str], Any, dict]:
        """Phase 4 of every episode (spec/protocol.md P18.3; the engine calls it on every rank): the
        groups over all of W built anew in ``g_next`` (:meth:`accelpact.impl.runtime.groups.JobGroups.rebuild_wide`),
        and the checkpoints moved onto the new checkpoint group.  Returns the names of the groups built,
        the new control group and the socket records of the training groups rebuilt (by name)."""
        names = self.groups.rebuild_wide(self.rank, g_next)
        t = self.training
        if t is not None and t.checkpoints is not None:
            t.checkpoints.group = self.checkpoint_group
        return names, self.groups.control, {k: self.groups.records[k] for k in names if k in self.groups.records}

    def attach(self, model: Any = None, optimizer: Any = None, *, checkpoint_dir: str | os.PathLike | None = None,
               checkpoint_every: int = 0, extra_state: Callable[[], Any] | None = None,
               trace_header: Mapping[str, Any] | None = None, hooks: Any = None,
               rebuild: Callable[["Session", Any], tuple[Any, Any]] | None = None,
               warmup: Callable[[], Any] | None = None, micro_batches: int | None = None,
               shrink_at: Any = None, checkpoint: str = "sync") -> "Training | None":
        """Attach the recovery engine to a wrapped ``model`` and its ``optimizer``.

        Restores the latest committed checkpoint under ``checkpoint_dir`` first (model, optimizer,
        RNG; ``Training.start_step`` is its step C, ``Training.restored_extra`` what ``extra_state``
        returned when it was saved).  ``checkpoint_every``: commit a DCP checkpoint every that many
        committed steps (0: never; an L2 restart then starts from step 0).  ``extra_state()``: any
        picklable per-rank state to save with each checkpoint (your data loader's position).
        ``trace_header``: extra fields for the trace's header.  ``hooks``: test-only
        (:class:`accelpact.impl.hooks.Hooks`, what a test harness builds to inject faults or install a
        seeded bug, e.g. ``accelpact.testing.faults.fault_hooks(job, "crash@backward:4:1")``); None: none.

        ``rebuild(job, extra)``: builds the wrapped model and its optimizer on the job's *current*
        groups (``job.shard_group``... ``job.mesh``) and returns ``(model, optimizer)``; ``extra`` is the
        extra state to start from (None: a fresh start).  Needed with spares (a hot swap rebuilds the
        model on every rank, spec/hotswap.md); with it, ``model`` and ``optimizer`` may be omitted
        (``rebuild(job, None)`` builds them).  On a spare, ``attach`` idles until the spare takes a
        dead rank's identity and returns the training at that rank's frontier, or returns None when
        the job ended without needing it.  ``warmup()``: what a spare runs while it idles, before
        any claim (load your data, import your model's code) so that a swap does not wait for it.
        Without ``rebuild``, a communicator failure in forward or backward is still discarded in place
        where the wrapper can reset its aborted iteration (FSDP2, DDP: :func:`in_place_rebuild`; the
        setting ``discard_in_place``): the same model goes on, ``run.discarded`` is true,
        ``run.restored_extra`` is ``extra_state()``'s value at F and the step comes again; FSDP1 needs
        ``rebuild`` for that (spec/protocol.md P17.3), else such a failure is L2.

        ``micro_batches=M`` (issue 41, needs ``rebuild``): opt in to shrink and grow.  A step is then
        ``M`` micro-batches shared among the replicas (``run.micro_batches(step)``, ``run.loss_weight``,
        ``run.no_sync(last)``); a rank that dies with no spare idle, while every shard keeps a live
        replica, takes its replica out of the data-parallel dimension at F (no restart), and a spare idle
        later brings it back at a committed boundary.  ``shrink_at=(step, replica)`` (or
        ``ACCELPACT_SHRINK_AT=step:replica``): a fault-free run's requested shrink at the boundary where
        F == step (tests and references compare a real death with it).

        ``checkpoint``: ``"sync"`` (the default: the whole save at the due boundary) or ``"async"``
        (``dcp.async_save``: the state is copied to CPU memory at the boundary and written while the
        next steps run; the last durable checkpoint is still the one every rank finished and
        acknowledged, :mod:`accelpact.impl.runtime.checkpoint`).
        """
        if self.training is not None:
            raise ApiError("attach: this job already has an attached model; one model per job")
        if checkpoint not in ("sync", "async"):
            raise ApiError(f"attach: checkpoint={checkpoint!r}: must be 'sync' or 'async'")
        self._checkpoint_mode = checkpoint
        self._opt_in(micro_batches, shrink_at, rebuild)
        if self.spares and rebuild is None:
            raise ApiError(f"attach: this job has {self.spares} spare(s): pass rebuild=fn, where fn(job, extra) builds the "
                           "wrapped model and optimizer on job's current groups (a hot swap rebuilds them on every rank)")
        if self.spare is not None:
            assert rebuild is not None
            return self._join_as_spare(rebuild, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                                       extra_state=extra_state, trace_header=trace_header, hooks=hooks, warmup=warmup)
        if model is None or optimizer is None:
            if rebuild is None:
                raise ApiError("attach: pass the wrapped model and its optimizer, or rebuild=fn to build them")
            model, optimizer = rebuild(self, None)
        start, restored_extra, resumed_from = 0, None, None
        ckpt = self._checkpoints(checkpoint_dir, checkpoint_every)
        if ckpt is not None:
            c = latest_committed(ckpt.root, world=self.world)
            if c is not None:
                restored = ckpt.load(c, model, optimizer)
                start, restored_extra, resumed_from = c, restored.cursor, c
        # without rebuild=, a wrapper that resets an aborted step in place (FSDP2, DDP) discards on itself (P17.3)
        discard = rebuild if rebuild is not None else in_place_rebuild(model) if self.settings.discard_in_place else None
        # whether a failure in forward or backward can be discarded in place (P17): the checker's envelope
        trace = self._trace(model, start, {"discard": discard is not None, **(trace_header or {})})
        training = Training(job=self, pact=None, checkpoints=ckpt, start_step=start, resumed_from=resumed_from,
                            restored_extra=restored_extra, extra_state=extra_state, wrapper="", rebuild=discard,
                            hooks=hooks)
        self.training = training
        training._engage(model, optimizer, generation=self.generation, frontier=start, trace=trace)
        _warn_if_single_replica(self.topology, training.wrapper, self.rank)
        return training

    def _opt_in(self, micro_batches: int | None, shrink_at: Any, rebuild: Any) -> None:
        """Issue 41's opt-in, checked: ``micro_batches`` at least the replicas (each needs a share),
        ``rebuild`` given (a shrink rebuilds the model on the groups that remain)."""
        from .. import shrink as _shrink

        if micro_batches is None:
            if shrink_at is not None:
                raise ApiError("attach: shrink_at needs micro_batches=M (a shrink keeps the global batch of M micro-batches)")
            return
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ApiError(f"attach: micro_batches={micro_batches!r}: must be an integer >= 1 (the step's micro-batch count)")
        if rebuild is None:
            raise ApiError("attach: micro_batches needs rebuild=fn: a shrink or a grow rebuilds the model on the groups "
                           "that remain (fn(job, extra) -> (model, optimizer))")
        if micro_batches < self.replicas:
            raise ApiError(f"attach: micro_batches={micro_batches} is fewer than the job's {self.replicas} replicas: "
                           "every replica needs at least one micro-batch")
        try:
            at = _shrink.parse_shrink_at(shrink_at, "shrink_at") if shrink_at is not None else _shrink.shrink_at_from_env()
        except _shrink.ShrinkError as exc:
            raise ApiError(str(exc)) from None
        self._micro_batches, self._shrink_at = micro_batches, at

    def _checkpoints(self, checkpoint_dir: Any, checkpoint_every: int) -> Any:
        if checkpoint_dir is None and not checkpoint_every:
            return None
        if checkpoint_dir is None:
            raise ApiError("attach: checkpoint_every needs checkpoint_dir (where the DCP checkpoints go)")
        return CheckpointManager(checkpoint_dir, every=checkpoint_every, rank=self.rank, world=self.world,
                                 store=dist.PrefixStore("ckpt", self.attempt_store), group=self.checkpoint_group,
                                 commit_timeout_s=self.settings.collective_timeout_s, mode=self._checkpoint_mode)

    @functools.cached_property
    def contract(self) -> tuple[str, Any]:
        """The platform this job's engine decides on (its backend's: ``cpu-gloo``, ``cuda-nccl``) and the
        envelope it decides with (the ``envelope`` setting's file, else the shipped default), read once
        per job: every engine of the job decides with it and every trace header carries it
        (``platform``, ``envelope``), so the trace checker models the contract the engine had, not the
        one the checker would assume (an unqualified platform's failures are L2)."""
        envelope = load_envelope(self.settings.envelope) if self.settings.envelope else default_envelope()
        return _backend(self.backend).platform, envelope

    def _contract_header(self) -> dict[str, Any]:
        platform, envelope = self.contract
        return {"platform": platform, "envelope": envelope.to_json()}

    def _trace(self, model: Any, start: int, trace_header: Mapping[str, Any] | None, path: Any = None) -> Any:
        if self.settings.trace_dir is None:
            return NullTrace()
        wrap = wrapper_of(model)
        kind = wrapper(wrap.name).recovers
        header = dict(world=self.world, nodes=self.topology.nodes, ranks_per_node=self.topology.ranks_per_node,
                      group=kind, own_group=list(self.topology.group(kind, self.rank)), attempt=self.attempt,
                      scenario="job", seed=0, backend=self.backend, frontier_at_start=start, wrapper=wrap.name,
                      generation_at_start=self.generation, spares=self.spares, **self._contract_header())
        if self._micro_batches:  # issue 41: the job can shrink and grow (the model's Config.shrink, micro_batches)
            header.update(shrink=True, micro_batches=self._micro_batches)
        header.update(trace_header or {})
        return Trace(path or RunDir(self.settings.trace_dir).trace(self.attempt, self.rank), self.rank, header)

    def _join_as_spare(self, rebuild: Callable[["Session", Any], tuple[Any, Any]], *, checkpoint_dir: Any,
                       checkpoint_every: int, extra_state: Any, trace_header: Any, hooks: Any,
                       warmup: Callable[[], Any] | None = None) -> "Training | None":
        """A spare: idle on the control plane until a survivor's claim hands it a dead identity
        (``SpareJoin``), then the swap's episode as that rank (:class:`accelpact.impl.spare.SpareEngine`:
        agreement, every group built in g+1, the model built by ``rebuild``, the state received from a
        live replica, validation, release); returns the training at the dead rank's frontier.  None:
        the job ended without needing this spare.  An abort of the job ends the spare with its code.

        While it idles, before any claim, it runs ``warmup()`` and builds the model once on stand-in
        groups (:meth:`_prebuild`), so that a swap's critical path is the state transfer, not a first
        build; then it tells the keeper that started it, if one did (refill), that it is ready."""
        k = self.spare
        assert k is not None
        hotswap.warm_up()
        if warmup is not None:
            warmup()
        self._prebuild(rebuild)
        spare_ready()  # a spare its keeper started in a dead worker's place enters the pool now (refill)
        got = hotswap.wait_for_claim(self.attempt_store, k, ABORT_KEY, self.settings.spare_wait_s)
        if isinstance(got, str):
            if got == "closed":
                return None
            exit_now(code_for(got if got in ("rejected", "mismatch", "deadline", "exception") else "deadline"), got, None)
        assert not isinstance(got, str)
        dead, g, point = got
        published = hotswap.read_state(self.attempt_store, dead)
        if published is None:
            raise hotswap.SwapError(f"spare {k}: rank {dead} published no state at its last commit; cannot take its identity")
        self.rank = dead
        _announce_identity(k, dead, os.environ.get("RANK"))
        trace: Any = NullTrace()
        if self.settings.trace_dir is not None:
            path = RunDir(self.settings.trace_dir).spare_trace(k, self.attempt, dead)
            header = dict(world=self.world, nodes=self.topology.nodes, ranks_per_node=self.topology.ranks_per_node,
                          attempt=self.attempt, scenario="job", seed=0, backend=self.backend,
                          frontier_at_start=published["frontier"], spare=k, generation_at_start=g,
                          **self._contract_header())
            header.update(trace_header or {})
            trace = Trace(path, dead, header)
        engine = SpareEngine(self, control=ControlPlane(self.attempt_store, dead, self.world, prefix=PREFIX), spare=k,
                             generation=g, published=published, trace=trace, hooks=hooks,
                             deadline_s=self.settings.deadline_s)
        engine.join()
        notices = hotswap.Notices(self.attempt_store)
        n = notices.count()
        module, optimizer, record = engine.swap(point=point, rebuild=rebuild, extra=copy.deepcopy(published["extra"]))
        notices.handled(n)
        self.spare = None
        ckpt = self._checkpoints(checkpoint_dir, checkpoint_every)
        training = Training(job=self, pact=None, checkpoints=ckpt, start_step=published["frontier"], resumed_from=None,
                            restored_extra=copy.deepcopy(published["extra"]), extra_state=extra_state, wrapper="",
                            rebuild=rebuild, hooks=hooks, spare_index=k)
        training.swaps.append(record)
        training._notices = notices
        self.training = training
        frontier = published["frontier"]
        training._engage(module, optimizer, generation=g + 1, frontier=frontier, trace=trace)
        # the save the survivors take after this release, which this identity never reached (a death at
        # the boundary of a due F; an async save lost in the episode), tagged with the swap's generation
        training._save_on_join(point, g)
        return training

    def _prebuild(self, rebuild: Callable[["Session", Any], tuple[Any, Any]]) -> bool:
        """A spare, while it idles: call ``rebuild(job, None)`` once on stand-in groups and drop what it
        returns, so that the swap's build finds its code imported and run once (the wrapper's lazy
        imports: DDP's first construction imports ``torch._dynamo``, most of a first build here; the
        model's code; the device's first allocations).  The stand-in is c10d's ``fake`` backend: this
        process as rank 0 of the job's topology, in groups of the job's shapes (the shard sizes of a real
        rank, so its memory, freed again), whose collectives move no data.  During the call
        ``job.rank`` is 0 and ``job.shard_group`` ... ``job.mesh`` are the stand-ins; afterwards every
        stand-in group is destroyed and the spare holds no group, as before.  ``rebuild`` must tolerate
        this call (it builds; what it returns is dropped).  Skipped where a default process group exists
        (the user's own) or the backend is not available; a failure is said on stderr and the spare idles
        on (the swap builds anyway).  True when the model was built."""
        if dist.is_initialized():
            return False
        try:
            importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers c10d's "fake" backend
        except Exception as exc:  # noqa: BLE001 - any import failure: no stand-in, the swap builds from cold
            print(f"accelpact: spare {self.spare}: no stand-in groups to build the model on while idle ({exc!r})",
                  file=sys.stderr, flush=True)
            return False
        saved = (self.rank, self.groups)
        try:
            dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=self.world)
            topo = self.topology
            training = {kind: dist.new_group(list(topo.group(kind, 0))) for kind in ("shard", "replicate")}
            training["world"] = dist.new_group(list(range(self.world)))
            self.rank, self.groups = 0, replace(self.groups, training=training, mesh=None)
            built = rebuild(self, None)
            del built
            return True
        except Exception as exc:  # noqa: BLE001 - the user's rebuild on stand-ins: any failure only costs the warm start
            print(f"accelpact: spare {self.spare}: building the model on stand-in groups while idle failed ({exc!r}); "
                  "a swap will build it from cold", file=sys.stderr, flush=True)
            return False
        finally:
            self.rank, self.groups = saved
            if dist.is_initialized():
                dist.destroy_process_group()

    def previous_frontier(self) -> int | None:
        """The committed frontier this rank reached in earlier attempts (what an L2 restart replays
        to), from the store's progress keys; None in attempt 0 or when the store lost them."""
        best = None
        for a in range(self.attempt):
            key = progress_key(a, self.rank)
            if self.store.check([key]):
                v = int(self.store.get(key).decode())
                best = v if best is None else max(best, v)
        return best

    def close(self) -> None:
        """End of training on every rank: wait until every rank got here (a rank leaving early closes
        sockets under its peers), stop the engine, end its threads' store waits and join them (no
        C++ wait may be in flight when the interpreter finalizes), destroy the groups.  Collective."""
        if self.spare is not None:  # a spare the job never needed: it holds no group
            return
        run = self.training
        if run is not None and run.left:
            # issue 41: this rank's replica left the data-parallel dimension; its peers rebuilt every group
            # without it, so nothing collective is left to it: it ends here (no teardown of groups whose
            # peers moved on, and no store write that would read as the job's end)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if run is not None and run._open is not None and not run.discarded:
            # the last step's missing boundary: no later run.step() can refuse it
            raise ApiError(f"job.close(): the last step ({run._open}) was never closed by run.boundary(loss): write "
                           "run.boundary(loss) after each `with run.step(step):` block, the last one too (its "
                           "optimizer step is not committed without it: not repaired, not checkpointed)")
        if run is not None:
            run.settle_checkpoint()  # an async save in flight ends before the checkpoint group's last use
        dist.barrier(group=self.checkpoint_group)
        if self.training is not None:
            pact = self.training.pact
            if self.training._watcher is not None:
                self.training._watcher.stop()
            pact.close()
            # every rank's watchdog is stopped before any rank wakes the watchdogs' store waits
            dist.barrier(group=self.checkpoint_group)
            pact.watchdog.wake_and_join()
            for old in retired_watchdogs():  # engines a swap or a discard retired: their threads may still wait
                old.wake_and_join()
            left = settle_threads()
            if left:
                print(f"accelpact: job.close(): engine thread(s) {left} still running after 10 s; the interpreter's "
                      "teardown may abort the process (exit -6) if one is inside a C++ call then", file=sys.stderr, flush=True)
        dist.destroy_process_group()  # every group, in order, before the interpreter's teardown


def in_place_rebuild(model: Any) -> Callable[["Session", Any], tuple[Any, Any]] | None:
    """What a job attached without ``rebuild=`` discards with: :func:`accelpact.impl.effects.rebuild_in_place`
    (the marker of a discard that keeps the wrapper, resets its aborted iteration and rebinds it onto
    the rebuilt groups) where the model's wrapper can reset in place
    (:meth:`accelpact.impl.runtime.adapters.base.Adapter.in_place_problem`: FSDP2 on torch 2.13); None
    elsewhere (FSDP1, DDP: a failure in forward or backward is then L2 unless ``rebuild=`` is given;
    spec/protocol.md P17.3 says why)."""
    if adapter_for(model).in_place_problem(model) is not None:
        return None
    return rebuild_in_place


def identity_message(spare: int, rank: int, launcher_rank: str | None) -> str:
    """The line a spare logs when it takes a dead rank's identity (its ``RANK`` env var stays its own)."""
    return (f"accelpact: spare {spare} (launcher RANK={launcher_rank}) now acts as rank {rank}: use job.rank, not "
            "os.environ['RANK']")


def _announce_identity(spare: int, rank: int, launcher_rank: str | None) -> None:
    """Log the identity on stderr and, where ``setproctitle`` is installed (optional), in the process title."""
    print(identity_message(spare, rank, launcher_rank), file=sys.stderr, flush=True)
    try:
        titles: Any = importlib.import_module("setproctitle")  # optional: never a dependency
    except ImportError:
        return
    titles.setproctitle(f"accelpact rank {rank} (spare {spare})")


def single_replica_message(topology: Any, wrapper_name: str) -> str | None:
    """What :meth:`Session.attach` warns when R cannot be repaired in place: a hybrid wrapper
    (R = the replicate group) on a world of one replica, where every replicate group is a single
    rank; None when R has peers (always for DDP, whose R is the world group)."""
    world = topology.nodes * topology.ranks_per_node
    if world < 2 or topology.nodes != 1 or wrapper(wrapper_name).recovers != "replicate":
        return None
    return (f"accelpact: replicas=1 on {world} ranks: every replicate group is a single rank, so no failure can be "
            "repaired in place (L1) and no spare can take a rank's place (hot swap needs a live replica): every "
            "failure is an L2 restart from the last checkpoint. Set replicas= in accelpact.init (or "
            "ACCELPACT_REPLICAS) to the number of model replicas, e.g. replicas=2 on 4 ranks (the default is one "
            "replica per node, WORLD_SIZE // LOCAL_WORLD_SIZE: 1 under torchrun --standalone)")


def _warn_if_single_replica(topology: Any, wrapper_name: str, rank: int) -> None:
    """Warn once per job, on rank 0 (every rank would print the same message)."""
    msg = single_replica_message(topology, wrapper_name)
    if msg is not None and rank == 0:
        warnings.warn(msg, UserWarning, stacklevel=3)


# ------------------------------------------------------------------------------------- init
def _exit_cleanly_on_uncaught() -> None:
    """An exception your script does not catch ends the rank with exit code 1 after its traceback, as
    Python's default does, but without the interpreter's teardown: with process groups alive, their
    threads' teardown aborts the process ("terminate called without an active exception", SIGABRT,
    -6; seen after an ``ApiError`` at a second ``attach``).  Installed once, at :func:`init`, after the
    default group exists: torch's own hook then prints the traceback (with its ``[rankN]:`` prefix)
    and this one exits."""
    if getattr(sys.excepthook, "_accelpact", False):
        return
    previous = sys.excepthook

    def hook(tp: Any, value: Any, tb: Any) -> None:
        try:
            previous(tp, value, tb)
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            os._exit(1)

    hook._accelpact = True  # type: ignore[attr-defined]  # a marker on the function: installed once per process
    sys.excepthook = hook


def init(backend: str | None = None, *, replicas: int | None = None, mesh: Any = None,
         env: Mapping[str, str] | None = None, **settings: Any) -> Session:
    """Build this rank's job (collective: every rank calls it, before building its model).

    ``backend``/``replicas`` and the keyword ``settings`` are :class:`Settings` fields.  Test faults
    are not a setting: a test passes its hooks at :meth:`Session.attach`.

    If the default process group exists already (your own ``init_process_group``), it is used as
    is; under torchrun restarts it must then have been created on a store namespaced by the restart
    count (spec/implementation.md, "Public API").  ``mesh``: your own 2-D ``DeviceMesh``
    (``init_device_mesh(device, (replicas, shards), mesh_dim_names=("replicate", "shard"))``) whose
    groups become the job's shard and replicate groups (NCCL only: see :func:`_check_user_mesh`).
    """
    env = os.environ if env is None else env
    s = Settings.resolve(env, backend=backend, replicas=replicas, **settings)
    if s.backend is None:
        s = replace(s, backend="nccl" if torch.cuda.is_available() else "gloo")
    assert s.backend is not None
    be = _backend(s.backend)
    rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    local_rank = _env_int(env, "LOCAL_RANK", rank)
    local_world = _env_int(env, "LOCAL_WORLD_SIZE", world)
    # one replica per node by default: the launcher's nodes, spares counted on both sides (each node holds
    # its own, issue 43: the training ranks over the training ranks per node)
    nodes = max(1, world // max(1, local_world))
    if s.spares:  # RANK >= WORLD_SIZE - spares are spares (as the keeper numbers them); the training world is the rest
        if s.spares >= world:
            raise ApiError(f"spares={s.spares} leaves no training rank in WORLD_SIZE={world}: the launcher starts the "
                           "training ranks and the spares together (torchrun --nproc-per-node ranks+spares)")
        world -= s.spares
    n = s.replicas if s.replicas is not None else nodes
    if world % n:
        raise ApiError(f"replicas={n} does not divide WORLD_SIZE={world}: each replica must hold the same number of "
                       "shards (set replicas= or ACCELPACT_REPLICAS)")
    # every process of this node takes cuda:LOCAL_RANK, spares too (their LOCAL_RANK is past the
    # training ranks'): count them all, not the training ranks only
    why = be.unavailable(_env_int(env, "LOCAL_WORLD_SIZE", world + s.spares))
    if why:
        raise ApiError(f"backend {be.name}: {why}; use backend='gloo' on CPU-only machines")
    if mesh is not None:
        n = _check_user_mesh(mesh, be, world)
    # NCCL groups keep the environment they were built in
    user_nccl = be.revoke == "abort" and (mesh is not None or (dist.is_initialized() and "nccl" in str(dist.get_backend()).lower()))
    if why := prebuilt_env_problem(be, os.environ, prebuilt=user_nccl):
        raise ApiError(why)
    device = be.prepare_process(local_rank)
    topo = Topology(n, world // n)

    timeout = timedelta(seconds=s.pg_timeout_s)
    store = counting.wrap_store(dist.TCPStore(_env(env, "MASTER_ADDR"), _env_int(env, "MASTER_PORT"), is_master=False, timeout=timeout))
    # the job's attempt, the same on every agent's workers (attempts.py: torchrun's restart count is not)
    attempt = attempts.start(store, {**env, "RANK": str(rank)})
    astore = counting.wrap_store(dist.PrefixStore(f"attempt{attempt}", counting.real_store(store)))  # counted under ACCELPACT_COUNT only
    # how every group of the job is built (impl/runtime/groups.py)
    where = dict(device=device, store=astore, deadline_s=s.deadline_s, pg_timeout_s=s.pg_timeout_s,
                 collective_timeout_s=s.collective_timeout_s)
    if rank >= world:  # a spare: no group until it takes a dead rank's identity (Session.attach)
        _exit_cleanly_on_uncaught()
        return Session(settings=s, rank=-1, world=world, local_rank=local_rank, attempt=attempt, replicas=n,
                       device=device, store=store, attempt_store=astore, topology=topo, spares=s.spares,
                       spare=rank - world, groups=build_job_groups(workload, topo, rank, be.name, build=False, **where))
    default_record = None  # the default group's sockets, where we build it: a wide revoke closes them (P18.4)
    if not dist.is_initialized():
        _, default_record = revoke.recorded(lambda: dist.init_process_group(
            be.name, store=dist.PrefixStore("pg", astore), rank=rank, world_size=world, timeout=timeout,
            **be.init_kwargs(device)), be.name)
    elif dist.get_world_size() != world or dist.get_rank() != rank:
        raise ApiError(f"the default process group (rank {dist.get_rank()} of {dist.get_world_size()}) does not match "
                       f"RANK={rank} WORLD_SIZE={world}")
    # after init_process_group, whose own hook (the "[rankN]:" prefix) prints into a buffer: ours must
    # wrap it, not be wrapped by it, or the traceback would be lost at the exit
    _exit_cleanly_on_uncaught()
    if mesh is not None and mesh.mesh.tolist() != topo.mesh_ranks():
        raise ApiError(f"mesh: its ranks {mesh.mesh.tolist()} are not laid out as {topo.mesh_ranks()} (row r = replica "
                       "r's ranks, rank = replica * shards + shard index): build it with init_device_mesh")
    groups = build_job_groups(workload, topo, rank, be.name, mesh=mesh, default_record=default_record, **where)
    return Session(settings=s, rank=rank, world=world, local_rank=local_rank, attempt=attempt, replicas=n,
                   device=device, store=store, attempt_store=astore, topology=topo, groups=groups, spares=s.spares)


def _check_user_mesh(mesh: Any, be: Any, world: int) -> int:
    """A user's own ``DeviceMesh`` is usable when AccelPact can revoke its groups: on NCCL a group is
    revoked by aborting its communicator, which works on any group; on gloo it is revoked by
    shutting down the sockets recorded while the group was built, which only groups built by
    :func:`init` have.  Returns the number of replicas (the mesh's first dimension)."""
    if be.revoke == "sockets":
        raise ApiError(f"mesh: a DeviceMesh you built cannot be repaired on {be.name}: AccelPact revokes a {be.name} group "
                       "by shutting down the sockets it recorded while building the group. Let accelpact.init build the "
                       "groups and use job.mesh, the same ('replicate', 'shard') mesh")
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if names != ("replicate", "shard"):
        raise ApiError(f"mesh: needs a 2-D DeviceMesh with mesh_dim_names=('replicate', 'shard'), got {names or None}: "
                       "init_device_mesh(device, (replicas, shards), mesh_dim_names=('replicate', 'shard'))")
    if mesh.size() != world:
        raise ApiError(f"mesh: it spans {mesh.size()} ranks, WORLD_SIZE is {world}")
    return int(mesh.size(0))


def _env(env: Mapping[str, str], name: str) -> str:
    v = env.get(name)
    if not v:
        raise ApiError(f"{name} is not set: run under torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
                       "MASTER_PORT), or set them yourself")
    return v
