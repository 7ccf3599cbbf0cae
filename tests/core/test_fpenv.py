"""fpenv: a thread that flushes subnormals is told, and keeps them inside ``keeping()`` only, with
its own environment back after (the bridge runs foreign callees so on XLA's and tensorflow's
threads: tests/functions/test_bridge_foreign.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fpenv

pytestmark = pytest.mark.frameworks("torch")  # torch.set_flush_denormal: the flags set on this thread


@pytest.fixture
def flushing():
    import torch

    assert torch.set_flush_denormal(True)  # (True: this CPU has the flags)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _kept() -> bool:
    tiny = np.array([1e-39], np.float32)  # numpy's arithmetic, not only Python floats'
    return bool((tiny * np.float32(1.0))[0] != 0)


def test_keeping_keeps_subnormals_and_puts_the_flushing_back(flushing):
    assert fpenv.flushes() and not _kept()
    with fpenv.keeping():
        assert not fpenv.flushes() and _kept()
    assert fpenv.flushes() and not _kept()


def test_keeping_puts_the_environment_back_after_an_error(flushing):
    with pytest.raises(KeyError), fpenv.keeping():
        raise KeyError("x")
    assert fpenv.flushes()


def test_keeping_on_a_thread_that_keeps_them_changes_nothing():
    assert not fpenv.flushes()
    with fpenv.keeping():
        assert _kept()
    assert not fpenv.flushes()


def test_keeping_changes_this_thread_alone(flushing):
    """Another thread that flushes (set in itself) still flushes while this one, flushing too, keeps
    subnormals inside keeping()."""
    import torch

    ready, checked, seen = threading.Event(), threading.Event(), []

    def other():
        torch.set_flush_denormal(True)  # this thread's flags only
        ready.set()
        checked.wait(30)
        seen.append(fpenv.flushes())
        torch.set_flush_denormal(False)

    t = threading.Thread(target=other)
    t.start()
    assert ready.wait(30)
    try:
        with fpenv.keeping():
            assert not fpenv.flushes()
            checked.set()
            t.join(30)
    finally:
        checked.set()
        t.join(30)
    assert seen == [True] and fpenv.flushes()


def test_where_it_cannot_reset_it_says_so_once_and_runs(flushing, monkeypatch):
    monkeypatch.setattr(fpenv, "_libm", [None])
    monkeypatch.setattr(fpenv, "_warned", [])
    with pytest.warns(bb.Bf16BridgeWarning, match="flushes subnormal floats to zero.*cannot reset"):
        with fpenv.keeping():
            assert fpenv.flushes()  # (as it is: nothing to reset it with)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fpenv.keeping():  # once a process
            pass
