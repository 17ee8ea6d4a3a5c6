"""The keeper (impl/launch/keeper.py), ``topology.spares`` (impl/launch/job.py) and how the launchers start spares
(impl/launch/launch.py): hot swap, issue 13.

The keeper keeps one training rank's crash from being the whole group's failure in torchrun's eyes:
with spares it posts a death notice on the job's store and waits for the job's end; a fail-stop exit
reaches the launcher unchanged; without spares it is not even a process of its own (``exec``).

Every process is started by a :class:`ProcessSet` (its own session; killed and reaped on leaving the
block), every wait is bounded, every store is on loopback.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelpact.impl.launch import keeper
from accelpact.impl.launch.job import FieldError, Job, JobError, Topology, Workload
from accelpact.impl.launch.launch import ProcessSet, StoreServer, job_key, run_local, run_torchrun, worker_env

KEEPER = [sys.executable, "-m", "accelpact.impl.launch.keeper_entry", "--"]  # the keeper as the launchers start it
#: the keeper imports torch only to post a notice; this bounds that import and one store round trip
NOTICE_S = 30.0


def _env(tmp_path: Path, spares: str | None, rank: int = 0, world: int = 2, port: int | None = None,
         attempt: int | None = None, **extra) -> dict[str, str]:
    env = worker_env({"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1"})
    for k in (keeper.SPARES_ENV, keeper.WAIT_ENV, "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT"):
        env.pop(k, None)
    # these children die again when started again: refill is tested on its own (below, tests/test_refill.py)
    env[keeper.REFILL_ENV] = "0"
    env.update(extra)
    if spares is not None:
        env[keeper.SPARES_ENV] = spares
    if port is not None:
        env["MASTER_PORT"] = str(port)
    if attempt is not None:
        env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    return env


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _wait_exit(p: subprocess.Popen, timeout_s: float) -> int:
    try:
        return p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"keeper pid {p.pid} still running after {timeout_s}s")


def _wait_file(path: Path, timeout_s: float, p: subprocess.Popen) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        if p.poll() is not None:
            pytest.fail(f"process exited ({p.returncode}) before writing {path.name}")
        time.sleep(0.02)
    pytest.fail(f"{path.name} not written within {timeout_s}s")


def _master():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=30))


def _key(attempt: int, key: str) -> str:
    return f"attempt{attempt}/{key}"


# ------------------------------------------------------------------------------------ the keeper

@pytest.mark.multiproc
@pytest.mark.parametrize("spares", [None, "0"])
def test_without_spares_the_keeper_execs_the_child(tmp_path: Path, spares: str | None) -> None:
    """No spares: the exit code is the child's, and the child *is* the keeper's process (exec)."""
    out = tmp_path / "out.txt"
    with open(out, "wb") as f, ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import os, sys; print(os.getpid(), flush=True); sys.exit(3)"),
                     env=_env(tmp_path, spares), stdout=f)
        assert _wait_exit(p, 20) == 3
    assert out.read_text().split()[0] == str(p.pid)


@pytest.mark.multiproc
def test_keeper_accepts_the_command_without_double_dash(tmp_path: Path) -> None:
    with ProcessSet() as ps:
        p = ps.start([sys.executable, "-m", "accelpact.impl.launch.keeper", *_child("import sys; sys.exit(4)")],
                     env=_env(tmp_path, "1"))
        assert _wait_exit(p, 20) == 4


@pytest.mark.multiproc
@pytest.mark.parametrize("code", [0, 70, 1])
def test_fail_stop_exit_passes_through_at_once(tmp_path: Path, code: int) -> None:
    """Spares, but the child exits on its own (0, or a fail-stop code): the keeper exits with that code
    at once and posts no notice; it is a process of its own (the child's pid differs)."""
    store = _master()
    out = tmp_path / "out.txt"
    with open(out, "wb") as f, ProcessSet() as ps:
        t0 = time.monotonic()
        p = ps.start(KEEPER + _child(f"import os, sys; print(os.getpid(), flush=True); sys.exit({code})"),
                     env=_env(tmp_path, "1", rank=0, world=3, port=store.port), stdout=f)
        assert _wait_exit(p, 20) == code
        assert time.monotonic() - t0 < 10
    assert out.read_text().split()[0] != str(p.pid)
    assert not store.check([_key(0, keeper.DEATHS_KEY)])


@pytest.mark.multiproc
@pytest.mark.parametrize("attempt,end,expect", [(None, "closed", 0), (2, "deadline", 128 + 9), (0, "rejected", 128 + 9)])
def test_crash_posts_a_notice_and_waits_for_the_job_end(tmp_path: Path, attempt: int | None, end: str,
                                                        expect: int) -> None:
    """A training rank's worker SIGKILLed: notice ``attempt{a}/accelpact/swap/death/1`` = RANK, the
    keeper stays alive; ``closed`` on the abort key -> exit 0, an abort reason -> 128 + SIGKILL."""
    store = _master()
    a = attempt or 0
    with ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                     env=_env(tmp_path, "1", rank=1, world=3, port=store.port, attempt=attempt))
        store.wait([_key(a, keeper.death_key(1))], datetime.timedelta(seconds=NOTICE_S))
        assert store.get(_key(a, keeper.death_key(1))) == b"1"
        assert store.add(_key(a, keeper.DEATHS_KEY), 0) == 1
        if a:
            assert not store.check([_key(0, keeper.DEATHS_KEY)])  # the attempt's namespace, not another's
        time.sleep(0.3)
        assert p.poll() is None, f"keeper exited ({p.returncode}) instead of waiting for the job's end"
        store.set(_key(a, keeper.ABORT_KEY), end)
        assert _wait_exit(p, 10) == expect


