"""The qualification contract: observation keys, envelopes, and ``decide``.

Spec: ``spec/contract.md`` (ids ``C1``-``C6``).  Pure Python, no I/O beyond reading an
envelope file the caller names.  The implementation calls the same ``decide`` so that
the model and the code cannot disagree about what is admitted.

An envelope admits L1 (preserve in memory, zero replay) only for keys observed at the
committed boundary.  Everything else -- an in-flight failure phase, a key that is not
in the envelope, a failed guard -- is rejected to L2 (fail-stop restart).  Nothing is
guessed: an unknown key is a rejection, not a nearest match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

#: Failure phases a key may name (C1).  ``boundary`` is the committed optimizer boundary.
FAILURE_PHASES = ("boundary", "forward", "backward", "optimizer")
IN_FLIGHT_PHASES = ("forward", "backward", "optimizer")
LEVELS = ("L1", "L2")
ENVELOPE_FORMAT = "accelpact-envelope/1"


class EnvelopeError(ValueError):
    """An envelope file or mapping is malformed; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class ObservationKey:
    """K = (platform, resource profile, failure phase, objective) (C1)."""

    platform: str
    profile: str
    phase: str
    objective: str

    def as_tuple(self) -> tuple[str, str, str, str]:
        return (self.platform, self.profile, self.phase, self.objective)

    def __str__(self) -> str:
        return "(" + ", ".join(self.as_tuple()) + ")"


@dataclass(frozen=True, slots=True)
class Decision:
    """The contract's answer: a level and the reason, which ends up in traces and exit messages."""

    level: str  # "L1" | "L2"
    reason: str

    @property
    def preserve(self) -> bool:
        return self.level == "L1"


