"""The graph hb_mapper calibrates (tuner.graph.optimize): rewrites, names, and what the plan sees."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.graph.optimize import optimize
from tuner.simulate.plan import make_plan

SHAPE = [1, 4, 8, 8]


def _conv(name, x, out, rng, cin=4, cout=4):
    w = numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32), f"{name}.w")
    return helper.make_node("Conv", [x, w.name], [out], name=name, pads=[1] * 4), w


def _model(nodes, inits, outputs=("y",), opset=11):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return onnx.shape_inference.infer_shapes(model)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _run(model, x):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _same_function(a, b):
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32) * 4
    for u, v in zip(_run(a, x), _run(b, x)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def target():
    return load_target("bayes-e")


def identity_chain():
    """PP-OCR exports put Identity nodes between convolutions."""
    rng = np.random.default_rng(0)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "a_id", "b", rng)
    c3, w3 = _conv("/c3", "b_id", "y", rng)
    nodes = [c1, helper.make_node("Identity", ["a"], ["a_id"], name="/id1"), c2,
             helper.make_node("Identity", ["b"], ["b_id"], name="/id2"), c3]
    return _model(nodes, [w1, w2, w3])


def test_identities_are_removed_and_the_all_bpu_plan_is_one_subgraph(target):
    before = identity_chain()
    as_exported = make_plan(Graph(before), target, Candidate.make())
    assert as_exported.n_subgraphs == 3 and len(as_exported.cpu_nodes) == 2   # what tuner did before

    model, names = optimize(before)
    graph = Graph(model, names)
    assert [n.op_type for n in graph] == ["Conv", "Conv", "Conv"]
    plan = make_plan(graph, target, Candidate.make())
    assert plan.n_subgraphs == 1 and plan.cpu_nodes == []
    _same_function(before, model)


def test_node_info_on_a_removed_node_is_a_note_not_an_error(target):
    model, names = optimize(identity_chain())
    graph = Graph(model, names)
    plan = make_plan(graph, target, Candidate.make(nodes={"/id1": {"ON": "CPU"}}))
    assert plan.cpu_nodes == []
    assert any("'/id1'" in n and "Identity removed" in n and "no effect" in n for n in plan.notes)
    with pytest.raises(TunerError, match="not in the graph hb_mapper calibrates: Identity removed"):
        graph.node("/id1")
    with pytest.raises(TunerError, match="is not in the model"):
        graph.node("/nope")


def test_an_identity_writing_a_graph_output_hands_the_name_to_its_producer():
    rng = np.random.default_rng(0)
    c1, w1 = _conv("/c1", "x", "a", rng)
    before = _model([c1, helper.make_node("Identity", ["a"], ["y"], name="/out_id")], [w1])
    model, names = optimize(before)
    assert [n.name for n in model.graph.node] == ["/c1"] and list(model.graph.node[0].output) == ["y"]
    _same_function(before, model)


def silu_model():
    rng = np.random.default_rng(1)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "s", "y", rng)
    nodes = [c1, helper.make_node("Sigmoid", ["a"], ["sig"], name="/act/Sigmoid"),
             helper.make_node("Mul", ["a", "sig"], ["s"], name="/act/Mul"), c2]
    return _model(nodes, [w1, w2])


def test_silu_is_one_lut_named_after_its_mul_and_quantized_once_in_and_out(target):
    before = silu_model()
    plain = make_plan(Graph(before), target, Candidate.make())
    model, names = optimize(before)
    graph = Graph(model, names)
    assert [(n.name, n.op_type) for n in graph] == [("/c1", "Conv"), ("/act/Mul", "HzSwish"), ("/c2", "Conv")]
    plan = make_plan(graph, target, Candidate.make())
    # One quantization point on x (the LUT's input) and one on its output; the exported graph had
    # a third one, on sigmoid(x) at the Mul's input.
    assert sorted(t for t, _ in plan.edges.values()) == ["a", "s", "x"]
    assert "sig" in {t for t, _ in plain.edges.values()}
    _same_function(before, model)


def test_node_info_on_a_member_of_a_fused_region_does_not_place_it(target):
    """hb places a fused activation by its own name (the Mul): ON: CPU on its Sigmoid leaves it on the BPU
    (toy silu, sig ON CPU: no CPU node; docs/hb_rules/placement.md section 8), and ON: CPU on the Mul is refused."""
    model, names = optimize(silu_model())
    graph = Graph(model, names)
    plan = make_plan(graph, target, Candidate.make(nodes={"/act/Sigmoid": {"ON": "CPU"}}))
    assert plan.cpu_nodes == []
    assert any("fused into HzSwish" in n and "no effect" in n for n in plan.notes)
    with pytest.raises(TunerError, match="HorizonRT not support these cpu operators: HzSwish"):
        make_plan(graph, target, Candidate.make(nodes={"/act/Mul": {"ON": "CPU"}}))


def test_sigmoid_times_a_constant_is_no_silu():
    rng = np.random.default_rng(2)
    c1, w1 = _conv("/c1", "x", "a", rng)
    before = _model([c1, helper.make_node("Sigmoid", ["a"], ["sig"], name="/Sigmoid"),
                     helper.make_node("Mul", ["sig", "k"], ["y"], name="/Mul")], [w1, _const("k", [80.0])])
    model, _ = optimize(before)
    assert [n.op_type for n in Graph(model)] == ["Conv", "Sigmoid", "HzChannelScale"]


def test_hardswish_as_paddle_exports_it_is_one_lut():
    """x * clip(x + 3, 0, 6) / 6 behind an affine Add, as in PP-OCRv4's detector. The Add of a per-channel
    constant read by the Conv alone becomes the Conv's bias, as hb's optimizer folds it."""
    rng = np.random.default_rng(4)
    c1, w1 = _conv("/c1", "x", "a", rng)
    nodes = [c1, helper.make_node("Add", ["a", "b"], ["a2"], name="/affine"),
             helper.make_node("Add", ["a2", "three"], ["p"], name="/hs/Add"),
             helper.make_node("Clip", ["p", "zero", "six"], ["c"], name="/hs/Clip"),
             helper.make_node("Mul", ["a2", "c"], ["m"], name="/hs/Mul"),
             helper.make_node("Div", ["m", "six"], ["y"], name="/hs/Div")]
    inits = [w1, _const("b", np.full((1, 4, 1, 1), 0.1)), _const("three", 3.0), _const("zero", 0.0), _const("six", 6.0)]
    before = _model(nodes, inits)
    model, names = optimize(before)
    # hb names it after the x * clip(...) Mul, not the Div by 6 (toy model F8, hb_mapper 1.24.3:
    # ``HzHardSwish hs_mul``; PP-OCRv4: ``HzHardSwish p2o.Mul.2``)
    assert [(n.name, n.op_type) for n in Graph(model)] == [("/c1", "Conv"), ("/hs/Mul", "HzHardSwish")]
    assert "folded into /c1" in names.rewrites["/affine"].reason
    assert names.translate((("/hs/Div", {"OutputType": "int16"}),), {"/c1", "/hs/Mul"})[0] == \
        {"/hs/Mul": {"OutputType": "int16"}}
    _same_function(before, model)


def _conv1(name, x, out, rng, cin=4, cout=4, k=1, pads=0, group=1):
    w = numpy_helper.from_array((rng.standard_normal((cout, cin // group, k, k)) * 0.3).astype(np.float32), f"{name}.w")
    return helper.make_node("Conv", [x, w.name], [out], name=name, pads=[pads] * 4, group=group), w


def test_scale_and_shift_after_a_conv_fold_into_it_as_hb_folds_them():
    """hb's optimizer folds Mul, Div, Add, Sub by constants and BN read from a Conv alone into the Conv
    (toy models E9, E12, F5, F6, F10 on hb_mapper 1.24.3; PP-OCRv4's ``Conv -> Mul(k) -> Add(b)``): one
    Conv writing the last one's output. An Add after a single-output-channel Conv stays (F4, F12)."""
    rng = np.random.default_rng(20)
    c1, w1 = _conv("/c1", "x", "a", rng)
    nodes = [c1, helper.make_node("Mul", ["k", "a"], ["m"], name="/Mul"),
             helper.make_node("Add", ["m", "b"], ["s"], name="/Add"),
             helper.make_node("Div", ["s", "two"], ["d"], name="/Div"),
             helper.make_node("Sub", ["d", "b"], ["y"], name="/Sub")]
    inits = [w1, _const("k", [0.476]), _const("b", [0.1]), _const("two", np.full((1, 4, 1, 1), 2.0))]
    before = _model(nodes, inits)
    model, names = optimize(before)
    assert [(n.name, n.op_type, n.outputs) for n in Graph(model)] == [("/c1", "Conv", ["y"])]
    assert all("folded into /c1" in names.rewrites[n].reason for n in ("/Mul", "/Add", "/Div", "/Sub"))
    _same_function(before, model)
    # a single output channel: the Mul folds, the Add does not
    c2, w2 = _conv("/c2", "x", "a", rng, cout=1)
    before = _model([c2, helper.make_node("Mul", ["a", "k"], ["m"], name="/Mul"),
                     helper.make_node("Add", ["m", "b"], ["y"], name="/Add")], [w2, _const("k", [0.5]), _const("b", [0.1])])
    model, _ = optimize(before)
    assert [(n.name, n.op_type) for n in Graph(model)] == [("/c2", "Conv"), ("/Add", "Add")]
    _same_function(before, model)
    # a Conv whose output has a second reader folds nothing: the Mul is lowered (a unit conv in hb)
    c3, w3 = _conv("/c3", "x", "a", rng)
    before = _model([c3, helper.make_node("Mul", ["a", "k"], ["m"], name="/Mul"),
                     helper.make_node("Add", ["m", "a"], ["y"], name="/Add")], [w3, _const("k", [0.5])])
    model, _ = optimize(before)
    assert [(n.name, n.op_type) for n in Graph(model)] == [("/c3", "Conv"), ("/Mul", "HzChannelScale"), ("/Add", "Add")]


def test_a_scale_and_shift_before_an_unpadded_conv_fold_into_it_as_hb_folds_them(target):
    """PP-OCRv4's ``HardSwish -> Mul(k) -> Add(b) -> Conv 1x1``: hb's optimized graph has the Conv read the
    HardSwish output (its weights times k, b in its bias), so its input threshold is the HardSwish output's
    (``p2o.Conv.2``: 28.26 real; 13.45 with the scale left in front). Toy models on hb_mapper 1.24.3: folded
    into a Conv with no padding (1x1, or 3x3 pads 0, stride 1 or 2: E1, E5, E7, E16); with padding (E2, E3)
    or a second reader of the Add (E8) the Mul stays a unit conv with the Add as its bias (E11, E13)."""
    rng = np.random.default_rng(21)
    c1, w1 = _conv("/c1", "x", "a", rng)
    relu = helper.make_node("Relu", ["a"], ["r"], name="/Relu")
    affine = [helper.make_node("Mul", ["k", "r"], ["m"], name="/Mul"), helper.make_node("Add", ["m", "b"], ["s"], name="/Add")]
    k, b = _const("k", np.linspace(0.3, 2.0, 4).reshape(1, 4, 1, 1)), _const("b", [-0.05])
    c2, w2 = _conv1("/c2", "s", "y", rng)
    before = _model([c1, relu] + affine + [c2], [w1, w2, k, b])
    model, names = optimize(before)
    graph = Graph(model, names)
    assert [(n.name, n.op_type) for n in graph] == [("/c1", "Conv"), ("/Relu", "Relu"), ("/c2", "Conv")]
    assert graph.data_inputs(graph.by_name["/c2"]) == [(0, "r")]
    assert names.rewrites["/Mul"].nodes == () and names.rewrites["/Add"].nodes == ()
    _same_function(before, model)
    plan = make_plan(graph, target, Candidate.make())
    assert plan.edges[("/c2", 0)] == ("r", "int8")        # the Relu output is the Conv's input

    c3, w3 = _conv("/c3", "s", "y", rng)                   # 3x3, pads 1: not folded
    before = _model([c1, relu] + affine + [c3], [w1, w3, k, b])
    model, names = optimize(before)
    graph = Graph(model, names)
    assert [(n.name, n.op_type, n.outputs) for n in graph] == [
        ("/c1", "Conv", ["a"]), ("/Relu", "Relu", ["r"]), ("/Mul", "HzChannelScale", ["s"]), ("/c3", "Conv", ["y"])]
    assert names.rewrites["/Add"].nodes == ("/Mul",)
    _same_function(before, model)
    plan = make_plan(graph, target, Candidate.make())
    assert sorted(t for t, _ in plan.edges.values()) == ["r", "s", "x"]     # one point less: no Mul output


def test_div_of_two_feature_maps_becomes_reciprocal_and_mul_with_hb_names(target):
    rng = np.random.default_rng(5)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "x", "b", rng)
    w2.CopyFrom(numpy_helper.from_array(np.abs(numpy_helper.to_array(w2)), w2.name))
    nodes = [c1, c2, helper.make_node("Div", ["a", "b"], ["y"], name="/blk/Div")]
    before = _model(nodes, [w1, w2])
    model, names = optimize(before)
    graph = Graph(model, names)
    assert [n.name for n in graph][-2:] == ["/blk/Div_reciprocal", "/blk/Div_mul"]
    assert graph.by_name["/blk/Div_reciprocal"].op_type == "Reciprocal"
    _same_function(before, model)
    # node_info may use hb_mapper's name or the ONNX name; InputType1 of the Div is the reciprocal's input
    by_onnx = make_plan(graph, target, Candidate.make(nodes={"/blk/Div": {"ON": "CPU"}}))
    assert set(by_onnx.cpu_nodes) == {"/blk/Div_reciprocal", "/blk/Div_mul"}
    by_hb = make_plan(graph, target, Candidate.make(nodes={"/blk/Div_mul": {"ON": "CPU"}}))
    assert by_hb.cpu_nodes == ["/blk/Div_mul"]
    k1 = make_plan(graph, target, Candidate.make(nodes={"/blk/Div": {"InputType1": "int16"}}))
    assert k1.in_dtype["/blk/Div_reciprocal"] == "int16" and k1.in_dtype["/blk/Div_mul"] == "int8"


