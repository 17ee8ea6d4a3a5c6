"""Issue 44 item 5: ``accelpact.integrations.torchtitan`` against fakes of torchtitan 0.3.0's interfaces,
so that ``make test`` runs it without torchtitan (tests/test_torchtitan_train.py runs the real one).

The fakes have the attributes and signatures the adapter touches, read from torchtitan 0.3.0's source:
``Trainer`` (``torchtitan/trainer.py``: ``__init__(config)`` calling ``init_distributed()``,
``model_parts``, ``optimizers`` (``OptimizersContainer``: ``.optimizers``, ``step()``,
``zero_grad(set_to_none)``), ``lr_schedulers`` (``state_dict() -> {"last_epoch"}``), ``dataloader``
(stateful), ``gradient_accumulation_steps``, ``num_pipeline_parallel_microbatches``, ``step``,
``ntokens_seen``, ``state_dict``/``load_state_dict``, ``gc_handler.run(step)``,
``batch_generator(data_iterable)`` raising ``DataloaderExhaustedError``, ``train_step(data_iterator)``,
``forward_backward_step(*, input_dict, labels, global_valid_tokens)``, ``close()``), its ``Config``'s
``parallelism`` (``ParallelismConfig``), ``training``, ``checkpoint`` (``CheckpointManager.Config``),
``validator``, ``profiler.build(global_step, base_folder)`` and ``dump_folder``; ``ParallelDims``
(``torchtitan/distributed/parallel_dims.py``: the degrees, ``from_config``, ``_mesh_exist``); and the
modules ``torchtitan.components.dataloader`` (``DataloaderExhaustedError``) and
``torchtitan.tools.logging`` (``logger``).  AccelPact's side (``job.attach`` and the training it
returns) is faked too where a test is about the adapter's loop; the meshes are built for real over
the groups ``accelpact.init`` builds (2 gloo ranks).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.launch.api import ApiError  # noqa: E402 - after the torch skip
from accelpact.integrations import torchtitan as tt  # noqa: E402 - after the torch skip


# ------------------------------------------------------------------------------------- torchtitan's fakes
class DataloaderExhaustedError(Exception):
    """torchtitan.components.dataloader.DataloaderExhaustedError"""


@pytest.fixture(autouse=True)
def fake_torchtitan_modules(monkeypatch):
    """The two torchtitan modules the adapter imports by name, as fakes."""
    dataloader = types.ModuleType("torchtitan.components.dataloader")
    dataloader.DataloaderExhaustedError = DataloaderExhaustedError
    logging_ = types.ModuleType("torchtitan.tools.logging")
    logging_.logger = types.SimpleNamespace(warning=lambda msg: None)
    utils = types.ModuleType("torchtitan.tools.utils")
    utils.set_default_dtype = lambda dtype: contextlib.nullcontext()
    config = types.ModuleType("torchtitan.config")
    config.TORCH_DTYPE_MAP = {"float32": torch.float32}
    for name, mod in (("torchtitan", types.ModuleType("torchtitan")), ("torchtitan.components", types.ModuleType("c")),
                      ("torchtitan.components.dataloader", dataloader), ("torchtitan.tools", types.ModuleType("t")),
                      ("torchtitan.tools.logging", logging_), ("torchtitan.tools.utils", utils), ("torchtitan.config", config)):
        monkeypatch.setitem(sys.modules, name, mod)


@dataclass
class ParallelismConfig:
    data_parallel_replicate_degree: int = 2
    data_parallel_shard_degree: int = -1
    context_parallel_degree: int = 1
    tensor_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    spmd_backend: str = "partial_dtensor"


@dataclass
class CheckpointConfig:  # CheckpointManager.Config
    enable: bool = False
    folder: str = "checkpoint"
    interval: int = 500
    async_mode: str = "disabled"
    initial_load_path: str | None = None
    create_seed_checkpoint: bool = False
    load_only: bool = False
    load_step: int = -1
    exclude_from_loading: list = field(default_factory=list)
    last_save_in_hf: bool = False
    enable_first_step_checkpoint: bool = False
    keep_latest_k: int = 10


@dataclass
class TrainingConfig:
    steps: int = 5
    disable_cuda_graphs: bool = False
    dtype: str = "float32"
    enable_cpu_offload: bool = False


@dataclass
class ValidatorConfig:
    enable: bool = False


class Profiler:
    def __init__(self, log: list) -> None:
        self.log = log

    def step(self) -> None:
        self.log.append("profiler.step")


@dataclass
class ProfilerConfig:
    log: list = field(default_factory=list)

    @contextlib.contextmanager
    def build(self, *, global_step: int = 0, base_folder: str = ""):
        self.log.append(f"profiler@{global_step}")
        yield Profiler(self.log)


class Model(torch.nn.Module):
    """A model part as torchtitan builds it: built on the meta device, then ``to_empty`` and ``init_weights``."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(1, 1)

    def forward(self, x):
        return self.lm_head(x)

    def init_weights(self, buffer_device=None) -> None:
        torch.nn.init.normal_(self.lm_head.weight)
        torch.nn.init.zeros_(self.lm_head.bias)


