"""Storages, redaction and opening studies that do not exist."""

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