def test_shape_arithmetic_on_static_shapes_is_folded_and_does_not_split_subgraphs(target):
    rng = np.random.default_rng(6)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "r", "y", rng)
    nodes = [c1, helper.make_node("Shape", ["a"], ["shp"], name="/Shape"),
             helper.make_node("Gather", ["shp", "idx"], ["n"], name="/Gather", axis=0),
             helper.make_node("Unsqueeze", ["n"], ["n1"], name="/Unsqueeze", axes=[0]),
             helper.make_node("Concat", ["n1", "rest"], ["newshape"], name="/Concat", axis=0),
             helper.make_node("Reshape", ["a", "newshape"], ["r"], name="/Reshape"), c2]
    inits = [w1, w2, numpy_helper.from_array(np.array(0, np.int64), "idx"),
             numpy_helper.from_array(np.array([4, 8, 8], np.int64), "rest")]
    before = _model(nodes, inits)
    assert make_plan(Graph(before), target, Candidate.make()).cpu_nodes == ["/Shape"]   # split the subgraph
    model, names = optimize(before)
    graph = Graph(model, names)
    assert [n.op_type for n in graph] == ["Conv", "Reshape", "Conv"]
    plan = make_plan(graph, target, Candidate.make())
    assert plan.cpu_nodes == [] and plan.n_subgraphs == 1
    _same_function(before, model)


