"""AccelPact for torchtitan (0.3.0): its ``Trainer`` with the three calls in place (README, "torchtitan").

A torchtitan user changes one line: ``trainer = AccelPactTrainer(config)`` where ``train.py`` has
``trainer = config.build()``; ``trainer.train()`` and ``trainer.close()`` stay.  What the subclass
changes in torchtitan's ``Trainer`` (``torchtitan/trainer.py``), and where the three calls go:

* ``Trainer.init_distributed`` -> :func:`accelpact.init` (``replicas`` = ``data_parallel_replicate_degree``),
  which builds the default group and the job's groups; torchtitan's ``ParallelDims`` is
  :class:`AccelPactParallelDims`, whose meshes (``world`` and the data-parallel axes ``dp_replicate``,
  ``fsdp``/``dp_shard``, ``batch``, ``loss``, ``dp``) are laid over those groups
  (:class:`DataParallelMeshes`) and which builds no group of its own: FSDP2's HSDP mesh is
  ``(replicate group, shard group)``, so R is the group ``fully_shard`` reduces over, and ``batch``
  and ``loss`` (the token count and the loss metrics) run on the job's world group.  Only pure data
  parallelism: PP, TP, CP and EP must be 1 (:func:`check_config`).
* the end of ``Trainer.__init__`` -> ``job.attach(model_parts[0], optimizers.optimizers[0], ...)``: the
  FSDP2 root and the one torch optimizer inside torchtitan's ``OptimizersContainer`` (whose ``step()``
  calls it, so the step guard sees the commit), with torchtitan's checkpoint settings
  (``checkpoint.enable/folder/interval/async_mode``, :func:`checkpoint_plan`).  AccelPact's DCP
  checkpoints replace torchtitan's checkpointer (built disabled): they hold the model, the optimizer
  and the RNG, and as the stateful loader's state (``extra_state``) the rest of what torchtitan's
  checkpointer would save, its ``train_state``, ``dataloader`` and ``lr_scheduler`` (:func:`extra_state`).
* ``Trainer.train``'s loop -> :meth:`AccelPactTrainerMixin.train`: the step's batches are read first
  (torchtitan's ``DataloaderExhaustedError`` ends training outside any step), then
  ``with run.step(step): self.train_step(...)`` (forward, backward, gradient clipping,
  ``optimizers.step()``, ``lr_schedulers.step()``, the metrics; then the gradients set to None, which
  torchtitan leaves to the next step's start and AccelPact's boundary guard wants gone), then
  ``run.boundary(loss)`` where torchtitan calls ``checkpointer.save(step)``; a discarded step (a communicator failure in forward or
  backward) sets the loader, the LR schedule and the step counters back to F and comes again: discarded
  in place (FSDP2's ``reset_iter_state``, torch 2.13), from ``run.restored_extra``; or, where the wrapper
  cannot reset in place (or with ``rebuild=True``), on a model torchtitan's own building code makes anew
  (``attach(rebuild=...)``, :meth:`AccelPactTrainerMixin._accelpact_rebuild`), which is handed the
  extra state at F.  After an L2 restart ``attach`` restored the last committed checkpoint and
  ``train`` starts from its step with that state.
* ``Trainer.close`` -> torchtitan's close, then ``job.close()`` (collective) instead of
  ``destroy_process_group``.

Not handled (refused with the reason, :func:`check_config`): spares (a hot swap: a spare would have to
build torchtitan's ``Trainer``, whose ``__init__`` runs collectives over the default group, before it
holds any group), pipeline/tensor/context/expert parallelism, several model parts or optimizers,
``spmd_backend`` other than ``partial_dtensor`` (torchtitan 0.3.0's default ``spmd_types`` fails in
``fully_shard`` on torch 2.13.0: "When dp_mesh_dims is provided, all parameters must be DTensors on the
full SPMD mesh"), CUDA graphs (a discard resets FSDP2's iteration state, which a captured graph would
replay around), and torchtitan checkpoint options AccelPact has no counterpart for (an initial load,
a seed checkpoint, HF export).  torchtitan's ``FusedQKVLinear`` renames its state-dict keys, which
torch's ``get_state_dict`` cannot resolve: :func:`checkpointable` drops those hooks at attach.  torchtitan's ``set_pg_timeouts`` (``torch.distributed.set_timeout``,
a nightly-only API) is not called: the job's groups keep AccelPact's ``collective_timeout_s``.

This module imports torchtitan only when its classes are built (:func:`__getattr__`): the mixins
and the helpers work against any object with the attributes torchtitan's ``Trainer`` has, which is how
``tests/test_torchtitan.py`` tests them without torchtitan.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh

from accelpact.impl.launch.api import ApiError, Session, in_place_rebuild, init

# ``AccelPactTrainer`` and ``AccelPactParallelDims`` are this module's too, built on first use (:func:`__getattr__`)
__all__ = ["AccelPactParallelDimsMixin", "AccelPactTrainerMixin", "CheckpointPlan", "DataParallelMeshes", "DP_AXES",
           "EXTRA_STATES", "KEY_RENAMING_HOOKS", "check_config", "checkpointable", "checkpoint_plan", "extra_state",
           "load_extra_state", "parallel_dims_class", "torchtitan_coordinate", "trainer_class"]

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object

#: torchtitan's data-parallel mesh axes (``ParallelDims``) -> the kind of the job's group each is laid
#: over: HSDP's replicate axis over R, its shard axis over the shard group, the axes that span every
#: data-parallel rank (the batch's token count, the loss metrics) over the world group
DP_AXES: dict[str, str] = {"dp_replicate": "replicate", "fsdp": "shard", "dp_shard": "shard",
                           "batch": "world", "loss": "world", "dp": "world"}
#: torchtitan's degrees of the parallelisms AccelPact does not recover (each must be 1)
OTHER_DEGREES: dict[str, str] = {"pipeline_parallel_degree": "PP", "tensor_parallel_degree": "TP",
                                 "context_parallel_degree": "CP", "expert_parallel_degree": "EP"}
#: the states torchtitan's checkpointer saves beside the model and the optimizer (its ``TRAIN_STATE``,
#: ``DATALOADER`` and ``LR_SCHEDULER`` keys), saved here as the job's ``extra_state``
EXTRA_STATES: tuple[str, ...] = ("train_state", "dataloader", "lr_scheduler")
#: torchtitan checkpoint options AccelPact has no counterpart for, and the value that leaves them unused
UNSUPPORTED_CHECKPOINT: dict[str, Any] = {"initial_load_path": None, "create_seed_checkpoint": False,
                                          "load_only": False, "load_step": -1, "exclude_from_loading": [],
                                          "last_save_in_hf": False, "enable_first_step_checkpoint": False}


# ------------------------------------------------------------------------------------- config
def check_config(config: Any, *, spares: int = 0, cuda: bool | None = None) -> None:
    """What this integration can run, checked on torchtitan's ``Trainer.Config`` before anything is
    built: an :class:`ApiError` naming the setting otherwise."""
    p = config.parallelism
    for name, label in OTHER_DEGREES.items():
        degree = getattr(p, name, 1)
        if degree != 1:
            raise ApiError(f"torchtitan: parallelism.{name}={degree}: AccelPact recovers data parallelism only (FSDP2 / "
                           f"HSDP over dp_replicate x dp_shard); {label} must be 1")
    backend = getattr(p, "spmd_backend", "partial_dtensor")
    if backend != "partial_dtensor":
        raise ApiError(f"torchtitan: parallelism.spmd_backend={backend!r}: use 'partial_dtensor' (torchtitan 0.3.0's "
                       "default 'spmd_types' fails in fully_shard on torch 2.13.0, and the full-DTensor backend lays "
                       "its meshes over axes AccelPact does not build)")
    if spares:
        raise ApiError(f"torchtitan: spares={spares}: a hot swap is not supported with torchtitan: a spare would have to "
                       "build torchtitan's Trainer, whose __init__ runs collectives over the default group, before it "
                       "holds any group; run without spares (a failure the job cannot repair in place is an L2 restart)")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cuda and not config.training.disable_cuda_graphs:
        raise ApiError("torchtitan: training.disable_cuda_graphs=False: CUDA graphs are not supported with AccelPact (a "
                       "discard resets FSDP2's iteration state, which a captured graph would replay around); set "
                       "--training.disable_cuda_graphs")
    checkpoint_plan(config)


@dataclass(frozen=True)
class CheckpointPlan:
    """AccelPact's checkpoints from torchtitan's ``checkpoint`` settings: ``directory`` (None: no
    checkpoint), ``every`` committed steps (``interval``) and ``mode`` (``async_mode`` "disabled":
    "sync", else "async")."""

    directory: str | None
    every: int
    mode: str


def checkpoint_plan(config: Any) -> CheckpointPlan:
    """``checkpoint.enable`` -> ``dump_folder/checkpoint.folder`` every ``checkpoint.interval`` steps."""
    ck = config.checkpoint
    if not ck.enable:
        return CheckpointPlan(None, 0, "sync")
    for name, unused in UNSUPPORTED_CHECKPOINT.items():
        value = getattr(ck, name, unused)
        if value != unused:
            raise ApiError(f"torchtitan: checkpoint.{name}={value!r}: not supported with AccelPact, whose own DCP "
                           f"checkpoints replace torchtitan's checkpointer; leave it at {unused!r}")
    folder = os.path.join(config.dump_folder, ck.folder)
    if "://" in folder:
        raise ApiError(f"torchtitan: checkpoint folder {folder!r}: AccelPact writes its checkpoints to a local or "
                       "shared file system path")
    mode = "sync" if getattr(ck, "async_mode", "disabled") == "disabled" else "async"
    return CheckpointPlan(folder, int(ck.interval), mode)


def without_torchtitan_checkpointer(config: Any) -> Any:
    """``config`` with ``checkpoint.enable`` off: torchtitan's checkpointer is built disabled (its
    load and save do nothing); AccelPact's checkpoints take its place."""
    if not config.checkpoint.enable:
        return config
    return dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, enable=False))


