"""The torch adapter, one file per concern; the registry imports each on first use.

``convert`` (the core Adapter: planner facts, conversion primitives), ``probe`` (what torch holds
and speaks, tried on first need; the capability probe's hooks), ``bridge`` (bb.bridge), ``cast``
(bb.cast_module), ``shards`` (DTensor), ``numerics`` (bb.parity), ``trace`` (bb.parity.trace: forward hooks), ``kernels`` (bb.kernels), and
``internals``: every private API of torch or CPython these use, each guarded.
"""