def test_mul_by_a_channel_constant_leaves_the_bpu_in_int32_like_a_conv(target):
    """docs/hb_rules/ops.md §4.2 #12: '/model.10/attn/Mul BPU HzSQuantizedConv int8/int32' before a CPU Softmax."""
    rng = np.random.default_rng(7)
    c1, w1 = _conv("/c1", "x", "a", rng)
    # (a Relu between: a Mul read from a Conv alone would be folded into it)
    nodes = [c1, helper.make_node("Relu", ["a"], ["r"], name="/Relu"), helper.make_node("Mul", ["k", "r"], ["m"], name="/scale/Mul"),
             helper.make_node("Softmax", ["m"], ["y"], name="/Softmax", axis=1)]
    before = _model(nodes, [w1, _const("k", rng.standard_normal((1, 4, 1, 1)))])
    model, names = optimize(before)
    graph = Graph(model, names)
    assert graph.by_name["/scale/Mul"].op_type == "HzChannelScale"
    assert graph.data_inputs(graph.by_name["/scale/Mul"]) == [(0, "r")]
    plan = make_plan(graph, target, Candidate.make())
    assert plan.out_dtype["/scale/Mul"] == "int32" and plan.cpu_nodes == ["/Softmax"]
    assert not plan.cpu_reads   # int32 leaves unrounded
    # the user's InputType1 (the feature map was the Mul's second input) reaches it
    p16 = make_plan(graph, target, Candidate.make(nodes={"/scale/Mul": {"InputType1": "int16"}}))
    assert p16.in_dtype["/scale/Mul"] == "int16"
    _same_function(before, model)
    # Its constant is the weight of a depthwise 1x1 convolution: int8 per output channel (the rule of
    # Conv weights, docs/hb_rules/quantizer.md §1.7) gives each value its own scale, so it is exact and the
    # simulator keeps it float (it is not in plan.weights).
    from tuner.simulate.weights import fake_quant_weight

    k = numpy_helper.to_array(graph.initializers["k"]).reshape(4, 1, 1, 1).astype(np.float64)
    np.testing.assert_allclose(fake_quant_weight(k, 0), k, rtol=1e-6)
    assert "/scale/Mul" not in plan.weights


