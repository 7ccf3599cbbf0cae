"""Checkpoints: safetensors files written from and read into any framework, bits unchanged.

``save(tree, path, metadata=None)``, ``load(path, to=...)``, ``open(path)`` and
``load_for_target(path, to=..., dtype="auto")``. ``format`` reads and checks headers and lays
them out; ``io`` maps files privately and writes them atomically; ``target`` chooses dtypes
for a target. The data moves through ``convert``'s routes; nothing here names a framework.
docs/checkpoints.md has the rules (keys, zero-copy, what is copied and why, errors).
"""

from __future__ import annotations

from .format import CODES, MAX_HEADER, TensorInfo
from .io import Checkpoint, load, open, save
from .target import KeyReport, LoadReport, load_for_target

__all__ = ["CODES", "MAX_HEADER", "Checkpoint", "KeyReport", "LoadReport", "TensorInfo", "load",
           "load_for_target", "open", "save"]
