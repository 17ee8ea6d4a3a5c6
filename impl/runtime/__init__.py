"""The torch runtime: what the protocol engine drives on real process groups.

Backends (gloo, NCCL: drain, abort, rebuild), training wrappers and their adapters (DDP, FSDP1,
FSDP2: rebinding a wrapper to a rebuilt group), committed checkpoints, state digests, the L1
replace strategies and the hot swap of a spare.  This layer may import torch, the model
(``accelpact.model``) and the engine's leaf modules (``accelpact.impl.controlplane``,
``accelpact.impl.trace``, ...); it never imports the launcher (``accelpact.impl.launch``) or the
test tooling (``accelpact.testing``).  The engine imports it lazily where it needs torch.
"""
