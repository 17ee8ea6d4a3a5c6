"""The engine's deadlines: the one phase-wait default and the one step-deadline rule.

Every caller (``attach``, ``accelpact.init``'s ``Settings``, the typed ``Job``) takes its default
from here, so the engine and the launcher cannot disagree on them.
"""

from __future__ import annotations

__all__ = ["DEFAULT_DEADLINE_S", "STEP_DEADLINE_FLOOR_S", "default_step_deadline"]

#: Each recovery phase's wait on peers (phases 2-6), in seconds: the one default of ``Job.deadline_s``,
#: ``accelpact.init``'s ``Settings.deadline_s`` and ``attach``'s ``deadline_s``.
DEFAULT_DEADLINE_S = 20.0

#: Floor of the default step deadline: a step (forward, backward, optimizer, boundary) that makes
#: no progress for this long is taken to be hung (``RankExpire``).  Its compute is no wait the
#: deadlines bound, so set ``step_deadline_s`` above the longest legitimate step when steps run longer.
STEP_DEADLINE_FLOOR_S = 600.0


def default_step_deadline(collective_timeout_s: float | None, deadline_s: float) -> float:
    """The step deadline when none is set (spec/protocol.md P10.5): it outlasts a step with its waits,
    one collective on a slow or hung peer (``collective_timeout_s``, the training groups' timeout:
    what turns it into a recoverable error) and then up to six phase waits of ``deadline_s`` each
    (agreement, replacement, validation, release), and at least :data:`STEP_DEADLINE_FLOOR_S` for
    the step's own compute.  ``collective_timeout_s`` None: not known (a group that does not say)."""
    return max(STEP_DEADLINE_FLOOR_S, (collective_timeout_s or 0.0) + 6 * deadline_s)
