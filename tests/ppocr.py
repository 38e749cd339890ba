"""A real pretrained model on real photographs: PP-OCRv4's text detector on scikit-image's bundled images.

The detector ships inside the PyPI package ``rapidocr-onnxruntime`` (``models/ch_PP-OCRv4_det_infer.onnx``:
opset 12, dynamic input ``x`` [N,3,H,W], DBNet probability map ``sigmoid_0.tmp_0`` [N,1,H,W]).
The photographs are the ones scikit-image bundles in its wheel (no download).

Preprocessing follows rapidocr's ``ch_ppocr_det.utils.DetPreProcess``: BGR channel order (rapidocr
loads images with OpenCV), bilinear resize to multiples of 32, ``(x / 255 - 0.5) / 0.5``, HWC -> 1xCxHxW.
Unlike rapidocr we resize every photo to one fixed size (calibration and ``input_shape`` need one
shape) and use scikit-image's resize instead of OpenCV's (rapidocr needs cv2, which we don't install).

Used by ``tests/simulate/test_ppocr.py`` and ``benchmarks/trial_cost.py``.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np

DET_MODEL = "ch_PP-OCRv4_det_infer.onnx"
#: Bundled with scikit-image 0.2x (loadable offline); two of them contain printed text.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "page", "text", "camera", "immunohistochemistry")
HEIGHT, WIDTH = 256, 320
MEAN, STD = 0.5, 0.5

YAML = """\
model_parameters:
  onnx_model: '{MODEL}'
  march: 'bayes-e'
  working_dir: 'model_output'
  output_model_file_prefix: 'ppocr_det'
input_parameters:
  input_name: 'x'
  input_type_train: 'featuremap'
  input_layout_train: 'NCHW'
  input_type_rt: 'featuremap'
  input_layout_rt: 'NCHW'
  input_shape: '1x3x{H}x{W}'
  norm_type: 'no_preprocess'
calibration_parameters:
  cal_data_dir: 'cal'
  cal_data_type: 'float32'
  calibration_type: '{CAL}'
  per_channel: False
compiler_parameters:
  compile_mode: 'latency'
  optimize_level: 'O3'
  debug: False
  core_num: 1
"""


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


def write_ppocr_project(root: Path, photos: tuple[str, ...] = PHOTOS, height: int = HEIGHT, width: int = WIDTH,
                        calibration_type: str = "max") -> Path:
    """Copy the detector into ``root``, write cal/NNNN.bin and hb_config.yaml there; return the YAML path.

    The YAML names the model relative to its own folder, as a user's would.
    """
    src = det_model_path()
    if src is None:
        raise FileNotFoundError("rapidocr-onnxruntime is not installed: pip install --no-deps rapidocr-onnxruntime==1.4.4")
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, root / DET_MODEL)
    cal = root / "cal"
    cal.mkdir(exist_ok=True)
    for i, name in enumerate(photos):
        preprocess(load_photo(name), height, width).tofile(cal / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(YAML.replace("{MODEL}", DET_MODEL).replace("{H}", str(height)).replace("{W}", str(width))
                   .replace("{CAL}", calibration_type))
    return cfg
