"""run(): the same computation in each framework, from the same bf16 bits, against float64."""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import replace

import numpy as np

from bf16bridge.adapters.hooks import NumericsHooks
from bf16bridge.core import dtypes
from bf16bridge.core.convert import convert
from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import against, metrics
from bf16bridge.parity.compare import compare
from bf16bridge.parity.ops import OPS, Op
from bf16bridge.parity.policies import DEFAULT_POLICY


def default_frameworks() -> list[str]:
    """The registered frameworks that compute (adapter attribute ``computes``): the ones the
    built-in ops run in. Asks each adapter, which imports its framework; one that cannot
    be imported here is kept, so that a run asked of it reports it as not run."""
    from bf16bridge.core import registry
    from bf16bridge.errors import FrameworkNotInstalledError

    out = []
    for name in registry.names():
        try:
            if registry.hooks(name, NumericsHooks).computes:
                out.append(name)
        except FrameworkNotInstalledError:
            out.append(name)
    return out


def settings(frameworks) -> dict:
    """What changes numerics, recorded with each report: the machine, and each framework's
    own settings (its adapter's ``numerics()``), asked only of frameworks already imported."""
    from bf16bridge.core import registry
    from bf16bridge.capabilities.probing import probe
    from bf16bridge.errors import FrameworkNotInstalledError

    caps = probe()
    out = {"cpu_bf16": caps.cpu.why, "cores": caps.cpu.cores, "numpy": caps.numpy.version}
    for name in frameworks:
        fw = caps.frameworks.get(name)
        out[f"{name}_version"] = fw.version if fw else None
    for name in frameworks:
        s = registry.spec(name)
        if sys.modules.get(s.requires or name) is not None:  # None: an import that was blocked
            try:
                out.update(registry.hooks(name, NumericsHooks).numerics())
            except FrameworkNotInstalledError:  # imported, yet its adapter cannot load: run() says why
                pass
    return out


def run(op, inputs: dict | None = None, frameworks=None, *, policy=DEFAULT_POLICY, kind: str | None = None,
        seed: int = 0, allow_missing: bool = False, **params: int):
    """Run ``op`` (a built-in name or an Op) in each framework on identical bf16 inputs.

    ``frameworks``: names (default: every registered framework that computes, see
    default_frameworks()). Inputs are made from ``seed`` and ``kind`` (normal, wide,
    cancel, ties; "all" for the unary ops' exhaustive inputs) unless given as {name: bf16
    numpy array}. Each framework gets the same bits through the bridge; the float64
    reference is computed from the same bits. Returns the Report of compare(). A framework
    that cannot run the op is recorded in ``report.settings["not run"]`` and fails the
    report unless ``allow_missing=True``. Ops run over every input value also get
    ``report.worst_regions``.
    """
    from bf16bridge.core import registry

    if isinstance(op, str) and op not in OPS:
        raise InvalidArgumentError(f"unknown op {op!r}; built-in ops: {', '.join(OPS)}")
    o: Op = OPS[op] if isinstance(op, str) else op
    frameworks = [registry.resolve(f) for f in (default_frameworks() if frameworks is None else frameworks)]
    if not frameworks:
        raise InvalidArgumentError(f"run {o.name}: no frameworks to run it in; name two or more "
                                   f"(or leave frameworks= out: {', '.join(default_frameworks())})")
    _check_sizes([o], params)
    p = {**o.params, **params}
    kind = kind or o.kinds[0]
    if kind not in o.kinds:
        raise InvalidArgumentError(f"{o.name} takes the input kinds {', '.join(o.kinds)}; got {kind!r}")
    made = o.inputs(np.random.default_rng(seed), kind, p)
    if inputs is None:
        inputs = made
    elif sorted(inputs) != sorted(made):
        raise InvalidArgumentError(f"{o.name} takes the inputs {', '.join(sorted(made))} ({{name: bf16 array}}); "
                                   f"got {', '.join(map(str, sorted(inputs))) or 'none'}")
    wide = {k: metrics.to_float64(v) for k, v in inputs.items()}
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # exp(88.7) = inf is the answer
        ref = o.reference(**wide, **p)
        cond = o.condition(**wide, **p) if o.condition else None
    results, failed = {}, {}
    for fw in frameworks:
        fn = o.impl.get(fw)
        if fn is None:
            failed[fw] = "no definition of this op"
            continue
        try:
            args = {k: convert(v, fw, copy=True) for k, v in inputs.items()}
            y = fn(**args, **p)
            results[fw] = np.array(convert(y, "numpy"))  # own the memory: the framework may reuse its buffer
        except Exception as err:  # noqa: BLE001 - a framework that cannot run the op is reported, not fatal
            failed[fw] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    label = o.name + "".join(f" {k}={v}" for k, v in params.items()) + f" [{kind}]"
    s = settings(frameworks)
    if failed:
        s["not run"] = failed
    data = {"results": {k: _pack(v) for k, v in results.items()}, "reference": _pack(ref),
            "condition": _pack(cond) if cond is not None else None}
    if kind == "all" and len(inputs) == 1:  # every input value: say where the errors live
        data.update(_elementwise(o, inputs, p))
    return _judge(results, data, policy, label, s, allow_missing)


def _elementwise(o: Op, inputs: dict, p: dict) -> dict:
    """What a run over every input value saves beside its results: the input, and the reference at
    the input with its subnormal elements flushed to zero (what a framework that flushes subnormal
    inputs computes, which rounding(k) explains)."""
    (name, x), = inputs.items()
    out = {"input": _pack(x)}
    flushed, sub = against.flush_subnormal(x)
    if sub.any():
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            out["flushed"] = _pack(np.asarray(o.reference(**{name: flushed}, **p), dtype=np.float64))
    return out


