"""L2 checkpoints (impl/runtime/checkpoint.py): commit marker, crash mid-save, bit-identical reload, F - C replay.

Spec ids: P13.1 (commit marker only after every rank acknowledged), I6 (a crash mid-save never
yields a loaded half checkpoint), I5 / C5.2 (L2 replays exactly F - C steps and its state equals the
uninterrupted run's).

The multi-process cases use a tiny DDP stand-in (:func:`standin`, 2 ranks through
:mod:`accelpact.testing`: gloo on loopback, a launcher-hosted TCPStore) so that they do not depend
on the workload module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelpact.impl.runtime.checkpoint import MARKER, CheckpointError, committed_steps, latest_committed, step_dir

def standin(ctx, cfg: dict) -> None:
    """A tiny DDP job (2 ranks, gloo on loopback, the harness's launcher-hosted store) that
    checkpoints every ``cfg["every"]`` steps; ``kill_rank`` SIGKILLs itself mid-save of
    ``kill_step`` just before ``kill_file`` lands; ``exit_after`` exits 70 after that step."""
    import os
    import signal
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import accelpact.impl.runtime.checkpoint as ck

    rank, world, out = ctx.rank, ctx.world, cfg["out"]
    astore = dist.PrefixStore("attempt%d" % cfg["attempt"], ctx.store)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", astore), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)  # per-rank RNG stream (dropout), restored from the checkpoint
    mgr = ck.CheckpointManager(out + "/ckpt", every=cfg["every"], rank=rank, world=world,
                               store=dist.PrefixStore("ckpt", astore), commit_timeout_s=cfg.get("commit_timeout_s", 60))
    start = 0
    c = ck.latest_committed(out + "/ckpt", world=world)
    if c is not None:
        start = mgr.load(c, model, opt).step
    if cfg.get("kill_rank") == rank:
        real = ck._atomic_write

        def killing(path, data, _real=real):
            if f"step-{cfg['kill_step']}" in str(path) and path.name == cfg["kill_file"]:
                os.kill(os.getpid(), signal.SIGKILL)  # die mid-save, before this file lands
            _real(path, data)

        ck._atomic_write = killing

    def snap():
        return {"params": [p.detach().clone() for p in model.parameters()], "optim": opt.state_dict(),
                "rng": torch.get_rng_state()}

    def ran_file(extra: dict) -> None:
        Path(f"{out}/ran-a{cfg['attempt']}-r{rank}.json").write_text(json.dumps({"ran": ran, **extra}))

    ran = []
    for step in range(start, cfg["steps"]):
        g = torch.Generator().manual_seed(step * 1000 + rank)  # data cursor = step
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ran.append(step)
        f = step + 1
        if mgr.due(f):
            try:
                mgr.save(f, model, opt, cursor=f)
            except ck.CheckpointError as exc:
                print("commit failed:", exc, flush=True)
                ran_file({"commit_failed": f})
                os._exit(75)
            torch.save(snap(), f"{out}/snap-step{f}-a{cfg['attempt']}-r{rank}.pt")
        if cfg.get("exit_after") == f:
            ran_file({})
            os._exit(70)
    ran_file({"start": start})
    torch.save(snap(), f"{out}/final-a{cfg['attempt']}-r{rank}.pt")
    dist.barrier()


WORLD = 2


def _launch(ranks, cfg: dict, timeout: float = 120.0) -> list[int | None]:
    """Run the stand-in on WORLD ranks (accelpact.testing: every process bounded and reaped); the
    exit codes (a rank whose peer was killed may fail on its next collective: CRASHED)."""
    run = ranks.run(standin, WORLD, timeout_s=timeout, cfg=cfg)
    assert not run.hung, run.explain()
    return [run.codes[r] for r in range(WORLD)]


def _load(path: Path):
    import torch

    return torch.load(path, weights_only=False)


def _assert_identical(a: dict, b: dict) -> None:
    import torch

    assert len(a["params"]) == len(b["params"])
    for x, y in zip(a["params"], b["params"], strict=True):
        assert torch.equal(x, y)
    assert torch.equal(a["rng"], b["rng"])
    sa, sb = a["optim"]["state"], b["optim"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name in sa[k]:
            assert torch.equal(torch.as_tensor(sa[k][name]), torch.as_tensor(sb[k][name])), (k, name)


# ----------------------------------------------------------------------------- pure (no processes)

def test_latest_committed_ignores_uncommitted_and_foreign(tmp_path: Path) -> None:
    """P13.1/I6: only folders with a valid marker count; a torn or foreign marker is ignored."""
    assert latest_committed(tmp_path / "missing") is None
    for s in (2, 4, 6, 8):
        step_dir(tmp_path, s).mkdir(parents=True)
    (step_dir(tmp_path, 2) / MARKER).write_text(json.dumps({"step": 2, "world": 2}))
    (step_dir(tmp_path, 4) / MARKER).write_text(json.dumps({"step": 4, "world": 2}))
    (step_dir(tmp_path, 6) / MARKER).write_text('{"step": 6, "wor')          # torn write
    (step_dir(tmp_path, 8) / MARKER).write_text(json.dumps({"step": 8, "world": 4}))  # other world size
    (tmp_path / "step-x").mkdir()
    assert committed_steps(tmp_path, world=2) == [2, 4]
    assert latest_committed(tmp_path, world=2) == 4
    assert latest_committed(tmp_path) == 8


def test_load_refuses_uncommitted_folder(tmp_path: Path) -> None:
    """I6: loading a folder without the marker raises and says what to do instead."""
    import torch

    from accelpact.impl.runtime.checkpoint import CheckpointManager

    step_dir(tmp_path, 3).mkdir(parents=True)
    m = torch.nn.Linear(2, 2)
    mgr = CheckpointManager(tmp_path, every=1, rank=0, world=1)
    with pytest.raises(CheckpointError, match="latest_committed"):
        mgr.load(3, m, torch.optim.SGD(m.parameters(), lr=0.1))


# ----------------------------------------------------------------------------- multi-process

@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kill_rank,kill_file", [
    pytest.param(1, "rank1.pt", marks=pytest.mark.nightly("a second crash point (about 26 s): the crash before the commit marker runs every time")),
    (0, MARKER)])
def test_crash_mid_save_never_loads_half_checkpoint(ranks, tmp_path: Path, kill_rank: int, kill_file: str) -> None:
    """I6: SIGKILL of a rank mid-save (before its rank file / before the marker) leaves step 4
    uncommitted; the resume loads step 2, bit-identical to what was saved there."""
    cfg = {"out": str(tmp_path), "attempt": 0, "every": 2, "steps": 6, "kill_rank": kill_rank,
           "kill_step": 4, "kill_file": kill_file, "commit_timeout_s": 5}
    codes = _launch(ranks, cfg)
    assert codes[kill_rank] == -9, codes
    assert step_dir(tmp_path / "ckpt", 4).is_dir()          # the half checkpoint exists on disk ...
    assert not (step_dir(tmp_path / "ckpt", 4) / MARKER).exists()
    assert latest_committed(tmp_path / "ckpt", world=WORLD) == 2   # ... and is never chosen
    # Restart: every rank resumes from 2 and its state equals what it had at step 2.
    cfg2 = {"out": str(tmp_path), "attempt": 1, "every": 0, "steps": 2}
    assert _launch(ranks, cfg2) == [0, 0]
    for r in range(WORLD):
        ran = json.loads((tmp_path / f"ran-a1-r{r}.json").read_text())
        assert ran == {"ran": [], "start": 2}
        _assert_identical(_load(tmp_path / f"final-a1-r{r}.pt"), _load(tmp_path / f"snap-step2-a0-r{r}.pt"))


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_resume_replays_exactly_f_minus_c_and_ends_bit_identical(ranks, tmp_path: Path) -> None:
    """I5/C5.2: exit at F=5 with C=3 committed; the restart replays steps 3 and 4 (F - C = 2) and
    ends bit-identical (params, AdamW state, RNG) to an uninterrupted run."""
    ref = tmp_path / "ref"
    ref.mkdir()
    assert _launch(ranks, {"out": str(ref), "attempt": 0, "every": 3, "steps": 8}) == [0, 0]
    run = tmp_path / "run"
    run.mkdir()
    assert _launch(ranks, {"out": str(run), "attempt": 0, "every": 3, "steps": 8, "exit_after": 5}) == [70, 70]
    c = latest_committed(run / "ckpt", world=WORLD)
    assert c == 3
    assert _launch(ranks, {"out": str(run), "attempt": 1, "every": 3, "steps": 8}) == [0, 0]
    f = 5
    for r in range(WORLD):
        first = json.loads((run / f"ran-a0-r{r}.json").read_text())["ran"]
        second = json.loads((run / f"ran-a1-r{r}.json").read_text())["ran"]
        assert first == list(range(0, f))
        assert second[0] == c and second == list(range(c, 8))
        replayed = [s for s in second if s < f]
        assert len(replayed) == f - c
        _assert_identical(_load(run / f"final-a1-r{r}.pt"), _load(ref / f"final-a0-r{r}.pt"))


def test_a_collective_failing_while_the_state_dict_is_gathered_is_a_failed_save(tmp_path: Path, monkeypatch) -> None:
    """Soak K1 (30-minute soak, seed 1, a1/g2): FSDP1's optim_state_dict broadcasts on the default
    group inside the save; a cut there raised a raw RuntimeError out of the boundary (every rank
    exited 1, no record).  It is the save's failure (SaveFailed): the engine repairs and saves again."""
    import torch
    import torch.distributed.checkpoint.state_dict as sd

    from accelpact.impl.runtime.checkpoint import CheckpointManager, SaveFailed

    def gather_fails(*args, **kwargs):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:14057")

    monkeypatch.setattr(sd, "get_state_dict", gather_fails)
    model = torch.nn.Linear(2, 2)
    mgr = CheckpointManager(tmp_path, every=1, rank=0, world=1)
    with pytest.raises(SaveFailed, match="Connection closed by peer"):
        mgr.save(1, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert latest_committed(tmp_path) is None


# ---- a fault during the save (issue 41): every wait of the save ends on the verdict, one outcome on every rank ----
def _ack_managers(tmp_path: Path, world: int):
    import torch.distributed as dist

    from accelpact.impl.runtime.checkpoint import CheckpointManager

    store = dist.HashStore()
    folder = step_dir(tmp_path, 2)
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        (folder / f"rank{r}.pt").write_bytes(b"x")
    return [CheckpointManager(tmp_path, every=2, rank=r, world=world, store=store, commit_timeout_s=60) for r in range(world)], folder


def test_a_death_during_the_acknowledgements_withdraws_the_save_on_every_rank(tmp_path: Path) -> None:
    """Ranks 0 and 1 acknowledged and wait; rank 2 is declared (its death notice: ``abandoned()``
    names it).  Both waits end with SaveFailed naming rank 2, and a late acknowledgement of rank 2
    (it died just after its DCP shard, or its acknowledgement was in flight) finds the save withdrawn
    and fails too: nothing is committed, whoever acknowledged last."""
    import threading

    from accelpact.impl.runtime.checkpoint import Abandon, SaveFailed

    mgrs, folder = _ack_managers(tmp_path, 3)
    declared = threading.Event()
    results: dict = {}

    def rank(r: int) -> None:
        try:
            mgrs[r]._acknowledge_and_commit(2, folder, 5, lambda: Abandon("rank 2 died", (2,)) if declared.is_set() else None)
            results[r] = None
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    declared.set()
    for t in threads:
        t.join(30)
    for r in (0, 1):
        assert isinstance(results[r], SaveFailed) and results[r].dead == (2,), results
        assert "abandoned at 2/3 acknowledgements: rank 2 died" in str(results[r]), results
    with pytest.raises(SaveFailed, match="abandoned at 3/3 acknowledgements: a peer withdrew it"):
        mgrs[2]._acknowledge_and_commit(2, folder, 5, None)
    assert not (folder / MARKER).exists()


def test_a_save_every_rank_acknowledged_stands_on_a_rank_that_gives_up_after_it(tmp_path: Path) -> None:
    """Rank 0 waits; its slice ends just as ranks 1 and 2 acknowledge (rank 2 last: it sets ``all``),
    and by then a peer's death is posted (``abandoned()`` names it).  Rank 0's withdrawal finds every
    acknowledgement before it, and so does rank 1's after it: the save stands on every rank, and rank
    0 commits it (as the last acknowledger decided)."""
    from accelpact.impl.runtime.checkpoint import Abandon

    mgrs, folder = _ack_managers(tmp_path, 3)
    store = mgrs[0].store
    key, everyone, gone = "ckpt/step-2/g0/done", "ckpt/step-2/g0/all", "ckpt/step-2/g0/gone"

    class SliceEndsAsPeersAcknowledge:
        """Rank 0's store: its first wait's slice ends (a timeout) just after the peers acknowledged."""

        def __init__(self) -> None:
            self.first = True

        def __getattr__(self, name: str):
            return getattr(store, name)

        def wait(self, keys, timeout=None):
            if self.first:
                self.first = False
                assert int(store.add(key, 1)) == 2  # rank 1
                mgrs[2]._acknowledge_and_commit(2, folder, 0, None)  # rank 2, the last: `all` is set
                raise RuntimeError("Wait timeout")
            return store.wait(keys, timeout)

    mgrs[0].store = SliceEndsAsPeersAcknowledge()
    mgrs[0]._acknowledge_and_commit(2, folder, 0, lambda: Abandon("rank 1 died", (1,)))
    assert (folder / MARKER).exists() and json.loads((folder / MARKER).read_text())["tag"] == 0
    assert mgrs[1]._withdraw(key, everyone, gone, deadline=float("inf")) is None  # a second withdrawal: `all` says
    assert not store.check([gone])


def test_the_save_guard_interrupts_collectives_blocked_on_a_declared_peer(tmp_path: Path, monkeypatch) -> None:
    """While DCP's collectives run, the save guard asks ``abandoned()`` once per slice; once it names
    a dead rank, ``interrupt()`` (the engine's: the save's groups' sockets shut down) makes the blocked
    collective fail now: SaveFailed naming the rank, nothing acknowledged or committed."""
    import threading

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint.state_dict as sd

    from accelpact.impl.runtime.checkpoint import Abandon, CheckpointManager, SaveFailed

    shut = threading.Event()

    def blocked_on_a_stopped_peer(*args, **kwargs):  # a collective whose peer never answers
        if shut.wait(60):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
        raise AssertionError("the save's collective was never interrupted")

    monkeypatch.setattr(sd, "get_state_dict", blocked_on_a_stopped_peer)
    asked = []

    def abandoned():
        asked.append(1)
        return Abandon("rank 1 died or was deposed during the save (death notice)", (1,)) if len(asked) >= 2 else None

    interrupts = []
    store = dist.HashStore()
    mgr = CheckpointManager(tmp_path, every=1, rank=0, world=2, store=store, commit_timeout_s=60)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(SaveFailed, match="abandoned in its collectives: rank 1 died") as info:
        mgr.save(1, model, torch.optim.SGD(model.parameters(), lr=0.1), abandoned=abandoned,
                 interrupt=lambda: (interrupts.append(1), shut.set()))
    assert info.value.dead == (1,)
    assert interrupts == [1] and len(asked) == 2
    assert not store.check(["ckpt/step-1/g0/done"]) and latest_committed(tmp_path) is None
