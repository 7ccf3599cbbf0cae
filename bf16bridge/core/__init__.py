"""The core: the dtype table, the registry of adapters, the planner, plans and ``convert``.

It imports the standard library, numpy, ml_dtypes and ``bf16bridge.errors`` only.
"""
