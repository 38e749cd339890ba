"""The fused FakeQuant kernel: built and checked on first use, equal to Q/DQ pairs bit for bit, optional."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from cli import tuner
from helpers import write_example_project, write_tiny_project

from tuner.candidate import Calibration, Candidate
from tuner.runtime import fakequant
from tuner.runtime.session import make_session
from tuner.simulate.qdq import build_sim_model
from tuner.workspace import Workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return Workspace.open(write_example_project(tmp_path_factory.mktemp("fq"), n_cal=4, n_eval=3))


def test_the_kernel_builds_here_and_passes_its_check():
    path = fakequant.library()
    # .ci/run installs gcc; without a C compiler tuner still works, on Q/DQ pairs
    assert path is not None and Path(path).is_file(), "no fused kernel: is a C compiler (cc, $CC) installed?"
    fakequant.self_check(path)


CANDIDATES = [
    Candidate.make(Calibration("max")),
    Candidate.make(Calibration("max", per_channel=True), {"/Slice": {"InputType": "int16"}}),
    Candidate.make(Calibration("kl"), {"/Concat_2": {"OutputType": "int16"}}),
    Candidate.make(Calibration("max", 0.9999, asymmetric=True)),
]


@pytest.mark.parametrize("k", range(len(CANDIDATES)))
def test_fakequant_graphs_equal_qdq_graphs_bit_for_bit(ws, k):
    cand = CANDIDATES[k]
    sim = ws.simulator
    assert sim.fused
    plan, scales = sim.plan(cand), sim.scales(cand.calibration)
    extra = [n.outputs[0] for n in sim.graph if n.outputs and sim.graph.is_activation(n.outputs[0])]
    pairs = build_sim_model(ws.model.proto, sim.graph, ws.target, plan, scales, sim.weights, extra_outputs=extra)
    fused = build_sim_model(ws.model.proto, sim.graph, ws.target, plan, scales, sim.weights, extra_outputs=extra,
                            fused=True)
    n_fq = sum(n.op_type == "FakeQuant" for n in fused.graph.node)
    n_q = sum(n.op_type == "QuantizeLinear" for n in pairs.graph.node)
    assert n_fq == n_q > 10 and not any(n.op_type == "QuantizeLinear" for n in fused.graph.node)
    assert len(fused.graph.node) == len(pairs.graph.node) - n_q
    a, b = make_session(pairs), make_session(fused)
    names = [o.name for o in pairs.graph.output]
    for sample in ws.eval_data:
        for x, y in zip(a.run(names, sample), b.run(names, sample)):
            np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))


def test_asymmetric_points_use_the_kernel_with_their_zero_point(ws):
    cand = CANDIDATES[3]
    sim = ws.simulator
    fused = build_sim_model(ws.model.proto, sim.graph, ws.target, sim.plan(cand), sim.scales(cand.calibration),
                            sim.weights, fused=True)
    bounds = {tuple(a.f for a in n.attribute if a.name in ("lo", "hi")) for n in fused.graph.node
              if n.op_type == "FakeQuant"}
    assert any(lo != -128.0 for lo, _ in bounds)  # uint8 with a zero point: lo = -zp, hi = 255 - zp
    assert all(hi - lo in (255.0, 65535.0) for lo, hi in bounds)


def test_disabled_by_environment(monkeypatch, ws):
    monkeypatch.setenv("TUNER_FAKEQUANT", "0")
    assert fakequant.library() is None
    from tuner.simulate import Simulator

    sim = Simulator(ws.model, ws.target, ws.stats, ws.eval_data)
    assert not sim.fused
    cand = CANDIDATES[1]
    monkeypatch.delenv("TUNER_FAKEQUANT")
    assert sim.evaluate(cand).outputs == ws.simulator.evaluate(cand).outputs


def test_a_build_that_disagrees_with_qdq_is_not_kept(tmp_path, monkeypatch, caplog):
    """A kernel that rounds half away from zero (roundf) must fail the check: no library, Q/DQ is used."""
    bad = tmp_path / "fakequant.c"
    bad.write_text(fakequant.SOURCE.read_text().replace("nearbyintf(v)", "roundf(v)"))
    monkeypatch.setattr(fakequant, "SOURCE", bad)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="tuner.runtime.fakequant"):
        assert fakequant._find_or_build() is None
    assert "failed its check" in caplog.text
    assert not list((tmp_path / "cache" / "kernels").glob("*.so"))


def test_without_a_compiler_eval_still_works_and_says_why(tmp_path):
    project = write_tiny_project(tmp_path / "p")
    env_ok = {"TUNER_CACHE_DIR": str(tmp_path / "c1")}
    env_none = {"TUNER_CACHE_DIR": str(tmp_path / "c2"), "CC": str(tmp_path / "no-such-cc")}

    def run(env):   # a real process: the kernel is built once per process, its warning is logged
        return tuner("eval", project, "--json", "--no-nodes", env=env, process=True)

    with_kernel, without = run(env_ok), run(env_none)
    assert with_kernel.returncode == 0 and without.returncode == 0, without.stderr
    assert "same results, slower" in without.stderr and "Traceback" not in without.stderr
    assert "slower" not in with_kernel.stderr
    assert json.loads(with_kernel.stdout)["outputs"] == json.loads(without.stdout)["outputs"]
    assert not list((tmp_path / "c2").glob("kernels/*.so")) and list((tmp_path / "c1").glob("kernels/*.so"))
