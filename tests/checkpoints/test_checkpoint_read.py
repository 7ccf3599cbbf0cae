"""Reading checkpoints (bb.open, bb.load; bf16bridge/checkpoints/read.py): listing without reading
data, results as private views of the map (writes never reach the file, and survive copying gets),
zero-copy where aligned and one copy where not, copies in aligned memory of their own (mapped and
populated, or numpy's when a map is refused), the read cache, peak memory of a load in a fresh
process, a checkpoint closed when dropped, an unknown target named once."""

from __future__ import annotations

import mmap
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.errors import CheckpointError
from conftest import FRAMEWORKS, bits, ptr
from checkpoint_cases import _file, _st_write, _t, _values


def test_open_lists_without_reading_data_and_names_missing_keys(tmp_path):
    p = tmp_path / "m.safetensors"
    bb.save({"w": np.zeros((4, 8), ml_dtypes.bfloat16), "i": np.arange(3)}, p, metadata={"k": "v"})
    with bb.open(p) as f:
        assert (len(f), "w" in f, set(f)) == (2, True, {"w", "i"})
        info = f.info("w")
        assert (info.dtype, info.shape, info.nbytes, info.aligned) == ("bfloat16", (4, 8), 64, True)
        assert f.metadata == {"k": "v"}
        for ask in (f.get, f.info, f.array):  # ours, and still a KeyError; the message as written
            with pytest.raises(bb.MissingKeyError, match="has no tensor 'nope' .*keys\\(\\) lists them") as err:
                ask("nope")
            assert isinstance(err.value, KeyError) and str(err.value).startswith(str(p))
            with pytest.raises(bb.InvalidArgumentError, match="keys are strings; got \\[\\]"):
                ask([])  # (review: TypeError, unhashable type)
    with pytest.raises(CheckpointError, match="closed"):
        f.get("w")


def test_a_checkpoint_dropped_without_close_closes_its_file(tmp_path):
    import gc

    p = tmp_path / "m.safetensors"
    bb.save({"w": np.ones(64, np.float32)}, p)
    f = bb.open(p)
    file = f._file
    w = f.get("w")  # a view keeps the map, not the file
    del f
    gc.collect()
    assert file.closed and w.tolist() == [1.0] * 64
    g = bb.open(p)
    g.close()
    g.close()  # twice: nothing more to do
    assert g._file.closed and g.closed


def test_load_names_an_unknown_target_once_not_blaming_a_key(tmp_path):
    p = tmp_path / "m.safetensors"
    bb.save({"n": np.ones(3, np.float32)}, p)
    with pytest.raises(bb.UnknownFrameworkError) as err:
        bb.load(p, to="mx")
    assert "key" not in str(err.value) and "'mx'" in str(err.value)


# -- private memory maps, alignment, plans ---------------------------------------------------

@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_results_are_private_views_of_the_map(tmp_path, target):
    p = tmp_path / "m.safetensors"
    bb.save({"w": np.arange(64, dtype=np.float32).astype(ml_dtypes.bfloat16), "b": np.ones(7, np.int8)}, p)
    before = p.read_bytes()
    with bb.open(p) as f:
        base = np.frombuffer(f._map, np.uint8).ctypes.data
        w = f.get("w", to=target)
        assert ptr(w) == base + f.info("w").offset  # a view of the map, not a copy
        assert f.plan("w", target).zero_copy
        w[3] = 42  # numpy and torch both index-assign
        again = f.get("w")
        assert float(again[3]) == 42.0  # the same private pages (documented)
    assert p.read_bytes() == before  # never reaches the file
    assert float(bb.load(p)["w"][3]) == 3.0  # a new map reads the file's bytes


@pytest.mark.parametrize("target", ["jax", "tensorflow"])
def test_aligned_tensors_go_zero_copy_to_jax_and_tensorflow_others_copy_once(tmp_path, target):
    p = tmp_path / "m.safetensors"
    bb.save({"aligned": np.arange(32, dtype=np.float32).astype(ml_dtypes.bfloat16),  # 64 bytes
             "odd": np.arange(5, dtype=ml_dtypes.bfloat16), "odd2": np.arange(3, dtype=ml_dtypes.bfloat16)}, p)
    with bb.open(p) as f:
        assert f.header.data_start % 64 == 0 and f.info("aligned").aligned
        assert not f.info("odd2").aligned
        base = np.frombuffer(f._map, np.uint8).ctypes.data
        assert f.plan("aligned", target).zero_copy
        assert ptr(f.get("aligned", target)) == base + f.info("aligned").offset
        plan = f.plan("odd2", target)
        assert plan.copies and sum(s.copies for s in plan.steps) == 1
        assert any("aligned" in s.reason for s in plan.steps if s.copies)
        out = f.get("odd2", target)
        assert bits(out).tobytes() == np.arange(3, dtype=ml_dtypes.bfloat16).view(np.uint16).tobytes()
        assert ptr(out) % 64 == 0


