"""The prices of tuner's latency model (:mod:`tuner.cost.latency`) and their refinements, as values.

* :class:`BpuCoefficients`: hbdk's O3 estimate per layer kind and input precision plus the
  subgraph-level terms (:data:`GLOBAL_TERMS`), fitted to hbdk (:mod:`tuner.cost.fit`) and shipped in
  ``search_spaces/targets/<march>.yaml`` (``cost.bpu``), or a march's roofline estimates;
* :class:`ModelFit`: ``tuner latency fit``'s scales for one model, kept by model fingerprint
  (:func:`load_fit`, :func:`fit_path`);
* :class:`BoardFit`: a board's measured relation to hbdk's estimate (``tuner latency board``);
* :func:`load_profile`: a measured per-node profile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tuner.cost.bpu import KINDS, MAC_KINDS, LayerPrice
from tuner.errors import TunerError
from tuner.graph import Target

PRECISIONS = ("int8", "int16")


#: The subgraph-level terms: an int16 output's write (thousand elements), a requantized tensor (thousand
#: elements), the DDR traffic of the model's inputs and outputs and of the tensors cut between a subgraph
#: and the rest (kilobytes), a tensor cut between BPU and CPU inside
#: the model (hbdk's layers next to a cut were measured 30-70 us slower in all: the example's three
#: CPU-cut Convs), the layout conversions of a tensor handed between two BPU subgraphs (thousand pixels:
#: ~6 us each on both sides, whatever its channels), a subgraph, and the model itself (a constant per model).
GLOBAL_TERMS = ("out16_kelem", "requant_kelem", "io_kbyte", "cut_kbyte", "cut_tensor", "relayout_kpix", "subgraph",
                "model")


#: What ``tuner latency fit`` refines per model: a constant added to the model (``model``, us: what this
#: model costs that its layers' prices miss, e.g. the example's ~200 us of layout conversions hbdk charges
#: to its full-resolution element-wise layers), a scale of the int16 terms (int16 layers, writes,
#: requantizes) and a scale of the I/O terms (DDR traffic, cut tensors, subgraphs).
SCALES = ("model", "int16", "io")


_SCALE_OF = {"int8": "int8", "int16": "int16", "out16_kelem": "int16", "requant_kelem": "int16",
             "io_kbyte": "io", "cut_kbyte": "io", "cut_tensor": "io", "relayout_kpix": "io", "subgraph": "io",
             "model": "model"}


def scale_of(term: str) -> str:
    """Which per-model scale a subgraph feature (:meth:`CostModel.features`) belongs to."""
    return _SCALE_OF[term]


@dataclass(frozen=True)
class BpuCoefficients:
    """hbdk's O3 estimate in microseconds: the layers' prices per kind and input precision
    (:class:`tuner.cost.bpu.LayerPrice`) and the subgraph-level terms (:data:`GLOBAL_TERMS`, microseconds
    per unit). A kind without a price costs as ``other``."""

    layers: Mapping[tuple[str, str], LayerPrice]
    terms: Mapping[str, float]
    source: str = ""

    @classmethod
    def from_target(cls, target: Target) -> BpuCoefficients:
        """The target's ``cost.bpu``; a target without one (no compiler fit for its march) has its
        roofline estimates (``bpu_macs_per_s``, ``bpu_bytes_per_s``, ...) in the same form."""
        cost = target.raw.get("cost") or {}
        raw = cost.get("bpu")
        if isinstance(raw, dict):
            return cls.from_dict(raw)
        need = ("bpu_macs_per_s", "bpu_bytes_per_s", "bpu_op_overhead_s", "int16_mac_factor", "int16_byte_factor")
        if not all(k in cost for k in need):
            raise TunerError(f"target {target.march}: cost.bpu (hbdk's fitted coefficients) or the roofline "
                             f"estimates ({', '.join(need)}) missing")
        return cls.from_roofline({k: float(cost[k]) for k in need}, target.march)

    @classmethod
    def from_roofline(cls, c: Mapping[str, float], march: str) -> BpuCoefficients:
        """A MAC rate and a byte rate (int16 slower by its factors), a fixed cost per layer: the model
        tuner had before hbdk was fitted, for marches without a fit."""
        fixed = c["bpu_op_overhead_s"] * 1e6
        us_mmac = 1e12 / c["bpu_macs_per_s"]
        us_kbyte = 1e9 / c["bpu_bytes_per_s"]
        lay = {}
        for kind in KINDS:
            for prec, mac_f, byte_f in (("int8", 1.0, 1.0), ("int16", c["int16_mac_factor"], c["int16_byte_factor"])):
                lay[(kind, prec)] = LayerPrice(fixed, us_mmac * mac_f if kind in MAC_KINDS else 0.0,
                                               us_kbyte * byte_f, us_kbyte * byte_f)
        return cls(layers=lay, terms={"io_kbyte": us_kbyte}, source=f"roofline estimates for {march} (no compiler fit)")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BpuCoefficients:
        lay = {}
        for kind, per in (raw.get("layers") or {}).items():
            if kind not in KINDS:
                raise TunerError(f"cost.bpu.layers: unknown kind {kind!r} (known: {', '.join(KINDS)})")
            for prec, values in (per or {}).items():
                if prec not in PRECISIONS or not isinstance(values, (list, tuple)) or len(values) != 4:
                    raise TunerError(f"cost.bpu.layers.{kind}.{prec}: expected [fixed_us, us_per_mmac, "
                                     "us_per_kelem_in, us_per_kelem_out]")
                lay[(kind, prec)] = LayerPrice.from_list(values)
        terms = {t: float(raw[t]) for t in GLOBAL_TERMS if t in raw}
        return cls(layers=lay, terms=terms, source=str(raw.get("source", "")))

    def to_dict(self) -> dict[str, Any]:
        lay: dict[str, dict[str, list[float]]] = {}
        for (kind, prec), price in sorted(self.layers.items(),
                                          key=lambda kv: (KINDS.index(kv[0][0]), PRECISIONS.index(kv[0][1]))):
            lay.setdefault(kind, {})[prec] = [round(v, 6) for v in price.as_list()]
        out: dict[str, Any] = {"source": self.source, "layers": lay}
        out.update({t: round(self.terms.get(t, 0.0), 6) for t in GLOBAL_TERMS})
        return out

    def price(self, kind: str, prec: str) -> LayerPrice:
        return self.layers.get((kind, prec)) or self.layers.get(("other", prec)) or LayerPrice()

    def scaled(self, scales: Mapping[str, float]) -> BpuCoefficients:
        """These coefficients refined for one model: ``int8``/``int16``/``io`` scale their terms, ``model``
        replaces the per-model constant (microseconds)."""
        terms = {k: v * scales.get(scale_of(k), 1.0) for k, v in self.terms.items() if k != "model"}
        terms["model"] = float(scales.get("model", self.terms.get("model", 0.0)))
        return replace(self, layers={k: p.scaled(scales.get(k[1], 1.0)) for k, p in self.layers.items()},
                       terms=terms)

    def us(self, features: Mapping[str, float]) -> float:
        """A subgraph's estimate from its features (:meth:`CostModel.features`, priced with these layers)."""
        return sum(x if k in PRECISIONS else self.terms.get(k, 0.0) * x for k, x in features.items())


