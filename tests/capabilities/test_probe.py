"""The capability probe and the fallback policy, on this machine and on machines it stands in for."""

import dataclasses
import importlib
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, aligned_copy, bits

probe_mod = importlib.import_module("bf16bridge.capabilities.probing")


class FakeReader(probe_mod.Reader):
    """A machine described by its parts."""

    def __init__(self, arch="x86_64", flags="", hwcap2=None, ml_dtypes=(True, "ml_dtypes works"), system="Linux"):
        self._arch, self._flags, self._hwcap2, self._ml, self._system = arch, flags, hwcap2, ml_dtypes, system

    def machine(self):
        return self._arch

    def system(self):
        return self._system

    def cpu_count(self):
        return 8

    def cpuinfo(self):
        key = "Features" if self._arch == "aarch64" else "flags"
        return f"processor\t: 0\n{key}\t\t: {self._flags}\n"

    def hwcap2(self):
        return self._hwcap2

    def sysctl(self, name):
        return None

    def ml_dtypes(self):
        return self._ml

    def numpy_bf16_dlpack(self):
        return False, "numpy <= 2.4 has no bf16 DLPack"


X86_BF16 = "fpu sse avx2 avx512f avx512_bf16 amx_bf16"
X86_PLAIN = "fpu sse avx2 avx512f"


@pytest.mark.parametrize("reader,compute,why", [
    (FakeReader("x86_64", X86_BF16), True, "AVX512_BF16 and AMX_BF16 present"),
    (FakeReader("x86_64", X86_PLAIN), False, "no AVX512_BF16 or AMX_BF16"),
    (FakeReader("aarch64", "fp asimd bf16 i8mm"), True, "FEAT_BF16 present (cpuinfo)"),
    (FakeReader("aarch64", "fp asimd", hwcap2=1 << 14), True, "FEAT_BF16 present (HWCAP2)"),
    (FakeReader("aarch64", "fp asimd", hwcap2=0), False, "no FEAT_BF16 (HWCAP2)"),
    (FakeReader("riscv64", ""), False, "not known"),
    # nothing readable (said "no FEAT_BF16 (cpuinfo)", a fact it never read)
    (type("Unread", (FakeReader,), {"cpuinfo": lambda self: ""})("aarch64"), False, "could not read the CPU features"),
])
def test_cpu_bf16_compute(reader, compute, why):
    # no trials: they run on this machine, whatever CPU the reader stands in for
    caps = bb.probe(reader=reader, trials=False)
    assert caps.cpu.bf16_compute is compute
    assert why in caps.cpu.why
    d = caps.decide("numpy", for_compute=True)
    # numpy computes bf16 in float32 on any CPU (np.matmul resolves no bf16 loop): float32 for compute
    assert d.dtype == "float32" and why in d.reason
    assert ("np.matmul has no bf16 loop" in d.reason) is compute
    assert caps.decide("numpy").dtype == "bfloat16"  # storage alone never needs widening


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "CPU", "Cpu:1", "/CPU:0", "/device:CPU:0",
                                    "/job:localhost/replica:0/task:0/device:CPU:0"])
def test_for_compute_on_the_cpu_by_any_spelling_is_the_cpu(device):
    """cpu:0 and CPU were taken as an unknown device: bf16 on a CPU without bf16 arithmetic."""
    caps = bb.probe(reader=FakeReader("x86_64", X86_PLAIN))
    d = caps.decide("numpy", for_compute=True, device=device)
    assert d.dtype == "float32" and "no AVX512_BF16" in d.reason


def test_decide_says_what_it_does_not_know_and_refuses_bad_arguments():
    caps = bb.probe(reader=FakeReader("x86_64", X86_PLAIN))
    d = caps.decide("numpy", for_compute=True, device="mps:0")
    assert d.dtype == "bfloat16" and "no framework here reports a device 'mps:0'" in d.reason
    with pytest.raises(bb.InvalidArgumentError, match="widen_to must be"):
        caps.decide("numpy", widen_to="float16")
    with pytest.raises(bb.InvalidArgumentError, match="device must be a str"):
        caps.decide("numpy", for_compute=True, device=0)


