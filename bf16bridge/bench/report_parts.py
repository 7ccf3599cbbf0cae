"""The sections of the parts run alone (narrow dtypes, checkpoints, shards, narrow kernels, casting):
their targets and their markdown, each from its saved JSON."""

from __future__ import annotations

from bf16bridge.core.text import table

from .harness import SIZES
from .units import ratio as _ratio, secs as _t, size as _b, times_cell as _times_cell, times_x as _x


# -- the parts run alone (bf16bridge bench --only dtypes|checkpoints|shards), each from its saved JSON

PARTS = ("dtypes", "checkpoints", "shards", "kernels", "casting")
#: how each part is named in the heading of the targets' table
PART_TITLES = {"dtypes": "narrow dtypes", "checkpoints": "checkpoints", "shards": "shards",
               "kernels": "narrow kernels", "casting": "casting"}
#: what the columns of each part's log mean (bf16bridge bench prints those of the parts it runs)
PART_COLUMNS = {
    "dtypes": (("bf16", "dtypes: bb.convert of a bf16 tensor of the same bytes for the same pair, beside the "
                        "narrow dtype's bridge"),
               ("hand unpacking", "dtypes: torch's packed fp4 unpacked by hand, the workaround there")),
    "checkpoints": (("first, load", "checkpoints: open + first tensor, and the whole load, in a fresh process "
                                    "each; peak extra: the RSS the load adds"),),
    "shards": (("median, best, n", "shards: of n calls; a ratio (x) is of medians"),),
    "kernels": (("to_dtype, to_float32", "kernels: ours (threads=1: on one thread), the fastest call; beside "
                                         "ml_dtypes astype and torch .to(); (differs): not ml_dtypes' bits"),),
    "casting": (("cast_tree, cast_module", "casting: ours, the fastest call, beside the hand loop, the tree map "
                                           "and module.to; same bits: against that loop"),),
}
CKPT_RSS_SHARE = 0.05
#: the framework each safetensors loader fills, and the route people use where it fails
CKPT_PEERS = {"numpy": ("safetensors.numpy", "safetensors.torch + .float().numpy()"),
              "torch": ("safetensors.torch", None), "jax": ("safetensors.flax", None),
              "tensorflow": ("safetensors.tensorflow", None)}


def _ckpt_ref(results: dict, fw: str):
    """The loader a bb.load into ``fw`` is judged against: safetensors' own, or where that fails the
    float32 route; (name, its row, why) or None where both fail."""
    own, fallback = CKPT_PEERS[fw]
    if "error" not in results.get(own, {"error": "not run"}):
        return own, results[own], ""
    if fallback and "error" not in results.get(fallback, {"error": "not run"}):
        return fallback, results[fallback], f" ({own} fails: {results[own]['error']})"
    return None


