"""The tuner command as users run it: a real subprocess, exit codes, one-line errors."""

import json

import numpy as np
import pytest
from cli import start_tuner, tuner


def run(*args, cwd=None, env=None):   # this module runs the command as users do: a real process
    return tuner(*args, cwd=cwd, env=env, timeout=300, process=True)


def test_eval_prints_node_and_output_tables(tiny_project):
    r = run("eval", tiny_project)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Node" in out and "Cosine Similarity" in out and "Threshold" in out
    assert "/gate/Where" in out and "id(1)" in out
    assert "2 BPU subgraph(s)" in out
    assert "seg" in out and "depth" in out


def test_eval_json_has_outputs_nodes_and_fingerprints(tiny_project):
    r = run("eval", tiny_project, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data["outputs"]) == {"seg", "depth"}
    assert 0.5 < data["outputs"]["seg"]["cosine"] <= 1.0
    assert len(data["model"]["sha256"]) == 64 and len(data["calibration_data"]["sha256"]) == 64
    assert data["counts"]["subgraphs"] == 2
    assert {r["node"] for r in data["nodes"]} >= {"/stem/Conv", "/gate/Where_cast", "/gate/Where_add"}


def test_a_reader_that_stops_early_ends_the_command_quietly(tiny_project):
    """`tuner eval --json | head`: the reader closes its end before tuner writes; tuner exits with
    128 + SIGPIPE and no 'Exception ignored ... BrokenPipeError' traceback on stderr."""
    proc = start_tuner("eval", tiny_project, "--json", text=False)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_eval_on_separate_data(tiny_project, tmp_path):
    other = tmp_path / "eval"
    other.mkdir()
    for i in range(3):
        np.random.default_rng(i).random((1, 4, 16, 16), dtype=np.float32).tofile(other / f"{i}.bin")
    data = json.loads(run("eval", tiny_project, "--data", other, "--json", "--no-nodes").stdout)
    assert data["eval_data"]["samples"] == 3 and data["nodes"] == []


def bad(project, fragment, *extra):
    r = run("eval", project, *extra)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("tuner: error:")]
    assert len(lines) == 1, r.stderr
    assert fragment in lines[0], lines[0]
    return lines[0]


def test_missing_config(tmp_path):
    bad(tmp_path / "nope.yaml", "no such file")


def test_missing_data_folder_names_where_it_came_from(tiny_project, tmp_path):
    """The --data folder is evaluation data: not called a calibration folder (issue 25 item 8)."""
    line = bad(tiny_project, "evaluation data folder not found", "--data", tmp_path / "gone")
    assert "gone" in line and "--data" in line and "calibration" not in line
    (tmp_path / "empty").mkdir()
    line = bad(tiny_project, "empty evaluation data folder", "--data", tmp_path / "empty")
    assert "calibration" not in line
    (tiny_project.parent / "cal").rename(tiny_project.parent / "moved")
    line = bad(tiny_project, "calibration folder not found", "--data", tmp_path / "empty")
    assert "cal_data_dir" in line


def test_unknown_key(tiny_project):
    tiny_project.write_text(tiny_project.read_text().replace("  per_channel: False", "  per_chanel: False"))
    bad(tiny_project, "calibration_parameters.per_chanel: unknown key (did you mean 'per_channel'?)")


def test_unknown_node_in_node_info(tiny_project):
    tiny_project.write_text(tiny_project.read_text().replace("node_info: {}", "node_info: {'/stem/conv': {'ON': 'CPU'}}"))
    bad(tiny_project, "'/stem/conv' is not in the model")


