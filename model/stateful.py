"""Property-based exploration of larger worlds with a hypothesis state machine.

The exhaustive search (:mod:`accelpact.model.explore`) covers small worlds; this machine
drives the SAME transition function (:func:`accelpact.model.transitions.step`) through random
walks over worlds up to 4 nodes x 4 ranks.  Rules are protocol steps and injected faults
(each draws one *enabled* action, ``@precondition`` = something is enabled), ``@invariant``
checks every state invariant, each rule checks the edge invariants of its step, and
``teardown`` drains the run WITHOUT faults (protocol and supervisor actions only, chosen
deterministically) and asserts that a final state is reached within a bound: chaos, then
liveness, as TigerBeetle's VOPR does.

Every random choice is a hypothesis draw: no wall clock, no module-level random, so runs
are reproducible from the printed blob.
"""

from __future__ import annotations

from hypothesis import event, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from .explore import STEPS_PER_RANK
from .invariants import check_edge, check_state
from .protocol import Action, all_actions, is_final
from .transitions import actions_for
from .state import RECOVERY_PCS, Config, State, initial_state

__all__ = ["ProtocolMachine", "configs", "drain", "drain_bound", "make_machine"]


@st.composite
def configs(draw, max_nodes: int = 4, max_ranks_per_node: int = 4, max_faults: int = 3, mutant: str | None = None) -> Config:
    """Worlds up to ``max_nodes x max_ranks_per_node`` with an R of either kind and a fault budget."""
    nodes = draw(st.integers(1, max_nodes))
    rpn = draw(st.integers(1, max_ranks_per_node))
    if nodes * rpn < 2:
        rpn = 2 if max_ranks_per_node >= 2 else rpn
        nodes = 2 if nodes * rpn < 2 else nodes
    return Config(
        nodes=nodes,
        ranks_per_node=rpn,
        affected_local=draw(st.integers(0, rpn - 1)),
        group=draw(st.sampled_from(("replicate", "world"))),
        failing=draw(st.sampled_from(("one", "any"))),
        max_faults=draw(st.integers(1, max_faults)),
        spares=draw(st.sampled_from((0, 0, 1, 2))),  # hot swap (issue 13) in half the worlds
        mutant=mutant,
    )


def drain_bound(cfg: Config) -> int:
    """Most protocol steps a fault-free drain may take: every rank (and every spare) through every
    generation, plus a restart."""
    return STEPS_PER_RANK * (len(cfg.world) + cfg.spares) * (cfg.max_faults + 1) + 1


def drain(cfg: Config, s: State, actions: tuple[Action, ...] | None = None) -> tuple[State, list[Action], str | None]:
    """Take the most advanced enabled non-fault action until none is left or the bound is hit.

    "Most advanced" is the last enabled action in :func:`all_actions` order (later phases,
    then higher ranks first): it drives ranks apart instead of in lock step, so a drain
    also exposes ordering bugs (e.g. a release decided before every vote).

    Returns the last state, the actions taken and an error (None when a final state was
    reached within :func:`drain_bound` with every invariant holding).
    """
    table = actions_for(cfg)
    acts = tuple(a for a in reversed(actions or all_actions(cfg)) if table[a.name].actor != "fault")
    taken: list[Action] = []
    for _ in range(drain_bound(cfg)):
        nxt = next((a for a in acts if table[a.name].enabled(cfg, s, a.rank, a.arg)), None)
        if nxt is None:
            break
        t = table[nxt.name].step(cfg, s, nxt.rank, nxt.arg)
        taken.append(nxt)
        bad = check_state(cfg, t) + check_edge(cfg, s, t)
        if bad:
            inv, msg = bad[0]
            return t, taken, f"{inv.id} {inv.name} violated while draining after {nxt}: {msg}"
        s = t
    if not is_final(cfg, s):
        pcs = ", ".join(f"{r}:{rk.pc}{'(hung)' if rk.hung else ''}" for r, rk in enumerate(s.ranks))
        return s, taken, (
            f"no final state within {drain_bound(cfg)} fault-free steps (took {len(taken)}); "
            f"ranks {pcs}, abort={s.store.abort!r} (deadlock or unbounded exit: L2/L3)"
        )
    return s, taken, None


