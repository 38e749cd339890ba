"""The real toolchain's *_calibrated_model.onnx read by import-calibrated and eval --thresholds.

The files are made here by the real hb_mapper (fixture ``hb_toolchain``: skipped without it) from
the bundled example at O0: the YAML's ``max`` and the same with two nodes on the CPU (two
conversions of ~20 s each, kept between runs by content). Measured on the example's 32 samples
(docs/calibrated.md, "Checked against real files"): tuner's simulation with the real thresholds is within 0.0004
output cosine (to float) of the real calibrated model run by hmct's executor, and within 0.9998
cosine of its outputs directly, on max, kl, default, set_all_nodes_int16, per_channel and
node_info variants.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import yaml
from cli import tuner
from helpers import write_example_project

from tuner.inputs.realmatch import load_thresholds
from tuner.metrics import Similarity
from tuner.toolchain.hbexec import run_models
from tuner.toolchain.hbrun import CompileKnobs, convert
from tuner.toolchain.realrun import measure
from tuner.workspace import Workspace

#: |cosine to float| of tuner's simulation minus the real calibrated model's (measured <= 0.0004)
COSINE_TOL = 0.001
#: cosine between tuner's simulated outputs and the real calibrated model's (measured >= 0.9998)
DIRECT_MIN = 0.999
CPU_NODES = {"/Mul_1": {"ON": "CPU"}, "/dec1/conv/Conv": {"ON": "CPU"}}


@pytest.fixture(scope="module")
def runs(hb_toolchain, tmp_path_factory):
    root = tmp_path_factory.mktemp("realcal")
    cfg = write_example_project(root / "ex", n_cal=12, n_eval=4)
    raw = yaml.safe_load(cfg.read_text())
    raw["model_parameters"]["node_info"] = CPU_NODES
    cpu = cfg.with_name("hb_config_cpu.yaml")
    cpu.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = {}
    for name, path in (("max", cfg), ("cpu", cpu)):
        conv = convert(hb_toolchain, path, CompileKnobs(optimize_level="O0"))
        assert conv.ok, conv.error
        out[name] = (path, conv)
    return out


def _agreement(tc, cfg, conv, calibrated=None):
    """(tuner's figures with the real thresholds, the real calibrated model's, their direct cosine)."""
    path = calibrated or conv.model("calibrated")
    ws = Workspace.open(cfg)
    ws.real_thresholds = load_thresholds(path, ws.graph, ws.model.path, ws.model.proto, ws.first_sample())
    sim = ws.simulator
    cand = ws.base_candidate()
    ev = sim.evaluate(cand)
    real = run_models(tc, [path], [dict(s) for s in sim.data])[0]
    figures, _, _ = sim.score(real)
    names = ws.model.output_names
    direct = {o: Similarity() for o in names}
    for sample, got in zip(sim.data, real):
        mine, _ = sim.tensors(cand, names, sample)
        for o in names:
            direct[o].update(np.asarray(got[o], np.float32).reshape(mine[o].shape), mine[o])
    return ws, ev, figures, {o: s.cosine for o, s in direct.items()}


def test_import_calibrated_reads_the_real_file(runs):
    cfg, conv = runs["max"]
    r = tuner("import-calibrated", str(conv.model("calibrated")), str(cfg), "--no-run", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    not_compared = {u["node"]: u["reason"] for u in got["unmapped"]}
    # hb_mapper's Where split (Cast/Equal/Cast and Mul/Mul/Add): tuner's graph splits it the same way now
    assert "/Where_cast_output_HzCalibration" not in not_compared
    rows = {r["tensor"]: r for r in got["rows"]}
    assert "/Where_cast_output" in rows
    # the model output's node (depth_before -> depth_before_HzCalibration -> depth) maps to the output
    assert rows["depth"]["node"] == "depth_before_HzCalibration" and rows["depth"]["qtype"] == "int16"
    diff = {d["tensor"]: d for d in got["differences"]}
    assert "depth" not in diff     # tuner rounds the model output in int16 too (a tensor no BPU node reads)
    assert diff["/Slice_1_output_0"]["real"] == "int8"          # hb rounds the Slice outputs, tuner passes through
    assert got["nodes"] == len(got["rows"]) + len(got["unmapped"])


def test_eval_thresholds_reproduces_the_real_calibrated_model(hb_toolchain, runs):
    cfg, conv = runs["max"]
    ws, ev, real, direct = _agreement(hb_toolchain, cfg, conv)
    for o, m in real.items():
        assert abs(ev.outputs[o]["cosine"] - m["cosine"]) < COSINE_TOL, (o, ev.outputs[o]["cosine"], m["cosine"])
        assert direct[o] > DIRECT_MIN, (o, direct[o])
    # the CLI says the same (and the real model's figures are those realrun measures)
    r = tuner("eval", str(cfg), "--no-nodes", "--json", "--thresholds", str(conv.model("calibrated")))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    rr = measure(hb_toolchain, conv, ws.simulator, str(cfg), "cal", models=("calibrated",))
    for o, m in rr.calibrated.outputs.items():
        assert abs(got["outputs"][o]["cosine"] - m["cosine"]) < COSINE_TOL


def test_tensors_the_real_model_leaves_float_stay_float(hb_toolchain, runs):
    """With two nodes on the CPU, hb_mapper rounds neither the CPU Conv's input (its Concat moves to the CPU
    with it) nor the CPU Mul's first input (a Conv+Clip group's int32 accumulator): with the file they stay
    float, tuner's own plan leaves them unrounded as well, and the simulation reproduces the real
    calibrated model."""
    cfg, conv = runs["cpu"]
    ws, ev, real, direct = _agreement(hb_toolchain, cfg, conv)
    own = ws.simulator.plan(ws.base_candidate())
    assert own.placement["/Concat_4"] == "CPU" and own.out_dtype["/stem/act/Clip"] == "int32"
    for t in ("/Concat_4_output_0", "/stem/act/Clip_output_0"):
        assert ws.real_thresholds.leaves_float(t)
        assert t not in own.quantized_tensors() and t not in ev.plan.quantized_tensors()
    for o, m in real.items():
        assert abs(ev.outputs[o]["cosine"] - m["cosine"]) < COSINE_TOL
        assert direct[o] > DIRECT_MIN


def test_a_switched_off_node_is_float(hb_toolchain, runs, tmp_path):
    """The real file with one node switched OFF (hmct's executor passes the tensor through): tuner
    leaves that tensor float and still reproduces the file's outputs."""
    cfg, conv = runs["max"]
    m = onnx.load(str(conv.model("calibrated")))
    node = next(n for n in m.graph.node if n.name == "/Mul_4_output_0_HzCalibration")
    attr = next(a for a in node.attribute if a.name == "switch")
    attr.s = b"OFF"
    path = tmp_path / "segdepth_calibrated_model.onnx"
    onnx.save(m, str(path))
    ws, ev, real, direct = _agreement(hb_toolchain, cfg, conv, calibrated=path)
    assert ws.real_thresholds.leaves_float("/Mul_4_output_0")
    assert "/Mul_4_output_0" not in ev.plan.quantized_tensors()
    for o, fig in real.items():
        assert abs(ev.outputs[o]["cosine"] - fig["cosine"]) < COSINE_TOL
        assert direct[o] > DIRECT_MIN
