"""A dense input in another dimension order (a transpose, a permute) crosses into jax zero-copy where
jax's DLPack import keeps it and computes on the result (the trial ``probe.takes_permuted``: jax 0.10
does; jax 0.4.30 imports it into an array its first operation refuses): plan() says so, the bits
arrive, and the result is the array torch (or numpy) shows. Strides with gaps or repeats are copied
first, even after a transpose of the same kind was served from convert's cache."""

import itertools

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.adapters.jax import probe
from bf16bridge.core import fastpath, registry
from conftest import BF16, bits, ptr

pytestmark = pytest.mark.frameworks("torch", "jax")


def _torch(a: np.ndarray):
    """A torch bf16 tensor over a 64-byte aligned copy of uint16 array ``a``."""
    import torch

    from conftest import aligned_copy

    return torch.from_numpy(aligned_copy(a)).view(torch.bfloat16)


def _cases(a: np.ndarray) -> dict:
    """Dense torch views of ``a``'s bits (16 x 64 x 64 uint16) in other dimension orders."""
    t = _torch(a)
    flat = t.reshape(1024, 64)
    return {
        "transposed": flat.T,
        "permuted 3-d": t.permute(2, 0, 1),
        "swapped 3-d": t.permute(1, 0, 2),
        "size-1 dimension, any stride": flat[:64].unsqueeze(1).permute(2, 1, 0).as_strided((64, 1, 64), (1, 999, 64)),
        "transposed rows from 64 bytes in": flat[32:].T,
    }


@pytest.fixture(autouse=True)
def _fresh_plans():
    fastpath.clear()
    yield
    fastpath.clear()


#: registry generations no registration makes (it counts up from 0): one for each redeclaration
_UNUSED_GENERATIONS = itertools.count(-1, -1)


def _redeclare(monkeypatch, takes: bool) -> None:
    """jax's trial answered ``takes``, and the plans made on the old answer forgotten (the route cache
    is keyed on the registry's generation)."""
    monkeypatch.setattr(probe, "takes_permuted", lambda: takes)
    monkeypatch.setattr(registry, "GENERATION", next(_UNUSED_GENERATIONS))
    fastpath.clear()


@pytest.mark.parametrize("case", ["transposed", "permuted 3-d", "swapped 3-d", "size-1 dimension, any stride",
                                  "transposed rows from 64 bytes in"])
def test_plan_and_result_follow_the_trial(case, all_bf16):
    x = _cases(all_bf16.reshape(16, 64, 64))[case]
    p = bb.plan(x, to="jax")
    kept = probe.takes_permuted()
    assert p.shares_memory == kept and p.copies != kept, str(p)
    for _ in range(2):  # the second from convert's cache
        y = bb.convert(x, "jax")
        assert (ptr(y) == x.data_ptr()) == kept
        assert tuple(y.shape) == tuple(x.shape)
        np.testing.assert_array_equal(bits(y), bits(x))  # numpy.asarray(y) is x, element by element
    if kept:
        assert any("keeps the input's layout" in n for n in p.notes), p.notes
        assert [s.label for s in p.steps] == ["jax.numpy.from_dlpack"]
    else:
        assert "permuted" in p.steps[0].reason, str(p)


def test_every_bf16_pattern_through_the_kept_transposes_and_back(all_bf16):
    """Every bf16 bit pattern into jax by each layout, computed on there (a bit-cast: an XLA program
    that keeps every bit), and back into torch, which keeps jax's order zero-copy."""
    import jax
    import jax.numpy as jnp

    for case, x in _cases(all_bf16.reshape(16, 64, 64)).items():
        want = bits(x)
        y = bb.convert(x, "jax", copy=None if not probe.takes_permuted() else False)
        np.testing.assert_array_equal(np.asarray(y).view(np.uint16), want, err_msg=case)
        np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(y, jnp.uint16)), want, err_msg=case)
        back = bb.convert(y, "torch", copy=False, on_alias="allow")
        assert back.data_ptr() == ptr(y) and tuple(back.shape) == tuple(x.shape)
        np.testing.assert_array_equal(bits(back), want, err_msg=case)
    assert np.array_equal(np.sort(bits(_cases(all_bf16.reshape(16, 64, 64))["transposed"]).ravel()), all_bf16)


@pytest.mark.parametrize("dtype", ["float32", "uint16"])
def test_a_transposed_numpy_array_crosses_by_jax_s_import_too(dtype):
    """numpy exports its strides over DLPack as torch does: the same declaration, the same route."""
    from conftest import aligned_copy

    a = aligned_copy(np.arange(48, dtype=dtype).reshape(6, 8)).T
    p = bb.plan(a, to="jax")
    assert p.shares_memory == probe.takes_permuted(), str(p)
    y = bb.convert(a, "jax")
    assert (ptr(y) == ptr(a)) == probe.takes_permuted()
    np.testing.assert_array_equal(np.asarray(y), a)


def test_every_bf16_pattern_of_a_transposed_numpy_array(all_bf16):
    """bf16 numpy (no DLPack bf16 before NumPy 2.5): its bits, by whatever route the plan takes."""
    from conftest import aligned_copy

    a = aligned_copy(all_bf16.reshape(256, 256)).view(BF16).T
    y = bb.convert(a, "jax")
    np.testing.assert_array_equal(bits(y), bits(a))


