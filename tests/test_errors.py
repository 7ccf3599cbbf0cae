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
