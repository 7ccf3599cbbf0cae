"""Measure every route against the usual workaround, the raw call and memcpy, in one run.

Times are medians of repeated runs after warm-up; every claim is a ratio to a
floor measured in the same process run (this machine is shared and noisy).
"""

from __future__ import annotations

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


def pairs() -> list[tuple[str, str]]:
    """Every ordered pair of the registered frameworks."""
    names = registry.names()
    return [(s, d) for s in names for d in names if s != d]


KiB, MiB = 1 << 10, 1 << 20
SIZES = {"1 KiB": KiB, "1 MiB": MiB, "32 MiB": 32 * MiB, "256 MiB": 256 * MiB}
QUICK_SIZES = ("1 KiB", "32 MiB")


def _ready(y):
    if hasattr(y, "block_until_ready"):
        y.block_until_ready()
    return y


def measure(fn, *, min_time=0.25, min_repeat=5, max_repeat=2000, max_time=6.0, warmup=2) -> dict:
    """Median and best seconds of fn() over repeated runs after warm-up."""
    for _ in range(warmup):
        _ready(fn())
    times = []
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


def memcpy_floor(nbytes: int, fresh: bool = True) -> dict:
    """A memcpy of the same bytes: into fresh memory (np.copy), as a copying route must make;
    or, fresh=False, into memory already there (the bandwidth floor for kernels given out=)."""
    src = np.ones(nbytes, dtype=np.uint8)
    if fresh:
        return measure(lambda: np.copy(src))
    dst = np.empty_like(src)
    dst[...] = 0
    return measure(lambda: np.copyto(dst, src))


def bench_pairs(sizes, log) -> tuple[list[dict], list[str]]:
    """The rows, and the pairs left out (no raw call or workaround written for them)."""
    raws, extras = raw_routes(), extra_workarounds()
    todo = [p for p in pairs() if p in raws and p in WORKAROUNDS]
    left_out = [f"{s} -> {d}" for s, d in pairs() if (s, d) not in todo]
    if left_out:
        log(f"no raw call or workaround for {', '.join(left_out)}: left out")
    rows = []
    for label in sizes:
        nbytes = SIZES[label]
        base = sample(nbytes)
        mem = memcpy_floor(nbytes)
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
        base = x = None  # free the largest buffers before the next size
        gc.collect()
    return rows, left_out


def bench_import_copy_cost(label: str, log) -> list[dict]:
    """Adapter.import_copy_cost, measured: for each adapter whose import copies an unaligned
    buffer itself, that import of an unaligned numpy array against the route the bridge
    takes instead (its own aligned copy, then the import, zero-copy), in the same run."""
    nbytes = SIZES[label]
    hub = registry.get(registry.HUB)
    x = sample(nbytes, offset=16)
    rows = []
    for name in registry.names():
        a = registry.get(name)
        if name == registry.HUB or a.dlpack_unaligned != "copies":
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


