"""Per-march tables (``search_spaces/targets/<march>.yaml``): what the BPU can run, in which dtypes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import yaml

from tuner.errors import TunerError

TARGETS_DIR = Path(__file__).resolve().parents[2] / "search_spaces" / "targets"


@dataclass(frozen=True)
class FusionStep:
    ops: frozenset[str]
    optional: bool


@dataclass(frozen=True)
class Target:
    march: str
    bpu_ops: frozenset[str]
    bpu_default_cpu: frozenset[str]
    int16_ops: frozenset[str]
    int16_input_only: frozenset[str]
    weight_ops: dict[str, tuple[int, int]]
    int32_output_ops: frozenset[str]
    passive_ops: frozenset[str]
    same_scale_ops: frozenset[str]
    lut_ops: frozenset[str]
    quantize_bias: bool
    fusion_patterns: tuple[tuple[FusionStep, ...], ...]
    max_opset: int | None
    max_ir_version: int | None
    raw: dict[str, Any]
    # op -> the only input indices that may be int16 (MatMul: input 1 never, docs/hb_rules/ops.md S8)
    int16_inputs: dict[str, frozenset[int]] = field(default_factory=dict)
    # op -> ((attribute, limit), ...): the output is int8 only when a value of the attribute
    # exceeds its limit (dilated Conv, docs/hb_rules/ops.md S1)
    int8_output_only: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    # When hb_mapper sets a Conv's int16 input back to int8 at quantization (bayes-e, measured):
    # {"depthwise_max_stride": n, "int32_output_max_taps": n}; empty: never
    conv_int16_input_drop: dict[str, int] = field(default_factory=dict)
    # ops whose int16 refusal hb applies when calibrating: the tensor they read stays int8 for all readers
    int16_refused_at_calibration: frozenset[str] = frozenset()
    # hb's post-calibration rules (tuner.simulate.sharing, plan's high-precision outputs, one quantizer per
    # tensor for CPU readers); off in the onnxruntime-semantics oracle (tuner.simulate.oracle)
    post_calibration: bool = True

    def bpu_capable(self, op_type: str) -> bool:
        return op_type in self.bpu_ops or op_type in self.bpu_default_cpu

    def int16_input(self, op_type: str, k: int | None = None) -> bool:
        """Whether input ``k`` of an ``op_type`` node may be int16 (``k=None``: some input may)."""
        if op_type not in self.int16_ops and op_type not in self.int16_input_only:
            return False
        if op_type not in self.int16_inputs:
            return True
        return bool(self.int16_inputs[op_type]) if k is None else k in self.int16_inputs[op_type]

    def int16_input_indices(self, op_type: str) -> frozenset[int] | None:
        """The only inputs of ``op_type`` that may be int16, or None when any may."""
        return self.int16_inputs.get(op_type)

    def int16_output(self, op_type: str, node: onnx.NodeProto | None = None) -> bool:
        """Whether the output may be int16; with ``node``, its attributes are checked too."""
        return op_type in self.int16_ops and not (node is not None and self.output_int8_only(node))

    def output_int8_only(self, node: onnx.NodeProto) -> bool:
        """The node's attributes restrict its output to int8 (no int16, no int32), e.g. a Conv
        with a dilation above 1 (S1: "H或W大于1时，只支持输出int8")."""
        for attr, limit in self.int8_output_only.get(node.op_type, ()):
            a = next((a for a in node.attribute if a.name == attr), None)
            if a is not None and any(v > limit for v in (list(a.ints) or [a.i])):
                return True
        return False


def available_targets() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.yaml"))


def load_target(march_or_path: str | Path) -> Target:
    """Load a target by march name (``bayes-e``) or by the path of a target YAML."""
    path = Path(march_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = TARGETS_DIR / f"{march_or_path}.yaml"
    if not path.is_file():
        raise TunerError(f"no target table for march {str(march_or_path)!r}; tuner has "
                         f"{', '.join(available_targets())} (in search_spaces/targets/)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TunerError(f"{path}: invalid YAML: {exc}") from None
    try:
        weight_ops = {op: (int(v["input"]), int(v["axis"])) for op, v in (raw.get("weight_ops") or {}).items()}
        patterns = []
        for pattern in raw.get("fusion_patterns") or []:
            steps = []
            for step in pattern:
                step = str(step)
                optional = step.endswith("?")
                steps.append(FusionStep(frozenset(step.rstrip("?").split("|")), optional))
            patterns.append(tuple(steps))
        limits = raw.get("model_limits") or {}
        fused = {str(k): str(v) for k, v in (raw.get("fused_ops") or {}).items()}

        def ops(key: str) -> frozenset[str]:
            """A table's op set, with the fused kinds whose "like" op is in it."""
            base = frozenset(raw.get(key) or ())
            return base | {kind for kind, like in fused.items() if like in base}

        int16_inputs = _int16_inputs(path, raw.get("int16_inputs"))
        int8_only = _int8_output_only(path, raw.get("int8_output_only"))
        return Target(
            march=raw["march"], bpu_ops=ops("bpu_ops"),
            bpu_default_cpu=ops("bpu_default_cpu"),
            int16_ops=ops("int16_ops"),
            int16_input_only=ops("int16_input_only"),
            weight_ops=weight_ops, int32_output_ops=ops("int32_output_ops"),
            passive_ops=frozenset(raw.get("passive_ops") or ()),
            same_scale_ops=frozenset(raw.get("same_scale_ops") or ()),
            lut_ops=ops("lut_ops"),
            quantize_bias=bool(raw.get("quantize_bias", True)),
            fusion_patterns=tuple(patterns), max_opset=limits.get("max_opset"),
            max_ir_version=limits.get("max_ir_version"), raw=raw, int16_inputs=int16_inputs,
            int8_output_only=int8_only, conv_int16_input_drop=_int_mapping(path, "conv_int16_input_drop",
                                                                           raw.get("conv_int16_input_drop")),
            int16_refused_at_calibration=frozenset(raw.get("int16_refused_at_calibration") or ()))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TunerError(f"{path}: malformed target table ({type(exc).__name__}: {exc})") from None


def _int16_inputs(path: Path, value: Any) -> dict[str, frozenset[int]]:
    """``int16_inputs: {MatMul: [0]}``: op -> the input indices that may be int16."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TunerError(f"{path}: int16_inputs: expected a mapping op -> list of input indices, got {value!r}")
    out = {}
    for op, ks in value.items():
        if not isinstance(ks, list) or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in ks):
            raise TunerError(f"{path}: int16_inputs.{op}: expected a list of input indices (0, 1, ...), got {ks!r}")
        out[str(op)] = frozenset(ks)
    return out


def _int_mapping(path: Path, key: str, value: Any) -> dict[str, int]:
    """``key: {name: integer}`` (absent: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        raise TunerError(f"{path}: {key}: expected a mapping name -> integer, got {value!r}")
    return {str(k): int(v) for k, v in value.items()}


def _int8_output_only(path: Path, value: Any) -> dict[str, tuple[tuple[str, int], ...]]:
    """``int8_output_only: {Conv: {dilations: 1}}``: op -> attribute -> the largest value that
    still allows a non-int8 output."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TunerError(f"{path}: int8_output_only: expected a mapping op -> {{attribute: limit}}, got {value!r}")
    out = {}
    for op, limits in value.items():
        if not isinstance(limits, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                   for v in limits.values()):
            raise TunerError(f"{path}: int8_output_only.{op}: expected {{attribute: integer limit}}, "
                             f"e.g. {{dilations: 1}}, got {limits!r}")
        out[str(op)] = tuple((str(a), int(v)) for a, v in limits.items())
    return out
