"""A fused activation on the CPU is refused, as hb_mapper refuses it at its last step ("HorizonRT not support
these cpu operators: HzHardSwish"), and only ``ON: CPU`` on the node hb names it after puts it there
(tuner.simulate.placement.CPU_RUNTIME_LACKS, docs/hb_rules/placement.md section 8). No toolchain: the toys of
tests/activation_toys.py through tuner's optimizer and plan; tests/toolchain/test_cpu_runtime_real.py converts
them."""

from __future__ import annotations

import pytest
from activation_toys import ACTIVATIONS, activation_model, write_activation_toy

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.graph.optimize import optimize
from tuner.simulate.plan import make_plan
from tuner.study.space import node_choices


@pytest.fixture(scope="module")
def target():
    return load_target("bayes-e")


def _graph(form: str) -> Graph:
    model, names = optimize(activation_model(form))
    return Graph(model, names)


@pytest.mark.parametrize("form", sorted(ACTIVATIONS))
def test_a_fused_activation_on_the_cpu_is_refused_and_its_members_on_bpu_are_not(target, form):
    kind, head, members = ACTIVATIONS[form]
    graph = _graph(form)
    assert graph.by_name[head].op_type == kind
    with pytest.raises(TunerError, match=f"{head} \\({kind}\\) on the CPU .*HorizonRT not support these cpu "
                                         f"operators: {kind}"):
        make_plan(graph, target, Candidate.make(nodes={head: {"ON": "CPU"}}))
    for member in members:     # hb ignores it: the fused node stays on the BPU
        plan = make_plan(graph, target, Candidate.make(nodes={member: {"ON": "CPU"}}))
        assert plan.placement[head] == "BPU" and plan.cpu_nodes == []
        assert any(f"'{member}'" in n and "no effect" in n for n in plan.notes)
    # its neighbours on the CPU are fine, and the fused node stays on the BPU between them
    plan = make_plan(graph, target, Candidate.make(nodes={"conv1": {"ON": "CPU"}, "conv2": {"ON": "CPU"}}))
    assert plan.cpu_nodes == ["conv1", "conv2"] and plan.placement[head] == "BPU"


def test_the_space_never_offers_cpu_for_a_fused_activation(target):
    assert "CPU" not in node_choices("HzHardSwish", target, ["BPU", "CPU"], ["int8", "int16"])
    assert "CPU" in node_choices("Mul", target, ["BPU", "CPU"], ["int8", "int16"])
    # a lowered Mul by a constant is a float Conv on the CPU, which its runtime has (toy Conv -> Relu ->
    # Mul(per-channel constant) -> padded Conv, the Mul ON CPU: converted, a CPU ``Conv`` in the quantized model)
    assert "CPU" in node_choices("HzChannelScale", target, ["BPU", "CPU"], ["int8"])


def test_sensitivity_has_no_cpu_fix_for_a_fused_activation(tmp_path):
    from tuner.sensitivity import leave_one_fixed, sensitivity_table
    from tuner.workspace import Workspace

    ws = Workspace.open(write_activation_toy(tmp_path / "silu", "silu"))
    sim = ws.simulator
    gains = leave_one_fixed(sim, Candidate.make(), ["mul", "conv2"])
    assert "cpu" not in gains["mul"] and "int16" in gains["mul"]
    assert "cpu" in gains["conv2"]
    rows = sensitivity_table(sim, Candidate.make(), ["mul", "conv2"], gains=gains)   # "alone" runs: no refusal
    assert {r.node for r in rows} == {"mul", "conv2"}
