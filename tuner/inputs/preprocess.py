"""Calibration files from images with the user's own preprocessing, and the check that they match.

hb_mapper reads ``cal_data_dir`` as raw ``numpy.tofile`` dumps of ``cal_data_type`` in the
input's training format and shape, *before* the YAML's mean/scale (reference section 5.3).
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

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from tuner.errors import TunerError
from tuner.files import check_writable, write_atomic
from tuner.inputs.checks import ERROR, INFO, SEVERITIES, WARNING, Finding, FindingsReport
from tuner.inputs.config import HbConfig, load_config
from tuner.inputs.data import DTYPES, DataSet, InputData, input_data
from tuner.inputs.images import yaml_preprocess
from tuner.inputs.model import LoadedModel, load_model
from tuner.metrics.similarity import Similarity
from tuner.metrics.task import load_callable
from tuner.runtime.session import make_session

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
    want = f"a numpy array of shape {_dims(shape)}" if shape else "a numpy array"
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
            raise TunerError(f"preprocessing {label!r} returned shape {_dims(value.shape)} for {path}, but the "
                             f"model input needs {_dims(shape)} (with or without the batch dimension){hint}")
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        bad = "NaN" if np.isnan(value).any() else "Inf"
        raise TunerError(f"preprocessing {label!r} returned {bad} values for {path}; fix the function "
                         "(a division by a zero std or range?) or remove the image")
    return value


def _dims(shape) -> str:
    return "x".join(map(str, shape)) if shape else "()"


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
            arr = _to_dtype(fn(image), data.dtype, image, label, source)
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


# --------------------------------------------------------------------------- check-preprocess

@dataclass
class ChannelDiff:
    """|file - recomputed| of one channel over the compared samples (file values, before mean/scale)."""

    channel: int
    max_abs: float
    mean_abs: float
    range: float                 # value range of the channel (files and recomputed), the tolerance's unit
    worst_file: str | None       # the calibration file with the largest difference
    worst_image: str | None


@dataclass
class OutputDiff:
    """The float model's output on the recomputed tensors (reference) vs on the files."""

    output: str
    cosine: float | None
    max_abs: float | None


@dataclass
class PreprocessReport(FindingsReport):
    config: Path
    images: Path
    cal_dir: Path
    preprocess: str
    input: str
    n_images: int
    n_files: int
    compared: int
    channels: list[ChannelDiff] = field(default_factory=list)
    outputs: list[OutputDiff] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"config": str(self.config), "images": str(self.images), "cal_dir": str(self.cal_dir),
                "preprocess": self.preprocess, "input": self.input, "n_images": self.n_images,
                "n_files": self.n_files, "compared": self.compared, "exit_code": self.exit_code(),
                "channels": [_finite_dict(asdict(c)) for c in self.channels],
                "outputs": [_finite_dict(asdict(o)) for o in self.outputs],
                "findings": [asdict(f) for f in self.findings]}


