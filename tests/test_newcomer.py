"""What a newcomer trips on (issue 29): each mistake is refused or warned about, with what to write.

Single-process: a ``Training`` on a stand-in engine (the API's own bookkeeping is what is tested,
not the engine), the single-replica warning from the topology and the wrapper alone, and a spare's
``Session`` as ``init`` returns it (no group, no store needed).
"""

from __future__ import annotations

import contextlib
import re
import types
import warnings

import pytest

from accelpact.impl.launch.job import Topology

torch = pytest.importorskip("torch")

from accelpact.impl.runtime.groups import build_job_groups  # noqa: E402 - after the importorskip of torch
from accelpact.impl.launch.api import ApiError, Session, Settings, Training, single_replica_message  # noqa: E402 - after the importorskip of torch


class _Engine:
    """The part of :class:`accelpact.impl.recovery.Pact` that ``Training.step``/``boundary`` call."""

    frontier = 0

    def __init__(self, raise_in_step: BaseException | None = None) -> None:
        self.raise_in_step = raise_in_step

    @contextlib.contextmanager
    def step(self, step: int):
        yield self
        if self.raise_in_step is not None:
            exc, self.raise_in_step = self.raise_in_step, None
            raise exc

    def boundary(self, loss):
        self.frontier += 1
        return None


def _training(engine: _Engine) -> Training:
    job = types.SimpleNamespace(spares=0)
    return Training(job=job, pact=engine, checkpoints=None, start_step=0, resumed_from=None,  # type: ignore[arg-type]  # a stand-in job and engine
                    restored_extra=None, extra_state=None, wrapper="fsdp2-hybrid")


FORGOT = ("run.step(1): step 0 was never closed by run.boundary(loss): write run.boundary(loss) after each "
          "`with run.step(step):` block (the committed boundary, where repairs and checkpoints happen; without it no "
          "checkpoint is ever written)")


# ------------------------------------------------------------------------- 1. a forgotten boundary
def test_a_step_opened_without_the_previous_boundary_is_refused():
    run = _training(_Engine())
    with run.step(0):
        pass
    with pytest.raises(ApiError) as err:
        with run.step(1):
            pass
    assert str(err.value) == FORGOT


def test_the_last_step_without_its_boundary_is_refused_at_close():
    run = _training(_Engine())
    with run.step(0):
        pass
    run.boundary(None)
    with run.step(1):
        pass
    job = types.SimpleNamespace(spare=None, training=run)
    with pytest.raises(ApiError) as err:
        Session.close(job)  # type: ignore[arg-type]  # a stand-in job: close refuses before any collective
    assert str(err.value) == (
        "job.close(): the last step (1) was never closed by run.boundary(loss): write run.boundary(loss) after each "
        "`with run.step(step):` block, the last one too (its optimizer step is not committed without it: not "
        "repaired, not checkpointed)")


def test_steps_closed_by_their_boundary_run_on():
    run = _training(_Engine())
    for step in range(3):
        with run.step(step):
            pass
        run.boundary(None)
    assert run.pact.frontier == 3


def test_a_discarded_step_comes_again_without_a_boundary():
    """An episode that rebuilt the model in the step (a hot swap, a discard) handed it to the next
    generation's engine (``Rebuild.then``: ``Training._continue``); the step is discarded and comes
    again without a boundary."""
    run = _training(_Engine())

    class _Rebuilding(_Engine):
        @contextlib.contextmanager
        def step(self, step: int):
            yield self
            run.pact = _Engine()  # what Rebuild.then does: the engine of the next generation took over

    run.pact = _Rebuilding()
    with run.step(0):
        pass
    assert run.discarded
    with run.step(0):              # the same step again, no boundary in between: allowed
        pass
    assert not run.discarded
    run.boundary(None)
    with run.step(1):
        pass


# ------------------------------------------------------------------------- 2. one replica
SINGLE = ("accelpact: replicas=1 on 4 ranks: every replicate group is a single rank, so no failure can be repaired in "
          "place (L1) and no spare can take a rank's place (hot swap needs a live replica): every failure is an L2 "
          "restart from the last checkpoint. Set replicas= in accelpact.init (or ACCELPACT_REPLICAS) to the number of "
          "model replicas, e.g. replicas=2 on 4 ranks (the default is one replica per node, WORLD_SIZE // "
          "LOCAL_WORLD_SIZE: 1 under torchrun --standalone)")


def test_one_replica_of_a_hybrid_wrapper_is_warned_about():
    from accelpact.impl.launch.api import _warn_if_single_replica

    assert single_replica_message(Topology(1, 4), "fsdp2-hybrid") == SINGLE
    assert single_replica_message(Topology(1, 4), "fsdp1-hybrid") == SINGLE
    with pytest.warns(UserWarning, match=re.escape(SINGLE)):
        _warn_if_single_replica(Topology(1, 4), "fsdp2-hybrid", 0)


def test_the_single_replica_warning_is_said_once_on_rank_0():
    from accelpact.impl.launch.api import _warn_if_single_replica

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rank in (1, 2, 3):               # every rank would print the same: rank 0 alone says it
            _warn_if_single_replica(Topology(1, 4), "fsdp2-hybrid", rank)


