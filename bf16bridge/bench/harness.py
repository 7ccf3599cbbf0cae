"""Measure every route against the usual workaround, the raw call and memcpy, in one run.

Times are medians of repeated runs after warm-up; every claim is a ratio to a
floor measured in the same process run (this machine is shared and noisy).
"""

from __future__ import annotations

import functools
import gc
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import bf16bridge as bb
from bf16bridge import kernels
from bf16bridge.core import registry
from bf16bridge.core.memory import aligned_empty
from bf16bridge.cli.tables import aligned_source
from bf16bridge.cli.workarounds import WORKAROUNDS, ZERO_COPY_ALREADY

from .raw import extra_workarounds, raw_routes
from .timing import compare, ready as _ready


def held_by_numpy(names, log=print) -> tuple[list[str], list[dict]]:
    """The dtypes of ``names`` numpy (this ml_dtypes) holds, and the others each with the table's
    reason (ml_dtypes 0.3.1 has no fp4, fp6, e8m0...): a part leaves those out, says so in its log,
    and keeps them in its JSON ("left_out") for its section of the page."""
    from bf16bridge.core import dtypes

    kept, left = [], []
    for name in names:
        why = dtypes.values_missing(name)
        (left.append({"dtype": name, "why": why}) if why else kept.append(name))
    for r in left:
        log(f"  left out {r['dtype']}: {r['why']}")
    return kept, left


def pairs(frameworks=None) -> list[tuple[str, str]]:
    """Every ordered pair of the registered frameworks (of ``frameworks`` only, where given)."""
    names = [n for n in registry.names() if frameworks is None or n in frameworks]
    return [(s, d) for s in names for d in names if s != d]


KiB, MiB = 1 << 10, 1 << 20
SIZES = {"1 KiB": KiB, "1 MiB": MiB, "32 MiB": 32 * MiB, "256 MiB": 256 * MiB}
QUICK_SIZES = ("1 KiB", "1 MiB")
#: the one size the routes that must copy, an import's own copy and the kernels are measured at
ONE_SIZE = {"full": "32 MiB", "quick": "1 MiB"}
#: measure()'s batches in quick mode: short (--quick stays under a minute)
QUICK_TIMING = {"min_time": 0.02, "max_time": 0.5}


