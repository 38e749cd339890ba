import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.inputs.model import load_model


def test_not_a_file(tmp_path):
    with pytest.raises(TunerError, match="model file not found"):
        load_model(tmp_path / "missing.onnx")


def test_not_onnx(tmp_path):
    p = tmp_path / "model.onnx"
    p.write_bytes(b"\x89PNG\r\n\x1a\n not a model at all")
    with pytest.raises(TunerError, match="not an ONNX model"):
        load_model(p)


def _dynamic_model(tmp_path, opset=11, named=True, constant=False):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = []
    if constant:
        nodes.append(helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full((1,), 2.0, np.float32))))
    else:
        nodes.append(helper.make_node("Identity", ["x"], ["k0"], name="id" if named else ""))
    nodes.append(helper.make_node("Mul", ["x", "k" if constant else "k0"], ["m"], name="mul" if named else ""))
    nodes.append(helper.make_node("Relu", ["m"], ["y"], name="" if not named else "relu"))
    g = helper.make_graph(nodes, "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    p = tmp_path / "dyn.onnx"
    onnx.save(m, str(p))
    return p


def test_dynamic_shape_needs_input_shape(tmp_path):
    p = _dynamic_model(tmp_path)
    with pytest.raises(TunerError, match="dynamic shape; set input_parameters.input_shape"):
        load_model(p)
    model = load_model(p, {"x": (1, 2, 4, 4)})
    assert model.input_shapes == {"x": (1, 2, 4, 4)}


def test_input_shape_rank_mismatch(tmp_path):
    with pytest.raises(TunerError, match="has rank 3"):
        load_model(_dynamic_model(tmp_path), {"x": (2, 4, 4)})


def test_opset_above_target_warns(tmp_path):
    model = load_model(_dynamic_model(tmp_path, opset=13), {"x": (1, 2, 4, 4)}, max_opset=11)
    assert any("opset 13" in w for w in model.warnings)
    assert not load_model(_dynamic_model(tmp_path, opset=11), {"x": (1, 2, 4, 4)}, max_opset=11).warnings


def test_unnamed_nodes_get_deterministic_names(tmp_path):
    p = _dynamic_model(tmp_path, named=False)
    # The names as the exported graph has them (hb_mapper's optimizer would then drop the Identity).
    a = load_model(p, {"x": (1, 2, 4, 4)}, hb_optimize=False)
    b = load_model(p, {"x": (1, 2, 4, 4)}, hb_optimize=False)
    names = [n.name for n in a.proto.graph.node]
    assert names == ["Identity_0", "Mul_0", "Relu_0"]
    assert names == [n.name for n in b.proto.graph.node]
    assert any("no name" in w for w in a.warnings)


def test_constants_become_initializers(tmp_path):
    model = load_model(_dynamic_model(tmp_path, constant=True), {"x": (1, 2, 4, 4)})
    assert "k" in {t.name for t in model.proto.graph.initializer}
    assert all(n.op_type != "Constant" for n in model.proto.graph.node)


def _static_model(tmp_path, dims):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    p = tmp_path / "static.onnx"
    onnx.save(m, str(p))
    return p


def test_input_shape_must_match_static_dims(tmp_path):
    p = _static_model(tmp_path, [1, 3, 256, 320])
    with pytest.raises(TunerError, match=r"input_shape 1x3x320x256 does not match input 'x'.s static shape "
                                         r"1x3x256x320 \(dimension 2, 3\)"):
        load_model(p, {"x": (1, 3, 320, 256)})
    assert load_model(p, {"x": (1, 3, 256, 320)}).input_shapes == {"x": (1, 3, 256, 320)}
    # a dynamic dimension may take any value, the static ones must match
    p = _static_model(tmp_path, ["N", 3, 256, "W"])
    assert load_model(p, {"x": (4, 3, 256, 100)}).input_shapes == {"x": (4, 3, 256, 100)}
    with pytest.raises(TunerError, match=r"static shape Nx3x256xN|static shape \?x3x256x\?"):
        load_model(p, {"x": (4, 3, 255, 100)})


def test_git_lfs_pointer_and_truncated_models_are_named(tmp_path):
    p = tmp_path / "model.onnx"
    p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 23847291\n")
    with pytest.raises(TunerError, match=r"model.onnx: a Git LFS pointer \(\d+ bytes\), not the model; .*git lfs pull"):
        load_model(p)
    whole = _static_model(tmp_path, [1, 3, 8, 8]).read_bytes()
    for cut in (len(whole) // 2, len(whole) - 1):
        p.write_bytes(whole[:cut])
        with pytest.raises(TunerError, match=rf"model.onnx: a truncated or damaged ONNX file \({cut} bytes"):
            load_model(p)
