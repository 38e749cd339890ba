import re

import onnx
import pytest
from helpers import build_tiny_model
from onnx import TensorProto, helper

from tuner.errors import TunerError
from tuner.graph import Graph, fusion_groups, load_target


def test_topological_order_even_when_the_file_is_not_sorted():
    model = build_tiny_model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    graph = Graph(model)
    pos = {n.name: i for i, n in enumerate(graph)}
    for node in graph:
        for t in node.inputs:
            if t in graph.producer:
                assert pos[graph.producer[t].name] < pos[node.name]


def test_activation_tensors_exclude_weights_and_bool_masks():
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    acts = graph.activation_tensors()
    assert "x" in acts and "/stem/Conv_out" in acts
    assert "/stem/Conv.w" not in acts
    assert "/gate/mask" not in acts  # bool output of Greater


def test_fusion_groups_follow_the_target_patterns():
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    groups = [[n.name for n in g] for g in fusion_groups(graph, load_target("bayes-e"))]
    assert ["/stem/Conv", "/stem/BatchNormalization", "/stem/Relu"] in groups
    assert ["/res/Conv", "/res/Add", "/res/Relu"] in groups
    # /gate/Conv feeds two nodes (Sigmoid and Greater): nothing may fuse behind it
    assert not any(g[0] == "/gate/Conv" for g in groups)


def test_unknown_node_names_suggest_close_matches():
    graph = Graph(build_tiny_model())
    with pytest.raises(TunerError, match="did you mean '/stem/Conv'"):
        graph.node("stem/Conv")


def test_cycle_is_reported():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])]))
    with pytest.raises(TunerError, match="cycle"):
        Graph(model)


def test_target_tables():
    t = load_target("bayes-e")
    assert t.bpu_capable("Conv") and not t.bpu_capable("Where")
    assert "Softmax" in t.bpu_default_cpu and t.int16_input("Softmax")
    assert t.int16_input("Conv") and t.int16_output("Conv")            # x5_op_facts S3, S5-S7
    assert not t.int16_input("ConvTranspose") and not t.int16_input("Resize")
    assert t.int16_input("Equal") and not t.int16_output("Equal")
    assert t.int16_input("MatMul", 0) and not t.int16_input("MatMul", 1) and t.int16_output("MatMul")
    dilated = onnx.helper.make_node("Conv", ["x", "w"], ["y"], dilations=[1, 2])
    assert not t.int16_output("Conv", dilated) and t.int16_output("Conv", onnx.helper.make_node("Conv", ["x", "w"], ["y"]))
    assert "HardSwish" not in t.bpu_ops and {"GreaterOrEqual", "LessOrEqual"} <= t.bpu_default_cpu
    assert "ConvTranspose" not in t.int32_output_ops and t.adjust_int16_conv_output
    ultra = load_target("bayes")
    assert not ultra.bpu_capable("PRelu") and not ultra.bpu_capable("Erf") and ultra.int16_input("Conv")
    assert ultra.adjust_int16_conv_output and not ultra.int16_input("DepthToSpace")
    x3 = load_target("bernoulli2")
    assert not x3.int16_ops and not x3.adjust_int16_conv_output and not x3.bpu_capable("Reshape")
    with pytest.raises(TunerError, match="no target table for march 'bayes-x'"):
        load_target("bayes-x")


@pytest.mark.parametrize("extra,fragment", [
    ("int16_inputs: {MatMul: 0}\n", "int16_inputs.MatMul: expected a list of input indices"),
    ("int16_inputs: [MatMul]\n", "int16_inputs: expected a mapping"),
    ("int8_output_only: {Conv: {dilations: one}}\n", "int8_output_only.Conv: expected {attribute: integer limit}"),
])
def test_malformed_int16_rules_are_clear_errors(tmp_path, extra, fragment):
    from tuner.graph.target import TARGETS_DIR

    text = (TARGETS_DIR / "bayes-e.yaml").read_text(encoding="utf-8")
    text = "\n".join(line for line in text.splitlines()
                     if not line.startswith(("int16_inputs:", "int8_output_only:", "  MatMul: [0]", "  Conv: {dil")))
    path = tmp_path / "t.yaml"
    path.write_text(text + "\n" + extra, encoding="utf-8")
    with pytest.raises(TunerError, match=re.escape(fragment)):
        load_target(path)