@pytest.mark.multiproc
def test_notices_are_numbered_in_order(tmp_path: Path) -> None:
    """Two training ranks crash: notices 1 and 2 name them both (``add`` then ``set``)."""
    store = _master()
    with ProcessSet() as ps:
        procs = [ps.start(KEEPER + _child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                          env=_env(tmp_path, "2", rank=r, world=4, port=store.port)) for r in (0, 1)]
        keys = [_key(0, keeper.death_key(n)) for n in (1, 2)]
        store.wait(keys, datetime.timedelta(seconds=NOTICE_S))
        assert sorted(store.get(k) for k in keys) == [b"0", b"1"]
        store.set(_key(0, keeper.ABORT_KEY), keeper.CLOSED)
        assert [_wait_exit(p, 10) for p in procs] == [0, 0]


@pytest.mark.multiproc
def test_idle_spare_death_is_absorbed(tmp_path: Path) -> None:
    """Issue 25: an idle spare SIGKILLed: no death notice, the spare posted gone (no claim takes it),
    and the keeper waits for the job's end like a training rank's: ``closed`` -> exit 0 (torchrun
    sees nothing)."""
    from accelpact.impl.controlplane import spare_gone_key

    store = _master()
    with ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                     env=_env(tmp_path, "1", rank=2, world=3, port=store.port))
        store.wait([_key(0, spare_gone_key(0))], datetime.timedelta(seconds=NOTICE_S))
        time.sleep(0.3)
        assert p.poll() is None, f"keeper exited ({p.returncode}) instead of waiting for the job's end"
        store.set(_key(0, keeper.ABORT_KEY), keeper.CLOSED)
        assert _wait_exit(p, 10) == 0
    assert not store.check([_key(0, keeper.DEATHS_KEY)])


@pytest.mark.multiproc
def test_a_swapped_in_spare_dies_as_the_rank_it_holds(tmp_path: Path) -> None:
    """A spare that a claim assigned rank 1 (``swap/assign/0`` = ``1:g:point``) dies: the death notice
    names rank 1, so the survivors can swap again; an abort then ends the keeper with 128 + signal."""
    from accelpact.impl.controlplane import assign_key, spare_gone_key

    store = _master()
    store.set(_key(0, assign_key(0)), "1:0:backward")
    with ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                     env=_env(tmp_path, "1", rank=3, world=4, port=store.port))
        store.wait([_key(0, keeper.death_key(1))], datetime.timedelta(seconds=NOTICE_S))
        assert store.get(_key(0, keeper.death_key(1))) == b"1"
        assert not store.check([_key(0, spare_gone_key(0))])
        store.set(_key(0, keeper.ABORT_KEY), "rejected")
        assert _wait_exit(p, 10) == 128 + signal.SIGKILL


