"""The package's imports, every module's and every function's: no circle, none up the layers.

The layers, bottom first. A module may import from its own layer and the ones below it. A
module belongs to the longest prefix listed (``tuner.study.results`` before ``tuner.study``).
The same list, with the reasons, is in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAYERS: list[tuple[str, ...]] = [
    ("tuner", "tuner.errors", "tuner.console", "tuner.files", "tuner.runtime"),  # ground floor
    ("tuner.metrics",),          # arrays in, numbers out; label files, user metrics
    ("tuner.graph",),            # the ONNX graph as hb_mapper sees it: its rewrites, names, fusion, march tables
    ("tuner.inputs",),           # what the user gives: YAML, model (rewritten by graph), data, calibrated model
    ("tuner.calib",),            # one pass over the data -> statistics -> thresholds
    ("tuner.candidate",),        # a configuration, to and from the YAML's fields
    ("tuner.export",),           # candidate -> hb_mapper YAML
    ("tuner.simulate",),         # candidate -> plan -> fake-quant graph -> onnxruntime -> evaluation
    ("tuner.cost",),             # modeled latency of a plan
    ("tuner.workspace",),        # one YAML's model, data, statistics and simulator, loaded once
    ("tuner.sensitivity",),      # per-node rankings over a simulator
    ("tuner.toolchain",),        # the real tool's logs and calibrated model against a simulation
    ("tuner.study.results", "tuner.study.record"),   # a study's trials read back, the trial record (the report reads them)
    ("tuner.report",),           # terminal tables, JSON, CSV, report.html
    ("tuner.study",),            # space files, the Optuna study (it rewrites its report as it goes)
    ("tuner.toolchain.verify", "tuner.toolchain.verified", "tuner.rank"),  # the toolchain and the ranking on a study
    ("tuner.commands",),         # the subcommands: parse, call the library, render
    ("tuner.cli", "tuner.__main__"),
]

ROOT = Path(__file__).resolve().parent.parent / "tuner"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported tuner module, line) for every import in the file, at any depth."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:   # `from tuner.simulate import fakequant` imports a module
                full = f"{base}.{a.name}"
                out.append((full if full in known else base, node.lineno))
    return [(m, line) for m, line in out if m == "tuner" or m.startswith("tuner.")]


def layer(module: str) -> int:
    best, found = -1, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, found = len(n), i
    return found


def test_every_module_has_a_layer() -> None:
    assert [m for m in modules() if layer(m) < 0] == []


def test_no_import_runs_up_the_layers() -> None:
    known = modules()
    bad = [f"{known[m].relative_to(ROOT.parent)}:{line}: {m} (layer {layer(m)}) imports {dep} (layer {layer(dep)})"
           for m in known for dep, line in imports(known[m], known) if layer(dep) > layer(m)]
    assert bad == [], "\n".join(bad)


def test_no_import_circle() -> None:
    known = modules()
    edges = {m: {d for d, _ in imports(p, known) if d in known} for m, p in known.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                pytest.fail("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(known):
        if m not in state:
            visit(m)