@pytest.mark.parametrize("kind", ["jpeg", "nan", "size"])
def test_bad_calibration_files_are_named(tiny_project, kind):
    cal = tiny_project.parent / "cal"
    before = sorted(p.name for p in cal.iterdir())
    if kind == "jpeg":
        (cal / "zz.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(100))
        bad(tiny_project, "zz.jpg: is a JPEG image")
    elif kind == "nan":
        x = np.zeros((1, 4, 16, 16), np.float32)
        x[0, 0, 0, 0] = np.nan
        x.tofile(cal / "0003.bin")
        bad(tiny_project, "0003.bin: contains NaN")
    else:
        np.zeros((1, 4, 16, 8), np.float32).tofile(cal / "0003.bin")
        bad(tiny_project, "0003.bin: 2048 bytes")
    assert set(before) <= {p.name for p in cal.iterdir()}  # nothing of the user's was removed


def test_not_an_onnx_model(tiny_project):
    (tiny_project.parent / "tiny.onnx").write_bytes(b"definitely not protobuf \xff\xfe")
    bad(tiny_project, "not an ONNX model")


def test_calibration_type_that_cannot_be_simulated(tiny_project):
    tiny_project.write_text(tiny_project.read_text().replace("calibration_type: 'max'", "calibration_type: 'skip'"))
    bad(tiny_project, "cannot be simulated")


def test_check_data_exit_codes(tiny_project):
    r = run("check-data", tiny_project, "--json")
    data = json.loads(r.stdout)
    assert r.returncode == data["exit_code"] == 1        # 8 samples: too few; channel 3 on another scale
    codes = {f["code"] for f in data["findings"]}
    assert "few_samples" in codes and "range_ratio" in codes
    (tiny_project.parent / "cal" / "zz.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    r = run("check-data", tiny_project)
    assert r.returncode == 2 and "zz.png" in r.stdout and "Traceback" not in r.stderr


def test_search_stops_on_unusable_data(tmp_path):
    from helpers import write_tiny_space

    space = write_tiny_space(tmp_path)
    (tmp_path / "tiny" / "cal" / "bad.bin").write_bytes(b"\x00" * 12)
    r = run("search", space, cwd=tmp_path)
    assert r.returncode == 2 and "bad.bin" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "results").exists()


def test_sensitivity_ranks_nodes_and_writes_csv(tiny_project, tmp_path):
    out = tmp_path / "sens.csv"
    r = run("sensitivity", tiny_project, "--json", "--csv", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    gains = [row["gain"] for row in data["nodes"]]
    assert gains == sorted(gains, reverse=True)                       # most sensitive first
    rows = {row["node"]: row for row in data["nodes"]}
    assert "/gate/Where" not in rows                                  # CPU-only ops are not ranked
    conv = rows["/stem/Conv"]                                         # Conv takes int16 on bayes-e
    assert conv["alone_int16"]["accuracy"] > conv["alone_int8"]["accuracy"]
    sig = rows["/gate/Sigmoid"]
    # alone on the BPU, the Sigmoid's output goes to CPU nodes that lead only to model outputs: hb makes its
    # table int16 (and so its input) without being asked (docs/hb_rules/placement.md 3i), so asking changes nothing
    assert sig["alone_int16"]["accuracy"] == pytest.approx(sig["alone_int8"]["accuracy"], abs=1e-12)
    assert sig["alone_int8"]["accuracy"] < 1.0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("node,op_type,gain,cpu_gain,int16_gain") and len(lines) == len(rows) + 1
    table = run("sensitivity", tiny_project, "--top", 3)
    assert table.returncode == 0 and "most sensitive first" in table.stdout


def test_eval_trace_shows_where_error_enters_and_the_switches(tiny_project):
    r = run("eval", tiny_project, "--trace", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    trace = {row["node"]: row for row in data["trace"]}
    assert [row["node"] for row in data["trace"]] == [n["node"] for n in data["nodes"]]
    # hb splits Where: its casts run on the CPU, its Mul/Mul/Add on the BPU (Greater reads the BPU Conv)
    assert trace["/gate/Greater"]["on"] == "CPU" and "BPU->CPU" in trace["/gate/Greater"]["switch"]
    assert trace["/gate/Where_cast"]["on"] == "CPU"
    assert "CPU->BPU" in trace["/gate/Where_mul_x"]["switch"]
    # change = own cosine - worst input cosine; the first quantized conv loses accuracy
    stem = trace["/stem/Conv"]
    assert stem["change"] < 0 and abs(stem["change"] - (stem["cosine"] - 1.0)) < 1e-12
    text = run("eval", tiny_project, "--trace")
    assert text.returncode == 0 and "<< error enters" in text.stdout and "Switch" in text.stdout
    both = run("eval", tiny_project, "--trace", "--no-nodes")
    assert both.returncode == 2 and "--trace" in both.stderr


@pytest.mark.parametrize("argv,fragment", [
    (("search", "space.yaml", "--jobs", "0"), "argument --jobs: expected a positive integer, got 0"),
    (("search", "space.yaml", "--jobs", "-2"), "argument --jobs: expected a positive integer, got -2"),
    (("search", "space.yaml", "--n-trials", "-1"), "argument --n-trials: expected an integer >= 0, got -1"),
    (("search", "space.yaml", "--timeout", "5 minutes"), "argument --timeout: expected seconds or a duration"),
    (("search", "space.yaml", "--timeout", "0"), "argument --timeout: must be positive"),
    (("worker", "s", "--max-retry", "-1"), "argument --max-retry: expected an integer >= 0, got -1"),
    (("worker", "s", "--heartbeat", "0"), "argument --heartbeat: expected a positive number of seconds"),
    (("worker", "s", "--threads", "0"), "argument --threads: expected a positive integer, got 0"),
    (("eval", "c.yaml", "--limit", "0"), "argument --limit: expected a positive integer, got 0"),
    (("sensitivity", "c.yaml", "--top", "-3"), "argument --top: expected a positive integer, got -3"),
    (("verify", "s", "--command", "true", "--top", "0"), "argument --top: expected a positive integer, got 0"),
])
def test_bad_counts_are_refused_by_the_parser(tmp_path, argv, fragment):
    r = run(*argv, cwd=tmp_path)
    assert r.returncode == 2
    assert fragment in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []      # nothing created


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    """In a log (stderr a pipe) long work prints a progress line every TUNER_PROGRESS_EVERY seconds
    (default 10; 0 here: every step) with trials done, the best so far and an ETA."""
    import re

    from helpers import write_tiny_space

    space = write_tiny_space(tmp_path)
    env = {"TUNER_PROGRESS_EVERY": "0"}
    r = run("sensitivity", space, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    steps = re.findall(r"^node sensitivity: (\d+)/(\d+) \(\d+%\)", r.stderr, re.M)
    assert len(steps) >= 3 and steps[-1][0] == steps[-1][1]
    assert re.search(r"^node sensitivity: 1/\d+ \(\d+%\), ETA \d+", r.stderr, re.M)
    r = run("search", space, "--n-trials", 6, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"^trials: (\d+)/6 \(\d+%\)(.*)$", r.stderr, re.M)
    assert [int(n) for n, _ in lines][-1] == 6 and len(lines) >= 3
    assert any("best #" in rest and "ETA" in rest for _, rest in lines[:-1])
    # the default: no more than one line per 10 s (this search takes seconds: only the final one)
    r = run("search", space, "--n-trials", 10, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"^trials: ", r.stderr, re.M)) <= 2


@pytest.mark.parametrize("how", [("--timeout", "-5m"), ("--timeout=-5m",), ("--timeout", "-.5h"), ("--timeout", "-5")])
def test_a_negative_timeout_is_one_clear_line(tmp_path, how):
    """argparse takes '-5m' for an option ("expected one argument"); tuner names the value (issue 25 item 8)."""
    for command in (("search", tmp_path / "space.yaml"), ("worker", "s")):
        r = tuner(*command, *how)
        assert r.returncode == 2
        assert f"argument --timeout: must be positive (seconds, or a duration like 30m / 8h), got '{how[-1].split('=')[-1]}'" \
            in r.stderr, r.stderr
        assert "expected one argument" not in r.stderr


def test_eval_on_unnormalized_pixel_data_points_at_check_data(tiny_project):
    """0..255 integers reaching a featuremap input unnormalized: one hint line naming check-data (issue 25 item 8)."""
    plain = tuner("eval", tiny_project, "--no-nodes")
    assert plain.returncode == 0 and "check-data" not in plain.stderr
    rng = np.random.default_rng(0)
    for f in sorted((tiny_project.parent / "cal").glob("*.bin")):
        np.round(rng.random((1, 4, 16, 16)) * 255).astype(np.float32).tofile(f)
    r = tuner("eval", tiny_project, "--no-nodes")
    assert r.returncode == 0, r.stderr
    hints = [line for line in r.stderr.splitlines() if line.startswith("hint:")]
    assert len(hints) == 1 and "input 'x' holds integers 0..255" in hints[0]
    assert f"tuner check-data {tiny_project}" in hints[0]
    as_json = tuner("eval", tiny_project, "--no-nodes", "--json")
    assert json.loads(as_json.stdout) and "tuner check-data" in as_json.stderr


def test_eval_splits_a_camera_inputs_loss_and_a_featuremap_gets_none(tmp_path, tiny_project):
    from camera_toys import write_camera_project

    cfg = write_camera_project(tmp_path / "cam")
    r = run("eval", cfg, "--json", "--no-nodes")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    split = data["loss_split"]
    assert set(split) == {"input_path", "network", "both"}
    assert all(set(p) == {"outputs", "task"} and {"cosine", "sqnr_db"} <= set(p["outputs"]["out"])
               for p in split.values())
    assert split["both"]["outputs"] == data["outputs"]
    assert split["input_path"]["outputs"]["out"]["cosine"] < 0.8 < 0.999 < split["network"]["outputs"]["out"]["cosine"]
    text = run("eval", cfg, "--no-nodes")
    assert text.returncode == 0 and "loss split" in text.stdout and "network alone" in text.stdout
    plain = run("eval", tiny_project, "--json", "--no-nodes")
    assert plain.returncode == 0 and "loss_split" not in json.loads(plain.stdout)
