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
    assert t.int16_input("Conv") and t.int16_output("Conv")            # docs/hb_rules/ops.md S3, S5-S7
    assert not t.int16_input("ConvTranspose") and not t.int16_input("Resize")
    assert t.int16_input("Equal") and not t.int16_output("Equal")
    assert t.int16_input("MatMul", 0) and not t.int16_input("MatMul", 1) and t.int16_output("MatMul")
    dilated = onnx.helper.make_node("Conv", ["x", "w"], ["y"], dilations=[1, 2])
    assert not t.int16_output("Conv", dilated) and t.int16_output("Conv", onnx.helper.make_node("Conv", ["x", "w"], ["y"]))
    assert "HardSwish" not in t.bpu_ops and {"GreaterOrEqual", "LessOrEqual"} <= t.bpu_default_cpu
    assert "ConvTranspose" not in t.int32_output_ops
    assert t.conv_int16_input_drop == {"depthwise_max_stride": 1, "int32_output_max_taps": 256}   # measured, X5
    ultra = load_target("bayes")
    assert not ultra.bpu_capable("PRelu") and not ultra.bpu_capable("Erf") and ultra.int16_input("Conv")
    assert not ultra.conv_int16_input_drop and not ultra.int16_input("DepthToSpace")
    x3 = load_target("bernoulli2")
    assert not x3.int16_ops and not x3.conv_int16_input_drop and not x3.bpu_capable("Reshape")
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
                     if not line.startswith(("int16_inputs:", "int8_output_only:", "  MatMul: [0]", "  Conv: {dil",
                                             "  GlobalAveragePool: []")))
    path = tmp_path / "t.yaml"
    path.write_text(text + "\n" + extra, encoding="utf-8")
    with pytest.raises(TunerError, match=re.escape(fragment)):
        load_target(path)


#: docs/hb_rules/ops.md §4.3: "CPU计算" on RDK Ultra (S2), BPU ops on X5.
ULTRA_CPU_ONLY = ("Acos", "Acosh", "Asin", "Asinh", "Atanh", "Cosh", "Sinh", "Tan", "Round", "Sign", "Erf", "Selu",
                  "Softsign", "PRelu")
#: docs/hb_rules/ops.md §4.4: the X3 ONNX list's CPU ops (GridSample: "CPU计算※").
X3_CPU = ("Abs", "Acos", "Acosh", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cosh", "Elu", "Equal", "Erf",
          "Expand", "Flatten", "Floor", "Gather", "GatherElements", "Greater", "GreaterOrEqual", "HardSigmoid", "Less",
          "LessOrEqual", "Log", "Max", "Min", "ReduceMax", "ReduceSum", "Reshape", "Round", "Selu", "Sign", "Sinh",
          "Softsign", "Squeeze", "Sub", "Tan", "Tile", "TopK", "Transpose", "Unsqueeze", "GridSample")


def test_target_tables_entry_by_entry():
    """The rows of docs/hb_rules/ops.md §2 and §4 that the target tables must follow, one by one."""
    x5, ultra, x3 = load_target("bayes-e"), load_target("bayes"), load_target("bernoulli2")
    for t in (x5, ultra):
        # section 2: int16 in and out; int8 only; int16 input only
        for op in ("Conv", "MatMul", "Softmax", "Concat", "Add", "Sub", "Mul", "Sigmoid", "MaxPool", "Reshape",
                   "Flatten", "Squeeze", "Unsqueeze", "Relu", "Reciprocal"):
            assert t.int16_input(op) and t.int16_output(op), (t.march, op)
        assert t.int16_output("GlobalAveragePool")
        # measured on X5 (hb_mapper 1.24.3): "The input0 of Node(..., type:GlobalAveragePool) does not support
        # data type: int16", its output may be int16; J5's table keeps S1's "int16 in and out"
        assert t.int16_input("GlobalAveragePool", 0) == (t is ultra)
        for op in ("ConvTranspose", "Resize", "Upsample", "AveragePool", "PRelu", "Gather", "Div", "Gemm"):
            assert not t.int16_input(op) and not t.int16_output(op), (t.march, op)
        for op in ("Equal", "Greater", "Less"):
            assert t.int16_input(op) and not t.int16_output(op), (t.march, op)
        # section 4.1-4.2: default CPU, HardSwish gone, int32 outputs
        assert {"Softmax", "Min", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"} <= t.bpu_default_cpu
        assert not t.bpu_capable("HardSwish")
        assert {"Conv", "Gemm", "MatMul", "HzChannelScale"} <= t.int32_output_ops and "ConvTranspose" not in t.int32_output_ops
        for op in ("Where", "Not", "CumSum", "GatherND", "ScatterND", "InstanceNormalization", "Identity", "Cast",
                   "RoiAlign", "LogSoftmax", "ReduceMin"):
            assert not t.bpu_capable(op), (t.march, op)
    for op in ULTRA_CPU_ONLY:
        assert x5.bpu_capable(op) and not ultra.bpu_capable(op) and not ultra.int16_input(op), op
    assert x5.int16_input("DepthToSpace") and not ultra.int16_input("DepthToSpace") and ultra.bpu_capable("DepthToSpace")
    for op in X3_CPU:
        assert not x3.bpu_capable(op), op
    assert x3.bpu_default_cpu == {"Softmax"} and not x3.int16_ops and not x3.int16_input_only
    for op in ("Conv", "ConvTranspose", "Gemm", "MatMul", "Relu", "Add", "Mul", "Concat", "Resize", "MaxPool"):
        assert x3.bpu_capable(op), op
