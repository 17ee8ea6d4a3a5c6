"""``accelpact qualify --backend gloo|nccl [--trials 4] [--out FILE] [--list]``: build an envelope from evidence.

For each observation-key cell (platform = the backend's, profile = wrapper, failure phase,
objective) the scenarios of that cell (the repair for ``boundary``, the in-flight rejection for
forward/backward/optimizer) run ``--trials`` times.  The hot-swap cells (C1.2: a rank died, a spare
left, a live replica; ``--swap-phases``, default forward, backward, boundary) run the corpus's
``*-spare1-<phase>-crash-r1`` scenario of the wrapper: a crash taken over by a spare.  The envelope
(model/contract.py format, ``save_envelope``) admits L1 only for boundary cells and swap cells whose
every trial conformed; every cell whose trials all conformed is qualified for L2; a cell with a
failing trial gets L2 only (the fail-stop path is always the fallback) and its evidence records the
failures.

A cell's trials run under its *trial envelope* (:func:`trial_envelope`) when the shipped default
does not already admit L1 there (every platform but ``cpu-gloo``, e.g. ``cuda-nccl``): the engine
then attempts the in-place repair and the oracles judge it; without it an unqualified platform
would decide L2 at every failure and could never be qualified.  ``--list`` prints the cells and
their trial envelopes and runs nothing.  No torch import at module level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_arguments(parser) -> None:
    from ..impl.runtime.backends import BACKEND_NAMES

    parser.add_argument("--backend", default="gloo", choices=BACKEND_NAMES)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--out", default="envelope.json", help="envelope file to write (default envelope.json)")
    parser.add_argument("--wrappers", default="fsdp1-hybrid,fsdp2-hybrid,ddp", help="comma-separated wrappers to qualify")
    parser.add_argument("--phases", default="boundary,forward,backward,optimizer")
    parser.add_argument("--swap-phases", default="forward,backward,boundary",
                        help="hot-swap cells to qualify (a crash taken over by a spare), comma-separated; '' for none")
    parser.add_argument("--work", default="/tmp/accelpact-qualify", help="folder for the runs")
    parser.add_argument("--list", action="store_true", help="print the cells and their trial envelopes; run nothing")


def cell_scenarios(wrapper: str, phase: str, swap: bool = False):
    """The corpus scenarios that stand for one cell (see conformance/generate.py names); ``swap``: the
    hot-swap cell (a crash of rank 1 at ``phase`` with one spare; DDP on 2x1, HSDP on 2x2)."""
    from .generate import SCENARIO_DIR, SHORT
    from .scenario import load_scenario

    if swap:
        name = f"{'2x1' if SHORT[wrapper] == 'ddp' else '2x2'}-{SHORT[wrapper]}-spare1-{phase}-crash-r1"
    else:
        name = f"2x2-{SHORT[wrapper]}-{'repair' if phase == 'boundary' else 'reject-' + phase}"
    p = SCENARIO_DIR / f"{name}.json"
    return [load_scenario(p)] if p.exists() else []


def cells(backend_name: str, wrappers: str, phases: str, swap_phases: str = "") -> list[tuple[Any, list]]:
    """(observation key, its scenarios) of every cell to qualify on ``backend_name``'s platform;
    cells without a corpus scenario are left out (with a message)."""
    from ..impl.runtime.backends import backend
    from ..model.contract import DEFAULT_OBJECTIVE, ObservationKey

    platform = backend(backend_name).platform
    out = []
    for wrapper in [w for w in wrappers.split(",") if w]:
        for swap, chosen in ((False, phases), (True, swap_phases)):
            for phase in [p for p in chosen.split(",") if p]:
                scs = cell_scenarios(wrapper, phase, swap)
                if not scs:
                    print(f"qualify: no corpus scenario for ({wrapper}, {phase}{', swap' if swap else ''}); cell skipped")
                    continue
                out.append((ObservationKey(platform, wrapper, phase, DEFAULT_OBJECTIVE, died=swap, spare=swap,
                                           replica=swap), scs))
    return out


def trial_envelope(key):
    """The envelope a cell's trials run under, or None when the shipped default already decides for
    it as a qualified cell would (``cpu-gloo``: the default admits L1 at its boundary).  Otherwise the
    candidate cell of ``key``'s platform and profile: L1 and L2 at the boundary, L2 in flight
    (``default_envelope`` for that platform and profile).  Running under it does not qualify anything:
    the trials' oracles do."""
    from ..model.contract import ObservationKey, decide, default_envelope

    # an in-flight classic key is L2 by rule: its trials need the boundary's verdict; a swap key its own
    probe = key if key.died else ObservationKey(key.platform, key.profile, "boundary", key.objective)
    if decide(default_envelope(), probe, guards_ok=True).preserve:
        return None
    return default_envelope(platform=key.platform, profiles=(key.profile,), objective=key.objective)


def run(args) -> int:
    import platform as _platform

    from ..impl.runtime.backends import backend
    from ..model.contract import Envelope, EnvelopeEntry, save_envelope

    if args.trials < 1:
        print("qualify: --trials must be >= 1")
        return 2
    be = backend(args.backend)
    todo = cells(args.backend, args.wrappers, args.phases, getattr(args, "swap_phases", ""))
    if getattr(args, "list", False):
        for key, scs in todo:
            trial = trial_envelope(key)
            print(f"{key}: scenarios {[s.name for s in scs]}; trial envelope: "
                  f"{'the default' if trial is None else [list(e.actions) for e in trial.entries if e.key == key]}")
        return 0
    world = max((sc.topology.world for _k, scs in todo for sc in scs), default=1)
    why = be.unavailable(world)
    if why:
        print(f"qualify: {why}; use --backend gloo")
        return 2
    import torch

    from .runner import run_scenario

    plat = {"torch": torch.__version__, "backend": args.backend, "python": _platform.python_version(),
            "driver": (torch.version.cuda or "none") if be.device_type == "cuda" else "none"}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    entries = []
    all_ok = True
    for key, scs in todo:
        trial = trial_envelope(key)
        extra: dict[str, Any] = {}
        if trial is not None:
            path = work / f"trial-{key.platform}-{key.profile}.json"
            save_envelope(trial, path)
            extra["envelope"] = str(path)
        passes, trials, failures = 0, 0, []
        for sc in scs:
            for t in range(args.trials):
                rep = run_scenario(sc, backend=args.backend, out=work / f"{sc.name}-t{t}", **extra)
                trials += 1
                passes += int(rep.conforms)
                if not rep.conforms:
                    failures.append(f"{sc.name} trial {t}: {'; '.join(rep.problems)[:300]}")
                print(f"  {sc.name} trial {t}: {'ok' if rep.conforms else 'FAILED'}", flush=True)
        ok = passes == trials
        all_ok = all_ok and ok
        acts = ("L1", "L2") if ((key.phase == "boundary" or key.died) and ok) else ("L2",)
        evidence = {"trials": trials, "passes": passes, "platform": plat, "scenarios": [s.name for s in scs]}
        if failures:
            evidence["failures"] = failures
        entries.append(EnvelopeEntry(key, acts, evidence))
        print(f"{key}: {passes}/{trials} conformed -> {list(acts)}")
    save_envelope(Envelope(tuple(entries)), args.out)
    print(f"wrote {args.out} ({len(entries)} entries)")
    return 0 if all_ok else 1
