"""The keeper's process entry, as the launchers name it to torchrun (internal: users run ``accelpact launch``).

``python -m accelpact.impl.launch.keeper_entry -- CMD [ARGS...]`` is :mod:`accelpact.impl.launch.keeper`
without the deprecation line its own ``-m`` path prints (issue 44: the user-facing entry point is
``accelpact launch``; ``accelpact.impl.launch.launch`` and the harness start ranks through this one).
"""

from __future__ import annotations

import os
import sys

from .keeper import main


def _main() -> None:
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: the keeper's warm-up thread may still be importing torch, and finalizing
    # under a daemon thread inside a C extension's import can hang (impl/launch/keeper.py)
    os._exit(code)


if __name__ == "__main__":
    _main()
