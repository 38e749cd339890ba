"""The fidelity suite (issue 22, part 3): tuner's simulation against the real hb_mapper toolchain.

Runs whenever the toolchain is installed (``.ci/run`` installs it; without it these tests are
skipped, except under CI). Each configuration of ``tests/fidelity_suite.py`` is converted by the
real tool (O0, cached by content between runs: a second run converts only what changed), its
quantized model (what the board runs) is run with hmct's executor on the evaluation data, and the
same YAML is simulated by tuner. The assertions are the issue's thresholds, against the
**quantized** model:

* per output, |cosine difference| <= 0.005 and SQNR within 1.5 dB where the real cosine is >= 0.9;
* per-node input thresholds equal the real ones within 1 % (max, max-percentile, kl), the same
  dtypes and placement per node (the log's table);
* default's ``Select`` method;
* the per-node cosine on calibration sample 0 (hb's definition) within 0.005 median;
* the order of the configurations (Spearman >= 0.9 of real vs simulated mean output cosine).

A rule tuner does not model yet is listed in ``GAPS`` with the reason: its check is a strict xfail,
so the day the simulation gets it right the test fails until the entry is removed (the list can
only shrink). ``benchmarks/fidelity.py`` writes the same comparison as a table.
"""

from __future__ import annotations

import pytest
from fidelity_suite import MODELS, run_suite

from tuner.toolchain import fidelity as F

# the suite's conversions and simulations are shared by its tests and cost ~30 s together
pytestmark = pytest.mark.slow

#: (model, case, check) -> why tuner does not agree yet. Checks: outputs, thresholds, dtypes,
#: placement, method, node_cosine; (model, "*", "order") for the order of the configs.
GAPS: dict[tuple[str, str, str], str] = {}


def _gap(model: str, cases: tuple[str, ...], checks: tuple[str, ...], reason: str) -> None:
    for c in cases:
        for check in checks:
            GAPS[(model, c, check)] = reason


_gap("ppocr_det", ("per_channel_int16",), ("node_cosine",),
     "int16 into the per-channel p2o.Add.15: tuner reproduces hb's collapse (output cosine real 0.005, sim 0.009) and "
     "every node up to p2o.Mul.10 (|delta| < 1e-5), but downstream of the saturated p2o.Conv.3 input the per-node "
     "cosines of two saturated computations part ways (p2o.Conv.3 real 0.680, sim 0.326; median |delta| 0.18): "
     "hb's integer lowering of the x270 copy is not modelled beyond its float form")
GAPS[("ppocr_cls", "*", "order")] = (
    "six of the classifier's seven configurations lie within 0.006 of one another on the real quantized model "
    "(0.9626-0.9683; kl 0.9362) and hb's integer kernels move each by up to 0.004: tuner differs by up to 0.0036 "
    "(all_int16 0.9620 against 0.9656), and so does hb's own float model of them, its calibrated model with the "
    "tables' 1/6 slope (percentile 0.9645 against 0.9683, all_int16 0.9696 against 0.9656); the order check's "
    "tie (0.001) is below that")

CHECKS = ("outputs", "thresholds", "dtypes", "placement", "method", "node_cosine")


def _params() -> list:
    out = []
    for model, (_, cases) in MODELS.items():
        for case in cases:
            for check in CHECKS:
                reason = GAPS.get((model, case.name, check))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                out.append(pytest.param(model, case.name, check, marks=marks, id=f"{model}-{case.name}-{check}"))
    return out


_RESULTS: dict[str, dict[str, F.CaseResult]] = {}


@pytest.fixture(scope="session")
def suite(hb_toolchain, tmp_path_factory):
    """model -> case -> result, computed once per session (and converted once per content)."""

    def get(model: str) -> dict[str, F.CaseResult]:
        if model not in _RESULTS:
            if model in ("ppocr_det", "ppocr_cls", "ppocr_nv12"):
                from ppocr import cls_model_path, det_model_path

                if (cls_model_path() if model == "ppocr_cls" else det_model_path()) is None:
                    pytest.skip("rapidocr-onnxruntime is not installed (see the README's test command)")
            done = run_suite(hb_toolchain, model, tmp_path_factory.mktemp("fidelity"))
            _RESULTS[model] = {r.case: r for r, _ in done}
        return _RESULTS[model]

    return get


