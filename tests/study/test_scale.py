"""Several workers on one study: real processes, real journal files, a real PostgreSQL server.

PostgreSQL cases run when TUNER_TEST_POSTGRES_URL is set (.ci/run starts a server and sets it);
they are skipped only when it is absent.
"""

import os
import shutil
import signal
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import onnx
import optuna
import pytest
from cli import start_tuner as tuner
from helpers import build_tiny_model, write_tiny_space
from optuna.trial import TrialState

from tuner.study.loop import optimize_until, run
from tuner.study.session import StudySession
from tuner.study.storage import StudyPaths, make_storage

PG_URL = os.environ.get("TUNER_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="TUNER_TEST_POSTGRES_URL is not set (.ci/run sets it)")

# A user metric that holds every trial while the file `hold` exists beside it: a deterministic
# "slow trial" to kill a worker in the middle of.
SLOW_METRIC = """\
import time
from pathlib import Path

HOLD = Path(__file__).with_name("hold")


def score(outputs_float, outputs_quant, labels):
    t0 = time.monotonic()
    while HOLD.exists() and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    return 1.0
"""


def finish(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def trials_of(name, storage, root):
    """The study's trials ([] while no process has created it yet)."""
    stor = make_storage(storage, StudyPaths(root / "results" / name), heartbeat=None)
    try:
        return optuna.load_study(study_name=name, storage=stor).get_trials(deepcopy=False)
    except KeyError:
        return []


def slow_space(root: Path) -> Path:
    """The tiny space, no warm start (no sensitivity pass to hold up), with the holding metric."""
    space = write_tiny_space(root, extra="  warm_start: false\n")
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  report: ['user:slow.py:score']\n"))
    (root / "slow.py").write_text(SLOW_METRIC)
    return space


@contextmanager
def released(root, proc):
    """Whatever the block does, the held trials are let go and the search does not outlive the test."""
    try:
        yield
    finally:
        (root / "hold").unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()


def assert_exact_budget(trials, n):
    numbers = [t.number for t in trials]
    assert len(set(numbers)) == len(numbers) and sorted(numbers) == list(range(len(numbers)))
    assert sum(t.state == TrialState.COMPLETE for t in trials) == n
    assert not [t for t in trials if t.state == TrialState.RUNNING]


@pytest.mark.slow
def test_three_local_workers_on_a_journal_complete_exactly_the_budget(tmp_path):
    """The trials are held until three run at once (from three worker processes), then let go:
    counting which workers completed trials would race (on 2 cores a late worker may find the
    tiny budget already taken)."""
    space = slow_space(tmp_path)
    (tmp_path / "hold").touch()
    proc = tuner("search", space, "--n-trials", 14, "--jobs", 3, cwd=tmp_path)
    with released(tmp_path, proc):
        pids: set[int] = set()
        deadline = time.time() + 180
        while time.time() < deadline and len(pids) < 3 and proc.poll() is None:
            time.sleep(0.1)
            pids = {t.user_attrs["worker"]["pid"] for t in trials_of("tiny", None, tmp_path)
                    if t.state == TrialState.RUNNING and "worker" in t.user_attrs}
        (tmp_path / "hold").unlink()
        code, out, err = finish(proc)
    assert len(pids) == 3, f"never three trials running at once: {pids}"
    assert code == 0, err
    trials = trials_of("tiny", None, tmp_path)
    assert_exact_budget(trials, 14)
    status = finish(tuner("status", "tiny", cwd=tmp_path))
    assert status[0] == 0 and "14 completed trial(s), 0 failed, 0 running" in status[1]


@pytest.mark.slow
@needs_pg
def test_three_machines_on_postgresql_complete_exactly_the_budget_and_never_show_the_password(tmp_path):
    """`tuner search --n-trials 0` creates the study; three `tuner worker` processes (as on three
    machines) share it through PostgreSQL."""
    space = write_tiny_space(tmp_path)
    name = f"pg-{uuid.uuid4().hex[:8]}"
    password = PG_URL.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    outputs = [finish(tuner("search", space, "--study", name, "--storage", PG_URL, "--n-trials", 0, cwd=tmp_path))]
    assert outputs[0][0] == 0, outputs[0][2]
    workers = [tuner("worker", name, "--storage", PG_URL, "--n-trials", 15, "--threads", 1, cwd=tmp_path)
               for _ in range(3)]
    outputs += [finish(w) for w in workers]
    assert [o[0] for o in outputs] == [0, 0, 0, 0], [o[2] for o in outputs]
    trials = trials_of(name, PG_URL, tmp_path)
    assert_exact_budget(trials, 15)
    assert len({t.user_attrs["worker"]["pid"] for t in trials if t.state == TrialState.COMPLETE}) == 3
    assert all("joined study" in o[1] and "tuner:***@" in o[1] for o in outputs[1:])
    for _code, out, err in outputs:
        assert password not in out and password not in err
    written = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert written and not [p for p in written if password in p.read_text(errors="replace")]


@needs_pg
def test_a_wrong_password_is_a_clear_error_that_does_not_print_it(tmp_path):
    space = write_tiny_space(tmp_path)
    bad = PG_URL.replace(PG_URL.split("://", 1)[1].rsplit("@", 1)[0], "tuner:Wr0ngSecret")
    code, out, err = finish(tuner("search", space, "--storage", bad, "--n-trials", 1, cwd=tmp_path))
    assert code == 2 and "Traceback" not in err
    assert "cannot open postgresql://tuner:***@" in err and "Wr0ngSecret" not in out + err


def _kill_one_mid_trial(tmp_path, name, storage, procs_alive, min_running):
    """Hold all trials, wait until ``min_running`` are RUNNING, kill -9 one's worker; returns
    (killed pid, its trial number, the trials then)."""
    deadline = time.time() + 180
    while time.time() < deadline:
        time.sleep(0.2)
        assert procs_alive(), "the search ended before a worker could be killed"
        trials = trials_of(name, storage, tmp_path)
        running = [t for t in trials if t.state == TrialState.RUNNING and "worker" in t.user_attrs]
        if len(running) >= min_running:
            time.sleep(0.5)  # past the suggestions, into the (held) evaluation
            victim = next(t for t in trials_of(name, storage, tmp_path) if t.number == running[0].number)
            assert victim.state == TrialState.RUNNING and len(victim.params) == 21  # 18 nodes + 3 calibration knobs
            pid = victim.user_attrs["worker"]["pid"]
            os.kill(pid, signal.SIGKILL)
            return pid, victim.number, trials
    raise AssertionError("the workers never had trials running")


def _assert_orphan_failed_and_retried(trials, orphan, done_before, n):
    assert_exact_budget(trials, n)
    by_number = {t.number: t for t in trials}
    assert by_number[orphan].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == orphan]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == by_number[orphan].params
    assert retries[0].user_attrs["plan"].startswith(f"retry of trial {orphan}")
    for number, values in done_before.items():  # nothing completed is lost
        assert by_number[number].state == TrialState.COMPLETE and by_number[number].values == values


@pytest.mark.slow
def test_kill_9_of_a_local_worker_fails_and_retries_its_trial_once(tmp_path):
    space = slow_space(tmp_path)
    proc = tuner("search", space, "--n-trials", 14, "--jobs", 3, cwd=tmp_path)
    with released(tmp_path, proc):
        # a few trials complete first ("nothing completed is lost"), then every trial is held
        deadline = time.time() + 120
        while time.time() < deadline and sum(t.state == TrialState.COMPLETE
                                             for t in trials_of("tiny", None, tmp_path)) < 2:
            time.sleep(0.05)
        (tmp_path / "hold").touch()
        pid, orphan, before = _kill_one_mid_trial(tmp_path, "tiny", None, lambda: proc.poll() is None, 3)
        (tmp_path / "hold").unlink()
        code, out, err = finish(proc)
    assert code == 0, err
    done_before = {t.number: t.values for t in before if t.state == TrialState.COMPLETE}
    assert done_before
    _assert_orphan_failed_and_retried(trials_of("tiny", None, tmp_path), orphan, done_before, 14)
    assert f"as failed: [{orphan}]" in out


@pytest.mark.slow
@needs_pg
def test_kill_9_of_a_machine_on_postgresql_is_noticed_by_its_heartbeat(tmp_path):
    """No parent process sees this worker die: only its stopped heartbeat tells the others."""
    space = slow_space(tmp_path)
    name = f"pgkill-{uuid.uuid4().hex[:8]}"
    assert finish(tuner("search", space, "--study", name, "--storage", PG_URL, "--n-trials", 0, cwd=tmp_path))[0] == 0
    (tmp_path / "hold").touch()
    args = ("worker", name, "--storage", PG_URL, "--n-trials", 8, "--threads", 1, "--heartbeat", 1)
    workers = [tuner(*args, cwd=tmp_path) for _ in range(2)]
    try:
        pid, orphan, before = _kill_one_mid_trial(tmp_path, name, PG_URL, lambda: all(w.poll() is None for w in workers),
                                                  2)
        time.sleep(4)  # > the grace period (3 heartbeats of 1 s); the survivor is held, its heartbeat goes on
        (tmp_path / "hold").unlink()
        survivor = next(w for w in workers if w.pid != pid)
        code, out, err = finish(survivor)
    finally:
        (tmp_path / "hold").unlink(missing_ok=True)
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.communicate()
    assert code == 0, err
    _assert_orphan_failed_and_retried(trials_of(name, PG_URL, tmp_path), orphan, {}, 8)


def test_a_worker_with_another_model_file_refuses_to_join(tmp_path):
    space = write_tiny_space(tmp_path / "a")
    code, _, err = finish(tuner("search", space, "--n-trials", 2, "--jobs", 1, cwd=tmp_path / "a"))
    assert code == 0, err
    journal = tmp_path / "a" / "results" / "tiny" / "study.journal"
    # "another machine": a copy of the project whose model file differs
    shutil.copytree(tmp_path / "a" / "tiny", tmp_path / "b" / "tiny")
    shutil.copy(space, tmp_path / "b" / "space.yaml")
    onnx.save(build_tiny_model(seed=1), str(tmp_path / "b" / "tiny" / "tiny.onnx"))
    size = journal.stat().st_size
    code, out, err = finish(tuner("worker", "tiny", "--storage", journal, "--space", "space.yaml", cwd=tmp_path / "b"))
    assert code == 2 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("tuner: error:")]
    assert len(lines) == 1 and "cannot join study 'tiny'" in lines[0]
    assert str(tmp_path / "b" / "tiny" / "tiny.onnx") in lines[0] and "is not the study's model" in lines[0]
    assert journal.stat().st_size == size   # the study is untouched
    # the same files join
    shutil.copy(tmp_path / "a" / "tiny" / "tiny.onnx", tmp_path / "b" / "tiny" / "tiny.onnx")
    code, out, err = finish(tuner("worker", "tiny", "--storage", journal, "--space", "space.yaml", "--n-trials", 3,
                                  cwd=tmp_path / "b"))
    assert code == 0, err
    assert sum(t.state == TrialState.COMPLETE for t in trials_of("tiny", str(journal), tmp_path)) == 3
    assert (tmp_path / "b" / "results" / "tiny" / "best_minimal.yaml").is_file()     # a worker writes it too
    assert "best_minimal.yaml" in out and "one-line fixes" in out


