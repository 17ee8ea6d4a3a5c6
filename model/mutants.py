"""Deliberately broken protocol variants, selected by name (``Config.mutant``).

Each mutant is a one-line change inside :mod:`accelpact.model.protocol` (search for its
name there).  The exploration must reject every one of them: that is how we show the
search has teeth.  ``expect`` names the properties a counterexample is expected to break
(any one of them counts as caught).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    bug: str
    expect: tuple[str, ...]


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("early-release", "the release is decided by the first vote instead of the last", ("S1",)),
        Mutant("skip-agreement", "a rank passes phase 3 without waiting for the agreed decision", ("S2.2", "S2.3")),
        Mutant("no-fence", "store keys are not namespaced by generation: stale decisions are read", ("S2.3", "S4.2", "S2.1")),
        Mutant("partial-rebind", "rebinding updates only the first cached reference", ("S5",)),
        Mutant("admit-inflight", "the contract admits L1 for in-flight (forward/backward/optimizer) failures", ("S3",)),
        Mutant("linger", "survivors keep waiting instead of exiting on an abort or an expired deadline", ("deadlock", "L2")),
        Mutant("no-step-deadline", "the watchdog has no step deadline: a hung rank exits only on the abort key", ("deadlock", "L2")),
    )
}


def get(name: str) -> Mutant:
    """The mutant called ``name``; the error lists the valid names."""
    try:
        return MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; choose one of: {', '.join(MUTANTS)}") from None
