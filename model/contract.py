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
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

#: Failure phases a key may name (C1).  ``boundary`` is the committed optimizer boundary.
FAILURE_PHASES = ("boundary", "forward", "backward", "optimizer")
IN_FLIGHT_PHASES = ("forward", "backward", "optimizer")
LEVELS = ("L1", "L2")
#: The hot-swap facts of a key (C1.2), in the envelope file's field order.
SWAP_FACTS = ("died", "spare", "replica")
#: Where survivors may stand when a rank died for a swap to be qualifiable (C1.2): the committed
#: boundary, or forward/backward, whose uncommitted step is discarded in place.
SWAP_PHASES = ("forward", "backward", "boundary")
#: In-flight phases whose uncommitted step a rank can discard in place (issue 27, C3 rule 1): nothing
#: of the step is committed yet (gradients, the wrapper's pass, RNG and data cursor are all it
#: changed).  Inside ``optimizer.step()`` the update may be half applied: never discardable.
DISCARD_PHASES = ("forward", "backward")
ENVELOPE_FORMAT = "accelpact-envelope/1"


class EnvelopeError(ValueError):
    """An envelope file or mapping is malformed; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class ObservationKey:
    """K = (platform, resource profile, failure phase, objective) (C1), and the hot-swap facts (C1.2):
    ``died`` (a rank of the episode died in training), ``spare`` (a spare is left for each dead rank)
    and ``replica`` (each dead rank has a live replica).  Without a death the facts are all false and
    the key is the classic one."""

    platform: str
    profile: str
    phase: str
    objective: str
    died: bool = False
    spare: bool = False
    replica: bool = False

    def as_tuple(self) -> tuple[str, str, str, str]:
        return (self.platform, self.profile, self.phase, self.objective)

    @property
    def facts(self) -> tuple[str, ...]:
        """The hot-swap facts that hold, by name (empty without a death)."""
        return tuple(n for n in SWAP_FACTS if getattr(self, n))

    def __str__(self) -> str:
        facts = self.facts
        return "(" + ", ".join(self.as_tuple()) + (f"; {', '.join(facts)}" if facts else "") + ")"


@dataclass(frozen=True, slots=True)
class Decision:
    """The contract's answer: a level and the reason, which ends up in traces and exit messages."""

    level: str  # "L1" | "L2"
    reason: str
    #: an L1 that keeps no spare's identity: the dead rank's replica leaves the data-parallel dimension
    #: (issue 41, spec/protocol.md P19; decided by :func:`accelpact.model.hotswap.decide`)
    shrink: bool = False

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
                    **{n: True for n in e.key.facts},
                    "actions": list(e.actions),
                    **({"evidence": dict(e.evidence)} if e.evidence else {}),
                }
                for e in self.entries
            ],
        }


# The key the model and the CPU reference implementation use unless told otherwise.
DEFAULT_PLATFORM = "cpu-gloo"
DEFAULT_PROFILE = "hsdp"
#: The contract's resource profiles: the generic ``hsdp`` of the model's own configurations, and
#: one per data-parallel wrapper, named as the wrapper table names it
#: (``impl/runtime/wrappers.py`` ``WRAPPERS``; ``tests/test_hygiene.py`` checks the two agree, and
#: that the shipped envelope ``model/envelopes/default.json`` covers exactly these).
PROFILES: tuple[str, ...] = (DEFAULT_PROFILE, "fsdp1-hybrid", "fsdp1-zero2", "fsdp2-hybrid", "ddp")
DEFAULT_OBJECTIVE = "zero-replay"


