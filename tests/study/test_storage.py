"""Storages, redaction and opening studies that do not exist."""

from pathlib import Path

import optuna
import pytest

from tuner.errors import TunerError
from tuner.study.storage import StudyPaths, journal_storage, make_storage, open_existing, redact


def test_passwords_are_redacted_from_urls():
    assert redact("postgresql://tuner:s3cret@db:5432/t") == "postgresql://tuner:***@db:5432/t"
    assert redact("sqlite:///x.db") == "sqlite:///x.db" and redact("results/a.journal") == "results/a.journal"


def test_the_default_storage_is_the_journal_in_the_study_folder(tmp_path):
    paths = StudyPaths(tmp_path / "results" / "s")
    storage = make_storage(None, paths)
    optuna.create_study(study_name="s", storage=storage)
    assert paths.journal.is_file() and paths.root.is_dir()
    study, found = open_existing("s", None, tmp_path / "results")
    assert study.study_name == "s" and found.root == paths.root
    by_folder, _ = open_existing(str(paths.root), None)
    assert by_folder.study_name == "s"


def test_a_relative_journal_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = journal_storage(tmp_path.joinpath("a.journal").relative_to(tmp_path))
    optuna.create_study(study_name="a", storage=storage)
    assert (tmp_path / "a.journal").is_file()


def test_missing_studies_are_one_clear_error(tmp_path):
    with pytest.raises(TunerError, match="does not exist"):
        open_existing("nope", None, tmp_path)
    paths = StudyPaths(tmp_path / "s")
    optuna.create_study(study_name="other", storage=make_storage(None, paths))
    with pytest.raises(TunerError, match="it has other"):
        open_existing("s", str(paths.journal), tmp_path)
    with pytest.raises(TunerError, match=r"cannot open sqlite.*"):
        make_storage("sqlite:////nonexistent/dir/x.db", paths)


def _three_trials(paths: StudyPaths) -> bytes:
    study = optuna.create_study(study_name="s", storage=make_storage(None, paths))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return paths.journal.read_bytes()


def test_a_torn_last_record_is_cut_off_before_the_study_is_read_and_never_appended_after(tmp_path, capsys):
    """A write cut short (a full disk, kill -9) leaves half a record; the next run must not append after it."""
    paths = StudyPaths(tmp_path / "s")
    whole = _three_trials(paths)
    torn = b'{"op_code":4,"worker_id":"w","study_id":0,"datetime_st'
    paths.journal.write_bytes(whole + torn)
    study, _ = open_existing(str(paths.root), None)
    note = capsys.readouterr().err
    assert f"dropped {len(torn)} byte(s) of a torn journal record" in note and "intact" in note
    assert paths.journal.read_bytes() == whole
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)     # the re-run appends
    again, _ = open_existing(str(paths.root), None)
    assert len(again.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 5


def test_a_journal_an_older_run_appended_after_a_torn_record_is_read_again(tmp_path, capsys):
    """What b5a529e's re-run after a full disk left: the torn record and the next one on one line,
    which Optuna refuses to read (JSONDecodeError); the complete record is kept."""
    paths = StudyPaths(tmp_path / "s")
    whole = _three_trials(paths)
    lines = whole.splitlines(keepends=True)
    cut = len(lines) - 4
    broken = b"".join(lines[:cut]) + b'{"op_code":5,"worker_id":"w","trial_id":2,"par' + b"".join(lines[cut:])
    paths.journal.write_bytes(broken)
    study, _ = open_existing(str(paths.root), None)
    assert "dropped 46 byte(s)" in capsys.readouterr().err
    assert paths.journal.read_bytes() == whole
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 3


def test_a_journal_without_a_torn_record_is_left_alone(tmp_path, capsys):
    paths = StudyPaths(tmp_path / "s")
    whole = _three_trials(paths)
    before = paths.journal.stat().st_mtime_ns
    open_existing(str(paths.root), None)
    assert capsys.readouterr().err == "" and paths.journal.read_bytes() == whole
    assert paths.journal.stat().st_mtime_ns == before


def test_a_typod_study_name_lists_the_studies_there_closest_first(tmp_path):
    for name in ("zebra", "tiny_det", "tiny"):
        optuna.create_study(study_name=name, storage=make_storage(None, StudyPaths(tmp_path / name)))
    with pytest.raises(TunerError, match=rf"no study 'tinny': .*; the studies in {tmp_path}: tiny, tiny_det, zebra"):
        open_existing("tinny", None, tmp_path)
    with pytest.raises(TunerError, match="holds no study"):
        open_existing("tinny", None, tmp_path / "zebra" / "nothing")


def test_the_password_is_redacted_only_inside_the_url():
    """With password 'p', the driver's "Can't load plugin" must print intact (issue 25 item 8)."""
    url = "nosuch://u:p@h/db"
    with pytest.raises(TunerError) as err:
        make_storage(url, StudyPaths(Path("unused")))
    text = str(err.value)
    assert "Can't load plugin" in text and "u:***@h/db" in text and ":p@" not in text