# ------------------------------------------------------------------------------------- state
def extra_state(trainer: Any) -> dict[str, Any]:
    """What torchtitan's checkpointer saves besides the model and the optimizer, this rank's: the
    trainer's ``state_dict()`` (``step``, ``ntokens_seen``), the data loader's (its position) and the
    LR schedulers' (``last_epoch``).  AccelPact saves it with every checkpoint and keeps it at every
    committed boundary for a discard."""
    return {"train_state": trainer.state_dict(), "dataloader": trainer.dataloader.state_dict(),
            "lr_scheduler": trainer.lr_schedulers.state_dict()}


def load_extra_state(trainer: Any, state: Mapping[str, Any]) -> None:
    """Set the trainer, its data loader and its LR schedulers from :func:`extra_state`'s value."""
    missing = [k for k in EXTRA_STATES if k not in state]
    if missing:
        raise ApiError(f"torchtitan: the saved extra state has no {missing} (keys {sorted(state)}): a checkpoint of "
                       "another program?")
    trainer.load_state_dict(state["train_state"])
    trainer.dataloader.load_state_dict(state["dataloader"])
    trainer.lr_schedulers.load_state_dict(state["lr_scheduler"])


#: state-dict hooks that rename a module's keys to names that are no attribute of the module: torchtitan's
#: ``FusedQKVLinear`` saves its fused ``wqkv`` as the stock ``wq``/``wk``/``wv`` (gathering it whole
#: first) and merges them back on load
KEY_RENAMING_HOOKS: frozenset[str] = frozenset({"_split_qkv_on_save", "_merge_qkv_on_load"})


