"""The segdepth example at the users' resolution: same weights, another static input size.

    python examples/segdepth/make_hires.py [--size 360x640] [--cal 8] [--eval 16] [--out DIR] [--no-check]

Derives the model from the bundled ``segdepth.onnx`` (96x160) without torch and writes, into
``DIR`` (default ``examples/segdepth/data/<H>x<W>/``, git-ignored; about 2 s, the check 3 s more):

* ``segdepth_<H>x<W>.onnx``  the same graph and initializers with input ``[1, 5, H, W]``;
* ``cal/``, ``eval/``, ``labels/``  data written by make_data.py's ``write``, from ``scenes.make_sample(i,
  split, size=(H, W))`` (the same seeds as the 96x160 data, pixel quantities scaled);
* ``hb_config.yaml``, ``search.yaml``  the example's config and search space pointed at them.

The derivation (``derive``): the graph's input and output shapes are set to H x W, the shape
constants of the slice assignment (``/Shape_output_0`` of the ``Expand``, ``/Concat_6_output_0``
of the ``Reshape``: ``[1, 1, 96, 160]``) become ``[1, 1, H, W]``, and shape inference runs again
(strict) so every tensor has a static shape. H and W must be multiples of 2 (the heads' x2
``Resize``). The encoder halves the size four times, rounding up, so with 360 rows the deepest
features have 23 rows and a x2 ``Resize`` gives 46, not the 45 rows of the skip it is
concatenated with: the network as written in train.py (``nn.Upsample(scale_factor=2)``) cannot
run at 360x640, in torch either. A decoder ``Resize`` whose x2 output does not match its
``Concat`` partner therefore resizes to the partner's size instead (ONNX ``sizes``, as
``F.interpolate(x, size=skip.shape[-2:])`` exports); where 2x matches, ``sizes`` and
``scales=2`` are the same operation, so at 96x160 the derivation is the bundled model.

The check (``check``), torch being no dependency of this repository: ``reference_forward`` is
an independent numpy (float64) transcription of ``SegDepthNet.forward`` in train.py, with
torch's bilinear interpolation (``align_corners=False``: source = (dst + 0.5) * in / out - 0.5,
clamped at 0), reading only the convolutions' folded weights from the ONNX file by node name.
The derived model run by onnxruntime must agree with it on a 360x640 scene (seg logits and
depth), and the 96x160 derivation must reproduce the bundled model's outputs. The same
reference checks the bundled model against its torch parity figures (see README).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
BASE_MODEL = HERE / "segdepth.onnx"
BASE_H, BASE_W = 96, 160
MAX_RANGE = 80.0


def _load(name: str):
    """A sibling script of this folder as a module (the example is no package)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


def parse_size(text: str) -> tuple[int, int]:
    h, _, w = text.lower().partition("x")
    size = int(h), int(w)
    if size[0] < 16 or size[1] < 16 or size[0] % 2 or size[1] % 2:
        raise ValueError(f"size {text!r}: HxW, both even and >= 16")
    return size


def _set_dims(vi: onnx.ValueInfoProto, h: int, w: int) -> None:
    dims = vi.type.tensor_type.shape.dim
    dims[2].dim_value, dims[3].dim_value = h, w


def _static_shapes(m: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = [d.dim_value for d in dims]
    return out


def derive(base: onnx.ModelProto, h: int, w: int) -> onnx.ModelProto:
    """The base model with a static [1, 5, h, w] input (see the module's docstring)."""
    m = onnx.ModelProto()
    m.CopyFrom(base)
    del m.graph.value_info[:]
    for vi in list(m.graph.input) + list(m.graph.output):
        _set_dims(vi, h, w)
    # Shape constants of the slice assignment (Expand / Reshape targets ending in the old H, W).
    shape_inputs = {n.input[1] for n in m.graph.node if n.op_type in ("Expand", "Reshape")}
    changed = 0
    for init in m.graph.initializer:
        if init.name in shape_inputs:
            a = numpy_helper.to_array(init)
            if a.ndim == 1 and a.size >= 2 and tuple(a[-2:]) == (BASE_H, BASE_W):
                a = a.copy()
                a[-2:] = (h, w)
                init.CopyFrom(numpy_helper.from_array(a, init.name))
                changed += 1
    if changed != 2:
        raise RuntimeError(f"expected the Expand and Reshape shape constants, found {changed}")
    # The decoder's x2 Resizes: where 2x is not the Concat partner's size, resize to that size.
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    shapes = _static_shapes(onnx.shape_inference.infer_shapes(m))  # the encoder's shapes are known
    for n in m.graph.node:
        if n.op_type != "Resize":
            continue
        concat = [c for c in m.graph.node if c.op_type == "Concat" and n.output[0] in c.input]
        if not concat:
            continue
        partner = next(i for i in concat[0].input if i != n.output[0])
        src, dst = shapes[n.input[0]], shapes[partner]
        scales = consts[n.input[2]]
        if [int(round(d * s)) for d, s in zip(src, scales)][2:] == dst[2:]:
            continue
        sizes = np.array(src[:2] + dst[2:], dtype=np.int64)
        name = f"{n.name}/sizes_{h}x{w}"
        m.graph.initializer.append(numpy_helper.from_array(sizes, name))
        empty = f"{n.name}/no_scales"
        m.graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), empty))
        n.input[:] = [n.input[0], n.input[1], empty, name]
        shapes = _static_shapes(onnx.shape_inference.infer_shapes(m))
    used = {i for n in m.graph.node for i in n.input}
    live = [n for n in m.graph.node if n.op_type != "Constant" or n.output[0] in used]  # the old scales
    del m.graph.node[:]
    m.graph.node.extend(live)
    m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    onnx.checker.check_model(m, full_check=True)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or not all(d.HasField("dim_value") for d in dims):
            raise RuntimeError(f"non-static shape after the derivation: {vi.name}")
    return m


