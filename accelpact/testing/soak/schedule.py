"""A soak's fault schedule: drawn from a seed, printed, saved, replayed.

A schedule is the soak's configuration (world, wrapper, spares, launcher, minutes, the step count
once measured) and a list of :class:`SoakFault`, each with its kind, its target, and *when*:

* ``trigger: "time"``: ``at_s`` seconds after training started (every rank committed a step);
  the injector strikes at that time, or, if the job is then recovering or restarting, as soon as
  it trains steadily again (the delay is recorded);
* ``trigger: "recovery"``: during the episode its previous fault caused: the injector watches the
  run's traces for an identity with a ``RankObserve`` (or a swap's first action) and no
  ``RankResume`` yet, and strikes then (within ``window_s`` of the previous fault, else it is
  recorded as not met).

The same seed and the same configuration draw the same schedule (:func:`draw`, a
:class:`random.Random` of the seed, nothing else); :func:`Schedule.to_json` and :func:`load`
round-trip it (``accelpact soak --replay DIR/schedule.json``).  Torch-free.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...impl.deadlines import DEFAULT_COLLECTIVE_TIMEOUT_S
from ...impl.runtime.wrappers import WRAPPER_NAMES
from ...model.faults import SOAK_KINDS
from ..seeded import SEEDED_BUGS

__all__ = ["FORMAT", "SOAK_KINDS", "LAUNCHERS", "SoakConfig", "SoakError", "SoakFault", "Schedule", "draw", "load",
           "unavailable_kinds"]

FORMAT = "accelpact-soak-schedule/1"

# The fault kinds a soak draws (SOAK_KINDS, by the soak's names: ``cut_group`` is a ``collective_timeout``
# struck from outside the rank, ``cut_link`` a ``link_cut``) are the fault table's (model/faults.py
# ``FaultKind.soak``); the soak's injector strikes each with an external primitive (accelpact/testing/inject.py,
# accelpact/testing/netns.py, the launcher's store process): a stop, a held GIL and a partition last a
# drawn duration and end (SIGCONT, the GIL let go, the link up again).
TRIGGERS = ("time", "recovery")
#: launchers: torchrun (its agent hosts the store), or launch.run_restarting (a store process per
#: attempt, whose pid the workers' environment names: the store can be killed from outside)
LAUNCHERS = ("torchrun", "restarting")
#: the groups a ``cut_group`` may name (the job's: accelpact.init builds them in this order)
GROUPS = ("R", "shard", "world", "control", "checkpoint", "default")

#: kinds drawn, and their weights (a cut of R is the protocol's own fault: drawn most)
WEIGHTS: dict[str, float] = {"cut_group": 3.0, "crash": 2.0, "stop": 1.5, "gil_hang": 1.5, "slow": 1.5, "cut_link": 1.0,
                             "crash_spare": 1.0, "partition": 1.0, "store_loss": 0.7}
#: kinds that strike during an episode (``trigger: "recovery"``)
DURING_RECOVERY = ("crash", "stop", "gil_hang", "cut_group", "cut_link", "store_loss")
#: kinds drawn only to strike during an episode: the model's store loss (FaultStoreLoss) strikes
#: during one (spec/fault-model.md); in steady training it has no model to judge it against
ONLY_DURING_RECOVERY = ("store_loss",)
#: the failure detector's bound: a rank silent this long is dead (impl/detector.py defaults: 0.8 s
#: dead_after + 2 x 0.1 s interval); a stop or held GIL lasts longer, a straggler's sleep stays far
#: below the hang threshold (max(5 s, 10 x median step): HANG_FLOOR_S)
DETECTOR_BOUND_S = 1.0
HANG_FLOOR_S = 5.0


class SoakError(ValueError):
    """A soak flag or schedule file is malformed; the message names the flag (or field) and what to write."""


@dataclass(frozen=True)
class SoakConfig:
    """What a soak runs (the flags of ``accelpact soak``, validated by :meth:`check`)."""

    minutes: float = 10.0
    seed: int = 0
    wrapper: str = "fsdp1-hybrid"
    nodes: int = 2
    ranks_per_node: int = 2
    spares: int = 1
    launcher: str = "torchrun"
    layers: int = 2
    checkpoint_every: int = 50
    steps: int | None = None          # None: chosen from a measured step time
    fault_every_s: float = 25.0       # mean time between two drawn faults
    recovery_share: float = 0.2       # the share of faults drawn to strike during an episode
    kinds: tuple[str, ...] = tuple(SOAK_KINDS)
    seeded_bug: str | None = None
    deadline_s: float = 20.0
    #: the training groups' collective timeout (``Job.collective_timeout_s``): what bounds a gloo op that a
    #: revoke cannot wake (bench/README.md, K6), and so the episode it holds up (the peers wait for the
    #: straggler that long); well above every slow or stopped rank a soak draws (at most 5 s)
    collective_timeout_s: float = 60.0
    #: issue 41: the step's micro-batch count the worker opts in with (``Workload.micro_batches``: a death
    #: with no spare idle shrinks the job instead of restarting it); None: the replica count (a step
    #: computes what it did without the opt-in; a shrunk replica takes the vacant share), 0: not opted in
    micro_batches: int | None = None
    #: issue 44: how the worker's checkpoints are taken (``Workload.checkpoint``: sync or async)
    checkpoint: str = "sync"

    def check(self) -> "SoakConfig":
        """Raise :class:`SoakError` naming the flag of the first bad value."""
        if isinstance(self.minutes, bool) or not isinstance(self.minutes, (int, float)) or not 0 < self.minutes <= 24 * 60:
            raise SoakError(f"--minutes must be a number of minutes in (0, 1440], got {self.minutes!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise SoakError(f"--seed must be an integer >= 0, got {self.seed!r}")
        if self.wrapper not in WRAPPER_NAMES:
            raise SoakError(f"--wrapper must be one of {list(WRAPPER_NAMES)}, got {self.wrapper!r}")
        for flag, v in (("--nodes", self.nodes), ("--ranks-per-node", self.ranks_per_node)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 8:
                raise SoakError(f"{flag} must be an integer in [1, 8], got {v!r}")
        world = self.nodes * self.ranks_per_node
        if world < 2:
            raise SoakError("--nodes x --ranks-per-node must be >= 2: a fault needs a peer to survive it")
        if self.wrapper != "ddp" and self.nodes < 2:
            raise SoakError(f"--wrapper {self.wrapper} replicates across nodes: use --nodes >= 2 (or --wrapper ddp)")
        if world + self.spares > 16:
            raise SoakError(f"--nodes x --ranks-per-node + --spares = {world + self.spares} processes: at most 16 on one machine")
        if isinstance(self.spares, bool) or not isinstance(self.spares, int) or not 0 <= self.spares <= 8:
            raise SoakError(f"--spares must be an integer in [0, 8], got {self.spares!r}")
        if self.launcher not in LAUNCHERS:
            raise SoakError(f"--launcher must be one of {list(LAUNCHERS)}, got {self.launcher!r}")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or not 1 <= self.layers <= 16:
            raise SoakError(f"--layers must be an integer in [1, 16], got {self.layers!r}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 1:
            raise SoakError(f"--checkpoint-every must be an integer >= 1 (an L2 restart resumes from the last one), "
                            f"got {self.checkpoint_every!r}")
        if self.checkpoint not in ("sync", "async"):
            raise SoakError(f"--checkpoint must be sync or async, got {self.checkpoint!r}")
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 10):
            raise SoakError(f"--steps must be an integer >= 10 (or omitted: chosen from a measured step time), got {self.steps!r}")
        if isinstance(self.fault_every_s, bool) or not isinstance(self.fault_every_s, (int, float)) or not self.fault_every_s >= 5:
            raise SoakError(f"--fault-every must be a number of seconds >= 5, got {self.fault_every_s!r}")
        if not isinstance(self.recovery_share, (int, float)) or not 0 <= self.recovery_share <= 0.5:
            raise SoakError(f"--recovery-share must be a fraction in [0, 0.5], got {self.recovery_share!r}")
        bad = [k for k in self.kinds if k not in SOAK_KINDS]
        if bad or not self.kinds:
            raise SoakError(f"--kinds: {bad or 'none given'}; choose from {list(SOAK_KINDS)}")
        if self.seeded_bug is not None and self.seeded_bug not in SEEDED_BUGS:
            raise SoakError(f"--seeded-bug must be one of {list(SEEDED_BUGS)}, got {self.seeded_bug!r}")
        if isinstance(self.deadline_s, bool) or not isinstance(self.deadline_s, (int, float)) or not self.deadline_s > 0:
            raise SoakError(f"--deadline must be a number of seconds > 0, got {self.deadline_s!r}")
        ct = self.collective_timeout_s
        if isinstance(ct, bool) or not isinstance(ct, (int, float)) or not ct >= 10:
            raise SoakError(f"--collective-timeout must be a number of seconds >= 10 (above every slow or stopped "
                            f"rank a soak draws), got {ct!r}")
        mb = self.micro_batches
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or (mb != 0 and mb < self.replicas)):
            raise SoakError(f"--micro-batches must be 0 (not opted in) or an integer >= the job's {self.replicas} replicas "
                            f"({'one per rank' if self.recovers == 'world' else 'one per node'}), got {mb!r}")
        return self

    @property
    def replicas(self) -> int:
        """The job's replicas: one per rank for DDP, one per node (a shard group) for the hybrid wrappers."""
        return self.world if self.recovers == "world" else self.nodes

    @property
    def micro_batch_count(self) -> int:
        """The micro-batches of a step the worker trains with (0: not opted in): ``micro_batches``, or
        the replica count when it is None."""
        return self.replicas if self.micro_batches is None else self.micro_batches

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def recovers(self) -> str:
        """The kind of group R is (``replicate``, or ``world`` for DDP)."""
        return "world" if self.wrapper == "ddp" else "replicate"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kinds"] = list(self.kinds)
        return d

    @classmethod
    def from_json(cls, raw: Any, where: str = "config") -> "SoakConfig":
        if not isinstance(raw, Mapping):
            raise SoakError(f"{where}: must be an object, got {type(raw).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        extra = sorted(set(raw) - known)
        if extra:
            raise SoakError(f"{where}: unknown field(s) {extra}; allowed: {sorted(known)}")
        d = dict(raw)
        # a schedule saved before issue 41's opt-in ran without micro-batches: replayed, it runs so again
        d.setdefault("micro_batches", 0)
        # and one saved before the soak chose its collective timeout ran with the job's default
        d.setdefault("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S)
        if "kinds" in d:
            if not isinstance(d["kinds"], (list, tuple)):
                raise SoakError(f"{where}.kinds: must be a list of fault kinds, got {d['kinds']!r}")
            d["kinds"] = tuple(d["kinds"])
        return cls(**d).check()


@dataclass(frozen=True)
class SoakFault:
    """One scheduled fault (see the module doc).  ``rank``: the training rank (identity) it strikes,
    or for ``crash_spare`` which idle spare (an index among those idle then); ``peer``: a link cut's
    other end; ``group``: which of the rank's groups a ``cut_group`` cuts (``R``: the group the
    engine repairs); ``duration_s``: how long a stop, a held GIL, a straggler's sleep or a partition lasts."""

    index: int
    kind: str
    trigger: str = "time"
    at_s: float = 0.0
    rank: int = 0
    peer: int | None = None
    group: str | None = None
    duration_s: float | None = None
    window_s: float = 20.0

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "SoakFault":
        if not isinstance(raw, Mapping):
            raise SoakError(f"{where}: must be an object, got {type(raw).__name__}")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(raw) - known)
        if extra:
            raise SoakError(f"{where}: unknown field(s) {extra}; allowed: {sorted(known)}")
        for k in ("index", "kind"):
            if k not in raw:
                raise SoakError(f"{where}: missing field {k!r}")
        f = cls(**dict(raw))
        if f.kind not in SOAK_KINDS:
            raise SoakError(f"{where}.kind: {f.kind!r} is not one of {list(SOAK_KINDS)}")
        if f.trigger not in TRIGGERS:
            raise SoakError(f"{where}.trigger: {f.trigger!r} is not one of {list(TRIGGERS)}")
        if f.group is not None and f.group not in GROUPS:
            raise SoakError(f"{where}.group: {f.group!r} is not one of {list(GROUPS)}")
        if isinstance(f.at_s, bool) or not isinstance(f.at_s, (int, float)) or f.at_s < 0:
            raise SoakError(f"{where}.at_s: must be seconds >= 0, got {f.at_s!r}")
        return f

    def describe(self) -> str:
        what = {"cut_group": f"rank {self.rank}'s {self.group} group", "cut_link": f"link {self.rank}<->{self.peer}",
                "crash_spare": "an idle spare", "store_loss": "the store's process"}.get(self.kind, f"rank {self.rank}")
        dur = f" for {self.duration_s:.1f}s" if self.duration_s else ""
        when = f"t+{self.at_s:.0f}s" if self.trigger == "time" else "during the episode of the fault before"
        return f"#{self.index} {self.kind} {what}{dur} at {when}"


@dataclass(frozen=True)
class Schedule:
    """The seed, the configuration, and the faults in order; ``skipped``: kinds left out, with why."""

    config: SoakConfig
    faults: tuple[SoakFault, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.config.seed

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "seed": self.seed, "config": self.config.to_json(),
                "skipped": dict(self.skipped), "faults": [f.to_json() for f in self.faults]}

    def with_steps(self, steps: int) -> "Schedule":
        return replace(self, config=replace(self.config, steps=steps))

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, p)
        return p