def test_copy_true_detaches_and_copy_false_refuses_a_copy(tmp_path):
    p = tmp_path / "m.safetensors"
    bb.save({"a": np.zeros(64, np.float32), "b": np.zeros(3, np.int16), "c": np.zeros(3, np.int16)}, p)
    with bb.open(p) as f:
        c = f.get("a", copy=True)
        assert ptr(c) != np.frombuffer(f._map, np.uint8).ctypes.data + f.info("a").offset
        with pytest.raises(bb.CopyRequiredError):
            f.get("c", "jax", copy=False)  # at 64 * 4 + 6 bytes: not aligned


@pytest.mark.parametrize("target", FRAMEWORKS)
@pytest.mark.parametrize("everything", [False, True], ids=["large", "every size"])
def test_tensors_read_from_the_file_have_its_bits_in_aligned_memory_of_their_own(tmp_path, monkeypatch, target,
                                                                                   everything):
    # copy=True reads every tensor into an array of its own: from POPULATE_FROM bytes on, memory mapped
    # for it with its pages made at once (and unmapped with the result); "every size" reads all so
    from bf16bridge.checkpoints import read as rd

    if everything:
        monkeypatch.setattr(rd, "POPULATE_FROM", 0)
    big = _values("BF16", (rd.POPULATE_FROM + 4096) // 2 + 3, seed=1)  # past the size, not a whole page
    tensors = {"big": big.reshape(-1, 1), "small": _values("F32", 5, seed=2), "i16": _values("I16", 3, seed=3)}
    p = tmp_path / "st.safetensors"
    _st_write(p, tensors)  # safetensors' layout: every tensor 8 bytes past a 64-byte boundary at best
    out = bb.load(p, to=target, copy=True)
    for k, a in tensors.items():
        assert bits(out[k]).tobytes() == a.tobytes(), k
        assert ptr(out[k]) % 64 == 0, k
    with bb.open(p) as f:  # the memory each read into: maps only where the platform populates them
        for k, a in tensors.items():
            got = owner = f.get(k, copy=True)
            while isinstance(owner, np.ndarray) and owner.base is not None:
                owner = owner.base
            mapped = isinstance(owner, memoryview) and isinstance(owner.obj, mmap.mmap)  # np.frombuffer's
            assert mapped == (bool(rd._POPULATE) and (everything or a.nbytes >= rd.POPULATE_FROM)), k
            assert got.flags.writeable and got.view(np.uint8).tobytes() == a.tobytes()


def test_a_refused_populated_map_falls_back_to_numpy_memory(tmp_path, monkeypatch):
    # a memory limit refuses mmap with a bare OSError (no file, key or size): the read goes to numpy's
    # memory instead, whose own MemoryError names the size where memory is really short
    from bf16bridge.checkpoints import read as rd

    real = rd.mmap.mmap

    def refused(fileno, *args, **kwargs):  # anonymous maps only: the file's own map is made as ever
        if fileno == -1:
            raise OSError(12, "Cannot allocate memory")
        return real(fileno, *args, **kwargs)

    monkeypatch.setattr(rd, "POPULATE_FROM", 0)
    monkeypatch.setattr(rd.mmap, "mmap", refused)
    a = _values("BF16", 1000, seed=4)
    p = tmp_path / "st.safetensors"
    _st_write(p, {"a": a})
    with bb.open(p) as f:
        got = f.get("a", copy=True)
    assert got.view(np.uint8).tobytes() == a.tobytes() and ptr(got) % 64 == 0


@pytest.mark.parametrize("expose", ["array", "raw", "get"])
def test_a_write_into_a_view_survives_a_copying_get_of_the_same_key(tmp_path, expose):
    # a copying get() drops the pages of what it copied (MADV_DONTNEED): never those of a key
    # handed out writable, by array() and raw() as by get(), or the write is lost
    p = tmp_path / "m.safetensors"
    bb.save({"pad": np.zeros(3, np.uint8), "big": np.arange(4096, dtype=np.int64)}, p)
    with bb.open(p) as f:
        v = getattr(f, expose)("big").view(np.int64)
        v[:] = -1
        out = f.get("big", to="jax", fallback="auto")  # int64 -> int32: a copy from the map
        assert (v == -1).all()
        assert (np.asarray(out) == -1).all()


@pytest.mark.frameworks("torch")
def test_the_read_cache_keys_on_the_address_modulo_64_not_only_on_alignment(tmp_path):
    # two float32 tensors, neither 64-byte aligned: one on a 4-byte boundary (torch views it), one
    # on a 2-byte boundary (numpy's ALIGNED is False: read into an aligned array); get() does what
    # plan() says in either order
    data = np.arange(4, dtype=np.float32).tobytes() + b"\0\0" + np.arange(4, 8, dtype=np.float32).tobytes()
    header = {"a": _t("F32", (4,), (0, 16)), "p": _t("U8", (2,), (16, 18)), "b": _t("F32", (4,), (18, 34))}
    path = tmp_path / "m.safetensors"
    path.write_bytes(_file(header, data, pad=64))  # the data begins at 8 (mod 64)
    with bb.open(path) as f:
        base = np.frombuffer(f._map, np.uint8).ctypes.data
        assert (base + f.info("a").offset) % 64 == 8 and (base + f.info("b").offset) % 4 == 2
        assert f.plan("a", "torch").zero_copy and f.plan("b", "torch").copies
        b = f.get("b", "torch")  # first: a read
        a = f.get("a", "torch")
        assert ptr(a) == base + f.info("a").offset
        assert ptr(b) % 64 == 0
        assert a.tolist() == [0, 1, 2, 3] and b.tolist() == [4, 5, 6, 7]


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("target", ["jax", "tensorflow"])
def test_a_read_from_the_file_sees_this_processs_writes_into_a_view(tmp_path, target):
    # an unaligned tensor is read into an aligned array for jax and tensorflow; after a write into
    # a numpy view of it, that read comes from the map (the write), not the file
    p = tmp_path / "m.safetensors"
    bb.save({"aligned": np.zeros(32, ml_dtypes.bfloat16), "odd5": np.zeros(5, ml_dtypes.bfloat16),
             "odd": np.arange(3, dtype=ml_dtypes.bfloat16)}, p)
    with bb.open(p) as f:
        assert not f.info("odd").aligned and f.plan("odd", target).copies
        f.get("odd")[1] = 42
        assert f.get("odd", "torch")[1].item() == 42
        assert bits(f.get("odd", target)).tolist() == bits(np.array([0, 42, 2], ml_dtypes.bfloat16)).tolist()


# -- memory: a fresh process, peak RSS (tracemalloc cannot see framework allocators) -----------

_RSS = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes, bf16bridge as bb
    path, target = sys.argv[1], sys.argv[2]
    def status(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field)) * 1024
    bb.convert(np.zeros(64, ml_dtypes.bfloat16), target)  # the target's import and first call
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS (Linux >= 4.0)
    base = status("VmRSS")
    out = bb.load(path, to=target)
    for v in out.values():
        getattr(v, "block_until_ready", lambda: None)()
    print(base, status("VmHWM"), status("VmRSS"))
