"""The recovery engine: ``attach`` -> ``Pact``; ``Pact.step()`` and ``Pact.boundary()``.

This module reads like ``model/protocol.py``: one block per model action, in the same
order, each writing one trace record named as the model names it, with the post-state in
model vocabulary (``pc``, ``gen``, ``frontier``, ``tau``, ``point``, ``comm``,
``refs_stale``, ``reason``).

Ordering requirements (the step loop, spec/implementation.md):

* ``with pact.step(step):`` wraps forward, backward and ``optimizer.step()``; an exception
  inside it is an in-flight failure: RankObserve, RankReject (the contract says L2) and a
  job-wide abort, so every rank exits 70 (the others through their watchdog).
* ``pact.boundary(loss)`` is called after the optimizer step committed and the grads were
  cleared, before the next forward.  It runs the post-commit collective on R, then the
  failure-flag all-reduce on the control group (all of W), and on a non-zero flag the six
  phases.  Every rank of W enters recovery together.
* Any exception or expired deadline in phases 2-6 writes the abort (the phase's decision
  key and the job key) and exits at once with the reason's code (RankFail / RankTimeout).

The failure flag has one element per group of R's kind (``PactGroups.count``; one for DDP),
so that every rank learns *which* replicate group failed: its members rebuild it,
everybody else only votes.

Seeded bugs (test-only, env ``ACCELPACT_SEEDED_BUG``, see :mod:`controlplane`):
``skip-rebind`` (phase 5 skips ``adapter.rebind`` and does not fail on stale references),
``early-release`` (the first release vote decides), ``no-fence`` (keys not namespaced by g).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from accelpact.model.contract import DEFAULT_OBJECTIVE, DEFAULT_PLATFORM, DEFAULT_PROFILE, ObservationKey, decide, default_envelope
from accelpact.model.state import (
    DECISION_COMMIT,
    DECISION_RELEASE,
    PC_AGREED,
    PC_ARRIVED,
    PC_EXITED,
    PC_GUARDED,
    PC_OBSERVED,
    PC_READY,
    PC_REBOUND,
    PC_REPLACED,
    PC_TRAIN,
    PC_VALIDATED,
    REASON_DEADLINE,
    REASON_EXCEPTION,
    REASON_MISMATCH,
    REASON_REJECTED,
)

from . import revoke as _revoke
from .controlplane import ControlPlane, seeded_bug
from .exitcodes import claim_exit, code_for, exit_now, holding_exit
from .faults import FaultContext, FaultPlan, InjectedFault
from .guard import BoundaryGuard
from .replace import ReplacementStrategy, choose_strategy
from .trace import NullTrace
from .watchdog import Watchdog

__all__ = ["attach", "Pact", "PactGroups", "RecoveryReport", "RebindError", "ValidationError"]


class RebindError(RuntimeError):
    """Phase 5: references to the old communicator remain after rebinding."""


class ValidationError(RuntimeError):
    """Phase 6: the validation collective or the replica digests disagree."""


class RevokedWhilePending(RuntimeError):
    """An op on R was still pending ``REVOKE_GRACE_S`` after R was revoked: the op is abandoned
    and the failure observed (phase 1), as if the op had raised."""


#: Grace between R's revoke (its sockets shut down by the watchdog) and giving up on an op on R
#: that is still pending.  Normally the op fails within milliseconds of the shutdown; in rare
#: runs on loaded CI machines a gloo op on a 4-rank group stayed blocked for its whole timeout.
REVOKE_GRACE_S = 1.0


def _reap(work, group) -> None:
    """Hold an abandoned op's group until the op ends (its own timeout at the latest): dropping
    the last reference to a gloo group joins its worker threads, which would block the caller."""
    try:
        work.wait()
    except Exception:  # noqa: BLE001 - the op failed, as expected of an abandoned op
        pass
    del group


@dataclass(frozen=True, slots=True)
class PactGroups:
    """The groups the engine works with on this rank.

    ``affected``: this rank's group of R's kind (its replicate group for HSDP, the whole
    world for DDP), ``members``: its global ranks in group-rank order, ``index``/``count``:
    which of the ``count`` groups of that kind it is.  ``control``: an out-of-band gloo group
    over all of W (never used by the wrapper).  ``record``: the socket record of ``affected``
    (from :func:`revoke.recorded`).  ``others``: name -> socket record of further groups
    (e.g. ``"shard"``), for fault injection.
    """

    control: Any
    affected: Any
    members: tuple[int, ...]
    record: _revoke.SocketRecord
    name: str = "replicate"
    index: int = 0
    count: int = 1
    others: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """The group's name in store keys: ``replicate1`` when there are several."""
        return self.name if self.count == 1 else f"{self.name}{self.index}"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """One repair.  Durations in ns; measured, never asserted."""

    generation: int            # the generation that was repaired (the pact now runs in generation + 1)
    member: bool               # this rank rebuilt R
    observe_ns: int            # boundary collective start -> failure observed (phase 1)
    agree_ns: int              # guard + contract + frontier agreement (phases 2-3)
    rebuild_ns: int            # phase 4
    rebind_ns: int             # phase 5
    validate_ns: int           # phase 6 validation
    release_ns: int            # release vote -> resume
    retire_ns: int             # dropping the old communicator
    total_ns: int              # observed -> resumed
    refs_rebound: int
    revoke_to_observe_ns: int  # this rank's revoke hard-close -> observed (-1: observed directly, before the revoke)


