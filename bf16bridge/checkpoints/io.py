"""Reading and writing safetensors files: private memory maps, streamed atomic writes.

Reading maps the file once, privately (``mmap.ACCESS_COPY``): numpy and torch results are
views of the map, so nothing is read until touched, and a write into a result changes this
process's copy of that page, never the file. Writing streams one tensor at a time into a
temporary file beside the target, then fsyncs and renames it into place.
"""

from __future__ import annotations

import builtins
import dataclasses
import mmap
import os
import tempfile
import types
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import kernels, registry, trees
from ..adapters.numpy import aligned_empty
from ..convert import Fallback, convert, plan
from ..errors import Bf16BridgeError, CheckpointError, InvalidArgumentError, UnsupportedDtypeError
from . import format as fmt

#: a key's parts are joined with this (and ``nested=True`` splits on it)
SEP = "."


# -- keys --------------------------------------------------------------------------------------


def _key(path: tuple) -> str:
    parts = []
    for p in path:
        if isinstance(p, bool) or not isinstance(p, (str, int)):
            raise InvalidArgumentError(
                f"at {trees.where(path)}: a checkpoint key is made of strings and list positions; "
                f"{p!r} ({type(p).__name__}) is neither: use string keys")
        parts.append(str(p))
    return SEP.join(parts)


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _refuse_values(node, path: tuple) -> None:
    """Refuse what the walk kept as it was (numbers, strings, None): a file holds tensors only."""
    if node is trees.SLOT:
        return
    if isinstance(node, Mapping):
        for k, v in node.items():
            _refuse_values(v, path + (k,))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _refuse_values(v, path + (i,))
    elif isinstance(node, _PLAIN):
        raise InvalidArgumentError(
            f"at {trees.where(path)}: {type(node).__name__} {node!r:.40} is not a tensor; a checkpoint holds "
            "tensors only: put strings in metadata={...}, make numbers arrays, or leave them out")


def leaves(tree) -> list[tuple[str, Any]]:
    """``(key, tensor)`` for every tensor of ``tree``, keys joined with "."; colliding keys refused."""
    found: list[tuple[tuple, Any]] = []

    def take(x, path):
        found.append((path, x))
        return trees.SLOT

    skeleton = trees.map_leaves(take, tree, unwrap_values=True)
    _refuse_values(skeleton, ())
    if found and found[0][0] == () and len(found) == 1 and skeleton is trees.SLOT:
        raise InvalidArgumentError("a bare tensor has no key: pass a dict, {'weight': x}")
    out: dict[str, tuple] = {}
    for path, x in found:
        key = _key(path)
        if key in out:
            raise InvalidArgumentError(
                f"key {key!r}: {trees.where(out[key][0])} and {trees.where(path)} both flatten to it; "
                "rename one (keys join their parts with '.')")
        if key == fmt.METADATA_KEY:
            raise InvalidArgumentError(f"key {key!r} is the format's own (it holds the metadata): rename it")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidArgumentError(f"key {key!r} cannot be written as UTF-8 ({err.reason})") from None
        out[key] = (path, x)
    return [(k, x) for k, (_, x) in out.items()]


# -- writing -----------------------------------------------------------------------------------


