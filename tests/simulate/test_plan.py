import onnx
import pytest

from helpers import build_int16_rules_model, build_tiny_model
from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.simulate.plan import make_plan


@pytest.fixture(scope="module")
def graph():
    return Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))


@pytest.fixture(scope="module")
def target():
    return load_target("bayes-e")


def plan_for(graph, target, nodes=None, optimization=()):
    return make_plan(graph, target, Candidate.make(nodes=nodes or {}, optimization=optimization))


def test_default_placement_and_subgraphs(graph, target):
    plan = plan_for(graph, target)
    assert plan.cpu_nodes == ["/gate/Greater", "/gate/Where"]  # Greater defaults to CPU, Where is CPU-only
    # /head/Concat needs the Where output: it cannot share a subgraph with the stem
    assert plan.n_subgraphs == 2
    assert plan.subgraph["/stem/Conv"] == plan.subgraph["/gate/Mul"] != plan.subgraph["/head/Concat"]


def test_fusion_edges_are_not_quantized(graph, target):
    plan = plan_for(graph, target)
    assert ("/stem/BatchNormalization", 0) not in plan.edges
    assert ("/stem/Relu", 0) not in plan.edges
    assert ("/res/Add", 0) not in plan.edges                   # Conv output inside Conv+Add+Relu
    assert plan.edges[("/res/Add", 1)] == ("/stem/relu_out", "int8")  # the residual input is quantized
    assert plan.edges[("/stem/Conv", 0)] == ("x", "int8")


def test_outputs_int32_for_conv_int8_otherwise(graph, target):
    plan = plan_for(graph, target)
    assert "seg" not in plan.outputs          # Conv leaves the BPU in int32
    assert plan.outputs["depth"] == "int8"    # Mul output is rounded to int8
    assert plan.out_dtype["/head/seg/Conv"] == "int32"


def test_bpu_to_cpu_edges_dequantize_the_producer_output(graph, target):
    plan = plan_for(graph, target)
    assert plan.cpu_reads[("/gate/Where", 1)] == ("/gate/mul_out", "int8")
    assert ("/gate/Greater", 0) not in plan.cpu_reads  # Conv output leaves in int32


def test_cpu_placement_splits_and_requantizes(graph, target):
    plan = plan_for(graph, target, {"/res/Add": {"ON": "CPU"}})
    assert plan.placement["/res/Add"] == "CPU"
    assert ("/res/Add", 1) in plan.cpu_reads and ("/res/Add", 0) not in plan.cpu_reads  # Conv output: int32
    assert plan.edges[("/res/Relu", 0)] == ("/res/add_out", "int8")                    # CPU->BPU quantizes again
    assert plan.n_subgraphs > plan_for(graph, target).n_subgraphs


def test_int16_honoured_where_the_march_allows_it(graph, target):
    plan = plan_for(graph, target, {"/gate/Sigmoid": {"InputType": "int16"}, "/head/Concat": {"InputType1": "int16"}})
    assert plan.edges[("/gate/Sigmoid", 0)] == ("/gate/Conv_out", "int16")
    assert plan.edges[("/head/Concat", 1)] == ("/stem/relu_out", "int16")
    assert plan.edges[("/head/Concat", 0)] == ("/gate/where_out", "int8")
    assert plan.notes == []


def test_int16_refused_on_conv_transpose_falls_back_with_a_note(target):
    """ConvTranspose is int8 only on bayes-e (x5_op_facts S3)."""
    rules = Graph(onnx.shape_inference.infer_shapes(build_int16_rules_model()))
    plan = plan_for(rules, target, {"/up/ConvTranspose": {"InputType": "int16"}})
    assert plan.edges[("/up/ConvTranspose", 0)] == ("/dil/tanh", "int8")
    assert any("/up/ConvTranspose" in n and "int16 input not supported" in n for n in plan.notes)


def test_output_type_int16_reaches_int16_capable_consumers(graph, target):
    plan = plan_for(graph, target, {"/gate/Sigmoid": {"OutputType": "int16"}})
    assert plan.edges[("/gate/Mul", 1)] == ("/gate/sig_out", "int16")
    assert plan.out_dtype["/gate/Sigmoid"] == "int16"


def test_set_all_nodes_int16(graph, target):
    plan = plan_for(graph, target, optimization=("set_all_nodes_int16",))
    assert plan.edges[("/gate/Mul", 0)][1] == "int16"
    assert plan.edges[("/stem/Conv", 0)][1] == "int16"  # Conv takes int16 on bayes-e (x5_op_facts S3, S7)
    assert plan.notes == []                              # set_all_nodes_int16 is silent where it cannot apply


def test_forcing_a_cpu_only_op_onto_the_bpu_is_refused(graph, target):
    plan = plan_for(graph, target, {"/gate/Where": {"ON": "BPU"}, "/gate/Greater": {"ON": "BPU"}})
    assert plan.placement["/gate/Where"] == "CPU" and plan.placement["/gate/Greater"] == "BPU"
    assert any("/gate/Where" in n for n in plan.notes)


def test_unknown_node_is_an_error(graph, target):
    with pytest.raises(TunerError, match="'/stem/Conv2' is not in the model"):
        plan_for(graph, target, {"/stem/Conv2": {"ON": "CPU"}})
