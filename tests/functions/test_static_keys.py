"""The key a bridged function keeps a traced caller's signature under (trees.walk.key of the call's
skeleton: its containers and non-tensor values): values that compare equal but are not the same
argument get different keys, so a call never runs with another call's value (0.0 == -0.0, yet
x * -0.0 flips every sign bit; 1 == 1.0 == True, yet x * 1.0 changes an integer tensor's dtype).
Equal arguments get equal keys, so a signature is found again."""

import dataclasses
import struct
from typing import NamedTuple

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.trees import walk
from conftest import bits, make


@dataclasses.dataclass(frozen=True)
class _Config:
    scale: object


class _Pair(NamedTuple):
    a: object
    b: object


def _nan(payload: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


def _box(v):
    """The places a static value sits in a call: as it is, in a list, a dict, a tuple, a namedtuple,
    a dataclass, a keyword."""
    return {"plain": ((v,), {}), "list": (([v],), {}), "dict": (({"s": v},), {}), "tuple": (((1, v),), {}),
            "namedtuple": ((_Pair(v, 2),), {}), "dataclass": ((_Config(v),), {}), "keyword": ((), {"s": v})}


def _key(args, kwargs, values_only=False):
    """The key of a call with a tensor first and then these arguments (as bridged asks for it)."""
    _, skeleton, _ = walk.flatten_call((np.zeros(3, np.float32), *args), kwargs)
    k = walk.key(skeleton, values_only=values_only)
    assert k is not None
    return k


#: values equal under == (and so under a dict's or a tuple's comparison) that a call must tell apart
#: (numpy scalars are not among them: they are tensors, slots of the skeleton)
EQUAL_BUT_NOT_THE_SAME = {
    "signed zero": (0.0, -0.0),
    "signed zero, complex real part": (complex(0.0, 1.0), complex(-0.0, 1.0)),
    "signed zero, complex imaginary part": (complex(1.0, 0.0), complex(1.0, -0.0)),
    "int and float": (1, 1.0),
    "bool and int": (True, 1),
}


@pytest.mark.parametrize("values_only", [False, True], ids=["signature", "declared"])
@pytest.mark.parametrize("where", list(_box(0.0)))
@pytest.mark.parametrize("case", list(EQUAL_BUT_NOT_THE_SAME))
def test_equal_values_that_are_not_the_same_get_different_keys(case, where, values_only):
    first, second = EQUAL_BUT_NOT_THE_SAME[case]
    assert first == second  # (what a key built on == would merge)
    k1 = _key(*_box(first)[where], values_only=values_only)
    k2 = _key(*_box(second)[where], values_only=values_only)
    assert k1 != k2


@pytest.mark.parametrize("where", list(_box(0.0)))
@pytest.mark.parametrize("value", [0.0, -0.0, 1, 1.0, True, complex(0.0, -0.0)],
                         ids=repr)
def test_the_same_value_twice_gets_the_same_key(where, value):
    again = type(value)(value)  # another object of the same value: a fresh call's argument
    k1, k2 = _key(*_box(value)[where]), _key(*_box(again)[where])
    assert k1 == k2 and hash(k1) == hash(k2)


def test_nan_is_keyed_by_its_bits():
    """NaN != NaN, yet the same NaN is the same argument; another payload is another."""
    assert _key((_nan(1),), {}) == _key((_nan(1),), {})
    assert _key((_nan(1),), {}) != _key((_nan(2),), {})


def test_tensors_are_slots_not_values():
    """Two calls with other tensors of the same kind and the same static values share a key."""
    def key(x):
        _, skeleton, _ = walk.flatten_call((x, -0.0), {})
        return walk.key(skeleton)

    assert key(np.zeros(3, np.float32)) == key(np.ones(3, np.float32))


@pytest.mark.frameworks("jax")
@pytest.mark.filterwarnings("ignore:numpy has no autodiff:bf16bridge.Bf16BridgeWarning")
def test_a_traced_call_with_minus_zero_runs_with_minus_zero():
    """What the key is for: jax.jit around a bridged numpy function, called with 0.0 then -0.0."""
    import jax

    fn = bb.bridge("numpy")(lambda x, s: x * s)
    a = np.arange(1, 4, dtype=np.float32)
    for s in (0.0, -0.0, 0.0):
        got = jax.jit(lambda x: fn(x, s))(make("jax", a))
        np.testing.assert_array_equal(bits(got), bits(a * s))
