"""AccelPact: zero-replay in-process recovery at a committed optimizer boundary.

``accelpact.model`` is the pure executable model (no torch); ``accelpact.impl`` is the
reference torch implementation that mirrors it; ``accelpact.conformance`` checks the
second against the first.
"""

__version__ = "0.1.0"
