"""The chaos soak: one long training job under a seeded random storm of external faults,
judged over its whole history.  ``accelpact soak`` (:mod:`.cli`); the schedule (:mod:`.schedule`),
what the injector sees of the live run (:mod:`.live`), the injector (:mod:`.injector`), the judge
(:mod:`.judge`), the summary and timeline (:mod:`.report`).  README.md, "Chaos soak"."""
