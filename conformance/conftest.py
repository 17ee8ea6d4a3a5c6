"""pytest options for the conformance suite (spec/scenario-format.md, "Running").

``pytest conformance/`` runs the fast subset with real processes on gloo; ``--full`` runs the whole
corpus; ``--scenario SUBSTR`` filters by name; ``--backend NAME`` (one of
:data:`accelpact.impl.backends.BACKEND_NAMES`) skips each scenario with the backend's reason when
this machine cannot run it (``Backend.unavailable``, e.g. too few GPUs for nccl); ``--world-size N`` keeps only scenarios of that world size;
``--torchrun-args "k=v,..."`` passes ``run_torchrun`` keyword arguments (e.g. ``monitor_interval=0.5``).
Works under pytest-xdist (each scenario writes to its own tmp folder; the reference cache is per
worker via ``ACCELPACT_REF_CACHE`` or the session tmp folder).
"""

from __future__ import annotations


from accelpact.impl.backends import BACKEND_NAMES  # torch-free


def pytest_addoption(parser):
    g = parser.getgroup("accelpact conformance")
    g.addoption("--backend", default="gloo", choices=BACKEND_NAMES, help="collective backend for the real runs")
    g.addoption("--world-size", type=int, default=None, help="only scenarios with this many ranks")
    g.addoption("--scenario", default=None, help="only scenarios whose name contains this substring")
    g.addoption("--torchrun-args", default="", help="comma-separated k=v keyword arguments for run_torchrun")
    g.addoption("--full", action="store_true", help="run the whole corpus, not only the fast subset")
