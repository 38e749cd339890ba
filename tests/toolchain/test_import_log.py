"""tuner import-log against a stand-in hb_mapper (tests/toolchain/fake_hb_mapper.py) run as a real process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli import tuner as cli
from helpers import write_tiny_project

FAKE = Path(__file__).with_name("fake_hb_mapper.py")
NODE_INFO = "{'/gate/Sigmoid': {'InputType': 'int16', 'OutputType': 'int16'}, '/res/Add': {'OutputType': 'int16'}}"


def fake_hb_mapper(cfg: Path, **env) -> Path:
    import os

    r = subprocess.run([sys.executable, str(FAKE), "makertbin", "--config", cfg.name, "--model-type", "onnx"],
                       cwd=cfg.parent, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return cfg.parent / "hb_mapper_makertbin.log"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("imp")
    cfg = write_tiny_project(root / "p", node_info=NODE_INFO)
    return cfg, fake_hb_mapper(cfg)


def test_import_log_compares_real_and_simulated_per_node(project):
    cfg, log = project
    r = cli("import-log", log, "--config", cfg, "--json", cwd=cfg.parent)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    comp = out["comparison"]
    nodes = {n["node"]: n for n in comp["nodes"]}
    # the stand-in refused int16 on the Sigmoid, kept it on the Add; the simulator assumed both honoured
    assert nodes["/gate/Sigmoid"]["int16_refused"] is True and nodes["/gate/Sigmoid"]["sim_dtype"] == "int16/int16"
    assert nodes["/res/Add"]["int16_refused"] is False
    assert comp["summary"]["int16_refused"] == ["/gate/Sigmoid"]
    # its error is 3x the simulator's: every real cosine is lower, the ranking mostly the same
    paired = [n for n in comp["nodes"] if n["real_cosine"] is not None and n["sim_cosine"] is not None]
    assert len(paired) >= 12 and all(n["real_cosine"] < n["sim_cosine"] for n in paired)
    assert comp["summary"]["spearman"] > 0.8
    assert comp["summary"]["output_cosine_gap"] < 0
    # rows the tool inserted have no model node; the CPU Where is CPU on both sides
    assert "HZ_PREPROCESS_FOR_x" in comp["log_only"] and nodes["/gate/Where_cast"]["real_on"] == "CPU"
    assert not comp["summary"]["placement_differs"]
    # thresholds side by side (the stand-in's are 1 % above the simulator's)
    conv = nodes["/res/Conv"]
    assert conv["real_threshold"] == pytest.approx(conv["sim_threshold"] * 1.01, rel=1e-4)


def test_import_log_text_shows_the_gap_and_placement_differences(project, tmp_path):
    cfg, log = project
    text = log.read_text().replace("/head/depth/Sigmoid                                 BPU  id(1)",
                                   "/head/depth/Sigmoid                                 CPU  --   ")
    moved = tmp_path / "moved.log"
    moved.write_text(text)
    r = cli("import-log", moved, "--config", cfg, cwd=cfg.parent)
    assert r.returncode == 0, r.stderr
    assert "Cosine real" in r.stdout and "gap" in r.stdout and "Spearman" in r.stdout
    assert "placement differs on 1 node(s): /head/depth/Sigmoid" in r.stdout
    assert "int16 refused by the tool on 1 node(s): /gate/Sigmoid" in r.stdout
    assert "*/gate/Sigmoid" in r.stdout   # the row is marked


def test_update_target_feeds_refusals_into_the_next_study(project, tmp_path):
    from tuner.graph import load_target
    from tuner.study.space import load_space, resolve
    from tuner.workspace import Workspace

    cfg, log = project
    learned = tmp_path / "learned.yaml"
    r = cli("import-log", log, "--config", cfg, "--update-target", learned, cwd=cfg.parent)
    assert r.returncode == 0, r.stderr
    assert "Sigmoid: no int16" in r.stdout
    t = load_target(learned)
    assert "Sigmoid" not in t.int16_ops and "Add" in t.int16_ops and t.march == "bayes-e"
    evidence = yaml.safe_load(learned.read_text())["learned"]
    assert evidence["int16"]["Sigmoid"]["refused"] == ["/gate/Sigmoid"] and str(log) in evidence["logs"][0]
    # the next study references it: no int16 choice is offered for Sigmoid nodes any more
    space = tmp_path / "space.yaml"
    space.write_text(f"base: {cfg}\nmarch: learned.yaml\nnodes:\n  op_types: [Sigmoid, Add]\n")
    sp = load_space(space)
    ws = Workspace.open(sp.base, march=sp.raw["march"])
    res = resolve(sp, ws.graph, ws.target, ws.base_candidate())
    choices = {d.nodes[0]: d.choices for d in res.decisions}
    assert not any("int16" in c for c in choices["/gate/Sigmoid"]) and "BPU:int16" in choices["/res/Add"]
    # a second log adds evidence; a file that is not a target table is refused, not overwritten
    r = cli("import-log", log, "--config", cfg, "--update-target", learned, cwd=cfg.parent)
    assert r.returncode == 0, r.stderr
    other = tmp_path / "other.yaml"
    other.write_text("hello: 1\n")
    r = cli("import-log", log, "--config", cfg, "--update-target", other, cwd=cfg.parent)
    assert r.returncode == 2 and "not a tuner target table" in r.stderr and other.read_text() == "hello: 1\n"


def test_import_log_errors_are_one_line(project, tmp_path):
    cfg, _ = project
    r = cli("import-log", cfg, cwd=tmp_path)
    assert r.returncode == 2 and "not an hb_mapper makertbin log" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "failed.log"
    bad.write_text("2025-01-01 00:00:00,000 file: hb_mapper.py func: x line No: 1 Start hb_mapper....\n"
                   "2025-01-01 00:00:01,000 ERROR Layer /x expect data shape range [1, 8192]\n")
    r = cli("import-log", bad, cwd=tmp_path)
    assert r.returncode == 2 and "did not finish" in r.stderr and "8192" in r.stderr


# --------------------------------------------------------------------------- the log's terms


def _import_json(log: Path, cfg: Path) -> dict:
    r = cli("import-log", log, "--config", cfg, "--json", cwd=cfg.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["comparison"]


def test_compared_figures_follow_the_first_calibration_sample(tmp_path):
    """hb_mapper prints its tables from the first calibration sample; a second sample 30x larger
    sets the thresholds (both sides) and dominates a pooled cosine, but not the compared figure."""
    from helpers import tiny_sample

    cfg = write_tiny_project(tmp_path / "p", n=2)
    (tiny_sample(1) * 30.0).tofile(cfg.parent / "cal" / "0001.bin")
    # a stand-in that agrees with the simulator: on the same terms, the figures are the same
    log = fake_hb_mapper(cfg, FAKE_HB_FACTOR="1", FAKE_HB_REFUSE="")
    comp = _import_json(log, cfg)
    assert comp["terms"] == ("tuner on the first calibration sample, hb cosine with eps 1e-5, "
                             "as hb_mapper computes its table")
    paired = [n for n in comp["nodes"] if n["real_cosine"] is not None and n["sim_cosine"] is not None]
    assert len(paired) >= 12
    for n in paired:          # the log prints 6 decimals
        assert n["sim_cosine"] == pytest.approx(n["real_cosine"], abs=1e-6), n["node"]
    assert abs(comp["summary"]["output_cosine_gap"]) < 1e-6
    for o in comp["outputs"]:
        for k in ("cosine", "l1", "l2", "chebyshev"):
            assert o[f"sim_{k}"] == pytest.approx(o[f"real_{k}"], rel=1e-6, abs=1e-6), (o["name"], k)
        # the first sample is quantized on the big sample's grid: far worse than the pooled figure
        assert o["sim_cosine_pooled"] - o["real_cosine"] > 0.03, o["name"]
    assert comp["pooled_samples"] == 2 and comp["pooled_data"] == "calibration data"
    assert comp["summary"]["sim_output_cosine_pooled"] > comp["summary"]["sim_output_cosine"] + 0.03


def _write_relu_project(root: Path) -> Path:
    """x [1,1,2,2] -> Relu -> Conv 1x1 (weight 1, exact in int8) -> y. Calibration sample 1 sets the
    threshold 0.127 (int8 step 0.001); sample 0 holds values of a few steps, so its vectors are tiny and
    hb_mapper's eps counts. (A Relu alone at the model output would leave the BPU in int16, hb's
    high-precision output, and take its input's group with it: no int8 step to see.)"""
    import numpy as np
    import onnx
    from helpers import hb_yaml
    from onnx import TensorProto, helper, numpy_helper

    (root / "cal").mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])
    relu = helper.make_node("Relu", ["x"], ["r"], name="/relu")
    conv = helper.make_node("Conv", ["r", "w"], ["y"], name="/conv")
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    model = helper.make_model(helper.make_graph([relu, conv], "relu", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(root / "relu.onnx"))
    np.array([0.0014, 0.0026, 0.0007, -0.001], np.float32).reshape(1, 1, 2, 2).tofile(root / "cal" / "0000.bin")
    np.array([0.127, 0.05, -0.1, 0.02], np.float32).reshape(1, 1, 2, 2).tofile(root / "cal" / "0001.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("relu.onnx", "x", "1x1x2x2", prefix="relu"))
    return cfg


def test_compared_cosine_is_hbs_eps_cosine_on_a_near_zero_tensor(tmp_path):
    import math

    cfg = _write_relu_project(tmp_path / "relu")
    log = fake_hb_mapper(cfg, FAKE_HB_FACTOR="1", FAKE_HB_REFUSE="")
    comp = _import_json(log, cfg)
    # first sample: float y = [0.0014, 0.0026, 0.0007, 0], quantized (step 0.001) [0.001, 0.003, 0.001, 0]
    dot, ff, qq = 9.9e-6, 9.21e-6, 11e-6
    hb = (dot + 1e-5) / (math.sqrt(ff * qq) + 1e-5)         # 0.991763
    plain = dot / math.sqrt(ff * qq)                          # 0.983579: what a plain cosine would compare
    (out,) = comp["outputs"]
    (node,) = [n for n in comp["nodes"] if n["node"] == "/relu"]
    assert out["real_cosine"] == pytest.approx(hb, abs=1e-6) and node["real_cosine"] == pytest.approx(hb, abs=1e-6)
    assert out["sim_cosine"] == pytest.approx(hb, abs=1e-6) and node["sim_cosine"] == pytest.approx(hb, abs=1e-6)
    assert abs(out["sim_cosine"] - plain) > 5e-3
    # L1 = mean |d| = 0.0011 / 4, L2 = |d| / n = sqrt(0.41e-6) / 4, Chebyshev = 0.0004
    assert out["sim_l1"] == pytest.approx(0.0011 / 4, rel=1e-4) and out["real_l1"] == pytest.approx(0.000275, abs=1e-6)
    assert out["sim_l2"] == pytest.approx(math.sqrt(0.41e-6) / 4, rel=1e-4)
    assert out["sim_chebyshev"] == pytest.approx(4e-4, rel=1e-4)
    # the pooled figure (both samples, plain cosine) is another, far better number
    assert out["sim_cosine_pooled"] > 0.9999


def test_a_pre_1_24_output_table_is_paired_with_the_model_outputs_by_their_nodes(tmp_path):
    """Before 1.24 the output table names the node computing each output; the comparison pairs
    those rows with the model's outputs (gap per output), and none is left as a log-only row."""
    cfg = write_tiny_project(tmp_path / "p")
    log = fake_hb_mapper(cfg, FAKE_HB_STYLE="old", FAKE_HB_FACTOR="1", FAKE_HB_REFUSE="")
    assert "Node                Cosine Similarity" in log.read_text()
    comp = _import_json(log, cfg)
    outs = {o["name"]: o for o in comp["outputs"]}
    assert set(outs) == {"seg", "depth"}
    assert outs["seg"]["real_row"] == "/head/seg/Conv" and outs["depth"]["real_row"] == "/head/depth/Mul"
    for o in outs.values():     # a stand-in that agrees with the simulator, on the same terms
        assert o["real_cosine"] == pytest.approx(o["sim_cosine"], abs=2e-6)
    assert comp["summary"]["output_cosine_gap"] == pytest.approx(0.0, abs=2e-6)
    r = cli("import-log", log, "--config", cfg, cwd=cfg.parent)
    assert r.returncode == 0 and "seg (log: /head/seg/Conv)" in r.stdout


def test_a_pre_1_24_log_alone_says_its_output_table_names_nodes(tmp_path):
    log = Path(__file__).with_name("real_logs") / "12_user_wuchao_yolov8_ultra_1.18.2.log"
    r = cli("import-log", log, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Node (of the output)" in r.stdout and "/model.22/Sigmoid " in r.stdout
