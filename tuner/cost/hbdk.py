"""What hbdk (the X5 compiler) says a model costs: its per-subgraph estimate and per-layer table.

With ``compiler_parameters.debug: True``, hb_mapper leaves ``<subgraph>.json`` next to the
``.bin`` for every BPU subgraph. Its ``summary`` holds the estimate the log prints
(``latency (us)``, DDR bytes loaded and stored per run) and ``layer details``: one row per
compiled layer with the layer's name (the quantized model's node name, a fused Conv with a
``-conv`` suffix), its MAC count, its output shape as the model has it and as the BPU lays it
out (NHWC, channels and width padded), its computing cost without DDR, its load/store cost and
the period it is active in the compiler's schedule. These are hbdk's own estimates of BPU time:
no CPU op and no BPU<->CPU transfer is in them.

Measured here (hbdk 3.49.15, the bundled example, all-int8 max): at ``O0`` the estimate is about
the sum of both columns (2412 us: compute 504 + load/store 1784); at ``O3`` layers overlap and
keep their tensors on chip (582 us: compute 511 + load/store 276). Users deploy O3.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_US = re.compile(r"([\d.]+)\s*us")
_PERIOD = re.compile(r"([\d.]+)\s*~\s*([\d.]+)\s*us")


@dataclass(frozen=True)
class LayerRow:
    """One row of hbdk's per-layer table."""

    name: str
    macs: int
    shape: tuple[int, ...]
    aligned: tuple[int, ...]
    compute_us: float
    load_store_us: float
    start_us: float | None = None
    end_us: float | None = None

    @property
    def node(self) -> str:
        """The quantized model's node name (a fused Conv's row is ``<name>-conv``)."""
        return self.name[: -len("-conv")] if self.name.endswith("-conv") else self.name

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LayerRow:
        return cls(**{**d, "shape": tuple(d.get("shape", ())), "aligned": tuple(d.get("aligned", ()))})


@dataclass(frozen=True)
class SubgraphEstimate:
    """hbdk's estimate of one BPU subgraph (BPU time only)."""

    name: str
    latency_us: float
    loaded_bytes: int
    stored_bytes: int
    layers: tuple[LayerRow, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "layers": [r.to_json() for r in self.layers]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SubgraphEstimate:
        return cls(**{**d, "layers": tuple(LayerRow.from_json(r) for r in d.get("layers", ()))})


def _us(cell: Any) -> float:
    m = _US.search(str(cell))
    return float(m.group(1)) if m else 0.0


def _shape(cell: Any) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(cell).strip("[] ").split(",") if x.strip())
    except ValueError:
        return ()


def _int(cell: Any) -> int:
    try:
        return int(str(cell).replace(",", "").strip() or 0)
    except ValueError:
        return 0


def parse_layer_rows(rows: list[Any]) -> tuple[LayerRow, ...]:
    """``summary["layer details"]``: a header row, then one row per layer; columns found by their header
    (``layer``, ``ops``, ``original output shape``, ``aligned output shape``, ``computing cost ...``,
    ``load/store cost``, ``active period of time``). A table without ``layer`` gives ()."""
    if not rows or not isinstance(rows[0], list):
        return ()
    head = [str(c).strip().lower() for c in rows[0]]

    def col(prefix: str) -> int | None:
        return next((i for i, c in enumerate(head) if c.startswith(prefix)), None)

    i_name, i_ops, i_shape, i_al = col("layer"), col("ops"), col("original output shape"), col("aligned output shape")
    i_comp, i_ls, i_act = col("computing cost"), col("load/store"), col("active period")
    if i_name is None:
        return ()
    out = []
    for r in rows[1:]:
        if not isinstance(r, list) or len(r) != len(head):
            continue
        cell = [r[i] if i is not None else "" for i in (i_ops, i_shape, i_al, i_comp, i_ls, i_act)]
        m = _PERIOD.search(str(cell[5]))
        out.append(LayerRow(name=str(r[i_name]), macs=_int(cell[0]), shape=_shape(cell[1]), aligned=_shape(cell[2]),
                            compute_us=_us(cell[3]), load_store_us=_us(cell[4]),
                            start_us=float(m.group(1)) if m else None, end_us=float(m.group(2)) if m else None))
    return tuple(out)


def read_subgraph_json(path: str | Path) -> SubgraphEstimate | None:
    """hbdk's ``<subgraph>.json`` (debug builds); None when absent or not of that form."""
    try:
        summary = json.loads(Path(path).read_text(encoding="utf-8"))["summary"]
        return SubgraphEstimate(name=str(summary.get("model name") or Path(path).stem),
                                latency_us=float(summary["latency (us)"]),
                                loaded_bytes=int(summary.get("loaded bytes per run", 0)),
                                stored_bytes=int(summary.get("stored bytes per run", 0)),
                                layers=parse_layer_rows(summary.get("layer details") or []))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def subgraph_estimates(folder: str | Path) -> list[SubgraphEstimate]:
    """Every ``<subgraph>.json`` of a debug build in ``folder`` (hb_mapper's ``working_dir``), in the order
    of their subgraph numbers. Found by content, not by the log's name: a model named with spaces
    ("Model from PaddlePaddle.") gives a subgraph file name the log line does not show whole."""
    out = []
    for path in Path(folder).glob("*.json"):
        est = read_subgraph_json(path)
        if est is not None:
            out.append(est)

    def number(e: SubgraphEstimate) -> tuple[int, str]:
        m = re.search(r"subgraph_(\d+)$", e.name)
        return (int(m.group(1)) if m else 0, e.name)

    return sorted(out, key=number)


@dataclass(frozen=True)
class NodeQtypes:
    """One node of hb_mapper's calibrated model: its op and the qtype of each input and output it reads
    or writes through an HzCalibration node (None: not rounded there: a weight's bias, a fused
    Conv -> Relu edge, a CPU input)."""

    op_type: str
    inputs: tuple[str | None, ...]
    outputs: tuple[str | None, ...]


def calibrated_qtypes(path: str | Path) -> dict[str, NodeQtypes]:
    """Per node of ``*_calibrated_model.onnx`` (HzCalibration nodes excepted): what is really int16.
    An input's qtype is that of the HzCalibration node producing it; an output's, the widest qtype of
    the HzCalibration nodes reading it."""
    from tuner.inputs.calibrated import read_calibrated

    cm = read_calibrated(path)
    by_output = {n.output: n for n in cm.nodes}
    readers: dict[str, set[str]] = {}
    for n in cm.nodes:
        if n.quantizes:
            readers.setdefault(n.tensor, set()).add(n.qtype)
    out = {}
    for node in cm.proto.graph.node:
        if node.op_type == "HzCalibration":
            continue
        ins = tuple(by_output[t].qtype if t in by_output and by_output[t].quantizes else None for t in node.input)
        outs = tuple(max(readers[t], key=_width) if readers.get(t) else None for t in node.output)
        out[node.name] = NodeQtypes(node.op_type, ins, outs)
    return out


def _width(qtype: str) -> int:
    return int("".join(c for c in qtype if c.isdigit()) or 0)
