"""hb_mapper's fixed and derived thresholds and its uint8 choice under asymmetric (tuner.simulate.fixed).

Two toy models built with the onnx helper API: ``lut`` (Sigmoid, HardSigmoid and Tanh in the
situations measured on the real toolchain: sole reader, shared input, behind a Slice group or a
MaxPool, at a model output) and ``relu`` (Conv+Relu/Clip outputs with every kind of reader measured).
The rules are checked on tuner's plan and on the simulated model's values; with the real toolchain
installed, the same toys are converted at O0 and tuner's thresholds and qtypes are compared with the
calibrated model's, tensor by tensor (docs/hb_rules/calibration.md sections 4 and 6).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrated_models import calibrate
from helpers import hb_yaml, save_toy_model
from onnx import helper, numpy_helper

from tuner.candidate import Calibration, Candidate
from tuner.simulate.qdq import plan_scales
from tuner.simulate.scales import FIXED_INPUT
from tuner.workspace import Workspace

SIG8, SIG16 = FIXED_INPUT["Sigmoid"]["int8"], FIXED_INPUT["Sigmoid"]["int16"]


def _sigmoid(t: float) -> float:
    return 1.0 / (1.0 + math.exp(-t))


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.outputs: list[str] = []

    def conv(self, name: str, x: str, cin: int = 4, cout: int = 4, k: int = 3, scale: float = 0.3, group: int = 1,
             pad: int | None = None) -> str:
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, f"{name}.w"))
        p = k // 2 if pad is None else pad
        self.nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [name], name=name, pads=[p] * 4, group=group))
        return name

    def op(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, name: str, value, dtype=np.float32) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def write(self, root: Path, name: str, sample, n: int = 6, node_info: str = "{}") -> Path:
        save_toy_model(root / f"{name}.onnx", self.nodes, self.inits, [1, 4, 8, 8], self.outputs)
        (root / "cal").mkdir(exist_ok=True)
        rng = np.random.default_rng(7)
        for i in range(n):
            sample(rng).astype(np.float32).tofile(root / "cal" / f"{i:04d}.bin")
        cfg = root / "hb_config.yaml"
        cfg.write_text(hb_yaml(f"{name}.onnx", "x", "1x4x8x8", node_info=node_info, prefix=name))
        return cfg


def write_lut_project(root: Path) -> Path:
    b = _Builder(3)
    sl = {k: b.const(k, v, np.int64) for k, v in (("s0", [0]), ("e0", [2]), ("s1", [2]), ("e1", [4]), ("ax", [1]))}
    # sole reader: the Conv output (max ~25) reaches the Sigmoid only
    b.outputs.append(b.conv("/one/out", b.op("Sigmoid", [b.conv("/one/conv", "x", scale=1.5)], "/one/sig")))
    # shared: a Conv reads the Sigmoid's input too
    sh = b.conv("/sh/conv", "x", scale=1.5)
    b.outputs += [b.conv("/sh/out", b.op("Sigmoid", [sh], "/sh/sig")), b.conv("/sh/out2", sh)]
    # the example's depth head: Conv -> Resize -> two Slices -> two Sigmoids
    rs = b.op("Resize", [b.conv("/grp/conv", "x", scale=1.5), b.const("roi", []), b.const("sc", [1, 1, 2, 2])],
              "/grp/rs", mode="linear")
    for k, (s, e) in enumerate((("s0", "e0"), ("s1", "e1"))):
        part = b.op("Slice", [rs, sl[s], sl[e], sl["ax"]], f"/grp/sl{k}")
        b.outputs.append(b.conv(f"/grp/out{k}", b.op("Sigmoid", [part], f"/grp/sig{k}"), cin=2))
    # a Slice group whose first member feeds a Conv: only the Sigmoid's Slice is fixed
    mix = b.conv("/mix/conv", "x", scale=1.5)
    b.outputs += [b.conv("/mix/out0", b.op("Slice", [mix, sl["s0"], sl["e0"], sl["ax"]], "/mix/sl0"), cin=2),
                  b.conv("/mix/out1", b.op("Sigmoid", [b.op("Slice", [mix, sl["s1"], sl["e1"], sl["ax"]], "/mix/sl1")],
                                           "/mix/sig1"), cin=2)]
    # behind a MaxPool: hb's node is the MaxPool's input, read by the MaxPool
    mp = b.op("MaxPool", [b.conv("/mp/conv", "x", scale=1.5)], "/mp/pool", kernel_shape=[2, 2], strides=[2, 2])
    b.outputs.append(b.conv("/mp/out", b.op("Sigmoid", [mp], "/mp/sig")))
    # HardSigmoid alone and shared (a small input: output alpha T + beta < 1), Tanh
    b.outputs.append(b.conv("/hs/out", b.op("HardSigmoid", [b.conv("/hs/conv", "x", scale=1.5)], "/hs/hsig",
                                            alpha=1 / 6, beta=0.5)))
    hs2 = b.conv("/hs2/conv", "x", scale=0.1)
    b.outputs += [b.conv("/hs2/out", b.op("HardSigmoid", [hs2], "/hs2/hsig", alpha=1 / 6, beta=0.5)),
                  b.conv("/hs2/out2", hs2)]
    b.outputs.append(b.conv("/th/out", b.op("Tanh", [b.conv("/th/conv", "x", scale=0.1)], "/th/tanh")))
    # a Sigmoid at a model output
    b.outputs.append(b.op("Sigmoid", [b.conv("/o/conv", "x", scale=1.5)], "/o/sig"))
    return b.write(root, "lut", lambda rng: rng.standard_normal((1, 4, 8, 8)))


@pytest.fixture(scope="module")
def lut(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        cfg = write_lut_project(tmp_path_factory.mktemp("lut"))
        yield cfg, Workspace.open(cfg)


def _thresholds(ws, cal: Calibration, candidate: Candidate | None = None):
    """(plan, tensor -> threshold) as the simulated model quantizes it (plan rules applied)."""
    cand = candidate or Candidate.make(cal)
    plan = ws.simulator.plan(cand)
    scales = plan_scales(ws.simulator.scales(cal), plan)
    dtypes = {t: d for t, d in list(plan.edges.values()) + list(plan.passthrough.values()) + list(plan.outputs.items())}

    def thr(t: str) -> float:
        return scales.threshold(plan.scale_of.get(t, t), dtypes.get(t, "int8"))
    return plan, thr


def test_a_sigmoid_that_alone_reads_its_input_has_hbs_fixed_threshold(lut):
    _, ws = lut
    assert ws.stats["/one/conv"].absmax > 2 * SIG8           # the data would give a much larger threshold
    for cal in (Calibration("max"), Calibration("kl"), Calibration("max", 0.99995)):
        plan, thr = _thresholds(ws, cal)
        assert thr("/one/conv") == pytest.approx(SIG8)
        assert thr("/one/sig") == pytest.approx(_sigmoid(SIG8))        # 0.995926, not the output's max
    # the simulated Sigmoid computes on its input clipped at 5.49897 (the data reaches 5x that)
    sim, ref = ws.simulator.tensors(Candidate.make(Calibration("max")), ["/one/sig"], next(iter(ws.eval_data)))
    assert ref["/one/sig"].max() > _sigmoid(SIG8) + 1e-3
    assert sim["/one/sig"].max() <= _sigmoid(SIG8) + 1e-6


def test_a_shared_input_keeps_its_threshold_and_the_output_follows_it(lut):
    _, ws = lut
    plan, thr = _thresholds(ws, Calibration("max"))
    t = ws.stats["/sh/conv"].absmax
    assert "/sh/conv" not in plan.fixed and thr("/sh/conv") == pytest.approx(t, rel=1e-6)
    assert thr("/sh/sig") == pytest.approx(_sigmoid(t), rel=1e-9)
    # HardSigmoid shared with a Conv: alpha T + beta (below 1), its own max would be smaller still
    t2 = ws.stats["/hs2/conv"].absmax
    assert thr("/hs2/conv") == pytest.approx(t2, rel=1e-6)
    assert thr("/hs2/hsig") == pytest.approx(t2 / 6 + 0.5, rel=1e-6) and thr("/hs2/hsig") < 1.0


def test_hardsigmoid_input_is_3_and_its_output_1(lut):
    _, ws = lut
    _, thr = _thresholds(ws, Calibration("max"))
    assert ws.stats["/hs/conv"].absmax > 3.0
    assert thr("/hs/conv") == 3.0 and thr("/hs/hsig") == 1.0


def test_tanh_output_is_tanh_of_the_input_threshold_not_its_own_calibration(lut):
    _, ws = lut
    _, thr = _thresholds(ws, Calibration("kl"))
    t_in = thr("/th/conv")
    own = ws.simulator.scales(Calibration("kl")).threshold("/th/tanh")
    assert thr("/th/tanh") == pytest.approx(math.tanh(t_in), rel=1e-9)
    assert abs(own / math.tanh(t_in) - 1) > 1e-3             # kl of the output itself would differ


def test_the_depth_head_group_takes_the_fixed_threshold(lut):
    """Conv -> Resize -> Slice, Slice -> Sigmoid, Sigmoid: the group's first calibrated member is a
    fixed Sigmoid input, so the Conv output, the Resize and both Slices use 5.49897."""
    _, ws = lut
    plan, thr = _thresholds(ws, Calibration("max"))
    for t in ("/grp/conv", "/grp/rs", "/grp/sl0", "/grp/sl1"):
        assert thr(t) == pytest.approx(SIG8), t
    assert ws.stats["/grp/conv"].absmax > 2 * SIG8


def test_a_fixed_slice_keeps_its_own_threshold_in_a_calibrated_group(lut):
    """Conv -> Slice0 -> Conv (first), Slice1 -> Sigmoid: the group keeps Slice0's calibrated
    threshold, Slice1 is rounded again at 5.49897 (real: 6.43 / 6.43 / 5.49897)."""
    _, ws = lut
    plan, thr = _thresholds(ws, Calibration("max"))
    assert thr("/mix/conv") == pytest.approx(ws.stats["/mix/sl0"].absmax, rel=1e-6)
    assert thr("/mix/sl1") == pytest.approx(SIG8)
    assert plan.edges[("/mix/sig1", 0)] == ("/mix/sl1", "int8")


def test_a_sigmoid_behind_a_maxpool_is_calibrated(lut):
    _, ws = lut
    plan, thr = _thresholds(ws, Calibration("max"))
    assert not any(t in plan.fixed for t in ("/mp/conv", "/mp/pool"))
    assert thr("/mp/sig") == pytest.approx(_sigmoid(thr("/mp/pool")), rel=1e-9)


def test_a_model_output_sigmoid_is_int16_in_and_out(lut):
    _, ws = lut
    plan, thr = _thresholds(ws, Calibration("max"))
    assert plan.edges[("/o/sig", 0)] == ("/o/conv", "int16")
    assert plan.outputs["/o/sig"] == "int16"
    assert thr("/o/conv") == pytest.approx(SIG16)
    assert thr("/o/sig") == pytest.approx(1 - 2 ** -16, abs=1e-9)       # sigmoid(11.09031), hb's 0.9999847


def test_real_thresholds_win_over_the_fixed_ones(lut, tmp_path):
    """A calibrated model that gives the Sigmoid's input 3.0 (not 5.49897): eval --thresholds uses 3.0."""
    from tuner.toolchain.calibrated_report import real_thresholds

    cfg, ws = lut
    path = tmp_path / "lut_calibrated_model.onnx"
    onnx.save(calibrate(ws.model.proto, {"/one/conv": {"thresholds": [3.0]}}), str(path))
    sim = Workspace.open(cfg).simulator
    cand = Candidate.make(Calibration("max"))
    sim.use_thresholds(real_thresholds(ws, path))
    for honour in (True, False):
        sim.use_thresholds(sim.real, honour_qtypes=honour)
        ev = sim.evaluate(cand, per_node=True)
        row = next(r for r in ev.nodes if r.name == "/one/sig")
        assert row.threshold == pytest.approx(3.0)
        plan = sim.plan(cand, ev.calibration)
        assert "/one/conv" not in plan.fixed
        # the output, which the file does not calibrate, follows the real input threshold
        assert plan_scales(sim.scales(ev.calibration), plan).threshold("/one/sig") == pytest.approx(_sigmoid(3.0))


