"""hb_mapper's *_calibrated_model.onnx: reader, real-threshold simulation, PC check, import-calibrated.

These build synthetic ones per docs/hb_rules/quantizer.md §4.1 (tests/calibrated_models.py) from the tests'
tiny model; test_calibrated_real.py reads the real toolchain's.
"""

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from calibrated_models import calibrate, weight_max
from cli import tuner
from helpers import build_tiny_model, tiny_sample, write_tiny_project
from onnx import TensorProto, helper

from tuner.calib.methods import hb_kernel_percentile as kernel_percentile
from tuner.errors import TunerError
from tuner.inputs.calibrated import parse_calibrated, read_calibrated
from tuner.inputs.calibrated_map import map_to_graph
from tuner.simulate.qdq import plan_scales
from tuner.toolchain.calibrated_report import CalibratedReport, build_report
from tuner.toolchain.calibrated_run import runnable_model
from tuner.workspace import Workspace


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    cfg = write_tiny_project(tmp_path_factory.mktemp("cal") / "p")
    ws = Workspace.open(cfg)
    cand = ws.base_candidate()
    return cfg, ws, ws.simulator.plan(cand), ws.simulator.scales(cand.calibration)


def own_max_model(ws, plan, scales) -> onnx.ModelProto:
    """A calibrated model whose thresholds are tuner's own max thresholds (activations and weights), on the
    graph hb's optimizer leaves (a real calibrated model's: BN folded, Where split), with the qtypes and
    shared thresholds of tuner's plan."""
    model = onnx.ModelProto()
    model.CopyFrom(ws.model.proto)
    dtypes = {t: d for t, d in list(plan.edges.values()) + list(plan.cpu_reads.values()) + list(plan.outputs.items())}
    scales = plan_scales(scales, plan)     # hb's fixed and derived thresholds (Sigmoid) as the plan has them
    acts = {t: {"thresholds": [scales.threshold(plan.scale_of.get(t, t), dtypes.get(t, "int8"))],
                "qtype": dtypes.get(t, "int8")} for t in plan.quantized_tensors()}
    weights = {(ws.graph.by_name[n].inputs[1], n): {"thresholds": weight_max(model, ws.graph.by_name[n].inputs[1])}
               for n in plan.weights}
    return calibrate(model, acts, weights, reads=set(plan.edges) | set(plan.cpu_reads))


def mixed_model(ws, scales) -> onnx.ModelProto:
    """Several qtypes, per-channel, switch OFF, an equalized Conv input with dequantize_scale."""
    model = build_tiny_model()
    ch = ws.stats["/stem/relu_out"].channel_absmax
    eq = {"thresholds": list(ch), "dequantize_scale": float(ch.max() / 127.0)}
    acts = {"x": {"thresholds": [scales.threshold("x")]},
            "/stem/relu_out": {"thresholds": [scales.threshold("/stem/relu_out")], "qtype": "uint8"},
            "/gate/Conv_out": {"thresholds": [scales.threshold("/gate/Conv_out")], "qtype": "int16"},
            "/gate/sig_out": {"thresholds": [1.0], "switch": "OFF"},
            "/head/cat_out": {"thresholds": [scales.threshold("/head/cat_out") * 0.9]}}
    m = calibrate(model, acts, equalized={("/stem/relu_out", "/res/Conv"): eq})
    # weight thresholds on the pre-scaled weight (docs/hb_rules/quantizer.md §1.5)
    scaled = weight_max(m, "/res/Conv.w")
    return calibrate(m, {}, weights={("/res/Conv.w", "/res/Conv"): {"thresholds": scaled}})


