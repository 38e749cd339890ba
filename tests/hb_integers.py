"""Reading hb's integer tensors back from a toy's real conversion (tests of tuner.simulate.intconv and
intadd): the toy converted at O0, its quantized model run with hmct's executor on calibration samples with
every integer tensor (the ``*_quantized`` outputs of its Hz nodes) as a graph output, and the calibrated
model's per-tensor thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from helpers import hb_yaml, save_toy_model
from onnx import TensorProto, helper

#: the integer toys' input: one 1x8x16x16 tensor ``x``
TOY_SHAPE = (1, 8, 16, 16)


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def write_toy_project(root: Path, nodes, inits, outputs: list[str], node_info: dict, rng: np.random.Generator) -> Path:
    """The integer toys' project: ``toy.onnx`` reading ``x`` (TOY_SHAPE), six calibration samples of
    2 N(0, 1) in ``cal/`` and a max-calibrated YAML with ``node_info``; returns the YAML's path."""
    root.mkdir(parents=True, exist_ok=True)
    save_toy_model(root / "toy.onnx", nodes, inits, list(TOY_SHAPE), outputs)
    (root / "cal").mkdir(exist_ok=True)
    for i in range(6):
        (rng.standard_normal(TOY_SHAPE) * 2).astype(np.float32).tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("toy.onnx", "x", "x".join(map(str, TOY_SHAPE)), "max", json.dumps(node_info), prefix="toy"))
    return cfg


def convert_with_integer_outputs(hb_toolchain, cfg: Path, root: Path, shape: tuple[int, ...], samples: int = 2):
    """``(conversion, quantized model, samples, outputs of the first model)``: ``cfg`` converted at O0 and
    its quantized model run on its first ``samples`` calibration samples (``cal/NNNN.bin`` beside it, of
    ``shape``) with every int8 / int16 tensor an output."""
    from tuner.toolchain.hbexec import run_models
    from tuner.toolchain.hbrun import CompileKnobs, convert

    conv = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert conv.ok, conv.error
    model = onnx.load(str(conv.model("quantized")))
    bits = {o: attrs(n).get("output_bit", 8) for n in model.graph.node if n.op_type.startswith("HzS")
            or n.op_type == "HzQuantize" for o in n.output}
    types = {8: TensorProto.INT8, 16: TensorProto.INT16}
    for name, b in bits.items():
        if name.endswith("_quantized") and b in types:
            model.graph.output.append(helper.make_tensor_value_info(name, types[b], None))
    path = root / "extra.onnx"
    onnx.save(model, str(path))
    xs = [{"x": np.fromfile(cfg.parent / "cal" / f"{i:04d}.bin", np.float32).reshape(shape)} for i in range(samples)]
    return conv, model, xs, run_models(hb_toolchain, [path], xs)[0]


def calibrated_thresholds(calibrated: Path, outputs: bool = False) -> dict[str, tuple[float, str]]:
    """Tensor -> (threshold, qtype) of the per-tensor HzCalibration nodes, by the tensor each reads (and, with
    ``outputs``, by the tensor each writes too)."""
    out = {}
    for n in onnx.load(str(calibrated)).graph.node:
        if n.op_type == "HzCalibration":
            a = attrs(n)
            if a.get("thresholds") and len(a["thresholds"]) == 1:
                out[n.input[0]] = (a["thresholds"][0], a["qtype"].decode())
                if outputs:
                    out[n.output[0]] = out[n.input[0]]
    return out
