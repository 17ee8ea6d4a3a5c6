"""Generic object-graph walker: find every cached reference to a target object.

The walker is the safety net (``GenericAdapter``) and the verifier of every adapter: after a
rebind it must find no reference to the old process group. It follows ``__dict__``,
``__slots__``, dicts, lists, tuples, sets, deques, bound methods, ``functools.partial``,
function closures, weakrefs and the Python ``__dict__`` of tensors/Parameters (FSDP2 DTensor
specs live there), but never tensor data, classes, modules or function globals. Cycles are
handled by identity.
"""
from __future__ import annotations

import collections
import functools
import logging
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

# Site kinds and how each is written (see ``write_site``).
ATTR, SLOT, KEY, INDEX, CELL, SET, PARTIAL_ARG, TUPLE_ITEM, WEAKREF, METHOD_SELF, READONLY = (
    "attr", "slot", "key", "index", "cell", "set", "partial_arg", "tuple_item", "weakref", "method_self", "readonly",
)
WRITABLE = frozenset({ATTR, SLOT, KEY, INDEX, CELL, SET, PARTIAL_ARG, TUPLE_ITEM})

_ATOMIC = (str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview)
_SKIP = (type, types.ModuleType, types.BuiltinFunctionType, types.CodeType,
         types.FrameType, logging.Logger, logging.Manager, threading.Thread)
_LAYOUT_DICTS = ("_modules", "_parameters", "_buffers")


class RebindError(RuntimeError):
    """A reference site cannot be written (weakref, bound-method self, unknown container)."""


@dataclass(frozen=True)
class RefSite:
    """One cached reference: ``owner`` holds the target under ``key`` written as ``kind``.

    Identity (eq/hash) is (id(owner), kind, key); ``path`` is the readable route from the root.
    ``parent`` is the site holding ``owner`` when ``owner`` is immutable (a tuple): rebinding
    rebuilds the tuple and writes it there.
    """

    owner_id: int
    kind: str
    key: Any
    owner: Any = field(compare=False, hash=False, repr=False)
    path: str = field(compare=False, hash=False)
    parent: "RefSite | None" = field(default=None, compare=False, hash=False, repr=False)

    @property
    def writable(self) -> bool:
        return self.kind in WRITABLE and (self.kind != TUPLE_ITEM or (self.parent is not None and self.parent.writable))


