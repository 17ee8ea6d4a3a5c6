"""The launcher and operations: how a job is described, started, kept and inspected.

The typed job (``job``), the run folder (``rundir``), the per-rank worker (``worker``), the
keeper that reports a rank's death (``keeper``), the supervisor that starts and restarts ranks
(``launch``), the public training-script API (``api``), the demo, plots and the reference
workload (``workload``, ``data/``).  This layer may import the engine (``accelpact.impl``) and the
runtime (``accelpact.impl.runtime``); it imports the test tooling (``accelpact.testing``) only to
arm a job's test-only fault plan, lazily.  Neither the engine nor the runtime imports it.
"""