""")


def test_a_copying_load_holds_about_one_tensor_of_the_file_at_a_time(tmp_path):
    n, elems = 24, (4 << 20) // 2 + 1  # 24 tensors of 4 MiB + 2 bytes: all but the first unaligned
    p = tmp_path / "m.safetensors"
    bb.save({f"t{i}": np.full(elems, i, ml_dtypes.bfloat16) for i in range(n)}, p)
    with bb.open(p) as f:
        assert sum(not f.info(k).aligned for k in f) == n - 1
    run = subprocess.run([sys.executable, "-c", _RSS, str(p), "jax"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    base, peak, after = map(int, run.stdout.split()[-3:])
    tensor = elems * 2
    assert after - base > (n - 2) * tensor  # the results are held (copies)
    # the results and at most a few tensors' worth more, at the peak and after (not the file again:
    # a copied tensor's pages of the map are dropped; the first tensor, aligned, stays a view)
    assert peak - base < (n + 4) * tensor, (peak - base) / tensor
    assert after - base < (n + 2) * tensor, (after - base) / tensor


@pytest.mark.frameworks("torch")
def test_a_zero_copy_load_reads_nothing(tmp_path):
    n, elems = 16, 4 << 20
    p = tmp_path / "m.safetensors"
    bb.save({f"t{i}": np.full(elems, i, ml_dtypes.bfloat16) for i in range(n)}, p)
    run = subprocess.run([sys.executable, "-c", _RSS, str(p), "torch"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    base, peak, _ = map(int, run.stdout.split()[-3:])
    assert peak - base < 0.05 * n * elems * 2  # under 5% of the file
