"""The random state "RNG back to F" restores (issue 43 item 2): the CPU generator and the CUDA generator
of the rank's device, captured and restored in one place (``impl/runtime/rng.py``) by the training
publish, the hot swap's publish, the swap's or discard's rebuild (``Effects._rebind``) and the checkpoint.

What runs here, on a CPU-only torch: the whole path on the CPU generator (the workload with dropout, its
rerun after the discard's restore equal to the uninterrupted step, and different without the restore);
the CUDA part through a stand-in for ``torch.cuda``'s generator functions (which device's state is read
and written, and that it travels with the published and checkpointed state).  Real GPU dropout drawing
from the CUDA generator is ``python -m accelpact.bench.gpu_check``'s ``device_rng_rerun`` (not run here).
"""

from __future__ import annotations

import types

import pytest
import torch

from accelpact.impl import effects
from accelpact.impl.effects import Effects
from accelpact.impl.launch import workload as W
from accelpact.impl.launch.training import Training
from accelpact.impl.runtime import hotswap, rng
from accelpact.impl.runtime.checkpoint import CheckpointManager


class FakeCuda:
    """``torch.cuda``'s generator functions for devices 0..3 of a machine that has none: a state per device
    (a ByteTensor), what ``get_rng_state``/``set_rng_state`` read and write, and a draw that moves it."""

    def __init__(self, monkeypatch, current: int = 0) -> None:
        self.states = {i: torch.tensor([i, 0], dtype=torch.uint8) for i in range(4)}
        self.current = current
        monkeypatch.setattr(rng, "_available", lambda: True)  # for rng alone: DCP and torch see the CPU machine
        for name, fn in (("is_initialized", lambda: True), ("current_device", lambda: self.current),
                         ("get_rng_state", self.get), ("set_rng_state", self.set)):
            monkeypatch.setattr(torch.cuda, name, fn)

    @staticmethod
    def _index(device) -> int:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        assert d.type == "cuda", d
        return d.index or 0

    def get(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def draw(self, device: int) -> None:
        """What a dropout kernel on ``cuda:device`` does to its generator: moves it on."""
        self.states[device] = self.states[device] + torch.tensor([0, 1], dtype=torch.uint8)


def test_capture_and_restore_on_the_cpu_and_the_older_form():
    torch.manual_seed(3)
    state = rng.capture()
    assert set(state) == {"cpu", "cuda"} and (torch.cuda.is_available() or state["cuda"] is None)
    a = torch.rand(4)
    rng.restore(state)
    assert torch.equal(torch.rand(4), a)
    old_form = state["cpu"]  # what a record published before rng.py held: the CPU state alone
    torch.rand(7)
    rng.restore(old_form)
    assert torch.equal(torch.rand(4), a)
    rng.restore(None)  # nothing published: nothing restored, nothing raised


def test_the_cuda_generator_of_the_ranks_device_is_captured_and_restored(monkeypatch):
    cuda = FakeCuda(monkeypatch, current=1)
    state = rng.capture(torch.device("cuda", 2))
    assert torch.equal(state["cuda"], cuda.states[2]), "the given device's generator"
    assert torch.equal(rng.capture()["cuda"], cuda.states[1]), "without a device: the current one"
    assert rng.capture(torch.device("cpu"))["cuda"] is None, "a CPU job keeps no CUDA state"
    at_f = cuda.get(2)
    cuda.draw(2)
    rng.restore(state, torch.device("cuda", 2))
    assert torch.equal(cuda.states[2], at_f)
    # a spare restores the dead rank's state onto its own device (another index)
    rng.restore(state, torch.device("cuda", 3))
    assert torch.equal(cuda.states[3], at_f)
    # no CUDA here (a GPU checkpoint read on a CPU machine): the CPU part only, nothing raised
    monkeypatch.setattr(rng, "_available", lambda: False)
    before = {i: s.clone() for i, s in cuda.states.items()}
    rng.restore(state)
    assert all(torch.equal(cuda.states[i], before[i]) for i in before)


def test_the_published_state_carries_the_cuda_generator(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    store = torch.distributed.HashStore()
    rec = hotswap.publish_state(store, 1, 4, {"kappa": 4}, device=torch.device("cuda", 1))
    back = hotswap.read_state(store, 1)
    assert back is not None and torch.equal(back["rng"]["cuda"], cuda.states[1]) and torch.equal(rec["rng"]["cuda"], cuda.states[1])
    assert torch.equal(back["rng"]["cpu"], torch.get_rng_state())
    keep = types.SimpleNamespace(extra_state=None, job=types.SimpleNamespace(device=torch.device("cuda", 0)),
                                 pact=types.SimpleNamespace(frontier=4))
    Training._keep_for_discard(keep)  # a discard's state at F, without spares
    assert torch.equal(keep._published["rng"]["cuda"], cuda.states[0])


# ---- the discard's rerun with dropout: the CPU generator path, for real --------------------------------

def _rebuild_and_rerun(spec: W.WorkloadSpec, published: dict, committed: dict, x: torch.Tensor) -> torch.Tensor:
    """``Effects._rebind``'s rebuild branch ("RNG back to F", the model built anew) on a stub engine, then
    the rerun of the discarded step's forward in training mode."""
    def rebuild(job, extra):
        torch.manual_seed(99)  # the user's factory may draw: the restore comes after it
        model = W.CharLM(W.vocab_size(), spec)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    sw = types.SimpleNamespace(rebuild=rebuild, job=types.SimpleNamespace(device=torch.device("cpu")), extra=None,
                               rng=published["rng"], old=None, module=None, optimizer=None, kind=None)
    Effects._rebind(types.SimpleNamespace(), types.SimpleNamespace(swap=sw))
    sw.module.load_state_dict(committed)  # the committed state (the swap's transfer; draws nothing)
    sw.module.train()
    return sw.module(x).detach()


def _discarded_step_reruns_equal(monkeypatch) -> bool:
    """The recorded fact the seeded-defect test reads: a step run at F with dropout, then discarded and
    rerun after the engine's rebuild, gives the same output as the uninterrupted run."""
    monkeypatch.setattr(effects, "wrapper_of", lambda module: types.SimpleNamespace(recovers="world"))
    spec = W.WorkloadSpec(wrapper="ddp", layers=1, dim=16, heads=2, seq=8, batch=2, dropout=0.3)
    torch.manual_seed(0)
    model = W.CharLM(W.vocab_size(), spec)
    model.train()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    x, _ = W.DataCursor(0, spec.batch, spec.seq, 0, 1).batch(0)
    keep = types.SimpleNamespace(extra_state=None, job=types.SimpleNamespace(device=torch.device("cpu")),
                                 pact=types.SimpleNamespace(frontier=0))
    Training._keep_for_discard(keep)  # F's state, as the training publish takes it at the boundary
    uninterrupted = model(x).detach()
    rerun = _rebuild_and_rerun(spec, keep._published, committed, x)
    return bool(torch.equal(rerun, uninterrupted))


def test_a_discarded_steps_rerun_with_dropout_equals_the_uninterrupted_step(monkeypatch):
    assert _discarded_step_reruns_equal(monkeypatch)


def test_seeded_defect_the_rng_not_restored_makes_the_rerun_differ(monkeypatch):
    """Seeded defect: ``Effects._rebind`` no longer restores the RNG (``rng.restore`` a no-op).  The
    rerun's dropout then draws other masks: the fact the test above reads is False, so it fails."""
    monkeypatch.setattr(effects._rng, "restore", lambda state, device=None: None)
    assert not _discarded_step_reruns_equal(monkeypatch)


def test_dropout_is_an_option_off_by_default():
    assert W.WorkloadSpec().dropout == 0.0
    with pytest.raises(ValueError, match="dropout"):
        W.WorkloadSpec(dropout=1.0)
    layer = W.CharLM(W.vocab_size(), W.WorkloadSpec(layers=1, dim=16, heads=2, seq=8, dropout=0.25)).layers[0].layer
    assert layer.dropout.p == 0.25


# ---- the checkpoint: the CUDA state in the rank file; an older file loads --------------------------------

def _save_and_load(tmp_path, monkeypatch, *, drop_cuda_key: bool) -> tuple[bool, bool]:
    cuda = FakeCuda(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mgr = CheckpointManager(tmp_path, every=1, rank=0, world=1, device=torch.device("cuda", 0), group_errors=dict)
    mgr.save(1, model, opt)
    saved_cuda, saved_cpu = cuda.get(0), torch.get_rng_state()
    path = tmp_path / "step-1" / "rank0.pt"
    local = torch.load(path, weights_only=False)
    assert torch.equal(local["cuda_rng"], saved_cuda)
    if drop_cuda_key:  # a rank file written before the CUDA state was kept
        del local["cuda_rng"]
        torch.save(local, path)
    cuda.draw(0)
    torch.rand(5)
    mgr.load(1, model, opt)
    return bool(torch.equal(cuda.get(0), saved_cuda)), bool(torch.equal(torch.get_rng_state(), saved_cpu))


def test_the_checkpoint_keeps_and_restores_the_cuda_generator(tmp_path, monkeypatch):
    assert _save_and_load(tmp_path, monkeypatch, drop_cuda_key=False) == (True, True)


def test_an_older_checkpoint_without_the_cuda_state_still_loads(tmp_path, monkeypatch):
    cuda_restored, cpu_restored = _save_and_load(tmp_path, monkeypatch, drop_cuda_key=True)
    assert cpu_restored and not cuda_restored, "no CUDA state in the file: the CPU one only"
