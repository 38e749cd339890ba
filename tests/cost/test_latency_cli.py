"""``tuner latency`` and the latency lines of ``tuner eval``, as users run them (subprocesses).

The fit on a real toolchain (``test_fit_on_the_tiny_model``) is skipped where the toolchain is not
installed; everything else runs anywhere."""

import json
import os
from pathlib import Path

import pytest
from cli import tuner as run

DATA = Path(__file__).parent / "data"


def test_eval_prints_the_latency_breakdown(tiny_project):
    r = run("eval", tiny_project, "--no-nodes")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("latency"))
    assert "BPU" in line and "hbdk O3 estimate" in line and "CPU" in line and "switches" in line
    assert "shipped constants" in r.stdout
    data = json.loads(run("eval", tiny_project, "--no-nodes", "--json").stdout)
    lat = data["latency"]
    assert lat["total_ms"] == pytest.approx(lat["bpu_ms"] + lat["cpu_ms"] + lat["switch_ms"])
    assert lat["compiler_ms"] > 0 and lat["subgraphs"] == 2 and len(lat["subgraph_ms"]) == 2


def test_fit_without_the_toolchain_is_one_line(tiny_project, tmp_path):
    r = run("latency", "fit", tiny_project, env={"TUNER_HB_TOOLCHAIN": str(tmp_path / "nowhere")})
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "toolchain" in r.stderr


def test_board_needs_one_thread(tiny_project):
    r = run("latency", "board", DATA / "perf_x5_repvgg_a2_4threads.txt", "--config", tiny_project, "--hbdk-ms", "1")
    assert r.returncode != 0 and "--thread_num 1" in r.stderr


def test_board_campaign(tiny_project, tmp_path):
    """A 1-thread perf output for the tiny model's .bin: one point in its campaign, the estimate's scale
    refitted (fewer than 3 models), and eval --board uses it."""
    perf = tmp_path / "perf.txt"
    perf.write_text((DATA / "perf_x3_mobilenetv1_1thread.txt").read_text())
    r = run("latency", "board", perf, "--config", tiny_project, "--hbdk-ms", "2.0", "--board", "desk", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["campaign"]["points"]) == 1 and out["campaign"]["points"][0]["board_ms"] == pytest.approx(4.003106)
    fit = out["fit"]
    # 4.003 = k x 2.0 + the default's output and fixed terms
    assert fit["per_estimate"] * 2.0 + fit["per_output_mb"] * out["campaign"]["points"][0]["output_mb"] \
        + fit["fixed_ms"] == pytest.approx(4.003106, rel=1e-6)
    r = run("eval", tiny_project, "--no-nodes", "--board", "desk", "--json")
    assert r.returncode == 0, r.stderr
    lat = json.loads(r.stdout)["latency"]
    assert lat["bpu_ms"] == pytest.approx(fit["per_estimate"] * lat["compiler_ms"])
    assert "desk" in lat["board"]
    r = run("eval", tiny_project, "--no-nodes", "--board", "other")
    assert r.returncode != 0 and "no board campaign named 'other'" in r.stderr


def test_a_search_space_names_its_board(tmp_path):
    """``board: NAME`` in a space: its trials' latency is that board's (the BPU part scaled by its fit); a
    board without a campaign is one line and exit 2, before the statistics pass."""
    from helpers import write_tiny_space

    space = write_tiny_space(tmp_path, extra="board: desk\n")
    cache = {"TUNER_CACHE_DIR": str(tmp_path / "cache")}
    r = run("search", space, "--n-trials", 2, cwd=tmp_path, env=cache)
    assert r.returncode == 2 and "no board campaign named 'desk'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "cache" / "stats").exists()
    perf = tmp_path / "perf.txt"
    perf.write_text((DATA / "perf_x3_mobilenetv1_1thread.txt").read_text())
    cfg = tmp_path / "tiny" / "hb_config.yaml"
    b = run("latency", "board", perf, "--config", cfg, "--hbdk-ms", "0.5", "--board", "desk", env=cache)
    assert b.returncode == 0, b.stderr
    from tuner.study.session import StudySession

    os.environ["TUNER_CACHE_DIR"] = cache["TUNER_CACHE_DIR"]
    try:
        on_board = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
        plain = StudySession.open(write_tiny_space(tmp_path / "plain"), results_dir=tmp_path / "results2", quiet=True)
    finally:
        del os.environ["TUNER_CACHE_DIR"]
    cand = plain.problem.ws.base_candidate()
    a = on_board.problem.cost.latency(on_board.problem.ws.simulator.plan(cand))
    p = plain.problem.cost.latency(plain.problem.ws.simulator.plan(cand))
    assert a.total_ms != pytest.approx(p.total_ms) and on_board.problem.cost.board.label != plain.problem.cost.board.label


def test_fit_on_the_tiny_model(hb_toolchain, tiny_project):
    """Three real O3 compiles of the tiny model (all-int8, int16 on its largest layers, a Conv on the CPU):
    the fitted model reproduces hbdk on them, is kept by model fingerprint, and eval says it uses it."""
    r = run("latency", "fit", tiny_project, "--json")
    assert r.returncode == 0, r.stderr
    fit = json.loads(r.stdout)
    names = [s["name"] for s in fit["samples"]]
    assert names[0] == "int8" and "fit_int16" in names and "fit_cut" in names
    assert Path(fit["path"]).is_file()
    for s in fit["samples"]:
        assert s["modeled_ms"] == pytest.approx(s["hbdk_ms"], rel=0.25)   # a 34 us model: fixed costs rule
    def err(key):
        return sum((s[key] / s["hbdk_ms"] - 1) ** 2 for s in fit["samples"])

    assert err("modeled_ms") <= err("modeled_ms_shipped") + 1e-6
    r = run("eval", tiny_project, "--no-nodes")
    assert r.returncode == 0 and "fitted to 3 real compile(s) of this model" in r.stdout
