"""The control plane: generation-namespaced keys and decided barriers over a c10d TCPStore.

One method per model action that touches the store (``Store`` in ``model/state.py``).
Decisions are single-assignment: ``compare_set(key, "", value)`` creates the key only
if it is missing, and the value it returns is the decision that stands.  That is what
makes a decision agreed even when a late rank arrives after the others timed out
(``store.barrier`` can split; it is never used here).

Store facts this relies on (spec/torch-facts.md):
* ``compare_set`` on a missing key with a non-empty ``expected`` returns ``expected``
  without creating it: we always pass ``expected=""``.
* ``set`` is not acknowledged; a ``set`` followed by a round-trip op (``add``) on the same
  connection is ordered, so ``arrive`` writes the frontier with ``set`` then ``add``.
* every wait is bounded: ``store.wait(keys, timedelta)`` raises ``DistStoreError`` on expiry.
* a ``store.wait`` that expires makes torch's TCPStore client log two ``[c10d] ... waitForInput ...
  likely a timeout`` warnings on stderr (``socket.cpp``; no Python switch turns them off for one call).
  A watcher that waits for the whole job (the watchdog's abort and revoke watchers) therefore waits in
  slices of :data:`KEY_WAIT_S` on keys that are always set when the wait must end (an abort, ``closed``
  at the job's end, a revoke, ``retired`` at its generation's release or retire): a fault-free run's
  log stays quiet (issue 44).
"""

from __future__ import annotations

import copy
import datetime
import time

from .exitcodes import claim_exit, release_exit
from accelpact.model.state import (DECISION_COMMIT, DECISION_RELEASE, PC_ARRIVED, PC_GUARDED, PC_OBSERVED, PC_TRAIN,
                                   REASON_DEADLINE, REASON_MISMATCH)

__all__ = ["ABORT_KEY", "CLOSED", "DEATHS_KEY", "KEY_WAIT_S", "RETIRED", "STEP_REVOKE", "WIDE_ENTRY", "NEXT_KEY", "PREFIX", "REFILL_IDS_KEY", "REFILLS_KEY", "ControlPlane", "ControlPlaneError", "assign_key", "claim_key",
           "claimers_key", "comm_generation", "wide_prefix", "comm_name", "death_key", "heartbeat_key", "parse_assignment", "progress_key", "spare_gone_key", "spare_node_key", "state_key",
           "swap_prefix", "swap_rebuilt_key", "taken_key"]

# ---------------------------------------------------------------------------------- store keys
#: The one home of the job's store keys: every ``accelpact/...`` key is spelled here and
#: nowhere else (``tests/test_hygiene.py``).  All are under the attempt's namespace
#: (``attempt{TORCHELASTIC_RESTART_COUNT}/``, a PrefixStore); the per-generation ones of the protocol
#: are :class:`ControlPlane`'s (``{prefix}g{g}/...``, spec/implementation.md).
#: The job prefix: the default of every ``prefix=`` (ControlPlane, the replacement strategies, the detector).
PREFIX = "accelpact/"
#: The job-wide abort key (:attr:`ControlPlane.abort_key` with the default prefix).
ABORT_KEY = f"{PREFIX}abort"
#: the starts of one launcher RANK, outside every attempt's namespace (impl/launch/attempts.py)
STARTS_KEY = f"{PREFIX}starts/{{rank}}"
#: hot swap (spec/hotswap.md): the count of death notices posted (``add``); notice n is at :func:`death_key`
DEATHS_KEY = f"{PREFIX}swap/deaths"
#: hot swap: a bound on the spare indices taken (``add``): every spare a claim took (:func:`taken_key`)
#: has an index below it (a claim takes the spare of the dead rank's node first, not the lowest index)
NEXT_KEY = f"{PREFIX}swap/next"
#: hot swap, refill (spec/hotswap.md): the count of spare indices keepers allocated after launch
#: (``add``): the n-th refill is spare ``ACCELPACT_SPARES + n - 1``
REFILL_IDS_KEY = f"{PREFIX}swap/refill-ids"
#: hot swap, refill: the count of those refills that entered the pool (``add``, once per refill: when
#: the new spare is ready to take an identity, or when it died before); the pool holds spares
#: ``0 .. ACCELPACT_SPARES + refills - 1``
REFILLS_KEY = f"{PREFIX}swap/refills"

