"""Issue 44, item 6: a fault-free run's log is quiet.

Before: every rank's watchdog re-armed its store wait on the revoke log every 5 s, and each expiry
made torch's TCPStore client log ``[c10d] waitForInput ... likely a timeout`` (two lines).  Now the
watchdog's store waits end by their key being set (``controlplane.KEY_WAIT_S``), so a run of the
README's first example that trains well past the old 5 s slice prints no such warning; a resumed
episode prints one line for the whole job (``impl/episode.py`` ``episode_line``).
"""

from __future__ import annotations

import datetime
import time

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip
from accelpact.testing.examples import torchrun  # noqa: E402 - after the torch skip

#: the watchdog's revoke slice before issue 44 (s): the run below must train longer than this, or
#: it could not have shown the warning in the first place
OLD_SLICE_S = 5.0


@pytest.mark.multiproc
def test_a_fault_free_run_prints_no_wait_for_input_warning(tmp_path):
    """FSDP2 HSDP, 2 ranks (2 replicas), 250 steps on loopback (about 12 s): no ``waitForInput``
    in the agent's combined output, and the training itself lasted past the old slice."""
    out = tmp_path / "quiet"
    text = torchrun("fsdp2_hsdp.py", out, "--replicas", "2", "--steps", "250", nproc=2)
    run = RunDir(out)
    # the first checkpoint (step 2) to the final snapshot: the span the watchdog waited through
    first = min(p.stat().st_mtime for p in run.ckpt.iterdir())
    span = run.final(0).stat().st_mtime - first
    assert span > OLD_SLICE_S + 1, f"training lasted {span:.1f}s: too short to show the old slice's warning"
    assert "waitForInput" not in text, "\n".join(ln for ln in text.splitlines() if "waitForInput" in ln)[:2000]
    assert "accelpact: episode" not in text, "a fault-free run reported an episode"


def test_the_watchdog_store_waits_end_by_their_keys_not_a_timeout():
    """One rank's watchdog watching a generation (abort and revoke watchers in their store waits):
    stopping it at the job's end (``wake_and_join``: ``closed`` on the abort key, ``retired`` on the
    revoke log) ends both waits within a second, although their slices are an hour long."""
    import torch.distributed as dist

    from accelpact.impl.controlplane import KEY_WAIT_S, ControlPlane
    from accelpact.impl.runtime import revoke
    from accelpact.impl.watchdog import Watchdog
    from accelpact.testing import HOST

    assert KEY_WAIT_S >= 600, "the watchers' slices must outlast a fault-free run's quiet stretches"
    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    cp = ControlPlane(store, 0, 1, prefix="quiet/")
    wd = Watchdog(cp).start()
    assert wd.slice_s == KEY_WAIT_S and wd.key_wait_s == KEY_WAIT_S
    wd.watch(0, "replicate", revoke.SocketRecord("gloo"))
    time.sleep(0.3)  # both threads inside their store waits
    wd.stop()
    t0 = time.monotonic()
    assert wd.wake_and_join(10.0), [t.name for t in wd._threads if t.is_alive()]
    assert time.monotonic() - t0 < 5.0