class _Exited(BaseException):
    """Never escapes: exit paths end the process."""


def _state_digest(module, optimizer) -> bytes:
    from .digest import state_digest

    return state_digest(module, optimizer)


#: Floor of the default step deadline: a step (forward, backward, optimizer, boundary) that makes
#: no progress for this long is taken to be hung (``RankExpire``).  Set ``step_deadline_s`` above
#: the longest legitimate step including its waits on slow peers (the collective timeout).
DEFAULT_STEP_DEADLINE_S = 600.0


def default_step_deadline(deadline_s: float) -> float:
    """Every phase wait (agreement, replacement, validation, release) can take ``deadline_s``;
    the step deadline must outlast them all and the step's own collectives."""
    return max(DEFAULT_STEP_DEADLINE_S, 6 * deadline_s)


class Pact:
    """The attached engine of one rank.  Create with :func:`attach`."""

    def __init__(self, module, optimizer, *, groups: PactGroups, control: ControlPlane, trace=None, envelope=None,
                 key: ObservationKey | None = None, deadline_s: float = 30.0, adapter=None,
                 fault_plan: FaultPlan | None = None, frontier: int = 0,
                 strategy: ReplacementStrategy | None = None, step_deadline_s: float = DEFAULT_STEP_DEADLINE_S) -> None:
        if control.rank not in groups.members:
            raise ValueError(f"attach: rank {control.rank} is not in its own group's members {groups.members}")
        self.module = module
        self.optimizer = optimizer
        self.groups = groups
        self.control = control
        self.rank = control.rank
        self.trace = trace if trace is not None else NullTrace()
        self.envelope = envelope if envelope is not None else default_envelope()
        self.key = key or ObservationKey(DEFAULT_PLATFORM, DEFAULT_PROFILE, "boundary", DEFAULT_OBJECTIVE)
        self.deadline_s = deadline_s
        self.step_deadline_s = step_deadline_s
        self.plan = fault_plan or FaultPlan()
        self.gen = 0
        self.pc = PC_TRAIN
        self.reports: list[RecoveryReport] = []
        self.last_loss = None
        self._step = frontier
        self._frontier_delta = 0
        self._failed_groups: tuple[int, ...] = ()
        self._pg = groups.affected
        self._record = groups.record
        # keep no second reference to R's communicator: after a repair the adapters' walker would
        # find it (the guard's hooks make the pact reachable from the module) and the old group
        # could never be freed
        groups = dataclasses.replace(groups, affected=None)
        self.groups = groups
        self._bug = seeded_bug()
        # Each control-plane write and its trace record form one model action (exitcodes.holding_exit).
        # Seeded bug "unheld-records" drops the hold; ACCELPACT_TEST_WRITE_TO_RECORD_S (test-only)
        # sleeps between each write and its record, which widens the window the hold closes.
        self._hold = holding_exit if self._bug != "unheld-records" else contextlib.nullcontext
        self.control.claims_exit = self._bug != "unheld-records"
        self._write_to_record_s = float(os.environ.get("ACCELPACT_TEST_WRITE_TO_RECORD_S", "0") or 0)
        if adapter is None:
            from .adapters import adapter_for

            adapter = adapter_for(module)
        self.adapter = adapter
        self.strategy = strategy or choose_strategy(self._pg, control.prefix)
        self.sites = adapter.discover(module, self._pg)  # once, at attach: rebinding reuses them
        self.guard = BoundaryGuard(module, optimizer, frontier=frontier, on_point=self._on_point)
        self.watchdog = Watchdog(control, trace=self.trace, gen_of=lambda: self.gen, pc_of=lambda: self.pc).start()
        self.watchdog.watch(self.gen, groups.key, self._record)
        self._closed = False

    # ---- helpers ----------------------------------------------------------------------------
    @property
    def process_group(self):
        """R's current communicator on this rank (changes at each repair)."""
        return self._pg

    def _st(self, pc: str, **more) -> dict:
        self.pc = pc
        return {"pc": pc, **more}

    def _act(self, action: str, state: dict, detail: dict | None = None, outcome: str = "ok", gen: int | None = None) -> None:
        self.trace.action(action, self.gen if gen is None else gen, outcome, state, detail)

    def _written(self, value=None):
        """Marks a control-plane write whose record follows; returns ``value``.  Test-only delay."""
        if self._write_to_record_s:
            time.sleep(self._write_to_record_s)
        return value

    def _on_point(self, point: str) -> None:
        self._inject(point)

    def _inject(self, point: str) -> dict:
        """Fire the faults planned for this rank at ``point``; returns their merged effects."""
        faults = self.plan.at(point, self._step, self.rank)
        effects: dict = {}
        if not faults:
            return effects
        groups = {self.groups.name: self._record, self.groups.key: self._record, **self.groups.others}
        state = {"pc": self.pc, "gen": self.gen, "frontier": self.guard.frontier + self._frontier_delta,
                 "tau": self.guard.tau + self._frontier_delta, "point": self.guard.point}
        for f in faults:
            ctx = FaultContext(self.trace, self.rank, self.gen, state, groups, self.guard, self.module)
            eff = self.plan.apply(f, ctx)
            self._frontier_delta += eff.get("frontier_delta", 0)
            effects.update(eff)
        return effects

    # ---- the step loop -----------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, step: int):
        """Wraps forward, backward and ``optimizer.step()``.  An exception inside is an
        in-flight failure: the contract rejects it and every rank exits 70.  Arms the
        watchdog's step deadline (``step_deadline_s``), which :meth:`boundary` disarms."""
        self._step = step
        self.watchdog.arm(self.step_deadline_s)
        try:
            yield self
        except Exception as exc:
            point = self.guard.point if self.guard.point != "boundary" else "forward"
            self._in_flight(point, exc)

    def _in_flight(self, point: str, exc: BaseException) -> None:
        g = self.gen
        # Held from the revoke to the exit: the guard check and the contract are local (no wait on
        # peers), and a peer's rejection must not end this rank between its RankObserve and the
        # RankReject it is about to record (the model allows both; the record then says which).
        with self._hold():
            try:
                self.control.publish_revoke(g, self.groups.key)  # peers blocked on R wake up
            except Exception:
                pass  # store lost: the watchdog exits DEADLINE
            self._act("RankObserve", self._st(PC_OBSERVED, point=point, frontier=self.guard.frontier, tau=self.guard.tau),
                      {"error": repr(exc)[:300], "in_flight": True})
            report = self.guard.check()
            decision = decide(self.envelope, self._key(point), report.ok)
            self._reject(decision.reason, report.reasons)

    def _key(self, point: str) -> ObservationKey:
        return ObservationKey(self.key.platform, self.key.profile, point, self.key.objective)

    def boundary(self, loss) -> RecoveryReport | None:
        """After the commit: the post-commit collective on R, the failure flag on W, and on a
        failure anywhere in R the six phases.  Returns the report of a repair, else None."""
        import torch

        if self.plan.scheduled("boundary", self._step):
            # A boundary fault strikes only once every rank has committed: without this fence a
            # peer still finishing the step's last backward collective would see it in flight.
            self.groups.control.allreduce([torch.zeros(1)]).wait()
        injected = self._inject("boundary")
        t0 = time.monotonic_ns()
        observed, err = False, None
        t = (loss.detach().reshape(-1)[:1].float().clone() if loss is not None else torch.zeros(1))
        try:
            if injected.get("group_failed") in (self.groups.name, self.groups.key):
                raise InjectedFault(f"injected failure of {self.groups.key} at the boundary of step {self._step}")
            self._wait_unless_revoked(self._pg.allreduce([t]), "the boundary all-reduce")
            self.last_loss = float(t[0]) / len(self.groups.members)
        except RuntimeError as exc:
            observed, err = True, exc
        t_obs = time.monotonic_ns()
        if observed:
            self.control.publish_revoke(self.gen, self.groups.key)
        flag = torch.zeros(self.groups.count, dtype=torch.int64)
        if observed:
            flag[self.groups.index] = 1
        try:
            self.groups.control.allreduce([flag]).wait()
        except RuntimeError as exc:
            # the out-of-band control group failed: a peer is gone; not repairable in place
            self._fail(exc, time.monotonic_ns())
        failed = [i for i, v in enumerate(flag.tolist()) if v]
        if not failed:
            self.watchdog.disarm()
            return None
        report = self._recover(failed, t0, t_obs, err)
        self.reports.append(report)
        self.watchdog.disarm()
        return report

    def _wait_unless_revoked(self, work, what: str) -> None:
        """Wait for an op on R; raise its error, or :class:`RevokedWhilePending` if R was revoked in
        this generation and the op is still pending ``REVOKE_GRACE_S`` later (the op and its group
        go to a reaper thread).  No added latency: the op's future wakes the wait."""
        done = threading.Event()
        work.get_future().add_done_callback(lambda _f: done.set())
        seen = None  # when this rank first knew of the revoke (its watcher's, or the store key)
        try:
            while not done.wait(0.05):
                if seen is None and (any(r[0] == self.gen for r in self.watchdog.revocations)
                                     or self.control.revoked(self.gen, self.groups.key)):
                    seen = time.monotonic()
                if seen is not None and time.monotonic() - seen > REVOKE_GRACE_S:
                    threading.Thread(target=_reap, args=(work, self._pg), name="accelpact-reaper", daemon=True).start()
                    raise RevokedWhilePending(f"{what} on {self.groups.key} was still pending {REVOKE_GRACE_S} s after "
                                              f"generation {self.gen}'s revoke shut down its sockets")
            work.wait()  # raises the op's own error, if any
        finally:
            # the raised error's traceback keeps this frame: it must not keep the op (and through
            # it the old group's sockets and threads) alive until the next garbage collection
            del work

    # ---- the six phases ----------------------------------------------------------------------
    def _recover(self, failed: list[int], t0: int, t_obs: int, err) -> RecoveryReport:
        import torch

        g = self.gen
        self._failed_groups = tuple(failed)
        member = self.groups.index in failed
        point = "boundary"
        revoke_lat = -1
        if member and err is not None:
            revs = [r for r in self.watchdog.revocations if r[0] == g]
            if revs and t_obs >= revs[0][3]:
                revoke_lat = t_obs - revs[0][3]  # else: observed directly, before the revoke reached us
        # Phase 1: RankObserve
        with self._hold():
            if member:
                self._written(self.control.publish_revoke(g, self.groups.key))
            self._act("RankObserve", self._st(PC_OBSERVED, point=point, frontier=self.guard.frontier + self._frontier_delta,
                                              tau=self.guard.tau + self._frontier_delta),
                      {"member": member, "failed_groups": failed, "error": repr(err)[:200] if err else None})
        t_start = time.monotonic_ns()
        new_pg = None
        refs_rebound = 0
        durations = {"rebuild": 0, "rebind": 0, "validate": 0}
        try:
            # Phase 2: RankGuard / RankReject
            self._inject("guard")
            report = self.guard.check()
            decision = decide(self.envelope, self._key(point), report.ok)
            if not decision.preserve:
                self._reject(decision.reason, report.reasons)
            self._act("RankGuard", self._st(PC_GUARDED), {"decision": decision.level, "why": decision.reason})
            # Phase 3: RankArrive, RankDecideAgreement, RankAwaitAgreement
            self._inject("agree")
            F = self.guard.frontier + self._frontier_delta
            # Each store write is recorded under the exit claim (exitcodes.holding_exit): a peer
            # may act on it at once, and our watchdog must not exit between write and record.
            with self._hold():
                count, last = self._written(self.control.arrive(g, F))
                self._act("RankArrive", self._st(PC_ARRIVED, frontier=F, tau=self.guard.tau + self._frontier_delta),
                          {"count": count, "last": last})
            if last:
                with self._hold():
                    dec = self._written(self.control.decide_agreement(g))
                    if dec != DECISION_COMMIT:  # mismatch: record, then the job abort, then exit (RankExit)
                        self.watchdog.exit_on_abort(dec[len("abort:"):] if dec.startswith("abort:") else REASON_MISMATCH,
                                                    before=lambda: self._act("RankDecideAgreement", {"pc": PC_ARRIVED},
                                                                             {"decision": dec}, outcome="fail"))
                        raise _Exited
                    self._act("RankDecideAgreement", {"pc": PC_ARRIVED}, {"decision": dec})
            dec = self.control.await_agreement(g, time.monotonic() + self.deadline_s)
            if dec != DECISION_COMMIT:
                self._decided_abort(dec, expired=self.control.last_expired)
            self._act("RankAwaitAgreement", self._st(PC_AGREED), {"decision": dec})
            t_agreed = time.monotonic_ns()
            if member:
                # Phase 4: RankReplace
                self._inject("replace")
                old_pg = self._pg
                t = time.monotonic_ns()
                new_pg = self.strategy.replace(old_pg, g + 1, self.groups.members, self.rank, self.control.store,
                                               self.deadline_s, name=self.groups.key)
                durations["rebuild"] = time.monotonic_ns() - t
                self._act("RankReplace", self._st(PC_REPLACED, comm=g + 1), {"duration_ns": durations["rebuild"]})
                # Phase 5: RankRebind (discover once at attach; rebind + verify on every repair)
                self._inject("rebind")
                t = time.monotonic_ns()
                stale = 0
                # the engine's own reference moves first: it is one of the references to rebind
                self._pg, self._record = new_pg, self.strategy.last_record
                if self.strategy.needs_rebind:
                    if self._bug != "skip-rebind":
                        self.adapter.rebind(self.module, self.sites, old_pg, new_pg)
                    check = self.adapter.verify(self.module, self.sites, old_pg, new_pg)
                    stale = int(check.stale)
                    refs_rebound = int(check.total) - stale
                    if not check.ok and self._bug != "skip-rebind":
                        raise RebindError(f"{stale} of {check.total} cached references still name the generation-{g} "
                                          f"communicator after rebinding: {check.detail}")
                del old_pg
                durations["rebind"] = time.monotonic_ns() - t
                self._act("RankRebind", self._st(PC_REBOUND, refs_stale=stale),
                          {"refs_rebound": refs_rebound, "duration_ns": durations["rebind"]})
                # Phase 6: RankValidate (collective on the new group + replica digests)
                self._inject("validate")
                t = time.monotonic_ns()
                digest = self._validate(new_pg, g)
                durations["validate"] = time.monotonic_ns() - t
                self._act("RankValidate", self._st(PC_VALIDATED), {"digest": digest, "duration_ns": durations["validate"]})
            else:
                # outside R the rank waits in "agreed" while R is rebuilt: faults aimed at phases
                # 4-6 strike it there (model: Fault* while pc == agreed, before RankReady)
                for point in ("replace", "rebind", "validate"):
                    self._inject(point)
            # Release: RankReady, RankDecideRelease, RankResume
            self._inject("release")
            t_rel = time.monotonic_ns()
            with self._hold():
                count, last = self._written(self.control.ready(g))
                self._act("RankReady", self._st(PC_READY), {"count": count, "last": last})
            if last:
                with self._hold():
                    dec = self._written(self.control.decide_release(g))
                    self._act("RankDecideRelease", {"pc": PC_READY}, {"decision": dec},
                              outcome="ok" if dec == DECISION_RELEASE else "fail")
            dec = self.control.await_release(g, time.monotonic() + self.deadline_s)
            if dec != DECISION_RELEASE:
                self._decided_abort(dec, expired=self.control.last_expired)
        except _Exited:
            raise
        except Exception as exc:
            self._fail(exc, t_start)
        # RankResume: generation g+1, R's communicator swapped, the old one dropped
        t_ret = time.monotonic_ns()
        new_pg = None
        self.gen = g + 1
        self._frontier_delta = 0
        self.watchdog.watch(self.gen, self.groups.key, self._record)
        if self.control._fenced:
            self.control.retire_revoke(g, self.groups.key)
        retire = time.monotonic_ns() - t_ret
        t_end = time.monotonic_ns()
        self._act("RankResume", self._st(PC_TRAIN, gen=self.gen, point=""), {"from_gen": g}, gen=g)
        return RecoveryReport(
            generation=g, member=member, observe_ns=t_obs - t0, agree_ns=t_agreed - t_start,
            rebuild_ns=durations["rebuild"], rebind_ns=durations["rebind"], validate_ns=durations["validate"],
            release_ns=t_end - t_rel, retire_ns=retire, total_ns=t_end - t_obs, refs_rebound=refs_rebound,
            revoke_to_observe_ns=revoke_lat,
        )

    def _validate(self, new_pg, g: int) -> str:
        """Phase 6: an all-reduce on the new group, then every replica's digest compared."""
        import torch

        n = len(self.groups.members)
        one = torch.ones(1)
        new_pg.allreduce([one]).wait()
        if int(one[0]) != n:
            raise ValidationError(f"validation all-reduce on generation-{g + 1} R gave {int(one[0])}, expected {n}")
        mine = torch.frombuffer(bytearray(_state_digest(self.module, self.optimizer)), dtype=torch.uint8)
        outs = [torch.empty_like(mine) for _ in range(n)]
        new_pg.allgather([outs], [mine]).wait()
        differing = [self.groups.members[i] for i, o in enumerate(outs) if not torch.equal(o, mine)]
        if differing:
            raise ValidationError(f"replica digests differ from rank {self.rank}'s on rank(s) {differing}: "
                                  "replicas of R do not hold identical shards; restart from the checkpoint (L2)")
        return bytes(mine.tolist()).hex()

    # ---- exits (fail-stop) ----------------------------------------------------------------------
    def _which(self) -> str:
        return self.control.decision_for(self.pc)

    def _reject(self, why: str, guard_reasons=()) -> None:
        """RankReject: the contract says L2; abort the job (every rank exits 70)."""
        claim_exit()
        g, which = self.gen, self._which()

        def record():
            self._act("RankReject", {"pc": PC_EXITED, "reason": REASON_REJECTED},
                      {"why": why, "guard": list(guard_reasons)}, outcome="fail", gen=g)
            self._store_abort(g, which, REASON_REJECTED)

        exit_now(code_for(REASON_REJECTED), REASON_REJECTED, self.trace, record=record, claimed=True)
        raise _Exited

    def _decided_abort(self, dec: str, expired: bool) -> None:
        """A decision key says abort.  If our own wait expired we are the RankTimeout;
        otherwise a peer decided and we exit on the job abort (RankExit)."""
        reason = dec[len("abort:"):] if dec.startswith("abort:") else REASON_EXCEPTION
        if expired and reason == REASON_DEADLINE:
            claim_exit()
            g, which = self.gen, self._which()

            def record():
                self._act("RankTimeout", {"pc": PC_EXITED, "reason": REASON_DEADLINE}, {"decision": dec}, outcome="fail", gen=g)
                self._store_abort(g, which, REASON_DEADLINE)

            exit_now(code_for(REASON_DEADLINE), REASON_DEADLINE, self.trace, record=record, claimed=True)
        self.watchdog.exit_on_abort(reason)
        raise _Exited

    def _fail(self, exc: BaseException, t_start: int) -> None:
        """RankFail (exception in phases 2-6), or RankTimeout if a collective outlived the deadline."""
        claim_exit()
        g, which = self.gen, self._which()
        # Building R's communicator (phase 4, pc "agreed") and the validation collective (phase
        # 6, pc "rebound") are waits on peers (model: RankTimeout there).  A communication error
        # in them -- a peer died or never came -- is that wait failing: deadline.  Our own errors
        # (stale references, digest mismatch, an injected exception) are exceptions.
        # The boundary's control-group all-reduce (pc "train") is such a wait too.
        own_error = isinstance(exc, (RebindError, ValidationError, InjectedFault))
        if not own_error:
            # a wait on peers failed: if a peer already aborted the job, this is that abort
            # reaching us (RankExit with its reason), not a new failure
            try:
                standing = self.control.read_abort()
            except Exception:
                standing = ""
            if standing:
                self.watchdog.exit_with(standing, claimed=True)  # records RankExit, os._exit
                raise _Exited
        timed_out = self.pc in (PC_TRAIN, PC_AGREED, PC_REBOUND) and not own_error and (
            self.pc != PC_AGREED or self.groups.index in self._failed_groups)
        reason = REASON_DEADLINE if timed_out else REASON_EXCEPTION
        action = "RankTimeout" if timed_out else "RankFail"

        def record():
            self._act(action, {"pc": PC_EXITED, "reason": reason}, {"error": f"{type(exc).__name__}: {exc}"[:500]},
                      outcome="fail", gen=g)
            self._store_abort(g, which, reason)

        exit_now(code_for(reason), reason, self.trace, record=record, claimed=True)
        raise _Exited

    def _store_abort(self, g: int, which: str, reason: str) -> None:
        try:
            self.control.write_abort_decision(g, which, reason)
            self.control.abort(reason)
        except Exception:
            pass  # store lost: peers' watchdogs exit DEADLINE on their own

    # ---- end -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Normal end of training: stop the watchdog, remove the hooks, end the trace."""
        if self._closed:
            return
        self._closed = True
        self.watchdog.stop()
        self.guard.remove()
        self.trace.end("released", gen=self.gen, frontier=self.guard.frontier)


def attach(module, optimizer, *, groups: PactGroups, control: ControlPlane, trace=None, envelope=None,
           key: ObservationKey | None = None, deadline_s: float = 30.0, adapter=None, fault_plan=None,
           frontier: int = 0, strategy: ReplacementStrategy | None = None,
           step_deadline_s: float | None = None) -> Pact:
    """Discover R's cached references once, install the guard, start the watchdog.

    ``deadline_s`` bounds each wait on peers in phases 2-6; ``step_deadline_s`` bounds a whole step
    (forward to the end of its boundary) before the watchdog takes the rank for hung and exits
    72: default :func:`default_step_deadline`; ``math.inf`` turns it off."""
    if isinstance(fault_plan, (list, tuple)):
        fault_plan = FaultPlan.from_list(fault_plan)
    return Pact(module, optimizer, groups=groups, control=control, trace=trace, envelope=envelope, key=key,
                deadline_s=deadline_s, adapter=adapter, fault_plan=fault_plan, frontier=frontier, strategy=strategy,
                step_deadline_s=step_deadline_s if step_deadline_s is not None else default_step_deadline(deadline_s))
