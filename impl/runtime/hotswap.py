"""Hot swap: a dead rank's identity taken by a spare, its state from a live replica, the
uncommitted step discarded and rerun.  spec/protocol.md section 11 (the model's actions), spec/hotswap.md
(this implementation).

Who does what (read beside ``model/protocol.py``'s hot-swap actions):

* The **keeper** (:mod:`accelpact.impl.launch.keeper`, the process the launcher sees in place of a
  training rank) is the failure detector of a crash: it sees its worker die (``waitpid``), posts a
  *death notice* on the store (:func:`accelpact.impl.launch.keeper.post_death`) and keeps the launcher from
  taking one rank's death for the job's.
* Every survivor's :class:`SwapWatcher` wakes on a notice and shuts down the sockets of every group
  of its rank (the revoke of every communicator at once), so no survivor stays blocked on a live
  peer that has left the step.  The engine's step and boundary then meet a failed collective and,
  seeing the notice (:meth:`Notices.wait_new`), observe it (model ``RankObserve``) and run the
  swap instead of taking the L2 path.
* The engine runs the episode on a survivor (``SWAP`` of :mod:`accelpact.impl.episode`) or a spare
  (``SPARE_SWAP``), in the model's order: the decision (:func:`accelpact.model.hotswap.decide`, the contract extended with the facts),
  ``RankClaimSpare`` (single assignment ``g{g}/spare/{dead}``; the pool is ``swap/next``),
  ``SpareJoin``, ``RankDiscardStep``, the agreement on (F, g) over all of W (the spare arrives under
  the dead identity with the F its predecessor published at its last commit), every group rebuilt in
  generation g+1 (default group, control, checkpoint, shard, replicate, world; ``RankReplace``), the
  model rebuilt on them by the user's ``rebuild`` factory, ``RankTransferState`` (a live replica
  sends its shard and optimizer state point to point to the spares of its new group of R's kind), ``RankValidate`` (the
  replicas' state checksums on every new group of R's kind), the release (``RankReady``,
  ``RankDecideRelease``) and ``RankResume`` in g+1 with a fresh engine.
* The discard is a *rebuild*: the survivors' committed state (parameters and optimizer state, which
  a step in forward or backward has not touched) is moved into a freshly built wrapper, which is idle
  by construction; gradients and the wrapper's runtime state of the step (FSDP's handles and hooks
  mid-backward, DDP's reducer) go with the old one.  RNG and data cursor come back to F from the
  state published at F.  Rebinding cached references, as an L1 repair does, cannot return a wrapper
  interrupted mid-backward to idle on every wrapper; building a new one can, and the spare needs
  exactly that code path anyway.
* Memory (issue 43): an episode holds the state once.  Before the new wrapper is built the old one
  sheds what is not committed state (``Adapter.shed``: gradients, FSDP's unsharded parameters); the
  new optimizer adopts the old one's state tensors (:func:`import_state` ``adopt``); a spare receives
  into its own parameters and adopts the received optimizer state (:func:`receive_slots`); only the
  spares receive (:func:`transfer`, point to point).  The one extra copy is the parameters' shards,
  from the rebuild until the old wrapper is dropped.

Store keys (under the attempt's namespace): ``accelpact/swap/deaths`` and ``accelpact/swap/death/{n}``
(the keeper's notices), ``accelpact/swap/next`` (spares taken), ``accelpact/g{g}/spare/{dead}``
(the claim: a spare's index, or ``none``), ``accelpact/swap/taken/{k}`` (the claim that took spare k),
``accelpact/swap/spare-node/{k}`` (a refilled spare's node), ``accelpact/swap/assign/{k}`` (``{dead}:{g}``, what
spare k waits for), ``accelpact/swap/state/r{rank}`` (F, RNG and extra state at the rank's last commit).

Spares per node (issue 43; spec/hotswap.md, "Spares per node"): :class:`SpareLayout` says which of the
launcher's processes are spares (the last ``K`` of each node) and which identity each training process
takes (``node * training_per_node + local``), so that replicas and shard groups keep their node
boundaries; a claim takes an idle spare of the dead identity's node first (:func:`claim_order`).
"""

from __future__ import annotations

import datetime
import io
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..controlplane import (DEATHS_KEY, NEXT_KEY, REFILLS_KEY, assign_key, claim_key, claimers_key, death_key, depose_key,
                            parse_assignment, spare_gone_key, spare_node_key, state_key, taken_key)
from ..threadname import EngineThread
from . import revoke
from . import rng as _rng
from .backends import backend_of, wait_bounded
from .digest import checksum_hex, state_checksum

__all__ = ["LAUNCHER_RANK_ENV", "LayoutError", "Notices", "SPARES_PER_NODE_ENV", "SpareLayout", "SwapError", "SwapNeeded",
           "SwapRecord", "SwapWatcher", "claim_order", "exchange_in_place", "claim_read", "claim_write", "export_state", "holder_since", "import_state", "pool_size", "publish_state", "read_claims", "read_state", "receive_slots",
           "store_barrier", "transfer", "validate", "wait_for_claim"]

