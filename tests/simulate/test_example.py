"""The simulator on the bundled seg+depth example (real trained weights)."""

import pytest
from helpers import write_example_project

from tuner.candidate import Calibration, Candidate
from tuner.metrics import Similarity
from tuner.runtime.session import make_session
from tuner.simulate.oracle import ort_quantize, ort_semantics
from tuner.workspace import Workspace


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return write_example_project(tmp_path_factory.mktemp("example"))


def test_oracle_all_bpu_int8_max_matches_quantize_static(example):
    # The exported graph: hb_mapper's optimizer lowers the example's Muls by constants to
    # weight-quantized convolutions (docs/hb_rules/ops.md §4.2 #14), which onnxruntime's quantizer keeps as
    # Muls (differs by design).
    ws = Workspace.open(example, hb_optimize=False)
    ws.target = ort_semantics(ws.target)
    cand = Candidate.make(Calibration("max"))
    sim = ws.simulator
    ev = sim.evaluate(cand)
    qdq = ort_quantize(ws.model.proto, ws.graph, sim.plan(cand), sim.scales(ev.calibration), ws.calibration_data)
    session = make_session(qdq)
    names = ws.model.output_names
    agree = {o: Similarity() for o in names}
    for sample in ws.eval_data:
        mine, _ = sim.tensors(cand, names, sample)
        for o, theirs in zip(names, session.run(names, sample)):
            agree[o].update(theirs, mine[o])
    for o in names:
        assert agree[o].cosine >= 0.99999, (o, agree[o].cosine)


def test_the_radar_channel_breaks_per_tensor_input_quantization(example):
    """The example's input mixes RGB in 0..1 with radar range in metres, and three Slices read it: hb
    gives the input the first (RGB) Slice's threshold (1.0), so the radar range is clipped (measured on
    the real toolchain: tests/fidelity); an int16 request on the Slices gives the group the input's own
    range in int16 and fixes it. ``per_channel`` does not: hb_mapper deploys per-channel activation
    scales only on Conv inputs, by equalization (docs/hb_rules/quantizer.md §1.5), and the example's input feeds
    Slices, so its quantization stays per-tensor."""
    ws = Workspace.open(example)
    sim = ws.simulator
    per_tensor = sim.evaluate(Candidate.make(Calibration("max")))
    per_channel = sim.evaluate(Candidate.make(Calibration("max", per_channel=True)))
    first = [n.name for n in ws.graph if "input" in n.inputs]
    int16_input = sim.evaluate(Candidate.make(Calibration("max"), {n: {"InputType": "int16"} for n in first}))
    assert per_tensor.outputs["seg"]["cosine"] < 0.95
    assert abs(per_channel.outputs["seg"]["cosine"] - per_tensor.outputs["seg"]["cosine"]) < 0.05
    assert int16_input.outputs["seg"]["cosine"] > 0.99
    # Greater, Where's Cast/Equal/Cast (hb splits Where: its Mul/Mul/Add run on the BPU), ScatterND
    assert per_tensor.plan.n_subgraphs == 2 and len(per_tensor.plan.cpu_nodes) == 5


def test_the_ranking_finds_the_input_slices_by_their_int16_gain(example):
    """One Slice on the CPU changes nothing (hb keeps the input's group threshold while another BPU
    Slice reads it, measured), int16 on one Slice fixes the radar channel: a node's sensitivity is the
    gain of its best fix, so the Slices rank above every node whose only gain is a CPU placement."""
    from tuner.sensitivity import best_gain, leave_one_fixed

    ws = Workspace.open(example)
    sim = ws.simulator
    slices = [n.name for n in ws.graph if "input" in n.inputs and n.op_type == "Slice"]
    convs = [n.name for n in ws.graph if n.op_type == "Conv"][:3]
    gains = leave_one_fixed(sim, Candidate.make(Calibration("max")), slices + convs)
    assert len(slices) == 3
    for s in slices:
        assert abs(gains[s]["cpu"]) < 1e-6, gains[s]
        assert gains[s]["int16"] > 0.02, gains[s]
    assert min(best_gain(gains[s]) for s in slices) > max(best_gain(gains[c]) for c in convs)
