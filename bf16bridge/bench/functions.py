"""The cost of a call (issue 9): convert, convert_tree and bridged functions against hand-written
raw calls and peers, measured as ratios in one run; and where each peer fails.

Each comparison alternates its contenders call by call, so load from others on this shared
machine hits every contender alike. A result keeps the fastest call and the median call; the
targets are judged on the fastest (the least disturbed by other load), and the report shows both.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import bf16bridge as bb
from bf16bridge.errors import Bf16BridgeWarning

from .harness import SIZES, machine, pairs, sample
from .timing import BUDGET_S, MIN_ROUNDS, QUICK_BUDGET_S, QUICK_MIN_ROUNDS, compare, ready as _ready
from .loss_step import bench_mlp_step, one_torch_thread
from .raw import from_tf, raw_routes

def _mods() -> tuple[Any, Any, Any, Any, Any]:
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import tensorflow as tf
    import torch

    return ml_dtypes, torch, jax, jnp, tf


def _interop():
    """torch_jax_interop's two calls, or None where it does not import."""
    try:
        import torch_jax_interop as tji
    except Exception as err:  # noqa: BLE001 - a peer that does not import is reported, not fatal
        return None, f"{type(err).__name__}: {err}"
    return {("torch", "jax"): tji.torch_to_jax, ("jax", "torch"): tji.jax_to_torch}, None


# -- 1. convert of 1 KiB, every pair, against the raw call and torch_jax_interop -------------


#: the shape of each convert row set: 1 KiB flat, and the same bytes with a size-1 dimension (a batch of one)
CONVERT_SHAPES = {"rows": (512,), "rows_batch_of_one": (1, 512)}


def bench_convert(quick: bool, log) -> dict:
    peers, peer_error = _interop()
    out: dict = {"peer_error": peer_error}
    for key, shape in CONVERT_SHAPES.items():
        out[key] = _convert_rows(sample(SIZES["1 KiB"]).reshape(shape), peers if key == "rows" else None, quick, log)
    return out


def _convert_rows(base: np.ndarray, peers: dict | None, quick: bool, log) -> list[dict]:
    """``bb.convert`` of ``base`` (bf16) on every pair against the raw call (and the peers where given)."""
    raws = raw_routes()
    rows = []
    for s, d in pairs():
        if (s, d) not in raws:
            continue
        x = bb.convert(base, s, copy=True)
        p = bb.plan(x, to=d)
        contenders: dict[str, Callable[[], Any]] = {"bridge": lambda: bb.convert(x, d), "raw": lambda: raws[(s, d)](x)}
        if p.alias is not None:
            contenders["bridge, on_alias='allow'"] = lambda: bb.convert(x, d, on_alias="allow")
        if peers and (s, d) in peers:
            peer = peers[(s, d)]  # (called through a lambda, as the others are: the same call overhead)
            contenders["torch_jax_interop"] = lambda: peer(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Bf16BridgeWarning)  # the default call's warning is timed, not shown
            r = compare(contenders, quick=quick)
        rows.append({"source": s, "target": d, "copies": p.copies, "warns": p.alias is not None, "times": r})
        log(f"  convert 1 KiB {base.shape} {s:>10} -> {d:<10} "
            + "  ".join(f"{k} {v['best'] * 1e6:.2f} us" for k, v in r.items()))
    return rows


# -- 2. convert_tree of a GPT-2-small-shaped state dict ---------------------------------------


def gpt2_shapes() -> dict[str, tuple[int, ...]]:
    """GPT-2 small's parameters (Hugging Face names, Conv1D weights as stored: in x out)."""
    d, ff, v, ctx = 768, 3072, 50257, 1024
    out: dict[str, tuple[int, ...]] = {"wte.weight": (v, d), "wpe.weight": (ctx, d)}
    for i in range(12):
        h = f"h.{i}."
        out.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,),
                    h + "attn.c_attn.weight": (d, 3 * d), h + "attn.c_attn.bias": (3 * d,),
                    h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
                    h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
                    h + "mlp.c_fc.weight": (d, ff), h + "mlp.c_fc.bias": (ff,),
                    h + "mlp.c_proj.weight": (ff, d), h + "mlp.c_proj.bias": (d,)})
    out.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return out


