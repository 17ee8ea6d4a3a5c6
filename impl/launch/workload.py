"""Training workload used by tests, the demo and the benchmarks (the model's S_app).

A tiny char-level transformer LM over a shipped English corpus, wrapped in FSDP1 HYBRID_SHARD or
_HYBRID_SHARD_ZERO2, FSDP2 HSDP (``fully_shard`` on a 2-D mesh) or DDP; deterministic initialisation,
deterministic batches addressed by (step, data-parallel index), and per-rank snapshots for
bit-identity checks.

Ordering requirements:
* ``build_groups`` is collective over the default group: every rank calls it, in the same order
  relative to any other ``dist.new_group`` call (spec/torch-facts.md: members-only calls desynchronise).
* ``build_job`` seeds the global torch RNG from ``spec.seed`` before creating the model, so all
  ranks build identical weights; call it on every rank with the same spec.
* ``train_step(job, step)`` requires ``step == job.cursor.kappa`` (zero replay, zero skipped batch).
"""
from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.backends import backend as _backend
from .job import Topology
from ..runtime.wrappers import GROUP_KINDS, WRAPPER_NAMES, wrapper

__all__ = ["App", "DataCursor", "Groups", "Topology", "WorkloadSpec", "build_groups", "build_job", "groups_of",
           "local_params", "r_group", "r_ranks", "snapshot", "train_step"]


# --------------------------------------------------------------------------- groups
@dataclass
class Groups:
    """This rank's communicators. ``world`` is a dedicated all-ranks group (not the default group,
    which stays free for control traffic); ``mesh`` is a 2-D DeviceMesh built over the same
    replicate/shard groups (FSDP2)."""

    topo: Topology
    rank: int
    replicate: Any
    shard: Any
    world: Any
    mesh: Any = None
    replicate_ranks: tuple[int, ...] = ()
    shard_ranks: tuple[int, ...] = ()
    #: where this rank's model, batches and collectives live (the backend's device: CPU for gloo,
    #: ``cuda:LOCAL_RANK`` for NCCL; :meth:`accelpact.impl.runtime.backends.Backend.prepare_process`)
    device: Any = None


def groups_of(job: Any) -> Groups:
    """The workload's :class:`Groups` from a job built by :func:`accelpact.init` (its training groups)."""
    topo, rank = job.topology, job.rank
    return Groups(topo=topo, rank=rank, replicate=job.replicate_group, shard=job.shard_group, world=job.world_group,
                  mesh=job.mesh, replicate_ranks=topo.group("replicate", rank), shard_ranks=topo.group("shard", rank),
                  device=job.device)


def build_groups(topo: Topology, rank: int, backend: str = "gloo", timeout: timedelta = timedelta(seconds=60),
                 new_group: Callable[[str, list[int]], Any] | None = None, device: Any = None) -> Groups:
    """Create shard, replicate and data-parallel world groups (collective over the default group).

    Every rank creates every group in the fixed order: shard groups by node, replicate groups by
    local index, then the world group; it keeps those it belongs to. The FSDP2 mesh reuses these
    groups (``DeviceMesh.from_group``), so they carry ``timeout`` instead of gloo's 30-min default.
    ``new_group(kind, ranks)`` (kind: "shard", "replicate", "world") replaces ``dist.new_group``
    when the caller must see each group as it is built (the worker records its sockets for revoke).
    """
    if not dist.is_initialized():
        raise RuntimeError("build_groups needs the default process group: call dist.init_process_group first")
    if dist.get_world_size() != topo.world:
        raise ValueError(f"Topology {topo.nodes}x{topo.ranks_per_node} needs world size {topo.world}, default group has {dist.get_world_size()}")
    make = new_group or (lambda kind, ranks: dist.new_group(ranks, backend=backend, timeout=timeout))
    mine: dict[str, Any] = {}
    for kind in GROUP_KINDS:
        for members in topo.groups_of_kind(kind):
            g = make(kind, list(members))
            if rank in members:
                mine[kind] = g
    shard, replicate, world = mine["shard"], mine["replicate"], mine["world"]
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(
        [replicate, shard], _backend(backend).device_type, mesh=topo.mesh_ranks(), mesh_dim_names=("replicate", "shard")
    )
    return Groups(
        topo=topo, rank=rank, replicate=replicate, shard=shard, world=world, mesh=mesh,
        replicate_ranks=topo.group("replicate", rank), shard_ranks=topo.group("shard", rank),
        device=device if device is not None else torch.device(_backend(backend).device_type),
    )