def part_targets(parts: dict) -> list[tuple[str, bool, str]]:
    """The targets of the parts that have saved results: (what, met?, the measured numbers)."""
    out: list[tuple[str, bool, str]] = []
    ck = parts.get("checkpoints")
    if ck:
        res, size = ck["results"], ck["nbytes"]
        for key, what in (("load_s", "full load"), ("first_s", "open + first tensor")):
            for fw in CKPT_PEERS:
                ours = res.get(f"bb.load {fw}", {"error": "not run"})
                ref = _ckpt_ref(res, fw)
                if "error" in ours:
                    out.append((f"checkpoint {what} into {fw}: no slower than safetensors'", False,
                                f"bb.load fails: {ours['error']}"))
                    continue
                if ref is None:
                    out.append((f"checkpoint {what} into {fw}: no slower than safetensors'", True,
                                f"{_t(ours[key])}; every safetensors loader for {fw} fails on the file"))
                    continue
                name, r, why = ref
                out.append((f"checkpoint {what} into {fw}: no slower than {name}", ours[key] <= r[key],
                            f"{_t(ours[key])} vs {_t(r[key])} ({_x(ours[key] / r[key])}){why}"))
        for name in ck["zero_copy"]:
            r = res.get(name, {"error": "not run"})
            if "error" in r:
                out.append((f"checkpoint: peak extra RSS of {name} (zero-copy) under 5% of the file", False, r["error"]))
                continue
            share = r["peak_load"] / size
            out.append((f"checkpoint: peak extra RSS of {name} (zero-copy) under 5% of the file",
                        share < CKPT_RSS_SHARE, f"{_b(r['peak_load'])} of {_b(size)} ({share:.1%})"))
        many = ck.get("many")  # open + first tensor of a file of many small tensors (results before it: none)
        for fw in ("numpy", "torch") if many else ():
            what = (f"checkpoint open + first tensor, {many['tensors']}-tensor header, into {fw}: no slower than "
                    f"safetensors.{fw}")
            ours, ref = many["results"][f"bb.load {fw}"], many["results"][f"safetensors.{fw}"]
            if "error" in ours or "error" in ref:
                out.append((what, "error" not in ours, f"bb fails: {ours['error']}" if "error" in ours else
                            f"{_t(ours['first_s'])}; safetensors.{fw} fails: {ref['error']}"))
                continue
            out.append((what, ours["first_s"] <= ref["first_s"],
                        f"{_t(ours['first_s'])} vs {_t(ref['first_s'])} ({_x(ours['first_s'] / ref['first_s'])})"))
    # -- narrow dtypes (bf16bridge/bench/dtypes.py)
    if parts.get("dtypes"):
        out += dtype_targets(parts["dtypes"])
    if parts.get("kernels"):
        out += kernel_targets(parts["kernels"])
    if parts.get("casting"):
        out += casting_targets(parts["casting"])
    # -- shards (bf16bridge/bench/shards.py)
    if parts.get("shards"):
        out += shard_targets(parts["shards"])
    return out


def _left_out(part: dict) -> list[str]:
    """A part's dtypes left out in the run (this ml_dtypes lacks them), each with why."""
    if not part.get("left_out"):
        return []
    return ["", "Left out in this run: " + "; ".join(f"{r['dtype']} ({r['why']})" for r in part["left_out"]) + "."]


#: torch's packed fp4 into numpy and jax (unpacked, a copy) against the hand unpacking of its nibbles,
#: at every size: its per-call cost may add this much at 1 KiB (issue 31)
FP4_RATIO = 1.5


def dtype_targets(dt: dict) -> list[tuple[str, bool, str]]:
    """The narrow dtypes part: torch's packed fp4 through the bridge within FP4_RATIO of the hand
    unpacking, with its bits, in medians of calls alternated with it (results saved before judged alike)."""
    out = []
    for r in dt["rows"]:
        if r["dtype"] != "float4_e2m1fn_x2":
            continue
        b, w = r["bridge"], r["workaround"]
        ratio = b["median"] / w["median"]
        out.append((f"{r['dtype']} {r['source']} -> {r['target']} at {r['size']}: at most {FP4_RATIO:g}x the "
                    "hand unpacking, same bits", ratio <= FP4_RATIO and w["same_bits"],
                    f"{_x(ratio)} ({_t(b['median'])} vs {_t(w['median'])}, medians"
                    + (f"; fastest calls {_t(b['best'])} vs {_t(w['best'])}" if "best" in b and "best" in w else "")
                    + ")" + ("" if w["same_bits"] else "; the bits differ")))
    return out


