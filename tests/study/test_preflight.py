"""Arguments and output folders are checked before any work: one line, exit code 2, nothing created.

``/sys`` is a folder nobody (root included) can create files in: it stands for a read-only mount.
"""

import os

import pytest
from cli import tuner
from helpers import write_tiny_space


def cli(*args, cwd, cache):
    return tuner(*args, cwd=cwd, env={"TUNER_CACHE_DIR": str(cache)})


def one_error(r):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tuner: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


unwritable = pytest.mark.skipif(os.access("/sys", os.W_OK) and not os.path.ismount("/sys"),
                                reason="needs /sys (a folder where files cannot be created)")


@unwritable
@pytest.mark.parametrize("extra,fragment", [
    (("--results-dir", "/sys/tuner-results"), "/sys/tuner-results/tiny: cannot write the study's results there"),
    (("--storage", "/sys/tuner/study.journal"), "/sys/tuner: cannot write the study's storage there"),
    (("--storage", "sqlite:////sys/tuner/x.db"), "/sys/tuner: cannot write the study's storage there"),
    (("--storage", "postgres://tuner:s3cret@db:5432/t"), "use postgresql://..."),
    (("--results-dir", "space.yaml"), "space.yaml is a file, not a folder"),
])
def test_search_checks_outputs_before_any_data_pass(tmp_path, extra, fragment):
    space = write_tiny_space(tmp_path)
    cache = tmp_path / "cache"
    for command in (("search", space), ("worker", "tiny", "--space", space)):
        if command[0] == "worker" and extra[0] == "--results-dir":
            continue        # a worker without a study to join says so first
        r = cli(*command, *extra, cwd=tmp_path, cache=cache)
        line = one_error(r)
        assert fragment in line or (command[0] == "worker" and "does not exist" in line), line
        assert "s3cret" not in r.stderr
    assert not cache.exists()                        # no statistics were computed
    assert not (tmp_path / "results").exists()


@unwritable
def test_sensitivity_checks_its_outputs_first(tmp_path):
    space = write_tiny_space(tmp_path)
    cache = tmp_path / "cache"
    line = one_error(cli("sensitivity", space, "--results-dir", "/sys/r", cwd=tmp_path, cache=cache))
    assert "/sys/r/tiny: cannot write the sensitivity ranking there" in line
    line = one_error(cli("sensitivity", tmp_path / "tiny" / "hb_config.yaml", "--csv", "/sys/r/s.csv",
                         cwd=tmp_path, cache=cache))
    assert "/sys/r: cannot write the CSV file there" in line
    assert not cache.exists()


def test_read_only_commands_create_nothing_and_export_keeps_existing_files(tmp_path):
    space = write_tiny_space(tmp_path)
    cache = tmp_path / "cache"
    assert cli("search", space, "--n-trials", 3, cwd=tmp_path, cache=cache).returncode == 0
    typo = tmp_path / "results" / "tiny" / "study.journl"
    for command in ("status", "export", "report"):
        line = one_error(cli(command, "tiny", "--storage", typo, cwd=tmp_path, cache=cache))
        assert f"--storage: {typo} does not exist" in line
        assert not typo.exists()
    line = one_error(cli("status", "tiny", "--storage", "sqlite:///missing.db", cwd=tmp_path, cache=cache))
    assert "missing.db does not exist" in line and not (tmp_path / "missing.db").exists()
    line = one_error(cli("status", "tiny", "--storage", "postgres://u:pw@h/db", cwd=tmp_path, cache=cache))
    assert "use postgresql://..." in line
    # export never replaces an existing file unless asked
    mine = tmp_path / "mine.yaml"
    mine.write_text("# my hand-written config\n")
    line = one_error(cli("export", "tiny", "--out", mine, cwd=tmp_path, cache=cache))
    assert "the file exists; tuner does not replace it unless you pass --force" in line
    assert mine.read_text() == "# my hand-written config\n"
    r = cli("export", "tiny", "--out", mine, "--force", cwd=tmp_path, cache=cache)
    assert r.returncode == 0, r.stderr
    assert "exported by tuner" in mine.read_text()
    base = tmp_path / "tiny" / "hb_config.yaml"
    before = base.read_bytes()
    line = one_error(cli("export", "tiny", "--out", base, "--force", cwd=tmp_path, cache=cache))
    assert "refusing to overwrite your input YAML" in line and base.read_bytes() == before