@dataclass
class ModelSpec:
    log: list = field(default_factory=list)
    post_optimizer_build_fn: Any = None

    def parallelize_fn(self, model, *, parallel_dims, training, parallelism, compile_config, ac_config, dump_folder):
        self.log.append(("parallelize", parallel_dims))
        return model


@dataclass
class ModelConfig:
    def build(self) -> Model:
        return Model()


@dataclass
class OptimizerConfig:  # OptimizersContainer.Config
    log: list = field(default_factory=list)

    def build(self, *, model_parts):
        return OptimizersContainer([torch.optim.SGD(model_parts[0].parameters(), lr=0.1)], self.log)


@dataclass
class LRSchedulerConfig:
    def build(self, *, optimizers, training_steps):
        return LRSchedulers()


@dataclass
class Config:  # Trainer.Config
    dump_folder: str = "./outputs"
    model_spec: ModelSpec = field(default_factory=ModelSpec)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr_scheduler: LRSchedulerConfig = field(default_factory=LRSchedulerConfig)
    compile: Any = None
    activation_checkpoint: Any = None
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    validator: ValidatorConfig = field(default_factory=ValidatorConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self) -> None:  # one log of what happened, in order
        self.optimizer.log = self.model_spec.log = self.profiler.log


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    world_size: int
    spmd_backend: str = "partial_dtensor"

    @classmethod
    def from_config(cls, parallelism_config: ParallelismConfig, world_size: int) -> "ParallelDims":
        p = parallelism_config
        return cls(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                   cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                   ep=p.expert_parallel_degree, world_size=world_size, spmd_backend=p.spmd_backend)

    def __post_init__(self) -> None:
        if self.dp_shard < 0:
            self.dp_shard = self.world_size // (self.dp_replicate * self.cp * self.tp * self.pp)

    def _mesh_exist(self, name: str, degree: int) -> bool:  # 0.3.0's rule
        if name == "fsdp":
            return True
        if name == "dp_shard" and self.spmd_backend in ("full_dtensor", "spmd_types"):
            return True
        if name == "efsdp":
            return self.ep > 1
        return degree > 1


class Loader:
    """A stateful data loader: batch i is ``({"input": [i]}, [i])``; ``state_dict``/``load_state_dict`` its position."""

    def __init__(self, n: int, log: list) -> None:
        self.n, self.pos, self.log = n, 0, log

    def __iter__(self):
        while self.pos < self.n:
            i = self.pos
            self.pos += 1
            self.log.append(f"read {i}")
            yield {"input": torch.tensor([float(i)])}, torch.tensor([float(i)])

    def state_dict(self) -> dict:
        return {"dp_rank_0": self.pos, "world_size": 1}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["dp_rank_0"]