# ---------------------------------------------------------------------------------------------- uint8

#: Conv+Relu/Clip outputs the real tool made uint8 under asymmetric, by reader (measured)
UINT8 = {"/conv/r": "a Conv", "/res/r": "a Conv and a Conv group's residual Add", "/dw0/r": "a depthwise Conv, no pad",
         "/clip/r": "a Conv (Clip 0..6)", "/mp/r": "a MaxPool read by a Conv", "/ap/r": "an AveragePool",
         "/chs/r": "a Mul by a per-channel constant"}
INT8 = {"x": "the model input (non-negative)", "/dw1/r": "a depthwise Conv with padding",
        "/clipn/r": "a Clip(-1, 6)", "/cat/r": "a Concat", "/rs/r": "a Resize", "/gap/r": "a GlobalAveragePool",
        "/mul/r": "a Mul of two feature maps", "/abs/r": "an Abs output", "/add/r": "a standalone Add"}


def write_relu_project(root: Path) -> Path:
    b = _Builder(5)

    def relu(tag: str, **kw) -> str:
        return b.op("Relu", [b.conv(f"/{tag}/c", "x", **kw)], f"/{tag}/r")

    b.outputs.append(b.conv("/conv/o", relu("conv")))
    r = relu("res")
    b.outputs += [b.conv("/res/o", r), b.op("Add", [b.conv("/res/b", "x"), r], "/res/add")]
    b.outputs.append(b.conv("/dw0/o", relu("dw0"), group=4, pad=0))
    b.outputs.append(b.conv("/dw1/o", relu("dw1"), group=4))
    b.outputs.append(b.conv("/clip/o", b.op("Clip", [b.conv("/clip/c", "x"), b.const("c0", 0.0), b.const("c6", 6.0)],
                                            "/clip/r")))
    b.outputs.append(b.conv("/clipn/o", b.op("Clip", [b.conv("/clipn/c", "x"), b.const("cm1", -1.0), "c6"],
                                             "/clipn/r")))
    b.outputs.append(b.conv("/mp/o", b.op("MaxPool", [relu("mp")], "/mp/pool", kernel_shape=[2, 2], strides=[2, 2])))
    b.outputs.append(b.conv("/ap/o", b.op("AveragePool", [relu("ap")], "/ap/pool", kernel_shape=[2, 2],
                                          strides=[2, 2])))
    b.outputs.append(b.conv("/chs/o", b.op("Mul", [relu("chs"), b.const("k", np.full((1, 4, 1, 1), 0.5))], "/chs/m")))
    b.outputs.append(b.conv("/cat/o", b.op("Concat", [relu("cat"), relu("cat2")], "/cat/cat", axis=1), cin=8))
    b.outputs.append(b.conv("/rs/o", b.op("Resize", [relu("rs"), b.const("roi", []), b.const("sc", [1, 1, 2, 2])],
                                          "/rs/up", mode="nearest")))
    b.outputs.append(b.conv("/gap/o", b.op("GlobalAveragePool", [relu("gap")], "/gap/g"), k=1))
    b.outputs.append(b.conv("/mul/o", b.op("Mul", [relu("mul"), b.conv("/mul/b", "x")], "/mul/m")))
    b.outputs.append(b.conv("/abs/o", b.op("Abs", [b.conv("/abs/c", "x")], "/abs/r")))
    b.outputs.append(b.conv("/add/o", b.op("Add", [relu("add"), relu("add2")], "/add/s")))
    return b.write(root, "relu", lambda rng: rng.uniform(0.0, 1.0, (1, 4, 8, 8)))


