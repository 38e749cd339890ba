"""Calibration files from images with the user's own preprocessing, and the check that they match.

hb_mapper reads ``cal_data_dir`` as raw ``numpy.tofile`` dumps of ``cal_data_type`` in the
input's training format and shape, *before* the YAML's mean/scale (docs/hb_rules/config.md §6).
The user's training preprocessing is the only reliable way to get there, so it is given as a
callable (``module:function`` or ``path/to/file.py:function``) taking an image path and
returning that tensor.

* :func:`load_preprocess` -- load the callable; the returned function checks every result.
* :func:`make_cal_data` -- one file per image, exactly as hb_mapper reads them (``tuner make-cal-data``).
* :func:`check_preprocess` -- recompute the tensors from the images and compare them with the
  files in ``cal_data_dir``, per channel and through the float model, naming the usual
  mismatches (RGB/BGR swap, x255 scale, already-normalised files) (``tuner check-preprocess``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from tuner.errors import TunerError
from tuner.files import check_writable, write_atomic
from tuner.inputs.config import HbConfig, load_config
from tuner.inputs.data import DTYPES, InputData, input_data
from tuner.inputs.images import dims, yaml_preprocess
from tuner.inputs.model import LoadedModel, load_model
from tuner.metrics.user import load_callable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
EXACT_TOL = 1e-4          # max |file - recomputed| per channel, relative to the channel range: "same tensors"
FIT_TOL = 5e-3            # RMS residual of a signature fit, relative to the file channel range (uint8 rounding ~1e-3)
COEF_TOL = 1e-2           # relative tolerance when matching fitted coefficients to a signature (255, mean/scale)
INTEGRAL_TOL = 1e-3       # a value this close to an integer may be stored in an integer cal_data_type

PreprocessFn = Callable[[Path], np.ndarray]


# --------------------------------------------------------------------------- loading

def load_preprocess(spec: str, base_dir: str | Path | None = None,
                    shape: tuple[int, ...] | None = None) -> PreprocessFn:
    """Load the user's preprocessing ``"module:function"`` or ``"path/to/file.py:function"``.

    A relative file path is resolved against ``base_dir`` (default: the current directory).
    The returned function calls ``fn(image_path)`` and checks the result: a numpy array of
    real numbers, finite, and -- when ``shape`` is given -- of that shape with or without the
    leading batch dimension of 1 (it is returned in ``shape``). Every problem, including an
    exception raised by the user's function, is a TunerError naming the image file.
    """
    fn = load_callable(spec, base_dir, what="preprocessing", signature="fn(image_path) -> numpy array")
    label = str(spec).strip()

    def run(path: Path) -> np.ndarray:
        path = Path(path)
        try:
            value = fn(path)
        except TunerError:
            raise
        except Exception as exc:  # the user's code on the user's image
            raise TunerError(f"preprocessing {label!r} failed on {path}: {type(exc).__name__}: {exc}; "
                             "fix the function or remove the image") from exc
        return _check_result(value, path, label, shape)

    return run


YAML_PREPROCESS = "the YAML's input parameters"


def preprocessor(spec: str | None, config: HbConfig, data: InputData) -> tuple[PreprocessFn, str]:
    """The user's callable when given, else the image reading the YAML describes; and its label."""
    if spec:
        return load_preprocess(spec, shape=data.shape), str(spec).strip()
    return yaml_preprocess(config.inputs[0], data.shape), YAML_PREPROCESS


def _check_result(value, path: Path, label: str, shape: tuple[int, ...] | None) -> np.ndarray:
    want = f"a numpy array of shape {dims(shape)}" if shape else "a numpy array"
    if not isinstance(value, np.ndarray):
        raise TunerError(f"preprocessing {label!r} returned {type(value).__name__} for {path}; it must return "
                         f"{want} (the calibration tensor before the YAML's mean/scale)")
    if value.dtype.kind not in "uif":
        raise TunerError(f"preprocessing {label!r} returned an array of dtype {value.dtype} for {path}; it must "
                         "return real numbers (float32 or an integer type)")
    if shape is not None and value.shape != tuple(shape):
        if shape[0] == 1 and value.shape == tuple(shape[1:]):
            value = value.reshape(shape)
        else:
            hint = ""
            if sorted(value.shape) in (sorted(shape), sorted(shape[1:])):
                hint = "; the dimensions are there but in another order: check input_layout_train (NCHW vs NHWC)"
            raise TunerError(f"preprocessing {label!r} returned shape {dims(value.shape)} for {path}, but the "
                             f"model input needs {dims(shape)} (with or without the batch dimension){hint}")
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        bad = "NaN" if np.isnan(value).any() else "Inf"
        raise TunerError(f"preprocessing {label!r} returned {bad} values for {path}; fix the function "
                         "(a division by a zero std or range?) or remove the image")
    return value


