"""The real models ``benchmarks/search_quality.py`` tunes, each written as an hb_mapper project plus a
search space in a temporary folder (absolute paths there only).

* ``segdepth``: the bundled example (its data from ``examples/segdepth/make_data.py``).
* ``ppocr_det``: PP-OCRv4's text detector from ``rapidocr-onnxruntime==1.4.4`` (BN folded as
  hb_mapper does), on the scikit-image photographs of ``tests/ppocr.py``.
* ``ppocr_cls``: PP-OCR's text-direction classifier (0 / 180 degrees) from the same package, on
  real printed text: strips of the text lines of ``skimage.data.page()`` (label 0) and the same
  strips turned by 180 degrees (label 1) are the labelled evaluation set; strips of
  ``skimage.data.text()`` (handwriting on a board, another photograph) are the calibration set
  (``tests/ppocr.py``'s ``write_cls_project``, shared with the fidelity suite). Preprocessing is
  PaddleOCR's ``ClsPreProcess``: resize to height 48 keeping the aspect ratio, width <= 192,
  ``(x / 255 - 0.5) / 0.5``, zero padding on the right (grayscale replicated to 3 channels, so BGR = RGB).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from search import SPACE, copy_space, prepare_data

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tests/ppocr.py: the PP-OCR projects, shared with the tests


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
def prepare_ppocr_det(root: Path, top_k: int = 24, min_accuracy: float = 0.99) -> Prepared | None:
    from ppocr import DET_MODEL, det_model_path, relabel_opset11, write_ppocr_project

    if det_model_path() is None:
        return None
    cfg = write_ppocr_project(root / "project", fold=True)
    relabel_opset11(cfg.parent / DET_MODEL)   # hb_mapper refuses the shipped opset 12 (the maximum is 11)
    body = {"nodes": {"select": "bpu", "top_k": top_k, "precision": ["int8", "int16_input", "int16"]},
            "calibration": {"calibration_type": ["max", "kl"], "max_percentile": [1.0, 0.99999, 0.9999],
                            "per_channel": [False, True]},
            "objectives": {"mode": "pareto", "accuracy": "mean_cosine", "min_accuracy": min_accuracy}}
    return Prepared("ppocr_det", _space(root, cfg, body), min_accuracy, None,
                    "PP-OCRv4 det (BN folded), 8 scikit-image photos at 256x320, calibration = evaluation set, "
                    "no labels. Target 0.99: hb's all-int8 defaults give 0.977-0.980 (real 0.979); 0.997, the target "
                    "while tuner simulated hb's per_channel on every Conv input, is out of reach now that it "
                    "equalizes only hb's 6 tensors")


# --------------------------------------------------------------------------- PP-OCR text-direction classifier
def prepare_ppocr_cls(root: Path, top_k: int | None = 24, min_accuracy: float = 0.99,
                      precision: tuple[str, ...] = ("int8", "int16_input", "int16"),
                      calibration: dict | None = None) -> Prepared | None:
    from ppocr import CLS_OUTPUT, cls_model_path, write_cls_project

    if cls_model_path() is None:
        return None
    cfg, labels = write_cls_project(root)
    (root / "labels").mkdir(exist_ok=True)
    for i, lab in enumerate(labels):
        np.save(root / "labels" / f"{i:04d}.npy", np.array(lab, np.int64))
    metric = f"top1:{CLS_OUTPUT}"
    body = {"eval_data": str((root / "eval").resolve()),
            "labels": {CLS_OUTPUT: str((root / "labels" / "*.npy").resolve())},
            "nodes": {"select": "bpu", "top_k": top_k, "precision": list(precision)},
            "calibration": calibration or {"calibration_type": ["max", "kl"], "max_percentile": [1.0, 0.99999, 0.9999],
                                           "per_channel": [False, True]},
            "objectives": {"mode": "pareto", "accuracy": "mean_cosine", "report": [metric],
                           "min_accuracy": min_accuracy}}
    n_cal = len(list((root / "cal").glob("*.bin")))
    return Prepared("ppocr_cls", _space(root, cfg, body), min_accuracy, metric,
                    f"PP-OCR mobile v2.0 text-direction classifier, {len(labels)} labelled strips of "
                    f"skimage.data.page() (upright + 180 deg), calibration on {n_cal} strips of skimage.data.text()")