#: After a failure, how long a survivor waits for a death notice before it takes the failure for an
#: ordinary one (L2 as before).  The keeper posts within milliseconds of the death (``waitpid``).
NOTICE_GRACE_S = 3.0
#: After the first notice, how long before the dead set is read: a concurrent crash (FailBench F2)
#: is noticed by its own keeper a few milliseconds later.
SETTLE_S = 0.1



class SwapError(RuntimeError):
    """The swap could not complete (no spare, a missing peer, a transfer or validation failure)."""


class SwapNeeded(Exception):
    """Inside the engine (:class:`~accelpact.impl.recovery.Pact`) only: the observation of a failure
    that an episode rebuilding the model answers (a rank died and the job has spares, or a step in
    flight is discarded in place).  The engine's step, boundary and save repair catch it and run the
    episode there; it never reaches the caller."""

    def __init__(self, point: str, dead: tuple[int, ...], error: BaseException | None, mode: str = "") -> None:
        super().__init__(f"rank(s) {list(dead)} {'vacant: grow' if mode == 'grow' else 'leave: shrink' if mode == 'shrink' else 'died'} "
                         f"({point}): hot swap")
        #: ``mode``: "" (a death or a discard: the contract decides swap, shrink or L2), "shrink" (a
        #: requested shrink: ``dead`` leave alive), "grow" (``dead`` are the vacant identities)
        self.point, self.dead, self.error, self.mode = point, dead, error, mode


@dataclass
class SwapRecord:
    """One swap as the run's result names it."""

    generation: int
    point: str
    dead: list[int]
    spares: dict[int, int]          # dead rank -> spare index
    sources: dict[int, int]         # dead rank -> the replica that sent its state
    frontier: int
    role: str                       # "survivor" or "spare"
    durations_ms: dict[str, float] = field(default_factory=dict)
    t_resume: float = 0.0           # time.monotonic() when the release came: training again at F


# ------------------------------------------------------------------------------------- spares per node
#: Environment variable: how many of each node's processes are spares (``accelpact launch --spares K``).
#: The keeper reads it and gives its worker the job's total in ``ACCELPACT_SPARES`` (what
#: :func:`accelpact.init` reads).
SPARES_PER_NODE_ENV = "ACCELPACT_SPARES_PER_NODE"
#: The job's total of spares (``accelpact.init``'s ``spares`` setting); on the launcher's side, without
#: :data:`SPARES_PER_NODE_ENV`, the deprecated way to name the spares of a one-node job.
SPARES_ENV = "ACCELPACT_SPARES"
#: Set by the keeper for its worker: the ``RANK`` the launcher gave the process (its ``RANK`` is then
#: the identity :class:`SpareLayout` gives it).
LAUNCHER_RANK_ENV = "ACCELPACT_LAUNCHER_RANK"


class LayoutError(ValueError):
    """The launcher's environment cannot hold spares per node; the message names the variable."""