# --------------------------------------------------------------------------- shared setup

def list_images(folder: str | Path, limit: int | None = None) -> list[Path]:
    """The image files (common extensions) directly in ``folder``, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TunerError(f"{folder}: images folder not found")
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        others = sorted(p.name for p in folder.iterdir() if p.is_file())[:3]
        seen = f" (it holds {', '.join(others)}...)" if others else ""
        raise TunerError(f"{folder}: no images{seen}; expected files ending in {', '.join(IMAGE_SUFFIXES)}")
    return files[:limit] if limit is not None else files


def _single_input(config: HbConfig, model: LoadedModel, command: str) -> InputData:
    """The one model input, as tuner.inputs.data reads it (mean/scale included)."""
    names = model.input_names
    if len(names) != 1 or len(config.inputs) != 1:
        raise TunerError(f"{command} handles single-input models; {model.path.name} has {len(names)} inputs "
                         f"({', '.join(names)}): write each input's folder (its cal_data_dir entry) with your own "
                         "script, one numpy.tofile() dump of cal_data_type per sample, the same sorted file order "
                         "in every folder")
    return input_data(config.inputs, model.input_shapes, require_folder=False)[0]


def _open(config_path: str | Path, command: str) -> tuple[HbConfig, LoadedModel, InputData]:
    config = load_config(config_path)
    shapes = {s.name: s.shape for s in config.inputs if s.shape is not None}
    model = load_model(config.onnx_model, shapes)
    return config, model, _single_input(config, model, command)


def _cal_type_source(config: HbConfig) -> str:
    explicit = (config.section("calibration_parameters") or {}).get("cal_data_type") is not None
    return "" if explicit else " (inferred from the folder name, since calibration_parameters.cal_data_type is not set)"


def _to_dtype(x: np.ndarray, dtype: str, image: Path, label: str, source: str) -> np.ndarray:
    """``x`` as hb_mapper's ``cal_data_type``; integers must already be integral and in range."""
    np_type = DTYPES[dtype]
    if dtype == "float32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if x.dtype.kind in "ui":
        r = x
    else:
        r = np.rint(x)
        off = np.abs(x - r)
        if x.size and float(off.max()) > INTEGRAL_TOL:
            example = float(x.flat[int(off.argmax())])
            raise TunerError(f"preprocessing {label!r} returned non-integer values for {image} (e.g. "
                             f"{example:.6g}) but cal_data_type is {dtype!r}{source}; "
                             "return integer pixels (0..255) or set calibration_parameters.cal_data_type: 'float32'")
    info = np.iinfo(cast("type[np.integer[Any]]", np_type))   # an integer cal_data_type here
    lo, hi = (float(r.min()), float(r.max())) if r.size else (0.0, 0.0)
    if lo < info.min or hi > info.max:
        raise TunerError(f"preprocessing {label!r} returned values {lo:g}..{hi:g} for {image}, outside "
                         f"cal_data_type {dtype!r} ({info.min}..{info.max}){source}; set "
                         "calibration_parameters.cal_data_type: 'float32' or fix the function")
    return np.ascontiguousarray(r, dtype=np_type)


# --------------------------------------------------------------------------- make-cal-data

def _check_pixels(x: np.ndarray, image: Path, label: str, type_train: str, type_rt: str) -> None:
    """An image ``input_type_rt``: hb_mapper's loader reads each file as 0..255 ``input_type_train``
    pixels and converts them to the board's input (nv12 through uint8 bytes, where values outside
    0..255 wrap round; docs/hb_rules/input.md §2), the mean/scale being the YAML's: a preprocessing that
    returns anything else (normalized values) makes wrong calibration data, so it stops here."""
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if lo < 0 or hi > 255:
        raise TunerError(f"preprocessing {label!r} returned values {lo:.4g}..{hi:.4g} for {image}, but input_type_rt "
                         f"is {type_rt!r}: hb_mapper reads the calibration files as 0..255 {type_train} pixels (it "
                         f"converts them to {type_rt} itself and applies the YAML's mean/scale): return the pixels "
                         "before any normalization")