def _is_tensor(obj: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


@functools.lru_cache(maxsize=1)
def _torch():
    try:
        import torch
        return torch
    except ImportError:  # the walker itself works on plain Python graphs
        return None


def _slot_names(cls: type) -> Iterator[str]:
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"  # name mangling
            yield name


_MISSING = object()


def _children(obj: Any, path: str, layout: bool) -> Iterator[tuple[Any, str, Any, str, bool]]:
    """Yield (child, kind, key, child_path, child_is_layout_dict)."""
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            yield v, KEY, k, (f"{path}.{k}" if layout else f"{path}[{k!r}]"), False
        return
    if isinstance(obj, (list, collections.deque)):
        for i, v in enumerate(list(obj)):
            yield v, INDEX, i, f"{path}[{i}]", False
        return
    if isinstance(obj, tuple):
        for i, v in enumerate(obj):
            yield v, TUPLE_ITEM, i, f"{path}[{i}]", False
        return
    if isinstance(obj, (set, frozenset)):
        kind = SET if isinstance(obj, set) else READONLY
        for v in list(obj):
            yield v, kind, id(v), f"{path}{{{type(v).__name__}@{id(v):x}}}", False
        return
    if isinstance(obj, types.MethodType):
        yield obj.__self__, METHOD_SELF, "__self__", f"{path}.__self__", False
        return
    if isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:  # empty cell
                continue
            name = obj.__code__.co_freevars[i]
            yield v, CELL, name, f"{path}.<closure {name}>", False
        return
    if isinstance(obj, functools.partial):
        yield obj.func, READONLY, "func", f"{path}.func", False
        for i, v in enumerate(obj.args):
            yield v, PARTIAL_ARG, i, f"{path}.args[{i}]", False
        for k, v in (obj.keywords or {}).items():
            yield v, KEY, k, f"{path}.keywords[{k!r}]", False
        # fall through to __dict__ (partials may carry attributes)
    if isinstance(obj, weakref.ref) and not isinstance(obj, weakref.ProxyType):
        v = obj()
        if v is not None:
            yield v, WEAKREF, "()", f"{path}()", False
        return
    d = getattr(obj, "__dict__", None) if not isinstance(obj, _SKIP) else None
    if isinstance(d, dict):
        is_module = _is_nn_module(obj)
        for k, v in list(d.items()):
            yield v, ATTR, k, f"{path}.{k}" if not (is_module and k in _LAYOUT_DICTS) else path, is_module and k in _LAYOUT_DICTS
    if not _is_tensor(obj):
        for name in _slot_names(type(obj)):
            v = getattr(obj, name, _MISSING)
            if v is not _MISSING:
                yield v, SLOT, name, f"{path}.{name}", False


def _is_nn_module(obj: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.nn.Module)


def walk(root: Any, match, root_name: str = "model", stop: Iterable[Any] = ()) -> list[RefSite]:
    """Breadth-first walk from ``root``; return a site for every edge whose child satisfies ``match``.

    Matched children are not descended into (a process group's internals are not ours), nor are
    the objects in ``stop`` (by identity: the recovery engine's own objects, which the guard's hooks
    make reachable from the module; the engine moves its own references itself).  Breadth-first
    gives the shortest readable path to each owner.
    """
    seen: dict[int, Any] = {id(root): root}  # keeps visited objects alive so ids stay unique
    for o in stop:
        seen[id(o)] = o
    sites: list[RefSite] = []
    site_of_owner: dict[int, RefSite] = {}  # site through which an (immutable) owner was reached
    queue: collections.deque = collections.deque([(root, root_name, False)])
    while queue:
        obj, path, layout = queue.popleft()
        for child, kind, key, cpath, clayout in _children(obj, path, layout):
            if isinstance(child, _ATOMIC):
                continue
            if match(child):
                parent = site_of_owner.get(id(obj)) if kind == TUPLE_ITEM else None
                sites.append(RefSite(id(obj), kind, key, obj, cpath, parent))
                continue
            if id(child) in seen or isinstance(child, _SKIP):
                continue
            seen[id(child)] = child
            if isinstance(child, tuple):
                site_of_owner[id(child)] = RefSite(id(obj), kind, key, obj, cpath,
                                                    site_of_owner.get(id(obj)) if kind == TUPLE_ITEM else None)
            queue.append((child, cpath, clayout))
    return sites


def find_references(root: Any, target: Any, root_name: str = "model", stop: Iterable[Any] = ()) -> list[RefSite]:
    """Every site reachable from ``root`` (not through ``stop``) that holds ``target`` (by identity)."""
    return walk(root, lambda o: o is target, root_name, stop)


def write_site(site: RefSite, old: Any, new: Any) -> None:
    """Write ``new`` where ``site`` holds ``old``. Raises RebindError for read-only sites."""
    kind, owner, key = site.kind, site.owner, site.key
    if kind == ATTR:
        owner.__dict__[key] = new  # 3x faster than nn.Module.__setattr__ (spec/torch-facts.md)
    elif kind == SLOT:
        object.__setattr__(owner, key, new)
    elif kind in (KEY, INDEX):
        owner[key] = new
    elif kind == CELL:
        owner.__closure__[owner.__code__.co_freevars.index(key)].cell_contents = new
    elif kind == SET:
        owner.discard(old)
        owner.add(new)
    elif kind == PARTIAL_ARG:
        args = list(owner.args)
        args[key] = new
        owner.__setstate__((owner.func, tuple(args), owner.keywords, owner.__dict__ or None))
    elif kind == TUPLE_ITEM:
        if site.parent is None or not site.parent.writable:
            raise RebindError(f"{site.path}: reference sits in a tuple reachable only read-only; rebuild its holder instead")
        items = list(owner)
        items[key] = new
        write_site(site.parent, owner, type(owner)(items) if type(owner) is tuple else type(owner)(*items))
    else:
        raise RebindError(
            f"{site.path}: a {kind} reference cannot be rewritten in place; drop or replace its holder "
            "(an adapter must own this reference)"
        )


def rewrite_tuples(sites: "list[RefSite]", old: Any, new: Any) -> int:
    """Rebind every TUPLE_ITEM site at once: each affected tuple (and each tuple holding one) is
    rebuilt exactly once and written to its mutable holder once. Writing sites one by one would
    let a later site rebuild from the stale tuple and undo an earlier one."""
    affected: dict[int, tuple[Any, "RefSite | None"]] = {}
    n = 0
    for s in sites:
        if s.kind != TUPLE_ITEM:
            continue
        if not s.writable:
            raise RebindError(f"{s.path}: reference sits in a tuple reachable only read-only; rebuild its holder instead")
        n += 1
        owner, parent = s.owner, s.parent
        while True:
            affected[id(owner)] = (owner, parent)
            if parent is None or parent.kind != TUPLE_ITEM:
                break
            owner, parent = parent.owner, parent.parent
    memo: dict[int, Any] = {}

    def rebuild(t: tuple) -> tuple:
        if id(t) not in memo:
            items = [new if x is old else (rebuild(x) if isinstance(x, tuple) and id(x) in affected else x) for x in t]
            memo[id(t)] = tuple(items) if type(t) is tuple else type(t)(*items)
        return memo[id(t)]

    for t, parent in list(affected.values()):
        if parent is not None and parent.kind != TUPLE_ITEM:
            write_site(parent, t, rebuild(t))
    return n
