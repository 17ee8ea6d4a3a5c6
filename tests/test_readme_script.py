"""The README's "Use it in your training script" section, as a newcomer would use it (issue 29, Done when).

The first python block of that section is taken from README.md as it is (the test breaks if the README
drifts) and completed with the glue a newcomer writes from that section alone: imports, argument parsing
(``--out``, ``--fault``, ``--steps``), a tiny model (``make_model``), a stateful data loader (``MyLoader``:
a cursor with ``state_dict``/``load_state_dict``, so that the data after a restart depends on the restored
cursor, not on the step number) and, after the block, this rank's final state saved for the comparison.
Nothing else of the project is read.

The script then runs as the section's commands run the example, three times on 4 gloo CPU ranks under
``python -m torch.distributed.run --standalone`` in one folder: fault-free; with the boundary cut
``collective_timeout@boundary:3:0,2`` (repaired in place: zero restarts); with ``crash@backward:4:1``
under ``--max-restarts 1`` (every rank restarts once from the checkpoint).  Each faulted run's final
state, rank by rank (parameters, optimizer state, the loader's cursor), is ``torch.equal`` to the
fault-free run's.  Every launch is bounded and reaped (``ProcessSet``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.launch.launch import ProcessSet, worker_env  # noqa: E402 - after the torch skip
from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Use it in your training script"
WORLD = 4
STEPS = 8
CUT = "collective_timeout@boundary:3:0,2"
CRASH = "crash@backward:4:1"
LAUNCH_S = 150.0

#: What a newcomer writes around the README's block: imports, flags, the model and the data cursor the
#: block names (``make_model``, ``MyLoader``, ``out``, ``fault``, ``total``).
PROLOGUE = '''\
import argparse

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--fault", default=None)
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
out, fault, total = args.out, args.fault, args.steps
torch.set_num_threads(1)


def make_model(device):
    torch.manual_seed(0)  # the same initial weights on every rank
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3)]
    return nn.Sequential(*blocks, nn.Linear(16, 1)).to(device)


class MyLoader:
    """This rank's data stream: next() reads the batch at the cursor and advances it."""

    def __init__(self, rank):
        self.rank, self.position = rank, 0

    def next(self, device):
        g = torch.Generator().manual_seed(100_003 * self.rank + self.position)
        self.position += 1
        x = torch.randn(8, 16, generator=g)
        return x.to(device), x.sum(dim=1, keepdim=True).to(device)

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


# ---- the README's block ----
'''

#: After the block: this rank's final state, to compare runs (shards as they are).
EPILOGUE = '''
# ---- end of the README's block ----


def local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


final = {f"param.{n}": local(p) for n, p in model.named_parameters()}
final.update({f"optim.{i}.{k}": local(v) for i, s in optim.state_dict()["state"].items() for k, v in s.items()
              if torch.is_tensor(v)})
final["loader.position"] = torch.tensor(loader.position)
torch.save(final, f"{out}/state-rank{job.rank}.pt")
'''


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def readme_block() -> str:
    """The first python code block of the section, verbatim."""
    m = re.search(r"```python\n(.*?)```", readme_section(), re.S)
    assert m, f"README.md's {SECTION!r} has no python block"
    return m.group(1)


def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(PROLOGUE + readme_block() + EPILOGUE)
    return path


def torchrun(train: Path, cwd: Path, out: str, *extra: str, max_restarts: int = 0) -> str:
    """``python -m torch.distributed.run --standalone --nproc-per-node 4 train.py --out OUT ...`` in ``cwd``
    (the README's command, with the script's own flags): the agent's output; fails on a non-zero exit or
    on the bound."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", str(train), "--out", out,
           "--steps", str(STEPS), *extra]
    env = {k: v for k, v in worker_env().items() if not k.startswith("ACCELPACT_")}
    # about the result, not detection: 4 ranks on 2 shared cores can be descheduled past the detector's
    # 0.8 s default (spec/detection.md), as tests/test_examples.py says
    env["ACCELPACT_DEAD_AFTER_S"] = "5"
    log = cwd / f"{Path(out).name}.log"
    with ProcessSet() as ps, open(log, "wb") as f:
        ps.start(cmd, env=env, stdout=f, cwd=cwd)
        timed_out = ps.wait(LAUNCH_S)
        codes = ps.codes
    text = log.read_text(errors="replace")
    assert not timed_out, f"{out}: still running after {LAUNCH_S}s\n{text[-4000:]}"
    assert codes == [0], f"{out}: torchrun exited {codes}\n{text[-4000:]}"
    return text


def final_states(run: Path) -> list[dict]:
    return [torch.load(run / f"state-rank{r}.pt") for r in range(WORLD)]


def attempts(run: Path) -> dict[int, set[int]]:
    """rank -> the torchrun attempts it wrote a trace in."""
    out: dict[int, set[int]] = {}
    for a, r in RunDir(run).trace_files():
        out.setdefault(r, set()).add(a)
    return out


def assert_identical(reference: list[dict], run: list[dict], what: str) -> None:
    for r, (a, b) in enumerate(zip(reference, run, strict=True)):
        assert a.keys() == b.keys(), f"{what}, rank {r}: different state keys"
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, f"{what}, rank {r}: {len(differ)} tensors differ from the fault-free run, e.g. {differ[:3]}"


def test_the_readme_block_is_what_this_test_completes():
    """The names the glue provides are the ones the block uses, and the section shows the faults run below."""
    block = readme_block()
    for name in ("make_model(", "MyLoader(", "out", "total", "fault", "loader.state_dict", "run.restored_extra",
                 "run.boundary(", "job.close()"):
        assert name in block, f"the README's block no longer uses {name!r}: update this test's glue"
    section = readme_section()
    assert CUT in section and CRASH in section and "--max-restarts 1" in section


@pytest.mark.timeout(480)
def test_a_script_from_the_readme_alone_is_bit_identical_after_a_cut_and_a_sigkill(tmp_path):
    train = script(tmp_path)
    torchrun(train, tmp_path, "runs/fsdp2")
    reference = final_states(tmp_path / "runs/fsdp2")
    assert all(int(s["loader.position"]) == STEPS for s in reference), "the cursor read one batch per step"

    torchrun(train, tmp_path, "runs/cut", "--fault", CUT)
    cut = tmp_path / "runs/cut"
    assert attempts(cut) == {r: {0} for r in range(WORLD)}, "the cut must be repaired in place: no restart"
    resumed = [r for r in range(WORLD) if any(x.get("action") == "RankResume" for x in RunDir(cut).records(0, r))]
    assert resumed == list(range(WORLD)), f"every rank must resume from an in-place repair; resumed: {resumed}"
    assert_identical(reference, final_states(cut), "boundary cut")

    torchrun(train, tmp_path, "runs/crash", "--fault", CRASH, max_restarts=1)
    crash = tmp_path / "runs/crash"
    assert attempts(crash) == {r: {0, 1} for r in range(WORLD)}, "every rank must restart exactly once"
    assert_identical(reference, final_states(crash), "SIGKILL and torchrun restart")
    # told nothing, every attempt: the first ends in torchrun's teardown of the survivors (issue 42)
    from accelpact.conformance.cli_check import check_dir

    ok, msg = check_dir(crash)
    assert ok, msg
