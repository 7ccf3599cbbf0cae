"""Writing a checkpoint: streamed one tensor at a time into a temporary file, fsynced and
renamed into place, so an interrupted save never leaves a half-written file under the target name."""

from __future__ import annotations

import builtins
import os
import tempfile
from collections.abc import Mapping

import numpy as np

from bf16bridge.adapters.hooks import ShardHooks
from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge import kernels
from bf16bridge.core import registry
from bf16bridge.trees import walk as trees
from bf16bridge.core.memory import aligned_empty
from bf16bridge.core.convert import convert, plan
from bf16bridge.core.warn import warn
from bf16bridge.errors import (Bf16BridgeError, CheckpointError, InvalidArgumentError, UnsupportedDtypeError,
                      UnsupportedTypeError)
from bf16bridge.shards import convert_shards
from bf16bridge.checkpoints import format as fmt
from bf16bridge.checkpoints.keys import leaves


#: ndarray subclasses that hold nothing beyond their values (a memory-mapped file's array, numpy's
#: matrix, a record array's view of its fields): saved as their values. Any other subclass may hold
#: state of its own (a unit, as astropy's Quantity) that a file would lose; a masked array (its mask)
#: is the numpy adapter's to refuse, as every route does
_VALUES_ONLY = (np.ndarray, np.memmap, np.matrix, np.recarray, np.ma.MaskedArray)


def _way_out(dtype: np.dtype) -> str:
    """What to save instead of a numpy array of ``dtype`` that no safetensors code holds."""
    if dtype.names:
        return (f"a structured dtype has no code: save each field as its own key ({{'{dtype.names[0]}': "
                f"a['{dtype.names[0]}'], ...}})")
    if dtype.kind == "O":
        return "an object array has no code: make it an array of a numeric dtype (np.asarray(a, dtype=np.float32))"
    if dtype.kind in "mM":
        return (f"save a.view(np.int64) and its unit ({dtype}) in metadata={{...}}; the file keeps no unit, "
                "so np.datetime64/timedelta64 come back as int64")
    if dtype.kind in "USV":
        return "a checkpoint holds tensors: put strings in metadata={...}, or their bytes as a uint8 array"
    if dtype.kind == "f" and dtype.itemsize > 8:
        return "cast it to float64 (rounds: a.astype(np.float64))"
    if dtype.kind == "c":
        return "cast it to complex64 (rounds)"
    return "cast it to a dtype the format holds"


