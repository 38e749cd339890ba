"""tuner import-log against a stand-in hb_mapper (tests/toolchain/fake_hb_mapper.py) run as a real process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import write_tiny_project

FAKE = Path(__file__).with_name("fake_hb_mapper.py")
NODE_INFO = "{'/gate/Sigmoid': {'InputType': 'int16', 'OutputType': 'int16'}, '/res/Add': {'OutputType': 'int16'}}"


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


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
    assert "HZ_PREPROCESS_FOR_x" in comp["log_only"] and nodes["/gate/Where"]["real_on"] == "CPU"
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
