
import numpy as np
import onnx
import pytest
from helpers import write_tiny_project

import tuner.calib.collect as collect
from tuner.candidate import Calibration, Candidate
from tuner.metrics import Similarity
from tuner.runtime.session import make_session
from tuner.simulate.calibrate import rank
from tuner.simulate.oracle import ort_quantize, ort_semantics
from tuner.simulate.plan import make_plan
from tuner.workspace import Workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return Workspace.open(write_tiny_project(tmp_path_factory.mktemp("sim")))


def test_a_cpu_node_reads_what_its_bpu_neighbours_read(ws):
    """One quantizer per tensor (measured on the real toolchain): the CPU stem Conv reads the model input
    quantized while the BPU gate Conv reads it too; with both on the CPU the input stays float and the CPU
    Conv computes exactly the float value. (hb folds the BN into the stem Conv: it writes /stem/bn_out.)"""
    sample = next(iter(ws.eval_data))
    both = Candidate.make(Calibration("max"), {"/stem/Conv": {"ON": "CPU"}, "/gate/Conv": {"ON": "CPU"}})
    sim, ref = ws.simulator.tensors(both, ["/stem/bn_out", "/res/Conv_out"], sample)
    np.testing.assert_array_equal(sim["/stem/bn_out"], ref["/stem/bn_out"])
    assert not np.array_equal(sim["/res/Conv_out"], ref["/res/Conv_out"])  # downstream BPU nodes are quantized
    one = Candidate.make(Calibration("max"), {"/stem/Conv": {"ON": "CPU"}})
    sim1, _ = ws.simulator.tensors(one, ["/stem/bn_out"], sample)
    assert not np.array_equal(sim1["/stem/bn_out"], ref["/stem/bn_out"])


def test_int16_scales_are_closer_to_float_than_int8_for_every_tensor(ws):
    table = ws.simulator.scales(Calibration("max"))
    sample = next(iter(ws.eval_data))
    tensors = [t for t in ws.graph.activation_tensors() if t not in ws.model.output_names][:10]
    _, ref = ws.simulator.tensors(Candidate.make(Calibration("max")), tensors, sample)
    for t in tensors:
        x = ref[t]
        errs = {}
        for dtype, qmax in (("int8", 127), ("int16", 32767)):
            s = float(table.get(t, dtype).scale)
            errs[dtype] = np.abs(np.clip(np.round(x / s), -qmax, qmax) * s - x).max()
        assert errs["int16"] < errs["int8"] or errs["int8"] == 0, t   # a 0/1 tensor (Where's casts) is exact


def test_int16_everywhere_beats_int8_at_the_outputs(ws):
    int8 = ws.simulator.evaluate(Candidate.make(Calibration("max")))
    int16 = ws.simulator.evaluate(Candidate.make(Calibration("max"), optimization=("set_all_nodes_int16",)))
    assert int16.outputs["depth"]["sqnr_db"] > int8.outputs["depth"]["sqnr_db"]
    assert int16.counts()["int16_nodes"] > 0 == int8.counts()["int16_nodes"]


def test_per_channel_helps_when_one_input_channel_is_on_another_scale(ws):
    """Channel 3 of the tiny model's input is 50x the others (like radar range in metres): per-channel
    scales on it (equalized into the stem Conv) bring the stem Conv's output closer to float. (The model
    outputs need not follow: hb's shared Concat threshold and int32 outputs decide them.)"""
    sample = next(iter(ws.eval_data))
    errs = {}
    for pc in (False, True):
        sim, ref = ws.simulator.tensors(Candidate.make(Calibration("max", per_channel=pc)), ["/stem/bn_out"], sample)
        errs[pc] = float(np.abs(sim["/stem/bn_out"] - ref["/stem/bn_out"]).mean())
    assert errs[True] < errs[False]


def test_default_calibration_is_the_search_winner_evaluated_on_the_evaluation_set(ws):
    """default picks by hb_mapper's model-wise score on the first calibration sample
    (tests/simulate/test_calibrate.py); the evaluation is then the winner's, like an explicit one."""
    cand = Candidate.make(Calibration("default"))
    ev = ws.simulator.evaluate(cand)
    choice = ws.simulator.choice(cand)
    assert ev.calibration == choice.method == rank(dict(choice.scores))[0]
    assert ev.outputs == ws.simulator.evaluate(Candidate.make(choice.method)).outputs
    assert ev.notes[0] == f"default calibration: Select {choice.method.describe()} method."


