"""core.warn: our warnings are warnings.warn's, at the caller's line, whatever path the call takes;
core.fastpath forgets its plans when the registry changes; fallback="auto" needs no import by the user."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath, registry
from bf16bridge.core import warn as bb_warn
from conftest import BF16, make


def _said(call) -> list:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        call()
    return [(w.filename, w.lineno, w.category) for w in said]


@pytest.mark.frameworks("jax", "torch")
@pytest.mark.parametrize("how", ["convert", "to_torch", "convert_tree"])
def test_a_warning_points_at_the_callers_line_planned_or_cached(how):
    x = make("jax", np.ones(4, BF16))  # a writable torch alias of it: said, and its plan cached
    calls = {"convert": lambda: bb.convert(x, "torch"), "to_torch": lambda: bb.to_torch(x),
             "convert_tree": lambda: bb.convert_tree({"w": x}, "torch")}
    fastpath.clear()
    for _ in range(2):  # planned, then from the cache
        said = _said(calls[how])
        assert fastpath.CACHE
        assert said == [(__file__, calls[how].__code__.co_firstlineno, bb.Bf16BridgeWarning)], said


@pytest.mark.parametrize(("add", "ignored"), [
    (lambda: warnings.simplefilter("ignore", bb.Bf16BridgeWarning), True),
    (lambda: warnings.simplefilter("ignore", UserWarning), True),  # (our category is a UserWarning)
    (lambda: warnings.simplefilter("ignore"), True),
    (lambda: warnings.filterwarnings("ignore", category=bb.Bf16BridgeWarning, module="elsewhere"), False),
    (lambda: warnings.filterwarnings("ignore", "the torch result", bb.Bf16BridgeWarning), False),
    (lambda: warnings.filterwarnings("ignore", category=bb.Bf16BridgeWarning, lineno=3), False),
    (lambda: warnings.simplefilter("ignore", DeprecationWarning), False),
    (lambda: warnings.simplefilter("default", bb.Bf16BridgeWarning), False),
])
def test_only_a_newest_filter_that_ignores_us_everywhere_skips_warnings_warn(add, ignored):
    with warnings.catch_warnings():
        warnings.resetwarnings()
        add()
        assert bb_warn.ignored() is ignored


def test_no_filters_at_all_leave_it_to_warnings():
    with warnings.catch_warnings():
        warnings.resetwarnings()
        assert not bb_warn.ignored()
        with pytest.warns(bb.Bf16BridgeWarning, match="said"):
            bb_warn.warn("said")


def test_gathered_counts_what_is_said_and_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with bb_warn.gathered() as pending:
            bb_warn.say("one")
            bb_warn.say("one")
            bb_warn.say("two")
    assert pending == {"one": 2, "two": 1}


def test_a_registry_change_empties_the_plan_cache():
    bb.convert(np.zeros(4, BF16), "numpy")
    assert fastpath.CACHE
    spec = registry.spec("numpy")
    registry.register_adapter("numpy", spec.module, types=spec.types, aliases=spec.aliases, extra=spec.extra,
                              requires=spec.requires, hooks=dict(spec.hooks) or None, replace=True)
    assert not fastpath.CACHE


def test_fallback_auto_asks_the_probe_without_the_user_importing_it():
    code = ("import sys, numpy as np, ml_dtypes, bf16bridge as bb\n"
            "assert 'bf16bridge.capabilities' not in sys.modules\n"
            "p = bb.plan(np.zeros(2, ml_dtypes.bfloat16), 'numpy', fallback='auto')\n"
            "assert 'bf16bridge.capabilities' in sys.modules, sorted(sys.modules)\n"
            "print(p.decision)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fallback='auto'" in out.stdout