def test_reader_reads_every_attribute_and_ignores_unknown_ones(project, tmp_path):
    _, ws, _, scales = project
    cal = parse_calibrated(mixed_model(ws, scales), tmp_path / "m.onnx")
    by = {n.name: n for n in cal.nodes}
    assert by["/gate/Conv_out_HzCalibration"].qtype == "int16"
    assert by["/stem/relu_out_HzCalibration"].qtype == "uint8"
    assert not by["/gate/sig_out_HzCalibration"].on and not by["/gate/sig_out_HzCalibration"].quantizes
    eq = by["/stem/relu_out_/res/Conv_HzCalibration"]
    assert eq.kind == "activation" and eq.tensor == "/stem/relu_out" and eq.per_channel and len(eq.thresholds) == 8
    assert eq.dequantize_scale == pytest.approx(max(eq.thresholds) / 127.0, rel=1e-6)
    w = by["/res/Conv.w_/res/Conv_HzCalibration"]
    assert (w.kind, w.consumer, w.axis, len(w.thresholds)) == ("weight", "/res/Conv", 0, 8)
    mapped = map_to_graph(cal, ws.graph, build_tiny_model())
    assert set(mapped.activations["/stem/relu_out"]) == {by["/stem/relu_out_HzCalibration"], eq}
    assert mapped.weights["/res/Conv"] == w


def test_reader_errors_name_the_file_or_node(project, tmp_path):
    cfg, ws, _, scales = project
    plain = tmp_path / "plain.onnx"
    onnx.save(build_tiny_model(), str(plain))
    r = tuner("import-calibrated", str(plain), str(cfg))
    assert r.returncode == 2, r.stderr
    assert "no HzCalibration node" in r.stderr
    # a node whose tensor tuner cannot map
    m = calibrate(build_tiny_model(), {"x": {"thresholds": [50.0]}})
    m.graph.node[0].input[0] = "nowhere"
    m.graph.input.append(helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [1, 4, 16, 16]))
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    r = tuner("import-calibrated", str(bad), str(cfg), "--no-run")
    assert r.returncode == 2, r.stderr
    err = r.stderr
    assert "x_HzCalibration" in err and "'nowhere'" in err and "Traceback" not in err
    # a malformed attribute names the node
    m = calibrate(build_tiny_model(), {"x": {"thresholds": [float("nan")]}})
    with pytest.raises(TunerError, match="x_HzCalibration.*NaN"):
        parse_calibrated(m, tmp_path / "nan.onnx")
    m = calibrate(build_tiny_model(), {"x": {"thresholds": [1.0], "switch": "MAYBE"}})
    with pytest.raises(TunerError, match="x_HzCalibration.*switch"):
        parse_calibrated(m, tmp_path / "sw.onnx")


def test_eval_with_own_max_thresholds_reproduces_eval_max(project, tmp_path):
    cfg, ws, plan, scales = project
    path = tmp_path / "own_calibrated_model.onnx"
    onnx.save(own_max_model(ws, plan, scales), str(path))
    r = tuner("eval", str(cfg), "--json", "--no-nodes")
    assert r.returncode == 0, r.stderr
    ref = json.loads(r.stdout)
    r = tuner("eval", str(cfg), "--json", "--no-nodes", "--thresholds", str(path))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["calibration"]["type"] == "real"
    for out, m in ref["outputs"].items():
        assert got["outputs"][out]["cosine"] == pytest.approx(m["cosine"], abs=1e-6)
    assert got["mean_output_cosine"] == pytest.approx(ref["mean_output_cosine"], abs=1e-6)


def test_real_thresholds_change_the_simulation(project, tmp_path):
    cfg, ws, plan, scales = project
    path = tmp_path / "mixed_calibrated_model.onnx"
    onnx.save(mixed_model(ws, scales), str(path))
    from tuner.toolchain.calibrated_report import real_thresholds

    sim = Workspace.open(cfg).simulator
    base = sim.evaluate(ws.base_candidate())
    sim.use_thresholds(real_thresholds(ws, path))
    real = sim.evaluate(ws.base_candidate())
    rs = sim.scales(real.calibration)
    assert str(np.asarray(rs.get("/stem/relu_out", "int8").zero_point).dtype) == "uint8"
    assert str(np.asarray(rs.get("/gate/Conv_out", "int8").zero_point).dtype) == "int16"   # real qtype honoured
    eq = rs.get("/stem/relu_out", "int8", channel=True)
    assert eq.axis == 1 and eq.dequantize_scale == pytest.approx(float(ws.stats["/stem/relu_out"].channel_absmax.max()
                                                                       / 127.0), rel=1e-6)
    assert rs.get("/head/cat_out", "int8").threshold == pytest.approx(scales.threshold("/head/cat_out") * 0.9, rel=1e-6)
    assert real.mean_cosine != base.mean_cosine


