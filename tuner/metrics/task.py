"""Streaming task metrics: what users care about, beyond cosine similarity.

Every accumulator takes ONE sample per ``update(...)`` (a leading batch dimension of 1 is
dropped; a larger batch is an error) and keeps only running sums, never whole-dataset arrays,
like :class:`tuner.metrics.similarity.Similarity`. Results are properties and ``as_dict()``;
a result with nothing measured yet is NaN.

* :class:`SegAgreement` -- argmax(float) == argmax(quant), over all pixels of all samples.
* :class:`SegIoU` -- mIoU and pixel accuracy of one model against label maps (run one for the
  float model and one for the quantized model to report "mIoU float vs quantized").
* :class:`DepthError` -- AbsRel, RMSE, delta1 of a depth map against a reference (the float
  output or labels).
* :class:`Top1` -- classification: agreement float vs quant, and accuracy against labels.
* :func:`load_user_metric` / :class:`UserMetric` (tuner.metrics.user) -- a user's per-sample function, averaged.
* :func:`parse_metric_spec` / :func:`higher_is_better` -- the ``"<kind>:<output>"`` selection.

Shape problems (wrong rank, mismatched maps, one-channel "segmentation") and bad labels usually
mean the metric was pointed at the wrong output, so they raise :class:`TunerError`.
"""

from __future__ import annotations

import glob as _glob
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import TunerError
from tuner.metrics.user import UserFn, UserMetric, load_callable, load_user_metric  # noqa: F401 (re-exported)


def _drop_batch(a: Any, ndim: int, what: str) -> np.ndarray:
    """``a`` with leading size-1 dimensions dropped down to ``ndim`` dimensions."""
    arr = np.asarray(a)
    shape = arr.shape
    while arr.ndim > ndim and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != ndim:
        raise TunerError(f"{what}: expected {ndim} dimensions (plus an optional batch dimension "
                         f"of 1), got shape {shape}; is the metric pointed at the right output?")
    return arr


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


# --------------------------------------------------------------------------- segmentation

def _seg_argmax(logits: Any, what: str) -> np.ndarray:
    x = _drop_batch(logits, 3, what)
    if x.shape[0] < 2:
        raise TunerError(f"{what}: logits have {x.shape[0]} channel(s) (shape {np.shape(logits)}); "
                         "argmax needs at least 2 classes [C,H,W]; for a one-channel map use a "
                         "cosine or depth metric instead")
    return np.argmax(x, axis=0)


@dataclass
class SegAgreement:
    """Fraction of pixels whose argmax class is the same in the float and quantized logits."""

    agree: int = 0
    count: int = 0

    def update(self, float_logits: np.ndarray, quant_logits: np.ndarray) -> None:
        """Logits ``[1,C,H,W]`` or ``[C,H,W]``, the same shape for both."""
        f = _seg_argmax(float_logits, "SegAgreement")
        q = _seg_argmax(quant_logits, "SegAgreement")
        if f.shape != q.shape:
            raise TunerError(f"SegAgreement: shape mismatch {np.shape(float_logits)} vs "
                             f"{np.shape(quant_logits)}")
        self.agree += int(np.count_nonzero(f == q))
        self.count += f.size

    @property
    def agreement(self) -> float:
        return _ratio(self.agree, self.count)

    def as_dict(self) -> dict[str, float]:
        return {"seg_agreement": self.agreement}


