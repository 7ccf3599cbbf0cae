"""python -m bf16bridge.bench.shards [--quick] [--out FILE]

A bf16 jax array of 256 MiB sharded over 8 host devices becomes per-shard torch tensors, three
ways, in one run (issue 12):

- ``bb.convert_shards(x, "torch")``: shard by shard, zero-copy;
- a hand loop, ``[torch.from_dlpack(s.data) for s in x.addressable_shards]``: zero-copy too,
  without indices, replicas, checks or the layout: the floor for per-shard work (the target,
  ``report_parts.shard_targets``: convert_shards at most 1.2x it);
- ``np.asarray(x)``: a gather into one host copy, what most code does (timed on a fresh array
  over the same buffers each time, since jax keeps an array's host copy once made; the cost of
  that rewrapping is measured too, as ``rewrap``);

and back: ``bb.from_shards(shards, "jax", sharding=x.sharding)`` against a hand
``jax.make_array_from_single_device_arrays`` over the shards' buffers. A memcpy of the same bytes
is measured beside them. Then the same bytes replicated twice (a (4, 2) mesh, ``P('x', None)``):
``from_shards`` and ``convert_shards(replicas="one")``, which compare each index's replicas bit
for bit, against the same calls with ``compare_replicas=False``: what the comparison costs. Every
claim is a ratio of times measured in the same process (the machine is shared and noisy); results,
with the peak memory each way adds, go to benchmarks/results/shards.json (``--quick``: 1 MiB, to
benchmarks/results/shards-quick.json; installed, to ./bf16bridge-bench/: bf16bridge/bench/paths.py).

jax must see 8 devices, so this sets ``XLA_FLAGS`` before it imports jax: run it as its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEVICES = 8
if "jax" not in sys.modules:  # XLA reads the flag once, when jax starts (run() checks it was read)
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               f"--xla_force_host_platform_device_count={DEVICES}").strip()

import numpy as np  # noqa: E402

import bf16bridge as bb  # noqa: E402

from .functions import code_version  # noqa: E402
from .harness import MiB, machine, measure, memcpy_floor, peak_extra_bytes, sample  # noqa: E402
from .paths import results_dir  # noqa: E402

SIZE = {"full": 256 * MiB, "quick": 1 * MiB}


def _ratio(a: dict, b: dict) -> float:
    return a["median"] / b["median"]


def _mesh(shape: tuple, axes: tuple):
    """jax's devices as a mesh of ``shape``: jax.make_mesh, or where this jax has none (0.4.30, the
    oldest declared) jax.sharding.Mesh over the first devices."""
    import jax
    from jax.sharding import Mesh

    if hasattr(jax, "make_mesh"):
        return jax.make_mesh(shape, axes)
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), axes)


def _sharded(host) -> dict:
    """The calls timed on ``host`` sharded over every device, P('x', None), each checked first: every
    shard the same buffer, every bit kept."""
    import jax
    import torch
    from jax.sharding import NamedSharding, PartitionSpec

    x = jax.device_put(host, NamedSharding(_mesh((DEVICES,), ("x",)), PartitionSpec("x", None)))
    x.block_until_ready()
    buffers = [s.data for s in x.addressable_shards]

    def rewrap():
        return jax.make_array_from_single_device_arrays(x.shape, x.sharding, buffers)

    got = bb.convert_shards(x, "torch", on_alias="allow")
    for s, a, t in zip(got, x.addressable_shards, [torch.from_dlpack(s.data) for s in x.addressable_shards]):
        assert s.tensor.data_ptr() == t.data_ptr() == a.data.unsafe_buffer_pointer()
        assert np.array_equal(s.tensor.view(torch.int16).numpy().view(np.uint16),
                              np.asarray(host).view(np.uint16)[s.index])

    def back_hand():
        views = [jax.device_put(s.tensor.view(torch.int16).numpy().view(host.dtype), a.device)
                 for s, a in zip(got, x.addressable_shards)]
        return jax.make_array_from_single_device_arrays(x.shape, x.sharding, views)

    y = bb.from_shards(got, "jax", sharding=x.sharding, copy=False)
    assert all(a.data.unsafe_buffer_pointer() == s.tensor.data_ptr() for a, s in zip(y.addressable_shards, got))
    return {"convert_shards": lambda: bb.convert_shards(x, "torch", on_alias="allow"),
            "hand_loop": lambda: [torch.from_dlpack(s.data) for s in x.addressable_shards],
            # a new array over the same buffers each time: jax keeps an array's host copy once made
            "np_asarray": lambda: np.asarray(rewrap()), "rewrap": rewrap,
            "from_shards": lambda: bb.from_shards(got, "jax", sharding=x.sharding, copy=False),
            "hand_assemble": back_hand, "shards": len(got)}


def _replicated(host) -> dict:
    """The same array over a (4, 2) mesh, P('x', None): 4 indices, 2 replicas each, each replica a
    buffer of its own (device_put of one aligned host array would alias it, and replicas over one
    buffer are not read). What comparing the replicas costs (it reads both of each pair), against
    the same calls told not to compare (compare_replicas=False)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    rsharding = NamedSharding(_mesh((DEVICES // 2, 2), ("x", "y")), PartitionSpec("x", None))
    places = rsharding.addressable_devices_indices_map(host.shape)
    xr = jax.make_array_from_single_device_arrays(
        host.shape, rsharding, [jax.device_put(np.array(host[idx]), dev) for dev, idx in places.items()])
    xr.block_until_ready()
    assert len({s.data.unsafe_buffer_pointer() for s in xr.addressable_shards}) == DEVICES
    got_r = bb.convert_shards(xr, "torch", on_alias="allow")
    assert len(got_r) == DEVICES and {s.replica for s in got_r} == {0, 1}

    def back_replicated(compare=True):
        return bb.from_shards(got_r, "jax", sharding=xr.sharding, copy=False, compare_replicas=compare)

    def one_replicated(compare=True):
        return bb.convert_shards(xr, "torch", replicas="one", on_alias="allow", compare_replicas=compare)

    yr = back_replicated()
    assert all(a.data.unsafe_buffer_pointer() == s.tensor.data_ptr() for a, s in zip(yr.addressable_shards, got_r))
    return {"from_shards_replicated": back_replicated,
            "from_shards_replicated_unchecked": lambda: back_replicated(False),
            "convert_shards_one": one_replicated, "convert_shards_one_unchecked": lambda: one_replicated(False)}


def _ratios(times: dict) -> dict:
    return {
        "convert_shards / hand_loop": _ratio(times["convert_shards"], times["hand_loop"]),
        "np_asarray / convert_shards": _ratio(times["np_asarray"], times["convert_shards"]),
        "np_asarray / memcpy": _ratio(times["np_asarray"], times["memcpy"]),
        "from_shards / hand_assemble": _ratio(times["from_shards"], times["hand_assemble"]),
        "replicated from_shards: compared / compare_replicas=False":
            _ratio(times["from_shards_replicated"], times["from_shards_replicated_unchecked"]),
        "replicated convert_shards one: compared / compare_replicas=False":
            _ratio(times["convert_shards_one"], times["convert_shards_one_unchecked"]),
        "replicated from_shards: compared / memcpy": _ratio(times["from_shards_replicated"], times["memcpy"]),
    }


def run(quick: bool, log=print) -> dict:
    import jax

    if len(jax.devices()) != DEVICES:
        raise SystemExit(f"jax sees {len(jax.devices())} devices, not {DEVICES}: jax was imported before "
                         "bf16bridge.bench.shards could set XLA_FLAGS; run it as its own process")
    mode = "quick" if quick else "full"
    nbytes = SIZE[mode]
    host = sample(nbytes).reshape(-1, 16384 if not quick else 512)
    log(f"{mode}: a {host.shape} bf16 array ({nbytes / MiB:.0f} MiB) over {DEVICES} devices, P('x', None)")
    calls = _sharded(host)
    shards = calls.pop("shards")
    rep = _replicated(host)
    times = {k: measure(fn) for k, fn in calls.items()}
    times["memcpy"] = memcpy_floor(nbytes)
    times.update({k: measure(fn) for k, fn in rep.items()})
    for k, v in times.items():
        log(f"  {k}: median {v['median'] * 1e6:.1f} us (best {v['best'] * 1e6:.1f}, n={v['n']})")
    ratios = _ratios(times)
    for k, q in ratios.items():
        log(f"  {k}: {q:.2f}x")
    peak = {"convert_shards": peak_extra_bytes(calls["convert_shards"]),
            "np_asarray": peak_extra_bytes(calls["np_asarray"]),
            "from_shards_replicated": peak_extra_bytes(rep["from_shards_replicated"])}
    log(f"  peak extra memory: {', '.join(f'{k} {v / MiB:.1f} MiB' for k, v in peak.items() if v is not None)}")
    return {
        "mode": mode, "machine": machine(), "code": code_version(), "nbytes": nbytes, "shape": list(host.shape),
        "devices": DEVICES, "sharding": "P('x', None) over a mesh of 8 cpu devices", "shards": shards,
        "replicated": "the same array, P('x', None) over a (4, 2) mesh: 4 indices, 2 replicas each, each replica "
                      "a buffer of its own",
        "times": times, "ratios": ratios, "peak_extra_bytes": peak,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bf16bridge.bench.shards", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 MiB instead of 256 MiB (the smoke test)")
    ap.add_argument("--out", type=Path, help="the JSON file to write")
    args = ap.parse_args(argv)
    name = "shards-quick.json" if args.quick else "shards.json"
    out = args.out or results_dir() / name
    result = run(args.quick, log=lambda s: print(s, flush=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    os._exit(code)  # torch and jax together have crashed at interpreter exit here (docs/FACTS)