def test_eval_with_thresholds_counts_the_calibrated_models_qtypes(project, tmp_path):
    """The summary's int16 count is the YAML's plan; the real qtypes, which are what is simulated,
    are counted beside it (the mixed model has one int16 and one uint8 tensor where the plan has int8)."""
    cfg, ws, plan, scales = project
    path = tmp_path / "mixed_calibrated_model.onnx"
    onnx.save(mixed_model(ws, scales), str(path))
    r = tuner("eval", str(cfg), "--no-nodes", "--thresholds", str(path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "0 int16 node(s)" in out
    line = next(x for x in out.splitlines() if x.startswith("hb_mapper's calibrated model quantizes"))
    assert "1 int16" in line and "1 uint8" in line
    r = tuner("eval", str(cfg), "--json", "--no-nodes", "--thresholds", str(path))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["real_qtypes"]["int16"] == 1 and got["real_qtypes"]["uint8"] == 1
    r = tuner("eval", str(cfg), "--json", "--no-nodes")
    assert r.returncode == 0, r.stderr
    assert "real_qtypes" not in json.loads(r.stdout)


def test_import_calibrated_table_differences_and_pc_check(project, tmp_path):
    cfg, ws, plan, scales = project
    path = tmp_path / "mixed_calibrated_model.onnx"
    onnx.save(mixed_model(ws, scales), str(path))
    r = tuner("import-calibrated", str(path), str(cfg))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "Threshold real" in text and "Closest tuner method" in text and "PC check" in text
    r = tuner("import-calibrated", str(path), str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    report = CalibratedReport.from_dict(d)
    assert report.as_dict() == d
    rows = {r.node: r for r in report.rows}
    assert rows["/head/cat_out_HzCalibration"].ratio == pytest.approx(0.9, rel=1e-5)
    assert rows["x_HzCalibration"].closest == "max"
    diff = {x.tensor: x for x in report.differences}
    assert diff["/gate/Conv_out"].real == "int16" and diff["/gate/Conv_out"].tuner == "int8"
    assert diff["/gate/sig_out"].real == "float"                  # switch OFF
    assert diff["/stem/relu_out"].real == "uint8"
    assert diff["/res/relu_out"].real == "--"                     # tuner quantizes it, hb has no node
    assert any("(/stem/Conv)" in t for t in diff)                 # a weight tuner quantizes, hb does not
    pc = report.pc_check
    assert pc.samples == 8 and pc.switched_off_cosine == pytest.approx(1.0, abs=1e-6)
    assert pc.identities == 1 and pc.replaced == len(rows) - 1
    assert 0.9 < pc.mean_cosine < 1.0


def test_plan_differences_where_hb_quantizes_what_tuner_does_not(project, tmp_path):
    """A tensor tuner leaves float (the residual Add before its fused Relu) and a weight tuner does not
    quantize (the constant of the Mul tuner lowers to a 1x1 Conv) both calibrated by hb_mapper."""
    cfg, ws, plan, scales = project
    assert "/res/add_out" not in plan.quantized_tensors() and "/head/depth/Mul" not in plan.weights
    m = calibrate(build_tiny_model(), {"x": {"thresholds": [50.0]}, "/res/add_out": {"thresholds": [30.0]}},
                  weights={("/head/depth/mul_k", "/head/depth/Mul"): {"thresholds": [2.0]}})
    report = build_report(ws, parse_calibrated(m, tmp_path / "m.onnx"), run_pc=False, reading=False)
    diff = {x.tensor: x for x in report.differences}
    assert (diff["/res/add_out"].real, diff["/res/add_out"].tuner) == ("int8", "float")
    assert diff["/res/add_out"].what == "hb_mapper quantizes it; tuner does not"
    w = diff["/head/depth/mul_k (/head/depth/Mul)"]
    assert (w.real, w.tuner) == ("int8", "float") and "tuner keeps it float" in w.what
    assert "x" not in diff                                          # the same on both sides
    text = report.text()
    assert "hb_mapper quantizes it; tuner does not" in text


def test_calibrated_model_of_another_width_is_an_error_naming_the_node(project, tmp_path):
    """Same tensor names, other channel counts (e.g. the calibrated model of another model size):
    exit 2 naming the node, before the simulation or the PC check would fail on the shapes."""
    cfg, ws, _, scales = project
    for node, keep in (("/stem/relu_out_/res/Conv_HzCalibration", 4), ("/res/Conv.w_/res/Conv_HzCalibration", 5)):
        m = mixed_model(ws, scales)
        attr = next(a for n in m.graph.node if n.name == node for a in n.attribute if a.name == "thresholds")
        vals = list(attr.floats)[:keep]
        del attr.floats[:]
        attr.floats.extend(vals)
        path = tmp_path / "other_calibrated_model.onnx"
        onnx.save(m, str(path))
        for argv in (["eval", str(cfg), "--no-nodes", "--thresholds", str(path)], ["import-calibrated", str(path),
                                                                                     str(cfg)]):
            r = tuner(*argv)
            assert r.returncode == 2
            err = r.stderr
            assert node in err and f"{keep} per-channel thresholds" in err and "Traceback" not in err


def test_conv_transpose_weight_thresholds_must_be_one_per_output_channel(tmp_path):
    """A grouped ConvTranspose weight [Cin, Cout/g, k, k] has g * Cout/g output channels
    (docs/hb_rules/quantizer.md §1.7): that many thresholds map; another count is an error naming the
    node, not a silent fallback to tuner's max |w|."""
    from tuner.graph import Graph

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 2, 2], np.linspace(-1, 1, 48).astype(np.float32))
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="/up", strides=[2, 2], group=2)
    model = helper.make_model(helper.make_graph([node], "deconv", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 13)])
    graph = Graph(onnx.shape_inference.infer_shapes(model))
    for count, ok in ((6, True), (3, False), (4, False)):
        m = calibrate(model, {"x": {"thresholds": [1.0]}}, weights={("w", "/up"): {"thresholds": [0.5] * count}})
        cal = parse_calibrated(m, tmp_path / "deconv_calibrated_model.onnx")
        if ok:
            assert map_to_graph(cal, graph).weights["/up"].thresholds == (0.5,) * count
        else:
            with pytest.raises(TunerError, match=rf"w_/up_HzCalibration.*{count} per-channel weight thresholds.*"
                                                 "has 6 output channels"):
                map_to_graph(cal, graph)


