"""Issue 44 item 5, against torchtitan itself: its llama3 debug model trained under
``accelpact.integrations.torchtitan.AccelPactTrainer`` on 2 gloo CPU ranks (HSDP: dp_replicate=2 x
dp_shard=1), struck from outside, compared with the same script's fault-free run.

Runs where torchtitan imports: in this interpreter, or in the one ``ACCELPACT_TORCHTITAN_PYTHON`` names
(torchtitan 0.3.0 needs Python >= 3.11 and deps this project does not install; README, "torchtitan",
says how that venv is made); skipped otherwise, naming the import error.  ``nightly``: each case
starts torchtitan twice or more (its imports alone take seconds a rank).

The worker (:data:`WORKER`) is torchtitan's ``train.py`` with the one-line change the README gives
(``AccelPactTrainer(config)``), plus what torchtitan 0.3.0 needs to run on CPU at all (it has no CPU
mode: the device module, the attention backend; README, "torchtitan") and the strike's half, outside
AccelPact: at torchtitan step ``PAUSE_STEP`` a rank writes a marker and waits, bounded, until this test
process has struck:

* ``backward``: rank 0 waits in the backward (a hook on the gradient of the final norm's output); this
  process cuts R's sockets of rank 0 (``inject.cut_links`` on the replicate group's ports read off the
  job's store): a peer's gradient reduction on R fails and the step is discarded in place (FSDP2's
  reset); ``backward-rebuild``: the same, discarded on a model torchtitan's own building code makes
  anew (``AccelPactTrainer(rebuild=True)``, what a torch without ``reset_iter_state`` does);
* ``boundary``: rank 0 waits right after the optimizer step (a post-step hook), the step committed; the
  cut makes the boundary's probe on R fail: repaired in place (L1);
* ``kill``: rank 1 waits there and this process SIGKILLs it: every rank exits, torchrun restarts them
  (``--max-restarts 1``) and AccelPact resumes from the last committed checkpoint (step 2): the model,
  the optimizer and, through ``extra_state``, torchtitan's data loader, LR schedule and step counters.

Judged: torchrun exits 0; the restarts are the case's (none, or one for ``kill``); the episode happened
(a discard in backward; a repair at the boundary; a second attempt resumed from step 2); every rank's
final parameters, optimizer state and torchtitan extra state (loader position, LR schedule, counters)
are equal (``torch.equal``) to the fault-free run's; ``check_told_nothing`` accepts the traces.
Seeded defect (``TT_DEFECT=no-loader-state``: the worker's trainer saves an empty loader state): after
the kill the loader restarts from the beginning and the judge must find the difference.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from accelpact.impl.launch.launch import ProcessSet, worker_env  # noqa: E402 - after the torch skip
from accelpact.impl.rundir import RunDir  # noqa: E402 - after the torch skip

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

WORLD = 2
STEPS = 6
#: torchtitan's step (1-based) in which a rank waits for the strike (after the checkpoint of step 2)
PAUSE_STEP = 4
LAUNCH_S = 300.0
SYNC_S = 120.0
#: as tests/test_inflight_three_calls.py: a gloo op on sockets already shut down can stay blocked until
#: its group's timeout (bench/README.md, K6), so the collective timeout is short
SETTINGS = {"ACCELPACT_COLLECTIVE_TIMEOUT_S": "10", "ACCELPACT_PG_TIMEOUT_S": "15", "ACCELPACT_DEAD_AFTER_S": "5"}

WORKER = r'''
"""torchtitan's train.py under AccelPact (tests/test_torchtitan_train.py)."""
import os
import sys
import time
import types
from pathlib import Path

import torch
import torch._utils


def cpu_device_module():
    """torchtitan 0.3.0 takes ``_get_available_device_type() or "cuda"`` as its device and calls torch.cuda's
    memory functions; on CPU: "cpu", with a torch.cpu module that has them."""
    shim = types.ModuleType("torch_cpu_for_torchtitan")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(shim, name, getattr(torch.cpu, name))
    shim.get_device_name = lambda *a: "cpu"
    shim.get_device_properties = lambda *a: types.SimpleNamespace(total_memory=1 << 34)
    shim.memory_stats = lambda *a: {}
    shim.reset_peak_memory_stats = lambda *a: None
    shim.empty_cache = lambda *a: None
    shim.current_device = lambda: 0
    torch._utils._get_available_device_type = lambda: "cpu"
    real = torch._utils._get_device_module
    torch._utils._get_device_module = lambda t="cuda": shim if t == "cpu" else real(t)


cpu_device_module()

