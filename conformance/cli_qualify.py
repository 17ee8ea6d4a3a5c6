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

Each cell's evidence (:func:`cell_evidence`) says what the trials ran on: the scenario topology's
``nodes`` and ``ranks_per_node``, the ``hosts`` its ranks ran on (qualify launches every rank on this
machine: :data:`QUALIFY_HOSTS`), the backend, torch and (NCCL) NCCL versions, and the ``transport``.
``inter_node`` is true only when ranks of different nodes ran on different hosts; an HSDP cell
without it gets a warning (:func:`inter_node_warning`): its R traffic never crossed a network, and a
single-node run meets neither a real NCCL timeout nor an inter-node failure of R (issue 26 item 5).

``--real-timeout`` (NCCL only) adds to each boundary cell the trials of its repair scenario with the
boundary ``collective_timeout`` (an abort from outside) replaced by a genuine NCCL timeout: R's
boundary collective queued behind a device spin longer than R's timeout
(:mod:`accelpact.testing.nccl_timeout`); the cell is L1 only if those conform too, and its evidence
says ``real_timeout``.  Elsewhere, or while that fault kind is not registered in
``accelpact/model/faults.py`` ``KINDS``, the flag is skipped with the reason (:func:`real_timeout_problem`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .generate import SCENARIO_DIR, SHORT, _classic_name
from . import runner
from .scenario import load_scenario
from ..impl.runtime.backends import BACKEND_NAMES, backend, one_gpu_env
from ..impl.runtime.wrappers import WRAPPERS
from ..model.contract import (DEFAULT_OBJECTIVE, DISCARD_PHASES, Envelope, EnvelopeEntry, ObservationKey, decide,
                              default_envelope, save_envelope)
from ..testing import nccl_timeout as nt
from ..model.faults import KINDS
from ..testing.nccl_timeout import KIND

#: The hosts a qualify run's ranks occupy: every scenario is launched on this machine
#: (``runner.run_scenario``: the local launcher, the store on 127.0.0.1), whatever its topology says.
QUALIFY_HOSTS = 1
#: The profiles whose replicate group R spans nodes (HSDP): a cell of one is only qualified across
#: nodes when its trials ran on more than one host.
HSDP_PROFILES: tuple[str, ...] = ("hsdp", *(w.name for w in WRAPPERS.values() if w.recovers == "replicate"))
#: The NCCL variables that choose its transport, in the order the evidence lists them.
NCCL_TRANSPORT_ENV: tuple[str, ...] = ("NCCL_NET", "NCCL_SOCKET_IFNAME", "NCCL_HOSTID")
NCCL_TRANSPORT_UNKNOWN = "unknown: set by NCCL at init"


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="gloo", choices=BACKEND_NAMES)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--out", default="envelope.json", help="envelope file to write (default envelope.json)")
    parser.add_argument("--wrappers", default=",".join(WRAPPERS), help="comma-separated wrappers to qualify (default: every wrapper of the table)")
    parser.add_argument("--phases", default="boundary,forward,backward,optimizer")
    parser.add_argument("--swap-phases", default="forward,backward,boundary",
                        help="hot-swap cells to qualify (a crash taken over by a spare), comma-separated; '' for none")
    parser.add_argument("--work", default="/tmp/accelpact-qualify", help="folder for the runs")
    parser.add_argument("--list", action="store_true", help="print the cells and their trial envelopes; run nothing")
    parser.add_argument("--real-timeout", action="store_true",
                        help="NCCL only: also run each boundary cell's repair as a genuine NCCL timeout of R (a device "
                             "spin longer than R's timeout before the boundary collective)")


def cell_scenarios(wrapper: str, phase: str, swap: bool = False):
    """The corpus scenarios that stand for one cell (see conformance/generate.py names); ``swap``: the
    hot-swap cell (a crash of rank 1 at ``phase`` with one spare; DDP on 2x1, HSDP on 2x2)."""
    if swap:
        name = f"{'2x1' if SHORT[wrapper] == 'ddp' else '2x2'}-{SHORT[wrapper]}-spare1-{phase}-crash-r1"
    else:
        name = f"2x2-{SHORT[wrapper]}-{_classic_name(phase)}"
    p = SCENARIO_DIR / f"{name}.json"
    return [load_scenario(p)] if p.exists() else []


