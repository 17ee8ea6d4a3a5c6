"""The public API (``accelpact.init`` -> ``Session.attach`` -> ``Training``), impl/launch/api.py.

Single-process: settings from arguments and ``ACCELPACT_*`` variables and their errors, what
``init`` needs from the launcher, the fault flag, a user's own mesh on gloo.  Multi-process (2x2 on
loopback gloo, :mod:`accelpact.testing`): a repair through the API leaves the job's group views on
the new communicator, and a second attempt resumes from the last committed checkpoint with the
per-rank extra state saved beside it.
"""

from __future__ import annotations

import pytest

from accelpact.model.faults import Fault, FaultError

torch = pytest.importorskip("torch")

from accelpact.impl.launch.api import ApiError, Settings  # noqa: E402 - after the importorskip of torch


# ------------------------------------------------------------------------------------ settings
def test_settings_argument_over_environment_over_default():
    env = {"ACCELPACT_DEADLINE_S": "7.5", "ACCELPACT_REPLICAS": "4", "ACCELPACT_DETECT": "0"}
    s = Settings.resolve(env, deadline_s=3.0, replicas=None)
    assert s.deadline_s == 3.0          # the argument wins
    assert s.replicas == 4              # then the variable
    assert s.detect is False
    assert s.collective_timeout_s == Settings().collective_timeout_s  # then the default


@pytest.mark.parametrize("var, value, says", [
    ("ACCELPACT_DEADLINE_S", "soon", "ACCELPACT_DEADLINE_S='soon'"),
    ("ACCELPACT_DEADLINE_S", "-1", "seconds > 0"),
    ("ACCELPACT_REPLICAS", "0", "integer >= 1"),
    ("ACCELPACT_BACKEND", "mpi", "unknown backend 'mpi'"),
    ("ACCELPACT_DETECT", "maybe", "true or false"),
])
def test_a_malformed_variable_is_an_error_naming_it(var, value, says):
    with pytest.raises(ApiError, match=says):
        Settings.resolve({var: value})


def test_an_unknown_setting_is_refused():
    with pytest.raises(TypeError, match="unknown setting.*deadline"):
        Settings.resolve({}, deadline=3)


def test_init_outside_a_launcher_says_what_it_needs():
    import accelpact

    with pytest.raises(ApiError, match="RANK is not set: run under torchrun"):
        accelpact.init("gloo", env={})


def test_init_refuses_replicas_that_do_not_divide_the_world():
    import accelpact

    with pytest.raises(ApiError, match="replicas=3 does not divide WORLD_SIZE=4"):
        accelpact.init("gloo", replicas=3, env={"RANK": "0", "WORLD_SIZE": "4"})


def test_a_user_mesh_on_gloo_is_refused_with_what_to_do():
    import accelpact

    class Mesh:
        mesh_dim_names = ("replicate", "shard")

    with pytest.raises(ApiError, match="use job.mesh"):
        accelpact.init("gloo", mesh=Mesh(), env={"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})


def test_settings_job_and_attach_share_one_deadline_default_and_one_step_deadline_rule():
    """Issue 23: one phase-deadline default, one step-deadline rule (spec/protocol.md P10.5), whether
    the job comes from ``accelpact.init`` (Settings), a job file (Job) or a direct ``attach``."""
    import datetime
    import inspect

    import torch.distributed as dist

    from accelpact.impl import recovery
    from accelpact.impl.runtime.backends import backend_of
    from accelpact.impl.deadlines import DEFAULT_DEADLINE_S, STEP_DEADLINE_FLOOR_S, default_step_deadline
    from accelpact.impl.launch.job import Job, Topology, Workload

    job = Job(topology=Topology(2, 1), workload=Workload(wrapper="ddp", layers=1, steps=1, seed=1), out="/nonexistent")
    assert Settings().deadline_s == job.deadline_s == DEFAULT_DEADLINE_S
    for fn in (recovery.attach, recovery.Pact):
        params = inspect.signature(fn).parameters
        assert params["deadline_s"].default == DEFAULT_DEADLINE_S, fn
        assert params["step_deadline_s"].default is None, fn   # derived by the rule below
    assert job.step_deadline_s == default_step_deadline(job.collective_timeout_s, job.deadline_s)
    assert default_step_deadline(60.0, 20.0) == STEP_DEADLINE_FLOOR_S              # a step's compute: the floor
    assert default_step_deadline(1800.0, 20.0) == 1800.0 + 6 * 20.0               # outlasts a slow collective, then six phase waits
    assert default_step_deadline(None, 200.0) == 6 * 200.0
    assert job.replace(collective_timeout_s=1800.0).step_deadline_s == 1920.0
    # attach reads the collective timeout off R's group, as the training groups were built with it
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=1800))
    assert backend_of(pg).timeout_of(pg) == 1800.0


