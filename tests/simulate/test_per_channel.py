"""hb_mapper's per_channel: which Conv inputs it quantizes per channel, with which scales
(tuner.simulate.perchannel, docs/hb_rules/calibration.md section 5), and how they are deployed.

* the scale rule against hb's own C++ (``data/hb_channel_scales.json``: 67 probes measured on
  ``set_calibration_channel_scale``, our arrays);
* the tensor rule on a toy with every kind of writer and reader measured (Conv, Conv+Relu, Conv+Add,
  lowered Mul, model input; MaxPool, Concat, LeakyRelu, ConvTranspose, an Abs reader, 2x2 maps, a
  maximum below 16), and, with the real toolchain installed, the same toy converted at O0: the tensors
  with channel scales, their thresholds and the Convs that read them equalized are the calibrated
  model's;
* the deployed arithmetic written out independently (per-channel quantization, one dequantize_scale,
  weights scaled before their int8 rounding), and hb's table printing channel 0's threshold.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import hb_yaml, save_toy_model
from onnx import TensorProto, helper, numpy_helper

from tuner.candidate import Calibration, Candidate
from tuner.simulate.perchannel import MIN_MAX, Reader, activation_bound, candidates, channel_scales, equalization
from tuner.simulate.qdq import build_sim_model
from tuner.simulate.scales import channelwise
from tuner.simulate.weights import fake_quant_weight
from tuner.workspace import Workspace

PROBES = Path(__file__).parent / "data" / "hb_channel_scales.json"
PER_CHANNEL = Calibration("max", per_channel=True)


# -- the scales ------------------------------------------------------------------------------------
def test_channel_scales_are_hbs_on_every_probe():
    """hb's C++ on 67 probes (one g=1 Conv reader, a grouped one, three readers, a depthwise and a g=1
    one; designed weight ranges, near ties, the 16 floor, random weights): tuner's scales to float32."""
    doc = json.loads(PROBES.read_text())
    assert len(doc["probes"]) >= 60
    for i, p in enumerate(doc["probes"]):
        ws = {f"w{k}": np.asarray(r["weight"], np.float32) for k, r in enumerate(p["readers"])}
        ws = {k: w.reshape(w.shape + (1,) * (4 - w.ndim)) for k, w in ws.items()}
        readers = [Reader(f"w{k}", r["group"]) for k, r in enumerate(p["readers"])]
        got = equalization(np.asarray(p["maxima"], np.float32), readers, ws.__getitem__)
        if p["scales"] is None:
            assert got is None, i
        else:
            assert got is not None, i
            np.testing.assert_allclose(got, p["scales"], rtol=2e-6, err_msg=f"probe {i}")


def test_a_depthwise_reader_takes_the_activation_bound_and_16_is_the_floor():
    a = np.array([16.0, 8.0, 1.0, 0.0])
    dw = {"w": np.ones((4, 1, 3, 3), np.float32)}
    got = equalization(a, [Reader("w", 4)], dw.__getitem__)
    np.testing.assert_allclose(got, (16 + 0.016) / (a + 0.016))
    assert got[0] == 1 and got[3] == pytest.approx(1001)
    assert equalization(a * np.nextafter(MIN_MAX, 0) / MIN_MAX, [Reader("w", 4)], dw.__getitem__) is None
    assert equalization(np.array([100.0]), [Reader()], dw.__getitem__) is None
    # readers without weights (a lowered Mul, a residual Add) take the bound too; the node takes the largest
    np.testing.assert_allclose(equalization(a, [Reader()], dw.__getitem__), activation_bound(a))


