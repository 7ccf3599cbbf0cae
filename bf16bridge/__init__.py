"""bf16bridge: bfloat16 tensors between PyTorch, NumPy, TensorFlow and JAX,
bit for bit, without copying where the hardware allows.

Importing this package imports no framework: only the standard library,
numpy and ml_dtypes. Submodules (``bb.parity``, ``bb.kernels``, ...) load on
first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bf16bridge.core.adapter import Adapter, Handoff, Source
from bf16bridge.core.memory import aligned_empty
from bf16bridge.core.convert import convert, plan, to_jax, to_numpy, to_tensorflow, to_torch
from bf16bridge.errors import (
    Bf16BridgeError,
    Bf16BridgeWarning,
    CheckpointError,
    CopyRequiredError,
    CopyTooLargeError,
    DeviceError,
    FrameworkNotInstalledError,
    InputWrittenError,
    MissingKeyError,
    PrivateApiError,
    InvalidArgumentError,
    ShapeTooLargeError,
    UnknownFrameworkError,
    UnsupportedDtypeError,
    UnsupportedTypeError,
)
from bf16bridge.core.registry import framework_of, register_adapter
from bf16bridge.trees.convert import convert_tree, plan_tree

# fallback='auto' asks the capability probe, imported on the first conversion that needs it
importlib.import_module("bf16bridge.core.policy").set_auto_policy("bf16bridge.capabilities.probing:auto_policy")

# numpy is the hub: its adapter loads with the package (and registers NumPy 2.5's DLPack dtypes)
importlib.import_module("bf16bridge.adapters.numpy")

if TYPE_CHECKING:
    from bf16bridge import capabilities, casting, checkpoints, functions, kernels, parity, shards
    from bf16bridge.capabilities import Capabilities, Decision, probe
    from bf16bridge.casting import cast_module, cast_tree
    from bf16bridge.checkpoints import load, load_for_target, open, save
    from bf16bridge.core import dtypes
    from bf16bridge.core.plan import Plan, Step, TreePlan
    from bf16bridge.functions import BridgedFunction, bridge
    from bf16bridge.shards import Shard, convert_shards, from_shards

#: submodules loaded on first use (they import more, or are rarely needed): name -> module
_SUBMODULES = {name: name for name in ("adapters", "capabilities", "casting", "checkpoints", "cli", "errors",
                                       "functions", "kernels", "parity", "shards", "trees")}
_SUBMODULES["dtypes"] = "core.dtypes"
#: names that live in a lazily loaded submodule
_LAZY = {"bridge": "functions", "BridgedFunction": "functions", "probe": "capabilities", "Capabilities": "capabilities",
         "Decision": "capabilities", "Plan": "core.plan", "Step": "core.plan", "TreePlan": "core.plan",
         "cast_module": "casting", "cast_tree": "casting",
         "save": "checkpoints", "load": "checkpoints", "open": "checkpoints", "load_for_target": "checkpoints",
         "convert_shards": "shards", "from_shards": "shards", "Shard": "shards"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{_SUBMODULES[name]}")
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name == "__version__":
        from importlib import metadata  # costs milliseconds: only when asked

        try:
            return metadata.version("bf16bridge")
        except metadata.PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'bf16bridge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, *_LAZY, "__version__"})


__all__ = [
    "Adapter", "Bf16BridgeError", "Bf16BridgeWarning", "Capabilities", "CheckpointError", "CopyRequiredError", "CopyTooLargeError",
    "Decision", "DeviceError", "FrameworkNotInstalledError", "Handoff", "InputWrittenError", "InvalidArgumentError", "MissingKeyError", "Plan", "PrivateApiError", "ShapeTooLargeError", "Source",
    "Step", "TreePlan", "UnknownFrameworkError", "UnsupportedDtypeError", "UnsupportedTypeError", "__version__",
    "BridgedFunction", "Shard", "aligned_empty", "bridge", "cast_module", "cast_tree", "convert", "convert_shards",
    "convert_tree", "framework_of", "from_shards", "load", "load_for_target", "open", "plan", "plan_tree", "probe",
    "register_adapter", "save", "to_jax", "to_numpy", "to_tensorflow", "to_torch",
]
