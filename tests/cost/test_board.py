"""Board numbers: real ``hrt_model_exec perf`` outputs (fixtures with their provenance in tests/cost/data)
and the fit of board latency to hbdk's estimate."""

import csv
from pathlib import Path

import pytest

from tuner.cost.board import BoardPoint, Campaign, campaign_path, campaigns, parse_perf, predict
from tuner.cost.latency import BoardFit
from tuner.errors import TunerError

DATA = Path(__file__).parent / "data"


def test_x3_one_thread():
    (run,) = parse_perf((DATA / "perf_x3_mobilenetv1_1thread.txt").read_text())
    assert run.average_ms == pytest.approx(4.003106)
    assert run.threads == 1 and run.frames == 200 and run.fps == pytest.approx(244.204717)
    assert run.firmware == "unknown firmware"      # that log prints no versions


def test_x5_versions_and_threads():
    (run,) = parse_perf((DATA / "perf_x5_repvgg_a2_4threads.txt").read_text())
    assert run.threads == 4 and run.average_ms == pytest.approx(21.25876)
    assert run.runtime == "1.23.5"
    assert run.bpu_platform == "1.3.6"
    assert run.model_builder == "1.23.8"
    assert run.model_file.endswith("RepVGG_A2-deploy_224x224_nv12.bin")
    assert "1.3.6" in run.firmware


def test_notebook_output_with_command():
    (run,) = parse_perf((DATA / "perf_x5_mobilenetv2_4threads.txt").read_text())
    assert run.threads == 4 and run.average_ms == pytest.approx(3.420286)
    assert run.model_file == "model/mobilenetv2_224x224_nv12.bin"


def test_two_runs_in_one_log():
    text = (DATA / "perf_x3_mobilenetv1_1thread.txt").read_text()
    runs = parse_perf(text + "\n" + text.replace("4.003106", "5.5"))
    assert [r.average_ms for r in runs] == [pytest.approx(4.003106), pytest.approx(5.5)]


def test_not_a_perf_output():
    with pytest.raises(TunerError, match="Average"):
        parse_perf("hb_mapper makertbin ... done\n")


def zoo_points():
    lines = [line for line in (DATA / "zoo_x5_yolo_2025-07.csv").read_text().splitlines() if not line.startswith("#")]
    return [BoardPoint(r["model"], float(r["hbdk_ms"]), float(r["output_mb"]), float(r["board_ms"]))
            for r in csv.DictReader(lines)]


def test_zoo_campaign_fit():
    """The public zoo campaign (14 models, one build): board ~ 1.02 x hbdk + 0.56 ms/MB + ~0.2 ms, a few % off."""
    fit, err = Campaign("zoo", "x5", zoo_points()).fit(BoardFit())
    assert fit.per_estimate == pytest.approx(1.02, abs=0.03)
    assert fit.per_output_mb == pytest.approx(0.56, abs=0.05)
    assert 0.0 <= fit.fixed_ms <= 0.4
    assert err < 0.03


def test_few_points_rescale_the_estimate_only():
    pts = zoo_points()[:2]
    default = BoardFit(per_estimate=1.0, per_output_mb=0.56, fixed_ms=0.24)
    fit, _ = Campaign("b", "fw", pts).fit(default)
    assert (fit.per_output_mb, fit.fixed_ms) == (0.56, 0.24)
    # a board 20 % slower on the BPU part: the scale follows
    slow = [BoardPoint(p.name, p.hbdk_ms, p.output_mb, 1.2 * p.hbdk_ms + 0.56 * p.output_mb + 0.24) for p in pts]
    fit, err = Campaign("b", "fw", slow).fit(default)
    assert fit.per_estimate == pytest.approx(1.2, rel=1e-6) and err < 1e-9
    assert predict(fit, 10.0, 1.0) == pytest.approx(12.8)


def test_campaigns_stay_apart(tmp_path):
    a = Campaign("x5-desk", "x5, runtime 1.24.5", zoo_points()[:3])
    b = Campaign("x5-desk", "x5, runtime 1.23.5", zoo_points()[3:5])
    for c in (a, b):
        campaign_path(tmp_path, c.board, c.firmware).write_text(__import__("json").dumps(c.to_json()))
    found = campaigns(tmp_path, "x5-desk")
    assert sorted(len(c.points) for _, c in found) == [2, 3]
    assert campaigns(tmp_path, "other") == []
