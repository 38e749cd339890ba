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


def save_toy_model(path: Path, nodes, inits, input_shape, outputs, graph_name: str | None = None) -> None:
    """An opset-11 (ir 7) model of ``nodes`` reading input ``x`` of ``input_shape``, written to ``path``
    (its folder created) with its outputs' shapes inferred and the model checked: the toys' common form."""
    g = helper.make_graph(nodes, graph_name or path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)],
                                                                ir_version=7))
    shapes = {v.name: v for v in model.graph.value_info}
    for o in model.graph.output:
        if o.name in shapes:
            o.CopyFrom(shapes[o.name])
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


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


def write_reciprocal_project(root: Path, n: int = 6, conv: bool = False, tap: bool = False) -> Path:
    """x -> Relu -> Reciprocal -> y. Channel 0 holds values ~0.005, channel 1 ~50: one per-tensor int8
    scale rounds channel 0 to 0 and the quantized model outputs inf; per-channel scales do not.
    ``conv``: an identity 1x1 Conv after the Reciprocal writes y, so that the Reciprocal's output is
    read by a BPU node (int8) instead of leaving the BPU in high precision (which makes the table and
    its input int16, as hb_mapper does at a model output). ``tap``: a second output ``z``, an identity
    1x1 Conv of the Relu output: a BPU reader, so the Relu output is quantized as that Conv reads it (int8)
    also for a CPU Reciprocal, instead of leaving the BPU in int16 (read only by the CPU)."""
    root.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="/relu"),
             helper.make_node("Reciprocal", ["r"], ["q" if conv else "y"], name="/reciprocal")]
    inits = []
    outs = [y]
    if conv or tap:
        inits = [numpy_helper.from_array(np.eye(2, dtype=np.float32).reshape(2, 2, 1, 1), "w")]
    if conv:
        nodes.append(helper.make_node("Conv", ["q", "w"], ["y"], name="/conv"))
    if tap:
        nodes.append(helper.make_node("Conv", ["r", "w"], ["z"], name="/tap"))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 4, 4]))
    model = helper.make_model(helper.make_graph(nodes, "recip", [x], outs, inits),
                              opset_imports=[helper.make_opsetid("", 11)])
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


