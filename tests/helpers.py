"""Small real ONNX models built with the onnx helper API, their data and hb_mapper YAML."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]


def _conv(name, x, cin, cout, rng, k=3, stride=1, bias=True):
    w = numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * (1.0 / np.sqrt(cin * k * k))).astype(np.float32), f"{name}.w")
    inits = [w]
    inputs = [x, w.name]
    if bias:
        b = numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{name}.b")
        inits.append(b)
        inputs.append(b.name)
    node = helper.make_node("Conv", inputs, [f"{name}_out"], name=name, pads=[k // 2] * 4, strides=[stride] * 2)
    return node, inits


def build_tiny_model(seed: int = 0) -> onnx.ModelProto:
    """Conv+BN+Relu, a residual Conv+Add+Relu, Sigmoid gate, Where (CPU-only), Concat, two heads.

    Input "x" [1,4,16,16]; outputs "seg" [1,3,16,16] and "depth" [1,1,16,16]; opset 11, ir 7.
    """
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    c1, i1 = _conv("/stem/Conv", "x", 4, 8, rng)
    nodes.append(c1), inits.extend(i1)
    bn = [numpy_helper.from_array(a.astype(np.float32), f"/stem/bn.{n}") for n, a in
          (("scale", 1 + 0.1 * rng.standard_normal(8)), ("bias", 0.1 * rng.standard_normal(8)),
           ("mean", 0.1 * rng.standard_normal(8)), ("var", 1 + 0.1 * rng.random(8)))]
    inits.extend(bn)
    nodes.append(helper.make_node("BatchNormalization", ["/stem/Conv_out"] + [t.name for t in bn], ["/stem/bn_out"],
                                  name="/stem/BatchNormalization"))
    nodes.append(helper.make_node("Relu", ["/stem/bn_out"], ["/stem/relu_out"], name="/stem/Relu"))
    c2, i2 = _conv("/res/Conv", "/stem/relu_out", 8, 8, rng)
    nodes.append(c2), inits.extend(i2)
    nodes.append(helper.make_node("Add", ["/res/Conv_out", "/stem/relu_out"], ["/res/add_out"], name="/res/Add"))
    nodes.append(helper.make_node("Relu", ["/res/add_out"], ["/res/relu_out"], name="/res/Relu"))
    # radar-like branch: gate from the last input channel, Where on a mask (CPU-only on bayes-e)
    c3, i3 = _conv("/gate/Conv", "x", 4, 8, rng, k=1)
    nodes.append(c3), inits.extend(i3)
    nodes.append(helper.make_node("Sigmoid", ["/gate/Conv_out"], ["/gate/sig_out"], name="/gate/Sigmoid"))
    nodes.append(helper.make_node("Mul", ["/res/relu_out", "/gate/sig_out"], ["/gate/mul_out"], name="/gate/Mul"))
    zero = numpy_helper.from_array(np.zeros((1,), np.float32), "zero")
    inits.append(zero)
    nodes.append(helper.make_node("Greater", ["/gate/Conv_out", "zero"], ["/gate/mask"], name="/gate/Greater"))
    nodes.append(helper.make_node("Where", ["/gate/mask", "/gate/mul_out", "/res/relu_out"], ["/gate/where_out"],
                                  name="/gate/Where"))
    nodes.append(helper.make_node("Concat", ["/gate/where_out", "/stem/relu_out"], ["/head/cat_out"], name="/head/Concat",
                                  axis=1))
    c4, i4 = _conv("/head/seg/Conv", "/head/cat_out", 16, 3, rng, k=1)
    c4.output[0] = "seg"
    nodes.append(c4), inits.extend(i4)
    c5, i5 = _conv("/head/depth/Conv", "/head/cat_out", 16, 1, rng, k=1)
    nodes.append(c5), inits.extend(i5)
    nodes.append(helper.make_node("Sigmoid", ["/head/depth/Conv_out"], ["/head/depth/sig"], name="/head/depth/Sigmoid"))
    scale = numpy_helper.from_array(np.array([80.0], np.float32), "/head/depth/mul_k")
    inits.append(scale)
    nodes.append(helper.make_node("Mul", ["/head/depth/sig", "/head/depth/mul_k"], ["depth"], name="/head/depth/Mul"))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("seg", TensorProto.FLOAT, [1, 3, 16, 16]),
                               helper.make_tensor_value_info("depth", TensorProto.FLOAT, [1, 1, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="tuner-tests")
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def tiny_sample(i: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + i)
    x = rng.random((1, 4, 16, 16), dtype=np.float32)
    x[:, 3] *= 50.0  # a channel on another scale, like radar range in metres
    return x


def hb_yaml(model_file: str, input_name: str, shape: str, calibration_type: str = "max", node_info: str = "{}",
            prefix: str = "tiny") -> str:
    """An hb_mapper YAML for a featuremap-input test model with its calibration data in ``cal/``."""
    return f"""\