@dataclass
class SegIoU:
    """Confusion matrix of argmax(logits) against integer label maps; mIoU and pixel accuracy.

    ``confusion[label, pred]`` counts pixels; pixels labelled ``ignore_label`` are not counted.
    The number of classes C comes from the first logits seen. Any other label outside
    ``[0, C)`` is an error (a wrong ignore label or a model with fewer classes than the data).

    mIoU rule: IoU_c = TP / (TP + FP + FN) for each class c; the mean is over classes present
    in the labels or in the predictions (on non-ignored pixels) of all samples seen, i.e. a
    class whose union is 0 is skipped, not counted as 0 or 1.
    """

    ignore_label: int | None = 255
    confusion: np.ndarray | None = field(default=None, repr=False)

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        """Logits ``[1,C,H,W]`` or ``[C,H,W]``; labels ``[H,W]`` (or ``[1,H,W]``) of class ids."""
        pred = _seg_argmax(logits, "SegIoU")
        n = int(np.shape(_drop_batch(logits, 3, "SegIoU"))[0])
        lab = _drop_batch(labels, 2, "SegIoU labels")
        if lab.shape != pred.shape:
            raise TunerError(f"SegIoU: labels shape {np.shape(labels)} does not match the logits' "
                             f"spatial shape {pred.shape} (from {np.shape(logits)}); resize the "
                             "labels (nearest) to the model's output size")
        if not np.issubdtype(lab.dtype, np.integer):
            if not np.all(np.isfinite(lab)) or not np.all(lab == np.round(lab)):
                raise TunerError(f"SegIoU: labels must be integer class ids, got dtype {lab.dtype} "
                                 "with non-integer values")
        lab = lab.astype(np.int64).ravel()
        pred = pred.astype(np.int64).ravel()
        if self.confusion is None:
            self.confusion = np.zeros((n, n), dtype=np.int64)
        elif self.confusion.shape[0] != n:
            raise TunerError(f"SegIoU: logits have {n} classes but earlier samples had "
                             f"{self.confusion.shape[0]}")
        keep = lab != self.ignore_label if self.ignore_label is not None else slice(None)
        lab, pred = lab[keep], pred[keep]
        bad = (lab < 0) | (lab >= n)
        if bad.any():
            raise TunerError(f"SegIoU: label values {sorted(set(lab[bad].tolist()))[:5]} are outside "
                             f"the model's classes 0..{n - 1} and are not the ignore label "
                             f"{self.ignore_label}; set the ignore label or check the label maps")
        self.confusion += np.bincount(lab * n + pred, minlength=n * n).reshape(n, n)

    @property
    def iou(self) -> np.ndarray:
        """Per-class IoU; NaN for a class absent from both labels and predictions."""
        if self.confusion is None:
            return np.zeros(0)
        cm = self.confusion
        tp = np.diag(cm).astype(np.float64)
        union = cm.sum(axis=0) + cm.sum(axis=1) - tp
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(union > 0, tp / np.maximum(union, 1), np.nan)

    @property
    def miou(self) -> float:
        iou = self.iou
        present = ~np.isnan(iou)
        return float(iou[present].mean()) if present.any() else math.nan

    @property
    def pixel_accuracy(self) -> float:
        if self.confusion is None:
            return math.nan
        return _ratio(float(np.trace(self.confusion)), float(self.confusion.sum()))

    @property
    def count(self) -> int:
        """Pixels counted (ignored pixels excluded)."""
        return 0 if self.confusion is None else int(self.confusion.sum())

    def as_dict(self) -> dict[str, float]:
        return {"miou": self.miou, "pixel_accuracy": self.pixel_accuracy}


# --------------------------------------------------------------------------- depth

@dataclass
class DepthError:
    """AbsRel, RMSE and delta1 of a depth/regression map against a reference map.

    Only valid pixels count: the reference is finite, ``> min_depth`` and, when ``max_depth`` is
    set, ``<= max_depth`` (the cap excludes pixels; predictions are not clipped). A non-finite
    or non-positive prediction on a valid pixel is NOT excluded: it shows up as a NaN/inf
    AbsRel/RMSE and a delta1 failure, since hiding it would hide a broken quantized model.

    * AbsRel = mean(|p - r| / r)
    * RMSE = sqrt(mean((p - r)^2))
    * delta1 = fraction with max(p/r, r/p) < 1.25 (a prediction <= 0 fails)
    """

    min_depth: float = 1e-3
    max_depth: float | None = None
    abs_rel_sum: float = 0.0
    sq_sum: float = 0.0
    delta1_hits: int = 0
    count: int = 0

    def update(self, pred: np.ndarray, ref: np.ndarray) -> None:
        """``pred`` ``[1,1,H,W]``/``[1,H,W]``/``[H,W]``; ``ref`` the same or labels ``[H,W]``."""
        p = _drop_batch(pred, 2, "DepthError prediction").astype(np.float64)
        r = _drop_batch(ref, 2, "DepthError reference").astype(np.float64)
        if p.shape != r.shape:
            raise TunerError(f"DepthError: prediction shape {np.shape(pred)} does not match the "
                             f"reference shape {np.shape(ref)}")
        with np.errstate(invalid="ignore"):
            valid = np.isfinite(r) & (r > self.min_depth)
            if self.max_depth is not None:
                valid &= r <= self.max_depth
        p, r = p[valid], r[valid]
        if not r.size:
            return
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            err = p - r
            self.abs_rel_sum += float(np.sum(np.abs(err) / r))
            self.sq_sum += float(np.sum(err * err))
            ratio = p / r                   # r > 0: max(p/r, r/p) < 1.25  <=>  0.8 < p/r < 1.25
            self.delta1_hits += int(np.count_nonzero((ratio < 1.25) & (ratio > 1.0 / 1.25)))
        self.count += r.size

    @property
    def abs_rel(self) -> float:
        return _ratio(self.abs_rel_sum, self.count)

    @property
    def rmse(self) -> float:
        return math.sqrt(self.sq_sum / self.count) if self.count else math.nan

    @property
    def delta1(self) -> float:
        return _ratio(self.delta1_hits, self.count)

    def as_dict(self) -> dict[str, float]:
        return {"absrel": self.abs_rel, "rmse": self.rmse, "delta1": self.delta1}