@pytest.mark.parametrize("takes", [False, True])
def test_the_declaration_is_the_trial_s_answer(monkeypatch, takes):
    """Answered otherwise, the plan follows: a copy in torch first where jax would not keep the order."""
    x = _torch(np.arange(64, dtype=np.uint16).reshape(8, 8)).T
    _redeclare(monkeypatch, takes)
    p = bb.plan(x, to="jax")
    assert p.copies != takes, str(p)
    if not takes:
        assert p.steps[0].framework == "torch" and "permuted" in p.steps[0].reason, str(p)
        y = bb.convert(x, "jax")
        assert ptr(y) != x.data_ptr()
        np.testing.assert_array_equal(bits(y), bits(x))
        with pytest.raises(bb.CopyRequiredError, match="copy=None"):
            bb.convert(x, "jax", copy=False)


@pytest.mark.parametrize("copy", [None, False])
@pytest.mark.parametrize("other", ["every other column", "broadcast", "transposed slice of columns"])
def test_strides_with_gaps_after_a_kept_transpose_are_copied_not_refused_raw(other, copy):
    """A strided input after a kept transpose of the same dtype is copied first (or refused with our
    CopyRequiredError under copy=False), alone, in a tree and in a bridged call: never handed the
    transpose's cached plan, whose import would refuse it (and hand it back: the test below)."""
    base = _torch(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
    x = {"every other column": base[:, ::2], "broadcast": base[:1].expand(64, 64),
         "transposed slice of columns": base[:, 8:].T}[other]
    t = base.T
    for _ in range(2):
        if copy is False and not probe.takes_permuted():
            with pytest.raises(bb.CopyRequiredError, match="copy=None"):
                bb.convert(t, "jax", copy=False)
        else:
            assert (ptr(bb.convert(t, "jax", copy=copy)) == t.data_ptr()) == probe.takes_permuted()
        if copy is False:
            with pytest.raises(bb.CopyRequiredError, match="copy=None"):
                bb.convert(x, "jax", copy=False)
            continue
        y = bb.convert(x, "jax")
        assert ptr(y) != x.data_ptr()
        np.testing.assert_array_equal(bits(y), bits(x))
        _, yx = bb.convert_tree([t, x], "jax")
        np.testing.assert_array_equal(bits(yx), bits(x))
    seen: list = []
    bb.bridge("jax", jit=False)(lambda a, b: seen.extend((a, b)) or a)(t, x)
    np.testing.assert_array_equal(bits(seen[1]), bits(x))


def test_jax_s_refusal_of_other_strides_stands_for_inputs_it_cannot_describe():
    """jax's import in a kept plan, handed strides it refuses (a cache key coarser than the layout class
    would hand it such an input), hands the input back to convert's full path (StalePlan, our
    CopyRequiredError), only for a tensor described as strided beyond a permutation; anything else
    keeps jax's own error."""
    importer = registry.get("jax").importer_aligned()
    if importer is None:  # (jax 0.4.30: no refusing import)
        return
    x = _torch(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))[:, ::2]
    with pytest.raises(bb.CopyRequiredError):  # StalePlan, which convert catches
        importer(x)

    class Producer:  # a DLPack producer no adapter claims
        def __dlpack__(self, **kw):
            return x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return x.__dlpack_device__()

    with pytest.raises(Exception) as info:
        importer(Producer())
    assert not isinstance(info.value, bb.Bf16BridgeError), repr(info.value)


def test_writes_through_the_torch_input_are_seen_in_jax_as_the_plan_notes():
    """The shared-memory note of torch -> jax (a write to the input afterwards changes the result) holds
    for a kept transpose as for a contiguous tensor; where the trial says copy, the result is apart."""
    x = _torch(np.zeros((8, 16), np.uint16)).T
    p = bb.plan(x, to="jax")
    y = bb.convert(x, "jax")
    x[3, 5] = 2.0
    shared = any("writing to the input afterwards changes it" in n for n in p.notes)
    assert shared == p.shares_memory == probe.takes_permuted()
    assert float(np.asarray(y)[3, 5]) == (2.0 if shared else 0.0)
    assert float(y.astype("float32").sum()) == (2.0 if shared else 0.0)  # computed on by jax


def test_the_probe_states_the_fact():
    takes, why = probe.HOOKS.facts()["permuted import"]
    assert takes == probe.takes_permuted() and "transpose" in why


def test_a_traced_bridged_call_tries_the_layout_before_its_callback_runs(monkeypatch):
    """The trial computes on jax: inside a callback of a program over several devices it would wait on
    the device the callback holds (a hang under jax 0.4.30): staging the callback asks it first."""
    import inspect

    import jax
    import torch

    from bf16bridge.adapters.jax import callback

    in_callback = []
    real = probe.takes_permuted

    def spy():  # whether this ask comes from inside a running callback (its host-side functions)
        in_callback.append(any(f.function in {"fwd_cb", "bwd_cb", "_host_results", "_fill"} for f in inspect.stack()))
        return real()

    monkeypatch.setattr(probe, "takes_permuted", spy)
    assert callback.probe is probe

    @bb.bridge("torch")
    def f(x):
        return torch.sin(x)

    jax.block_until_ready(jax.jit(f)(jax.numpy.ones((4, 2), "float32")))
    assert in_callback and not in_callback[0], in_callback
