"""for_compute decided per framework and device by trying: numpy's matmul loop read, jax's compiled
program read, torch's and tensorflow's matmul timed; decide() follows the trial where the hardware has
bf16 arithmetic, and fallback='auto' runs none of them."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import time

import pytest

import bf16bridge as bb
from bf16bridge.adapters import trials
from bf16bridge.capabilities.records import ComputeTrial, Device

probing = importlib.import_module("bf16bridge.capabilities.probing")
Reader = probing.Reader


class Machine(Reader):
    """This numpy on a CPU given by its /proc/cpuinfo flags (x86)."""

    def __init__(self, flags):
        self._flags = flags

    def machine(self):
        return "x86_64"

    def system(self):
        return "Linux"

    def cpuinfo(self):
        return f"flags\t: {self._flags}\n"

    def numpy_bf16_dlpack(self):
        return False, "not asked here"


BF16_CPU, PLAIN_CPU = Machine("avx2 avx512f avx512_bf16"), Machine("avx2 avx512f")


def with_numpy_trial(caps, *rows):
    return dataclasses.replace(caps, numpy=dataclasses.replace(caps.numpy, compute=tuple(ComputeTrial(*r) for r in rows)))


def test_numpy_reads_that_it_computes_bf16_in_float32_and_for_compute_says_why():
    caps = bb.probe(reader=BF16_CPU, trials=False)  # a read, not a trial: fallback='auto' has it too
    (trial,) = caps.numpy.compute
    assert (trial.device, trial.dtype, trial.how) == ("cpu", "float32", "read")
    assert "np.matmul has no bf16 loop" in trial.why
    d = caps.decide("numpy", for_compute=True)
    assert d.dtype == "float32" and "AVX512_BF16 present" in d.reason and "np.matmul has no bf16 loop" in d.reason
    assert caps.decide("numpy").dtype == "bfloat16"  # storage is another question
    assert caps.decide("numpy", for_compute=True, widen_to="bits").dtype == "bits"


@pytest.mark.parametrize("cpu,trial,dtype,said", [
    (BF16_CPU, ("cpu", "bfloat16", "timed", "bf16 was faster"), "bfloat16", "computes in bf16 on this CPU"),
    (BF16_CPU, ("cpu", "float32", "read", "XLA widens it"), "float32", "XLA widens it"),
    (BF16_CPU, ("cpu", "unknown", "failed", "the trial broke"), "bfloat16", "the trial broke"),
    (BF16_CPU, None, "bfloat16", "not tried: bb.probe() tries it"),
    # a CPU without bf16 arithmetic: float32 whatever a framework's trial said
    (PLAIN_CPU, ("cpu", "bfloat16", "timed", "bf16 was faster"), "float32", "no bf16 arithmetic"),
])
def test_decide_follows_the_frameworks_own_trial_on_a_cpu_with_bf16_arithmetic(cpu, trial, dtype, said):
    caps = with_numpy_trial(bb.probe(reader=cpu, trials=False), *([trial] if trial else []))
    for device in ("cpu", "CPU:0", "/CPU:0"):
        d = caps.decide("numpy", for_compute=True, device=device)
        assert d.dtype == dtype and said in d.reason, (device, d)


def test_decide_follows_a_trial_on_a_device_of_its_own():
    caps = bb.probe(reader=BF16_CPU, trials=False)
    gpu = Device("cuda:0 H100", True, "compute capability 9.0 (bf16 arithmetic from 8.0)")
    fw = dataclasses.replace(caps.frameworks["jax"], devices=(gpu,))
    caps = dataclasses.replace(caps, frameworks={**caps.frameworks, "jax": fw})
    assert caps.decide("numpy", for_compute=True, device="cuda:0").dtype == "bfloat16"  # no trial there
    caps = with_numpy_trial(caps, ("cuda:0", "float32", "read", "widened on the device"))
    d = caps.decide("numpy", for_compute=True, device="cuda:0")
    assert d.dtype == "float32" and "widened on the device" in d.reason


def test_timed_trial_compares_the_best_times_against_its_threshold(monkeypatch):
    """A clock that each call advances by its dtype's cost: the decision is bf16 below SLOWER times
    float32's, float32 at it or above, and the ratio is said."""
    for cost, dtype in ((1.0, "bfloat16"), (1.49, "bfloat16"), (trials.SLOWER, "float32"), (40.0, "float32")):
        clock = [0.0]
        monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

        def run(d, cost=cost):
            step = cost if d == "bfloat16" else 1.0
            return lambda: clock.__setitem__(0, clock[0] + step)

        got, how, why = trials.timed_bf16_matmul(run, "fake matmul")
        assert (got, how) == (dtype, "timed") and f"took {cost:.2f} times float32's" in why, (cost, why)