def test_a_bpu_softmax_runs_as_hb_mappers_six_quantized_parts(tmp_path):
    """Real 1.24.3 log (docs/hb_rules/ops.md S5): a Softmax forced onto the BPU shows as
    <name>_{reducemax,sub,exp,reducesum,reciprocal,mul}_FROM_QUANTIZED_SOFTMAX rows, each quantized."""
    from helpers import hb_yaml

    from tuner.candidate import Calibration
    from tuner.graph.softmax import SOFTMAX_PARTS, softmax_part, softmax_tensors
    from tuner.workspace import Workspace

    rng = np.random.default_rng(8)
    c1, w1 = _conv("/c1", "x", "a", rng)
    before = _model([c1, helper.make_node("Softmax", ["a"], ["y"], name="/attn/Softmax", axis=3)], [w1])
    onnx.save(before, str(tmp_path / "sm.onnx"))
    (tmp_path / "cal").mkdir()
    for i in range(4):
        (rng.standard_normal(SHAPE) * 2).astype(np.float32).tofile(tmp_path / "cal" / f"{i:04d}.bin")
    cfg = tmp_path / "hb.yaml"
    cfg.write_text(hb_yaml("sm.onnx", "x", "1x4x8x8", prefix="sm"))
    ws = Workspace.open(cfg)
    assert set(softmax_tensors("/attn/Softmax")) <= set(ws.stats)      # the parts have statistics
    sim = ws.simulator
    cpu = Candidate.make(Calibration("max"))
    assert sim.plan(cpu).softmax == {}                                  # default CPU: one float op
    for dtype, setting in (("int8", {"ON": "BPU"}), ("int16", {"ON": "BPU", "InputType": "int16"})):
        cand = Candidate.make(Calibration("max"), {"/attn/Softmax": setting})
        plan = sim.plan(cand)
        assert plan.softmax == {"/attn/Softmax": dtype}
        assert {t for t, d in plan.internal.values() if d == dtype} == set(softmax_tensors("/attn/Softmax"))
        from tuner.simulate.qdq import build_sim_model
        model = build_sim_model(ws.model.proto, sim.graph, sim.target, plan, sim.scales(cand.calibration), sim.weights)
        names = [n.name for n in model.graph.node if n.domain in ("", "ai.onnx")]
        assert [softmax_part("/attn/Softmax", p) for p in SOFTMAX_PARTS] == [n for n in names if "FROM_QUANTIZED" in n]
        # one quantization point on each tensor between the parts
        points = {n.input[0] for n in model.graph.node if n.op_type in ("FakeQuant", "QuantizeLinear")}
        assert set(softmax_tensors("/attn/Softmax")) <= points
    ev8 = sim.evaluate(Candidate.make(Calibration("max"), {"/attn/Softmax": {"ON": "BPU"}}))
    ev16 = sim.evaluate(Candidate.make(Calibration("max"), {"/attn/Softmax": {"ON": "BPU", "InputType": "int16"}}))
    evcpu = sim.evaluate(cpu)
    assert ev8.outputs["y"]["sqnr_db"] < ev16.outputs["y"]["sqnr_db"]
    assert ev8.outputs["y"]["sqnr_db"] < evcpu.outputs["y"]["sqnr_db"]
    rows = sim.evaluate(Candidate.make(Calibration("max"), {"/attn/Softmax": {"ON": "BPU", "InputType": "int16"}}),
                        per_node=True).nodes
    parts = [r for r in rows if "FROM_QUANTIZED_SOFTMAX" in r.name]
    assert [r.name for r in parts] == [softmax_part("/attn/Softmax", p) for p in SOFTMAX_PARTS]
    assert all(r.in_dtype == "int16" and r.cosine is not None and r.threshold is not None for r in parts)
    assert "/attn/Softmax" not in {r.name for r in rows}
    # the ReduceSum and Mul read exp(x - max) <= 1: threshold 1.0, as the real int16 log shows
    assert parts[3].threshold == pytest.approx(1.0) and parts[5].threshold == pytest.approx(1.0)