def _dtypes_markdown(dt: dict) -> list[str]:
    lines = ["", "## Narrow dtypes beside bf16 (fp8, fp4)", "",
             f"Written by `bf16bridge bench{' --quick' if dt['mode'] == 'quick' else ''} --only dtypes` on "
             f"{dt['machine']['when']} (`benchmarks/results/dtypes{'-quick' if dt['mode'] == 'quick' else ''}.json`). "
             "Per ordered pair, in one run: `bb.convert` of the narrow tensor, `bb.convert` of a bf16 tensor of "
             "the same bytes for the same pair, and the usual workaround (widen to float32 in the source, move "
             "the float32, narrow in the target; for torch's packed fp4, the hand unpacking of the nibbles). "
             "Ratios are the other's median over the bridge's: above 1, the bridge is faster (fp4: the bridge and "
             "the hand unpacking alternate call by call). Copies: from "
             "`bb.plan`. Same bits: the workaround's result against the input, bit for bit.", *_left_out(dt)]
    for label in dt["sizes"]:
        rows = [r for r in dt["rows"] if r["size"] == label]
        cells = []
        for r in rows:
            w = r["workaround"]
            wcell = (_t(w["median"]), _x(w["median"] / r["bridge"]["median"]), "yes" if w["same_bits"] else "**no**") \
                if "median" in w else (f"fails: {w['error']}", "", "")
            cells.append((r["dtype"], f"{r['source']} -> {r['target']}",
                          "copies" + (f" ({'; '.join(r['reasons'])})" if r["reasons"] else "") if r["copies"]
                          else "zero-copy", _t(r["bridge"]["median"]), _t(r["bf16"]["median"]),
                          _x(r["bridge"]["median"] / r["bf16"]["median"]), *wcell, f"`{w['code']}`"))
        lines += ["", f"### {label} a tensor", "",
                  table(["dtype", "pair", "route", "bridge", "bf16 bridge", "bridge / bf16", "workaround",
                         "workaround / bridge", "same bits", "workaround code"], cells, "markdown")]
    return lines


def _checkpoints_markdown(ck: dict) -> list[str]:
    size = ck["nbytes"]
    cells = []
    for name, r in ck["results"].items():
        if "error" in r:
            cells.append((name, f"fails: {r['error']}", "", "", "", ""))
            continue
        cells.append((name, _t(r["first_s"]), _t(r["load_s"]), _t(r["touch_s"]),
                      f"{_b(r['peak_load'])} ({r['peak_load'] / size:.1%})",
                      f"{_b(r['peak_extra'])} ({r['peak_extra'] / size:.1%})"))
    return ["", "## Checkpoints: bb.load against safetensors' own loaders", "",
            f"Written by `bf16bridge bench{' --quick' if ck['mode'] == 'quick' else ''} --only checkpoints` on "
            f"{ck['machine']['when']} in {ck['wall_s']:.0f} s "
            f"(`benchmarks/results/checkpoints{'-quick' if ck['mode'] == 'quick' else ''}.json`; "
            "`bf16bridge/bench/checkpoints.py` measures). The file: "
            f"{_b(size)} of bf16 in GPT-2-small shapes with {ck['layers']} blocks, written by {ck['writer']} "
            "(its data is 8-byte aligned, not 64: jax and tensorflow loads copy each tensor once, numpy and torch "
            "loads are views of the map); page cache warm. Each loader runs in a fresh process, "
            f"{ck['repeat']} times: the best time and the largest peak"
            + (f" (open + first tensor: the best of {ck['first_repeat']}, the processes past {ck['repeat']} only opening "
               "the file and reading its first tensor)" if ck.get("first_repeat", ck["repeat"]) > ck["repeat"] else "")
            + ". Peak extra RSS over the process's RSS "
            "before the load (VmHWM); \"touch\" reads one byte of every page of every result.", "",
            table(["loader", "open + first tensor", "load", "load + touch", "peak extra RSS: load",
                   "peak extra RSS: load + touch"], cells, "markdown"), *_many_markdown(ck.get("many"))]