#: The slice of a watcher's store wait that ends by a key being set (module doc): the abort key
#: (an abort, or :data:`CLOSED` at the job's end) and a generation's revoke log (a revoke, or
#: :data:`RETIRED` at its release, at a retired engine's wake and at the job's end).  Bounded, and long
#: enough that a fault-free run's waits never expire (each expiry logs torch's ``waitForInput`` warning).
KEY_WAIT_S = 3600.0

# ---------------------------------------------------------------------------------- store values
#: The abort key's value when the job ended normally (:meth:`accelpact.impl.watchdog.Watchdog.wake_and_join`): not an abort.
CLOSED = "closed"

#: Suffix of a revoke's value that says the revoke abandons the step in flight (P17): the
#: watcher then closes every training group of its rank, not only R (``accelpact.impl.watchdog.Watchdog.step_records``).
STEP_REVOKE = "/step"

#: The revoke-log entry that says a group over all of W failed under a rank at the boundary
#: (P18.4; :meth:`ControlPlane.publish_wide_revoke`): every watcher closes the rank's groups over W
#: (``accelpact.impl.watchdog.Watchdog.wide_records``: the control and checkpoint groups), so a peer blocked in the failure flag
#: or a checkpoint save wakes up.  R is not closed: it did not fail.
WIDE_ENTRY = "wide"

#: Value a rank writes into its group's revoke key of generation g after releasing g, so that
#: a watcher still waiting on it wakes and re-arms on g+1 at once.  Never a revoke.
RETIRED = "retired"


def death_key(n: int) -> str:
    """Hot swap: the key of death notice ``n`` (1-based); its value is the dead rank, as a decimal string."""
    return f"{PREFIX}swap/death/{n}"


def assign_key(k: int) -> str:
    """Hot swap: what spare ``k`` waits for (``{dead}:{g}:{point}``, :func:`parse_assignment`)."""
    return f"{PREFIX}swap/assign/{k}"


def parse_assignment(value: str) -> tuple[int, int, str]:
    """:func:`assign_key`'s value: (the dead identity, the claim's generation, the point it died at)."""
    dead, g, point = value.split(":", 2)
    return int(dead), int(g), point


def depose_key(rank: int, since: int = 0) -> str:
    """Hot swap: set by a survivor whose failure detector declared ``rank`` dead or hung while the
    job has spares; the keeper of the process that holds ``rank``'s identity then kills its worker,
    whose death is an ordinary one (a notice, a swap).  Its value is the declaring rank.  One key per
    holder: ``since`` is the generation from which that process holds the identity (0: the rank's
    own worker; ``g + 1``: a spare a claim of generation ``g`` assigned it), so a request to depose a
    former holder never reaches the spare in its place, and a later holder can be deposed in turn."""
    return f"{PREFIX}swap/depose/{rank}/{since}"


def spare_gone_key(k: int) -> str:
    """Hot swap: set by spare ``k``'s keeper when the spare died idle (no claim takes it)."""
    return f"{PREFIX}swap/spare-gone/{k}"


def taken_key(k: int) -> str:
    """Hot swap: set (single assignment) by the claim that took spare ``k`` from the pool (``{g}:{dead}``)."""
    return f"{PREFIX}swap/taken/{k}"


def spare_node_key(k: int) -> str:
    """Hot swap: the node of spare ``k`` started by a keeper's refill (a launch-time spare's node is its index's)."""
    return f"{PREFIX}swap/spare-node/{k}"


