"""Multi-process recovery tests of the engine (gloo, loopback, DDP on 4 ranks, group="world").

Spec ids: S1 (all or none), S2 (one agreed decision per generation), S3 (in-flight -> L2),
S5 (every cached reference rebound), S6/S7 (bounded fail-stop exit), C3 (contract decides).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _mp  # noqa: E402

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.multiproc


def _assert_equal_snapshots(a, b):
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), f"param {k} differs"
    sa, sb = a["optim"]["state"], b["optim"]["state"]
    assert sa.keys() == sb.keys()
    for pid in sa:
        for name in sa[pid]:
            assert torch.equal(torch.as_tensor(sa[pid][name]), torch.as_tensor(sb[pid][name])), f"optim {pid}/{name} differs"
    assert torch.equal(a["rng"], b["rng"]), "RNG state differs"
    assert a["step"] == b["step"]


def _assert_conforms(run, world):
    """The traces of every rank are a behaviour of the model (accelpact.conformance checker)."""
    from accelpact.conformance.checker import check_traces, config_from_headers
    from accelpact.impl.trace import load_traces as load_dir

    traces = load_dir(run.out)[0]
    assert sorted(traces) == list(range(world))
    verdict = check_traces(config_from_headers(traces), traces, silent_faults=True)
    assert verdict.accepted, verdict.message


def _ends(run, ranks):
    out = {}
    for r in ranks:
        recs = run.trace(r)
        out[r] = recs[-1] if recs and recs[-1].get("type") == "end" else None
    return out


@pytest.mark.timeout(150)
def test_ten_repairs_no_leak(tmp_path):
    """S4/S5: ten successive repairs in one job; native threads, fds and registered groups do not
    grow (the old communicator is dropped at each repair); generations are monotonic."""
    faults = [{"step": s, "at": "boundary", "kind": "collective_timeout", "ranks": [s % 2], "group": "world"}
              for s in range(1, 11)]
    run = _mp.launch(_mp.ddp_worker, 2, {"steps": 12, "faults": faults, "measure": True}, tmp_path, timeout=120)
    assert run.codes == {0: 0, 1: 0}, run.explain()
    import json

    for r in range(2):
        res = run.result(r)
        _assert_equal_snapshots(res["run"], res["reference"])
        assert res["gen"] == 10
        gens = [rec["state"]["gen"] for rec in run.trace(r) if rec.get("action") == "RankResume"]
        assert gens == list(range(1, 11)), gens
        rows = [json.loads(x) for x in (tmp_path / f"measure-r{r}.jsonl").read_text().splitlines()]
        repairs = [x for x in rows if x["step"] >= 0]
        assert len(repairs) == 10
        # the first repair retires the c10d default group (still registered by c10d), later ones free theirs
        base = repairs[1]
        for x in repairs[2:]:
            assert x["fds"] == base["fds"], (r, [y["fds"] for y in repairs])
            assert x["threads"] == base["threads"], (r, [y["threads"] for y in repairs])
            assert x["groups"] == base["groups"] == rows[0]["groups"]
        print("repair totals (ms) rank", r, [round(x["report"]["total_ns"] / 1e6, 1) for x in repairs])


@pytest.mark.timeout(120)
def test_ablation_skip_rebind_next_backward_fails(tmp_path):
    """S5 ablation: with rebinding skipped (seeded bug), the engine resumes, the next backward
    runs DDP's reducer on the revoked communicator and fails; every rank exits 70 (in flight)."""
    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [1], "group": "world"}]
    run = _mp.launch(_mp.ddp_worker, 2, {"steps": 4, "faults": faults, "reference": False}, tmp_path,
                     env={"ACCELPACT_SEEDED_BUG": "skip-rebind"})
    assert set(run.codes.values()) == {70}, run.explain()
    rejecters = 0
    for r in range(2):
        recs = [x for x in run.trace(r) if x.get("type") == "action"]
        rebind = [x for x in recs if x["action"] == "RankRebind"]
        assert rebind and rebind[0]["state"]["refs_stale"] == 1
        after = recs[recs.index(next(x for x in recs if x["action"] == "RankResume")) + 1:]
        obs = [x for x in after if x["action"] == "RankObserve"]
        if obs:
            assert obs[0]["state"]["point"] == "backward", obs
            # the observer rejects, unless a peer's rejection reached its watchdog first (RankExit)
            assert [x["action"] for x in after][-1] in ("RankReject", "RankExit"), after
            rejecters += "RankReject" in [x["action"] for x in after]
    assert rejecters >= 1, run.explain()
    # and the conformance checker rejects the traces (refs_stale != 0 is not a model behaviour)
    from accelpact.conformance.checker import check_traces, config_from_headers
    from accelpact.impl.trace import load_traces as load_dir

    traces = load_dir(run.out)[0]
    verdict = check_traces(config_from_headers(traces), traces, silent_faults=True)
    assert not verdict.accepted and "refs_stale" in verdict.message, verdict.message