def test_repeated_candidate_reuses_its_session(ws):
    cand = Candidate.make(Calibration("max", 0.9999), {"/res/Add": {"ON": "CPU"}})
    before = ws.simulator.session_builds
    a = ws.simulator.evaluate(cand)
    b = ws.simulator.evaluate(cand)
    assert ws.simulator.session_builds == before + 1
    assert a.outputs == b.outputs


def test_per_node_table_matches_the_plan(ws):
    cand = Candidate.make(Calibration("max"), {"/res/Add": {"ON": "CPU"}})
    ev = ws.simulator.evaluate(cand, per_node=True)
    rows = {r.name: r for r in ev.nodes}
    assert len(rows) == len(ws.graph)
    assert rows["/res/Add"].on == "CPU" and rows["/res/Add"].subgraph is None
    assert rows["/stem/Conv"].threshold == pytest.approx(ws.stats["x"].absmax)
    assert 0.9 < rows["/stem/Conv"].cosine <= 1.0
    assert rows["/gate/Greater"].cosine is None  # bool output
    # the per-node cosine at an output node is the output's cosine
    assert rows["/head/depth/Mul"].cosine == pytest.approx(ev.outputs["depth"]["cosine"])


def test_second_open_makes_no_data_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))  # empty: other tests cached the tiny model
    cfg = write_tiny_project(tmp_path / "p")
    calls = []
    real = collect.collect_statistics
    monkeypatch.setattr(collect, "collect_statistics", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = Workspace.open(cfg)
    second = Workspace.open(cfg)
    assert calls == [1]
    assert not first.stats_from_cache and second.stats_from_cache
    for name, st in first.stats.items():
        np.testing.assert_array_equal(st.hist, second.stats[name].hist)
    # changed data: a new pass
    (tmp_path / "p" / "cal" / "0000.bin").write_bytes(np.ones((1, 4, 16, 16), np.float32).tobytes())
    assert not Workspace.open(cfg).stats_from_cache and calls == [1, 1]


def test_matches_onnxruntime_quantize_static_with_the_same_scales(tmp_path):
    """Oracle: with the same quantization points and scales, onnxruntime's own QDQ model agrees.

    onnxruntime quantizes every op output and has no Horizon fusion or int32 outputs, so the
    simulator runs with those two rules off; BatchNormalization is removed because
    quantize_static quantizes BN parameters, which hb_mapper folds into the Conv instead.
    """
    cfg = write_tiny_project(tmp_path / "o")
    model = onnx.load(str(tmp_path / "o" / "tiny.onnx"))
    nodes = [n for n in model.graph.node if n.op_type != "BatchNormalization"]
    for n in nodes:
        n.input[:] = ["/stem/Conv_out" if t == "/stem/bn_out" else t for t in n.input]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(tmp_path / "o" / "tiny.onnx"))
    # The exported graph: hb_mapper lowers the depth head's Mul by 80 to a convolution
    # (docs/hb_rules/ops.md §4.2 #14, tuner.graph.optimize); onnxruntime's quantizer keeps a Mul.
    ws = Workspace.open(cfg, hb_optimize=False)
    ws.target = ort_semantics(ws.target)
    cand = Candidate.make(Calibration("max"))
    ev = ws.simulator.evaluate(cand)
    plan = make_plan(ws.graph, ws.target, cand)
    qdq = ort_quantize(ws.model.proto, ws.graph, plan, ws.simulator.scales(ev.calibration), ws.calibration_data)
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) >= 10
    session = make_session(qdq)
    names = ws.model.output_names
    agree = {o: Similarity() for o in names}
    for sample in ws.eval_data:
        sim, _ = ws.simulator.tensors(cand, names, sample)
        for o, value in zip(names, session.run(names, sample)):
            agree[o].update(value, sim[o])
    for o in names:
        assert agree[o].cosine >= 0.99999, (o, agree[o].cosine)
    assert ev.mean_cosine < 0.99999  # and the quantization itself is not a no-op