@pytest.mark.parametrize("model,case,check", _params())
def test_agrees_with_the_real_toolchain(suite, model, case, check):
    r = suite(model)[case]
    assert r.ok, f"hb_mapper refused {model}/{case}: {r.error}"
    if check == "outputs":
        bad = [f"{o.name}: cosine real {o.real_cosine:.4f} sim {o.sim_cosine:.4f}, SQNR real {o.real_sqnr:.2f} "
               f"sim {o.sim_sqnr:.2f} dB" for o in r.outputs if not o.agrees]
        assert not bad, "; ".join(bad)
    elif check == "thresholds":
        if not r.thresholds_apply:
            return
        assert r.threshold_pairs > 0
        assert not r.threshold_off, (f"{len(r.threshold_off)}/{r.threshold_pairs} input thresholds off by > 1 %, e.g. "
                                     + ", ".join(f"{n} sim {s:.4g} real {t:.4g}" for n, s, t in r.threshold_off[:4]))
    elif check == "dtypes":
        assert not r.dtype_off, "dtype differs: " + ", ".join(f"{n} sim {s} real {t}" for n, s, t in r.dtype_off[:6])
    elif check == "placement":
        assert not r.placement_off, "placement differs: " + ", ".join(
            f"{n} sim {s} real {t}" for n, s, t in r.placement_off[:6])
    elif check == "method":
        if r.method_agrees is None:
            return
        assert r.method_agrees, f"hb_mapper selected {r.real_method}, tuner {r.sim_method}"
    elif check == "node_cosine":
        assert r.node_cosine_median is not None and r.node_pairs >= 10
        assert r.node_cosine_median <= F.NODE_COSINE_TOL, (
            f"median |real - sim| per-node cosine {r.node_cosine_median:.5f} over {r.node_pairs} nodes")


@pytest.mark.parametrize("model", [pytest.param(m, marks=[pytest.mark.xfail(strict=True, reason=GAPS[(m, "*", "order")])]
                                                if (m, "*", "order") in GAPS else []) for m in MODELS
                                      if len(MODELS[m][1]) >= 3])     # an order needs three configurations
def test_the_order_of_the_configs_is_reproduced(suite, model):
    results = list(suite(model).values())
    s = F.suite_summary(model, results)
    assert s.converted == s.cases
    assert s.order_spearman is not None and s.order_spearman >= F.ORDER_SPEARMAN, s


def test_a_yaml_the_tool_refuses_is_a_clear_record(hb_toolchain, tmp_path):
    """Every node on the CPU: hb_mapper refuses it ("There is no node can execute on BPU"); the
    runner returns the tool's one line, not an exception."""
    import numpy as np
    import onnx
    from helpers import hb_yaml
    from onnx import TensorProto, helper, numpy_helper

    from tuner.toolchain.hbrun import CompileKnobs, convert

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.3, (2, 4, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu1"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    onnx.save(model, str(tmp_path / "two.onnx"))
    (tmp_path / "cal").mkdir()
    for i in range(4):
        rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32).tofile(tmp_path / "cal" / f"{i:04d}.bin")
    cpu = "{" + ", ".join(f"'{n}': {{'ON': 'CPU'}}" for n in ("conv1", "relu1", "conv2")) + "}"
    cfg = tmp_path / "all_cpu.yaml"
    cfg.write_text(hb_yaml("two.onnx", "x", "1x3x8x8", node_info=cpu, prefix="two"))
    conv = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert not conv.ok
    assert "no node can execute on BPU" in (conv.error or ""), conv.error
    assert "\n" not in (conv.error or "")