# -- the tensors ------------------------------------------------------------------------------------
class _Toy:
    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.outputs: list[str] = []

    def conv(self, name: str, x: str, cin: int = 8, cout: int = 8, k: int = 3, group: int = 1, scale: float = 0.3,
             stride: int = 1, pad: bool = True) -> str:
        w = (self.rng.normal(0, scale, (cout, cin // group, k, k))).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, f"{name}.w"))
        self.nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [name], name=name, group=group, kernel_shape=[k, k],
                                           pads=[k // 2 if pad else 0] * 4, strides=[stride, stride]))
        return name

    def dw(self, name: str, x: str) -> str:
        return self.conv(name, x, group=8)

    def op(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def out(self, *names: str) -> None:
        self.outputs.extend(names)


#: channel ranges of the toy's input (x 3): every selected tensor's maximum is well above 16
CHANNEL_SCALE = np.array([1, 2, 4, 8, 16, 3, 5, 7], np.float32)
#: tensors hb gives channel scales (measured: the same branches converted with hb_mapper 1.24.3)
SELECTED = {"x", "t1", "t2", "t3", "a4", "t4", "t6", "t7", "b12", "t12"}
#: tensors whose writer and readers qualify but whose largest maximum is below 16
SMALL = {"t14"}


def write_toy(root: Path, n: int = 4) -> Path:
    """x (1x8x16x16) read by sixteen Convs, one branch per writer/reader case."""
    b = _Toy()
    b.out(b.dw("d1", b.conv("t1", "x")))                                   # Conv -> depthwise
    b.out(b.conv("e2", b.conv("t2", "x"), k=1))                            # Conv -> g=1 1x1
    b.out(b.dw("d3", b.op("Relu", [b.conv("c3", "x")], "t3")))            # Conv+Relu -> depthwise
    relu4 = b.op("Relu", [b.conv("ca4", "x")], "a4")                       # Conv+Add, a4 its residual input
    add = b.op("Add", [relu4, b.conv("c4", "x")], "t4")
    b.out(b.dw("d4", add))
    t5 = b.conv("t5", "x")                                                 # an Abs reads it too: per tensor
    b.out(b.dw("d5", t5), b.op("Abs", [t5], "abs5"))
    t6 = b.conv("t6", "x")                                                 # a depthwise and a g=1 reader
    b.out(b.dw("d6", t6), b.conv("e6", t6, k=1))
    b.out(b.conv("e7", b.conv("t7", "x"), group=2))                        # a grouped reader
    b.out(b.dw("d8", b.op("MaxPool", [b.conv("a8", "x")], "t8", kernel_shape=[2, 2], strides=[2, 2])))
    cat = b.op("Concat", [b.conv("a10", "x", cout=4), b.conv("b10", "x", cout=4)], "t10", axis=1)
    b.out(b.dw("d10", cat))
    b.inits.append(numpy_helper.from_array(b.rng.normal(0, 0.3, (8, 4, 2, 2)).astype(np.float32), "ct.w"))
    b.out(b.op("ConvTranspose", [b.conv("t11", "x"), "ct.w"], "ct11", kernel_shape=[2, 2], strides=[2, 2]))
    b.inits.append(numpy_helper.from_array(b.rng.uniform(0.5, 2, (1, 8, 1, 1)).astype(np.float32), "k12"))
    relu12 = b.op("Relu", [b.conv("c12", "x")], "b12")                     # a lowered Mul reads it, writes t12
    b.out(b.dw("d12", b.op("Mul", [relu12, "k12"], "t12")))
    b.out(b.dw("d13", b.op("LeakyRelu", [b.conv("c13", "x")], "t13", alpha=0.1)))
    b.out(b.dw("d14", b.conv("t14", "x", scale=0.0003)))                   # maximum below 16
    b.out(b.conv("e15", b.conv("t15", "x", k=8, stride=8, pad=False), k=1))  # a 2x2 map
    save_toy_model(root / "pc.onnx", b.nodes, b.inits, [1, 8, 16, 16], b.outputs, graph_name="per_channel")
    (root / "cal").mkdir(exist_ok=True)
    for i in range(n):
        x = np.random.default_rng(i).normal(0, 1, (1, 8, 16, 16)) * CHANNEL_SCALE[None, :, None, None] * 3
        x.astype(np.float32).tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("pc.onnx", "x", "1x8x16x16", prefix="pc").replace("per_channel: False", "per_channel: True"))
    return cfg


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        cfg = write_toy(tmp_path_factory.mktemp("per_channel"))
        yield cfg, Workspace.open(cfg)


def _selection(ws: Workspace, cal: Calibration = PER_CHANNEL, nodes: dict | None = None) -> dict[str, np.ndarray]:
    plan = ws.simulator.plan(Candidate.make(cal, nodes or {}))
    return channel_scales(ws.graph, plan, ws.simulator.stats)


def test_the_tensors_hb_quantizes_per_channel(toy):
    _, ws = toy
    plan = ws.simulator.plan(Candidate.make(PER_CHANNEL))
    structural = set(candidates(ws.graph, plan))
    assert structural == SELECTED | SMALL
    selected = _selection(ws)
    assert set(selected) == SELECTED
    assert all(float(ws.simulator.stats[t].channel_absmax.max()) >= MIN_MAX for t in SELECTED)
    assert float(ws.simulator.stats["t14"].channel_absmax.max()) < MIN_MAX
    # a g=1 reader alone leaves t2 at ones (per channel in name only), the depthwise readers do not
    assert np.all(selected["t2"] == 1) and np.all(selected["t6"] == activation_bound(ws.simulator.stats["t6"].channel_absmax))
    # x is read by sixteen Convs of every kind: the element-wise largest of their proposals
    assert 1 < selected["x"].max() < activation_bound(ws.simulator.stats["x"].channel_absmax).max()


def test_a_reader_on_the_cpu_keeps_the_tensor_per_tensor(toy):
    _, ws = toy
    assert "t1" not in _selection(ws, nodes={"d1": {"ON": "CPU"}})
    assert "t1" in _selection(ws, nodes={"d3": {"ON": "CPU"}})


def test_only_the_selected_convs_are_equalized(toy):
    """Equalized weights (``__w8eq``) exactly on the Conv readers of the selected tensors."""
    _, ws = toy
    sim = ws.simulator
    cand = Candidate.make(PER_CHANNEL)
    model = build_sim_model(ws.model.proto, sim.graph, ws.target, sim.plan(cand), sim.scales(PER_CHANNEL), sim.weights)
    eq = {n.name for n in model.graph.node if any("__w8eq" in i for i in n.input)}
    readers = {c.name for t in SELECTED for c, k in ws.graph.consumers[t] if c.op_type == "Conv" and k == 0}
    assert eq == readers
    assert {"d5", "d8", "d10", "d13", "d14", "e15"}.isdisjoint(eq)
    # without per_channel nothing is equalized
    plain = build_sim_model(ws.model.proto, sim.graph, ws.target, sim.plan(Candidate.make(Calibration("max"))),
                            sim.scales(Calibration("max")), sim.weights)
    assert not any("__w8eq" in i for n in plain.graph.node for i in n.input)


def test_hbs_table_prints_channel_0s_threshold(toy):
    _, ws = toy
    ev = ws.simulator.evaluate(Candidate.make(PER_CHANNEL), per_node=True)
    rows = {r.name: r for r in ev.nodes}
    cs = _selection(ws)["t1"]
    T = float(ws.simulator.stats["t1"].channel_absmax.max())
    assert rows["d1"].threshold == pytest.approx(T / cs[0], rel=1e-6)
    assert rows["d5"].threshold == pytest.approx(float(ws.simulator.stats["t5"].absmax), rel=1e-6)


def test_the_selection_and_thresholds_are_the_real_tools(hb_toolchain, toy):
    """The toy converted at O0 with per_channel: the tensors whose calibration node has per-channel
    thresholds, those thresholds (T / cs_c) and the Convs reading an equalized node (dequantize_scale)."""
    from tuner.inputs.calibrated import read_calibrated
    from tuner.toolchain.hbrun import CompileKnobs, convert

    cfg, ws = toy
    conv = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert conv.ok, conv.error
    real = read_calibrated(conv.model("calibrated"))
    per_channel = {n.tensor: n for n in real.activations() if n.per_channel}
    assert set(per_channel) == SELECTED
    selected = _selection(ws)
    table = ws.simulator.scales(PER_CHANNEL)
    for t, node in per_channel.items():
        mine = channelwise(table.get(t, "int8"), selected[t])
        np.testing.assert_allclose(np.asarray(mine.scale, np.float64) * 127, node.thresholds, rtol=1e-4, err_msg=t)
    readers = {}
    for n in real.proto.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    equalized = {r.name for n in real.activations() if n.dequantize_scale is not None
                 for r in readers.get(n.output, []) if r.op_type == "Conv"}
    # hb's Convs include the lowered Mul (tuner's HzChannelScale reads the per-channel point instead)
    assert equalized == {c.name for t in SELECTED for c, k in ws.graph.consumers[t]
                         if c.op_type in ("Conv", "HzChannelScale") and k == 0}


# -- the deployed arithmetic -----------------------------------------------------------------------------
#: input channel ranges of the one-Conv model, and its weight's input-channel ranges (largest where the
#: activation is smallest): its g=1 Conv moves them towards one another
RANGES = np.array([0.5, 2.0, 20.0, 200.0], np.float32)
COLUMNS = np.array([8.0, 4.0, 2.0, 1.0], np.float32)


def write_conv(root: Path, n: int = 6) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.2 * COLUMNS[None, :, None, None]).astype(np.float32)
    b = (rng.standard_normal(6) * 0.1).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="/conv", pads=[1] * 4)], "pc",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), str(root / "c.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    for i in range(n):
        (rng.uniform(-1.0, 1.0, (1, 4, 8, 8)) * RANGES[None, :, None, None]).astype(np.float32).tofile(
            root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("c.onnx", "x", "1x4x8x8", prefix="c"))
    return cfg


def test_a_per_channel_input_reaches_the_conv_by_equalization(tmp_path, monkeypatch):
    """The deployed arithmetic written out: the input quantized per channel (t_c / 127 with t_c = T / cs_c),
    dequantized with T / 127 (dequantize_scale), convolved with the weights scaled by t_c / T and only
    then int8-quantized per output channel; the bias int32 at (T / 127) x the scaled weight's scale."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    ws = Workspace.open(write_conv(tmp_path / "conv"))
    sim = ws.simulator
    cs = _selection(ws)["x"]
    assert cs[3] == 1 and np.all(cs[:3] > 1.5)          # the weight ranges 8, 4, 2, 1 brought together
    sample = next(iter(ws.eval_data))
    x = sample["x"].astype(np.float64)
    T = float(ws.stats["x"].channel_absmax.max())
    t = T / cs
    q = np.clip(np.round(x / (t / 127).reshape(1, -1, 1, 1)), -128, 127)
    x_deq = (q * T / 127).astype(np.float32)
    w = numpy_helper.to_array(ws.graph.initializers["w"]).astype(np.float64)
    w_scaled = w * (t / T).reshape(1, -1, 1, 1)
    conv = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["a", "w"], ["y"], pads=[1] * 4)], "c",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(fake_quant_weight(w_scaled, 0).astype(np.float32), "w")]),
        opset_imports=[helper.make_opsetid("", 11)])
    y_ref = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": x_deq})[0]
    bias = numpy_helper.to_array(ws.graph.initializers["b"]).astype(np.float64)
    b_scale = T / 127 * np.abs(w_scaled).reshape(6, -1).max(axis=1) / 127
    y_ref = y_ref + (np.round(bias / b_scale) * b_scale).reshape(1, -1, 1, 1).astype(np.float32)
    got, _ = sim.tensors(Candidate.make(PER_CHANNEL), ["y"], sample)
    np.testing.assert_allclose(got["y"], y_ref, rtol=1e-4, atol=1e-4 * float(np.abs(y_ref).max()))
    # and it helps: the small channels are no longer crushed by the 200 one
    base = sim.evaluate(Candidate.make(Calibration("max")))
    assert sim.evaluate(Candidate.make(PER_CHANNEL)).outputs["y"]["sqnr_db"] > base.outputs["y"]["sqnr_db"] + 1
