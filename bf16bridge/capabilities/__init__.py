"""The capability probe: what this machine and these libraries can do with bf16 (``probe()``)."""

from bf16bridge.capabilities.probing import (
    Capabilities, Decision, Device, DtypeSupport, FrameworkCaps, NarrowCompute, NumpyCaps, probe, probed_dtypes,
)

__all__ = ["Capabilities", "Decision", "Device", "DtypeSupport", "FrameworkCaps", "NarrowCompute", "NumpyCaps", "probe",
           "probed_dtypes"]
