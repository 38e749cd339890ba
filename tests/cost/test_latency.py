"""The latency model's properties on the tiny model: what costs more, what a fit changes, how fast it is."""

import time

import onnx
import pytest
from helpers import Toy, build_tiny_model

from tuner.candidate import Candidate
from tuner.cost.bpu import LayerPrice, aligned_elements, layers, op_kind
from tuner.cost.fit import fit_price, fit_scales, make_sample, modeled_us, real_precision
from tuner.cost.hbdk import LayerRow, NodeQtypes, SubgraphEstimate
from tuner.cost.latency import (
    BoardFit,
    BpuCoefficients,
    CostModel,
    LayerUse,
    ModelFit,
    Precision,
    load_profile,
    node_macs,
    scale_of,
)
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.simulate.plan import make_plan


@pytest.fixture(scope="module")
def setup():
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    target = load_target("bayes-e")
    return graph, target, CostModel(graph, target)


def plan_of(setup, nodes=None, optimization=()):
    graph, target, _ = setup
    return make_plan(graph, target, Candidate.make(nodes=nodes or {}, optimization=optimization))


def lat(setup, nodes=None, optimization=()):
    return setup[2].latency(plan_of(setup, nodes, optimization))


def test_conv_macs_by_hand(setup):
    graph, _, _ = setup
    # /stem/Conv: 8 output channels x 16x16 pixels x (4 input channels x 3x3 kernel)
    assert node_macs(graph, graph.by_name["/stem/Conv"]) == 8 * 16 * 16 * 4 * 9
    assert node_macs(graph, graph.by_name["/gate/Sigmoid"]) == 8 * 16 * 16


def test_layers_follow_fusion(setup):
    """A Conv with its BN and Relu is one hbdk layer, named after the Conv; a lone Sigmoid is a table."""
    graph, target, _ = setup
    lay = layers(graph, target)
    assert lay["/stem/Relu"].head == "/stem/Conv" and lay["/stem/Conv"].kind == "conv"
    assert op_kind(graph, graph.by_name["/gate/Sigmoid"]) == "lut"
    assert op_kind(graph, graph.by_name["/gate/Mul"]) == "eltwise"
    # [1, 8, 16, 16]: 8 channels stay 8, the width 16 is a multiple of 8
    assert lay["/stem/Conv"].elements == 8 * 16 * 16
    assert aligned_elements((1, 3, 16, 20)) == 8 * 16 * 24
    assert aligned_elements((1, 24, 4, 8)) == 32 * 4 * 8


def test_cpu_nodes_and_switches_cost_more(setup):
    base = lat(setup)
    one_cpu = lat(setup, {"/res/Add": {"ON": "CPU"}})
    assert one_cpu.total_ms > base.total_ms
    assert one_cpu.cpu_ms > base.cpu_ms and one_cpu.switch_ms > base.switch_ms
    assert one_cpu.subgraphs > base.subgraphs


def test_a_cut_costs_the_bpu_its_io(setup):
    """hbdk's side of a cut: the new subgraph's fixed cost and the tensors written and read back."""
    base = lat(setup)
    cut = lat(setup, {"/res/Conv": {"ON": "CPU"}})
    assert cut.subgraphs > base.subgraphs
    assert len(cut.subgraph_ms) == cut.subgraphs
    _, _, cm = setup
    f_base = cm.features(Precision.of_plan(plan_of(setup)))
    f_cut = cm.features(Precision.of_plan(plan_of(setup, {"/res/Conv": {"ON": "CPU"}})))
    io = sum(f.get("cut_kbyte", 0.0) for f in f_cut) - sum(f.get("cut_kbyte", 0.0) for f in f_base)
    cuts = sum(f.get("cut_tensor", 0.0) for f in f_cut) - sum(f.get("cut_tensor", 0.0) for f in f_base)
    # /res/Conv's input leaves the first subgraph and its output enters the next: 2 x 8x16x16 int8 at least
    assert io >= 2 * 8 * 16 * 16 / 1e3 and cuts >= 2


def _handed_over(channels):
    """A Conv's output read by a Sigmoid, and through a CPU node by the Add after both: with the CPU node the
    Add is a second BPU subgraph that reads the Sigmoid's output straight from the first."""
    t = Toy()
    a = t.conv("a", "x", 8, channels)
    out = t.op("Add", "add", [t.op("Sigmoid", "s", [a]), t.op("Abs", "cpu", [a])])
    graph = t.graph([out])
    target = load_target("bayes-e")
    cm = CostModel(graph, target)
    return [cm.features(Precision.of_plan(make_plan(graph, target, Candidate.make(nodes=ni))))
            for ni in ({}, {"cpu": {"ON": "CPU"}})]