model_parameters:
  onnx_model: '{model_file}'
  march: 'bayes-e'
  working_dir: 'model_output'
  output_model_file_prefix: '{prefix}'
  node_info: {node_info}
input_parameters:
  input_name: '{input_name}'
  input_type_train: 'featuremap'
  input_layout_train: 'NCHW'
  input_type_rt: 'featuremap'
  input_layout_rt: 'NCHW'
  input_shape: '{shape}'
  norm_type: 'no_preprocess'
calibration_parameters:
  cal_data_dir: 'cal'
  cal_data_type: 'float32'
  calibration_type: '{calibration_type}'
  per_channel: False
compiler_parameters:
  compile_mode: 'latency'
  optimize_level: 'O3'
  debug: False
  core_num: 1
"""


def write_tiny_project(root: Path, n: int = 8, calibration_type: str = "max", node_info: str = "{}") -> Path:
    """Write tiny.onnx, cal/NNNN.bin and hb_config.yaml into ``root``; return the YAML path."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(build_tiny_model(), str(root / "tiny.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    for i in range(n):
        tiny_sample(i).tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("tiny.onnx", "x", "1x4x16x16", calibration_type, node_info))
    return cfg




EXAMPLE = REPO / "examples" / "segdepth"


def write_example_project(root: Path, n_cal: int = 16, n_eval: int = 8) -> Path:
    """The bundled seg+depth example with freshly generated data in ``root``; returns its YAML."""
    import subprocess
    import sys

    import yaml

    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(root / "data"),
                    "--cal", str(n_cal), "--eval", str(n_eval)], check=True, capture_output=True)
    cfg = yaml.safe_load((EXAMPLE / "hb_config.yaml").read_text())
    cfg["model_parameters"]["onnx_model"] = str(EXAMPLE / "segdepth.onnx")
    cfg["calibration_parameters"]["cal_data_dir"] = "data/cal"
    path = root / "hb_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def write_tiny_space(root: Path, extra: str = "", n: int = 8) -> Path:
    """A search space over the tiny model (project in root/tiny); returns the space path."""
    cfg = write_tiny_project(root / "tiny", n=n)
    space = root / "space.yaml"
    space.write_text(f"""\
base: {cfg.relative_to(root).as_posix()}
calibration:
  calibration_type: [max, kl]
  max_percentile: [1.0, 0.9999]
  per_channel: [false, true]
objectives:
  mode: pareto
study:
  name: tiny
  seed: 3
  n_trials: 12
{extra}""")
    return space


def write_reciprocal_project(root: Path, n: int = 6) -> Path:
    """x -> Reciprocal -> y. Channel 0 holds values ~0.005, channel 1 ~50: one per-tensor int8
    scale rounds channel 0 to 0 and the quantized model outputs inf; per-channel scales do not."""
    root.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="/relu"),
             helper.make_node("Reciprocal", ["r"], ["y"], name="/reciprocal")]
    model = helper.make_model(helper.make_graph(nodes, "recip", [x], [y]), opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(root / "recip.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        a = np.empty((1, 2, 4, 4), np.float32)
        a[:, 0] = rng.uniform(0.004, 0.006, (4, 4))
        a[:, 1] = rng.uniform(40, 50, (4, 4))
        a.tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("recip.onnx", "x", "1x2x4x4", prefix="recip"))
    return cfg
