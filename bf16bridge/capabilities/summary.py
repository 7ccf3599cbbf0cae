"""The probe's saved results and the docs/probe.md blocks generated from them (docs never state a
measured result by hand; tests/capabilities/test_probe_docs.py compares each block with its JSON).

    python -m bf16bridge.capabilities.summary compute   probe this machine (every framework), save
                                                        the results folder's probe-compute.json, regenerate its block
    python -m bf16bridge.capabilities.summary arm       regenerate the Arm block from arm-check.json
                                                        (tools/arm_check.sh writes it)
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "probe.md"


def results_dir() -> Path:
    """Where the project keeps saved results: the bench package's folder once it has one."""
    moved = ROOT / "bf16bridge" / "bench" / "results"
    return moved if moved.is_dir() else ROOT / "benchmarks" / "results"


def compute_record(caps) -> dict:
    """What this machine's probe found about bf16 compute and allocations, JSON-ready."""
    fws = {n: f for n, f in caps.frameworks.items() if f.probed}
    out: dict = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "cpu": {"arch": caps.cpu.arch, "os": caps.cpu.os, "flags": list(caps.cpu.flags),
                   "bf16_compute": caps.cpu.bf16_compute, "why": caps.cpu.why},
           "versions": {"numpy": caps.numpy.version, "ml_dtypes": caps.numpy.ml_dtypes_version,
                        **{n: f.version for n, f in fws.items()}},
           "frameworks": {}}
    for name, found in (("numpy", caps.numpy), *fws.items()):
        d = caps.decide(name, for_compute=True)
        out["frameworks"][name] = {
            "trials": [{"device": t.device, "dtype": t.dtype, "how": t.how, "why": t.why} for t in found.compute],
            "for_compute": d.dtype, "reason": d.reason,
            "allocation offsets": list(found.alignment.offsets) if found.alignment else None}
    return out


def compute_block(data: dict) -> str:
    """The docs block of a compute_record: one row a framework."""
    cpu, v = data["cpu"], data["versions"]
    lines = [f"Probed {data['when']} on {cpu['arch']} {cpu['os']}: {cpu['why']} "
             f"(numpy {v['numpy']}, ml_dtypes {v['ml_dtypes']}"
             + "".join(f", {n} {v[n]}" for n in v if n not in ("numpy", "ml_dtypes")) + ").",
             "", "| framework | `for_compute` on this CPU | how it was found | what the trial found | "
                 "fresh allocations, address mod 64 |", "|---|---|---|---|---|"]
    for name, f in data["frameworks"].items():
        cpu_trial = next((t for t in f["trials"] if t["device"] == "cpu"), None)
        how = cpu_trial["how"] if cpu_trial else "not tried"
        why = cpu_trial["why"] if cpu_trial else "-"
        offsets = ", ".join(map(str, f["allocation offsets"])) if f["allocation offsets"] is not None else "-"
        lines.append(f"| {name} | {f['for_compute']} | {how} | {why} | {offsets} |")
    return "\n".join(lines)


def arm_block(data: dict) -> str:
    """The docs block of tools/arm_check.sh's summary: what each emulated CPU showed, read not timed."""
    lines = [f"{data['what']}; wheels: {', '.join(data['wheels']) or 'not listed'}.", "",
             "| QEMU_CPU | HWCAP2 bf16 / i8mm | probe: bf16 arithmetic | `for_compute` per framework | "
             "fresh allocations, address mod 64 | 65,536-pattern round trip | probe's stderr | tests |",
             "|---|---|---|---|---|---|---|---|"]
    for cpu, c in data["cpus"].items():
        probe_cpu = c["probe cpu"]
        decided = []
        for name, d in c["decisions"].items():
            if not isinstance(d, dict):
                decided.append(f"{name}: {d}")
                continue
            trial = next((t for t in c["compute trials"].get(name, []) if t["device"] == "cpu"), None)
            timed = probe_cpu["bf16_compute"] and trial is not None and trial["how"] == "timed"
            decided.append(f"{name}: " + ("timed under emulation, not recorded" if timed else d["for_compute"]))
        offsets = "; ".join(f"{n}: {', '.join(map(str, o))}" for n, o in c["allocation offsets mod 64"].items() if o)
        trips = "; ".join(f"{k} (starts {v[1]} past 64): {'bits and pointers as planned' if v[0] else 'FAILED'}"
                          for k, v in c["roundtrip"].items() if isinstance(v, list)) or "not run"
        stderr = "empty" if c["probe stderr empty"] else "; ".join(c["probe stderr"])
        tests = c["tests"]
        said = (f"{tests['ran'] - tests['failed'] - tests['skipped']} passed, {tests['failed']} failed"
                + (f" ({', '.join(tests['failures'])})" if tests["failures"] else "")) if "ran" in tests else tests["not run"]
        lines.append(f"| {cpu} | {_yes(c['HWCAP2_BF16 (bit 14)'])} / {_yes(c['HWCAP2_I8MM (bit 13)'])} | "
                     f"{_yes(probe_cpu['bf16_compute'])}: {probe_cpu['why']} | {'; '.join(decided)} | {offsets or '-'} | "
                     f"{trips} | {stderr} | {said} |")
    return "\n".join(lines)


def _yes(v) -> str:
    return {True: "yes", False: "no"}.get(v, "not read")


def _marked(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated: {re.escape(name)} -->\n)(.*?)(<!-- end {re.escape(name)} -->)", re.S)


def block_in(text: str, name: str) -> str | None:
    """The generated block ``name`` of a docs page's text (between its markers), or None."""
    found = _marked(name).search(text)
    return None if found is None else found.group(2).rstrip("\n")


def write_block(name: str, block: str, doc: Path = DOC) -> None:
    text = doc.read_text()
    if block_in(text, name) is None:
        raise SystemExit(f"{doc} has no '<!-- generated: {name} -->' ... '<!-- end {name} -->' markers")
    doc.write_text(_marked(name).sub(lambda m: f"{m.group(1)}{block}\n{m.group(3)}", text, count=1))


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    if what == "compute":
        import bf16bridge as bb

        data = compute_record(bb.probe(frameworks="all"))
        (results_dir() / "probe-compute.json").write_text(json.dumps(data, indent=1) + "\n")
        write_block("probe-compute.json", compute_block(data))
        return 0
    if what == "arm":
        data = json.loads((results_dir() / "arm-check.json").read_text())
        write_block("arm-check.json", arm_block(data))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