def test_node_info_naming_a_folded_constant_is_a_note(tmp_path, target):
    from tuner.inputs.model import load_model

    rng = np.random.default_rng(9)
    c1, w1 = _conv("/c1", "x", "a", rng)
    k = helper.make_node("Constant", [], ["k"], name="/Constant_7", value=_const("kv", [2.0]))
    before = _model([c1, k, helper.make_node("Mul", ["a", "k"], ["y"], name="/Mul")], [w1])
    onnx.save(before, str(tmp_path / "c.onnx"))
    m = load_model(tmp_path / "c.onnx")
    plan = make_plan(Graph(m.proto, m.names), target, Candidate.make(nodes={"/Constant_7": {"ON": "CPU"}}))
    assert any("'/Constant_7' (Constant): constant folded" in n for n in plan.notes)


def test_a_grouped_conv_transpose_has_one_weight_scale_per_output_channel():
    """docs/hb_rules/quantizer.md §1.7: the weight [Cin, Cout/g, k, k] is reshaped to (g, Cin/g, Cout/g, ...) first."""
    from tuner.simulate.weights import grouped_deconv_weight

    rng = np.random.default_rng(10)
    w = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)   # Cin 4, group 2 -> Cout 6
    w[2:, 1] *= 100                                             # group 1's second channel is large
    fq, scales = grouped_deconv_weight(w, 2)
    assert scales.shape == (6,)
    assert scales[4] == pytest.approx(np.abs(w[2:, 1]).max() / 127) and scales[1] == pytest.approx(np.abs(w[:2, 1]).max() / 127)
    # group 0's channel 1 is not crushed by group 1's large one (it would be with one scale per Cout/g column)
    np.testing.assert_allclose(fq[:2, 1], w[:2, 1], atol=float(scales[1]) / 2 + 1e-7)


