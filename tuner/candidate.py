"""A candidate configuration: calibration settings plus per-node placement and precision.

It is an immutable, hashable value, so it can key caches and be compared, and it converts
exactly to and from the hb_mapper YAML fields it stands for (``model_parameters.node_info``
in dict form, ``calibration_parameters``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.errors import TunerError
from tuner.inputs.config import HbConfig, parse_node_info

# The values hb_mapper accepts (docs/hb_rules/config.md §4); a candidate never holds anything it would reject.
CALIBRATION_TYPES = ("default", "mix", "kl", "max", "load", "skip")
#: hb_mapper's max_percentile default: percentile 1.0 is the plain abs-max (a search space lists it as the value).
PLAIN_MAX_PERCENTILE = 1.0
_INPUT_K = re.compile(r"^InputType(\d+)$")


@dataclass(frozen=True)
class Calibration:
    """``calibration_parameters`` that shape the quantization thresholds.

    One vocabulary, normalised here and only here: ``max_percentile`` is a float below 1 for
    max-percentile, else None. Percentile 1.0 (hb_mapper's default, a space's plain-max
    value) *is* plain max, and a percentile means nothing to another calibration_type, so
    both become None: two spellings of one configuration compare, hash and key equal.
    """

    type: str = "default"
    max_percentile: float | None = None
    per_channel: bool = False
    asymmetric: bool = False

    def __post_init__(self) -> None:
        if self.type not in CALIBRATION_TYPES:
            raise TunerError(f"calibration_type {self.type!r} is not one of {', '.join(CALIBRATION_TYPES)}")
        if self.max_percentile is not None:
            p = float(self.max_percentile)
            if not 0.0 < p <= 1.0:
                raise TunerError(f"max_percentile must be in (0, 1], got {self.max_percentile}")
            object.__setattr__(self, "max_percentile", p if self.type == "max" and p < PLAIN_MAX_PERCENTILE else None)

    @property
    def percentile_value(self) -> float:
        """``max_percentile`` as a search space lists it (plain max: 1.0)."""
        return PLAIN_MAX_PERCENTILE if self.max_percentile is None else self.max_percentile

    @classmethod
    def parse(cls, spec: str) -> Calibration:
        """A short command-line form: ``max``, ``kl``, ``max:0.99995`` (percentile), ``+pc``
        for per-channel, e.g. ``max:0.99995+pc``."""
        text = spec.strip()
        per_channel = text.endswith("+pc")
        if per_channel:
            text = text[: -len("+pc")]
        ctype, _, pct = text.partition(":")
        if ctype not in ("max", "kl"):
            raise TunerError(f"calibration {spec!r}: expected max, kl, max:PERCENTILE, optionally +pc "
                             "(e.g. max:0.99995+pc)")
        if pct and ctype != "max":
            raise TunerError(f"calibration {spec!r}: a percentile applies to max only (max:0.99995)")
        try:
            percentile = float(pct) if pct else None
        except ValueError:
            raise TunerError(f"calibration {spec!r}: {pct!r} is not a number (max:0.99995)") from None
        return cls(type=ctype, max_percentile=percentile, per_channel=per_channel)

    def describe(self) -> str:
        """The method string as hb_mapper logs it (``Select <method> method.``).

        Format of horizon_nn's ``CalibrationMethod.__str__`` [docs/hb_rules/quantizer.md §2.2, src 24158003755]: the
        kernel parameters (``num_bin``/``max_num_bin`` for kl, ``percentile`` for max-percentile),
        then ``per_channel``, then ``asymmetric``, comma-joined after one colon; a method without any
        is its bare name: ``max``, ``max:per_channel``, ``max:per_channel,asymmetric``,
        ``max-percentile:percentile=0.99995,per_channel``, ``kl:num_bin=1024,max_num_bin=16384``.
        The percentile is printed as Python prints the float (the source formats it with an
        f-string), so 0.999995 keeps its seven digits (``%g`` would print 1).
        """
        params = []
        if self.max_percentile is not None:
            name = "max-percentile"
            params.append(f"percentile={float(self.max_percentile)!r}")
        elif self.type == "kl":
            name = "kl"
            params += ["num_bin=1024", "max_num_bin=16384"]
        else:
            name = self.type
        if self.per_channel:
            params.append("per_channel")
        if self.asymmetric:
            params.append("asymmetric")
        return f"{name}:{','.join(params)}" if params else name


@dataclass(frozen=True)
class NodeSetting:
    """One ``node_info`` entry. ``None`` means "not set" (hb_mapper decides)."""

    on: str | None = None
    input_type: str | None = None
    input_types: tuple[tuple[int, str], ...] = ()
    output_type: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> NodeSetting:
        per_input = []
        for key, value in d.items():
            m = _INPUT_K.match(key)
            if m:
                per_input.append((int(m.group(1)), value))
        return cls(on=d.get("ON"), input_type=d.get("InputType"), input_types=tuple(sorted(per_input)),
                   output_type=d.get("OutputType"))

    def to_dict(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.on is not None:
            out["ON"] = self.on
        if self.input_type is not None:
            out["InputType"] = self.input_type
        for k, v in self.input_types:
            out[f"InputType{k}"] = v
        if self.output_type is not None:
            out["OutputType"] = self.output_type
        return out

    def input_dtype(self, k: int) -> str | None:
        """dtype asked for input k: ``InputType<k>`` wins over ``InputType``."""
        for idx, v in self.input_types:
            if idx == k:
                return v
        return self.input_type

    @property
    def empty(self) -> bool:
        return not self.to_dict()


@dataclass(frozen=True)
class Candidate:
    """Calibration plus per-node settings (sorted by node name, so equal configs compare equal)."""

    calibration: Calibration = field(default_factory=Calibration)
    nodes: tuple[tuple[str, NodeSetting], ...] = ()
    optimization: tuple[str, ...] = ()

    @classmethod
    def make(cls, calibration: Calibration | None = None,
             nodes: Mapping[str, NodeSetting | dict[str, Any]] | None = None,
             optimization: tuple[str, ...] = ()) -> Candidate:
        items = []
        for name, s in (nodes or {}).items():
            setting = s if isinstance(s, NodeSetting) else NodeSetting.from_dict(s)
            if not setting.empty:
                items.append((name, setting))
        return cls(calibration or Calibration(), tuple(sorted(items)), tuple(optimization))

    @classmethod
    def from_config(cls, cfg: HbConfig, node_info_supported: bool = True) -> Candidate:
        """The candidate a YAML describes. Without node_info support (bernoulli2) only the
        legacy ``run_on_cpu``/``run_on_bpu`` lists count, as on the real tool."""
        cal = Calibration(type=cfg.calibration_type, max_percentile=cfg.max_percentile,
                          per_channel=cfg.per_channel, asymmetric="asymmetric" in cfg.optimization)
        nodes = cfg.node_info if node_info_supported else cfg.legacy_placement
        return cls.make(cal, {k: NodeSetting.from_dict(v) for k, v in nodes.items()},
                        tuple(o for o in cfg.optimization if o != "asymmetric"))

    @classmethod
    def from_yaml_fields(cls, fields: dict[str, Any]) -> Candidate:
        """Inverse of :meth:`to_yaml_fields` (and of any hb_mapper YAML's two sections)."""
        mp = fields.get("model_parameters") or {}
        cp = fields.get("calibration_parameters") or {}
        node_info = parse_node_info("model_parameters.node_info", mp.get("node_info"))
        opts = tuple(o.strip() for o in re.split(r"[,;]", cp.get("optimization") or "") if o.strip())
        ctype = cp.get("calibration_type", "default")
        cal = Calibration(type=ctype, max_percentile=cp.get("max_percentile"),
                          per_channel=bool(cp.get("per_channel", False)), asymmetric="asymmetric" in opts)
        return cls.make(cal, node_info, tuple(o for o in opts if o != "asymmetric"))

    def to_yaml_fields(self) -> dict[str, Any]:
        """The two YAML sections this candidate sets; merge them into the user's base YAML."""
        cp: dict[str, Any] = {"calibration_type": self.calibration.type}
        if self.calibration.max_percentile is not None:
            cp["max_percentile"] = self.calibration.max_percentile
        if self.calibration.type in ("max", "kl"):
            cp["per_channel"] = bool(self.calibration.per_channel)
        opts = list(self.optimization) + (["asymmetric"] if self.calibration.asymmetric else [])
        if opts:
            cp["optimization"] = ",".join(opts)
        mp: dict[str, Any] = {}
        if self.nodes:
            mp["node_info"] = {name: s.to_dict() for name, s in self.nodes}
        return {"model_parameters": mp, "calibration_parameters": cp}

    def setting(self, node: str) -> NodeSetting:
        for name, s in self.nodes:
            if name == node:
                return s
        return NodeSetting()

    def with_calibration(self, calibration: Calibration) -> Candidate:
        return replace(self, calibration=calibration)

    def key(self) -> str:
        """Stable short hash of the candidate, for caches and de-duplication."""
        blob = json.dumps({"cal": [self.calibration.type, self.calibration.max_percentile,
                                   self.calibration.per_channel, self.calibration.asymmetric],
                           "nodes": [[n, s.to_dict()] for n, s in self.nodes],
                           "opt": list(self.optimization)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
