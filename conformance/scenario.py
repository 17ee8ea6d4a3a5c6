"""Scenario files: the schema and its validation (spec/scenario-format.md F1).

A scenario is the public, implementation-independent description of one conformance run: a
world shape (:class:`~accelpact.impl.launch.job.Topology`), a workload
(:class:`~accelpact.impl.launch.job.Workload`), the injected faults (:class:`~accelpact.model.faults.Fault`,
validated by its one validator :meth:`Fault.parse`) and an optional expected outcome.  This module
adds only what is scenario-specific: the rules that make a fault list one recovery scenario
(below) and the episode view of it.  Where it lives in the model is :mod:`.mapping`; what the
model says it may end in is :mod:`.outcomes`; :meth:`Scenario.job` is the one way a scenario
becomes a run (:class:`~accelpact.impl.launch.job.Job`).

Scenario-level rules (everything else is the fault's, the topology's or the workload's own):

* at least one fault at a trigger point (in flight or ``boundary``): it starts the recovery;
* a fault at a recovery point needs a trigger fault at the same step (the recovery it strikes in);
* one trigger point per step (R fails once per step);
* faults leave at least one step after them (``step <= steps - 2``): the run shows what follows;
* faults strike the first attempt (``attempt`` 0): the model says what the restart does;
* ``checkpoint_every >= 1``: the model's checkpoint C is the last multiple at or before F;
* a fault's ``group`` defaults to, and must be, the wrapper's R (``Workload.recovers``);
* a ``partition`` leaves some rank on the network (it names its ranks, not every one);
* model limitation: the ranks whose collective fails lie in one group R (one replicate group for
  the hybrid wrappers).  The model recovers a single group R; the implementation can repair
  several replicate groups at once, but such a scenario has no model to judge it against.

Pure Python, no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..model.faults import KINDS, RECOVERY_POINTS, TRIGGER_POINTS, Fault, FaultError
from ..impl.launch.job import FieldError, Job, JobError, Topology, Workload, check_object
from ..testing import seeded

__all__ = [
    "OUTCOMES", "SCENARIO_FIELDS", "Scenario", "ScenarioError", "load_scenario", "scenario_from_job",
    "scenario_from_mapping",
]

SCENARIO_FIELDS = ("name", "topology", "workload", "faults", "expect")
OUTCOMES = ("L1", "L2")
#: the largest side of a scenario's topology (the model search grows fast with the world)
MAX_SIDE = 16


class ScenarioError(FieldError):
    """A scenario file or mapping is malformed; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    topology: Topology
    workload: Workload
    faults: tuple[Fault, ...]
    expect: str | None = None   # "L1" | "L2" | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "topology": self.topology.to_json(),
            "workload": self.workload.to_json(),
            "faults": [f.to_json() for f in self.faults],
        }
        if self.expect is not None:
            out["expect"] = {"outcome": self.expect}
        return out

    def dumps(self) -> str:
        """Canonical text (sorted nothing, fixed field order, trailing newline): deterministic corpus."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    @property
    def group(self) -> str:
        """The kind of group R is (``replicate`` or ``world``): the wrapper's."""
        return self.workload.recovers

    @property
    def episode_steps(self) -> tuple[int, ...]:
        """The steps whose trigger fault starts a recovery episode, in order: episode g is generation g."""
        return tuple(sorted({f.step for f in self.faults if f.is_trigger}))

    def trigger_point(self, step: int) -> str:
        """Where R fails in the episode of ``step`` (one trigger point per step)."""
        return next(f.at for f in self.faults if f.step == step and f.is_trigger)

    @property
    def frontier(self) -> int:
        """F: the committed step at which the first trigger fault strikes."""
        return self.episode_steps[0]

    @property
    def checkpoint(self) -> int:
        """C: the last checkpoint at or before F (step 0 counts: the initial state is durable)."""
        every = self.workload.checkpoint_every
        return (self.frontier // every) * every

    def episode_ranks(self, step: int) -> tuple[int, ...]:
        """The ranks whose collective fails at the trigger of ``step``: those of the trigger faults
        that are the failure itself, or, when there is none, of every trigger fault of that step."""
        world = self.topology.world
        trig = [f for f in self.faults if f.step == step and f.is_trigger]
        ranks = [r for f in trig if f.is_failure for r in f.targets(world)]
        # a link cut fails the group of R's kind its two ends share, if any (P18.2)
        ranks += [r for f in trig if KINDS[f.kind].pair and self.link_group(f) is not None for r in f.ranks]
        if any(KINDS[f.kind].pair for f in trig):
            return tuple(sorted(set(ranks)))
        return tuple(sorted(set(ranks or [r for f in trig for r in f.targets(world)])))

    def link_group(self, f: Fault) -> int | None:
        """The group of R's kind a link cut's two ends share (its index), or None: the link crosses none."""
        a, b = f.ranks
        ga, gb = self.topology.group_index(self.group, a), self.topology.group_index(self.group, b)
        return ga if ga == gb else None

    def episode_groups(self, step: int) -> tuple[int, ...]:
        """Which groups of R's kind fail at the trigger of ``step`` (their indices): R of that
        episode is their union.  Several at once are repaired together in one generation."""
        return tuple(sorted({self.topology.group_index(self.group, r) for r in self.episode_ranks(step)}))

    def episode_members(self, step: int) -> frozenset[int]:
        """The members of the groups that fail at ``step`` (R of that episode)."""
        return frozenset(r for gi in self.episode_groups(step) for r in self.topology.groups_of_kind(self.group)[gi])

    def job(self, out: str | Path, *, backend: str = "gloo", deadline_s: float = 8.0,
            seeded_bug: str | None = None) -> Job:
        """The run of this scenario: a traced :class:`~accelpact.impl.launch.job.Job` writing to ``out``.
        ``seeded_bug`` (test-only) travels as the job's field, nowhere else; a name that is not a seeded
        bug (:mod:`accelpact.testing.seeded`) is a JobError naming them."""
        try:
            seeded.check(seeded_bug)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        job = Job(topology=self.topology, workload=self.workload, out=str(out), scenario=self.name, trace=True,
                  deadline_s=deadline_s, dead_after_s=CONFORMANCE_DEAD_AFTER_S,
                  collective_timeout_s=CONFORMANCE_COLLECTIVE_TIMEOUT_S, hang_floor_s=CONFORMANCE_HANG_FLOOR_S)
        return job.replace(faults=self.faults, backend=backend, seeded_bug=seeded_bug)  # validated again: Job.parse


#: The failure detector's silence threshold in conformance runs.  Its default (0.8 s, spec/detection.md)
#: is met by a rank whose heartbeat thread waits for a core longer than that, which up to nine processes
#: on two shared cores (a hot-swap scenario under pytest -n 2) do: the detector then ends a healthy job.
#: The scenarios are about the protocol's outcomes; detection speed is measured by ``accelpact bench
#: detect`` and tests/test_detector.py at the default.
CONFORMANCE_DEAD_AFTER_S = 3.0

#: The training groups' collective timeout in conformance runs: the former default, kept explicit when
#: the default became torch's NCCL default (600 s, impl/deadlines.py).  Some scenarios' episodes wait out
#: an op of a step abandoned in flight that the revoke did not wake (K6, bench/README.md; the straggler
#: wait, spec/protocol.md P3.6, is bounded by this timeout past the deadline): 600 s there would exceed
#: the runner's bound per launch.  The corpus is about outcomes, not about how long a slow step may be.
CONFORMANCE_COLLECTIVE_TIMEOUT_S = 60.0

#: The derived hang threshold's floor in conformance runs: the detector's own (5 s), not the collective
#: timeout the default raises it to (a slow healthy step is no failure, issue 40): the hang scenarios
#: are about the protocol's outcomes once a hang is found, and their survivors' exit bound assumes it
#: is found within seconds.
CONFORMANCE_HANG_FLOOR_S = 5.0


# --------------------------------------------------------------------------------------
# Validation

def scenario_from_mapping(data: Any, *, source: str = "<scenario>") -> Scenario:
    """Validate and build a scenario; every error names the field, what was wrong and the fix."""
    data = check_object(source, data, ("name", "topology", "workload", "faults"), ("expect",), error=ScenarioError)
    name = data["name"]
    if not isinstance(name, str) or not name or any(c.isspace() or c == "/" for c in name):
        raise ScenarioError(f"{source}.name: must be a non-empty string without spaces or '/', got {name!r}")
    topo = Topology.parse(data["topology"], f"{source}.topology", ScenarioError, max_side=MAX_SIDE)
    work = Workload.parse(data["workload"], f"{source}.workload", ScenarioError, required=tuple(f for f in Workload.FIELDS if f not in Workload.OPTIONAL_IN_SCENARIO))
    if work.checkpoint_every < 1:
        raise ScenarioError(f"{source}.workload.checkpoint_every: must be >= 1 in a scenario (the model restarts from "
                            f"the last checkpoint C at or before F), got {work.checkpoint_every}")
    group = work.recovers
    if not isinstance(data["faults"], list) or not data["faults"]:
        raise ScenarioError(f"{source}.faults: must be a non-empty list of fault objects (a scenario without faults tests nothing)")
    faults = []
    for i, raw in enumerate(data["faults"]):
        where = f"{source}.faults[{i}]"
        if isinstance(raw, Mapping) and "group" not in raw:
            raw = {**raw, "group": group}  # a scenario's faults strike R unless told otherwise
        try:
            f = Fault.parse(raw, where, world=topo.world, steps=work.steps, groups=(group,))
        except FaultError as exc:
            raise ScenarioError(str(exc)) from None
        if f.step > work.steps - 2:
            raise ScenarioError(f"{where}.step: must be in [0, {work.steps - 2}] (a scenario leaves at least one step "
                                f"after its faults), got {f.step}")
        if f.attempt != 0:
            raise ScenarioError(f"{where}.attempt: a scenario's faults strike the first attempt; omit it (got {f.attempt})")
        faults.append(f)
    expect = None
    if "expect" in data:
        e = check_object(f"{source}.expect", data["expect"], ("outcome",), error=ScenarioError)
        if e["outcome"] not in OUTCOMES:
            raise ScenarioError(f"{source}.expect.outcome: must be one of {list(OUTCOMES)}, got {e['outcome']!r}")
        expect = e["outcome"]
    sc = Scenario(name, topo, work, tuple(faults), expect)
    _check_consistency(sc, source)
    return sc


def _check_consistency(sc: Scenario, source: str) -> None:
    """The scenario-level rules of the module doc that span several faults."""
    steps = set(sc.episode_steps)
    if not steps:
        raise ScenarioError(f"{source}.faults: needs at least one fault at {list(TRIGGER_POINTS)} to start a recovery")
    rpn = sc.topology.ranks_per_node
    for i, f in enumerate(sc.faults):
        if KINDS[f.kind].pair and f.ranks[0] // rpn == f.ranks[1] // rpn:
            raise ScenarioError(f"{source}.faults[{i}]: a {f.kind} joins ranks on two nodes (rank = node * "
                                f"{rpn} + local); {list(f.ranks)} are both on node {f.ranks[0] // rpn}")
        if f.at in RECOVERY_POINTS and f.step not in steps:
            raise ScenarioError(
                f"{source}.faults[{i}]: a fault at {f.at!r} needs a fault at 'boundary' (or in flight) at the same step {f.step} "
                "to start the recovery it strikes in; add one"
            )
    for s in sorted(steps):
        points = {f.at for f in sc.faults if f.step == s and f.is_trigger}
        if len(points) > 1:
            raise ScenarioError(f"{source}.faults: step {s} has trigger faults at several points {sorted(points)}; R fails once per step, pick one")
    for i, f in enumerate(sc.faults):
        if f.kind == "partition" and set(f.targets(sc.topology.world)) == set(range(sc.topology.world)):
            raise ScenarioError(f"{source}.faults[{i}]: a partition must leave some rank on the network: with every "
                                f"rank cut off nobody could notice it (name the partitioned ranks in 'ranks')")
    for i, f in enumerate(sc.faults):
        members = sc.episode_members(f.step) if f.step in steps else frozenset()
        outside = [r for r in f.targets(sc.topology.world) if r not in members]
        if KINDS[f.kind].members_only and outside:
            raise ScenarioError(f"{source}.faults[{i}]: kind {f.kind!r} strikes only members of the groups that fail at "
                                f"step {f.step} ({sorted(members)}: only their replicas are compared in phase 6); "
                                f"rank(s) {outside} are not")


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read scenario file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{p}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return scenario_from_mapping(data, source=p.name)


def scenario_from_job(job: Job, *, source: str = "<job>") -> Scenario:
    """The scenario a job plays (its name, topology, workload and faults), validated as one."""
    return scenario_from_mapping({"name": job.scenario, "topology": job.topology.to_json(),
                                  "workload": job.workload.to_json(), "faults": [f.to_json() for f in job.faults]},
                                 source=source)