def test_per_node_table_and_trace_use_hb_mappers_names(tmp_path):
    """The rows of ``tuner eval`` and ``--trace`` are the graph hb_mapper calibrates, under its log's
    names: no Identity row, a Div as ``<name>_reciprocal`` + ``<name>_mul``, a BPU Softmax as its six
    ``..._FROM_QUANTIZED_SOFTMAX`` parts (the trace once failed on those: the graph has one Softmax)."""
    from helpers import hb_yaml

    from tuner.candidate import Calibration
    from tuner.graph.softmax import SOFTMAX_PARTS, softmax_part
    from tuner.report.text import accumulated_rows, accumulated_table, node_table
    from tuner.workspace import Workspace

    rng = np.random.default_rng(11)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "x", "b", rng)
    nodes = [c1, c2, helper.make_node("Identity", ["a"], ["a_id"], name="/id"),
             helper.make_node("Sigmoid", ["b"], ["s"], name="/gate/Sigmoid"),
             helper.make_node("Div", ["a_id", "s"], ["d"], name="/blk/Div"),
             helper.make_node("Softmax", ["d"], ["y"], name="/attn/Softmax", axis=3)]
    onnx.save(_model(nodes, [w1, w2]), str(tmp_path / "m.onnx"))
    (tmp_path / "cal").mkdir()
    for i in range(4):
        rng.standard_normal(SHAPE).astype(np.float32).tofile(tmp_path / "cal" / f"{i:04d}.bin")
    (tmp_path / "hb.yaml").write_text(hb_yaml("m.onnx", "x", "1x4x8x8", prefix="m"))
    ws = Workspace.open(tmp_path / "hb.yaml")
    ev = ws.simulator.evaluate(Candidate.make(Calibration("max"), {"/attn/Softmax": {"ON": "BPU"}}), per_node=True)
    parts = [softmax_part("/attn/Softmax", p) for p in SOFTMAX_PARTS]
    names = ["/c1", "/c2", "/gate/Sigmoid", "/blk/Div_reciprocal", "/blk/Div_mul"] + parts
    assert [r.name for r in ev.nodes] == names
    assert all(n in node_table(ev) for n in names) and "/id" not in node_table(ev)
    rows = accumulated_rows(ev, ws.graph)
    assert [r["node"] for r in rows] == names
    by = {r["node"]: r for r in rows}
    cos = {r.name: r.cosine for r in ev.nodes}
    # a part's change is measured from the parts it reads; the first parts read the Div's Mul
    assert by[parts[2]]["change"] == pytest.approx(cos[parts[2]] - cos[parts[1]])
    assert by[parts[5]]["change"] == pytest.approx(cos[parts[5]] - min(cos[parts[2]], cos[parts[4]]))
    assert by[parts[1]]["change"] == pytest.approx(cos[parts[1]] - min(cos["/blk/Div_mul"], cos[parts[0]]))
    assert "/blk/Div_mul" in accumulated_table(ev, ws.graph)


