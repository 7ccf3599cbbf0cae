"""Keywords that contradict each other are refused before anything runs (core/convert.py,
check_keywords): on_alias="copy" asks for a copy where the result would alias, which copy=False
forbids. Taken as it comes, the alias route would copy under copy=False, silently."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bf16_ramp, bits, make, ptr

CONFLICT = "on_alias='copy'.*copy=False"

#: sources into torch: jax's and tensorflow's results alias immutable memory (on_alias applies);
#: numpy's do not (the keywords still contradict each other)
SOURCES = ["jax", "tensorflow", "numpy"]


def _entries(x):
    """Every call that takes both keywords, with copy=False and on_alias='copy'."""
    kw = dict(copy=False, on_alias="copy")
    return {
        "convert": lambda: bb.convert(x, "torch", **kw),
        "to_torch": lambda: bb.to_torch(x, **kw),
        "convert_tree": lambda: bb.convert_tree({"w": x}, "torch", **kw),
    }


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("source", SOURCES)
def test_on_alias_copy_with_copy_false_is_refused(source):
    x = make(source, bf16_ramp())
    assert (bb.plan(x, "torch", copy=False).alias is not None) == (source != "numpy")
    # the same input and target, taken zero-copy: the cached plans of convert and convert_tree exist
    bb.convert(x, "torch", copy=False, on_alias="allow")
    bb.convert_tree({"w": x}, "torch", copy=False, on_alias="allow")
    for name, call in _entries(x).items():
        with pytest.raises(bb.InvalidArgumentError, match=CONFLICT):
            call()


def test_the_refusal_comes_before_the_input_is_looked_at():
    """The keywords are the call's fault, whatever the input: no framework is asked about it."""
    with pytest.raises(bb.InvalidArgumentError, match=CONFLICT):
        bb.convert(object(), "torch", copy=False, on_alias="copy")
    with pytest.raises(bb.InvalidArgumentError, match=CONFLICT):
        bb.convert_tree({"w": object()}, "numpy", copy=False, on_alias="copy")


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("copy", [None, True])
def test_on_alias_copy_copies_where_copy_allows_it(copy):
    """What the refusal guards: on_alias='copy' takes a copy where the result would alias."""
    j = make("jax", bf16_ramp())
    t = bb.convert(j, "torch", copy=copy, on_alias="copy")
    assert ptr(t) != ptr(j)
    np.testing.assert_array_equal(bits(t), bf16_ramp().view(np.uint16))