def measure(fn, *, min_time=0.25, min_repeat=5, max_repeat=2000, max_time=6.0, warmup=2) -> dict:
    """Median and best seconds of fn() over repeated runs after warm-up."""
    for _ in range(warmup):
        _ready(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeat:
        t0 = time.perf_counter()
        _ready(fn())
        times.append(time.perf_counter() - t0)
        spent = time.perf_counter() - start
        if len(times) >= min_repeat and spent >= min_time:
            break
        if len(times) >= 3 and spent >= max_time:
            break
    return {"median": statistics.median(times), "best": min(times), "n": len(times)}


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_extra_bytes(fn) -> int | None:
    """Peak resident memory fn() adds (Linux: reset the high-water mark, run, read it)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _status_kib("VmRSS")
    y = _ready(fn())
    peak = _status_kib("VmHWM")
    del y
    gc.collect()
    if before is None or peak is None:
        return None
    return max(0, (peak - before) * 1024)


def sample(nbytes: int, offset: int = 0) -> np.ndarray:
    n = nbytes // 2
    raw = aligned_empty((n + 64,), np.uint16)
    out = raw[offset // 2: offset // 2 + n]
    out[...] = np.random.default_rng(0).integers(0, 1 << 16, n, dtype=np.uint16)
    return out.view(bb.dtypes.numpy_dtype("bfloat16"))


def memcpy_floor(nbytes: int, fresh: bool = True, quick: bool = False) -> dict:
    """A memcpy of the same bytes: into fresh memory (np.copy), as a copying route must make;
    or, fresh=False, into memory already there (the bandwidth floor for kernels given out=)."""
    measure = _measure(quick)
    src = np.ones(nbytes, dtype=np.uint8)
    if fresh:
        return measure(lambda: np.copy(src))
    dst = np.empty_like(src)
    dst[...] = 0
    return measure(lambda: np.copyto(dst, src))


def _measure(quick: bool):
    return functools.partial(measure, **QUICK_TIMING) if quick else measure


def bench_pairs(sizes, log, frameworks=None, quick: bool = False) -> tuple[list[dict], list[str]]:
    """The rows, and the pairs left out (no raw call or workaround written for them)."""
    raws, extras = raw_routes(frameworks), extra_workarounds(frameworks)
    measure = _measure(quick)
    todo = [p for p in pairs(frameworks) if p in raws and p in WORKAROUNDS]
    left_out = [f"{s} -> {d}" for s, d in pairs(frameworks) if (s, d) not in todo]
    if left_out:
        log(f"no raw call or workaround for {', '.join(left_out)}: left out")
    rows = []
    for label in sizes:
        nbytes = SIZES[label]
        base = sample(nbytes)
        mem = memcpy_floor(nbytes, quick=quick)
        log(f"{label}: memcpy {mem['median'] * 1e6:.1f} us")
        for s, d in todo:
            x = aligned_source(base, s)  # 64-byte aligned, as the table assumes (jax 0.4.30's own: by chance)
            p = bb.plan(x, to=d)
            bridge = measure(lambda: bb.convert(x, d))
            raw = measure(lambda: raws[(s, d)](x))
            code, fn = WORKAROUNDS[(s, d)]
            with np.errstate(invalid="ignore"):
                works = [{"code": code, **measure(lambda: fn(x))}]
                works += [{"code": c, **measure(lambda: f(x))} for c, f in extras.get((s, d), [])]
            row = {
                "size": label, "nbytes": nbytes, "source": s, "target": d,
                "route": " -> ".join(f"{st.framework}: {st.label}" for st in p.steps),
                "copies": p.copies, "bridge": bridge, "raw": raw, "workarounds": works, "memcpy": mem,
                "workaround_zero_copy": (s, d) in ZERO_COPY_ALREADY,
            }
            if label == max(sizes, key=lambda k: SIZES[k]):
                row["peak_extra_bytes"] = {"bridge": peak_extra_bytes(lambda: bb.convert(x, d))}
                with np.errstate(invalid="ignore"):
                    row["peak_extra_bytes"]["workaround"] = peak_extra_bytes(lambda: fn(x))
            rows.append(row)
            log(f"  {s:>10} -> {d:<10} bridge {bridge['median'] * 1e6:9.1f} us  raw {raw['median'] * 1e6:9.1f} us"
                f"  workaround {works[0]['median'] * 1e6:11.1f} us")
        del base, x  # free the largest buffers before the next size
        gc.collect()
    return rows, left_out


def bench_import_copy_cost(label: str, log, frameworks=None, quick: bool = False) -> list[dict]:
    """Adapter.import_copy_cost, measured: for each adapter whose import copies an unaligned
    buffer itself, that import of an unaligned numpy array against the route the bridge
    takes instead (its own aligned copy, then the import, zero-copy), in the same run."""
    nbytes = SIZES[label]
    hub = registry.get(registry.HUB)
    measure = _measure(quick)
    x = sample(nbytes, offset=16)
    rows = []
    for name in registry.names():
        if name == registry.HUB or frameworks is not None and name not in frameworks:
            continue
        a = registry.get(name)
        if a.dlpack_unaligned != "copies":
            continue
        imp = next((h for h in a.handoffs() if (h.src, h.dst) == (registry.HUB, name)), None)
        if imp is None:
            log(f"  import_copy_cost {name}: no hand-off from {registry.HUB} to measure; left out")
            continue
        # check that the two routes are what they stand for: the import copies, after ours it does not
        own, aligned = imp.run(x), hub.copy(x)
        ours = imp.run(aligned)
        if a.data_ptr(_ready(own)) == x.ctypes.data or a.data_ptr(_ready(ours)) != aligned.ctypes.data:
            log(f"  import_copy_cost {name}: the routes did not copy as expected; left out")
            continue
        own = ours = aligned = None
        # alternate the two, so that drift on this shared machine hits both alike
        t_own, t_ours = [], []
        for _ in range(3):
            t_own.append(measure(lambda: imp.run(x), min_repeat=3))
            t_ours.append(measure(lambda: imp.run(hub.copy(x)), min_repeat=3))
        r_own = min(t_own, key=lambda r: r["median"])
        r_ours = min(t_ours, key=lambda r: r["median"])
        ratio = r_own["median"] / r_ours["median"]
        rows.append({"adapter": name, "size": label, "declared": a.import_copy_cost, "measured": ratio,
                     "own": {"code": f"{imp.label} of an unaligned {registry.HUB} array", **r_own},
                     "bridge": {"code": f"{registry.HUB} adapter copy(), then {imp.label}", **r_ours}})
        log(f"  import_copy_cost {name}: measured {ratio:.2f} (declared {a.import_copy_cost:g}): "
            f"{r_own['median'] * 1e3:.2f} ms vs {r_ours['median'] * 1e3:.2f} ms")
    return rows


def _copying_cases(nbytes: int, frameworks) -> list[tuple]:
    """(what, input, target, the framework's own call for the same layout change, or None) for each
    route that must copy, or that copied until its target's import kept the layout (a transpose into
    jax where its trial says it keeps one), whose two frameworks are measured."""
    unaligned = sample(nbytes, offset=16)
    readonly = sample(nbytes)
    readonly.flags.writeable = False
    cases: list[tuple] = [
        ("numpy (not 64-byte aligned) -> jax", unaligned, "jax", None),
        ("numpy (not 64-byte aligned) -> tensorflow", unaligned, "tensorflow", None),
        ("numpy (read-only) -> torch", readonly, "torch", None),
    ]
    if frameworks is not None and "numpy" not in frameworks:
        cases = []
    if frameworks is None or "torch" in frameworks:
        import torch

        side = int((nbytes // 2) ** 0.5)
        t = torch.from_numpy(sample(side * side * 2).view(np.uint16)).view(torch.bfloat16).reshape(side, side).T
        cases += [("torch (transposed) -> tensorflow", t, "tensorflow", ("t.contiguous()", lambda: t.contiguous())),
                  ("torch (transposed) -> jax", t, "jax", ("t.contiguous()", lambda: t.contiguous()))]
    return [c for c in cases if frameworks is None or c[2] in frameworks]


def bench_copying_routes(label: str, log, frameworks=None, quick: bool = False) -> list[dict]:
    """Routes that must copy, each against a memcpy of the same bytes. A case whose plan is zero-copy
    here (``copies`` False) is measured against the raw call instead (``raw``), alternated with it, at
    this size and at 1 KiB (``small``): its time must not grow with the size."""
    nbytes = SIZES[label]
    measure = _measure(quick)
    raws = raw_routes(frameworks)
    small = {c[0]: c for c in _copying_cases(SIZES["1 KiB"], frameworks)}
    rows = []
    for name, x, d, own in _copying_cases(nbytes, frameworks):
        p = bb.plan(x, to=d)
        mem = memcpy_floor(nbytes, quick=quick)  # measured next to each case: the machine drifts
        row = {"case": name, "size": label, "copies": p.copies, "memcpy": mem,
               "reasons": [st.reason for st in p.steps if st.copies]}
        if not p.copies:
            raw = raws[(registry.framework_of(x), d)]
            for key, size, y in (("at", label, x), ("small", "1 KiB", small[name][1])):
                runs = [(measure(lambda y=y: bb.convert(y, d)), measure(lambda y=y: raw(y))) for _ in range(3)]
                bridge, by_hand = (min((r[i] for r in runs), key=lambda r: r["median"]) for i in (0, 1))
                if key == "at":
                    row.update(bridge=bridge, raw={"code": "the raw call (bench/raw.py)", **by_hand})
                else:
                    row["small"] = {"size": size, "bridge": bridge, "raw": by_hand}
            log(f"  zero-copy route {name}: {row['bridge']['median'] * 1e6:.1f} us vs raw "
                f"{row['raw']['median'] * 1e6:.1f} us ({label}); {row['small']['bridge']['median'] * 1e6:.1f} us "
                f"vs {row['small']['raw']['median'] * 1e6:.1f} us (1 KiB)")
            rows.append(row)
            continue
        r = row["bridge"] = measure(lambda: bb.convert(x, d))
        if own:
            row["own"] = {"code": own[0], **measure(own[1])}
        rows.append(row)
        log(f"  copy route {name}: {r['median'] * 1e3:.2f} ms vs memcpy {mem['median'] * 1e3:.2f} ms")
    return rows


def _kernel_cases(b, f, with_torch: bool) -> dict:
    """{conversion: (bytes moved, [(implementation, call)], the call whose peak memory is read)}."""
    import ml_dtypes

    others = [k for k in kernels.backends() if k not in ("auto", kernels.pick_backend())]
    out_f, out_b = np.empty(f.shape, np.float32), np.empty(f.shape, ml_dtypes.bfloat16)
    to_f32 = [(f"kernels.to_float32 (auto: {kernels.pick_backend()})", lambda: kernels.to_float32(b, out=out_f)),
              *((f"kernels.to_float32 backend={k}", lambda k=k: kernels.to_float32(b, out=out_f, backend=k))
                for k in others),
              ("ml_dtypes astype", lambda: b.astype(np.float32))]
    to_bf16 = [(f"kernels.to_bf16 (auto: {kernels.pick_backend()})", lambda: kernels.to_bf16(f, out=out_b)),
               *((f"kernels.to_bf16 backend={k}", lambda k=k: kernels.to_bf16(f, out=out_b, backend=k))
                 for k in others),
               ("ml_dtypes astype", lambda: f.astype(ml_dtypes.bfloat16))]
    if with_torch:
        import torch

        tb, tf_ = torch.from_numpy(b.view(np.uint16)).view(torch.bfloat16), torch.from_numpy(f)
        to_f32.append(("torch .to(float32)", lambda: tb.to(torch.float32)))
        to_bf16.append(("torch .to(bfloat16) (not bit-exact: NaN, subnormals)", lambda: tf_.to(torch.bfloat16)))
    n = b.size
    return {"bf16 -> float32": (6 * n, to_f32, lambda: kernels.to_float32(b, out=out_f)),
            "float32 -> bf16": (6 * n, to_bf16, lambda: kernels.to_bf16(f, out=out_b))}


def bench_kernels(sizes, log, frameworks=None, quick: bool = False) -> list[dict]:
    """Each conversion's implementations and the floor's memcpy (into memory already there) alternate
    call by call, so that other load on this shared machine hits them alike; the floor is the bytes
    moved at memcpy's bandwidth, of its median call and of its fastest."""
    rows = []
    for label in sizes:
        nbytes = SIZES[label]
        b = sample(nbytes)
        f = np.random.default_rng(1).standard_normal(nbytes // 2).astype(np.float32)
        src, dst = np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
        cases = _kernel_cases(b, f, frameworks is None or "torch" in frameworks)
        for what, (moved, impls, main) in cases.items():
            times = compare({"memcpy": lambda: np.copyto(dst, src), **dict(impls)}, quick=quick,
                            budget=0.05 if quick else 1.5, min_rounds=3 if quick else 10)
            mem = times.pop("memcpy")
            floor, floor_best = moved * mem["median"] / (2 * nbytes), moved * mem["best"] / (2 * nbytes)
            for name, _ in impls:
                r = times[name]
                rows.append({"size": label, "kernel": what, "impl": name, "time": r, "floor": floor,
                             "floor_best": floor_best, "memcpy": mem})
                log(f"  {label} {what} {name}: {r['median'] * 1e3:.2f} ms (floor {floor * 1e3:.2f} ms); fastest "
                    f"{r['best'] * 1e3:.2f} ms (floor {floor_best * 1e3:.2f} ms)")
            rows.append({"size": label, "kernel": what, "impl": "peak extra memory, chunked, out= given",
                         "peak_extra_bytes": peak_extra_bytes(main)})
        del b, f, src, dst  # free the largest buffers before the next size
        gc.collect()
    return rows


def bench_import(log, runs: int = 11) -> dict:
    """Each import in a fresh process, the two alternating so that drift hits both alike."""
    code = "import time; t = time.perf_counter(); import {mods}; print(time.perf_counter() - t)"
    cases = (("numpy, ml_dtypes", "numpy, ml_dtypes"), ("bf16bridge", "bf16bridge"))
    times: dict[str, list[float]] = {key: [] for key, _ in cases}
    for _ in range(runs):
        for key, mods in cases:
            r = subprocess.run([sys.executable, "-c", code.format(mods=mods)], capture_output=True, text=True,
                               check=True)
            times[key].append(float(r.stdout.strip()))
    out = {k: {"median": statistics.median(v), "best": min(v), "n": runs} for k, v in times.items()}
    for k, v in out.items():
        log(f"  import {k}: {v['median'] * 1e3:.1f} ms")
    return out


def machine() -> dict:
    from importlib import metadata

    def v(d):
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            return None

    caps = bb.probe(trials=False, devices=False)  # the CPU's bf16 arithmetic only: no trials to wait for
    return {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "cpu_bf16": caps.cpu.why, "python": platform.python_version(),
        "versions": {d: v(d) for d in ("bf16bridge", "numpy", "ml_dtypes", "torch", "jax", "jaxlib",
                                        "tensorflow-cpu", "tensorflow", "keras")},
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def run(quick: bool, log=print, frameworks=None, left_out: dict | None = None) -> dict:
    """The main part: every pair of ``frameworks`` (default: every registered one) against the raw call
    and the workaround, the routes that must copy, an import's own copy, the kernels, the import time.
    ``left_out``: {framework: why} for the page, those the caller chose not to measure."""
    names = [n for n in registry.names() if frameworks is None or n in frameworks]
    for name in names:  # import every framework measured before timing anything
        registry.get(name)
    mode = "quick" if quick else "full"
    one = ONE_SIZE[mode]
    rows, pairs_left_out = bench_pairs(QUICK_SIZES if quick else tuple(SIZES), log, frameworks, quick)
    return {
        "mode": mode,
        "machine": machine(),
        "frameworks": names,
        "frameworks_left_out": dict(left_out or {}),
        "pairs": rows,
        "pairs_left_out": pairs_left_out,
        "copying": bench_copying_routes(one, log, frameworks, quick),
        "import_copy_cost": bench_import_copy_cost(one, log, frameworks, quick),
        "kernels": bench_kernels((one,) if quick else (one, "256 MiB"), log, frameworks, quick),
        "import": bench_import(log, runs=5 if quick else 11),
    }
