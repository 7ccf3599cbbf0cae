"""The tensorflow adapter, one file per concern; the registry imports each on first use.

``convert`` (the core Adapter: planner facts, conversion primitives), ``probe`` (what tensorflow
holds, speaks and casts, tried on first need; the capability probe's hooks), ``bridge``
(bb.bridge), ``numerics`` (bb.parity), ``trace`` (bb.parity.trace:
Keras layers' outputs), ``framework`` (tensorflow's import and its dtype and device
names), and ``internals``: every private API of tensorflow these use, each guarded.
"""
