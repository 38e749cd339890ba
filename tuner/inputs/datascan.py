"""One streaming pass over the calibration files (``tuner check-data``, :mod:`tuner.inputs.checks`).

Reads every file once, one sample at a time: the raw values, the values *as the model sees them*
(after the YAML's mean/scale, which hb_mapper fuses into the model as HzPreprocess), per-input,
per-channel statistics of both (:class:`ChannelAcc`), and a coarse signature and digest per sample for the
duplicate check. A file that cannot be used becomes an ``error`` :class:`Finding` naming it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.inputs.data import DTYPES, DataSet, InputData, _image_kind, check_image_file, image_reader, list_samples
from tuner.inputs.findings import ERROR, ChannelStats, Finding

SIGNATURE_GRID = 8            # coarse signature: per channel, an 8x8 grid of block means ...
POINT_GRID = 16               # ... and the values at 16x16 fixed points (duplicate check)


class ChannelAcc:
    """Streaming per-channel accumulators (float64) for one input."""

    def __init__(self, channels: int):
        z = lambda: np.zeros(channels, np.float64)  # noqa: E731
        self.n = 0                                   # values per channel accumulated
        self.sum, self.sumsq, self.zeros = z(), z(), z()
        self.min, self.max = np.full(channels, np.inf), np.full(channels, -np.inf)
        self.raw_min, self.raw_max = np.full(channels, np.inf), np.full(channels, -np.inf)
        self.raw_int = np.ones(channels, bool)       # every raw value integer-valued so far
        self.raw_sum = z()                           # of the raw values (datarules.channel_order)
        self.nan = np.zeros(channels, np.int64)
        self.inf = np.zeros(channels, np.int64)
        # the files' layout (datarules.layout_mismatch): mean |b[i+1] - b[i]| and |b[i+C] - b[i]| over each
        # file's values in file order, C the channel count
        self.step_one = self.step_c = 0.0
        self.steps = 0

    def add_steps(self, flat: np.ndarray) -> None:
        """One file's values in file order: neighbours 1 and C apart (C > 1)."""
        c = len(self.sum)
        if c < 2 or flat.size <= c:
            return
        self.step_one += float(np.abs(np.diff(flat)).mean())
        self.step_c += float(np.abs(flat[c:] - flat[:-c]).mean())
        self.steps += 1

    def add(self, raw: np.ndarray, seen: np.ndarray) -> None:
        """``raw``/``seen``: [C, M] float64, finite."""
        self.n += seen.shape[1]
        self.sum += seen.sum(axis=1)
        self.sumsq += np.einsum("ij,ij->i", seen, seen)
        self.raw_sum += raw.sum(axis=1)
        self.zeros += (seen == 0).sum(axis=1)
        np.minimum(self.min, seen.min(axis=1), out=self.min)
        np.maximum(self.max, seen.max(axis=1), out=self.max)
        np.minimum(self.raw_min, raw.min(axis=1), out=self.raw_min)
        np.maximum(self.raw_max, raw.max(axis=1), out=self.raw_max)
        for c in np.flatnonzero(self.raw_int):
            self.raw_int[c] = bool(np.all(raw[c] == np.round(raw[c])))

    def stats(self, name: str) -> list[ChannelStats]:
        out = []
        for c in range(len(self.sum)):
            if self.n == 0:
                out.append(ChannelStats(name, c, None, None, None, None, None, int(self.nan[c]), int(self.inf[c])))
                continue
            mean = self.sum[c] / self.n
            var = max(self.sumsq[c] / self.n - mean * mean, 0.0)
            std = 0.0 if self.min[c] == self.max[c] else float(np.sqrt(var))
            out.append(ChannelStats(name, c, float(mean), std, float(self.min[c]), float(self.max[c]),
                                    float(self.zeros[c] / self.n), int(self.nan[c]), int(self.inf[c]),
                                    float(self.raw_min[c]), float(self.raw_max[c])))
        return out


