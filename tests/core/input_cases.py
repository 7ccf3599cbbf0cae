"""What the input tests of several files share: the targets, and bf16 arrays of random bit patterns."""

import numpy as np

from conftest import BF16, FRAMEWORKS


TARGETS = FRAMEWORKS


def _bf16(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 16, int(np.prod(shape)), dtype=np.uint16).reshape(shape).view(BF16)