def test_simulated_graph_is_a_valid_topologically_sorted_onnx_model(ws):
    from tuner.simulate.qdq import build_sim_model

    cand = Candidate.make(Calibration("max", per_channel=True), {"/res/Add": {"ON": "CPU"}, "/gate/Mul": {"InputType": "int16"}})
    sim = ws.simulator
    model = build_sim_model(ws.model.proto, sim.graph, ws.target, sim.plan(cand), sim.scales(cand.calibration), sim.weights)
    onnx.checker.check_model(model)
    seen = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    for node in model.graph.node:
        assert all(i in seen for i in node.input if i), node.name
        seen.update(node.output)
    quant = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert any(n.input[0] == "/gate/Conv_out" for n in quant) or any("int16" in n.name for n in quant)


def test_external_weights_give_the_same_outputs_and_leave_the_graph(tmp_path):
    """Static weights go to onnxruntime once as OrtValues; per-candidate tensors stay inline."""
    from helpers import write_example_project

    from tuner.simulate.qdq import build_sim_model
    from tuner.simulate.weights import ExternalWeights

    ex = Workspace.open(write_example_project(tmp_path / "ex", n_cal=4, n_eval=2))
    sim = ex.simulator
    for cal in (Calibration("max"), Calibration("max", per_channel=True)):
        cand = Candidate.make(cal, {"/Slice": {"InputType": "int16"}})
        plan, scales = sim.plan(cand), sim.scales(cal)
        ext = ExternalWeights()
        outside = build_sim_model(ex.model.proto, sim.graph, ex.target, plan, scales, sim.weights, external=ext)
        inline = build_sim_model(ex.model.proto, sim.graph, ex.target, plan, scales, sim.weights)
        stubs = [t.name for t in outside.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        # per-channel: the Convs behind per-channel inputs carry equalized weights (__w8eq)
        assert stubs and all("__w8pc" in n or "__w8eq" in n or n in sim.graph.initializers for n in stubs)
        assert outside.ByteSize() < inline.ByteSize() / 4
        sample = next(iter(ex.eval_data))
        a = make_session(outside, external=ext).run(None, sample)
        b = make_session(inline).run(None, sample)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_evaluations_read_the_data_files_only_at_set_up(tmp_path, monkeypatch):
    """Samples stay in memory after the float pass; beyond the budget they stream from disk, same result."""
    import tuner.simulate.simdata as simdata_module
    from tuner.inputs.data import DataSet
    from tuner.simulate import Simulator

    ws = Workspace.open(write_tiny_project(tmp_path / "d"))
    reads = []
    real = DataSet._read
    monkeypatch.setattr(DataSet, "_read", lambda self, spec, path: reads.append(path) or real(self, spec, path))
    cand = Candidate.make(Calibration("max"), {"/res/Add": {"ON": "CPU"}})
    cached = Simulator(ws.model, ws.target, ws.stats, ws.eval_data, ws.threads)
    assert len(reads) == len(ws.eval_data)
    a = cached.evaluate(cand, per_node=True)
    assert len(reads) == len(ws.eval_data)
    monkeypatch.setattr(simdata_module, "SAMPLE_CACHE_BYTES", 0)
    streamed = Simulator(ws.model, ws.target, ws.stats, ws.eval_data, ws.threads)
    b = streamed.evaluate(cand, per_node=True)
    assert len(reads) == 4 * len(ws.eval_data)  # set-up, the quantized pass and the per-node float pass
    assert a.outputs == b.outputs
    assert [r.cosine for r in a.nodes] == [r.cosine for r in b.nodes]


def test_labels_are_read_only_at_set_up(tmp_path, monkeypatch):
    """Label files stay in memory with the samples; beyond the budget they are read again, same result."""
    import tuner.simulate.simdata as simdata_module
    from tuner.metrics.task import LabelSet, parse_metric_spec

    project = write_tiny_project(tmp_path / "d")
    labels = tmp_path / "labels"
    labels.mkdir()
    for i in range(8):
        np.save(labels / f"seg_{i:04d}.npy", np.random.default_rng(i).integers(0, 3, (16, 16)).astype(np.int64))
    ws = Workspace.open(project)
    ws.use_task_metrics([parse_metric_spec("miou:seg")], {"seg": "labels/seg_*.npy"}, tmp_path)
    reads = []
    real = LabelSet.sample
    monkeypatch.setattr(LabelSet, "sample", lambda self, i: reads.append(i) or real(self, i))
    cand = Candidate.make(Calibration("max"), {"/res/Add": {"ON": "CPU"}})
    cached = ws.simulator
    a = [cached.evaluate(cand).task for _ in range(2)]
    assert len(reads) == len(ws.eval_data)
    cached.on.label(0)["seg"][:] = 99                 # a metric writing into its labels changes nothing later
    assert (cached.on.label(0)["seg"] < 3).all()
    monkeypatch.setattr(simdata_module, "SAMPLE_CACHE_BYTES", 0)
    ws._simulator = None
    b = ws.simulator.evaluate(cand).task
    assert len(reads) == 2 * len(ws.eval_data)  # streamed: the pass reads them again
    assert a[0] == a[1] == b and set(b) == {"miou:seg"}


def test_zero_points_are_shared_and_change_no_output_bit(ws):
    """One all-zero zero-point tensor per (dtype, shape): the outputs equal those of private copies."""
    from tuner.simulate.qdq import build_sim_model

    cand = Candidate.make(Calibration("max"), {"/gate/Mul": {"InputType": "int16"}})
    sim = ws.simulator
    shared = build_sim_model(ws.model.proto, sim.graph, ws.target, sim.plan(cand), sim.scales(cand.calibration),
                             sim.weights)
    quant = [n for n in shared.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    zps = {n.input[2] for n in quant}
    assert len(quant) > 2 * len(zps) and {"__zp0_int8_", "__zp0_int16_"} <= zps
    private = onnx.ModelProto()
    private.CopyFrom(shared)
    inits = {t.name: t for t in private.graph.initializer}
    for k, node in enumerate(n for n in private.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")):
        own = onnx.TensorProto()
        own.CopyFrom(inits[node.input[2]])
        own.name = f"own_zp_{k}"
        private.graph.initializer.append(own)
        node.input[2] = own.name
    sample = next(iter(ws.eval_data))
    for a, b in zip(make_session(shared).run(None, sample), make_session(private).run(None, sample)):
        np.testing.assert_array_equal(a, b)


def test_a_build_memo_shared_across_candidates_gives_the_same_graphs(ws):
    """Reused Q/DQ and bias protos: every build equals a build from scratch, whatever was built before."""
    from tuner.simulate.qdq import build_sim_model

    sim, memo = ws.simulator, {}
    cands = [Candidate.make(Calibration("max")), Candidate.make(Calibration("max", 0.9999)),
             Candidate.make(Calibration("max", per_channel=True), {"/gate/Mul": {"InputType": "int16"}}),
             Candidate.make(Calibration("max"), {"/res/Add": {"ON": "CPU"}})]
    for cand in cands + cands:
        args = (ws.model.proto, sim.graph, ws.target, sim.plan(cand), sim.scales(cand.calibration), sim.weights)
        assert build_sim_model(*args, memo=memo).SerializeToString() == build_sim_model(*args).SerializeToString()
    assert any(k[0] == "bias" for k in memo)


def test_the_int32_bias_uses_the_scale_its_input_is_quantized_with(tmp_path):
    """A Conv after AveragePool (a same-scale op): its input Q/DQ carries the pool's input scale,
    so the bias grid must be that scale times the weight scales, not the pool output's own."""
    from helpers import hb_yaml
    from onnx import TensorProto, helper, numpy_helper

    from tuner.simulate.qdq import build_sim_model

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.7, "b")
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], name="/pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w", "b"], ["y"], name="/conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(tmp_path / "m.onnx"))
    (tmp_path / "cal").mkdir()
    for i in range(4):
        (rng.standard_normal((1, 4, 8, 8)) * (i + 1)).astype(np.float32).tofile(tmp_path / "cal" / f"{i}.bin")
    (tmp_path / "c.yaml").write_text(hb_yaml("m.onnx", "x", "1x4x8x8", prefix="m"))
    w_ = Workspace.open(tmp_path / "c.yaml")
    sim = w_.simulator
    cand = Candidate.make(Calibration("max"))
    plan = sim.plan(cand)
    assert plan.scale_of.get("p") == "x"                        # the pool keeps its input's scale
    proto = build_sim_model(w_.model.proto, sim.graph, w_.target, plan, sim.scales(cand.calibration), sim.weights)
    conv = next(n for n in proto.graph.node if n.name == "/conv")
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    dq = next(n for n in proto.graph.node if n.output[0] == conv.input[0])
    s_in = float(inits[dq.input[1]])
    assert s_in == pytest.approx(float(sim.scales(cand.calibration).get("x", "int8").scale))
    w_scales = sim.weights.scales(sim.graph.initializers["w"], 0)
    steps = inits[conv.input[2]].astype(np.float64) / (s_in * w_scales)
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)


