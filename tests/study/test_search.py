"""The search as users run it: real Optuna, real journal files, real subprocesses."""

import json
import os
import signal
import subprocess
import time

import optuna
import pytest
import yaml
from cli import start_tuner
from cli import tuner as cli
from helpers import write_example_project, write_reciprocal_project, write_tiny_space
from optuna.trial import TrialState

from tuner.inputs.config import load_config
from tuner.study.loop import run
from tuner.study.results import best, rows
from tuner.study.session import StudySession
from tuner.study.storage import make_storage


def load(results_dir, name):
    from tuner.study.storage import StudyPaths

    return optuna.load_study(study_name=name, storage=make_storage(None, StudyPaths(results_dir / name)))


def poll_trials(results_dir, name):
    """Trials of a study another process is writing; [] until that process has created it."""
    try:
        return load(results_dir, name).get_trials(deepcopy=False)
    except KeyError:  # the journal file exists a moment before the study record in it
        return []


def test_search_beats_the_all_int8_baseline_and_writes_results(tmp_path):
    space = write_tiny_space(tmp_path)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, info = run(search, n_trials=12, timeout=None, jobs=1, seed=3, progress=False)
    rs = rows(study)
    assert len(rs) == 12 and info["enqueued"] >= 4
    baseline = next(r for r in rs if r.plan == "baseline: all-BPU int8, max")
    top = best(rs, "pareto", None)
    assert top.accuracy > baseline.accuracy
    paths = search.place.paths
    assert paths.best.is_file() and list(paths.pareto.glob("trial_*.yaml")) and paths.trials_csv.is_file()
    assert f"trial {top.number}" in paths.best.read_text().splitlines()[0]
    # every trial records what it needs to be exported and compared
    rec = rs[0].record
    assert {"accuracy", "latency", "counts", "candidate", "outputs", "key"} <= set(rec)


def test_manual_warm_start_plans_use_the_most_accurate_baseline_calibration(tmp_path):
    """The base YAML says max per-tensor (all int8: cosine ~0.998 on the tiny model), per-channel
    gives ~0.9995: int16 on a few nodes under the base's calibration cannot catch up, so the
    manual plans take the best baseline's calibration, as a user (and Horizon's recipe) would."""
    search = StudySession.open(write_tiny_space(tmp_path), results_dir=tmp_path / "results", quiet=True)
    n_plans = len(search.problem.warm_start_plans())
    study, info = run(search, n_trials=n_plans, timeout=None, jobs=1, seed=3, progress=False)
    rs = rows(study)
    baselines = [r for r in rs if r.plan and r.plan.startswith("baseline:")]
    manual = [r for r in rs if r.plan and r.plan.startswith("manual:")]
    assert info["enqueued"] == n_plans and manual and baselines
    best_baseline = max(baselines, key=lambda r: r.accuracy)
    assert all(study.trials[r.number].params["per_channel"] == best_baseline.record["calibration"]["requested"]
               .endswith("per_channel") for r in manual)
    assert max(r.accuracy for r in manual) >= best_baseline.accuracy - 1e-4
    assert max(r.accuracy for r in manual) > max(r.accuracy for r in baselines if "per_channel" not in r.plan)


def test_same_seed_same_trial_sequence(tmp_path):
    def sequence(folder):
        search = StudySession.open(write_tiny_space(folder), results_dir=folder / "results", quiet=True)
        study, _ = run(search, n_trials=14, timeout=None, jobs=1, seed=11, progress=False)
        return [t.params for t in study.trials]

    assert sequence(tmp_path / "a") == sequence(tmp_path / "b")


def test_failed_trials_are_recorded_with_the_reason_and_the_study_goes_on(tmp_path):
    cfg = write_reciprocal_project(tmp_path / "r", tap=True)
    # Reciprocal on the CPU reads the dequantized Relu output (int8: a BPU Conv reads it too, one quantizer
    # per tensor; read by the CPU alone it would leave the BPU in int16): an int8 scale rounds channel 0 to 0
    # and 1/0 reaches the model output as inf (on the BPU it would saturate instead); an int16
    # Relu (input and output) keeps it. (per_channel, the knob this test used, no longer reaches a tensor no
    # Conv reads: docs/hb_rules/quantizer.md §1.5.)
    cfg.write_text(cfg.read_text().replace("node_info: {}", "node_info: {'/reciprocal': {'ON': 'CPU'}}"))
    space = tmp_path / "space.yaml"
    space.write_text("base: r/hb_config.yaml\nnodes:\n  names: [/relu]\n  placement: [BPU]\n"
                     "  precision: [int8, int16]\n"
                     "calibration:\n  calibration_type: [max]\n  max_percentile: [1.0]\n"
                     "  per_channel: [false]\nstudy:\n  name: recip\n  n_trials: 3\n  warm_start: false\n")
    assert load_config(cfg)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, info = run(search, n_trials=3, timeout=None, jobs=1, seed=0, progress=False)
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    # the space's one other candidate completes once; its repeats are no new trials
    assert failed and len(done) == 1 and ("exhausted" in info or "stopped" in info), info
    assert "non-finite" in failed[0].user_attrs["error"]
    assert all(v == "BPU" for t in failed for k, v in t.params.items() if "relu" in k)
    assert all(v == "BPU:int16" for t in done for k, v in t.params.items() if "relu" in k)