from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention  # noqa: E402 - after the CPU device module
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402 - after the CPU device module
from torchtitan.tools.logging import init_logger  # noqa: E402 - after the CPU device module

from accelpact.integrations import torchtitan as tt  # noqa: E402 - after the CPU device module

assets, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
init_logger()
config = llama3_debugmodel()
# FlexAttention has no backward on CPU (torch 2.13): the debug model with SDPA's causal attention
for _fqn, _cfg, parent, attr in list(config.model_spec.model.traverse(FlexAttention.Config)):
    setattr(parent, attr, ScaledDotProductAttention.Config())
config.hf_assets_path = f"{assets}/tokenizer"
config.dataloader.dataset_path = f"{assets}/data"
config.training.seq_len = 64
config.training.local_batch_size = 2
config.training.steps = steps
config.training.disable_cuda_graphs = True
config.lr_scheduler.total_steps = steps
config.parallelism.data_parallel_replicate_degree = 2
config.parallelism.data_parallel_shard_degree = 1
config.parallelism.spmd_backend = "partial_dtensor"
config.validator.enable = False
config.checkpoint.enable = True
config.checkpoint.interval = 2
config.debug.seed = 7
config.dump_folder = out

extra_state = tt.extra_state
if os.environ.get("TT_DEFECT") == "no-loader-state":  # seeded: the loader's position is not saved
    tt.extra_state = lambda trainer: {**extra_state(trainer), "dataloader": {}}

# TT_REBUILD=1: a discard builds the model anew with torchtitan's building code (else: in place, FSDP2's reset)
trainer = tt.AccelPactTrainer(config, trace_dir=out, rebuild=os.environ.get("TT_REBUILD") == "1" or None)
rank = trainer.accelpact_job.rank