def test_arm_flags_recorded():
    caps = bb.probe(reader=FakeReader("aarch64", "fp", hwcap2=(1 << 14) | (1 << 13)), trials=False)
    assert caps.cpu.flags == ("bf16", "i8mm")


def test_numpy_without_ml_dtypes_decides_float32_with_a_reason():
    caps = bb.probe(reader=FakeReader("x86_64", X86_BF16, ml_dtypes=(False, "ml_dtypes is unusable: No module")),
                    trials=False)
    assert not caps.numpy.bf16_storage and "No module" in caps.numpy.bf16_storage_why
    d = caps.decide("numpy")
    assert d.dtype == "float32" and "numpy cannot hold bf16" in d.reason and "No module" in d.reason
    assert caps.decide("numpy", widen_to="bits").dtype == "bits"
    assert "numpy bf16 storage  no" in str(caps) or "no: ml_dtypes is unusable" in str(caps)


def test_real_probe_is_cached_frozen_and_json_ready():
    caps = bb.probe()
    assert bb.probe() is caps
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.cpu = None
    d = json.loads(json.dumps(caps.to_dict(), default=str))
    assert d["cpu"]["arch"] and d["numpy"]["bf16_storage"] is True
    if hasattr(np.dtypes, "register_dlpack_dtype"):  # NumPy >= 2.5: the bridge registered bf16 (test_numpy_registry)
        assert caps.numpy.bf16_dlpack is True and "registered by bf16bridge" in caps.numpy.bf16_dlpack_why
    else:  # numpy <= 2.4: its own export refuses bf16
        assert caps.numpy.bf16_dlpack is False and "BufferError" in caps.numpy.bf16_dlpack_why
    # numpy's own answer to a request for DLPack 1.x: 2.1 and later give a versioned capsule,
    # older ones (the oldest set's) refuse max_version and export legacy capsules only
    try:
        versioned = "versioned" in repr(np.zeros(1).__dlpack__(max_version=(1, 0)))
    except TypeError:
        versioned = False
    assert caps.numpy.dlpack_version.startswith("1." if versioned else "0.x"), caps.numpy.dlpack_version


@pytest.mark.frameworks("torch", "tensorflow")
def test_probe_of_frameworks_tries_them():
    caps = bb.probe(frameworks="all", refresh=True)
    for name in ("torch", "jax", "tensorflow"):
        fw = caps.frameworks[name]
        assert fw.probed and fw.version and fw.bf16_dlpack is True, fw
    assert caps.frameworks["torch"].facts["uint16"][0] is True
    assert caps.frameworks["jax"].facts["x64"][0] is False
    assert caps.frameworks["torch"].dlpack_version.startswith("1.")