def test_the_oracle_holds_on_hb_mappers_graph_where_it_changes_no_arithmetic(tmp_path):
    """Issue 13 part 5: hb_mapper's optimizer removes Identity/Dropout and folds shape arithmetic;
    those rewrites change where the graph splits, not the all-int8 per-tensor max arithmetic, so the
    simulation of the optimized graph still equals onnxruntime's QDQ model of that graph."""
    from helpers import hb_yaml
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="/c0", pads=[1] * 4),
             helper.make_node("Identity", ["a"], ["a1"], name="/id0"),
             helper.make_node("Relu", ["a1"], ["r"], name="/relu"),
             helper.make_node("Dropout", ["r"], ["r1"], name="/drop"),
             helper.make_node("Conv", ["r1", "w1"], ["b"], name="/c1", pads=[1] * 4),
             helper.make_node("Shape", ["b"], ["shp"], name="/Shape"),
             helper.make_node("Reshape", ["b", "shp"], ["b1"], name="/Reshape"),
             helper.make_node("Identity", ["b1"], ["b2"], name="/id1"),
             helper.make_node("Conv", ["b2", "w2"], ["y"], name="/c2", pads=[1] * 4)]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], w)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(tmp_path / "ids.onnx"))
    (tmp_path / "cal").mkdir()
    for i in range(4):
        rng.standard_normal((1, 4, 8, 8)).astype(np.float32).tofile(tmp_path / "cal" / f"{i:04d}.bin")
    (tmp_path / "hb.yaml").write_text(hb_yaml("ids.onnx", "x", "1x4x8x8", prefix="ids"))
    ws = Workspace.open(tmp_path / "hb.yaml")
    assert [n.op_type for n in ws.graph] == ["Conv", "Relu", "Conv", "Reshape", "Conv"]
    ws.target = ort_semantics(ws.target)
    cand = Candidate.make(Calibration("max"))
    ev = ws.simulator.evaluate(cand)
    plan = make_plan(ws.graph, ws.target, cand)
    assert plan.n_subgraphs == 1
    qdq = ort_quantize(ws.model.proto, ws.graph, plan, ws.simulator.scales(ev.calibration), ws.calibration_data)
    session = make_session(qdq)
    agree = Similarity()
    for sample in ws.eval_data:
        mine, _ = ws.simulator.tensors(cand, ["y"], sample)
        (theirs,) = session.run(["y"], sample)
        agree.update(theirs, mine["y"])
    assert agree.cosine >= 0.99999 and agree.max_abs < 1e-4, agree.as_dict()
    assert ev.mean_cosine < 0.99999