def _many_markdown(many: dict | None) -> list[str]:
    """The checkpoint part's many-tensor file: open + first tensor, ours and safetensors'."""
    if not many:
        return []
    cells = [(name, f"fails: {r['error']}" if "error" in r else _t(r["first_s"])) for name, r in many["results"].items()]
    return ["", f"Open + first tensor of a file of many small tensors: {many['tensors']} {many['dtype']} tensors of "
                f"{'x'.join(map(str, many['shape']))} ({_b(many['file_bytes'])}, its header most of what opening "
                f"reads), written by safetensors; the best of {many['repeat']} fresh processes each, the loaders "
                "interleaved. bb.load rows: `bb.open(path)` and `get` of the first key; safetensors rows: "
                "`safe_open` and `get_tensor` of the first key.", "",
            table(["loader", "open + first tensor"], cells, "markdown")]


#: convert_shards against the hand torch.from_dlpack loop over the same shards: its checks, indices and
#: layout may cost this much more (issue 31)
SHARDS_RATIO = 1.2


def shard_targets(sh: dict) -> list[tuple[str, bool, str]]:
    """The shards part: convert_shards within SHARDS_RATIO of the hand loop, in medians of one run."""
    t, ratio = sh["times"], sh["ratios"]["convert_shards / hand_loop"]
    return [(f"convert_shards of {_b(sh['nbytes'])} over {sh['devices']} host devices into torch: at most "
             f"{SHARDS_RATIO:g}x a hand torch.from_dlpack loop over the shards", ratio <= SHARDS_RATIO,
             f"{_x(ratio)} ({_t(t['convert_shards']['median'])} vs {_t(t['hand_loop']['median'])}, medians; "
             f"{sh['shards']} shards)")]


def _shards_markdown(sh: dict) -> list[str]:
    t, peak = sh["times"], sh["peak_extra_bytes"]
    code = {"convert_shards": "bb.convert_shards(x, 'torch')",
            "hand_loop": "[torch.from_dlpack(s.data) for s in x.addressable_shards]",
            "np_asarray": "np.asarray(x) (a gather into one host copy)",
            "rewrap": "jax.make_array_from_single_device_arrays over the same buffers (inside np_asarray's time)",
            "from_shards": "bb.from_shards(shards, 'jax', sharding=x.sharding)",
            "hand_assemble": "jax.make_array_from_single_device_arrays(shape, sharding, per-shard device_put)",
            "memcpy": "np.copy of the same bytes",
            "from_shards_replicated": "bb.from_shards(replicated, 'jax', sharding=xr.sharding) (compares replicas)",
            "from_shards_replicated_unchecked": "bb.from_shards(replicated, 'jax', sharding=xr.sharding, "
                                                "compare_replicas=False)",
            "convert_shards_one": "bb.convert_shards(xr, 'torch', replicas='one') (compares the dropped replicas)",
            "convert_shards_one_unchecked": "bb.convert_shards(xr, 'torch', replicas='one', compare_replicas=False)"}
    replicated = f" Replicated (`xr`): {sh['replicated']}." if sh.get("replicated") else ""
    return ["", "## Shards: a sharded jax array to per-shard torch tensors and back", "",
            f"Written by `bf16bridge bench{' --quick' if sh['mode'] == 'quick' else ''} --only shards` on "
            f"{sh['machine']['when']} (`bf16bridge/bench/shards.py`, its own process: XLA_FLAGS gives jax "
            f"{sh['devices']} cpu devices). A bf16 array of {_b(sh['nbytes'])}, shape {tuple(sh['shape'])}, "
            f"{sh['sharding']}; {sh['shards']} shards.{replicated}", "",
            table(["call", "time (median)", "code"], [(k, _t(v["median"]), f"`{code.get(k, k)}`") for k, v in t.items()],
                  "markdown"), "",
            table(["ratio", "measured"], [(k, _x(v)) for k, v in sh["ratios"].items()], "markdown"), "",
            "Peak extra memory: " + ", ".join(f"`{k}` {_b(v)}" for k, v in peak.items()) + "."]