def _gelu_erf(x):
    return [helper.make_node("Div", [x, "sqrt2"], ["g1"], name="/gelu/Div"),
            helper.make_node("Erf", ["g1"], ["g2"], name="/gelu/Erf"),
            helper.make_node("Add", ["g2", "one"], ["g3"], name="/gelu/Add"),
            helper.make_node("Mul", [x, "g3"], ["g4"], name="/gelu/Mul"),
            helper.make_node("Mul", ["g4", "half"], ["s"], name="/gelu/Mul_1")]


def _gelu_tanh(x):
    return [helper.make_node("Pow", [x, "three"], ["t1"], name="/gelu/Pow"),
            helper.make_node("Mul", ["t1", "c044"], ["t2"], name="/gelu/Mul"),
            helper.make_node("Add", [x, "t2"], ["t3"], name="/gelu/Add"),
            helper.make_node("Mul", ["t3", "c079"], ["t4"], name="/gelu/Mul_1"),
            helper.make_node("Tanh", ["t4"], ["t5"], name="/gelu/Tanh"),
            helper.make_node("Add", ["t5", "one"], ["t6"], name="/gelu/Add_1"),
            helper.make_node("Mul", [x, "t6"], ["t7"], name="/gelu/Mul_2"),
            helper.make_node("Mul", ["t7", "half"], ["s"], name="/gelu/Mul_3")]


def _mish_softplus(x):
    return [helper.make_node("Softplus", [x], ["m1"], name="/mish/Softplus"),
            helper.make_node("Tanh", ["m1"], ["m2"], name="/mish/Tanh"),
            helper.make_node("Mul", [x, "m2"], ["s"], name="/mish/Mul")]


def _mish_exp_log(x):
    return [helper.make_node("Exp", [x], ["m1"], name="/mish/Exp"),
            helper.make_node("Add", ["m1", "one"], ["m2"], name="/mish/Add"),
            helper.make_node("Log", ["m2"], ["m3"], name="/mish/Log"),
            helper.make_node("Tanh", ["m3"], ["m4"], name="/mish/Tanh"),
            helper.make_node("Mul", [x, "m4"], ["s"], name="/mish/Mul")]