# ----------------------------------------------------------------------------- the check
def _conv(x: np.ndarray, wgt: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """2-D convolution of x [C, H, W], 'same' padding k // 2, as nn.Conv2d (float64, im2col)."""
    k = wgt.shape[-1]
    p = k // 2
    c, hh, ww = x.shape
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    ho, wo = (hh + 2 * p - k) // stride + 1, (ww + 2 * p - k) // stride + 1
    cols = np.empty((c, k, k, ho, wo), dtype=np.float64)
    for i in range(k):
        for j in range(k):
            cols[:, i, j] = xp[:, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
    out = wgt.reshape(wgt.shape[0], -1).astype(np.float64) @ cols.reshape(c * k * k, ho * wo)
    return out.reshape(-1, ho, wo) + bias.astype(np.float64)[:, None, None]


def _interp_axis(x: np.ndarray, out: int, axis: int) -> np.ndarray:
    """torch's bilinear (align_corners=False) along one axis, to ``out`` samples."""
    n = x.shape[axis]
    src = np.maximum((np.arange(out, dtype=np.float64) + 0.5) * (n / out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    lam = src - i0
    shape = [1] * x.ndim
    shape[axis] = out
    lam = lam.reshape(shape)
    return np.take(x, i0, axis=axis) * (1.0 - lam) + np.take(x, i1, axis=axis) * lam


def _up(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return _interp_axis(_interp_axis(x, size[0], 1), size[1], 2)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference_forward(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SegDepthNet.forward (train.py) in numpy float64 on x [5, H, W]: (seg [4, H, W], depth [1, H, W]).

    The weights are the ONNX convolutions' (BatchNorm folded), found by node name; the decoder
    resizes each feature map to its skip's size (x2 where the sizes allow it)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    convs = {n.name: n for n in model.graph.node if n.op_type == "Conv"}

    def conv(name: str, v: np.ndarray, stride: int = 1) -> np.ndarray:
        n = convs[f"/{name}/Conv"]
        return _conv(v, inits[n.input[1]], inits[n.input[2]], stride)

    def relu(v: np.ndarray) -> np.ndarray:
        return np.maximum(v, 0.0)

    def res(prefix: str, v: np.ndarray) -> np.ndarray:
        y = relu(conv(f"{prefix}.1/conv1/conv", v))
        return relu(conv(f"{prefix}.1/conv2", y) + v)

    x = x.astype(np.float64)
    rgb, rng_m, valid = x[0:3], x[3:4], x[4:5]
    rng_n = rng_m * np.float64(np.float32(1.0 / MAX_RANGE))
    img = np.clip(conv("stem/conv", rgb, 2), 0.0, 6.0)
    rad = np.clip(conv("radar/conv", np.concatenate([rng_n, valid]), 2), 0.0, 6.0)
    gate = _sigmoid(conv("radar_gate", rad))
    f1 = relu(conv("fuse/conv", np.concatenate([img * gate, rad])))
    e2 = res("enc2/enc2", relu(conv("enc2/enc2.0/conv", f1, 2)))
    e3 = res("enc3/enc3", relu(conv("enc3/enc3.0/conv", e2, 2)))
    e4 = res("enc4/enc4", relu(conv("enc4/enc4.0/conv", e3, 2)))
    d3 = relu(conv("dec3/conv", np.concatenate([_up(e4, e3.shape[1:]), e3])))
    d2 = relu(conv("dec2/conv", np.concatenate([_up(d3, e2.shape[1:]), e2])))
    d1 = relu(conv("dec1/conv", np.concatenate([_up(d2, f1.shape[1:]), f1])))
    size = x.shape[1:]
    seg = _up(conv("seg_head/seg_head.1", relu(conv("seg_head/seg_head.0/conv", d1))), size)
    dh = _up(conv("depth_head/depth_head.1", relu(conv("depth_head/depth_head.0/conv", d1))), size)
    pred = _sigmoid(dh[0:1]) * MAX_RANGE
    alpha = _sigmoid(dh[1:2])
    depth = np.where(valid > 0.5, alpha * rng_m + (1.0 - alpha) * pred, pred)
    seg = seg.copy()
    seg[0:1] -= valid * np.float64(inits["sky_suppress"])
    return seg, depth


def run_onnx(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    seg, depth = s.run(["seg", "depth"], {"input": x[None].astype(np.float32)})
    return seg[0], depth[0]


def check(model: onnx.ModelProto, base: onnx.ModelProto, size: tuple[int, int], index: int = 0
          ) -> dict[str, float]:
    """Max |difference| of the derived model (onnxruntime) against reference_forward on eval scene
    ``index`` at ``size``, and of the 96x160 derivation against the bundled model."""
    scenes = _load("scenes")
    x = scenes.make_sample(index, "eval", size=size)[0]
    seg, depth = run_onnx(model, x)
    rseg, rdepth = reference_forward(base, x)
    x0 = scenes.make_sample(index, "eval")[0]
    bseg, bdepth = run_onnx(base, x0)
    dseg, ddepth = run_onnx(derive(base, BASE_H, BASE_W), x0)
    r0seg, r0depth = reference_forward(base, x0)
    return {
        "seg_vs_reference": float(np.abs(seg - rseg).max()),
        "depth_vs_reference": float(np.abs(depth - rdepth).max()),
        "seg_argmax_agreement": float((seg.argmax(0) == rseg.argmax(0)).mean()),
        "seg_range": float(np.abs(rseg).max()),
        "base_seg_vs_reference": float(np.abs(bseg - r0seg).max()),
        "base_depth_vs_reference": float(np.abs(bdepth - r0depth).max()),
        "base_seg_vs_derived": float(np.abs(bseg - dseg).max()),
        "base_depth_vs_derived": float(np.abs(bdepth - ddepth).max()),
    }


TOLERANCE = {"seg": 1e-3, "depth": 1e-2}  # logits span about +-12, depth 0..80 m; float32 vs float64


# ----------------------------------------------------------------------------- the files
def write_configs(out: Path, size: tuple[int, int], model_file: str) -> tuple[Path, Path]:
    """hb_config.yaml and search.yaml of the example, for this size and folder."""
    import yaml

    h, w = size
    cfg = yaml.safe_load((HERE / "hb_config.yaml").read_text(encoding="utf-8"))
    cfg["model_parameters"]["onnx_model"] = model_file
    cfg["model_parameters"]["output_model_file_prefix"] = f"segdepth_{h}x{w}"
    cfg["input_parameters"]["input_shape"] = f"1x5x{h}x{w}"
    cfg["calibration_parameters"]["cal_data_dir"] = "cal"
    cfg_path = out / "hb_config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    space = yaml.safe_load((HERE / "search.yaml").read_text(encoding="utf-8"))
    space["base"] = "hb_config.yaml"
    space["eval_data"] = "eval"
    space["labels"] = {"seg": "labels/seg_*.npy", "depth": "labels/depth_*.npy"}
    space.setdefault("study", {})["name"] = f"segdepth_{h}x{w}"
    space_path = out / "search.yaml"
    space_path.write_text(yaml.safe_dump(space, sort_keys=False), encoding="utf-8")
    return cfg_path, space_path


def default_out(size: tuple[int, int]) -> Path:
    return HERE / "data" / f"{size[0]}x{size[1]}"


def make(size: tuple[int, int], out: Path | None = None, n_cal: int = 8, n_eval: int = 16,
         verify: bool = True) -> Path:
    """Write the model, data and configs for ``size`` into ``out``; returns ``out``."""
    out = out or default_out(size)
    out.mkdir(parents=True, exist_ok=True)
    base = onnx.load(str(BASE_MODEL))
    model = derive(base, *size)
    if verify:
        d = check(model, base, size)
        bad = (max(d["seg_vs_reference"], d["base_seg_vs_reference"]) > TOLERANCE["seg"]
               or max(d["depth_vs_reference"], d["base_depth_vs_reference"]) > TOLERANCE["depth"]
               or d["base_seg_vs_derived"] > 1e-5 or d["base_depth_vs_derived"] > 1e-4)
        print("check: " + ", ".join(f"{k} {v:.3g}" for k, v in d.items()))
        if bad:
            raise SystemExit(f"the derived model disagrees with the reference (tolerance {TOLERANCE})")
    model_file = f"segdepth_{size[0]}x{size[1]}.onnx"
    onnx.save(model, str(out / model_file))
    _load("make_data").write(out, n_cal, n_eval, size)
    write_configs(out, size, model_file)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="360x640", help="HxW (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: data/<H>x<W> next to this file)")
    p.add_argument("--cal", type=int, default=8, help="calibration samples (default: 8)")
    p.add_argument("--eval", type=int, default=16, help="evaluation samples (default: 16)")
    p.add_argument("--no-check", action="store_true", help="skip the check against the numpy reference")
    a = p.parse_args(argv)
    try:
        size = parse_size(a.size)
    except ValueError as e:
        p.error(str(e))
    out = make(size, a.out, a.cal, a.eval, verify=not a.no_check)
    print(f"wrote {out}: segdepth_{size[0]}x{size[1]}.onnx, {a.cal} cal + {a.eval} eval samples "
          f"(float32 1x5x{size[0]}x{size[1]}), labels, hb_config.yaml, search.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
