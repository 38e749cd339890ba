"""What one in-process ``tuner search`` costs besides its trials: how often it reads its inputs,
re-reads the study and rewrites its result files (issue 24's "Done when" bounds).

The real functions are wrapped to count their calls; nothing is mocked."""

from __future__ import annotations

import builtins
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import optuna
import pytest
from helpers import tiny_sample, write_tiny_space

from tuner.cli import main
from tuner.study import loop, results, validation
from tuner.study.record import TrialRecord


def eval_space(root: Path) -> Path:
    """The tiny space scored on 3 samples of its own, the 8 calibration samples left for validation."""
    space = write_tiny_space(root)
    (root / "tiny" / "eval").mkdir()
    for i in range(3):
        (tiny_sample(100 + i) * np.float32(1.0 + 0.5 * i)).tofile(root / "tiny" / "eval" / f"{i:04d}.bin")
    space.write_text("eval_data: tiny/eval\n" + space.read_text())
    return space


class Counts:
    """Calls of the wrapped functions, by name; ``setup`` is the counts when the first trial starts."""

    def __init__(self, space: Path, base: Path, model: Path) -> None:
        self.files = {space.resolve(): "space", base.resolve(): "base", model.resolve(): "model"}
        self.n: Counter[str] = Counter()
        self.setup: Counter[str] | None = None
        self.callers: set[str] = set()        # where choose_best is called from
        self.writes: list[tuple[str, bool]] = []   # (file name, content changed)
        self.fronts = 0                       # times the written front (pareto/ file set) changed

    def read(self, path: object, how: str) -> None:
        try:
            what = self.files.get(Path(os.fspath(path)).resolve())  # type: ignore[arg-type]
        except TypeError:
            return
        if what is not None:
            self.n[f"{what} {how}"] += 1


@pytest.fixture
def counted(tmp_path, monkeypatch):
    space = eval_space(tmp_path)
    base = tmp_path / "tiny" / "hb_config.yaml"
    c = Counts(space, base, tmp_path / "tiny" / "tiny.onnx")

    read_text = Path.read_text

    def counting_read_text(self: Path, *a: object, **k: object) -> str:
        c.read(self, "read")
        return read_text(self, *a, **k)  # type: ignore[arg-type]

    real_open = builtins.open

    def counting_open(file: object, mode: str = "r", *a: object, **k: object) -> object:
        if isinstance(file, (str, Path)) and "b" in mode and "r" in mode:
            c.read(file, "bytes")
        return real_open(file, mode, *a, **k)  # type: ignore[call-overload]

    onnx_load = onnx.load

    def counting_onnx_load(f: object, *a: object, **k: object) -> onnx.ModelProto:
        c.read(f, "parse")
        return onnx_load(f, *a, **k)  # type: ignore[arg-type]

    rows = results.rows

    def counting_rows(*a: object, **k: object) -> list[results.Row]:
        c.n["rows"] += 1
        return rows(*a, **k)  # type: ignore[arg-type]

    from_json = TrialRecord.from_json.__func__  # type: ignore[attr-defined]

    def counting_from_json(cls: type, d: object) -> TrialRecord:
        c.n["decode"] += 1
        return from_json(cls, d)  # type: ignore[no-any-return]

    choose = validation.choose_best

    def counting_choose(*a: object, **k: object) -> object:
        c.n["choose_best"] += 1
        f = sys._getframe(1)
        c.callers.add(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}")
        return choose(*a, **k)  # type: ignore[arg-type]

    replace = os.replace

    def counting_replace(src: object, dst: object, *a: object, **k: object) -> None:
        d = Path(os.fspath(dst))  # type: ignore[arg-type]
        if d.suffix == ".yaml":
            old = read_text(d) if d.exists() else None
            c.writes.append((d.name if d.parent.name != "pareto" else f"pareto/{d.name}",
                             old != read_text(Path(os.fspath(src)))))  # type: ignore[arg-type]
        replace(src, dst, *a, **k)  # type: ignore[arg-type]

    optimize = optuna.Study.optimize

    def counting_optimize(self: optuna.Study, *a: object, **k: object) -> None:
        if c.setup is None:
            c.setup = Counter(c.n)
        optimize(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting_read_text)
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(onnx, "load", counting_onnx_load)
    monkeypatch.setattr(results, "rows", counting_rows)
    monkeypatch.setattr(TrialRecord, "from_json", classmethod(counting_from_json))
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tuner.") and getattr(mod, "choose_best", None) is choose:
            monkeypatch.setattr(mod, "choose_best", counting_choose)
    monkeypatch.setattr(os, "replace", counting_replace)
    monkeypatch.setattr(optuna.Study, "optimize", counting_optimize)
    monkeypatch.chdir(tmp_path)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    yield space, c
    signal.signal(signal.SIGINT, handlers[0])
    signal.signal(signal.SIGTERM, handlers[1])
    loop.STOP.clear()


def test_a_16_trial_search_reads_its_inputs_once_and_rewrites_only_what_changed(counted, capsys):
    space, c = counted
    assert main(["search", str(space), "--n-trials", "16", "--seed", "3"]) == 0
    assert c.setup is not None
    fronts = len({name for name, _ in c.writes if name.startswith("pareto/")})
    summary = {"set-up": dict(sorted(c.setup.items())), "total": dict(sorted(c.n.items())),
               "choose_best callers": sorted(c.callers),
               "yaml writes": len(c.writes), "unchanged yaml writes": sum(not ch for _, ch in c.writes),
               "pareto files written": fronts}
    with capsys.disabled():
        print("\nsearch counts:", summary)
    # set-up reads each input once: the space file, the base YAML (parsed once, hashed once) and the model
    assert c.setup["space read"] == 1 and c.setup["base read"] == 1 and c.setup["model parse"] == 1
    assert c.setup["base bytes"] <= 1
    # and nothing reads them again: the exports merge into the base YAML as parsed at set-up
    assert c.n["space read"] == 1 and c.n["base read"] == 1 and c.n["model parse"] == 1
    # the study is never read whole: the tracker (the loop's callback) keeps its rows, and the result
    # files, the report and the final summary read the outcome it keeps
    assert c.n["rows"] == 0
    # each trial's record is decoded at most twice (the tracker's row, the result files' front test)
    assert c.n["decode"] <= 2 * 16
    # best.yaml's trial is chosen in one place, once per change of the front (and at the end)
    assert c.callers == {"outcome.py:outcome"}
    assert c.n["choose_best"] <= fronts + 2
    # a result YAML is written only when its content changes
    assert all(changed for _, changed in c.writes)
