"""tuner verify end to end: a real study, real subprocesses (the stand-in hb_mapper, shell commands)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli import tuner as cli
from helpers import write_tiny_space

from tuner.study.loop import run
from tuner.study.results import rows
from tuner.study.session import StudySession
from tuner.study.storage import open_existing
from tuner.toolchain.compare import Comparison
from tuner.toolchain.logterms import TERMS
from tuner.toolchain.records import comparison_for_trial, real_record, real_records
from tuner.toolchain.verify import StudyContext, verify_study

FAKE = Path(__file__).with_name("fake_hb_mapper.py")


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    space = write_tiny_space(root)
    search = StudySession.open(space, results_dir=root / "results", quiet=True)
    run(search, n_trials=8, timeout=None, jobs=1, seed=3, progress=False)
    return root, space


def test_verify_runs_the_tool_imports_its_log_and_shows_the_gap(study_dir):
    root, _ = study_dir
    cmd = f"{sys.executable} {FAKE} makertbin --config {{yaml}} --model-type onnx"
    # no int16 refusal here (test_import_log has it): a refused int16 Sigmoid makes the stand-in another
    # model (its int8 input flips the CPU Greater's mask, 0.99 on the Where nodes where tuner has 1.0),
    # whose per-node order is not the simulator's, whichever trials the study ranks first
    r = cli("verify", "tiny", "--top", "2", "--command", cmd, "--timeout", "120", cwd=root,
            env={"FAKE_HB_REFUSE": "none"})
    assert r.returncode == 0, r.stdout + r.stderr
    study, paths = open_existing("tiny", None, root / "results")
    recs = real_records(study)
    assert len(recs) == 2
    for number, rec in recs.items():
        assert rec.status == "ok", rec
        folder = paths.root / "verify" / f"trial_{number:05d}"
        assert (folder / "hb_mapper_makertbin.log").is_file() and (folder / "model_output" / "fake.bin").is_file()
        # the stand-in's error is 3x the simulator's: on the same terms (its log's: the first calibration
        # sample) the real output cosine is lower (the trial's own figure is pooled over the evaluation data,
        # where the first sample may be easier or harder than the mean)
        assert rec.accuracy_source == "log:mean_cosine"
        comp = comparison_for_trial(study, number)
        assert isinstance(comp, Comparison) and comp.output_cosine_gap < 0 and comp.n_paired >= 12
        assert rec.accuracy == pytest.approx(comp.real_output_cosine, abs=1e-6)
        assert comp.spearman > 0.8
        # compared on the log's terms: the stand-in's tables are its simulation on the first calibration
        # sample with hb's formulas, its error 3x tuner's, so where their graphs agree (no Sigmoid upstream)
        # real = 1 - 3 (1 - sim) to the log's 6 decimals; the pooled figure is kept beside it
        assert comp.terms == TERMS and "compared on: " + TERMS in comp.text()
        nodes = {n.node: n for n in comp.nodes}
        for name in ("/stem/Conv", "/stem/Relu", "/res/Conv"):
            n = nodes[name]
            assert n.real_cosine == pytest.approx(1 - 3 * (1 - n.sim_cosine), abs=4e-6), name
        assert comp.pooled_data == "evaluation data" and comp.pooled_samples == 8
        assert all(o.sim_cosine_pooled is not None for o in comp.outputs)
        assert "gap" in comp.text() and comp.as_dict()["summary"]["output_cosine_gap"] == comp.output_cosine_gap
        # the real value went back into the study as a trial with the same parameters
        fed = study.trials[rec.feedback_trial]
        original = study.trials[number]
        assert fed.user_attrs["verified_from"] == number and fed.params == original.params
        assert fed.values[0] == pytest.approx(rec.accuracy) and fed.values[1] == pytest.approx(original.values[1])
    assert "real - sim" in r.stdout and "added to the study as trial(s)" in r.stdout
    # trials.csv now carries the real figures beside the simulated ones, on the verified trials only
    import csv

    table = {int(row["trial"]): row for row in csv.DictReader(paths.trials_csv.open())}
    for number, rec in recs.items():
        assert table[number]["real_status"] == "ok"
        assert float(table[number]["real_accuracy"]) == pytest.approx(rec.accuracy, abs=1e-6)
    assert all(row["real_status"] == "" for n, row in table.items() if n not in recs)
    assert "real beside simulated: " in r.stdout
    # status shows real next to simulated; export can pick by the real figure
    s = cli("status", "tiny", cwd=root)
    assert s.returncode == 0 and "Verified with the real toolchain (2 of 2 ok" in s.stdout
    e = cli("export", "tiny", "--by", "real", "--out", root / "real.yaml", cwd=root)
    assert e.returncode == 0, e.stderr
    lat = {r.number: r.latency_ms for r in rows(study)}
    best = max(recs, key=lambda n: (recs[n].accuracy, -lat[n], -n))    # a tie on the real figure: the cheaper
    assert f"trial {best}:" in e.stdout and (root / "real.yaml").is_file()
    # a trial without a log has no comparison
    others = [t.number for t in study.trials if t.number not in recs]
    assert comparison_for_trial(study, others[0]) is None


def test_failures_are_recorded_per_trial_and_never_stop_the_others(study_dir):
    root, space = study_dir
    study, paths = open_existing("tiny", None, root / "results")
    simulated = [r for r in rows(study) if "duplicate_of" not in r.record]
    a, b, c, d = [r.number for r in simulated[:4]]
    cmd = (f": {{yaml}}; case {{trial}} in {a}) sleep 30;; {b}) echo 'conversion broke' >&2; exit 3;; "
           f"{c}) echo 'hello, no figures here';; *) echo '{{\"accuracy\": 0.5, \"latency_ms\": 9.5}}';; esac")
    ctx = StudyContext(study, paths)
    n_before = len(study.trials)
    t0 = time.perf_counter()
    done = verify_study(ctx, cmd, numbers=[a, b, c, d], timeout=1.0)
    assert time.perf_counter() - t0 < 20          # the sleeping command was killed at its timeout
    status = {row.number: rec for row, rec in done}
    assert status[a].status == "timeout" and "killed" in status[a].error
    assert status[b].status == "failed" and "exit code 3" in status[b].error and "conversion broke" in status[b].error
    assert status[c].status == "unusable" and "neither" in status[c].error
    assert status[d].status == "ok" and status[d].accuracy == 0.5 and status[d].accuracy_source == "json:accuracy"
    assert status[d].latency_ms == 9.5
    # all four are stored; only the usable one was fed back, with the real accuracy and latency
    study, _ = open_existing("tiny", None, root / "results")
    assert {n: real_record(study, n).status for n in (a, b, c, d)} == \
        {a: "timeout", b: "failed", c: "unusable", d: "ok"}
    assert len(study.trials) == n_before + 1
    fed = study.trials[-1]
    assert fed.values == [0.5, 9.5] and fed.user_attrs["verified_from"] == d
    # the study goes on with the fed-back trials in it (TPE reads them; they are not simulated rows)
    n = len(study.trials)
    search = StudySession.open(space, results_dir=root / "results", quiet=True)
    study2, _ = run(search, n_trials=n + 2, timeout=None, jobs=1, seed=3, progress=False)
    assert len([t for t in study2.trials if t.state.name == "COMPLETE"]) == n + 2
    assert all("verified_from" not in r.trial.user_attrs for r in rows(study2))


def test_verify_needs_yaml_in_the_command(study_dir):
    root, _ = study_dir
    r = cli("verify", "tiny", "--command", "echo hi", cwd=root)
    assert r.returncode == 2 and "{yaml}" in r.stderr


def test_import_log_attaches_a_hand_made_run_to_a_trial(study_dir):
    root, _ = study_dir
    study, _ = open_existing("tiny", None, root / "results")
    number = next(r.number for r in rows(study) if real_record(study, r.number) is None)
    run_dir = root / "by_hand"
    run_dir.mkdir()
    e = cli("export", "tiny", "--trial", number, "--out", run_dir / "cfg.yaml", cwd=root)
    assert e.returncode == 0, e.stderr
    conv = subprocess.run([sys.executable, str(FAKE), "makertbin", "--config", "cfg.yaml", "--model-type", "onnx"],
                          cwd=run_dir, capture_output=True, text=True, timeout=300)
    assert conv.returncode == 0, conv.stderr
    r = cli("import-log", run_dir / "hb_mapper_makertbin.log", "--study", "tiny", "--trial", number, cwd=root)
    assert r.returncode == 0, r.stderr
    assert f"stored on trial {number}" in r.stdout and "added trial" in r.stdout
    study, _ = open_existing("tiny", None, root / "results")
    rec = real_record(study, number)
    assert rec.status == "ok" and rec.accuracy < rec.sim_accuracy
    assert comparison_for_trial(study, number).output_cosine_gap < 0
    r = cli("import-log", run_dir / "hb_mapper_makertbin.log", "--study", "tiny", cwd=root)
    assert r.returncode == 2 and "--trial" in r.stderr


def test_the_report_shows_real_next_to_simulated(study_dir):
    """After verification, report.html has the gap per verified trial, the side-by-side node
    table and the real points on the Pareto plot."""
    import html
    import re

    root, _ = study_dir
    study, paths = open_existing("tiny", None, root / "results")
    recs = {n: r for n, r in real_records(study).items() if r.comparison}
    if not recs:   # this test also runs alone (-k): verify two trials first
        cmd = f"{sys.executable} {FAKE} makertbin --config {{yaml}} --model-type onnx"
        assert cli("verify", "tiny", "--top", "2", "--command", cmd, cwd=root).returncode == 0
        study, paths = open_existing("tiny", None, root / "results")
        recs = {n: r for n, r in real_records(study).items() if r.comparison}
    r = cli("report", "tiny", cwd=root)
    assert r.returncode == 0, r.stderr
    page = paths.report.read_text(encoding="utf-8")
    assert "Simulation vs the real toolchain" in page and "real toolchain (tuner verify)" in page
    for number in recs:
        comp = comparison_for_trial(study, number)
        assert f"trial {number}: per-node comparison" in page
        assert f"{comp.output_cosine_gap:+.6f}" in page and comp.output_cosine_gap < 0
        assert html.escape(comp.node_table().splitlines()[0]) in page
    assert len(re.findall(r'class="plotly-graph-div"', page)) == 5
