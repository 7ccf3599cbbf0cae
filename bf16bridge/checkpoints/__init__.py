"""Checkpoints: safetensors files written from and read into any framework, bits unchanged.

``save(tree, path, metadata=None)``, ``load(path, to=...)``, ``open(path)`` and
``load_for_target(path, to=..., dtype="auto")``. ``format`` reads and checks headers and lays
them out (``decoder``: msgspec decodes them, where installed); ``keys`` flattens trees to dotted
keys; ``write`` streams a file atomically; ``read`` maps one privately; ``target`` chooses dtypes for a target. The data moves through ``convert``'s routes; nothing here names a framework.
docs/checkpoints.md has the rules (keys, zero-copy, what is copied and why, errors).
"""

from __future__ import annotations

from bf16bridge.checkpoints.format import CODES, MAX_HEADER, TensorInfo
from bf16bridge.checkpoints.read import Checkpoint, load, open
from bf16bridge.checkpoints.target import KeyReport, LoadReport, load_for_target
from bf16bridge.checkpoints.write import save

__all__ = ["CODES", "MAX_HEADER", "Checkpoint", "KeyReport", "LoadReport", "TensorInfo", "load",
           "load_for_target", "open", "save"]
