"""The bridge's use of NumPy 2.5's DLPack dtype registry (adapters/_numpy_registry.py).

Two halves. The stand-in tests drive the logic with a fake numpy whose ``from_dlpack`` refuses
ml_dtypes types until they are registered, as NumPy 2.5 does, so they run on any numpy. The real
tests run against this numpy: on NumPy >= 2.5 (``.venv-numpy25``, ``make test-numpy25``: numpy
2.5.5, jax 0.11.2, the device machine's versions) the real registry, bit for bit and by pointer;
on older numpys, that nothing is registered and numpy still refuses these types. The few that
need the registry itself (to map a key before the bridge looks) are skipped on NumPy < 2.5 with
that reason; tests/project/test_environment.py fails a run whose BF16BRIDGE_TEST_NUMPY names a numpy it
does not have, so in ``make test-numpy25`` they run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import ml_dtypes
import numpy as np
import pytest

from bf16bridge.core import dtypes
from bf16bridge.adapters import numpy_registry as registry

# DLPack 1.1's DLDataTypeCode (dlpack.h), written out here independently of dtypes.TABLE
DLPACK_CODES = {"bfloat16": 4, "float8_e3m4": 7, "float8_e4m3": 8, "float8_e4m3b11fnuz": 9,
                "float8_e4m3fn": 10, "float8_e4m3fnuz": 11, "float8_e5m2": 12, "float8_e5m2fnuz": 13,
                "float8_e8m0fnu": 14}


def fake_numpy(pre_registered=(), refuse=()):
    """A numpy whose DLPack takes only its own dtypes and the registered ones."""
    calls = []
    known = {np.dtype(getattr(ml_dtypes, n)) for n in pre_registered}

    def register_dlpack_dtype(key, dt, /):
        if dt.name in refuse:
            raise ValueError(f"DLPack key {key} already maps to another dtype")
        calls.append((key, dt.name))
        known.add(dt)

    def from_dlpack(a):
        if a.dtype.kind in "biufc" and a.dtype.name in dtypes.STANDARD or a.dtype in known:
            return a.copy()
        raise BufferError("DLPack only supports signed/unsigned integers, float and complex dtypes.")

    mod = types.SimpleNamespace(arange=np.arange, uint8=np.uint8, from_dlpack=from_dlpack,
                                dtypes=types.SimpleNamespace(register_dlpack_dtype=register_dlpack_dtype))
    return mod, calls


def held(names):
    return [n for n in names if dtypes.numpy_missing(n) is None]


def test_no_registry_does_nothing():
    mod, calls = fake_numpy()
    del mod.dtypes.register_dlpack_dtype
    r = registry.register(mod)
    assert not r.available and not r.registered and "NumPy >= 2.5" in str(r)
    assert not calls and not r.passes


def test_without_a_registry_what_numpy_passes_is_still_found():
    mod, _ = fake_numpy(pre_registered=["bfloat16"])
    del mod.dtypes.register_dlpack_dtype
    r = registry.register(mod)
    assert not r.available and r.passes == {"bfloat16"}


def test_registers_bf16_and_fp8_with_dlpacks_codes():
    mod, calls = fake_numpy()
    r = registry.register(mod)
    expected = held(DLPACK_CODES)
    assert sorted(calls) == sorted(((DLPACK_CODES[n], 8 * dtypes.numpy_dtype(n).itemsize), n) for n in expected)
    assert set(r.registered) == set(expected) and not r.already
    assert "bfloat16" in r.registered and "registered by bf16bridge" in str(r)


def test_sub_byte_types_are_not_expressible():
    mod, calls = fake_numpy()
    r = registry.register(mod)
    skipped = dict(r.skipped)
    for name in held(["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]):
        assert "bits == 8 x itemsize" in skipped[name]
    for name in held(["int4", "uint4", "int2", "uint2"]):
        assert "no code" in skipped[name]
    assert not {n for _, n in calls} & set(skipped)


def test_leaves_what_ml_dtypes_registered():
    mod, calls = fake_numpy(pre_registered=["bfloat16", "float8_e4m3fn"])
    r = registry.register(mod)
    assert set(r.already) == {"bfloat16", "float8_e4m3fn"}
    assert not {n for _, n in calls} & {"bfloat16", "float8_e4m3fn"}


def test_a_refusal_is_recorded_not_raised():
    mod, _ = fake_numpy(refuse=["float8_e5m2"])
    r = registry.register(mod)
    assert "float8_e5m2" not in r.registered
    assert "refused" in dict(r.skipped)["float8_e5m2"]


def test_registered_but_still_failing_is_said():
    mod, _ = fake_numpy()
    mod.dtypes.register_dlpack_dtype = lambda key, dt, /: None  # accepts, changes nothing
    r = registry.register(mod)
    assert not r.registered
    assert "still fails" in dict(r.skipped)["bfloat16"]


@pytest.mark.parametrize("name", sorted(DLPACK_CODES))
def test_table_codes_are_dlpacks(name):
    assert dtypes.row(name).dlpack == (DLPACK_CODES[name], 8 * dtypes.row(name).itemsize, 1)



# -- the real registry: this numpy, this ml_dtypes, this jax ------------------------------------

#: NumPy 2.5 added the registry (numpy#31256)
REAL = hasattr(np.dtypes, "register_dlpack_dtype")
needs_registry = pytest.mark.skipif(not REAL, reason="NumPy < 2.5 has no DLPack dtype registry; "
                                    "make test-numpy25 runs this against NumPy 2.5")
#: the rows the registry can map here: bf16 and the fp8 family (one value a byte, lanes 1)
MAPPABLE = held(DLPACK_CODES)
#: the rows it cannot: fp6/fp4 (fewer bits than their byte), the sub-byte ints (no DLPack code)
UNMAPPABLE = held(["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"])
#: what numpy <= 2.4 raises importing or exporting an ml_dtypes type over DLPack
REFUSED = (BufferError, RuntimeError)


def _patterns(name):
    """Every bit pattern of the row, as an array of it."""
    return dtypes.all_patterns(name).view(dtypes.numpy_dtype(name))


def _run(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (numpy's registry is process-wide and only grows):
    the lines it printed."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_the_registry_comes_with_numpy_2_5():
    from bf16bridge.core.versions import release

    assert REAL == (release(np.__version__) >= (2, 5)), np.__version__


def test_what_the_bridge_registered_here():
    from bf16bridge.adapters.numpy import ADAPTER, REGISTRATION

    if not REAL:
        assert REGISTRATION == registry.Registration(False) and not REGISTRATION.passes
        assert not set(MAPPABLE) & ADAPTER.dlpack_import
        return
    # everything expressible passes numpy's own round trip now, by ml_dtypes' hand or ours ...
    assert REGISTRATION.available and REGISTRATION.passes == set(MAPPABLE)
    assert set(MAPPABLE) <= ADAPTER.dlpack_import and set(MAPPABLE) <= ADAPTER.dlpack_export
    # ... the rest is said, with its reason, and never handed to the registry
    assert {n for n, _ in REGISTRATION.skipped} == set(UNMAPPABLE)
    assert not set(UNMAPPABLE) & ADAPTER.dlpack_import
    # a second look finds all of it mapped and registers nothing again
    again = registry.register()
    assert set(again.already) == set(MAPPABLE) and not again.registered


def test_ml_dtypes_alone_registers_nothing_and_the_bridge_only_fills_the_gaps():
    """In a fresh process: which rows numpy + ml_dtypes pass over DLPack before bf16bridge is
    imported (none, with ml_dtypes 0.6.0: ml_dtypes#376), then what importing bf16bridge (and
    nothing else) registered: exactly the rest of the rows the registry can map."""
    lines = _run(f"""
        import sys
        import ml_dtypes, numpy as np
        names = {MAPPABLE!r}
        def passes(n):
            a = np.zeros(4, getattr(ml_dtypes, n))
            try:
                return np.from_dlpack(a).dtype == a.dtype
            except (BufferError, RuntimeError):
                return False
        print(",".join(n for n in names if passes(n)))
        import bf16bridge
        from bf16bridge.adapters.numpy import REGISTRATION as r
        print(",".join(r.already)); print(",".join(r.registered))
        print(",".join(n for n in names if passes(n)))
        print(",".join(m for m in ("torch", "jax", "tensorflow") if m in sys.modules))
    """)
    before, already, registered, after, frameworks = (set(filter(None, line.split(","))) for line in lines)
    assert already == before and not registered & before
    assert not frameworks  # registering imports no framework
    if ml_dtypes.__version__ == "0.6.0":
        assert not before, "ml_dtypes 0.6.0 now registers its types: update FACTS.md and docs/routes.md"
    if REAL:
        assert registered == set(MAPPABLE) - before and after == set(MAPPABLE)
    else:
        assert not registered and after == before


@needs_registry
def test_a_row_ml_dtypes_mapped_first_is_left_to_it_and_the_probe_says_so():
    """As ml_dtypes would (ml_dtypes#376), bf16 is mapped before bf16bridge is imported: the bridge
    leaves it, registers the fp8 rows, and the probe names who mapped bf16."""
    lines = _run("""
        import ml_dtypes, numpy as np
        np.dtypes.register_dlpack_dtype((4, 16), np.dtype(ml_dtypes.bfloat16))
        import bf16bridge as bb
        from bf16bridge.adapters.numpy import REGISTRATION as r
        print(",".join(r.already)); print(",".join(r.registered))
        caps = bb.probe()
        print(caps.numpy.bf16_dlpack); print(caps.numpy.bf16_dlpack_why)
    """)
    assert lines[0] == "bfloat16" and "bfloat16" not in lines[1].split(",")
    assert set(lines[1].split(",")) == set(MAPPABLE) - {"bfloat16"}
    assert lines[2] == "True" and "mapped by numpy or ml_dtypes" in lines[3]


@needs_registry
def test_a_foreign_dtype_on_bf16s_key_is_not_taken_for_bf16():
    """Someone mapped DLPack's bf16 key (code 4, 16 bits) to float16 first: numpy's registry refuses
    ours, np.from_dlpack now reads bf16 capsules as float16, so the bridge must not route bf16
    through numpy's DLPack, and the probe must not say numpy passes bf16 (it said True: it only
    checked that np.from_dlpack did not raise). Conversions still arrive bit for bit."""
    lines = _run("""
        import ml_dtypes, numpy as np
        np.dtypes.register_dlpack_dtype((4, 16), np.dtype(np.float16))
        import jax
        import bf16bridge as bb
        from bf16bridge.adapters.numpy import ADAPTER, REGISTRATION as r
        print(dict(r.skipped).get("bfloat16", ""))
        print("bfloat16" in ADAPTER.dlpack_import, "bfloat16" in ADAPTER.dlpack_export)
        caps = bb.probe()
        print(caps.numpy.bf16_dlpack); print(caps.numpy.bf16_dlpack_why)
        a = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
        y = bb.convert(bb.convert(a, "jax"), "numpy")
        print(y.dtype, bytes(y.view(np.uint16)) == bytes(a.view(np.uint16)))
    """)
    assert "refused" in lines[0]
    assert lines[1] == "False False"
    assert lines[2] == "False" and "float16" in lines[3], lines[2:4]
    assert lines[4] == "bfloat16 True"


@pytest.mark.parametrize("source", ["jax", "numpy"])
@pytest.mark.parametrize("name", MAPPABLE)
def test_every_pattern_crosses_numpys_dlpack_zero_copy(name, source):
    """jax's export into np.from_dlpack, and numpy's own export (ndarray.__dlpack__) into
    jax.numpy.from_dlpack: on NumPy >= 2.5 after the bridge's registration, the same dtype, every
    bit pattern, the same memory (a numpy result read-only); before, refused."""
    from conftest import bits, fw, make, ptr

    a = _patterns(name)
    x = make(source, a)
    into = np.from_dlpack if source == "jax" else fw("jax").numpy.from_dlpack
    if not REAL:
        with pytest.raises(REFUSED):
            into(x)
        return
    y = into(x)
    assert np.dtype(y.dtype) == a.dtype
    np.testing.assert_array_equal(bits(y).view(np.uint8), a.view(np.uint8))
    assert ptr(y) == ptr(x)
    assert source == "numpy" or not y.flags.writeable


@pytest.fixture
def jax_without_handoffs():
    """jax with no direct hand-off with numpy (jax.device_put, np.asarray): as torch and tensorflow
    reach numpy, only DLPack and bit-views are left to the planner."""
    from bf16bridge.core import registry as adapters
    from bf16bridge.adapters.jax.convert import JaxAdapter

    class NoHandoffs(JaxAdapter):
        def handoffs(self):
            return []

    spec = adapters.spec("jax")
    adapters.register_adapter("jax", NoHandoffs(), types=spec.types, aliases=spec.aliases, replace=True,
                              hooks=dict(spec.hooks))
    try:
        yield
    finally:
        adapters.register_adapter("jax", spec.module, types=spec.types, aliases=spec.aliases,
                                  requires=spec.requires, replace=True, hooks=dict(spec.hooks))


@pytest.mark.parametrize("name", MAPPABLE)
def test_the_planner_takes_numpys_dlpack_once_it_carries_the_row(name, jax_without_handoffs):
    """With the registry, jax -> numpy and numpy -> jax are one zero-copy DLPack hand-over of the row
    itself, and plan() says so; without it, the row crosses as its unsigned carrier, and jax's
    bit-cast copies."""
    import bf16bridge as bb
    from conftest import bits, make, ptr

    a = _patterns(name)
    x = make("jax", a)
    for src, target, label in ((x, "numpy", "numpy.from_dlpack"), (make("numpy", a), "jax", "jax.numpy.from_dlpack")):
        p = bb.plan(src, target)
        if REAL:
            assert [(s.kind, s.label, s.dtype) for s in p.steps] == [("dlpack", label, name)], p
            assert p.zero_copy and f"{label} -> {name}  [zero-copy]" in str(p)
            y = bb.convert(src, target, copy=False)
            assert ptr(y) == ptr(src)
        else:
            carrier = dtypes.BITS_OF[name]
            assert [s.dtype for s in p.steps if s.kind == "dlpack"] == [carrier] and p.copies, p
            y = bb.convert(src, target)
        np.testing.assert_array_equal(bits(y).view(np.uint8), a.view(np.uint8))


def test_the_probe_says_who_mapped_bf16():
    import bf16bridge as bb
    from bf16bridge.adapters.numpy import REGISTRATION

    caps = bb.probe(refresh=True)
    if REAL:  # ml_dtypes 0.6.0 maps nothing: the bridge did (another ml_dtypes: the subprocess test above)
        assert caps.numpy.bf16_dlpack is True
        who = "registered by bf16bridge" if "bfloat16" in REGISTRATION.registered else "mapped by numpy or ml_dtypes"
        assert who in caps.numpy.bf16_dlpack_why
    else:
        assert caps.numpy.bf16_dlpack is False
        assert str(REGISTRATION) in caps.numpy.bf16_dlpack_why


# -- docs/routes.md's NumPy 2.5 table: this numpy's answers, checked where they were found --------

ROUTES_MD = __import__("pathlib").Path(__file__).resolve().parents[2] / "docs" / "routes.md"
BLOCK = ("<!-- numpy25: tests/adapters/test_numpy_registry.py checks it under make test-numpy25 -->", "<!-- /numpy25 -->")


def _crosses(run, a) -> str:
    """What a DLPack hand-over of ``a``'s memory does: refused, or what arrives."""
    from conftest import bits, ptr

    try:
        y = run()
    except Exception as err:  # noqa: BLE001 - what it raised is the finding
        return f"refused ({type(err).__name__})"
    if np.dtype(y.dtype) != a.dtype:
        return f"arrives as {np.dtype(y.dtype)}"
    same = np.array_equal(bits(y).view(np.uint8), a.view(np.uint8))
    return ("bit-exact" if same else "BITS CHANGED") + (", zero-copy" if ptr(y) == ptr(run.source) else ", copied")


