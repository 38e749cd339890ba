"""hb's integer element-wise Add (tuner.simulate.intadd): the rule, its float32 emulation, and, with the real
toolchain, the rule and the simulated model against a toy's real quantized model element by element.

The toy (onnx helper API, opset 11, max calibration, converted at O0): a Conv + Relu ``a``, a Conv ``b`` read
twice (so hb keeps it out of a fused residual), ``add1 = a + b`` (int8), ``add2 = add1 + b`` with an int16 output
(``node_info``), ``add3 = add2 + a`` (an int16 and an int8 input), then a Conv + Relu reading add1 and a Conv
reading add3, and a Mul of the two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hb_integers import attrs, calibrated_thresholds, convert_with_integer_outputs, write_toy_project
from onnx import TensorProto, helper, numpy_helper

from tuner.simulate.intadd import OUTPUT_SHIFT, emulation, norm, reference, requant

C = 16
ADDS = {"add1": ("add1_out", "int8"), "add2": ("add2_out", "int16"), "add3": ("add3_out", "int8")}


def _toy(root: Path, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def conv(name, x, relu=False):
        w = (rng.standard_normal((C, C if x != "x" else 8, 3, 3)) * rng.uniform(0.05, 0.4)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"),
                      numpy_helper.from_array((rng.standard_normal(C) * 0.3).astype(np.float32), f"{name}.b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}_out"], name=name, pads=[1] * 4))
        if not relu:
            return f"{name}_out"
        nodes.append(helper.make_node("Relu", [f"{name}_out"], [f"{name}_relu"], name=f"{name}_relu"))
        return f"{name}_relu"

    a = conv("c1", "x", relu=True)
    b = conv("c2", a)
    nodes.append(helper.make_node("Add", [a, b], ["add1_out"], name="add1"))
    nodes.append(helper.make_node("Add", ["add1_out", b], ["add2_out"], name="add2"))
    nodes.append(helper.make_node("Add", ["add2_out", a], ["add3_out"], name="add3"))
    k = conv("c4", "add1_out", relu=True)
    o = conv("c5", "add3_out")
    nodes.append(helper.make_node("Mul", [k, o], ["out"], name="m"))
    return write_toy_project(root, nodes, inits, ["out"], {"add2": {"OutputType": "int16"}}, rng)


# -- the rule alone ----------------------------------------------------------------------------------


def test_the_multipliers_have_15_bits_and_give_the_steps_ratios():
    rng = np.random.default_rng(0)
    for _ in range(500):
        s0, s1, s_out = 10.0 ** rng.uniform(-3, 0, 3)
        for out in ("int8", "int16"):
            rq = requant(s0, s1, s_out, out)
            s_a, s_b = (s0, s1) if rq.first == 0 else (s1, s0)
            assert s_a >= s_b and rq.output_right_shift == OUTPUT_SHIFT[out]
            assert 2 ** 14 <= rq.e_scale < 2 ** 15 and 2 ** 14 <= rq.output_scale < 2 ** 15
            assert abs(rq.e_scale / 2.0 ** rq.x_shift / (s_b / s_a) - 1) <= 2.0 ** -15
            n_out = rq.accu_right_shift + rq.output_right_shift - rq.x_shift
            assert abs(rq.output_scale / 2.0 ** n_out / (s_a / s_out) - 1) <= 2.0 ** -15


def test_a_ratio_of_one_is_16384_one_shift_lower():
    """hb's PP-OCRv4 Adds of two inputs on one threshold: x_shift 14, e_scale 16384 (not 2^15 with 15)."""
    assert norm(1.0) == (16384, 14) and norm(0.5) == (16384, 15)
    rq = requant(0.3, 0.3, 0.6, "int8")
    assert (rq.x_shift, rq.e_scale, rq.output_scale) == (14, 16384, 16384)


def test_the_float64_emulation_is_the_integer_rule():
    """The build's ops (tuner.simulate.intbuild.int_add: float64 from the dequantized float32 inputs) equal
    :func:`reference` for int8 and int16 inputs and outputs, whichever input has the larger step; the last shift
    in float32 would not (an int16 output)."""
    rng = np.random.default_rng(1)
    f = np.float32
    cases = ((0.31, 0.22, 0.41, "int8", 127, 127), (0.05, 0.3, 0.33, "int8", 127, 127), (0.2, 0.2, 0.4, "int8", 127, 127),
             (0.31, 0.22, 0.41 / 258, "int16", 127, 127), (0.013, 0.27, 0.0021, "int16", 127, 127),
             (0.31, 0.22 / 258, 0.41 / 258, "int16", 127, 32767), (0.3 / 258, 0.2 / 258, 0.41, "int8", 32767, 32767))
    for s0, s1, s_out, out, q0, q1 in cases:
        rq = requant(s0, s1, s_out, out)
        qmax = 127 if out == "int8" else 32767
        x0, x1 = rng.integers(-q0 - 1, q0 + 1, 200000), rng.integers(-q1 - 1, q1 + 1, 200000)
        g_a, g_b, m = emulation(rq)
        g0, g1 = (g_a, g_b) if rq.first == 0 else (g_b, g_a)
        a0 = np.round((x0 * f(s0)).astype(f).astype(np.float64) * (1 / float(f(s0))))   # the integers back
        a1 = np.round((x1 * f(s1)).astype(f).astype(np.float64) * (1 / float(f(s1))))
        t = np.floor(a0 * g0 + a1 * g1)
        want = reference(x0, x1, rq, qmax)
        v = np.floor(t * m + 0.5)
        assert np.array_equal(np.clip(v, -qmax - 1, qmax), want), (s0, s1, s_out, out)
        if out == "int16" and q0 == q1 == 127:
            v32 = np.clip(np.floor(t.astype(f) * f(m) + f(0.5)), -qmax - 1, qmax)
            assert not np.array_equal(v32, want)