@dataclass(frozen=True)
class SpareLayout:
    """Where a job's spares are (issue 43): ``nodes`` nodes of ``slots`` processes each (torchrun's
    ``LOCAL_WORLD_SIZE``, spares included), of which the last ``per_node`` of each node
    (``LOCAL_RANK >= slots - per_node``) are spares: a node's spare slots are its own.

    Identities keep the node boundaries: the training process in slot (node, local) is rank
    ``node * training_per_node + local``, the spare in slot (node, training_per_node + j) is spare
    ``node * per_node + j``.  With one replica per node (the default replica count, ``nodes``), replica
    ``i`` is node ``i``'s training ranks, and each shard group is one node's; the replicate groups
    span the nodes, one rank each.  On one node this is the launcher's own numbering (the last
    ``per_node`` ranks are the spares)."""

    nodes: int
    slots: int
    per_node: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.slots < 1:
            raise LayoutError(f"spares per node need nodes >= 1 and processes per node >= 1, got {self.nodes}x{self.slots}")
        if not 0 <= self.per_node < self.slots:
            raise LayoutError(f"{SPARES_PER_NODE_ENV}={self.per_node} leaves no training rank on a node of {self.slots} "
                              "processes (--nproc-per-node counts every process, spares included)")

    @property
    def training_per_node(self) -> int:
        return self.slots - self.per_node

    @property
    def world(self) -> int:
        """The training ranks (W)."""
        return self.nodes * self.training_per_node

    @property
    def spares(self) -> int:
        """The spares of the job (S), all nodes together."""
        return self.nodes * self.per_node

    def place(self, node: int, local: int) -> tuple[int | None, int | None]:
        """The identity of the process in slot (``node``, ``local``): ``(rank, None)`` for a training
        process, ``(None, k)`` for spare ``k``."""
        if not (0 <= node < self.nodes and 0 <= local < self.slots):
            raise LayoutError(f"slot (node {node}, LOCAL_RANK {local}) is outside {self.nodes} node(s) of {self.slots}")
        t = self.training_per_node
        if local < t:
            return node * t + local, None
        return None, node * self.per_node + (local - t)

    def worker_rank(self, node: int, local: int) -> int:
        """The ``RANK`` the worker in slot (``node``, ``local``) is given: its training rank, or ``W + k``
        for spare ``k`` (how :func:`accelpact.init` tells a spare and its index)."""
        rank, k = self.place(node, local)
        if rank is not None:
            return rank
        assert k is not None  # place gives one of the two
        return self.world + k

    def node_of_rank(self, rank: int) -> int:
        """The node that holds training rank ``rank``'s slot (its home, whoever holds it now)."""
        return rank // self.training_per_node

    def node_of_spare(self, k: int) -> int | None:
        """The node of launch-time spare ``k``; None for a spare a keeper started later (refill: its
        keeper records its node, :func:`~accelpact.impl.controlplane.spare_node_key`)."""
        return k // self.per_node if 0 <= k < self.spares else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "SpareLayout | None":
        """The layout a launcher's (or a kept worker's) environment describes; None when the job has no
        spares.  :data:`SPARES_PER_NODE_ENV` names the spares of each node; without it, ``ACCELPACT_SPARES``
        (deprecated) names them on a one-node job only, where the two agree (a job of several nodes is
        refused: its spares would all be the last node's).  Both given, ``ACCELPACT_SPARES`` must be
        their total.  ``WORLD_SIZE`` must be a multiple of ``LOCAL_WORLD_SIZE`` (the same number of
        processes on every node).  :class:`LayoutError` names the variable."""
        per, total = _int_var(env, SPARES_PER_NODE_ENV), _int_var(env, SPARES_ENV)
        if not per and not total:
            return None
        world = _int_var(env, "WORLD_SIZE")
        if world is None or world < 1:
            raise LayoutError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r}: spares need the launcher's WORLD_SIZE (>= 1)")
        slots = _int_var(env, "LOCAL_WORLD_SIZE")
        slots = world if slots is None else slots
        if slots < 1 or world % slots:
            raise LayoutError(f"LOCAL_WORLD_SIZE={slots} does not divide WORLD_SIZE={world}: spares per node need the "
                              "same number of processes on every node (--nproc-per-node)")
        nodes = world // slots
        if per is None:
            assert total is not None
            if nodes > 1:
                raise LayoutError(f"{SPARES_ENV}={total} on a job of {nodes} nodes: spares are per node, and the last "
                                  f"{total} rank(s) would all be the last node's; set {SPARES_PER_NODE_ENV}=K instead "
                                  "(accelpact launch --spares K: K spares on each node)")
            per = total
        elif total is not None and total != nodes * per:
            raise LayoutError(f"{SPARES_ENV}={total} disagrees with {SPARES_PER_NODE_ENV}={per} on {nodes} node(s) "
                              f"({nodes * per} spares): unset {SPARES_ENV} (accelpact launch --spares K sets the spares "
                              "of each node)")
        if per == 0:
            return None
        if per >= slots:
            name = SPARES_PER_NODE_ENV if _int_var(env, SPARES_PER_NODE_ENV) is not None else SPARES_ENV
            raise LayoutError(f"{name}={per} leaves no training rank on a node of {slots} processes (LOCAL_WORLD_SIZE; "
                              "--nproc-per-node counts every process, spares included)")
        return cls(nodes, slots, per)

    def slot_from_env(self, env: Mapping[str, str]) -> tuple[int, int]:
        """This process's slot (node, local) from the launcher's ``RANK`` and ``LOCAL_RANK``: torchrun
        numbers the processes node after node, so node = ``(RANK - LOCAL_RANK) // LOCAL_WORLD_SIZE``."""
        rank = _int_var(env, "RANK")
        if rank is None or rank < 0:
            raise LayoutError(f"RANK={env.get('RANK')!r}: spares need the launcher's RANK (>= 0)")
        local = _int_var(env, "LOCAL_RANK")
        if self.nodes == 1:
            local = rank if local is None else local
        if local is None or not 0 <= local < self.slots or local > rank or (rank - local) % self.slots:
            raise LayoutError(f"LOCAL_RANK={env.get('LOCAL_RANK')!r} with RANK={rank} and LOCAL_WORLD_SIZE={self.slots}: "
                              "not a slot of a launcher that numbers its processes node after node (torchrun)")
        return (rank - local) // self.slots, local