@pytest.mark.timeout(120)
def test_in_flight_backward_failure_every_rank_exits_70(tmp_path):
    """S3/C3: a failure of R during backward is in flight: the contract says L2, every rank exits 70."""
    faults = [{"step": 1, "at": "backward", "kind": "collective_timeout", "ranks": [1], "group": "world"}]
    run = _mp.launch(_mp.ddp_worker, 4, {"steps": 3, "faults": faults, "reference": False}, tmp_path)
    assert run.codes == {0: 70, 1: 70, 2: 70, 3: 70}, run.explain()
    rejecters = [r for r in range(4) if "RankReject" in run.actions(r)]
    assert rejecters, "some rank must have rejected"
    for r in rejecters:
        # rank 1 fails in backward; a peer can still be in forward (DDP's bucket-rebuild broadcast
        # of step 1) when its collective fails: both are in flight, neither is the boundary
        obs = [x for x in run.trace(r) if x.get("action") == "RankObserve"]
        assert obs[0]["state"]["point"] == ("backward" if r == 1 else obs[0]["state"]["point"])
        assert obs[0]["state"]["point"] in ("forward", "backward"), (r, obs[0]["state"])
    for r in set(range(4)) - set(rejecters):
        assert run.actions(r)[-1] == "RankExit"
    _assert_conforms(run, 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("at,kind,victim,codes", [
    ("validate", "crash", 1, {72, 73}),
    ("release", "hang", 1, {72}),
    ("agree", "frontier_mismatch", 1, {71}),
    ("guard", "dirty_guard", 0, {70}),
    ("rebind", "exception", 1, {73}),
])
def test_fault_in_phases_every_survivor_exits_within_deadline(tmp_path, at, kind, victim, codes):
    """S6/S7: a crash, hang, mismatch, dirty guard or exception during phases 2-6 ends every
    surviving rank with one reason's code, within the configured deadline of the fault."""
    deadline = 4.0
    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [0], "group": "world"},
              {"step": 1, "at": at, "kind": kind, "ranks": [victim]}]
    run = _mp.launch(_mp.ddp_worker, 2, {"steps": 3, "faults": faults, "reference": False, "deadline_s": deadline},
                     tmp_path, timeout=60)
    survivors = [r for r in range(2) if not (kind == "crash" and r == victim)]
    if kind == "crash":
        assert run.codes[victim] == -9
    got = {run.codes[r] for r in survivors}
    assert len(got) == 1 and got <= codes, run.explain()
    fault_t = next(x["t_ns"] for x in run.trace(victim) if x.get("action", "").startswith("Fault") and x["detail"]["point"] == at)
    for r, end in _ends(run, survivors).items():
        assert end is not None and end["outcome"] == "exited", (r, end)
        assert end["t_ns"] - fault_t < (deadline + 2.0) * 1e9, (r, (end["t_ns"] - fault_t) / 1e9)
    _assert_conforms(run, 2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_boundary_failure_repaired_in_place_ddp_8(tmp_path):
    """S1/S5 at 8 ranks (4x2): repaired in place, bit-identical to an uninterrupted run."""
    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [5], "group": "world"}]
    run = _mp.launch(_mp.ddp_worker, 8, {"steps": 3, "faults": faults}, tmp_path, timeout=200)
    assert set(run.codes.values()) == {0}, run.explain()
    for r in range(8):
        res = run.result(r)
        _assert_equal_snapshots(res["run"], res["reference"])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("wrapper", ["fsdp1-hybrid", "fsdp2-hybrid", "ddp"])