def default_envelope(
    platform: str = DEFAULT_PLATFORM,
    profiles: tuple[str, ...] = PROFILES,
    objective: str = DEFAULT_OBJECTIVE,
) -> Envelope:
    """L1 and L2 at the committed boundary and in forward and backward (discard the uncommitted step
    in place and rerun it, issue 27; evidence: the corpus's ``*-inflight-*`` scenarios, one per wrapper
    and point), L2 only in ``optimizer``, for each profile; and a hot swap (a rank died, a spare left, a live replica: C1.2) L1 and L2 at the boundary, in forward
    and in backward (evidence: the conformance corpus's ``*-spare*`` scenarios, one per wrapper and
    point).  A death without a spare or a replica, or in ``optimizer``, is outside it: L2.

    The shipped default covers ``cpu-gloo`` only: the one platform whose cells this project's
    conformance corpus has run.  Any other platform (``cuda-nccl`` included) is not in it, so every
    failure there is L2, and :func:`decide` says how to qualify it (:func:`unqualified_notice`)."""
    entries = []
    for profile in profiles:
        for phase in FAILURE_PHASES:
            acts = ("L1", "L2") if phase == "boundary" or phase in DISCARD_PHASES else ("L2",)
            entries.append(EnvelopeEntry(ObservationKey(platform, profile, phase, objective), acts))
        for phase in SWAP_PHASES:
            entries.append(EnvelopeEntry(ObservationKey(platform, profile, phase, objective, died=True, spare=True,
                                                        replica=True), ("L1", "L2")))
    return Envelope(tuple(entries))


def unqualified_notice(envelope: Envelope, platform: str) -> str | None:
    """When ``envelope`` has no entry at all for ``platform``: the message that says so, that every
    failure there is L2, and how to qualify it (the platform names its backend after the accelerator,
    ``cuda-nccl``: spec/contract.md C1).  None when the platform has entries.  The engine prints it
    once at attach and :func:`decide` puts it in the reason of each L2 it causes."""
    if any(e.key.platform == platform for e in envelope.entries):
        return None
    backend = platform.split("-", 1)[1] if "-" in platform else platform
    return (f"platform {platform!r} is not qualified in this envelope, so every failure on it is L2 (fail-stop "
            f"restart from the checkpoint). To qualify it, run `accelpact qualify --backend {backend} --out "
            f"envelope.json` on this platform, then pass that file: attach(..., envelope=load_envelope(\"envelope.json\")) "
            f"or the job's \"envelope\" field")


def decide(envelope: Envelope, key: ObservationKey, guards_ok: bool) -> Decision:
    """Map an observation to L1 or L2 (C3).  Order of checks is part of the contract.

    1. a failure inside ``optimizer.step()`` is L2 (the update may be half applied); one in forward
       or backward (:data:`DISCARD_PHASES`) is decided by the envelope like the boundary's: L1 means
       the rank discards its uncommitted step in place and reruns it (RankDiscardStep);
    2. a failed guard is L2 (outstanding gradients, a busy wrapper, tau != F);
    3. a key not in the envelope is L2 (never guessed);
    4. L1 only when the entry lists it.

    A key with ``died`` (a hot swap, C3.2) is decided in this order instead: a phase outside
    :data:`SWAP_PHASES` is L2 (``optimizer.step()`` may be half applied); no spare left is L2; no live
    replica is L2; a failed guard is L2 (after the discard: the survivors stand at the boundary);
    a key not in the envelope is L2; L1 only when the entry lists it.
    """
    if key.phase not in FAILURE_PHASES:
        return Decision("L2", f"unknown failure phase {key.phase!r}")
    if key.died:
        return _decide_swap(envelope, key, guards_ok)
    if key.phase in IN_FLIGHT_PHASES and key.phase not in DISCARD_PHASES:
        return Decision("L2", f"failure in flight ({key.phase}): the optimizer's update may be half applied")
    if key.phase in DISCARD_PHASES:
        return _by_entry(envelope, key, guards_ok, f"failure in {key.phase}: discard the uncommitted step in place "
                         "and rerun it", ": no in-place discard")
    return _by_entry(envelope, key, guards_ok, f"key {key} qualified for L1")


def without_discard(envelope: Envelope, why: str) -> Envelope:
    """``envelope`` with its in-flight cells without a death (forward, backward) narrowed to L2: for
    a job that cannot discard a step in place (the engine needs ``attach(rebuild=...)`` to rebuild
    the wrapper's runtime state of the step).  ``why`` goes into each narrowed entry's evidence."""
    out = []
    for e in envelope.entries:
        k = e.key
        if k.phase in DISCARD_PHASES and not k.died and "L1" in e.actions:
            e = EnvelopeEntry(k, tuple(a for a in e.actions if a != "L1") or ("L2",), {**e.evidence, "narrowed": why})
        out.append(e)
    return Envelope(tuple(out))