def build_int16_rules_model(seed: int = 0) -> onnx.ModelProto:
    """The ops whose int16 rules differ on bayes-e: a plain Conv, a dilated Conv, a ConvTranspose
    (int8 only) feeding a Conv, and a MatMul of two activations.

    x [1,2,8,8] -> /cancel/Conv (1x1, weights +-10: its output 10*(x0 - x1) is small while
    max|w| * max|x| is large) -> Sigmoid -> /dil/Conv (3x3, dilations 2) -> Tanh ->
    /up/ConvTranspose (stride 2) -> /up/Conv (1x1) -> Reshape [1,4,256] -> MatMul(a, a^T) -> "y" [1,4,4].
    Opset 11, ir 7.
    """
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array([[10.0, -10.0], [-10.0, 10.0]], np.float32).reshape(2, 2, 1, 1),
                                     "/cancel/Conv.w"),
             numpy_helper.from_array((rng.standard_normal((4, 2, 3, 3)) * 0.3).astype(np.float32), "/dil/Conv.w"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 2, 2)) * 0.3).astype(np.float32), "/up/ConvTranspose.w"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32), "/up/Conv.w"),
             numpy_helper.from_array(np.array([1, 4, 256], np.int64), "/mm/shape")]
    nodes = [
        helper.make_node("Conv", ["x", "/cancel/Conv.w"], ["/cancel/Conv_out"], name="/cancel/Conv"),
        helper.make_node("Sigmoid", ["/cancel/Conv_out"], ["/cancel/sig"], name="/cancel/Sigmoid"),
        helper.make_node("Conv", ["/cancel/sig", "/dil/Conv.w"], ["/dil/Conv_out"], name="/dil/Conv",
                         dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Tanh", ["/dil/Conv_out"], ["/dil/tanh"], name="/dil/Tanh"),
        helper.make_node("ConvTranspose", ["/dil/tanh", "/up/ConvTranspose.w"], ["/up/ct"], name="/up/ConvTranspose",
                         strides=[2, 2]),
        helper.make_node("Conv", ["/up/ct", "/up/Conv.w"], ["/up/Conv_out"], name="/up/Conv"),
        helper.make_node("Reshape", ["/up/Conv_out", "/mm/shape"], ["/mm/a"], name="/mm/Reshape"),
        helper.make_node("Transpose", ["/mm/a"], ["/mm/at"], name="/mm/Transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["/mm/a", "/mm/at"], ["y"], name="/mm/MatMul"),
    ]
    graph = helper.make_graph(nodes, "int16_rules", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="tuner-tests")
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def write_int16_rules_project(root: Path, n: int = 6, amplitude: float = 1.0) -> Path:
    """:func:`build_int16_rules_model` with calibration data in which x0 and x1 nearly cancel
    (x1 uniform in +-``amplitude``)."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(build_int16_rules_model(), str(root / "rules.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(n):
        x = np.empty((1, 2, 8, 8), np.float32)
        x[:, 1] = rng.uniform(-amplitude, amplitude, (8, 8))
        x[:, 0] = x[:, 1] + rng.normal(0, 0.003, (8, 8))
        x.tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("rules.onnx", "x", "1x2x8x8", prefix="rules"))
    return cfg


def write_mix_project(root: Path, n: int = 8) -> Path:
    """Two inputs whose tensors want different calibration methods (for ``mix``).

    ``u``: N(0, 1) with one huge outlier (200, in sample 3): ``max`` spends the int8 grid on the
    outlier and crushes the bulk; clipping methods (kl, max-percentile) keep it. ``v``: faint noise
    (0.02 N(0, 1)) and one spike of 30 in sample 0, which carries that sample's output: clipping it
    (max-percentile: hmct's kernel takes the 2nd largest of the 8 x 4096 values; kl: 3.88) is what
    hurts, ``max`` keeps it.
    y_u = |u| * 2 and y_v = |v| * 2 are the outputs.
    """
    root.mkdir(parents=True, exist_ok=True)
    shape = [1, 1, 64, 64]
    ins = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in ("u", "v")]
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in ("y_u", "y_v")]
    two = numpy_helper.from_array(np.array([2.0], np.float32), "two")
    nodes = [helper.make_node("Abs", ["u"], ["au"], name="/u/Abs"), helper.make_node("Mul", ["au", "two"], ["y_u"], name="/u/Mul"),
             helper.make_node("Abs", ["v"], ["av"], name="/v/Abs"), helper.make_node("Mul", ["av", "two"], ["y_v"], name="/v/Mul")]
    model = helper.make_model(helper.make_graph(nodes, "mix", ins, outs, [two]), opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(root / "mix.onnx"))
    rng = np.random.default_rng(11)
    for name in ("u", "v"):
        (root / f"cal_{name}").mkdir(exist_ok=True)
    for i in range(n):
        u = rng.standard_normal(shape).astype(np.float32)
        if i == 3:
            u[0, 0, 5, 5] = 200.0
        v = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if i == 0:
            v[0, 0, 5, 5] = 30.0
        u.tofile(root / "cal_u" / f"{i:04d}.bin")
        v.tofile(root / "cal_v" / f"{i:04d}.bin")
    text = hb_yaml("mix.onnx", "u;v", "1x1x64x64;1x1x64x64", prefix="mix")
    text = (text.replace("input_type_train: 'featuremap'", "input_type_train: 'featuremap;featuremap'")
            .replace("input_layout_train: 'NCHW'", "input_layout_train: 'NCHW;NCHW'")
            .replace("input_type_rt: 'featuremap'", "input_type_rt: 'featuremap;featuremap'")
            .replace("input_layout_rt: 'NCHW'", "input_layout_rt: 'NCHW;NCHW'")
            .replace("norm_type: 'no_preprocess'", "norm_type: 'no_preprocess;no_preprocess'")
            .replace("cal_data_dir: 'cal'", "cal_data_dir: 'cal_u;cal_v'")
            .replace("cal_data_type: 'float32'", "cal_data_type: 'float32;float32'")
            .replace("calibration_type: 'max'", "calibration_type: 'mix'"))
    cfg = root / "hb_config.yaml"
    cfg.write_text(text)
    return cfg


class Toy:
    """A small opset-11 model written node by node (x: [1, 8, 16, 16])."""

    def __init__(self, channels=8, size=16):
        self.rng = np.random.default_rng(0)
        self.nodes: list = []
        self.inits: list = []
        self.shape = [1, channels, size, size]

    def conv(self, name, x, cin, cout, k=3, stride=1, group=1, out=None):
        w = numpy_helper.from_array((self.rng.standard_normal((cout, cin // group, k, k)) * 0.3).astype(np.float32),
                                    f"{name}.w")
        self.inits.append(w)
        out = out or f"{name}_out"
        self.nodes.append(helper.make_node("Conv", [x, w.name], [out], name=name, pads=[k // 2] * 4,
                                           strides=[stride] * 2, group=group))
        return out

    def op(self, op_type, name, inputs, **attrs):
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def const(self, name, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def project(self, root, outputs, name="toy", node_info="{}", n=6, sample=None):
        """The model, ``n`` calibration samples (``sample(rng)``, default N(0, 1)) and an hb_mapper YAML in
        ``root``: the YAML's path (for a Workspace, or the real toolchain)."""
        save_toy_model(root / f"{name}.onnx", self.nodes, self.inits, self.shape, outputs)
        (root / "cal").mkdir(exist_ok=True)
        rng = np.random.default_rng(1)
        for i in range(n):
            x = sample(rng) if sample else rng.standard_normal(self.shape)
            np.asarray(x, np.float32).tofile(root / "cal" / f"{i:04d}.bin")
        cfg = root / "hb_config.yaml"
        cfg.write_text(hb_yaml(f"{name}.onnx", "x", "x".join(map(str, self.shape)), node_info=node_info, prefix=name))
        return cfg

    def graph(self, outputs):
        g = helper.make_graph(self.nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], self.inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
        model.ir_version = 7
        from tuner.graph import Graph

        return Graph(onnx.shape_inference.infer_shapes(model))


def decoder_toy(tap_maxpool: bool = False) -> tuple[Toy, list[str]]:
    """x -> Conv_s (skip); Conv_s -> Conv_1 + Relu -> Resize -> Concat(., skip) -> Conv_2 -> Relu_2 -> Conv_3
    (``tap_maxpool``: a MaxPool of the skip read by Conv_4 and Conv_5 too): the toy and its outputs."""
    t = Toy()
    s = t.conv("/conv_s", "x", 8, 8)
    a = t.op("Relu", "/relu_1", [t.conv("/conv_1", s, 8, 8)])
    up = t.op("Resize", "/up", [a, t.const("roi", []), t.const("scales", [1, 1, 1, 1])], mode="nearest")
    cat = t.op("Concat", "/cat", [up, s], axis=1)
    b = t.op("Relu", "/relu_2", [t.conv("/conv_2", cat, 16, 8)])
    outs = [t.conv("/conv_3", b, 8, 8)]
    if tap_maxpool:
        pool = t.op("MaxPool", "/pool", [s], kernel_shape=[3, 3], pads=[1] * 4)
        outs += [t.conv("/conv_4", pool, 8, 8), t.conv("/conv_5", pool, 8, 8)]
    return t, outs
