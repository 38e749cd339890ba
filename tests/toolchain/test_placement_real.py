"""Where hb_mapper puts the activation of a Conv sent to the CPU, against tuner's plan (skipped without the
toolchain). Toys x -> Conv -> Relu or Clip(0, 6) -> Conv, converted at O0 (seconds each), the first Conv
``ON: CPU`` and the activation with or without an int16 entry of its own. Found by `tuner verify --local` on the
example (a trial with ``/radar/conv/Conv`` on the CPU and ``InputType: int16`` on ``/radar/act/Clip``: hb kept
the Clip on the BPU, tuner moved it with its Conv)."""

from __future__ import annotations

import pytest
from helpers import Toy

from tuner.workspace import Workspace

CASES = {
    # activation, its node_info entry -> the activation on the CPU in hb's node table
    "clip": ("Clip", ""),
    "clip_in16": ("Clip", "'InputType': 'int16'"),
    "clip_out16": ("Clip", "'OutputType': 'int16'"),
    "relu": ("Relu", ""),
    "relu_in16": ("Relu", "'InputType': 'int16'"),
}


def _toy(root, act: str, entry: str):
    t = Toy()
    a = t.conv("/conv_a", "x", 8, 8)
    if act == "Clip":
        b = t.op("Clip", "/act", [a, t.const("lo", 0.0), t.const("hi", 6.0)])
    else:
        b = t.op("Relu", "/act", [a])
    y = t.conv("/conv_b", b, 8, 8)
    info = "{'/conv_a': {'ON': 'CPU'}" + (f", '/act': {{{entry}}}" if entry else "") + "}"
    root.mkdir(parents=True, exist_ok=True)
    return t.project(root, [y], node_info=info)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cpu_convs_activation_is_where_hb_puts_it(hb_toolchain, tmp_path, case):
    from tuner.toolchain.hbrun import CompileKnobs, convert

    cfg = _toy(tmp_path / case, *CASES[case])
    real = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert real.ok, real.error
    ws = Workspace.open(cfg)
    plan = ws.simulator.plan(ws.base_candidate())
    assert "/conv_a" in real.cpu_nodes
    assert ("/act" in plan.cpu_nodes) == ("/act" in real.cpu_nodes), (real.cpu_nodes, plan.cpu_nodes)
    assert ws.simulator.evaluate(ws.base_candidate()).outputs          # and the plan simulates


PULLED = {
    # node_info of the decoder toy -> hb's CPU nodes
    "cat": "{'/cat': {'ON': 'CPU'}}",
    "cat_conv2": "{'/cat': {'ON': 'CPU'}, '/conv_2': {'ON': 'CPU'}}",
    "conv2": "{'/conv_2': {'ON': 'CPU'}}",
}


@pytest.mark.parametrize("case", sorted(PULLED))
def test_a_resize_follows_a_cpu_concat_only_when_the_concat_feeds_the_cpu(hb_toolchain, tmp_path, case):
    """x -> Conv_s; Conv_1 + Relu -> Resize -> Concat(., Conv_s) -> Conv_2 + Relu -> Conv_3: the Resize goes to
    the CPU with the Concat when the Concat's reader is there too (hb moves the Concat itself in ``conv2``), and
    stays on the BPU when the Concat is on the CPU by its own entry but feeds a BPU Conv (``cat``: hb's CPU
    nodes are the Concat alone). Found on the example by `tuner verify --local` (``/Concat_3`` and ``/Concat_4``
    ``ON: CPU``: their Resizes stayed on the BPU, tuner moved them)."""
    from helpers import Toy

    from tuner.toolchain.hbrun import CompileKnobs, convert

    t = Toy()
    s = t.conv("/conv_s", "x", 8, 8)
    a = t.op("Relu", "/relu_1", [t.conv("/conv_1", s, 8, 8)])
    up = t.op("Resize", "/up", [a, t.const("roi", []), t.const("scales", [1, 1, 1, 1])], mode="nearest")
    cat = t.op("Concat", "/cat", [up, s], axis=1)
    b = t.op("Relu", "/relu_2", [t.conv("/conv_2", cat, 16, 8)])
    root = tmp_path / case
    root.mkdir()
    cfg = t.project(root, [t.conv("/conv_3", b, 8, 8)], node_info=PULLED[case])
    real = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert real.ok, real.error
    ws = Workspace.open(cfg)
    plan = ws.simulator.plan(ws.base_candidate())
    assert sorted(plan.cpu_nodes) == sorted(real.cpu_nodes)
    assert ("/up" in real.cpu_nodes) == (case != "cat")
