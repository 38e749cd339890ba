"""Sanity checks of the calibration data an hb_mapper YAML points at (``tuner check-data``).

Most accuracy collapses after hb_mapper conversion come from the calibration data, not
from the config: files in the wrong format, double normalisation, unnormalised pixels,
a channel in metres next to channels in 0..1, constant channels, duplicates, too few
samples. :func:`check_data` reads every file once (streaming, one sample at a time),
accumulates per-input, per-channel statistics of the data *as the model sees it* (after
the YAML's mean/scale, which hb_mapper fuses into the model as HzPreprocess) and of the
raw files, and turns what it finds into :class:`Finding` s.

Format problems (an image in the folder, a wrong file size, NaN/Inf, an empty folder,
different sample counts per input) become ``error`` findings naming the files instead of
exceptions, so one run lists all of them. A missing or invalid YAML or model still raises
:class:`~tuner.errors.TunerError`.

Sample-count rule: hb_mapper's docs ask for ~100 representative images (the official YOLO
samples use 20-50). Percentile calibration (``max_percentile`` 0.99995) gets enough *values*
from a single sample (one 1x64x80x80 tensor has 409,600), so the limit is scene coverage:
a condition present in 5% of real inputs is missing from n samples with probability
0.95**n -- 36% at n=20, 8% at n=50, 0.6% at n=100. Hence a warning below
:data:`FEW_SAMPLES_WARNING` (20) and an info below :data:`RECOMMENDED_SAMPLES` (100).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx.numpy_helper

from tuner.errors import TunerError
from tuner.inputs.config import HbConfig, InputSpec, load_config
from tuner.inputs.data import (
    DTYPES,
    DataSet,
    InputData,
    _image_kind,
    check_image_file,
    image_reader,
    input_data,
    list_samples,
)
from tuner.inputs.findings import (  # noqa: F401  (re-exported: their old home)
    ERROR,
    INFO,
    SEVERITIES,
    WARNING,
    ChannelStats,
    DataReport,
    Finding,
    FindingsReport,
)
from tuner.inputs.model import LoadedModel, load_model

FEW_SAMPLES_WARNING = 20      # below: warning (a 5%-frequent condition is missed with p > 0.36)
RECOMMENDED_SAMPLES = 100     # below: info (hb_mapper docs: ~100 representative images)
RANGE_RATIO = 30.0            # channel max|x| ratio within one input that crushes the small channels
NORMALIZED_LIMIT = 3.0        # raw |x| <= this and non-integer: the files look already normalised
FEATUREMAP_PIXEL_MIN = 32.0    # a featuremap's integer max above this (and <= 255) looks like pixels, not a mask or ids
PIXEL_MIN_MAX = 2.0           # raw max above this, integer-valued, >= 0: looks like 0..255 pixels
NEAR_DUPLICATE_RMS = 0.005    # RMS difference of the coarse signatures, in units of channel range
SIGNATURE_GRID = 8            # coarse signature: per channel, an 8x8 grid of block means ...
POINT_GRID = 16               # ... and the values at 16x16 fixed points, which must agree within:
NEAR_DUPLICATE_POINTS_RMS = 0.01
IMAGE_TYPES = ("rgb", "bgr", "yuv444", "gray")
MAX_LISTED = 5                # files/pairs named in one aggregated message


class _Acc:
    """Streaming per-channel accumulators (float64) for one input."""

    def __init__(self, channels: int):
        z = lambda: np.zeros(channels, np.float64)  # noqa: E731
        self.n = 0                                   # values per channel accumulated
        self.sum, self.sumsq, self.zeros = z(), z(), z()
        self.min, self.max = np.full(channels, np.inf), np.full(channels, -np.inf)
        self.raw_min, self.raw_max = np.full(channels, np.inf), np.full(channels, -np.inf)
        self.raw_int = np.ones(channels, bool)       # every raw value integer-valued so far
        self.nan = np.zeros(channels, np.int64)
        self.inf = np.zeros(channels, np.int64)

    def add(self, raw: np.ndarray, seen: np.ndarray) -> None:
        """``raw``/``seen``: [C, M] float64, finite."""
        self.n += seen.shape[1]
        self.sum += seen.sum(axis=1)
        self.sumsq += np.einsum("ij,ij->i", seen, seen)
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


def _names(paths: list[Path]) -> str:
    shown = ", ".join(p.name for p in paths[:MAX_LISTED])
    return shown + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _resolve_inputs(config: HbConfig, input_shapes: dict[str, tuple[int, ...]],
                    data_dirs: list[Path] | None) -> list[tuple[InputData, InputSpec]]:
    """The InputData of every model input, as dataset_from_config builds them (no file access)."""
    return list(zip(input_data(config.inputs, input_shapes, data_dirs), config.inputs))


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


def check_data(config_path: str | Path, data_dirs: list[Path] | None = None,
               limit: int | None = None, loaded: tuple[HbConfig, LoadedModel] | None = None) -> DataReport:
    """Check the calibration data of ``config_path`` (or ``data_dirs``, one folder per input).

    Reads at most ``limit`` samples per input. Raises TunerError only for a bad YAML/model.
    ``loaded``: the YAML and model already loaded (a search's), not read again.
    """
    if loaded is not None:
        config, model = loaded
    else:
        config = load_config(config_path)
        model = load_model(config.onnx_model, {s.name: s.shape for s in config.inputs if s.shape is not None})
    resolved = _resolve_inputs(config, model.input_shapes, data_dirs)
    findings: list[Finding] = []
    for w in config.warnings:
        if "cal_data_type" in w:
            findings.append(Finding(INFO, "cal_data_type_inferred", None, None, w))
        elif "preprocess_on" in w:
            findings.append(Finding(WARNING, "preprocess_on", None, None, w))

    # ---- folders --------------------------------------------------------------------------
    files: list[list[Path]] = []
    for data, _ in resolved:
        if not data.folder.is_dir():
            findings.append(Finding(ERROR, "missing_folder", data.name, None,
                                    f"{data.folder}: calibration folder not found for input {data.name!r}; check "
                                    "calibration_parameters.cal_data_dir (relative to the YAML), or the folder given "
                                    "with --data or a space's eval_data"))
            files.append([])
            continue
        listed = list_samples(data.folder)
        if not listed:
            findings.append(Finding(ERROR, "empty_folder", data.name, None,
                                    f"{data.folder}: empty calibration folder for input {data.name!r}; write "
                                    "samples there with numpy's tofile()"))
        files.append(listed)
    counts = [len(f) for f in files]
    if len(resolved) > 1 and len(set(counts)) > 1 and min(counts) > 0:
        fewest = min(counts)
        extra = [p for f in files for p in f[fewest:]]
        detail = ", ".join(f"{d.name!r}: {n}" for (d, _), n in zip(resolved, counts))
        findings.append(Finding(ERROR, "count_mismatch", None, None,
                                f"the input folders hold different numbers of samples ({detail}); hb_mapper pairs "
                                f"them by sorted name, so files without a partner ({_names(extra)}) break the "
                                "pairing: give every input one file per sample"))
    paired = min(counts) if counts else 0
    if limit is not None:
        paired = min(paired, limit)

    # ---- one streaming pass ----------------------------------------------------------------
    channels = [d.channels for d, _ in resolved]
    sig_sizes: list[tuple[int, int]] = [(0, 0)] * len(resolved)
    accs = [_Acc(c) for c in channels]
    signatures: list[tuple[np.ndarray, np.ndarray]] = []
    digests: list[str] = []
    sample_files: list[Path] = []
    scan = [len(f) if limit is None else min(len(f), limit) for f in files]
    for i in range(max(scan, default=0)):
        pieces, digest, ok = [], hashlib.sha1(), True
        for k, (data, _) in enumerate(resolved):
            if i >= scan[k]:
                ok = False
                continue
            path = files[k][i]
            raw, problem = _read_raw(data, path)
            if problem is not None:
                findings.append(problem)
                ok = False
                continue
            assert raw is not None   # read, or a problem found
            axis = data.channel_axis
            rawc = _channels_first(raw, axis).reshape(channels[k], -1)
            nan = np.isnan(rawc).sum(axis=1)
            inf = np.isinf(rawc).sum(axis=1)
            if nan.any() or inf.any():
                accs[k].nan += nan
                accs[k].inf += inf
                bad = [c for c in range(channels[k]) if nan[c] or inf[c]]
                what = " and ".join(t for t, n in (("NaN", nan.sum()), ("Inf", inf.sum())) if n)
                findings.append(Finding(ERROR, "non_finite", data.name, bad[0] if len(bad) == 1 else None,
                                        f"{path}: contains {int(nan.sum())} NaN and {int(inf.sum())} Inf values "
                                        f"(channel{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}); "
                                        f"{what} poisons calibration: fix the preprocessing that wrote it or "
                                        "remove the file"))
                ok = False
                continue
            if i >= paired:
                continue
            seenc = _channels_first(np.asarray(data.normalize(raw), np.float64), axis)
            accs[k].add(rawc, seenc.reshape(channels[k], -1))
            pieces.append(_signature(seenc))
            sig_sizes[k] = (pieces[-1][0].size, pieces[-1][1].size)
            digest.update(np.ascontiguousarray(raw).tobytes())
        if ok and i < paired:
            signatures.append((np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])))
            digests.append(digest.hexdigest())
            sample_files.append(files[0][i])
    samples = len(signatures)

    stats = [s for (data, _), acc in zip(resolved, accs) for s in acc.stats(data.name)]
    for (data, spec), acc in zip(resolved, accs):
        if acc.n:
            findings.extend(_channel_findings(data, spec, acc, samples, config, model.proto))
    findings.extend(_duplicate_findings(signatures, digests, sample_files, accs, channels, sig_sizes))

    usable = samples + max(0, min(counts, default=0) - paired)   # files beyond --limit count as usable
    if usable and usable < RECOMMENDED_SAMPLES:
        severity = WARNING if usable < FEW_SAMPLES_WARNING else INFO
        findings.append(Finding(severity, "few_samples", None, None,
                                f"only {usable} usable calibration samples; hb_mapper's docs recommend ~"
                                f"{RECOMMENDED_SAMPLES} representative ones: thresholds come from few scenes "
                                f"(a condition in 5% of real inputs is missing from {usable} samples with "
                                f"probability {0.95 ** usable:.0%}); add varied samples"))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return DataReport(config=Path(config_path), samples=samples, inputs=[d.name for d, _ in resolved],
                      stats=stats, findings=findings)


def _first_nodes(proto, name: str) -> list[str]:
    return [n.name for n in proto.graph.node if name in n.input][:3]


def _channel_findings(data: InputData, spec: InputSpec, acc: _Acc, samples: int, config: HbConfig,
                      proto) -> list[Finding]:
    out: list[Finding] = []
    name = data.name
    nch = len(acc.sum)
    for c in range(nch):
        if acc.min[c] == acc.max[c]:
            v = float(acc.min[c])
            if v in (0.0, 1.0):
                state, other = ("set", "active") if v == 0 else ("cleared", "inactive")
                out.append(Finding(WARNING, "constant_channel", name, c,
                                   f"input {name!r} channel {c} is {v:g} everywhere in all {samples} samples: if it "
                                   f"is a 0/1 mask, calibration never sees it {state} and clips that value at "
                                   f"runtime; add samples where the mask is {other} (or fold a truly constant "
                                   "channel into the model)"))
            else:
                out.append(Finding(WARNING, "constant_channel", name, c,
                                   f"input {name!r} channel {c} is constant ({v:.4g}) in all {samples} samples: "
                                   "calibration learns nothing about its range and clips real values at runtime; "
                                   "add samples where it varies, or fold the constant into the model"))
    raw_lo, raw_hi = float(acc.raw_min.min()), float(acc.raw_max.max())
    raw_int = bool(acc.raw_int.all())
    if (spec.type_train in IMAGE_TYPES and spec.norm_type == "no_preprocess" and raw_hi > PIXEL_MIN_MAX
            and raw_int and raw_lo >= 0):
        out.append(Finding(WARNING, "unnormalized_image", name, None,
                           f"input {name!r} ({spec.type_train}) holds integer pixels {raw_lo:g}..{raw_hi:g} and "
                           "norm_type is no_preprocess, so the model sees unnormalized 0..255 values: if it was "
                           "trained on normalized input, keep the files 0..255 and set norm_type: "
                           "data_mean_and_scale with mean_value/scale_value (ImageNet: 123.675 116.28 103.53 / "
                           "0.01712475 0.017507 0.01742919; /255 only: data_scale, 0.003921568627451)"))
    if (spec.type_train == "featuremap" and spec.norm_type == "no_preprocess" and raw_int and raw_lo >= 0
            and FEATUREMAP_PIXEL_MIN < raw_hi <= 255):
        out.append(Finding(WARNING, "unnormalized_image", name, None,
                           f"input {name!r} (featuremap) holds integers {raw_lo:g}..{raw_hi:g}, like 0..255 pixels, "
                           "and a featuremap input gets no normalization (norm_type no_preprocess), so the model "
                           "sees them as they are: if it was trained on normalized images, write the files "
                           "normalized as in training, as float32 ('tuner make-cal-data --preprocess')"))
    if (spec.norm_type != "no_preprocess" and max(abs(raw_lo), abs(raw_hi)) <= NORMALIZED_LIMIT and not raw_int):
        seen_lo, seen_hi = float(acc.min.min()), float(acc.max.max())
        out.append(Finding(WARNING, "double_normalization", name, None,
                           f"input {name!r}: the files look already normalized (raw {raw_lo:.3g}..{raw_hi:.3g}, not "
                           f"integers) and the YAML normalizes again (HzPreprocess, norm_type {spec.norm_type}; the "
                           f"model sees {seen_lo:.3g}..{seen_hi:.3g}): write raw 0..255 pixels or set "
                           "norm_type: no_preprocess"))
    out.extend(_range_findings(name, acc, config, proto))
    return out


def _slice_channels(proto, node) -> tuple[int, int] | None:
    """[start, end) along axis 1 of a Slice whose starts/ends/axes are constants, else None."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = onnx.numpy_helper.to_array(a.t)
    ins = list(node.input) + [""] * 5
    starts: Any
    ends: Any
    axes: Any
    steps: Any = None
    if len(node.input) >= 3:          # opset >= 10: starts, ends, axes, steps as inputs
        starts, ends = consts.get(ins[1]), consts.get(ins[2])
        axes = consts.get(ins[3]) if ins[3] else None
        steps = consts.get(ins[4]) if ins[4] else None
    else:                             # opset 1-9: attributes
        attrs = {a.name: list(a.ints) for a in node.attribute}
        starts, ends, axes = attrs.get("starts"), attrs.get("ends"), attrs.get("axes")
    if starts is None or ends is None:
        return None
    starts, ends = [int(v) for v in np.ravel(starts)], [int(v) for v in np.ravel(ends)]
    axes_l = [int(v) for v in np.ravel(axes)] if axes is not None else list(range(len(starts)))
    if steps is not None and any(int(v) != 1 for v in np.ravel(steps)):
        return None
    if 1 not in axes_l:
        return None
    k = axes_l.index(1)
    return starts[k], ends[k]


def _group_threshold(name: str, absmax: np.ndarray, config: HbConfig, proto) -> tuple[float, str] | None:
    """The max threshold hb_mapper gives input ``name`` when only Slices read it: the first Slice's
    output range (graph order), not the input's own (measured on the real toolchain: the bundled
    example's input, read by three Slices, gets the RGB Slice's 1.0 and its radar channels are clipped;
    docs/hb_rules/placement.md 2b, tuner.simulate.sharing). None when a compute op reads the input or
    a Slice carries a node_info entry (then the input keeps its own range), or the Slice is not a
    constant channel slice."""
    readers = [n for n in proto.graph.node if name in n.input]
    if not readers or any(n.op_type != "Slice" for n in readers):
        return None
    if any(k != "ON" or v != "CPU" for n in readers for k, v in config.node_info.get(n.name, {}).items()):
        return None
    first = readers[0]
    span = _slice_channels(proto, first)
    if span is None:
        return None
    chans = list(range(len(absmax)))[span[0]:span[1]]
    if not chans:
        return None
    return float(max(absmax[c] for c in chans)), f"{first.name!r} (channels {chans[0]}-{chans[-1]})"


def _range_findings(name: str, acc: _Acc, config: HbConfig, proto) -> list[Finding]:
    """Channels of one input whose max|x| differs by >= RANGE_RATIO: split at the largest gap."""
    absmax = np.maximum(np.abs(acc.min), np.abs(acc.max))
    live = [c for c in range(len(absmax)) if absmax[c] > 0]
    if len(live) < 2:
        return []
    order = sorted(live, key=lambda c: absmax[c])
    gaps = [absmax[order[j + 1]] / absmax[order[j]] for j in range(len(order) - 1)]
    j = int(np.argmax(gaps))
    if gaps[j] < RANGE_RATIO:
        return []
    small, large = sorted(order[: j + 1]), sorted(order[j + 1:])
    small_max = float(absmax[order[j]])
    nodes = _first_nodes(proto, name)
    node_hint = (f"node_info {{{', '.join(repr(n) + ': {InputType: int16}' for n in nodes)}}}" if nodes
                 else "node_info InputType: int16 on the first nodes")
    # hb_mapper applies per-channel activation scales only on Conv inputs (by equalization,
    # docs/hb_rules/quantizer.md §1.5; tuner.simulate.scales): per_channel helps an input only Convs read.
    readers = sorted({n.op_type for n in proto.graph.node if name in n.input})
    conv_only = readers == ["Conv"]
    severity = INFO if config.per_channel and conv_only else WARNING
    if conv_only:
        fix = "set per_channel: True, make the input int16"
        extra = (" (per_channel is already True; check the input still gets per-channel scales)"
                 if config.per_channel else "")
    else:
        fix = "make the input int16"
        extra = (f" (per_channel does not help: hb_mapper applies per-channel scales only on Conv inputs, and "
                 f"this input feeds {', '.join(readers)})")
    group = _group_threshold(name, absmax, config, proto)
    out = []
    for c in large:
        if group is not None and absmax[c] > group[0] * 1.0001:
            t, first = group
            out.append(Finding(severity, "range_ratio", name, c,
                               f"input {name!r} channel {c} spans |x| <= {absmax[c]:.4g} while channel"
                               f"{'s' if len(small) > 1 else ''} {', '.join(map(str, small))} span <= {small_max:.3g} "
                               f"({absmax[c] / small_max:.0f}x), and only Slices read the input: hb_mapper gives it "
                               f"the threshold of the first Slice, {first}, |x| <= {t:.3g}, so channel {c} is "
                               f"clipped at {t:.3g} (under max; measured on the real toolchain); {fix}: an int16 "
                               f"request on any one of its Slices gives it its own range (node_info "
                               f"{{{nodes[0]!r}: {{InputType: int16}}}}), "
                               f"or rescale channel {c} in the data and the model{extra}"))
            continue
        step = float(absmax[c]) / 127.0
        levels = small_max / step
        out.append(Finding(severity, "range_ratio", name, c,
                           f"input {name!r} channel {c} spans |x| <= {absmax[c]:.4g} while channel"
                           f"{'s' if len(small) > 1 else ''} {', '.join(map(str, small))} span <= {small_max:.3g} "
                           f"({absmax[c] / small_max:.0f}x): one per-tensor int8 scale (step {step:.3g}) leaves the "
                           f"small channels ~{levels:.1f} of 127 levels; {fix} "
                           f"({node_hint}), or rescale channel {c} in the data and the model{extra}"))
    return out


def _duplicate_findings(signatures: list[tuple[np.ndarray, np.ndarray]], digests: list[str], files: list[Path],
                        accs: list[_Acc], channels: list[int], sizes: list[tuple[int, int]]) -> list[Finding]:
    """Identical samples (same bytes) and near-identical ones (coarse signatures within tolerance)."""
    n = len(signatures)
    if n < 2:
        return []
    # Normalise each signature entry by its channel's range so every channel counts alike.
    ranges = [np.where(r > 0, r, 1.0) for r in (np.maximum(np.abs(a.min), np.abs(a.max)) for a in accs)]
    close_enough = np.ones((n, n), bool)
    for part, limit in ((0, NEAR_DUPLICATE_RMS), (1, NEAR_DUPLICATE_POINTS_RMS)):
        div = np.concatenate([np.repeat(r, size[part] // c) for r, size, c in zip(ranges, sizes, channels)])
        sig = np.stack([s[part] for s in signatures]) / div
        sq = np.einsum("ij,ij->i", sig, sig)
        d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * sig @ sig.T, 0.0) / sig.shape[1]
        close_enough &= d2 < limit ** 2
    first: dict[str, int] = {}
    pairs: list[tuple[int, int, bool]] = []
    for j in range(n):
        if digests[j] in first:
            pairs.append((j, first[digests[j]], True))
            continue
        first[digests[j]] = j
        close = np.flatnonzero(close_enough[j, :j])
        if close.size:
            pairs.append((j, int(close[0]), False))
    if not pairs:
        return []
    exact = sum(p[2] for p in pairs)
    shown = ", ".join(f"{files[j].name} {'=' if e else '~'} {files[i].name}" for j, i, e in pairs[:MAX_LISTED])
    more = f" and {len(pairs) - MAX_LISTED} more" if len(pairs) > MAX_LISTED else ""
    return [Finding(WARNING, "duplicate_samples", None, None,
                    f"{len(pairs)} of {n} samples repeat an earlier one ({exact} identical, {len(pairs) - exact} "
                    f"near-identical: {shown}{more}); they add no information, so the set behaves like "
                    f"{n - len(pairs)} samples: replace them with different scenes")]


def format_report(report: DataReport) -> str:
    """A terminal table of per-input, per-channel statistics followed by the findings."""
    lines = [f"calibration data of {report.config}: {report.samples} usable samples, "
             f"input{'s' if len(report.inputs) != 1 else ''} {', '.join(report.inputs)}", ""]
    show_raw = any(s.raw_min is not None and (s.raw_min != s.min or s.raw_max != s.max) for s in report.stats)
    header = ["input", "ch", "mean", "std", "min", "max"] + (["raw min..max"] if show_raw else []) + \
        ["zero%", "nan", "inf"]
    rows = []
    for s in report.stats:
        row = [s.input, str(s.channel), _fmt(s.mean), _fmt(s.std), _fmt(s.min), _fmt(s.max)]
        if show_raw:
            row.append("-" if s.raw_min is None else f"{s.raw_min:.4g}..{s.raw_max:.4g}")
        row += ["-" if s.zero_share is None else f"{100 * s.zero_share:.1f}", str(s.nan), str(s.inf)]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for k, r in enumerate([header] + rows):
        cells = (v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.extend(report.finding_lines("no findings"))
    lines.append("")
    lines.append(f"{report.count(ERROR)} errors, {report.count(WARNING)} warnings, {report.count(INFO)} info "
                 f"(exit code {report.exit_code()})")
    return "\n".join(lines)
