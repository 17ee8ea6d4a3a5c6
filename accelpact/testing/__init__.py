"""Multi-process test harness: run N ranks of a function on loopback gloo, bounded and reaped.

For the engine's own tests and for users testing their job, adapter or wrapper against real
process groups::

    from accelpact import testing

    def body(ctx: testing.Ctx, steps: int) -> float:      # module level: the child imports it
        ...                                               # ctx.rank, ctx.world, ctx.store, ctx.out
        return loss

    run = testing.run_ranks(body, 4, tmp_path, init_group=True, steps=3)
    assert run.codes == {0: 0, 1: 0, 2: 0, 3: 0}, run.explain()
    losses = run.values()                                 # per-rank return values (raises on failure)

How a launch runs:

* The calling process hosts the TCPStore on a free loopback port (as torchrun's agent does), so a
  rank's death never takes the store down; each rank joins it as a client (``ctx.store``).
* Each rank is a fresh ``python`` child (never a fork of the test process) started, waited on and
  reaped by :class:`accelpact.impl.launch.launch.ProcessSet`, the launcher's own core: one deadline for
  all, every child SIGKILLed and reaped when it passes or when the launch is left by an exception.
* ``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)`` in every rank.
* ``init_group=True`` initialises the default gloo group first (``ctx.group``, its sockets recorded
  in ``ctx.group_record``); False leaves the rank to build its own groups.
* The function's return value is saved per rank; an exception is saved as its traceback (the rank
  exits :data:`CRASHED`); ``SystemExit(n)`` exits ``n``.  Every rank ends with ``os._exit`` (gloo
  teardown after a failed group can abort the interpreter and turn the exit code into -6).
* The function is found in the child by module name, or, for a module that is not importable by
  name (a test module under pytest's ``--import-mode=importlib``), by its file path, registered
  under the same name so its classes unpickle; no ``sys.path`` edit.

:func:`start_ranks` returns the launch in progress (:class:`Ranks`, a context manager), so a test
can act on the store while the ranks run (wait for a key the ranks set, then write one), instead
of sleeping.  :func:`break_group` breaks a group for real from inside the ranks.

torch is imported lazily: importing this module does not need it.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import json
import os
import pickle
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from accelpact.impl.launch.launch import ProcessSet, worker_env
from accelpact.impl.launch.snapshots import compare_snapshots
from accelpact.impl.rundir import RunDir
from accelpact.impl.runtime import revoke
from accelpact.impl.runtime.adapters import GenericAdapter, adapter_for, find_references, make_gloo_group, site_set
from accelpact.impl.runtime.digest import state_digest

#: the workload's module, loaded on first use by :func:`rebind_scenario`: it imports torch, which
#: importing this package must not
WORKLOAD_MODULE = "accelpact.impl.launch.workload"

__all__ = ["CRASHED", "FAILURE_MARKERS", "HOST", "Ctx", "Harness", "Ranks", "Run", "break_group", "check_rebind_results",
           "client_store", "gloo_threads", "host_store", "rebind_scenario", "run_ranks", "start_ranks"]

HOST = "127.0.0.1"
#: exit code of a rank whose function raised (its traceback is in :attr:`Run.errors`)
CRASHED = 3
#: the harness's own files, inside the run folder (never a name :class:`RunDir` uses)
_HARNESS = ".ranks"


def host_store(timeout_s: float = 60.0):
    """A master TCPStore on a free loopback port, hosted by this process."""
    import torch.distributed as dist

    return dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def client_store(port: int, timeout_s: float = 60.0):
    """A client connection to the loopback store on ``port``."""
    import torch.distributed as dist

    return dist.TCPStore(HOST, port, None, False, timeout=datetime.timedelta(seconds=timeout_s))


@dataclass
class Ctx:
    """What a rank's function gets: its rank, the world size, the store (a client connection to
    the launcher's store on ``port``), the run folder ``out``; with ``init_group``, the default
    group and the record of its sockets (:func:`accelpact.impl.runtime.revoke.recorded`)."""

    rank: int
    world: int
    port: int
    out: Path
    store: Any = None
    group: Any = None
    group_record: Any = None

    def client_store(self, timeout_s: float = 60.0):
        """Another connection to the launcher's store."""
        return client_store(self.port, timeout_s)


