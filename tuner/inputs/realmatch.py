"""hb_mapper's calibrated model addressed to tuner's graph by float values, and the loader.

:func:`load_thresholds` reads a ``*_calibrated_model.onnx`` (tuner.inputs.calibrated) and maps it
to tuner's graph by names, then by float values (:func:`match_by_value`): it runs the float graph
hb_mapper calibrated (tuner.inputs.hzops) next to tuner's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from tuner.errors import TunerError
from tuner.graph import Graph
from tuner.inputs.calibrated import CalibratedModel, read_calibrated
from tuner.inputs.calibrated_map import HbGraph, MappedThresholds, counterpart, map_to_graph
from tuner.inputs.hzops import plain_model
from tuner.runtime.session import make_session, with_outputs

#: relative L2 distance under which two float tensors are the same tensor (hb_mapper's folding of a
#: BatchNormalization changes float rounding by ~1e-6)
SAME_VALUES = 1e-4
#: element differences up to this are float noise, whatever the tensor's size
ABS_NOISE = 1e-6


def match_by_value(cal: CalibratedModel, tuner_model: onnx.ModelProto, graph: Graph,
                   sample: dict[str, np.ndarray]) -> dict[str, str | None]:
    """Every float tensor of hb_mapper's calibrated graph -> the tuner tensor holding the same float
    values on ``sample`` (None: none does).

    Names alone mislead: hb_mapper's optimizer folds a BatchNormalization into the Conv before it and
    the Conv's output keeps the Conv's name, with the BatchNormalization's values (PP-OCRv4: tuner's
    ``conv2d_450.tmp_0`` is the value before the BatchNormalization, hb_mapper's the one after). So
    the calibrated model is run with every calibration node switched off (the float graph hb_mapper
    calibrated: its ``*_optimized_float_model.onnx`` plus the stand-ins of
    :mod:`tuner.toolchain.calibrated_run`) next to tuner's float graph, on one sample. A tensor maps to
    the tuner tensor of its name (or its producer's, see :func:`counterpart`) when their values
    agree, else to a tuner tensor of the same shape that agrees (the closest), else to nothing."""

    hb = HbGraph(cal.proto)
    hb_model = plain_model(cal)
    try:
        inferred = onnx.shape_inference.infer_shapes(hb_model)
    except Exception:
        inferred = hb_model
    floats = {vi.name for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
              if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    hb_names = sorted(t for t in hb.tensors if t not in hb.initializers and t in floats)
    mine = [t for t in graph.activation_tensors() if graph.is_float(t)]
    try:
        hb_sess = make_session(with_outputs(hb_model, hb_names))
        feed = {i.name: sample[i.name] for i in hb_sess.get_inputs() if i.name in sample}
        hb_values = dict(zip(hb_names, hb_sess.run(hb_names, feed)))
        tu_sess = make_session(with_outputs(tuner_model, mine))
        tu_values = dict(zip(mine, tu_sess.run(mine, {i.name: sample[i.name] for i in tu_sess.get_inputs()})))
    except Exception as exc:   # onnxruntime's own errors: fall back to the names (the caller says so)
        raise TunerError(f"{cal.path}: cannot run its float graph next to tuner's to match tensors by value: "
                         f"{str(exc).splitlines()[0][:200]}") from None
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for t in mine:
        by_shape.setdefault(np.shape(tu_values[t]), []).append(t)
    tensors = set(mine)

    def distance(a: np.ndarray, b: np.ndarray) -> float:
        """Relative L2 distance; 0 when no element differs by more than float noise (a Sigmoid output
        near 0 everywhere, PP-OCRv4's on a photo without text, has a relative distance of 0.08 from
        1e-7 differences)."""
        a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        if a64.size and float(np.abs(a64 - b64).max()) <= ABS_NOISE:
            return 0.0
        norm = max(float(np.linalg.norm(a64)), float(np.linalg.norm(b64)), 1e-12)
        return float(np.linalg.norm(a64 - b64)) / norm

    out: dict[str, str | None] = {}
    claimed = {t for t in hb_names if t in tensors}     # tuner tensors that have a namesake in hb's graph
    for t in hb_names:
        v = np.asarray(hb_values[t])
        if v.dtype.kind != "f":
            continue
        named = counterpart(t, hb, graph, tensors)
        if named is None:
            out[t] = None      # a tensor of hb's own rewrites: equal values would be a coincidence of the data
            continue
        if np.shape(tu_values[named]) == v.shape and distance(v, tu_values[named]) < SAME_VALUES:
            out[t] = named
            continue
        # the name misleads (a folded node): the tuner tensor holding these values, not one with a namesake
        best, best_d = None, SAME_VALUES
        for cand in by_shape.get(v.shape, ()):
            if cand in claimed:
                continue
            d = distance(v, tu_values[cand])
            if d < best_d:
                best, best_d = cand, d
        out[t] = best
    return out


def address(cal: CalibratedModel, graph: Graph, onnx_model: onnx.ModelProto | None,
            tuner_model: onnx.ModelProto | None = None, sample: dict[str, np.ndarray] | None = None) -> MappedThresholds:
    """:func:`map_to_graph` by names (a file of another model is an error there), then, with tuner's
    float model and a sample, again with the tensors matched by value (:func:`match_by_value`); when
    the float graphs cannot be run side by side, the names stand and a note says so."""
    by_name = map_to_graph(cal, graph, onnx_model)
    if tuner_model is None or sample is None:
        return by_name
    try:
        matches = match_by_value(cal, tuner_model, graph, sample)
    except TunerError as exc:
        return replace(by_name, notes=(f"{exc}; tensors matched by name only",))
    return map_to_graph(cal, graph, onnx_model, matches)


def load_thresholds(path: str | Path, graph: Graph, model_path: str | Path,
                    tuner_model: onnx.ModelProto | None = None,
                    sample: dict[str, np.ndarray] | None = None) -> MappedThresholds:
    """The real thresholds of the calibrated model at ``path``, addressed to ``graph`` (loaded
    from the ONNX at ``model_path``, whose tensor names tell a fused tensor from a wrong one).
    With tuner's float model and one ``sample``, tensors are matched by their float values
    (:func:`address`), else by their names only."""
    return address(read_calibrated(path), graph, onnx.load(str(model_path), load_external_data=False), tuner_model,
                   sample)
