"""Where the benchmark writes. In a checkout of the repository: the page to docs/benchmarks.md (a
--quick run's to benchmarks/results/quick.md) and the results to benchmarks/results/. Installed (no
checkout around the package): everything to ./bf16bridge-bench/ in the current directory. --out DIR
writes everything to DIR either way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
#: the folder an installed package writes to, in the current directory, when --out names none
INSTALLED_OUT = "bf16bridge-bench"


def checkout() -> Path | None:
    """The repository the package runs from, or None where it runs installed."""
    root = PACKAGE.parent
    if (root / "pyproject.toml").is_file() and (root / "benchmarks" / "results").is_dir() and (root / "docs").is_dir():
        return root
    return None


@dataclass(frozen=True)
class Outputs:
    doc: Path  # the page
    plot: Path
    main: Path  # the main part's JSON
    functions: Path  # the cost of a call's JSON
    results: Path  # the folder of every JSON (each part's: {part}.json, {part}-quick.json)

    def part(self, name: str, quick: bool) -> Path:
        return self.results / (f"{name}-quick.json" if quick else f"{name}.json")


def outputs(quick: bool, out: Path | None) -> Outputs:
    """Where a run writes, as the module says."""
    name, fname = ("quick", "functions-quick.json") if quick else ("full", "functions.json")
    root = checkout()
    if out is None and root is not None:
        results = root / "benchmarks" / "results"
        if quick:
            return Outputs(results / "quick.md", results / "quick.png", results / "quick.json", results / fname,
                           results)
        return Outputs(root / "docs" / "benchmarks.md", root / "docs" / "benchmarks.png", results / "full.json",
                       results / fname, results)
    folder = out if out is not None else Path.cwd() / INSTALLED_OUT
    return Outputs(folder / "benchmarks.md", folder / "benchmarks.png", folder / f"{name}.json", folder / fname,
                   folder)


def results_dir() -> Path:
    """Where a part run alone (python -m bf16bridge.bench.shards) saves its JSON without --out."""
    root = checkout()
    return root / "benchmarks" / "results" if root is not None else Path.cwd() / INSTALLED_OUT
