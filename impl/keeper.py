"""Deprecated: ``python -m accelpact.impl.keeper`` (the keeper's path before it moved to ``accelpact.impl.launch``).

Kept for one release so that a script written from an older README still starts its spares (issue 44):
it prints one deprecation line (once per node) naming ``accelpact launch``, then becomes the keeper
(``exec`` of ``python -m accelpact.impl.launch.keeper_entry`` with the same arguments: the same process,
so torchrun sees no difference).  The engine's modules do not import the launcher (pyproject.toml's
layers), so the keeper is named here as a command, never imported.  Remove in the next release.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENTRY", "MESSAGE"]

#: the keeper's process entry (impl/launch/keeper_entry.py), run in this process's place
ENTRY = "accelpact.impl.launch.keeper_entry"
MESSAGE = ("accelpact: `-m accelpact.impl.keeper` is deprecated and goes away in the next release: launch with "
           "`accelpact launch [torchrun options] --spares N -- script.py ...` (README, \"Hot swap\")")


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("LOCAL_RANK", "0") in ("", "0"):
        print(MESSAGE, file=sys.stderr, flush=True)
    args = sys.argv[1:] if argv is None else argv
    os.execv(sys.executable, [sys.executable, "-m", ENTRY, *args])


if __name__ == "__main__":
    main()