@pytest.mark.parametrize("channels", [1, 4])
def test_a_tensor_between_two_subgraphs_is_converted_per_pixel(channels):
    """hbdk converts a tensor handed from one BPU subgraph to another out of the BPU's layout where it is
    written and into it where it is read, per pixel (16x16 here); a 1-channel tensor is read as it is."""
    one, two = _handed_over(channels)
    assert len(one) == 1 and "relayout_kpix" not in one[0]
    assert len(two) == 2
    assert two[0]["relayout_kpix"] == pytest.approx(16 * 16 / 1e3)          # the Sigmoid's writer side
    assert two[1].get("relayout_kpix", 0.0) == pytest.approx(0.0 if channels == 1 else 16 * 16 / 1e3)
    # and the shipped constants price it: the 1-channel hand-over costs less than the 4-channel one
    assert _handed_over(4)[1][1]["relayout_kpix"] > _handed_over(1)[1][1].get("relayout_kpix", 0.0)


@pytest.mark.parametrize("stride", [1, 2])
def test_hbdk_sees_the_late_int8_fallback(stride):
    """A depthwise Conv with a stride above 1 keeps int16 in hb's calibrated model but is set back to int8
    at quantization (placement.md 3d): the quantized model hbdk compiles reads int8, so fitting on the real
    qtypes prices it in int8; with stride 1 it stays int16."""
    t = Toy()
    out = t.conv("pw", t.conv("dw", "x", 8, 8, stride=stride, group=8), 8, 8, k=1)
    graph = t.graph([out])
    target = load_target("bayes-e")
    cm = CostModel(graph, target)
    plan = make_plan(graph, target, Candidate.make(nodes={"dw": {"InputType": "int16"}}))
    q = {"dw": NodeQtypes("Conv", ("int16", None), ("int8",)), "pw": NodeQtypes("Conv", ("int8", None), (None,))}
    real = real_precision(cm, plan, q)
    assert ("dw" in real.in16) == (stride == 1)
    assert real.in16 == Precision.of_plan(plan).in16


def test_a_max_term_without_rows_cannot_undo_the_fit():
    """Rows whose input and output are the same size (a per-channel scale) are all charged to one of the
    two terms; the other keeps its prior only as far as it bounds no row, so the fitted slope prices them
    (before: a prior of 0.3 us per thousand elements won the max over the fitted 0.1)."""
    rows = []
    for kelem in (20, 50, 100, 200, 400, 800):
        u = LayerUse("n", 0, "scale", "int16", 0, kelem * 1000, kelem * 1000, False)
        rows.append((u, 2.0 + 0.1 * kelem))
    price = fit_price(rows, LayerPrice(2.0, 0.0, 0.3, 0.3), ridge=1e-6)
    for u, us in rows:
        assert price.us(u.macs, u.in_elements, u.elements) == pytest.approx(us, rel=0.02)


def test_rows_next_to_a_cut_stay_out_of_the_per_layer_fit(setup):
    """hbdk's rows of the layers that write or read a cut tensor carry its transfer and layout conversion,
    which the subgraph-level terms price: the per-layer fit leaves them out."""
    _, _, cm = setup
    cut = Precision.of_plan(plan_of(setup, {"/res/Conv": {"ON": "CPU"}}))
    base = Precision.of_plan(plan_of(setup))
    rows = tuple(LayerRow(name=u.head, macs=u.macs, shape=(), aligned=(), compute_us=5.0, load_store_us=1.0)
                 for u in cm.layer_terms(base))
    est = [SubgraphEstimate("s0", 100.0, 0, 0, rows)]
    kept_base = {u.head for u, _ in make_sample(cm, base, 100.0, estimates=est).rows}
    kept_cut = {u.head for u, _ in make_sample(cm, cut, 100.0, estimates=est).rows}
    edge = cm.cut_layers(cut)
    # /stem/Conv writes /stem/relu_out to the CPU Conv; /res/Add reads that Conv's output back
    assert {"/stem/Conv", "/res/Add"} <= edge
    assert not edge & kept_cut and "/gate/Sigmoid" in kept_base and "/gate/Sigmoid" in edge   # now read by sub 1
    assert "/head/seg/Conv" in kept_cut and "/head/seg/Conv" not in edge


def test_int16_costs_more_than_int8(setup):
    base = lat(setup)
    one = lat(setup, {"/gate/Sigmoid": {"InputType": "int16", "OutputType": "int16"}})
    assert one.bpu_ms > base.bpu_ms and one.int16_layers >= 1
    every = lat(setup, optimization=("set_all_nodes_int16",))
    assert every.bpu_ms > one.bpu_ms and every.compiler_ms > base.compiler_ms


def test_real_qtypes_replace_the_plans(setup):
    """Fitting reads int16 from the real calibrated model, not from the plan."""
    graph, target, cm = setup
    plan = plan_of(setup)
    q = {"/res/Conv": NodeQtypes("Conv", ("int16", "int8", None), (None,))}
    p = real_precision(cm, plan, q)
    assert "/res/Conv" in p.in16 and "/res/Conv" not in Precision.of_plan(plan).in16
    assert sum(cm.compiler_us(p)) > sum(cm.compiler_us(Precision.of_plan(plan)))