# --------------------------------------------------------------------------- classification

def _top1(logits: Any, what: str) -> int:
    x = _drop_batch(logits, 1, what)
    if x.size < 2:
        raise TunerError(f"{what}: logits of shape {np.shape(logits)} have fewer than 2 classes")
    return int(np.argmax(x))


@dataclass
class Top1:
    """Top-1 agreement (float vs quant, :meth:`update`) and accuracy (vs labels,
    :meth:`update_labels`); the two counters are independent."""

    agree: int = 0
    count: int = 0
    correct: int = 0
    labelled: int = 0

    def update(self, float_logits: np.ndarray, quant_logits: np.ndarray) -> None:
        """Logits ``[1,K]`` or ``[K]``."""
        f, q = _top1(float_logits, "Top1"), _top1(quant_logits, "Top1")
        if np.shape(float_logits) != np.shape(quant_logits):
            raise TunerError(f"Top1: shape mismatch {np.shape(float_logits)} vs "
                             f"{np.shape(quant_logits)}")
        self.agree += int(f == q)
        self.count += 1

    def update_labels(self, logits: np.ndarray, label: int | np.ndarray) -> None:
        """Logits ``[1,K]`` or ``[K]``; ``label`` an integer class id (or a one-element array)."""
        k = int(np.size(logits))
        pred = _top1(logits, "Top1")
        lab = np.asarray(label)
        if lab.size != 1 or not (np.issubdtype(lab.dtype, np.integer)
                                 or (np.issubdtype(lab.dtype, np.floating)
                                     and float(lab.ravel()[0]).is_integer())):
            raise TunerError(f"Top1: a label must be one integer class id, got {label!r}")
        lab_i = int(lab.ravel()[0])
        if not 0 <= lab_i < k:
            raise TunerError(f"Top1: label {lab_i} is outside the model's classes 0..{k - 1}")
        self.correct += int(pred == lab_i)
        self.labelled += 1

    @property
    def agreement(self) -> float:
        return _ratio(self.agree, self.count)

    @property
    def accuracy(self) -> float:
        return _ratio(self.correct, self.labelled)

    def as_dict(self) -> dict[str, float]:
        """Only the measured counters: ``top1_agreement`` and/or ``top1_accuracy``."""
        out = {}
        if self.count:
            out["top1_agreement"] = self.agreement
        if self.labelled:
            out["top1_accuracy"] = self.accuracy
        return out


# --------------------------------------------------------------------------- selection

# kind -> higher is better
KINDS: dict[str, bool] = {
    "seg_agreement": True, "miou": True, "absrel": False, "rmse": False, "delta1": True,
    "top1": True, "user": True,
}
_SPEC_FORMS = ("seg_agreement:<output>, miou:<output>, absrel:<output>, rmse:<output>, "
               "delta1:<output>, top1:<output>, user:<module>:<function>, "
               "user:<path/to/file.py>:<function>")


@dataclass(frozen=True)
class MetricSpec:
    """One metric selection. ``output`` is None for ``user`` (the function sees all outputs);
    ``user`` holds the ``module:function`` / ``file.py:function`` spec, else None."""

    kind: str
    output: str | None = None
    user: str | None = None

    @property
    def higher_is_better(self) -> bool:
        return higher_is_better(self.kind)


def parse_metric_spec(text: str) -> MetricSpec:
    """``"<kind>:<output>"`` or ``"user:<module or file.py>:<function>"``.

    Everything after the first ``:`` is the output name, so names such as ``"Identity:0"``
    work. ``user`` specs are only checked for shape here; :func:`load_user_metric` loads them.
    """
    kind, sep, rest = str(text).strip().partition(":")
    kind = kind.strip().lower()
    rest = rest.strip()
    if not sep or not rest or kind not in KINDS:
        why = f"unknown metric {kind!r}" if sep and rest and kind not in KINDS else "bad form"
        raise TunerError(f"metric {text!r}: {why}; use one of: {_SPEC_FORMS}")
    if kind == "user":
        target, colon, fn = rest.rpartition(":")
        if not colon or not target.strip() or not fn.strip().isidentifier():
            raise TunerError(f"metric {text!r}: a user metric needs a module or file and a "
                             f"function; use user:<module>:<function> or "
                             f"user:<path/to/file.py>:<function>")
        return MetricSpec(kind="user", output=None, user=f"{target.strip()}:{fn.strip()}")
    return MetricSpec(kind=kind, output=rest)


