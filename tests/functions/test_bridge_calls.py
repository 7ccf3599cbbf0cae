"""bb.bridge and the function it gives (bf16bridge/functions/bridged.py, BridgedFunction): its name, a
call in the callee's own framework, copy_inputs, the errors of bad use (mixed callers, a result of
another framework or one the caller cannot hold, an unknown framework), numpy's missing autodiff said;
bridging imports no framework, one imported later is still asked about its compiler; the examples run."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import bf16bridge as bb
from bridge_cases import _data, _layer
from conftest import bits, make


@pytest.mark.frameworks("torch")
def test_bridged_function_keeps_its_name_and_same_framework_calls_through():
    def my_fn(x):
        return x + 1

    fn = bb.bridge("torch")(my_fn)
    assert fn.__name__ == "my_fn" and "torch" in repr(fn)
    t = make("torch", _data((3,), 1))
    np.testing.assert_array_equal(bits(fn(t)), bits(t + 1))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("copy_inputs", [False, True])
def test_a_callee_writing_its_input_writes_the_callers_tensor_unless_copied(copy_inputs):
    a = make("numpy", _data((4,), 1))
    before = bits(a).copy()

    @bb.bridge("torch", copy_inputs=copy_inputs)
    def bump(x):
        x.add_(1)  # in place: the input is a view of the caller's array unless copied
        return x * 1

    bump(a)
    assert np.array_equal(bits(a), before) == copy_inputs


# -- bad use --------------------------------------------------------------------------------


@pytest.mark.frameworks("torch")
def test_mixed_caller_frameworks_are_refused():
    fn = bb.bridge("jax")(_layer("jax"))
    with pytest.raises(bb.InvalidArgumentError, match="jax, torch|numpy, torch"):
        fn(make("torch", _data((4, 3), 1)), make("numpy", _data((2, 4), 2)))


@pytest.mark.frameworks("torch")
def test_a_callee_returning_another_frameworks_tensor_is_refused():
    fn = bb.bridge("jax", jit=False)(lambda x: np.asarray(x))  # (np.asarray of a traced array: eagerly only)
    with pytest.raises(bb.UnsupportedTypeError, match="returned a numpy tensor"):
        fn(make("torch", _data((3,), 1)))


@pytest.mark.frameworks("torch")
def test_numpy_callee_says_gradients_stop():
    import torch

    fn = bb.bridge("numpy")(lambda x: x * 2)
    x = make("torch", _data((3,), 1)).requires_grad_()
    with pytest.warns(bb.Bf16BridgeWarning, match="numpy has no autodiff"):
        y = fn(x)
    assert not y.requires_grad
    np.testing.assert_array_equal(bits(y), bits(_data((3,), 1) * 2))
    assert isinstance(y, torch.Tensor)


@pytest.mark.frameworks("torch")
def test_a_result_the_caller_cannot_hold_gives_our_error():
    import jax
    import torch

    assert not jax.config.jax_enable_x64
    fn = bb.bridge("torch")(lambda x: (x, x.to(torch.float64)))
    # eagerly too, which function and which result (convert's bare error before); no fallback reaches jax here
    with pytest.raises(bb.UnsupportedDtypeError, match=r"the bridged torch function '.*<lambda>', result\[1\] \(to "
                                                       r"jax\): .*jax_enable_x64.*no fallback exists"):
        fn(make("jax", _data((3,), 1)))


def test_unknown_framework_is_refused():
    with pytest.raises(bb.UnknownFrameworkError):
        bb.bridge("mxnet")


# -- a framework loaded or imported late ------------------------------------------------------------


def test_bridge_imports_no_framework():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, bf16bridge as bb
        fn = bb.bridge("jax")(lambda x: x)
        print(sorted(m for m in ("jax", "torch", "tensorflow") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.frameworks("torch")  # the framework imported late: torch (torch.compile)
def test_a_framework_imported_after_the_first_call_is_still_asked_about_its_compiler():
    import subprocess
    import sys
    import textwrap

    # which adapters have a graph compiler to step out of is kept between calls: importing
    # torch after the first bridged call must make torch's hook (torch.compile) count
    code = textwrap.dedent("""
        import numpy as np, bf16bridge as bb
        from bf16bridge.functions import bridged as functions
        fn = bb.bridge("numpy")(lambda x: x)
        fn(np.ones(2, np.float32))
        before = [a.name for a in functions.compilers()]
        import torch
        print(before, [a.name for a in functions.compilers()])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] ['torch']"


@pytest.mark.frameworks("torch")
def test_examples_run(monkeypatch):
    """The examples under examples/ are part of the docs: they run, and check themselves (each as its
    own command line, without pytest's arguments)."""
    import pathlib
    import runpy

    here = pathlib.Path(__file__).parents[2] / "examples"
    scripts = sorted(here.glob("*.py"))
    assert len(scripts) >= 2
    for script in scripts:
        monkeypatch.setattr(sys, "argv", [str(script)])
        runpy.run_path(str(script), run_name="__main__")