def _describe(key: str, x, sharded: set[str]) -> fmt.Entry:
    """The entry of ``x`` (its data unread); a tensor sharded over several devices is noted in
    ``sharded``: it is gathered when its turn comes (one copy)."""
    if isinstance(x, np.ndarray) and type(x) not in _VALUES_ONLY:
        t = type(x)
        raise UnsupportedTypeError(
            f"key {key!r}: {t.__module__}.{t.__qualname__} is a subclass of numpy.ndarray that may hold more than "
            "its values (a unit, a mask), which a file would lose; pass np.asarray(x) to save its values")
    try:
        if registry.framework_of(x) == registry.HUB:
            name = dtypes.name_of_numpy(x.dtype) if type(x) is np.ndarray else None
            if name is None:  # a subclass, a scalar, a dtype the bridge lacks: the numpy adapter's checks
                name = registry.get(registry.HUB).describe(x, alignment=False).dtype  # (a masked array refused)
            shape = np.shape(x)
        else:
            p = plan(x, registry.HUB)
            shape, name = p.result_shape or (), p.dtype_out  # a packing route changes the shape (torch's fp4 x2)
    except UnsupportedDtypeError as err:
        if registry.framework_of(x) == registry.HUB:
            raise UnsupportedDtypeError(f"key {key!r}: {err}; {_way_out(np.asarray(x).dtype)}") from err
        raise type(err)(f"key {key!r}: {err}") from err
    except UnsupportedTypeError as err:
        framework = registry.framework_of(x)
        try:
            pieces = registry.hooks(framework, ShardHooks).local_shards(x)
        except Bf16BridgeError:
            pieces = None  # (a deleted array: the error above says so)
        if pieces is None:  # not a sharded tensor (a jax array over several devices, a DTensor)
            raise type(err)(f"key {key!r}: {err}") from err
        sharded.add(key)
        # the global shape; held packed (torch's fp4 x2): written, as gathered, in values
        shape, name = dtypes.in_values(*registry.get(framework).shape_dtype(x))
    except Bf16BridgeError as err:
        raise type(err)(f"key {key!r}: {err}") from err
    code = fmt.NAMES.get(name)
    if code is None or code in fmt.UNPACKED:
        row = dtypes.ROWS.get(name)
        wider = next((w for w in row.widenings if fmt.NAMES.get(w) not in (None, *fmt.UNPACKED)), None) if row else None
        how = (f"widen it to {wider} first (exact: every {name} value is a {wider} value)" if wider else
               "cast it first (complex128 to complex64, rounding)")
        raise UnsupportedDtypeError(
            f"key {key!r}: {name} has no safetensors code that bf16bridge writes "
            f"(the format has: {', '.join(fmt.CODES)}; float6 is packed in files, in an order bf16bridge "
            f"does not write); {how}")
    n = 1
    for d in shape:
        n *= int(d)
    nbits = n * fmt.CODES[code][1]
    if nbits % 8:
        raise UnsupportedDtypeError(f"key {key!r}: {n} values of {name} end inside a byte, which the format "
                                    "cannot hold (F4 packs two a byte): pad it to an even count")
    return fmt.Entry(key, code, tuple(int(d) for d in shape), nbits // 8)


def _gather(key: str, x) -> np.ndarray:
    """A sharded tensor's values as one numpy array (a copy), from the shards this process holds;
    refused (naming the key) if they do not cover it: a file holds whole tensors."""
    try:
        # one shard per index (replica 0, the others compared with it), as a file holds one value per element
        got = convert_shards(x, registry.HUB, replicas="one", on_alias="allow", on_grad="drop")
        out = aligned_empty(got.shape, fmt.numpy_dtype(got.dtype))
    except Bf16BridgeError as err:
        disagreement = getattr(err, "disagreement", None)
        if disagreement is not None:  # the way out convert_shards names is its keywords, which save has not
            raise type(err)(f"key {key!r}: {disagreement}. bb.save writes one value per element: recompute the "
                            "array so that its replicas agree, or save the replica you want "
                            "(bb.convert_shards(x, 'numpy', replicas='all') numbers them)") from err
        unreadable = getattr(err, "unreadable", None)  # its way out, compare_replicas=False, save has not either
        if unreadable is not None:
            raise type(err)(f"key {key!r}: {unreadable}") from err
        raise type(err)(f"key {key!r}: {err}") from err
    seen: set[tuple] = set()
    covered = 0
    for shard in got.shards:  # the pieces of a sharding are equal or disjoint: one of each index
        where = tuple((s.start, s.stop) for s in shard.index)
        if where not in seen:
            seen.add(where)
            out[shard.index] = shard.tensor
            covered += shard.tensor.size
    if covered != out.size:
        raise UnsupportedTypeError(
            f"key {key!r}: a tensor sharded over several processes: this one holds {covered} of its {out.size} "
            "values, and a file holds whole tensors; gather it first (jax: multihost_utils.process_allgather; "
            "DTensor: x.full_tensor()), or save each process's shards (bb.convert_shards) under keys of their own")
    return out


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
    if not a.flags.c_contiguous:  # not np.ascontiguousarray: it makes a 0-d array 1-d (shape [] -> [1])
        a = a.copy(order="C")
    if fmt.NAMES.get(a.dtype.name) != entry.code or a.shape != entry.shape:
        raise CheckpointError(
            f"key {key!r}: the tensor changed while it was saved ({entry.code} {list(entry.shape)} planned, "
            f"{a.dtype.name} {list(a.shape)} read); save it again once nothing else writes to it")
    if entry.code in fmt.NIBBLES:  # two values a byte, element 2i in the low nibble (torch's x2 order)
        try:
            return kernels.pack_nibbles(a.reshape(-1))
        except Bf16BridgeError as err:  # a byte packing would change (a view of other bytes)
            raise type(err)(f"key {key!r}: {err}") from err
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


def _check_metadata(metadata) -> None:
    """Refuse ``metadata`` that is not a mapping of str -> str the header can hold (UTF-8)."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError(f"metadata must be a dict of str -> str; got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgumentError(
                f"metadata key {k!r}: keys and values must be strings (got {type(k).__name__} -> "
                f"{type(v).__name__}); write numbers as str(...) or json.dumps(...)")
        for what, text in (("key", k), ("value", v)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise InvalidArgumentError(f"metadata key {k!r}: its {what} cannot be written as UTF-8 "
                                           f"({err.reason}); the header is UTF-8 JSON") from None


def _warn_empty(path: str, empty: list) -> None:
    """Warn that the tree's empty containers are not written (a file holds only tensors under keys)."""
    n = len(empty)
    warn(f"bb.save writes {path} without {n} empty container{'' if n == 1 else 's'} of the tree "
         f"({', '.join(map(trees.where, empty[:3]))}{f' and {n - 3} more' if n > 3 else ''}): a file holds "
         "tensors under keys, and an empty container (or a pytree's None) has none, so bb.load does not "
         "give it back; "
         "rebuild it after loading, or leave it out of what you save")


def _write_replacing(path: str, directory: str, head: bytes, entries: list, tensors: dict, sharded: set) -> None:
    """Write the file into a temporary one beside ``path``, fsync it and rename it over ``path``;
    on any failure the temporary file is removed and ``path`` is left as it was."""
    # the temporary name stays within a directory entry's 255 bytes whatever the target's length
    stem = os.path.basename(path).encode("utf-8", "surrogateescape")[:100].decode("utf-8", "ignore")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{stem}.", suffix=".tmp")
    except OSError as err:
        raise CheckpointError(f"{path}: cannot write a file beside it ({err.strerror}); check that "
                              f"{directory} exists and is writable") from err
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with builtins.open(fd, "wb", closefd=True) as f:
            f.write(head)
            for e in entries:
                x = tensors[e.key]
                a = _numpy(e.key, _gather(e.key, x) if e.key in sharded else x, e)
                if a.size:
                    f.write(a.reshape(-1).view(np.uint8).data)
                del a  # one tensor's bytes alive at a time
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(err, OSError):  # a full disk, a directory in the way: ours, naming the file
            raise CheckpointError(f"{path}: cannot write it ({err.strerror or err}); {path} is left as "
                                  "it was") from err
        raise


@plain_python
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
    path = fmt.fspath(path, "bb.save")
    _check_metadata(metadata)
    pairs, empty = leaves(tree)
    sharded: set[str] = set()
    entries = fmt.order([_describe(k, x, sharded) for k, x in pairs])
    head = fmt.header_bytes(entries, metadata)
    if len(head) - fmt.PREFIX > fmt.MAX_HEADER:  # every reader (ours, safetensors') refuses such a file
        raise InvalidArgumentError(
            f"{path}: the header would be {len(head) - fmt.PREFIX} bytes, past the format's cap of "
            f"{fmt.MAX_HEADER} that readers refuse; shorten the metadata or the keys, or save fewer tensors a file")
    if empty:  # said before anything is written: a warnings filter of "error" leaves the target as it was
        _warn_empty(path, empty)
    directory = os.path.dirname(os.path.abspath(path))
    _write_replacing(path, directory, head, entries, dict(pairs), sharded)
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