def claim_key(g: int, dead: int) -> str:
    """Hot swap: the claim for ``dead`` in generation ``g`` (a spare's index, or ``none``)."""
    return f"{PREFIX}g{g}/spare/{dead}"


def claimers_key(g: int, dead: int) -> str:
    """Hot swap: the count of ranks that would claim a spare for ``dead`` in generation ``g`` (``add``)."""
    return f"{PREFIX}g{g}/claimers/{dead}"


def state_key(rank: int) -> str:
    """Hot swap: ``rank``'s F, RNG and extra state at its last commit."""
    return f"{PREFIX}swap/state/r{rank}"


def swap_prefix(g_next: int) -> str:
    """Hot swap: the store prefix of every group rebuilt in ``g_next`` (``{PREFIX}g{g_next}/swap/``)."""
    return f"{PREFIX}g{g_next}/swap/"


def wide_prefix(g_next: int) -> str:
    """The store prefix of the groups over all of W rebuilt in ``g_next`` by every episode (P18.3):
    ``{PREFIX}g{g_next}/wide/``."""
    return f"{PREFIX}g{g_next}/wide/"


def swap_rebuilt_key(g: int) -> str:
    """Hot swap: the barrier of the ranks that rebuilt their model in generation ``g``."""
    return f"{PREFIX}g{g}/swap-rebuilt"


def progress_key(attempt: int, rank: int) -> str:
    """The committed frontier ``rank`` publishes in ``attempt`` (the launcher's live progress)."""
    return f"{PREFIX}progress/a{attempt}/r{rank}"


def heartbeat_key(rank: int, attempt: int = 0, prefix: str = PREFIX, epoch: int = 0) -> str:
    """The store key of ``rank``'s heartbeat in ``attempt``: ``{prefix}hb/a{attempt}/{rank}``; a
    detector of a later ``epoch`` (an engine of generation g > 0 built after a hot swap or a discard
    in place) publishes and reads ``{prefix}hb/a{attempt}/e{epoch}/{rank}``: a peer that has not built
    its engine of that generation yet has *no* heartbeat there (the startup grace), rather than the
    last one of its previous engine, stale since that engine stopped."""
    return f"{prefix}hb/a{attempt}/{rank}" if not epoch else f"{prefix}hb/a{attempt}/e{epoch}/{rank}"


def comm_name(prefix: str, g: int, group: str) -> str:
    """The name (c10d group name and store prefix) of R's generation-``g`` replacement communicator:
    ``{prefix}g{g}/pg/{group}``.  Traces record it (``RankReplace``'s ``comm``), so a record names
    the real group object, and :func:`comm_generation` reads the generation back."""
    return f"{prefix}g{g}/pg/{group}"


def comm_generation(name: str) -> int | None:
    """The generation in a communicator name written by :func:`comm_name`, or in the namespace of a
    hot swap's groups (:func:`swap_prefix`); 0 for any other name (the job's original group); None
    when ``name`` is not a group name at all (not a string)."""
    if not isinstance(name, str) or not name:
        return None
    head, sep, _ = name.rpartition("/pg/")
    if not sep and name.endswith("/swap/"):
        head, sep = name[: -len("/swap/")], "/swap/"
    if not sep:
        return 0
    gen = head.rsplit("/", 1)[-1]
    return int(gen[1:]) if gen[:1] == "g" and gen[1:].isdigit() else None


class ControlPlaneError(RuntimeError):
    """A control-plane value is malformed (e.g. a frontier that is not ``"F,g"``)."""


