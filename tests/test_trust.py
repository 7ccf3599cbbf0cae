"""Nothing passes silently: each test here reproduces a hole that once let a wrong
result, a silent alias or a foreign exception through (issues "nothing passes
silently" and "found by fuzzing"), and checks it stays closed."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, FRAMEWORKS, aligned_copy, bits, make, ptr

TARGETS = FRAMEWORKS


def _bf16(n=8):
    return (np.arange(n, dtype=np.float32) - 3.5).astype(BF16)


# -- caches keyed on everything a route depends on ------------------------------------


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

    a = aligned_copy(_bf16())
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


# -- what the plan knows, the call says ---------------------------------------------------


@pytest.mark.frameworks("torch")
def test_readonly_memory_is_not_written_through_a_two_step_chain():
    a = aligned_copy(_bf16())
    a.flags.writeable = False
    before = bits(a).copy()
    j = bb.to_jax(a, copy=False)
    assert bb.plan(j, to="torch").alias is not None
    # a write there would kill the process where the memory is mapped read-only (audit): said
    with pytest.warns(bb.Bf16BridgeWarning, match="immutable jax(.|\n)*read-only memory(.|\n)*kills the process"):
        t = bb.to_torch(j)
    assert ptr(t) == ptr(a)  # the default stays zero-copy, and says so
    with pytest.raises(bb.CopyRequiredError, match="on_alias='error'"):
        bb.to_torch(j, on_alias="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        safe = bb.to_torch(j, on_alias="copy")
        bb.to_torch(j, on_alias="allow")
    safe[0] = 42
    np.testing.assert_array_equal(bits(a), before)
    np.testing.assert_array_equal(bits(j), before)


@pytest.mark.frameworks("torch")
def test_the_warning_points_at_the_callers_line():
    j = make("jax", _bf16())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        bb.to_torch(j)
        bb.convert_tree({"w": j}, "torch")
    assert [w.filename for w in said] == [__file__, __file__]


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("src", ["jax", "tensorflow"])
def test_no_alias_warning_where_nothing_aliases(src):
    x = make(src, _bf16())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dst in ("numpy", "jax", "tensorflow"):
            bb.convert(x, dst)
        bb.convert(x, "torch", copy=True)


@pytest.mark.parametrize("bad", [{"on_alias": "maybe"}, {"on_grad": "keep"}, {"on_alias": "copy", "copy": False}])
def test_alias_and_grad_keywords_are_checked(bad):
    with pytest.raises(bb.InvalidArgumentError):
        bb.convert(_bf16(), "torch", **bad)


# -- argument errors are ours --------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"copy": "yes"}, {"copy": 0}, {"copy": 1}, {"copy": np.False_},
                                    {"fallback": "float16"}, {"for_compute": True}, {"for_compute": "yes"}])
def test_bad_keywords_raise_our_error_before_anything_is_cached(kwargs):
    with pytest.raises(bb.InvalidArgumentError) as err:
        bb.convert(_bf16(), "jax", **kwargs)
    assert isinstance(err.value, bb.Bf16BridgeError) and isinstance(err.value, ValueError)
    with pytest.raises(bb.InvalidArgumentError):
        bb.plan(_bf16(), "jax", **kwargs)


def test_copy_zero_does_not_poison_copy_false():
    unaligned = aligned_copy(_bf16(64), offset_bytes=2)
    with pytest.raises(bb.InvalidArgumentError):
        bb.to_jax(unaligned, copy=0)
    with pytest.raises(bb.CopyRequiredError):
        bb.to_jax(unaligned, copy=False)


@pytest.mark.parametrize("args", [(-1,), ((2, -3),), ((2.5,),), (3, "nope"), ((True, 2),),
                                  # numpy's TypeError / ValueError before (audit)
                                  ((2, 3), np.dtype(object)), ((2,), np.dtype([("a", object)])),
                                  ((1 << 62,),), ((1 << 40, 1 << 40), np.float32), ((3,), np.dtype("V0")),
                                  ((3,), np.dtype(("f4", (2,))))])
def test_aligned_empty_refuses_what_numpy_refuses(args):
    with pytest.raises(bb.InvalidArgumentError):
        bb.aligned_empty(*args)


# -- wrong bits and copy=False that copied --------------------------------------------------


@pytest.mark.parametrize("dst", TARGETS)
def test_big_endian_bf16_keeps_its_values(dst, all_bf16):
    native = all_bf16.view(BF16)
    big = native.astype(BF16.newbyteorder(">"))
    assert big.view(np.uint16)[1] != 1  # really stored swapped
    for copy in (None, True):
        y = bb.convert(big, dst, copy=copy)
        np.testing.assert_array_equal(bits(y), all_bf16)


@pytest.mark.frameworks("torch")
def test_zero_stride_torch_view_reaches_numpy_as_planned():
    import torch

    t = torch.arange(64, dtype=torch.bfloat16).as_strided((1, 2), (0, 1))
    j = bb.to_jax(t, copy=False)
    p = bb.plan(j, to="numpy", copy=False)
    y = bb.to_numpy(j, copy=False)  # shares, as the plan says, or raises: never a silent copy
    assert p.shares_memory and ptr(y) == ptr(j) == ptr(t)
    np.testing.assert_array_equal(bits(y), bits(t))


@pytest.mark.parametrize("dst", TARGETS)
def test_numpy_scalar_with_copy_false_is_decided_one_way(dst):
    outcomes = set()
    for i in range(64):
        try:
            bb.convert(np.float32(i), dst, copy=False)
            outcomes.add("ok")
        except bb.CopyRequiredError:
            outcomes.add("copy required")
    assert outcomes == {"copy required"}
    y = bb.convert(np.float32(3), dst)
    assert bits(y) == np.float32(3).view(np.uint32)


@pytest.mark.parametrize("dst", ["torch", "jax", "tensorflow"])
@pytest.mark.parametrize("copy", [None, True, False])
def test_structured_field_with_odd_stride_is_copied_or_refused(dst, copy):
    s = np.zeros(5, dtype=[("a", np.float32), ("c", np.complex64)])
    s["c"] = np.arange(5) + 1j * np.arange(5, 10)
    field = s["c"]
    assert field.strides == (12,)
    if copy is False:
        with pytest.raises(bb.CopyRequiredError, match="multiples"):
            bb.convert(field, dst, copy=False)
        return
    np.testing.assert_array_equal(bits(bb.convert(field, dst, copy=copy)), bits(np.ascontiguousarray(field)))


@pytest.mark.parametrize("src", ["jax", "tensorflow"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_empty_result_writability_matches_the_plan(src, dtype):
    mod = __import__("jax.numpy" if src == "jax" else src, fromlist=["zeros"])
    made = [make(src, np.zeros((0, 3), dtype=BF16 if dtype == "bfloat16" else dtype)),
            mod.zeros((0, 3), getattr(mod, dtype))]  # the framework's own empty tensor, too
    for x in made:
        y = bb.to_numpy(x)
        assert y.flags.writeable == bb.plan(x, to="numpy").writable


# -- foreign exceptions become ours --------------------------------------------------------


def test_jax_prng_key_is_refused_clearly():
    import jax

    with pytest.raises(bb.UnsupportedDtypeError, match="key_data"):
        bb.to_numpy(jax.random.key(0))


@pytest.mark.frameworks("torch")
def test_torch_nested_tensor_is_refused_clearly():
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)
        strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    jagged = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    for nt in (strided, jagged):
        with pytest.raises(bb.UnsupportedTypeError, match="unbind"):
            bb.to_numpy(nt)


@pytest.mark.frameworks("torch")
def test_huge_copy_is_refused_before_allocating():
    import torch

    big = np.broadcast_to(np.ones(1, BF16), (10**6, 10**6))  # read-only: torch needs a copy
    with pytest.raises(bb.CopyTooLargeError, match="TiB"):
        bb.to_torch(big)
    e = torch.ones(1, dtype=torch.bfloat16).expand(10**6, 10**6)
    for dst in ("jax", "tensorflow"):
        with pytest.raises(bb.CopyTooLargeError):
            bb.convert(e, dst)
    assert isinstance(bb.CopyTooLargeError("x"), MemoryError)


# -- trees ---------------------------------------------------------------------------------


Pair = collections.namedtuple("Pair", "w b")


@pytest.mark.frameworks("torch")
def test_tree_keeps_every_container_type():
    import torch

    tree = {
        "dd": collections.defaultdict(list, w=_bf16()),
        "od": collections.OrderedDict([("z", _bf16()), ("a", _bf16())]),
        "nt": Pair(_bf16(), 3),
        "t": (_bf16(), "label"),
        "l": [_bf16(), None],
    }
    out = bb.convert_tree(tree, "torch")
    assert type(out["dd"]) is collections.defaultdict and out["dd"].default_factory is list
    assert type(out["od"]) is collections.OrderedDict and list(out["od"]) == ["z", "a"]
    assert type(out["nt"]) is Pair and out["nt"].b == 3
    assert type(out["t"]) is tuple and out["t"][1] == "label"
    assert type(out["l"]) is list and out["l"][1] is None
    assert isinstance(out["dd"]["w"], torch.Tensor)
    assert type(tree["dd"]["w"]) is np.ndarray  # the input is not modified


@pytest.mark.frameworks("torch")
def test_tree_of_jax_registered_nodes():
    import dataclasses

    import jax
    import torch

    @dataclasses.dataclass
    class Layer:
        w: object
        b: object

    # the fields named: jax 0.4.30's register_dataclass takes them only so
    jax.tree_util.register_dataclass(Layer, data_fields=["w", "b"], meta_fields=[])

    out = bb.convert_tree({"layer": Layer(_bf16(), [_bf16(4)])}, "torch")
    assert type(out["layer"]) is Layer
    assert isinstance(out["layer"].w, torch.Tensor) and isinstance(out["layer"].b[0], torch.Tensor)
    with pytest.raises(bb.UnsupportedDtypeError, match=r"\['layer'\]\['w'\]"):
        bb.convert_tree({"layer": Layer(np.array(["s"]), 1)}, "torch")


def test_tree_does_not_import_jax_to_look_at_a_tree():
    code = textwrap.dedent("""
        import sys, numpy as np, ml_dtypes, bf16bridge as bb
        class Box:
            pass
        out = bb.convert_tree({"a": [np.ones(2, ml_dtypes.bfloat16), Box()]}, "numpy")
        assert isinstance(out["a"][1], Box)
        print(sorted(m for m in ("jax", "torch", "tensorflow") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.frameworks("torch")
def test_tree_refuses_a_cycle_and_unbuildable_tuples_and_keeps_string_leaves():
    loop = [_bf16()]
    loop.append(loop)
    with pytest.raises(bb.UnsupportedTypeError, match="contains itself"):
        bb.convert_tree(loop, "torch")

    class Span(tuple):
        def __new__(cls, start, stop):
            return super().__new__(cls, (start, stop))

    with pytest.raises(bb.UnsupportedTypeError, match="Span"):
        bb.convert_tree({"s": Span(_bf16(), _bf16())}, "torch")
    out = bb.convert_tree([np.str_("name"), b"raw", "text"], "torch")
    assert out == [np.str_("name"), b"raw", "text"]
    shared = _bf16()
    assert len(bb.convert_tree([shared, shared], "numpy")) == 2  # a shared leaf is no cycle


# -- the surface a user meets first --------------------------------------------------------


def test_submodules_load_on_attribute_access():
    code = textwrap.dedent("""
        import bf16bridge as bb
        assert {"parity", "kernels", "capabilities", "dtypes"} <= set(dir(bb))
        assert callable(bb.parity.compare) and callable(bb.kernels.to_bf16)
        assert bb.__version__
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.frameworks("torch")
def test_plan_and_step_are_frozen_records():
    import dataclasses

    p = bb.plan(make("torch", _bf16()), to="numpy")
    assert dataclasses.is_dataclass(p) and dataclasses.is_dataclass(p.steps[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.copies = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        tuple(p)  # a record, not a tuple to unpack
    assert p == bb.plan(make("torch", _bf16()), to="numpy")  # equal without comparing callables
    assert p.to_dict()["steps"][0]["kind"] == "bitview"


def test_convert_takes_no_unknown_keywords():
    with pytest.raises(TypeError):
        bb.to_torch(_bf16(), kopy=True)  # type: ignore[call-arg]


# -- the hot path: a cached plan serves only inputs it fits ---------------------------------


@pytest.mark.frameworks("torch")
def test_cached_zero_copy_plan_does_not_serve_a_readonly_array():
    a = aligned_copy(_bf16())
    first = bb.to_torch(a)
    assert ptr(first) == ptr(a)
    ro = aligned_copy(_bf16())
    ro.flags.writeable = False
    t = bb.to_torch(ro)  # same type, dtype and layout: only the read-only flag differs
    assert ptr(t) != ptr(ro)
    t[0] = 1
    np.testing.assert_array_equal(bits(ro), bits(_bf16()))


@pytest.mark.frameworks("torch")
def test_cached_plan_does_not_serve_a_conjugated_tensor():
    import torch

    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    np.testing.assert_array_equal(bb.to_numpy(z), z.numpy())
    zc = z.conj()
    assert zc.is_conj()
    np.testing.assert_array_equal(bb.to_numpy(zc), np.conj(z.numpy()))


def test_cached_plan_does_not_serve_an_unaligned_buffer_to_jax():
    aligned = aligned_copy(_bf16(64))
    assert ptr(bb.to_jax(aligned, copy=False)) == ptr(aligned)
    unaligned = aligned_copy(_bf16(64), offset_bytes=2)
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
        aligned = aligned_copy(_bf16(64))
        assert tf_ptr(bb.to_tensorflow(aligned)) == ptr(aligned)
        for offset in (2, 16, 32):
            unaligned = aligned_copy(_bf16(64), offset_bytes=offset)
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

    b = aligned_copy(_bf16())
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
    j = make("jax", _bf16())
    for _ in range(3):  # the first call plans; the others take the cached plan
        with pytest.warns(bb.Bf16BridgeWarning):
            bb.to_torch(j)
    import torch

    t = torch.arange(64, dtype=torch.bfloat16)
    for _ in range(3):
        y = bb.to_numpy(bb.to_jax(t, copy=False), copy=False)
        assert ptr(y) == ptr(t)


# -- the alias warning on the hot path: remembered only where warnings would show nothing ------


def _aliasing_calls(x, n: int) -> None:
    for _ in range(n):
        bb.to_torch(x)  # one call site; the first call plans, the others take the cached plan


def _shown(setup, n: int = 3, src: str = "jax") -> int:
    """How many alias warnings ``n`` calls from one line show under the filters ``setup`` makes."""
    x = make(src, _bf16())
    with warnings.catch_warnings(record=True) as said:
        setup()
        _aliasing_calls(x, n)
    assert all(issubclass(w.category, bb.Bf16BridgeWarning) for w in said)
    return len(said)


def _only(action, **kw):
    return lambda: (warnings.resetwarnings(), warnings.filterwarnings(action, category=bb.Bf16BridgeWarning, **kw))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("src", ["jax", "tensorflow"])
@pytest.mark.parametrize(("setup", "shown"), [
    (_only("always"), 3),
    (_only("default"), 1),
    (_only("module"), 1),
    (_only("once"), 1),
    (_only("ignore"), 0),
    (lambda: warnings.simplefilter("ignore"), 0),
    (_only("ignore", message="the torch result is writable"), 0),  # our message, by its start
    (_only("ignore", message="something else"), 1),  # no match: the default action, once here
    (_only("ignore", module=__name__), 0),  # this module's calls
    (_only("ignore", module="elsewhere"), 1),  # another module's
    (_only("always", lineno=_aliasing_calls.__code__.co_firstlineno + 2), 3),  # this line
])
def test_the_alias_warning_follows_the_users_filters(src, setup, shown):
    assert _shown(setup, src=src) == shown


@pytest.mark.frameworks("torch")
def test_an_error_filter_raises_on_every_call():
    j = make("jax", _bf16())
    with warnings.catch_warnings():
        warnings.simplefilter("error", bb.Bf16BridgeWarning)
        for _ in range(3):
            with pytest.raises(bb.Bf16BridgeWarning, match="immutable jax"):
                bb.to_torch(j)


@pytest.mark.frameworks("torch")
def test_a_filter_change_is_seen_even_in_the_same_list_of_the_same_length():
    j = make("jax", _bf16())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", bb.Bf16BridgeWarning)
        warnings.simplefilter("ignore", bb.Bf16BridgeWarning)
        n = len(warnings.filters)
        _aliasing_calls(j, 3)
        assert said == []
        warnings.simplefilter("always", bb.Bf16BridgeWarning)  # moved to the front: same list, same length
        assert len(warnings.filters) == n
        _aliasing_calls(j, 3)
        assert len(said) == 3
        warnings.filters[:] = [("ignore", None, Warning, None, 0)]  # rewritten in place
        _aliasing_calls(j, 2)
        assert len(said) == 3
        warnings.filters = [("always", None, Warning, None, 0)]  # replaced
        _aliasing_calls(j, 2)
        assert len(said) == 5


@pytest.mark.frameworks("torch")
def test_default_filters_show_the_warning_again_in_each_catch_warnings_as_warnings_does():
    j = make("jax", _bf16())
    for _ in range(2):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("default", bb.Bf16BridgeWarning)
            _aliasing_calls(j, 3)
            bb.to_torch(j)  # another line: shown there too
        assert len(said) == 2


@pytest.mark.frameworks("tensorflow", "torch")
def test_string_leaves_stay_strings_after_numpy_has_seen_their_type():
    with pytest.raises(bb.UnsupportedDtypeError):
        bb.to_torch(np.str_("x"))  # the registry now knows np.str_ as a numpy type
    assert bb.convert_tree({"name": np.str_("x"), "w": _bf16()}, "numpy")["name"] == "x"


# -- a tf tensor that has no DLPack export is never asked for a pointer ---------------------------

_NO_EXPORT = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes, tensorflow as tf, jax
    import bf16bridge as bb
    from bf16bridge.core import registry
    kinds = {"string": lambda: tf.constant(["a", "b"]), "resource": lambda: tf.Variable(1.0).handle,
             "variant": lambda: tf.data.experimental.to_variant(tf.data.Dataset.range(2))}
    batch = tf.constant(np.zeros(64, ml_dtypes.bfloat16))
    for to in ("jax", "tensorflow", "numpy", "torch"):
        bb.convert(batch, to)
        bb.convert(batch, to)  # the second call takes the cached plan, keyed on the buffer's alignment
        for kind, make in kinds.items():
            x = make()
            out = bb.convert_tree({"x": batch, "text": x}, to, on_unsupported="keep")
            kept = out["text"] is x
            try:
                bb.convert(x, to)
                said = "converted"
            except bb.UnsupportedDtypeError as err:
                said = "refused" if kind in str(err) else "unnamed"
            try:
                registry.get("tensorflow").data_ptr(x)
                ptr = "pointer"
            except bb.UnsupportedDtypeError:
                ptr = "refused"
            print(to, kind, kept, said, ptr, flush=True)
""")


@pytest.fixture(scope="module")
def no_export_run():
    # in a subprocess: before the fix, tensorflow aborted the process (an abort kills pytest)
    return subprocess.run([sys.executable, "-c", _NO_EXPORT], capture_output=True, text=True, timeout=300)


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("to", ["jax", "tensorflow", "numpy", "torch"])
@pytest.mark.parametrize("kind", ["string", "resource", "variant"])
def test_tf_tensor_without_dlpack_is_refused_not_aborted_after_a_cached_plan(no_export_run, to, kind):
    assert no_export_run.returncode == 0, no_export_run.stderr[-2000:]
    assert f"{to} {kind} True refused refused" in no_export_run.stdout.splitlines()


def _fresh_globals(j):
    """One code object run three times, each in new globals (each has its own warnings registry)."""
    code = compile("bb.to_torch(j)", "<cell>", "exec")
    for _ in range(3):
        exec(code, {"bb": bb, "j": j})


def _registry_cleared(j):
    """One line called three times, its warnings registry cleared between calls."""
    ns = {"bb": bb, "j": j}
    exec(compile("def f():\n    bb.to_torch(j)\n", "<module-like>", "exec"), ns)
    for _ in range(3):
        ns["f"]()
        ns["__warningregistry__"].clear()


def _catch_between(j):
    for _ in range(3):
        bb.to_torch(j)
        with warnings.catch_warnings():
            pass


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("action", ["default", "module"])
@pytest.mark.parametrize(("calls", "shown"), [
    (_fresh_globals, 3),  # as warnings does: its registry is new each time
    (_registry_cleared, 3),  # as warnings does: its registry no longer holds the key
    (_catch_between, 3),  # as warnings does: leaving catch_warnings forgets what its registries hold
])
def test_a_remembered_site_follows_pythons_own_registry(action, calls, shown):
    j = make("jax", _bf16())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter(action, bb.Bf16BridgeWarning)
        calls(j)
    assert [w.category for w in said] == [bb.Bf16BridgeWarning] * shown


@pytest.mark.parametrize("implementation", ["pypy", "graalpy"])
def test_numpy_pointer_reads_no_memory_off_cpython(monkeypatch, implementation):
    # id(x) is an address only on CPython: elsewhere the pointer comes from __array_interface__
    import types

    from bf16bridge.adapters import numpy_internals as internals

    a = aligned_copy(_bf16(64))[2:]
    monkeypatch.setattr(sys, "implementation", types.SimpleNamespace(name=implementation))
    assert internals.data_offset() is None
    monkeypatch.setattr(internals, "DATA_OFFSET", None)
    monkeypatch.setattr(internals, "read_pointer", None)  # any read of memory by address fails
    assert internals.data_pointer(a) == a.__array_interface__["data"][0] == ptr(a)