@dataclass(frozen=True)
class ModelFit:
    """``tuner latency fit``'s result for one model: scales of the shipped coefficients (int8 layers,
    int16 layers, subgraph I/O) that make them reproduce hbdk on that model's compiles."""

    model_sha256: str
    march: str
    scales: Mapping[str, float]
    samples: tuple[dict[str, Any], ...] = ()      # per compile: name, hbdk_ms, modeled_ms before / after
    toolchain: str = ""
    created: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "scales": dict(self.scales), "samples": list(self.samples)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelFit:
        return cls(model_sha256=str(d["model_sha256"]), march=str(d["march"]),
                   scales={str(k): float(v) for k, v in dict(d["scales"]).items()},
                   samples=tuple(dict(s) for s in d.get("samples", ())), toolchain=str(d.get("toolchain", "")),
                   created=str(d.get("created", "")))

    def describe(self) -> str:
        s = ", ".join(f"{k} {v:+.0f} us" if k == "model" else f"{k} x{v:.2f}" for k, v in self.scales.items())
        return f"fitted to {len(self.samples)} real compile(s) of this model ({s})"


@dataclass(frozen=True)
class BoardFit:
    """board_ms = per_estimate x hbdk estimate + per_output_mb x MB of float32 model outputs + fixed_ms,
    for one board and firmware (``tuner latency board``, :mod:`tuner.cost.board`). Without a label (the
    target's ``cost.board``) only ``per_estimate`` applies and the switches are tuner's estimates; a
    board's fit (labelled) also replaces the estimates of the model outputs' transfer and the fixed cost."""

    per_estimate: float = 1.0
    per_output_mb: float = 0.0
    fixed_ms: float = 0.0
    label: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BoardFit:
        return cls(per_estimate=float(d.get("per_estimate", 1.0)), per_output_mb=float(d.get("per_output_mb", 0.0)),
                   fixed_ms=float(d.get("fixed_ms", 0.0)), label=str(d.get("label", d.get("source", ""))))


def load_profile(path: str | Path) -> dict[str, dict[str, float]]:
    """A measured per-node profile: ``{node: {bpu_ms: float, cpu_ms: float}}`` (YAML or JSON)."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{path}: profile file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TunerError(f"{path}: invalid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TunerError(f"{path}: expected a mapping of node name to {{bpu_ms, cpu_ms}}")
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or not set(entry) <= {"bpu_ms", "cpu_ms"}:
            raise TunerError(f"{path}: {name}: expected {{bpu_ms: number, cpu_ms: number}}")
        try:
            out[str(name)] = {k: float(v) for k, v in entry.items()}
        except (TypeError, ValueError):
            raise TunerError(f"{path}: {name}: times must be numbers (milliseconds)") from None
    return out


def fits_dir() -> Path:
    from tuner.files import cache_dir

    return cache_dir() / "latency"


def fit_path(model_sha256: str, march: str) -> Path:
    return fits_dir() / f"{model_sha256[:32]}-{march}.json"


def load_fit(model_sha256: str, march: str) -> ModelFit | None:
    """``tuner latency fit``'s result for this model and march, when one was made (None otherwise)."""
    path = fit_path(model_sha256, march)
    try:
        return ModelFit.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
