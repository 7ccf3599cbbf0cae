"""Trials an adapter runs on its framework's own casts: does a cast keep every value as ml_dtypes does?
And ``Bounded``: a trial kept once found, which a caller that may hold what it waits for waits on boundedly."""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
import warnings
from typing import Any, Callable, ContextManager, Generic, NamedTuple, TypeVar

from bf16bridge.core import dtypes, formats


def cast_matches(src: str, dst: str, run: Callable[[Any], Any]) -> bool:
    """Whether ``run`` (a framework's own conversion, given and returning numpy arrays) keeps
    every ``src`` value exactly in ``dst``, as ml_dtypes reads both: NaN for NaN, zeros keeping
    their sign. For the adapters' ``casts``, found by trying (at most 256 values; 65,536 for bf16).

    ``run`` gets every ``src`` value as a numpy array of ``src``, or, where numpy cannot hold
    ``src`` (no ml_dtypes), as its carrier's bits: the expected values then come from the
    row's own decoding (``core.formats``), which reads its bits without ml_dtypes."""
    import numpy as np

    try:
        # NaN patterns warn "invalid value encountered in cast" in some ml_dtypes casts
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            bits = dtypes.all_patterns(src)
            if dtypes.numpy_missing(src) is None:
                a = bits.view(dtypes.numpy_dtype(src))
                want = a.astype(np.float64)
            else:
                a = bits
                want = formats.widen(bits, src).astype(np.float64)
            got = np.asarray(run(a)).astype(np.float64)
    except Exception:  # noqa: BLE001 - any failure means it does not convert
        return False
    nan = np.isnan(want)
    return bool(want.shape == got.shape and np.array_equal(nan, np.isnan(got))
                and np.array_equal(want[~nan], got[~nan])
                and np.array_equal(np.signbit(want[~nan]), np.signbit(got[~nan])))


def float_row(name: str | None) -> bool:
    """A floating row numpy holds here, one value a byte or more (ml_dtypes' cast is the reference
    an adapter's own cast between two of them is held to: ``rounds_as_ml_dtypes``)."""
    row = dtypes.ROWS.get(name) if name is not None else None
    return row is not None and row.kind == "float" and row.packing == 1 and dtypes.numpy_missing(row.name) is None


def _rounding_probe(src: str):
    """Values of float row ``src`` where two casts from it differ if they round differently: every
    pattern of a 16-bit or narrower type; for float32 and float64, every exponent (subnormals
    included) under mantissas at, just below and just above a tie at each bit (a tie plus the
    smallest tail shows a double rounding)."""
    import numpy as np

    dt = dtypes.numpy_dtype(src)
    if dt.itemsize <= 2:
        return dtypes.all_patterns(src).view(dt)
    mant = 23 if dt.itemsize == 4 else 52
    u = np.dtype(f"u{dt.itemsize}")
    tails = sorted({m for k in range(mant) for m in (1 << k, (1 << k) - 1, (1 << k) + 1, 3 << k)
                    if m < 1 << mant})
    heads = np.arange(1 << (dt.itemsize * 8 - mant), dtype=u) << u.type(mant)  # sign and exponent
    return (heads[:, None] | np.array(tails, u)[None, :]).ravel().view(dt)


def rounds_as_ml_dtypes(src: str, dst: str, run: Callable[[Any], Any]) -> bool:
    """Whether ``run`` (a framework's own cast from float row ``src`` to ``dst``, given and returning
    numpy arrays) gives ml_dtypes' bits (a NaN: a NaN) on every value where two casts can differ
    (subnormals flushed, a double rounding): tried once per pair by the adapters whose casts do
    not (XLA:CPU and tensorflow's CPU kernels flush subnormals), which then cast in numpy."""
    import numpy as np

    a = _rounding_probe(src)
    to = dtypes.numpy_dtype(dst)
    # NaN and overflow casts warn through errstate (no catch_warnings: from two threads at once, its
    # restore can leave "ignore" behind for the whole process)
    with np.errstate(all="ignore"):
        try:
            want = a.astype(to)
        except (TypeError, ValueError):  # no cast of ml_dtypes' between the two (e8m0 -> e4m3fn): none to hold to
            return True
        try:
            got = np.asarray(run(a))
        except Exception:  # noqa: BLE001 - a cast that fails is no cast to take
            return False
        if got.dtype != to or got.shape != want.shape:
            return False
        nan = np.isnan(want.astype(np.float32))
        return bool(np.isnan(got[nan].astype(np.float32)).all()
                    and np.array_equal(want[~nan].view(f"u{to.itemsize}"), got[~nan].view(f"u{to.itemsize}")))