# --------------------------------------------------------------------------- spec / data
@dataclass(frozen=True)
class WorkloadSpec:
    wrapper: str = "fsdp1-hybrid"
    layers: int = 4
    dim: int = 32
    heads: int = 2
    seq: int = 16
    batch: int = 4
    lr: float = 1e-3
    seed: int = 0
    #: DDP only: reduce each gradient on its own (see ``_per_gradient_allreduce``); off leaves
    #: DDP's bucketed all-reduce through its C++ Reducer (what a user's job usually runs).
    ddp_per_gradient: bool = True
    #: Benchmarks only: a step's device time, slept at the start of each step (inside it, so a
    #: fault in flight meets it): a step of about a second without two CPU cores computing for it,
    #: as a GPU step leaves the host idle (``accelpact bench goodput``).  0: no pad.
    pad_s: float = 0.0
    #: Dropout of every transformer block (0: none, the default: every existing run is unchanged).  It
    #: draws from the generator of the device the model runs on (the CUDA generator of ``cuda:LOCAL_RANK``
    #: on NCCL, the CPU generator on gloo), so a test sees whether "RNG back to F" restores that device's
    #: generator: a rerun of a step with dropout matches the uninterrupted run only if it does (issue 43).
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.wrapper not in WRAPPER_NAMES:
            raise ValueError(f"unknown wrapper {self.wrapper!r}; use one of {list(WRAPPER_NAMES)}")
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} must be divisible by heads={self.heads}")
        if self.layers < 1 or self.seq < 2 or self.batch < 1:
            raise ValueError("WorkloadSpec needs layers >= 1, seq >= 2, batch >= 1")
        if not self.pad_s >= 0:
            raise ValueError(f"pad_s={self.pad_s} must be >= 0 seconds")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")


