"""One YAML through the real toolchain, measured as tuner measures its simulation: :class:`RealRun`.

:func:`measure` takes a conversion (:func:`tuner.toolchain.hbrun.convert`, cached), runs the
tool's quantized model (what the ``.bin`` computes) and calibrated model (its fake-quant model)
with hmct's executor on a simulator's data (:mod:`tuner.toolchain.hbexec`), and scores both against
the float model with the simulator's own scorer (:meth:`tuner.simulate.Simulator.score`): the
same samples, the same float reference, the same per-output metrics and task metrics as the
simulated figures it is compared with. It also reads the calibrated model's qtypes (which tensors
the tool made int16 / uint8) and keeps the conversion record (CPU nodes, subgraphs, hbdk's BPU
latency, the ``Select`` line, the tool's error when it refused the YAML).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import TunerError
from tuner.inputs.calibrated import read_calibrated
from tuner.metrics.accuracy import accuracy
from tuner.simulate import Simulator
from tuner.toolchain.hbexec import run_models
from tuner.toolchain.hbrun import Conversion
from tuner.toolchain.installed import Toolchain

MODELS = ("quantized", "calibrated")


@dataclass(frozen=True)
class ModelFigures:
    """One of the tool's models against the float model on one data set."""

    outputs: dict[str, dict[str, float]]        # per output: cosine, sqnr_db, l1, l2, max_abs, ...
    task: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def value(self, spec: str) -> float:
        """The accuracy objective ``spec`` (``mean_cosine``, ``miou:seg``, ...) of this model."""
        return accuracy(self.outputs, spec, self.task)

    @property
    def mean_cosine(self) -> float:
        return self.value("mean_cosine")

    def to_json(self) -> dict[str, Any]:
        return {"outputs": self.outputs, "task": self.task, "samples": self.samples}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelFigures:
        return cls(outputs=d["outputs"], task=d.get("task", {}), samples=int(d.get("samples", 0)))


@dataclass(frozen=True)
class RealRun:
    """The real toolchain's result for one YAML on one data set."""

    yaml: str
    data: str                                   # which data the models ran on
    conversion: Conversion
    quantized: ModelFigures | None = None
    calibrated: ModelFigures | None = None
    qtypes: dict[str, str] = field(default_factory=dict)   # calibrated activation tensor -> int8/int16/uint8 (ON only)
    float_tensors: tuple[str, ...] = ()         # calibration nodes the tool switched OFF
    seconds: float = 0.0                        # conversion (0 when cached) + the model runs
    error: str | None = None                    # why there are no figures (the tool refused the YAML, ...)

    @property
    def ok(self) -> bool:
        return self.conversion.ok and self.quantized is not None

    @property
    def int16_tensors(self) -> list[str]:
        return sorted(t for t, q in self.qtypes.items() if q == "int16")

    @property
    def uint8_tensors(self) -> list[str]:
        return sorted(t for t, q in self.qtypes.items() if q == "uint8")

    def qtype_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.qtypes.values():
            out[q] = out.get(q, 0) + 1
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        return {"yaml": self.yaml, "data": self.data, "conversion": self.conversion.to_json(),
                "quantized": self.quantized.to_json() if self.quantized else None,
                "calibrated": self.calibrated.to_json() if self.calibrated else None,
                "qtypes": self.qtypes, "float_tensors": list(self.float_tensors), "seconds": self.seconds,
                "error": self.error}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RealRun:
        return cls(yaml=d["yaml"], data=d["data"], conversion=Conversion.from_json(d["conversion"]),
                   quantized=ModelFigures.from_json(d["quantized"]) if d.get("quantized") else None,
                   calibrated=ModelFigures.from_json(d["calibrated"]) if d.get("calibrated") else None,
                   qtypes=dict(d.get("qtypes", {})), float_tensors=tuple(d.get("float_tensors", ())),
                   seconds=float(d.get("seconds", 0.0)), error=d.get("error"))


def measure(tc: Toolchain, conversion: Conversion, sim: Simulator, yaml: str, data_label: str,
            models: tuple[str, ...] = MODELS) -> RealRun:
    """Run the conversion's models on ``sim``'s data and score them; a refused conversion gives
    a RealRun with its error and no figures."""
    t0 = time.perf_counter()
    if not conversion.ok:
        return RealRun(yaml=yaml, data=data_label, conversion=conversion,
                       error=conversion.error or "hb_mapper did not convert the YAML")
    paths = [conversion.model(m) for m in models]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        return RealRun(yaml=yaml, data=data_label, conversion=conversion,
                       error=f"the conversion folder {conversion.folder} lacks {', '.join(missing)}")
    # an image input_type_rt: hb's models take the runtime colour values minus 128 (docs/hb_rules/input.md)
    feeds = sim.dataset.hb_feeds() if sim.dataset.has_input_path else sim.data
    outs = run_models(tc, paths, feeds, cache_dir=conversion.root)
    figures: dict[str, ModelFigures] = {}
    for name, o in zip(models, outs):
        per_output, task, _ = sim.score(o)
        figures[name] = ModelFigures(outputs=per_output, task=task, samples=len(o))
    qtypes: dict[str, str] = {}
    off: list[str] = []
    try:
        cal = read_calibrated(conversion.model("calibrated"))
        for n in cal.activations():
            if n.on:
                qtypes[n.tensor] = n.qtype
            else:
                off.append(n.tensor)
    except TunerError:
        pass
    return RealRun(yaml=yaml, data=data_label, conversion=conversion, quantized=figures.get("quantized"),
                   calibrated=figures.get("calibrated"), qtypes=qtypes, float_tensors=tuple(off),
                   seconds=round(conversion.seconds * (not conversion.cached) + time.perf_counter() - t0, 2))