# -- bf16 compute and allocations, for the capability probe ---------------------------------------

#: the side of the square matmuls the compute trial times: big enough that arithmetic, not the call, costs
MATMUL_SIDE = 256
#: bf16 counts as computed natively unless its matmul takes this many times float32's: widening costs a
#: copy of twice the size, worth it only where bf16 arithmetic is clearly the slower
SLOWER = 1.5
#: the sizes (bytes) of the fresh allocations whose alignment the probe reads: small and medium blocks,
#: which allocators place by their own alignment (large ones are page-aligned mappings)
ALLOCATION_SIZES = (1, 24, 100, 1000, 4099, 40000)


def timed_bf16_matmul(run: Callable[[str], Callable[[], Any]], what: str, rounds: int = 5) -> tuple[str, str, str]:
    """(dtype, "timed", why) for compute in one framework: ``run(dtype)`` ("bfloat16", "float32") gives a
    call doing one MATMUL_SIDE-square matmul in that dtype, finished when it returns. Each runs once to
    warm up, then they alternate ``rounds`` times; the best time of each is compared. float32 where bf16
    takes SLOWER times float32's or more."""
    import time

    calls = {d: run(d) for d in ("bfloat16", "float32")}
    best = dict.fromkeys(calls, float("inf"))
    for call in calls.values():
        call()
    for _ in range(rounds):
        for d, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[d] = min(best[d], time.perf_counter() - t0)
    ratio = best["bfloat16"] / max(best["float32"], 1e-9)
    said = (f"a {MATMUL_SIDE}x{MATMUL_SIDE} {what} in bf16 took {ratio:.2f} times float32's "
            f"(best of {rounds}, timed)")
    return ("float32" if ratio >= SLOWER else "bfloat16"), "timed", said


def allocation_offsets(make: Callable[[int], Any], pointer: Callable[[Any], int]) -> tuple[int, ...]:
    """Each address mod 64 of fresh allocations of ALLOCATION_SIZES bytes (``make(n)``, all alive at
    once, so each is a block of its own; ``pointer(x)``: its data address)."""
    kept = [make(n) for n in ALLOCATION_SIZES]
    return tuple(pointer(x) % 64 for x in kept)


# -- trials a caller may not wait on to the end --------------------------------------------------------

T = TypeVar("T")
#: guards every Bounded trial's answers and runs
_LOCK = threading.Lock()
#: (trial, args) a hurried caller gave up on that still run: a hurried caller waits for no trial meanwhile
#: (what holds one, a device a callback holds, holds the others)
_STALLED: set = set()
#: answers that landed after a conservative one was given in their place
_REVISED = [0]
#: per thread: how many conservative answers were given in it (``kept`` keeps nothing computed on one)
_GIVEN = threading.local()
#: the threads trials run in, each with its trial's wait: the process waits that long for each at exit
_THREADS: dict[threading.Thread, float] = {}
_AT_EXIT: list = []  # _join_at_exit, once registered


def _join_at_exit() -> None:
    """Wait a while for trials still running in threads of their own: ending the interpreter under one
    stops it inside its framework's native code, which aborts the process."""
    for thread, wait in list(_THREADS.items()):
        thread.join(wait)


def revision() -> int:
    """How many trials' answers landed after a conservative answer was given in their place: 0 in a
    process where none was. Caches of what an adapter declares from its trials key on it."""
    return _REVISED[0]


def given_here() -> int:
    """How many conservative answers Bounded trials gave in this thread."""
    return getattr(_GIVEN, "count", 0)


class CacheInfo(NamedTuple):
    """How many answers a trial keeps (as functools' cache_info says it)."""

    currsize: int


