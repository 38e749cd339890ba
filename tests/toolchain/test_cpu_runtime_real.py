"""The real tool refuses exactly the fused activations on the CPU that tuner refuses (skipped without the
toolchain): each toy of tests/activation_toys.py converted at O0 with ``ON: CPU`` on the node hb names the
fused activation after (refused at the runtime model's generation, after calibration and compilation, with
its kind), and with ``ON: CPU`` on another member of it (converted, nothing on the CPU), as
tuner.simulate.placement and tuner.graph.names simulate it."""

from __future__ import annotations

import pytest
from activation_toys import ACTIVATIONS, write_activation_toy

from tuner.errors import TunerError
from tuner.workspace import Workspace


def _tuner_refusal(cfg) -> str | None:
    ws = Workspace.open(cfg)
    try:
        ws.simulator.plan(ws.base_candidate())
    except TunerError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("form", sorted(ACTIVATIONS))
def test_the_real_tool_refuses_what_tuner_refuses(hb_toolchain, tmp_path, form):
    from tuner.toolchain.hbrun import CompileKnobs, convert

    kind, head, members = ACTIVATIONS[form]
    refused = write_activation_toy(tmp_path, form, (head,))
    accepted = write_activation_toy(tmp_path, form, (members[0],))
    real = convert(hb_toolchain, refused, CompileKnobs(optimize_level="O0"))
    assert not real.ok and real.error == f"HorizonRT not support these cpu operators: {kind}", real.error
    assert "runtime_model_generation" in real.log_path.read_text()     # at the end: after calibration
    assert real.cpu_nodes == (head,)                                    # on the CPU, not moved back
    ours = _tuner_refusal(refused)
    assert ours is not None and real.error in ours
    real = convert(hb_toolchain, accepted, CompileKnobs(optimize_level="O0"))
    assert real.ok and real.cpu_nodes == (), (real.error, real.cpu_nodes)
    assert _tuner_refusal(accepted) is None