def _decide_swap(envelope: Envelope, key: ObservationKey, guards_ok: bool) -> Decision:
    if key.phase not in SWAP_PHASES:
        return Decision("L2", f"a rank died while the survivors were in {key.phase}: the update may be half applied")
    if not key.spare:
        return Decision("L2", "a rank died and no spare is left to take its identity")
    if not key.replica:
        return Decision("L2", "a rank died and none of its replicas lives: its shard exists nowhere else")
    if key.phase in IN_FLIGHT_PHASES:
        why = f"a rank died in {key.phase}: discard the uncommitted step in place, swap in a spare, rerun the step"
    else:
        why = "a rank died at the committed boundary: swap in a spare"
    return _by_entry(envelope, key, guards_ok, why, ": no swap")


def _by_entry(envelope: Envelope, key: ObservationKey, guards_ok: bool, l1_reason: str, l2_suffix: str = "") -> Decision:
    """The last checks of both orders (C3 steps 2-5, C3.5 steps 4-7): the guard, then the envelope's
    entry for ``key``: outside it L2, L1 only where the entry lists it."""
    if not guards_ok:
        return Decision("L2", "guard failed: not a clean committed boundary")
    entry = envelope.lookup(key)
    if entry is None:
        notice = unqualified_notice(envelope, key.platform)
        return Decision("L2", f"key {key} is outside the envelope{l2_suffix}" + (f": {notice}" if notice else ""))
    if "L1" in entry.actions:
        return Decision("L1", l1_reason)
    return Decision("L2", f"key {key} is qualified for L2 only{l2_suffix}")


# ---------------------------------------------------------------------------------------
# Envelope files (C6.1): JSON, or TOML with the same structure.

_ENTRY_FIELDS = {"platform", "profile", "phase", "objective", "actions", "evidence", *SWAP_FACTS}
_TOP_FIELDS = ("format", "entries", "comment", "platform_info")


