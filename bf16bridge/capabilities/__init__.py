"""The capability probe: what this machine and these libraries can do with bf16 (``probe()``)."""

from bf16bridge.capabilities.probing import probe, probed_dtypes
from bf16bridge.capabilities.records import (
    Capabilities, Decision, Device, DtypeSupport, FrameworkCaps, NarrowCompute, NumpyCaps,
)

__all__ = ["Capabilities", "Decision", "Device", "DtypeSupport", "FrameworkCaps", "NarrowCompute", "NumpyCaps", "probe",
           "probed_dtypes"]