@pytest.mark.multiproc
def test_a_swapped_in_spare_is_deposed_as_the_rank_it_holds(tmp_path: Path) -> None:
    """Soak K7: a spare that a claim of generation 2 assigned rank 1 is stopped, and a survivor's
    detector declares it.  Its keeper must kill it on the depose request for rank 1's holder since
    generation 3 (before, only a training rank's keeper watched, so the stopped spare lived on and
    the job ended L2), and never on the request that deposed rank 1's former holder."""
    from accelpact.impl.controlplane import NEXT_KEY, assign_key, depose_key

    store = _master()
    store.set(_key(0, depose_key(1, 0)), "2")  # rank 1's own worker was deposed (and died) before: by rank 2
    store.add(_key(0, NEXT_KEY), 1)
    store.set(_key(0, assign_key(0)), "1:2:backward")
    store.set(_key(0, depose_key(1, 3)), "0")  # this spare's own request: by rank 0
    log = tmp_path / "keeper.log"
    with ProcessSet() as ps, open(log, "w") as out:
        p = ps.start(KEEPER + _child("import time; time.sleep(120)"), env=_env(tmp_path, "1", rank=3, world=4, port=store.port),
                     stdout=out)
        store.wait([_key(0, keeper.death_key(1))], datetime.timedelta(seconds=NOTICE_S))
        assert store.get(_key(0, keeper.death_key(1))) == b"1"
        store.set(_key(0, keeper.ABORT_KEY), keeper.CLOSED)
        assert _wait_exit(p, 10) in (0, 128 + signal.SIGKILL)
    # the keeper says whose request it acted on: this spare's (rank 0's), never its predecessor's (rank 2's)
    text = log.read_text()
    assert "worker deposed: rank 0's" in text and "rank 2's" not in text, text


def test_a_depose_request_names_the_identitys_current_holder() -> None:
    """``Notices.depose`` writes the key of the process holding the identity now (``holder_since``:
    0 for the rank's own worker, ``g + 1`` after the latest claim of generation ``g`` for it)."""
    import torch.distributed as dist

    from accelpact.impl.controlplane import NEXT_KEY, assign_key, depose_key
    from accelpact.impl.runtime.hotswap import Notices, holder_since

    store = dist.HashStore()
    assert holder_since(store, 1) == 0
    store.add(NEXT_KEY, 2)
    store.set(assign_key(0), "1:0:backward")
    store.set(assign_key(1), "1:4:boundary")
    assert (holder_since(store, 1), holder_since(store, 2)) == (5, 0)
    notices = Notices(store)
    assert notices.depose(1, 3) and not notices.depose(1, 0)  # single assignment: the first asks
    assert store.get(depose_key(1, 5)) == b"3" and not store.check([depose_key(1, 0)])


def test_claims_pass_over_a_spare_that_died_idle() -> None:
    """The pool skips spares posted gone: with spare 0 gone, the first claim takes spare 1; with
    both gone, the claim stands as none (L2)."""
    from accelpact.impl.runtime import hotswap
    from accelpact.impl.controlplane import spare_gone_key

    store = _master()
    store.set(spare_gone_key(0), "1")
    assert hotswap.claim_write(store, 0, 1, spares=2) == (True, 1)
    assert store.get(hotswap.assign_key(1)).decode() == "1:0:"
    store.set(spare_gone_key(1), "1")
    assert hotswap.claim_write(store, 1, 2, spares=2) == (True, None)