def bench_tree(quick: bool, log) -> list[dict]:
    ml, torch, jax, jnp, tf = _mods()
    raws = raw_routes()
    # torch's allocator aligns to 64 bytes; values do not matter to a zero-copy move (the
    # pages are zero-filled, not random, to keep the run short)
    sd = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in gpt2_shapes().items()}
    rows = []
    for d in ("numpy", "jax", "tensorflow"):
        there = bb.convert_tree(sd, d)
        for src, tree, to in (("torch", sd, d), (d, there, "torch")):
            raw = raws[(src, to)]
            p = bb.plan(next(iter(tree.values())), to=to)
            contenders = {"bridge": lambda t=tree, to=to: bb.convert_tree(t, to),
                          "raw loop": lambda t=tree, raw=raw: {k: raw(v) for k, v in t.items()}}
            if p.alias is not None:
                contenders["bridge, on_alias='allow'"] = lambda t=tree, to=to: bb.convert_tree(t, to, on_alias="allow")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Bf16BridgeWarning)
                r = compare(contenders, quick=quick)
            rows.append({"source": src, "target": to, "tensors": len(tree), "warns": p.alias is not None,
                         "times": r})
            log(f"  convert_tree GPT-2 {src:>10} -> {to:<10} "
                + "  ".join(f"{k} {v['best'] * 1e3:.3f} ms" for k, v in r.items()))
        del there  # (freed before the next target's copy)
    return rows


# -- 3. bridged functions against hand-written autodiff wrappers with raw DLPack calls -------

AUTODIFF = ("torch", "jax", "tensorflow")


class _Raw:
    """The raw moves a hand-written wrapper uses (bf16, contiguous, aligned inputs): of the public calls,
    the cheapest per call (raw.py's choices; torch -> jax detaches: Tensor.__dlpack__ refuses a tensor
    that requires grad)."""

    def __init__(self):
        ml, torch, jax, jnp, tf = _mods()
        imp = tf.experimental.dlpack.from_dlpack
        bf16 = ml.bfloat16
        to_capsule, from_capsule = torch.utils.dlpack.to_dlpack, torch.utils.dlpack.from_dlpack
        tf_capsule = tf.experimental.dlpack.to_dlpack

        def np_to_tf(a):
            if a.ctypes.data % 64:  # tensorflow's kernels abort on an unaligned import (FACTS.md)
                a = _aligned(a)
            return tf.bitcast(imp(a.view(np.uint16).__dlpack__()), tf.bfloat16)

        self.move = {
            ("torch", "jax"): lambda t: jnp.from_dlpack(t.detach()),
            ("jax", "torch"): lambda j: from_capsule(j.__dlpack__()),
            ("torch", "tensorflow"): lambda t: imp(to_capsule(t)),
            ("tensorflow", "torch"): lambda x: from_capsule(tf_capsule(x)),
            ("jax", "tensorflow"): lambda j: imp(j.__dlpack__()),
            ("tensorflow", "jax"): from_tf(jnp.from_dlpack),
            ("numpy", "torch"): lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16),
            ("torch", "numpy"): lambda t: t.detach().view(torch.int16).numpy().view(bf16),
            ("numpy", "tensorflow"): np_to_tf,
            ("tensorflow", "numpy"): lambda x, _in=from_tf(np.from_dlpack): _in(tf.bitcast(x, tf.uint16)).view(bf16),
        }


def _aligned(a):
    from bf16bridge.core.memory import aligned_empty

    out = aligned_empty(a.shape, np.uint16)
    out[...] = a.view(np.uint16)
    return out.view(a.dtype)


def _callee_fn(callee):
    """(a @ b) * c in the callee's own API (jax: jit-compiled, as a bridged jax function usually is)."""
    ml, torch, jax, jnp, tf = _mods()
    if callee == "torch":
        return lambda a, b, c: (a @ b) * c
    if callee == "jax":
        return jax.jit(lambda a, b, c: (a @ b) * c)
    return lambda a, b, c: tf.matmul(a, b) * c


def _callee_vjp(callee):
    """The callee's own vjp: (fn, inputs) -> (output, pullback(ct) -> grads)."""
    ml, torch, jax, jnp, tf = _mods()

    def torch_vjp(fn, xs):
        ins = [x.detach().requires_grad_() for x in xs]
        with torch.enable_grad():
            out = fn(*ins)
        return out, lambda ct: torch.autograd.grad(out, ins, ct)

    def jax_vjp(fn, xs):
        out, pb = jax.vjp(fn, *xs)
        return out, pb

    def tf_vjp(fn, xs):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            out = fn(*xs)
        return out, lambda ct: tape.gradient(out, xs, output_gradients=ct)

    return {"torch": torch_vjp, "jax": jax_vjp}.get(callee, tf_vjp)