def higher_is_better(kind: str) -> bool:
    """True for agreement/accuracy-like metrics (and user metrics: return a score, negate a
    loss), False for errors (``absrel``, ``rmse``)."""
    try:
        return KINDS[kind.strip().lower()]
    except KeyError:
        raise TunerError(f"unknown metric kind {kind!r}; known: {', '.join(KINDS)}") from None


class LabelSet:
    """Per-output label files, paired with the evaluation samples by sorted file name.

    ``patterns`` maps an output name to a glob (``data/labels/seg_*.npy``), relative to ``base``.
    Files are read one sample at a time, like the data themselves.
    """

    def __init__(self, patterns: dict[str, str], base: Path, n_samples: int):
        self.files: dict[str, list[Path]] = {}
        for output, pattern in patterns.items():
            full = pattern if Path(pattern).is_absolute() else str(Path(base) / pattern)
            files = sorted(Path(p) for p in _glob.glob(full))
            if len(files) < n_samples:
                raise TunerError(f"labels for output {output!r}: {len(files)} files match {pattern!r} but there are "
                                 f"{n_samples} evaluation samples; give one label file per sample (sorted by name)")
            self.files[output] = files[:n_samples]

    def sample(self, i: int) -> dict[str, np.ndarray]:
        out = {}
        for output, files in self.files.items():
            try:
                out[output] = np.load(files[i], allow_pickle=False)
            except Exception as exc:
                raise TunerError(f"{files[i]}: not a readable .npy label file ({exc})") from None
        return out


class TaskScore:
    """The selected task metrics, accumulated over one evaluation pass (one instance per pass).

    Against labels where the output has them (mIoU, depth errors, top-1 accuracy), else
    against the float model's output (agreement, depth error relative to float).
    """

    def __init__(self, specs: list[MetricSpec], user_fns: dict[str, UserFn] | None = None):
        """``user_fns``: the user metrics of ``specs``, loaded once at set-up
        (:func:`load_user_metrics`), so a pass per trial does not import the user's file again."""
        self.specs = specs
        self._acc: dict[MetricSpec, Any] = {}
        for spec in specs:
            if spec.kind == "user":
                assert user_fns is not None and spec.user is not None   # a user spec names its function
                self._acc[spec] = UserMetric(user_fns[spec.user], name=spec.user)
            else:
                self._acc[spec] = _ACCUMULATORS[spec.kind]()

    def update(self, ref: dict[str, np.ndarray], quant: dict[str, np.ndarray],
               labels: dict[str, np.ndarray] | None = None) -> None:
        labels = labels or {}
        for spec, acc in self._acc.items():
            if spec.kind == "user":
                acc.update(ref, quant, labels or None)
                continue
            if spec.output not in quant:
                raise TunerError(f"metric {spec.kind}:{spec.output}: the model has no output {spec.output!r}; it has "
                                 f"{', '.join(quant)}")
            label = labels.get(spec.output)
            if spec.kind == "seg_agreement":
                acc.update(ref[spec.output], quant[spec.output])
            elif spec.kind == "miou":
                if label is None:
                    raise TunerError(f"metric miou:{spec.output} needs label maps: set labels: {{{spec.output}: "
                                     f"'folder/*.npy'}} in the search space (or use seg_agreement:{spec.output})")
                acc.update(quant[spec.output], label)
            elif spec.kind in ("absrel", "rmse", "delta1"):
                acc.update(quant[spec.output], label if label is not None else ref[spec.output])
            elif label is not None:
                acc.update_labels(quant[spec.output], label)
            else:
                acc.update(ref[spec.output], quant[spec.output])

    def results(self) -> dict[str, float]:
        out = {}
        for spec, acc in self._acc.items():
            if spec.kind == "top1":
                out[spec_text(spec)] = acc.accuracy if acc.labelled else acc.agreement
            else:
                out[spec_text(spec)] = getattr(acc, _VALUES[spec.kind])
        return out


#: The accumulator of each metric kind, and the property that holds its value.
_ACCUMULATORS = {"seg_agreement": SegAgreement, "miou": SegIoU, "absrel": DepthError, "rmse": DepthError,
                 "delta1": DepthError, "top1": Top1}
_VALUES = {"seg_agreement": "agreement", "miou": "miou", "absrel": "abs_rel", "rmse": "rmse", "delta1": "delta1",
           "user": "value"}


def load_user_metrics(specs: list[MetricSpec], base_dir: Path | None = None) -> dict[str, UserFn]:
    """Load every user metric of ``specs`` once (at set-up, where a bad spec should fail)."""
    return {s.user: load_user_metric(s.user, base_dir) for s in specs if s.kind == "user" and s.user is not None}


def spec_text(spec: MetricSpec) -> str:
    return f"user:{spec.user}" if spec.kind == "user" else f"{spec.kind}:{spec.output}"