@pytest.mark.multiproc
def test_lost_store_ends_the_wait(tmp_path: Path) -> None:
    """The store's host dies while the keeper waits for the job's end: exit 128 + signal, said on stderr."""
    err = tmp_path / "err.txt"
    with StoreServer.start(2, timeout_s=60) as server, open(err, "wb") as f, ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                     env=_env(tmp_path, "1", rank=0, world=2, port=server.port), stdout=f)
        import torch.distributed as dist

        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30))
        client.wait([_key(0, keeper.death_key(1))], datetime.timedelta(seconds=NOTICE_S))
        del client
        assert p.poll() is None
        server.kill()
        assert _wait_exit(p, 40) == 128 + signal.SIGKILL
    assert "unreachable" in err.read_text()


@pytest.mark.multiproc
def test_wait_is_bounded(tmp_path: Path) -> None:
    store = _master()
    err = tmp_path / "err.txt"
    with open(err, "wb") as f, ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"),
                     env=_env(tmp_path, "1", rank=0, world=2, port=store.port, **{keeper.WAIT_ENV: "1"}), stdout=f)
        store.wait([_key(0, keeper.death_key(1))], datetime.timedelta(seconds=NOTICE_S))
        assert _wait_exit(p, 15) == 128 + signal.SIGSEGV
    assert keeper.WAIT_ENV in err.read_text()


_TERM_CHILD = """
import pathlib, signal, sys, time
def handler(signum, frame):
    pathlib.Path(sys.argv[1]).write_text(signal.Signals(signum).name)
    sys.exit(5)
signal.signal(signal.SIGTERM, handler)
signal.signal(signal.SIGINT, handler)
pathlib.Path(sys.argv[2]).write_text("ready")
time.sleep(60)
"""


