"""Helpers the parity tests of several files share: random bf16 data, the narrow dtypes numpy holds
here, and arrays of those dtypes from their bit patterns."""

import ml_dtypes
import numpy as np

import bf16bridge as bb
from strategies import numpy_holds

F32 = np.float32


def _rand(shape=(64, 64), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(ml_dtypes.bfloat16)


#: the narrow dtypes numpy holds here: parity compares arrays, and an ml_dtypes without a row (0.3.1: fp6,
#: fp4, int2, e8m0...) has none of it (test_dtypes.py asserts our error naming the ml_dtypes that has it)
NARROW = [n for n in bb.kernels.KERNEL_DTYPES if n != "bfloat16" and numpy_holds(n)]


def _patterns(name, codes):
    return np.array(codes, dtype=np.uint8).view(getattr(ml_dtypes, name))