class LRSchedulers:
    def __init__(self) -> None:
        self.last_epoch = 0

    def step(self) -> None:
        self.last_epoch += 1

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = state["last_epoch"]


class OptimizersContainer:
    def __init__(self, optimizers: list, log: list) -> None:
        self.optimizers, self.log = optimizers, log

    def step(self) -> None:
        self.log.append("optimizers.step")
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.log.append(f"zero_grad({set_to_none})")
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


class Trainer:
    """torchtitan's ``Trainer``, what the adapter touches of it (module doc)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.log: list = config.profiler.log
        self.parallel_dims = self.init_distributed()
        self.device = torch.device("cpu")
        self.model_config = ModelConfig()
        self.model_parts = [self.model_config.build()]
        self.optimizers = config.optimizer.build(model_parts=self.model_parts)
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers, training_steps=config.training.steps)
        self.metrics_processor = types.SimpleNamespace(optimizers=self.optimizers, model_parts=self.model_parts)
        self.loss_fn = types.SimpleNamespace(lm_head=None)
        self.loss_fn.set_lm_head = lambda head: setattr(self.loss_fn, "lm_head", head)
        self.dataloader = Loader(getattr(config, "batches", 100), self.log)
        self.gradient_accumulation_steps = getattr(config, "accumulation", 1)
        self.num_pipeline_parallel_microbatches = 1
        self.gc_handler = types.SimpleNamespace(run=lambda step: None)
        self.validator = None
        self.step = 0
        self.ntokens_seen = 0
        self.closed = False
        self.losses: list = []

    def init_distributed(self) -> Any:
        raise AssertionError("the adapter replaces init_distributed")

    def state_dict(self) -> dict:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step, self.ntokens_seen = state_dict["step"], state_dict["ntokens_seen"]

    def batch_generator(self, data_iterable):
        it = iter(data_iterable)
        while True:
            try:
                batch = next(it)
            except StopIteration as ex:
                raise DataloaderExhaustedError() from ex
            yield batch

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> Any:
        self.ntokens_seen += labels.numel()
        self.log.append(f"fwd-bwd {int(labels[0])}")
        loss = (self.model_parts[0](input_dict["input"].view(1, 1)) - labels).pow(2).sum()
        loss.backward()
        self.losses.append(float(loss.detach()))
        return loss

    def train_step(self, data_iterator) -> None:
        self.optimizers.zero_grad(set_to_none=self.config.training.disable_cuda_graphs)
        batches = [next(data_iterator) for _ in range(self.gradient_accumulation_steps)]
        for input_dict, labels in batches:
            self.forward_backward_step(input_dict=input_dict, labels=labels, global_valid_tokens=torch.tensor(1))
        self.optimizers.step()
        self.lr_schedulers.step()

    def close(self) -> None:
        self.closed = True


class FakeRun:
    """AccelPact's ``Training`` as the loop sees it: ``steps``, ``step``, ``boundary``, ``discarded``,
    ``restored_extra``, ``start_step``, ``resumed_from``.  It keeps ``extra_state()`` at every boundary
    (and at attach), as the engine does, and discards the steps in ``discard`` once each."""

    def __init__(self, log: list, extra_state: Any, *, start: int = 0, restored: Any = None, discard: tuple = (),
                 rebuild: Any = None, job: Any = None) -> None:
        self.log, self.extra_state, self.discard, self.rebuild, self.job = log, extra_state, set(discard), rebuild, job
        self.start_step, self.resumed_from, self.restored_extra = start, (start if restored is not None else None), restored
        self.frontier, self.discarded, self.losses = start, False, []
        self.kept = copy.deepcopy(restored) if restored is not None else copy.deepcopy(extra_state())

    def steps(self, total: int):
        while self.frontier < total:
            yield self.frontier

    @contextlib.contextmanager
    def step(self, step: int):
        assert step == self.frontier
        self.log.append(f"step {step} opens")
        yield self
        self.log.append(f"step {step} closes")
        self.discarded = step in self.discard
        if self.discarded:
            self.discard.discard(step)
            if self.rebuild is not None:  # the engine: rebuild(job, extra at F), then the state moved in
                self.log.append(f"rebuild at {step}")
                self.rebuild(self.job, copy.deepcopy(self.kept))
            else:  # in place: the extra state at F handed back in run.restored_extra
                self.restored_extra = copy.deepcopy(self.kept)

    def boundary(self, loss: Any) -> None:
        self.log.append(f"boundary {self.frontier}")
        self.losses.append(float(loss.detach()))
        self.frontier += 1
        self.kept = copy.deepcopy(self.extra_state())


class FakeJob:
    def __init__(self, world: int = 2, replicas: int = 2, **run_kwargs: Any) -> None:
        self.world, self.replicas, self.rank, self.spare, self.spares = world, replicas, 0, None, 0
        self.device = torch.device("cpu")
        self.run_kwargs, self.attached, self.closed = run_kwargs, None, 0

    def attach(self, model, optimizer, **kwargs):
        self.attached = (model, optimizer, kwargs)
        trainer = kwargs["extra_state"].args[0]  # functools.partial(extra_state, trainer)
        return FakeRun(trainer.log, kwargs["extra_state"], rebuild=kwargs["rebuild"], job=self, **self.run_kwargs)

    def close(self) -> None:
        self.closed += 1


class FakeMeshes:
    """Stands in for :class:`DataParallelMeshes`: records each request."""

    def __init__(self) -> None:
        self.asked: list = []

    def mesh(self, names):
        self.asked.append(tuple(names))
        return ("mesh", tuple(names))


class TitanTrainer(tt.AccelPactTrainerMixin, Trainer):
    """``AccelPactTrainer`` over the fake ``Trainer``, its ``ParallelDims`` over the fake one."""

    def _accelpact_parallel_dims_class(self) -> type:
        return type("Dims", (tt.AccelPactParallelDimsMixin, ParallelDims), {})



def make(config: Config | None = None, rebuild: bool | None = False, **run_kwargs: Any) -> TitanTrainer:
    config = config or Config()
    job = FakeJob(**run_kwargs)
    return TitanTrainer(config, job=job, rebuild=rebuild)


def checkpoints_on(**kw: Any) -> Config:
    return Config(checkpoint=CheckpointConfig(enable=True, interval=2, **kw), dump_folder="/tmp/out")


# ------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("setting, value, says", [
    ("pipeline_parallel_degree", 2, "PP must be 1"), ("tensor_parallel_degree", 2, "TP must be 1"),
    ("context_parallel_degree", 2, "CP must be 1"), ("expert_parallel_degree", 2, "EP must be 1"),
    ("spmd_backend", "spmd_types", "partial_dtensor"), ("spmd_backend", "full_dtensor", "partial_dtensor"),
])
def test_check_config_refuses_parallelisms_it_does_not_recover(setting, value, says):
    config = Config()
    setattr(config.parallelism, setting, value)
    with pytest.raises(ApiError, match=f"parallelism.{setting}") as err:
        tt.check_config(config, cuda=False)
    assert says in str(err.value)


def test_check_config_refuses_spares_and_cuda_graphs():
    with pytest.raises(ApiError, match="spares=1: a hot swap is not supported"):
        tt.check_config(Config(), spares=1, cuda=False)
    with pytest.raises(ApiError, match="disable_cuda_graphs"):
        tt.check_config(Config(), cuda=True)
    tt.check_config(Config(training=TrainingConfig(disable_cuda_graphs=True)), cuda=True)
    tt.check_config(Config(), cuda=False)  # on CPU torchtitan captures no graph: nothing to refuse


@pytest.mark.parametrize("option, value", [
    ("initial_load_path", "/hf/llama"), ("create_seed_checkpoint", True), ("load_only", True), ("load_step", 10),
    ("exclude_from_loading", ["dataloader"]), ("last_save_in_hf", True), ("enable_first_step_checkpoint", True),
])
def test_checkpoint_options_without_a_counterpart_are_named(option, value):
    with pytest.raises(ApiError, match=f"checkpoint.{option}="):
        tt.checkpoint_plan(checkpoints_on(**{option: value}))
    # off, they are not looked at (torchtitan's checkpointer is off too)
    off = checkpoints_on(**{option: value})
    off.checkpoint.enable = False
    assert tt.checkpoint_plan(off) == tt.CheckpointPlan(None, 0, "sync")


def test_checkpoint_plan_maps_torchtitans_settings():
    assert tt.checkpoint_plan(Config()) == tt.CheckpointPlan(None, 0, "sync")
    assert tt.checkpoint_plan(checkpoints_on()) == tt.CheckpointPlan("/tmp/out/checkpoint", 2, "sync")
    for mode in ("async", "async_with_pinned_mem"):
        assert tt.checkpoint_plan(checkpoints_on(async_mode=mode)).mode == "async"
    with pytest.raises(ApiError, match="local or shared file system"):
        tt.checkpoint_plan(checkpoints_on(folder="s3://bucket/ckpt"))


def test_torchtitans_checkpointer_is_built_disabled_and_the_users_config_is_kept():
    config = checkpoints_on()
    trainer = make(config)
    assert trainer.config.checkpoint.enable is False and config.checkpoint.enable is True
    _model, _optim, kwargs = trainer.accelpact_job.attached
    assert (kwargs["checkpoint_dir"], kwargs["checkpoint_every"], kwargs["checkpoint"]) == ("/tmp/out/checkpoint", 2, "sync")


def test_attach_gets_the_one_model_part_and_the_one_torch_optimizer():
    trainer = make()
    model, optim, kwargs = trainer.accelpact_job.attached
    assert model is trainer.model_parts[0] and optim is trainer.optimizers.optimizers[0]
    assert kwargs["extra_state"]() == tt.extra_state(trainer)


def test_several_model_parts_or_optimizers_are_refused():
    trainer = make()
    trainer.model_parts.append(torch.nn.Linear(1, 1))
    with pytest.raises(ApiError, match="2 model parts"):
        trainer._accelpact_attach(None, None)
    trainer.model_parts.pop()
    trainer.optimizers.optimizers.append(torch.optim.SGD(trainer.model_parts[0].parameters(), lr=1.0))
    with pytest.raises(ApiError, match="2 optimizers"):
        trainer._accelpact_attach(None, None)


def test_replicas_come_from_torchtitans_parallelism():
    with pytest.raises(ApiError, match="data_parallel_replicate_degree"):
        TitanTrainer(Config(), job=FakeJob(), replicas=2)
    with pytest.raises(ApiError, match="dp_replicate=1 x dp_shard=2 is not the job's 2 replica"):
        make(Config(parallelism=ParallelismConfig(data_parallel_replicate_degree=1)))


# ------------------------------------------------------------------------------------- state
def test_extra_state_is_torchtitans_checkpointer_states_and_round_trips():
    trainer = make()
    trainer.step, trainer.ntokens_seen, trainer.dataloader.pos, trainer.lr_schedulers.last_epoch = 3, 30, 6, 3
    saved = copy.deepcopy(tt.extra_state(trainer))
    assert set(saved) == set(tt.EXTRA_STATES) == {"train_state", "dataloader", "lr_scheduler"}
    trainer.step, trainer.ntokens_seen, trainer.dataloader.pos, trainer.lr_schedulers.last_epoch = 9, 90, 18, 9
    tt.load_extra_state(trainer, saved)
    assert (trainer.step, trainer.ntokens_seen, trainer.dataloader.pos, trainer.lr_schedulers.last_epoch) == (3, 30, 6, 3)
    with pytest.raises(ApiError, match=r"no \['dataloader'\]"):
        tt.load_extra_state(trainer, {"train_state": saved["train_state"], "lr_scheduler": saved["lr_scheduler"]})


# ------------------------------------------------------------------------------------- the loop
def _fault_free(steps: int = 5, **config_kw: Any) -> TitanTrainer:
    config = Config(training=TrainingConfig(steps=steps))
    for k, v in config_kw.items():
        setattr(config, k, v)
    trainer = make(config)
    trainer.train()
    return trainer


def test_the_loop_reads_the_batches_then_steps_then_closes_at_the_boundary():
    trainer = _fault_free(steps=2)
    log = [x for x in trainer.log if not x.startswith("profiler@")]
    assert log == ["read 0", "step 0 opens", "zero_grad(False)", "fwd-bwd 0", "optimizers.step", "zero_grad(True)",
                   "step 0 closes", "boundary 0", "profiler.step",
                   "read 1", "step 1 opens", "zero_grad(False)", "fwd-bwd 1", "optimizers.step", "zero_grad(True)",
                   "step 1 closes", "boundary 1", "profiler.step"], log
    run = trainer.accelpact_run
    assert trainer.step == 2 and run.frontier == 2
    trainer.close()
    assert trainer.closed and trainer.accelpact_job.closed == 1


def test_the_boundary_gets_the_sum_of_the_steps_micro_batch_losses():
    config = Config(training=TrainingConfig(steps=2))
    config.accumulation = 2  # gradient accumulation: two forward-backward passes a step
    trainer = make(config)
    trainer.train()
    assert [x for x in trainer.log if x.startswith("read")] == ["read 0", "read 1", "read 2", "read 3"]
    a, b, c, d = trainer.losses
    assert trainer.accelpact_run.losses == pytest.approx([a + b, c + d])


def test_a_discarded_step_rewinds_the_loader_schedule_and_counters_and_comes_again():
    reference = _fault_free(steps=5)
    trainer = make(Config(training=TrainingConfig(steps=5)), discard=(2,))
    trainer.train()
    reads = [x for x in trainer.log if x.startswith("read")]
    assert reads == ["read 0", "read 1", "read 2", "read 2", "read 3", "read 4"], reads
    # torchtitan's state as the fault-free run's (the parameters at F are the engine's part, not faked here)
    assert tt.extra_state(trainer) == tt.extra_state(reference)


def test_a_discard_by_rebuild_builds_with_torchtitans_code_and_hands_the_trainer_the_new_parts():
    reference = _fault_free(steps=5)
    trainer = make(Config(training=TrainingConfig(steps=5)), rebuild=True, discard=(2,))
    old_model, old_optim = trainer.model_parts[0], trainer.optimizers.optimizers[0]
    assert trainer.accelpact_job.attached[2]["rebuild"] == trainer._accelpact_rebuild
    trainer.train()
    reads = [x for x in trainer.log if isinstance(x, str) and x.startswith(("read", "rebuild"))]
    assert reads == ["read 0", "read 1", "read 2", "rebuild at 2", "read 2", "read 3", "read 4"], reads
    assert tt.extra_state(trainer) == tt.extra_state(reference)
    model, optim = trainer.model_parts[0], trainer.optimizers.optimizers[0]
    assert model is not old_model and optim is not old_optim
    assert [p for g in optim.param_groups for p in g["params"]] == list(model.parameters())
    assert trainer.metrics_processor.model_parts == [model] and trainer.metrics_processor.optimizers is trainer.optimizers
    assert trainer.loss_fn.lm_head is model.lm_head and model._skip_lm_head is True
    assert ("parallelize", trainer.parallel_dims) in trainer.log


def test_rebuild_default_follows_what_the_wrapper_can_reset_in_place():
    # a plain module cannot reset an aborted step in place (no FSDP2): the default discards by rebuilding
    assert make(rebuild=None).accelpact_job.attached[2]["rebuild"] is not None
    assert make(rebuild=False).accelpact_job.attached[2]["rebuild"] is None


def test_an_l2_restart_starts_from_the_checkpoint_with_torchtitans_state():
    reference = _fault_free(steps=5)
    at_two = _fault_free(steps=2)
    saved = copy.deepcopy(tt.extra_state(at_two))
    trainer = make(Config(training=TrainingConfig(steps=5)), start=2, restored=saved)
    trainer.train()
    reads = [x for x in trainer.log if x.startswith("read")]
    assert reads == ["read 2", "read 3", "read 4"], reads
    assert tt.extra_state(trainer) == tt.extra_state(reference)
    assert "profiler@2" in trainer.log


def test_running_out_of_data_ends_training_outside_a_step():
    config = Config(training=TrainingConfig(steps=5))
    config.batches = 3
    trainer = make(config)
    trainer.train()
    assert [x for x in trainer.log if x.startswith(("step", "boundary"))][-2:] == ["step 2 closes", "boundary 2"]
    assert "step 3 opens" not in trainer.log
    trainer.close()
    assert trainer.accelpact_job.closed == 1


def test_close_after_a_failed_training_does_not_run_the_collective_close():
    trainer = make(Config(training=TrainingConfig(steps=3)))
    trainer.train_step = lambda it: (_ for _ in ()).throw(RuntimeError("a bug in the step"))
    with pytest.raises(RuntimeError, match="a bug"):
        trainer.train()
    trainer.close()
    assert trainer.closed and trainer.accelpact_job.closed == 0


# ------------------------------------------------------------------------------------- meshes
def test_parallel_dims_answer_the_jobs_meshes_for_data_parallel_axes():
    trainer = make()
    dims = trainer.parallel_dims
    dims.accelpact_meshes = meshes = FakeMeshes()
    assert (dims.dp_replicate, dims.dp_shard) == (2, 1)
    assert dims.get_optional_mesh(["dp_replicate", "fsdp"]) == ("mesh", ("dp_replicate", "fsdp"))
    assert dims.get_optional_mesh("batch") == ("mesh", ("batch",))
    assert dims.get_optional_mesh("loss") == ("mesh", ("loss",))
    assert dims.world_mesh == ("mesh", ("world",)) and dims.build_mesh() == ("mesh", ("world",))
    for disabled in ("pp", "cp", "tp", "ep", "efsdp", "dp_shard"):  # degree 1 (dp_shard: partial_dtensor)
        assert dims.get_optional_mesh(disabled) is None, disabled
    assert dims.get_optional_mesh(["dp_replicate", "tp"]) is None
    with pytest.raises(ApiError, match=r"axes \['tp'\] have no mesh"):
        dims.get_optional_mesh("tp", include_singleton_axes=True)
    with pytest.raises(ValueError, match="Invalid mesh dim"):
        dims.get_optional_mesh("nope")
    assert dims.get_activated_mesh(["dp_replicate", "dp_shard", "cp", "tp"]) == ("mesh", ("dp_replicate",))
    assert set(dims.get_all_one_dimensional_meshes()) == {"dp_replicate", "batch", "loss", "dp"}
    assert meshes.asked


@pytest.mark.parametrize("replicas, shards", [(2, 1), (1, 2), (2, 2), (3, 2)])
def test_the_coordinates_are_torchtitans_row_major_unflatten(replicas, shards):
    """torchtitan's build_mesh unflattens the world row-major as (pp, dp_replicate, dp_shard, cp, tp)
    (its docstring); torch's own reshape of arange(W) gives each rank's place independently."""
    layout = torch.arange(replicas * shards).reshape(1, replicas, shards, 1, 1)
    for rank in range(replicas * shards):
        _pp, r, s, _cp, _tp = (int(i[0]) for i in torch.nonzero(layout == rank, as_tuple=True))
        assert tt.torchtitan_coordinate(("dp_replicate", "fsdp"), rank, replicas, shards) == (r, s)
        assert tt.torchtitan_coordinate(("dp_shard",), rank, replicas, shards) == (s,)
        assert tt.torchtitan_coordinate(("batch",), rank, replicas, shards) == (r * shards + s,)


def _meshes_on_real_groups(ctx: Any) -> dict:
    """A rank: accelpact.init (2 replicas), the meshes over its groups, a collective on each."""
    import accelpact
    import torch.distributed as dist

    job = accelpact.init(backend="gloo", replicas=2, detect=False)
    meshes = tt.DataParallelMeshes(job)
    out = {}
    for names in (("dp_replicate", "fsdp"), ("batch",), ("loss",), ("world",), ("fsdp",)):
        mesh = meshes.mesh(names)
        assert meshes.mesh(names) is mesh  # the same groups: the same mesh
        t = torch.ones(1)
        dist.all_reduce(t, group=mesh.get_group(0))
        out[names] = (tuple(mesh.shape), tuple(mesh.get_coordinate()), float(t[0]), tuple(mesh.mesh_dim_names))
    out["groups"] = (meshes.mesh(("dp_replicate", "fsdp")).get_group(0) is job.replicate_group,
                     meshes.mesh(("batch",)).get_group() is job.world_group)
    job.close()
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_the_meshes_lie_over_the_groups_accelpact_built(tmp_path):
    from accelpact import testing

    run = testing.run_ranks(_meshes_on_real_groups, 2, tmp_path, timeout_s=120)
    values = run.values()
    for rank, got in enumerate(values):
        assert got[("dp_replicate", "fsdp")] == ((2, 1), (rank, 0), 2.0, ("dp_replicate", "fsdp"))
        assert got[("batch",)] == ((2,), (rank,), 2.0, ("batch",))
        assert got[("world",)][:3] == ((2,), (rank,), 2.0) and got[("loss",)][:3] == ((2,), (rank,), 2.0)
        assert got[("fsdp",)][:3] == ((1,), (0,), 1.0)
        assert got["groups"] == (True, True)


# ------------------------------------------------------------------------------------- checkpoints
class FusedQKV(torch.nn.Module):
    """torchtitan's FusedQKVLinear as far as its state dict goes: a fused ``wqkv`` saved as ``wq``/``wk``/``wv``."""

    def __init__(self) -> None:
        super().__init__()
        self.wqkv = torch.nn.Linear(2, 6, bias=False)
        self.register_state_dict_post_hook(self._split_qkv_on_save)
        self.register_load_state_dict_pre_hook(self._merge_qkv_on_load)

    @staticmethod
    def _split_qkv_on_save(module, state_dict, prefix, local_metadata) -> None:
        w = state_dict.pop(f"{prefix}wqkv.weight")
        for name, part in zip(("wq", "wk", "wv"), w.chunk(3), strict=True):
            state_dict[f"{prefix}{name}.weight"] = part

    @staticmethod
    def _merge_qkv_on_load(module, state_dict, prefix, *args) -> None:
        parts = [state_dict.pop(f"{prefix}{n}.weight") for n in ("wq", "wk", "wv")]
        state_dict[f"{prefix}wqkv.weight"] = torch.cat(parts)


def test_checkpointable_drops_fused_qkv_key_renaming():
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model = torch.nn.Sequential(FusedQKV(), torch.nn.Linear(6, 1))
    with pytest.raises(AttributeError):
        get_model_state_dict(model)  # what AccelPact's checkpoints would meet
    assert tt.checkpointable(model) == 2
    assert set(get_model_state_dict(model)) == {n for n, _ in model.named_parameters()}
    assert tt.checkpointable(model) == 0


def test_checkpointable_names_another_renaming_hook():
    model = torch.nn.Linear(2, 2)
    model.register_state_dict_post_hook(lambda m, sd, prefix, meta: sd.__setitem__("renamed.weight", sd.pop("weight")))
    with pytest.raises(ApiError, match="names no submodule"):
        tt.checkpointable(model)


def test_the_classes_need_torchtitan_only_when_built(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtitan.trainer", None)  # an import of it fails
    tt.trainer_class.cache_clear()
    with pytest.raises(ImportError):
        tt.AccelPactTrainer  # noqa: B018 - the module attribute builds the class
    tt.trainer_class.cache_clear()