class _Run:
    """One run of a trial: ``done`` set when it ends, ``error`` what it raised."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class Bounded(Generic[T]):
    """A trial kept once found (as functools.cache keeps it), run where it is asked; a hurried caller
    (``hurried()``: one that may hold what the trial waits for) runs it in a thread of its own instead
    (``context(*args)``: the caller's settings it needs there) and waits at most ``wait`` seconds, or not
    at all while another trial it gave up on still runs. A caller that stops waiting gets
    ``conservative(*args)`` (an answer that costs a copy at most), which is not kept; the trial's own
    answer is kept when it lands (``revision()`` counts those)."""

    def __init__(self, trial: Callable[..., T], conservative: Callable[..., T], hurried: Callable[[], bool],
                 wait: float, context: Callable[..., ContextManager] | None = None):
        functools.update_wrapper(self, trial)
        self.trial, self.conservative, self.hurried, self.wait, self.context = (
            trial, conservative, hurried, wait, context)
        self.answers: dict[tuple, T] = {}
        self.runs: dict[tuple, _Run] = {}
        self.given: set[tuple] = set()  # the arguments a conservative answer was given for

    def __call__(self, *args) -> T:
        try:
            return self.answers[args]
        except KeyError:
            return self._ask(args, self.hurried())

    def found(self, *args) -> T:
        """The trial's own answer, waited for however long it takes."""
        try:
            return self.answers[args]
        except KeyError:
            return self._ask(args, False)

    def cache_info(self) -> CacheInfo:
        return CacheInfo(len(self.answers))

    def cache_clear(self) -> None:
        with _LOCK:
            self.answers.clear()

    def _ask(self, args: tuple, hurried: bool) -> T:
        while True:
            with _LOCK:
                if args in self.answers:
                    return self.answers[args]
                run = self.runs.get(args)
                new = run is None
                if run is None:
                    run = self.runs[args] = _Run()
                stalled = bool(_STALLED)
            if new and not hurried:
                self._run(args, run, away=False)
            elif new:
                self._start(args, run)
            if not run.done.wait((0 if stalled else self.wait) if hurried else None):
                return self._give(args)
            if run.error is not None:
                raise run.error

    def _start(self, args: tuple, run: _Run) -> None:
        thread = threading.Thread(target=self._run, args=(args, run, True), daemon=True,
                                  name=f"bf16bridge trial {self.trial.__name__}")
        with _LOCK:
            if not _AT_EXIT:
                _AT_EXIT.append(atexit.register(_join_at_exit))
            _THREADS[thread] = self.wait
        thread.start()

    def _run(self, args: tuple, run: _Run, away: bool) -> None:
        """Run the trial, keep its answer (or the error it raised, for whoever waits), end ``run``."""
        error: BaseException | None = None
        try:
            with self.context(*args) if away and self.context is not None else contextlib.nullcontext():
                answer = self.trial(*args)
        except BaseException as err:  # noqa: BLE001 - raised again to every caller waiting on this run
            error = err
        with _LOCK:
            if error is None:
                self.answers[args] = answer
                if args in self.given:
                    _REVISED[0] += 1
            self.given.discard(args)
            _STALLED.discard((self, args))
            del self.runs[args]
            _THREADS.pop(threading.current_thread(), None)
        run.error = error
        run.done.set()

    def _give(self, args: tuple) -> T:
        """The conservative answer, for a caller that stopped waiting (the trial's, had it just landed)."""
        with _LOCK:
            if args in self.answers:
                return self.answers[args]
            if args in self.runs:
                _STALLED.add((self, args))
                self.given.add(args)
        _GIVEN.count = given_here() + 1
        return self.conservative(*args)


def kept(fn: Callable[..., T]) -> Callable[..., T]:
    """functools.cache for a function of Bounded trials' answers, which keeps nothing it computed on a
    conservative answer."""
    answers: dict[tuple, T] = {}

    @functools.wraps(fn)
    def ask(*args):
        try:
            return answers[args]
        except KeyError:
            pass
        before = given_here()
        answer = fn(*args)
        if given_here() == before:
            answers[args] = answer
        return answer

    ask.cache_info = lambda: CacheInfo(len(answers))  # type: ignore[attr-defined]
    ask.cache_clear = answers.clear  # type: ignore[attr-defined]
    return ask


class kept_property:
    """``functools.cached_property`` for what an adapter declares from Bounded trials: a value computed
    on a conservative answer is not kept (asked again, it follows the trial's own answer once landed)."""

    def __init__(self, fn: Callable[[Any], Any]):
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self.fn, self.name = fn, fn.__name__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        before = given_here()
        value = self.fn(obj)
        if given_here() == before:
            obj.__dict__[self.name] = value  # (read from the instance from now on, as cached_property's)
        return value
