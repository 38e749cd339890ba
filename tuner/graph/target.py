"""Per-march tables (``search_spaces/targets/<march>.yaml``): what the BPU can run, in which dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    def bpu_capable(self, op_type: str) -> bool:
        return op_type in self.bpu_ops or op_type in self.bpu_default_cpu

    def int16_input(self, op_type: str) -> bool:
        return op_type in self.int16_ops or op_type in self.int16_input_only

    def int16_output(self, op_type: str) -> bool:
        return op_type in self.int16_ops


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

        return Target(
            march=raw["march"], bpu_ops=ops("bpu_ops"),
            bpu_default_cpu=ops("bpu_default_cpu"),
            int16_ops=ops("int16_ops"),
            int16_input_only=ops("int16_input_only"),
            weight_ops=weight_ops, int32_output_ops=ops("int32_output_ops"),
            passive_ops=frozenset(raw.get("passive_ops") or ()),
            same_scale_ops=frozenset(raw.get("same_scale_ops") or ()),
            lut_ops=ops("lut_ops") - {k for k, v in fused.items() if v not in ("Sigmoid", "HardSigmoid", "Tanh", "Erf")},
            quantize_bias=bool(raw.get("quantize_bias", True)),
            fusion_patterns=tuple(patterns), max_opset=limits.get("max_opset"),
            max_ir_version=limits.get("max_ir_version"), raw=raw)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TunerError(f"{path}: malformed target table ({type(exc).__name__}: {exc})") from None
