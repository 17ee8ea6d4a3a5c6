"""Hypothesis profiles for the model tests.

``ci`` (the default, and always when ``CI`` is set): derandomized, no example database,
``print_blob=True``, bounded examples and stateful steps, no deadline (the machine is shared and
loaded; speed is measured in benchmarks, never asserted).  ``nightly``: many more examples and a
persisted database in ``.hypothesis/``; select it with ``HYPOTHESIS_PROFILE=nightly``.

Fixtures of the multi-process harness (:mod:`accelpact.testing`): ``ranks`` (run N ranks of a
module-level function in the test's ``tmp_path``), ``store`` (a loopback master TCPStore hosted by
the test) and ``connect`` (new client connections to it).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    max_examples=60,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "nightly",
    derandomize=False,
    database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
    print_blob=True,
    max_examples=2000,
    stateful_step_count=300,
    deadline=None,
    suppress_health_check=_SLOW_OK,
)

_profile = os.environ.get("HYPOTHESIS_PROFILE") or "ci"
if os.environ.get("CI") and _profile != "nightly":
    _profile = "ci"
settings.load_profile(_profile)

#: ``make nightly`` sets it: tests marked ``nightly`` (minutes of model search each) run only then.
NIGHTLY = os.environ.get("ACCELPACT_NIGHTLY") == "1"


def pytest_collection_modifyitems(config, items):
    """Skip every ``@pytest.mark.nightly("why")`` test, naming why, unless ACCELPACT_NIGHTLY=1."""
    if NIGHTLY:
        return
    for item in items:
        mark = item.get_closest_marker("nightly")
        if mark is not None:
            why = mark.args[0] if mark.args else "minutes of model search"
            item.add_marker(pytest.mark.skip(reason=f"{why}: set ACCELPACT_NIGHTLY=1 (make nightly does)"))


# ---- multi-process harness (accelpact.testing) through fixtures -------------------------------------

@pytest.fixture
def ranks(tmp_path):
    """Run N ranks of a module-level function in ``tmp_path``: ``ranks.run(fn, world, **kw)`` -> Run,
    ``ranks.start(fn, world, **kw)`` -> Ranks (see :mod:`accelpact.testing`)."""
    pytest.importorskip("torch")
    from accelpact.testing import Harness

    return Harness(tmp_path)


@pytest.fixture
def store():
    """A master TCPStore on a free loopback port, hosted by the test process."""
    pytest.importorskip("torch")
    from accelpact.testing import host_store

    return host_store()


@pytest.fixture
def connect(store):
    """``connect()``: a new client connection to the ``store`` fixture's store."""
    from accelpact.testing import client_store

    return lambda timeout_s=60.0: client_store(store.port, timeout_s)