def _int_var(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise LayoutError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise LayoutError(f"{name}={raw!r} must be >= 0")
    return value


def claim_order(candidates: Iterable[int], home: int | None, node_of: Callable[[int], int | None]) -> list[int]:
    """The order in which a claim for a dead identity tries the pool's spares: those on the identity's
    home node (``home``) first, then every other, each part by index.  ``home`` None (one node, or no
    layout known): by index."""
    ks = sorted(candidates)
    if home is None:
        return ks
    return sorted(ks, key=lambda k: node_of(k) != home)


def _layout_here() -> SpareLayout | None:
    """The job's layout as this process's keeper gave it (None: unknown or none: claims go by index)."""
    try:
        return SpareLayout.from_env(os.environ)
    except LayoutError:
        return None



# ------------------------------------------------------------------------------------- notices
class Notices:
    """The keepers' death notices (``swap/deaths``, ``swap/death/{n}``), read in order."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.seen = 0  # notices handled by an earlier swap of this rank

    def count(self) -> int:
        return int(self.store.add(DEATHS_KEY, 0))

    def depose(self, rank: int, by: int) -> bool:
        """Ask the keeper of the process holding ``rank``'s identity to kill its worker
        (``depose_key`` of its current holder, :func:`holder_since`; single assignment): a stopped or
        hung process is deposed so that its death, posted as any other, hands its identity to a
        spare.  True when this call was the first to ask."""
        key = depose_key(rank, holder_since(self.store, rank))
        return self.store.compare_set(key, "", str(by)).decode() == str(by)

    def read(self, upto: int) -> tuple[int, ...]:
        return tuple(int(self.store.get(death_key(n)).decode()) for n in range(self.seen + 1, upto + 1))

    def wait_new(self, grace_s: float = NOTICE_GRACE_S, settle_s: float = SETTLE_S) -> tuple[int, ...]:
        """The ranks with a notice not yet handled; waits up to ``grace_s`` for the first, then
        ``settle_s`` for concurrent ones.  Empty: no rank died (the failure is an ordinary one)."""
        deadline = time.monotonic() + grace_s
        n = self.count()
        while n <= self.seen and time.monotonic() < deadline:
            time.sleep(0.02)
            n = self.count()
        if n <= self.seen:
            return ()
        time.sleep(settle_s)
        n = self.count()
        try:
            self.store.wait([death_key(n)], datetime.timedelta(seconds=5))
        except Exception:  # noqa: BLE001 - the keeper's set follows its add at once; read what is there
            pass
        return tuple(sorted(set(self.read(n))))

    def handled(self, n: int) -> None:
        self.seen = max(self.seen, n)

    def handled_claimed(self, claimed: Iterable[int]) -> None:
        """After an episode's release: the notices that follow the handled ones, in order, of ranks
        whose identity a spare took in it (``claimed``) are handled too.  A rank that observed its
        episode as a discard (no death noticed when it began) learns here of the deaths a peer's swap
        absorbed meanwhile; left unhandled, such a notice would start a second episode for a rank that
        lives (a spare holds it).  A notice of any other rank stays: its death is the next episode's."""
        claimed = set(claimed)
        n = self.count()
        while self.seen < n and int(self.store.get(death_key(self.seen + 1)).decode()) in claimed:
            self.seen += 1


class SwapWatcher:
    """A thread that waits for the next death notice and then shuts down the sockets of every
    group of this rank (``records``: socket records, :func:`accelpact.impl.runtime.revoke.hard_close`), so
    that no survivor stays blocked in a collective with a live peer that left the step.  It revokes
    once per notice; :meth:`stop` ends it within a slice."""

    def __init__(self, store: Any, records: Callable[[], list], seen: int, slice_s: float = 0.1,
                 relevant: Callable[[int], bool] | None = None) -> None:
        self.store = store.clone() if hasattr(store, "clone") else store
        self.records = records
        #: whether a notice's rank concerns this rank's groups (a shrunk job: the death of a rank out of
        #: training, a benched one, revokes nothing); None: every notice does
        self.relevant = relevant
        self.next = seen + 1
        self.slice_s = slice_s
        self.revoked: list[tuple[int, int]] = []  # (notice, sockets closed)
        self._stop = threading.Event()
        self._thread = EngineThread(target=self._run, name="accelpact-swap-watcher", daemon=True)

    def start(self) -> "SwapWatcher":
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.slice_s * 10)

    def _run(self) -> None:
        # polled with check(): a store wait that times out logs a c10d warning each time
        while not self._stop.wait(self.slice_s):
            try:
                if not self.store.check([death_key(self.next)]):
                    continue
            except Exception:  # noqa: BLE001 - store lost: the watchdog handles it
                continue
            if self.relevant is not None:
                try:
                    who = int(self.store.get(death_key(self.next)).decode())
                except Exception:  # noqa: BLE001 - store lost (the watchdog handles it) or a torn write: revoke
                    who = -1
                if who >= 0 and not self.relevant(who):
                    self.next += 1
                    continue
            closed = revoke.hard_close_all(list(self.records()))  # NCCL: aborted together
            self.revoked.append((self.next, closed))
            self.next += 1


# ------------------------------------------------------------------------------------- state at F
def publish_state(store: Any, rank: int, frontier: int, extra: Any, device: Any = None) -> dict:
    """At each committed boundary (jobs with spares): what the spare that may take this identity
    needs beyond the replica's shard: F, the RNG state and the caller's extra state (the data cursor).
    Returns the published record (the survivor's own copy, for its discard).

    ``rng``: :func:`accelpact.impl.runtime.rng.capture` of ``device`` (the rank's device): the CPU
    generator and, where CUDA is available, the CUDA generator of that device (``{"cpu", "cuda"}``), which
    the swap's "RNG back to F" restores (:func:`accelpact.impl.runtime.rng.restore`, onto the
    restoring rank's own device: a spare's differs from the dead rank's)."""
    import torch

    rec = {"frontier": int(frontier), "rng": _rng.capture(device), "extra": extra}
    buf = io.BytesIO()
    torch.save(rec, buf)
    store.set(state_key(rank), buf.getvalue())
    return rec


