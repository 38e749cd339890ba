"""report.html: written by the search and by ``tuner report``, self-contained, and drawn by a
real browser (headless Chromium) without script errors."""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest
from cli import tuner as cli
from helpers import write_tiny_space

from tuner.study.loop import run
from tuner.study.results import best, rows
from tuner.study.session import StudySession

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    space = write_tiny_space(root)
    search = StudySession.open(space, results_dir=root / "results", quiet=True)
    study, _ = run(search, n_trials=12, timeout=None, jobs=1, seed=3, progress=False)
    return root, search, study


def plot_ids(text: str) -> list[str]:
    return re.findall(r'<div id="([a-z]+)" class="plotly-graph-div"', text)


def test_search_writes_a_self_contained_report(finished):
    root, search, study = finished
    page = search.place.paths.report.read_text(encoding="utf-8")
    # offline: plotly is inline, nothing is fetched
    assert "Plotly" in page and not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    assert plot_ids(page) == ["pareto", "history", "importances", "sensitivity", "trace"]
    top = best(rows(study), "pareto", None)
    assert f"Chosen configuration (trial {top.number})" in page
    for name, d in (top.record["candidate"]["model_parameters"].get("node_info") or {}).items():
        assert f"<td>{html.escape(name)}</td><td>{d.get('ON', '')}</td>" in page
    assert html.escape(search.place.paths.best.read_text(encoding="utf-8")) in page
    assert "<h2>The simplest fix</h2>" in page and search.place.paths.best_minimal.is_file()   # written before the report
    for fp in search.problem.fingerprints.values():
        assert fp in page


def test_traces_follow_the_placement_the_trial_recorded(finished):
    _, search, study = finished
    rs = rows(study)
    exported, baseline = search.report_source.draw_traces(rs)[0]
    top = best(rs, "pareto", None)
    assert exported.trial == top.number
    # against the baseline a user starts from: the most accurate all-int8 one, not the first
    top_base = max((r for r in rs if r.plan and r.plan.startswith("baseline")), key=lambda r: r.accuracy)
    assert baseline.trial == top_base.number and baseline.label.startswith("best all-BPU int8 baseline")
    assert sorted(n["name"] for n in exported.nodes if n["on"] == "CPU") == sorted(top.record["cpu_nodes"])
    # all-int8: error enters somewhere, and a float CPU node fed float inputs is exact
    cos = [n["cosine"] for n in baseline.nodes if n["cosine"] is not None]
    assert min(cos) < 0.99999 and len(cos) > 5
    assert [n["name"] for n in exported.nodes] == [n.name for n in search.problem.ws.graph]


def test_tuner_report_redraws_and_survives_missing_model_files(finished, tmp_path):
    root, search, _ = finished
    report = search.place.paths.report
    report.unlink()
    r = cli("report", "tiny", "--results-dir", root / "results", cwd=root)
    assert r.returncode == 0, r.stderr
    assert report.is_file() and len(plot_ids(report.read_text(encoding="utf-8"))) == 5
    assert "<h2>The simplest fix</h2>" in report.read_text(encoding="utf-8")
    model = next((root / "tiny").glob("*.onnx"))
    moved = tmp_path / model.name
    shutil.move(model, moved)
    try:
        r = cli("report", "tiny", "--results-dir", root / "results", cwd=root)
    finally:
        shutil.move(moved, model)
    assert r.returncode == 0, r.stderr
    assert "per-node views left out" in r.stderr and "Traceback" not in r.stderr
    page = report.read_text(encoding="utf-8")
    assert "per-node views left out" in page and plot_ids(page) == ["pareto", "history", "importances"]


def test_report_of_unknown_study_exits_2(tmp_path):
    r = cli("report", "nope", "--results-dir", tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and "no study 'nope'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="Chromium is not installed (.ci/run installs Debian's chromium)")
def test_report_draws_in_headless_chromium(finished, tmp_path):
    """Open the file as a user would (file://, no network) and read back the page's own
    record of how many plots drew and which script errors occurred."""
    assert CHROMIUM, "CI must have chromium (.ci/run installs it)"
    _, search, study = finished
    search.report_file.write(study, force=True)
    page = search.place.paths.report.read_text(encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=15000", "--window-size=1400,1000"]
    r = subprocess.run([CHROMIUM, *flags, "--dump-dom", search.place.paths.report.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    status = re.search(r'<div id="tuner-status"([^>]*)>', r.stdout)
    assert status, r.stdout[:500]
    attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', status.group(1)))
    assert attrs.get("done") == "1"
    assert attrs.get("errors") == ""
    assert int(attrs["drawn"]) == len(plot_ids(page)) == 5
    console_errors = [line for line in r.stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    assert not console_errors
    shot = tmp_path / "report.png"
    r = subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", search.place.paths.report.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 20_000


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_reads_the_study_as_it_is(finished):
    """docs/search.md's 'optuna-dashboard results/<study>/study.journal': the real server, on
    loopback, lists the study and each trial's tuner record."""
    import json
    import time
    import urllib.request

    exe = shutil.which("optuna-dashboard", path=os.path.dirname(sys.executable)) or shutil.which("optuna-dashboard")
    assert exe, "optuna-dashboard is in the test extra"
    _, search, study = finished
    port = _free_port()
    proc = subprocess.Popen([exe, str(search.place.paths.journal), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as resp:
                    summaries = json.load(resp)["study_summaries"]
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"optuna-dashboard did not start: {proc.stdout.read()[-2000:]}") from None
                time.sleep(0.3)
        (summary,) = summaries
        assert summary["study_name"] == "tiny"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}?after=0",
                                    timeout=30) as resp:
            detail = json.load(resp)
        assert len(detail["trials"]) == len(study.trials)
        attrs = {a["key"]: a["value"] for a in detail["trials"][0]["user_attrs"]}
        record = json.loads(attrs["record"]) if isinstance(attrs["record"], str) else attrs["record"]
        assert record["accuracy"] == study.trials[0].user_attrs["record"]["accuracy"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("mode, extra", [("accuracy", ""), ("latency", "  min_accuracy: 0.99\n")])
def test_single_objective_studies_draw_every_plot(tmp_path, mode, extra):
    space = write_tiny_space(tmp_path)
    space.write_text(space.read_text().replace("  mode: pareto\n", f"  mode: {mode}\n{extra}"))
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=12, timeout=None, jobs=1, seed=3, progress=False)
    assert len(study.directions) == 1
    page = search.place.paths.report.read_text(encoding="utf-8")
    assert plot_ids(page) == ["pareto", "history", "importances", "sensitivity", "trace"]
    assert 'class="note"' not in page