def _channels_first(x: np.ndarray, axis: int | None) -> np.ndarray:
    """[C, ...] view with the channel axis first (one channel for rank < 2)."""
    return x[None] if axis is None else np.moveaxis(x, axis, 0)


def _signature(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coarse picture of one sample ([C, ...] float64) for duplicate detection.

    Per channel: block means on an 8x8 grid (layout of the scene) and the values at 16x16 fixed
    points (texture: two noise-like samples have the same block means but different points).
    """
    c = x.shape[0]
    if x.ndim == 4 and x.shape[1] == 1 or x.ndim == 3:      # [C, 1, H, W] / [C, H, W]
        img = x.reshape(c, x.shape[-2], x.shape[-1])
        h, w = img.shape[1:]
        rows = np.linspace(0, h - 1, min(POINT_GRID, h)).round().astype(int)
        cols = np.linspace(0, w - 1, min(POINT_GRID, w)).round().astype(int)
        points = img[:, rows][:, :, cols]
        gh, gw = min(SIGNATURE_GRID, h), min(SIGNATURE_GRID, w)
        img = img[:, : h - h % gh, : w - w % gw]
        means = img.reshape(c, gh, img.shape[1] // gh, gw, img.shape[2] // gw).mean(axis=(2, 4))
        return means.ravel(), points.ravel()
    flat = x.reshape(c, -1)
    k = min(SIGNATURE_GRID * SIGNATURE_GRID, flat.shape[1])
    means = np.stack([p.mean(axis=1) for p in np.array_split(flat, k, axis=1)], axis=1)
    idx = np.linspace(0, flat.shape[1] - 1, min(POINT_GRID * POINT_GRID, flat.shape[1])).round().astype(int)
    return means.ravel(), flat[:, idx].ravel()


def _read_raw(data: InputData, path: Path) -> tuple[np.ndarray | None, Finding | None]:
    """The file's values (float64, the input's shape) or an error finding naming the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        return None, Finding(ERROR, "unreadable", data.name, None, f"{path}: cannot be read ({exc.strerror}); "
                             "fix its permissions or remove it")
    if data.images is not None:      # preprocess_on: hb_mapper reads the folder's images itself
        read = image_reader(data)    # without Pillow: a TunerError, not a finding per file
        try:
            check_image_file(data, path, head)
            return read(path).astype(np.float64), None
        except TunerError as exc:
            return None, Finding(ERROR, "not_an_image", data.name, None, str(exc))
    kind = _image_kind(head)
    if kind:
        return None, Finding(ERROR, "image_file", data.name, None,
                             f"{path}: is {kind}, not a raw tensor; hb_mapper reads numpy.tofile() dumps of "
                             "preprocessed samples: convert the images (see 'tuner make-cal-data') or remove the file")
    try:
        DataSet._check_file(data, path)
    except TunerError as exc:
        return None, Finding(ERROR, "wrong_size", data.name, None,
                             f"{exc}; rewrite it with numpy's tofile() in that shape and dtype, or remove it")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # numpy raises ValueError, OSError, EOFError, ...
            return None, Finding(ERROR, "unreadable", data.name, None,
                                 f"{path}: not a readable .npy file ({exc}); rewrite it with numpy.save or remove it")
        if arr.shape != data.shape:
            if arr.size != int(np.prod(data.shape)) or arr.shape != data.shape[1:]:
                return None, Finding(ERROR, "wrong_size", data.name, None,
                                     f"{path}: shape {arr.shape}, but input {data.name!r} needs "
                                     f"{'x'.join(map(str, data.shape))}; rewrite it in that shape or remove it")
            arr = arr.reshape(data.shape)
    else:
        arr = np.fromfile(path, dtype=DTYPES[data.dtype]).reshape(data.shape)
    return arr.astype(np.float64), None


