"""The real models ``benchmarks/search_quality.py`` tunes, each written as an hb_mapper project plus a
search space in a temporary folder (absolute paths there only).

* ``segdepth``: the bundled example (its data from ``examples/segdepth/make_data.py``).
* ``ppocr_det``: PP-OCRv4's text detector from ``rapidocr-onnxruntime==1.4.4`` (BN folded as
  hb_mapper does), on the scikit-image photographs of ``tests/ppocr.py``.
* ``ppocr_cls``: PP-OCR's text-direction classifier (0 / 180 degrees) from the same package, on
  real printed text: strips of the text lines of ``skimage.data.page()`` (label 0) and the same
  strips turned by 180 degrees (label 1) are the labelled evaluation set; strips of
  ``skimage.data.text()`` (handwriting on a board, another photograph) are the calibration set.
  Preprocessing is PaddleOCR's ``ClsPreProcess``: resize to height 48 keeping the aspect ratio,
  width <= 192, ``(x / 255 - 0.5) / 0.5``, zero padding on the right (grayscale replicated to
  3 channels, so BGR = RGB).
"""

from __future__ import annotations

import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from search import SPACE, copy_space, prepare_data

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tests/ppocr.py: the detector's project, shared with the tests

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


@dataclass
class Prepared:
    """One model ready to search: its space file, the accuracy floor and the metrics with labels."""

    name: str
    space: Path
    min_accuracy: float
    labelled_metric: str | None     # a task metric with real labels (the goal keeps it within 1% of float)
    note: str


def _space(root: Path, base: Path, body: dict) -> Path:
    raw = {"base": str(base.resolve()), **body}
    path = root / "search.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- segdepth
#: segdepth's goal: the real tool's best configuration of the example (the main job's best.yaml) gives 0.99982
#: mean cosine on its quantized model, and the simulation, which now tracks the real tool, tops out near 0.99988
#: in this space: 0.9999 (the goal before the simulation followed hb's rules) is out of reach for every method.
SEGDEPTH_GOAL = 0.9998


def prepare_segdepth(root: Path, top_k: int = 24, min_accuracy: float = SEGDEPTH_GOAL,
                     precision: tuple[str, ...] | None = None, calibration: dict | None = None) -> Prepared:
    """The bundled example's space; ``precision`` / ``calibration`` replace its lists (a smaller space)."""
    prepare_data()
    nodes = {"top_k": top_k} | ({"precision": list(precision)} if precision is not None else {})
    space = copy_space(SPACE, root / "search.yaml", nodes=nodes, calibration=calibration or {},
                       objectives={"min_accuracy": min_accuracy},
                       study={"name": None})  # the benchmark names its studies
    return Prepared("segdepth", space, min_accuracy, "miou:seg",
                    "bundled example, 16 held-out synthetic scenes with labels")


# --------------------------------------------------------------------------- PP-OCR detector
def prepare_ppocr_det(root: Path, top_k: int = 24, min_accuracy: float = 0.997) -> Prepared | None:
    from ppocr import det_model_path, write_ppocr_project

    if det_model_path() is None:
        return None
    cfg = write_ppocr_project(root / "project", fold=True)
    body = {"nodes": {"select": "bpu", "top_k": top_k, "precision": ["int8", "int16_input", "int16"]},
            "calibration": {"calibration_type": ["max", "kl"], "max_percentile": [1.0, 0.99999, 0.9999],
                            "per_channel": [False, True]},
            "objectives": {"mode": "pareto", "accuracy": "mean_cosine", "min_accuracy": min_accuracy}}
    return Prepared("ppocr_det", _space(root, cfg, body), min_accuracy, None,
                    "PP-OCRv4 det (BN folded), 8 scikit-image photos at 256x320, calibration = evaluation set, "
                    "no labels. Target 0.997: at 0.99 the all-int8 default already passes and every method ties; "
                    "0.999 was out of every method's reach in this 24-node space (best 0.9975)")


# --------------------------------------------------------------------------- PP-OCR text-direction classifier
def cls_model_path() -> Path | None:
    from ppocr import det_model_path

    det = det_model_path()
    path = det.parent / CLS_MODEL if det is not None else None
    return path if path is not None and path.is_file() else None


def cls_preprocess(gray: np.ndarray) -> np.ndarray:
    """PaddleOCR ClsPreProcess of a grayscale strip: 1x3x48x192 float32."""
    from skimage.transform import resize

    c, h, w = CLS_SHAPE
    rw = min(w, math.ceil(h * gray.shape[1] / gray.shape[0]))
    rgb = np.repeat(gray[:, :, None], 3, axis=2).astype(np.float32)
    img = resize(rgb, (h, rw), order=1, preserve_range=True, anti_aliasing=False)
    out = np.zeros(CLS_SHAPE, np.float32)
    out[:, :, :rw] = (img.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out[None]


def cls_samples() -> tuple[list[np.ndarray], list[int], list[np.ndarray]]:
    """(evaluation inputs, their labels, calibration inputs)."""
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


def prepare_ppocr_cls(root: Path, top_k: int | None = 24, min_accuracy: float = 0.99,
                      precision: tuple[str, ...] = ("int8", "int16_input", "int16"),
                      calibration: dict | None = None) -> Prepared | None:
    from helpers import hb_yaml

    src = cls_model_path()
    if src is None:
        return None
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, root / CLS_MODEL)
    evals, labels, cal = cls_samples()
    for folder, arrays in (("cal", cal), ("eval", evals)):
        (root / folder).mkdir(exist_ok=True)
        for i, a in enumerate(arrays):
            a.tofile(root / folder / f"{i:04d}.bin")
    (root / "labels").mkdir(exist_ok=True)
    for i, lab in enumerate(labels):
        np.save(root / "labels" / f"{i:04d}.npy", np.array(lab, np.int64))
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml(CLS_MODEL, "x", "1x{}x{}x{}".format(*CLS_SHAPE), "max", prefix="ppocr_cls"))
    metric = f"top1:{CLS_OUTPUT}"
    body = {"eval_data": str((root / "eval").resolve()),
            "labels": {CLS_OUTPUT: str((root / "labels" / "*.npy").resolve())},
            "nodes": {"select": "bpu", "top_k": top_k, "precision": list(precision)},
            "calibration": calibration or {"calibration_type": ["max", "kl"], "max_percentile": [1.0, 0.99999, 0.9999],
                                           "per_channel": [False, True]},
            "objectives": {"mode": "pareto", "accuracy": "mean_cosine", "report": [metric],
                           "min_accuracy": min_accuracy}}
    return Prepared("ppocr_cls", _space(root, cfg, body), min_accuracy, metric,
                    f"PP-OCR mobile v2.0 text-direction classifier, {len(evals)} labelled strips of "
                    f"skimage.data.page() (upright + 180 deg), calibration on {len(cal)} strips of skimage.data.text()")