def test_a_candidate_another_worker_evaluated_is_answered_from_storage(tmp_path):
    space = write_tiny_space(tmp_path, extra="  warm_start: false\n")
    results_dir = tmp_path / "results"
    first = StudySession.open(space, results_dir=results_dir, quiet=True)
    study_a, _ = run(first, n_trials=3, timeout=None, jobs=1, seed=0, progress=False)
    # a second worker, started before the first one's last trials exist
    second = StudySession.open(space, results_dir=results_dir, quiet=True)
    study_b = second.study(seed=1, create=False)
    second.scorer.index(study_b)
    run(first, n_trials=6, timeout=None, jobs=1, seed=0, progress=False)
    target = [t for t in study_a.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE][-1]
    study_b.enqueue_trial(target.params)
    evaluate = second.problem.ws.simulator.evaluate
    second.problem.ws.simulator.evaluate = lambda *a, **k: pytest.fail("a candidate in the storage was simulated again")
    try:
        # one proposal: the enqueued repeat (it does not count, so 7 leaves room for it)
        optimize_until(second, study_b, 7, None, [], should_stop=lambda: study_b.get_trials(deepcopy=False)[-1].state.is_finished())
    finally:
        second.problem.ws.simulator.evaluate = evaluate
    last = study_b.get_trials(deepcopy=False)[-1]
    assert last.state == TrialState.PRUNED and last.user_attrs["duplicate_of"] == target.number
    assert sum(t.state == TrialState.COMPLETE for t in study_b.get_trials(deepcopy=False)) == 6   # not a new trial
