"""The alias warning: a writable result that aliases memory its source treats as immutable or
read-only is said (or refused, or copied: on_alias), at the caller's line, and only where something
aliases; one line, said once per process for each kind of alias (whatever the call site), on the
cached path too; the user's warning filters decide whether that once is shown (an "error" filter
raises every time), and a new list of filters (warnings.catch_warnings) starts over."""

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath
from conftest import aligned_copy, bf16_ramp, bits, make, ptr


# -- what the plan knows, the call says ---------------------------------------------------


@pytest.mark.frameworks("torch")
def test_readonly_memory_is_not_written_through_a_two_step_chain():
    a = aligned_copy(bf16_ramp())
    a.flags.writeable = False
    before = bits(a).copy()
    j = bb.to_jax(a, copy=False)
    assert bb.plan(j, to="torch").alias is not None
    # a write there would kill the process where the memory is mapped read-only (audit): said, and the plan
    # says how
    assert "kills the process" in bb.plan(j, to="torch").alias
    with pytest.warns(bb.Bf16BridgeWarning, match="immutable jax tensor.*bb.plan"):
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
@pytest.mark.parametrize("call", [bb.to_torch, lambda j: bb.convert_tree({"w": j}, "torch")])
def test_the_warning_points_at_the_callers_line(call):
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        call(j)
    assert [w.filename for w in said] == [__file__]


def _two_sites(x) -> None:
    for _ in range(2):
        bb.to_torch(x)  # one call site
    for _ in range(2):
        bb.convert(x, "torch")  # another


@pytest.mark.frameworks("torch", "tensorflow")
@pytest.mark.parametrize("action", ["default", "always", "module"])
def test_said_once_per_process_for_each_kind_of_alias_on_one_line(action):
    import tensorflow as tf

    j, t, v = make("jax", bf16_ramp()), make("tensorflow", bf16_ramp()), tf.Variable(np.zeros(4, np.float32))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter(action, bb.Bf16BridgeWarning)
        _two_sites(j)  # two call sites, two calls each, planned then cached: one warning
        bb.convert_tree({"a": j, "b": [j]}, "torch")  # the same kind in a tree: said already
        _two_sites(t)  # another kind of alias: its own one warning
        _two_sites(v)  # and another (a live tf.Variable's buffer)
        _two_sites(j)
    messages = [str(w.message) for w in said]
    assert len(messages) == 3, messages
    assert "immutable jax tensor" in messages[0] and "immutable tensorflow tensor" in messages[1], messages
    assert "live tf.Variable" in messages[2] and "immutable" not in messages[2], messages
    for m in messages:
        assert "\n" not in m and len(m) < 240 and "on_alias=" in m and "once per process" in m, m


@pytest.mark.frameworks("torch")
def test_the_cached_path_says_it_once_too():
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", bb.Bf16BridgeWarning)
        _aliasing_calls(j, 3)
        fastpath.clear()  # planned afresh: still said already
        _aliasing_calls(j, 2)
    assert len(said) == 1


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("src", ["jax", "tensorflow"])
def test_no_alias_warning_where_nothing_aliases(src):
    x = make(src, bf16_ramp())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dst in ("numpy", "jax", "tensorflow"):
            bb.convert(x, dst)
        bb.convert(x, "torch", copy=True)


# -- the user's filters: whether the one warning shows, and how -------------------------------------


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
    (_only("always"), 1),  # once per process, even under "always"
    (_only("default"), 1),
    (_only("module"), 1),
    (_only("once"), 1),
    (_only("ignore"), 0),
    (lambda: warnings.simplefilter("ignore"), 0),
    (_only("ignore", message="the torch result is writable"), 0),  # our message, by its start
    (_only("ignore", message="something else"), 1),  # no match: the default action, once here
    (_only("ignore", module=__name__), 0),  # this module's calls
    (_only("ignore", module="elsewhere"), 1),  # another module's
    (_only("always", lineno=_aliasing_calls.__code__.co_firstlineno + 2), 1),  # this line
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
        assert len(said) == 1  # (ignored everywhere, it was not said: now it is, once)
        warnings.filters[:] = [("ignore", None, Warning, None, 0)]  # rewritten in place
        _aliasing_calls(j, 2)
        assert len(said) == 1
        warnings.filters = [("always", None, Warning, None, 0)]  # replaced: a new list starts over
        _aliasing_calls(j, 2)
        assert len(said) == 2


@pytest.mark.frameworks("torch")
def test_each_catch_warnings_starts_over_as_pythons_own_registries_do():
    j = make("jax", bf16_ramp())
    for _ in range(2):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("default", bb.Bf16BridgeWarning)
            _aliasing_calls(j, 3)
            bb.to_torch(j)  # another line: said already
        assert len(said) == 1


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
    (_fresh_globals, 1),  # new globals (a new registry of warnings) each time: said once all the same
    (_registry_cleared, 1),  # its registry cleared between calls
    (_catch_between, 1),  # a catch_warnings between calls, whose list of filters is gone after it
])
def test_said_once_whatever_pythons_own_registries_hold(action, calls, shown):
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter(action, bb.Bf16BridgeWarning)
        calls(j)
    assert [w.category for w in said] == [bb.Bf16BridgeWarning] * shown


@pytest.mark.frameworks("torch")
def test_a_tree_says_it_once_with_its_count_and_then_it_is_said():
    j = make("jax", bf16_ramp())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", bb.Bf16BridgeWarning)
        for _ in range(2):
            bb.convert_tree({"a": j, "b": [j, j]}, "torch")
        bb.to_torch(j)
    assert [str(w.message).split(":")[0] for w in said] == ["3 leaves of this tree"]
