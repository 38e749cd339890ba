"""hb_mapper logs as the real tool writes them, every version: the fixture logs in real_logs/ (see
PROVENANCE.md there) and excerpts written in the same format where no real file shows a case."""

from pathlib import Path

import pytest

from tuner.candidate import Calibration, Candidate
from tuner.simulate.simulator import Evaluation, NodeRow
from tuner.toolchain.compare import Comparison
from tuner.toolchain.hblog import parse_log, read_log

LOGS = Path(__file__).with_name("real_logs")
V1_24 = LOGS / "01_zoo_hb_mapper_1.24.3_yolo11n.log"
V1_18 = LOGS / "12_user_wuchao_yolov8_ultra_1.18.2.log"
REPVGG = LOGS / "14_zoo_md_repvgg_excerpt.log"
INT16 = LOGS / "19_zoo_readme_yolo11_int16_excerpt.log"


# (log, rows of its node table, rows of its output table), counted in the files
@pytest.mark.parametrize("path,n_nodes,n_outputs", [(V1_24, 243, 6), (V1_18, 173, 6), (REPVGG, 47, 1), (INT16, 243, 6)],
                         ids=lambda v: v.name[:2] if isinstance(v, Path) else str(v))
def test_every_row_of_every_real_table_is_read(path, n_nodes, n_outputs):
    log = read_log(path)
    assert (len(log.nodes), len(log.outputs)) == (n_nodes, n_outputs)
    assert not log.warnings
    # no row swallowed the next one: a name is one word, and every row's cells are its own
    assert all(" " not in n.name and n.on in ("BPU", "CPU") for n in log.nodes)
    assert all(o.cosine is not None and " " not in o.name for o in log.outputs)


def test_blank_cells_of_hb_mapper_1_18_stay_blank():
    """hb_mapper <= 1.23 leaves the cosine and threshold cells of Split and inserted rows blank."""
    nodes = {n.name: n for n in read_log(V1_18).nodes}
    split = nodes["/model.2/Split"]
    assert (split.kernel, split.cosine, split.threshold, split.in_dtype, split.out_dtype) == \
        ("Split", None, None, "int8", "int8")
    # the row after it keeps its own name and values
    conv = nodes["/model.2/m.0/cv1/conv/Conv"]
    assert (conv.cosine, conv.threshold) == (0.931595, 28.33646)
    unit = nodes["UNIT_CONV_FOR_/model.2/m.0/Add"]
    assert (unit.kernel, unit.cosine, unit.threshold) == ("HzSQuantizedConv", 0.976257, 28.33646)
    # three blank rows in a row (lines 1295-1297) are three records
    for name in ("/model.4/Split_output_0_Requantize", "/model.4/Split_output_1_Requantize",
                 "/model.4/m.0/Add_output_0_Requantize"):
        assert nodes[name].kernel == "HzRequantize" and nodes[name].cosine is None
    names = [n.name for n in read_log(V1_18).nodes]
    assert names.index("/model.4/Concat") == names.index("/model.4/m.0/Add_output_0_Requantize") + 1
    assert nodes["/model.22/cv2.0/cv2.0.2/Conv"].out_dtype == "int32"


# hb_mapper <= 1.23 style: rows with nothing after the Type cell, one before a normal row, two in a row
SHORT_ROWS = """\
2023-03-01 10:00:00,000 file: node_info.py func: node_info line No: 55 The converted model node information:
=============================================================================================================
Node                             ON   Subgraph  Type              Cosine Similarity  Threshold  In/Out DataType
-------------------------------------------------------------------------------------------------------------
HZ_PREPROCESS_FOR_input          BPU  id(0)     HzPreprocess      0.999990           127.0      int8/int8
UNIT_CONV_FOR_561                BPU  id(0)     HzSQuantizedConv
Conv_16                          BPU  id(0)     HzSQuantizedConv  0.998000           3.5        int8/int8
Conv_16_output_0_pad             BPU  id(0)     HzPad
UNIT_CONV_FOR_577                BPU  id(0)     HzSQuantizedConv
Conv_18                          BPU  id(0)     HzSQuantizedConv  0.997000           4.25       int8/int32
2023-03-01 10:00:01,000 file: build.py func: build line No: 530 The quantify model output:
"""


