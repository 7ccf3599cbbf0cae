"""What ``bf16bridge probe`` prints: first a line per framework, its decisions (what a bf16 tensor
should arrive as there, to store it and to compute on it: ``Capabilities.decide``) and their
reason; the findings behind them under --verbose; and --json, every finding with the decisions."""

from __future__ import annotations

import json

from bf16bridge.core import registry

FOOTER = ("(what a bf16 tensor should arrive as in each framework, to store it and to compute on this CPU, and "
          "why: bb.probe().decide(); --verbose: the findings behind it; --json: all of it)")


def _pair(decision) -> dict:
    return {"dtype": decision.dtype, "reason": decision.reason}


def decisions(caps) -> dict:
    """{framework: {"storage": {dtype, reason}, "for_compute": {dtype, reason}, "devices": {device:
    {dtype, reason}}}} for numpy and each framework probed ("devices": for compute on each device
    the framework reports where that differs from the CPU's); a framework not probed is not
    imported for this: {"storage": None, "for_compute": None, "why": why it was not probed}."""
    out: dict = {}
    for name in (registry.HUB, *caps.frameworks):
        fw = caps.frameworks.get(name)
        if fw is not None and not fw.probed:
            out[name] = {"storage": None, "for_compute": None, "why": fw.why}
            continue
        storage, compute = caps.decide(name), caps.decide(name, for_compute=True)
        devices = {}
        for d in fw.devices if fw is not None else ():
            device = d.name.split(" ")[0]
            on = caps.decide(name, for_compute=True, device=device)
            if on != compute:
                devices[device] = _pair(on)
        out[name] = {"storage": _pair(storage), "for_compute": _pair(compute), "devices": devices}
    return out


def _line(entry: dict, version: str | None) -> str:
    if entry["storage"] is None:
        if not version:
            return "not installed" + ("" if entry["why"] == "not installed" else f" ({entry['why']})")
        return f"not tried ({version}): {entry['why']}"
    storage, compute = entry["storage"], entry["for_compute"]
    if storage["dtype"] != "bfloat16":  # cannot hold bf16: the reason is the same for compute
        text = f"{storage['dtype']}: {storage['reason']}"
    elif compute["dtype"] == storage["dtype"]:
        text = f"{storage['dtype']} to store and to compute: {compute['reason']}"
    else:
        text = f"{storage['dtype']} to store, {compute['dtype']} to compute: {compute['reason']}"
    return text + "".join(f"; on {dev}: {d['dtype']} ({d['reason']})" for dev, d in entry["devices"].items())


def summary(caps) -> str:
    """A line per framework, its decisions first, then why; then what the lines are."""
    found = decisions(caps)
    width = max(len(name) for name in found)
    version = {name: fw.version for name, fw in caps.frameworks.items()}
    lines = [f"{name:<{width}}  {_line(entry, version.get(name))}" for name, entry in found.items()]
    return "\n".join([*lines, FOOTER])


def render(caps, verbose: bool = False) -> str:
    """The text ``bf16bridge probe`` prints: the summary; with ``verbose``, then every finding."""
    return summary(caps) + (f"\n\n{caps}" if verbose else "")


def to_json(caps) -> str:
    """Every finding (Capabilities.to_dict()) and, under "decisions", decisions(caps)."""
    return json.dumps({**caps.to_dict(), "decisions": decisions(caps)}, indent=2, default=str)