def checkpointable(model: Any) -> int:
    """Make ``model``'s state dict one that torch's ``get_state_dict``/``set_state_dict`` (what
    AccelPact's DCP checkpoints use) can resolve: every key the name of a parameter or buffer.  The
    hooks of :data:`KEY_RENAMING_HOOKS` are removed from the model (its checkpoints then hold the
    fused ``wqkv`` as it is trained, in AccelPact's format, not torchtitan's), and a key still
    unresolvable is an :class:`ApiError` at attach (``get_model_state_dict`` tried once: FSDP2's state
    dict runs no collective) rather than at the first checkpoint.
    Returns how many hooks were removed."""
    removed = 0
    for module in model.modules():
        for table in (module._state_dict_hooks, module._load_state_dict_pre_hooks):
            for key, hook in list(table.items()):
                if getattr(getattr(hook, "hook", hook), "__name__", "") in KEY_RENAMING_HOOKS:
                    del table[key]
                    removed += 1
    try:
        get_model_state_dict(model)
    except AttributeError as exc:
        raise ApiError(f"torchtitan: the model's state dict has a key that names no submodule (a state-dict hook renamed "
                       f"it): torch's get_state_dict, which AccelPact's checkpoints use, cannot save it ({exc})") from None
    return removed


# ------------------------------------------------------------------------------------- meshes
def _group(job: Session, kind: str) -> Any:
    """The job's current group of ``kind`` (R from the engine once attached: a repair replaces it)."""
    return {"replicate": lambda: job.replicate_group, "shard": lambda: job.shard_group,
            "world": lambda: job.world_group}[kind]()