def load(path: str | os.PathLike) -> Schedule:
    """Read a saved schedule; :class:`SoakError` names the file and the field."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SoakError(f"--replay: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SoakError(f"--replay: {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
        raise SoakError(f"--replay: {path} is not a soak schedule (format {FORMAT!r} expected)")
    cfg = SoakConfig.from_json(raw.get("config"), f"{path}: config")
    if raw.get("seed") != cfg.seed:
        raise SoakError(f"--replay: {path}: seed {raw.get('seed')!r} differs from config.seed {cfg.seed}")
    items = raw.get("faults")
    if not isinstance(items, list):
        raise SoakError(f"--replay: {path}: faults must be a list")
    faults = tuple(SoakFault.from_json(f, f"{path}: faults[{i}]") for i, f in enumerate(items))
    for i, f in enumerate(faults):
        if f.index != i:
            raise SoakError(f"--replay: {path}: faults[{i}].index is {f.index}, expected {i}")
        for r in (f.rank, f.peer):
            if r is not None and not 0 <= r < max(cfg.world, cfg.spares):
                raise SoakError(f"--replay: {path}: faults[{i}] names rank {r} outside the world of {cfg.world}")
    skipped = raw.get("skipped") or {}
    if not isinstance(skipped, Mapping):
        raise SoakError(f"--replay: {path}: skipped must be an object")
    return Schedule(cfg, faults, dict(skipped))


def unavailable_kinds(cfg: SoakConfig, *, netns_why: str | None = None) -> dict[str, str]:
    """Kinds this configuration cannot strike here, with why (printed and saved with the schedule)."""
    out: dict[str, str] = {}
    if cfg.spares == 0:
        out["crash_spare"] = "the job has no spares (--spares 0)"
    if cfg.launcher == "torchrun":
        out["store_loss"] = ("torchrun's agent serves the store in its own process (killing it ends the supervisor): "
                             "use --launcher restarting (a store process per attempt)")
    out["partition"] = ("a silent partition needs every rank in a network namespace of its own (netns.Fabric); "
                        "torchrun and launch.run_restarting start the ranks in the launcher's"
                        + (f"; and here: {netns_why}" if netns_why else ""))
    return out


def _weighted(rng: random.Random, kinds: Iterable[str]) -> str:
    ks = list(kinds)
    return rng.choices(ks, weights=[WEIGHTS.get(k, 1.0) for k in ks])[0]


def draw(cfg: SoakConfig, skipped: Mapping[str, str] | None = None) -> Schedule:
    """The schedule of ``cfg`` (its seed): faults every ``fault_every_s`` on average from 20 s after
    training starts until 30 s before ``minutes`` end, each of a kind drawn (by :data:`WEIGHTS`) from
    the configuration's kinds that are not ``skipped``; after a fault that starts an episode, with
    probability ``recovery_share``, one more that strikes during it.  A store loss is drawn only to
    strike during an episode (:data:`ONLY_DURING_RECOVERY`), after a crash or a stop that starts one."""
    cfg.check()
    skip = dict(skipped if skipped is not None else unavailable_kinds(cfg))
    kinds = [k for k in cfg.kinds if k not in skip]
    if not kinds:
        raise SoakError(f"--kinds: every kind asked for is unavailable here: {skip}")
    rng = random.Random(cfg.seed)
    world = cfg.world
    horizon = cfg.minutes * 60.0 - 30.0
    t = 20.0
    faults: list[SoakFault] = []
    primaries = [k for k in kinds if k not in ONLY_DURING_RECOVERY] or ["crash"]
    during = [k for k in DURING_RECOVERY if k in kinds]
    while t < horizon or not faults:
        kind = _weighted(rng, primaries)
        late = [k for k in ONLY_DURING_RECOVERY if k in kinds]
        if late and rng.random() < WEIGHTS[late[0]] / sum(WEIGHTS.get(k, 1.0) for k in kinds):
            kind = rng.choice(["crash", "stop"]) if {"crash", "stop"} & set(kinds) else kind  # its episode's cause
            faults.append(_one(rng, len(faults), kind, "time", round(t, 1), cfg))
            faults.append(_one(rng, len(faults), rng.choice(late), "recovery", 0.0, cfg))
        else:
            faults.append(_one(rng, len(faults), kind, "time", round(t, 1), cfg))
            primary = kind not in ("slow", "crash_spare")
            if primary and during and rng.random() < cfg.recovery_share:
                faults.append(_one(rng, len(faults), rng.choice(during), "recovery", 0.0, cfg))
        t += cfg.fault_every_s * rng.uniform(0.6, 1.4)
        if t >= horizon and faults:
            break
    if world < 2:  # pragma: no cover - check() refuses it
        raise SoakError("world too small")
    return Schedule(cfg, tuple(faults), skip)


def _one(rng: random.Random, index: int, kind: str, trigger: str, at_s: float, cfg: SoakConfig) -> SoakFault:
    world = cfg.world
    rank = rng.randrange(world)
    peer = group = duration = None
    if kind == "cut_link":
        peer = rng.choice([r for r in range(world) if r != rank])
    elif kind == "cut_group":
        group = rng.choices(GROUPS, weights=[6, 1, 1, 1, 1, 1])[0]
        if cfg.wrapper == "ddp" and group == "world":
            group = "R"  # DDP's R is its world group
    elif kind in ("stop", "gil_hang"):
        duration = round(rng.uniform(1.5, 4.0), 2)
    elif kind == "slow":
        duration = round(rng.uniform(0.3, 2.5), 2)
    elif kind == "partition":
        duration = round(rng.uniform(2.0, 5.0), 2)
    elif kind == "crash_spare":
        rank = rng.randrange(max(1, cfg.spares))
    return SoakFault(index=index, kind=kind, trigger=trigger, at_s=at_s, rank=rank, peer=peer, group=group,
                     duration_s=duration)