def baseline(caller: str, callee: str, fn) -> tuple[Callable, Callable]:
    """The hand-written wrapper a user writes today for ``fn`` of ``callee`` called from ``caller``,
    with raw DLPack moves: torch ``autograd.Function`` around the callee's vjp; jax
    ``custom_vjp`` + ``pure_callback`` (its backward recomputes the forward, as the bridge's
    does: a callback cannot keep the pullback between the two); tf ``custom_gradient``.
    Returns (the wrapper, the forward alone for inputs that need no gradient)."""
    wrapper = {"torch": _torch_wrapper, "jax": _jax_wrapper}.get(caller, _tf_wrapper)
    return wrapper(callee, fn, _Raw().move, _callee_vjp(callee))


def _torch_wrapper(callee: str, fn, mv: dict, vjp) -> tuple[Callable, Callable]:
    function: Any = _mods()[1].autograd.Function  # (a base class mypy cannot name: torch is imported late)
    to_c, back = mv[("torch", callee)], mv[(callee, "torch")]

    class Wrapped(function):
        @staticmethod
        def forward(ctx, a, b, c):
            out, ctx.pb = vjp(fn, [to_c(a), to_c(b), to_c(c)])
            return back(out)

        @staticmethod
        def backward(ctx, ct):
            return tuple(back(g) for g in ctx.pb(to_c(ct)))

    def fwd_only(a, b, c):
        return back(fn(to_c(a), to_c(b), to_c(c)))

    return Wrapped.apply, fwd_only


def _jax_wrapper(callee: str, fn, mv: dict, vjp) -> tuple[Callable, Callable]:
    # jax 0.10 hands a pure_callback jax arrays, 64-byte aligned; jax 0.4.30 (the oldest declared)
    # allocates them 16-byte aligned at best, which tensorflow must not take as they are (its first
    # kernel on an unaligned buffer aborts the process: the raw wrapper a user writes there dies so),
    # so there they go through an aligned numpy copy; results go back as numpy
    from bf16bridge.adapters.jax.probe import allocates_aligned

    ml, torch, jax, jnp, tf = _mods()
    from_jax, from_numpy, back = mv[("jax", callee)], mv[("numpy", callee)], mv[(callee, "numpy")]
    to_c = from_jax if allocates_aligned() or callee != "tensorflow" else (
        lambda x: from_numpy(_aligned(np.asarray(x))))
    aval = jax.ShapeDtypeStruct((64, 64), jnp.bfloat16)

    def fwd_cb(a, b, c):
        return back(fn(to_c(a), to_c(b), to_c(c)))

    def bwd_cb(a, b, c, ct):
        _, pb = vjp(fn, [to_c(a), to_c(b), to_c(c)])
        return [back(g) for g in pb(to_c(ct))]

    @jax.custom_vjp
    def f(a, b, c):
        return jax.pure_callback(fwd_cb, aval, a, b, c)

    def f_fwd(a, b, c):
        return f(a, b, c), (a, b, c)

    def f_bwd(res, ct):
        return tuple(jax.pure_callback(bwd_cb, [aval] * 3, *res, ct))

    f.defvjp(f_fwd, f_bwd)
    to_j, from_j = mv[("jax", callee)], mv[(callee, "jax")]

    def fwd_only(a, b, c):  # concrete jax arrays: no callback needed
        return from_j(fn(to_j(a), to_j(b), to_j(c)))

    return f, fwd_only


def _tf_wrapper(callee: str, fn, mv: dict, vjp) -> tuple[Callable, Callable]:
    tf = _mods()[4]
    to_c, back = mv[("tensorflow", callee)], mv[(callee, "tensorflow")]

    @tf.custom_gradient
    def g(a, b, c):
        out, pb = vjp(fn, [to_c(a), to_c(b), to_c(c)])
        return back(out), lambda ct: [back(x) for x in pb(to_c(ct))]

    def fwd_only(a, b, c):
        return back(fn(to_c(a), to_c(b), to_c(c)))

    return g, fwd_only