def camera_note(config_path: str | Path) -> str | None:
    """What hb_mapper does with the files make-cal-data writes for an image ``input_type_rt`` (None for
    a featuremap): the files stay the training format, the conversion is hb's (docs/hb_rules/input.md)."""
    config = load_config(config_path)
    spec = config.inputs[0] if len(config.inputs) == 1 else None
    if spec is None or spec.type_rt in (None, "featuremap"):
        return None
    rt = spec.type_rt
    if rt == "nv12" and spec.type_train in ("rgb", "bgr") and spec.space_and_range != "bt601_video":
        how = "to NV12 bytes (BT.601 full range, chroma of each 2x2 block's top-left pixel)"
    elif rt == "nv12" and spec.type_train in ("rgb", "bgr"):
        how = "to video-range YUV in float (float32 files: the conversion fails on integer ones)"
    elif rt == "yuv444" and spec.type_train in ("rgb", "bgr"):
        how = "to YUV in float (float32 files: the conversion fails on integer ones)"
    elif {rt, spec.type_train} == {"rgb", "bgr"}:
        how = "by swapping the channels"
    else:
        how = "by shifting them by -128 only"
    return (f"input_type_rt {rt}: the files hold {spec.type_train} pixels 0..255 in {spec.layout_train} (the training "
            f"format, before mean/scale); hb_mapper converts them {how} before calibrating")

def _safe_stem(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("._") or "image"


def cal_file_names(images: list[Path]) -> list[str]:
    """``0000_<stem>.bin``...: the index keeps the images' sorted order, the stem names the source."""
    width = max(4, len(str(len(images) - 1)))
    return [f"{i:0{width}d}_{_safe_stem(p)}.bin" for i, p in enumerate(images)]


def make_cal_data(config_path: str | Path, images: str | Path, preprocess: str | None, out: str | Path,
                  limit: int | None = None, overwrite: bool = False) -> list[Path]:
    """Write one calibration file per image of ``images`` into ``out``; return their paths.

    Each file is ``numpy.tofile`` of the YAML's ``cal_data_type`` (float32 when none applies) in
    the model input's shape, what hb_mapper reads from ``cal_data_dir``. Existing files are
    never overwritten unless ``overwrite``; files in ``out`` that this run would not write are
    always an error (hb_mapper would read them as samples too). Single-input models only.
    """
    config, _, data = _open(config_path, "make-cal-data")
    files = list_images(images, limit)
    fn, label = preprocessor(preprocess, config, data)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TunerError(f"{out}: exists and is not a folder; --out needs a folder")
    check_writable(out, "the calibration files")
    targets = [out / n for n in cal_file_names(files)]
    if out.is_dir():
        wanted = {t.name for t in targets}
        present = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
        stale = [n for n in present if n not in wanted]
        if stale:
            raise TunerError(f"{out}: already holds {len(stale)} file(s) this run would not write "
                             f"({', '.join(stale[:3])}{'...' if len(stale) > 3 else ''}); hb_mapper reads every file "
                             "in cal_data_dir as a sample: remove them or choose an empty folder")
        clash = [n for n in present if n in wanted]
        if clash and not overwrite:
            raise TunerError(f"{out}: {len(clash)} file(s) exist already ({', '.join(clash[:3])}"
                             f"{'...' if len(clash) > 3 else ''}); pass --force (overwrite=True) to replace them")
    out.mkdir(parents=True, exist_ok=True)
    source = _cal_type_source(config)
    created: list[Path] = []
    written: list[Path] = []
    try:
        for image, target in zip(files, targets):
            x = fn(image)
            if data.path is not None:
                _check_pixels(x, image, label, data.path.type_train, data.path.type_rt)
            arr = _to_dtype(x, data.dtype, image, label, source)
            existed = target.exists()
            write_atomic(target, arr.tobytes())   # its temporary file is hidden: never read as a sample
            written.append(target)
            if not existed:
                created.append(target)
    except BaseException:
        for p in created:     # leave no half-made set behind (replaced files cannot be restored)
            p.unlink(missing_ok=True)
        raise
    return written