def test_short_rows_are_records_of_their_own():
    log = parse_log(SHORT_ROWS)
    assert [(n.name, n.kernel, n.cosine, n.threshold, n.out_dtype) for n in log.nodes] == [
        ("HZ_PREPROCESS_FOR_input", "HzPreprocess", 0.99999, 127.0, "int8"),
        ("UNIT_CONV_FOR_561", "HzSQuantizedConv", None, None, None),
        ("Conv_16", "HzSQuantizedConv", 0.998, 3.5, "int8"),
        ("Conv_16_output_0_pad", "HzPad", None, None, None),
        ("UNIT_CONV_FOR_577", "HzSQuantizedConv", None, None, None),
        ("Conv_18", "HzSQuantizedConv", 0.997, 4.25, "int32")]
    assert not log.warnings


def test_a_row_that_cannot_be_read_is_named_by_its_line():
    lines = SHORT_ROWS.splitlines()
    # line 7: a cosine cell that is no number, a subgraph that is no id(n)
    lines[6] = "Conv_16                          BPU  id(0)     HzSQuantizedConv  0.99x000           3.5        int8/int8"
    lines[8] = "UNIT_CONV_FOR_577                BPU  0         HzSQuantizedConv"
    log = parse_log("\n".join(lines) + "\n")
    assert [n.name for n in log.nodes] == ["HZ_PREPROCESS_FOR_input", "UNIT_CONV_FOR_561", "Conv_16_output_0_pad",
                                           "Conv_18"]
    assert len(log.warnings) == 2
    assert "line 7" in log.warnings[0] and "Conv_16" in log.warnings[0]
    assert "line 9" in log.warnings[1] and "UNIT_CONV_FOR_577" in log.warnings[1]


def test_the_line_numbers_count_from_the_file_when_the_last_of_several_conversions_is_read():
    text = SHORT_ROWS + "2023-03-01 10:00:02,000 End Model Convert\n"
    broken = SHORT_ROWS.replace("0.998000           3.5", "0.99x000           3.5")
    log = parse_log(text + broken + "2023-03-01 10:00:04,000 End Model Convert\n")
    assert any("conversions" in w for w in log.warnings)
    [bad] = [w for w in log.warnings if "could not read" in w]
    assert f"line {len(text.splitlines()) + 7}" in bad


def test_older_output_table_headed_node():
    """Before 1.24 the output table is headed 'Node  Cosine Similarity ...' and names the output's node."""
    outs = read_log(V1_18).outputs
    assert [(o.name, o.cosine) for o in outs][:2] == [("/model.22/cv2.0/cv2.0.2/Conv", 0.974614),
                                                      ("/model.22/Sigmoid", 0.000024)]
    assert (outs[-1].name, outs[-1].l1, outs[-1].l2, outs[-1].chebyshev) == ("/model.22/Sigmoid_2", 0.000036, 0.00001,
                                                                             0.184444)
    assert read_log(V1_18).outputs_by == "node" and read_log(V1_24).outputs_by == "output"
    [gemm] = read_log(REPVGG).outputs
    assert (gemm.name, gemm.cosine, gemm.chebyshev) == ("/linear/Gemm", 0.768926, 8.068202)
    # the node table before it is still the node table
    assert read_log(REPVGG).nodes[-1].name == "/linear/Gemm_reshape_output"


# an X3 (bernoulli2) conversion's end, as OpenExplorer 2.x writes it
X3_TAIL = """\
2022-06-10 15:02:11,120 INFO Start to compile the model with march bernoulli2.
2022-06-10 15:02:20,531 INFO End to compile the model with march bernoulli2.
2022-06-10 15:02:20,532 INFO The converted model node information:
==============================================================================
Node                ON   Subgraph  Type   Cosine Similarity  Threshold
------------------------------------------------------------------------------
data                BPU  id(0)     Conv   0.999936           127.000000
fc                  CPU  --        Gemm   0.998000           --
2022-06-10 15:02:20,600 INFO The quantify model output:
=============================================================================
Node  Cosine Similarity  L1 Distance  L2 Distance  Chebyshev Distance
-----------------------------------------------------------------------------
fc    0.998000           0.001        0.0002       0.05
2022-06-10 15:02:21,804 INFO Convert to runtime bin file sucessfully!
2022-06-10 15:02:21,805 INFO End Model Convert
"""


def test_x3_era_success_line_and_march():
    log = parse_log(X3_TAIL)
    assert log.succeeded and log.march == "bernoulli2"
    assert [n.name for n in log.nodes] == ["data", "fc"] and [o.name for o in log.outputs] == ["fc"]


