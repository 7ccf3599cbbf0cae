"""A probe trial asked first inside a jax callback: its computation can wait for the device the callback
holds (a program over several devices), so it is waited for at most probe.CALLBACK_WAIT_S there, and past
that the caller gets the answer that costs a copy at most, not kept, while the trial runs on and keeps its
own answer (trials.Bounded). The reproduction runs in a child with 8 jax host devices (XLA_FLAGS is read
when jax is imported): a user's pure_callback whose body is the process's first conversion into jax."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from bf16bridge.adapters import trials
from conftest import by_first_word

CHILD = r"""
import sys
import ml_dtypes, numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import bf16bridge as bb
from bf16bridge.adapters.jax import probe

a = np.arange(48, dtype=np.uint16).reshape(6, 8)

def transposed():
    if sys.argv[1] == "torch":
        import torch
        return torch.from_numpy(a.copy()).view(torch.bfloat16).T
    return a.copy().view(ml_dtypes.bfloat16).T

def host(x):  # runs while the program holds its devices: the process's first conversion into jax
    return np.asarray(bb.convert(transposed(), "jax")).view(np.uint16).astype(np.float32) + x

f = jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct((8, 6), jnp.float32), x) * 2)
x = jax.device_put(jnp.zeros((8, 6), jnp.float32), NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x", None)))
out = np.asarray(f(x))
assert len(jax.devices()) == 8 and np.array_equal(out, 2 * a.T.astype(np.float32)), out
if sys.argv[2].endswith("exiting at once"):  # while the trials given up on may still run
    print("ok", jax.__version__)
    sys.exit(0)
probe.narrow_rows.found(), probe.takes_permuted.found()  # the trials given up on, landed
assert probe.revision() > 0, "no trial was given up on inside the callback"
for trial in (probe.narrow_rows, probe.takes_permuted, probe.allocates_aligned):
    assert trial() == trial.__wrapped__(), trial.__name__  # kept: the trial's own answer, tried again here
facts = probe.HOOKS.facts()
assert facts["permuted import"][0] == probe.takes_permuted.__wrapped__(), facts
assert facts["aligned buffers"][0] == probe.allocates_aligned.__wrapped__(), facts
assert np.array_equal(np.asarray(bb.convert(transposed(), "jax")).view(np.uint16), a.T)
# what the adapter declares, and plans made after, follow the trials' own answers (nothing kept from the
# conservative ones: kept_property, and the revision in the adapter's state)
from bf16bridge.core import registry
jx = registry.get("jax")
assert jx.copies_aligned == probe.allocates_aligned.__wrapped__()
assert ("float8_e4m3fn" in jx.dlpack_import) == ("float8_e4m3fn" in probe.narrow_rows.__wrapped__().dlpack_in)
if sys.argv[1] == "torch":  # a transpose over torch's own (64-byte aligned) memory
    import torch
    t = torch.arange(48, dtype=torch.int16).view(torch.bfloat16).reshape(6, 8).T
    assert t.data_ptr() % 64 == 0
    assert bb.plan(t, to="jax").copies != probe.takes_permuted.__wrapped__(), str(bb.plan(t, to="jax"))
print("ok", jax.__version__)
"""


@pytest.mark.frameworks("jax")
@pytest.mark.parametrize("case", by_first_word(["torch", "numpy", "numpy exiting at once"]))
def test_a_first_conversion_inside_a_callback_over_eight_devices_finishes(case):
    """Without the bound, the layout and narrow-row trials wait inside the callback for the device it
    holds, and the process hangs (jax 0.4.30 and 0.10.2). Then the trials' own answers are kept, and the
    facts say them; a process ending at once waits for the trials still running (ended under one, it aborts)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    start = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, case.split()[0], case], env=env, capture_output=True,
                           text=True, timeout=90)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the child hung inside the callback (90 s): {str(err.stderr or '')[-2000:]}")
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.stdout + r.stderr)[-3000:]
    assert time.perf_counter() - start < 60, r.stdout


@pytest.mark.frameworks("jax")
def test_inside_callback_is_seen_in_jax_s_callbacks_only():
    import jax
    import jax.numpy as jnp

    from bf16bridge.adapters.jax import probe

    seen = []

    def host(x):
        seen.append(probe.inside_callback())
        return x

    jax.block_until_ready(jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct((2,), jnp.float32), x))(
        jnp.ones(2, jnp.float32)))
    jax.block_until_ready(jax.jit(lambda x: (jax.debug.callback(host, x), x)[1])(jnp.ones(2, jnp.float32)))
    assert seen == [True, True] and not probe.inside_callback()


# -- trials.Bounded, on trials that block until released ------------------------------------------


