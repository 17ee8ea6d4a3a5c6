"""The engine's deadlines: the one phase-wait default and the one step-deadline rule.

Every caller (``attach``, ``accelpact.init``'s ``Settings``, the typed ``Job``) takes its default
from here, so the engine and the launcher cannot disagree on them.
"""

from __future__ import annotations

__all__ = ["DEFAULT_COLLECTIVE_TIMEOUT_S", "DEFAULT_DEADLINE_S", "STEP_DEADLINE_FLOOR_S", "default_step_deadline",
           "step_wait_bound"]

#: Each recovery phase's wait on peers (phases 2-6), in seconds: the one default of ``Job.deadline_s``,
#: ``accelpact.init``'s ``Settings.deadline_s`` and ``attach``'s ``deadline_s``.
DEFAULT_DEADLINE_S = 20.0

#: The training groups' collective timeout, in seconds: the one default of ``Job.collective_timeout_s``,
#: ``accelpact.init``'s ``Settings.collective_timeout_s`` and the bound of every wait of a fault-free step
#: (:func:`step_wait_bound`).  It is torch's own NCCL default, ``default_pg_nccl_timeout`` (10 min,
#: torch/distributed/constants.py, from ProcessGroupNCCL.hpp's ``kProcessGroupNCCLDefaultTimeout``; None
#: on a build without NCCL; gloo's ``default_pg_timeout`` is 30 min), what a user's NCCL group gets
#: without AccelPact, so a step that torch
#: alone would wait out is never taken for a failure: a slow healthy step (an evaluation, a checkpoint
#: to a slow disk on one rank) costs only its time.  A dead or stopped rank is not waited for this
#: long: the heartbeat detector declares it in about a second (spec/detection.md).
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0

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


def step_wait_bound(collective_timeout_s: float | None) -> float:
    """The bound of a fault-free step's own waits on its peers that are no collective of the training
    groups (the commit's device drain, the checkpoint's acknowledgements): the training groups'
    collective timeout, the wait torch would give a collective of the same step, never the recovery's
    phase deadline (a slow healthy step is not a failure; a dead or stopped peer is the detector's to
    find).  ``collective_timeout_s`` None (a group that does not say): :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`."""
    return collective_timeout_s if collective_timeout_s else DEFAULT_COLLECTIVE_TIMEOUT_S
