"""A real pretrained model on real photographs: PP-OCRv4's text detector on scikit-image's bundled images.

The detector ships inside the PyPI package ``rapidocr-onnxruntime`` (``models/ch_PP-OCRv4_det_infer.onnx``:
opset 12, dynamic input ``x`` [N,3,H,W], DBNet probability map ``sigmoid_0.tmp_0`` [N,1,H,W]).
The photographs are the ones scikit-image bundles in its wheel (no download).

Preprocessing follows rapidocr's ``ch_ppocr_det.utils.DetPreProcess``: BGR channel order (rapidocr
loads images with OpenCV), bilinear resize to multiples of 32, ``(x / 255 - 0.5) / 0.5``, HWC -> 1xCxHxW.
Unlike rapidocr we resize every photo to one fixed size (calibration and ``input_shape`` need one
shape) and use scikit-image's resize instead of OpenCV's (rapidocr needs cv2, which we don't install).

PP-OCR mobile v2.0's text-direction classifier ships in the same package
(``models/ch_ppocr_mobile_v2.0_cls_infer.onnx``: opset 11, input ``x`` [N,3,48,192], two-class Softmax
``save_infer_model/scale_0.tmp_1``, 0 or 180 degrees): :func:`write_cls_project`, on strips of scikit-image's
printed page and handwritten board (:func:`cls_samples`).

Used by ``tests/simulate/test_ppocr.py``, ``tests/fidelity_suite.py``, ``benchmarks/trial_cost.py`` and
``benchmarks/quality_models.py``.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
from helpers import hb_yaml
from onnx import numpy_helper

DET_MODEL = "ch_PP-OCRv4_det_infer.onnx"
#: Bundled with scikit-image 0.2x (loadable offline); two of them contain printed text.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "page", "text", "camera", "immunohistochemistry")
HEIGHT, WIDTH = 256, 320
MEAN, STD = 0.5, 0.5



def det_model_path() -> Path | None:
    """The detector inside the installed rapidocr_onnxruntime, or None when it is not installed.

    The package is located without importing it: its ``__init__`` imports cv2, which the
    simulator does not need (CI installs rapidocr with ``--no-deps``).
    """
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "models" / DET_MODEL
        if path.is_file():
            return path
    return None


def load_photo(name: str) -> np.ndarray:
    """An HxWx3 uint8 RGB image from ``skimage.data`` (grayscale ones are replicated to 3 channels)."""
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)())
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3]).astype(np.uint8)


def preprocess(rgb: np.ndarray, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """rapidocr's DetPreProcess at a fixed size: 1x3xHxW float32, BGR, (x/255 - mean)/std."""
    from skimage.transform import resize

    if height % 32 or width % 32:
        raise ValueError(f"PP-OCR det needs sizes that are multiples of 32, got {height}x{width}")
    bgr = rgb[:, :, ::-1]
    img = resize(bgr, (height, width), order=1, preserve_range=True, anti_aliasing=False)
    x = (img.astype(np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype(np.float32)


def fold_into_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float-graph folding hb_mapper does before quantizing, done up front (a new model).

    Constant nodes become initializers; a Conv/ConvTranspose whose only consumer adds a per-channel
    constant takes it as its bias; a BatchNormalization that is the only consumer of such a conv is
    folded into its weight and bias. Outputs keep their names, so the rest of the graph is unchanged.
    onnxruntime's quantize_static would otherwise quantize the BN parameters and the added
    constant to int8 per tensor, which neither hb_mapper nor the simulator does.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    nodes = []
    for n in g.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        else:
            nodes.append(n)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    outputs = {o.name for o in g.output}

    def sole_consumer(tensor: str) -> onnx.NodeProto | None:
        users = consumers.get(tensor, [])
        return users[0] if len(users) == 1 and tensor not in outputs else None

    removed: set[int] = set()
    for conv in nodes:
        if conv.op_type not in ("Conv", "ConvTranspose") or len(conv.input) < 2 or conv.input[1] not in consts:
            continue
        group = next((a.i for a in conv.attribute if a.name == "group"), 1)
        if conv.op_type == "ConvTranspose" and group != 1:
            continue  # its output channels are not one weight axis
        axis = 0 if conv.op_type == "Conv" else 1
        w = consts[conv.input[1]].astype(np.float32)
        channels = w.shape[axis]
        b = consts[conv.input[2]].astype(np.float32) if len(conv.input) > 2 and conv.input[2] else np.zeros(channels, np.float32)
        last = conv.output[0]
        absorbed = []
        nxt = sole_consumer(last)
        if nxt is not None and nxt.op_type == "Add":
            other = [t for t in nxt.input if t != last]
            c = consts.get(other[0]) if len(other) == 1 else None
            if c is not None and c.size == channels and (c.ndim <= 1 or c.shape[-3 if c.ndim >= 3 else 0] == channels):
                b = b + c.reshape(-1).astype(np.float32)
                absorbed.append(nxt)
                last = nxt.output[0]
                nxt = sole_consumer(last)
        if nxt is not None and nxt.op_type == "BatchNormalization" and all(t in consts for t in nxt.input[1:5]):
            gamma, beta, mean, var = (consts[t].astype(np.float64) for t in nxt.input[1:5])
            eps = next((a.f for a in nxt.attribute if a.name == "epsilon"), 1e-5)
            k = gamma / np.sqrt(var + eps)
            shape = [1] * w.ndim
            shape[axis] = channels
            w = (w * k.reshape(shape)).astype(np.float32)
            b = ((b - mean) * k + beta).astype(np.float32)
            absorbed.append(nxt)
            last = nxt.output[0]
        if not absorbed:
            continue
        name = conv.name or conv.output[0]
        consts[f"{name}__folded_w"] = w
        consts[f"{name}__folded_b"] = b
        del conv.input[1:]
        conv.input.extend([f"{name}__folded_w", f"{name}__folded_b"])
        conv.output[0] = last
        removed.update(id(n) for n in absorbed)
    kept = [n for n in nodes if id(n) not in removed]
    used = {t for n in kept for t in n.input}
    del g.node[:]
    g.node.extend(kept)
    del g.initializer[:]
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items() if k in used)
    onnx.checker.check_model(out)
    return out


def write_ppocr_project(root: Path, photos: tuple[str, ...] = PHOTOS, height: int = HEIGHT, width: int = WIDTH,
                        calibration_type: str = "max", fold: bool = False) -> Path:
    """Copy the detector into ``root``, write cal/NNNN.bin and hb_config.yaml there; return the YAML path.

    The YAML names the model relative to its own folder, as a user's would. ``fold`` writes the
    model through :func:`fold_into_convs` instead of copying the shipped file.
    """
    src = det_model_path()
    if src is None:
        raise FileNotFoundError("rapidocr-onnxruntime is not installed: pip install --no-deps rapidocr-onnxruntime==1.4.4")
    root.mkdir(parents=True, exist_ok=True)
    if fold:
        onnx.save(fold_into_convs(onnx.load(str(src))), str(root / DET_MODEL))
    else:
        shutil.copyfile(src, root / DET_MODEL)
    cal = root / "cal"
    cal.mkdir(exist_ok=True)
    for i, name in enumerate(photos):
        preprocess(load_photo(name), height, width).tofile(cal / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml(DET_MODEL, "x", f"1x3x{height}x{width}", calibration_type, prefix="ppocr_det"))
    return cfg


def pixels(rgb: np.ndarray, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """The detector's input before its normalization: 1x3xHxW uint8 BGR 0..255, resized as :func:`preprocess`
    does (the calibration file of an image ``input_type_train``, mean/scale left to the YAML)."""
    from skimage.transform import resize

    img = resize(rgb[:, :, ::-1], (height, width), order=1, preserve_range=True, anti_aliasing=False)
    return np.ascontiguousarray(np.clip(np.rint(img), 0, 255).astype(np.uint8).transpose(2, 0, 1)[None])


def write_ppocr_camera_project(root: Path, type_rt: str = "nv12", photos: tuple[str, ...] = PHOTOS,
                               height: int = HEIGHT, width: int = WIDTH) -> Path:
    """The detector as a camera model: ``input_type_train: bgr`` (rapidocr feeds it BGR), ``input_type_rt``
    ``type_rt``, its ``(x / 255 - 0.5) / 0.5`` as ``data_mean_and_scale`` (mean 127.5, scale 1/127.5), and
    uint8 BGR calibration files in cal/ (opset relabelled to 11). Returns the YAML path."""
    src = det_model_path()
    if src is None:
        raise FileNotFoundError("rapidocr-onnxruntime is not installed: pip install --no-deps rapidocr-onnxruntime==1.4.4")
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, root / DET_MODEL)
    relabel_opset11(root / DET_MODEL)
    cal = root / "cal"
    cal.mkdir(exist_ok=True)
    for i, name in enumerate(photos):
        pixels(load_photo(name), height, width).tofile(cal / f"{i:04d}.bin")
    text = hb_yaml(DET_MODEL, "x", f"1x3x{height}x{width}", "max", prefix=f"ppocr_det_{type_rt}")
    layout_rt = "" if type_rt == "nv12" else "\n  input_layout_rt: 'NHWC'"
    text = text.replace("  input_type_train: 'featuremap'", "  input_type_train: 'bgr'").replace(
        "  input_type_rt: 'featuremap'\n  input_layout_rt: 'NCHW'", f"  input_type_rt: '{type_rt}'{layout_rt}").replace(
        "  norm_type: 'no_preprocess'", "  norm_type: 'data_mean_and_scale'\n  mean_value: '127.5'\n"
        f"  scale_value: '{1 / 127.5:.9f}'").replace("cal_data_type: 'float32'", "cal_data_type: 'uint8'")
    cfg = root / "hb_config.yaml"
    cfg.write_text(text)
    return cfg


def relabel_opset11(path: Path) -> None:
    """Relabel an opset-12 PP-OCR export as opset 11 in place: hmct 1.1.0 refuses opset 12 ("The opset
    version of the model is 12, the maximum supported version is 11": ``check_opset_version`` in
    hmct/converter/preparer/prepare.py), and the detector's ops (Conv, BatchNormalization, HardSigmoid,
    Clip, Resize, ConvTranspose, Constant with ``value``, ...) mean the same in opset 11, so this is what a
    user re-exporting it gets."""
    model = onnx.load(str(path))
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 11
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


# --------------------------------------------------------------------------- the text-direction classifier
CLS_MODEL = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"
CLS_SHAPE = (3, 48, 192)
#: Text lines of skimage.data.page() (rows), found from its ink profile; each is cut into strips.
PAGE_LINES = ((11, 35), (48, 66), (66, 84), (84, 102), (102, 120), (120, 137), (172, 191))
#: (x0, width) of the strips cut from each line.
PAGE_STRIPS = ((0, 384), (0, 192), (192, 192), (0, 128), (128, 128), (256, 128), (60, 240), (100, 200))
#: Lines of skimage.data.text() (rows, columns) for calibration strips.
TEXT_STRIPS = ((0, 40, 0, 448), (20, 60, 80, 320), (50, 90, 0, 260), (70, 110, 100, 400), (100, 140, 0, 300),
               (120, 172, 40, 360), (10, 50, 140, 448), (90, 130, 200, 448))


def cls_model_path() -> Path | None:
    """The classifier beside the detector in the installed rapidocr_onnxruntime, or None."""
    det = det_model_path()
    path = det.parent / CLS_MODEL if det is not None else None
    return path if path is not None and path.is_file() else None


def cls_preprocess(gray: np.ndarray) -> np.ndarray:
    """PaddleOCR's ClsPreProcess of a grayscale strip: resize to height 48 keeping the aspect ratio, width
    <= 192, ``(x / 255 - 0.5) / 0.5``, zero padding on the right (grayscale replicated to 3 channels, so
    BGR = RGB): 1x3x48x192 float32."""
    from skimage.transform import resize

    c, h, w = CLS_SHAPE
    rw = min(w, math.ceil(h * gray.shape[1] / gray.shape[0]))
    rgb = np.repeat(gray[:, :, None], 3, axis=2).astype(np.float32)
    img = resize(rgb, (h, rw), order=1, preserve_range=True, anti_aliasing=False)
    out = np.zeros(CLS_SHAPE, np.float32)
    out[:, :, :rw] = (img.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out[None]


def cls_samples() -> tuple[list[np.ndarray], list[int], list[np.ndarray]]:
    """(evaluation inputs, their labels, calibration inputs): strips of the text lines of
    ``skimage.data.page()`` (label 0) each followed by the same strip turned by 180 degrees (label 1);
    strips of ``skimage.data.text()`` (handwriting on a board) and their turned copies for calibration."""
    import skimage.data

    page, text = np.asarray(skimage.data.page()), np.asarray(skimage.data.text())
    evals, labels = [], []
    for top, bottom in PAGE_LINES:
        for x0, width in PAGE_STRIPS:
            strip = page[top:bottom, x0:x0 + width]
            evals += [cls_preprocess(strip), cls_preprocess(strip[::-1, ::-1])]
            labels += [0, 1]
    cal = []
    for top, bottom, left, right in TEXT_STRIPS:
        strip = text[top:bottom, left:right]
        cal += [cls_preprocess(strip), cls_preprocess(strip[::-1, ::-1])]
    return evals, labels, cal


def write_cls_project(root: Path, eval_every: int = 1, calibration_type: str = "max") -> tuple[Path, list[int]]:
    """Copy the classifier into ``root``, write cal/ (16 strips), eval/ (every ``eval_every``-th of the 112
    labelled strips) and hb_config.yaml; return (the YAML path, the labels of eval/'s samples)."""
    src = cls_model_path()
    if src is None:
        raise FileNotFoundError("rapidocr-onnxruntime is not installed: pip install --no-deps rapidocr-onnxruntime==1.4.4")
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, root / CLS_MODEL)
    evals, labels, cal = cls_samples()
    evals, labels = evals[::eval_every], labels[::eval_every]
    for folder, arrays in (("cal", cal), ("eval", evals)):
        (root / folder).mkdir(exist_ok=True)
        for i, a in enumerate(arrays):
            a.tofile(root / folder / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml(CLS_MODEL, "x", "1x{}x{}x{}".format(*CLS_SHAPE), calibration_type, prefix="ppocr_cls"))
    return cfg, labels