def test_a_simulator_on_other_data_shares_the_model_side(tmp_path, monkeypatch):
    """A data change builds only the data side: the graph and the fake-quantized weights are the
    workspace's, and the evaluations equal those of a simulator that built everything itself."""
    from tuner.graph import load_target
    from tuner.inputs.data import dataset_from_config
    from tuner.simulate import Simulator
    from tuner.simulate.simmodel import SimModel

    ws = Workspace.open(write_tiny_project(tmp_path / "d"))
    builds = []
    real = SimModel.__init__
    monkeypatch.setattr(SimModel, "__init__", lambda self, *a, **k: builds.append(1) or real(self, *a, **k))
    sim = ws.simulator
    three = dataset_from_config(ws.config.inputs, ws.model.input_shapes, limit=3)
    other = ws.simulator_on(three)
    assert len(builds) == 1 and other.graph is sim.graph and other.weights is sim.weights
    assert len(other.reference) == 3 < len(sim.reference)
    cand = Candidate.make(Calibration("max", per_channel=True), {"/res/Add": {"ON": "CPU"}})
    shared = other.evaluate(cand, per_node=True)
    alone = Simulator(ws.model, ws.target, ws.stats, three, ws.threads)
    assert len(builds) == 2
    own = alone.evaluate(cand, per_node=True)
    assert shared.outputs == own.outputs and [r.cosine for r in shared.nodes] == [r.cosine for r in own.nodes]
    assert shared.outputs != sim.evaluate(cand).outputs   # other samples, other figures
    other_target = SimModel(ws.model, load_target("bayes"))
    with pytest.raises(ValueError, match="model_side"):
        Simulator(ws.model, ws.target, ws.stats, ws.eval_data, model_side=other_target)