def parts_markdown(parts: dict) -> str:
    """The sections of the parts that have saved results, appended to the page (empty where none)."""
    lines: list[str] = []
    judged = part_targets(parts)
    if judged:
        lines += ["", f"## Targets ({', '.join(PART_TITLES[p] for p in PARTS if parts.get(p))})", "",
                  table(["target", "met", "measured"], [(w, "yes" if ok else "**no**", how) for w, ok, how in judged],
                        "markdown")]
    if parts.get("dtypes"):
        lines += _dtypes_markdown(parts["dtypes"])
    if parts.get("checkpoints"):
        lines += _checkpoints_markdown(parts["checkpoints"])
    if parts.get("shards"):
        lines += _shards_markdown(parts["shards"])
    if parts.get("kernels"):
        lines += _kernels_markdown(parts["kernels"])
    if parts.get("casting"):
        lines += _casting_markdown(parts["casting"])
    return "\n".join(lines) + "\n" if lines else ""


# -- the narrow kernels (bf16bridge/bench/kernels.py) and casting (bf16bridge/bench/casting.py), judged on the
# fastest call of each contender, as the cost of a call is (the least disturbed by other load)

#: "no slower than" the tool a user would use, with this much room for the noise of a shared machine
NO_SLOWER = 1.1
#: at the smallest size, a kernel call may cost this much more than the astype it replaces
KERNEL_CALL_SLACK_S = 10e-6
#: cast_module does more than module.to (a walk by type, hooks on kept modules, a report)
MODULE_RATIO = 1.5
OURS = {"float32 -> dtype": "to_dtype", "dtype -> float32": "to_float32"}


def _sizes(kr: dict) -> tuple[str, str]:
    sizes = sorted(kr["sizes"], key=lambda k: SIZES[k])
    return sizes[0], sizes[-1]


def kernel_targets(kr: dict) -> list[tuple[str, bool, str]]:
    """The narrow kernels: our bits are ml_dtypes', and ours are no slower than its astype (at the
    large size) nor much slower for a small array; the nibbles no slower than the numpy one-liners."""
    out = []
    small, large = _sizes(kr)
    wrong = [f"{r['dtype']} {r['direction']} {r['size']} ({k}: {c['differ']} of {c['of']})"
             for r in kr["rows"] for k, c in r["times"].items()
             if k.startswith(OURS[r["direction"]]) and not c["same_bits"]]
    wrong += [f"{r['kernel']} {r['size']}" for r in kr["nibbles"] if not r["times"][r["kernel"]]["same_bits"]]
    n = sum(1 for r in kr["rows"] for k in r["times"] if k.startswith(OURS[r["direction"]])) + len(kr["nibbles"])
    out.append(("narrow kernels: what was timed of ours has ml_dtypes' bits (every dtype, both ways, and the "
                "nibbles the one-liners' bits)", not wrong,
                f"differs: {'; '.join(wrong)}" if wrong else f"{n} timed calls, every bit the same"))
    for direction, ours in OURS.items():
        rows = [r for r in kr["rows"] if r["direction"] == direction and r["size"] == large]
        ratio = {r["dtype"]: _ratio(r["times"], ours, "ml_dtypes astype") for r in rows}
        worst = max(ratio, key=lambda d: ratio[d])
        wr = next(r for r in rows if r["dtype"] == worst)["times"]
        missed = [f"{d} {_x(v)}" for d, v in ratio.items() if v > NO_SLOWER]
        out.append((f"{ours} at {large} (of float32): no slower than ml_dtypes' astype, every dtype "
                    f"(at most {NO_SLOWER:g}x)", not missed,
                    f"worst {worst}: {_x(ratio[worst])} ({_t(wr[ours]['best'])} vs {_t(wr['ml_dtypes astype']['best'])})"
                    + (f"; over: {', '.join(missed)}" if missed else "")))
        rows = [r for r in kr["rows"] if r["direction"] == direction and r["size"] == small]
        extra = {r["dtype"]: r["times"][ours]["best"] - r["times"]["ml_dtypes astype"]["best"] for r in rows}
        worst = max(extra, key=lambda d: extra[d])
        wr = next(r for r in rows if r["dtype"] == worst)["times"]
        out.append((f"{ours} at {small}: at most ml_dtypes' astype + {KERNEL_CALL_SLACK_S * 1e6:.0f} us, every dtype",
                    extra[worst] <= KERNEL_CALL_SLACK_S,
                    f"worst {worst}: {_t(wr[ours]['best'])} vs {_t(wr['ml_dtypes astype']['best'])} "
                    f"(+{_t(extra[worst])}; on one thread {_t(wr[ours + ', threads=1']['best'])})"))
    for r in kr["nibbles"]:
        if r["size"] != large:
            continue
        hand = next(k for k in r["times"] if k.startswith("numpy"))
        q = _ratio(r["times"], r["kernel"], hand)
        out.append((f"{r['kernel']} at {large}: no slower than the numpy one-liner (at most {NO_SLOWER:g}x)",
                    q <= NO_SLOWER, f"{_x(q)} ({_t(r['times'][r['kernel']]['best'])} vs "
                                        f"{_t(r['times'][hand]['best'])})"))
    return out


