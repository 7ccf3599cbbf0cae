"""Reading a checkpoint: the file mapped once, privately (``mmap.ACCESS_COPY``).

numpy and torch results are views of the map, so nothing is read until touched, and a write into
a result changes this process's copy of that page, never the file; jax and tensorflow get views of
64-byte aligned tensors, and the others read from the file into 64-byte aligned arrays of their own.
"""

from __future__ import annotations

import dataclasses
import io
import math
import mmap
import os
import stat
from collections.abc import Iterator, Mapping

import numpy as np

from bf16bridge.core.autograph import plain_python
from bf16bridge import kernels
from bf16bridge.core import registry
from bf16bridge.core.memory import aligned_empty
from bf16bridge.core.convert import Device, Fallback, convert, find_device, plan, run_plan
from bf16bridge.errors import (Bf16BridgeError, CheckpointError, CopyRequiredError, InvalidArgumentError, MissingKeyError,
                      UnsupportedDtypeError)
from bf16bridge.core.plan import Plan, Step
from bf16bridge.checkpoints import format as fmt
from bf16bridge.checkpoints.keys import nest


#: from this many bytes on, a tensor read from the file goes into memory mapped for it with MAP_POPULATE
#: (every page made in one call), not numpy's memory, whose huge-page faults can stall; below, glibc reuses pages
POPULATE_FROM = 1 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux


class Checkpoint:
    """An open safetensors file: ``bb.open(path)``'s answer, best used in a ``with`` block.

    Opening reads and checks the header and maps the file privately; the file stays open for
    reads until ``close()``. ``keys()``, ``metadata``, ``info(key)`` and ``plan(key, to)`` read no
    tensor data; ``get(key, to=...)`` makes one tensor. Results of numpy and torch (and of jax and
    tensorflow where the bytes are 64-byte aligned) are views of the map: they keep it (and the
    descriptor it holds) alive after ``close()``, which closes the file and drops this object's hold.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = fmt.fspath(path, "bb.open")
        # without blocking: a named pipe's open waits for a writer (bb.load hung for ever on one);
        # binary where the platform has a text mode
        nonblocking = getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, os.O_RDONLY | nonblocking | getattr(os, "O_BINARY", 0))
        except OSError as err:
            raise CheckpointError(f"{self.path}: cannot open it ({err.strerror})") from err
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a pipe or a device has no size to check a header against
                raise CheckpointError(f"{self.path}: cannot open it (it is {_kind(st.st_mode)}, not a regular "
                                      "file); bb.open maps a safetensors file: save or copy it to a file first")
            if nonblocking:
                os.set_blocking(fd, True)
            f = io.FileIO(fd, "r")  # unbuffered: the header is read once, in two reads (no buffer to fill)
        except BaseException:
            os.close(fd)
            raise
        try:
            size = st.st_size
            self.header = fmt.read(f, self.path, size)
            self._map: mmap.mmap | None = None
            if size > self.header.data_start:  # a file of no tensor data has nothing to map
                try:
                    self._map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
                except OSError as err:
                    raise CheckpointError(f"{self.path}: cannot map it ({err.strerror}); "
                                          "bb.load(path, copy=True) needs the map too: free memory") from err
        except BaseException:
            f.close()
            raise
        #: kept open until close(): a copy is read with os.preadv, not through the map (no page faults,
        #: and no page of the map held for it)
        self._file = f
        #: the keys in file order; their TensorInfo is built on first use (header.info)
        self._keys = self.header.keys
        self._entries = self.header.entries
        #: keys handed out as views: their pages are never dropped (see _release)
        self._shared: set[str] = set()
        #: (code, empty, offset % 64, to, copy, type(copy), fallback) -> (whether get() reads rather than views,
        #: whether the route copies)
        self._reads: dict[tuple, tuple[bool, bool]] = {}
        self.closed = False

    # the mapping of keys, read from the header only
    @property
    def metadata(self) -> Mapping[str, str]:
        """The file's ``__metadata__`` (read-only)."""
        return self.header.metadata

    def keys(self) -> list[str]:
        """The tensors' keys, in file order."""
        return list(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def check(self) -> None:
        """Every entry's own checks (dtype, shape, size) now, which ``bb.open`` leaves to each entry's
        first use: CheckpointError naming the first bad key. ``bb.load`` and ``load_for_target`` call it
        before reading any data; call it to validate a whole file (a download) without loading it."""
        for key in self._keys:
            self.info(key)

    def info(self, key: str) -> fmt.TensorInfo:
        """Key, dtype, shape, nbytes, file offset and alignment of one tensor (reads no data)."""
        if not isinstance(key, str):  # (a list raised TypeError: unhashable)
            raise InvalidArgumentError(f"a checkpoint's keys are strings; got {key!r} ({len(self._keys)} keys; "
                                       "keys() lists them)")
        try:
            return self._entries[key]
        except KeyError:
            raise MissingKeyError(f"{self.path} has no tensor {key!r} ({len(self._keys)} keys; "
                                  "keys() lists them)") from None

    def array(self, key: str) -> np.ndarray:
        """The tensor as a numpy view of the private map (nothing read until touched). A write into
        it stays in this process's pages of the map: later ``get`` of the key see it."""
        a = self._view(key)
        self._shared.add(key)  # handed out writable: its pages are never dropped (see _release)
        return a

    def _view(self, key: str) -> np.ndarray:
        """``array(key)`` without recording the key as handed out (for the routes and reads here)."""
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
            return kernels.unpack_nibbles(self._raw(key), t.dtype, out=out).reshape(t.shape)
        return np.frombuffer(self._map, dtype, t.nbytes // dtype.itemsize, t.offset).reshape(t.shape)

    def raw(self, key: str) -> np.ndarray:
        """The tensor's bytes as a uint8 view of the private map (any dtype, packed ones too); a
        write into it stays in this process's pages, as ``array``'s."""
        a = self._raw(key)
        self._shared.add(key)
        return a

    def _raw(self, key: str) -> np.ndarray:
        t = self.info(key)
        if self.closed:
            raise CheckpointError(f"{self.path}: closed; open it again to read {key!r}")
        if t.nbytes == 0 or self._map is None:
            return np.zeros(0, np.uint8)
        return np.frombuffer(self._map, np.uint8, t.nbytes, t.offset)

    def plan(self, key: str, to: str = "numpy", *, copy: bool | None = None, fallback: Fallback = "error",
             device: Device = None):
        """What ``get(key, to, ...)`` will do, as a ``bb.plan`` (route, copies and why). Reads no data."""
        return self._route(key, self.info(key), to, copy, fallback, device)[0]

    def _route(self, key: str, t: fmt.TensorInfo, to: str, copy, fallback, device=None):
        """(the plan, a placeholder of the array get() reads the tensor into, or None for the map's view)."""
        if t.code in fmt.NIBBLES:
            if copy is False:
                raise CopyRequiredError(f"{self.path}: key {key!r}: copy=False, but the file packs {t.code} two "
                                        "values a byte and reading it unpacks it (a copy); pass copy=None")
            try:
                a = self._placeholder(t)
            except UnsupportedDtypeError as err:
                raise UnsupportedDtypeError(f"{self.path}: key {key!r}: {err}") from err
        else:
            a = self._view(key)
        try:
            p = plan(a, to, copy=copy, fallback=fallback, device=device)
        except Bf16BridgeError as err:
            raise type(err)(f"{self.path}: key {key!r}: {err}") from err
        if t.code in fmt.NIBBLES:  # read and unpacked into the placeholder: the route takes it from there
            step = Step("copy", registry.HUB, "read and unpack (kernels.unpack_nibbles) into a 64-byte aligned "
                        "array", t.dtype, True, f"the file packs {t.code} two values a byte; ml_dtypes holds one")
            return _prefixed(p, step), a
        if not a.size or copy is False or not (p.copies or copy) or _moves(p):
            # (a move to another device copies from the map's view: reading the file first would add a copy)
            return p, None
        buf = self._placeholder(t)
        q = plan(buf, to, copy=None, fallback=fallback, device=device)
        if q.copies:  # the route copies even an aligned array of our own: let it copy from the map
            return p, None
        why = "; ".join(s.reason for s in p.steps if s.copies) or "copy=True"
        step = Step("copy", registry.HUB, "os.preadv from the file into a 64-byte aligned array", t.dtype, True, why)
        return _prefixed(q, step), buf

    def _placeholder(self, t: fmt.TensorInfo) -> np.ndarray:
        """An array of the tensor's shape and dtype to plan with (its memory is never touched)."""
        return aligned_empty(t.shape, fmt.numpy_dtype(t.dtype))

    def _buffer(self, t: fmt.TensorInfo) -> np.ndarray:
        """An array of its own, 64-byte aligned, to read the tensor into: from POPULATE_FROM bytes on
        (where the platform has MAP_POPULATE), memory mapped for it with every page made at once."""
        dtype = fmt.numpy_dtype(t.dtype)
        n = math.prod(t.shape) * dtype.itemsize
        if n < POPULATE_FROM or not _POPULATE:
            return aligned_empty(t.shape, dtype)
        try:
            pages = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        except OSError:  # memory refused (a limit): numpy's memory, whose MemoryError names the size
            return aligned_empty(t.shape, dtype)
        return np.frombuffer(pages, dtype).reshape(t.shape)  # the array holds the map; unmapped with it

    def _read(self, t: fmt.TensorInfo, buf: np.ndarray) -> np.ndarray:
        """The tensor's bytes read into ``buf`` (unpacked first if packed)."""
        if t.code in fmt.NIBBLES:
            return kernels.unpack_nibbles(self._raw(t.key), t.dtype, out=buf.reshape(-1)).reshape(t.shape)
        if t.key in self._shared:  # handed out as a view: this process may have written into its pages,
            np.copyto(buf, self._view(t.key))  # which the file does not hold
            return buf
        view = buf.reshape(-1).view(np.uint8).data
        done = 0
        while done < t.nbytes:
            if not hasattr(os, "preadv"):  # pragma: no cover - not on Linux or macOS: through the map
                view[done:] = self._raw(t.key).data[done:]
                break
            n = os.preadv(self._file.fileno(), [view[done:]], t.offset + done)
            if n <= 0:
                raise CheckpointError(f"{self.path}: key {t.key!r}: the file ended {t.nbytes - done} bytes early "
                                      "while it was read (was it changed after it was opened?)")
            done += n
        return buf

    def get(self, key: str, to: str = "numpy", *, copy: bool | None = None, fallback: Fallback = "error",
            device: Device = None):
        """One tensor in framework ``to``: a view of the map where the route allows (numpy, torch;
        jax and tensorflow when 64-byte aligned), else the tensor read from the file into a 64-byte
        aligned array of its own that the route then takes without a copy (``plan(key, to)`` says
        which, and why). ``copy=True`` reads every tensor so (the result holds nothing of the file);
        ``copy=False`` refuses to copy. Two ``get`` of the same key share memory where both are views:
        a write into one shows in the other. ``fallback`` is ``convert``'s, for a target that cannot
        hold the dtype (jax's int64 without x64: "auto" narrows when every value fits). ``device``:
        the result lands there (``convert``'s ``device=``: one copy from the map to that device,
        which ``plan(key, to, device=...)`` shows; a device ``to`` does not have is our DeviceError)."""
        t = self.info(key)
        if self.closed:
            raise CheckpointError(f"{self.path}: closed; open it again to read {key!r}")
        if device is not None:  # a device `to` does not have is the call's fault, said before anything is read
            find_device(registry.resolve(to), device)
        # whether to read depends on what the route does: the dtype, the address modulo 64, emptiness
        # and the keywords (copy's type too: 0 is refused, not a decided False); planned once per file
        decided = (t.code, t.nbytes == 0, t.offset % fmt.ALIGN, to, copy, type(copy), fallback, device)
        known = self._reads.get(decided)
        if known is None and not copy and t.code not in fmt.NIBBLES and registry.resolve(to) == registry.HUB:
            # numpy takes the map's own array as it is (what plan(key, "numpy") says): not planned, but
            # the keywords are checked as the plan checks them (copy=True is planned: it checks the size)
            from bf16bridge.core import planner as routes

            try:
                routes.check_args(copy, fallback, False)
            except Bf16BridgeError as err:
                raise type(err)(f"{self.path}: key {key!r}: {err}") from err
            known = self._reads[decided] = (False, False)  # (the view below refuses F6 and dtypes not held)
        planned = None  # a plan to run as it is: the map's view, on a route that warns of nothing
        if known is None:
            p, placeholder = self._route(key, t, to, copy, fallback, device)
            read, copies = self._reads[decided] = (placeholder is not None, p.copies)
            if placeholder is None and p.alias is None and not p.drops_grad:
                planned = p
            del placeholder
        else:
            read, copies = known
        buf = self._buffer(t) if read else None
        a = self._read(t, buf) if buf is not None else self._view(key)
        try:
            if registry.resolve(to) == registry.HUB and copy in (None, True, False):
                # the map's own array or ours: every dtype ml_dtypes holds (fp8 too), nothing to route
                out = a.copy() if copy and buf is None else a
            elif planned is not None:
                out = run_plan(planned, a, copy)
            else:
                out = convert(a, to, copy=None if buf is not None else copy, fallback=fallback, on_alias="allow",
                              device=device)
        except Bf16BridgeError as err:
            raise type(err)(f"{self.path}: key {key!r}: {err}") from err
        if buf is None and self._map is not None and a.size:
            if out is a or _shares(a, out, to, copies):
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
        t = self.header.info(key)
        start = -(-t.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = (t.offset + t.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if stop > start:
            self._map.madvise(advise, start, stop - start)

    def close(self) -> None:
        """Close the file and drop this object's hold on the map; results that are views keep the map
        (and the descriptor it holds) alive."""
        self.closed = True
        self._file.close()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # views are alive: they hold the map; it is unmapped when the last one goes
            self._map = None

    def __del__(self) -> None:
        # dropped without close(): its file is closed when it is collected (at once, in CPython);
        # cheaper than weakref.finalize on a process's first open
        f = self.__dict__.get("_file")
        if f is not None:
            f.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<bf16bridge Checkpoint {self.path!r}, {len(self)} tensors, {state}>"


def _prefixed(p: Plan, step: Step) -> Plan:
    """``p`` with a first step that reads the tensor into an array of its own."""
    return dataclasses.replace(p, steps=(step, *p.steps), copies=True, shares_memory=False, notes=(
        "read from the file into its own 64-byte aligned array, which only the result holds",))


def _moves(p: Plan) -> bool:
    """Whether plan ``p`` ends by moving its result to another device (``device=``)."""
    return bool(p.steps) and p.steps[-1].kind == "place"


def _shares(a: np.ndarray, out, to: str, copies: bool) -> bool:
    adapter = registry.get(registry.resolve(to))
    try:
        return adapter.data_ptr(out) == a.ctypes.data
    except Exception:  # noqa: BLE001 - a framework that cannot give a pointer (tensorflow's fp8):
        return not copies  # the plan says whether the route copied


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "no regular file"


@plain_python
def open(path: str | os.PathLike) -> Checkpoint:  # noqa: A001 - bb.open, as the issue asks
    """Open a safetensors file lazily: ``with bb.open(path) as f: f.get(key, to="torch")``."""
    return Checkpoint(path)


@plain_python
def load(path: str | os.PathLike, to: str = "numpy", *, nested: bool = False, copy: bool | None = None,
         fallback: Fallback = "error", device: Device = None) -> dict:
    """Every tensor of a safetensors file, in framework ``to``, as ``{key: tensor}`` in file order
    (``nested=True``: split on "." into nested dicts). Views of a private memory map where the
    route allows, one copy a tensor otherwise; ``copy``, ``fallback`` and ``device`` as ``Checkpoint.get``."""
    if nested not in (True, False):
        raise InvalidArgumentError(f"nested must be True or False; got {nested!r}")
    # an unknown target or device is said once, not blamed on the first key
    find_device(registry.resolve(to), device)
    with Checkpoint(path) as f:
        f.check()  # a bad entry refuses the file before any tensor is read (not after the ones before it)
        out = {key: f.get(key, to, copy=copy, fallback=fallback, device=device) for key in f.keys()}
    return nest(out, os.fspath(path)) if nested else out


def copied_view(f: Checkpoint, key: str) -> np.ndarray:
    """A view of ``key``'s bytes for a reader in this package that copies it out (load_for_target's
    cast): not recorded as handed out; ``release`` drops its pages once the copy is made."""
    return f._view(key)


def release(f: Checkpoint, key: str) -> None:
    """Drop the pages of ``key`` once ``copied_view``'s copy is made."""
    f._release(key)


def handed_out(f: Checkpoint, key: str) -> bool:
    """Whether ``get`` handed ``key`` out as a view of the file."""
    return key in f._shared
