"""Board numbers: ``hrt_model_exec perf`` output read back, and the board's relation to hbdk's estimate.

``hrt_model_exec perf --model_file X.bin --thread_num 1`` on the board prints the per-frame latency
of one thread (``Average    latency    is: 7.01 ms``) after the run conditions, and before them the
runtime's versions (``[DNN] Runtime version = 1.24.5_(3.15.55 HBRT)``, ``[BPU_PLAT]BPU Platform
Version(1.3.6)! soc info(x5)``). The D-Robotics model zoo's READMEs and notebooks show the format.

board_ms = per_estimate x hbdk's estimate + per_output_mb x MB of float32 model outputs + fixed_ms.
Over the zoo's 14 RDK X5 reference models of one build (ultralytics YOLO, July 2025: hb_mapper
1.24.3 logs, runtime 1.24.5) this gives 1.02, 0.56 ms/MB and 0.24 ms (2.6 % mean error); numbers of
the same models move ~20 % between the zoo's campaigns, so a fit is kept per board and firmware
(:class:`Campaign`) and never pooled across them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.cost.latency import BoardFit
from tuner.errors import TunerError

_AVG = re.compile(r"Average\s+latency\s+is:\s*([\d.]+)\s*ms")
_THREADS = re.compile(r"Thread\s+number\s+is:\s*(\d+)")
_FRAMES = re.compile(r"Frame\s+count\s+is:\s*(\d+)")
_FPS = re.compile(r"Frame\s+rate\s+is:\s*([\d.]+)\s*FPS")
_RUNTIME = re.compile(r"Runtime version\s*=\s*([\d.]+\d)")
_DNN = re.compile(r"\[DNN\]:\s*([\d.]+\d)")
_PLAT = re.compile(r"BPU Platform Version\(([^)]+)\)")
_SOC = re.compile(r"soc info\(([^)]+)\)")
_BUILDER = re.compile(r"model builder version\s*=\s*([\d.]+\d)")
_MODEL_FILE = re.compile(r"--model_file[= ](\S+)")


@dataclass(frozen=True)
class PerfRun:
    """One ``hrt_model_exec perf`` run as its output tells it."""

    average_ms: float
    threads: int
    frames: int | None = None
    fps: float | None = None
    runtime: str = ""            # [DNN] Runtime version (or the [DNN]: line of newer runtimes)
    bpu_platform: str = ""
    soc: str = ""
    model_builder: str = ""      # the toolchain that built the .bin
    model_file: str = ""

    @property
    def firmware(self) -> str:
        """What makes a campaign: the board's runtime and BPU platform (and SoC, when printed)."""
        parts = [p for p in (self.soc, f"runtime {self.runtime}" if self.runtime else "",
                             f"bpu {self.bpu_platform}" if self.bpu_platform else "") if p]
        return ", ".join(parts) or "unknown firmware"


def parse_perf(text: str) -> list[PerfRun]:
    """Every run in ``text`` (a console log may hold several): one per ``Average latency`` line, with the
    versions printed before it. Raises TunerError when there is none."""
    runs = []
    head: dict[str, Any] = {"runtime": "", "bpu_platform": "", "soc": "", "model_builder": "", "model_file": ""}
    pending: dict[str, Any] = {}
    for line in text.splitlines():
        for key, rx in (("runtime", _RUNTIME), ("runtime", _DNN), ("bpu_platform", _PLAT), ("soc", _SOC),
                        ("model_builder", _BUILDER), ("model_file", _MODEL_FILE)):
            m = rx.search(line)
            if m:
                head[key] = m.group(1).rstrip("!.,")
        for key, rx, conv in (("threads", _THREADS, int), ("frames", _FRAMES, int), ("fps", _FPS, float)):
            m = rx.search(line)
            if m:
                pending[key] = conv(m.group(1))
        m = _AVG.search(line)
        if m:
            pending["average_ms"] = float(m.group(1))
            if "threads" not in pending:
                raise TunerError("hrt_model_exec perf output: 'Average latency' without 'Thread number is:' before it")
        if "average_ms" in pending and "fps" in pending:
            runs.append(PerfRun(**pending, **head))
            pending = {}
    if "average_ms" in pending:
        runs.append(PerfRun(**pending, **head))
    if not runs:
        raise TunerError("no 'Average    latency    is: ... ms' line: is this the output of `hrt_model_exec perf`?")
    return runs