def test_calibrated_model_of_another_model_and_missing_files_exit_2(project, tmp_path):
    cfg, *_ = project
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 16, 16])
    w = onnx.numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "conv.weight")
    g = helper.make_graph([helper.make_node("Conv", ["x", "conv.weight"], ["conv_out"], name="conv"),
                           helper.make_node("Relu", ["conv_out"], ["out"], name="relu")], "other", [x], [y], [w])
    other = calibrate(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
                      {"x": {"thresholds": [3.0]}, "conv_out": {"thresholds": [2.0]}})
    path = tmp_path / "other_calibrated_model.onnx"
    onnx.save(other, str(path))
    for argv in (["import-calibrated", str(path), str(cfg)], ["eval", str(cfg), "--thresholds", str(path)]):
        r = tuner(*argv)
        assert r.returncode == 2
        err = r.stderr
        assert "conv_out_HzCalibration" in err and "calibrated model of this YAML's onnx_model" in err
    missing = tmp_path / "nowhere_calibrated_model.onnx"
    for argv in (["import-calibrated", str(missing), str(cfg)], ["eval", str(cfg), "--thresholds", str(missing)]):
        r = tuner(*argv)
        assert r.returncode == 2 and "no such file" in r.stderr
    r = tuner("import-calibrated", str(path), str(tmp_path / "none.yaml"))
    assert r.returncode == 2, r.stderr
    assert "none.yaml" in r.stderr
    r = tuner("import-calibrated", str(path), str(cfg), "--march", "nonsense")
    assert r.returncode == 2, r.stderr
    assert "march 'nonsense'" in r.stderr