def _s(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


class ControlPlane:
    """Per-rank view of the job's control plane.

    ``prefix`` is the job prefix (a torchrun attempt gets its own).  Keys are
    ``{prefix}abort`` and ``{prefix}g{g}/...`` (see spec/implementation.md).
    """

    def __init__(self, store, rank: int, world_size: int, prefix: str = PREFIX, *, claims_exit: bool = False) -> None:
        self.store = store
        # The engine's control plane (claims_exit=True; Pact sets it): the first rank whose wait on a decision
        # expires claims the process's exit before writing abort:deadline, and keeps the claim
        # if that decision stands, so that its RankTimeout is recorded before any peer's reaction
        # to the decision can reach its watchdog (see exitcodes.holding_exit).
        self.claims_exit = claims_exit
        self.rank = rank
        self.world_size = world_size
        #: the ranks an episode's barriers count (ascending): every rank of W, unless the job shrank
        #: (``accelpact.impl.shrink.ActiveControlPlane``); the agreement's reference is the first one's F
        self.members: tuple[int, ...] = tuple(range(world_size))
        self.prefix = prefix
        self.last_expired = False  # set by the last await_*: True if its deadline expired

    # ---- keys -----------------------------------------------------------------------
    def key(self, g: int, name: str) -> str:
        """``{prefix}g{g}/{name}``: every key of a generation's episode is fenced by it."""
        return f"{self.prefix}g{g}/{name}"

    @property
    def abort_key(self) -> str:
        return f"{self.prefix}abort"

    def revoke_key(self, g: int, group: str) -> str:
        return self.key(g, f"revoke/{group}")

    # ---- primitives -------------------------------------------------------------------
    def _decide(self, key: str, value: str) -> str:
        """Single assignment: write ``value`` if ``key`` is empty; return the value that stands."""
        return _s(self.store.compare_set(key, "", value))

    def _await(self, g: int, which: str, deadline: float, on_expiry: str) -> str:
        """Wait for a decision key until ``deadline`` (monotonic seconds; :meth:`decided_by`).  On
        expiry try to decide ``on_expiry`` ourselves; either way return the decision that stands."""
        key = self.key(g, which)
        self.last_expired = False
        if self.decided_by(g, which, deadline):  # a lost store raises here
            return _s(self.store.get(key))
        # Several ranks' deadlines can expire together: only the first to expire on this key
        # is the RankTimeout (the model's single step that writes the abort); the others read
        # the decision that stands and exit on it (RankExit).
        # The claim comes before the count: once the count makes us first, a peer may write
        # the same abort:deadline and the job abort at once, and our watchdog must not end
        # us (RankExit) before we record the RankTimeout that the model gives to the first.
        held = self.claims_exit
        if held:
            claim_exit()
        try:
            first = self.first_expirer(g, which)
            dec = self._decide(key, on_expiry)
        except BaseException:
            if held:
                release_exit()
            raise
        self.last_expired = first and dec == on_expiry
        if held and not self.last_expired:
            release_exit()  # not the first, or a decision already stood: not ours to time out on
        return dec

    # ---- Store.abort -------------------------------------------------------------------
    def abort(self, reason: str) -> str:
        """Job-wide abort, first writer wins; returns the winning reason (read back)."""
        return self._decide(self.abort_key, reason)

    def wait_abort(self, timeout_s: float) -> str:
        """The job's abort reason once one stands, waiting at most ``timeout_s``; "" if none came."""
        import torch.distributed as dist

        try:
            self.store.wait([self.abort_key], datetime.timedelta(seconds=max(timeout_s, 0.001)))
        except dist.DistStoreError:
            return ""
        return _s(self.store.get(self.abort_key))

    def reachable(self) -> bool:
        """Whether the store still answers (one round trip); False once its server is gone."""
        try:
            self.store.check([self.abort_key])
        except Exception:  # noqa: BLE001 - any failure to reach the store is its loss (DistNetworkError, reset, ...)
            return False
        return True

    def read_abort(self) -> str:
        """The job's abort reason, or "" (no wait)."""
        if self.store.check([self.abort_key]):
            return _s(self.store.get(self.abort_key))
        return ""

    @staticmethod
    def decision_for(pc: str) -> str:
        """Which decision a rank in ``pc`` is before: ``agree`` up to phase 3, ``release`` after
        (model ``_decision_key``)."""
        return "agree" if pc in (PC_TRAIN, PC_OBSERVED, PC_GUARDED, PC_ARRIVED) else "release"

    def on_store(self, store) -> "ControlPlane":
        """The same control plane over another store connection (one per thread: a thread that
        waits must not share a TCPStore client with the main thread)."""
        other = copy.copy(self)
        other.store = store
        return other

    def first_expirer(self, g: int, which: str) -> bool:
        """Count one expiry on ``which`` of g; True for the first.  Among the ranks whose wait or
        step deadline expires on one decision only the first writes the timeout."""
        return int(self.store.add(self.key(g, which) + "/expired", 1)) == 1

    def write_abort_decision(self, g: int, which: str, reason: str) -> str:
        """Model ``_write_abort_decision``: ``abort:<reason>`` into ``agree`` or ``release`` of g."""
        if which not in ("agree", "release"):
            raise ValueError(f"write_abort_decision: which must be 'agree' or 'release', got {which!r}")
        return self._decide(self.key(g, which), f"abort:{reason}")

    # ---- phase 1 -------------------------------------------------------------------------
    def publish_revoke(self, g: int, group: str, *, step: bool = False) -> bool:
        """RankObserve (members of R): mark R revoked in g (single assignment on ``g{g}/revoke/{group}``)
        and, if this call wrote it, append ``{group}`` to generation g's revoke log (:meth:`revlog_key`),
        which every rank's watcher reads in order; True if this call wrote it.  ``step``: the revoke
        abandons the step in flight (P17, suffix :data:`STEP_REVOKE`): every watcher closes every
        group of its rank, not only R."""
        suffix = STEP_REVOKE if step else ""
        value = f"{self.rank}{suffix}"
        wrote = self._decide(self.revoke_key(g, group), value) == value
        if wrote:
            self._log_revoke(g, f"{group}{suffix}")
        return wrote

    def publish_wide_revoke(self, g: int) -> bool:
        """A rank's failure flag (or a checkpoint save) failed at the boundary: a group over all of W
        failed under it (P18.4).  Single assignment on ``g{g}/revoke/wide``; the first writer appends
        ``wide`` to g's revoke log, on which every rank's watcher closes its groups over W (the control
        and checkpoint groups), so a peer blocked in the flag or the save wakes up.  True if this call
        wrote it."""
        wrote = self._decide(self.revoke_key(g, WIDE_ENTRY), str(self.rank)) == str(self.rank)
        if wrote:
            self._log_revoke(g, WIDE_ENTRY)
        return wrote

    def revlog_key(self, g: int, n: int) -> str:
        """The ``n``-th entry (from 1) of generation g's revoke log: what a watcher waits for next."""
        return self.key(g, f"revlog/{n}")

    def _log_revoke(self, g: int, entry: str) -> None:
        n = int(self.store.add(self.key(g, "revlog"), 1))
        self.store.set(self.revlog_key(g, n), entry)

    def retire_revoke(self, g: int, group: str) -> None:
        """After the release of g: no revoke of g matters any more.  ``g{g}/revoke/{group}`` is set to
        ``retired`` (single assignment: a real revoke that stands is left as it is) and ``retired`` is
        appended to g's revoke log, so a watcher still reading it moves on to g+1 at once."""
        self._decide(self.revoke_key(g, group), RETIRED)
        self._log_revoke(g, RETIRED)

    def revoked_by(self, g: int, group: str) -> int | None:
        """The rank whose ``RankObserve`` revoked ``group`` in g (the single assignment of
        :meth:`publish_revoke`), or None: not revoked (or retired)."""
        key = self.revoke_key(g, group)
        if not self.store.check([key]):
            return None
        head = bytes(self.store.get(key)).decode(errors="replace").partition("/")[0]
        return int(head) if head.isdigit() else None

    def revoked(self, g: int, group: str) -> bool:
        return bool(self.store.check([self.revoke_key(g, group)]))

    # ---- phase 3 -------------------------------------------------------------------------
    def arrive(self, g: int, frontier: int, reported_gen: int | None = None) -> tuple[int, bool]:
        """RankArrive: post ``"F,g"`` then count; the add that returns the members' count (|W|) is the
        last arriver."""
        gen = g if reported_gen is None else reported_gen
        self.store.set(self.key(g, f"frontier/{self.rank}"), f"{frontier},{gen}")
        count = int(self.store.add(self.key(g, "arrive"), 1))
        return count, count == len(self.members)

    def frontiers(self, g: int) -> dict[int, tuple[int, int]]:
        keys = [self.key(g, f"frontier/{r}") for r in self.members]
        out: dict[int, tuple[int, int]] = {}
        for r, raw in zip(self.members, self.store.multi_get(keys), strict=True):
            text = _s(raw)
            try:
                f, gg = text.split(",")
                out[r] = (int(f), int(gg))
            except ValueError:
                raise ControlPlaneError(f"frontier of rank {r} in g{g} is {text!r}; expected 'F,g'") from None
        return out

    @staticmethod
    def agrees(row: tuple[int, int], ref: tuple[int, int], g: int) -> bool:
        """Whether a rank's report ``(F, g')`` agrees with rank 0's ``ref``: the same F, in generation g."""
        return row == (ref[0], g)

    def decide_agreement(self, g: int) -> str:
        """RankDecideAgreement (last arriver): commit if the frontiers agree, else
        ``abort:mismatch``.  Returns the decision that stands (an expirer's ``abort:deadline``
        may have been written first).  On an abort the caller records the action, then writes
        the job abort (model ``_st_decide_agreement`` does both), holding its exit claim from
        before this write (``exitcodes.holding_exit``): every peer sees the decision at once."""
        rows = self.frontiers(g)
        ref = rows.get(self.members[0])
        ok = ref is not None and all(self.agrees(v, ref, g) for v in rows.values())
        value = DECISION_COMMIT if ok else f"abort:{REASON_MISMATCH}"
        return self._decide(self.key(g, "agree"), value)

    def arrived(self, g: int) -> set[int]:
        """The ranks whose (F, g) report stands in generation ``g`` (they made their RankArrive)."""
        return {r for r in self.members if self.store.check([self.key(g, f"frontier/{r}")])}

    def decided_by(self, g: int, which: str, deadline: float) -> bool:
        """Whether generation ``g``'s ``which`` decision ("agree", "release") stands by ``deadline``
        (monotonic seconds).  Unlike :meth:`await_agreement` it decides nothing on expiry."""
        import torch.distributed as dist

        try:
            self.store.wait([self.key(g, which)], datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except dist.DistStoreError:  # expiry; anything else is a lost store and propagates
            return False
        return True

    def await_agreement(self, g: int, deadline: float) -> str:
        """RankAwaitAgreement: the agreed decision, or ``abort:deadline`` if none by ``deadline``."""
        return self._await(g, "agree", deadline, f"abort:{REASON_DEADLINE}")

    # ---- phase 6 release -------------------------------------------------------------------
    def ready(self, g: int) -> tuple[int, bool]:
        """RankReady: count a release vote; the add that returns the quorum (|W|) is the last voter."""
        count = int(self.store.add(self.key(g, "ready"), 1))
        return count, count == self.release_quorum()

    def release_quorum(self) -> int:
        """How many release votes decide: every member (every rank of W unless the job shrank)."""
        return len(self.members)

    def decide_release(self, g: int) -> str:
        """RankDecideRelease (last voter): ``release`` unless an abort already stands."""
        return self._decide(self.key(g, "release"), DECISION_RELEASE)

    def await_release(self, g: int, deadline: float) -> str:
        return self._await(g, "release", deadline, f"abort:{REASON_DEADLINE}")
