"""The torch runtime: what the protocol engine drives on real process groups.

Backends (gloo, NCCL: drain, abort, rebuild), training wrappers and their adapters (DDP, FSDP1,
FSDP2: rebinding a wrapper to a rebuilt group), committed checkpoints, state digests, the L1
replace strategies, revoke, retiring replaced groups and the hot swap of a spare.  This layer may
import torch, the model (``accelpact.model``) and the engine's foundations (``controlplane``'s store
keys, ``threadname``, ``exitcodes``); it never imports the engine's protocol modules (``recovery``,
``episode``, ``effects``, ``watchdog``, ``detector``, ``guard``, ``hooks``), the launcher
(``accelpact.impl.launch``) or the test tooling (``accelpact.testing``): import-linter checks it.
"""
