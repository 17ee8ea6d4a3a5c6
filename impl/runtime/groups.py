"""Every process group of a rank's job is built here: at :func:`accelpact.init` and in an episode.

* :func:`build_job_groups` (at init, collective over the default group): the engine's out-of-band
  control group and DCP's checkpoint group over all of W (gloo), and the training groups (shard,
  replicate, world) of the job's topology, each with the socket record its revoke closes;
* :func:`rebuild_wide` (every repair's ``RankReplace``, P18.3): the groups over all of W in
  generation g+1;
* :func:`rebuild_groups` (a hot swap's or a discard's ``RankReplace``): every group of the job in g+1.

Order: every rank builds every group in one fixed order (members-only builds desynchronise the
default group, spec/torch-facts.md).  A rebuilt job's old groups are unregistered and destroyed off
the critical path (:mod:`accelpact.impl.runtime.retire`).  ``job`` is the training job
(:class:`~accelpact.impl.launch.api.Session`), updated in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..controlplane import swap_prefix, wide_prefix
from . import revoke
from .adapters.base import unregister_group
from .backends import backend
from .retire import retire_off_path

__all__ = ["JobGroups", "build_job_groups", "build_recorded_groups", "rebuild_groups", "rebuild_wide"]


@dataclass(frozen=True, slots=True)
class JobGroups:
    """What :func:`build_job_groups` built for one rank: its training groups by kind and their socket
    records, and the control and checkpoint groups with theirs."""

    training: dict
    records: dict
    control: Any
    control_record: Any
    checkpoint: Any
    checkpoint_record: Any


def _new_group(ranks: list[int] | None, backend_name: str, timeout: timedelta, **kwargs: Any) -> tuple[Any, Any]:
    """``dist.new_group`` (over ``ranks``, all of W for None) with its socket record."""
    return revoke.recorded(lambda: dist.new_group(ranks, backend=backend_name, timeout=timeout, **kwargs), backend_name)


def build_recorded_groups(workload: Any, topo: Any, rank: int, backend_name: str, timeout: timedelta,
                          device: Any = None) -> tuple[Any, dict]:
    """The workload's training groups (``workload.build_groups``: shard, replicate, world and the 2-D
    mesh over them) with the socket record of every group this rank belongs to: ``(groups, records)``,
    records keyed ``"shard"``, ``"replicate"``, ``"world"``."""
    records = {}
    extra = backend(backend_name).init_kwargs(device) if device is not None else {}

    def new_group(kind: str, ranks: list[int]) -> Any:
        g, rec = _new_group(ranks, backend_name, timeout, **extra)
        if rank in ranks:
            records[kind] = rec
        return g

    return workload.build_groups(topo, rank, backend_name, timeout, new_group=new_group, device=device), records


def build_job_groups(workload: Any, topo: Any, rank: int, backend_name: str, *, device: Any, deadline_s: float,
                     pg_timeout_s: float, collective_timeout_s: float, mesh: Any = None) -> JobGroups:
    """At init, on every rank, in one order: the control group (gloo over W, timeout the phase
    deadline: the failure flag, validation), the checkpoint group (gloo over W: DCP's, never a
    communicator that may fail), then the training groups: built here, or, with a user's ``mesh``, its
    shard and replicate groups (their timeout set to ``collective_timeout_s``) and a world group built
    here."""
    control, control_record = _new_group(None, "gloo", timedelta(seconds=max(deadline_s, 1.0)))
    checkpoint, checkpoint_record = _new_group(None, "gloo", timedelta(seconds=pg_timeout_s))
    timeout = timedelta(seconds=collective_timeout_s)
    if mesh is None:
        groups, records = build_recorded_groups(workload, topo, rank, backend_name, timeout, device=device)
        training = {"shard": groups.shard, "replicate": groups.replicate, "world": groups.world}
    else:
        be = backend(backend_name)
        world = dist.new_group(list(range(topo.world)), backend=backend_name, timeout=timeout, **be.init_kwargs(device))
        training = {"shard": mesh.get_group("shard"), "replicate": mesh.get_group("replicate"), "world": world}
        for g in (training["shard"], training["replicate"]):  # the mesh's own timeout is not ours (spec/nccl.md row 21)
            be.set_timeout(g, collective_timeout_s)
        records = {k: revoke.record_group(g, backend_name) for k, g in training.items()}
    return JobGroups(training, records, control, control_record, checkpoint, checkpoint_record)


def _make_group(job: Any, b: Any, pre: str, name: str, members: list[int], timeout_s: float) -> tuple[Any, Any]:
    """One group of ``job`` built by its ``members`` under the store prefix ``pre + name`` with backend
    ``b``, registered with c10d under that name: ``(group, revoke record)``."""
    pg, rec = b.build_group(dist.PrefixStore(pre + name, job.attempt_store), members.index(job.rank), len(members),
                            name=pre + name, global_ranks=members, device=job.device if b.device_type != "cpu" else None,
                            connect_timeout_s=job.settings.deadline_s, timeout_s=timeout_s)
    b.register(pg, pre + name, members, job.attempt_store)
    return pg, rec


def _build_wide(job: Any, pre: str) -> tuple[Any, Any, Any, Any, Any]:
    """The groups over all of W, in one fixed order on every rank: default (the job's backend),
    control and checkpoint (gloo): ``(default, control, control_record, checkpoint, checkpoint_record)``."""

    s, world = job.settings, list(range(job.world))
    default, _ = _make_group(job, backend(job.backend), pre, "default", world, s.pg_timeout_s)
    control, control_rec = _make_group(job, backend("gloo"), pre, "control", world, max(s.deadline_s, 1.0))
    checkpoint, checkpoint_rec = _make_group(job, backend("gloo"), pre, "checkpoint", world, s.pg_timeout_s)
    return default, control, control_rec, checkpoint, checkpoint_rec


def _retire_groups(old: list) -> None:
    """Unregister the replaced groups and destroy them off the critical path, on the engine's retiring
    thread (:func:`accelpact.impl.runtime.retire.retire_off_path`, as phase 5 retires a replaced R): a
    teardown that blocks on a dead peer blocks that thread, not the episode.  Call it after the job
    let go of them, so that the retiring thread holds their last reference where it can; a group
    something else still holds (the old model, the engine's R) is destroyed where that reference goes."""

    box = []
    for pg in old:
        if pg is not None:
            unregister_group(pg)
            box.append(pg)
    old.clear()  # the caller's list held them too: the box is their last reference here
    if box:
        retire_off_path(box)


def _install_wide(job: Any, built: tuple[Any, Any, Any, Any, Any]) -> None:
    default, control, control_rec, checkpoint, checkpoint_rec = built
    c10d._update_default_pg(default)
    job.control_group, job.checkpoint_group = control, checkpoint
    job.control_record, job.checkpoint_record = control_rec, checkpoint_rec


def rebuild_wide(job: Any, g_next: int) -> list[str]:
    """``RankReplace``'s groups over all of W (spec/protocol.md P18.3): the default, control and
    checkpoint groups and, where the job holds it apart from R (HSDP), the world group, built in
    generation ``g_next`` under ``accelpact/g{g_next}/wide/<name>`` by every rank of W, in one fixed
    order; the new default group installed, ``job`` updated in place, the old groups unregistered and
    retired off the critical path.  Every rank calls it in every episode: a link inside R crosses every one of them, and the
    engine cannot tell a broken link from a broken communicator of R alone.  Returns the names built."""
    pre = wide_prefix(g_next)
    old = [c10d._world.default_pg, job.control_group, job.checkpoint_group]
    built = _build_wide(job, pre)
    names = ["default", "control", "checkpoint"]
    if "world" in job.groups:  # HSDP: the world group is not R (DDP's is, and the engine rebuilds it)
        old.append(job.groups["world"])
        job.groups["world"], job.records["world"] = _make_group(job, backend(job.backend), pre, "world",
                                                                list(range(job.world)), job.settings.collective_timeout_s)
        names.append("world")
    _install_wide(job, built)
    _retire_groups(old)
    return names


def rebuild_groups(job: Any, g_next: int, held: tuple = ()) -> None:
    """RankReplace for every group of the job (``RankReplace`` of the model's R, and with it the
    default group, the control and checkpoint groups, shard, replicate and world): built in generation
    ``g_next`` by the members only, under ``accelpact/g{g_next}/swap/<name>`` (the generation fences
    every older member out), in one fixed order on every rank, registered with c10d; the new default
    group installed.  ``job`` (a :class:`~accelpact.impl.launch.api.TrainingJob`) is updated in place; its
    old groups are unregistered and retired off the critical path (:func:`_retire_groups`).  ``held``: further old groups of this rank
    (R, which the engine holds rather than the job)."""
    be, rank, topo = backend(job.backend), job.rank, job.topology
    pre = swap_prefix(g_next)
    training = [*job.groups.values(), *held]
    old = [c10d._world.default_pg, job.control_group, job.checkpoint_group, *training]
    for pg in training:
        be.abort(pg)  # NCCL: the old communicators' kernels end before new ones take the device (gloo: nothing)
    built = _build_wide(job, pre)
    groups: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for kind in ("shard", "replicate", "world"):
        for i, members in enumerate(topo.groups_of_kind(kind)):
            if rank in members:
                groups[kind], records[kind] = _make_group(job, be, pre, f"{kind}{i}", list(members),
                                                          job.settings.collective_timeout_s)
    _install_wide(job, built)
    job.groups, job.records, job._mesh = groups, records, None
    job.generation = g_next
    del training
    _retire_groups(old)