def _driver(caller: str):
    """How a caller runs forward and backward: f, inputs, cotangent -> (output, grads)."""
    ml, torch, jax, jnp, tf = _mods()

    def torch_run(f, xs, ct):
        out = f(*xs)
        return out, torch.autograd.grad(out, xs, ct)

    def jax_run(f, xs, ct):
        out, pb = jax.vjp(f, *xs)
        return _ready([out, *pb(ct)])

    def tf_run(f, xs, ct):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            out = f(*xs)
        return out, tape.gradient(out, xs, output_gradients=ct)

    return {"torch": torch_run, "jax": jax_run}.get(caller, tf_run)


def _bridged_data() -> list:
    """The bridged calls' three 64x64 bf16 inputs and their cotangent, as numpy arrays."""
    ml = _mods()[0]
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((64, 64)) * 0.5).astype(np.float32).astype(ml.bfloat16) for _ in range(4)]


def bench_bridged(quick: bool, log) -> list[dict]:
    with one_torch_thread(_mods()[1]):
        return _bench_bridged(quick, log)


def _bench_bridged(quick: bool, log) -> list[dict]:
    ml, torch, jax, jnp, tf = _mods()
    data = _bridged_data()
    rows = []
    for caller in AUTODIFF:
        for callee in AUTODIFF:
            if caller == callee:
                continue
            fn = _callee_fn(callee)
            bridged = bb.bridge(callee)(fn)
            base, base_fwd = baseline(caller, callee, fn)
            xs = [bb.convert(a, caller, copy=True) for a in data[:3]]
            ct = bb.convert(data[3], caller, copy=True)
            grad_xs = [x.requires_grad_() for x in xs] if caller == "torch" else xs
            run = _driver(caller)
            # both give the callee's own results, bit for bit: a fair race runs the same work
            got, want = run(bridged, grad_xs, ct), run(base, grad_xs, ct)
            same = all(np.array_equal(_bits(g), _bits(w)) for g, w in zip(_flat(got), _flat(want)))
            plain = [x.detach() for x in xs] if caller == "torch" else xs
            same_fwd = np.array_equal(_bits(bridged(*plain)), _bits(base_fwd(*plain)))
            r = compare({"bridge": lambda: run(bridged, grad_xs, ct), "hand-written": lambda: run(base, grad_xs, ct)},
                        quick=quick)
            rf = compare({"bridge": lambda: _ready(bridged(*plain)), "hand-written": lambda: _ready(base_fwd(*plain))},
                         quick=quick)
            row: dict[str, Any] = {"caller": caller, "callee": callee, "same_bits": bool(same and same_fwd),
                                   "forward_backward": r, "forward": rf}
            if caller == "torch":
                row.update(_forward_grad_inputs(bridged, base_fwd, grad_xs, quick))
            rows.append(row)
            log(f"  bridged {caller:>10} -> {callee:<10} fwd+bwd {r['bridge']['best'] * 1e6:8.1f} us vs "
                f"{r['hand-written']['best'] * 1e6:8.1f} us; fwd {rf['bridge']['best'] * 1e6:7.1f} us vs "
                f"{rf['hand-written']['best'] * 1e6:7.1f} us{'' if same and same_fwd else '  (BITS DIFFER)'}"
                + (f"; fwd, inputs require grad {row['forward_grad_inputs']['bridge']['best'] * 1e6:7.1f} us vs "
                   f"{row['forward_grad_inputs']['hand-written']['best'] * 1e6:7.1f} us"
                   f"{'' if row['same_bits_grad_inputs'] else '  (BITS DIFFER)'}" if caller == "torch" else ""))
    return rows


def _forward_grad_inputs(bridged, base_fwd, grad_xs: list, quick: bool) -> dict:
    """A torch caller's forward-only call on inputs that require grad (a model's parameters in
    inference, under ``torch.no_grad()``): the bridged call against the hand-written forward, whose
    moves take such tensors as they are."""
    torch = _mods()[1]

    def fwd(f):
        with torch.no_grad():
            return _ready(f(*grad_xs))

    same = np.array_equal(_bits(fwd(bridged)), _bits(fwd(base_fwd)))
    return {"forward_grad_inputs": compare({"bridge": lambda: fwd(bridged), "hand-written": lambda: fwd(base_fwd)},
                                           quick=quick), "same_bits_grad_inputs": bool(same)}


