"""The launcher and operations: how a job is described, started, kept and inspected.

The typed job (``job``), the keeper that reports a rank's death (``keeper``), the supervisor that
starts and restarts ranks (``launch``; the harness's rank program it starts is
``accelpact.testing.worker``, named as a command), the public training-script API (``api``,
``training``), the demo, plots, snapshot comparison and the reference workload (``workload``,
``data/``).  This layer may import the engine (``accelpact.impl``) and the runtime
(``accelpact.impl.runtime``), never the test tooling (``accelpact.testing``).  Neither the engine nor
the runtime imports it.
"""