class ProtocolMachine(RuleBasedStateMachine):
    """Random walks over the protocol model; the configuration is drawn once per run."""

    #: set by :func:`make_machine`: a fixed configuration, or None to draw one with :func:`configs`
    fixed_config: Config | None = None
    mutant: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.cfg: Config | None = None
        self.state: State | None = None
        self.trail: list[str] = []
        self.max_recovering = 0
        self.failed = False
        self.actions: tuple[Action, ...] = ()
        self.protocol_actions: tuple[Action, ...] = ()
        self.fault_actions: tuple[Action, ...] = ()
        self.table: dict = {}
        self.fault_odds = 1

    @initialize(data=st.data())
    def choose_config(self, data) -> None:
        cfg = self.fixed_config or data.draw(configs(mutant=self.mutant), label="config")
        self.cfg = cfg
        self.actions = all_actions(cfg)
        self.table = actions_for(cfg)
        self.protocol_actions = tuple(a for a in self.actions if self.table[a.name].actor != "fault")
        self.fault_actions = tuple(a for a in self.actions if self.table[a.name].actor == "fault")
        self.state = initial_state(cfg)
        # Swarm testing (Groce et al.): each run draws how sparse its faults are, so that some runs
        # inject their faults late, deep inside a recovery (a delay after a vote, a hang after the
        # release), not only in the first steps where a uniform choice puts most of them.
        self.fault_odds = data.draw(st.sampled_from((1, 4, 16)), label="one fault in")
        event(f"world {cfg.nodes}x{cfg.ranks_per_node} group={cfg.group}")

    # -- helpers --------------------------------------------------------------------------

    def _enabled(self, acts: tuple[Action, ...]) -> list[Action]:
        if self.state is None:
            return []
        cfg, s = self.cfg, self.state
        return [a for a in acts if self.table[a.name].enabled(cfg, s, a.rank, a.arg)]

    def _now(self) -> tuple[Config, State]:
        """The configuration and state (both set by ``choose_config``, the first rule)."""
        assert self.cfg is not None and self.state is not None, "choose_config runs first"
        return self.cfg, self.state

    def _take(self, a: Action) -> None:
        cfg, before = self._now()
        after = self.table[a.name].step(cfg, before, a.rank, a.arg)
        self.trail.append(str(a))
        bad = check_edge(cfg, before, after)
        if bad:
            self.failed = True
            inv, msg = bad[0]
            raise AssertionError(f"{inv.id} {inv.name} violated by {a}: {msg}")
        self.state = after
        event(f"action {a.name}")
        recovering = sum(1 for rk in after.ranks if rk.pc in RECOVERY_PCS)
        if recovering > self.max_recovering:
            self.max_recovering = recovering
        for rk in after.ranks:
            if rk.pc in RECOVERY_PCS:
                event(f"reached pc {rk.pc}")

    # -- rules ------------------------------------------------------------------------------
    # Both rules are always valid (a precondition that fails makes hypothesis retry and then
    # discard the run): each prefers its own kind of action and falls back to the other, and a
    # state where nothing at all is enabled must be final (otherwise it is a deadlock, L3).

    def _pick(self, data, first: tuple[Action, ...], second: tuple[Action, ...], label: str) -> None:
        acts = self._enabled(first) or self._enabled(second)
        if not acts:
            self._terminal()
            return
        self._take(data.draw(st.sampled_from(acts), label=label))

    def _terminal(self) -> None:
        event("reached a state without successor")
        cfg, s = self._now()
        if not is_final(cfg, s):
            self.failed = True
            pcs = ", ".join(f"{r}:{rk.pc}" for r, rk in enumerate(s.ranks))
            raise AssertionError(f"deadlock (L3): no action enabled in a non-final state; ranks {pcs}; after {self.trail[-8:]}")

    @precondition(lambda self: self.state is not None)
    @rule(data=st.data())
    def protocol_step(self, data) -> None:
        """One protocol or supervisor step, drawn among the enabled ones (a fault if none is)."""
        self._pick(data, self.protocol_actions, self.fault_actions, "step")

    @precondition(lambda self: self.state is not None)
    @rule(data=st.data())
    def inject_fault(self, data) -> None:
        """One injected fault, drawn among the enabled ones (the budget is Config.max_faults); in a
        sparse run (``fault_odds`` > 1) most draws take a protocol step instead."""
        if self.fault_odds > 1 and data.draw(st.integers(0, self.fault_odds - 1), label="fault now") != 0:
            self._pick(data, self.protocol_actions, self.fault_actions, "step")
            return
        self._pick(data, self.fault_actions, self.protocol_actions, "fault")

    # -- properties -------------------------------------------------------------------------

    @invariant()
    def safety(self) -> None:
        if self.state is None:
            return
        bad = check_state(*self._now())
        if bad:
            self.failed = True
            inv, msg = bad[0]
            raise AssertionError(f"{inv.id} {inv.name} violated: {msg}; last steps {self.trail[-8:]}")

    def teardown(self) -> None:
        if self.state is None or self.failed:
            return
        cfg, s = self._now()
        target(float(self.max_recovering), label="ranks in recovery at once")
        target(float(max(rk.gen for rk in s.ranks)), label="generation reached")
        _s, taken, err = drain(cfg, s, self.actions)
        if err:
            raise AssertionError(f"after the fault-free drain: {err}; chaos steps {self.trail[-8:]}, drain {[str(a) for a in taken[-8:]]}")


def make_machine(config: Config | None = None, *, mutant: str | None = None) -> type[ProtocolMachine]:
    """A machine class for one fixed ``config`` (or drawn configs carrying ``mutant``)."""
    name = "ProtocolMachine_" + ("drawn" if config is None else f"{config.nodes}x{config.ranks_per_node}")
    chosen = config.mutant if config else mutant
    if chosen:
        name += "_" + chosen.replace("-", "_")
    return type(name, (ProtocolMachine,), {"fixed_config": config, "mutant": mutant})