def _hardswish_hardsigmoid(x):
    return [helper.make_node("HardSigmoid", [x], ["h1"], name="/hs/HardSigmoid", alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", [x, "h1"], ["s"], name="/hs/Mul")]


@pytest.mark.parametrize("pattern,kind,last", [
    (_gelu_erf, "HzGelu", "/gelu/Mul_1"), (_gelu_tanh, "HzGelu", "/gelu/Mul_3"),
    (_mish_softplus, "HzMish", "/mish/Mul"), (_mish_exp_log, "HzMish", "/mish/Mul"),
    (_hardswish_hardsigmoid, "HzHardSwish", "/hs/Mul")])
def test_gelu_mish_and_hardswish_are_one_lut_quantized_once_in_and_out(target, pattern, kind, last):
    """docs/hb_rules/quantizer.md §3.4 / §5: GELU, Mish and HardSwish have fused Hz kinds, one LUT each."""
    rng = np.random.default_rng(12)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "s", "y", rng)
    inits = [w1, w2, _const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5), _const("three", 3.0),
             _const("c044", 0.044715), _const("c079", np.sqrt(2 / np.pi))]
    before = _model([c1] + pattern("a") + [c2], inits)
    model, names = optimize(before)
    graph = Graph(model, names)
    assert [(n.name, n.op_type) for n in graph] == [("/c1", "Conv"), (last, kind), ("/c2", "Conv")]
    plan = make_plan(graph, target, Candidate.make())
    assert plan.placement[last] == "BPU"
    assert sorted(t for t, _ in plan.edges.values()) == ["a", "s", "x"]     # in once, out once
    _same_function(before, model)


def test_a_search_space_may_name_nodes_by_their_onnx_names(tmp_path, target):
    """nodes.names of a search space takes node_info's names: an ONNX name the optimizer replaced
    stands for the nodes that replaced it; a removed one is an error that says so."""
    import dataclasses

    from helpers import write_tiny_space

    from tuner.study.space import free_nodes, load_space

    rng = np.random.default_rng(13)
    c1, w1 = _conv("/c1", "x", "a", rng)
    c2, w2 = _conv("/c2", "x", "b", rng)
    nodes = [c1, c2, helper.make_node("Identity", ["a"], ["a_id"], name="/id"),
             helper.make_node("Sigmoid", ["b"], ["s"], name="/gate/Sigmoid"),
             helper.make_node("Div", ["a_id", "s"], ["y"], name="/blk/Div")]
    model, names = optimize(_model(nodes, [w1, w2]))
    graph = Graph(model, names)
    space = load_space(write_tiny_space(tmp_path))

    def free(*wanted):
        return free_nodes(dataclasses.replace(space, rule=dataclasses.replace(space.rule, names=wanted)), graph, target)

    assert free("/blk/Div") == ["/blk/Div_reciprocal", "/blk/Div_mul"]
    assert free("/blk/Div_mul", "/c1") == ["/c1", "/blk/Div_mul"]
    with pytest.raises(TunerError, match="'/id' .*Identity removed"):
        free("/id")
    with pytest.raises(TunerError, match="'/blk/Div' .*Div split into Reciprocal \\+ Mul; name '/blk/Div_reciprocal', "
                                         "'/blk/Div_mul' instead"):
        graph.node("/blk/Div")


def test_softmax_part_inputs_are_how_softmax_parts_wires_them():
    """The per-node trace reads a BPU Softmax's rows by SOFTMAX_PART_INPUTS: it must be the wiring
    softmax_parts builds (each part's activation inputs: the Softmax's input or another part)."""
    from tuner.graph.softmax import SOFTMAX_PART_INPUTS, SOFTMAX_PARTS, softmax_part, softmax_parts

    for opset in (11, 13):
        node = helper.make_node("Softmax", ["x"], ["y"], name="/sm", axis=-1)
        parts, inits = softmax_parts(node, 4, opset)
        made = {o: p.name for p in parts for o in p.output}
        consts = {t.name for t in inits}
        for part in parts:
            reads = tuple("x" if t == "x" else next(q for q in SOFTMAX_PARTS if softmax_part("/sm", q) == made[t])
                          for t in part.input if t not in consts)
            assert SOFTMAX_PART_INPUTS[next(q for q in SOFTMAX_PARTS if softmax_part("/sm", q) == part.name)] == reads
