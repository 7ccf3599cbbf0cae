"""What ``bb.parity`` asks of jax: it computes, and the settings that change its bf16 results."""

from __future__ import annotations

import os

import jax

from bf16bridge.adapters.hooks import NumericsHooks


class JaxNumerics(NumericsHooks):
    name = "jax"
    computes = True

    def numerics(self):
        return {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
                "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}


HOOKS = JaxNumerics()
