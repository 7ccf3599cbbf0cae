"""bf16bridge: bfloat16 tensors between PyTorch, NumPy, TensorFlow and JAX,
bit for bit, without copying where the hardware allows.

Importing this package imports no framework: only the standard library,
numpy and ml_dtypes.
"""

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
from .probe import Capabilities, Decision, probe
from .registry import framework_of, register_adapter
from .routes import Plan, Step

__version__ = "0.1.0"

__all__ = [
    "Bf16BridgeError", "Capabilities", "Decision", "probe", "CopyRequiredError", "DeviceError", "FrameworkNotInstalledError", "Plan",
    "Step", "UnknownFrameworkError", "UnsupportedDtypeError", "UnsupportedTypeError", "__version__",
    "convert", "convert_tree", "framework_of", "plan", "register_adapter", "to_jax", "to_numpy",
    "to_tensorflow", "to_torch",
]