def test_hsdp_boundary_failure_repaired_in_place(tmp_path, wrapper):
    """S1/S5 with the real adapters: rank 1's replicate group ([1, 3]) fails at the committed
    boundary; ranks 1 and 3 rebuild and rebind it, ranks 0 and 2 only vote; every rank's shards,
    AdamW state, RNG, step and data cursor equal an uninterrupted run."""
    from accelpact.impl.workload import compare_snapshots

    group = "world" if wrapper == "ddp" else "replicate"
    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [1], "group": group}]
    # deadline 30 s: this test is about the repair, not its speed; on 2 loaded CI cores one run in
    # ~30 exited 72 with the default 10 s (not reproduced since; the message now shows the traces)
    run = _mp.launch(_mp.hsdp_worker, 4, {"wrapper": wrapper, "steps": 3, "faults": faults, "deadline_s": 30.0},
                     tmp_path, timeout=130)
    assert run.codes == {0: 0, 1: 0, 2: 0, 3: 0}, run.explain()
    for r in range(4):
        res = run.result(r)
        ok, why = compare_snapshots(res["run"], res["reference"])
        assert ok, f"rank {r}: {why}"
        assert res["gen"] == 1
        acts = run.actions(r)
        member = r in (1, 3) or wrapper == "ddp"
        assert ("RankRebind" in acts) == member and ("RankValidate" in acts) == member, (r, acts)
        assert acts[-1] == "RankResume"
        want = ["RankObserve", "RankGuard", "RankArrive", "RankAwaitAgreement"]
        want += ["RankReplace", "RankRebind", "RankValidate"] if member else []
        want += ["RankReady", "RankResume"]
        assert [a for a in acts if a in want] == want, (r, acts)
        if member:
            rep = res["reports"][0]
            assert rep["refs_rebound"] > 0
            print(wrapper, "rank", r, {k: (round(v / 1e6, 2) if k.endswith("_ns") else v) for k, v in rep.items()})
    assert sum("RankDecideAgreement" in run.actions(r) for r in range(4)) == 1  # S2.1: one decider
    assert sum("RankDecideRelease" in run.actions(r) for r in range(4)) == 1
    _assert_conforms(run, 4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp1_hsdp_8_ranks_repaired_in_place(tmp_path):
    """S1/S5 at 8 ranks (4x2, FSDP1 HYBRID_SHARD): replicate group [1, 3, 5, 7] repaired in place."""
    from accelpact.impl.workload import compare_snapshots

    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [5], "group": "replicate"}]
    run = _mp.launch(_mp.hsdp_worker, 8, {"wrapper": "fsdp1-hybrid", "steps": 3, "faults": faults}, tmp_path, timeout=280)
    assert set(run.codes.values()) == {0}, run.explain()
    for r in range(8):
        res = run.result(r)
        ok, why = compare_snapshots(res["run"], res["reference"])
        assert ok, f"rank {r}: {why}"
        assert ("RankRebind" in run.actions(r)) == (r % 2 == 1)


def test_strategy_chosen_by_capability_not_version():
    """RankReplace: native reconfigure only when the group object has it (torch 2.13 has not)."""
    from accelpact.impl.replace import NativeReconfigure, ReplaceAndRebind, choose_strategy

    class WithReconfigure:
        def reconfigure(self, store, rank, size, timeout):
            self.args = (rank, size)

    class Plain:
        pass

    native = choose_strategy(WithReconfigure())
    assert isinstance(native, NativeReconfigure) and not native.needs_rebind
    plain = choose_strategy(Plain())
    assert isinstance(plain, ReplaceAndRebind) and plain.needs_rebind
    assert not hasattr(torch.distributed.ProcessGroup, "reconfigure") or isinstance(
        choose_strategy(torch.distributed.ProcessGroup(1, 0)), NativeReconfigure)
    with pytest.raises(ValueError, match="not a member"):
        plain.replace(None, 1, (0, 1), 2, None, 1.0)



