"""The alias warning: a writable result that aliases memory its source treats as immutable or
read-only is said (or refused, or copied: on_alias), at the caller's line, and only where something
aliases; on the cached path too it follows the user's warning filters and Python's own per-site
registries, as warnings.warn does."""

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from conftest import aligned_copy, bf16_ramp, bits, make, ptr


# -- what the plan knows, the call says ---------------------------------------------------


@pytest.mark.frameworks("torch")
def test_readonly_memory_is_not_written_through_a_two_step_chain():
    a = aligned_copy(bf16_ramp())
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
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        bb.to_torch(j)
        bb.convert_tree({"w": j}, "torch")
    assert [w.filename for w in said] == [__file__, __file__]


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("src", ["jax", "tensorflow"])
def test_no_alias_warning_where_nothing_aliases(src):
    x = make(src, bf16_ramp())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dst in ("numpy", "jax", "tensorflow"):
            bb.convert(x, dst)
        bb.convert(x, "torch", copy=True)


# -- the alias warning on the hot path: remembered only where warnings would show nothing ------


def _aliasing_calls(x, n: int) -> None:
    for _ in range(n):
        bb.to_torch(x)  # one call site; the first call plans, the others take the cached plan


def _shown(setup, n: int = 3, src: str = "jax") -> int:
    """How many alias warnings ``n`` calls from one line show under the filters ``setup`` makes."""
    x = make(src, bf16_ramp())
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
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings():
        warnings.simplefilter("error", bb.Bf16BridgeWarning)
        for _ in range(3):
            with pytest.raises(bb.Bf16BridgeWarning, match="immutable jax"):
                bb.to_torch(j)


@pytest.mark.frameworks("torch")
def test_a_filter_change_is_seen_even_in_the_same_list_of_the_same_length():
    j = make("jax", bf16_ramp())
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
    j = make("jax", bf16_ramp())
    for _ in range(2):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("default", bb.Bf16BridgeWarning)
            _aliasing_calls(j, 3)
            bb.to_torch(j)  # another line: shown there too
        assert len(said) == 2


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
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter(action, bb.Bf16BridgeWarning)
        calls(j)
    assert [w.category for w in said] == [bb.Bf16BridgeWarning] * shown