def _check_evidence(where: str, evidence: Any) -> None:
    """C6.2: the fields ``accelpact qualify`` writes are type-checked; other keys are kept as they are."""
    if not isinstance(evidence, Mapping):
        raise EnvelopeError(f"{where}.evidence: must be an object, got {type(evidence).__name__}")
    for name in ("trials", "passes"):
        if name in evidence:
            value = evidence[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EnvelopeError(f"{where}.evidence.{name}: must be an integer >= 0, got {value!r}")
    if "trials" in evidence and "passes" in evidence and evidence["passes"] > evidence["trials"]:
        raise EnvelopeError(
            f"{where}.evidence.passes: {evidence['passes']} passes exceed {evidence['trials']} trials; "
            "passes counts trials that met the objective"
        )
    if "platform" in evidence:
        plat = evidence["platform"]
        if not isinstance(plat, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in plat.items()):
            raise EnvelopeError(
                f"{where}.evidence.platform: must be an object of strings (e.g. torch, backend, driver versions), got {plat!r}"
            )


def envelope_from_mapping(data: Any, *, source: str = "<envelope>") -> Envelope:
    """Validate and build an envelope; every error names the offending field and location."""
    if not isinstance(data, Mapping):
        raise EnvelopeError(f"{source}: top level must be an object with 'format' and 'entries'")
    unknown = set(data) - set(_TOP_FIELDS)
    if unknown:
        raise EnvelopeError(f"{source}: unknown top-level field(s) {sorted(unknown)}; allowed: {', '.join(_TOP_FIELDS)}")
    if "comment" in data and not isinstance(data["comment"], str):
        raise EnvelopeError(f"{source}: field 'comment' must be a string, got {type(data['comment']).__name__}")
    if "platform_info" in data and not isinstance(data["platform_info"], Mapping):
        raise EnvelopeError(f"{source}: field 'platform_info' must be an object, got {type(data['platform_info']).__name__}")
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
        for name in SWAP_FACTS:
            if name in item and not isinstance(item[name], bool):
                raise EnvelopeError(f"{where}.{name}: must be true or false, got {item[name]!r}")
        facts = {n: bool(item.get(n, False)) for n in SWAP_FACTS}
        if (facts["spare"] or facts["replica"]) and not facts["died"]:
            raise EnvelopeError(f"{where}: 'spare' and 'replica' describe a death; set \"died\": true with them")
        swap = facts["died"] and facts["spare"] and facts["replica"]
        if "L1" in acts and swap and item["phase"] not in SWAP_PHASES:
            raise EnvelopeError(f"{where}.actions: a swap is only qualifiable in {list(SWAP_PHASES)}, not in phase "
                                f"{item['phase']!r} (the update may be half applied); use [\"L2\"]")
        if "L1" in acts and facts["died"] and not swap:
            raise EnvelopeError(f"{where}.actions: L1 after a death needs a spare and a live replica "
                                "(\"spare\": true, \"replica\": true); use [\"L2\"]")
        if "L1" in acts and not facts["died"] and item["phase"] not in ("boundary", *DISCARD_PHASES):
            raise EnvelopeError(
                f"{where}.actions: L1 is only qualifiable at the committed boundary or in {list(DISCARD_PHASES)} (a "
                f"discard in place), not in phase {item['phase']!r} (the update may be half applied); use [\"L2\"]"
            )
        evidence = item.get("evidence", {})
        _check_evidence(where, evidence)
        key = ObservationKey(item["platform"], item["profile"], item["phase"], item["objective"], **facts)
        if key in seen:
            raise EnvelopeError(f"{where}: duplicate key {key} (first at entries[{seen[key]}])")
        seen[key] = i
        entries.append(EnvelopeEntry(key, tuple(acts), dict(evidence)))
    return Envelope(tuple(entries))


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of two equal keys silently; an envelope must not (C6.3)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise EnvelopeError(f"duplicate field {k!r} in one JSON object; write each field once")
        out[k] = v
    return out


def load_envelope(path: str | Path) -> Envelope:
    """Load a ``.json`` or ``.toml`` envelope file; raise :class:`EnvelopeError` naming the problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvelopeError(f"{p}: cannot read envelope file ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise EnvelopeError(f"{p}: not UTF-8 text at byte {exc.start}; save the envelope as UTF-8") from exc
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
            data = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
        except EnvelopeError as exc:
            raise EnvelopeError(f"{p}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise EnvelopeError(f"{p}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return envelope_from_mapping(data, source=str(p))


def load_default_envelope() -> Envelope:
    """The shipped ``model/envelopes/default.json`` (package data; equals ``default_envelope()``)."""
    from importlib.resources import as_file, files

    with as_file(files(__package__ or "accelpact.model").joinpath("envelopes", "default.json")) as p:
        return load_envelope(p)


# TOML writing: the standard library reads TOML but cannot write it, and the envelope
# schema is small (strings, lists of strings, an evidence table of scalars, lists, tables),
# so a schema-limited writer is enough.

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: Any, where: str) -> str:
    if not isinstance(key, str):
        raise EnvelopeError(f"{where}: TOML keys must be strings, got {key!r}")
    return key if _BARE_KEY.fullmatch(key) else _toml_str(key)


def _toml_str(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes; DEL must be escaped in TOML.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_toml_key(k, where)} = {_toml_value(v, f'{where}.{k}')}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise EnvelopeError(f"{where}: {type(value).__name__} value {value!r} cannot be written to TOML; use a JSON envelope")


def envelope_to_toml(envelope: Envelope) -> str:
    """The TOML form of ``envelope.to_json()``: ``format`` then one ``[[entries]]`` table per entry."""
    data = envelope.to_json()
    lines = [f"format = {_toml_str(data['format'])}"]
    if not data["entries"]:
        lines.append("entries = []")  # an empty envelope admits nothing, but is still well formed
    for i, entry in enumerate(data["entries"]):
        lines += ["", "[[entries]]"]
        lines += [f"{k} = {_toml_value(v, f'entries[{i}].{k}')}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def save_envelope(envelope: Envelope, path: str | Path) -> None:
    """Write atomically (unique temp file in the same folder, fsync, rename), so a reader
    never sees half an envelope.  ``.toml`` paths get TOML, every other path JSON."""
    p = Path(path)
    text = envelope_to_toml(envelope) if p.suffix == ".toml" else json.dumps(envelope.to_json(), indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; an envelope is meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