@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL replacement needs >= 2 GPUs (one process per GPU); this machine has fewer")
@pytest.mark.timeout(180)
def test_nccl_replace_builds_working_communicator(tmp_path):
    """RankReplace on NCCL: a fresh communicator per generation prefix works; the old one is aborted."""
    import json

    run = _mp.launch(_mp.nccl_replace_worker, 2, {}, tmp_path, timeout=150)
    assert run.codes == {0: 0, 1: 0}, run.explain()
    for r in range(2):
        assert json.loads((tmp_path / f"nccl-r{r}.json").read_text()) == {"old": 2.0, "new": 2.0}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bug", ["", "unheld-records"])
def test_control_plane_write_and_its_record_are_one_action(tmp_path, bug):
    """I1 (traces are behaviours of the model): a control-plane write and its trace record are one
    model action.  With 0.4 s between each write and its record, the last arriver's mismatch decision is
    seen by its peer, which writes the job abort at once; the decider's watchdog must still wait
    until the decision is recorded (the checker accepts).  Seeded bug ``unheld-records`` drops that
    hold: the watchdog exits first, the trace lacks RankDecideAgreement, and the checker rejects."""
    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [0], "group": "world"},
              {"step": 1, "at": "agree", "kind": "frontier_mismatch", "ranks": [1]}]
    env = {"ACCELPACT_TEST_WRITE_TO_RECORD_S": "0.4", **({"ACCELPACT_SEEDED_BUG": bug} if bug else {})}
    run = _mp.launch(_mp.ddp_worker, 2, {"steps": 3, "faults": faults, "reference": False, "deadline_s": 6.0},
                     tmp_path, timeout=90, env=env)
    assert run.codes == {0: 71, 1: 71}, run.explain()
    deciders = [r for r in range(2) if "RankDecideAgreement" in run.actions(r)]
    from accelpact.conformance.checker import check_traces, config_from_headers
    from accelpact.impl.trace import load_traces as load_dir

    traces = load_dir(run.out)[0]
    verdict = check_traces(config_from_headers(traces), traces, silent_faults=True)
    if not bug:
        assert len(deciders) == 1, {r: run.actions(r) for r in range(2)}
        assert verdict.accepted, verdict.message
    else:
        assert not deciders, {r: run.actions(r) for r in range(2)}
        assert not verdict.accepted and "RankExit" in verdict.message, verdict.message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("at", ["agree", "boundary"])
def test_every_rank_hung_exits_within_step_deadline(tmp_path, at):
    """L2/S7 (RankExpire): after a failure at the boundary every rank hangs (at the agreement, or at
    the boundary before observing it).  No rank is left whose wait could time out; the watchdog's
    step deadline ends them: one RankExpire writes abort:deadline, every rank exits 72 within the
    step deadline (plus a watcher slice), and the traces are a behaviour of the model."""
    step_deadline = 6.0
    faults = [{"step": 1, "at": "boundary", "kind": "collective_timeout", "ranks": [0], "group": "world"},
              {"step": 1, "at": at, "kind": "hang", "ranks": [0, 1]}]
    run = _mp.launch(_mp.ddp_worker, 2, {"steps": 3, "faults": faults, "reference": False, "deadline_s": 2.0,
                                         "step_deadline_s": step_deadline}, tmp_path, timeout=60)
    assert run.codes == {0: 72, 1: 72}, run.explain()
    expirers = [r for r in range(2) if "RankExpire" in run.actions(r)]
    assert len(expirers) == 1, run.explain()
    hang_t = min(x["t_ns"] for r in range(2) for x in run.trace(r) if x.get("action") == "FaultHang")
    for r, end in _ends(run, [0, 1]).items():
        assert end is not None and end["outcome"] == "exited", (r, end)
        assert (end["t_ns"] - hang_t) / 1e9 < step_deadline + 5.0, run.explain()
    _assert_conforms(run, 2)
