"""The random state a step draws from, captured and restored in one place: the CPU generator and, where
CUDA is available, the CUDA generator of the rank's device.

"RNG back to F" (a discard's rerun, a hot swap's rebuild, the spare that takes a dead rank's identity, an
L2 resume from a checkpoint) must give the rerun of a step the random numbers the uninterrupted run drew:
dropout on the GPU draws from the device's generator (``torch.cuda.default_generators[i]``), not from the
CPU one, so restoring ``torch.set_rng_state`` alone lets a rerun with GPU dropout differ (issue 43).

A captured state is a dict ``{"cpu": ByteTensor, "cuda": ByteTensor | None}``; ``"cuda"`` is None where
CUDA is unavailable or was never initialised in this process (a CPU job: nothing changes for it).
:func:`restore` also takes the older form, a bare CPU ``ByteTensor`` (what a record published or a
checkpoint saved before this module holds): the CPU state only.  The CUDA state is restored onto the
rank's device (the one given, else the current one): a spare restores the dead rank's state on its own
device, whose index differs.  A state with a CUDA part restored where CUDA is unavailable (a GPU
checkpoint read on a CPU machine) restores the CPU part only.

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["capture", "cuda_state", "restore"]


def _available() -> bool:
    """Whether this process can use CUDA (``torch.cuda.is_available()``; one place, so that a test can
    stand in a CUDA machine for these functions alone)."""
    import torch

    return torch.cuda.is_available()


def _cuda_device(device: Any = None) -> Any:
    """The CUDA device whose generator is the rank's: ``device`` if it is a CUDA device, else the
    current CUDA device when CUDA is available and initialised here; None otherwise (a CPU job, or a
    process that never touched CUDA: nothing has drawn from a CUDA generator)."""
    import torch

    if not _available():
        return None
    if device is not None:
        dev = torch.device(device)
        return dev if dev.type == "cuda" else None
    if not torch.cuda.is_initialized():
        return None
    return torch.device("cuda", torch.cuda.current_device())


def cuda_state(device: Any = None) -> Any:
    """The CUDA generator state of the rank's device (:func:`_cuda_device`), a CPU ByteTensor; None
    where there is none to keep."""
    import torch

    dev = _cuda_device(device)
    return None if dev is None else torch.cuda.get_rng_state(dev)


def capture(device: Any = None) -> dict[str, Any]:
    """``{"cpu": ..., "cuda": ...}``: the CPU generator's state and the CUDA generator state of the rank's
    device (``device``, else the current CUDA device if CUDA is initialised; None without CUDA)."""
    import torch

    return {"cpu": torch.get_rng_state(), "cuda": cuda_state(device)}


def restore(state: Any, device: Any = None) -> None:
    """Put back a state of :func:`capture` (or the older bare CPU ``ByteTensor``): the CPU generator, and
    the CUDA generator of the rank's device where the state has a CUDA part and CUDA is available.
    None: nothing to restore."""
    import torch

    if state is None:
        return
    if not isinstance(state, dict):  # the older form: the CPU generator only
        torch.set_rng_state(state)
        return
    if state.get("cpu") is not None:
        torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if cuda is None or not _available():
        return
    dev = _cuda_device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev is not None:
        torch.cuda.set_rng_state(cuda, dev)
