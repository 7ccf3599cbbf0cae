"""Checkpoint loading: bb.load into each framework against safetensors' own loaders.

    python -m bf16bridge.bench.checkpoints            # a GPT-2-small-shaped bf16 file (about 250 MB)
    python -m bf16bridge.bench.checkpoints --layers 2 # smaller, for a quick look
    python -m bf16bridge.bench.checkpoints --first    # only open + first tensor, bb and safetensors into
                                                # numpy and torch, 1 GiB file, 7 processes each
    python -m bf16bridge.bench.checkpoints --first --many  # the same, of 850 float32 64x64 tensors

The harness's part (``bf16bridge bench --only checkpoints``) also times open + first tensor of a file
of many small tensors (MANY_*: 850 float32 64x64, written by safetensors), whose header is most of the
work, ours and safetensors' into numpy and torch.

Each loader runs in a fresh process (so one run's pages and allocator caches do not help the
next) on a file already in the page cache (written just before: this measures the loaders, not
the disk). Per loader: time to open the file and have its first tensor, time of the full load,
time of the load plus a touch of every page of every result (a view that reads nothing at load
time pays here), and the peak extra RSS over the process's RSS before the load, after the load
and after the touch (VmHWM, reset through /proc/self/clear_refs; tracemalloc cannot see the
frameworks' allocators; a touched page of a memory map counts, as the page cache's page it is). A loader that
fails on the file says why, in its row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import ml_dtypes
import numpy as np

#: loader name -> (framework module imported before measuring, code that sets `out` from `path`, first-tensor code)
LOADERS = {
    "bb.load numpy": ("numpy", "out = bb.load(path)",
                      "with bb.open(path) as f: first = f.get(f.keys()[0])"),
    "bb.load torch": ("torch", "out = bb.load(path, to='torch')",
                      "with bb.open(path) as f: first = f.get(f.keys()[0], 'torch')"),
    "bb.load jax": ("jax", "out = bb.load(path, to='jax')",
                    "with bb.open(path) as f: first = f.get(f.keys()[0], 'jax')"),
    "bb.load tensorflow": ("tensorflow", "out = bb.load(path, to='tensorflow')",
                           "with bb.open(path) as f: first = f.get(f.keys()[0], 'tensorflow')"),
    "safetensors.numpy": ("numpy", "from safetensors.numpy import load_file; out = load_file(path)",
                          "from safetensors import safe_open\n"
                          "with safe_open(path, 'np') as f: first = f.get_tensor(next(iter(f.keys())))"),
    "safetensors.torch": ("torch", "from safetensors.torch import load_file; out = load_file(path)",
                          "from safetensors import safe_open\n"
                          "with safe_open(path, 'pt') as f: first = f.get_tensor(next(iter(f.keys())))"),
    "safetensors.flax": ("jax", "from safetensors.flax import load_file; out = load_file(path)",
                         "from safetensors import safe_open\n"
                         "with safe_open(path, 'flax') as f: first = f.get_tensor(next(iter(f.keys())))"),
    "safetensors.tensorflow": ("tensorflow", "from safetensors.tensorflow import load_file; out = load_file(path)",
                               "from safetensors import safe_open\n"
                               "with safe_open(path, 'tf') as f: first = f.get_tensor(next(iter(f.keys())))"),
    # what people do for numpy where safetensors.numpy has no bf16: torch, widened to float32
    "safetensors.torch + .float().numpy()": (
        "torch", "from safetensors.torch import load_file; out = {k: v.float().numpy() for k, v in load_file(path).items()}",
        "from safetensors import safe_open\n"
        "with safe_open(path, 'pt') as f: first = f.get_tensor(next(iter(f.keys()))).float().numpy()"),
}

_CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np, ml_dtypes
    import bf16bridge as bb
    path, module, load, first_code, first_only = sys.argv[1:6]
    import bf16bridge.checkpoints, safetensors.numpy  # imports are not what is measured
    if module != "numpy":
        __import__(module)
        __import__({"jax": "safetensors.flax"}.get(module, f"safetensors.{module}"))
    bb.convert(np.zeros(64, ml_dtypes.bfloat16), module)  # the adapter's import and first call
    def status(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field)) * 1024
    def touch(x):
        a = bb.convert(x, "numpy", on_alias="allow")
        u = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        return int(u[::4096].sum()) if u.size else 0  # one byte a page: every page read
    import gc
    gc.collect()  # a collection pending since the imports would land in whichever loader allocates first
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    try:
        t0 = time.perf_counter()
        exec(first_code)
        first_s = time.perf_counter() - t0
        del first
        if first_only == "1":
            print(json.dumps({"first_s": first_s}))
            sys.exit(0)
        t0 = time.perf_counter()
        exec(load)
        for v in out.values():
            getattr(v, "block_until_ready", lambda: None)()
        load_s = time.perf_counter() - t0
        peak_load = status("VmHWM") - base
        for v in out.values():
            touch(v)
        touch_s = time.perf_counter() - t0
        print(json.dumps({"first_s": first_s, "load_s": load_s, "touch_s": touch_s,
                          "peak_load": peak_load, "peak_extra": status("VmHWM") - base,
                          "tensors": len(out)}))
    except Exception as err:
        print(json.dumps({"error": f"{type(err).__name__}: {str(err)[:120]}"}))
""")


