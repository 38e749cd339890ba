"""A full disk during a search: one line, no torn journal record, every completed trial kept, and
the re-run continues (issue 25 item 1). On a real, small file system mounted for the test."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from cli import error_line, start_tuner, tuner
from helpers import write_tiny_space
from optuna.trial import TrialState

from tuner.study.storage import StudyPaths, make_storage


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB tmpfs mounted at tmp_path/disk (root only: CI runs as root)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited file system needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(path: Path, until: subprocess.Popen[str] | None = None, limit_s: float = 300) -> None:
    """Fill the file system ``path`` is on: write until it is full and, while ``until`` runs, keep
    taking every byte that is freed (a file removed after a failed write)."""
    t0 = time.monotonic()
    with open(path, "ab", buffering=0) as f:
        while time.monotonic() - t0 < limit_s:
            try:
                f.write(b"\0" * 65536)
                continue
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            try:
                f.write(b"\0" * 4096)
                continue
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            if until is None or until.poll() is not None:
                return
            time.sleep(0.002)


def _completed(journal: Path) -> list[int]:
    study = optuna.load_study(study_name="tiny", storage=make_storage(str(journal), StudyPaths(journal.parent)))
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_search_that_fills_the_disk_ends_with_one_line_and_the_rerun_continues(small_disk, jobs):
    """With ``--jobs 2`` the worker processes write the journal: the parent ends with the same line."""
    space = write_tiny_space(small_disk)
    results = small_disk / "results"
    journal = results / "tiny" / "study.journal"
    proc = start_tuner("search", space, "--results-dir", results, "--n-trials", 5000, "--jobs", jobs)
    t0 = time.monotonic()
    while not (journal.is_file() and journal.read_bytes().count(b'"state":1') >= 10):   # 10 trials completed
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 300
        time.sleep(0.05)
    kept_before = len(_completed(journal))
    _fill(small_disk / "filler", until=proc)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("tuner: error: cannot write ") and f"the file system at {small_disk} is full" in line
    assert "free some space" in line
    data = journal.read_bytes()
    assert data.endswith(b"\n"), "a torn record was left at the end of the journal"
    done = _completed(journal)
    assert len(done) >= kept_before >= 10

    (small_disk / "filler").unlink()
    status = tuner("status", "tiny", "--results-dir", results, "--json")
    assert status.returncode == 0, status.stderr
    rerun = tuner("search", space, "--results-dir", results, "--n-trials", len(done) + 5)
    assert rerun.returncode == 0, rerun.stderr
    after = _completed(journal)
    assert set(done) <= set(after) and len(after) == len(done) + 5
    report = tuner("report", "tiny", "--results-dir", results)
    assert report.returncode == 0, report.stderr


def test_a_journal_append_on_a_full_disk_leaves_the_journal_as_it_was(small_disk):
    paths = StudyPaths(small_disk / "s")
    study = optuna.create_study(study_name="s", storage=make_storage(None, paths))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    before = paths.journal.read_bytes()
    _fill(small_disk / "filler")
    os.truncate(small_disk / "filler", os.path.getsize(small_disk / "filler") - 2048)   # room for part of a record
    trial = study.ask()
    from tuner.errors import DiskFull

    with pytest.raises(DiskFull, match=r"study\.journal .*the file system at .* is full"):
        trial.set_user_attr("big", "x" * 100_000)
    assert paths.journal.read_bytes().startswith(before)
    assert paths.journal.read_bytes().endswith(b"\n")
    (small_disk / "filler").unlink()
    again = optuna.load_study(study_name="s", storage=make_storage(None, paths))
    assert len(again.get_trials(states=(TrialState.COMPLETE,))) == 3


@pytest.fixture
def read_only_study(small_disk):
    """A finished study whose folder's file system is then remounted read-only (as root, a chmod'ed
    folder does not stop writes)."""
    space = write_tiny_space(small_disk)
    results = small_disk / "results"
    done = tuner("search", space, "--results-dir", results, "--n-trials", 4)
    assert done.returncode == 0, done.stderr
    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, text=True)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {remount.stderr.strip()}")
    return results


def test_export_to_its_default_path_in_a_read_only_study_folder_is_one_line(read_only_study):
    line = error_line(tuner("export", "tiny", "--results-dir", read_only_study))
    assert line.startswith(f"tuner: error: {read_only_study / 'tiny'}: cannot write trial_")
    assert "Read-only file system" in line and "--out" in line
    elsewhere = read_only_study.parent.parent / "t.yaml"
    ok = tuner("export", "tiny", "--results-dir", read_only_study, "--out", elsewhere)
    assert ok.returncode == 0 and elsewhere.is_file(), ok.stderr


def test_report_in_a_read_only_study_folder_is_one_line(read_only_study):
    line = error_line(tuner("report", "tiny", "--results-dir", read_only_study))
    assert line.startswith(f"tuner: error: {read_only_study / 'tiny'}: cannot write report.html")
    assert "Read-only file system" in line and "copy the study folder" in line
    assert tuner("status", "tiny", "--results-dir", read_only_study).returncode == 0     # reading still works