def _judge(results, data, policy, label, s, allow_missing):
    ref = _unpack(data["reference"])
    cond = _unpack(data["condition"]) if data.get("condition") else None
    x = _unpack(data["input"]) if data.get("input") else None
    flushed = data.get("flushed")  # (none: no subnormal input, or results saved before it was kept)
    rep = compare(results, reference=ref if x is None or not flushed else _saved_reference(x, ref, flushed),
                  condition=cond, inputs=x, policy=policy, op=label, settings=s, not_run=s.get("not run"),
                  allow_missing=allow_missing)
    return replace(rep, data=data)


def _saved_reference(x: np.ndarray, ref: np.ndarray, flushed: dict):
    """An elementwise op's reference as the function of its inputs compare() calls: at the inputs, and
    at them with their subnormal elements flushed to zero, both saved with the results (a recheck runs
    nothing)."""
    at = {metrics.to_float64(x).tobytes(): ref, against.flush_subnormal(x)[0].tobytes(): _unpack(flushed)}
    return lambda v: at[np.ascontiguousarray(v, dtype=np.float64).tobytes()]


def _check_sizes(ops: list, params: dict) -> None:
    """Refuse a size no op of the run takes (it would be dropped, and the run would not be the one
    asked for) and one that is not a whole number >= 1."""
    known = {k for o in ops for k in o.params}
    unknown = sorted(k for k in params if k not in known)
    bad = sorted(k for k, v in params.items()
                 if k in known and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1))
    if unknown or bad:
        raise InvalidArgumentError(
            (f"no op of this run has the size {', '.join(unknown)}" if unknown
             else f"a size is a whole number >= 1; got {', '.join(f'{k}={params[k]!r}' for k in bad)}")
            + "; the sizes each op takes: " + "; ".join(f"{o.name} {', '.join(o.params) or '(none)'}" for o in ops))


#: matmul's sweep over the inner dimension K
MATMUL_K = (16, 256, 4096)


def suite(frameworks=None, *, ops=None, policy=DEFAULT_POLICY, seed=0, params: dict | None = None,
          allow_missing: bool = False) -> list:
    """The built-in cases: every op with each of its input kinds, and matmul over a sweep of K.

    ``params`` (e.g. {"k": 1024, "rows": 128}) set the sizes of the ops that have them;
    a given "k" replaces matmul's sweep.
    """
    params = params or {}
    frameworks = default_frameworks() if frameworks is None else frameworks
    for name in ops or OPS:
        if name not in OPS:
            raise InvalidArgumentError(f"unknown op {name!r}; built-in ops: {', '.join(OPS)}")
    _check_sizes([OPS[name] for name in ops or OPS], params)
    reports = []
    for name in ops or OPS:
        o = OPS[name]
        own = {k: v for k, v in params.items() if k in o.params}
        sweep = [{"k": k} for k in MATMUL_K] if name == "matmul" and "k" not in own else [{}]
        for extra in sweep:
            for kind in o.kinds:
                sizes: dict[str, int] = {**own, **extra}  # only the op's own size names (o.params)
                reports.append(run(o, frameworks=frameworks, policy=policy, kind=kind, seed=seed,
                                   allow_missing=allow_missing, **sizes))  # type: ignore[arg-type]
    return reports


def _pack(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "bits": base64.b64encode(a.tobytes()).decode()}


def _unpack(d: dict) -> np.ndarray:
    dt = dtypes.numpy_dtype(d["dtype"]) if d["dtype"] == "bfloat16" else np.dtype(d["dtype"])
    return np.frombuffer(base64.b64decode(d["bits"]), dtype=dt).reshape(d["shape"]).copy()


def dumps(reports) -> str:
    out = []
    for r in reports:
        d = r.to_dict()
        d["data"] = r.data
        out.append(d)
    return json.dumps(out, indent=1, default=str)


def recheck(path, policy, *, allow_missing: bool = False):
    """Judge saved results again under another policy, running nothing.

    ``path``: a file written by ``bf16bridge parity --format json`` (or ``dumps``); one that
    cannot be read, or holds something else, is refused with InvalidArgumentError."""
    how = "save results with 'bf16bridge parity --format json --output FILE' (or runner.dumps)"
    try:
        with open(path) as f:
            saved = json.load(f)
    except OSError as err:
        raise InvalidArgumentError(f"recheck {path}: cannot read it ({err.strerror or err}); {how}") from err
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidArgumentError(f"recheck {path}: not JSON ({err}); {how}") from err
    if not isinstance(saved, list) or not all(isinstance(d, dict) for d in saved):
        raise InvalidArgumentError(f"recheck {path}: not a list of parity reports; {how}")
    reports = []
    for d in saved:
        data = d.get("data")
        if not data:
            raise InvalidArgumentError(f"recheck {path}: a report without its results ({d.get('op')}); {how}")
        try:
            results = {k: _unpack(v) for k, v in data["results"].items()}
            _unpack(data["reference"])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InvalidArgumentError(f"recheck {path}: the results of {d.get('op')} are damaged "
                                       f"({type(err).__name__}: {err}); {how}") from err
        reports.append(_judge(results, data, policy, d.get("op"), d.get("settings", {}), allow_missing))
    return reports