def casting_targets(cr: dict) -> list[tuple[str, bool, str]]:
    """Casting: cast_tree no slower than the hand loop (torch) or the tree map (jax); cast_module
    within MODULE_RATIO of module.to; each with the same bits as the loop it is judged against."""
    sd, mod, jx = cr["state_dict"], cr["module"], cr["jax"]
    out = []
    for key, what in (("cast_tree", "cast_tree of the torch state dict (norms kept, tied weights cast once)"),
                      ("cast_tree, policy=[]", "cast_tree(policy=[]) of the torch state dict (every leaf cast)")):
        ratio = _ratio(sd["times"], key, "hand loop")
        out.append((f"{what}: no slower than the hand loop (at most {NO_SLOWER:g}x)", ratio <= NO_SLOWER,
                    f"{_x(ratio)} ({_t(sd['times'][key]['best'])} vs {_t(sd['times']['hand loop']['best'])})"))
    ratio = _ratio(mod["times"], "cast_module", "module.to(torch.bfloat16)")
    out.append((f"cast_module: at most {MODULE_RATIO:g}x module.to(torch.bfloat16)", ratio <= MODULE_RATIO,
                f"{_x(ratio)} ({_t(mod['times']['cast_module']['best'])} vs "
                f"{_t(mod['times']['module.to(torch.bfloat16)']['best'])})"))
    ratio = _ratio(jx["times"], "cast_tree", "jax.tree.map astype")
    out.append((f"cast_tree of jax params: no slower than jax.tree.map astype (at most {NO_SLOWER:g}x)",
                ratio <= NO_SLOWER, f"{_x(ratio)} ({_t(jx['times']['cast_tree']['best'])} vs "
                                    f"{_t(jx['times']['jax.tree.map astype']['best'])})"))
    bad = [name for name, r in (("torch state dict", sd), ("nn.Module", mod), ("jax params", jx)) if not r["same_bits"]]
    out.append(("casting: every leaf cast has the bits of the loop it is timed against, every kept leaf the "
                "input's", not bad, f"differs: {', '.join(bad)}" if bad else "same bits in all three"))
    return out


def _torch_bits(c: dict | None, direction: str) -> str:
    if c is None:
        return "torch has no such dtype"
    if c["same_bits"]:
        return "same"
    width = 8 if direction == "float32 -> dtype" else 2
    eg = ", ".join(f"0x{i:0{width}X}: 0x{a:X} vs 0x{b:X}" for i, a, b in c["examples"])
    return f"differs on {c['differ']} of {c['of']} (input: ml_dtypes vs torch: {eg})"


