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
    from helpers import decoder_toy

    from tuner.toolchain.hbrun import CompileKnobs, convert

    t, outs = decoder_toy()
    root = tmp_path / case
    root.mkdir()
    cfg = t.project(root, outs, node_info=PULLED[case])
    real = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert real.ok, real.error
    ws = Workspace.open(cfg)
    plan = ws.simulator.plan(ws.base_candidate())
    assert sorted(plan.cpu_nodes) == sorted(real.cpu_nodes)
    assert ("/up" in real.cpu_nodes) == (case != "cat")


SLICES = {
    # (the slices of x, node_info) -> hb's CPU nodes
    "one_slice_cpu_conv": (1, "{'/conv_c': {'ON': 'CPU'}}", ["/conv_c", "/sa"]),
    "two_slices_cpu_conv": (2, "{'/conv_c': {'ON': 'CPU'}}", ["/conv_c"]),
    "concat_cpu_reader": (3, "{'/conv_c': {'ON': 'CPU'}}", ["/cat", "/conv_c"]),
    "concat_cpu_reader_int16_slice": (3, "{'/conv_c': {'ON': 'CPU'}, '/sb': {'InputType': 'int16', 'OutputType': 'int16'}}",
                                      ["/cat", "/conv_c"]),
}


@pytest.mark.parametrize("case", sorted(SLICES))
def test_a_slice_of_a_shared_model_input_stays_on_the_bpu(hb_toolchain, tmp_path, case):
    """x -> Slice(s) -> ...: a Slice whose CPU reader (a Conv, or a Concat that follows its CPU Conv) would pull
    it goes to the CPU when it is the input's only reader and stays on the BPU when another BPU node reads the
    input; a Concat of a constant Mul of one Slice and the other Slice then goes to the CPU, int16 entry on the
    Slice or not. Found on the example by `tuner verify --local` (its /Concat of /Mul and /Slice_2 before the
    CPU /radar/conv/Conv: on the CPU in hb, not in tuner) and its /stem/conv/Conv on the CPU (/Slice stays on
    the BPU, in int8: fidelity case cpu_stem)."""
    import numpy as np
    from helpers import Toy

    from tuner.toolchain.hbrun import CompileKnobs, convert

    kind, info, want = SLICES[case]
    t = Toy()
    ax = t.const("ax", [1], np.int64)
    a = t.op("Slice", "/sa", ["x", t.const("s0", [0], np.int64), t.const("e0", [4], np.int64), ax])
    outs = []
    if kind == 3:
        b = t.op("Slice", "/sb", ["x", t.const("s1", [4], np.int64), t.const("e1", [8], np.int64), ax])
        cat = t.op("Concat", "/cat", [t.op("Mul", "/mul", [a, t.const("k", 0.5)]), b], axis=1)
        outs.append(t.conv("/conv_y", t.conv("/conv_c", cat, 8, 8), 8, 8))
    else:
        outs.append(t.conv("/conv_y", t.conv("/conv_c", a, 4, 8), 8, 8))
        if kind == 2:
            b = t.op("Slice", "/sb", ["x", t.const("s1", [4], np.int64), t.const("e1", [8], np.int64), ax])
            outs.append(t.conv("/conv_z", b, 4, 8))
    root = tmp_path / case
    root.mkdir()
    cfg = t.project(root, outs, node_info=info)
    real = convert(hb_toolchain, cfg, CompileKnobs(optimize_level="O0"))
    assert real.ok, real.error
    assert sorted(real.cpu_nodes) == want
    ws = Workspace.open(cfg)
    assert sorted(ws.simulator.plan(ws.base_candidate()).cpu_nodes) == want
