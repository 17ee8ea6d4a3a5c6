"""Adapters that adopt AccelPact inside a training framework's own loop (README, "torchtitan").

Each module here depends on its framework only when its classes are used: importing
:mod:`accelpact.integrations.torchtitan` needs torch and AccelPact, not torchtitan.  They build on
the public API (:func:`accelpact.init`, ``Session.attach``, ``run.step``, ``run.boundary``) and on
nothing of the test tooling.
"""