# ---- the strike's half: a rank waits at PAUSE_STEP until the test process struck (first attempt only)
sync, strike = os.environ.get("TT_SYNC_DIR"), os.environ.get("TT_STRIKE", "")
pause = int(os.environ.get("TT_PAUSE_STEP", "-1"))
waiter = 1 if strike == "kill" else 0
armed = [bool(sync) and rank == waiter and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"]


def wait_for_the_strike(*_):
    if not armed[0] or trainer.step != pause:
        return
    armed[0] = False
    Path(sync, "paused").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120.0
    while not Path(sync, "struck").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def in_backward(module, args, output):
    if armed[0] and trainer.step == pause and output.requires_grad:
        output.register_hook(lambda grad: (wait_for_the_strike(), grad)[1])


if strike == "backward":
    trainer.model_parts[0].norm.register_forward_hook(in_backward)
elif strike in ("boundary", "kill"):
    trainer.optimizers.optimizers[0].register_step_post_hook(wait_for_the_strike)

trainer.train()

# ---- the final state, this rank's: parameters, optimizer state, torchtitan's extra state
model, optim = trainer.model_parts[0], trainer.optimizers.optimizers[0]


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


state = {f"param/{n}": local(p).detach().clone() for n, p in model.named_parameters()}
names = {id(p): n for n, p in model.named_parameters()}
for p, s in optim.state.items():
    state.update({f"optim/{names[id(p)]}/{k}": local(v).clone() for k, v in s.items()})
state["extra"] = extra_state(trainer)
torch.save(state, f"{out}/state-rank{rank}.pt")
trainer.close()
'''


def write_assets(root: Path) -> Path:
    """A word-level tokenizer (``tokenizer.json`` as the ``tokenizers`` library writes it) and a small text
    data set in c4_test's layout (JSON lines with a "text" field), made here: the wheel ships neither."""
    import random

    rnd = random.Random(0)
    words = [f"w{i}" for i in range(500)]
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "tokenizer.json").write_text(json.dumps(tok))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (root / "data").mkdir()
    lines = [json.dumps({"text": " ".join(rnd.choice(words) for _ in range(rnd.randint(20, 120)))}) for _ in range(400)]
    (root / "data" / "train.json").write_text("\n".join(lines) + "\n")
    return root


@functools.cache
def titan_python() -> tuple[str | None, str]:
    """(the interpreter torchtitan imports in, or None; why not)."""
    py = os.environ.get("ACCELPACT_TORCHTITAN_PYTHON") or (sys.executable if importlib.util.find_spec("torchtitan") else "")
    if not py:
        return None, "torchtitan is not importable here and ACCELPACT_TORCHTITAN_PYTHON is not set"
    probe = subprocess.run([py, "-c", "import torchtitan.trainer, accelpact.integrations.torchtitan"], capture_output=True,
                           text=True, timeout=180)
    if probe.returncode != 0:
        return None, f"{py}: import torchtitan.trainer failed: {probe.stderr.strip().splitlines()[-1:]}"
    return py, ""


@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    py, why = titan_python()
    if py is None:
        pytest.skip(why)
    return py, write_assets(tmp_path_factory.mktemp("torchtitan-assets"))


def torchrun(py: str, assets: Path, cwd: Path, name: str, env_extra: dict[str, str], restarts: int = 0) -> tuple[list[int], str, Path]:
    train = cwd / "tt_train.py"
    if not train.exists():
        train.write_text(WORKER)
    out = cwd / "runs" / name
    cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD), "--max-restarts",
           str(restarts), "--monitor-interval", "0.1", str(train), str(assets), str(out), str(STEPS)]
    env = {k: v for k, v in worker_env().items() if not k.startswith(("ACCELPACT_", "TT_"))}
    env.update(SETTINGS)
    env.update(env_extra)
    log = cwd / f"{name}.log"
    with ProcessSet() as ps, open(log, "wb") as f:
        ps.start(cmd, env=env, stdout=f, cwd=cwd)
        timed_out = ps.wait(LAUNCH_S)
        codes = ps.codes
    text = log.read_text(errors="replace")
    assert not timed_out, f"{name}: still running after {LAUNCH_S}s\n{text[-4000:]}"
    return codes, text, out


def _strike(sync: Path, cwd: Path, how: str, got: list) -> None:
    """From this process: wait for the marker, then cut rank 0's R (``backward``, ``boundary``) or
    SIGKILL rank 1 (``kill``), then let the waiting rank go on."""
    from datetime import timedelta

    import torch.distributed as dist

    from accelpact.impl.launch.job import Topology
    from accelpact.testing import inject
    from accelpact.testing.examples import worker_pid
    from accelpact.testing.soak.live import discover_groups, proc_env

    try:
        deadline = time.monotonic() + SYNC_S
        while not (sync / "paused").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("no rank reached the paused step")
            time.sleep(0.01)
        pids = {r: worker_pid("tt_train.py", r) for r in range(WORLD)}
        assert all(pids.values()), f"workers not found: {pids}"
        if how == "kill":
            os.kill(pids[1], signal.SIGKILL)
            got.append(("killed", pids[1]))
            return
        env = proc_env(pids[0])
        store = dist.TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=10))
        # with 2 replicas of 1 shard, R spans every rank like the default, control, checkpoint and world groups;
        # discover_groups labels those by creation order (accelpact.init: default, control, checkpoint, the
        # single-rank shard groups, replicate, world): R is the fourth of the five ("all-3")
        found = discover_groups(store, pids, Topology(2, 1), attempt=0)
        groups = [g for g in found if g.label == "all-3"]
        assert len(groups) == 1 and sorted(groups[0].members) == [0, 1], f"R not found (or not one): {found}"
        cut = inject.cut_links(pids[0], any_ports=groups[0].ports)
        got.append((sorted(groups[0].members), len(cut)))
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        got.append(exc)
    finally:
        (sync / "struck").write_text("1")


def run_struck(py: str, assets: Path, cwd: Path, how: str, defect: str = "") -> tuple[list[int], str, Path, list]:
    """``how``: a strike (module doc), ``backward-rebuild``: the backward cut discarded on a rebuilt model."""
    how, _, rebuild = how.partition("-")
    sync = cwd / f"{how}-sync"
    sync.mkdir()
    got: list = []
    t = threading.Thread(target=_strike, args=(sync, cwd, how, got), daemon=True)
    t.start()
    env = {"TT_SYNC_DIR": str(sync), "TT_PAUSE_STEP": str(PAUSE_STEP), "TT_STRIKE": how, "TT_REBUILD": "1" if rebuild else ""}
    if defect:
        env["TT_DEFECT"] = defect
    codes, text, out = torchrun(py, assets, cwd, how, env, restarts=1 if how == "kill" else 0)
    t.join(timeout=SYNC_S + 10)
    assert got and not isinstance(got[0], BaseException), got
    return codes, text, out, got


def judge(reference: Path, run: Path, codes: list[int], text: str, how: str) -> list[str]:
    """Every way ``run`` falls short of the promise (empty: it keeps it)."""
    from accelpact.conformance.checker import check_told_nothing
    from accelpact.impl.trace import load_traces

    how, _, rebuild = how.partition("-")
    problems: list[str] = []
    if codes != [0]:
        problems.append(f"torchrun exited {codes}: {text[-1500:]}")
    files = RunDir(run).trace_files()
    attempts = sorted({a for a, _r in files})
    if attempts != ([0, 1] if how == "kill" else [0]):
        problems.append(f"attempts {attempts} (expected {'a restart' if how == 'kill' else 'none'})")
    recs = {(a, r): RunDir(run).records(a, r) for (a, r) in files}
    acts = {k: [x.get("action") for x in v] for k, v in recs.items()}
    if how == "backward":
        observed = [x for v in recs.values() for x in v if x.get("action") == "RankObserve"]
        if not any(x.get("state", {}).get("point") == "backward" and x.get("detail", {}).get("cause") == "discard"
                   for x in observed):
            problems.append(f"no rank observed the cut in backward as a discard: {[x.get('state') for x in observed]}")
        problems += [f"rank {r} did not discard and resume: {acts.get((0, r))}" for r in range(WORLD)
                     if not {"RankDiscardStep", "RankResume"} <= set(acts.get((0, r), []))]
        rebinds = [x.get("detail", {}) for v in recs.values() for x in v if x.get("action") == "RankRebind"]
        if not rebinds or any(bool(d.get("rebuilt")) != bool(rebuild) for d in rebinds):
            problems.append(f"the discard was not {'on a rebuilt model' if rebuild else 'in place'}: {rebinds}")
    elif how == "boundary":
        problems += [f"rank {r} was not repaired in place: {acts.get((0, r))}" for r in range(WORLD)
                     if "RankResume" not in acts.get((0, r), []) or "RankDiscardStep" in acts.get((0, r), [])]
    elif how == "kill":
        starts = {json.loads(RunDir(run).trace(1, r).read_text().splitlines()[0]).get("frontier_at_start") for r in range(WORLD)
                  if (1, r) in files}
        if starts != {2}:
            problems.append(f"the restart resumed from {starts}, not from the checkpoint of step 2")
    for r in range(WORLD):
        a, b = reference / f"state-rank{r}.pt", run / f"state-rank{r}.pt"
        if not b.exists():
            problems.append(f"rank {r} saved no final state")
            continue
        x, y = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
        differ = [k for k in x if k != "extra" and (k not in y or not torch.equal(x[k], y[k]))]
        if differ or x.keys() != y.keys():
            problems.append(f"rank {r}: {len(differ)} tensors differ from the fault-free run, e.g. {differ[:3]}")
        if x["extra"] != y["extra"]:
            problems.append(f"rank {r}: torchtitan's extra state differs: {x['extra']} != {y['extra']}")
    try:
        for attempt, traces in sorted(load_traces(run).items()):
            verdict = check_told_nothing(traces)
            if not verdict.accepted:
                problems.append(f"the checker rejects attempt {attempt}'s traces: {verdict.message[:1500]}")
    except Exception as exc:  # noqa: BLE001 - an unreadable trace is a problem the judge reports
        problems.append(f"the traces cannot be checked: {exc!r}")
    return problems


@pytest.fixture(scope="module")
def reference(titan, tmp_path_factory):
    py, assets = titan
    cwd = tmp_path_factory.mktemp("torchtitan-reference")
    codes, text, out = torchrun(py, assets, cwd, "reference", {})
    assert codes == [0], text[-4000:]
    return out


@pytest.mark.nightly("starts torchtitan on 2 gloo CPU ranks twice (about a minute); tests/test_torchtitan.py runs the "
                     "adapter against fakes of torchtitan's interfaces in make test")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", ["backward", "backward-rebuild", "boundary", "kill"])
def test_torchtitan_debug_model_recovers_from_a_strike_bit_identical(titan, reference, tmp_path, how):
    py, assets = titan
    codes, text, out, got = run_struck(py, assets, tmp_path, how)
    if how != "kill":
        members, cut = got[0]
        assert members == [0, 1] and cut > 0, f"the cut found {cut} connection(s) of group {members}"
    problems = judge(reference, out, codes, text, how)
    assert not problems, "\n".join(problems)


@pytest.mark.nightly("starts torchtitan on 2 gloo CPU ranks with a restart (about a minute); the seeded defect of the "
                     "loader's saved state")
@pytest.mark.timeout(900)
def test_torchtitan_without_the_loader_state_fails_the_judge(titan, reference, tmp_path):
    py, assets = titan
    codes, text, out, _got = run_struck(py, assets, tmp_path, "kill", defect="no-loader-state")
    problems = judge(reference, out, codes, text, "kill")
    assert problems, "seeded defect no-loader-state: the judge found nothing wrong"
    print(f"no-loader-state: {problems[0][:300]}")
