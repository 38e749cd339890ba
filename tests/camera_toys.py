"""A camera-input toy for the input path tests (issue 26): Conv 3->8 3x3, Relu, Conv 8->4 1x1 on a 1x3x32x32
input, and uint8 RGB calibration images with chroma detail at the pixel level (sinusoids plus noise),
so 4:2:0 subsampling visibly costs accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MEAN = "123.675 116.28 103.53"
SCALE = "0.017125 0.017507 0.017429"


def camera_model(channels: int = 3, size: int = 32) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (8, channels, 3, 3)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 8).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["data", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["out"], name="conv2")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"),
                                                          (np.zeros(4, np.float32), "b2"))]
    g = helper.make_graph(nodes, "camera", [helper.make_tensor_value_info("data", TensorProto.FLOAT,
                                                                          [1, channels, size, size])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, size, size])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    return m


def camera_images(n: int = 8, channels: int = 3, size: int = 32) -> list[np.ndarray]:
    """``n`` 1xCxHxW uint8 images: per channel a random 2-D sinusoid plus noise (sigma 10), 0..255."""
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = []
    for _ in range(n):
        chans = []
        for _ in range(channels):
            f, p = rng.uniform(1, 6, 2), rng.uniform(0, 6, 2)
            chans.append(127.5 + 110 * np.sin(f[0] * 6.28 * yy + p[0]) * np.cos(f[1] * 6.28 * xx + p[1])
                         + rng.normal(0, 10, (size, size)))
        out.append(np.clip(np.rint(np.stack(chans)), 0, 255).astype(np.uint8)[None])
    return out


def write_camera_project(root: Path, type_rt: str = "nv12", type_train: str = "rgb",
                         norm: str = "data_mean_and_scale", mean: str = MEAN, scale: str = SCALE) -> Path:
    """camera.onnx, cal/NNNN.bin (uint8 RGB NCHW) and hb_config.yaml in ``root``; the YAML's path."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(camera_model(), str(root / "camera.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    for i, x in enumerate(camera_images()):
        (x if type_train == "rgb" else x[:, ::-1]).tofile(root / "cal" / f"{i:04d}.bin")
    lines = ["model_parameters:", "  onnx_model: 'camera.onnx'", "  march: 'bayes-e'",
             "  working_dir: 'model_output'", f"  output_model_file_prefix: 'camera_{type_rt}'",
             "input_parameters:", "  input_name: 'data'", f"  input_type_train: '{type_train}'",
             "  input_layout_train: 'NCHW'", f"  input_type_rt: '{type_rt}'"]
    if type_rt != "nv12":
        lines.append("  input_layout_rt: 'NHWC'")
    lines += ["  input_shape: '1x3x32x32'", f"  norm_type: '{norm}'"]
    if "mean" in norm:
        lines.append(f"  mean_value: '{mean}'")
    if "scale" in norm:
        lines.append(f"  scale_value: '{scale}'")
    lines += ["calibration_parameters:", "  cal_data_dir: 'cal'", "  cal_data_type: 'uint8'",
              "  calibration_type: 'max'", "compiler_parameters:", "  optimize_level: 'O0'", "  core_num: 1", ""]
    cfg = root / "hb_config.yaml"
    cfg.write_text("\n".join(lines))
    return cfg
