"""bf16bridge: bfloat16 tensors between PyTorch, NumPy, TensorFlow and JAX,
bit for bit, without copying where the hardware allows.

Importing this package imports no framework: only the standard library,
numpy and ml_dtypes.
"""

from .adapters.numpy import aligned_empty
from .convert import convert, convert_tree, plan, to_jax, to_numpy, to_tensorflow, to_torch
from .errors import (
    Bf16BridgeError,
    CopyRequiredError,
    DeviceError,
    FrameworkNotInstalledError,
    UnknownFrameworkError,
    UnsupportedDtypeError,
    UnsupportedTypeError,
)
from .registry import framework_of, register_adapter

__version__ = "0.1.0"


def __getattr__(name):
    # The planner and the probe load on first use, to keep `import bf16bridge` as cheap
    # as importing numpy and ml_dtypes.
    if name in ("probe", "Capabilities", "Decision"):
        from . import capabilities

        return getattr(capabilities, name)
    if name in ("Plan", "Step"):
        from . import routes

        return getattr(routes, name)
    raise AttributeError(f"module 'bf16bridge' has no attribute {name!r}")

__all__ = [
    "Bf16BridgeError", "Capabilities", "Decision", "aligned_empty", "probe", "CopyRequiredError", "DeviceError", "FrameworkNotInstalledError", "Plan",
    "Step", "UnknownFrameworkError", "UnsupportedDtypeError", "UnsupportedTypeError", "__version__",
    "convert", "convert_tree", "framework_of", "plan", "register_adapter", "to_jax", "to_numpy",
    "to_tensorflow", "to_torch",
]
