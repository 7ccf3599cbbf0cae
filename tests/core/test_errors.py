"""Our error classes keep their type where frameworks re-raise errors from user code."""

from __future__ import annotations

import inspect

import pytest

from bf16bridge import errors

# every error of ours a bridged call, convert or a checkpoint read may raise inside traced code
OURS = sorted((c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.Bf16BridgeError) and c is not errors.FrameworkNotInstalledError),
              key=lambda c: c.__name__)


def test_the_table_is_not_empty():
    assert len(OURS) >= 9 and errors.Bf16BridgeError in OURS


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("cls", OURS, ids=lambda c: c.__name__)
def test_an_error_of_ours_inside_tf_function_keeps_its_type(cls):
    """autograph re-raises an error from code it converted with the location added, as the same
    type only when the class's __init__ is Exception's; otherwise as its own StagingError, which
    `except bb.CopyRequiredError` misses."""
    import tensorflow as tf

    @tf.function
    def f(x):
        raise cls("the input, and the way out")

    with pytest.raises(cls, match="the input, and the way out") as info:
        f(tf.constant(1.0))
    assert type(info.value) is cls


def test_every_error_keeps_its_message_and_builtin_bases():
    for cls in OURS:
        e = cls("the way out")
        assert str(e) == "the way out" and e.args == ("the way out",)
    e = errors.FrameworkNotInstalledError("install the torch extra", name="torch")
    assert isinstance(e, ImportError) and e.msg == "install the torch extra" and e.name == "torch"
    assert isinstance(errors.InvalidArgumentError("x"), TypeError) and isinstance(errors.CheckpointError("x"),
                                                                                   ValueError)


# -- tf.function's autograph calls the library as it is -------------------------------------------

def _public_functions():
    import bf16bridge as bb

    return [n for n in bb.__all__ if inspect.isfunction(getattr(bb, n))]


def test_every_public_function_carries_autographs_marker():
    """autograph rewrites every function a tf.function reaches unless it carries the marker: the
    library's code was rewritten, and warned about a lazy import it could not transform."""
    import bf16bridge as bb

    names = _public_functions()
    assert len(names) >= 20 and "cast_tree" in names and "convert" in names
    assert [n for n in names if not hasattr(getattr(bb, n), "autograph_info__")] == []


@pytest.mark.frameworks("tensorflow")
def test_a_tf_function_calling_the_library_is_not_rewritten_by_autograph(tmp_path):
    """From a file: autograph converts only functions whose source it can read (python -c has none,
    and nothing under it was converted, marker or not)."""
    import subprocess
    import sys

    script = tmp_path / "f.py"
    script.write_text("""if True:
        import numpy as np, tensorflow as tf
        import bf16bridge as bb

        @tf.function
        def f(x):
            out = bb.cast_tree({"w": x}, "float16", policy=())[0]["w"]
            assert bb.framework_of(out) == "tensorflow"
            return out

        print(f(tf.constant(np.ones(3, np.float32))).dtype.name)
    """)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "float16"
    assert "AutoGraph" not in run.stderr, run.stderr[-2000:]