@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_reaches_the_child(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM/SIGINT sent to the keeper alone (not its group) is forwarded to the child."""
    got, ready = tmp_path / "got", tmp_path / "ready"
    with ProcessSet() as ps:
        p = ps.start(KEEPER + _child(_TERM_CHILD) + [str(got), str(ready)], env=_env(tmp_path, "1"))
        _wait_file(ready, 20, p)
        os.kill(p.pid, sig)
        assert _wait_exit(p, 10) == 5
    assert got.read_text() == sig.name


@pytest.mark.multiproc
def test_stopped_keeper_posts_no_notice(tmp_path: Path) -> None:
    """The agent stopping the group (SIGTERM) is no crash: the child dies of the forwarded SIGTERM and
    the keeper exits 128 + SIGTERM at once, without a notice."""
    store = _master()
    ready = tmp_path / "ready"
    code = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(60)"
    with ProcessSet() as ps:
        p = ps.start(KEEPER + _child(code) + [str(ready)], env=_env(tmp_path, "1", rank=0, world=2, port=store.port))
        _wait_file(ready, 20, p)
        os.kill(p.pid, signal.SIGTERM)
        assert _wait_exit(p, 10) == 128 + signal.SIGTERM
    assert not store.check([_key(0, keeper.DEATHS_KEY)])


@pytest.mark.multiproc
@pytest.mark.parametrize("var,value", [(keeper.SPARES_ENV, "two"), (keeper.SPARES_ENV, "-1"), (keeper.WAIT_ENV, "soon"),
                                       ("RANK", "")])
def test_malformed_environment_exits_2_naming_the_variable(tmp_path: Path, var: str, value: str) -> None:
    ran, err = tmp_path / "ran", tmp_path / "err.txt"
    env = _env(tmp_path, "1")
    env[var] = value
    with open(err, "wb") as f, ProcessSet() as ps:
        p = ps.start(KEEPER + _child("import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('x')") + [str(ran)],
                     env=env, stdout=f)
        assert _wait_exit(p, 20) == 2
    assert var in err.read_text()
    assert not ran.exists(), "the child ran despite the malformed environment"


# ------------------------------------------------------------------------------------ refill

def test_refill_allocates_unique_indices_and_names_the_attempt() -> None:
    """``refill``: the n-th refill of the attempt is spare ``S + n - 1`` with launcher RANK ``W + k``;
    the start it will count on that RANK names the keeper's attempt (here 2, a RANK never started
    before); nothing is refilled once the job ended."""
    import torch.distributed as dist

    from accelpact.impl.controlplane import STARTS_KEY
    from accelpact.impl.launch import attempts

    job = dist.HashStore()
    job.add(STARTS_KEY.format(rank=1), 3)  # the keeper's own RANK started 3 times: attempt 2
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "X": "y"}
    store = dist.PrefixStore("attempt2", job)
    got = [keeper.refill(store, job, env, spares=2) for _ in range(2)]
    assert [k for k, _ in got] == [2, 3]
    assert [e["RANK"] for _, e in got] == ["4", "5"] and all(e["LOCAL_RANK"] == "1" and e["X"] == "y" for _, e in got)
    assert [attempts.start(job, e) for _, e in got] == [2, 2]
    store.set(keeper.ABORT_KEY, keeper.CLOSED)
    assert keeper.refill(store, job, env, spares=2) is None


def test_a_refill_enters_the_pool_once_and_claims_take_it() -> None:
    """``PoolEntry``: a refill is counted into the pool (``swap/refills``) once, ready or gone; a claim
    with the launch-time spare taken then takes it, and passes over one posted gone."""
    import torch.distributed as dist

    from accelpact.impl.controlplane import REFILLS_KEY
    from accelpact.impl.runtime import hotswap

    store = dist.HashStore()
    env = {"RANK": "0", "WORLD_SIZE": "3"}
    assert hotswap.claim_write(store, 0, 1, spares=1) == (True, 0)
    assert not hotswap.pool_covers(store, 1, (0,), spares=1)
    k, _ = keeper.refill(store, dist.HashStore(), env, spares=1)
    assert k == 1 and not hotswap.pool_covers(store, 1, (0,), spares=1)  # allocated, not ready: not in the pool
    entry = keeper.PoolEntry(k)
    assert entry.enter(store) and not entry.enter(store)
    assert int(store.add(REFILLS_KEY, 0)) == 1 and hotswap.pool_size(store, 1) == 2
    assert hotswap.pool_covers(store, 1, (0,), spares=1)
    assert hotswap.claim_write(store, 1, 0, spares=1) == (True, 1)
    assert store.get(hotswap.assign_key(1)).decode() == "0:1:"
    # a refill that died before it was ready: posted gone, then counted, so no claim takes it
    k2, _ = keeper.refill(store, dist.HashStore(), env, spares=1)
    assert keeper.spare_died(store, k2) == f"spare {k2} died idle: posted gone"
    assert keeper.PoolEntry(k2).enter(store)
    assert not hotswap.pool_covers(store, 2, (1,), spares=1)
    assert hotswap.claim_write(store, 2, 1, spares=1) == (True, None)


def test_spare_ready_writes_once_on_its_pipe() -> None:
    r, w = os.pipe()
    env = {keeper.READY_FD_ENV: str(w)}
    assert keeper.spare_ready(env) and keeper.READY_FD_ENV not in env
    assert os.read(r, 8) == b"1" and os.read(r, 8) == b""  # one byte, then the end: the write end is closed
    os.close(r)
    assert not keeper.spare_ready(env) and not keeper.spare_ready({})


_REFILL_CHILD = """
import os, pathlib, signal, sys, time
if not os.environ.get("ACCELPACT_SPARE_READY_FD"):  # the keeper's first worker: it crashes
    os.kill(os.getpid(), signal.SIGKILL)