def cells(backend_name: str, wrappers: str, phases: str, swap_phases: str = "") -> list[tuple[Any, list]]:
    """(observation key, its scenarios) of every cell to qualify on ``backend_name``'s platform;
    cells without a corpus scenario are left out (with a message)."""
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


def real_timeout_problem(backend_name: str) -> str | None:
    """Why ``--real-timeout`` cannot run on ``backend_name`` here (None: it can): the fault is NCCL only
    (:func:`accelpact.testing.nccl_timeout.unavailable`), and a scenario can name it only once it is a
    fault kind (``accelpact/model/faults.py`` ``KINDS``)."""
    why = nt.unavailable(backend_name)
    if why:
        return why
    if nt.KIND not in KINDS:
        return (f"the fault kind {nt.KIND!r} is not registered in accelpact/model/faults.py KINDS (its effect is "
                "accelpact.testing.nccl_timeout.nccl_timeout; spec/nccl.md, 'A genuine NCCL timeout')")
    return None


def real_timeout_scenario(sc):
    """``sc`` (a boundary repair) with each ``collective_timeout`` at the boundary made a genuine NCCL
    timeout of the same group on the same ranks, named ``<name>-nccl_timeout``."""
    import dataclasses

    faults = tuple(dataclasses.replace(f, kind=KIND) if (f.kind == "collective_timeout" and f.at == "boundary") else f
                   for f in sc.faults)
    return dataclasses.replace(sc, name=f"{sc.name}-{KIND}", faults=faults)


def trial_envelope(key):
    """The envelope a cell's trials run under, or None when the shipped default already decides for
    it as a qualified cell would (``cpu-gloo``: the default admits L1 at its boundary).  Otherwise the
    candidate cell of ``key``'s platform and profile: L1 and L2 at the boundary, L2 in flight
    (``default_envelope`` for that platform and profile).  Running under it does not qualify anything:
    the trials' oracles do."""
    # inside optimizer.step() a classic key is L2 by rule: its trials need the boundary's verdict; a swap
    # key and a discard in forward or backward (P17) their own
    probe = key if key.died or key.phase in DISCARD_PHASES else ObservationKey(key.platform, key.profile, "boundary",
                                                                                key.objective)
    if decide(default_envelope(), probe, guards_ok=True).preserve:
        return None
    return default_envelope(platform=key.platform, profiles=(key.profile,), objective=key.objective)


def nccl_version() -> str | None:
    """The NCCL version torch was built with (``torch.cuda.nccl.version()``, e.g. ``"2.21.5"``), or None
    when this build has none (a CPU wheel) or torch cannot say.  Does not initialise CUDA."""
    try:
        import torch.cuda.nccl as nccl

        v = nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build has no _nccl_version; any failure means "unknown"
        return None
    return ".".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)


def transport(backend_name: str, environ: Mapping[str, str] | None = None) -> str:
    """How the trials' collectives travelled, as far as the environment says.  Gloo: TCP, on
    ``GLOO_SOCKET_IFNAME`` when set, else on loopback (the ranks rendezvous on 127.0.0.1).  NCCL: the
    variables of :data:`NCCL_TRANSPORT_ENV` that are set (the one-GPU mode's, which its ranks set,
    included), else :data:`NCCL_TRANSPORT_UNKNOWN` (NCCL picks NVLink/SHM/P2P/IB/socket at init)."""
    env = dict(os.environ if environ is None else environ)
    if backend(backend_name).device_type == "cpu":
        ifname = env.get("GLOO_SOCKET_IFNAME")
        return f"tcp GLOO_SOCKET_IFNAME={ifname}" if ifname else "tcp loopback"
    env = {**env, **{k: v for k, v in one_gpu_env(0, env).items() if k in NCCL_TRANSPORT_ENV}}
    if "NCCL_HOSTID" in one_gpu_env(0, env):
        env["NCCL_HOSTID"] = "accelpact-one-gpu-rank{LOCAL_RANK}"  # one per process (ONE_GPU_ENV)
    got = [f"{k}={env[k]}" for k in NCCL_TRANSPORT_ENV if env.get(k)]
    return ", ".join(got) if got else NCCL_TRANSPORT_UNKNOWN


