"""Toy models Conv -> fused activation -> Conv (onnx helper API, opset 11), one per activation form hb_mapper
fuses into one node (tuner.graph.optimize), for the rule that such a node cannot run on the CPU
(tuner.simulate.placement.CPU_RUNTIME_LACKS; docs/hb_rules/placement.md section 8).

``ACTIVATIONS``: form -> (fused kind, the node hb names the fused node after, the other members).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from helpers import hb_yaml
from onnx import TensorProto, helper, numpy_helper

ACTIVATIONS = {
    "hardsigmoid": ("HzHardSwish", "mul", ("hsig",)),
    "hardswish_div": ("HzHardSwish", "mul", ("add", "clip", "div")),
    "silu": ("HzSwish", "mul", ("sig",)),
    "mish": ("HzMish", "mul", ("softplus", "tanh")),
    "gelu": ("HzGelu", "mul2", ("div", "erf", "add", "mul")),
}


def _activation(form: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing ``form`` from tensor ``a`` into tensor ``b``, and their constants."""
    consts: list[onnx.TensorProto] = []

    def k(name: str, value: float) -> str:
        consts.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    mk = helper.make_node
    nodes = {
        "hardsigmoid": [mk("HardSigmoid", ["a"], ["h"], name="hsig", alpha=1 / 6, beta=0.5),
                        mk("Mul", ["a", "h"], ["b"], name="mul")],
        "hardswish_div": [mk("Add", ["a", k("three", 3.0)], ["p"], name="add"),
                          mk("Clip", ["p", k("zero", 0.0), k("six", 6.0)], ["q"], name="clip"),
                          mk("Mul", ["a", "q"], ["r"], name="mul"), mk("Div", ["r", k("six_d", 6.0)], ["b"], name="div")],
        "silu": [mk("Sigmoid", ["a"], ["s"], name="sig"), mk("Mul", ["a", "s"], ["b"], name="mul")],
        "mish": [mk("Softplus", ["a"], ["sp"], name="softplus"), mk("Tanh", ["sp"], ["t"], name="tanh"),
                 mk("Mul", ["a", "t"], ["b"], name="mul")],
        "gelu": [mk("Div", ["a", k("sqrt2", 1.4142135)], ["d"], name="div"), mk("Erf", ["d"], ["e"], name="erf"),
                 mk("Add", ["e", k("one", 1.0)], ["f"], name="add"), mk("Mul", ["a", "f"], ["g"], name="mul"),
                 mk("Mul", ["g", k("half", 0.5)], ["b"], name="mul2")],
    }[form]
    return nodes, consts


def activation_model(form: str) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    nodes, inits = _activation(form)
    inits += [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.4).astype(np.float32), "w1"),
              numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1] * 4), *nodes,
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2")]
    g = helper.make_graph(nodes, form, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    onnx.checker.check_model(model)
    return model


def write_activation_toy(root: Path, form: str, cpu: tuple[str, ...] = ()) -> Path:
    """The toy, 4 calibration samples and an hb_mapper YAML putting the nodes ``cpu`` on the CPU."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(activation_model(form), str(root / "toy.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    rng = np.random.default_rng(4)
    for i in range(4):
        rng.standard_normal((1, 4, 8, 8)).astype(np.float32).tofile(root / "cal" / f"{i:04d}.bin")
    node_info = "{" + ", ".join(f"'{n}': {{'ON': 'CPU'}}" for n in cpu) + "}"
    cfg = root / f"cfg_{'_'.join(cpu) or 'none'}.yaml"
    cfg.write_text(hb_yaml("toy.onnx", "x", "1x4x8x8", node_info=node_info, prefix="toy"))
    return cfg