def bench_bridged_jit(quick: bool, log) -> list[dict]:
    """A jax caller under ``jax.jit``: the bridged call against the hand-written ``custom_vjp`` +
    ``pure_callback`` wrapper (``baseline``), forward and backward (a jitted ``jax.vjp``) and forward
    only, for the torch and tensorflow callees."""
    ml, torch, jax, jnp, tf = _mods()
    with one_torch_thread(_mods()[1]):
        data = _bridged_data()
        xs = [jnp.asarray(a) for a in data[:3]]
        ct = jnp.asarray(data[3])
        run = _driver("jax")  # (its vjp, under jit here)
        rows = []
        for callee in [c for c in AUTODIFF if c != "jax"]:
            fn = _callee_fn(callee)
            contenders = {"bridge": bb.bridge(callee)(fn), "hand-written": baseline("jax", callee, fn)[0]}
            both = {k: jax.jit(lambda *a, f=f: run(f, a[:3], a[3])) for k, f in contenders.items()}
            fwd = {k: jax.jit(f) for k, f in contenders.items()}
            same = all(np.array_equal(_bits(g), _bits(w)) for g, w in zip(
                _flat(both["bridge"](*xs, ct)), _flat(both["hand-written"](*xs, ct))))
            same_fwd = np.array_equal(_bits(fwd["bridge"](*xs)), _bits(fwd["hand-written"](*xs)))
            r = compare({k: (lambda g=g: _ready(g(*xs, ct))) for k, g in both.items()}, quick=quick)
            rf = compare({k: (lambda g=g: _ready(g(*xs))) for k, g in fwd.items()}, quick=quick)
            rows.append({"caller": "jax", "callee": callee, "same_bits": bool(same and same_fwd),
                         "forward_backward": r, "forward": rf})
            log(f"  bridged under jax.jit -> {callee:<10} fwd+bwd {r['bridge']['best'] * 1e6:8.1f} us vs "
                f"{r['hand-written']['best'] * 1e6:8.1f} us; fwd {rf['bridge']['best'] * 1e6:7.1f} us vs "
                f"{rf['hand-written']['best'] * 1e6:7.1f} us{'' if same and same_fwd else '  (BITS DIFFER)'}")
        return rows


def _flat(x):
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [x]


def _bits(x) -> np.ndarray:
    return np.asarray(bb.convert(x, "numpy", copy=True, on_grad="drop")).view(np.uint16)


# -- 4. where each peer fails ------------------------------------------------------------------


def peer_failures(log) -> list[dict]:
    """torch_jax_interop, the raw DLPack calls and the bridge, on bf16 inputs of each layout:
    whether each works, keeps the bits and shares memory, or what it raises."""
    ml, torch, jax, jnp, tf = _mods()
    peers, peer_error = _interop()
    tools = _peer_tools(peers)
    rows = []
    for case, t in _peer_cases().items():
        want = t.contiguous().view(torch.int16).numpy().view(np.uint16)
        for tool, fns in tools.items():
            for direction, fn in fns.items():
                if direction[0] == "jax" and case != "contiguous, 64-byte aligned":
                    continue  # the same compact jax array as the first case: nothing new
                # jax -> torch starts from the bridge's own jax copy of the layout (jax arrays are
                # always compact; a sliced or transposed case is the same array made compact)
                x = t if direction[0] == "torch" else jnp.asarray(bb.convert(t.contiguous(), "numpy"))
                rows.append(_peer_row({"case": case, "tool": tool, "direction": " -> ".join(direction)}, fn, x, want))
    if peer_error:
        rows.append({"case": "import", "tool": "torch_jax_interop", "direction": "", "ok": False,
                     "result": peer_error})
    for r in rows:
        log(f"  peers {r['tool']:>18} {r['direction']:>14} {r['case']:<30} {r['result']}")
    return rows


def _peer_cases() -> dict:
    """The bf16 torch tensors of each layout the peers are tried on."""
    torch = _mods()[1]
    src = torch.from_numpy(sample(2 * 64 * 66).view(np.uint16)).view(torch.bfloat16).reshape(64, 66)
    return {
        "contiguous, 64-byte aligned": src[:, :64].contiguous(),
        "unaligned (offset 2 bytes)": src.reshape(-1)[1:4097],
        "sliced (every other column)": src[:, ::2],
        "transposed": src[:, :64].contiguous().T,
    }


