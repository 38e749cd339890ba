"""What the data checks report: findings (severity, code, message) and the reports made of them.

``tuner check-data`` (:mod:`tuner.inputs.checks`) and ``tuner check-preprocess``
(:mod:`tuner.inputs.check_preprocess`) both report findings; the exit code follows the worst one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)


@dataclass
class Finding:
    """One problem found in the data. ``message`` names the problem and the fix on one line."""

    severity: str            # "error" | "warning" | "info"
    code: str                # stable id, e.g. "constant_channel"
    input: str | None
    channel: int | None
    message: str


@dataclass
class ChannelStats:
    """Statistics of one channel of one input over all usable samples, as the model sees it.

    ``raw_min``/``raw_max`` are the file values before the YAML's mean/scale (equal to
    ``min``/``max`` when ``norm_type`` is ``no_preprocess``). ``nan``/``inf`` count the
    non-finite values in all scanned files; the other fields cover finite samples only
    (``None`` when no usable sample exists).
    """

    input: str
    channel: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    zero_share: float | None
    nan: int
    inf: int
    raw_min: float | None = None
    raw_max: float | None = None


class FindingsReport:
    """What reports made of findings share: counts and the CLI's exit code."""

    findings: list[Finding]

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for f in self.findings)

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def exit_code(self) -> int:
        """0: clean (info at most), 1: warnings, 2: unusable (any error)."""
        if self.count(ERROR):
            return 2
        return 1 if self.count(WARNING) else 0

    def finding_lines(self, none: str) -> list[str]:
        """One line per finding (severity, code, message), or ``none`` when there is none."""
        if not self.findings:
            return [none]
        code_w = max(len(f.code) for f in self.findings)
        return [f"{f.severity.upper():<7}  {f.code:<{code_w}}  {f.message}" for f in self.findings]


@dataclass
class DataReport(FindingsReport):
    config: Path
    samples: int                       # usable samples (every input's file readable and finite)
    inputs: list[str]
    stats: list[ChannelStats]
    findings: list[Finding] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"config": str(self.config), "samples": self.samples, "inputs": list(self.inputs),
                "exit_code": self.exit_code(),
                "stats": [asdict(s) for s in self.stats],
                "findings": [asdict(f) for f in self.findings]}
