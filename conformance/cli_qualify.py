"""``accelpact qualify --backend gloo|nccl [--trials 4] [--out FILE]``: build an envelope from evidence.

For each observation-key cell (platform, profile = wrapper, failure phase, objective) the
scenarios of that cell (the repair for ``boundary``, the in-flight rejection for
forward/backward/optimizer) run ``--trials`` times.  The envelope (model/contract.py format,
``save_envelope``) admits L1 only for boundary cells whose every trial conformed; every cell
whose trials all conformed is qualified for L2; a cell with a failing trial gets L2 only (the
fail-stop path is always the fallback) and its evidence records the failures.
No torch import at module level.
"""

from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    from ..impl.backends import BACKEND_NAMES

    parser.add_argument("--backend", default="gloo", choices=BACKEND_NAMES)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--out", default="envelope.json", help="envelope file to write (default envelope.json)")
    parser.add_argument("--wrappers", default="fsdp1-hybrid,fsdp2-hybrid,ddp", help="comma-separated wrappers to qualify")
    parser.add_argument("--phases", default="boundary,forward,backward,optimizer")
    parser.add_argument("--work", default="/tmp/accelpact-qualify", help="folder for the runs")


def cell_scenarios(wrapper: str, phase: str):
    """The corpus scenarios that stand for one cell (see conformance/generate.py names)."""
    from .generate import SCENARIO_DIR, SHORT
    from .scenario import load_scenario

    name = f"2x2-{SHORT[wrapper]}-{'repair' if phase == 'boundary' else 'reject-' + phase}"
    p = SCENARIO_DIR / f"{name}.json"
    return [load_scenario(p)] if p.exists() else []


def run(args) -> int:
    import platform as _platform

    import torch

    from ..impl.backends import backend
    from ..model.contract import DEFAULT_OBJECTIVE, Envelope, EnvelopeEntry, ObservationKey, save_envelope
    from .runner import run_scenario

    if args.trials < 1:
        print("qualify: --trials must be >= 1")
        return 2
    be = backend(args.backend)
    cells = []
    for wrapper in [w for w in args.wrappers.split(",") if w]:
        for phase in [p for p in args.phases.split(",") if p]:
            scs = cell_scenarios(wrapper, phase)
            if not scs:
                print(f"qualify: no corpus scenario for ({wrapper}, {phase}); cell skipped")
                continue
            cells.append((wrapper, phase, scs))
    world = max((sc.topology.world for _w, _p, scs in cells for sc in scs), default=1)
    why = be.unavailable(world)
    if why:
        print(f"qualify: {why}; use --backend gloo")
        return 2
    plat = {"torch": torch.__version__, "backend": args.backend, "python": _platform.python_version(),
            "driver": (torch.version.cuda or "none") if be.device_type == "cuda" else "none"}
    entries = []
    all_ok = True
    for wrapper, phase, scs in cells:
        passes, trials, failures = 0, 0, []
        for sc in scs:
            for t in range(args.trials):
                rep = run_scenario(sc, backend=args.backend, out=Path(args.work) / f"{sc.name}-t{t}")
                trials += 1
                passes += int(rep.conforms)
                if not rep.conforms:
                    failures.append(f"{sc.name} trial {t}: {'; '.join(rep.problems)[:300]}")
                print(f"  {sc.name} trial {t}: {'ok' if rep.conforms else 'FAILED'}", flush=True)
        ok = passes == trials
        all_ok = all_ok and ok
        acts = ("L1", "L2") if (phase == "boundary" and ok) else ("L2",)
        evidence = {"trials": trials, "passes": passes, "platform": plat, "scenarios": [s.name for s in scs]}
        if failures:
            evidence["failures"] = failures
        key = ObservationKey(be.platform, wrapper, phase, DEFAULT_OBJECTIVE)
        entries.append(EnvelopeEntry(key, acts, evidence))
        print(f"{key}: {passes}/{trials} conformed -> {list(acts)}")
    save_envelope(Envelope(tuple(entries)), args.out)
    print(f"wrote {args.out} ({len(entries)} entries)")
    return 0 if all_ok else 1
