"""``bb.parity.trace(..., grads=True)``: each parameter's gradient, by each framework's own autodiff, of
the same scalar (the output times a fixed random cotangent, bf16 values so every dtype holds them
exactly; or the user's loss), judged as the layers are: against the float64 copy's gradient, the first
side's own error the yardstick, or the two sides against each other."""

from __future__ import annotations

import numpy as np

from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import metrics
from bf16bridge.parity.tracing import judge
from bf16bridge.parity.tracing.names import pair_params
from bf16bridge.parity.tracing.report import GradRow
from bf16bridge.parity.tracing.run import Side, float_leaves


def cotangent(shape: tuple, seed: int) -> np.ndarray:
    """A fixed random cotangent of ``shape``: normal values rounded to bf16, as float32 (exact in every dtype)."""
    x = np.random.default_rng(seed).standard_normal(shape)
    return metrics.to_float64(metrics.rounded(x, "bfloat16")).astype(np.float32)


def _losses(loss, first_is_a: bool) -> tuple:
    if loss is None:
        return None, None
    if not (isinstance(loss, (tuple, list)) and len(loss) == 2 and all(callable(f) for f in loss)):
        raise InvalidArgumentError("trace: loss= is a pair (loss_a, loss_b), each a function of its model's output "
                                   f"giving a scalar in that model's framework; got {type(loss).__name__}")
    return (loss[0], loss[1]) if first_is_a else (loss[1], loss[0])


def _grads(side: Side, cot: np.ndarray, loss) -> tuple[list, dict, dict]:
    """(names in order, {name: parameter as numpy}, {name: gradient as numpy or None})."""
    found = side.hooks.gradients(side.model, side.args, cot, loss)
    names = [n for n, _, _ in found]
    params = {n: metrics.ensure_numpy(p) for n, p, _ in found}
    grads = {n: None if g is None else metrics.ensure_numpy(g) for n, _, g in found}
    return names, params, grads


def gradients(first: Side, judged: Side, ref: Side | None, output, *, k: float, loss, grad_pairs, rename, seed: int,
              depth: int) -> dict:
    """The gradient rows of the report, the divergence among them, and the parameters left unpaired."""
    leaves = float_leaves(output)
    if not leaves and loss is None:
        raise InvalidArgumentError("trace: grads=True, but the model's output holds no floating tensor: pass loss=")
    cot = cotangent(tuple(leaves[0][1].shape), seed) if leaves else np.zeros(0, np.float32)
    loss_first, loss_judged = _losses(loss, first.is_a)
    f_names, f_params, f_grads = _grads(first, cot, loss_first)
    j_names, j_params, j_grads = _grads(judged, cot, loss_judged)
    r_grads = _grads(ref, cot, loss_first)[2] if ref is not None else None
    fa = [(n, f_params[n]) for n in f_names]
    ja = [(n, j_params[n]) for n in j_names]
    a_list, b_list = (fa, ja) if first.is_a else (ja, fa)
    pairs, ua, ub = pair_params(a_list, b_list, pairs=grad_pairs, rename=rename)
    rms = [float(np.sqrt(np.mean(metrics.to_float64(g) ** 2))) for g in f_grads.values() if g is not None and g.size]
    floor = float(np.median(rms)) if rms else 0.0
    rows = []
    for na, nb, transposed in pairs:
        fn, jn = (na, nb) if first.is_a else (nb, na)
        verdict = _judge(f_grads[fn], j_grads[jn], None if r_grads is None else r_grads.get(fn), transposed,
                         depth, k, floor)
        rows.append(GradRow(na, nb, tuple(dict(a_list)[na].shape), transposed, verdict))
    failing = [r for r in rows if not r.passed]
    return {"grads": tuple(rows), "grad_divergence": failing[-1] if failing else None,
            "grads_unpaired_a": tuple(ua), "grads_unpaired_b": tuple(ub)}


def _judge(mine, theirs, ref, transposed: bool, depth: int, k: float, floor: float) -> judge.Verdict:
    if mine is None or theirs is None:
        v = judge.mismatched((), ())
        side = "either side" if mine is None and theirs is None else "one side only"
        return judge.Verdict(**{**v.__dict__, "why": f"no gradient reaches this parameter on {side}"})
    if transposed:
        theirs = np.ascontiguousarray(theirs.T)
    if theirs.shape != mine.shape:
        return judge.mismatched(tuple(theirs.shape), tuple(mine.shape))
    if ref is not None:
        r64 = metrics.to_float64(ref)
        return judge.against(theirs, r64, judge.measure(mine, r64, k), depth, k)
    return judge.between(mine, theirs, depth, k, floor)