def bench_copying_routes(label: str, log) -> list[dict]:
    """Routes that must copy, each against a memcpy of the same bytes."""
    import torch

    nbytes = SIZES[label]
    unaligned = sample(nbytes, offset=16)
    readonly = sample(nbytes)
    readonly.flags.writeable = False
    side = int((nbytes // 2) ** 0.5)
    t = torch.from_numpy(sample(side * side * 2).view(np.uint16)).view(torch.bfloat16).reshape(side, side).T
    # (what, input, target, the framework's own call for the same layout change, or None)
    cases = [
        ("numpy (not 64-byte aligned) -> jax", unaligned, "jax", None),
        ("numpy (not 64-byte aligned) -> tensorflow", unaligned, "tensorflow", None),
        ("numpy (read-only) -> torch", readonly, "torch", None),
        ("torch (transposed) -> tensorflow", t, "tensorflow", ("t.contiguous()", lambda: t.contiguous())),
        ("torch (transposed) -> jax", t, "jax", ("t.contiguous()", lambda: t.contiguous())),
    ]
    rows = []
    for name, x, d, own in cases:
        p = bb.plan(x, to=d)
        mem = memcpy_floor(nbytes)  # measured next to each case: the machine drifts
        r = measure(lambda: bb.convert(x, d))
        row = {"case": name, "size": label, "copies": p.copies, "bridge": r, "memcpy": mem,
               "reasons": [st.reason for st in p.steps if st.copies]}
        if own:
            row["own"] = {"code": own[0], **measure(own[1])}
        rows.append(row)
        log(f"  copy route {name}: {r['median'] * 1e3:.2f} ms vs memcpy {mem['median'] * 1e3:.2f} ms")
    return rows


def bench_kernels(sizes, log) -> list[dict]:
    import ml_dtypes
    import torch

    others = [b for b in kernels.backends() if b not in ("auto", kernels.pick_backend())]
    rows = []
    for label in sizes:
        nbytes = SIZES[label]
        n = nbytes // 2  # bf16 elements
        b = sample(nbytes)
        f = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        mem = memcpy_floor(nbytes, fresh=False)
        bandwidth = 2 * nbytes / mem["median"]  # bytes read + written per second
        out_f = np.empty(n, np.float32)
        out_b = np.empty(n, ml_dtypes.bfloat16)
        tb, tf_ = torch.from_numpy(b.view(np.uint16)).view(torch.bfloat16), torch.from_numpy(f)
        cases = {
            "bf16 -> float32": (6 * n, [
                (f"kernels.to_float32 (auto: {kernels.pick_backend()})", lambda: kernels.to_float32(b, out=out_f)),
                *((f"kernels.to_float32 backend={k}", lambda k=k: kernels.to_float32(b, out=out_f, backend=k))
                  for k in others),
                ("ml_dtypes astype", lambda: b.astype(np.float32)),
                ("torch .to(float32)", lambda: tb.to(torch.float32)),
            ], lambda: kernels.to_float32(b, out=out_f)),
            "float32 -> bf16": (6 * n, [
                (f"kernels.to_bf16 (auto: {kernels.pick_backend()})", lambda: kernels.to_bf16(f, out=out_b)),
                *((f"kernels.to_bf16 backend={k}", lambda k=k: kernels.to_bf16(f, out=out_b, backend=k))
                  for k in others),
                ("ml_dtypes astype", lambda: f.astype(ml_dtypes.bfloat16)),
                ("torch .to(bfloat16) (not bit-exact: NaN, subnormals)", lambda: tf_.to(torch.bfloat16)),
            ], lambda: kernels.to_bf16(f, out=out_b)),
        }
        for what, (moved, impls, main) in cases.items():
            floor = moved / bandwidth
            for name, fn in impls:
                r = measure(fn, min_repeat=3)
                rows.append({"size": label, "kernel": what, "impl": name, "time": r, "floor": floor,
                             "memcpy": mem})
                log(f"  {label} {what} {name}: {r['median'] * 1e3:.2f} ms (floor {floor * 1e3:.2f} ms)")
            rows.append({"size": label, "kernel": what, "impl": "peak extra memory, chunked, out= given",
                         "peak_extra_bytes": peak_extra_bytes(main)})
    return rows


def bench_import(log, runs: int = 11) -> dict:
    """Each import in a fresh process, the two alternating so that drift hits both alike."""
    code = "import time; t = time.perf_counter(); import {mods}; print(time.perf_counter() - t)"
    cases = (("numpy, ml_dtypes", "numpy, ml_dtypes"), ("bf16bridge", "bf16bridge"))
    times = {key: [] for key, _ in cases}
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

    caps = bb.probe()
    return {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "cpu_bf16": caps.cpu.why, "python": platform.python_version(),
        "versions": {d: v(d) for d in ("bf16bridge", "numpy", "ml_dtypes", "torch", "jax", "jaxlib",
                                        "tensorflow-cpu", "tensorflow", "keras")},
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def run(quick: bool, log=print) -> dict:
    for name in registry.names():  # import every framework before timing anything
        registry.get(name)

    sizes = QUICK_SIZES if quick else tuple(SIZES)
    rows, left_out = bench_pairs(sizes, log)
    return {
        "mode": "quick" if quick else "full",
        "machine": machine(),
        "pairs": rows,
        "pairs_left_out": left_out,
        "copying": bench_copying_routes("32 MiB", log),
        "import_copy_cost": bench_import_copy_cost("32 MiB", log),
        "kernels": bench_kernels(("32 MiB",) if quick else ("32 MiB", "256 MiB"), log),
        "import": bench_import(log),
    }
