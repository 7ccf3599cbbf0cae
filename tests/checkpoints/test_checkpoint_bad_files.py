"""Bad checkpoint files and paths refused with our errors: every damaged header or entry a
CheckpointError naming the file and the key (an entry's own faults on its first read, and by the
loaders before any tensor is read), a missing file, a path that is no regular file (a directory, a
device, a named pipe not waited on), a path naming no file or no path at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors

import bf16bridge as bb
from bf16bridge.checkpoints import format as fmt
from bf16bridge.errors import CheckpointError, InvalidArgumentError
from checkpoint_cases import DECODINGS, _file, _t, decoding


GOOD = _file({"a": _t(), "b": _t("I16", (2,), (8, 12))}, bytes(12))


BAD = {
    "empty file": (b"", "fewer than the 8", None),
    "truncated prefix": (GOOD[:5], "fewer than the 8", None),
    "truncated data": (GOOD[:-1], "runs past the end", "b"),
    "bytes left over": (GOOD + b"\0", "bytes left over", "b"),
    "header past the end": (_file({"a": _t()}, bytes(8), length=10_000), "runs past the end of the file", None),
    "huge header": (_file({}, length=fmt.MAX_HEADER + 1), "past the cap", None),
    "length near 2**64": (_file({}, length=2**64 - 1), "past the cap", None),
    "not utf-8": (_file(b'{"a\xff":1}'), "not UTF-8", None),
    "not json": (_file(b'{"a": '), "not JSON", None),
    "a list": (_file([1, 2]), "not an object", None),
    "deep nesting": (_file(b"[" * 100_000 + b"]" * 100_000), "nests too deep|not JSON", None),
    "duplicate key": (_file(b'{"a":' + json.dumps(_t()).encode() + b',"a":' + json.dumps(_t()).encode() + b"}",
                            bytes(8)), "twice", "a"),
    "unknown dtype": (_file({"a": _t("F7")}, bytes(8)), "unknown dtype 'F7'", "a"),
    "dtype not a string": (_file({"a": _t(4)}, bytes(8)), "unknown dtype 4", "a"),
    "negative shape": (_file({"a": _t(shape=(-2,))}, bytes(8)), "shape", "a"),
    "float shape": (_file({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, bytes(8)), "shape", "a"),
    "bool shape": (_file({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, bytes(4)), "shape", "a"),
    "shape not a list": (_file({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, bytes(8)), "shape", "a"),
    "shape x dtype != bytes": (_file({"a": _t(shape=(3,))}, bytes(8)), "needs 12 bytes", "a"),
    "offsets reversed": (_file({"a": _t(offsets=(8, 0))}, bytes(8)), "data_offsets", "a"),
    "offsets missing": (_file({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "data_offsets", "a"),
    "not starting at 0": (_file({"a": _t(offsets=(4, 12))}, bytes(12)), "start at offset 0", "a"),
    "hole": (_file({"a": _t(), "b": _t(offsets=(12, 20))}, bytes(20)), "hole", "b"),
    "overlap": (_file({"a": _t(), "b": _t(offsets=(4, 12))}, bytes(12)), "overlaps", "b"),
    "offsets out of range": (_file({"a": _t(shape=(4,), offsets=(0, 16))}, bytes(8)), "past the end", "a"),
    "entry not an object": (_file({"a": [1]}), "not an object", "a"),
    "metadata not strings": (_file({"__metadata__": {"k": 1}}), "__metadata__", "__metadata__"),
    "metadata a list": (_file({"__metadata__": ["k"]}), "__metadata__", "__metadata__"),
    "odd nibbles": (_file({"a": _t("F4", (3,), (0, 1))}, bytes(1)), "inside a byte", "a"),
}


#: the faults of one entry alone (its dtype, shape, size): bb.open checks them when the entry is first
#: asked for (info, get, raw, array, plan); every other fault refuses the file at open
ENTRY_FAULTS = frozenset({"unknown dtype", "dtype not a string", "negative shape", "float shape", "bool shape",
                          "shape not a list", "shape x dtype != bytes", "odd nibbles"})


def _read_every_key(p):
    with bb.open(p) as f:
        for k in f.keys():
            f.get(k)


@pytest.mark.parametrize("decoding_name", DECODINGS)
@pytest.mark.parametrize("name", list(BAD))
def test_bad_files_raise_checkpoint_error_naming_file_and_key(tmp_path, name, decoding_name):
    with decoding(decoding_name):  # with msgspec, and without it (json's path alone)
        _bad_file_refused(tmp_path, name)


def _bad_file_refused(tmp_path, name):
    blob, match, key = BAD[name]
    p = tmp_path / "bad.safetensors"
    p.write_bytes(blob)
    calls = [lambda: bb.load(p), lambda: bb.load_for_target(p, "numpy"), lambda: _read_every_key(p)]
    if name in ENTRY_FAULTS:  # open lists the key; each read of it raises what bb.load raises
        f = bb.open(p)
        assert key in f.keys()
        calls += [lambda: f.info(key), lambda: f.get(key), lambda: f.get(key, "torch"), lambda: f.raw(key),
                  lambda: f.array(key), lambda: f.plan(key, "jax")]
    else:
        calls.append(lambda: bb.open(p))
    for call in calls:
        with pytest.raises(CheckpointError, match=match) as err:
            call()
        assert str(p) in str(err.value)
        if key is not None:
            assert f"(key {key!r})" in str(err.value)
    if name in ENTRY_FAULTS:
        f.close()
    with pytest.raises(Exception):  # safetensors refuses each as well (or has no such check: duplicates)
        if name == "duplicate key":
            raise ValueError("safetensors keeps the last of duplicate keys; we refuse them")
        safetensors.deserialize(blob)


def test_a_bad_entry_is_refused_each_time_it_is_read_and_its_neighbours_read_bit_for_bit(tmp_path):
    # its dtype, shape and size are checked on first use: the file opens, the entry is refused
    # (twice: a failed check is not remembered as a pass), the tensors around it read as written
    a = np.arange(4, dtype=np.uint16).view(ml_dtypes.bfloat16)
    p = tmp_path / "one_bad.safetensors"
    p.write_bytes(_file({"a": _t("BF16", (4,), (0, 8)), "b": _t("F32", (3,), (8, 16)), "c": _t("I16", (2,), (16, 20))},
                        a.tobytes() + bytes(8) + np.array([7, -7], np.int16).tobytes()))
    with bb.open(p) as f:
        assert f.keys() == ["a", "b", "c"] and len(f) == 3 and "b" in f
        for _ in range(2):
            with pytest.raises(CheckpointError, match=r"its shape \[3\] of F32 needs 12 bytes; data_offsets give 8 "
                                                      r"\(key 'b'\)"):
                f.get("b")
        assert f.get("a").view(np.uint16).tolist() == [0, 1, 2, 3] and f.get("c").tolist() == [7, -7]
    with pytest.raises(CheckpointError, match="key 'b'"):
        bb.load(p)


@pytest.mark.parametrize("loader", ["load", "load copy=True", "load_for_target float32", "check"])
def test_a_bad_last_entry_refuses_the_file_before_any_tensor_is_read(tmp_path, monkeypatch, loader):
    """bb.open leaves an entry's own checks to its first use; the loaders (and check()) run them all
    first, so a bad entry at the end is refused before the tensors before it are read, copied or cast
    (a file of gigabytes refused in microseconds, not after minutes and twice its memory)."""
    from bf16bridge.checkpoints import read

    a = np.arange(4, dtype=np.uint16).view(ml_dtypes.bfloat16)
    p = tmp_path / "bad_last.safetensors"
    p.write_bytes(_file({"a": _t("BF16", (4,), (0, 8)), "b": _t("F32", (3,), (8, 16))}, a.tobytes() + bytes(8)))
    touched = []
    for name in ("_raw", "_read", "_view"):
        real = getattr(read.Checkpoint, name)
        monkeypatch.setattr(read.Checkpoint, name, lambda self, *args, _real=real, _name=name:
                            touched.append(_name) or _real(self, *args))
    calls = {"load": lambda: bb.load(p), "load copy=True": lambda: bb.load(p, copy=True),
             "load_for_target float32": lambda: bb.load_for_target(p, "numpy", dtype="float32"),
             "check": lambda: bb.open(p).check()}
    with pytest.raises(CheckpointError, match=r"needs 12 bytes; data_offsets give 8 \(key 'b'\)"):
        calls[loader]()
    assert touched == []
    with bb.open(p) as f:  # the good entry still reads, once asked for alone
        assert f.get("a").view(np.uint16).tolist() == [0, 1, 2, 3] and touched


def test_good_file_of_the_bad_table_loads(tmp_path):
    (tmp_path / "ok.safetensors").write_bytes(GOOD)
    assert {k: v.tolist() for k, v in bb.load(tmp_path / "ok.safetensors").items()} == {"a": [0, 0], "b": [0, 0]}


# -- bad paths -------------------------------------------------------------------------------

def test_a_missing_file_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot open"):
        bb.open(tmp_path / "nope.safetensors")


def test_a_path_that_is_no_regular_file_is_refused_naming_what_it_is(tmp_path):
    # a directory raised OSError's words only; /dev/null read as "0 bytes, damaged"
    fds = set(os.listdir("/proc/self/fd"))  # (Linux) the refused path's descriptor is closed again
    for path, kind in ((tmp_path, "a directory"), (os.devnull, "a character device")):
        with pytest.raises(CheckpointError, match=f"cannot open it \\(it is {kind}, not a regular file\\)"):
            bb.open(path)
    assert set(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_named_pipe_is_refused_not_waited_on(tmp_path):
    # its open blocked until a writer came: bb.load hung for ever (in a child, so a hang fails the test)
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    code = "import bf16bridge as bb, sys\ntry:\n    bb.load(sys.argv[1])\nexcept bb.CheckpointError as e:\n    print(e)"
    run = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cannot open it (it is a named pipe, not a regular file)" in run.stdout


@pytest.mark.parametrize("call", ["save", "open", "load", "load_for_target"])
@pytest.mark.parametrize("name, says", [("", "empty"), ("m\0.safetensors", "NUL")])
def test_a_path_naming_no_file_is_our_error(tmp_path, monkeypatch, name, says, call):
    monkeypatch.chdir(tmp_path)  # "" once wrote its temporary file into the working directory
    path = name if not name else str(tmp_path / name)
    run = {"save": lambda: bb.save({"a": np.zeros(1)}, path), "open": lambda: bb.open(path),
           "load": lambda: bb.load(path), "load_for_target": lambda: bb.load_for_target(path, to="numpy")}[call]
    with pytest.raises(InvalidArgumentError, match=f"no file's path.*{says}"):  # was a bare ValueError for NUL
        run()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("call, what", [(lambda p: bb.open(3), "bb.open"), (lambda p: bb.load(None), "bb.open"),
                                        (lambda p: bb.save({"w": np.ones(2)}, None), "bb.save"),
                                        (lambda p: bb.load_for_target(3.5), "bb.open")])
def test_a_path_that_is_no_path_is_our_invalid_argument_error(tmp_path, call, what):
    with pytest.raises(InvalidArgumentError, match=f"^{what}: the path must be a str or an os.PathLike"):
        call(tmp_path)