def read_state(store: Any, rank: int) -> dict | None:
    import torch

    if not store.check([state_key(rank)]):
        return None
    return torch.load(io.BytesIO(store.get(state_key(rank))), weights_only=False)


# ------------------------------------------------------------------------------------- the spare's wait
def wait_for_claim(store: Any, k: int, abort_key: str, timeout_s: float,
                   slice_s: float = 0.05) -> tuple[int, int, str] | str:
    """Spare ``k`` idles on the control plane until a survivor assigns it a dead identity
    (``(dead, g, point)``) or the job ends (the abort key's value: ``closed``, or an abort reason)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # polled with check(): a store wait that times out logs a c10d warning each time
        if store.check([assign_key(k)]):
            return parse_assignment(store.get(assign_key(k)).decode())
        if store.check([abort_key]):
            return store.get(abort_key).decode()
        time.sleep(slice_s)
    return "deadline"


# ------------------------------------------------------------------------------------- the state itself
def _local(t: Any) -> Any:
    """A tensor's local storage: a DTensor's local shard, a plain tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _shard(p: Any) -> Any:
    """A parameter's committed local shard, also mid-step: an FSDP1 flat parameter's ``_local_shard``
    (its ``.data`` is the unsharded parameter between forward and backward), an FSDP2 parameter's
    DTensor local shard (the optimizer's parameter; unsharding gathers into other storage), a plain
    parameter itself."""
    shard = getattr(p, "_local_shard", None)
    return shard if shard is not None else _local(p)


def _params(optimizer: Any) -> list:
    """The parameters as the optimizer holds them (the sharded ones), in its order."""
    return [p for grp in optimizer.param_groups for p in grp["params"]]


def export_state(module: Any, optimizer: Any) -> tuple[dict, list]:
    """This rank's committed state as (manifest, tensors): parameters' local shards in the optimizer's
    order and buffers in ``named_buffers`` order, then every optimizer state tensor by parameter index
    and key.  The manifest holds the rest (shapes, dtypes, scalars, hyper-parameters): what
    :func:`import_state` needs to rebuild it in another wrapper built the same way."""
    params = _params(optimizer)
    tensors = [_shard(p).detach() for p in params] + [b.detach() for _, b in module.named_buffers()]
    index = {id(p): i for i, p in enumerate(params)}
    state: dict[int, dict] = {}
    for p, st in optimizer.state.items():
        i = index[id(p)]
        entry: dict[str, tuple] = {}
        for key in st:  # insertion order: the optimizer's own (state_dict() compares it)
            v = st[key]
            if hasattr(v, "shape") and hasattr(v, "dtype"):
                loc = _local(v).detach()
                entry[key] = ("t", str(loc.dtype), tuple(loc.shape), hasattr(v, "_local_tensor"), str(loc.device))
                tensors.append(loc)
            else:
                entry[key] = ("v", v)
        state[i] = entry
    groups = [{k: v for k, v in grp.items() if k != "params"} for grp in optimizer.param_groups]
    manifest = {"params": [(str(t.dtype), tuple(t.shape)) for t in tensors[:len(params)]],
                "buffers": [(str(b.dtype), tuple(b.shape)) for _, b in module.named_buffers()],
                "state": {i: state[i] for i in sorted(state)}, "groups": groups}
    return manifest, tensors


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name.split(".")[-1])


def _takes_in_place(dst: Any, dtype: str, shape: tuple) -> bool:
    """A received tensor can land in ``dst`` itself: contiguous storage of the manifest's dtype and shape."""
    return str(dst.dtype) == dtype and tuple(dst.shape) == tuple(shape) and dst.is_contiguous()


def receive_slots(module: Any, optimizer: Any, manifest: dict, device: Any) -> list:
    """What a receiving spare's transfer writes into, in the manifest's order: each parameter's and
    buffer's own local storage in the rebuilt wrapper (:func:`_shard`) where it can take the message
    as it is, else an empty tensor shaped as the manifest's; then a new tensor for every
    optimizer-state entry, which :func:`import_state` (``adopt``) makes the state itself.  So the
    state is never held twice: a spare's peak is its model plus the optimizer state it receives.
    Raises :class:`SwapError` before anything is received when the rebuilt model does not match."""
    import torch

    params = _params(optimizer)
    buffers = [b for _, b in module.named_buffers()]
    _check_counts(params, buffers, manifest)
    out = []
    for p, (dt, shape) in zip(list(params) + buffers, list(manifest["params"]) + list(manifest["buffers"]), strict=True):
        dst = _shard(p)
        if tuple(dst.shape) != tuple(shape):
            raise SwapError(f"state transfer: local shape {tuple(dst.shape)} vs {tuple(shape)}")
        out.append(dst.detach() if _takes_in_place(dst, dt, shape) else torch.empty(shape, dtype=_torch_dtype(dt), device=dst.device))
    for i in manifest["state"]:
        for key in manifest["state"][i]:
            spec = manifest["state"][i][key]
            if spec[0] == "t":
                dev = device if spec[4] != "cpu" else "cpu"  # e.g. Adam's step counter stays on the CPU
                out.append(torch.empty(spec[2], dtype=_torch_dtype(spec[1]), device=dev))
    return out


