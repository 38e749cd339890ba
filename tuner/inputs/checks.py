"""Sanity checks of the calibration data an hb_mapper YAML points at (``tuner check-data``).

Most accuracy collapses after hb_mapper conversion come from the calibration data, not
from the config: files in the wrong format, double normalisation, unnormalised pixels,
a channel in metres next to channels in 0..1, constant channels, duplicates, too few
samples. :func:`check_data` reads every file once (streaming, one sample at a time:
:mod:`tuner.inputs.datascan`), accumulates per-input, per-channel statistics of the data *as the model sees it* (after
the YAML's mean/scale, which hb_mapper fuses into the model as HzPreprocess) and of the
raw files, and turns what it finds into :class:`Finding` s (each check a function of
:mod:`tuner.inputs.datarules`).

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

from pathlib import Path

from tuner.inputs.config import HbConfig, InputSpec, load_config
from tuner.inputs.data import InputData, input_data
from tuner.inputs.datarules import (  # noqa: F401  (constants re-exported: their old home)
    FEW_SAMPLES_WARNING,
    RECOMMENDED_SAMPLES,
    InputSeen,
    channel_findings,
    config_notes,
    count_mismatch,
    duplicates,
    few_samples,
)
from tuner.inputs.datascan import list_folder, scan_samples
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


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _resolve_inputs(config: HbConfig, input_shapes: dict[str, tuple[int, ...]],
                    data_dirs: list[Path] | None) -> list[tuple[InputData, InputSpec]]:
    """The InputData of every model input, as dataset_from_config builds them (no file access)."""
    return list(zip(input_data(config.inputs, input_shapes, data_dirs), config.inputs))


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
    inputs = [d for d, _ in resolved]
    findings = config_notes(config)
    files: list[list[Path]] = []
    for data in inputs:
        listed, problems = list_folder(data)
        files.append(listed)
        findings.extend(problems)
    findings.extend(count_mismatch(inputs, files))
    counts = [len(f) for f in files]
    paired = min(counts) if counts else 0
    if limit is not None:
        paired = min(paired, limit)

    scan = scan_samples(inputs, files, paired, limit)
    findings.extend(scan.findings)
    samples = len(scan.signatures)
    stats = [s for data, acc in zip(inputs, scan.accs) for s in acc.stats(data.name)]
    for (data, spec), acc in zip(resolved, scan.accs):
        if acc.n:
            findings.extend(channel_findings(InputSeen(data, spec, acc, samples, config, model.proto)))
    findings.extend(duplicates(scan.signatures, scan.digests, scan.files, scan.accs, [d.channels for d in inputs],
                               scan.sizes))
    findings.extend(few_samples(samples + max(0, min(counts, default=0) - paired)))  # files beyond --limit count
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return DataReport(config=Path(config_path), samples=samples, inputs=[d.name for d in inputs],
                      stats=stats, findings=findings)


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