@dataclass(frozen=True, slots=True)
class EnvelopeEntry:
    key: ObservationKey
    actions: tuple[str, ...]  # qualified levels, subset of LEVELS
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A set of qualified entries, looked up by exact key (C2)."""

    entries: tuple[EnvelopeEntry, ...] = ()

    def lookup(self, key: ObservationKey) -> EnvelopeEntry | None:
        for entry in self.entries:
            if entry.key == key:
                return entry
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ENVELOPE_FORMAT,
            "entries": [
                {
                    "platform": e.key.platform,
                    "profile": e.key.profile,
                    "phase": e.key.phase,
                    "objective": e.key.objective,
                    "actions": list(e.actions),
                    **({"evidence": dict(e.evidence)} if e.evidence else {}),
                }
                for e in self.entries
            ],
        }


# The key the model and the CPU reference implementation use unless told otherwise.
DEFAULT_PLATFORM = "cpu-gloo"
DEFAULT_PROFILE = "hsdp"
DEFAULT_OBJECTIVE = "zero-replay"


def default_envelope(
    platform: str = DEFAULT_PLATFORM,
    profiles: tuple[str, ...] = ("hsdp", "fsdp1-hybrid", "fsdp2-hybrid", "ddp"),
    objective: str = DEFAULT_OBJECTIVE,
) -> Envelope:
    """L1 and L2 at the committed boundary, L2 for every in-flight phase, for each profile."""
    entries = []
    for profile in profiles:
        for phase in FAILURE_PHASES:
            acts = ("L1", "L2") if phase == "boundary" else ("L2",)
            entries.append(EnvelopeEntry(ObservationKey(platform, profile, phase, objective), acts))
    return Envelope(tuple(entries))


def decide(envelope: Envelope, key: ObservationKey, guards_ok: bool, *, admit_inflight: bool = False) -> Decision:
    """Map an observation to L1 or L2 (C3).  Order of checks is part of the contract.

    1. an in-flight failure phase is L2 (the optimizer state may be half-applied);
    2. a failed guard is L2 (outstanding gradients, a busy wrapper, tau != F);
    3. a key not in the envelope is L2 (never guessed);
    4. L1 only when the entry lists it.

    ``admit_inflight`` exists only for the ``admit-inflight`` mutant.
    """
    if key.phase not in FAILURE_PHASES:
        return Decision("L2", f"unknown failure phase {key.phase!r}")
    if key.phase in IN_FLIGHT_PHASES and not admit_inflight:
        return Decision("L2", f"failure in flight ({key.phase}): not at a committed boundary")
    if not guards_ok:
        return Decision("L2", "guard failed: not a clean committed boundary")
    probe = key if not admit_inflight else ObservationKey(key.platform, key.profile, "boundary", key.objective)
    entry = envelope.lookup(probe)
    if entry is None:
        return Decision("L2", f"key {key} is outside the envelope")
    if "L1" in entry.actions:
        return Decision("L1", f"key {key} qualified for L1")
    return Decision("L2", f"key {key} is qualified for L2 only")


# ---------------------------------------------------------------------------------------
# Envelope files (C4): JSON, or TOML with the same structure.

_ENTRY_FIELDS = {"platform", "profile", "phase", "objective", "actions", "evidence"}


def envelope_from_mapping(data: Any, *, source: str = "<envelope>") -> Envelope:
    """Validate and build an envelope; every error names the offending field and location."""
    if not isinstance(data, Mapping):
        raise EnvelopeError(f"{source}: top level must be an object with 'format' and 'entries'")
    unknown = set(data) - {"format", "entries", "comment", "platform_info"}
    if unknown:
        raise EnvelopeError(f"{source}: unknown top-level field(s) {sorted(unknown)}; allowed: format, entries, comment, platform_info")
    fmt = data.get("format")
    if fmt != ENVELOPE_FORMAT:
        raise EnvelopeError(f"{source}: field 'format' must be {ENVELOPE_FORMAT!r}, got {fmt!r}")
    raw = data.get("entries")
    if not isinstance(raw, list):
        raise EnvelopeError(f"{source}: field 'entries' must be a list of entry objects")
    entries: list[EnvelopeEntry] = []
    seen: dict[ObservationKey, int] = {}
    for i, item in enumerate(raw):
        where = f"{source}: entries[{i}]"
        if not isinstance(item, Mapping):
            raise EnvelopeError(f"{where}: must be an object")
        extra = set(item) - _ENTRY_FIELDS
        if extra:
            raise EnvelopeError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {sorted(_ENTRY_FIELDS)}")
        for name in ("platform", "profile", "phase", "objective"):
            value = item.get(name)
            if not isinstance(value, str) or not value:
                raise EnvelopeError(f"{where}.{name}: required non-empty string, got {value!r}")
        if item["phase"] not in FAILURE_PHASES:
            raise EnvelopeError(f"{where}.phase: {item['phase']!r} is not one of {list(FAILURE_PHASES)}")
        acts = item.get("actions")
        if not isinstance(acts, list) or not acts or not all(a in LEVELS for a in acts):
            raise EnvelopeError(f"{where}.actions: must be a non-empty list drawn from {list(LEVELS)}, got {acts!r}")
        if len(set(acts)) != len(acts):
            raise EnvelopeError(f"{where}.actions: duplicate level in {acts!r}")
        if "L1" in acts and item["phase"] != "boundary":
            raise EnvelopeError(
                f"{where}.actions: L1 is only qualifiable at the committed boundary, not in phase {item['phase']!r}; "
                "use [\"L2\"] for in-flight phases"
            )
        evidence = item.get("evidence", {})
        if not isinstance(evidence, Mapping):
            raise EnvelopeError(f"{where}.evidence: must be an object")
        key = ObservationKey(item["platform"], item["profile"], item["phase"], item["objective"])
        if key in seen:
            raise EnvelopeError(f"{where}: duplicate key {key} (first at entries[{seen[key]}])")
        seen[key] = i
        entries.append(EnvelopeEntry(key, tuple(acts), dict(evidence)))
    return Envelope(tuple(entries))


def load_envelope(path: str | Path) -> Envelope:
    """Load a ``.json`` or ``.toml`` envelope file; raise :class:`EnvelopeError` naming the problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise EnvelopeError(f"{p}: cannot read envelope file ({exc.strerror})") from exc
    if p.suffix == ".toml":
        try:
            import tomllib  # Python 3.11+
        except ModuleNotFoundError:  # pragma: no cover - 3.10
            raise EnvelopeError(f"{p}: TOML envelopes need Python >= 3.11; use JSON") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise EnvelopeError(f"{p}: not valid TOML: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EnvelopeError(f"{p}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return envelope_from_mapping(data, source=str(p))


def save_envelope(envelope: Envelope, path: str | Path) -> None:
    """Write atomically (temp file + rename), so a reader never sees half an envelope."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(envelope.to_json(), indent=2, sort_keys=False) + "\n")
    tmp.replace(p)
