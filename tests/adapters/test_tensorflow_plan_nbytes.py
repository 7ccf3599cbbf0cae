"""plan(tf tensor).nbytes is the tensor's size in bytes (the tensorflow adapter's describe), as numpy
counts the same values: every dtype tensorflow holds, scalars, empty and many-dimensional shapes,
a tf.Variable too. Checkpoint reports and plan_tree's byte totals are sums of it."""

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import dtypes, registry
from conftest import make

SHAPES = [(), (0,), (7,), (1, 1, 1), (2, 3, 4), (3, 0, 2), (5, 17)]


def _held():
    held = [d for d in dtypes.NAMES if registry.get("tensorflow").holds(d)]
    # the rows whose width differs, each among them: a count by the wrong width cannot agree on all
    assert {"bool", "bfloat16", "float32", "float64", "complex128", "float8_e4m3fn", "int4"} <= set(held)
    return held


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_plan_nbytes_of_a_tf_tensor_is_its_size_in_bytes(shape):
    for name in _held():
        a = np.zeros(shape, dtypes.numpy_dtype(name))
        t = make("tensorflow", a)
        for to, copy in (("numpy", None), ("numpy", True), ("tensorflow", None)):
            assert bb.plan(t, to, copy=copy).nbytes == a.nbytes, (name, to, copy)
        assert bb.plan(a, "tensorflow").nbytes == a.nbytes, name  # the numpy input counts the same


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("name", ["bfloat16", "float32", "int64", "complex64"])
@pytest.mark.parametrize("shape", [(), (3, 5)], ids=str)
def test_plan_nbytes_of_a_tf_variable_is_its_values_size(name, shape):
    import tensorflow as tf

    a = np.ones(shape, dtypes.numpy_dtype(name))
    v = tf.Variable(make("tensorflow", a))
    assert bb.plan(v, "numpy").nbytes == a.nbytes