from accelpact.impl.launch.keeper import spare_ready
pathlib.Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
spare_ready()
time.sleep(120)
"""


@pytest.mark.multiproc
def test_keeper_refills_a_dead_worker_and_a_dead_idle_spare(tmp_path: Path) -> None:
    """A training rank's worker crashes: its keeper posts the notice and starts spare 1 (RANK 3) in
    its place, which enters the pool once it says it is ready.  That idle spare SIGKILLed from here:
    posted gone, and spare 2 (RANK 4) replaces it.  The job's end (``closed``) before any claim ends
    the idle spare and the keeper exits 0."""
    from accelpact.impl.controlplane import REFILLS_KEY, spare_gone_key

    store = _master()
    pids = tmp_path / "pids"
    pids.mkdir()
    err = tmp_path / "err.txt"
    env = _env(tmp_path, "1", rank=1, world=3, port=store.port, **{keeper.REFILL_ENV: "1"})
    with open(err, "wb") as f, ProcessSet() as ps:
        p = ps.start(KEEPER + _child(_REFILL_CHILD) + [str(pids)], env=env, stdout=f)
        store.wait([_key(0, keeper.death_key(1))], datetime.timedelta(seconds=NOTICE_S))
        first = int(_wait_file(pids / "3", NOTICE_S, p))
        deadline = time.monotonic() + NOTICE_S
        while int(store.add(_key(0, REFILLS_KEY), 0)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(store.add(_key(0, REFILLS_KEY), 0)) == 1
        os.kill(first, signal.SIGKILL)
        store.wait([_key(0, spare_gone_key(1))], datetime.timedelta(seconds=NOTICE_S))
        _wait_file(pids / "4", NOTICE_S, p)
        while int(store.add(_key(0, REFILLS_KEY), 0)) < 2 and time.monotonic() < deadline + NOTICE_S:
            time.sleep(0.05)
        assert int(store.add(_key(0, REFILLS_KEY), 0)) == 2
        assert int(store.add(_key(0, keeper.DEATHS_KEY), 0)) == 1  # the idle spare's death is no rank's
        store.set(_key(0, keeper.ABORT_KEY), keeper.CLOSED)
        assert _wait_exit(p, 15) == 0
    text = err.read_text()
    assert "starting spare 1 in its place (RANK=3)" in text and "starting spare 2 in its place (RANK=4)" in text, text


def test_keeper_constants_match_the_engine() -> None:
    """The keys and the ``closed`` value the keeper uses are those the engine writes."""
    from accelpact.impl.controlplane import ControlPlane
    from accelpact.impl.controlplane import CLOSED

    assert keeper.CLOSED == CLOSED
    assert ControlPlane(None, 0, 1).abort_key == keeper.ABORT_KEY
    assert keeper.DEATHS_KEY == "accelpact/swap/deaths" and keeper.death_key(3) == "accelpact/swap/death/3"


def test_post_death_adds_then_sets() -> None:
    store = _master()
    assert keeper.post_death(store, 5) == 1 and keeper.post_death(store, 2) == 2
    assert store.get(keeper.death_key(1)) == b"5" and store.get(keeper.death_key(2)) == b"2"
    assert store.add(keeper.DEATHS_KEY, 0) == 2


# ------------------------------------------------------------------------------- topology.spares

def test_topology_spares_parse_and_round_trip() -> None:
    t = Topology.parse({"nodes": 2, "ranks_per_node": 2, "spares": 1})
    assert t == Topology(2, 2, 1) and t.spares == 1 and t.world == 4
    assert t.to_json() == {"nodes": 2, "ranks_per_node": 2, "spares": 1}
    assert Topology.parse(t.to_json()) == t
    assert t.groups_of_kind("world") == [(0, 1, 2, 3)]  # spares are not in the training world


def test_topology_without_spares_serializes_as_before() -> None:
    t = Topology.parse({"nodes": 2, "ranks_per_node": 1})
    assert t.spares == 0 and t.to_json() == {"nodes": 2, "ranks_per_node": 1}
    assert json.dumps(Topology(2, 1, 0).to_json()) == '{"nodes": 2, "ranks_per_node": 1}'


@pytest.mark.parametrize("spares", [-1, 65, True, "1", 1.0])
def test_topology_spares_validated(spares) -> None:
    with pytest.raises(FieldError, match="topology.spares"):
        Topology.parse({"nodes": 1, "ranks_per_node": 2, "spares": spares})
    with pytest.raises(FieldError, match="spares"):
        Topology(1, 2, spares)


def test_job_and_scenario_accept_spares(tmp_path: Path) -> None:
    from accelpact.conformance.scenario import scenario_from_job

    job = Job(topology=Topology(2, 1, 1), workload=Workload(wrapper="ddp", layers=1, steps=3, checkpoint_every=1),
              out=str(tmp_path))
    again = Job.parse(job.to_json())
    assert again == job and again.topology.spares == 1 and again.world == 2
    plain = job.replace(topology=Topology(2, 1))
    assert "spares" not in plain.to_json()["topology"]
    assert job_key(job) == job_key(plain)  # the reference of a job with spares is the spare-free one
    with pytest.raises(JobError, match="topology.spares"):
        Job.parse({**job.to_json(), "topology": {"nodes": 2, "ranks_per_node": 1, "spares": -2}})
    played = job.replace(faults=[{"step": 1, "at": "boundary", "kind": "crash"}])
    assert scenario_from_job(played).topology.spares == 1


# ------------------------------------------------------------------------------------ launchers

_FAKE_WORKER = """
import json, os, sys
from pathlib import Path
job = Path(sys.argv[sys.argv.index("--job") + 1])
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELPACT_SPARES")
info = {k: os.environ.get(k) for k in names}
info["ppid"] = os.getppid()
info["parent"] = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\\0")
(job.parent / f"fake-{os.environ['RANK']}.info").write_text(json.dumps(info))
"""


@pytest.fixture
def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The harness's rank program (``launch.WORKER_MODULE``) replaced by a module that records its environment and its parent."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fake_accelpact_worker.py").write_text(_FAKE_WORKER)
    monkeypatch.setattr("accelpact.impl.launch.launch.WORKER_MODULE", "fake_accelpact_worker")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(mods), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv(keeper.SPARES_ENV, raising=False)
    return mods


def _infos(out: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("fake-*.info")}


def _job(out: Path, spares: int) -> Job:
    return Job(topology=Topology(2, 1, spares), workload=Workload(wrapper="ddp", layers=1, steps=2), out=str(out))


@pytest.mark.multiproc
@pytest.mark.parametrize("spares", [0, 1])
def test_run_local_starts_spares_and_keepers(tmp_path: Path, fake_worker: Path, spares: int) -> None:
    out = tmp_path / "run"
    pids: list[int] = []
    res = run_local(_job(out, spares), timeout_s=60, on_start=lambda procs: pids.extend(p.pid for p in procs))
    assert not res.timed_out and res.codes == [0] * (2 + spares), res.log_tail()
    info = _infos(out)
    total = 2 + spares
    assert sorted(info) == list(range(total))
    for r, i in info.items():
        assert (i["RANK"], i["LOCAL_RANK"], i["WORLD_SIZE"], i["LOCAL_WORLD_SIZE"]) == (str(r), str(r), str(total),
                                                                                       str(total))
        assert i["ACCELPACT_SPARES"] == (str(spares) if spares else None)
        kept = spares > 0
        # with spares every worker is its keeper's child (pids[r] is the keeper); otherwise the launcher started it
        assert (i["ppid"] == pids[r]) == kept and ("accelpact.impl.launch.keeper_entry" in i["parent"]) == kept, (r, i)
        if not kept:
            assert i["ppid"] == os.getpid()


@pytest.mark.multiproc
def test_run_local_spares_override(tmp_path: Path, fake_worker: Path) -> None:
    out = tmp_path / "run"
    res = run_local(_job(out, 1), timeout_s=60, spares=0)
    assert res.codes == [0, 0] and sorted(_infos(out)) == [0, 1]


@pytest.mark.multiproc
def test_run_torchrun_starts_spares_under_keepers(tmp_path: Path, fake_worker: Path) -> None:
    out = tmp_path / "run"
    res = run_torchrun(_job(out, 1), max_restarts=0, timeout_s=90)
    assert res.returncode == 0 and not res.timed_out, res.log_tail()
    info = _infos(out)
    assert sorted(info) == [0, 1, 2]
    for r, i in info.items():
        assert (i["RANK"], i["WORLD_SIZE"], i["LOCAL_WORLD_SIZE"], i["ACCELPACT_SPARES"]) == (str(r), "3", "3", "1")
        assert "accelpact.impl.launch.keeper_entry" in i["parent"], i  # torchrun runs every process under a keeper