@dataclass(frozen=True)
class BoardPoint:
    """One measured model: hbdk's estimate of its .bin, its float32 output size, the board's latency."""

    name: str
    hbdk_ms: float
    output_mb: float
    board_ms: float
    estimate_source: str = "hbdk"     # hbdk (the real compiler) or modeled (tuner's model of it)
    source: str = ""


@dataclass
class Campaign:
    """The points of one board and firmware, and their fit (never pooled with another campaign's)."""

    board: str
    firmware: str
    points: list[BoardPoint] = field(default_factory=list)

    def fit(self, default: BoardFit) -> tuple[BoardFit, float]:
        """(the fit, its mean relative error). Three or more points with different estimates fit all three
        terms; fewer rescale ``default``'s estimate term only (its output and fixed terms kept)."""
        pts = self.points
        label = f"{self.board} ({self.firmware}), {len(pts)} model(s)"
        if not pts:
            return default, float("nan")
        y = np.array([p.board_ms for p in pts])
        if len(pts) >= 3 and len({round(p.hbdk_ms, 3) for p in pts}) >= 3:
            a = np.array([[p.hbdk_ms, p.output_mb, 1.0] for p in pts])
            w = 1.0 / y
            coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
            if np.all(coef >= 0):
                fit = BoardFit(per_estimate=float(coef[0]), per_output_mb=float(coef[1]), fixed_ms=float(coef[2]),
                               label=label)
                return fit, _error(fit, pts)
        rest = np.array([default.per_output_mb * p.output_mb + default.fixed_ms for p in pts])
        est = np.array([p.hbdk_ms for p in pts])
        k = float(np.sum((y - rest) * est / y ** 2) / np.sum(est ** 2 / y ** 2))
        fit = BoardFit(per_estimate=max(k, 0.0), per_output_mb=default.per_output_mb, fixed_ms=default.fixed_ms,
                       label=label)
        return fit, _error(fit, pts)

    def to_json(self) -> dict[str, Any]:
        return {"board": self.board, "firmware": self.firmware, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Campaign:
        return cls(board=str(d["board"]), firmware=str(d["firmware"]),
                   points=[BoardPoint(**p) for p in d.get("points", [])])


def predict(fit: BoardFit, hbdk_ms: float, output_mb: float) -> float:
    return fit.per_estimate * hbdk_ms + fit.per_output_mb * output_mb + fit.fixed_ms


def _error(fit: BoardFit, pts: Sequence[BoardPoint]) -> float:
    return float(np.mean([abs(predict(fit, p.hbdk_ms, p.output_mb) / p.board_ms - 1) for p in pts]))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "board"


def campaign_path(folder: Path, board: str, firmware: str) -> Path:
    return folder / f"{_slug(board)}__{_slug(firmware)}.json"


def load_campaign(path: Path) -> Campaign | None:
    try:
        return Campaign.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def campaigns(folder: Path, board: str | None = None) -> list[tuple[Path, Campaign]]:
    out = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        c = load_campaign(p)
        if c is not None and (board is None or c.board == board):
            out.append((p, c))
    return out


def boards_dir() -> Path:
    """Where ``tuner latency board`` keeps its campaigns: ``boards`` in tuner's cache folder."""
    from tuner.files import cache_dir

    return cache_dir() / "boards"


def board_fit(name: str, default: BoardFit) -> tuple[BoardFit, float] | None:
    """The newest campaign of board ``name``, fitted (None: no campaign of that name)."""
    found = campaigns(boards_dir(), name)
    if not found:
        return None
    path, camp = max(found, key=lambda pc: pc[0].stat().st_mtime)
    return camp.fit(default)


def check_board(name: str) -> None:
    """One line when there is no campaign of board ``name`` (before any expensive work)."""
    if not campaigns(boards_dir(), name):
        raise TunerError(f"no board campaign named {name!r} in {boards_dir()}: tuner latency board PERF.txt "
                         f"--config YAML --board {name}")


def require_board_fit(name: str, target_raw: dict[str, Any]) -> BoardFit:
    """Board ``name``'s fit, or one line saying how to make it."""
    check_board(name)
    default = BoardFit.from_dict((target_raw.get("cost") or {}).get("board") or {})
    found = board_fit(name, default)
    assert found is not None
    return found[0]
