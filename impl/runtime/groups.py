"""Every process group of a rank's job is built here: at :func:`accelpact.init` and in an episode.

* :func:`build_job_groups` (at init, collective over the default group): the engine's out-of-band
  control group and DCP's checkpoint group over all of W (gloo), and the training groups (shard,
  replicate, world) of the job's topology, each with the socket record its revoke closes: the job's
  one record of its groups, :class:`JobGroups`;
* :meth:`JobGroups.rebuild_wide` (every repair's ``RankReplace``, P18.3): the groups over all of W in
  generation g+1;
* :meth:`JobGroups.rebuild_all` (a hot swap's or a discard's ``RankReplace``): every group in g+1.

Order: every rank builds every group in one fixed order (members-only builds desynchronise the
default group, spec/torch-facts.md).  A rebuilt job's old groups are unregistered and destroyed off
the critical path (:mod:`accelpact.impl.runtime.retire`); the record is updated in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..controlplane import swap_prefix, wide_prefix
from . import counting, revoke
from .adapters.base import unregister_group
from .backends import backend
from .retire import retire_off_path

__all__ = ["JobGroups", "build_job_groups", "build_recorded_groups"]


@dataclass(eq=False)
class JobGroups:
    """This rank's process groups: the job's one record of them.

    ``training``: this rank's group of each kind it belongs to (``"shard"``, ``"replicate"``,
    ``"world"``; the group the engine recovers, R, leaves it once an engine holds it), ``records``:
    the socket record of each (what a revoke closes); ``control`` and ``checkpoint``: the groups over
    all of W, with theirs; ``generation``: the generation they were built in; ``mesh``: the 2-D
    DeviceMesh over shard and replicate (built on first use, or the user's).  The rest says how a
    group is built here: the topology, the training backend, the device, the attempt's store (every
    rebuilt group's rendezvous) and the timeouts."""

    topology: Any
    backend: str
    device: Any
    store: Any
    deadline_s: float
    pg_timeout_s: float
    collective_timeout_s: float
    training: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)
    default_record: Any = None
    control: Any = None
    control_record: Any = None
    checkpoint: Any = None
    checkpoint_record: Any = None
    generation: int = 0
    mesh: Any = None
    #: the ranks in training (issue 41: a shrunk job's groups are built over them only); None: every
    #: rank of the topology.  Identities never change: a rank out of it holds no group of this generation
    active: tuple[int, ...] | None = None

    def members(self, ranks: Any) -> list[int]:
        """``ranks`` less those out of training (a shrunk job's)."""
        return [r for r in ranks if self.active is None or r in self.active]

    def wide_records(self) -> list:
        """The socket records of the groups over all of W that a wide revoke closes (P18.4): the
        default group's (where this job built it: a user's own ``init_process_group`` has none), the
        control and the checkpoint group's.  A peer blocked in any of them (the flag, a save, FSDP1's
        state-dict gathers on the default group) wakes up."""
        return [r for r in (self.default_record, self.control_record, self.checkpoint_record) if r is not None]

    def _make(self, rank: int, b: Any, pre: str, name: str, members: list[int], timeout_s: float) -> tuple[Any, Any]:
        """One group built by its ``members`` under the store prefix ``pre + name`` with backend ``b``,
        registered with c10d under that name: ``(group, revoke record)``."""
        pg, rec = b.build_group(dist.PrefixStore(pre + name, self.store), members.index(rank), len(members),
                                name=pre + name, global_ranks=members, device=self.device if b.device_type != "cpu" else None,
                                connect_timeout_s=self.deadline_s, timeout_s=timeout_s)
        b.register(pg, pre + name, members, self.store)
        return pg, rec

    def _replace_wide(self, rank: int, pre: str) -> list:
        """The groups over all of W built under ``pre``, in one fixed order on every rank: default (the
        training backend), control and checkpoint (gloo); the new default installed.  Returns the old
        ones (to retire).  A shrunk job (``active``) builds control and checkpoint over its active
        ranks and keeps its default group: c10d's global ranks are the default group's, and a rank out
        of training cannot join a new one (nothing of AccelPact's runs on it; a grow back to every rank
        rebuilds it)."""
        world = self.members(range(self.topology.world))
        if self.active is not None:
            old = [self.control, self.checkpoint]
            control, control_rec = self._make(rank, backend("gloo"), pre, "control", world, self.collective_timeout_s)
            checkpoint, checkpoint_rec = self._make(rank, backend("gloo"), pre, "checkpoint", world,
                                                    max(self.pg_timeout_s, self.collective_timeout_s))
            self.control, self.control_record = control, control_rec
            self.checkpoint, self.checkpoint_record = checkpoint, checkpoint_rec
            return old
        old = [c10d._world.default_pg, self.control, self.checkpoint]
        default, default_rec = self._make(rank, backend(self.backend), pre, "default", world, self.pg_timeout_s)
        control, control_rec = self._make(rank, backend("gloo"), pre, "control", world, self.collective_timeout_s)
        checkpoint, checkpoint_rec = self._make(rank, backend("gloo"), pre, "checkpoint", world,
                                                max(self.pg_timeout_s, self.collective_timeout_s))
        c10d._update_default_pg(default)
        self.default_record = default_rec
        self.control, self.control_record = control, control_rec
        self.checkpoint, self.checkpoint_record = checkpoint, checkpoint_rec
        return old

    def rebuild_wide(self, rank: int, g_next: int) -> list[str]:
        """``RankReplace``'s groups over all of W (spec/protocol.md P18.3): the default, control and
        checkpoint groups and, where this record holds it apart from R (HSDP), the world group, built in
        generation ``g_next`` under ``accelpact/g{g_next}/wide/<name>`` by every rank of W, in one fixed
        order; the old groups unregistered and retired off the critical path.  Every rank calls it in
        every episode: a link inside R crosses every one of them, and the engine cannot tell a broken
        link from a broken communicator of R alone.  Returns the names built."""
        pre = wide_prefix(g_next)
        old = self._replace_wide(rank, pre)
        names = ["default", "control", "checkpoint"] if self.active is None else ["control", "checkpoint"]
        if "world" in self.training:  # HSDP: the world group is not R (DDP's is, and the engine rebuilds it)
            old.append(self.training["world"])
            self.training["world"], self.records["world"] = self._make(rank, backend(self.backend), pre, "world",
                                                                       self.members(range(self.topology.world)),
                                                                       self.collective_timeout_s)
            names.append("world")
        _retire_groups(old)
        return names

    def rebuild_all(self, rank: int, g_next: int, held: tuple = (), active: Any = "same") -> None:
        """``RankReplace`` of a hot swap or a discard: every group (default, control, checkpoint, shard,
        replicate, world) built in generation ``g_next`` by its members only, under
        ``accelpact/g{g_next}/swap/<name>`` (the generation fences every older member out), in one
        fixed order on every rank; the old ones aborted first (NCCL: their kernels end before new ones
        take the device), then unregistered and retired off the critical path.  ``rank``: the identity
        this process holds (a spare's, once it took one); ``held``: further old groups of this rank (R,
        which the engine holds rather than this record).  ``active``: the ranks in training in
        ``g_next`` (issue 41: a shrink leaves some out, a grow brings them back; None: every rank;
        ``"same"``: as in this generation); each group is built over its active members only."""
        if active != "same":
            self.active = None if active is None or len(set(active)) == self.topology.world else tuple(sorted(active))
        be, topo = backend(self.backend), self.topology
        pre = swap_prefix(g_next)
        training = [*self.training.values(), *held]
        be.abort_all(training)  # NCCL: in one bracket, as torch aborts the world (serial aborts can hang)
        old = self._replace_wide(rank, pre) + training
        groups: dict[str, Any] = {}
        records: dict[str, Any] = {}
        for kind in ("shard", "replicate", "world"):
            for i, members in enumerate(topo.groups_of_kind(kind)):
                members = self.members(members)
                if rank in members:
                    groups[kind], records[kind] = self._make(rank, be, pre, f"{kind}{i}", members,
                                                             self.collective_timeout_s)
        self.training, self.records, self.mesh, self.generation = groups, records, None, g_next
        del training
        _retire_groups(old)