def _finite_dict(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


class _PairAcc:
    """Streaming per-channel sums of file values f and recomputed values p (float64)."""

    def __init__(self, channels: int):
        z = lambda: np.zeros(channels, np.float64)  # noqa: E731
        self.n = 0
        self.sf, self.sp, self.sff, self.spp, self.sfp = z(), z(), z(), z(), z()
        self.sfq = z()                      # f * p with channels 0 and 2 swapped in p
        self.max_abs, self.sum_abs, self.max_abs_swapped = z(), z(), z()
        self.fmin, self.fmax = z() + np.inf, z() - np.inf
        self.pmin, self.pmax = z() + np.inf, z() - np.inf
        self.worst = [-1] * channels

    def add(self, f: np.ndarray, p: np.ndarray, q: np.ndarray | None, index: int) -> None:
        self.n += f.shape[1]
        self.sf += f.sum(1)
        self.sp += p.sum(1)
        self.sff += np.einsum("ci,ci->c", f, f)
        self.spp += np.einsum("ci,ci->c", p, p)
        self.sfp += np.einsum("ci,ci->c", f, p)
        d = np.abs(f - p)
        mx = d.max(1)
        for c in np.nonzero(mx > self.max_abs)[0]:
            self.worst[c] = index
        self.max_abs = np.maximum(self.max_abs, mx)
        self.sum_abs += d.sum(1)
        if q is not None:
            self.sfq += np.einsum("ci,ci->c", f, q)
            self.max_abs_swapped = np.maximum(self.max_abs_swapped, np.abs(f - q).max(1))
        self.fmin, self.fmax = np.minimum(self.fmin, f.min(1)), np.maximum(self.fmax, f.max(1))
        self.pmin, self.pmax = np.minimum(self.pmin, p.min(1)), np.maximum(self.pmax, p.max(1))

    def fit(self, swapped: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per channel least squares f ~ a*x + b with x = p (or p with channels 0/2 swapped);
        returns a, b and the RMS residual relative to the file channel range."""
        n = self.n
        perm = _swap_perm(len(self.sf)) if swapped else np.arange(len(self.sf))
        sx, sxx = self.sp[perm], self.spp[perm]
        sfx = self.sfq if swapped else self.sfp
        mf, mx = self.sf / n, sx / n
        var_x = np.maximum(sxx / n - mx * mx, 0.0)
        var_f = np.maximum(self.sff / n - mf * mf, 0.0)
        cov = sfx / n - mf * mx
        ok = var_x > 1e-12 * np.maximum(sxx / n, 1e-30)
        a = np.where(ok, cov / np.where(ok, var_x, 1.0), 0.0)
        b = mf - a * mx
        resid = np.sqrt(np.maximum(var_f - a * cov, 0.0))
        frange = np.maximum(self.fmax - self.fmin, 1e-12)
        return a, b, resid / frange


def _swap_perm(channels: int) -> np.ndarray:
    perm = np.arange(channels)
    if channels >= 3:
        perm[0], perm[2] = 2, 0
    return perm


def _close(x: np.ndarray, target: np.ndarray, scale: np.ndarray | float) -> bool:
    return bool(np.all(np.abs(x - target) <= COEF_TOL * np.maximum(np.abs(scale), 1e-12)))


def _signature(a: np.ndarray, b: np.ndarray, frange: np.ndarray, data: InputData) -> tuple[str, str] | None:
    """Name the per-channel affine map files = a * recomputed + b, if it is a known mistake."""
    ones = np.ones_like(a)
    zero_b = bool(np.all(np.abs(b) <= COEF_TOL * frange))
    if zero_b and _close(a, ones, 1.0):
        return "same", ""
    if zero_b and _close(a, 255 * ones, 255.0):
        return "scale_255", ("the files are 255 x the recomputed tensors (0..255 pixels where the preprocessing "
                             "gives 0..1)")
    if zero_b and _close(a, ones / 255, 1 / 255):
        return "scale_255", ("the files are the recomputed tensors / 255 (0..1 where the preprocessing gives "
                             "0..255 pixels)")
    c = len(a)
    mean = np.zeros(c) if data.mean is None else np.broadcast_to(np.asarray(data.mean, np.float64).ravel(), (c,))
    scale = np.ones(c) if data.scale is None else np.broadcast_to(np.asarray(data.scale, np.float64).ravel(), (c,))
    if data.mean is not None or data.scale is not None:
        # files = (x - mean) * scale: the YAML's normalisation is in the files and will be applied again
        if _close(a, scale, scale) and _close(b, -mean * scale, frange):
            return "already_normalized", ("the files hold the recomputed tensors after the YAML's mean/scale, i.e. "
                                          "already normalised, and hb_mapper applies mean/scale again (double "
                                          "normalisation)")
        # x = (files - mean) * scale: the callable normalises, the files do not
        if _close(a, 1 / scale, 1 / scale) and _close(b, mean, frange):
            return "callable_normalizes", ("the recomputed tensors are the files after the YAML's mean/scale: the "
                                           "preprocessing normalises, but calibration files must be written before "
                                           "mean/scale (hb_mapper applies it)")
    fmt = lambda v: " ".join(f"{x:.4g}" for x in v)  # noqa: E731
    return "affine", f"the files are a * recomputed + b per channel with a = {fmt(a)}, b = {fmt(b)}"


def check_preprocess(config_path: str | Path, images: str | Path, preprocess: str | None,
                     limit: int | None = None) -> PreprocessReport:
    """Recompute the calibration tensors from ``images`` with ``preprocess`` and compare them
    with the files in ``cal_data_dir`` (paired by sorted order, the first min(counts) pairs).

    Per channel: max and mean |difference| and the worst file; through the float model (the
    YAML's mean/scale applied to both): per-output cosine and max |difference|. Raises
    TunerError for a bad YAML/model/callable/images folder; unreadable calibration files
    become an error finding (exit code 2).
    """
    config, model, data = _open(config_path, "check-preprocess")
    if config.inputs[0].cal_dir is None:
        raise TunerError(f"{config.path}: calibration_parameters.cal_data_dir is not set; nothing to compare with")
    image_files = list_images(images)
    fn, label = preprocessor(preprocess, config, data)
    report = PreprocessReport(config=Path(config_path), images=Path(images), cal_dir=data.folder, preprocess=label,
                              input=data.name, n_images=len(image_files), n_files=0, compared=0)
    raw = replace(data, mean=None, scale=None)     # the file values, before mean/scale
    try:
        dataset = DataSet([raw])        # lists and size-checks every file; samples are read lazily
    except TunerError as exc:
        report.findings.append(Finding(ERROR, "cal_files_unusable", data.name, None, f"{exc}"))
        return report
    report.n_files = n_files = len(dataset)
    n = min(n_files, len(image_files))
    if limit is not None:
        n = min(n, limit)
    if n == 0:
        report.findings.append(Finding(ERROR, "nothing_compared", data.name, None,
                                       "no pair of image and calibration file to compare (--limit 0?)"))
        return report
    if n_files != len(image_files):
        report.findings.append(Finding(INFO, "count_differs", data.name, None,
                                       f"{data.folder} holds {n_files} files and {images} {len(image_files)} images; "
                                       f"compared the first {min(n_files, len(image_files))} pairs by sorted name: "
                                       "make sure both sort in the same order"))
    try:
        session = make_session(model.proto)
    except Exception as exc:  # onnxruntime's own errors
        raise TunerError(f"{model.path}: onnxruntime cannot run the float model ({exc})") from None
    out_names = model.output_names
    sims = {o: Similarity() for o in out_names}
    axis, channels = data.channel_axis, data.channels
    acc = _PairAcc(channels)
    perm = _swap_perm(channels) if channels >= 3 else None
    cal_files = dataset.files[0]
    samples = iter(dataset)
    for i in range(n):
        try:
            f = next(samples)[data.name]
        except TunerError as exc:     # NaN/Inf in a file: nothing sound to compare
            report.findings.append(Finding(ERROR, "cal_files_unusable", data.name, None, f"{exc}"))
            return report
        p = np.asarray(fn(image_files[i]), np.float32).reshape(data.shape)
        fc = _flat(f, axis, channels)
        pc = _flat(p, axis, channels)
        acc.add(fc, pc, pc[perm] if perm is not None else None, i)
        ref = session.run(out_names, {data.name: data.normalize(p).astype(np.float32, copy=False)})
        got = session.run(out_names, {data.name: data.normalize(f).astype(np.float32, copy=False)})
        for name, r, g in zip(out_names, ref, got):
            sims[name].update(r, g)
    report.compared = n
    integer = data.dtype != "float32"
    rng = np.maximum(np.maximum(acc.fmax, acc.pmax) - np.minimum(acc.fmin, acc.pmin), 1e-12)
    tol = EXACT_TOL * rng + (0.5 if integer else 0.0)   # integer files hold rounded values
    for c in range(channels):
        w = acc.worst[c]
        report.channels.append(ChannelDiff(channel=c, max_abs=float(acc.max_abs[c]),
                                           mean_abs=float(acc.sum_abs[c] / acc.n), range=float(rng[c]),
                                           worst_file=cal_files[w].name if w >= 0 else None,
                                           worst_image=image_files[w].name if w >= 0 else None))
    report.outputs = [OutputDiff(o, _finite(s.cosine), _finite(s.max_abs)) for o, s in sims.items()]
    if not np.all(acc.max_abs <= tol):
        report.findings.append(_diagnose(acc, data, tol, report, config))
    report.findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return report


def _flat(x: np.ndarray, axis: int | None, channels: int) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return (x.reshape(1, -1) if axis is None else np.moveaxis(x, axis, 0).reshape(channels, -1))


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _diagnose(acc: _PairAcc, data: InputData, tol: np.ndarray, report: PreprocessReport,
              config: HbConfig) -> Finding:
    worst_c = int(np.argmax(acc.max_abs / tol))
    cw = report.channels[worst_c]
    head = "calibration files were not produced by this preprocessing: "
    where = (f"channel {worst_c} differs by up to {cw.max_abs:.4g} (range {cw.range:.4g}, worst file "
             f"{cw.worst_file} vs image {cw.worst_image})")
    cos = [o for o in report.outputs if o.cosine is not None]
    effect = ""
    if cos:
        low = min(cos, key=lambda o: o.cosine or 0.0)
        effect = f"; float model output {low.output!r} cosine {low.cosine:.6f} between the two"
    fix = (f"; regenerate them with 'tuner make-cal-data {config.path} {report.images} --preprocess "
           f"{report.preprocess} --out {data.folder} --force' (or fix the script that wrote them)")
    frange = np.maximum(acc.fmax - acc.fmin, 1e-12)
    fits = [(False, *acc.fit(False))]
    if acc.sfq.any():
        fits.append((True, *acc.fit(True)))
    swapped_exact = len(fits) > 1 and bool(np.all(acc.max_abs_swapped <= tol))
    good = [(sw, a, b) for sw, a, b, r in fits if np.all(r <= FIT_TOL)]
    if swapped_exact or good:
        # prefer the pairing that needs no swap; among equals, the one with the smaller residual
        sw, a, b = (True, fits[1][1], fits[1][2]) if swapped_exact else good[0]
        sig = _signature(a, b, frange, data)
        # (as before: a fit _signature does not name fails here; see the cli15 report)
        assert sig is not None, "an exact fit without a known signature"
        code, text = sig
        if sw:
            ttype = config.inputs[0].type_train
            said = f" (the YAML says input_type_train {ttype!r})" if ttype in ("rgb", "bgr") else ""
            if code == "same":
                swap = ("channel order swapped (RGB vs BGR): the difference disappears when channels 0 and 2 are "
                        f"swapped{said}")
                return Finding(WARNING, "rgb_bgr_swap", data.name, None, f"{head}{swap}; {where}{effect}{fix}")
            return Finding(WARNING, f"rgb_bgr_swap+{code}", data.name, None,
                           f"{head}channel order swapped (RGB vs BGR: channels 0 and 2 exchanged){said}, and then "
                           f"{text}; {where}{effect}{fix}")
        if code != "same":
            return Finding(WARNING, code, data.name, None, f"{head}{text}; {where}{effect}{fix}")
    return Finding(WARNING, "tensors_differ", data.name, None,
                   f"{head}{where}, and no simple relation (channel swap, x255, mean/scale) explains it: a different "
                   f"resize/crop/interpolation, other images, or a different sort order{effect}{fix}")


def format_preprocess_report(report: PreprocessReport) -> str:
    """Per-channel and per-output tables followed by the findings."""
    lines = [f"preprocessing {report.preprocess} vs {report.cal_dir} (input {report.input!r}): compared "
             f"{report.compared} of {report.n_files} files / {report.n_images} images", ""]

    def table(header: list[str], rows: list[list[str]]) -> None:
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
        for k, r in enumerate([header] + rows):
            lines.append("  ".join(v.ljust(w) if i in (0, len(r) - 1) else v.rjust(w)
                                   for i, (v, w) in enumerate(zip(r, widths))).rstrip())
            if k == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("")

    if report.channels:
        table(["ch", "max |diff|", "mean |diff|", "range", "worst file"],
              [[str(c.channel), f"{c.max_abs:.4g}", f"{c.mean_abs:.4g}", f"{c.range:.4g}",
                f"{c.worst_file} ({c.worst_image})" if c.worst_file and c.max_abs > 0 else "-"]
               for c in report.channels])
    if report.outputs:
        table(["float output", "cosine", "max |diff|"],
              [[o.output, "-" if o.cosine is None else f"{o.cosine:.6f}",
                "-" if o.max_abs is None else f"{o.max_abs:.4g}"] for o in report.outputs])
    lines.extend(report.finding_lines("the calibration files match this preprocessing"))
    lines.append("")
    verdict = {0: "consistent", 1: "differences", 2: "unusable"}[report.exit_code()]
    lines.append(f"{verdict} (exit code {report.exit_code()})")
    return "\n".join(lines)