# ------------------------------------------------------------------------------------------ results

@dataclass
class Run:
    """A finished launch: exit code per rank, what each returned or raised, and its traces."""

    codes: dict[int, int | None]
    out: Path
    wall_s: float
    hung: list[int] = field(default_factory=list)
    returns: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every rank exited 0 on its own."""
        return not self.hung and all(c == 0 for c in self.codes.values())

    def trace(self, rank: int, attempt: int = 0) -> list[dict]:
        """Records of the rank's trace file (``trace-a{attempt}-r{rank}.ndjson``), [] if none."""
        return RunDir(self.out).records(attempt, rank)

    def actions(self, rank: int, attempt: int = 0) -> list[str]:
        """The rank's model actions, in trace order."""
        return [r["action"] for r in self.trace(rank, attempt) if r.get("type") == "action"]

    def result(self, rank: int) -> Any:
        """What ``rank``'s function returned (None if it did not return)."""
        return self.returns.get(rank)

    def values(self) -> list[Any]:
        """Every rank's return value in rank order; AssertionError (with :meth:`explain`) unless
        every rank returned and exited 0."""
        if not self.ok or len(self.returns) != len(self.codes):
            raise AssertionError(self.explain())
        return [self.returns[r] for r in sorted(self.codes)]

    def explain(self, last: int = 5) -> str:
        """Exit codes, hung ranks, tracebacks and each rank's last trace records (action, outcome,
        detail): the message of a failed assertion on a run, so that a failure seen once in CI
        can be diagnosed."""
        lines = [f"exit codes {self.codes}; hung past the timeout (killed): {self.hung}; wall {self.wall_s:.1f} s"]
        for r, tb in sorted(self.errors.items()):
            lines.append(f"rank {r} raised:\n{tb.rstrip()}")
        lines.append("last records per rank:")
        for r in sorted(self.codes):
            recs = [x for x in self.trace(r) if x.get("type") in ("action", "note", "end")]
            t0 = recs[0]["t_ns"] if recs and "t_ns" in recs[0] else 0
            for x in recs[-last:]:
                what = x.get("action") or (f"note:{x['note']}" if x.get("type") == "note" else f"end:{x.get('outcome')}")
                rest = x.get("detail") or {k: v for k, v in x.items() if k not in ("type", "rank", "t_ns", "note", "outcome")}
                lines.append(f"  r{r} +{(x.get('t_ns', t0) - t0) / 1e9:7.3f}s {what} {x.get('outcome', '')} "
                             f"{json.dumps(rest, default=str)[:240]}")
        return "\n".join(lines)


class Ranks:
    """A launch in progress (from :func:`start_ranks`).  ``store`` is the hosted master store (a
    client of itself: the test can wait on and write keys while the ranks run).  Leaving the
    ``with`` block kills and reaps every rank that is still running."""

    def __init__(self, procs: ProcessSet, store: Any, out: Path, world: int, timeout_s: float) -> None:
        self.procs = procs
        self.store = store
        self.port = store.port
        self.out = out
        self.world = world
        self.timeout_s = timeout_s
        self._run: Run | None = None

    def wait_keys(self, keys: Iterable[str], timeout_s: float = 60.0) -> None:
        """Block until every key in ``keys`` is set in the store (bounded: DistStoreError after
        ``timeout_s``)."""
        self.store.wait(list(keys), datetime.timedelta(seconds=timeout_s))

    def wait(self, timeout_s: float | None = None) -> Run:
        """Wait for every rank until the launch's bound (``timeout_s`` seconds after the start;
        default the launch's), then kill the rest; the :class:`Run`."""
        if self._run is not None:
            return self._run
        timed_out = self.procs.wait(self.timeout_s if timeout_s is None else timeout_s)
        hung = [r for r in self.procs.running()] if timed_out else []
        self.procs.kill()
        codes = dict(enumerate(self.procs.codes))
        wall = self.procs.elapsed_s
        self._run = Run(codes, self.out, wall, hung, *_collect(self.out, self.world))
        return self._run

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.procs.kill()