def list_folder(data: InputData) -> tuple[list[Path], list[Finding]]:
    """The sample files of one input's calibration folder, or an error finding when the folder is
    missing or empty."""
    if not data.folder.is_dir():
        return [], [Finding(ERROR, "missing_folder", data.name, None,
                            f"{data.folder}: calibration folder not found for input {data.name!r}; check "
                            "calibration_parameters.cal_data_dir (relative to the YAML), or the folder given "
                            "with --data or a space's eval_data")]
    listed = list_samples(data.folder)
    if not listed:
        return [], [Finding(ERROR, "empty_folder", data.name, None,
                            f"{data.folder}: empty calibration folder for input {data.name!r}; write "
                            "samples there with numpy's tofile()")]
    return listed, []


@dataclass(frozen=True)
class Scan:
    """What one pass over the files found: per input its accumulators (and signature part sizes), per
    usable sample (every input's file read and finite, within the paired count) its signature, digest
    and first input's file, and the files that could not be used."""

    accs: list[ChannelAcc]
    sizes: list[tuple[int, int]]
    signatures: list[tuple[np.ndarray, np.ndarray]]
    digests: list[str]
    files: list[Path]
    findings: list[Finding]


def scan_samples(inputs: list[InputData], files: list[list[Path]], paired: int, limit: int | None) -> Scan:
    """Read sample ``i`` of every input for each ``i`` (at most ``limit`` per input); the first ``paired``
    samples feed the statistics and signatures, the rest are only checked."""
    channels = [d.channels for d in inputs]
    sizes: list[tuple[int, int]] = [(0, 0)] * len(inputs)
    accs = [ChannelAcc(c) for c in channels]
    signatures: list[tuple[np.ndarray, np.ndarray]] = []
    digests: list[str] = []
    sample_files: list[Path] = []
    findings: list[Finding] = []
    scan = [len(f) if limit is None else min(len(f), limit) for f in files]
    for i in range(max(scan, default=0)):
        pieces, digest, ok = [], hashlib.sha1(), True
        for k, data in enumerate(inputs):
            if i >= scan[k]:
                ok = False
                continue
            raw, rawc, problem = _read_finite(data, files[k][i], accs[k])
            if problem is not None:
                findings.append(problem)
                ok = False
                continue
            assert raw is not None and rawc is not None   # read, or a problem found
            if i >= paired:
                continue
            seenc = _channels_first(np.asarray(data.normalize(raw), np.float64), data.channel_axis)
            accs[k].add(rawc, seenc.reshape(channels[k], -1))
            if data.images is None and raw.ndim == 4:   # images are read in the YAML's layout
                accs[k].add_steps(raw.reshape(-1))
            pieces.append(_signature(seenc))
            sizes[k] = (pieces[-1][0].size, pieces[-1][1].size)
            digest.update(np.ascontiguousarray(raw).tobytes())
        if ok and i < paired:
            signatures.append((np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])))
            digests.append(digest.hexdigest())
            sample_files.append(files[0][i])
    return Scan(accs, sizes, signatures, digests, sample_files, findings)


def _read_finite(data: InputData, path: Path, acc: ChannelAcc
                 ) -> tuple[np.ndarray | None, np.ndarray | None, Finding | None]:
    """The file's values, as read and as [C, M] (channels first), or an error finding when it cannot be
    read or holds NaN/Inf (counted in ``acc``)."""
    raw, problem = _read_raw(data, path)
    if problem is not None:
        return None, None, problem
    assert raw is not None   # read, or a problem found
    channels = data.channels
    rawc = _channels_first(raw, data.channel_axis).reshape(channels, -1)
    nan = np.isnan(rawc).sum(axis=1)
    inf = np.isinf(rawc).sum(axis=1)
    if not (nan.any() or inf.any()):
        return raw, rawc, None
    acc.nan += nan
    acc.inf += inf
    bad = [c for c in range(channels) if nan[c] or inf[c]]
    what = " and ".join(t for t, n in (("NaN", nan.sum()), ("Inf", inf.sum())) if n)
    return None, None, Finding(ERROR, "non_finite", data.name, bad[0] if len(bad) == 1 else None,
                               f"{path}: contains {int(nan.sum())} NaN and {int(inf.sum())} Inf values "
                               f"(channel{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}); "
                               f"{what} poisons calibration: fix the preprocessing that wrote it or "
                               "remove the file")