def numpy25_table() -> str:
    """The block docs/routes.md shows: per row, what the registration did and what each side's
    DLPack import does with every bit pattern of it."""
    import jax

    from bf16bridge.adapters.numpy import REGISTRATION
    from conftest import aligned_copy, make

    skipped = dict(REGISTRATION.skipped)
    lines = [f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, jax {jax.__version__}",
             "", "| dtype | numpy's DLPack registry | jax -> `np.from_dlpack` | numpy -> `jnp.from_dlpack` |",
             "|---|---|---|---|"]
    for name in MAPPABLE + UNMAPPABLE:
        if name in REGISTRATION.registered:
            how = "registered by bf16bridge"
        elif name in REGISTRATION.already:
            how = "mapped before bf16bridge looked"
        else:
            how = f"not registered: {skipped.get(name, 'no registry')}"
        a = aligned_copy(_patterns(name))
        x = make("jax", a)

        def into_numpy(x=x):
            return np.from_dlpack(x)

        def into_jax(a=a):
            return jax.numpy.from_dlpack(a)

        into_numpy.source, into_jax.source = x, a
        lines.append(f"| {name} | {how} | {_crosses(into_numpy, a)} | {_crosses(into_jax, a)} |")
    return "\n".join(lines)


def _doc_block() -> str:
    text = ROUTES_MD.read_text()
    start, end = text.index(BLOCK[0]) + len(BLOCK[0]), text.index(BLOCK[1])
    return text[start:end].strip()


def test_routes_md_numpy25_table():
    """Under NumPy 2.5 (make test-numpy25) the block is what this run finds, row for row; elsewhere,
    it names the versions constraints-numpy25.txt pins, which that run uses."""
    block = _doc_block()
    if REAL:
        want = numpy25_table()
        assert block == want, f"docs/routes.md's numpy25 block is stale; it should read:\n{want}"
    else:
        pins = dict(line.split("==") for line in (ROUTES_MD.parents[1] / "constraints-numpy25.txt").read_text()
                    .splitlines() if "==" in line and not line.startswith("#"))
        assert block.splitlines()[0] == f"numpy {pins['numpy']}, ml_dtypes {pins['ml_dtypes']}, jax {pins['jax']}"