def _check_counts(params: list, buffers: list, manifest: dict) -> None:
    if len(params) != len(manifest["params"]) or len(buffers) != len(manifest["buffers"]):
        raise SwapError(f"state transfer: the rebuilt model has {len(params)} parameters and {len(buffers)} buffers, "
                        f"the state has {len(manifest['params'])} and {len(manifest['buffers'])}: rebuild it as it was built")


def import_state(module: Any, optimizer: Any, manifest: dict, tensors: list, *, adopt: bool = False) -> None:
    """Load (manifest, tensors) from :func:`export_state` into a wrapper built the same way and its
    fresh optimizer: parameters and buffers copied into their local storage (not copied where the
    tensor already is that storage: :func:`receive_slots`), the optimizer state rebuilt on the new
    parameters (a DTensor state on the parameter's new mesh and placements).

    ``adopt``: the optimizer-state tensors become the new optimizer's as they are, not copies.  For
    tensors nothing else goes on using: a survivor's old optimizer, dropped once its state moved (a
    rebuild then holds the state once, not twice), or a spare's received ones.  Without it every
    state tensor is cloned (the source stays independent)."""
    import torch

    params = _params(optimizer)
    buffers = [b for _, b in module.named_buffers()]
    _check_counts(params, buffers, manifest)
    it = iter(tensors)
    with torch.no_grad():
        for p in list(params) + list(buffers):
            src = next(it)
            dst = _shard(p)
            if dst.shape != src.shape:
                raise SwapError(f"state transfer: local shape {tuple(dst.shape)} vs {tuple(src.shape)}")
            if not _same_storage(dst, src):
                dst.copy_(src)
        order = params
        optimizer.state.clear()
        for i, entry in manifest["state"].items():
            p = order[int(i)]
            st: dict = {}
            for key in entry:
                spec = entry[key]
                if spec[0] == "v":
                    st[key] = spec[1]
                    continue
                loc = next(it)
                if not adopt:
                    loc = loc.clone()
                if spec[3]:
                    from torch.distributed.tensor import DTensor

                    st[key] = DTensor.from_local(loc, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                                 stride=p.stride())
                else:
                    st[key] = loc
            optimizer.state[p] = st
        for grp, saved in zip(optimizer.param_groups, manifest["groups"], strict=True):
            grp.update(saved)