def test_pc_runner_honours_dequantize_scale_and_qtypes(project, tmp_path):
    """The runnable model computes exactly docs/hb_rules/quantizer.md §4.2's fake quantization, checked with numpy."""
    _, ws, _, scales = project
    cal = parse_calibrated(mixed_model(ws, scales), tmp_path / "m.onnx")
    exposed = ["/stem/relu_out_/res/Conv_HzCalibration_out", "/stem/relu_out", "/gate/Conv_out",
               "/gate/Conv_out_HzCalibration_out", "/gate/sig_out", "/gate/sig_out_HzCalibration_out",
               "/stem/relu_out_HzCalibration_out"]
    for fused in (False, True):
        m = runnable_model(cal, fused=fused)
        if fused and not any(n.op_type == "FakeQuant" for n in m.graph.node):
            continue
        for t in exposed:
            m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
        from tuner.runtime.session import make_session

        sess = make_session(m)
        vals = dict(zip(exposed, sess.run(exposed, {"x": tiny_sample(0)})))
        by = {n.name: n for n in cal.nodes}
        eq = by["/stem/relu_out_/res/Conv_HzCalibration"]
        s = (np.array(eq.thresholds, np.float32) / 127).astype(np.float32).reshape(1, -1, 1, 1)
        q = np.clip(np.round(vals["/stem/relu_out"] / s), -128, 127)
        np.testing.assert_allclose(vals[exposed[0]], q * np.float32(eq.dequantize_scale), rtol=1e-6)
        t16 = by["/gate/Conv_out_HzCalibration"].thresholds[0]
        s16 = np.float32(t16 / 32767)
        np.testing.assert_allclose(vals[exposed[3]], np.clip(np.round(vals["/gate/Conv_out"] / s16), -32768, 32767)
                                   * s16, rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(vals[exposed[5]], vals["/gate/sig_out"])    # switch OFF
        s8 = np.float32(by["/stem/relu_out_HzCalibration"].thresholds[0] / 255)   # uint8: [0, 255], zero point 0
        np.testing.assert_allclose(vals[exposed[6]], np.clip(np.round(vals["/stem/relu_out"] / s8), 0, 255) * s8,
                                   rtol=1e-6, atol=1e-7)


def test_asymmetric_uint8_float16_and_tensor_valued_thresholds(tmp_path):
    """docs/hb_rules/quantizer.md §4.1-4.2 forms the tiny model does not hold: uint8 [min, max] (zero point from
    min), a float16 node (a round trip through float16), thresholds written as a tensor attribute."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3]) for n in ("a", "h", "t")]
    nodes = [helper.make_node("HzCalibration", ["x"], ["a"], name="a_HzCalibration", domain="horizon",
                              thresholds=[-2.0, 6.0], qtype="uint8", quant_attrs=7),
             helper.make_node("HzCalibration", ["x"], ["h"], name="h_HzCalibration", domain="horizon",
                              thresholds=[1.0], qtype="float16"),
             helper.make_node("HzCalibration", ["x"], ["t"], name="t_HzCalibration", domain="horizon",
                              thresholds=onnx.numpy_helper.from_array(np.array([4.0], np.float32)), qtype="INT8")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], outs),
                          opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("horizon", 1)])
    cal = parse_calibrated(m, tmp_path / "a.onnx")
    by = {n.name: n for n in cal.nodes}
    assert by["a_HzCalibration"].asymmetric and not by["h_HzCalibration"].quantizes
    assert by["t_HzCalibration"].thresholds == (4.0,) and by["t_HzCalibration"].qtype == "int8"
    v = np.linspace(-3, 7, 6, dtype=np.float32).reshape(1, 2, 3)
    run = runnable_model(cal, fused=False)
    a, h, t = ort.InferenceSession(run.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": v})
    s, zp = np.float32(8.0 / 255), round(2.0 / (8.0 / 255))
    np.testing.assert_allclose(a, (np.clip(np.round(v / s) + zp, 0, 255) - zp) * s, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(h, v.astype(np.float16).astype(np.float32))
    s4 = np.float32(4.0 / 127)
    np.testing.assert_allclose(t, np.clip(np.round(v / s4), -128, 127) * s4, rtol=1e-6)


def test_fused_activation_stand_ins_and_unknown_horizon_op(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])
    for kind, ref in (("HzSwish", lambda v: v / (1 + np.exp(-v))),
                      ("HzGelu", lambda v: 0.5 * v * (1 + np.vectorize(__import__("math").erf)(v / np.sqrt(2)))),
                      ("HzMish", lambda v: v * np.tanh(np.log1p(np.exp(v)))),
                      ("HzHardSwish", lambda v: v * np.clip(v / 6 + 0.5, 0, 1))):
        nodes = [helper.make_node("HzCalibration", ["x"], ["xq"], name="x_HzCalibration", domain="horizon",
                                  thresholds=[4.0], qtype="int16"),
                 helper.make_node(kind, ["xq"], ["y"], name="/act", domain="horizon")]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("horizon", 1)])
        run = runnable_model(parse_calibrated(m, tmp_path / "a.onnx"), fused=False)
        v = np.linspace(-3, 3, 6, dtype=np.float32).reshape(1, 2, 3)
        got = ort.InferenceSession(run.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": v})[0]
        np.testing.assert_allclose(got, ref(v), atol=1e-3)
    nodes[1] = helper.make_node("HzFilter", ["xq"], ["y"], name="/filter", domain="horizon")
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("horizon", 1)])
    with pytest.raises(TunerError, match="'/filter' \\(HzFilter"):
        runnable_model(parse_calibrated(m, tmp_path / "f.onnx"), fused=False)


def kernel_thresholds(model, data, tensors, p):
    """hmct's max-percentile kernel computed directly (an independent reference for tuner.calib's
    histogram-based one): the k-th largest |x| over every value of every sample, k = n - ceil(p' n) + 1
    for n values per sample (docs/hb_rules/calibration.md 2)."""
    from tuner.runtime.session import make_session, run_samples, with_outputs

    session = make_session(with_outputs(model.proto, tensors))
    names = [o.name for o in session.get_outputs() if o.name in set(tensors)]
    pooled: dict[str, list] = {}
    for sample, outs in run_samples(session, names, data, None, with_inputs=True):
        values = dict(zip(names, outs))
        values.update({k: v for k, v in sample.items() if k in set(tensors)})
        for t, v in values.items():
            pooled.setdefault(t, []).append(np.abs(np.asarray(v, np.float32)))
    n_samples = len(next(iter(pooled.values())))
    q = kernel_percentile(p, n_samples)
    out = {}
    for t, v in pooled.items():
        n = v[0].size
        k = n - math.ceil(float(np.float32(q)) * n) + 1
        out[t] = float(np.sort(np.concatenate([a.ravel() for a in v]))[-k])
    return out, q, n_samples


def pooled_thresholds(model, data, tensors, p):
    """The pooled reading computed directly: the p-quantile of |x| over every value of every sample."""
    from tuner.runtime.session import make_session, run_samples, with_outputs

    session = make_session(with_outputs(model.proto, tensors))
    names = [o.name for o in session.get_outputs() if o.name in set(tensors)]
    pooled: dict[str, list] = {}
    for sample, outs in run_samples(session, names, data, None, with_inputs=True):
        values = dict(zip(names, outs))
        values.update({k: v for k, v in sample.items() if k in set(tensors)})
        for t, v in values.items():
            pooled.setdefault(t, []).append(np.abs(np.asarray(v, np.float32)).ravel())
    return {t: float(np.quantile(np.concatenate(v), p)) for t, v in pooled.items()}


def hb_like_graph() -> onnx.ModelProto:
    """The tiny model as hb's optimizer leaves it where that matters to a calibrated model's tensors (its BN
    folded into the stem Conv, its Where split into Cast/Equal/Cast + Mul/Mul/Add), in plain ONNX ops."""
    from tuner.graph.convfold import fold_into_convs
    from tuner.graph.lower import split_where
    from tuner.graph.names import NameMap

    model = onnx.shape_inference.infer_shapes(build_tiny_model())
    names = NameMap()
    fold_into_convs(model, names)
    split_where(model, names)
    return model


def test_percentile_reading_names_the_supported_reading(tmp_path):
    """Thresholds made with the kernel's rule are recognised as such, per tensor and overall."""

    cfg = write_tiny_project(tmp_path / "p")
    cfg.write_text(cfg.read_text().replace("per_channel: False", "per_channel: False\n  max_percentile: 0.999"))
    ws = Workspace.open(cfg)
    plan = ws.simulator.plan(ws.base_candidate())
    tensors = sorted(plan.quantized_tensors())
    kernel, q, n = kernel_thresholds(ws.model, ws.calibration_data, tensors, 0.999)
    assert q == pytest.approx(kernel_percentile(0.999, 8)) and q == pytest.approx(0.992) and n == 8
    path = tmp_path / "pct_calibrated_model.onnx"
    hb_graph = hb_like_graph()
    onnx.save(calibrate(hb_graph, {t: {"thresholds": [kernel[t]]} for t in tensors}), str(path))
    report = build_report(ws, read_calibrated(path), run_pc=False)
    p = report.percentile
    assert p is not None and p.kernel_percentile == pytest.approx(0.992)
    assert p.verdict == "kernel" and p.kernel_wins > p.pooled_wins
    # the table's max-percentile method is the one tuner simulates (tuner's own threshold for this YAML)
    for r in report.rows:
        assert r.methods["max-percentile 0.999"] == pytest.approx(r.tuner, rel=1e-9), r.tensor
    r = tuner("import-calibrated", str(path), str(cfg))
    assert r.returncode == 0, r.stderr
    assert "the thresholds support the kernel's k-th largest" in r.stdout
    # thresholds made with the other reading are recognised as that one
    pooled = pooled_thresholds(ws.model, ws.calibration_data, tensors, 0.999)
    onnx.save(calibrate(hb_graph, {t: {"thresholds": [pooled[t]]} for t in tensors}), str(path))
    p = build_report(ws, read_calibrated(path), run_pc=False).percentile
    assert p is not None and p.verdict == "pooled" and p.pooled_wins > p.kernel_wins
    r = tuner("import-calibrated", str(path), str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["percentile"]["verdict"] == "pooled"


def test_search_space_thresholds_key(tmp_path, project):
    from helpers import write_tiny_space

    from tuner.study.space import load_space

    _, ws, plan, scales = project
    space_path = without_calibration_lists(write_tiny_space(tmp_path))
    onnx.save(own_max_model(ws, plan, scales), str(tmp_path / "tiny_calibrated_model.onnx"))
    text = space_path.read_text()
    space_path.write_text(text + "thresholds: tiny_calibrated_model.onnx\n")
    space = load_space(space_path)
    assert space.thresholds == (tmp_path / "tiny_calibrated_model.onnx").resolve()
    sws = Workspace.for_space(space)
    ev = sws.simulator.evaluate(sws.base_candidate())
    assert ev.calibration.type == "real" and not ev.calibration.honour_qtypes
    space_path.write_text(text + "thresholds: missing.onnx\n")
    with pytest.raises(TunerError, match="thresholds: 'missing.onnx' not found"):
        load_space(space_path)


def test_a_search_with_the_thresholds_key_simulates_every_trial_with_the_real_thresholds(tmp_path, project):
    """A real (small) search: every trial is simulated with hb_mapper's thresholds, so the all-int8
    baseline trial scores what the space's workspace scores with them, not tuner's own max."""
    import csv

    from helpers import write_tiny_space

    from tuner.study.space import load_space

    _, ws, _, scales = project
    space_path = without_calibration_lists(write_tiny_space(tmp_path))
    onnx.save(mixed_model(ws, scales), str(tmp_path / "tiny_calibrated_model.onnx"))
    space_path.write_text(space_path.read_text() + "thresholds: tiny_calibrated_model.onnx\n")
    results = tmp_path / "results"
    r = tuner("search", str(space_path), "--n-trials", "4", "--threads", "1", "--results-dir", str(results))
    assert r.returncode == 0, r.stderr
    with open(results / "tiny" / "trials.csv") as f:
        trials = list(csv.DictReader(f))
    assert len(trials) >= 4 and all(t["calibration"].startswith("real thresholds") for t in trials)
    sws = Workspace.for_space(load_space(space_path))
    base = sws.base_candidate()
    real = sws.simulator.evaluate(base, per_node=False).mean_cosine
    own = Workspace.open(load_space(space_path).base).simulator.evaluate(base, per_node=False).mean_cosine
    first = next(t for t in trials if t["plan"] == "baseline: all-BPU int8, max")
    assert float(first["accuracy"]) == pytest.approx(real, abs=1e-6) and abs(real - own) > 1e-5
    best = (results / "tiny" / "best.yaml").read_text()
    assert "real thresholds" in best
    # the calibration is the base YAML's (max), the one the calibrated model came from: not searched
    assert yaml.safe_load(best)["calibration_parameters"]["calibration_type"] == "max"
    assert all(t["calibration"] == trials[0]["calibration"] for t in trials)


def without_calibration_lists(space_path):
    """The tiny space without its calibration lists (a thresholds: space searches none)."""
    text = space_path.read_text()
    start = text.index("calibration:\n")
    end = text.index("objectives:")
    space_path.write_text(text[:start] + text[end:])
    return space_path


def test_thresholds_pin_the_calibration_to_the_base_yamls(tmp_path, project):
    """The calibrated model's thresholds come from one calibration: a space with thresholds: does
    not search calibration_type (a kl trial would be scored with max's thresholds and export a YAML
    that makes hb_mapper compute others), and a space that lists calibration values with it is refused."""
    from helpers import write_tiny_space

    from tuner.study.space import load_space

    _, ws, plan, scales = project
    listed = write_tiny_space(tmp_path)
    onnx.save(own_max_model(ws, plan, scales), str(tmp_path / "tiny_calibrated_model.onnx"))
    listed.write_text(listed.read_text() + "thresholds: tiny_calibrated_model.onnx\n")
    with pytest.raises(TunerError, match=r"thresholds: and calibration.calibration_type: \['max', 'kl'\] contradict"):
        load_space(listed)
    r = tuner("search", str(listed), "--n-trials", "1", "--results-dir", str(tmp_path / "r"))
    assert r.returncode == 2, r.stderr
    err = r.stderr
    assert "contradict" in err and "Traceback" not in err and not (tmp_path / "r").exists()
    space = load_space(without_calibration_lists(listed))
    assert space.knobs.free() == {} and space.knobs.calibration_type == ("max",)
    assert space.raw["calibration"]["calibration_type"] == ["max"]

