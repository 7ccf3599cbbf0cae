"""What the tree tests of several files share: the bf16 arrays their trees hold."""

from __future__ import annotations

import numpy as np

from conftest import BF16


def _bf16(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape)).astype(np.float32).astype(BF16)