@pytest.mark.slow
def test_resume_after_kill_9(tmp_path):
    """kill -9 a search mid-trial: completed trials survive, numbering continues, the zombie is failed."""
    cfg = write_example_project(tmp_path / "ex", n_cal=8, n_eval=24)
    space = tmp_path / "space.yaml"
    space.write_text(f"base: {cfg.relative_to(tmp_path).as_posix()}\nnodes:\n  top_k: 6\n"
                     "study:\n  name: kill\n  n_trials: 200\n  warm_start: false\n")
    proc = start_tuner("search", space, "--threads", 1, cwd=tmp_path, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    journal = tmp_path / "results" / "kill" / "study.journal"
    deadline = time.time() + 240
    killed_with_running = False
    try:
        while time.time() < deadline:
            time.sleep(0.2)
            if not journal.exists():
                continue
            trials = poll_trials(tmp_path / "results", "kill")
            complete = [t for t in trials if t.state == TrialState.COMPLETE]
            # a trial that already names its worker (the instant between Optuna making it RUNNING and
            # tag_trials recording the process is no "mid-trial": nothing could attribute it)
            running = [t for t in trials if t.state == TrialState.RUNNING and "worker" in t.user_attrs]
            if len(complete) >= 3 and running:
                os.kill(proc.pid, signal.SIGKILL)
                killed_with_running = True
                break
    finally:
        proc.kill()
        proc.wait()
    assert killed_with_running, "the search never reached 3 completed trials with one running"
    before = load(tmp_path / "results", "kill").get_trials(deepcopy=False)
    done_before = {t.number: t.values for t in before if t.state == TrialState.COMPLETE}
    zombie = [t.number for t in before if t.state == TrialState.RUNNING]
    assert zombie
    n_target = len(done_before) + 2
    r = cli("search", space, "--n-trials", n_target, "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"as failed: {zombie}" in r.stdout
    after = load(tmp_path / "results", "kill").get_trials(deepcopy=False)
    for number, values in done_before.items():
        assert after[number].state == TrialState.COMPLETE and after[number].values == values
    assert all(after[n].state == TrialState.FAIL for n in zombie)
    numbers = [t.number for t in after]
    assert numbers == list(range(len(after)))
    assert sum(t.state == TrialState.COMPLETE for t in after) == n_target
    assert max(numbers) > max(done_before)


def test_changed_inputs_with_the_same_study_name_are_refused(tmp_path):
    space = write_tiny_space(tmp_path)
    assert cli("search", space, "--n-trials", 4, cwd=tmp_path).returncode == 0
    cal = tmp_path / "tiny" / "cal" / "0000.bin"
    data = bytearray(cal.read_bytes())
    data[:4] = b"\x00\x00\x80\x3f"
    cal.write_bytes(bytes(data))
    r = cli("search", space, "--n-trials", 6, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "was made from other inputs (data" in r.stderr and "--study NEW_NAME" in r.stderr
    # a new name is a new study
    assert cli("search", space, "--n-trials", 4, "--study", "tiny2", cwd=tmp_path).returncode == 0


def test_export_keeps_the_users_keys_and_eval_reproduces_the_trial(tmp_path):
    space = write_tiny_space(tmp_path)
    base = tmp_path / "tiny" / "hb_config.yaml"
    base.write_text(base.read_text().replace("  debug: False", "  debug: True\n  jobs: 4")
                    .replace("output_model_file_prefix: 'tiny'", "output_model_file_prefix: 'tiny_custom'"))
    before = base.read_bytes()
    assert cli("search", space, "--n-trials", 10, cwd=tmp_path).returncode == 0
    out = tmp_path / "exported" / "tiny_best.yaml"
    r = cli("export", "tiny", "--out", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert base.read_bytes() == before                     # the user's YAML is untouched
    cfg = load_config(out)                                 # passes the hb_mapper schema rules
    raw = yaml.safe_load(out.read_text())
    assert raw["compiler_parameters"]["jobs"] == 4 and raw["compiler_parameters"]["debug"] is True
    assert raw["model_parameters"]["output_model_file_prefix"] == "tiny_custom"
    assert cfg.onnx_model == (tmp_path / "tiny" / "tiny.onnx").resolve()  # relative paths still resolve
    study = load(tmp_path / "results", "tiny")
    rs = rows(study)
    trial = best(rs, "pareto", None)
    assert f"trial {trial.number}" in out.read_text()
    ev = json.loads(cli("eval", out, "--json", "--no-nodes", cwd=tmp_path).stdout)
    for name, metrics in trial.record["outputs"].items():
        assert ev["outputs"][name]["cosine"] == pytest.approx(metrics["cosine"], abs=1e-9)
    # refusing to overwrite the input YAML
    r = cli("export", "tiny", "--out", base, cwd=tmp_path)
    assert r.returncode == 2 and "the file exists; tuner does not replace it unless you pass --force" in r.stderr
    r = cli("export", "tiny", "--out", base, "--force", cwd=tmp_path)
    assert r.returncode == 2 and "refusing to overwrite your input YAML" in r.stderr
    assert base.read_bytes() == before


@pytest.mark.parametrize("text,fragment", [
    ("base: tiny/hb_config.yaml\nnodes: [1, 2]\n", "nodes: expected a mapping"),
    ("base: tiny/hb_config.yaml\nstudy:\n  sampler: cmaes\n", "study.sampler: must be one of"),
    ("base: tiny/hb_config.yaml\ncalibration:\n  per_channel: [yes]\n", "repeated values"),
    ("base: tiny/hb_config.yaml\ncalibration:\n  max_percentile: [1.5]\n", "values must be in (0, 1]"),
    ("{{{", "invalid YAML"),
])
def test_bad_space_files_exit_2(tmp_path, text, fragment):
    write_tiny_space(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text if "per_channel: [yes]" not in text else text.replace("[yes]", "[yes, true]"))
    r = cli("search", bad, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tuner: error:")]
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    assert not (tmp_path / "results").exists()


def test_status_and_export_of_unknown_study(tmp_path):
    r = cli("status", "nothing", cwd=tmp_path)
    assert r.returncode == 2 and "no study 'nothing'" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_cleanly(tmp_path, sig):
    cfg = write_example_project(tmp_path / "ex", n_cal=8, n_eval=16)
    space = tmp_path / "space.yaml"
    # every BPU node free: a space too large for repeated (instant) candidates
    space.write_text(f"base: {cfg.relative_to(tmp_path).as_posix()}\n"
                     "study:\n  name: stop\n  n_trials: 100000\n  warm_start: false\n")
    proc = start_tuner("search", space, "--threads", 1, cwd=tmp_path)
    journal = tmp_path / "results" / "stop" / "study.journal"
    deadline = time.time() + 240
    while time.time() < deadline:
        time.sleep(0.2)
        if journal.exists() and sum(t.state == TrialState.COMPLETE for t in poll_trials(tmp_path / "results", "stop")) >= 2:
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "run the same command again to continue" in err
    assert "completed trial(s)" in out
    trials = load(tmp_path / "results", "stop").get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]   # storage consistent
    assert (tmp_path / "results" / "stop" / "best.yaml").exists()


def test_sqlite_storage_url_and_a_measured_profile(tmp_path):
    space = write_tiny_space(tmp_path)
    (tmp_path / "profile.yaml").write_text("/stem/Conv: {bpu_ms: 40.0, cpu_ms: 400.0}\n")
    space.write_text(space.read_text() + "profile: profile.yaml\n")
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    r = cli("search", space, "--n-trials", 5, "--storage", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    study = optuna.load_study(study_name="tiny", storage=url)
    rs = rows(study)
    assert len(rs) == 5 and all(r.latency_ms > 40.0 for r in rs)   # the profile's 40 ms is in every trial
    assert cli("status", "tiny", "--storage", url, cwd=tmp_path).returncode == 0


def test_resuming_with_the_same_seed_does_not_replay_earlier_proposals(tmp_path):
    space = write_tiny_space(tmp_path)
    space.write_text(space.read_text().replace("  seed: 3\n", "  seed: 3\n  sampler: random\n  warm_start: false\n"))
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    run(search, n_trials=8, timeout=None, jobs=1, seed=3, progress=False)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=16, timeout=None, jobs=1, seed=3, progress=False)
    rs = rows(study)
    assert len(rs) == 16
    assert not [r for r in rs if "duplicate_of" in r.record]


def test_task_metric_objective_with_labels(tmp_path):
    """Objective miou:seg against label maps; AbsRel of depth vs float is reported with every trial."""
    import numpy as np

    space = write_tiny_space(tmp_path)
    labels = tmp_path / "tiny" / "labels"
    labels.mkdir()
    for i in range(8):
        np.save(labels / f"seg_{i:04d}.npy", np.random.default_rng(i).integers(0, 3, (16, 16)).astype(np.int64))
    text = space.read_text().replace("objectives:\n  mode: pareto\n",
                                     "labels:\n  seg: tiny/labels/seg_*.npy\nobjectives:\n  mode: pareto\n"
                                     "  accuracy: miou:seg\n  report: [absrel:depth, seg_agreement:seg]\n")
    space.write_text(text)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=6, timeout=None, jobs=1, seed=0, progress=False)
    rs = rows(study)
    assert len(rs) == 6
    for r in rs:
        task = r.record["task"]
        assert set(task) == {"miou:seg", "absrel:depth", "seg_agreement:seg"}
        assert r.accuracy == task["miou:seg"] and 0.0 <= task["miou:seg"] <= 1.0
        assert 0.0 <= task["absrel:depth"] < 10.0 and 0.5 < task["seg_agreement:seg"] <= 1.0
    assert "miou:seg" in search.place.paths.trials_csv.read_text().splitlines()[0]
    # too few label files: one clear error
    for p in list(labels.glob("seg_000[4-7].npy")):
        p.unlink()
    from tuner.errors import TunerError

    with pytest.raises(TunerError, match="4 files match"):
        StudySession.open(space, results_dir=tmp_path / "results2", quiet=True)


def test_each_trial_records_its_worker_once_when_it_is_created(tmp_path):
    """The sampler writes the worker (host, pid) as Optuna creates the trial; the objective
    does not write it a second time (one storage write per trial, an fsync on a journal)."""
    space = write_tiny_space(tmp_path)
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=6, timeout=None, jobs=1, seed=0, progress=False)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert len(trials) == 6 and all(t.user_attrs["worker"]["pid"] == os.getpid() for t in trials)
    logs = [json.loads(line) for line in search.place.paths.journal.read_text().splitlines()]
    writes = [log["trial_id"] for log in logs if "worker" in (log.get("user_attr") or {})]
    assert sorted(writes) == sorted(t._trial_id for t in trials)


def test_a_trial_that_cannot_change_the_result_does_not_reread_the_study(tmp_path, monkeypatch):
    """No trial meets max_latency_ms 1e-9, so the front stays empty: after the first write, an
    infeasible trial returns the last result without reading the study, as a dominated one does;
    a forced rewrite uses the rows kept as the trials finished (no trial decoded again)."""
    from tuner.study import results

    space = write_tiny_space(tmp_path)
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  max_latency_ms: 0.000000001\n"))
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=4, timeout=None, jobs=1, seed=0, progress=False)
    reads, decoded = [], []
    monkeypatch.setattr(results, "rows", lambda st, *a, real=results.rows: reads.append(st) or real(st, *a))
    monkeypatch.setattr(results, "row", lambda t, *a, real=results.row: decoded.append(t.number) or real(t, *a))
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        assert search.result_files.write(study, trial=t) is None
    assert reads == [] and decoded == []
    search.place.paths.trials_csv.unlink()
    search.result_files.write(study, force=True)
    assert reads == [] and decoded == []
    assert len(search.place.paths.trials_csv.read_text().splitlines()) == 1 + 4     # written from the kept rows


def test_trials_csv_keeps_up_while_the_front_does_not_change(tmp_path, monkeypatch):
    """An infeasible study never changes its front; trials.csv still follows the study within
    CSV_EVERY_TRIALS trials (or CSV_EVERY_S seconds), so a kill -9 leaves it nearly complete."""
    import csv

    from tuner.study import outputs

    space = write_tiny_space(tmp_path)
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  max_latency_ms: 0.000000001\n"))
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    study, _ = run(search, n_trials=12, timeout=None, jobs=1, seed=0, progress=False)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert len(done) == 12
    csv_path = search.place.paths.trials_csv

    def n_rows():
        return len(list(csv.reader(csv_path.open()))) - 1 if csv_path.exists() else None

    csv_path.unlink()
    for i, t in enumerate(done):
        search.result_files.write(study, trial=t)
        assert n_rows() == (12 if i + 1 >= outputs.CSV_EVERY_TRIALS else None)   # the 10th trial rewrites it
    csv_path.unlink()
    monkeypatch.setattr(outputs, "CSV_EVERY_S", 0.0)     # as if 30 s had passed since the last write
    search.result_files.write(study, trial=done[-1])
    assert n_rows() == 12
