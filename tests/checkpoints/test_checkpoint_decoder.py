"""msgspec, the checkpoints' optional header decoder: loaded with the checkpoints, never by
``import bf16bridge``; where it cannot be imported, json's path reads every header and refuses the
same files with the same errors; its decoders serve many threads at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np

import bf16bridge as bb
from bf16bridge.checkpoints import decoder
from checkpoint_cases import _file, _t


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_msgspec_is_loaded_with_the_checkpoints_not_with_bf16bridge():
    assert decoder.DECODERS is not None  # the test extra installs it: its path is the one tested
    out = _run("""
        import sys
        import bf16bridge as bb
        print("msgspec" in sys.modules)
        bb.open  # the checkpoints, loaded on first use
        print("msgspec" in sys.modules)
    """)
    assert out.split() == ["False", "True"]


def test_without_msgspec_json_reads_every_header_and_refuses_the_same_files(tmp_path):
    good, entry_fault, file_fault = (tmp_path / f"{n}.safetensors" for n in ("good", "entry", "file"))
    a = np.arange(6, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(2, 3)
    bb.save({"a": a, "b": np.arange(3, dtype=np.int16)}, good, metadata={"k": "v"})
    entry_fault.write_bytes(_file({"a": _t(shape=(3,))}, bytes(8)))
    file_fault.write_bytes(_file({"a": _t(), "b": _t(offsets=(4, 12))}, bytes(12)))
    out = _run(f"""
        import sys
        sys.modules["msgspec"] = None  # as where it is not installed: its import fails
        import numpy as np
        import bf16bridge as bb
        from bf16bridge.checkpoints import decoder
        from bf16bridge.errors import CheckpointError
        assert decoder.DECODERS is None and decoder.decode(b"{{}}") is None and decoder.metadata(b"{{}}") is None
        with bb.open({str(good)!r}) as f:
            print(f.keys(), dict(f.metadata), f.get("a").view(np.uint16).tolist(), f.get("b").tolist())
        for path in ({str(entry_fault)!r}, {str(file_fault)!r}):
            try:
                bb.load(path)
            except CheckpointError as err:
                print(str(err).replace(path, "PATH").split("; the file is")[0])
    """)
    assert out.splitlines() == [
        "['a', 'b'] {'k': 'v'} [[0, 1, 2], [3, 4, 5]] [0, 1, 2]",
        "PATH: its shape [3] of F32 needs 12 bytes; data_offsets give 8 (key 'a')",
        "PATH: its data_offsets overlaps the tensor before it (key 'b')"]


def test_many_threads_open_one_file_at_once(tmp_path):
    tensors = {f"h.{i}.w": np.full((4, 4), i, np.float32) for i in range(200)}
    p = tmp_path / "m.safetensors"
    bb.save(tensors, p, metadata={"format": "np"})
    barrier = threading.Barrier(8)
    found, errors = [], []

    def work():
        try:
            barrier.wait()
            for _ in range(20):
                with bb.open(p) as f:
                    found.append((f.keys() == list(tensors), dict(f.metadata) == {"format": "np"},
                                  all(f.get(k).tolist() == v.tolist() for k, v in tensors.items())))
        except Exception as err:  # noqa: BLE001 - said below, with the others
            errors.append(repr(err))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(found) == 160 and all(all(r) for r in found)