class Blocking:
    """A trial that answers ``answer`` once released (``go``), counting its runs."""

    def __init__(self, answer, error: BaseException | None = None):
        self.answer, self.error, self.go, self.runs = answer, error, threading.Event(), 0
        self.__name__ = "blocking"

    def __call__(self, *args):
        self.runs += 1
        assert self.go.wait(10), "never released"
        if self.error is not None:
            raise self.error
        return (self.answer, *args)


def _bounded(trial, hurried=True, wait=0.2, context=None) -> trials.Bounded:
    return trials.Bounded(trial, lambda *args: ("conservative", *args), lambda: hurried, wait, context)


def _trial_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("bf16bridge trial")]


@pytest.fixture(autouse=True)
def _every_trial_thread_ends():
    yield
    for t in _trial_threads():
        t.join(5)
    assert _trial_threads() == []


def test_a_hurried_caller_gets_the_conservative_answer_not_kept_then_the_trial_s():
    trial = Blocking("real")
    ask = _bounded(trial, wait=1.0)
    revised, given = trials.revision(), trials.given_here()
    start = time.perf_counter()
    assert ask(1) == ("conservative", 1)
    assert 1.0 <= time.perf_counter() - start < 9
    assert ask.answers == {} and trials.given_here() == given + 1
    start = time.perf_counter()
    assert ask(1) == ("conservative", 1)  # while it is still stalled: no second wait (the first waited 1 s)
    assert time.perf_counter() - start < 0.5
    trial.go.set()
    assert ask.found(1) == ("real", 1)  # waited for however long
    assert ask(1) == ("real", 1) and ask.answers == {(1,): ("real", 1)} and trial.runs == 1
    assert trials.revision() == revised + 1


def test_while_one_trial_is_stalled_a_hurried_caller_waits_for_no_other():
    first, second = Blocking("first"), Blocking("second")
    a, b = _bounded(first, wait=0.1), _bounded(second, wait=5)
    assert a() == ("conservative",)
    start = time.perf_counter()
    assert b() == ("conservative",)
    assert time.perf_counter() - start < 1
    first.go.set()
    second.go.set()
    assert a.found() == ("first",) and b.found() == ("second",)
    third = Blocking("third")
    third.go.set()
    c = _bounded(third, wait=5)
    assert c() == ("third",)  # none stalled now: waited for, and kept
    assert c.answers == {(): ("third",)}


def test_a_caller_not_hurried_runs_the_trial_where_it_is_asked():
    trial = Blocking("real")
    trial.go.set()
    ask = _bounded(trial, hurried=False, wait=0)
    assert ask("x") == ("real", "x") and ask("x") == ("real", "x") and trial.runs == 1
    assert _trial_threads() == []


@pytest.mark.parametrize("hurried", [False, True])
def test_a_trial_s_error_reaches_its_caller_and_is_not_kept(hurried):
    trial = Blocking("real", error=RuntimeError("refused"))
    trial.go.set()
    ask = _bounded(trial, hurried=hurried, wait=5)
    for runs in (1, 2):
        with pytest.raises(RuntimeError, match="refused"):
            ask()
        assert trial.runs == runs and ask.answers == {}


def test_a_trial_run_apart_runs_under_the_context_its_arguments_name():
    local = threading.local()

    class Setting:
        def __init__(self, value):
            self.value = value

        def __enter__(self):
            local.value = self.value

        def __exit__(self, *exc):
            del local.value

    ask = trials.Bounded(lambda v: getattr(local, "value", None), lambda v: "conservative", lambda: True, 5,
                         lambda v: Setting(v))
    assert ask("wide") == "wide" and ask("narrow") == "narrow"


def test_kept_keeps_nothing_computed_on_a_conservative_answer():
    trial = Blocking("real")
    ask = _bounded(trial, wait=0.05)
    calls = []

    @trials.kept
    def derived():
        calls.append(1)
        return ask()[0]

    assert derived() == "conservative" and derived() == "conservative" and len(calls) == 2
    trial.go.set()
    ask.found()
    assert derived() == "real" and derived() == "real" and len(calls) == 3


@pytest.mark.frameworks("jax")
def test_jax_s_computing_trials_are_bounded_inside_callbacks():
    from bf16bridge.adapters.jax import probe

    for trial in (probe.narrow_rows, probe.takes_permuted, probe.allocates_aligned, probe.refuses_unaligned):
        assert isinstance(trial, trials.Bounded) and trial.hurried is probe.inside_callback, trial
        assert trial.wait == probe.CALLBACK_WAIT_S
    assert probe.casts("bfloat16", "float32")  # (asked where it is: no callback, no thread)
    assert isinstance(probe.rounds_as_ml_dtypes_here("float32", "bfloat16"), bool)