def _describe(key: str, x) -> fmt.Entry:
    if registry.framework_of(x) == registry.HUB:
        shape, name = np.shape(x), np.asarray(x).dtype.name
    else:
        try:
            p = plan(x, registry.HUB)
        except Bf16BridgeError as err:
            raise type(err)(f"key {key!r}: {err}") from err
        shape, name = p.shape, p.dtype_out
    code = fmt.NAMES.get(name)
    if code is None or code in fmt.UNPACKED:
        raise UnsupportedDtypeError(
            f"key {key!r}: {name} has no safetensors code that bf16bridge writes "
            f"(the format has: {', '.join(fmt.CODES)}); cast it first (complex128 to complex64; "
            "float6 is packed in files, in an order bf16bridge does not write)")
    n = 1
    for d in shape:
        n *= int(d)
    nbits = n * fmt.CODES[code][1]
    if nbits % 8:
        raise UnsupportedDtypeError(f"key {key!r}: {n} values of {name} end inside a byte, which the format "
                                    "cannot hold (F4 packs two a byte): pad it to an even count")
    return fmt.Entry(key, code, tuple(int(d) for d in shape), nbits // 8)


def _numpy(key: str, x, entry: fmt.Entry) -> np.ndarray:
    """The tensor's bits as a C-contiguous little-endian numpy array (a view where it can be)."""
    try:
        if registry.framework_of(x) == registry.HUB:
            a = np.asarray(x)
        else:
            a = convert(x, registry.HUB, on_alias="allow", on_grad="drop")
    except Bf16BridgeError as err:
        raise type(err)(f"key {key!r}: {err}") from err
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    a = np.ascontiguousarray(a)
    if fmt.NAMES.get(a.dtype.name) != entry.code or a.shape != entry.shape:
        raise CheckpointError(
            f"key {key!r}: the tensor changed while it was saved ({entry.code} {list(entry.shape)} planned, "
            f"{a.dtype.name} {list(a.shape)} read); save it again once nothing else writes to it")
    if entry.code in fmt.NIBBLES:  # two values a byte, element 2i in the low nibble (torch's x2 order)
        return kernels.pack_nibbles(a.reshape(-1))
    return a


def _umask() -> int:
    try:
        with builtins.open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def save(tree, path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tree``'s tensors (any framework's, nested) to a safetensors file at ``path``.

    Keys are the leaves' paths joined with "." (``{"h": [{"w": x}]}`` -> ``"h.0.w"``); two leaves
    whose keys collide, a leaf that is not a tensor, and ``metadata`` that is not str -> str are
    refused (InvalidArgumentError, naming the key). Tensors are written one at a time, each moved
    to numpy by ``convert`` (zero-copy where the route allows) and written from its buffer, into a
    temporary file in the same directory that is fsynced and renamed over ``path``: an
    interrupted save leaves ``path`` as it was. The header is padded so that the data begins on
    a 64-byte boundary, and tensors whose size is a multiple of 64 bytes come first (each of
    them then begins aligned, which lets jax and tensorflow load it without a copy).
    """
    path = os.fspath(path)
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise InvalidArgumentError(f"metadata must be a dict of str -> str; got {type(metadata).__name__}")
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgumentError(
                    f"metadata key {k!r}: keys and values must be strings (got {type(k).__name__} -> "
                    f"{type(v).__name__}); write numbers as str(...) or json.dumps(...)")
    pairs = leaves(tree)
    entries = fmt.order([_describe(k, x) for k, x in pairs])
    tensors = dict(pairs)
    head = fmt.header_bytes(entries, metadata)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with builtins.open(fd, "wb", closefd=True) as f:
            f.write(head)
            for e in entries:
                a = _numpy(e.key, tensors[e.key], e)
                if a.size:
                    f.write(a.reshape(-1).view(np.uint8).data)
                del a  # one tensor's bytes alive at a time
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:  # the rename itself survives a crash only once the directory is synced
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# -- reading -----------------------------------------------------------------------------------


class Checkpoint:
    """An open safetensors file: ``bb.open(path)``'s answer, best used in a ``with`` block.

    Opening reads and checks the header, maps the file privately and closes the file object
    (the map keeps its own descriptor until it is unmapped). ``keys()``, ``metadata``,
    ``info(key)`` read no tensor data; ``get(key, to=...)`` makes one tensor. Results of numpy and
    torch (and of jax and tensorflow where the bytes are 64-byte aligned) are views of the map:
    they keep it alive after ``close()``, which only drops this object's hold on it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            f = builtins.open(self.path, "rb")
        except OSError as err:
            raise CheckpointError(f"{self.path}: cannot open it ({err.strerror})") from err
        with f:
            size = os.fstat(f.fileno()).st_size
            self.header = fmt.read(f, self.path, size)
            self._map: mmap.mmap | None = None
            if size > self.header.data_start:  # a file of no tensor data has nothing to map
                self._map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        self._infos = {t.key: t for t in self.header.tensors}
        #: keys handed out as views: their pages are never dropped (see _release)
        self._shared: set[str] = set()
        self.closed = False

    # the mapping of keys, read from the header only
    @property
    def metadata(self) -> Mapping[str, str]:
        """The file's ``__metadata__`` (read-only)."""
        return self.header.metadata

    def keys(self) -> list[str]:
        """The tensors' keys, in file order."""
        return list(self._infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, key: object) -> bool:
        return key in self._infos

    def info(self, key: str) -> fmt.TensorInfo:
        """Key, dtype, shape, nbytes, file offset and alignment of one tensor (reads no data)."""
        try:
            return self._infos[key]
        except KeyError:
            raise KeyError(f"{self.path} has no tensor {key!r} ({len(self._infos)} keys; "
                           "keys() lists them)") from None

    def array(self, key: str) -> np.ndarray:
        """The tensor as a numpy view of the private map (nothing read until touched)."""
        t = self.info(key)
        if self.closed:
            raise CheckpointError(f"{self.path}: closed; open it again to read {key!r}")
        if t.code in fmt.UNPACKED:
            raise UnsupportedDtypeError(
                f"{self.path}: key {key!r} is {t.code}, four values in three bytes, in an order bf16bridge "
                "does not unpack; raw(key) gives its bytes")
        try:
            dtype = fmt.numpy_dtype(t.dtype)
        except UnsupportedDtypeError as err:
            raise UnsupportedDtypeError(f"{self.path}: key {key!r}: {err}") from err
        if t.nbytes == 0 or self._map is None:
            return np.zeros(t.shape, dtype)
        if t.code in fmt.NIBBLES:  # ml_dtypes holds one value a byte: unpacked, one aligned copy
            out = aligned_empty(t.nbytes * 2, dtype)
            return kernels.unpack_nibbles(self.raw(key), t.dtype, out=out).reshape(t.shape)
        return np.frombuffer(self._map, dtype, t.nbytes // dtype.itemsize, t.offset).reshape(t.shape)

    def raw(self, key: str) -> np.ndarray:
        """The tensor's bytes as a uint8 view of the private map (any dtype, packed ones too)."""
        t = self.info(key)
        if self.closed:
            raise CheckpointError(f"{self.path}: closed; open it again to read {key!r}")
        if t.nbytes == 0 or self._map is None:
            return np.zeros(0, np.uint8)
        return np.frombuffer(self._map, np.uint8, t.nbytes, t.offset)

    def plan(self, key: str, to: str = "numpy", *, copy: bool | None = None, fallback: Fallback = "error"):
        """What ``get(key, to, ...)`` will do, as ``bb.plan`` says it (route, copies and why). Reads no
        data; for a packed (F4) tensor, the plan of its unpacked copy, with a note that says so."""
        t = self.info(key)
        if t.code not in fmt.NIBBLES:
            return plan(self.array(key), to, copy=copy, fallback=fallback)
        p = plan(aligned_empty(t.shape, fmt.numpy_dtype(t.dtype)), to, copy=copy, fallback=fallback)
        return dataclasses.replace(p, copies=True, shares_memory=False, notes=p.notes + (
            f"the file packs {t.code} two values a byte; ml_dtypes holds one: unpacked first (one copy)",))

    def get(self, key: str, to: str = "numpy", *, copy: bool | None = None, fallback: Fallback = "error"):
        """One tensor in framework ``to``: a view of the map where the route allows (numpy, torch;
        jax and tensorflow when 64-byte aligned), else one copy (``plan(key, to)`` says why).
        ``copy=True`` detaches it from the file; ``copy=False`` refuses to copy. Two ``get`` of the
        same key share memory where both are views: a write into one shows in the other.
        ``fallback`` is ``convert``'s, for a target that cannot hold the dtype (jax's int64 without
        x64: "auto" narrows when every value fits)."""
        a = self.array(key)
        try:
            if registry.resolve(to) == registry.HUB and copy in (None, True, False):
                # the map's own array: every dtype ml_dtypes holds (fp8 too), nothing to route
                out = a.copy() if copy else a
            else:
                out = convert(a, to, copy=copy, fallback=fallback, on_alias="allow")
        except Bf16BridgeError as err:
            raise type(err)(f"{self.path}: key {key!r}: {err}") from err
        if self._map is not None and a.size:
            if not self._infos[key].packed and _shares(a, out, to):
                self._shared.add(key)
            else:
                del a
                self._release(key)
        return out

    def _release(self, key: str) -> None:
        """Drop the pages of a tensor that was copied out (its private pages are no longer
        needed: a later touch reads the file again), so a copying load holds about one tensor
        of the file at a time. Only whole pages inside the tensor, never one shared with a
        neighbour, and never a key handed out as a view (its writes live in those pages)."""
        advise = getattr(mmap, "MADV_DONTNEED", None)
        if advise is None or self._map is None or key in self._shared:
            return
        t = self._infos[key]
        start = -(-t.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = (t.offset + t.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if stop > start:
            self._map.madvise(advise, start, stop - start)

    def close(self) -> None:
        """Drop this object's hold on the map; results that are views keep it alive."""
        self.closed = True
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # views are alive: they hold the map; it is unmapped when the last one goes
            self._map = None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<bf16bridge Checkpoint {self.path!r}, {len(self)} tensors, {state}>"


def _shares(a: np.ndarray, out, to: str) -> bool:
    adapter = registry.get(registry.resolve(to))
    try:
        return adapter.data_ptr(out) == a.ctypes.data
    except Exception:  # noqa: BLE001 - a framework that cannot say: keep the pages, to be safe
        return True


def open(path: str | os.PathLike) -> Checkpoint:  # noqa: A001 - bb.open, as the issue asks
    """Open a safetensors file lazily: ``with bb.open(path) as f: f.get(key, to="torch")``."""
    return Checkpoint(path)


def nest(flat: Mapping[str, Any], path: str) -> dict:
    """``{"a.b": x}`` -> ``{"a": {"b": x}}``; a key that is also another's prefix is refused."""
    out: dict = {}
    for key, value in flat.items():
        parts = key.split(SEP)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CheckpointError(f"{path}: key {key!r} nests under {SEP.join(parts[:i + 1])!r}, which is a "
                                      "tensor; load with nested=False")
            node = child
        if parts[-1] in node:
            raise CheckpointError(f"{path}: key {key!r} is a tensor and a prefix of other keys; "
                                  "load with nested=False")
        node[parts[-1]] = value
    return out


def load(path: str | os.PathLike, to: str = "numpy", *, nested: bool = False, copy: bool | None = None,
         fallback: Fallback = "error") -> dict:
    """Every tensor of a safetensors file, in framework ``to``, as ``{key: tensor}`` in file order
    (``nested=True``: split on "." into nested dicts). Views of a private memory map where the
    route allows, one copy a tensor otherwise; ``copy`` and ``fallback`` as ``Checkpoint.get``."""
    if nested not in (True, False):
        raise InvalidArgumentError(f"nested must be True or False; got {nested!r}")
    with Checkpoint(path) as f:
        out = {key: f.get(key, to, copy=copy, fallback=fallback) for key in f.keys()}
    return nest(out, os.fspath(path)) if nested else out