def _same_storage(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same elements of the same storage (a slot received in place)."""
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.numel() > 0 and a.data_ptr() == b.data_ptr())


def manifest_bytes(manifest: dict) -> bytes:
    return pickle.dumps(manifest)


# ------------------------------------------------------------------------------------- the episode

def pool_size(store: Any, spares: int) -> int:
    """How many spares the pool has held so far: the ``spares`` started at launch (indices ``0 ..
    spares - 1``) and those keepers started since (refill, :data:`~accelpact.impl.controlplane.REFILLS_KEY`:
    indices ``spares ..``).  Taken ones (``swap/next``) and gone ones are counted too."""
    return spares + int(store.add(REFILLS_KEY, 0))


def pool_covers(store: Any, g: int, dead: Sequence[int], spares: int) -> bool:
    """The decision's ``spare`` fact (model ``hotswap._facts``): the pool holds a spare for every
    dead rank of generation ``g`` whose claim has not begun.  The pool is read before the claims,
    and a claim begins (``claimers_key``) before it takes from the pool, so a claim under way is
    never counted twice: once as taken, once as still to claim.  A spare on any node counts."""
    left = sum(1 for k in range(pool_size(store, spares)) if _idle(store, k))
    todo = [d for d in dead if int(store.add(claimers_key(g, d), 0)) == 0]
    return left >= len(todo)


def _idle(store: Any, k: int) -> bool:
    """Spare ``k`` is in the pool: no claim took it and its keeper did not post it gone."""
    return not store.check([taken_key(k)]) and not store.check([spare_gone_key(k)])


def holder_since(store: Any, rank: int) -> int:
    """The generation from which the process now holding ``rank``'s identity holds it: ``g + 1`` for
    the latest claim (of generation ``g``) that assigned a spare to ``rank`` (``swap/assign/{k}`` of
    every spare taken from the pool so far: each has an index below ``swap/next``), else 0 (the rank's
    own worker)."""
    since = 0
    for k in range(int(store.add(NEXT_KEY, 0))):
        if store.check([assign_key(k)]):
            dead, g, _point = parse_assignment(store.get(assign_key(k)).decode())
            if dead == rank:
                since = max(since, g + 1)
    return since


def _take(store: Any, g: int, dead: int, spares: int, layout: SpareLayout | None) -> int | None:
    """Take one idle spare from the pool for ``dead`` (single assignment on ``swap/taken/{k}``), the dead
    identity's home node's first (:func:`claim_order`; a refilled spare's node is what its keeper
    recorded); None when the pool is empty.  ``swap/next`` is raised above the index taken."""
    home = layout.node_of_rank(dead) if layout is not None and layout.nodes > 1 else None

    def node_of(k: int) -> int | None:
        assert layout is not None
        n = layout.node_of_spare(k)
        if n is None and store.check([spare_node_key(k)]):
            n = int(store.get(spare_node_key(k)).decode())
        return n

    mark = f"{g}:{dead}"
    for k in claim_order(range(pool_size(store, spares)), home, node_of):
        if store.check([spare_gone_key(k)]):  # a spare that died idle is no longer in the pool
            continue
        if store.compare_set(taken_key(k), "", mark).decode() != mark:
            continue  # another claim took it
        bound = int(store.add(NEXT_KEY, 0))
        if bound <= k:  # two claims raising it at once may overshoot: it is a bound, never a count
            store.add(NEXT_KEY, k + 1 - bound)
        return k
    return None


def claim_write(store: Any, g: int, dead: int, spares: int, point: str = "",
                on_claim: Callable[[], None] | None = None, layout: SpareLayout | None = None) -> tuple[bool, int | None]:
    """The store writes of ``RankClaimSpare`` for ``dead`` in generation ``g``: the first survivor to
    claim (a counter) takes one spare from the pool (:func:`_take`: an idle spare of the dead
    identity's node first, then one of another node; spares whose keeper posted them gone,
    :func:`~accelpact.impl.controlplane.spare_gone_key`, are passed over), writes its index into
    ``g{g}/spare/{dead}`` (single assignment: ``none`` when the pool is empty) and tells the spare
    (``swap/assign/{k}``).  Returns (this rank was the claimer, the spare it wrote or None).  No
    wait: the engine takes it under its write/record hold.  ``on_claim``: what the claimer does
    before any spare can be told (a grow publishes the vacant identity's state at F there).
    ``layout``: the job's :class:`SpareLayout` (default: the one this process's keeper gave it in the
    environment; none: spares by index)."""
    key = claim_key(g, dead)
    if int(store.add(claimers_key(g, dead), 1)) != 1:
        return False, None
    if on_claim is not None:
        on_claim()
    k = _take(store, g, dead, spares, layout if layout is not None else _layout_here())
    value = str(k) if k is not None else "none"
    stood = store.compare_set(key, "", value).decode()
    if stood == value and k is not None:
        store.set(assign_key(k), f"{dead}:{g}:{point}")
        return True, k
    return True, None


def claim_read(store: Any, g: int, dead: int, timeout_s: float) -> int | None:
    """The claim that stands for ``dead`` in generation ``g`` (None: no spare was left), waiting up
    to ``timeout_s`` for the claimer to write it."""
    key = claim_key(g, dead)
    store.wait([key], datetime.timedelta(seconds=timeout_s))
    v = store.get(key).decode()
    return None if v == "none" else int(v)


def read_claims(store: Any, g: int, world: int) -> dict[int, int]:
    """Every claim of generation ``g`` that names a spare (dead rank -> spare index): what a spare
    reads once its own assignment came (every claim of the episode was written before any spare was
    told: the claimers write, then assign)."""
    out = {}
    for r in range(world):
        if store.check([claim_key(g, r)]):
            v = store.get(claim_key(g, r)).decode()
            if v != "none":
                out[r] = int(v)
    return out


def exchange_in_place(pg: Any, tensors: list, peer: int, timeout_s: float, *, send: bool,
                      place: Callable[[Any, Any], Any] | None = None) -> None:
    """Send each of ``tensors`` to group rank ``peer`` of ``pg`` (``send``), or receive each into
    itself from it, on the group's device: a tensor not on it (a CPU tensor on NCCL, which registers
    ``ProcessGroupNCCL`` for ``cuda`` only: AdamW's ``step``, the blob size) is copied there
    (``place``, default the group's :meth:`Backend.place`) and, received, copied back; one on the
    device already goes as it is.  One tensor at a time, each wait bounded by
    ``timeout_s``; messages between one pair arrive in the order sent (one tag)."""
    be = backend_of(pg)
    if place is None:
        place = be.place
    for t in tensors:
        moved = place(t, pg)
        work = pg.send([moved], peer, 0) if send else pg.recv([moved], peer, 0)
        if be.sliced_wait:
            # one whole wait(timeout): a gloo send or recv reports completed only once a wait saw it end, and
            # a timed-out wait on one closes every connection of its group, so it is never waited in slices
            # (spec/torch-facts.md); past the bound the group is given up with the episode
            work.wait(datetime.timedelta(seconds=timeout_s))
        else:
            wait_bounded(work, timeout_s)
        del work
        if not send and moved is not t:
            t.copy_(moved)  # after wait_bounded: on NCCL the current stream waited for the kernel


def transfer(pg: Any, members: tuple[int, ...], source: int, rank: int, module: Any, optimizer: Any,
             device: Any, timeout_s: float, receivers: Sequence[int] | None = None) -> int:
    """RankTransferState on the new group of R's kind of a dead identity: ``source`` (a live replica)
    sends its manifest and then its state tensors point to point to each of ``receivers`` (the spares
    that took the group's dead identities; default: every other member), one receiver after the
    other.  A receiver loads them into its rebuilt model as they arrive: parameters and buffers
    straight into their storage, the optimizer state adopted (:func:`receive_slots`), so it never
    holds the state twice.  No other member of the group takes part or allocates anything (the
    model's ``RankTransferState`` writes the spares only).  Returns the bytes sent to one receiver
    (the source, and a receiver), 0 on any other rank."""
    import torch

    targets = tuple(m for m in members if m != source) if receivers is None else tuple(receivers)
    if rank == source:
        manifest, tensors = export_state(module, optimizer)
        blob = torch.frombuffer(bytearray(manifest_bytes(manifest)), dtype=torch.uint8)
        size = torch.tensor([blob.numel()], dtype=torch.int64)
        for r in targets:
            # every message runs on the group's device (NCCL: ``size`` and the blob are CPU tensors; so
            # is AdamW's ``step`` unless capturable/fused) and lands back in the receiver's CPU tensor
            exchange_in_place(pg, [size, blob] + tensors, members.index(r), timeout_s, send=True)
        return int(size[0]) + sum(t.numel() * t.element_size() for t in tensors)
    if rank not in targets:
        return 0
    if module is None or optimizer is None:
        raise SwapError(f"state transfer: rank {rank} receives the state but has no rebuilt model to load it into")
    root = members.index(source)
    size = torch.zeros(1, dtype=torch.int64)
    exchange_in_place(pg, [size], root, timeout_s, send=False)
    blob = torch.empty(int(size[0]), dtype=torch.uint8)
    exchange_in_place(pg, [blob], root, timeout_s, send=False)
    manifest = pickle.loads(blob.numpy().tobytes())
    tensors = receive_slots(module, optimizer, manifest, device)
    exchange_in_place(pg, tensors, root, timeout_s, send=False)
    import_state(module, optimizer, manifest, tensors, adopt=True)
    return int(size[0]) + sum(t.numel() * t.element_size() for t in tensors)


def validate(pg: Any, members: tuple[int, ...], rank: int, module: Any, optimizer: Any, timeout_s: float) -> str:
    """RankValidate on a new group of R's kind: an all-reduce that counts the members, then every
    member's state checksum compared (:func:`accelpact.impl.runtime.digest.state_checksum`); raises
    :class:`SwapError` naming the ranks that differ.  Returns this rank's checksum (hex)."""
    import torch


    device = backend_of(pg).device_for(pg)
    one = torch.ones(1, device=device)
    wait_bounded(pg.allreduce([one]), timeout_s)
    if int(one[0]) != len(members):
        raise SwapError(f"validation all-reduce gave {int(one[0])}, expected {len(members)}")
    mine = state_checksum(module, optimizer, device)
    outs = [torch.empty_like(mine) for _ in members]
    wait_bounded(pg.allgather([outs], [mine]), timeout_s)
    differing = [members[i] for i, o in enumerate(outs) if not torch.equal(o, mine)]
    if differing:
        raise SwapError(f"after the swap, replica checksums differ from rank {rank}'s on rank(s) {differing}")
    return checksum_hex(mine)


def store_barrier(store: Any, key: str, world: int, timeout_s: float, what: str) -> None:
    """Count this rank in at ``key`` and wait until all ``world`` ranks did, at most ``timeout_s``
    (:class:`TimeoutError` naming how many came).  Two store operations per rank, whatever ``world``
    is: the ``add`` that returns ``world`` (the last to come) sets ``key/all``, on which the others
    block in one ``wait`` (no polling: at 1,024 ranks a 5 ms poll is ~200k requests/s, issue 40)."""
    import torch.distributed as dist

    done = f"{key}/all"
    if int(store.add(key, 1)) >= world:
        store.set(done, "1")
        return
    try:
        store.wait([done], datetime.timedelta(seconds=max(timeout_s, 0.001)))
    except dist.DistStoreError:  # expiry; a lost store propagates as what it is
        raise TimeoutError(f"only {int(store.add(key, 0))} of {world} ranks {what} within {timeout_s} s") from None


def warm_up() -> None:
    """What a spare does while it idles: import what building a wrapped model and its groups imports
    (seconds on a loaded node), so that the swap does not wait for it."""
    import importlib

    for name in ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.device_mesh",
                 "torch.nn.parallel", "torch.distributed.checkpoint", "torch.distributed.algorithms.join"):
        try:
            importlib.import_module(name)
        except ImportError:  # a build without it: the rebuild imports what it needs
            pass
