"""The qualification contract (spec/contract.md, C1-C6): decide() and envelope files.

C1 observation key, C2 exact lookup, C3 order of checks in decide(), C5.3 L2 always listed,
C6.1 file format (JSON/TOML, atomic save, shipped default), C6.2 evidence,
C6.3 malformed files raise EnvelopeError naming the field.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelpact.model.contract import (
    DISCARD_PHASES,
    ENVELOPE_FORMAT,
    FAILURE_PHASES,
    SWAP_PHASES,
    Envelope,
    EnvelopeEntry,
    EnvelopeError,
    ObservationKey,
    decide,
    without_discard,
    default_envelope,
    envelope_from_mapping,
    envelope_to_toml,
    load_default_envelope,
    load_envelope,
    save_envelope,
)

pytestmark = pytest.mark.timeout(120)

K = ObservationKey("cpu-gloo", "hsdp", "boundary", "zero-replay")


def _key(phase: str, profile: str = "hsdp") -> ObservationKey:
    return ObservationKey("cpu-gloo", profile, phase, "zero-replay")


def _entry(**over) -> dict:
    e = {"platform": "cpu-gloo", "profile": "hsdp", "phase": "boundary", "objective": "zero-replay", "actions": ["L1", "L2"]}
    e.update(over)
    return e


def _doc(*entries: dict, **top) -> dict:
    d = {"format": ENVELOPE_FORMAT, "entries": list(entries) if entries else [_entry()]}
    d.update(top)
    return d


# --------------------------------------------------------------------------------------
# C1/C2/C3: decide()

def test_c3_boundary_in_envelope_is_l1():
    d = decide(default_envelope(), K, guards_ok=True)
    assert d.level == "L1" and d.preserve


@pytest.mark.parametrize("phase", DISCARD_PHASES)
def test_c3_in_flight_is_decided_by_the_envelope_in_forward_and_backward(phase):
    """C3 step 1 (issue 27): forward and backward are decided as the boundary is (guard, then the
    envelope's entry): L1 means discard the step in place and rerun it; a failed guard or an unknown
    key is L2, naming why."""
    d = decide(default_envelope(), _key(phase), guards_ok=True)
    assert d.level == "L1" and "discard" in d.reason and phase in d.reason
    assert "guard" in decide(default_envelope(), _key(phase), guards_ok=False).reason
    assert "outside the envelope" in decide(Envelope(), _key(phase), guards_ok=True).reason
    narrowed = without_discard(default_envelope(), "no rebuild")
    assert decide(narrowed, _key(phase), guards_ok=True).level == "L2"
    assert decide(narrowed, _key("boundary"), guards_ok=True).level == "L1"


def test_c3_optimizer_is_l2_even_if_guard_fails_and_key_unknown():
    """C3 step 1 comes first for optimizer.step(): the reason names the in-flight phase."""
    for env, guards_ok in ((default_envelope(), True), (default_envelope(), False), (Envelope(), False)):
        d = decide(env, _key("optimizer"), guards_ok=guards_ok)
        assert d.level == "L2" and "in flight" in d.reason and "optimizer" in d.reason


def test_c3_failed_guard_beats_unknown_key():
    """C3 step 2 before step 3: a dirty guard on an unknown key reports the guard."""
    d = decide(Envelope(), K, guards_ok=False)
    assert d.level == "L2" and "guard" in d.reason


def test_c3_unknown_key_is_l2_never_guessed():
    """C2: lookup is exact; a near key (other profile, platform or objective) is not admitted."""
    env = default_envelope()
    for key in (
        ObservationKey("cuda-nccl", "hsdp", "boundary", "zero-replay"),
        ObservationKey("cpu-gloo", "fsdp3", "boundary", "zero-replay"),
        ObservationKey("cpu-gloo", "hsdp", "boundary", "bounded-replay"),
        ObservationKey("CPU-GLOO", "hsdp", "boundary", "zero-replay"),
    ):
        d = decide(env, key, guards_ok=True)
        assert d.level == "L2" and "outside the envelope" in d.reason, key


def test_c3_unknown_phase_is_l2():
    d = decide(default_envelope(), _key("backward-hook"), guards_ok=True)
    assert d.level == "L2" and "unknown failure phase" in d.reason


def test_c3_l1_only_if_listed():
    env = envelope_from_mapping(_doc(_entry(actions=["L2"])))
    d = decide(env, K, guards_ok=True)
    assert d.level == "L2" and "L2 only" in d.reason
    env = envelope_from_mapping(_doc(_entry(actions=["L1"])))
    assert decide(env, K, guards_ok=True).level == "L1"


def test_c3_in_flight_is_l2_even_where_the_envelope_lists_l1():
    """C3 rule 1 comes before the envelope: an envelope that (wrongly) lists L1 for an in-flight
    phase still gets L2 (the admit-inflight mutant, model/mutants.py, is the broken variant)."""
    # the file format refuses such an entry (envelope_from_mapping); built directly, decide must still refuse it
    env = Envelope((EnvelopeEntry(_key("optimizer"), ("L1", "L2")),))
    d = decide(env, _key("optimizer"), guards_ok=True)
    assert d.level == "L2" and "in flight" in d.reason


def test_c1_default_envelope_shape():
    """C1, C5.3: every profile has one entry per failure phase; L1 at the boundary and in forward and
    backward (discard in place), not in optimizer; L2 everywhere.
    C1.2: and one hot-swap entry (died, spare, replica) per swappable phase, L1 and L2."""
    env = default_envelope()
    profiles = {e.key.profile for e in env.entries}
    assert profiles == {"hsdp", "fsdp1-hybrid", "fsdp1-zero2", "fsdp2-hybrid", "ddp"}
    classic = [e for e in env.entries if not e.key.died]
    swaps = [e for e in env.entries if e.key.died]
    assert len(classic) == len(profiles) * len(FAILURE_PHASES)
    assert sorted((e.key.profile, e.key.phase) for e in swaps) == sorted((p, ph) for p in profiles for ph in SWAP_PHASES)
    for e in classic:
        assert ("L1" in e.actions) == (e.key.phase != "optimizer")
        assert "L2" in e.actions
    for e in swaps:
        assert e.key.spare and e.key.replica and e.actions == ("L1", "L2")


@pytest.mark.parametrize("phase,spare,replica,guards,level,why", [
    ("backward", True, True, True, "L1", "discard the uncommitted step"),
    ("boundary", True, True, True, "L1", "swap in a spare"),
    ("optimizer", True, True, True, "L2", "half applied"),
    ("backward", False, True, True, "L2", "no spare"),
    ("backward", True, False, True, "L2", "none of its replicas"),
    ("backward", True, True, False, "L2", "guard failed"),
])
def test_c3_5_a_death_is_decided_on_the_hot_swap_facts(phase, spare, replica, guards, level, why):
    """C3.5: with ``died`` the key's facts decide, in order, and the envelope's swap entry admits L1."""
    key = ObservationKey("cpu-gloo", "fsdp1-hybrid", phase, "zero-replay", died=True, spare=spare, replica=replica)
    d = decide(default_envelope(), key, guards_ok=guards)
    assert d.level == level and why in d.reason, d


def test_c3_5_a_swap_outside_the_envelope_is_l2_and_the_file_format_refuses_bad_swap_entries():
    key = ObservationKey("cpu-gloo", "ddp", "boundary", "zero-replay", died=True, spare=True, replica=True)
    classic_only = Envelope(tuple(e for e in default_envelope().entries if not e.key.died))
    assert decide(classic_only, key, True).level == "L2"
    base = {"platform": "cpu-gloo", "profile": "ddp", "objective": "zero-replay", "actions": ["L1"]}
    for bad, needle in (({**base, "phase": "optimizer", "died": True, "spare": True, "replica": True}, "only qualifiable in"),
                        ({**base, "phase": "backward", "died": True, "spare": True}, "needs a spare and a live replica"),
                        ({**base, "phase": "backward", "spare": True, "replica": True}, "set \"died\": true"),
                        ({**base, "phase": "boundary", "died": "yes"}, "must be true or false")):
        with pytest.raises(EnvelopeError, match=needle):
            envelope_from_mapping({"format": ENVELOPE_FORMAT, "entries": [bad]})
    # a swap entry round-trips through the file format
    env = envelope_from_mapping(default_envelope().to_json())
    assert env == default_envelope()


keys = st.builds(
    ObservationKey,
    st.sampled_from(["cpu-gloo", "cuda-nccl", "x"]),
    st.sampled_from(["hsdp", "ddp", "fsdp2-hybrid", "y"]),
    st.sampled_from(FAILURE_PHASES + ("weird",)),
    st.sampled_from(["zero-replay", "z"]),
)


@given(key=keys, guards_ok=st.booleans())
def test_c3_decide_is_l1_exactly_when_all_checks_pass(key, guards_ok):
    """C3 as a property: L1 iff not inside optimizer.step(), guards pass, key listed with L1."""
    env = default_envelope()
    entry = env.lookup(key)
    want = key.phase != "optimizer" and guards_ok and entry is not None and "L1" in entry.actions
    assert decide(env, key, guards_ok=guards_ok).preserve == want


# --------------------------------------------------------------------------------------
# C6.3 (and C6.2 evidence types): malformed envelopes raise EnvelopeError naming the field

@pytest.mark.parametrize(
    "doc, names",
    [
        ([], "top level"),
        ({"entries": []}, "'format'"),
        (_doc(format="accelpact-envelope/2"), "'format'"),
        ({"format": ENVELOPE_FORMAT}, "'entries'"),
        ({"format": ENVELOPE_FORMAT, "entries": {"a": 1}}, "'entries'"),
        (_doc(extra=1), "extra"),
        (_doc(comment=3), "'comment'"),
        (_doc(platform_info="torch"), "'platform_info'"),
        (_doc("not an object"), "entries[0]"),
        (_doc({k: v for k, v in _entry().items() if k != "platform"}), "entries[0].platform"),
        (_doc({k: v for k, v in _entry().items() if k != "objective"}), "entries[0].objective"),
        (_doc({k: v for k, v in _entry().items() if k != "actions"}), "entries[0].actions"),
        (_doc(_entry(profile=7)), "entries[0].profile"),
        (_doc(_entry(profile="")), "entries[0].profile"),
        (_doc(_entry(phase="somewhere")), "entries[0].phase"),
        (_doc(_entry(actions="L1")), "entries[0].actions"),
        (_doc(_entry(actions=[])), "entries[0].actions"),
        (_doc(_entry(actions=["L3"])), "entries[0].actions"),
        (_doc(_entry(actions=["L2", "L2"])), "entries[0].actions"),
        (_doc(_entry(colour="red")), "colour"),
        (_doc(_entry(evidence=[1])), "entries[0].evidence"),
        (_doc(_entry(evidence={"trials": "20"})), "entries[0].evidence.trials"),
        (_doc(_entry(evidence={"trials": -1})), "entries[0].evidence.trials"),
        (_doc(_entry(evidence={"trials": True})), "entries[0].evidence.trials"),
        (_doc(_entry(evidence={"trials": 2, "passes": 3})), "entries[0].evidence.passes"),
        (_doc(_entry(evidence={"platform": {"torch": 2.13}})), "entries[0].evidence.platform"),
        (_doc(_entry(), _entry(phase="forward", actions=["L2"]), _entry(actions=["L2"])), "entries[2]: duplicate key"),
    ],
)
def test_c63_malformed_mapping_names_the_field(doc, names):
    with pytest.raises(EnvelopeError) as exc:
        envelope_from_mapping(doc, source="t.json")
    assert names in str(exc.value), str(exc.value)
    assert str(exc.value).startswith("t.json")


def test_c63_l1_inside_the_optimizer_step_rejected():
    with pytest.raises(EnvelopeError, match=r"entries\[0\]\.actions: L1 is only qualifiable.*'optimizer'"):
        envelope_from_mapping(_doc(_entry(phase="optimizer", actions=["L1", "L2"])))
    for phase in DISCARD_PHASES:  # a discard in place (issue 27)
        assert envelope_from_mapping(_doc(_entry(phase=phase, actions=["L1", "L2"]))).entries[0].actions == ("L1", "L2")


def test_c63_invalid_json_names_line(tmp_path: Path):
    p = tmp_path / "env.json"
    p.write_text('{"format": "accelpact-envelope/1",\n "entries": [,]}')
    with pytest.raises(EnvelopeError, match=r"not valid JSON: line 2 column"):
        load_envelope(p)


def test_c63_duplicate_json_field_rejected(tmp_path: Path):
    """json.loads would silently keep the last 'phase'; the loader must not."""
    p = tmp_path / "env.json"
    p.write_text(
        '{"format": "accelpact-envelope/1", "entries": [{"platform": "cpu-gloo", "profile": "hsdp", '
        '"phase": "forward", "phase": "boundary", "objective": "zero-replay", "actions": ["L1"]}]}'
    )
    with pytest.raises(EnvelopeError, match=r"duplicate field 'phase'"):
        load_envelope(p)


def test_c63_invalid_toml(tmp_path: Path):
    p = tmp_path / "env.toml"
    p.write_text('format = "accelpact-envelope/1"\n[[entries]\nplatform = "cpu-gloo"\n')
    with pytest.raises(EnvelopeError, match=r"env\.toml: not valid TOML"):
        load_envelope(p)


def test_c63_duplicate_toml_field_rejected(tmp_path: Path):
    p = tmp_path / "env.toml"
    p.write_text('format = "accelpact-envelope/1"\n[[entries]]\nphase = "forward"\nphase = "boundary"\n')
    with pytest.raises(EnvelopeError, match=r"not valid TOML"):
        load_envelope(p)


def test_c63_toml_schema_errors_name_the_field(tmp_path: Path):
    p = tmp_path / "env.toml"
    p.write_text(
        'format = "accelpact-envelope/1"\n[[entries]]\nplatform = "cpu-gloo"\nprofile = "hsdp"\n'
        'phase = "optimizer"\nobjective = "zero-replay"\nactions = ["L1"]\n'
    )
    with pytest.raises(EnvelopeError, match=r"env\.toml: entries\[0\]\.actions: L1 is only qualifiable"):
        load_envelope(p)


def test_c63_missing_and_non_utf8_files(tmp_path: Path):
    with pytest.raises(EnvelopeError, match="cannot read envelope file"):
        load_envelope(tmp_path / "absent.json")
    p = tmp_path / "latin1.json"
    p.write_bytes(b'{"format": "caf\xe9"}')
    with pytest.raises(EnvelopeError, match="not UTF-8"):
        load_envelope(p)


def test_c63_value_toml_cannot_hold_is_rejected_on_save(tmp_path: Path):
    env = Envelope((EnvelopeEntry(K, ("L1",), {"note": None}),))
    with pytest.raises(EnvelopeError, match=r"entries\[0\]\.evidence\.note: NoneType"):
        save_envelope(env, tmp_path / "e.toml")
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


# --------------------------------------------------------------------------------------
# C6.1/C6.2: round trips, TOML = JSON, atomic save, the shipped default

EXAMPLE_TOML = """\
format = "accelpact-envelope/1"
comment = "written by hand"

[[entries]]
platform = "cpu-gloo"
profile = "ddp"
phase = "boundary"
objective = "zero-replay"
actions = ["L1", "L2"]

[entries.evidence]
trials = 20
passes = 20
platform = { torch = "2.13.0", backend = "gloo", driver = "none" }

[[entries]]
platform = "cpu-gloo"
profile = "ddp"
phase = "backward"
objective = "zero-replay"
actions = ["L2"]
"""

EXAMPLE_JSON = {
    "format": "accelpact-envelope/1",
    "comment": "written by hand",
    "entries": [
        {
            "platform": "cpu-gloo", "profile": "ddp", "phase": "boundary", "objective": "zero-replay",
            "actions": ["L1", "L2"],
            "evidence": {"trials": 20, "passes": 20, "platform": {"torch": "2.13.0", "backend": "gloo", "driver": "none"}},
        },
        {"platform": "cpu-gloo", "profile": "ddp", "phase": "backward", "objective": "zero-replay", "actions": ["L2"]},
    ],
}


def test_c61_toml_and_json_are_equivalent(tmp_path: Path):
    (tmp_path / "e.toml").write_text(EXAMPLE_TOML)
    (tmp_path / "e.json").write_text(json.dumps(EXAMPLE_JSON))
    a, b = load_envelope(tmp_path / "e.toml"), load_envelope(tmp_path / "e.json")
    assert a == b and a.to_json() == b.to_json()
    assert a.entries[0].evidence["platform"]["torch"] == "2.13.0"
    assert decide(a, ObservationKey("cpu-gloo", "ddp", "boundary", "zero-replay"), True).level == "L1"


def test_c61_shipped_default_envelope_loads():
    shipped = Path(__file__).resolve().parents[1] / "model" / "envelopes" / "default.json"
    assert shipped.is_file(), "model/envelopes/default.json must ship with the package"
    env = load_envelope(shipped)
    assert env.to_json() == default_envelope().to_json()
    assert load_default_envelope().to_json() == default_envelope().to_json()


def test_c61_save_is_atomic_and_replaces(tmp_path: Path):
    """The temp file lives beside the target and is renamed over it; no leftovers."""
    p = tmp_path / "env.json"
    p.write_text("old contents that are not an envelope")
    save_envelope(default_envelope(), p)
    assert load_envelope(p) == default_envelope()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["env.json"]
    assert (p.stat().st_mode & 0o777) == 0o644


text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
scalar = st.one_of(st.integers(-(2**40), 2**40), st.booleans(), text, st.floats(allow_nan=False, allow_infinity=False))
evidence = st.fixed_dictionaries(
    {},
    optional={
        "trials": st.integers(0, 1000),
        "platform": st.dictionaries(st.sampled_from(["torch", "backend", "driver"]), text),
        "note": st.one_of(scalar, st.lists(scalar, max_size=3), st.dictionaries(text, scalar, max_size=3)),
    },
).map(lambda d: {**d, "passes": d["trials"] // 2} if "trials" in d else d)


@st.composite
def envelopes(draw):
    n = draw(st.integers(0, 6))
    seen, entries = set(), []
    for _ in range(n):
        phase = draw(st.sampled_from(FAILURE_PHASES))
        key = ObservationKey(draw(text), draw(text), phase, draw(text))
        if key in seen:
            continue
        seen.add(key)
        acts = draw(st.sampled_from([("L1",), ("L2",), ("L1", "L2"), ("L2", "L1")]) if phase == "boundary" else st.just(("L2",)))
        entries.append(EnvelopeEntry(key, acts, draw(evidence)))
    return Envelope(tuple(entries))


@given(env=envelopes(), suffix=st.sampled_from([".json", ".toml"]))
def test_c61_round_trip_save_load(tmp_path_factory, env, suffix):
    """C6.1/C6.2: save then load gives the same keys, levels and evidence, in JSON and TOML."""
    p = tmp_path_factory.mktemp("rt") / f"env{suffix}"
    save_envelope(env, p)
    back = load_envelope(p)
    assert back == env
    assert back.to_json() == env.to_json()


@given(env=envelopes())
def test_c61_toml_text_parses_to_the_json_document(env):
    assert tomllib.loads(envelope_to_toml(env)) == json.loads(json.dumps(env.to_json()))
