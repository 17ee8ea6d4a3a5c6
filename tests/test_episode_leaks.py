"""Soak K3: an episode that rebuilds the model and every group (a discard in place, P17; a hot swap the
same way) must let go of what it retired.

The 30-minute soak saw each survivor grow by about three listening sockets (each a gloo group, with its
threads and fds) per episode.  Measured here, on a 2x2 FSDP1 HSDP job that meets three link cuts in
backward, each discarded in place, five things held the retired generation:

* the conformance worker kept the first model in a local variable for the whole run;
* the engine's post-step hook on the old optimizer held the retired engine (and its groups) strongly;
* torch 2.13's ``_cleanup_process_group_global_state`` leaves a group in the default tag's list
  (``tags_to_pg[""]``), so the groups built at ``accelpact.init`` were never freed;
* FSDP1's post-backward hook state of a backward that raised: a cycle through autograd's C++ hook
  list, which the garbage collector cannot see (``FSDP1Adapter.release``);
* the unsharded parameter views a backward that raised leaves as plain tensor attributes of the
  modules: their ``grad_fn`` leads to the flat parameter, whose ``_param_infos`` name the modules,
  another cycle through autograd (``FSDP1Adapter.release`` drops them).

Each rank checks, at the job's last boundary (after episode 3), that the engine, the wrapper, every
inner FSDP unit and the optimizer of generation 0 are gone and that no tag list of c10d holds a
group c10d no longer knows, and prints its threads and listening sockets per generation (6, 7, 7, 7:
the first episode's +1 is reused by every later one).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

CUTS = (3, 7, 11)
STEPS = 18


def sampling_body(ctx, job) -> dict:
    """A rank of ``job`` (the conformance worker) that keeps weak references to generation 0's engine,
    wrapper and optimizer, and at the last boundary reports which are still alive, the c10d tag lists'
    strays and its own threads, fds and listening sockets at each generation's last boundary."""
    import gc
    import weakref

    import torch.distributed as dist

    from accelpact.impl.launch.api import Training
    from accelpact.testing.worker import run_job
    from accelpact.testing.soak.live import proc_counts

    from accelpact.impl.runtime.retire import retire_off_path

    # no automatic collection: what frees the retired engine and its groups must be the engine's own
    # collection after each episode (recovery.collect_off_path; the interpreter's came 25-40 s late in the soak)
    gc.disable()
    first: dict = {}
    seen: dict = {"counts": {}}
    real = Training.boundary

    def boundary(self, loss=None):
        report = real(self, loss)
        if self.discarded:
            return report
        g = self.pact.gen
        if not first:
            first.update(engine=weakref.ref(self.pact), wrapper=weakref.ref(self.pact.module),
                         optimizer=weakref.ref(self.pact.optimizer))
            first.update({f"unit {name or 'root'}": weakref.ref(m) for name, m in self.pact.module.named_modules()
                          if type(m).__name__ == "FullyShardedDataParallel" and name})
        retire_off_path([]).wait(30)  # the retiring thread has run what was queued (the episode's collection)
        seen["counts"][g] = proc_counts(os.getpid())
        w = dist.distributed_c10d._world
        seen["alive"] = sorted(k for k, r in first.items() if r() is not None)
        seen["strays"] = sum(1 for pgs in w.tags_to_pg.values() for pg in pgs if pg not in w.pg_map)
        seen["gen"] = g
        return report

    Training.boundary = boundary  # type: ignore[method-assign]  # this process only: the rank samples itself
    code = run_job(job)
    if code:
        raise SystemExit(code)
    return seen


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_three_discards_free_the_retired_engine_wrapper_and_groups_registry(ranks, tmp_path) -> None:
    from accelpact.impl.launch.job import Job, Topology, Workload

    # a collective timeout below the deadline: a wrapper's op posted on sockets its own watcher had just
    # shut down can stay blocked until the group's timeout (spec/torch-facts.md, bench/README.md "K6");
    # it then fails within the peers' wait at the arrival, and the episode is still repaired in place
    out = tmp_path / "run"
    job = Job(topology=Topology(2, 2), workload=Workload("fsdp1-hybrid", 1, STEPS, 0, 0), out=str(out),
              scenario="episode-leaks", trace=True, deadline_s=30.0, collective_timeout_s=10.0, pg_timeout_s=60.0,
              dead_after_s=5.0).replace(faults=[{"step": s, "at": "backward", "kind": "link_cut", "ranks": [1, 3]}
                                                for s in CUTS])
    run = ranks.run(sampling_body, 4, timeout_s=360, job=job)
    assert run.codes == {0: 0, 1: 0, 2: 0, 3: 0}, run.explain()
    for r, seen in enumerate(run.values()):
        assert seen["gen"] == len(CUTS), f"rank {r}: generation {seen['gen']}, expected {len(CUTS)} episodes"
        assert seen["alive"] == [], f"rank {r}: generation 0's {seen['alive']} outlived {len(CUTS)} episodes"
        assert seen["strays"] == 0, f"rank {r}: {seen['strays']} group(s) in c10d's tag lists that c10d no longer knows"
        c = seen["counts"]
        print(f"rank {r}: listening sockets per generation {[c[g]['listeners'] for g in sorted(c)]}, "
              f"threads {[c[g]['threads'] for g in sorted(c)]}")
        later = {(c[g]["listeners"], c[g]["threads"]) for g in sorted(c)[1:]}
        assert len(later) == 1, f"rank {r}: listening sockets and threads grew across the episodes: {later}"
