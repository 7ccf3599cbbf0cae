"""The jax adapter, one module a concern: ``convert`` (the core Adapter: planner facts and conversion
primitives), ``bridge`` and ``callback`` (bb.bridge), ``shards``, ``probe`` (trials and the capability
probe), ``numerics`` (bb.parity), ``trace``
(bb.parity.trace: flax intermediates and taps), and ``internals`` (every private jax/XLA API used). The registry
imports ``convert`` on first use, and each feature's module when that feature first asks."""
