"""Running ``examples/`` under real torchrun on Gloo CPU, for tests (tests/test_examples.py,
tests/test_faults_from_outside.py): the launch (bounded, reaped: :class:`ProcessSet`; loopback,
free ports), the bit-identity check against a fault-free run, the trace checker told nothing, and
finding a worker's pid by its ``RANK``, as an injector outside the job does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ..impl.launch.launch import ProcessSet, free_port, worker_env
from ..impl.rundir import RunDir

__all__ = ["EXAMPLES", "TIMEOUT_S", "assert_bit_identical", "assert_trace_accepted", "torchrun", "worker_pid"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 240.0


def torchrun(script: str, out: Path, *extra: str, nproc: int = 4, nnodes: int = 1, max_restarts: int = 0,
             spares: int = 0, settings: Mapping[str, str] | None = None) -> str:
    """Run ``examples/<script>`` under ``nnodes`` torchrun agents of ``nproc`` workers each; the
    agents' combined output.  Fails the test on a non-zero agent exit or on the timeout.
    ``settings``: :func:`accelpact.init` settings for every worker, as ``ACCELPACT_<NAME>`` variables
    (``{"collective_timeout_s": "10"}``)."""
    out.mkdir(parents=True, exist_ok=True)
    if nnodes == 1:
        rdzv = ["--standalone"]
    else:
        rdzv = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv-id", out.name, "--local-addr", "127.0.0.1"]
    options = [*rdzv, "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "--monitor-interval", "0.1"]
    run = [str(EXAMPLES / script), "--out", str(out), *extra]
    # with spares, as the README says: `accelpact launch ... --spares N -- script.py` (keepers, ACCELPACT_SPARES)
    cmd = ([sys.executable, "-m", "accelpact.cli", "launch", *options, "--spares", str(spares), "--", *run] if spares
           else [sys.executable, "-m", "torch.distributed.run", *options, *run])
    env = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    # these tests are about the repair and bit-identity, not detection: on 2 shared cores with up to 8
    # workers a rank can be descheduled past the detector's 0.8 s default (spec/detection.md)
    env["ACCELPACT_DEAD_AFTER_S"] = "5"
    env.update({f"ACCELPACT_{k.upper()}": str(v) for k, v in (settings or {}).items()})
    logs = [out / f"agent{i}.log" for i in range(nnodes)]
    with ProcessSet() as ps:
        files = [open(log, "wb") for log in logs]
        try:
            for f in files:
                ps.start(cmd, env=env, stdout=f)
            timed_out = ps.wait(TIMEOUT_S)
        finally:
            for f in files:
                f.close()
        codes = ps.codes
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    assert not timed_out, f"{script} {extra}: still running after {TIMEOUT_S}s\n{text[-4000:]}"
    assert codes == [0] * nnodes, f"{script} {extra}: agents exited {codes}\n{text[-4000:]}"
    return text


def assert_bit_identical(reference: Path, run: Path, world: int) -> None:
    import torch

    for r in range(world):
        a = torch.load(RunDir(reference).final(r))  # the examples save where the worker does
        b = torch.load(RunDir(run).final(r))
        assert a.keys() == b.keys(), f"rank {r}: different state keys"
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, f"rank {r}: {len(differ)} tensors differ from the uninterrupted run, e.g. {differ[:3]}"


def assert_trace_accepted(run: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "accelpact.cli", "check-trace", str(run)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"the trace checker rejects {run}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"


def worker_pid(script: str, rank: int) -> int | None:
    """The pid of the worker (not the keeper) running ``examples/<script>`` with ``RANK=rank``, if any."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(script.encode() in c for c in cmd) and not any(c.startswith(b"accelpact.impl.launch.keeper") for c in cmd) \
                and f"RANK={rank}".encode() in env:
            return int(d.name)
    return None
