import onnx
import pytest
from helpers import build_tiny_model

from tuner.candidate import Candidate
from tuner.cost.latency import CostModel, load_profile, node_macs
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.simulate.plan import make_plan


@pytest.fixture(scope="module")
def setup():
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    target = load_target("bayes-e")
    return graph, target, CostModel(graph, target)


def lat(setup, nodes=None, optimization=()):
    graph, target, cm = setup
    return cm.latency(make_plan(graph, target, Candidate.make(nodes=nodes or {}, optimization=optimization)))


def test_conv_macs_by_hand(setup):
    graph, _, _ = setup
    # /stem/Conv: 8 output channels x 16x16 pixels x (4 input channels x 3x3 kernel)
    assert node_macs(graph, graph.by_name["/stem/Conv"]) == 8 * 16 * 16 * 4 * 9
    assert node_macs(graph, graph.by_name["/gate/Sigmoid"]) == 8 * 16 * 16


def test_cpu_nodes_and_switches_cost_more(setup):
    base = lat(setup)
    one_cpu = lat(setup, {"/res/Add": {"ON": "CPU"}})
    assert one_cpu.total_ms > base.total_ms
    assert one_cpu.cpu_ms > base.cpu_ms and one_cpu.switch_ms > base.switch_ms
    assert one_cpu.subgraphs > base.subgraphs


def test_int16_costs_more_than_int8(setup):
    assert lat(setup, {"/gate/Sigmoid": {"InputType": "int16", "OutputType": "int16"}}).bpu_ms > lat(setup).bpu_ms


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