@functools.lru_cache(maxsize=1)
def load_corpus() -> str:
    """The shipped corpus (original English prose, ``impl/launch/data/corpus.txt``)."""
    return resources.files("accelpact.impl.launch").joinpath("data/corpus.txt").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _encoded() -> tuple[tuple[str, ...], torch.Tensor]:
    text = load_corpus()
    vocab = tuple(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    return vocab, torch.tensor([index[c] for c in text], dtype=torch.long)


def vocab_size() -> int:
    return len(_encoded()[0])


@dataclass
class DataCursor:
    """Position kappa in the data stream: the number of steps whose batches were consumed.

    ``batch(step, dp_index)`` is a pure function of (seed, step, dp_index): every data-parallel
    worker (every rank, as in standard FSDP/HSDP/DDP) reads its own windows of the corpus.
    """

    seed: int
    batch_size: int
    seq: int
    dp_index: int
    dp_size: int
    kappa: int = 0

    def batch(self, step: int, dp_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        dp = self.dp_index if dp_index is None else dp_index
        data = _encoded()[1]
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 4099 + dp)
        starts = torch.randint(0, data.numel() - self.seq - 1, (self.batch_size,), generator=g)
        idx = starts[:, None] + torch.arange(self.seq + 1)[None, :]
        win = data[idx]
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def advance(self) -> None:
        self.kappa += 1


# --------------------------------------------------------------------------- model
class Block(nn.Module):
    """One pre-norm transformer block (the FSDP wrapping unit)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=4 * dim, dropout=dropout, batch_first=True, norm_first=True
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.layer(x, src_mask=mask, is_causal=True)


class CharLM(nn.Module):
    def __init__(self, vocab: int, spec: WorkloadSpec) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, spec.dim)
        self.pos = nn.Parameter(torch.randn(spec.seq, spec.dim) * 0.02)
        self.layers = nn.ModuleList(Block(spec.dim, spec.heads, spec.dropout) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(spec.dim)
        self.head = nn.Linear(spec.dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(spec.seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        for blk in self.layers:
            h = blk(h, self.mask)
        return self.head(self.norm(h))


# --------------------------------------------------------------------------- app
@dataclass
class App:
    """One rank's training application (S_app): the wrapped model, its optimizer and the data cursor on
    the job's groups, and the next step."""

    spec: WorkloadSpec
    topo: Topology
    groups: Groups
    module: nn.Module
    optimizer: torch.optim.Optimizer
    cursor: DataCursor
    step: int = 0

    @property
    def r_group(self) -> Any:
        return r_group(self.spec, self.groups)


def r_group(spec: WorkloadSpec, groups: Groups) -> Any:
    """The group the wrapper treats as R (``Wrapper.recovers``): replicate for HSDP, the world for DDP."""
    return getattr(groups, wrapper(spec.wrapper).recovers)


def r_ranks(spec: WorkloadSpec, groups: Groups) -> tuple[int, ...]:
    return groups.topo.group(wrapper(spec.wrapper).recovers, groups.rank)


def _per_gradient_allreduce(ddp, bucket):
    """DDP comm hook: average each gradient of the bucket separately on ``ddp.process_group``.

    The group is looked up at call time, so an L1 rebind of ``ddp.process_group`` covers the hook.
    """
    pg = ddp.process_group
    world = pg.size()
    for grad in bucket.gradients():  # views into bucket.buffer()
        pg.allreduce([grad]).wait()
    buffer = bucket.buffer()
    buffer.div_(world)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut


# DDP checks the hook's annotations as objects (this module uses postponed annotations).
_per_gradient_allreduce.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def _fsdp1(model: nn.Module, groups: Groups, strategy: str) -> nn.Module:
    """FSDP1 with the hybrid ``strategy`` (a ``ShardingStrategy`` name) over explicit (shard,
    replicate) groups, one unit per block."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    device = groups.device if groups.device is not None else torch.device("cpu")

    def allocate(module: nn.Module) -> None:
        """A meta-built model (``build_job(materialize=False)``): each module's own storage, unit by
        unit as FSDP flattens and shards it, left uninitialised (the rebuild imports the state)."""
        module.to_empty(device=device, recurse=False)

    # Explicit (shard, replicate) groups: process_group=None silently degrades on CPU (spec/torch-facts.md).
    return FSDP(
        model,
        process_group=(groups.shard, groups.replicate),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        use_orig_params=False,
        device_id=groups.device,  # the backend's device; cpu_offload stays off (spec/torch-facts.md)
        param_init_fn=allocate if _on_meta(model) else None,
    )


def wrap_fsdp1(model: nn.Module, groups: Groups, spec: WorkloadSpec) -> nn.Module:
    """FSDP1 HYBRID_SHARD over explicit (shard, replicate) groups, one unit per block."""
    return _fsdp1(model, groups, "HYBRID_SHARD")


def wrap_fsdp1_zero2(model: nn.Module, groups: Groups, spec: WorkloadSpec) -> nn.Module:
    """FSDP1 _HYBRID_SHARD_ZERO2 (ZeRO-2 in the shard group, replicated over R) over explicit (shard,
    replicate) groups, one unit per block: the parameters stay unsharded from forward to backward."""
    return _fsdp1(model, groups, "_HYBRID_SHARD_ZERO2")


def wrap_fsdp2(model: nn.Module, groups: Groups, spec: WorkloadSpec) -> nn.Module:
    """FSDP2 ``fully_shard`` on the 2-D (replicate, shard) mesh: HSDP, one unit per block."""
    from torch.distributed.fsdp import fully_shard

    meta = _on_meta(model)
    if not meta:
        model.to(groups.device)
    for blk in model.layers:  # type: ignore[union-attr]  # CharLM.layers is a ModuleList
        fully_shard(blk, mesh=groups.mesh)
    root = fully_shard(model, mesh=groups.mesh)
    if meta:  # only this rank's shards are allocated (uninitialised: a rebuild imports its state)
        root.to_empty(device=groups.device)  # type: ignore[attr-defined]  # FSDPModule is an nn.Module at run time
    return root  # type: ignore[return-value]  # FSDPModule is an nn.Module at run time


def wrap_ddp(model: nn.Module, groups: Groups, spec: WorkloadSpec) -> nn.Module:
    """DDP over the data-parallel world group."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    on_cuda = groups.device is not None and groups.device.type == "cuda"
    model = model.to_empty(device=groups.device) if _on_meta(model) else model.to(groups.device)
    module = DDP(model, process_group=groups.world, device_ids=[groups.device] if on_cuda else None)
    # Deterministic reduction order: DDP rebuilds its buckets after the first iteration, so a
    # job restarted from a checkpoint (L2) would otherwise sum gradients in another order than
    # the uninterrupted run (measured: differences of 2-4e-9).  Reducing every gradient on its
    # own makes the sum independent of the bucket layout.
    if spec.ddp_per_gradient:
        module.register_comm_hook(module, _per_gradient_allreduce)
    return module


def _on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def build_job(spec: WorkloadSpec, topo: Topology, groups: Groups, *, materialize: bool = True) -> App:
    """Build the wrapped model (``WRAPPERS[spec.wrapper].wrap``), AdamW and the data cursor
    (identical init on all ranks).

    ``materialize=False``: the model is built on the meta device and the wrapper allocates only this
    rank's storage (FSDP1: unit by unit, through each module's ``reset_parameters``; FSDP2: its
    shards, ``to_empty``; DDP: the whole model, ``to_empty``), with no meaningful values.  For a
    rebuild whose state is then imported (``attach(rebuild=...)`` after a hot swap or a discard: the
    engine moves the committed state in), so that the rebuild never holds the whole unsharded model
    beside the rank's shard (issue 43; the README's "Memory in an episode")."""
    torch.manual_seed(spec.seed)
    if materialize:
        model = CharLM(vocab_size(), spec)
    else:
        with torch.device("meta"):
            model = CharLM(vocab_size(), spec)
    module = wrapper(spec.wrapper).wrap_fn()(model, groups, spec)
    optimizer = torch.optim.AdamW(module.parameters(), lr=spec.lr, foreach=False)
    cursor = DataCursor(spec.seed, spec.batch, spec.seq, dp_index=groups.rank, dp_size=topo.world)
    return App(spec, topo, groups, module, optimizer, cursor)


def train_step(job: App, step: int) -> torch.Tensor:
    """One optimizer step: forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``,
    cursor advance. Returns the detached local loss."""
    if step != job.cursor.kappa:
        raise ValueError(
            f"train_step({step}) but the data cursor is at kappa={job.cursor.kappa}: steps must be "
            "consecutive (zero replay); restore a snapshot/checkpoint taken at that step instead"
        )
    if job.spec.pad_s:
        time.sleep(job.spec.pad_s)  # the step's device time (benchmarks; WorkloadSpec.pad_s)
    x, y = job.cursor.batch(step)
    if job.groups.device is not None and job.groups.device.type != "cpu":
        x, y = x.to(job.groups.device), y.to(job.groups.device)
    logits = job.module(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)
    job.cursor.advance()
    job.step = step + 1
    return loss.detach()


# --------------------------------------------------------------------------- snapshots
def _local(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        to_local = getattr(t, "to_local", None)
        if to_local is not None:  # DTensor: this rank's shard
            t = to_local()
        return t.detach().clone()
    return t


def local_params(module: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's parameter storage: FSDP1 flat-param shards, FSDP2 DTensor local shards, DDP params."""
    return {name: _local(p) for name, p in module.named_parameters()}


def _clone_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return _local(obj)
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_tree(v) for v in obj)
    return copy.deepcopy(obj)


def snapshot(job: App) -> dict:
    """Per-rank state for bit-identity checks (spec/torch-facts.md: shards, optimizer, RNG, step, cursor).
    On a CUDA device also ``cuda_rng``: that device's generator state (what GPU dropout draws from)."""
    snap = {
        "step": job.step,
        "cursor": job.cursor.kappa,
        "params": local_params(job.module),
        "optimizer": _clone_tree(job.optimizer.state_dict()),
        "rng": torch.get_rng_state().clone(),
    }
    device = job.groups.device
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        snap["cuda_rng"] = torch.cuda.get_rng_state(device).clone()
    return snap