def _kernels_markdown(kr: dict) -> list[str]:
    quick = kr["mode"] == "quick"
    th = kr["threads"]
    lines = ["", "## Narrow kernels against ml_dtypes' astype and torch's .to()", "",
             f"Written by `bf16bridge bench{' --quick' if quick else ''} --only kernels` on "
             f"{kr['machine']['when']} (`benchmarks/results/kernels{'-quick' if quick else ''}.json`; "
             "`bf16bridge/bench/kernels.py` measures). Each size is the float32 side's bytes. The input: float32 normals "
             "scaled to the dtype's range, the last sixteenth random float32 bit patterns (NaN, inf, subnormals, "
             "overflow); the widening starts from ml_dtypes' rounding of it. The contenders alternate call by "
             "call; a cell shows the fastest call and, in parentheses, the median; ratios are of the fastest "
             f"calls. Threads: ours by default {th['kernels default']}, ml_dtypes' astype {th['ml_dtypes astype']}, "
             f"torch {th['torch .to()']} (its thread pool spins against ours on this small machine). Every result "
             "timed is compared with ml_dtypes' astype bit for bit, in the run; torch's differences are "
             "documented in [kernels.md](kernels.md#every-narrow-dtype-to_dtype-to_float32).", *_left_out(kr)]
    for label in sorted(kr["sizes"], key=lambda k: SIZES[k]):
        cells = []
        for r in kr["rows"]:
            if r["size"] != label:
                continue
            tm, ours = r["times"], OURS[r["direction"]]
            torch = tm.get("torch .to()")
            cells.append((r["dtype"], r["direction"], _times_cell(tm[ours]), _times_cell(tm[ours + ", threads=1"]),
                          _times_cell(tm["ml_dtypes astype"]), _x(_ratio(tm, "ml_dtypes astype", ours)),
                          "yes" if tm[ours]["same_bits"] and tm[ours + ", threads=1"]["same_bits"] else "**no**",
                          _times_cell(torch) if torch else "", _x(_ratio(tm, "torch .to()", ours)) if torch else "",
                          _torch_bits(torch, r["direction"])))
        lines += ["", f"### {label} of float32 ({next(r['elements'] for r in kr['rows'] if r['size'] == label):,} "
                  "elements)", "",
                  table(["dtype", "direction", "ours", "ours, 1 thread", "ml_dtypes astype", "astype / ours",
                         "ours: ml_dtypes' bits", "torch .to()", "torch / ours", "torch's bits"], cells, "markdown")]
    nibble_cells = []
    for r in kr["nibbles"]:
        tm = r["times"]
        hand = next(k for k in tm if k.startswith("numpy"))
        nibble_cells.append((r["kernel"], r["size"], f"{r['nibbles']:,}", _times_cell(tm[r["kernel"]]),
                             _times_cell(tm[hand]), _x(_ratio(tm, hand, r["kernel"])),
                             "yes" if tm[r["kernel"]]["same_bits"] else "**no**", f"`{hand.split(': ', 1)[1]}`"))
    lines += ["", "### Two 4-bit values a byte", "",
              "float4_e2m1fn values, one a byte (the size), packed two a byte, and back; against the numpy "
              "one-liners a user writes (`u`: the values as uint8, `b`: the packed bytes).", "",
              table(["kernel", "size", "values", "ours", "numpy one-liner", "one-liner / ours", "same bits",
                     "one-liner"], nibble_cells, "markdown")]
    return lines