def gpt2_shapes(layers: int = 12, d: int = 768, vocab: int = 50257, ctx: int = 1024) -> dict:
    """The parameter shapes of GPT-2 small (124M), HF naming."""
    shapes = {"wte.weight": (vocab, d), "wpe.weight": (ctx, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(layers):
        h = f"h.{i}."
        shapes.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,), h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
                       h + "attn.c_attn.weight": (d, 3 * d), h + "attn.c_attn.bias": (3 * d,),
                       h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
                       h + "mlp.c_fc.weight": (d, 4 * d), h + "mlp.c_fc.bias": (4 * d,),
                       h + "mlp.c_proj.weight": (4 * d, d), h + "mlp.c_proj.bias": (d,)})
    return shapes


def write(path: str, layers: int, ours: bool = False) -> int:
    """A bf16 checkpoint of GPT-2-small shapes, written by safetensors itself (its layout: the data
    starts 8-byte aligned) or by bb.save (``ours``: the data starts 64-byte aligned)."""
    from safetensors import TensorSpec, serialize_file

    rng = np.random.default_rng(0)
    tensors = {k: rng.standard_normal(s, dtype=np.float32).astype(ml_dtypes.bfloat16)
               for k, s in gpt2_shapes(layers).items()}
    if ours:
        import bf16bridge as bb

        bb.save(tensors, path)
        return sum(a.nbytes for a in tensors.values())
    specs = {k: TensorSpec(dtype="bfloat16", shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, a in tensors.items()}
    serialize_file(specs, path)
    return sum(a.nbytes for a in tensors.values())


#: the many-tensor file: this many float32 tensors of this shape, written by safetensors; opening it is
#: mostly reading its header (about 77 KB of JSON), which a file of many small tensors makes large
MANY_TENSORS, MANY_SHAPE, MANY_DTYPE = 850, (64, 64), "float32"


def write_many(path: str) -> int:
    """The many-tensor file, written by safetensors' own serializer (numpy buffers), as ``write`` writes."""
    from safetensors import TensorSpec, serialize_file

    rng = np.random.default_rng(0)
    tensors = {f"model.layers.{i}.weight": rng.standard_normal(MANY_SHAPE).astype(MANY_DTYPE)
               for i in range(MANY_TENSORS)}
    specs = {k: TensorSpec(dtype=MANY_DTYPE, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, a in tensors.items()}
    serialize_file(specs, path)
    return sum(a.nbytes for a in tensors.values())


def first_many(path: str, repeat: int) -> dict:
    """Open + first tensor of the many-tensor file, FIRST's loaders interleaved, ``repeat`` fresh processes each:
    the best time of each (the same child as the part's other rows, only opening and reading)."""
    times: dict[str, list[float]] = {name: [] for name in FIRST}
    errors: dict[str, dict] = {}
    for _ in range(repeat):  # interleaved: a busy moment of a shared machine hits every loader alike
        for name in FIRST:
            if name not in errors:
                r = run(path, 1, (name,), first_only=True)[name]
                if "error" in r:
                    errors[name] = r
                else:
                    times[name].append(r["first_s"])
    return {name: errors.get(name) or {"first_s": min(times[name])} for name in FIRST}


def run(path: str, repeat: int = 3, loaders=None, first_only: bool = False) -> dict:
    """Each loader's best time of ``repeat`` fresh processes, and its largest peak (``first_only``:
    only the time to open the file and have its first tensor; ``loaders``: these of LOADERS)."""
    results = {}
    for name in loaders or LOADERS:
        module, load, first = LOADERS[name]
        best: dict | None = None
        for _ in range(repeat):
            proc = subprocess.run([sys.executable, "-c", _CHILD, path, module, load, first, "1" if first_only else "0"],
                                  capture_output=True, text=True, timeout=600)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(lines[-1]) if lines else {"error": f"exit {proc.returncode}: {proc.stderr[-200:]}"}
            if "error" in r:
                best = r
                break
            if best is None:
                best = r
            else:
                best = {k: (max(best[k], r[k]) if k.startswith("peak") else min(best[k], r[k])) for k in r}
        results[name] = best
    return results


def table(results: dict, nbytes: int, writer: str = "safetensors") -> str:
    mb = nbytes / 2**20
    lines = [f"File: {mb:.0f} MiB of bf16 (GPT-2-small shapes), written by {writer}; page cache warm.", "",
             "| loader | open + first tensor | load | load + touch every page | peak extra RSS: load "
             "| peak extra RSS: load + touch |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | fails: {r['error']} | | | | |")
            continue
        lines.append(f"| {name} | {r['first_s'] * 1e3:.1f} ms | {r['load_s'] * 1e3:.1f} ms | "
                     f"{r['touch_s'] * 1e3:.1f} ms | {r['peak_load'] / 2**20:.0f} MiB ({r['peak_load'] / nbytes:.0%}) | "
                     f"{r['peak_extra'] / 2**20:.0f} MiB ({r['peak_extra'] / nbytes:.0%}) |")
    return "\n".join(lines)


#: the harness's part (``bf16bridge bench --only checkpoints``): about 1 GiB, or a small file in --quick
#: first_repeat: fresh processes for open + first tensor (the ``repeat`` full ones and more that only open and
#: read the first tensor): a millisecond, which one busy moment of a shared machine can triple
HARNESS = {"full": {"layers": 70, "repeat": 2, "first_repeat": 6},
           "quick": {"layers": 1, "repeat": 1, "first_repeat": 1}}
#: loaders whose load of a safetensors-written file is zero-copy (a view of the map): the RSS target's rows
ZERO_COPY = ("bb.load numpy", "bb.load torch")


def bench(quick: bool, log=print) -> dict:
    """The harness's checkpoint part: write the file, run every loader (fresh processes), time it all."""
    import time

    from .harness import machine

    mode = "quick" if quick else "full"
    cfg = HARNESS[mode]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpt2.safetensors")
        nbytes = write(path, cfg["layers"])
        file_bytes = os.path.getsize(path)
        log(f"checkpoint: {nbytes / 2**20:.0f} MiB of bf16 ({cfg['layers']} layers), {cfg['repeat']} fresh processes "
            f"a loader ({cfg['first_repeat']} for open + first tensor)")
        results = run(path, cfg["repeat"])
        extra = cfg["first_repeat"] - cfg["repeat"]
        for _ in range(extra):  # interleaved over the loaders, as first() does
            for name, r in results.items():
                if "error" not in r:
                    again = run(path, 1, (name,), first_only=True)[name]
                    r["first_s"] = min(r["first_s"], again.get("first_s", r["first_s"]))
        os.remove(path)
        many_path = os.path.join(d, "many.safetensors")
        many_bytes = write_many(many_path)
        many_results = first_many(many_path, cfg["first_repeat"])
        many = {"tensors": MANY_TENSORS, "shape": list(MANY_SHAPE), "dtype": MANY_DTYPE, "nbytes": many_bytes,
                "file_bytes": os.path.getsize(many_path), "repeat": cfg["first_repeat"], "results": many_results}
    for name, r in results.items():
        log(f"  {name}: " + (f"fails: {r['error']}" if "error" in r else
                             f"first {r['first_s'] * 1e3:.1f} ms, load {r['load_s'] * 1e3:.1f} ms, "
                             f"peak extra {r['peak_load'] / 2**20:.0f} MiB"))
    for name, r in many_results.items():
        log(f"  {MANY_TENSORS} tensors, {name}: " + (f"fails: {r['error']}" if "error" in r else
                                                       f"first {r['first_s'] * 1e3:.2f} ms"))
    return {"mode": mode, "machine": machine(), "writer": "safetensors", "layers": cfg["layers"],
            "repeat": cfg["repeat"], "first_repeat": cfg["first_repeat"], "nbytes": nbytes, "file_bytes": file_bytes,
            "zero_copy": list(ZERO_COPY),
            "results": results, "many": many, "wall_s": time.perf_counter() - t0}


#: the rows of the open + first tensor target (``--first``): ours and safetensors' into numpy and torch
FIRST = ("bb.load numpy", "safetensors.numpy", "bb.load torch", "safetensors.torch")


def first(layers: int = 70, repeat: int = 7, many: bool = False) -> str:
    """Only open + first tensor, ours against safetensors' (numpy, torch), fresh processes: min and
    median of ``repeat``, a quick look at the one target the full part takes a minute to judge
    (``many``: of the many-tensor file instead of GPT-2's shapes)."""
    import statistics

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpt2.safetensors")
        if many:
            write_many(path)
        else:
            write(path, layers)
        rows: dict[str, list] = {name: [] for name in FIRST}
        for _ in range(repeat):  # interleaved: a busy moment of a shared machine hits every loader alike
            for name in FIRST:
                r = run(path, 1, (name,), first_only=True)[name]
                rows[name].append(r.get("first_s", float("nan")) if "error" not in r else float("nan"))
                if "error" in r:
                    print(f"{name}: {r['error']}", file=sys.stderr)
    what = f"{MANY_TENSORS} {MANY_DTYPE} tensors" if many else f"{layers} layers"
    lines = [f"open + first tensor, {what}, {repeat} fresh processes each", "",
             "| loader | min | median |", "|---|---|---|"]
    for name, ts in rows.items():
        lines.append(f"| {name} | {min(ts) * 1e3:.2f} ms | {statistics.median(ts) * 1e3:.2f} ms |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks (12: GPT-2 small)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes a loader (best time, largest peak)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--writer", choices=("safetensors", "bb"), default="safetensors",
                        help="who writes the file (bb.save aligns the data for jax and tensorflow)")
    parser.add_argument("--first", action="store_true",
                        help="only open + first tensor into numpy and torch, ours and safetensors' (--layers 70 "
                             "and --repeat 7 unless given)")
    parser.add_argument("--many", action="store_true",
                        help=f"with --first: of a file of {MANY_TENSORS} {MANY_DTYPE} tensors (the harness's "
                             "many-tensor rows) instead of GPT-2's shapes")
    args = parser.parse_args(argv)
    if args.first:
        given = argv if argv is not None else sys.argv[1:]
        print(first(args.layers if "--layers" in given else 70, args.repeat if "--repeat" in given else 7, args.many))
        return 0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpt2.safetensors")
        nbytes = write(path, args.layers, ours=args.writer == "bb")
        results = run(path, args.repeat)
    print(table(results, nbytes, args.writer))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nbytes": nbytes, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
