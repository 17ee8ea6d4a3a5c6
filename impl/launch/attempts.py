"""Which attempt of the job a process belongs to, the same for every worker of every agent.

torchrun's ``TORCHELASTIC_RESTART_COUNT`` is an agent's own count, ``max_restarts -
remaining_restarts`` (``torch/distributed/elastic/agent/server/api.py``,
``SimpleElasticAgent._invoke_run``).  An agent whose worker failed spends a restart; an agent whose
workers are healthy but that sees another node waiting to rendezvous again
(``rdzv_handler.num_nodes_waiting() > 0``) restarts them without spending one.  So with two or more
agents, one round's workers can start with different counts (found: after a SIGKILL of a worker on
node A, node B's workers waited in the episode's control barrier, B restarted them on A's
re-rendezvous with count 0 while A's had 1, and B's workers read attempt 0's keys: gloo's
``connectFullMesh`` dialled a dead worker's address, "connection refused").

What is the same on every rank: each agent starts every one of its workers (spares too) once per
round, and only after all of the previous round's workers stopped (the new round needs every agent
to rendezvous, which each does after stopping its own).  So the number of starts of a launcher RANK,
counted on the job's store under :data:`STARTS_KEY` (outside every attempt's namespace), is one
round count for every rank.  The attempt is the larger of that count less one and the restart count:
a launcher that serves each attempt a fresh store (``launch.run_restarting``) counts 1 every time, and
its restart count is the right one.

:func:`start` counts (once per worker process: ``accelpact.init``); :func:`current` only reads (a
keeper, whose worker counts its own start).
"""

from __future__ import annotations

from typing import Any, Mapping

#: ``{rank}``: the launcher's RANK (spares included); outside every ``attempt{n}/`` namespace
from ..controlplane import STARTS_KEY


def _restart_count(env: Mapping[str, str]) -> int:
    return int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)


def start(store: Any, env: Mapping[str, str]) -> int:
    """Count this process's start of its launcher RANK on ``store`` (the job's store, no prefix) and
    return its attempt.  Call once per worker process."""
    starts = int(store.add(STARTS_KEY.format(rank=int(env["RANK"])), 1))
    return max(_restart_count(env), starts - 1)


def current(store: Any, env: Mapping[str, str]) -> int:
    """The attempt of the latest start of this launcher RANK, without counting one.  Before the
    worker of this round counted its start it is the previous round's: a keeper asks again each time
    it needs the store (:mod:`accelpact.impl.launch.keeper`)."""
    starts = int(store.add(STARTS_KEY.format(rank=int(env["RANK"])), 0))
    return max(_restart_count(env), starts - 1)
