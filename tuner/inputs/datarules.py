"""The calibration-data checks of ``tuner check-data`` (:mod:`tuner.inputs.checks`), each a function.

Each check reads what the streaming pass (:mod:`tuner.inputs.datascan`) accumulated and returns its
:class:`Finding` s: per input, the channel rules of :data:`CHANNEL_RULES` (constant channels,
unnormalized pixels, double normalization, files in the other layout, a hint of swapped colour order,
channel ranges one int8 scale cannot serve); over the
whole set, :func:`count_mismatch`, :func:`duplicates` and :func:`few_samples`. The
sample-count rule is explained in :mod:`tuner.inputs.checks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

from tuner.inputs.config import HbConfig, InputSpec
from tuner.inputs.data import InputData
from tuner.inputs.datascan import ChannelAcc
from tuner.inputs.findings import ERROR, INFO, WARNING, Finding

FEW_SAMPLES_WARNING = 20      # below: warning (a 5%-frequent condition is missed with p > 0.36)
RECOMMENDED_SAMPLES = 100     # below: info (hb_mapper docs: ~100 representative images)
RANGE_RATIO = 30.0            # channel max|x| ratio within one input that crushes the small channels
NORMALIZED_LIMIT = 3.0        # raw |x| <= this and non-integer: the files look already normalised
FEATUREMAP_PIXEL_MIN = 32.0    # a featuremap's integer max above this (and <= 255) looks like pixels, not a mask or ids
PIXEL_MIN_MAX = 2.0           # raw max above this, integer-valued, >= 0: looks like 0..255 pixels
NEAR_DUPLICATE_RMS = 0.005    # RMS difference of the coarse signatures, in units of channel range
NEAR_DUPLICATE_POINTS_RMS = 0.01   # ... and of the values at the fixed points
IMAGE_TYPES = ("rgb", "bgr", "yuv444", "gray")
CAMERA_TYPES = ("nv12", "yuv444", "rgb", "bgr", "gray")   # input_type_rt with an input path (inputpath.py)
#: Layout: the mean |difference| of values 1 apart in file order over that of values C apart. A planar
#: (NCHW) file of a photo has neighbouring pixels 1 apart (ratio 0.35..0.67 on nine scikit-image colour
#: photos), an interleaved (NHWC) one a pixel's other channels (0.90 on the dark, nearly grey Hubble field;
#: 2.9..80 on the other eight). Beyond these limits the files' layout is named; between them nothing.
INTERLEAVED_RATIO = 1.5
PLANAR_RATIO = 0.75
#: Channel order: natural photos have a higher mean red than blue more often than not (ImageNet's means
#: 123.7 red, 103.5 blue; 7 of 9 scikit-image colour photos, the rocket against a blue sky the exception),
#: so a data set whose declared blue channel's mean exceeds its red one's by this many 0..255 levels is
#: a hint to check input_type_train, never more (a set of sky or sea photos is blue).
SWAP_MEAN_GAP = 10.0
MAX_LISTED = 5                # files/pairs named in one aggregated message


@dataclass(frozen=True)
class InputSeen:
    """What the pass saw of one model input: its data and YAML entry, its accumulated statistics, the
    usable sample count, the YAML and the model (the channel rules' argument)."""

    data: InputData
    spec: InputSpec
    acc: ChannelAcc
    samples: int
    config: HbConfig
    proto: onnx.ModelProto

    @property
    def name(self) -> str:
        return self.data.name


def config_notes(config: HbConfig) -> list[Finding]:
    """The YAML's own warnings that concern the data: an inferred cal_data_type (info), preprocess_on
    (warning)."""
    out = []
    for w in config.warnings:
        if "cal_data_type" in w:
            out.append(Finding(INFO, "cal_data_type_inferred", None, None, w))
        elif "preprocess_on" in w:
            out.append(Finding(WARNING, "preprocess_on", None, None, w))
    return out


def count_mismatch(inputs: list[InputData], files: list[list[Path]]) -> list[Finding]:
    """Inputs whose folders hold different numbers of samples: hb_mapper pairs them by sorted name."""
    counts = [len(f) for f in files]
    if not (len(inputs) > 1 and len(set(counts)) > 1 and min(counts) > 0):
        return []
    fewest = min(counts)
    extra = [p for f in files for p in f[fewest:]]
    detail = ", ".join(f"{d.name!r}: {n}" for d, n in zip(inputs, counts))
    return [Finding(ERROR, "count_mismatch", None, None,
                    f"the input folders hold different numbers of samples ({detail}); hb_mapper pairs "
                    f"them by sorted name, so files without a partner ({_names(extra)}) break the "
                    "pairing: give every input one file per sample")]


def few_samples(usable: int) -> list[Finding]:
    """Fewer usable samples than hb_mapper's docs recommend: a warning below FEW_SAMPLES_WARNING, an
    info below RECOMMENDED_SAMPLES (none when there are none: the folder findings say why)."""
    if not usable or usable >= RECOMMENDED_SAMPLES:
        return []
    severity = WARNING if usable < FEW_SAMPLES_WARNING else INFO
    return [Finding(severity, "few_samples", None, None,
                    f"only {usable} usable calibration samples; hb_mapper's docs recommend ~"
                    f"{RECOMMENDED_SAMPLES} representative ones: thresholds come from few scenes "
                    f"(a condition in 5% of real inputs is missing from {usable} samples with "
                    f"probability {0.95 ** usable:.0%}); add varied samples")]


def constant_channels(seen: InputSeen) -> list[Finding]:
    """A channel with one value in every sample: calibration learns nothing about its range (a 0/1
    mask never seen in its other state is clipped at runtime)."""
    out: list[Finding] = []
    name, acc, samples = seen.name, seen.acc, seen.samples
    for c in range(len(acc.sum)):
        if acc.min[c] != acc.max[c]:
            continue
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
    return out


def unnormalized_image(seen: InputSeen) -> list[Finding]:
    """An image input (rgb, bgr, yuv444, gray) of integer 0..255 pixels with norm_type no_preprocess:
    the model sees unnormalized values."""
    acc, spec, name = seen.acc, seen.spec, seen.name
    raw_lo, raw_hi = float(acc.raw_min.min()), float(acc.raw_max.max())
    if not (spec.type_train in IMAGE_TYPES and spec.norm_type == "no_preprocess" and raw_hi > PIXEL_MIN_MAX
            and bool(acc.raw_int.all()) and raw_lo >= 0):
        return []
    return [Finding(WARNING, "unnormalized_image", name, None,
                    f"input {name!r} ({spec.type_train}) holds integer pixels {raw_lo:g}..{raw_hi:g} and "
                    "norm_type is no_preprocess, so the model sees unnormalized 0..255 values: if it was "
                    "trained on normalized input, keep the files 0..255 and set norm_type: "
                    "data_mean_and_scale with mean_value/scale_value (ImageNet: 123.675 116.28 103.53 / "
                    "0.01712475 0.017507 0.01742919; /255 only: data_scale, 0.003921568627451)")]


def unnormalized_featuremap(seen: InputSeen) -> list[Finding]:
    """A featuremap input holding integers like 0..255 pixels: a featuremap gets no normalization."""
    acc, spec, name = seen.acc, seen.spec, seen.name
    raw_lo, raw_hi = float(acc.raw_min.min()), float(acc.raw_max.max())
    if not (spec.type_train == "featuremap" and spec.norm_type == "no_preprocess" and bool(acc.raw_int.all())
            and raw_lo >= 0 and FEATUREMAP_PIXEL_MIN < raw_hi <= 255):
        return []
    return [Finding(WARNING, "unnormalized_image", name, None,
                    f"input {name!r} (featuremap) holds integers {raw_lo:g}..{raw_hi:g}, like 0..255 pixels, "
                    "and a featuremap input gets no normalization (norm_type no_preprocess), so the model "
                    "sees them as they are: if it was trained on normalized images, write the files "
                    "normalized as in training, as float32 ('tuner make-cal-data --preprocess')")]


def double_normalization(seen: InputSeen) -> list[Finding]:
    """Files that look already normalized (small, not integers) while the YAML normalizes again; for an
    image ``input_type_rt`` whatever the norm type: hb_mapper's loader reads the files as 0..255 pixels
    of ``input_type_train`` and turns them into the board's input (docs/hb_rules/input.md §2), so
    normalized values become a nearly black picture."""
    acc, spec, name = seen.acc, seen.spec, seen.name
    raw_lo, raw_hi = float(acc.raw_min.min()), float(acc.raw_max.max())
    camera = spec.type_rt in CAMERA_TYPES
    if not ((spec.norm_type != "no_preprocess" or camera) and max(abs(raw_lo), abs(raw_hi)) <= NORMALIZED_LIMIT
            and not bool(acc.raw_int.all())):
        return []
    seen_lo, seen_hi = float(acc.min.min()), float(acc.max.max())
    if camera:
        return [Finding(WARNING, "double_normalization", name, None,
                        f"input {name!r}: the files look already normalized (raw {raw_lo:.3g}..{raw_hi:.3g}, not "
                        f"integers), but input_type_rt is {spec.type_rt}: hb_mapper reads the files as 0..255 "
                        f"{spec.type_train} pixels and converts them to the board's {spec.type_rt} input, and the "
                        f"mean/scale are the YAML's (norm_type {spec.norm_type}; the network sees "
                        f"{seen_lo:.3g}..{seen_hi:.3g}): write the pixels before mean/scale ('tuner make-cal-data')")]
    return [Finding(WARNING, "double_normalization", name, None,
                    f"input {name!r}: the files look already normalized (raw {raw_lo:.3g}..{raw_hi:.3g}, not "
                    f"integers) and the YAML normalizes again (HzPreprocess, norm_type {spec.norm_type}; the "
                    f"model sees {seen_lo:.3g}..{seen_hi:.3g}): write raw 0..255 pixels or set "
                    "norm_type: no_preprocess")]


def layout_mismatch(seen: InputSeen) -> list[Finding]:
    """Files in the other layout than ``input_layout_train`` (same size, so the size check passes): a
    photo's values 1 apart in file order are neighbouring pixels when planar (NCHW), a pixel's other
    channels when interleaved (NHWC); the ratio of their mean differences (INTERLEAVED_RATIO,
    PLANAR_RATIO) names the layout the files are in."""
    acc, spec, name = seen.acc, seen.spec, seen.name
    if not acc.steps or acc.step_c <= 0 or len(spec.shape or ()) != 4:
        return []
    ratio = acc.step_one / acc.step_c
    found = "NHWC" if ratio > INTERLEAVED_RATIO else "NCHW" if ratio < PLANAR_RATIO else None
    if found is None or found == spec.layout_train:
        return []
    c = len(acc.sum)
    how = "interleaved: each pixel's channels side by side" if found == "NHWC" else "planar: one channel after another"
    return [Finding(WARNING, "layout_mismatch", name, None,
                    f"input {name!r}: the files look {found} ({how}; values 1 apart differ {ratio:.2f}x as much as "
                    f"values {c} apart, over {acc.steps} files) but input_layout_train is {spec.layout_train}: "
                    f"hb_mapper reads them as {spec.layout_train}, so each 'channel' mixes pixels; write them "
                    f"{spec.layout_train} (numpy: x.transpose({'0, 3, 1, 2' if found == 'NHWC' else '0, 2, 3, 1'})) "
                    "or set input_layout_train")]


def channel_order(seen: InputSeen) -> list[Finding]:
    """A hint that the files may hold the other colour order than ``input_type_train`` (rgb/bgr): the
    declared blue channel's mean over the set exceeds the red one's by SWAP_MEAN_GAP levels, as is rare in
    natural photos (not impossible: an info, not a warning). Integer 0..255 files only."""
    acc, spec, name = seen.acc, seen.spec, seen.name
    if spec.type_train not in ("rgb", "bgr") or len(acc.sum) != 3 or not acc.n or not bool(acc.raw_int.all()) \
            or float(acc.raw_max.max()) > 255 or float(acc.raw_min.min()) < 0:
        return []
    means = [float(m) for m in acc.raw_sum / acc.n]
    r, b = (means[0], means[2]) if spec.type_train == "rgb" else (means[2], means[0])
    if b - r <= SWAP_MEAN_GAP:
        return []
    other = "bgr" if spec.type_train == "rgb" else "rgb"
    return [Finding(INFO, "channel_order", name, None,
                    f"input {name!r}: read as {spec.type_train}, the mean blue ({b:.1f}) exceeds the mean red "
                    f"({r:.1f}) by {b - r:.1f}; natural photos have more red than blue on average (ImageNet "
                    f"123.7 / 103.5), so the files may be {other} (OpenCV's imread gives BGR): if so, write "
                    f"{spec.type_train} or set input_type_train: '{other}' (a set of sky or sea photos can "
                    "be this blue: then ignore this)")]


def range_ratio(seen: InputSeen) -> list[Finding]:
    """Channels of one input whose max|x| differs by >= RANGE_RATIO (one int8 scale leaves the small
    ones a few levels): :func:`_range_findings`."""
    return _range_findings(seen.name, seen.acc, seen.config, seen.proto)


#: The per-input checks, in the order their findings are listed.
CHANNEL_RULES: tuple[Callable[[InputSeen], list[Finding]], ...] = (
    constant_channels, unnormalized_image, unnormalized_featuremap, double_normalization, layout_mismatch,
    channel_order, range_ratio)


def channel_findings(seen: InputSeen) -> list[Finding]:
    """The findings of every channel rule on one input."""
    return [f for rule in CHANNEL_RULES for f in rule(seen)]


def _first_nodes(proto, name: str) -> list[str]:
    return [n.name for n in proto.graph.node if name in n.input][:3]


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


def _range_findings(name: str, acc: ChannelAcc, config: HbConfig, proto) -> list[Finding]:
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


def duplicates(signatures: list[tuple[np.ndarray, np.ndarray]], digests: list[str], files: list[Path],
                        accs: list[ChannelAcc], channels: list[int], sizes: list[tuple[int, int]]) -> list[Finding]:
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


def _names(paths: list[Path]) -> str:
    shown = ", ".join(p.name for p in paths[:MAX_LISTED])
    return shown + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")
