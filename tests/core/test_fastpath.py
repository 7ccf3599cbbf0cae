"""core.fastpath, the per-type plan cache: a cached plan serves only inputs it fits (a read-only,
conjugated or unaligned input of the same type gets a plan of its own), follows what a route depends on
beyond the input (jax's x64 flag, a replaced adapter), and still warns and still checks copy=False by
pointer."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import aligned_copy, bf16_ramp, bits, make, ptr


# -- what a cached route depends on beyond the input ---------------------------------------


def test_route_cache_sees_jax_x64_flag_change():
    import jax

    a = np.arange(3, dtype=np.float64) + 0.1
    assert not jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", True)
        assert bb.to_jax(a).dtype == np.float64
        jax.config.update("jax_enable_x64", False)
        # the same input kind again: a cached route must not narrow it to float32
        with pytest.raises(bb.UnsupportedDtypeError, match="jax_enable_x64"):
            bb.to_jax(a)
    finally:
        jax.config.update("jax_enable_x64", False)


def test_registry_does_not_reach_into_the_route_cache():
    import inspect

    from bf16bridge.core import registry

    source = inspect.getsource(registry)
    assert "clear_cache" not in source and ".routes" not in source


@pytest.mark.frameworks("torch")
def test_replacing_an_adapter_replans():
    from bf16bridge.core import registry
    from bf16bridge.adapters.numpy import NumpyAdapter

    class NoBitview(NumpyAdapter):
        bitview_free = None  # this numpy cannot view bf16 as uint16

    a = aligned_copy(bf16_ramp())
    assert bb.plan(a, to="torch").zero_copy
    spec = registry.spec("numpy")
    try:
        bb.register_adapter("numpy", NoBitview(), types=spec.types, aliases=spec.aliases, replace=True)
        with pytest.raises(bb.UnsupportedDtypeError):
            bb.plan(a, to="torch")
    finally:
        bb.register_adapter("numpy", spec.module, types=spec.types, aliases=spec.aliases,
                            requires=spec.requires, replace=True)
    assert bb.plan(a, to="torch").zero_copy


# -- the hot path: a cached plan serves only inputs it fits ---------------------------------


@pytest.mark.frameworks("torch")
def test_cached_zero_copy_plan_does_not_serve_a_readonly_array():
    a = aligned_copy(bf16_ramp())
    first = bb.to_torch(a)
    assert ptr(first) == ptr(a)
    ro = aligned_copy(bf16_ramp())
    ro.flags.writeable = False
    t = bb.to_torch(ro)  # same type, dtype and layout: only the read-only flag differs
    assert ptr(t) != ptr(ro)
    t[0] = 1
    np.testing.assert_array_equal(bits(ro), bits(bf16_ramp()))


@pytest.mark.frameworks("torch")
def test_cached_plan_does_not_serve_a_conjugated_tensor():
    import torch

    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    np.testing.assert_array_equal(bb.to_numpy(z), z.numpy())
    zc = z.conj()
    assert zc.is_conj()
    np.testing.assert_array_equal(bb.to_numpy(zc), np.conj(z.numpy()))


def test_cached_plan_does_not_serve_an_unaligned_buffer_to_jax():
    aligned = aligned_copy(bf16_ramp(64))
    assert ptr(bb.to_jax(aligned, copy=False)) == ptr(aligned)
    unaligned = aligned_copy(bf16_ramp(64), offset_bytes=2)
    with pytest.raises(bb.CopyRequiredError):
        bb.to_jax(unaligned, copy=False)
    np.testing.assert_array_equal(bits(bb.to_jax(unaligned)), bits(unaligned))


@pytest.mark.frameworks("tensorflow")
def test_cached_plan_does_not_serve_an_unaligned_buffer_to_tensorflow():
    # tensorflow imports an unaligned buffer, and its first kernel on it aborts the process: the
    # cached zero-copy plan of an aligned array must never serve an unaligned one (checked by
    # pointer before any tensorflow kernel runs)
    from bf16bridge.core import registry

    tf_ptr = registry.get("tensorflow").data_ptr
    for _ in range(2):
        aligned = aligned_copy(bf16_ramp(64))
        assert tf_ptr(bb.to_tensorflow(aligned)) == ptr(aligned)
        for offset in (2, 16, 32):
            unaligned = aligned_copy(bf16_ramp(64), offset_bytes=offset)
            out = bb.to_tensorflow(unaligned)
            assert tf_ptr(out) != ptr(unaligned) and tf_ptr(out) % 64 == 0
            np.testing.assert_array_equal(bits(out), bits(unaligned))


@pytest.mark.frameworks("torch")
def test_cached_plan_follows_jax_x64_and_adapter_replacement():
    import jax

    a = aligned_copy(np.arange(4, dtype=np.float64))
    try:
        jax.config.update("jax_enable_x64", True)
        assert bb.to_jax(a).dtype == np.float64
        assert bb.to_jax(a).dtype == np.float64  # from the cache
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(bb.UnsupportedDtypeError):
            bb.to_jax(a)
    finally:
        jax.config.update("jax_enable_x64", False)

    from bf16bridge.core import registry
    from bf16bridge.adapters.numpy import NumpyAdapter

    class NoBitview(NumpyAdapter):
        bitview_free = None

    b = aligned_copy(bf16_ramp())
    bb.to_torch(b)
    bb.to_torch(b)
    spec = registry.spec("numpy")
    try:
        bb.register_adapter("numpy", NoBitview(), types=spec.types, aliases=spec.aliases, replace=True)
        with pytest.raises(bb.UnsupportedDtypeError):
            bb.to_torch(b)
    finally:
        bb.register_adapter("numpy", spec.module, types=spec.types, aliases=spec.aliases,
                            requires=spec.requires, replace=True)


@pytest.mark.frameworks("torch")
def test_cached_plan_still_warns_and_still_verifies():
    j = make("jax", bf16_ramp())
    for _ in range(3):  # the first call plans; the others take the cached plan
        with pytest.warns(bb.Bf16BridgeWarning):
            bb.to_torch(j)
    import torch

    t = torch.arange(64, dtype=torch.bfloat16)
    for _ in range(3):
        y = bb.to_numpy(bb.to_jax(t, copy=False), copy=False)
        assert ptr(y) == ptr(t)


def _size_1_arrays() -> dict:
    """bf16 arrays numpy calls C-contiguous whose size-1 dimension has a stride of each kind."""
    base = aligned_copy(bf16_ramp(64)).reshape(8, 8)
    row = base[:1]  # (1, 8), row-major
    out = {"row-major": row, "stride 0": base[0][None], "negative stride": row[::-1],
           "odd stride": np.lib.stride_tricks.as_strided(row, row.shape, (48, 2))}
    assert all(a.flags.c_contiguous and 1 in a.shape for a in out.values())
    assert min(out["negative stride"].strides) < 0 and out["stride 0"].strides[0] == 0
    return out


def _other_layouts() -> dict:
    """bf16 arrays of the layouts besides row-major, and of no or one element."""
    base = aligned_copy(bf16_ramp(64)).reshape(8, 8)
    return {"transposed": base.T, "stepped": base[:, ::2], "reversed": base[::-1], "0-d": base[0, 0, ...],
            "one element": base[:1, :1], "empty": base[:0]}


@pytest.mark.parametrize("to", ["torch", "jax", "tensorflow"])
@pytest.mark.parametrize("kind", ["transposed", "stepped", "reversed", "0-d", "one element", "empty"])
def test_a_numpy_layout_runs_its_kept_plan_as_the_full_path_would(kind, to, monkeypatch):
    """Each layout keeps a plan of its own (described once, then not; a copying one too: each run copies
    afresh), and gives what a fresh plan gives: bits, and memory shared or not."""
    from bf16bridge.core import fastpath, registry

    a = _other_layouts()[kind]
    fastpath.clear()
    full = bb.plan(a, to=to)
    adapter, seen = registry.get("numpy"), []
    describe = adapter.describe
    monkeypatch.setattr(adapter, "describe", lambda x, **kw: (seen.append(x), describe(x, **kw))[1])
    for _ in range(3):
        for other in _other_layouts().values():  # each kind's plan beside the others'
            bb.convert(other, to)
        seen.clear()
        y = bb.convert(a, to)
        np.testing.assert_array_equal(bits(y), bits(np.ascontiguousarray(a)))
        if a.size:  # (an empty array's pointer says nothing)
            assert (ptr(y) == ptr(a)) == (not full.copies), (kind, str(full))
    assert bool(seen) == (kind == "empty"), (kind, str(full))  # (empty arrays: the full path)


@pytest.mark.parametrize("to", ["torch", "jax", "tensorflow"])
@pytest.mark.parametrize("kind", ["stride 0", "odd stride", "negative stride"])
def test_a_size_1_dimension_s_stride_gets_what_the_full_path_gives(kind, to):
    """numpy arrays with a size-1 dimension run the plan kept for a row-major one only where their
    stride is no matter (not negative: torch refuses those even where numpy calls them contiguous)."""
    from bf16bridge.core import fastpath

    arrays = _size_1_arrays()
    fastpath.clear()
    full = bb.plan(arrays[kind], to=to)
    want = bb.convert(arrays[kind], to)
    for _ in range(2):
        bb.convert(arrays["row-major"], to)  # its plan kept
        y = bb.convert(arrays[kind], to)
        np.testing.assert_array_equal(bits(y), bits(want))
        np.testing.assert_array_equal(bits(y), bits(np.ascontiguousarray(arrays[kind])))
        assert (ptr(y) == ptr(arrays[kind])) == (not full.copies), (kind, str(full))


@pytest.mark.parametrize("to", ["numpy", "torch", "jax", "tensorflow"])
def test_a_one_element_field_of_a_structured_array_gets_the_full_path_s_copy(to):
    """numpy calls a one-element field C-contiguous whatever its stride; a stride of no whole number of
    elements makes describe copy it, so a plan kept for a plain one-element array does not serve it."""
    from bf16bridge.core import fastpath

    plain = aligned_copy(np.arange(4, dtype=np.complex64))[:1]
    records = aligned_copy(np.zeros(4 + 3 * 12, np.uint8))[4:].view([("pad", "V4"), ("v", np.complex64)])
    field = records["v"][:1]  # at a whole number of elements from a 64-byte boundary, its stride not
    assert field.flags.c_contiguous and field.flags.aligned and field.strides == (12,) and ptr(field) % 8 == 0
    fastpath.clear()
    for _ in range(2):
        bb.convert(plain, to)  # its plan kept
        p, y = bb.plan(field, to=to), bb.convert(field, to)
        assert p.copies and ptr(y) != ptr(field), str(p)
        np.testing.assert_array_equal(bits(y), bits(np.ascontiguousarray(field)))


# -- plans that copy are kept too: each run copies afresh ------------------------------------


@pytest.mark.parametrize("kind, to", [pytest.param("torch stepped", "tensorflow", marks=pytest.mark.frameworks("torch")),
                                      ("numpy read-only", "torch"), ("numpy unaligned", "jax"),
                                      ("numpy plain, copy=True", "torch")])
def test_a_copying_plan_is_kept_and_copies_on_every_run(kind, to, monkeypatch):
    from bf16bridge.core import fastpath, registry

    def make():
        if kind == "torch stepped":
            return bb.convert(aligned_copy(bf16_ramp(64)).reshape(8, 8), "torch", copy=True)[:, ::2]
        a = aligned_copy(bf16_ramp(64), offset_bytes=2 if kind == "numpy unaligned" else 0)
        a.flags.writeable = kind != "numpy read-only"
        return a

    copy = True if kind.endswith("copy=True") else None
    source = kind.split()[0]
    fastpath.clear()
    first = make()
    assert bb.plan(first, to=to, copy=copy).copies
    bb.convert(first, to, copy=copy)
    adapter, seen = registry.get(source), []
    describe = adapter.describe
    monkeypatch.setattr(adapter, "describe", lambda x, **kw: (seen.append(x), describe(x, **kw))[1])
    results = []
    for _ in range(3):
        x = make()
        y = bb.convert(x, to, copy=copy)
        np.testing.assert_array_equal(bits(y), bits(x))
        assert ptr(y) != ptr(x)
        results.append(y)
    assert not seen, "the kept plan was not used"
    assert len({ptr(y) for y in results}) == 3  # a fresh copy each run


@pytest.mark.parametrize("to", ["tensorflow", "jax"])
def test_a_copying_plan_for_an_unaligned_input_leaves_an_aligned_one_zero_copy(to):
    """Kept for an unaligned array (numpy reads its pointer cheaply, so the key tells them apart), the
    copy serves no aligned array after it (zero-copy into tensorflow; into jax where numpy exports bf16)."""
    from bf16bridge.core import fastpath

    fastpath.clear()
    for _ in range(2):
        unaligned = aligned_copy(bf16_ramp(64), offset_bytes=2)
        assert ptr(bb.convert(unaligned, to)) != ptr(unaligned)
    aligned = aligned_copy(bf16_ramp(64))
    y = bb.convert(aligned, to)
    assert (ptr(y) == ptr(aligned)) == (not bb.plan(aligned, to=to).copies) and (to == "jax" or ptr(y) == ptr(aligned))
    np.testing.assert_array_equal(bits(y), bits(aligned))
