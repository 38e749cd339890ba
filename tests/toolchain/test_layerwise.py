"""hmct's own int16 promotion (``layerwise_search``), run through hb_mapper on a YAML: the baseline the
search-quality benchmark holds tuner's winner against (issue 22, part 6). Real toolchain only
(fixture ``hb_toolchain``: skipped without it); the example at O0, ~1 min per conversion, cached."""

from __future__ import annotations

from helpers import write_example_project

from tuner.inputs.calibrated import read_calibrated
from tuner.toolchain.hbrun import CompileKnobs, Layerwise, convert


def _int16(conv) -> set[str]:
    return {n.tensor for n in read_calibrated(conv.model("calibrated")).activations() if n.on and n.qtype == "int16"}


def test_layerwise_top_k_makes_the_most_sensitive_nodes_int16(hb_toolchain, tmp_path):
    cfg = write_example_project(tmp_path / "ex", n_cal=8, n_eval=2)
    knobs = CompileKnobs(optimize_level="O0")
    plain = convert(hb_toolchain, cfg, knobs)
    top2 = convert(hb_toolchain, cfg, knobs, layerwise=Layerwise(topk=2))
    assert plain.ok and top2.ok, (plain.error, top2.error)
    assert top2.key != plain.key and top2.quantizer == {"mix_topk": 2, "use_int16": True}
    log = top2.log_path.read_text(encoding="utf-8", errors="replace")
    assert "layerwise search" in log and "Topk cosine-similarity nodes has been set by the user as 2" in log
    # the two nodes and what their int16 spreads to (threshold groups): more int16 than the YAML alone
    assert len(_int16(top2)) > len(_int16(plain))
    again = convert(hb_toolchain, cfg, knobs, layerwise=Layerwise(topk=2))
    assert again.cached and again.key == top2.key