def _peer_tools(peers: dict | None) -> dict[str, dict]:
    """Each tool's call for each direction tried: {tool: {(source, target): call}}."""
    ml, torch, jax, jnp, tf = _mods()
    tools = {
        "bf16bridge": {("torch", "jax"): lambda t: bb.convert(t, "jax"),
                       ("torch", "tensorflow"): lambda t: bb.convert(t, "tensorflow"),
                       ("torch", "numpy"): lambda t: bb.convert(t, "numpy"),
                       ("jax", "torch"): lambda j: bb.convert(j, "torch", on_alias="allow")},
        "raw DLPack": {("torch", "jax"): jnp.from_dlpack,
                       ("torch", "tensorflow"): lambda t: tf.experimental.dlpack.from_dlpack(t.__dlpack__()),
                       ("torch", "numpy"): lambda t: np.from_dlpack(t.view(torch.uint16)).view(ml.bfloat16),
                       ("jax", "torch"): torch.from_dlpack},
        "the framework's own call": {("torch", "jax"): jnp.asarray, ("torch", "tensorflow"): tf.convert_to_tensor,
                                     ("torch", "numpy"): lambda t: t.numpy(), ("jax", "torch"): torch.asarray},
    }
    if peers:
        tools["torch_jax_interop"] = peers
    return tools


# tensorflow imports an unaligned buffer, and its first kernel on it aborts the process (FACTS.md)
_NEVER = {("raw DLPack", "torch -> tensorflow", "unaligned (offset 2 bytes)"):
          "not run: tensorflow imports it and its first kernel aborts the process (Check failed: IsAligned())"}


def _peer_row(row: dict[str, Any], fn, x, want: np.ndarray) -> dict[str, Any]:
    """``row`` with what ``fn(x)`` did: whether it kept the bits ``want`` and shared memory, or what it raised."""
    never = _NEVER.get((row["tool"], row["direction"], row["case"]))
    if never is not None:
        return {**row, "ok": None, "result": never}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = _ready(fn(x))
        bits = _bits(y)
        row["ok"] = bool(np.array_equal(bits, want))
        row["zero_copy"] = _ptr(x) == _ptr(y)
        row["result"] = ("bits kept" if row["ok"] else "BITS CHANGED") + (
            ", zero-copy" if row["zero_copy"] else ", copied")
    except Exception as err:  # noqa: BLE001 - the point is to record what each raises
        row["ok"] = False
        row["result"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
    return row


def _ptr(x) -> int | None:
    try:
        from bf16bridge.core import registry

        return registry.get(registry.framework_of(x)).data_ptr(x)
    except Exception:  # noqa: BLE001
        return None


def code_version() -> str:
    """The commit measured, and whether the package had changes not yet committed."""
    import subprocess
    from pathlib import Path

    pkg = Path(__file__).resolve().parent.parent  # the bf16bridge package folder
    try:
        # an installed copy inside some other checkout is not that checkout's code
        subprocess.run(["git", "ls-files", "--error-unmatch", "__init__.py"], cwd=pkg, capture_output=True,
                       check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=pkg, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"commit {head}" + (" with uncommitted changes in bf16bridge/" if dirty else "")


def run(quick: bool, log=print) -> dict:
    from bf16bridge.core import registry

    for name in registry.names():
        registry.get(name)
    log("functions: convert 1 KiB against the raw calls and torch_jax_interop")
    conv = bench_convert(quick, log)
    log("functions: convert_tree of a GPT-2-small-shaped state dict")
    tree = bench_tree(quick, log)
    log("functions: bridged functions against hand-written wrappers")
    fns = bench_bridged(quick, log)
    log("functions: bridged functions under jax.jit against hand-written pure_callback wrappers")
    fns_jit = bench_bridged_jit(quick, log)
    log("functions: a torch MLP step with a jax loss: bridged, jitted by hand, torch_jax_interop")
    _, torch, jax, jnp, _ = _mods()
    mlp = bench_mlp_step(quick, log, compare, torch, jax, jnp)
    log("functions: where each peer fails")
    peers = peer_failures(log)
    return {"mode": "quick" if quick else "full", "machine": machine(), "code": code_version(), "timing": {
        "budget_s": QUICK_BUDGET_S if quick else BUDGET_S, "min_rounds": QUICK_MIN_ROUNDS if quick else MIN_ROUNDS,
        "judged_on": "best"}, "convert": conv, "tree": tree, "bridged": fns, "bridged_jit": fns_jit,
        "mlp_step": mlp, "peers": peers}