# ------------------------------------------------------------------------------------ fault flag
def test_fault_flag_is_parsed_and_validated():
    assert Fault.parse_flag("collective_timeout@boundary:3:0,2") == Fault(3, "boundary", "collective_timeout", (0, 2))
    assert Fault.parse_flag("crash@backward:4") == Fault(4, "backward", "crash")
    assert Fault.parse_flag("collective_timeout@boundary:3:0:world").group == "world"
    for bad, says in [("boom", "is not KIND@POINT"), ("crash@backward:x", "must be integers"),
                      ("crash@nowhere:1", "is not one of"), ("crash@backward:1:0,0", "duplicate rank")]:
        with pytest.raises(FaultError, match=says):
            Fault.parse_flag(bad)


def test_wrapper_of_an_unwrapped_module_names_the_supported_wrappers():
    from accelpact.impl.runtime.wrappers import wrapper_of

    with pytest.raises(ValueError, match="fsdp1-hybrid.*fsdp2-hybrid.*ddp"):
        wrapper_of(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------------------ multi-process
def api_rank(ctx, steps: int, fault: str | None, ckpt: str) -> dict:
    """A user's loop on the workload's FSDP2 HSDP model, built only through the public API."""
    import accelpact
    from accelpact.impl.launch import workload
    from accelpact.testing.faults import fault_hooks

    job = accelpact.init("gloo", replicas=2, deadline_s=20.0, collective_timeout_s=60.0)
    before = {k: job.groups.training[k] for k in ("shard", "replicate", "world")}
    spec = workload.WorkloadSpec(wrapper="fsdp2-hybrid", layers=2, dim=16, heads=2, seq=8, batch=2)
    app = workload.build_job(spec, job.topology, workload.groups_of(job))
    run = job.attach(app.module, app.optimizer, checkpoint_dir=ckpt, checkpoint_every=2,
                     extra_state=lambda: ("cursor-at", app.cursor.kappa), hooks=fault_hooks(job, fault))
    if run.restored_extra is not None:
        app.cursor.kappa = run.restored_extra[1]
    start = run.start_step
    for step in run.steps(steps):
        with run.step(step):
            loss = workload.train_step(app, step)
        run.boundary(loss)
    out = {"start": start, "restored": run.restored_extra, "repairs": len(run.reports), "saved": [s for s, _ in run.saved],
           "replicate_is_new": job.replicate_group is not before["replicate"],
           "replicate_is_pacts": job.replicate_group is run.pact.process_group,
           "shard_unchanged": job.shard_group is before["shard"], "snapshot": workload.snapshot(app)}
    job.close()
    return out


@pytest.mark.multiproc
def test_a_repair_through_the_api_moves_the_jobs_group_views(ranks):
    run = ranks.run(api_rank, 4, init_group=False, steps=4, fault="collective_timeout@boundary:1:0,2",
                    ckpt=str(ranks.out / "ckpt"))
    assert run.ok, run.explain()
    for r, v in enumerate(run.values()):
        assert v["repairs"] == 1, (r, v["repairs"])
        assert v["replicate_is_pacts"], f"rank {r}: job.replicate_group is not R's current communicator"
        # only the failed replicate group {0, 2} was rebuilt; ranks 1 and 3 keep theirs
        assert v["replicate_is_new"] == (r in (0, 2)), (r, v["replicate_is_new"])
        assert v["shard_unchanged"]
        assert v["saved"] == [2, 4]


@pytest.mark.multiproc
@pytest.mark.nightly("an L2 resume through the API (about 24 s): the README's script resumes through the same API every time (test_readme_script)")
def test_a_second_attempt_resumes_from_the_last_committed_checkpoint(ranks):
    ckpt = str(ranks.out / "ckpt")
    first = ranks.run(api_rank, 4, init_group=False, steps=5, fault=None, ckpt=ckpt)
    assert first.ok, first.explain()
    again = ranks.run(api_rank, 4, init_group=False, steps=6, fault=None, ckpt=ckpt,
                      env={"TORCHELASTIC_RESTART_COUNT": "1"})
    assert again.ok, again.explain()
    for r, v in enumerate(again.values()):
        assert v["start"] == 4, f"rank {r} resumed at {v['start']}, the last committed checkpoint is step 4"
        assert v["restored"] == ("cursor-at", 4), v["restored"]
