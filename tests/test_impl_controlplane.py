"""Control plane over a real TCPStore (loopback): decided barriers, fencing, abort.

Spec ids: S2.1 (one decision per generation), S2.2/S2.3 (agreement on (F, g)), S4 (generation
fencing), S1 (the late rank reads the same decision as everyone).  Ranks are threads, each with
its own TCPStore client connection (the store is what is under test, not the processes).
"""

from __future__ import annotations

import threading
import time
import types

import pytest

pytest.importorskip("torch")

from accelpact.impl.controlplane import ControlPlane  # noqa: E402 - after the importorskip of torch
from accelpact.testing import seeded  # noqa: E402 - after the importorskip of torch
from accelpact.impl.hooks import Hooks  # noqa: E402 - after the importorskip of torch
from accelpact.testing.faults import hooks_for  # noqa: E402 - after the importorskip of torch


def planes(connect, world, prefix="job/", seeded_bug=None):
    """One control plane per rank, each on its own store connection (``connect``: the fixture);
    ``seeded_bug`` configured as the pact does at attach."""
    cps = [ControlPlane(connect(), r, world, prefix) for r in range(world)]
    for cp in cps:
        seeded.install(seeded_bug, control=cp)
    return cps


def run_all(fns, timeout=30.0):
    out: dict[int, object] = {}
    errs: list[BaseException] = []

    def wrap(i, fn):
        try:
            out[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - a rank thread's failure is reported by the test below
            errs.append(exc)

    ts = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert not any(t.is_alive() for t in ts), "a rank thread did not finish"
    assert not errs, errs
    return out


@pytest.mark.timeout(30)
def test_agreement_commits_with_one_decider(connect):
    """S2.1: exactly one last arriver decides; every rank reads commit."""
    cps = planes(connect, 4)

    def rank(cp):
        def go():
            count, last = cp.arrive(0, 5)
            dec = cp.decide_agreement(0) if last else None
            return count, last, dec, cp.await_agreement(0, time.monotonic() + 10)
        return go

    res = run_all([rank(cp) for cp in cps])
    assert sorted(r[0] for r in res.values()) == [1, 2, 3, 4]
    assert sum(r[1] for r in res.values()) == 1
    assert {r[3] for r in res.values()} == {"commit"}
    assert cps[0].read_abort() == ""


@pytest.mark.timeout(30)
def test_late_rank_after_others_timed_out_reads_the_same_abort(connect):
    """S1/S2: ranks 0-2 time out; the late rank 3 then completes the count and tries to decide
    commit, but reads the standing abort:deadline like everyone else (store.barrier would split)."""
    cps = planes(connect, 4)

    def early(cp):
        def go():
            cp.arrive(0, 5)
            return cp.await_agreement(0, time.monotonic() + 0.3), cp.last_expired
        return go

    res = run_all([early(cp) for cp in cps[:3]])
    assert {v[0] for v in res.values()} == {"abort:deadline"}
    # the three deadlines expire together; exactly one of them is the RankTimeout (the first to
    # expire on the key), the others read the decision that stands and exit on it (RankExit)
    assert sum(v[1] for v in res.values()) == 1
    count, last = cps[3].arrive(0, 5)
    assert (count, last) == (4, True)
    assert cps[3].decide_agreement(0) == "abort:deadline"
    assert cps[3].await_agreement(0, time.monotonic() + 5) == "abort:deadline"
    assert cps[3].last_expired is False


@pytest.mark.timeout(30)
def test_frontier_mismatch_aborts_job(connect):
    """S2.2: a rank reporting F+1 makes the decider write abort:mismatch (the engine then writes
    the job abort after recording the decision)."""
    cps = planes(connect, 3)
    for cp, f in zip(cps[:2], (5, 5), strict=True):
        assert not cp.arrive(0, f)[1]
    assert cps[2].arrive(0, 6) == (3, True)
    assert cps[2].decide_agreement(0) == "abort:mismatch"
    assert cps[0].await_agreement(0, time.monotonic() + 1) == "abort:mismatch"
    assert cps[1].read_abort() == ""
    assert cps[2].abort("mismatch") == "mismatch"
    assert cps[1].read_abort() == "mismatch"


@pytest.mark.timeout(30)
def test_release_and_first_abort_wins(connect):
    cps = planes(connect, 2)
    assert cps[0].ready(3) == (1, False)
    assert cps[1].ready(3) == (2, True)
    assert cps[1].decide_release(3) == "release"
    assert cps[0].await_release(3, time.monotonic() + 1) == "release"
    # a late abort decision cannot overwrite the release (single assignment)
    assert cps[0].write_abort_decision(3, "release", "deadline") == "release"
    assert cps[0].abort("deadline") == "deadline"
    assert cps[1].abort("exception") == "deadline"
    assert cps[1].read_abort() == "deadline"
    with pytest.raises(ValueError, match="which must be"):
        cps[0].write_abort_decision(3, "bogus", "deadline")


@pytest.mark.timeout(30)
def test_generation_fencing(connect):
    """S4: decisions of generation g are invisible in g+1; a stale decider cannot decide g+1."""
    cps = planes(connect, 2)
    for cp in cps:
        count, last = cp.arrive(0, 5)
        if last:
            cp.decide_agreement(0)
    assert cps[0].await_agreement(0, time.monotonic() + 1) == "commit"
    # generation 1: nobody arrived yet; the agreement of g0 must not be read
    assert cps[0].await_agreement(1, time.monotonic() + 0.2) == "abort:deadline"
    assert cps[1].arrive(1, 6) == (1, False)
    assert cps[0].key(1, "agree") != cps[0].key(0, "agree")


@pytest.mark.timeout(30)
def test_no_fence_seeded_bug_reads_stale_decision(connect):
    """The no-fence seeded bug: g1 reads g0's commit without any arrival (what fencing prevents)."""
    cps = planes(connect, 2, prefix="nofence/", seeded_bug="no-fence")
    for cp in cps:
        count, last = cp.arrive(0, 5)
        if last:
            cp.decide_agreement(0)
    assert cps[0].await_agreement(1, time.monotonic() + 0.2) == "commit"  # stale: nobody arrived in g1


def test_seeded_bug_is_validated_and_installed_through_the_hooks():
    """A seeded bug reaches the engine only as the hooks' installer (``Hooks.install``, run by
    ``Hooks.arm`` at attach); its name is checked on the test tooling's side, naming the seeded bugs."""
    with pytest.raises(ValueError, match=r"'nonsense' is not a seeded bug; use one of \('skip-rebind'"):
        hooks_for(seeded_bug="nonsense")
    with pytest.raises(ValueError, match="install must be a callable"):
        Hooks(install="no-fence")  # type: ignore[arg-type]  # a name is not an installer
    assert seeded.installer(None) is None and hooks_for().install is None
    Hooks().arm(engine=None, control=None)  # no hooks: nothing to install
    control = types.SimpleNamespace(prefix="p/")
    hooks_for(seeded_bug="no-fence").arm(engine=None, control=control)
    assert control.key(3, "commit") == "p/commit"  # the bug's replacement, bound to this instance
    # every seeded bug replaces something (a bug that replaces nothing would test nothing); that each
    # replaced name exists is tests/test_hygiene.py's
    unread = [b for b, entry in seeded.SEEDED_BUGS.items() if not (entry.engine or entry.control)]
    assert not unread, f"seeded bugs that replace nothing: {unread}"


@pytest.mark.timeout(30)
def test_early_release_seeded_bug_first_vote_decides(connect):
    cps = planes(connect, 3, prefix="early/", seeded_bug="early-release")
    assert cps[0].ready(0) == (1, True)
    # without the bug the first of three votes does not decide
    assert planes(connect, 3, prefix="fair/")[0].ready(0) == (1, False)


@pytest.mark.timeout(30)
def test_revoke_published_once(connect):
    cps = planes(connect, 2)
    assert cps[1].publish_revoke(0, "replicate1") is True
    assert cps[0].publish_revoke(0, "replicate1") is False
    assert cps[0].revoked(0, "replicate1") and not cps[0].revoked(1, "replicate1")


def test_store_keys_have_one_home():
    """Issue 23: the keys the keeper, the detector, the API and hot swap use are controlplane.py's, in the
    formats the spec documents."""
    from accelpact.impl import controlplane as cp
    from accelpact.impl import detector
    from accelpact.impl.runtime import hotswap
    from accelpact.impl.launch import keeper

    assert ControlPlane(None, 0, 1).abort_key == cp.ABORT_KEY == keeper.ABORT_KEY == "accelpact/abort"
    assert keeper.DEATHS_KEY is cp.DEATHS_KEY and keeper.death_key is cp.death_key and detector.heartbeat_key is cp.heartbeat_key
    assert hotswap.NEXT_KEY is cp.NEXT_KEY and hotswap.claim_key is cp.claim_key
    # the formats spec/hotswap.md documents
    assert cp.NEXT_KEY == "accelpact/swap/next" and cp.assign_key(3) == "accelpact/swap/assign/3"
    assert cp.claim_key(2, 5) == "accelpact/g2/spare/5" and cp.state_key(4) == "accelpact/swap/state/r4"
    assert cp.progress_key(1, 2) == "accelpact/progress/a1/r2" and cp.heartbeat_key(3, 1) == "accelpact/hb/a1/3"