def test_per_model_fit_scales(setup):
    """Three compiles whose hbdk numbers are the shipped model plus 20 us, with 2x the int16 terms and 1.5x
    the I/O terms: the per-model fit recovers the three, and with them reproduces the compiles."""
    _, _, cm = setup
    truth = {"model": 20.0, "int16": 2.0, "io": 1.5}
    samples = []
    for name, nodes in (("int8", {}), ("int16", {"/res/Conv": {"InputType": "int16", "OutputType": "int16"},
                                                "/gate/Mul": {"InputType": "int16", "OutputType": "int16"}}),
                        ("cut", {"/res/Conv": {"ON": "CPU"}})):
        p = Precision.of_plan(plan_of(setup, nodes))
        samples.append(make_sample(cm, p, sum(cm.compiler_us(p, cm.shipped.scaled(truth))), name))
    scales = fit_scales(samples, cm.shipped, ridge=1e-9)
    for k, v in truth.items():
        assert scales[k] == pytest.approx(v, rel=0.02)
    fitted = cm.shipped.scaled(scales)
    for s in samples:
        assert modeled_us(s, fitted) == pytest.approx(s.hbdk_us, rel=1e-3)
    assert {scale_of("int8"), scale_of("int16"), scale_of("io_kbyte"), scale_of("model")} == \
        {"int8", "int16", "io", "model"}


def test_a_model_fit_is_used_and_said(setup):
    graph, target, cm = setup
    plan = plan_of(setup)
    shipped_constant = cm.shipped.terms.get("model", 0.0)
    fit = ModelFit(model_sha256="0" * 64, march="bayes-e",
                   scales={"model": shipped_constant + 100.0, "int16": 1.0, "io": 1.0}, samples=({"name": "int8"},))
    fitted = CostModel(graph, target, fit=fit).latency(plan)
    assert fitted.compiler_ms == pytest.approx(cm.latency(plan).compiler_ms + 0.1)
    assert "fitted to 1 real compile" in fitted.fitted and cm.latency(plan).fitted == ""
    assert ModelFit.from_json(fit.to_json()) == fit


def test_board_scales_the_bpu_part(setup):
    graph, target, cm = setup
    plan = plan_of(setup)
    base = cm.latency(plan)
    scaled = CostModel(graph, target, board=BoardFit(per_estimate=2.0)).latency(plan)
    assert scaled.bpu_ms == pytest.approx(2.0 * base.compiler_ms) and scaled.switch_ms == base.switch_ms
    # a board's fit replaces the outputs' transfer and the fixed cost: seg [1,3,16,16] + depth [1,1,16,16]
    board = CostModel(graph, target, board=BoardFit(per_estimate=1.0, per_output_mb=1.0, fixed_ms=0.5,
                                                    label="desk")).latency(plan)
    out_mb = 4 * (3 + 1) * 16 * 16 / 1e6
    none = CostModel(graph, target, board=BoardFit(per_estimate=1.0, per_output_mb=0.0, fixed_ms=0.0,
                                                   label="desk")).latency(plan)
    assert board.switch_ms == pytest.approx(none.switch_ms + out_mb + 0.5)
    assert none.switch_ms < base.switch_ms


def test_coefficients_round_trip(setup):
    _, _, cm = setup
    again = BpuCoefficients.from_dict(cm.shipped.to_dict())
    assert again.to_dict() == cm.shipped.to_dict()
    assert again.price("conv", "int16").us(1e6, 0, 0) > again.price("conv", "int8").us(1e6, 0, 0)
    with pytest.raises(TunerError, match="unknown kind"):
        BpuCoefficients.from_dict({"layers": {"warp": {"int8": [1, 2, 3]}}})


def test_marches_without_a_fit_use_their_roofline():
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    for march in ("bernoulli2", "bayes"):
        cm = CostModel(graph, load_target(march))
        assert "roofline" in cm.shipped.source
        assert cm.latency(make_plan(graph, load_target(march), Candidate.make())).compiler_ms > 0


def test_cheap_per_trial(setup):
    """The search pays this per trial: well under 10 ms on the tiny model."""
    _, _, cm = setup
    plan = plan_of(setup, {"/gate/Sigmoid": {"InputType": "int16", "OutputType": "int16"}})
    cm.latency(plan)
    t0 = time.perf_counter()
    for _ in range(50):
        cm.latency(plan)
    assert (time.perf_counter() - t0) / 50 < 0.005


def test_profile_overrides_the_estimate(setup, tmp_path):
    graph, target, _ = setup
    p = tmp_path / "profile.yaml"
    p.write_text("/stem/Conv: {bpu_ms: 5.0, cpu_ms: 50.0}\n")
    cm = CostModel(graph, target, load_profile(p))
    base = cm.latency(make_plan(graph, target, Candidate.make()))
    assert base.bpu_ms > 5.0
    cpu = cm.latency(make_plan(graph, target, Candidate.make(nodes={"/stem/Conv": {"ON": "CPU"}})))
    assert cpu.cpu_ms > 50.0


def test_bad_profile(tmp_path):
    p = tmp_path / "profile.yaml"
    p.write_text("/stem/Conv: {bpu: 5}\n")
    with pytest.raises(TunerError, match="expected {bpu_ms: number, cpu_ms: number}"):
        load_profile(p)