def test_march_of_hb_mapper_1_18():
    log = read_log(V1_18)
    assert log.march == "bayes" and log.succeeded and log.versions["hb_mapper"] == "1.18.2"


SOFTMAX = "/model.10/m/m.0/attn/Softmax"


def test_a_decomposed_int16_softmax_belongs_to_its_node():
    log = read_log(INT16)
    rows = log.rows_for(SOFTMAX)
    assert [r.kernel for r in rows] == ["HzQuantizedReduceMax", "HzSElementwiseSub", "HzLut2Layer",
                                        "HzSQuantizedReduceSum", "HzLut2Layer", "HzSElementwiseMul"]
    assert all(r.truncated and r.name.endswith("_FROM_QUANTIZED_SOFTMAX") and r.out_dtype == "int16" for r in rows)
    # the cut rule is the one of name_matches: another node's tail is no part of it
    assert log.rows_for("/model.20/m/m.0/attn/Softmax") == rows       # ambiguous by the tail alone, as cut names are
    assert log.rows_for("/model.10/m/m.0/attn/Mul") == [r for r in log.nodes if r.name == "/model.10/m/m.0/attn/Mul"]
    assert not log.rows_for("/other/Softmax")


def test_a_row_of_another_model_node_is_no_part():
    log = parse_log(SHORT_ROWS)
    assert [r.name for r in log.rows_for("Conv")] == ["Conv_16", "Conv_16_output_0_pad", "Conv_18"]
    assert [r.name for r in log.rows_for("Conv_16", ["Conv_16", "Conv_18"])] == ["Conv_16"]
    # 'Conv' has no row: Conv_16 and Conv_18 are model nodes of their own, the pad row is Conv_16's
    assert log.rows_for("Conv", ["Conv", "Conv_16", "Conv_18"]) == []
    assert [r.name for r in log.rows_for("Conv_16_output_0", ["Conv_16"])] == ["Conv_16_output_0_pad"]


def test_the_comparison_reports_the_decomposed_softmax_kept_int16():
    log = read_log(INT16)
    cand = Candidate.make(Calibration(type="max"), {SOFTMAX: {"ON": "BPU", "InputType": "int16",
                                                              "OutputType": "int16"}})
    rows = [NodeRow(name="/model.10/m/m.0/attn/Mul", op_type="Mul", on="BPU", subgraph=0, cosine=0.99, threshold=70.0,
                    in_dtype="int8", out_dtype="int8"),
            NodeRow(name=SOFTMAX, op_type="Softmax", on="BPU", subgraph=0, cosine=0.97, threshold=12.5,
                    in_dtype="int16", out_dtype="int16")]
    ev = Evaluation(candidate=cand, calibration=Calibration(type="max"), outputs={}, plan=None, nodes=rows)
    comp = Comparison.build(ev, log)
    softmax = {n.node: n for n in comp.nodes}[SOFTMAX]
    assert softmax.real_on == "BPU" and softmax.real_dtype == "int16" and softmax.int16_refused is False
    assert softmax.kernel == "HzQuantizedReduceMax"
    assert "input+output: kept" in comp.node_table()
    assert SOFTMAX not in comp.without_row
    assert not any(name.endswith("_FROM_QUANTIZED_SOFTMAX") for name in comp.log_only)


def test_an_indented_line_after_the_table_is_not_taken_into_its_last_row():
    head = SHORT_ROWS.splitlines()[:4]
    text = "\n".join(head + ["UNIT_CONV_FOR_561                BPU  id(0)     HzSQuantizedConv",
                             " " * 66 + "see the table above"]) + "\n"
    log = parse_log(text)
    [unit] = log.nodes
    assert (unit.name, unit.cosine, unit.threshold) == ("UNIT_CONV_FOR_561", None, None) and not log.warnings


def test_a_node_headed_output_table_pairs_by_the_outputs_producers():
    """The 1.18.2 log names /model.22/... nodes; with the graph's producers each output finds its
    row, without them none does (the names are not the model's outputs)."""
    from tuner.toolchain.compare import output_rows

    log = read_log(V1_18)
    producers = {f"output{i}": o.name for i, o in enumerate(log.outputs)}
    rows = output_rows(log, list(producers), producers)
    assert [(k, r.name) for k, r in rows.items()] == list(producers.items())
    assert output_rows(log, list(producers), None) == {}
    # a 1.24 table names outputs: producers are not needed
    new = read_log(V1_24)
    assert list(output_rows(new, [o.name for o in new.outputs], None)) == [o.name for o in new.outputs]