@pytest.mark.parametrize("topo, wrapper", [(Topology(2, 2), "fsdp2-hybrid"), (Topology(1, 1), "fsdp2-hybrid"),
                                           (Topology(1, 4), "ddp")])
def test_no_warning_where_r_has_peers_or_the_world_is_one_rank(topo, wrapper):
    from accelpact.impl.launch.api import _warn_if_single_replica

    assert single_replica_message(topo, wrapper) is None     # DDP's R is the world group
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_single_replica(topo, wrapper, 0)


# ------------------------------------------------------------------------- 3. a spare without rebuild=
def _spare_job() -> Session:
    """What ``accelpact.init`` returns on the launcher's last process when ``spares=1``, world 4 + 1."""
    return Session(settings=Settings(backend="gloo", spares=1), rank=-1, world=4, local_rank=4, attempt=0,
                   replicas=2, device=torch.device("cpu"), store=None, attempt_store=None, topology=Topology(2, 2),
                   groups=build_job_groups(None, Topology(2, 2), -1, "gloo", device=torch.device("cpu"), store=None,
                                           deadline_s=20.0, pg_timeout_s=60.0, collective_timeout_s=60.0, build=False),
                   spares=1, spare=0)


SPARE = ("this process is spare 0: it holds no replicate group until it takes a dead rank's identity, inside attach. "
         "With spares, build the model in a function and pass it to attach: job.attach(rebuild=build, ...), where "
         "build(job, extra) wraps the model on job's current groups (job.mesh, job.shard_group, ...) and returns "
         "(model, optimizer); touch no group before attach")


def test_a_spare_touching_the_mesh_before_attach_is_told_to_use_rebuild():
    job = _spare_job()
    assert job.rank == -1                    # a spare has no identity yet
    with pytest.raises(ApiError) as err:
        _ = job.mesh
    assert str(err.value) == SPARE
    with pytest.raises(ApiError, match=re.escape("no shard group until")):
        _ = job.shard_group


def test_a_spare_attaching_a_built_model_is_told_to_pass_rebuild():
    with pytest.raises(ApiError, match=re.escape("pass rebuild=fn, where fn(job, extra) builds")):
        _spare_job().attach(torch.nn.Linear(2, 2), object())


# ------------------------------------------------------------------------- 6. a spare's identity is logged
def test_a_spare_taking_an_identity_says_so(capsys, monkeypatch):
    import sys

    from accelpact.impl.launch.api import _announce_identity

    monkeypatch.setitem(sys.modules, "setproctitle", None)   # not installed: the log line alone
    _announce_identity(0, 1, "4")
    assert capsys.readouterr().err == ("accelpact: spare 0 (launcher RANK=4) now acts as rank 1: use job.rank, not "
                                       "os.environ['RANK']\n")


_TWICE = '''
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
import accelpact
job = accelpact.init(replicas=1, trace_dir={out!r})
model = DDP(torch.nn.Linear(4, 4), process_group=job.world_group)
optim = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
run = job.attach(model, optim)
run = job.attach(model, optim)  # a second attach: ApiError, which the script does not catch
'''


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_an_uncaught_error_exits_1_never_sigabrt(tmp_path):
    """Issue 25: an exception the script does not catch (here the ApiError of a second attach) ends
    each rank with exit 1 and its traceback, never with SIGABRT from the interpreter's teardown of
    live groups (seen as exit -6 in about one run of three before ``init`` installed its hook)."""
    import subprocess
    import sys

    from accelpact.impl.launch.launch import worker_env

    script = tmp_path / "twice.py"
    script.write_text(_TWICE.format(out=str(tmp_path / "out")))
    env = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "--monitor-interval", "0.1", str(script)], env=env, capture_output=True, text=True,
                              timeout=150)
        text = proc.stdout + proc.stderr
        assert "one model per job" in text, text[-3000:]
        codes = {int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", text)}
        assert "terminate called" not in text and -6 not in codes, text[-3000:]
        assert codes <= {1, -15}, (codes, text[-3000:])  # 1: the error; -15: the agent stopping the other


@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.nightly("a torchrun launch (about 15 s of CPU): the warning's wording and once-on-rank-0 rule run every time "
                     "in this file's in-process tests")
def test_the_example_without_replicas_warns_once_under_torchrun(tmp_path):
    """Issue 29 item 2: ``examples/fsdp2_hsdp.py`` without ``--replicas`` on one node is one replica;
    what the user sees is the warning, once (rank 0), naming ``replicas=``; with ``--replicas 2``, none."""
    import subprocess
    import sys
    from pathlib import Path

    from accelpact.impl.launch.launch import worker_env

    script = Path(__file__).resolve().parents[1] / "examples" / "fsdp2_hsdp.py"
    env = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    message = single_replica_message(Topology(1, 2), "fsdp2-hybrid")
    assert message is not None and "Set replicas= in accelpact.init (or ACCELPACT_REPLICAS)" in message
    for replicas, expected in (([], 1), (["--replicas", "2"], 0)):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "--monitor-interval", "0.1", str(script), "--steps", "2", "--out",
                               str(tmp_path / f"r{len(replicas)}"), *replicas],
                              env=env, capture_output=True, text=True, timeout=200)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-3000:]
        assert text.count(message) == expected, text[-3000:]