def cell_evidence(key, scenarios: Sequence, *, backend_name: str, trials: int, passes: int,
                  failures: Sequence[str] = (), platform_info: Mapping[str, Any] | None = None,
                  torch_version: str | None = None, nccl: str | None = None, hosts: int = QUALIFY_HOSTS,
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``evidence`` of one qualified cell: the trial counts, the scenarios, and what they ran on:
    ``nodes`` / ``ranks_per_node`` (the scenarios' topology; the largest when several), ``hosts`` (the
    machines the ranks ran on), ``inter_node`` (ranks of different nodes on different hosts: ``nodes > 1
    and hosts > 1``), ``backend``, ``torch``, ``nccl`` (the NCCL version on NCCL, :func:`nccl_version`
    unless given; None on gloo) and ``transport`` (:func:`transport`).  No process is started."""
    be = backend(backend_name)
    nodes = max((sc.topology.nodes for sc in scenarios), default=1)
    per_node = max((sc.topology.ranks_per_node for sc in scenarios), default=1)
    ev: dict[str, Any] = {"trials": trials, "passes": passes, "scenarios": [s.name for s in scenarios]}
    if platform_info is not None:
        ev["platform"] = dict(platform_info)
    ev.update({"nodes": nodes, "ranks_per_node": per_node, "hosts": hosts, "inter_node": nodes > 1 and hosts > 1,
               "backend": be.name, "torch": torch_version,
               "nccl": (nccl if nccl is not None else nccl_version()) if be.device_type == "cuda" else None,
               "transport": transport(be.name, environ)})
    if failures:
        ev["failures"] = list(failures)
    return ev


def inter_node_warning(key, evidence: Mapping[str, Any]) -> str | None:
    """The warning qualify prints for an HSDP cell (:data:`HSDP_PROFILES`) whose evidence is not
    ``inter_node``; None otherwise."""
    if key.profile not in HSDP_PROFILES or evidence.get("inter_node"):
        return None
    return (f"qualify: WARNING: cell {key} was not qualified across nodes (topology {evidence.get('nodes')}x"
            f"{evidence.get('ranks_per_node')} on {evidence.get('hosts')} host(s), transport "
            f"{evidence.get('transport')}): R's traffic never crossed a network, so no real inter-node NCCL timeout "
            f"or error was met; the evidence says inter_node: false")


def run(args) -> int:
    import platform as _platform

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

    plat = {"torch": torch.__version__, "backend": args.backend, "python": _platform.python_version(),
            "driver": (torch.version.cuda or "none") if be.device_type == "cuda" else "none"}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    real = bool(getattr(args, "real_timeout", False))
    if real and (why := real_timeout_problem(args.backend)):
        print(f"qualify: --real-timeout skipped: {why}")
        real = False
    entries = []
    all_ok = True
    for key, scs in todo:
        if real and key.phase == "boundary" and not key.died:
            scs = [*scs, *(real_timeout_scenario(sc) for sc in scs)]
        trial = trial_envelope(key)
        extra: dict[str, Any] = {}
        if trial is not None:
            path = work / f"trial-{key.platform}-{key.profile}.json"
            save_envelope(trial, path)
            extra["envelope"] = str(path)
        passes, trials, failures = 0, 0, []
        for sc in scs:
            for t in range(args.trials):
                rep = runner.run_scenario(sc, backend=args.backend, out=work / f"{sc.name}-t{t}", **extra)
                trials += 1
                passes += int(rep.conforms)
                if not rep.conforms:
                    failures.append(f"{sc.name} trial {t}: {'; '.join(rep.problems)[:300]}")
                print(f"  {sc.name} trial {t}: {'ok' if rep.conforms else 'FAILED'}", flush=True)
        ok = passes == trials
        all_ok = all_ok and ok
        acts = ("L1", "L2") if ((key.phase in ("boundary", *DISCARD_PHASES) or key.died) and ok) else ("L2",)
        evidence = cell_evidence(key, scs, backend_name=args.backend, trials=trials, passes=passes, failures=failures,
                                 platform_info=plat, torch_version=torch.__version__)
        if key.phase == "boundary" and not key.died:
            evidence["real_timeout"] = real  # R met a genuine NCCL timeout in some trials (else only an abort)
        warning = inter_node_warning(key, evidence)
        if warning:
            print(warning, flush=True)
        entries.append(EnvelopeEntry(key, acts, evidence))
        print(f"{key}: {passes}/{trials} conformed -> {list(acts)}")
    save_envelope(Envelope(tuple(entries)), args.out)
    print(f"wrote {args.out} ({len(entries)} entries)")
    return 0 if all_ok else 1
