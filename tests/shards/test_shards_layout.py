"""The layout of a sharded tensor as data (bf16bridge.core.sharding, through bf16bridge.shards): a mesh
layout's placements both ways, partial placements, the layouts refused, and explicit index bounds."""

from __future__ import annotations

import pytest

from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError
from bf16bridge.shards import Layout, bounds


LAYOUTS = [
    # mesh axes, mesh shape, spec (per tensor dim), placements (per mesh axis)
    (("x",), (8,), (("x",), ()), (("shard", 0), ("replicate", None))[:1]),
    (("x", "y"), (4, 2), (("x",), ()), (("shard", 0), ("replicate", None))),
    (("x", "y"), (4, 2), ((), ("x",)), (("shard", 1), ("replicate", None))),
    (("x", "y"), (4, 2), (("y",), ("x",)), (("shard", 1), ("shard", 0))),
    (("x", "y"), (4, 2), (("x", "y"), ()), (("shard", 0), ("shard", 0))),
    (("x", "y"), (4, 2), ((), ()), (("replicate", None), ("replicate", None))),
    (("a", "b", "c"), (2, 2, 2), (("a", "c"), ("b",), ()), (("shard", 0), ("shard", 1), ("shard", 0))),
]


@pytest.mark.parametrize("axes,mesh,spec,placements", LAYOUTS)
def test_layout_placements_both_ways(axes, mesh, spec, placements):
    layout = Layout(axes, mesh, spec)
    assert layout.placements() == placements
    assert Layout.from_placements(axes, mesh, placements, len(spec)) == layout


def test_partial_placements_are_kept_as_data():
    layout = Layout.from_placements(("x", "y"), (4, 2), (("shard", 0), ("partial", None)), 2)
    assert layout.partial == ("y",)
    assert layout.placements() == (("shard", 0), ("partial", None))


@pytest.mark.parametrize("make_layout,error,words", [
    # a DTensor splits a dimension over several mesh axes in mesh order only
    (lambda: Layout(("x", "y"), (4, 2), (("y", "x"),)).placements(), UnsupportedTypeError, "mesh order"),
    (lambda: Layout(("x",), (8,), (("z",),)), InvalidArgumentError, "does not have"),
    (lambda: Layout(("x",), (8,), (("x",), ("x",))), InvalidArgumentError, "used twice"),
    (lambda: Layout(("x", "y"), (8,), ()), InvalidArgumentError, "sizes"),
    (lambda: Layout.from_placements(("x",), (2,), (("shard", 2),), 2), InvalidArgumentError, "Shard(2)"),
    (lambda: Layout.from_placements(("x",), (2,), (("stripe", 0),), 2), InvalidArgumentError, "'stripe'"),
])
def test_layout_refusals(make_layout, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        make_layout()


@pytest.mark.parametrize("index,shape,expected", [
    ((slice(None), slice(0, 4)), (8, 4), ((0, 8), (0, 4))),
    ((slice(2, None), slice(None, 3)), (8, 4), ((2, 8), (0, 3))),
    ((slice(6, 20),), (8,), ((6, 8),)),
    ((slice(0, 0),), (0,), ((0, 0),)),
])
def test_bounds_are_explicit(index, shape, expected):
    assert tuple((s.start, s.stop, s.step) for s in bounds(index, shape)) == tuple((a, b, None) for a, b in expected)


def test_bounds_refuse_steps():
    with pytest.raises(InvalidArgumentError, match="step 2"):
        bounds((slice(0, 8, 2),), (8,))
