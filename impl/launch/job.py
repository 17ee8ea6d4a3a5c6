"""The typed job: what one run of the worker does (spec/implementation.md, "Job file").

A :class:`Job` is a torch-free frozen dataclass, validated once by :meth:`Job.parse`, whose errors
name the field (``workload.steps``, ``faults[1].at``) and say what to write.  It is built in one
place by every caller (the conformance runner from a scenario, the demo and the benchmarks from
their flags, tests from keyword arguments) and travels to the workers as ``<out>/job.json``.

:class:`Topology` and :class:`Workload` are shared with the scenario format (a scenario is a
name, a topology, a workload, faults and an expectation; a job adds how to run it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...model.faults import Fault, FaultError, parse_faults
from ..deadlines import DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_DEADLINE_S, default_step_deadline
from ..rundir import RunDir
from ..runtime.backends import BACKEND_NAMES
from ..runtime.wrappers import WRAPPER_NAMES, wrapper

__all__ = ["FieldError", "Job", "JobError", "Topology", "Workload", "load_job"]


class FieldError(ValueError):
    """A field of a job or scenario is malformed; the message names the field and the fix."""


class JobError(FieldError):
    """The job is malformed; the message names the field and what to write instead."""


# --------------------------------------------------------------------------------------- validators
def check_int(where: str, value: Any, lo: int, hi: int | None = None, error: type[FieldError] = FieldError) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where}: must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise error(f"{where}: must be {f'>= {lo}' if hi is None else f'in [{lo}, {hi}]'}, got {value}")
    return value


def check_seconds(where: str, value: Any, error: type[FieldError] = FieldError) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise error(f"{where}: must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_object(where: str, value: Any, required: Iterable[str], optional: Iterable[str] = (),
                 error: type[FieldError] = FieldError) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise error(f"{where}: must be an object, got {type(value).__name__}")
    req, opt = tuple(required), tuple(optional)
    extra = set(value) - set(req) - set(opt)
    if extra:
        raise error(f"{where}: unknown field(s) {sorted(extra)}; allowed: {list(req + opt)}")
    missing = [k for k in req if k not in value]
    if missing:
        raise error(f"{where}: missing required field(s) {missing}")
    return value


# --------------------------------------------------------------------------------------- topology
@dataclass(frozen=True, slots=True)
class Topology:
    """N nodes x M ranks per node; rank = node*M + local.

    Shard group = the ranks of one node; replicate group = the ranks with the same local index;
    world = every rank.  :meth:`group` is the one place a group's members are computed.

    ``spares``: processes started beside the training world to take a crashed rank's identity (hot
    swap, :mod:`accelpact.impl.runtime.hotswap`); they get ranks ``world .. world + spares - 1`` at launch
    (the harness's launchers run one node, whose last ranks they are; on several nodes each node holds its
    own, :class:`~accelpact.impl.runtime.hotswap.SpareLayout`) and are not part of the training world
    (``world``, the groups and the mesh never include them).
    ``to_json`` names ``spares`` only when non-zero, so a job without spares serializes (and keys
    its cached reference) exactly as before spares existed."""

    nodes: int
    ranks_per_node: int
    spares: int = 0

    MAX_SPARES = 64

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise FieldError(f"topology needs nodes >= 1 and ranks_per_node >= 1, got {self.nodes}x{self.ranks_per_node}")
        if isinstance(self.spares, bool) or not isinstance(self.spares, int) or not 0 <= self.spares <= self.MAX_SPARES:
            raise FieldError(f"topology.spares: must be an integer in [0, {self.MAX_SPARES}] (spare processes for hot "
                             f"swap; 0: none), got {self.spares!r}")

    @classmethod
    def parse(cls, raw: Any, where: str = "topology", error: type[FieldError] = FieldError, max_side: int = 64) -> "Topology":
        t = check_object(where, raw, ("nodes", "ranks_per_node"), ("spares",), error=error)
        return cls(check_int(f"{where}.nodes", t["nodes"], 1, max_side, error),
                   check_int(f"{where}.ranks_per_node", t["ranks_per_node"], 1, max_side, error),
                   check_int(f"{where}.spares", t.get("spares", 0), 0, cls.MAX_SPARES, error))

    def to_json(self) -> dict[str, int]:
        d = {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node}
        if self.spares:
            d["spares"] = self.spares
        return d

    @property
    def world(self) -> int:
        """The training ranks (spares excluded)."""
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def shard_ranks(self, node: int) -> list[int]:
        return [node * self.ranks_per_node + local for local in range(self.ranks_per_node)]

    def replicate_ranks(self, local: int) -> list[int]:
        return [n * self.ranks_per_node + local for n in range(self.nodes)]

    def mesh_ranks(self) -> list[list[int]]:
        """2-D mesh ("replicate", "shard"): row n is node n's shard group."""
        return [self.shard_ranks(n) for n in range(self.nodes)]

    def groups_of_kind(self, kind: str) -> list[tuple[int, ...]]:
        """Every group of ``kind`` (``shard``, ``replicate``, ``world``), in creation order."""
        if kind == "shard":
            return [tuple(self.shard_ranks(n)) for n in range(self.nodes)]
        if kind == "replicate":
            return [tuple(self.replicate_ranks(local)) for local in range(self.ranks_per_node)]
        if kind == "world":
            return [tuple(range(self.world))]
        raise ValueError(f"unknown group kind {kind!r}; one of shard, replicate, world")

    def group(self, kind: str, rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group of ``kind``."""
        return self.groups_of_kind(kind)[self.group_index(kind, rank)]

    def group_index(self, kind: str, rank: int) -> int:
        """Which of the groups of ``kind`` holds ``rank``."""
        return {"shard": self.node_of(rank), "replicate": self.local_of(rank), "world": 0}[kind]


# --------------------------------------------------------------------------------------- workload
@dataclass(frozen=True, slots=True)
class Workload:
    """The training workload (``impl/launch/workload.py``): which wrapper, how deep, how long, which seed,
    how often a durable checkpoint is committed (0: never), (benchmarks) how long each step's
    device time is padded to (``pad_s``, :attr:`accelpact.impl.launch.workload.WorkloadSpec.pad_s`; 0: none),
    and (issue 41) how many micro-batches a step is (``micro_batches``: the worker opts in to shrink and
    grow, ``attach(micro_batches=M)``, and reads its data by (step, micro-batch); 0: not opted in),
    (issue 44) how its checkpoints are taken (``checkpoint``: ``attach(checkpoint=...)``, sync or async),
    and (issue 43, benchmarks) the model's width (``dim``: :attr:`accelpact.impl.launch.workload.WorkloadSpec.dim`;
    0: the workload's default; even, the workload has 2 attention heads) and whether each rank records its
    peak resident memory per step (``memory``: ``memory-a{attempt}-r{rank}.ndjson``,
    :mod:`accelpact.testing.memory`; Linux only)."""

    wrapper: str = "fsdp1-hybrid"
    layers: int = 4
    steps: int = 8
    seed: int = 0
    checkpoint_every: int = 0
    pad_s: float = 0.0
    micro_batches: int = 0
    checkpoint: str = "sync"
    dim: int = 0
    memory: bool = False

    FIELDS = ("wrapper", "layers", "steps", "seed", "checkpoint_every", "pad_s", "micro_batches", "checkpoint", "dim",
              "memory")
    #: what a scenario file need not say (benchmarks' knobs; the conformance corpus never pads nor opts in)
    OPTIONAL_IN_SCENARIO = ("pad_s", "micro_batches", "checkpoint", "dim", "memory")
    #: the widest model a job may ask for (``dim``)
    MAX_DIM = 16384

    @classmethod
    def parse(cls, raw: Any, where: str = "workload", error: type[FieldError] = FieldError,
              required: Iterable[str] = ("wrapper", "steps")) -> "Workload":
        w = check_object(where, raw, tuple(required), tuple(k for k in cls.FIELDS if k not in tuple(required)), error=error)
        d: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(cls)}
        d.update(w)
        if d["wrapper"] not in WRAPPER_NAMES:
            raise error(f"{where}.wrapper: {d['wrapper']!r} is not one of {list(WRAPPER_NAMES)}")
        if d["checkpoint"] not in ("sync", "async"):
            raise error(f"{where}.checkpoint: {d['checkpoint']!r} is not one of ['sync', 'async']")
        dim = check_int(f"{where}.dim", d["dim"], 0, cls.MAX_DIM, error)
        if dim % 2:
            raise error(f"{where}.dim: must be even (the workload's 2 attention heads split it), or 0 for the "
                        f"workload's default; got {dim}")
        if not isinstance(d["memory"], bool):
            raise error(f"{where}.memory: must be true or false (record each step's peak resident memory), "
                        f"got {d['memory']!r}")
        return cls(d["wrapper"], check_int(f"{where}.layers", d["layers"], 1, 256, error),
                   check_int(f"{where}.steps", d["steps"], 1, None, error), check_int(f"{where}.seed", d["seed"], 0, None, error),
                   check_int(f"{where}.checkpoint_every", d["checkpoint_every"], 0, None, error),
                   0.0 if d["pad_s"] == 0 and not isinstance(d["pad_s"], bool) else check_seconds(f"{where}.pad_s", d["pad_s"], error),
                   check_int(f"{where}.micro_batches", d["micro_batches"], 0, None, error), d["checkpoint"], dim,
                   d["memory"])

    def to_json(self) -> dict[str, Any]:
        # the knobs left at their default are left out: a job file (and a reference's cache key) of a
        # workload that does not use them reads as before
        return {k: getattr(self, k) for k in self.FIELDS
                if k not in ("pad_s", "micro_batches", "checkpoint", "dim", "memory")
                or getattr(self, k) not in (0, "sync", False)}

    @property
    def recovers(self) -> str:
        """The kind of group R is for this wrapper (``replicate`` or ``world``)."""
        return wrapper(self.wrapper).recovers

    @property
    def group_kinds(self) -> tuple[str, ...]:
        return wrapper(self.wrapper).groups


# --------------------------------------------------------------------------------------------- job
@dataclass(frozen=True, slots=True)
class Job:
    """One run: the scenario it plays, where it writes (``out``), and how it runs.

    ``faults``: every attempt's faults (``Fault.attempt``); ``seeded_bug``: the name of a deliberately
    broken engine for the conformance suite's teeth, which the harness's rank program validates and
    installs (:mod:`accelpact.testing.seeded`; this module does not interpret it); ``envelope``: the path of an envelope file (None: the default envelope);
    ``dead_after_s``: the failure detector's silence threshold (None: its default, spec/detection.md);
    ``hang_floor_s``: the least derived hang threshold (None: the collective timeout, ``Settings``)."""

    topology: Topology
    workload: Workload
    out: str
    scenario: str = "job"
    faults: tuple[Fault, ...] = ()
    backend: str = "gloo"
    trace: bool = False
    deadline_s: float = DEFAULT_DEADLINE_S
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # torch's NCCL default (deadlines.py)
    step_deadline_s: float | None = None
    pg_timeout_s: float = 120.0
    seeded_bug: str | None = None
    envelope: str | None = None
    dead_after_s: float | None = None
    hang_floor_s: float | None = None

    FIELDS = ("scenario", "topology", "workload", "faults", "backend", "out", "trace", "deadline_s",
              "collective_timeout_s", "step_deadline_s", "pg_timeout_s", "seeded_bug", "envelope", "dead_after_s",
              "hang_floor_s")

    def __post_init__(self) -> None:
        if self.step_deadline_s is None:
            object.__setattr__(self, "step_deadline_s", default_step_deadline(self.collective_timeout_s, self.deadline_s))

    @classmethod
    def parse(cls, raw: Any, where: str = "job") -> "Job":
        """Validate a job mapping (the ``job.json`` format); every error names the field."""
        j = check_object(where, raw, ("topology", "workload", "out"), tuple(k for k in cls.FIELDS if k not in
                                                                             ("topology", "workload", "out")), error=JobError)
        topo = Topology.parse(j["topology"], "topology", JobError)
        work = Workload.parse(j["workload"], "workload", JobError)
        if not isinstance(j["out"], str) or not j["out"]:
            raise JobError(f"out: must be the path of the run folder, got {j['out']!r}")
        backend = j.get("backend", "gloo")
        if backend not in BACKEND_NAMES:
            raise JobError(f"backend: must be one of {list(BACKEND_NAMES)}, got {backend!r}")
        try:
            faults = parse_faults(j.get("faults", []), "faults", world=topo.world, steps=work.steps,
                                  groups=work.group_kinds)
        except FaultError as exc:
            raise JobError(str(exc)) from None
        seconds = {k: check_seconds(k, j[k], JobError) for k in ("deadline_s", "collective_timeout_s", "pg_timeout_s")
                   if k in j}
        for k in ("step_deadline_s", "dead_after_s", "hang_floor_s"):
            if j.get(k) is not None:
                seconds[k] = check_seconds(k, j[k], JobError)
        bug = j.get("seeded_bug")
        if bug is not None and (not isinstance(bug, str) or not bug):
            raise JobError(f"seeded_bug: must be the name of a seeded bug (accelpact.testing.seeded) or null, got {bug!r}")
        env = j.get("envelope")
        if env is not None and not isinstance(env, str):
            raise JobError(f"envelope: must be the path of an envelope file or null, got {env!r}")
        name = j.get("scenario", "job")
        if not isinstance(name, str) or not name:
            raise JobError(f"scenario: must be a non-empty name, got {name!r}")
        trace = j.get("trace", False)
        if not isinstance(trace, bool):
            raise JobError(f"trace: must be true or false, got {trace!r}")
        return cls(topology=topo, workload=work, out=j["out"], scenario=name, faults=faults, backend=backend,
                   trace=trace, seeded_bug=bug, envelope=env, **seconds)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "topology": self.topology.to_json(), "workload": self.workload.to_json(),
                "faults": [f.to_json() for f in self.faults], "backend": self.backend, "out": self.out,
                "trace": self.trace, "deadline_s": self.deadline_s, "collective_timeout_s": self.collective_timeout_s,
                "step_deadline_s": self.step_deadline_s, "pg_timeout_s": self.pg_timeout_s,
                "seeded_bug": self.seeded_bug, "envelope": self.envelope,
                **({"dead_after_s": self.dead_after_s} if self.dead_after_s is not None else {}),
                **({"hang_floor_s": self.hang_floor_s} if self.hang_floor_s is not None else {})}

    def replace(self, **changes: Any) -> "Job":
        """A copy with ``changes``, validated again (``faults`` may be mappings)."""
        d = self.to_json()
        if "step_deadline_s" not in changes and any(k in changes for k in ("deadline_s", "collective_timeout_s")):
            d["step_deadline_s"] = None  # derived again from the new deadlines
        for k, v in changes.items():
            if k == "faults":
                v = [f.to_json() if isinstance(f, Fault) else f for f in v]
            elif hasattr(v, "to_json"):
                v = v.to_json()
            d[k] = v
        return Job.parse(d)

    def faults_for_attempt(self, attempt: int) -> tuple[Fault, ...]:
        """The faults that strike in torchrun attempt ``attempt``."""
        return tuple(f for f in self.faults if f.attempt == attempt)

    @property
    def world(self) -> int:
        return self.topology.world

    def write(self) -> Path:
        """Write ``<out>/job.json`` (creating ``out``); return its path."""
        path = RunDir(self.out).job
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".job.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)
        return path


def load_job(path: str | os.PathLike) -> Job:
    """Read and validate a job file; :class:`JobError` names the file and the field."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise JobError(f"cannot read job file {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise JobError(f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return Job.parse(raw)
