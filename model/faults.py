"""The fault vocabulary: where a fault may strike, every kind of fault under each of its names, and
the ``Fault`` record with its one validator.

One table, :data:`FAULTS`, names each kind of fault once (spec/implementation.md, "Where things go"):
its name in scenarios and jobs (``Fault.kind``), the model's fault kind it is
(``ActionSpec.fault_kind``, ``Config.faults``) and the model action it is recorded as, the points
where a scenario may schedule it, the soak's name for it, and what the scenario mapping and the
checker need to know of it.  Every other table of kinds is derived from it, never written again:

* :data:`KINDS`: the kinds a scenario or a job may name (those with points), name -> :class:`FaultKind`;
* :data:`MODEL_KINDS`: the model's fault kinds (``model.protocol.FAULT_KINDS``), in the table's order;
* :data:`MODEL_KIND`: the one translation of a scenario kind into the model's (``collective_timeout``
  is ``group_fail``, ``exception`` is ``raise``, ``corrupt_state`` is ``corrupt``, ``link_cut`` is ``link``);
* :data:`MODEL_ONLY_KINDS`: the model's kinds that no scenario names (the network's message faults);
* :data:`SOAK_KINDS`: the kinds the soak draws, by the soak's name (``cut_group`` is ``collective_timeout``
  struck from outside the rank, ``cut_link`` is ``link_cut``), with what each is.

A fault is ``{"step": 5, "at": "boundary", "kind": "collective_timeout", "ranks": [1],
"group": "replicate", "attempt": 0}``: at the ``at`` point of ``step`` in torchrun attempt
``attempt``, on ``ranks`` (omitted or empty: every rank), ``group`` naming the group a
``collective_timeout`` breaks.  How each kind takes effect is the injector's
(:mod:`accelpact.testing.faults`); this module is pure data, torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .contract import IN_FLIGHT_PHASES
from .state import PC_GUARDED, PC_OBSERVED, PC_TRAIN

__all__ = [
    "FAULTS", "FAULT_ACTION", "FAULT_FIELDS", "FAULT_POINTS", "Fault", "FaultError", "FaultKind", "IN_FLIGHT", "KINDS",
    "MODEL_KIND", "MODEL_KINDS", "MODEL_ONLY_KINDS", "RECOVERY_POINTS", "SOAK_KINDS", "SOAK_KIND", "TRIGGER_POINTS",
    "model_kinds", "parse_faults",
]

# --------------------------------------------------------------------------------------------- points
#: In flight: inside ``with pact.step(...)`` (forward, backward, ``optimizer.step()``), as the contract names them.
IN_FLIGHT: tuple[str, ...] = tuple(IN_FLIGHT_PHASES)
#: Where a failure of R can start a recovery episode.
TRIGGER_POINTS: tuple[str, ...] = IN_FLIGHT + ("boundary",)
#: Inside the six phases (a fault there needs a trigger at the same step to start the recovery it strikes in).
RECOVERY_POINTS: tuple[str, ...] = ("guard", "agree", "replace", "rebind", "validate", "release")
FAULT_POINTS: tuple[str, ...] = TRIGGER_POINTS + RECOVERY_POINTS


class FaultError(ValueError):
    """A fault is malformed; the message names the field (``faults[2].at``) and what to write."""


# ---------------------------------------------------------------------------------------------- kinds
@dataclass(frozen=True, slots=True)
class FaultKind:
    """One kind of fault under each of its names.

    ``name``: its name in scenarios and jobs (``Fault.kind``); ``model``: the model's fault kind it is
    (None: no fault to the protocol, e.g. a straggler, or one outside the model, an idle spare's
    death); ``action``: the model action it is recorded as outside a trigger point; ``points``: where
    a scenario or job may schedule it (empty: none names it: the model's own message faults, the
    soak's own kinds); ``soak``: the soak's name for it (None: the soak does not draw it).

    ``failure``: at a trigger point this kind *is* the failure of R that starts the episode (the
    model's ``FaultGroupFail``), not a separate fault action.  ``windows``: the pcs in which the
    model's action for it is enabled, when narrower than the point's window (None: the point's).
    ``members_only``: it can strike only members of the failing group R (the model's action is
    enabled only there).  ``breaks_group``: it acts on the group its fault names (``Fault.group``).
    ``job_wide``: its model action has no actor (the store's loss): the rank only triggers it.
    ``pair``: it names exactly two ranks, the ends of a link (``ranks: [a, b]``, a < b, two nodes).
    """

    name: str
    model: str | None
    action: str | None
    points: tuple[str, ...] = ()
    soak: str | None = None
    failure: bool = False
    windows: tuple[str, ...] | None = None
    members_only: bool = False
    breaks_group: bool = False
    job_wide: bool = False
    pair: bool = False
    doc: str = ""


_STOPPED_POINTS = ("boundary", "agree", "validate")

#: The one table of fault kinds, grouped by the model's fault kind in the model's order.
FAULTS: tuple[FaultKind, ...] = (
    FaultKind("collective_timeout", "group_fail", "FaultGroupFail", TRIGGER_POINTS, soak="cut_group", failure=True,
              breaks_group=True, doc="the group's connections are shut down: its collectives fail"),
    FaultKind("nccl_timeout", "group_fail", "FaultGroupFail", ("boundary",), failure=True, breaks_group=True,
              doc="NCCL only: the group's boundary collective queued behind a device spin longer than its timeout"),
    FaultKind("crash", "crash", "FaultCrash", FAULT_POINTS, soak="crash", doc="SIGKILL of the rank"),
    # a stopped process, a held GIL and a silent partition are, to the protocol, a crash: the rank takes
    # no step and sends nothing (its watchdog cannot run); they differ from it in that the process lives on
    FaultKind("stop", "crash", "FaultCrash", _STOPPED_POINTS, soak="stop",
              doc="SIGSTOP of the rank: every thread stops; peers' detectors declare it dead"),
    FaultKind("gil_hang", "crash", "FaultCrash", _STOPPED_POINTS, soak="gil_hang",
              doc="the rank's main thread holds the GIL forever: no Python thread runs"),
    FaultKind("partition", "crash", "FaultCrash", _STOPPED_POINTS, soak="partition",
              doc="a silent network partition of the rank: its link down, every frame dropped, no reset"),
    FaultKind("hang", "hang", "FaultHang", FAULT_POINTS, doc="the rank's main thread stops making progress"),
    FaultKind("exception", "raise", "FaultRaise", FAULT_POINTS, failure=True,
              doc="an exception raised at the point (in flight or at the boundary: the failure of the step)"),
    FaultKind("frontier_mismatch", "mismatch", "FaultMismatch", ("boundary", "guard", "agree"),
              windows=(PC_TRAIN, PC_OBSERVED, PC_GUARDED), doc="the rank reports F+1 at the agreement"),
    FaultKind("dirty_guard", "dirty_guard", "FaultDirtyGuard", ("boundary", "guard"), windows=(PC_TRAIN, PC_OBSERVED),
              doc="a stale gradient and a busy wrapper at the guard check"),
    FaultKind("delay", "delay", "FaultDelay", doc="a control-plane message delayed (the model's network)"),
    FaultKind("drop", "drop", "FaultDrop", doc="a control-plane message lost (the model's network)"),
    FaultKind("corrupt_state", "corrupt", "FaultCorrupt", ("boundary",), windows=(PC_TRAIN, PC_OBSERVED),
              members_only=True, doc="one bit of the rank's local parameter shard flipped after the commit: replicas disagree"),
    FaultKind("store_loss", "store_loss", "FaultStoreLoss", RECOVERY_POINTS, soak="store_loss", job_wide=True,
              doc="the process serving the control-plane store is killed (SIGKILL): every store operation fails"),
    # a physical fault (issue 25, P18.2): its model action is its own, not the group failure it causes
    FaultKind("link_cut", "link", "FaultLinkCut", TRIGGER_POINTS, soak="cut_link", pair=True,
              doc="every connection between two ranks on two nodes is shut down: every group across the link fails"),
    FaultKind("crash_spare", None, None, soak="crash_spare",
              doc="SIGKILL of an idle spare (the job goes on with one spare fewer; outside the model)"),
    FaultKind("slow", None, None, soak="slow",
              doc="a straggler: the rank's main thread sleeps below the hang threshold (must NOT be a fault)"),
)

#: kind -> FaultKind: the kinds a scenario or a job may name (``Fault.kind``)
KINDS: dict[str, FaultKind] = {k.name: k for k in FAULTS if k.points}
#: the model's fault kinds (``model.protocol.FAULT_KINDS``), in the table's order
MODEL_KINDS: tuple[str, ...] = tuple(dict.fromkeys(k.model for k in FAULTS if k.model is not None))
#: scenario kind -> the model's fault kind: the one translation between the two vocabularies
MODEL_KIND: dict[str, str] = {k.name: k.model for k in KINDS.values() if k.model is not None}
#: the model's fault kinds that no scenario names (its network's message faults)
MODEL_ONLY_KINDS: frozenset[str] = frozenset(MODEL_KINDS) - frozenset(MODEL_KIND.values())
#: scenario kind -> the model action it is recorded as (outside a trigger point)
FAULT_ACTION: dict[str, str] = {k.name: k.action for k in KINDS.values() if k.action is not None}
#: the soak's name -> FaultKind: the kinds the soak draws
SOAK_KIND: dict[str, FaultKind] = {k.soak: k for k in FAULTS if k.soak is not None}
#: the soak's name -> what it is (``accelpact soak --kinds``)
SOAK_KINDS: dict[str, str] = {name: k.doc for name, k in SOAK_KIND.items()}


def model_kinds(kinds: Iterable[str]) -> frozenset[str]:
    """The model's fault kinds (``Config.faults``) of scenario kinds; raises FaultError on an unknown one."""
    unknown = sorted(set(kinds) - set(MODEL_KIND))
    if unknown:
        raise FaultError(f"fault kinds {unknown} are not among {list(KINDS)}")
    return frozenset(MODEL_KIND[k] for k in kinds)


# ---------------------------------------------------------------------------------------------- Fault
FAULT_FIELDS = ("step", "at", "kind", "ranks", "group", "attempt")


def _int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultError(f"{where}: must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise FaultError(f"{where}: must be {f'>= {lo}' if hi is None else f'in [{lo}, {hi}]'}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault (see the module doc).  The same type serves the injector's plan, the job
    and the scenario format; :meth:`parse` is its one validator."""

    step: int
    at: str
    kind: str
    ranks: tuple[int, ...] = ()
    group: str = "replicate"
    attempt: int = 0

    @classmethod
    def parse(cls, raw: Any, where: str = "fault", *, world: int | None = None, steps: int | None = None,
              groups: Iterable[str] | None = None) -> "Fault":
        """Validate one fault mapping.  ``world``/``steps`` bound ``ranks``/``step`` when known;
        ``groups``: the group names a ``collective_timeout`` may break.  Errors name the field."""
        if not isinstance(raw, Mapping):
            raise FaultError(f"{where}: must be an object with fields {list(FAULT_FIELDS)}, got {type(raw).__name__}")
        unknown = set(raw) - set(FAULT_FIELDS)
        if unknown:
            raise FaultError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {list(FAULT_FIELDS)}")
        for k in ("step", "at", "kind"):
            if k not in raw:
                raise FaultError(f"{where}: missing required field {k!r}")
        step = _int(f"{where}.step", raw["step"], 0, None if steps is None else steps - 1)
        at, kind = raw["at"], raw["kind"]
        if at not in FAULT_POINTS:
            raise FaultError(f"{where}.at: {at!r} is not one of {list(FAULT_POINTS)}")
        if kind not in KINDS:
            raise FaultError(f"{where}.kind: {kind!r} is not one of {list(KINDS)}")
        if at not in KINDS[kind].points:
            allowed = [k for k, fk in KINDS.items() if at in fk.points]
            raise FaultError(f"{where}: kind {kind!r} cannot be injected at {at!r}; allowed there: {allowed}")
        ranks = raw.get("ranks", [])
        if not isinstance(ranks, (list, tuple)):
            raise FaultError(f"{where}.ranks: must be a list of ranks (omit it for every rank), got {ranks!r}")
        for j, r in enumerate(ranks):
            _int(f"{where}.ranks[{j}]", r, 0, None if world is None else world - 1)
        if len(set(ranks)) != len(ranks):
            raise FaultError(f"{where}.ranks: duplicate rank in {list(ranks)}")
        known = tuple(groups) if groups is not None else None
        group = raw.get("group", known[0] if known else "replicate")
        # only a kind that breaks a group names one that must exist; for the others it is ignored
        if not isinstance(group, str) or (KINDS[kind].breaks_group and known is not None and group not in known):
            raise FaultError(f"{where}.group: {group!r} is not a group this job can break; use one of {list(known or ())}")
        attempt = _int(f"{where}.attempt", raw.get("attempt", 0), 0)
        if KINDS[kind].pair and len(ranks) != 2:
            raise FaultError(f"{where}.ranks: kind {kind!r} names the two ends of the link, e.g. [0, 2]; got {list(ranks)}")
        return cls(step, at, kind, tuple(sorted(ranks)), group, attempt)

    @classmethod
    def parse_flag(cls, text: str, where: str = "--fault") -> "Fault":
        """A fault written as a command-line flag: ``KIND@POINT:STEP[:RANKS[:GROUP]]``, RANKS a
        comma-separated list (empty: every rank); e.g. ``collective_timeout@boundary:3:0,2`` (R's
        sockets cut on ranks 0 and 2 at step 3's boundary) or ``crash@backward:4:1``.  Validated by
        :meth:`parse`; errors name the flag and show the format."""
        form = "KIND@POINT:STEP[:RANKS[:GROUP]], e.g. collective_timeout@boundary:3:0,2"
        if not isinstance(text, str):
            raise FaultError(f"{where}: must be a string {form}, got {text!r}")
        kind, at_sign, rest = text.strip().partition("@")
        parts = rest.split(":")
        if not at_sign or not kind or len(parts) < 2 or len(parts) > 4:
            raise FaultError(f"{where}: {text!r} is not {form}")
        raw: dict[str, Any] = {"kind": kind, "at": parts[0]}
        try:
            raw["step"] = int(parts[1])
            if len(parts) > 2 and parts[2].strip():
                raw["ranks"] = [int(r) for r in parts[2].split(",")]
        except ValueError:
            raise FaultError(f"{where}: {text!r}: STEP and RANKS must be integers ({form})") from None
        if len(parts) > 3:
            raw["group"] = parts[3]
        return cls.parse(raw, f"{where} {text!r}")

    def to_json(self) -> dict[str, Any]:
        """The fault dict (the scenario format's and the job's): fixed field order; ``attempt``
        only when not 0."""
        out: dict[str, Any] = {"step": self.step, "at": self.at, "kind": self.kind, "ranks": list(self.ranks),
                               "group": self.group}
        if self.attempt:
            out["attempt"] = self.attempt
        return out

    def targets(self, world: int) -> tuple[int, ...]:
        """The ranks it strikes: ``ranks``, or every rank when empty."""
        return self.ranks or tuple(range(world))

    def strikes(self, rank: int) -> bool:
        return not self.ranks or rank in self.ranks

    @property
    def is_trigger(self) -> bool:
        """At a trigger point: the fault's step starts a recovery episode."""
        return self.at in TRIGGER_POINTS

    @property
    def is_failure(self) -> bool:
        """This fault is the failure of R itself (the model's FaultGroupFail), not a separate fault."""
        return self.is_trigger and KINDS[self.kind].failure

    @property
    def action(self) -> str:
        """The model action this fault is recorded as."""
        action = "FaultGroupFail" if self.is_failure else KINDS[self.kind].action
        assert action is not None, f"fault kind {self.kind!r} has no model action"  # every kind with points has one
        return action


def parse_faults(items: Any, where: str = "faults", **bounds: Any) -> tuple[Fault, ...]:
    """A list of fault mappings (or Faults) -> Faults, each validated with :meth:`Fault.parse`."""
    if items is None:
        return ()
    if not isinstance(items, (list, tuple)):
        raise FaultError(f"{where}: must be a list of fault objects, got {type(items).__name__}")
    return tuple(f if isinstance(f, Fault) else Fault.parse(f, f"{where}[{i}]", **bounds) for i, f in enumerate(items))
