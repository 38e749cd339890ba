"""Sessions keep every quantization point of a simulated graph, and skip only fusions that cannot apply."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tuner.runtime.session import PATTERN_OPS, disabled_optimizers, make_session

MS = "com.microsoft"


def _double_rounding_model() -> onnx.ModelProto:
    """x -> Q/DQ (scale 0.1) -> Q/DQ (scale 0.25): two rounding steps, which onnxruntime's
    DoubleQDQPairsRemover would merge into one."""
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s1"),
             numpy_helper.from_array(np.array(0.25, np.float32), "s2"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["q1"], domain=MS),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z"], ["d1"], domain=MS),
             helper.make_node("QuantizeLinear", ["d1", "s2", "z"], ["q2"], domain=MS),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["y"], domain=MS)]
    graph = helper.make_graph(nodes, "double", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)])


def test_two_consecutive_quantization_points_both_round():
    x = np.array([0.12, 0.13, 0.37, -0.38, 1.0], np.float32)
    (y,) = make_session(_double_rounding_model()).run(None, {"x": x})
    step1 = np.clip(np.round(x / np.float32(0.1)), -128, 127) * np.float32(0.1)
    expected = np.clip(np.round(step1 / np.float32(0.25)), -128, 127) * np.float32(0.25)
    merged = np.clip(np.round(x / np.float32(0.25)), -128, 127) * np.float32(0.25)
    assert not np.array_equal(expected, merged)  # the input tells the two semantics apart
    np.testing.assert_array_equal(y, expected.astype(np.float32))


def _model(op_types: list[str]) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i, op in enumerate(op_types):
        nodes.append(helper.make_node(op, [prev], [f"t{i}"]))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_fusions_are_skipped_only_when_the_model_lacks_their_ops():
    plain = disabled_optimizers(_model(["Relu"]))
    assert "LayerNormFusion" in plain and "GeluFusion" in plain
    with_norm = disabled_optimizers(_model(["ReduceMean", "Erf"]))
    assert "LayerNormFusion" not in with_norm and "GeluFusion" not in with_norm
    assert "MatMulAddFusion" in with_norm
    # every skipped fusion is one whose ops the model does not have
    for name in set(plain) & set(PATTERN_OPS):
        assert "Relu" not in PATTERN_OPS[name]


def test_models_with_subgraphs_keep_every_fusion():
    then_branch = helper.make_graph([helper.make_node("Erf", ["x"], ["e"])], "then", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=then_branch)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert not set(disabled_optimizers(model)) & set(PATTERN_OPS)