def _collect(out: Path, world: int) -> tuple[dict[int, Any], dict[int, str]]:
    returns: dict[int, Any] = {}
    errors: dict[int, str] = {}
    base = out / _HARNESS
    for r in range(world):
        e = base / f"error-r{r}.txt"
        if e.exists():
            errors[r] = e.read_text(errors="replace")
        p = base / f"return-r{r}.pt"
        if p.exists():
            import torch

            returns[r] = torch.load(p, weights_only=False)
    return returns, errors


# ------------------------------------------------------------------------------------------- launch

def start_ranks(fn: Callable[..., Any], world: int, out: str | os.PathLike, *, init_group: bool = False,
                timeout_s: float = 90.0, env: Mapping[str, Any] | None = None, store: Any = None,
                pg_timeout_s: float = 60.0, **kwargs: Any) -> Ranks:
    """Start ``fn(ctx, **kwargs)`` on ranks ``0..world-1`` (see the module doc); returns at once.

    ``fn``: a module-level function.  ``kwargs``: picklable.  ``store``: a master store to host
    (default: a fresh one).  ``env``: extra environment variables of the ranks.  ``timeout_s``:
    the launch's bound, counted from now.  ``pg_timeout_s``: the default group's timeout."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    module = sys.modules.get(fn.__module__)
    if fn.__module__ == "__main__" or module is None or "<locals>" in fn.__qualname__:
        raise ValueError(f"{fn.__module__}.{fn.__qualname__}: a rank function must be defined at module level of an "
                         "importable module or file (not __main__, not nested)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = out / _HARNESS
    shutil.rmtree(base, ignore_errors=True)  # an earlier launch's returns must not be read as this one's
    base.mkdir()
    store = store if store is not None else host_store()
    spec = {"module": fn.__module__, "qualname": fn.__qualname__, "file": getattr(module, "__file__", None),
            "world": world, "port": store.port, "out": str(out), "init_group": init_group,
            "pg_timeout_s": pg_timeout_s, "kwargs": pickle.dumps(kwargs)}
    spec_path = base / "spec.pkl"
    spec_path.write_bytes(pickle.dumps(spec))
    procs = ProcessSet()
    try:
        for r in range(world):
            procs.start([sys.executable, "-c", "from accelpact.testing import _child_main; _child_main()",
                         str(spec_path), str(r)], env=worker_env(env))
    except BaseException:
        procs.kill()
        raise
    return Ranks(procs, store, out, world, timeout_s)


def run_ranks(fn: Callable[..., Any], world: int, out: str | os.PathLike, **options: Any) -> Run:
    """:func:`start_ranks`, then wait for every rank: the :class:`Run` (never raises on a failed
    rank: assert on ``run.codes``/``run.values()`` with ``run.explain()``)."""
    with start_ranks(fn, world, out, **options) as ranks:
        return ranks.wait()


def gloo_threads(world: int, fn: Callable[[int, Any], Any], join_s: float = 60.0) -> dict[int, Any]:
    """Run ``fn(rank, pg)`` on ``world`` gloo ranks of one process (threads over one ``HashStore``,
    each its own ``ProcessGroupGloo``): their results by rank.  For unit tests of one collective
    helper; the first error a rank raised is raised here, and a rank still running after ``join_s``
    is an ``AssertionError``."""
    import datetime
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    out: dict[int, Any] = {}
    errs: list[BaseException] = []
    # every rank's group lives until every rank is done: a rank whose fn returned first would otherwise
    # close its connections while a peer still reads what it sent (a point-to-point send completes once
    # written, not once received): "Connection reset by peer" on the peer's receive
    pgs: dict[int, Any] = {}

    def run(r: int) -> None:
        try:
            pg = pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore("threads/", store), r, world, datetime.timedelta(seconds=20))
            out[r] = fn(r, pg)
        except BaseException as e:  # noqa: BLE001 - reraised below, in the caller's thread
            errs.append(e)

    ths = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(join_s)
    if errs:
        raise errs[0]
    assert len(out) == world, f"only ranks {sorted(out)} of {world} finished within {join_s:.0f} s"
    return out


class Harness:
    """The ``ranks`` pytest fixture: :func:`run_ranks`/:func:`start_ranks` in the test's folder."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.out = Path(out)

    def run(self, fn: Callable[..., Any], world: int, **options: Any) -> Run:
        return run_ranks(fn, world, self.out, **options)

    def start(self, fn: Callable[..., Any], world: int, **options: Any) -> Ranks:
        return start_ranks(fn, world, self.out, **options)