@pytest.fixture
def counted(monkeypatch):
    """The bf16 compute hooks of every framework this process imported, recording their calls and
    computing nothing (a probe with a stand-in CPU would otherwise time matmuls on this one)."""
    from bf16bridge.adapters.hooks import ProbeHooks
    from bf16bridge.core import registry

    calls: list = []
    registry.hooks("jax", ProbeHooks)  # the framework these tests probe, imported before the others are looked at
    for name in registry.names():
        if name != registry.HUB and (registry.spec(name).requires or name) in sys.modules:
            kind = type(registry.hooks(name, ProbeHooks))
            if hasattr(kind, "bf16_compute"):
                monkeypatch.setattr(kind, "bf16_compute", lambda self, name=name: calls.append(name) or ())
    return calls


@pytest.mark.frameworks("jax")
def test_a_cpu_without_bf16_arithmetic_runs_no_compute_trial(counted):
    """float32 is the answer there whatever a trial finds; a framework that picks its kernels wrongly
    for such a CPU would die running one (torch's float32 mm does under qemu's cortex-a72)."""
    caps = bb.probe(frameworks="jax", reader=PLAIN_CPU)
    assert counted == []
    (trial,) = caps.frameworks["jax"].compute
    assert (trial.dtype, trial.how) == ("float32", "not tried") and "no bf16 arithmetic" in trial.why
    assert caps.decide("jax", for_compute=True).dtype == "float32"
    bb.probe(frameworks="jax", reader=BF16_CPU)
    assert "jax" in counted


@pytest.mark.frameworks("jax")
def test_fallback_auto_runs_no_compute_trial_and_an_explicit_probe_does(counted):
    caps = bb.probe(frameworks="jax", reader=BF16_CPU, trials=False)
    assert counted == [] and caps.frameworks["jax"].compute == ()
    bb.probe(frameworks="jax", reader=BF16_CPU)
    assert "jax" in counted


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_each_framework_tries_bf16_compute_on_the_cpu_and_decide_follows_it():
    caps = bb.probe(frameworks="all", refresh=True)
    hows = {"torch": "timed", "tensorflow": "timed", "jax": "read"}
    for name, how in hows.items():
        trial = next(t for t in caps.frameworks[name].compute if t.device == "cpu")
        if not caps.cpu.bf16_compute:  # float32 whatever a trial found: none runs
            how = "not tried"
        assert trial.how == how and trial.dtype in ("bfloat16", "float32") and trial.why, trial
        d = caps.decide(name, for_compute=True)
        if caps.cpu.bf16_compute:
            assert d.dtype == trial.dtype and trial.why in d.reason, (name, d)
        else:
            assert d.dtype == "float32" and "no bf16 arithmetic" in d.reason
    assert "bf16 compute" in str(caps)


@pytest.mark.frameworks("jax")
def test_jax_reads_what_its_compiled_dot_takes():
    import jax

    from bf16bridge.adapters.jax import internals, probe

    dtype, how, why = probe.bf16_dot(jax.devices("cpu")[0])
    assert how == "read" and dtype in ("bfloat16", "float32")
    x = jax.numpy.ones((16, 16), jax.numpy.bfloat16)
    ops = internals.hlo_matmuls(internals.hlo_text(jax.jit(jax.numpy.dot).lower(x, x).compile()))
    assert (dtype == "bfloat16") == all(t == "bf16" for t in ops[0][1]), (ops, why)
