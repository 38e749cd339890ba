"""Reading what hbdk says: its per-subgraph JSON (debug builds), the log's cost lines, the real qtypes."""

import json

import onnx
import pytest
from calibrated_models import calibrate
from helpers import build_tiny_model

from tuner.cost.hbdk import calibrated_qtypes, parse_layer_rows, read_subgraph_json, subgraph_estimates
from tuner.toolchain.hbrun import read_subgraphs

#: The column headers and two rows in the form of hbdk 3.49.15's ``layer details`` (the example at O3)
ROWS = [["layer", "ops", "original output shape", "aligned output shape", "computing cost (no DDR)",
         "load/store cost", "active period of time"],
        ["/stem/conv/Conv-conv", "3,317,760", "[1,48,80,16]", "[1,48,80,16]", "2 us (0.3% of model)",
         "1 us (0.1% of model)", "21 ~ 38 us (17)"],
        ["/Concat", "0", "[1,96,160,2]", "[1,96,256,2]", "12 us (1.9% of model)", "0", "26 ~ 64 us (38)"]]


def summary(name, latency, rows=ROWS):
    return {"summary": {"model name": name, "latency (us)": latency, "loaded bytes per run": 100,
                        "stored bytes per run": 50, "layer details": rows}}


def test_layer_rows():
    conv, cat = parse_layer_rows(ROWS)
    assert conv.node == "/stem/conv/Conv" and conv.macs == 3317760 and conv.compute_us == 2.0
    assert conv.aligned == (1, 48, 80, 16) and (conv.start_us, conv.end_us) == (21.0, 38.0)
    assert cat.node == "/Concat" and cat.load_store_us == 0.0 and cat.aligned == (1, 96, 256, 2)
    # columns found by their headers, in any order
    shuffled = [[r[0], r[4], r[1]] for r in ROWS]
    assert parse_layer_rows(shuffled)[0].compute_us == 2.0
    assert parse_layer_rows([["name", "x"], ["a", "1"]]) == ()


def test_subgraph_files_found_by_content(tmp_path):
    """A model named with spaces: the file's name is not the log's first word; quant_info is not one."""
    (tmp_path / "Model from PaddlePaddle._subgraph_1.json").write_text(json.dumps(
        summary("Model from PaddlePaddle._subgraph_1", 20.5)))
    (tmp_path / "Model from PaddlePaddle._subgraph_0.json").write_text(json.dumps(
        summary("Model from PaddlePaddle._subgraph_0", 1213.2)))
    (tmp_path / "det_quant_info.json").write_text(json.dumps({"/Conv": {"type": "Conv"}}))
    est = subgraph_estimates(tmp_path)
    assert [e.latency_us for e in est] == [1213.2, 20.5]
    assert est[0].loaded_bytes == 100 and len(est[0].layers) == 2
    assert read_subgraph_json(tmp_path / "det_quant_info.json") is None


def test_log_costs_named_by_their_html(tmp_path):
    """hb_mapper may compile two subgraphs before it logs their costs: each cost line names its own."""
    log = "\n".join([
        "INFO Compile submodel: main_graph_subgraph_0",
        "INFO FPS=1872.95, latency = 533.9 us, DDR = 1153984 bytes   (see main_graph_subgraph_0.html)",
        "INFO Compile submodel: main_graph_subgraph_1",
        "INFO Compile submodel: main_graph_subgraph_2",
        "INFO FPS=21095.27, latency = 47.4 us, DDR = 229248 bytes   (see main_graph_subgraph_1.html)",
        "INFO FPS=1493.07, latency = 669.8 us, DDR = 2107904 bytes   (see main_graph_subgraph_2.html)",
        "INFO Compile submodel: Model from PaddlePaddle._subgraph_0",
        "INFO FPS=824.2, latency = 1213.2 us, DDR = 5 bytes",
    ])
    subs = read_subgraphs(log, tmp_path)
    assert [(s.name, s.latency_us) for s in subs] == [
        ("main_graph_subgraph_0", 533.9), ("main_graph_subgraph_1", 47.4), ("main_graph_subgraph_2", 669.8),
        ("Model from PaddlePaddle._subgraph_0", 1213.2)]


def test_real_qtypes_per_node():
    """What the calibrated model makes int16, per node: an input's qtype is its calibration node's, an
    output's the widest of the calibration nodes reading it."""
    model = onnx.shape_inference.infer_shapes(build_tiny_model())
    cal = calibrate(model, {"x": {"thresholds": 50.0, "qtype": "int16"},
                            "/stem/relu_out": {"thresholds": 4.0}})
    q = calibrated_qtypes_of(cal)
    assert q["/stem/Conv"].inputs[0] == "int16" and q["/stem/Conv"].op_type == "Conv"
    assert q["/stem/Relu"].outputs == ("int8",)
    assert q["/res/Conv"].inputs[0] == "int8"
    assert q["/head/depth/Mul"].outputs == (None,)


def calibrated_qtypes_of(proto):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m_calibrated_model.onnx"
        onnx.save(proto, str(path))
        return calibrated_qtypes(path)


@pytest.mark.parametrize("cell", ["", "n/a"])
def test_missing_cells_are_zero(cell):
    rows = [ROWS[0], ["/x", cell, "[1]", "[1]", cell, cell, cell]]
    (r,) = parse_layer_rows(rows)
    assert r.macs == 0 and r.compute_us == 0.0 and r.start_us is None