def _new_group(ranks: list[int] | None, backend_name: str, timeout: timedelta, **kwargs: Any) -> tuple[Any, Any]:
    """``dist.new_group`` (over ``ranks``, all of W for None) with its socket record."""
    return counting.count_group(revoke.recorded(lambda: dist.new_group(ranks, backend=backend_name, timeout=timeout, **kwargs), backend_name), backend_name)


def _retire_groups(old: list) -> None:
    """Unregister the replaced groups and destroy them off the critical path, on the retiring thread
    (:func:`accelpact.impl.runtime.retire.retire_off_path`, as phase 5 retires a replaced R): a
    teardown that blocks on a dead peer blocks that thread, not the episode.  The caller lets go of
    them first, so that the retiring thread holds their last reference where it can; a group
    something else still holds (the old model, the engine's R) is destroyed where that reference goes."""
    box = []
    for pg in old:
        if pg is not None:
            unregister_group(pg)
            box.append(pg)
    old.clear()  # the caller's list held them too: the box is their last reference here
    if box:
        retire_off_path(box)


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


def build_job_groups(workload: Any, topo: Any, rank: int, backend_name: str, *, device: Any, store: Any,
                     deadline_s: float, pg_timeout_s: float, collective_timeout_s: float, mesh: Any = None,
                     build: bool = True, default_record: Any = None) -> JobGroups:
    """The job's record of this rank's groups.  ``build`` (every training rank, at init, in one
    order): the control group (gloo over W, timeout the collective timeout: the failure flag and the
    commit fence, waits of every fault-free step), the checkpoint group (gloo over W: DCP's, never a communicator that may fail), then
    the training groups: built here, or, with a user's ``mesh``, its shard and replicate groups (their
    timeout set to ``collective_timeout_s``) and a world group built here.  Without ``build`` (a
    spare): an empty record, filled when the spare takes an identity (:meth:`JobGroups.rebuild_all`)."""
    groups = JobGroups(topo, backend_name, device, store, deadline_s, pg_timeout_s, collective_timeout_s, mesh=mesh,
                       default_record=default_record)
    if not build:
        return groups
    # the control group's ops (the failure flag, the commit fence) are waits of a fault-free step: bounded
    # by the training's collective timeout, never by the phase deadline (a slow healthy step is no failure)
    groups.control, groups.control_record = _new_group(None, "gloo", timedelta(seconds=max(collective_timeout_s, 1.0)))
    # a save to a slow disk on one rank is waited for as a slow step is: the collective timeout at least
    groups.checkpoint, groups.checkpoint_record = _new_group(None, "gloo", timedelta(seconds=max(pg_timeout_s, collective_timeout_s)))
    timeout = timedelta(seconds=collective_timeout_s)
    if mesh is None:
        built, groups.records = build_recorded_groups(workload, topo, rank, backend_name, timeout, device=device)
        groups.training = {"shard": built.shard, "replicate": built.replicate, "world": built.world}
    else:
        be = backend(backend_name)
        world = dist.new_group(list(range(topo.world)), backend=backend_name, timeout=timeout, **be.init_kwargs(device))
        groups.training = {"shard": mesh.get_group("shard"), "replicate": mesh.get_group("replicate"), "world": world}
        for g in (groups.training["shard"], groups.training["replicate"]):  # the mesh's own timeout is not ours (spec/nccl.md row 21)
            be.set_timeout(g, collective_timeout_s)
        groups.records = {k: revoke.record_group(g, backend_name) for k, g in groups.training.items()}
    return groups