# --------------------------------------------------------------------------------------------- child

def _import_module(name: str, file: str | None):
    """The module ``name``: imported by name when that finds ``file`` (or no file is known),
    else loaded from ``file`` and registered as ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if file is None or (spec is not None and spec.origin and os.path.exists(spec.origin)
                        and os.path.samefile(spec.origin, file)):
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {file}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def _child_main() -> None:
    """A rank: ``python -c '...; _child_main()' SPEC RANK`` (started by :func:`start_ranks`)."""
    spec_path, rank = Path(sys.argv[1]), int(sys.argv[2])
    base = spec_path.parent
    code = 0
    try:
        spec = pickle.loads(spec_path.read_bytes())
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        world, out = spec["world"], Path(spec["out"])
        # torchrun's variables, so a rank function can build its job with ``accelpact.init`` (one node)
        for k, v in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", rank), ("LOCAL_WORLD_SIZE", world),
                     ("MASTER_ADDR", HOST), ("MASTER_PORT", spec["port"])):
            os.environ.setdefault(k, str(v))
        store = client_store(spec["port"])
        ctx = Ctx(rank, world, spec["port"], out, store)
        if spec["init_group"]:
            timeout = datetime.timedelta(seconds=spec["pg_timeout_s"])

            def init():
                dist.init_process_group("gloo", store=dist.PrefixStore("default/", store), rank=rank, world_size=world,
                                        timeout=timeout)
                return dist.distributed_c10d._get_default_group()

            ctx.group, ctx.group_record = revoke.recorded(init)
        fn: Any = _import_module(spec["module"], spec["file"])
        for part in spec["qualname"].split("."):
            fn = getattr(fn, part)
        kwargs = pickle.loads(spec["kwargs"])
        value = fn(ctx, **kwargs)
        tmp = base / f".return-r{rank}.pt.tmp"
        torch.save(value, tmp)
        os.replace(tmp, base / f"return-r{rank}.pt")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - any failure of the rank is reported (traceback) and ends it CRASHED
        tb = traceback.format_exc()
        try:
            (base / f"error-r{rank}.txt").write_text(tb)
        except OSError:
            pass
        print(f"rank {rank}:\n{tb}", file=sys.stderr)
        code = CRASHED
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ------------------------------------------------------------------------------------ breaking groups

def break_group(ctx: Ctx, group: Any, members: Iterable[int], *, skippers: Iterable[int] = (), record: Any = None,
                timeout_s: float = 1.5) -> str:
    """Break ``group`` for real, from outside any collective on it; returns this rank's error text
    from its failed operation on ``group`` ('' if none failed, or not a member).

    A collective over the default group (``init_group=True``): every rank calls it.

    * ``record`` (this rank's :class:`~accelpact.impl.runtime.revoke.SocketRecord` of ``group``): every
      member shuts the group's connected sockets down (:func:`accelpact.impl.runtime.revoke.hard_close`,
      how a revoke or a ``collective_timeout`` fault breaks a group), then tries an all-reduce on it.
    * otherwise ``skippers`` skip an all-reduce on ``group`` so that the other members' short gloo
      timeout (``timeout_s``) fires; after a default-group barrier the skippers' next operation
      fails too (the peers closed their pairs).
    """
    import torch
    import torch.distributed as dist

    members, skippers = set(members), set(skippers)
    member = ctx.rank in members
    err = ""
    if member:
        group._get_backend(torch.device("cpu")).set_timeout(datetime.timedelta(seconds=timeout_s))
    if record is not None:
        if member:
            revoke.hard_close(record)
        dist.barrier()
        if member:
            err = _probe(group) or err
        dist.barrier()
        return err
    if member and ctx.rank not in skippers:
        err = _probe(group) or err
    dist.barrier()
    if member and ctx.rank in skippers:
        err = _probe(group) or err
    dist.barrier()
    return err


def _probe(group: Any) -> str:
    """One all-reduce on ``group``: its error text, or '' when it succeeded."""
    import torch
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(1), group=group)
    except RuntimeError as e:
        return str(e)
    return ""


# ------------------------------------------------------------------------------ adapter rebind check

#: error texts of an operation on a group that failed for real (gloo)
FAILURE_MARKERS = ("pair closure", "Connection closed", "Timed out", "timed out", "Connection reset")


def rebind_scenario(ctx: Ctx, wrapper: str, nodes: int = 2, ranks_per_node: int = 2, layers: int = 4,
                    pre_steps: int = 2, post_steps: int = 2, ablation: bool | str = True,
                    regen: bool = False) -> dict:
    """A rank function (``init_group=True``, world = nodes x ranks_per_node) checking a wrapper's
    adapter (:func:`accelpact.impl.runtime.adapters.adapter_for`) against a REAL failure of its group R:
    an uninterrupted run of the workload, then a run whose R breaks after ``pre_steps`` committed
    steps, a new group, the adapter's rebind, and ``post_steps`` more steps.

    Returns the adapter's and the reference walker's sites, the verification, the snapshot
    comparison with the uninterrupted run, digests and (``ablation``) the error raised when a second
    failure is NOT followed by a rebind (``ablation="python-only"``: followed by a rebind of the
    Python-visible references only); ``regen``: before that, a second failure and a rebind of the
    same sites to a generation-2 group.  Check the results with :func:`check_rebind_results`.
    """
    import torch
    import torch.distributed as dist

    W: Any = importlib.import_module(WORKLOAD_MODULE)
    topo = W.Topology(nodes, ranks_per_node)
    # The python-only ablation needs DDP's own bucketed all-reduce through the C++ Reducer
    # (the per-gradient hook reads ddp.process_group, which a Python-level rebind does fix).
    spec = W.WorkloadSpec(wrapper=wrapper, layers=layers, ddp_per_gradient=ablation != "python-only")
    total = pre_steps + post_steps
    res: dict = {"rank": ctx.rank}
    timeout = datetime.timedelta(seconds=60)

    # uninterrupted reference run
    gb = W.build_groups(topo, ctx.rank)
    jb = W.build_job(spec, topo, gb)
    for s in range(total):
        W.train_step(jb, s)
    snap_clean = W.snapshot(jb)

    # run with a failure of R after step pre_steps-1 committed
    ga = W.build_groups(topo, ctx.rank)
    ja = W.build_job(spec, topo, ga)
    for s in range(pre_steps):
        W.train_step(ja, s)
    R, members = W.r_group(spec, ga), W.r_ranks(spec, ga)
    adapter = adapter_for(ja.module)
    res["adapter"] = adapter.name
    sites = adapter.discover(ja.module, R)
    walked = find_references(ja.module, R)
    res["r_sites"] = [s.path for s in sites]
    res["r_walker"] = [s.path for s in walked]
    res["r_agree"] = site_set(sites) == site_set(walked)
    shard_sites = adapter.discover(ja.module, ga.shard)
    shard_walked = find_references(ja.module, ga.shard)
    res["shard_sites"] = len(shard_sites)
    res["shard_walker"] = len(shard_walked)
    res["shard_agree"] = site_set(shard_sites) == site_set(shard_walked)
    skippers = {r for r in members if topo.node_of(r) == 0} if wrapper != "ddp" else {0}
    res["fail_error"] = break_group(ctx, R, members, skippers=skippers)
    local = topo.local_of(ctx.rank) if wrapper != "ddp" else 0
    new_R = make_gloo_group(ctx.store, f"gen1/{wrapper}/R{local}/", members, ctx.rank, timeout, name=f"gen1-R{local}")
    res["rebound"] = adapter.rebind(ja.module, sites, R, new_R)
    check = adapter.verify(ja.module, sites, R, new_R)
    res["check"] = (check.ok, check.stale, check.total, check.detail)
    res["mesh_resolves_new"] = ga.mesh.get_group("replicate") is new_R if wrapper == "fsdp2-hybrid" else None
    res["c10d_rank_of_new"] = dist.get_rank(new_R)
    for s in range(pre_steps, total):
        W.train_step(ja, s)
    res["equal"] = compare_snapshots(W.snapshot(ja), snap_clean)
    res["digest"] = state_digest(ja.module, ja.optimizer)
    first = next(ja.module.parameters())
    p0 = first.to_local() if hasattr(first, "to_local") else first
    keep = p0.detach().clone()
    with torch.no_grad():
        p0.view(-1)[0] += 1.0
    res["digest_perturbed"] = state_digest(ja.module, ja.optimizer)
    with torch.no_grad():
        p0.copy_(keep)
    res["digest_restored"] = state_digest(ja.module, ja.optimizer)

    cur, step = new_R, total
    if regen:  # generation 2: another real failure, the SAME sites rebound again (discover once, rebind many)
        res["fail_error_regen"] = break_group(ctx, cur, members, skippers=skippers)
        gen2 = make_gloo_group(ctx.store, f"gen2/{wrapper}/R{local}/", members, ctx.rank, timeout, name=f"gen2-R{local}")
        adapter.rebind(ja.module, sites, cur, gen2)
        check2 = adapter.verify(ja.module, sites, cur, gen2)
        res["check_regen"] = (check2.ok, check2.stale, check2.total, check2.detail)
        W.train_step(ja, step)
        W.train_step(jb, step)
        res["equal_regen"] = compare_snapshots(W.snapshot(ja), W.snapshot(jb))
        if wrapper == "fsdp2-hybrid":
            res["mesh_resolves_new"] = res["mesh_resolves_new"] and ga.mesh.get_group("replicate") is gen2
        cur, step = gen2, step + 1
    if ablation:  # another real failure of R, replacement built, rebind SKIPPED
        res["fail_error2"] = break_group(ctx, cur, members, skippers=skippers)
        newer = make_gloo_group(ctx.store, f"gen9/{wrapper}/R{local}/", members, ctx.rank, timeout, name=f"gen9-R{local}")
        if ablation == "python-only":  # rewrite only what a Python walk sees (DDP: not the C++ Reducer)
            res["python_only_rebound"] = GenericAdapter().rebind(ja.module, find_references(ja.module, cur), cur, newer)
        try:
            W.train_step(ja, step)
            res["ablation_error"] = ""
        except RuntimeError as e:
            res["ablation_error"] = str(e)[:300]
    return res


def check_rebind_results(res: list[dict], wrapper: str, nodes: int, ranks_per_node: int) -> None:
    """Assert what :func:`rebind_scenario` must show (S5 RebindComplete, S6 StatePreserved,
    RankValidate): adapter and walker agree, R failed for real, the rebind verifies, the
    continuation equals the uninterrupted run, digests are equal across replicas and sensitive to a
    perturbation, a skipped rebind fails the next step."""
    world = nodes * ranks_per_node
    assert len(res) == world
    for r in res:
        rk = r["rank"]
        assert r["r_agree"], f"rank {rk}: adapter sites {r['r_sites']} != walker sites {r['r_walker']}"
        assert r["shard_agree"], f"rank {rk}: adapter and walker disagree on the shard group"
        assert any(m in r["fail_error"] for m in FAILURE_MARKERS), f"rank {rk}: R did not fail for real: {r['fail_error']!r}"
        ok, stale, total, detail = r["check"]
        assert ok and stale == 0 and total == len(r["r_sites"]), f"rank {rk}: verify failed: {detail}"
        assert r["rebound"] == total
        eq, why = r["equal"]
        assert eq, f"rank {rk}: continuation after rebind differs from the uninterrupted run: {why}"
        assert r["digest_perturbed"] != r["digest"] and r["digest_restored"] == r["digest"]
        assert len(r["digest"]) == 32
        if "check_regen" in r:
            assert r["check_regen"][0], f"rank {rk}: generation-2 rebind left stale references: {r['check_regen'][3]}"
            assert r["equal_regen"][0], f"rank {rk}: after the generation-2 rebind: {r['equal_regen'][1]}"
        if "ablation_error" in r:
            assert any(m in r["ablation_error"] for m in FAILURE_MARKERS), \
                f"rank {rk}: training on with stale references did not raise: {r['ablation_error']!r}"
    # replicas of R hold identical shards (digest equal); different shards differ
    key = (lambda rk: 0) if wrapper == "ddp" else (lambda rk: rk % ranks_per_node)
    by_class: dict[int, set] = {}
    for r in res:
        by_class.setdefault(key(r["rank"]), set()).add(r["digest"])
    assert all(len(d) == 1 for d in by_class.values()), f"replica digests differ: {by_class}"
    if wrapper != "ddp" and ranks_per_node > 1:
        assert len({next(iter(d)) for d in by_class.values()}) == ranks_per_node
