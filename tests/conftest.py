"""Hypothesis profiles for the model tests.

``ci`` (the default, and always when ``CI`` is set): derandomized, no example database,
``print_blob=True``, bounded examples and stateful steps, no deadline (the machine is shared and
loaded; speed is measured in benchmarks, never asserted).  ``nightly``: many more examples and a
persisted database in ``.hypothesis/``; select it with ``HYPOTHESIS_PROFILE=nightly``.
"""

from __future__ import annotations

import os

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