@pytest.fixture(scope="module")
def relu(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        cfg = write_relu_project(tmp_path_factory.mktemp("relu"))
        yield cfg, Workspace.open(cfg)


def test_asymmetric_makes_only_conv_relu_outputs_with_uint8_readers_uint8(relu):
    _, ws = relu
    plan = ws.simulator.plan(Candidate.make(Calibration("max", asymmetric=True)))
    sources = {plan.scale_of.get(t, t) for t in list(UINT8) + list(INT8)}
    assert {s for s in sources if s in plan.unsigned} == {plan.scale_of.get(t, t) for t in UINT8}
    for t in INT8:
        if t != "/clipn/r":
            assert ws.stats[t].min >= 0.0, t      # non-negative, yet int8


def test_uint8_scales_copy_the_symmetric_threshold_over_255(relu):
    _, ws = relu
    sim = ws.simulator
    for cal in (Calibration("max", asymmetric=True), Calibration("kl", asymmetric=True)):
        plan = sim.plan(Candidate.make(cal))
        asym = plan_scales(sim.scales(cal), plan)
        sym = plan_scales(sim.scales(Calibration(cal.type)), plan)
        r, c = asym.get("/conv/r", "int8"), asym.get("/cat/r", "int8")
        assert np.asarray(r.zero_point).dtype == np.uint8 and int(r.zero_point) == 0
        assert r.threshold == sym.get("/conv/r", "int8").threshold
        assert float(r.scale) == pytest.approx(r.threshold / 255, rel=1e-6)
        assert np.asarray(c.zero_point).dtype == np.int8 and float(c.scale) == float(sym.get("/cat/r", "int8").scale)
    # uint8 [0, T] halves the rounding step of the Relu output the Conv reads
    asym = sim.evaluate(Candidate.make(Calibration("max", asymmetric=True)))
    base = sim.evaluate(Candidate.make(Calibration("max")))
    assert asym.outputs["/conv/o"]["sqnr_db"] > base.outputs["/conv/o"]["sqnr_db"] + 1
    assert asym.outputs["/cat/o"]["sqnr_db"] == pytest.approx(base.outputs["/cat/o"]["sqnr_db"], abs=1e-9)


# ------------------------------------------------------------------------------ against the real tool

def _real_nodes(tc, cfg: Path, optimization: str | None = None) -> dict[str, tuple[str, float]]:
    """tensor -> (qtype, first threshold) of the real calibrated model of ``cfg`` (converted at O0)."""
    from tuner.inputs.calibrated import read_calibrated
    from tuner.toolchain.hbrun import CompileKnobs, convert

    if optimization:
        text = cfg.read_text().replace("  per_channel: False\n", f"  per_channel: False\n  optimization: '{optimization}'\n")
        cfg = cfg.with_name(f"{cfg.stem}_{optimization}.yaml")
        cfg.write_text(text)
    conv = convert(tc, cfg, CompileKnobs(optimize_level="O0"))
    assert conv.ok, conv.error
    return {n.tensor: (n.qtype, n.thresholds[0]) for n in read_calibrated(conv.model("calibrated")).activations()}


def test_fixed_and_derived_thresholds_equal_the_real_tools(hb_toolchain, lut):
    cfg, ws = lut
    real = _real_nodes(hb_toolchain, cfg)
    plan, thr = _thresholds(ws, Calibration("max"))
    dtypes = {t: d for t, d in list(plan.edges.values()) + list(plan.outputs.items())}
    checked = {"/one/conv": "int8", "/one/sig": "int8", "/sh/conv": "int8", "/sh/sig": "int8", "/grp/conv": "int8",
               "/grp/sl0": "int8", "/grp/sl1": "int8", "/mix/conv": "int8", "/mix/sl1": "int8", "/mp/sig": "int8",
               "/hs/conv": "int8", "/hs/hsig": "int8", "/hs2/conv": "int8", "/hs2/hsig": "int8", "/th/tanh": "int8",
               "/o/conv": "int16", "/o/sig_before": "int16"}
    for t, qtype in checked.items():
        mine = t.removesuffix("_before")
        assert real[t][0] == qtype, (t, real[t])
        assert dtypes.get(mine, "int8") == qtype, t
        assert thr(mine) == pytest.approx(real[t][1], rel=0.01), (t, thr(mine), real[t][1])


def test_the_uint8_tensors_are_the_real_tools(hb_toolchain, relu):
    cfg, ws = relu
    real = _real_nodes(hb_toolchain, cfg, "asymmetric")
    plan = ws.simulator.plan(Candidate.make(Calibration("max", asymmetric=True)))
    for t in list(UINT8) + list(INT8):
        if t in real:     # hb keeps one node per group: a tensor without one takes its group's
            assert (real[t][0] == "uint8") == (plan.scale_of.get(t, t) in plan.unsigned), (t, real[t])
    assert {t for t in UINT8 if real.get(t, ("",))[0] == "uint8"} == set(UINT8)