class DataParallelMeshes:
    """torchtitan's data-parallel meshes laid over the job's current groups (:data:`DP_AXES`, and
    ``world``: every rank), one per tuple of axis names, built again when the job's groups are no
    longer those a mesh was built on (an episode rebuilt them).  Each is checked against the layout
    torchtitan's own ``ParallelDims.build_mesh`` gives the same axes (:func:`torchtitan_coordinate`):
    this rank at the same coordinates, so the data each rank reads and the layout FSDP2 shards by
    are torchtitan's."""

    def __init__(self, job: Session) -> None:
        self.job = job
        self._built: dict[tuple[str, ...], tuple[tuple[Any, ...], DeviceMesh]] = {}

    def mesh(self, names: tuple[str, ...]) -> DeviceMesh:
        kinds = [DP_AXES.get(n, "world" if n == "world" else "") for n in names]
        if "" in kinds:
            raise ApiError(f"torchtitan: mesh {list(names)}: only the data-parallel axes {sorted(DP_AXES)} are laid over "
                           "the job's groups")
        groups = tuple(_group(self.job, k) for k in kinds)
        built = self._built.get(names)
        if built is not None and all(a is b for a, b in zip(built[0], groups, strict=True)):
            return built[1]
        device = self.job.device.type
        if len(names) == 1:
            mesh = DeviceMesh.from_group(groups[0], device, mesh_dim_names=names)
        elif kinds == ["replicate", "shard"]:
            mesh = DeviceMesh.from_group(list(groups), device, mesh=self.job.topology.mesh_ranks(), mesh_dim_names=names)
        else:
            raise ApiError(f"torchtitan: mesh {list(names)}: only one axis, or (replicate, shard) in that order, can be "
                           "laid over the job's groups")
        want = torchtitan_coordinate(names, self.job.rank, self.job.replicas, self.job.world // self.job.replicas)
        got = tuple(mesh.get_coordinate() or ())
        if got != want:
            raise ApiError(f"torchtitan: mesh {list(names)}: the job's groups put rank {self.job.rank} at {got}, "
                           f"torchtitan's layout at {want}")
        self._built[names] = (groups, mesh)
        return mesh


def torchtitan_coordinate(names: tuple[str, ...], rank: int, replicas: int, shards: int) -> tuple[int, ...]:
    """Where torchtitan 0.3.0's ``ParallelDims.build_mesh`` puts ``rank`` on the axes ``names`` under
    pure data parallelism: it unflattens the world row-major as (pp, dp_replicate, dp_shard/fsdp, cp,
    tp), so the replicate index is ``rank // shards`` and the shard index ``rank % shards``; the axes
    over every data-parallel rank (``batch``, ``loss``, ``dp``, ``world``) index it by ``rank``."""
    at = {"replicate": rank // shards, "shard": rank % shards, "world": rank}
    return tuple(at[DP_AXES.get(n, "world")] for n in names)


class AccelPactParallelDimsMixin(_Base):
    """torchtitan's ``ParallelDims`` whose every mesh is over the job's groups (:class:`DataParallelMeshes`),
    and which builds no process group of its own: torchtitan's ``build_mesh`` would build a group per
    axis, the degree-1 ones on the ``fake`` backend, and AccelPact lets no step commit beside a group
    whose failures it cannot read, nor keep a group an episode does not rebuild.  Its meshes, by axis:

    * ``world`` (:attr:`world_mesh`) and the data-parallel axes (:data:`DP_AXES`): the job's groups;
    * the other axes (``pp``, ``cp``, ``tp``, ``ep``, ``efsdp``) are of degree 1 here (:func:`check_config`):
      none, as torchtitan's ``get_optional_mesh`` answers for a disabled axis.

    ``accelpact_meshes`` is set by the trainer right after construction."""

    accelpact_meshes: "DataParallelMeshes | None" = None

    def _accelpact_degrees(self) -> dict[str, int]:
        """Every axis torchtitan's ``ParallelDims`` knows, with its degree (as its ``_validate_meshes``)."""
        dp = self.dp_replicate * self.dp_shard
        return {"pp": self.pp, "batch": dp, "loss": dp * self.cp, "dp_replicate": self.dp_replicate, "cp": self.cp,
                "tp": self.tp, "ep": self.ep, "efsdp": self.dp_shard * self.cp * self.tp // self.ep,
                "fsdp": self.dp_shard * self.cp, "dp_shard": self.dp_shard, "dp": dp}

    def _accelpact(self) -> DataParallelMeshes:
        if self.accelpact_meshes is None:
            raise ApiError("torchtitan: AccelPactParallelDims has no job yet (AccelPactTrainer.init_distributed sets it)")
        return self.accelpact_meshes

    def build_mesh(self) -> DeviceMesh:
        """No group is built: the world mesh over the job's world group."""
        return self._accelpact().mesh(("world",))

    @property
    def world_mesh(self) -> DeviceMesh:
        return self._accelpact().mesh(("world",))

    def get_optional_mesh(self, dims: Any, *, include_singleton_axes: bool = False) -> Any:
        """torchtitan's answer (None for a disabled axis, a ``ValueError`` for an unknown one), the mesh
        over the job's groups."""
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        degrees = self._accelpact_degrees()
        unknown = [n for n in names if n not in degrees]
        if unknown:
            raise ValueError(f"Invalid mesh dim: {unknown}. Valid dimensions are: {list(degrees)}")
        if not include_singleton_axes and any(not self._mesh_exist(n, degrees[n]) for n in names):
            return None
        other = [n for n in names if n not in DP_AXES]
        if other:
            raise ApiError(f"torchtitan: mesh {list(names)}: axes {other} have no mesh under AccelPact (pure data "
                           "parallelism: their degree is 1)")
        return self._accelpact().mesh(names)

    def get_activated_mesh(self, axes: list[str]) -> Any:
        active = [a for a in axes if a in DP_AXES and self.get_optional_mesh(a) is not None]
        return self.get_optional_mesh(active) if active else None

    def get_all_one_dimensional_meshes(self) -> dict[str, DeviceMesh]:
        degrees = self._accelpact_degrees()
        return {n: self._accelpact().mesh((n,)) for n in DP_AXES if degrees[n] > 1 and self._mesh_exist(n, degrees[n])}


# ------------------------------------------------------------------------------------- the trainer
class AccelPactTrainerMixin(_Base):
    """torchtitan's ``Trainer`` with AccelPact's three calls (module doc).  ``AccelPactTrainer(config,
    **settings)``: ``settings`` are :func:`accelpact.init`'s (``backend``, ``deadline_s``,
    ``collective_timeout_s``, ``trace_dir``, ...; ``replicas`` is torchtitan's
    ``parallelism.data_parallel_replicate_degree``); ``job``: a session :func:`accelpact.init` already
    built (else this builds it); ``hooks``: a function of the job returning the test hooks
    (``lambda job: fault_hooks(job, fault)``), None for none; ``trace_header``: as ``attach`` takes it;
    ``rebuild``: how a step aborted by a communicator failure in forward or backward is discarded:
    False, on the same FSDP2 wrapper (``FSDPModule.reset_iter_state``, torch 2.13); True, on a model
    built anew by torchtitan's own building code (:meth:`_accelpact_rebuild`, ``attach(rebuild=...)``),
    into which AccelPact moves the committed state; None (the default): in place where this torch can,
    else rebuilt.  After construction ``accelpact_job`` is the session and ``accelpact_run`` the
    attached training."""

    accelpact_job: Session
    accelpact_run: Any

    def __init__(self, config: Any, *, job: Session | None = None, hooks: Callable[[Session], Any] | None = None,
                 trace_header: Mapping[str, Any] | None = None, rebuild: bool | None = None, **settings: Any) -> None:
        if "replicas" in settings:
            raise ApiError("torchtitan: replicas= is parallelism.data_parallel_replicate_degree; set that instead")
        check_config(config, spares=int(settings.get("spares") or 0))
        plan = checkpoint_plan(config)
        self._accelpact_given = (job, settings)
        self._accelpact_rebuild_mode = rebuild
        self._accelpact_rebuilt = False
        self._accelpact_loss: Any = None
        self._accelpact_finished = False
        super().__init__(without_torchtitan_checkpointer(config))
        self.accelpact_plan = plan
        self.accelpact_run = self._accelpact_attach(hooks, trace_header)

    # ---- init: the job's groups, torchtitan's meshes over them ---------------------------------
    def init_distributed(self) -> Any:
        """``accelpact.init`` where torchtitan calls ``init_process_group``; ``ParallelDims`` from
        torchtitan's config, its data-parallel meshes over the job's groups."""
        config = self.config
        job, settings = self._accelpact_given
        if job is None:
            job = init(replicas=config.parallelism.data_parallel_replicate_degree, **settings)
        if job.spare is not None or job.spares:
            raise ApiError(f"torchtitan: this job has {job.spares} spare(s): a hot swap is not supported with torchtitan "
                           "(AccelPactTrainer's doc says why)")
        self.accelpact_job = job
        # as torchtitan's own init_distributed: autograd's backward on the calling thread
        torch.autograd.set_multithreading_enabled(False)
        dims = self._accelpact_parallel_dims_class().from_config(config.parallelism, job.world)
        shards = job.world // job.replicas
        if (dims.dp_replicate, dims.dp_shard) != (job.replicas, shards):
            raise ApiError(f"torchtitan: parallelism dp_replicate={dims.dp_replicate} x dp_shard={dims.dp_shard} is not the "
                           f"job's {job.replicas} replica(s) x {shards} shard(s) of WORLD_SIZE={job.world}")
        dims.accelpact_meshes = DataParallelMeshes(job)
        return dims

    def _accelpact_parallel_dims_class(self) -> Any:
        """The ``ParallelDims`` class :meth:`init_distributed` builds: torchtitan's with
        :class:`AccelPactParallelDimsMixin` (a test of the mixins substitutes a fake of torchtitan's)."""
        return parallel_dims_class()

    def _accelpact_attach(self, hooks: Callable[[Session], Any] | None, trace_header: Mapping[str, Any] | None) -> Any:
        """``job.attach`` on what torchtitan built: its one model part (the FSDP2 root) and the one torch
        optimizer of its ``OptimizersContainer``."""
        parts = list(self.model_parts)
        if len(parts) != 1:
            raise ApiError(f"torchtitan: {len(parts)} model parts: AccelPact attaches one model (no pipeline parallelism)")
        optimizers = list(self.optimizers.optimizers)
        if len(optimizers) != 1:
            raise ApiError(f"torchtitan: {len(optimizers)} optimizers in the OptimizersContainer "
                           f"({[type(o).__name__ for o in optimizers]}): AccelPact attaches one; give every parameter "
                           "group the same optimizer")
        plan = self.accelpact_plan
        checkpointable(parts[0])
        mode = self._accelpact_rebuild_mode
        rebuild = self._accelpact_rebuild if mode or (mode is None and in_place_rebuild(parts[0]) is None) else None
        return self.accelpact_job.attach(parts[0], optimizers[0], checkpoint_dir=plan.directory,
                                         checkpoint_every=plan.every, checkpoint=plan.mode,
                                         extra_state=functools.partial(extra_state, self), rebuild=rebuild,
                                         hooks=hooks(self.accelpact_job) if hooks is not None else None,
                                         trace_header=trace_header)

    def _accelpact_rebuild(self, job: Session, extra: Any) -> tuple[Any, Any]:
        """``attach(rebuild=...)``: the model part, its optimizers and LR schedulers built anew on the
        job's current groups by torchtitan's own building code, in ``Trainer.__init__``'s order for one
        model part (``model_config.build()`` on the meta device in the training dtype,
        ``model_spec.parallelize_fn``, ``to_empty``, ``init_weights``, ``train()``;
        ``config.optimizer.build``, ``post_optimizer_build_fn``, ``config.lr_scheduler.build``), handed to
        the trainer (``model_parts``, ``optimizers``, ``lr_schedulers``, the metrics processor's and the
        chunked loss's references) and set from ``extra`` (the loader, the LR schedule and the counters
        at F).  Returns the FSDP2 root and its torch optimizer; AccelPact then moves the committed state
        (parameters, buffers, optimizer state and hyperparameters) into them and restores the RNG."""
        del job  # the meshes come from the job through ParallelDims (DataParallelMeshes: its current groups)
        config, spec = self.config, self.config.model_spec
        utils = importlib.import_module("torchtitan.tools.utils")
        dtypes = importlib.import_module("torchtitan.config").TORCH_DTYPE_MAP
        with torch.device("meta"), utils.set_default_dtype(dtypes[config.training.dtype]):
            model = self.model_config.build()
        model = spec.parallelize_fn(model, parallel_dims=self.parallel_dims, training=config.training,
                                    parallelism=config.parallelism, compile_config=config.compile,
                                    ac_config=config.activation_checkpoint, dump_folder=config.dump_folder)
        offload = config.training.enable_cpu_offload
        model.to_empty(device="cpu" if offload else self.device.type)
        with torch.no_grad():
            model.init_weights(buffer_device=torch.device(self.device.type) if offload else None)
        model.train()
        optimizers = config.optimizer.build(model_parts=[model])
        if spec.post_optimizer_build_fn is not None:
            spec.post_optimizer_build_fn(optimizers, [model], self.parallel_dims)
        self.model_parts, self.optimizers = [model], optimizers
        self.lr_schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=config.training.steps)
        self.metrics_processor.optimizers, self.metrics_processor.model_parts = optimizers, self.model_parts
        if callable(getattr(self.loss_fn, "set_lm_head", None)):  # ChunkedLossWrapper: the new model's head
            self.loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        checkpointable(model)
        if extra is not None:
            load_extra_state(self, extra)
        self._accelpact_rebuilt = True
        return model, optimizers.optimizers[0]

    # ---- the step ----------------------------------------------------------------------------
    def forward_backward_step(self, **kwargs: Any) -> Any:
        """torchtitan's, with the step's loss summed over its micro-batches for ``run.boundary``."""
        loss = super().forward_backward_step(**kwargs)
        part = loss.detach().clone()  # torchtitan's own note: a graph-owned output is overwritten by the next replay
        self._accelpact_loss = part if self._accelpact_loss is None else self._accelpact_loss + part
        return loss

    def _read_step_batches(self, data_iterator: Any) -> list[Any]:
        """The batches one ``train_step`` reads (gradient accumulation x pipeline micro-batches), read
        before the step opens: running out of data is then no failure inside ``run.step``."""
        n = self.gradient_accumulation_steps * self.num_pipeline_parallel_microbatches
        return [next(data_iterator) for _ in range(n)]

    def train(self) -> None:
        """torchtitan's training loop with the three calls (module doc); returns after
        ``training.steps`` steps, or when the data ran out (torchtitan's ``DataloaderExhaustedError``,
        raised before the step opens)."""
        exhausted = _dataloader_exhausted_error()
        run, config = self.accelpact_run, self.config
        if run.resumed_from is not None:  # an L2 restart: the loader, LR schedule and counters at the checkpoint
            load_extra_state(self, run.restored_extra)
        with config.profiler.build(global_step=run.start_step, base_folder=config.dump_folder) as profiler:
            data_iterator = self.batch_generator(self.dataloader)
            for step in run.steps(config.training.steps):
                self.step = step + 1  # torchtitan counts steps from 1; AccelPact's step s commits F = s + 1
                self.gc_handler.run(self.step)
                try:
                    batches = self._read_step_batches(data_iterator)
                except exhausted:
                    _log_warning("Ran out of data; last step was canceled.")
                    break
                self._accelpact_loss = None
                with run.step(step):
                    self.train_step(iter(batches))
                    # torchtitan zeroes the gradients as a step starts; the boundary needs them gone (its guard)
                    self.optimizers.zero_grad(set_to_none=True)
                if run.discarded:  # the loader (and the rest) back to F, the step again
                    if not self._accelpact_rebuilt:  # in place: from run.restored_extra (a rebuild set it from extra)
                        load_extra_state(self, run.restored_extra)
                    self._accelpact_rebuilt = False
                    data_iterator = self.batch_generator(self.dataloader)
                    continue
                run.boundary(self._accelpact_loss)  # repairs here; AccelPact's checkpoint when due
                if config.validator.enable and self.validator.should_validate(self.step):
                    self.validator.validate(self.model_parts, self.step)
                profiler.step()
        self._accelpact_finished = True

    def close(self) -> None:
        """torchtitan's close, then ``job.close()`` (collective: after a training that finished on every
        rank).  After a failure escaped :meth:`train` only torchtitan's part runs: the rank is failing."""
        try:
            super().close()
        finally:
            if self._accelpact_finished:
                self.accelpact_job.close()


def _dataloader_exhausted_error() -> type[BaseException]:
    """torchtitan's ``DataloaderExhaustedError`` (what its ``batch_generator`` raises at the end of data)."""
    return importlib.import_module("torchtitan.components.dataloader").DataloaderExhaustedError


def _log_warning(message: str) -> None:
    importlib.import_module("torchtitan.tools.logging").logger.warning(message)


# ------------------------------------------------------------------------------------- the classes
@functools.cache
def parallel_dims_class() -> type:
    """``AccelPactParallelDims``: torchtitan's ``ParallelDims`` with :class:`AccelPactParallelDimsMixin`."""
    base = importlib.import_module("torchtitan.distributed.parallel_dims").ParallelDims
    return type("AccelPactParallelDims", (AccelPactParallelDimsMixin, base), {"__module__": __name__})


@functools.cache
def trainer_class() -> type:
    """``AccelPactTrainer``: torchtitan's ``Trainer`` with :class:`AccelPactTrainerMixin`."""
    base = importlib.import_module("torchtitan.trainer").Trainer
    return type("AccelPactTrainer", (AccelPactTrainerMixin, base), {"__module__": __name__})


def __getattr__(name: str) -> Any:
    """``AccelPactTrainer`` and ``AccelPactParallelDims``, built (and torchtitan imported) on first use."""
    if name == "AccelPactTrainer":
        return trainer_class()
    if name == "AccelPactParallelDims":
        return parallel_dims_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
