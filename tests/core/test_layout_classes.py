"""What ``layout_of`` calls a set of strides (the classes importers declare what they take of), and
that an importer's declaration is per memory kind: jax keeps a transpose of host memory where its trial
says so, and takes device memory row-major only (untried there), whatever the host trial said."""

import numpy as np
import pytest

from bf16bridge.core.adapter import CONTIGUOUS, NEGATIVE, PERMUTED, STRIDED, Source, layout_of


def _elements(a: np.ndarray) -> tuple:
    return a.shape, [s // a.itemsize for s in a.strides]


BASE = np.zeros((4, 6, 8), np.uint16)


@pytest.mark.parametrize("a,layout", [
    (BASE, CONTIGUOUS),
    (BASE[:1], CONTIGUOUS),
    (BASE[:, :, :0], CONTIGUOUS),  # no elements: contiguous whatever the strides
    (BASE.T, PERMUTED),
    (BASE.transpose(2, 0, 1), PERMUTED),
    (BASE.transpose(1, 0, 2), PERMUTED),
    (np.asfortranarray(BASE), PERMUTED),
    (BASE[2:].T, PERMUTED),  # an offset is no gap
    (BASE[:, :, ::2], STRIDED),
    (BASE[:, :3], STRIDED),
    (BASE[:, :3].T, STRIDED),  # a transpose of a slice with gaps
    (np.broadcast_to(BASE[:1], (4, 6, 8)), STRIDED),
    (BASE[::-1], NEGATIVE),
])
def test_layout_classes(a, layout):
    assert layout_of(*_elements(a)) == layout


def test_a_size_1_dimension_s_stride_is_no_matter():
    assert layout_of((8, 1, 6), (1, 999, 8)) == PERMUTED
    assert layout_of((1, 8), (7, 1)) == CONTIGUOUS
    assert layout_of((1, 1), (5, 9)) == CONTIGUOUS
    assert layout_of((), ()) == CONTIGUOUS


def test_two_dimensions_of_one_stride_overlap():
    assert layout_of((2, 2), (1, 1)) == STRIDED


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("layout", [CONTIGUOUS, PERMUTED])
def test_device_memory_crosses_into_jax_row_major_only(layout):
    """A torch tensor on a GPU (described, not made: planning needs no device) in another order has no
    zero-copy route into jax, as before the host trial existed; a row-major one crosses zero-copy."""
    import bf16bridge as bb
    from bf16bridge.core import planner

    src = Source(value=None, dtype="bfloat16", shape=(8, 8), nbytes=128, layout=layout, aligned=True,
                 readonly=False, device="cuda:0")
    host = planner.plan_for(src._replace(device="cpu"), "torch", "jax")
    from bf16bridge.adapters.jax.probe import takes_permuted

    assert host.copies == (layout == PERMUTED and not takes_permuted())
    if layout == CONTIGUOUS:
        assert not planner.plan_for(src, "torch", "jax").copies
        return
    with pytest.raises(bb.DeviceError):
        planner.plan_for(src, "torch", "jax")
    p = planner.plan_for(src, "torch", "jax", copy=True)
    assert [(s.framework, s.copies) for s in p.steps] == [("torch", True), ("jax", False)], str(p)