@pytest.mark.frameworks("torch")
def test_probe_imports_no_framework_unless_asked():
    code = textwrap.dedent("""
        import sys, json
        import bf16bridge as bb
        caps = bb.probe()
        assert not any(m in sys.modules for m in ("torch", "jax", "tensorflow")), "imported a framework"
        assert not caps.frameworks["torch"].probed and caps.frameworks["torch"].version
        assert "probe(frameworks=" in caps.frameworks["torch"].why
        caps = bb.probe(frameworks=["pt"])
        assert caps.frameworks["torch"].probed and not caps.frameworks["jax"].probed
        assert "jax" not in sys.modules and "tensorflow" not in sys.modules
        # one name is that name, not its letters (audit: "unknown framework 't'")
        assert bb.probe(frameworks="pt") == bb.probe(frameworks=["torch"])
        for bad in (5, [5]):
            try:
                bb.probe(frameworks=bad)
            except (bb.InvalidArgumentError, bb.UnknownFrameworkError) as err:
                assert "5" in str(err) or "int" in str(err), err
            else:
                raise AssertionError(bad)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_probe_and_the_cast_trials_print_nothing_on_stderr_and_keep_their_reasons():
    """The trials run framework calls that fail on purpose, and the frameworks' C++ logs some
    refusals to file descriptor 2 (tensorflow: "OP_REQUIRES failed at cast_op.cc:122 :
    UNIMPLEMENTED: Cast float4_e2m1fn to float is not supported"; torch's profiler, which the fp8
    matmul trial runs under: "USDT:... profiler_start"). A fresh process (every trial cold)
    imports the frameworks first (their import lines are theirs), then holds fd 2 around a full
    probe and tensorflow's cast trials: nothing may reach it, and the reasons are still kept."""
    code = textwrap.dedent("""
        import json, os, sys, tempfile
        import torch, jax, tensorflow
        import bf16bridge as bb
        from bf16bridge.core import registry
        for name in ("torch", "jax", "tensorflow"):
            registry.get(name)
        tf = registry.get("tensorflow")
        sys.stderr.flush()
        held, saved = tempfile.TemporaryFile(), os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            caps = bb.probe(frameworks="all", refresh=True)
            casts = {f"{s} {w}": tf.casts(s, w) for s in sorted(tf.narrow_held) for w in ("float32", "float16")}
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
        held.seek(0)
        fws = caps.frameworks
        print(json.dumps({"stderr": held.read().decode(errors="replace"), "casts": casts,
                          "why": [s.export_why for fw in fws.values() for s in fw.dtypes.values() if not s.dlpack_export],
                          "matmuls": [c.how for fw in fws.values() for c in fw.narrow_compute]}))
        sys.stdout.flush()
        os._exit(0)  # torch, tensorflow and jax together have crashed at shutdown here
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    assert got["stderr"] == "", got["stderr"][-3000:]
    assert got["casts"] and False in got["casts"].values(), got["casts"]  # some casts are refused: they were tried
    assert got["why"] and all(got["why"]), got["why"]  # each DLPack refusal keeps its reason
    assert got["matmuls"] and "unknown" not in got["matmuls"], got["matmuls"]  # the traced trials still read


@pytest.mark.frameworks("torch")
def test_fallback_auto_runs_no_trial_and_leaves_a_users_profiler_running():
    """fallback='auto' asks probe(trials=False): no narrow-dtype matmul (run under torch's
    profiler, it stopped the user's running one) and no DLPack trials; an explicit bb.probe()
    afterwards still runs them all. A fresh process, so the probe's cache is cold."""
    code = textwrap.dedent("""
        import torch
        from torch.profiler import ProfilerActivity, profile
        import bf16bridge as bb
        from bf16bridge.adapters.hooks import ProbeHooks
        from bf16bridge.core import registry
        calls = []
        cls = type(registry.hooks("torch", ProbeHooks))
        real = cls.narrow_compute
        cls.narrow_compute = lambda self, dtype: calls.append(dtype) or real(self, dtype)
        import jax
        read = []  # reading devices starts a device runtime (a CUDA context, jax's GPU client)
        for name in ("torch", "jax"):
            kind = type(registry.hooks(name, ProbeHooks))
            kind.devices = (lambda real, name: lambda self: read.append(name) or real(self))(kind.devices, name)
        with profile(activities=[ProfilerActivity.CPU]) as outer:
            y = bb.convert(torch.zeros(4, dtype=torch.bfloat16), "numpy", fallback="auto")
            y = bb.convert(torch.zeros(4, dtype=torch.bfloat16), "jax", fallback="auto", for_compute=True)
            torch.ones(3) * 2
        names = [e.name for e in outer.events()]
        assert "aten::mul" in names, f"the user's profiler recorded nothing after convert: {len(names)} events"
        assert calls == [], f"fallback='auto' ran narrow_compute for {calls}"
        assert read == [], f"fallback='auto' on the CPU read the devices of {read}"
        assert bb.probe(trials=False, devices=True).frameworks["jax"].probed and sorted(read) == ["jax", "torch"]
        caps = bb.probe()  # explicit: the trials run, not the cached trimmed answer
        assert calls and caps.frameworks["torch"].narrow_compute and caps.frameworks["torch"].dtypes
        assert caps.numpy.dtypes and "not tried" not in caps.numpy.bf16_dlpack_why
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.frameworks("torch", "jax")
def test_probe_reads_the_imported_frameworks_devices_by_default(monkeypatch):
    """probe()'s public default is devices=True: probe(trials=False), as a user calls it, reads
    each imported framework's devices (what decide(device=...) needs); only devices=False, which
    fallback='auto' passes for a CPU decision, leaves them unread."""
    import jax  # noqa: F401 - imported, so the probe reads it
    import torch  # noqa: F401

    from bf16bridge.adapters.hooks import ProbeHooks
    from bf16bridge.core import registry

    read = []
    for name in ("torch", "jax"):
        kind = type(registry.hooks(name, ProbeHooks))
        monkeypatch.setattr(kind, "devices", (lambda real, name: lambda self: read.append(name) or real(self))(
            kind.devices, name))
    caps = bb.probe(trials=False, refresh=True)
    assert {"torch", "jax"} <= set(read), read
    assert "devices not read" not in caps.frameworks["torch"].why
    read.clear()
    caps = bb.probe(trials=False, devices=False, refresh=True)
    assert read == [] and "devices not read" in caps.frameworks["torch"].why


@pytest.fixture
def machine(monkeypatch):
    """Make convert()'s probe see a machine of the test's choosing."""

    def use(reader):
        monkeypatch.setattr(probe_mod, "Reader", lambda: reader)
        monkeypatch.setattr(probe_mod, "_CACHE", {})

    return use


@pytest.mark.parametrize("src", ["torch", "jax", "tensorflow", "numpy"])
def test_auto_for_compute_on_a_cpu_without_bf16_gives_float32(machine, src, all_bf16):
    from conftest import make

    machine(FakeReader("x86_64", X86_PLAIN))
    x = make(src, all_bf16.view(BF16))
    p = bb.plan(x, to="numpy", fallback="auto", for_compute=True)
    assert p.dtype_out == "float32" and "no bf16 arithmetic" in p.decision and p.copies
    assert "no bf16 arithmetic" in str(p)
    y = bb.convert(x, "numpy", fallback="auto", for_compute=True)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.view(np.uint32), all_bf16.astype(np.uint32) << 16)  # exact widening


@pytest.mark.parametrize("dst", ["numpy", "torch", "jax", "tensorflow"])
def test_auto_keeps_bf16_where_it_fits(machine, dst, all_bf16):
    machine(FakeReader("x86_64", X86_BF16))
    a = aligned_copy(all_bf16.view(BF16))
    p = bb.plan(a, to=dst, fallback="auto", for_compute=True)
    if dst == "numpy":  # numpy computes bf16 in float32 (its matmul loop, read even by fallback='auto')
        assert p.dtype_out == "float32" and "np.matmul has no bf16 loop" in p.decision and p.copies
    else:  # the others are not tried by fallback='auto': a bf16 CPU keeps bf16, and says so
        assert p.dtype_out == "bfloat16" and "fallback='auto'" in p.decision and not p.copies
        assert "not tried: bb.probe() tries it" in p.decision
    np.testing.assert_array_equal(bits(bb.convert(a, dst, fallback="auto")), all_bf16)


def test_for_compute_needs_auto():
    with pytest.raises(ValueError, match="fallback='auto'"):
        bb.convert(np.zeros(2, BF16), "torch", for_compute=True)


def test_probe_cli_text_and_json():
    out = subprocess.run([sys.executable, "-m", "bf16bridge", "probe", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert "bf16_compute" in d["cpu"] and d["numpy"]["bf16_storage"] is True
    out = subprocess.run([sys.executable, "-m", "bf16bridge", "probe", "--verbose"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "cpu bf16 compute" in out.stdout and "decide('numpy')" in out.stdout


# -- frozen results -----------------------------------------------------------------


@pytest.mark.frameworks("torch", "tensorflow")
def test_probe_result_is_really_frozen_and_to_dict_is_a_free_copy():
    caps = bb.probe(frameworks="all")
    fw = caps.frameworks["torch"]
    mutations = [
        lambda: caps.frameworks.clear(),
        lambda: caps.frameworks.__setitem__("torch", None),
        lambda: caps.frameworks.pop("torch"),
        lambda: fw.facts.clear(),
        lambda: fw.facts.__setitem__("uint16", (False, "")),
        lambda: fw.devices.append(None),
    ]
    for mutate in mutations:
        with pytest.raises((TypeError, AttributeError)):
            mutate()
    assert set(caps.frameworks) >= {"torch", "jax", "tensorflow"} and fw.facts["uint16"][0] is True
    d = caps.to_dict()
    d["frameworks"].clear()
    d["frameworks"] = {}
    assert set(bb.probe(frameworks="all").frameworks) >= {"torch", "jax", "tensorflow"}
    d = json.loads(caps.to_json())
    assert d["frameworks"]["torch"]["facts"]["uint16"][0] is True
    assert isinstance(d["frameworks"]["jax"]["devices"], list)


def test_framework_caps_store_what_they_are_given_read_only():
    facts = {"x": (True, "why")}
    fw = probe_mod.FrameworkCaps("torch", "2.13.0", True, "why", facts=facts, devices=[])
    facts["x"] = (False, "changed afterwards")
    assert fw.facts["x"] == (True, "why") and fw.devices == ()


# -- DLPack entry points, found by trying -------------------------------------------


def _sample(name):
    """A small uint16 tensor made by the framework's own call."""
    from conftest import fw

    return {"torch": lambda m: m.zeros(2, dtype=m.uint16),
            "jax": lambda m: m.numpy.zeros(2, dtype="uint16"),
            "tensorflow": lambda m: m.zeros([2], m.uint16)}[name](fw(name))


@pytest.mark.parametrize("name", ["torch", "jax", "tensorflow"])
def test_probe_reports_dlpack_entry_points_as_tried(name):
    fw = bb.probe(frameworks="all").frameworks[name]
    has, why = fw.facts["Tensor.__dlpack__"]
    assert has is hasattr(_sample(name), "__dlpack__"), why
    if not has:  # tensorflow 2.16 (the oldest set): the way around it is named
        assert name == "tensorflow" and "tf.experimental.dlpack.to_dlpack" in why
    assert fw.dlpack_version and not fw.dlpack_version.startswith("none"), fw.dlpack_version
    assert fw.bf16_dlpack is True


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("dst", ["numpy", "torch", "jax"])
def test_tf_export_wrapper_hands_over_the_same_memory(dst, all_bf16):
    """The producer object a tensorflow without Tensor.__dlpack__ exports through, tried in every
    environment (the newest tensorflow has __dlpack__, so routes there do not use it)."""
    import tensorflow as tf

    from bf16bridge.adapters.tensorflow import convert as tfa
    from conftest import fw, make

    x = make("tensorflow", all_bf16.view(BF16))
    u = tf.bitcast(x, tf.uint16)
    consume = {"numpy": lambda m, o: m.from_dlpack(o), "torch": lambda m, o: m.from_dlpack(o),
               "jax": lambda m, o: m.numpy.from_dlpack(o)}[dst]
    y = consume(fw(dst), tfa._Exported(u if dst == "numpy" else x))
    np.testing.assert_array_equal(bits(y), all_bf16)
    from conftest import ptr

    assert ptr(y) == ptr(x)
    assert tfa._Exported(x).__dlpack_device__() == (1, 0)  # kDLCPU
    with pytest.raises(BufferError):
        tfa._Exported(x).__dlpack__(copy=True)


# -- versions: declared, tested, refused ----------------------------------------------

from bf16bridge.core import versions

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
#: distribution name in requirements -> import name in bf16bridge.core.versions.TESTED
_IMPORT_NAME = {"tensorflow-cpu": "tensorflow", "ml-dtypes": "ml_dtypes", "jaxlib": "jax"}


def _pins(filename):
    from packaging.requirements import Requirement

    out = {}
    for line in (ROOT / filename).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            out[_IMPORT_NAME.get(req.name.replace("_", "-"), req.name.replace("-", "_"))] = spec.version
    return out


def test_declared_lower_bounds_are_the_oldest_tested_and_pins_match_the_table():
    import tomllib

    from packaging.requirements import Requirement

    # (the oldest set also pins the tree libraries its tests walk, and the jax libraries under them)
    oldest = _pins("constraints-oldest.txt")
    assert {k: v for k, v in oldest.items() if k in versions.TESTED} == {k: v[0] for k, v in versions.TESTED.items()}
    # the newest tested of each: the newer of the full set's pin and the numpy 2.5 set's (numpy, jax);
    # both also pin the tools the tests use (mypy, hypothesis, the tree libraries)
    newest = _pins("constraints.txt")
    for name, version in _pins("constraints-numpy25.txt").items():
        if name in versions.TESTED and versions.release(version) > versions.release(newest[name]):
            newest[name] = version
    assert {k: v for k, v in newest.items() if k in versions.TESTED} == {k: v[1] for k, v in versions.TESTED.items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for name, reqs in project["optional-dependencies"].items():
        if name not in ("test", "bench", "lint", "trees"):  # tools for this repo's own checks
            declared += reqs
    assert len(declared) >= 8
    for line in declared:
        req = Requirement(line)
        name = _IMPORT_NAME.get(req.name, req.name.replace("-", "_"))
        (spec,) = req.specifier  # a lower bound only: newer releases are expected to work, and said so
        assert spec.operator == ">=" and versions.release(spec.version) == versions.release(oldest[name]), line
    # the oldest Python CI runs is the declared floor, and this run's Python is one CI runs
    assert project["requires-python"] == f">={versions.PYTHON[0]}"
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in versions.PYTHON
    listed = {c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")}
    assert listed == set(versions.PYTHON)


@pytest.mark.parametrize("name,version,word", [
    ("tensorflow", "2.15.1", "refused"),
    ("tensorflow", "2.16.2", "within"),
    ("tensorflow", "2.21.0", "within"),
    ("tensorflow", "2.22.0rc1", "newer"),
    ("jax", "0.4.29", "refused"),
    ("jax", "0.4.30", "within"),
    ("torch", "2.13.0+cpu", "within"),
    ("torch", "2.5.1", "expected to work"),
    ("torch", "2.2.2", "refused"),
    ("numpy", None, "not installed"),
])
def test_version_status_and_refusal(name, version, word):
    line = versions.status(name, version)
    assert word in line and versions.tested_range(name) in line, line
    if version is None:
        return
    if word == "refused":
        with pytest.raises(bb.FrameworkNotInstalledError) as err:
            versions.require(name, version)
        assert version in str(err.value) and versions.tested_range(name) in str(err.value)
        assert isinstance(err.value, ImportError)
    else:
        versions.require(name, version)


def test_the_installed_frameworks_are_within_the_tested_range():
    from conftest import REQUIRED

    caps = bb.probe(frameworks="all")
    for name in [n for n in ("torch", "jax", "tensorflow") if n in REQUIRED]:
        assert "within the tested range" in caps.frameworks[name].tested, caps.frameworks[name]
    assert caps.numpy.tested.count("within the tested range") == 2, caps.numpy.tested


@pytest.mark.parametrize("name,module,version", [("tensorflow", "tensorflow", "2.15.1"),
                                                 ("jax", "jax", "0.4.29"), ("torch", "torch", "2.2.2")])
def test_too_old_framework_gives_our_error_naming_version_and_range(name, module, version):
    """A conversion into (or a probe of) a framework older than any tested (torch: than its expected
    floor) fails at the adapter's load, with our error, never later with a foreign one."""
    code = textwrap.dedent(f"""
        import numpy as np, {module} as fw
        fw.__version__ = "{version}"  # what the adapter reads
        import bf16bridge as bb
        try:
            bb.convert(np.zeros(4, np.uint16), "{name}")
        except bb.FrameworkNotInstalledError as err:
            print(err)
        print(bb.probe(frameworks=["{name}"]).frameworks["{name}"].why)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout
    for line in lines:
        assert f"{name} {version} is older" in line and versions.tested_range(name) in line, line


def test_docs_state_the_tested_versions_of_the_table():
    routes = (ROOT / "docs" / "routes.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name, (oldest, newest) in versions.TESTED.items():
        assert f"| {oldest} | {newest} |" in routes, name
        assert f"{name} {versions.tested_range(name)}" in readme, name


# -- dtypes: which each framework holds and speaks over DLPack, against its own calls ----------

DTYPE_FRAMEWORKS = ("numpy", "torch", "jax", "tensorflow")


def _own_tensor(framework: str, name: str):
    """A 4-element tensor of dtype ``name`` made by the framework's own calls (raises where it
    has none): numpy and jax and tensorflow from an ml_dtypes array, torch by viewing bytes."""
    import ml_dtypes

    from bf16bridge.core import dtypes
    from conftest import fw

    if framework == "torch":
        torch = fw("torch")
        t = torch.zeros(4, dtype=torch.uint8).view(getattr(torch, name))
        assert t.dtype == getattr(torch, name)
        return t
    if name in dtypes.PACKED:  # no ml_dtypes dtype: two values a byte is torch's alone
        raise TypeError(f"ml_dtypes has no {name}")
    a = np.zeros(4, dtype=getattr(ml_dtypes, name))
    x = {"numpy": lambda: a, "jax": lambda: fw("jax").device_put(a),
         "tensorflow": lambda: fw("tensorflow").constant(a)}[framework]()
    assert np.dtype(x.dtype.as_numpy_dtype if framework == "tensorflow" else x.dtype) == a.dtype
    if framework == "jax":
        x.block_until_ready()
    return x


def _own_round_trip(framework: str, x) -> bool:
    """The framework's own DLPack export of ``x`` taken back by its own import, the dtype kept."""
    from conftest import fw

    try:
        if framework == "tensorflow":
            dl = fw("tensorflow").experimental.dlpack
            y = dl.from_dlpack(dl.to_dlpack(x))
        else:
            y = {"numpy": np.from_dlpack, "torch": lambda t: fw("torch").from_dlpack(t),
                 "jax": lambda t: fw("jax").numpy.from_dlpack(t)}[framework](x)
        return y.dtype == x.dtype
    except Exception:  # noqa: BLE001 - any refusal is a no
        return False


def _supports(caps, framework):
    return caps.numpy.dtypes if framework == "numpy" else caps.frameworks[framework].dtypes


@pytest.mark.parametrize("framework", DTYPE_FRAMEWORKS)
def test_probe_lists_the_dtypes_each_framework_holds_and_speaks_as_its_own_calls_do(framework):
    from bf16bridge.core import dtypes

    supports = _supports(bb.probe(frameworks="all"), framework)
    assert list(supports) == [d for d in dtypes.NAMES if d not in dtypes.STANDARD]
    for name, sup in supports.items():
        try:
            x, err = _own_tensor(framework, name), None
        except Exception as e:  # noqa: BLE001 - the framework cannot make one
            x, err = None, e
        assert sup.holds is (x is not None), (framework, name, sup, err)
        if x is None:
            assert sup.holds_why and sup.dlpack_export is None and sup.dlpack_import is None, sup
            continue
        # out and back in over DLPack, the dtype kept: both ways tried by the probe, or neither
        assert bool(sup.dlpack_export and sup.dlpack_import) is _own_round_trip(framework, x), (framework, sup)
        for ok, why in ((sup.dlpack_export, sup.export_why), (sup.dlpack_import, sup.import_why)):
            assert why and (ok or "tried" not in why or "not tried" in why or "type is lost" in why), sup


@pytest.mark.parametrize("framework", DTYPE_FRAMEWORKS)
def test_probe_finds_what_the_adapters_declare_to_the_planner(framework):
    """Trying and the declarations the planner follows agree: a disagreement is said in the reason."""
    for sup in _supports(bb.probe(frameworks="all"), framework).values():
        assert "the planner follows the declaration" not in sup.export_why + sup.import_why, sup


def test_probe_dtype_table_is_printed_frozen_and_in_json():
    from bf16bridge.core import dtypes

    caps = bb.probe(frameworks="all")
    torch_caps = caps.frameworks["torch"]
    with pytest.raises(TypeError):
        torch_caps.dtypes["float8_e4m3fn"] = None
    with pytest.raises((TypeError, AttributeError)):
        caps.numpy.dtypes.clear()
    with pytest.raises(AttributeError):
        torch_caps.narrow_compute.append(None)
    text = str(caps)
    table = text[text.index("dtype (held; DLPack out/in)"):]
    for name in torch_caps.dtypes:
        row = next(line for line in table.splitlines() if line.split()[0] == name)
        cells = [c for c in row[len(name):].split("  ") if c.strip()]
        assert len(cells) == 4, row  # numpy, torch, jax, tensorflow
    if any(not s.holds for s in torch_caps.dtypes.values()):
        assert "why not:" in table
    d = json.loads(caps.to_json())
    assert set(d["frameworks"]["jax"]["dtypes"]) == {n for n in dtypes.NAMES if n not in dtypes.STANDARD}
    assert d["numpy"]["dtypes"]["bfloat16"]["holds"] is True


def test_probe_without_ml_dtypes_says_numpy_holds_none_of_its_dtypes():
    caps = bb.probe(reader=FakeReader(ml_dtypes=(False, "ml_dtypes is unusable: No module")))
    assert caps.numpy.dtypes and all(not s.holds and "No module" in s.holds_why for s in caps.numpy.dtypes.values())


@pytest.mark.frameworks("torch")
def test_probe_asks_the_adapters_narrow_compute_for_each_fp8_dtype_held(monkeypatch):
    from bf16bridge.core import dtypes
    from bf16bridge.core import registry

    asked = []

    def narrow_compute(self, dtype):
        asked.append(dtype)
        if dtype == "float8_e5m2":
            raise RuntimeError("boom")
        return (("cpu", "emulated", f"widened {dtype}"),)

    from bf16bridge.adapters.hooks import ProbeHooks

    adapter = registry.hooks("torch", ProbeHooks)
    monkeypatch.setattr(type(adapter), "narrow_compute", narrow_compute, raising=False)
    caps = bb.probe(frameworks=["torch"], refresh=True)
    held = [d for d, s in caps.frameworks["torch"].dtypes.items() if s.holds]
    fp8 = [d for d in held if dtypes.ROWS[d].kind == "float" and dtypes.ROWS[d].bits == 8]
    assert asked == fp8 and "float8_e4m3fn" in fp8
    got = {c.dtype: c for c in caps.frameworks["torch"].narrow_compute}
    assert got["float8_e4m3fn"] == probe_mod.NarrowCompute("float8_e4m3fn", "cpu", "emulated",
                                                           "widened float8_e4m3fn")
    assert got["float8_e5m2"].how == "unknown" and "RuntimeError: boom" in got["float8_e5m2"].why
    assert re.search(r"\ntorch cpu float8_e4m3fn matmul +emulated: widened float8_e4m3fn\n", str(caps))
    bb.probe(frameworks=["torch"], refresh=True)  # the cache holds no answer of the stand-in hook


def _widening_matmul_seen_by_torch(dt) -> bool:
    """torch's own account: its profiler shows a matmul on non-fp8 tensors inside torch._scaled_mm."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.ones(16, 16).to(dt)
    one = torch.ones(())
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return any(e.name() == "aten::mm" and "Float8" not in str(e.dtypes()[0])
               for e in prof.profiler.kineto_results.events())


def _xla_converts_before_its_dot(np_dtype) -> bool:
    """jax's own account: the compiled program converts the fp8 parameters before any dot."""
    import jax
    import jax.numpy as jnp

    x = jax.device_put(np.ones((16, 16), dtype=np_dtype), jax.devices("cpu")[0])
    text = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32)).lower(x, x).compile().as_text()
    return " convert(" in text and "dot(" in text


@pytest.mark.parametrize("name", ["torch", "jax", "tensorflow"])
def test_fp8_matmul_is_tried_on_the_cpu_for_each_fp8_dtype_held_and_says_how(name):
    import ml_dtypes

    from bf16bridge.core import dtypes
    from conftest import fw

    caps = bb.probe(frameworks="all")
    f = caps.frameworks[name]
    held = [d for d, s in f.dtypes.items() if s.holds and dtypes.ROWS[d].kind == "float" and dtypes.ROWS[d].bits == 8]
    cpu = {c.dtype: c for c in f.narrow_compute if c.device == "cpu"}
    assert list(cpu) == held and held, f.narrow_compute
    for d, c in cpu.items():
        if name == "torch":
            want = "emulated" if _widening_matmul_seen_by_torch(getattr(fw("torch"), d)) else "native"
        elif name == "jax":
            want = "emulated" if _xla_converts_before_its_dot(getattr(ml_dtypes, d)) else "native"
        else:  # tensorflow has no fp8 MatMul kernel: its own refusal is the reason
            tf = fw("tensorflow")
            with pytest.raises(Exception) as refused:
                tf.linalg.matmul(tf.constant(np.ones((2, 2), getattr(ml_dtypes, d))),
                                 tf.constant(np.ones((2, 2), getattr(ml_dtypes, d))))
            want = "no"
            assert type(refused.value).__name__ in c.why, c
        assert c.how == want, c
