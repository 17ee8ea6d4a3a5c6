"""Adapter interface: discover once, rebind many, verify with the walker (model: RankRebind, S5).

Ordering requirements: ``discover`` runs while the old group is still the one cached (at attach,
or before the replacement); ``rebind`` runs after the new group exists on every member of R and
before the next forward; ``verify`` runs after ``rebind`` (it walks the graph, ~ms, not us).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence

from ..backends import backend as _backend, backend_of
from .walker import RebindError, RefSite, find_references, rewrite_tuples, write_site, ATTR, SLOT, KEY, INDEX, TUPLE_ITEM


@dataclass(frozen=True)
class RebindCheck:
    """Result of ``Adapter.verify``: ``stale`` references to the old group remain out of ``total``
    sites the adapter owns; ``detail`` names the stale paths (empty when ok)."""

    ok: bool
    stale: int
    total: int
    detail: str = ""


def wraps_with(module: Any, cls: type) -> int:
    """:meth:`Adapter.matches` for a wrapper that is a module class ``cls``: 2 the root is one, 1 a
    module inside is, 0 none."""
    return 2 if isinstance(module, cls) else int(any(isinstance(m, cls) for m in module.modules()))


class Adapter:
    """Wrapper-agnostic behaviour: walker discovery, per-site writes, walker verification.

    Subclasses override ``discover`` with a targeted list (the fast path) and, where a wrapper keeps
    the group outside Python (DDP's C++ Reducer), ``rebind``.
    """

    name = "generic"

    @staticmethod
    def matches(module: Any) -> int:
        """How this adapter's wrapper wraps ``module``: 2 the root is its wrapper class, 1 a module
        inside is, 0 not at all (:func:`accelpact.impl.runtime.adapters.adapter_for` takes the
        highest, ties in the wrapper table's order).  The generic adapter matches nothing: it is
        what is left."""
        return 0

    def discover(self, module: Any, old_pg: Any) -> list[RefSite]:
        return find_references(module, old_pg)

    def in_place_problem(self, module: Any) -> str | None:
        """Why a forward or backward of ``module`` that a communicator failure aborted cannot be
        discarded in place, on the same wrapper (None: it can, :meth:`reset_iter_state`).  Where it
        cannot, the discard needs ``attach(rebuild=...)``: the wrapper is built anew and the committed
        state moved into it (spec/protocol.md P17.3).  By default: a wrapper this adapter does not
        know how to reset."""
        return (f"the {self.name} adapter knows no way to reset its wrapper's per-iteration state after a forward or "
                "backward was aborted")

    def reset_iter_state(self, module: Any) -> None:
        """Drop the wrapper's per-iteration state of a forward or backward that a communicator failure
        aborted (a discard in place, spec/protocol.md P17.3): afterwards the wrapper is idle, as at a
        committed boundary, and its next forward starts a fresh iteration.  Gradients are the engine's
        (``RankDiscardStep`` drops the optimizer's).  Only where :meth:`in_place_problem` is None."""
        raise NotImplementedError(self.in_place_problem(module) or f"{self.name}: no in-place reset")

    def shed(self, module: Any, optimizer: Any) -> None:
        """``module``'s wrapper is about to be replaced (a hot swap's survivor, a discard with
        ``rebuild=``): before the new one is built beside it, let go of what it holds beyond the
        committed state that moves into the new one (the parameters' local shards, the buffers and the
        optimizer state, :func:`~accelpact.impl.runtime.hotswap.export_state`), so that an episode
        never holds two models' working memory at once.  Here every gradient; a wrapper adds what a
        step in flight left allocated (FSDP's unsharded parameters).  The wrapper is not used again
        afterwards: this may leave it unable to run."""
        seen: set[int] = set()
        for p in list(module.parameters()) + [q for grp in optimizer.param_groups for q in grp["params"]]:
            if id(p) not in seen:
                seen.add(id(p))
                p.grad = None

    def release(self, module: Any, keep: Any = None) -> int:
        """``module``'s wrapper is being dropped (a hot swap or a discard rebuilt the model): remove
        what a step that never finished its backward left registered on autograd's side, where the
        garbage collector cannot see it, so that the old wrapper, and through it its process groups,
        can be freed.  Nothing of ``keep`` (the model built in its place) is touched.  Returns the
        registrations removed.  Nothing, by default."""
        return 0

    def rebind(self, module: Any, sites: Sequence[RefSite], old_pg: Any, new_pg: Any) -> int:
        """Write ``new_pg`` into every site, then move old_pg's c10d name to new_pg (so name-based
        lookups follow); returns the number of sites written. Raises RebindError (before writing
        anything) if a site is read-only."""
        n = self._write_sites(sites, old_pg, new_pg)
        adopt_group_name(old_pg, new_pg)
        return n

    def _write_sites(self, sites: Sequence[RefSite], old_pg: Any, new_pg: Any) -> int:
        bad = [s.path for s in sites if not s.writable]
        if bad:
            raise RebindError(f"{len(bad)} reference(s) cannot be rewritten in place: {bad[:4]}; "
                              "extend the adapter for this wrapper or drop those holders")
        for s in sites:
            k = s.kind
            if k == ATTR:
                s.owner.__dict__[s.key] = new_pg
            elif k == SLOT:
                object.__setattr__(s.owner, s.key, new_pg)
            elif k == KEY or k == INDEX:
                s.owner[s.key] = new_pg
            elif k != TUPLE_ITEM:
                write_site(s, old_pg, new_pg)
        if any(s.kind == TUPLE_ITEM for s in sites):
            rewrite_tuples(list(sites), old_pg, new_pg)
        return len(sites)

    def verify(self, module: Any, sites: Sequence[RefSite], old_pg: Any, new_pg: Any, stop: Iterable[Any] = ()) -> RebindCheck:
        """The walker must find no reference to ``old_pg`` (reachable from ``module``, not through the
        objects of ``stop``) and every site must hold ``new_pg``."""
        stale_refs = find_references(module, old_pg, stop=stop)
        wrong = [s.path for s in sites if s.kind in (ATTR, SLOT, KEY, INDEX) and read_site(s) is not new_pg]
        paths = [s.path for s in stale_refs] + [p for p in wrong if p not in {s.path for s in stale_refs}]
        detail = "" if not paths else f"still naming the old group: {paths[:6]}" + (" ..." if len(paths) > 6 else "")
        return RebindCheck(ok=not paths, stale=len(paths), total=len(sites), detail=detail)


    def verify_sites(self, sites: Sequence[RefSite], old_pg: Any, new_pg: Any) -> RebindCheck:
        """Phase 5's check, O(sites): every known site holds ``new_pg`` and none ``old_pg``.

        Complete when ``sites`` are every reference to R reachable from the module: the engine
        makes them so by uniting the adapter's discovery with the walker's, at attach and again
        after the first step (:meth:`accelpact.impl.recovery.Pact._discover`)."""
        wrong = []
        for s in sites:
            try:
                held = read_site(s)
            except (RebindError, KeyError, IndexError, AttributeError):
                held = None
            if held is not new_pg:
                wrong.append(s.path)
        detail = "" if not wrong else f"still naming the old group: {wrong[:6]}" + (" ..." if len(wrong) > 6 else "")
        return RebindCheck(ok=not wrong, stale=len(wrong), total=len(sites), detail=detail)


class GenericAdapter(Adapter):
    """Fallback for unknown wrappers: the walker's sites are the rebind list."""


def read_site(site: RefSite) -> Any:
    k = site.kind
    if k == ATTR:
        return site.owner.__dict__.get(site.key)
    if k == SLOT:
        return getattr(site.owner, site.key, None)
    if k in (KEY, INDEX):
        return site.owner[site.key]
    raise RebindError(f"{site.path}: read_site supports attr/slot/key/index sites, not {site.kind}")


def site_set(sites: Iterable[RefSite]) -> set[tuple[int, str, Any]]:
    """Sites by identity (owner, kind, key), for adapter-vs-walker agreement checks."""
    return {(s.owner_id, s.kind, s.key) for s in sites}


# --------------------------------------------------------------------------- c10d registration
def register_group(pg: Any, name: str, global_ranks: Sequence[int], store: Any = None, backend: str = "gloo") -> Any:
    """Register ``pg`` with c10d under ``name`` as a group of ``backend`` (its c10d config, e.g.
    ``cuda:nccl``: :meth:`accelpact.impl.runtime.backends.Backend.register`), so name-based lookups (DeviceMesh,
    ``dist.get_rank(pg)``, ``get_process_group_ranks``) resolve it. Raises ValueError if the name is
    taken by another group."""
    return _backend(backend).register(pg, name, global_ranks, store)


def unregister_group(pg: Any) -> None:
    """Drop ``pg`` from c10d's registries (after every reference was rebound away from it).

    torch 2.13's ``_cleanup_process_group_global_state`` removes a group from its own tag's list but
    not from the default tag's (``tags_to_pg[""]``), where ``new_group`` also put it: the groups built
    at ``accelpact.init`` then outlived every repair (soak K3; spec/torch-facts.md).  So every tag
    list is swept here too."""
    import torch.distributed.distributed_c10d as c10d

    fn = getattr(c10d, "_cleanup_process_group_global_state", None)
    if fn is not None:
        fn(pg)
    tags = c10d._world.tags_to_pg
    for tag in list(tags):
        kept = [g for g in tags[tag] if g is not pg]
        if len(kept) != len(tags[tag]):
            if kept:
                tags[tag] = kept
            else:
                del tags[tag]
    c10d._world.pg_to_tag.pop(pg, None)


def adopt_group_name(old_pg: Any, new_pg: Any, name: str | None = None) -> str | None:
    """Give ``new_pg`` the c10d identity (name, rank mapping) of ``old_pg`` and drop ``old_pg`` from
    c10d's registries; the c10d registry is one more cached reference (DeviceMesh resolves its
    groups by name) and, dropping the old group's entries, c10d no longer keeps it alive.
    ``name``: the name ``old_pg`` had, for an old group already unregistered (an episode that
    rebuilt every group retires the old ones before their references are rebound); None: read it
    from c10d.  No-op when ``old_pg`` has no name or is the default group, or ``new_pg`` is a bare
    backend.  Returns the adopted name."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    w = c10d._world
    name = w.pg_names.get(old_pg) if name is None else name
    if name is None or not isinstance(new_pg, dist.ProcessGroup) or old_pg is new_pg:
        return None
    if name in w.pg_names.values() and w.pg_names.get(new_pg) != name and w.pg_names.get(old_pg) != name:
        return None  # the name belongs to a third group now: taking it would break that group's lookups
    if old_pg is c10d.GroupMember.WORLD:  # never unregister the default group: dist.* would break
        return None
    mapping = w.pg_group_ranks.get(new_pg) or w.pg_group_ranks.get(old_pg) or {}
    ranks = [g for g, _ in sorted(mapping.items(), key=lambda kv: kv[1])]
    store = (w.pg_map.get(new_pg) or w.pg_map.get(old_pg) or (None, None))[1]
    unregister_group(old_pg)
    if new_pg in w.pg_names:
        unregister_group(new_pg)
    new_pg._set_group_name(c10d.GroupName(name))
    register_group(new_pg, name, ranks, store, backend=backend_of(new_pg).name)  # NCCL: "nccl", "cuda:nccl"
    return name


def make_gloo_group(store: Any, prefix: str, global_ranks: Sequence[int], rank: int,
                    timeout: timedelta = timedelta(seconds=60), name: str | None = None) -> Any:
    """A c10d ``ProcessGroup`` over a fresh gloo backend, built by the members only.

    ``prefix`` must be unique per generation (fencing: a late member of an older generation
    cannot join). Registered under ``name`` (default: ``prefix``) so DDP's Reducer and DeviceMesh
    accept it. Collective over ``global_ranks`` only.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import GroupName

    if rank not in global_ranks:
        raise ValueError(f"rank {rank} is not a member of {list(global_ranks)}; only members build the group")
    group_rank, size = list(global_ranks).index(rank), len(global_ranks)
    pstore = dist.PrefixStore(prefix, store)
    backend = dist.ProcessGroupGloo(pstore, group_rank, size, timeout)
    pg = dist.ProcessGroup(pstore, group_rank, size)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    name = name or prefix
    pg._set_group_name(GroupName(name))
    pg._set_group_desc(name)
    return register_group(pg, name, global_ranks, pstore)


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    """(result, seconds) — for the measurements reported by tests and benchmarks."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
