"""Protocol state: frozen, hashable dataclasses (spec/protocol.md, section "State").

The model state is the abstract part of S = <S_app, S_runtime> that recovery touches,
per rank, plus the control-plane store and a few history variables that exist only so
that invariants can be stated as predicates on a single state (as TLA+ specs do).

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
from typing import Callable

from .contract import (
    DEFAULT_OBJECTIVE,
    DEFAULT_PLATFORM,
    DEFAULT_PROFILE,
    FAILURE_PHASES,
    Envelope,
    ObservationKey,
    default_envelope,
)

# Program counter of a rank: where it stands in the six phases.  Names match spec/protocol.md.
PC_TRAIN = "train"          # running training; also the state after a release (resumed at F)
PC_OBSERVED = "observed"    # phase 1 done: failure observed, revoke published
PC_GUARDED = "guarded"      # phase 2 done: guard passed, contract said L1
PC_ARRIVED = "arrived"      # phase 3: (F, g) posted to the control barrier, waiting for the decision
PC_AGREED = "agreed"        # phase 3 done: decision "commit" read
PC_REPLACED = "replaced"    # phase 4 done (members of R only): new communicator built
PC_REBOUND = "rebound"      # phase 5 done (members of R only): every cached reference names it
PC_VALIDATED = "validated"  # phase 6 done (members of R only): validation collective + digests passed
PC_READY = "ready"          # release vote posted, waiting for the release decision
PC_EXITED = "exited"        # fail-stop exit with a reason (L2)
PC_CRASHED = "crashed"      # died (SIGKILL); takes no further step
PC_RESTARTED = "restarted"  # the supervisor restarted it from the last durable checkpoint
PC_JOINED = "joined"        # hot swap: a spare that took a dead rank's identity, waiting for its state from a replica
PC_LEFT = "left"            # shrink (issue 41): its replica left the data-parallel dimension; the process idles as a spare

RECOVERY_PCS = (PC_OBSERVED, PC_GUARDED, PC_ARRIVED, PC_AGREED, PC_REPLACED, PC_REBOUND, PC_VALIDATED, PC_READY)
#: Phases 2-6 in the sense of the safety rule "any failure in phases 2-6 ends the rank".
PHASE_OF_PC = {
    PC_OBSERVED: 2,  # next: guard
    PC_GUARDED: 3,   # next: arrive
    PC_ARRIVED: 3,
    PC_AGREED: 4,
    PC_REPLACED: 5,
    PC_REBOUND: 6,
    PC_VALIDATED: 6,
    PC_READY: 6,     # the release is the end of phase 6
}
#: Waiting points: where a rank waits on others and its deadline can expire.
WAITING_PCS = (PC_ARRIVED, PC_REBOUND, PC_READY)

# Exit reasons (spec/protocol.md "Exit codes"); the implementation maps each to a code.
REASON_REJECTED = "rejected"        # contract said L2 (in flight, guard failed, key outside envelope)
REASON_MISMATCH = "mismatch"        # frontier agreement found a different (F, g)
REASON_DEADLINE = "deadline"        # a wait on peers expired
REASON_EXCEPTION = "exception"      # an exception inside phases 2-6
EXIT_REASONS = (REASON_REJECTED, REASON_MISMATCH, REASON_DEADLINE, REASON_EXCEPTION)

#: The points of one training step in the order a rank passes them: a failure that strikes at one
#: point is observed at a later point where the rank next uses the failed group (Config.uses_r).
STEP_ORDER = ("forward", "backward", "optimizer", "boundary")

DECISION_COMMIT = "commit"
DECISION_RELEASE = "release"

#: ``Rank.shard`` of a rank that never received a shard from another rank: its own replicate group's.
SHARD_OWN = -1
#: ``Rank.shard`` of a spare that joined but holds no state yet (``PC_JOINED``).
SHARD_NONE = -2

#: Stages of a deposed process (``State.deposed``): stopped; woken (its first store operation still to
#: come); acting as the rank again after that operation (it was not fenced out: never in the spec).
DEPOSED_STOPPED = "stopped"
DEPOSED_AWAKE = "awake"
DEPOSED_ACTING = "acting"


@dataclass(frozen=True, slots=True)
class Config:
    """A model instance: world shape, fault budget, contract, and an optional mutant.

    The world W is ``nodes x ranks_per_node`` ranks, rank = node * ranks_per_node + local.  The
    groups of R's kind are the replicate groups (one per local index, one rank per node), or, with
    ``group="world"`` or one rank per node, the one group W (DDP); every rank holds a communicator
    for its group.  Which groups fail is part of each episode: with ``failing="one"`` only the group
    of local index ``affected_local`` ever fails (the classic instance: R fixed per job); with
    ``failing="any"`` each ``FaultGroupFail`` breaks one group of the world's choice, and several
    may fail at the same boundary (one action each, before anyone observes), so R is the union of
    the episode's failed groups.

    Where a failure is observed: ``points`` are where a group failure can *strike*; ``uses_r`` are
    the points of a step at which the wrapper runs collectives on R (HSDP: backward's gradient
    all-reduce and the boundary probe; DDP also forward when it broadcasts buffers; the optimizer
    step: none).  Each rank observes a failure that struck at p where it next uses R, or, for a
    failure during a collective on R, possibly at the use after it (:meth:`observable`), chosen per
    rank: a partial collective leaves one peer in backward while another already reached the
    boundary.

    F and C move: the failure of episode g strikes at the committed frontier
    ``frontier + g * advance`` (:meth:`frontier_at`): the job trained ``advance`` steps between two
    episodes; C is ``checkpoint`` or, with ``checkpoint_every``, the last multiple reached
    (:meth:`checkpoint_at`).

    Hot swap (issue 13, spec/protocol.md "Hot swap"): with ``spares >= 1`` the job has that many spare
    processes idle on the control plane; a rank that dies in training (``FaultCrash(rank, point)``)
    may be replaced in place by a spare that takes its identity and its state from a live replica.
    With ``spares = 0`` (the default) no hot-swap action is instantiated and every state is the
    classic model's.
    """

    nodes: int = 2
    ranks_per_node: int = 2
    affected_local: int = 1
    group: str = "replicate"  # the affected group R: "replicate" (HSDP) or "world" (DDP)
    max_faults: int = 2
    frontier: int = 3        # F: the committed frontier when the fault strikes
    checkpoint: int = 1      # C: the last durable checkpoint (C <= F)
    refs: int = 2            # cached references per member of R that are modelled
    faults: frozenset[str] = frozenset()   # enabled fault kinds; empty means all (see protocol.FAULT_KINDS)
    points: tuple[str, ...] = ("boundary", "forward", "backward", "optimizer")
    platform: str = DEFAULT_PLATFORM
    profile: str = DEFAULT_PROFILE
    objective: str = DEFAULT_OBJECTIVE
    envelope: Envelope = field(default_factory=default_envelope, compare=False, hash=False)
    mutant: str | None = None
    failing: str = "one"     # "one": only the group of affected_local fails; "any": any groups, per episode
    uses_r: tuple[str, ...] = ("backward", "boundary")   # points of a step with collectives on R
    advance: int = 1         # steps trained between two episodes (F of episode g: frontier + g * advance)
    checkpoint_every: int = 0   # 0: C stays at ``checkpoint``; k: C is the last multiple of k at or before F
    spares: int = 0          # hot swap (issue 13): spare processes idle on the control plane; 0: none (the classic model)
    #: physical links (issue 25, P18): ``FaultLinkCut(a, b, point)`` is instantiated for every pair of ranks
    #: on different nodes, and ``RankRevokeWide``; needs ``failing="any"`` (a cut fails whichever groups cross it)
    links: bool = False
    #: the commit fence (issue 27, P17.2): a job that discards in place passes an all-reduce over all of W
    #: as ``optimizer.step()`` starts; a failure in forward or backward then stops every rank before its commit
    fence: bool = False
    #: shrink and grow (issue 41, spec/protocol.md P19): the job counts its step in micro-batches
    #: (``micro_batches``, the replicas' count at start when 0) and a death with no spare idle, where every
    #: shard keeps a live replica, is a shrink: the dead rank's replica leaves the data-parallel dimension
    #: at F (``RankShrink``), its survivors idle as spares (``RankLeave``), and a grow brings it back from a
    #: live replica once the pool holds a spare for each of its ranks (``RankStartGrow``).  False: today's
    #: job (a death with no spare is L2) and every state of the classic model
    shrink: bool = False
    micro_batches: int = 0
    #: refill (issue 41): a keeper whose worker died on a healthy node starts a fresh spare in its place
    #: (``KeeperRefill``, once per dead process)
    refill: bool = False
    # Derived, cached at construction because the search asks for them millions of times.
    _world: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)
    _affected: frozenset[int] = field(init=False, repr=False, compare=False, hash=False)
    _affected_t: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)
    _group_of: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)
    _members: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(f"Config: nodes and ranks_per_node must be >= 1, got {self.nodes}x{self.ranks_per_node}")
        if not 0 <= self.affected_local < self.ranks_per_node:
            raise ValueError(f"Config.affected_local={self.affected_local} must be in [0, {self.ranks_per_node})")
        if self.max_faults < 0:
            raise ValueError("Config.max_faults must be >= 0")
        if not 0 <= self.checkpoint <= self.frontier:
            raise ValueError(f"Config: need 0 <= checkpoint ({self.checkpoint}) <= frontier ({self.frontier})")
        if self.group not in ("replicate", "world"):
            raise ValueError(f"Config.group must be 'replicate' or 'world', got {self.group!r}")
        if self.refs < 1:
            raise ValueError("Config.refs must be >= 1")
        if self.failing not in ("one", "any"):
            raise ValueError(f"Config.failing must be 'one' or 'any', got {self.failing!r}")
        bad = [p for p in (*self.points, *self.uses_r) if p not in FAILURE_PHASES]
        if bad:
            raise ValueError(f"Config.points/uses_r: {bad} are not failure points {list(FAILURE_PHASES)}")
        if "boundary" not in self.uses_r:
            raise ValueError("Config.uses_r must contain 'boundary': the boundary probe is a collective on R")
        if self.advance < 0 or self.checkpoint_every < 0:
            raise ValueError("Config.advance and Config.checkpoint_every must be >= 0")
        if self.spares < 0:
            raise ValueError(f"Config.spares must be >= 0 (spare processes in the job), got {self.spares}")
        if self.links and self.failing != "any":
            raise ValueError("Config.links needs failing='any': a link cut fails whichever groups cross it "
                             "(and a wide revoke every group of R's kind), not one fixed group")
        if self.links and self.nodes < 2:
            raise ValueError("Config.links needs nodes >= 2: a link joins ranks on two nodes")
        if self.micro_batches < 0:
            raise ValueError(f"Config.micro_batches must be >= 0 (0: one per replica), got {self.micro_batches}")
        if (self.shrink or self.refill) and self.fence:
            raise ValueError("Config.shrink/refill: not modelled beside the commit fence (fence=True) yet")
        world = tuple(range(self.nodes * self.ranks_per_node))
        if self.ranks_per_node == 1 or self.group == "world":
            affected = world
            group_of = tuple(0 for _ in world)
            members: tuple[tuple[int, ...], ...] = (world,)
        else:
            affected = tuple(n * self.ranks_per_node + self.affected_local for n in range(self.nodes))
            group_of = tuple(r % self.ranks_per_node for r in world)
            members = tuple(tuple(n * self.ranks_per_node + lo for n in range(self.nodes)) for lo in range(self.ranks_per_node))
        object.__setattr__(self, "_group_of", group_of)
        object.__setattr__(self, "_members", members)
        object.__setattr__(self, "_world", world)
        object.__setattr__(self, "_affected_t", affected)
        object.__setattr__(self, "_affected", frozenset(affected))

    @property
    def world(self) -> tuple[int, ...]:
        return self._world

    @property
    def elastic(self) -> bool:
        """A death in training is an episode of the model (``FaultCrash(rank, point)``, the hot-swap
        actions): with spares, with a shrink, or with a refill."""
        return bool(self.spares or self.shrink or self.refill)

    def replica_of(self, r: int) -> int:
        """The replica (one full copy of S_app, the unit of the data-parallel dimension) rank ``r``
        belongs to: its node's shard group under HSDP (``group="replicate"``, several ranks per node);
        the rank itself where every rank holds a full copy (DDP, one rank per node)."""
        return r // self.ranks_per_node if self.group == "replicate" and self.ranks_per_node > 1 else r

    @property
    def replicas(self) -> tuple[int, ...]:
        """Every replica of the job, by index."""
        return tuple(sorted({self.replica_of(r) for r in self._world}))

    def replica_ranks(self, i: int) -> tuple[int, ...]:
        """The ranks of replica ``i``."""
        return tuple(r for r in self._world if self.replica_of(r) == i)

    @property
    def total_micro_batches(self) -> int:
        """M: the micro-batches of one step, whatever the replica count (P19.2)."""
        return self.micro_batches or len(self.replicas)

    @property
    def affected(self) -> tuple[int, ...]:
        """With ``failing="one"``: the group that fails (R).  With ``"any"``: not one group; use
        :meth:`group_of` and :meth:`members`."""
        return self._affected_t

    def is_member(self, r: int) -> bool:
        """True when rank ``r`` belongs to the affected group R (``failing="one"``)."""
        return r in self._affected

    def group_of(self, r: int) -> int:
        """The index of rank ``r``'s group of R's kind."""
        return self._group_of[r]

    def members(self, group: int) -> tuple[int, ...]:
        """The ranks of group ``group`` of R's kind."""
        return self._members[group]

    @property
    def groups(self) -> tuple[int, ...]:
        """The groups that can fail: ``(affected_local's group,)`` with ``failing="one"``, all with ``"any"``."""
        if self.failing == "one":
            return (self._group_of[self._affected_t[0]],)
        return tuple(range(len(self._members)))

    def observable(self, point: str) -> tuple[str, ...]:
        """Where a rank can observe a failure that struck at ``point``: at the first point of
        ``uses_r`` at or after it (never none: the boundary probe uses R); and, when it struck
        during a collective on R (``point`` is in ``uses_r``), also at the next use after it: a
        partial collective lets some members complete it while others see it fail."""
        later = [q for q in STEP_ORDER[STEP_ORDER.index(point):] if q in self.uses_r]
        return tuple(later[:2]) if later[0] == point else (later[0],)

    def frontier_at(self, gen: int) -> int:
        """F_g: the committed frontier at which the failure of episode (generation) ``gen`` strikes."""
        return self.frontier + gen * self.advance

    def checkpoint_at(self, f: int) -> int:
        """C: the last durable checkpoint at or before frontier ``f``."""
        if not self.checkpoint_every:
            return self.checkpoint
        return self.checkpoint + ((f - self.checkpoint) // self.checkpoint_every) * self.checkpoint_every

    def key(self, phase: str) -> ObservationKey:
        return ObservationKey(self.platform, self.profile, phase, self.objective)

    def with_(self, **changes) -> "Config":
        return replace(self, **changes)


class _CachedHash:
    """Frozen states are hashed many times (the search's seen-set, the trace checker's memo) and
    mostly share their parts (a step copies one rank): each object hashes its fields once.  A
    subclass declares ``_h`` (``init=False``, excluded from comparison), so ``replace`` never
    copies it: a changed object hashes afresh."""

    __slots__ = ()

    def __hash__(self) -> int:
        h = self._h  # type: ignore[attr-defined]  # declared by every subclass
        if not h:
            h = hash(_HASHED[type(self)](self)) or 1
            object.__setattr__(self, "_h", h)
        return h


#: per class, a getter returning the tuple of its compared fields (``operator.attrgetter``: one C call)
_HASHED: dict[type, attrgetter] = {}
_MASK = (1 << 61) - 1


def _hashed(cls: type) -> type:
    _HASHED[cls] = attrgetter(*(f.name for f in fields(cls) if f.compare))
    return cls


# Memoised derivation (an internal cache, invisible in values): ``with_rank``/``with_store`` replace a
# few fields of a Rank or a Store, and the exhaustive search derives the same few thousand ranks and
# stores from each other millions of times.  A derived object is a pure function of (old object,
# changes), so returning the equal object built the first time is the same value; sharing it also
# makes equal parts of different states one object (cheap comparisons, less memory).  Bounded: a
# table is cleared when it reaches _MEMO_LIMIT entries.  (Values are compared by ``==``, as the
# dataclasses compare them; the protocol passes bools for bool fields and ints for int fields.)
_MEMO_LIMIT = 1 << 17
_RANK_MEMO: dict[tuple, "Rank"] = {}
_STORE_MEMO: dict[tuple, "Store"] = {}


def _derive(memo: dict, obj, changes: dict):
    key = (obj, *changes.items())
    try:
        new = memo.get(key)
    except TypeError:  # an unhashable value: no memo
        return replace(obj, **changes)
    if new is None:
        if len(memo) >= _MEMO_LIMIT:
            memo.clear()
        new = memo[key] = replace(obj, **changes)
    return new


@_hashed
@dataclass(frozen=True, slots=True)
class Rank(_CachedHash):
    """One rank's abstract state.

    ``frontier``/``tau`` stand for S_app (weights, moments, RNG and data cursor are
    unchanged by recovery, so F and tau are enough to state "preserved");
    ``comm``/``refs`` stand for S_runtime: the generation of the communicator the rank
    holds for R, and the generation each modelled cached reference names.
    """

    pc: str = PC_TRAIN
    gen: int = 0
    frontier: int = 0        # F this rank reports at the control barrier
    tau: int = 0             # optimizer step counter
    point: str = ""          # failure phase recorded by the guard when the failure was observed
    #: history, kept with the process: the point where it observed its episode's failure (RankObserve),
    #: which RankDiscardStep does not rewrite (``point`` becomes ``boundary``); RankResume records it
    #: in ``State.resumed`` (what S3 judges); "" for a spare, which observed nothing
    seen: str = ""
    comm: int = 0            # generation of the communicator held for R (members of R)
    refs: tuple[int, ...] = ()
    dirty: bool = False      # guard will fail (outstanding grads / wrapper busy)
    hung: bool = False       # main thread stopped; the watchdog thread still runs
    delayed: bool = False    # slow: peers' deadlines may expire before it arrives
    drop: bool = False       # its next control-plane write will be lost
    lost: bool = False       # one of its writes was lost
    raised: bool = False     # an exception is propagating inside a recovery phase
    corrupt: bool = False    # S_app differs from its replicas' (a flipped bit after the commit)
    reason: str = ""         # exit reason once exited
    replayed: int = 0        # steps replayed after the last resume (L1: 0, L2: F - C)
    # The uncommitted step (S_app beyond F): set when a failure is observed in flight, cleared by a discard.
    grads: bool = False      # outstanding gradients; the wrapper is mid forward/backward (runtime state not idle)
    ahead: int = 0           # RNG and data cursor: steps consumed past the committed frontier (1 inside a step)
    #: the generation in which the control plane's groups over all of W that the rank holds were built
    #: (control, checkpoint, default, world; P18.3): RankReplace rebuilds them (``wide := g+1``) only where
    #: their failure was learned (``Store.wide_revoked``), a rank died in the episode, or its step was discarded
    wide: int = 0
    # Hot swap (issue 13): the process that holds this rank's identity.
    inc: int = 0             # incarnation: 0 the original process, +1 for each spare that took the identity
    shard: int = SHARD_OWN   # whose parameter/optimizer shard it holds: SHARD_OWN, or the replicate group it received
    _h: int = field(default=0, init=False, repr=False, compare=False)  # cached hash (_CachedHash)
    __hash__ = _CachedHash.__hash__


@_hashed
@dataclass(frozen=True, slots=True)
class Store(_CachedHash):
    """The control-plane store (a c10d TCPStore in the implementation).

    Every entry carries the generation it was written in.  Decisions are single-assignment
    per generation (``compare_set`` on an empty key), which is what makes them agreed.
    """

    failed: tuple[int, str, frozenset[int]] | None = None   # (gen, point, groups): these groups' communicators broke
    #: gens in which a group of R's kind was revoked: a member's revoke(R, g) (P1.2), or the step revoke of a
    #: rank that abandoned its step in flight (P17.1).  Not the wide revoke (``wide_revoked``)
    revoked: frozenset[int] = frozenset()
    arrivals: frozenset[tuple[int, int, int, int]] = frozenset()   # (gen, rank, F, g reported)
    last_arriver: tuple[tuple[int, int], ...] = ()          # (gen, rank) whose add() completed the count
    agree: tuple[tuple[int, str], ...] = ()                 # (gen, "commit" | "abort:<reason>")
    ready: frozenset[tuple[int, int]] = frozenset()         # (gen, rank) release votes
    last_ready: tuple[tuple[int, int], ...] = ()
    release: tuple[tuple[int, str], ...] = ()               # (gen, "release" | "abort:<reason>")
    abort: str = ""                                         # job-wide abort key: watchdogs exit on it
    down: bool = False                                      # the store server is gone: every operation fails
    # Hot swap (issue 13); empty / 0 without spares.
    dead: frozenset[tuple[int, int]] = frozenset()          # (gen, rank): its heartbeat stopped: it died in training (crash episode)
    claims: frozenset[tuple[int, int, int]] = frozenset()   # (gen, rank, inc): g{g}/spare/{rank} = inc, single assignment
    spares: int = 0                                         # spares idle on the control plane, not claimed yet
    #: gens in which a physical link failed (``FaultLinkCut``): the groups over all of W (control,
    #: checkpoint, default, world) cross every link, so every such group built in that generation or
    #: before failed with it (P18.2), and stays broken, latent, on a rank until it is rebuilt; never
    #: cleared (a fact of the run's history as much as of the store: what S16 judges)
    wide: frozenset[int] = frozenset()
    #: gens whose *wide revoke* was published (``g{g}/revoke/wide``, P18.4; ``RankRevokeWide``): a rank's
    #: failure flag or checkpoint save failed under it, so a group over all of W failed.  Every rank reads
    #: it after the agreement, so all decide alike whether phase 4 rebuilds the groups over W (P18.3);
    #: never cleared (what S15 judges)
    wide_revoked: frozenset[int] = frozenset()
    #: the replicas out of the data-parallel dimension (issue 41, P19): written by ``RankShrink`` (the
    #: dead rank's replica leaves), removed by ``RankStartGrow`` (it comes back); their ranks' identities
    #: are vacant meanwhile
    out: frozenset[int] = frozenset()
    #: (gen, replica) of each replica that left in generation gen (``g{gen}/out/{replica}``, ``RankShrink``)
    #: and of each that came back (``g{gen}/grow/{replica}``, ``RankStartGrow``); never cleared: a woken
    #: deposed process reads them (its identity's replica left after it was deposed), and the job's
    #: replicas in a generation are every replica less those shrunk and not grown since (S12, S17)
    shrunk: frozenset[tuple[int, int]] = frozenset()
    grown: frozenset[tuple[int, int]] = frozenset()
    _h: int = field(default=0, init=False, repr=False, compare=False)  # cached hash (_CachedHash)
    __hash__ = _CachedHash.__hash__


@_hashed
@dataclass(frozen=True, slots=True)
class State(_CachedHash):
    ranks: tuple[Rank, ...]
    store: Store = Store()
    faults: int = 0                  # faults injected so far (the budget is Config.max_faults)
    supervisor: str = ""             # "" | "restarted"
    # History variables (not implementation state; they let invariants be state predicates).
    #: (gen, rank, point, dirty) of each RankResume: the point where the rank observed the failure
    #: (``Rank.seen``; a spare's, which observed nothing: its transfer's, the committed boundary) and
    #: whether its guard had failed (what S3 judges)
    resumed: frozenset[tuple[int, int, str, bool]] = frozenset()
    agreed: frozenset[tuple[int, int, int]] = frozenset()          # (gen, rank, F reported) of each pass of phase 3
    #: (gen, rank, reason, released) of each fail-stop exit: ``released`` when the release of ``gen``
    #: had been decided before the rank exited (a failure of the next generation, not of ``gen``)
    exits: frozenset[tuple[int, int, str, bool]] = frozenset()
    #: (gen, group, digests equal) of each validation collective that completed: a failed group's
    #: collective on its new communicator completes for every member at once, and gathers the digests
    #: the members hold at that moment; each member then compares them on its own, even if a peer
    #: exited since (an exited rank holds nothing: the digests it published are here)
    validated: frozenset[tuple[int, int, bool]] = frozenset()
    #: history: (gen, group) of each group whose communicator failed in generation gen (FaultGroupFail,
    #: and FaultCrash in training for the dead rank's group): ``Store.failed`` holds only the latest
    #: episode's, overwritten by the next (what S5 judges)
    failures: frozenset[tuple[int, int]] = frozenset()
    #: generations in which a member of a failed group saw the episode's collective fail where the
    #: failure struck (its point was ``Store.failed``'s) and then exited: the witness of a partial
    #: collective that its peers' ``RankObserve`` still asks for, kept after the process is gone
    witnessed: frozenset[int] = frozenset()
    # Hot swap (issue 13); all empty without spares.
    #: processes that held a rank's identity before a spare took it (gen, rank, inc, stage): stopped (a
    #: SIGSTOP or SIGKILL: the failure detector cannot tell) when deposed (``DEPOSED_STOPPED``); one that
    #: was only stopped may wake (``RankFenced(rank, wake)``: ``DEPOSED_AWAKE``), and its first store
    #: operation (``RankFenced(rank)``) reads its identity's incarnation: a later one, and it exits (the
    #: entry goes); otherwise it goes on acting as the rank (``DEPOSED_ACTING``: never in the spec, what S10 judges)
    deposed: frozenset[tuple[int, int, int, str]] = frozenset()
    #: history: (gen, rank) of each RankDiscardStep (what S11 judges)
    discarded: frozenset[tuple[int, int]] = frozenset()
    #: history: (gen, rank, from_replica) of each RankTransferState into rank's spare: whether the sender
    #: was a replica of the dead rank (a member of its replicate group; what S12 judges)
    transfers: frozenset[tuple[int, int, bool]] = frozenset()
    #: history: (gen, rank, shard, tau, ahead, grads, corrupt) of a spare's S_app when it resumed (L1)
    #: from the generation in which it took the identity (what S9 judges)
    swapped: frozenset[tuple[int, int, int, int, int, bool, bool]] = frozenset()
    #: history: (gen, rank, inc) of each SpareJoin: a spare took rank's identity at incarnation inc in
    #: generation gen (with ``Store.claims``, ``Store.spares`` and each seat's ``Rank.inc``: what S13 judges)
    joins: frozenset[tuple[int, int, int]] = frozenset()
    # Shrink, grow and refill (issue 41); all empty without them.
    #: history: (gen, rank, micro-batches) of each RankResume in a job that shrinks: the micro-batches of
    #: every later step that the rank's replica processes (``model/batches.share``; what S17 judges)
    shares: frozenset[tuple[int, int, tuple[int, ...]]] = frozenset()
    #: history: what entered the spare pool besides the job's spares: ("leave", gen, rank) for each
    #: survivor of a leaving replica (``RankLeave``), ("refill", gen, rank) for each fresh spare a keeper
    #: started for a dead process (``KeeperRefill``; with ``Store.claims`` and ``Store.spares``: S13)
    pooled: frozenset[tuple[str, int, int]] = frozenset()
    _h: int = field(default=0, init=False, repr=False, compare=False)  # cached hash (_CachedHash)
    _rh: int = field(default=0, init=False, repr=False, compare=False)  # cached hash of the ranks

    def _ranks_hash(self) -> int:
        """A hash of the ranks that :meth:`with_rank` updates in O(1): the sum of one term per
        position (a 1,024-rank state is then hashed without touching its 1,024 ranks)."""
        rh = self._rh
        if not rh:
            rh = sum([hash((i, rk._h or hash(rk))) for i, rk in enumerate(self.ranks)]) & _MASK or 1
            object.__setattr__(self, "_rh", rh)
        return rh

    def __hash__(self) -> int:
        h = self._h
        if not h:
            rh = self._ranks_hash()
            h = hash((rh, _STATE_REST(self))) or 1
            object.__setattr__(self, "_h", h)
        return h

    def rank(self, r: int) -> Rank:
        return self.ranks[r]

    def with_rank(self, r: int, **changes) -> "State":
        ranks = list(self.ranks)
        old, ranks[r] = ranks[r], _derive(_RANK_MEMO, ranks[r], changes)
        t = _copy_ranks(self, tuple(ranks))
        new = ranks[r]
        rh = (self._ranks_hash() - hash((r, old._h or hash(old))) + hash((r, new._h or hash(new)))) & _MASK or 1
        object.__setattr__(t, "_rh", rh)
        return t

    def with_store(self, **changes) -> "State":
        t = _copy_store(self, _derive(_STORE_MEMO, self.store, changes))
        object.__setattr__(t, "_rh", self._rh)  # the ranks are the same
        return t

    def with_(self, **changes) -> "State":
        """``dataclasses.replace(self, **changes)``, several times faster (the search derives
        millions of states with one history set or the fault count changed): a copier written
        out for each set of changed fields, and the ranks' hash kept when the ranks are kept."""
        names = tuple(changes)
        copy = _COPIERS.get(names)
        if copy is None:
            bad = [n for n in names if n not in _INIT_FIELDS]
            if bad:
                raise TypeError(f"State.with_: {bad} are not fields of State (fields: {sorted(_INIT_FIELDS)})")
            copy = _COPIERS[names] = _copier(State, *names)
        t = copy(self, *changes.values())
        if "ranks" not in changes:
            object.__setattr__(t, "_rh", self._rh)
        return t


#: the compared fields of State other than ``ranks`` (hashed with the ranks' incremental hash)
_STATE_REST = attrgetter(*(f.name for f in fields(State) if f.compare and f.name != "ranks"))


def _copier(cls: type, *names: str):
    """``lambda s, *v: replace(s, **dict(zip(names, v)))`` for a frozen slotted dataclass without
    ``__post_init__``, written out field by field (the search derives millions of states, one
    changed field each; ``replace`` costs several times more).  Fields outside ``__init__``
    (caches) start at 0."""
    lines = [f"def copy(s, {', '.join(f'v{k}' for k in range(len(names)))}):", "    t = new(cls)"]
    for f in fields(cls):
        value = f"v{names.index(f.name)}" if f.name in names else (f"s.{f.name}" if f.init else "0")
        lines.append(f"    put(t, {f.name!r}, {value})")
    lines.append("    return t")
    scope = {"new": object.__new__, "put": object.__setattr__, "cls": cls}
    exec("\n".join(lines), scope)  # generated from the dataclass's own field names
    return scope["copy"]


assert not hasattr(State, "__post_init__")
_copy_ranks = _copier(State, "ranks")
_copy_store = _copier(State, "store")
#: State.with_'s copiers, one per tuple of changed field names (a handful in the whole protocol)
_COPIERS: dict[tuple[str, ...], Callable[..., State]] = {}
_INIT_FIELDS = frozenset(f.name for f in fields(State) if f.init)


def initial_state(config: Config) -> State:
    """Every rank training at generation 0, committed at F, holding its group's generation-0 communicator."""
    ranks = tuple(Rank(frontier=config.frontier, tau=config.frontier, comm=0, refs=(0,) * config.refs) for r in config.world)
    if config.spares:
        return State(ranks=ranks, store=Store(spares=config.spares))
    return State(ranks=ranks)