# -- against the real tool ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_toy(hb_toolchain, tmp_path_factory):
    """The toy converted at O0 and its quantized model run on two calibration samples with every integer
    tensor as a graph output."""
    root = tmp_path_factory.mktemp("intadd")
    cfg = _toy(root / "p")
    return (cfg, *convert_with_integer_outputs(hb_toolchain, cfg, root, (1, 8, 16, 16)))


def _thresholds(calibrated: Path) -> dict[str, tuple[float, str]]:
    return calibrated_thresholds(calibrated, outputs=True)


def test_the_rule_gives_hbs_integers(real_toy):
    """The three Adds are HzSElementwiseAdds whose six integers follow from the calibrated model's thresholds, and
    the rule on hb's input integers gives hb's output integers."""
    _cfg, conv, model, samples, outs = real_toy
    thr = _thresholds(conv.model("calibrated"))
    adds = {n.name: n for n in model.graph.node if n.op_type == "HzSElementwiseAdd"}
    assert set(ADDS) <= set(adds), sorted(adds)
    for name, (_tensor, out_dtype) in ADDS.items():
        node, a = adds[name], attrs(adds[name])
        steps = []
        for t in list(node.input) + [node.output[0]]:
            th, q = thr[t.removesuffix("_quantized")]
            steps.append(th / (127 if q == "int8" else 32767))
        assert thr[node.output[0].removesuffix("_quantized")][1] == out_dtype
        rq = requant(steps[0], steps[1], steps[2], out_dtype)
        got = (rq.x_shift, rq.e_scale, 0, rq.accu_right_shift, rq.output_scale, rq.output_right_shift)
        want = tuple(int(np.unique(a[k])[0]) for k in ("x_shift", "e_scale", "e_shift", "accu_right_shift",
                                                        "output_scale", "output_right_shift"))
        assert got == want, name
        qmax = 127 if out_dtype == "int8" else 32767
        for i in range(len(samples)):
            y = reference(outs[i][node.input[0]], outs[i][node.input[1]], rq, qmax)
            assert np.array_equal(y, outs[i][node.output[0]]), name


def test_the_simulation_is_hbs_add_kernel(real_toy, monkeypatch):
    """With TUNER_INTCONV=1 the three simulated Add outputs equal the real quantized model's integers on both
    samples, fed the same input (their inputs: int8 Conv outputs the Conv kernel's simulation matches, and
    add2's int16 output); tuner's float sum misses some of each."""
    from tuner.workspace import Workspace

    cfg, _conv, _model, samples, outs = real_toy
    differ = {}
    for on in ("1", "0"):
        monkeypatch.setenv("TUNER_INTCONV", on)
        ws = Workspace.open(cfg)
        sim = ws.simulator
        cand = ws.base_candidate()
        cal, _ = sim.resolve(cand)
        plan = sim.plan(cand, cal)
        proto = sim.side.build(plan, sim.scales(cal), {}, [], False)
        assert {n.name.split("__iadd")[0] for n in proto.graph.node if "__iadd" in n.name} == (set(ADDS) if on == "1" else set())
        scales = {t.name: float(numpy_helper.to_array(t)) for t in proto.graph.initializer
                  if t.name.endswith("_scale") and not t.dims}
        for tensor, dtype in ADDS.values():
            proto.graph.output.append(helper.make_tensor_value_info(f"{tensor}__{dtype}_dq", TensorProto.FLOAT, None))
        session = sim.side.session(proto)
        names = [o.name for o in session.get_outputs()]
        count = dict.fromkeys(ADDS, 0)
        for i, sample in enumerate(samples):
            got = dict(zip(names, session.run(names, sample)))
            for name, (tensor, dtype) in ADDS.items():
                ints = np.rint(got[f"{tensor}__{dtype}_dq"] / scales[f"{tensor}__{dtype}_scale"]).astype(np.int64)
                count[name] += int((ints.transpose(0, 2, 3, 1) != outs[i][f"{tensor}_quantized"]).sum())
        differ[on] = count
    assert differ["1"] == dict.fromkeys(ADDS, 0), differ
    assert all(v > 0 for v in differ["0"].values()), differ