def _casting_markdown(cr: dict) -> list[str]:
    quick = cr["mode"] == "quick"
    sd, mod, jx, g = cr["state_dict"], cr["module"], cr["jax"], cr["gpt2"]
    yes = {True: "yes", False: "**no**"}
    cells = [("torch state dict", "`bb.cast_tree(sd, 'bfloat16')`", _times_cell(sd["times"]["cast_tree"]),
              f"`{cr['code']['hand loop']}`", _times_cell(sd["times"]["hand loop"]),
              _x(_ratio(sd["times"], "cast_tree", "hand loop")), yes[sd["same_bits"]]),
             ("torch state dict", "`bb.cast_tree(sd, 'bfloat16', policy=[])`",
              _times_cell(sd["times"]["cast_tree, policy=[]"]), f"`{cr['code']['hand loop']}`",
              _times_cell(sd["times"]["hand loop"]), _x(_ratio(sd["times"], "cast_tree, policy=[]", "hand loop")),
              yes[sd["same_bits"]]),
             ("torch nn.Module", "`bb.cast_module(model, 'bfloat16')`", _times_cell(mod["times"]["cast_module"]),
              "`model.to(torch.bfloat16)`", _times_cell(mod["times"]["module.to(torch.bfloat16)"]),
              _x(_ratio(mod["times"], "cast_module", "module.to(torch.bfloat16)")), yes[mod["same_bits"]]),
             ("jax params", "`bb.cast_tree(params, 'bfloat16')`", _times_cell(jx["times"]["cast_tree"]),
              f"`{cr['code']['tree map']}`", _times_cell(jx["times"]["jax.tree.map astype"]),
              _x(_ratio(jx["times"], "cast_tree", "jax.tree.map astype")), yes[jx["same_bits"]])]
    m = mod["shape"]
    return ["", "## Casting: cast_tree and cast_module against the loops written by hand", "",
            f"Written by `bf16bridge bench{' --quick' if quick else ''} --only casting` on "
            f"{cr['machine']['when']} (`benchmarks/results/casting{'-quick' if quick else ''}.json`; "
            "`bf16bridge/bench/casting.py` measures). A cell shows the fastest call and, in parentheses, the median; "
            "ratios are of the fastest calls, ours over theirs (below 1: ours is faster).", "",
            f"- The torch state dict: GPT-2 shapes ({g['layers']} blocks, width {g['d']}, vocabulary {g['vocab']}), "
            f"float32, {sd['tensors']} keys over {sd['unique_tensors']} tensors ({_b(sd['nbytes'])}): "
            f"`{sd['tied'][0]}` is `{sd['tied'][1]}`, as GPT-2's `state_dict()` gives it. The hand loop casts "
            f"that tensor ({_b(sd['tied_nbytes'])}) twice"
            + (" and unties it (two tensors come back)" if sd["hand_loop_unties"] else "")
            + f"; cast_tree casts it once{' and keeps it tied' if sd['tied_cast_once'] else ' (**not tied**)'}. "
            f"By default cast_tree keeps the norms in float32 ({sd['kept']} leaves, {_b(sd['kept_nbytes'])}), "
            "handed back as they are; with `policy=[]` it casts every floating leaf, as the loop does.",
            f"- The nn.Module: {m['layers']} pre-norm blocks of width {m['d']}, vocabulary {m['vocab']}, head tied "
            f"to the embedding ({mod['modules']} modules, {mod['parameters']} parameters, {_b(mod['nbytes'])}). "
            f"Both calls are in place: each gets a fresh float32 deep copy, made outside the time; "
            f"{mod['times']['cast_module']['calls']} calls each. cast_module "
            f"keeps {mod['kept']} parameters (the LayerNorms) in float32, installs their hooks and builds its report; "
            "the cast model runs on bf16 ids" + ("" if mod["runs_in_bf16"] else " (**it did not**)") + ".",
            f"- The jax params: the same GPT-2 shapes as nested dicts under `params` (flax's layout, no tie), "
            f"{jx['tensors']} float32 arrays ({_b(jx['nbytes'])}); both calls blocked until ready. cast_tree keeps "
            f"{jx['kept']} norm leaves in float32.",
            "", "Same bits: every leaf both cast is bit for bit the same, and every leaf ours kept is the input's.", "",
            table(["tree", "ours", "time", "theirs", "time", "ours / theirs", "same bits"], cells, "markdown")]
