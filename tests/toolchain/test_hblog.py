"""hb_mapper log parsing on hand-written logs, one per variant of the documented format
(docs/hb_rules/config.md §7)."""

import pytest

from tuner.errors import TunerError
from tuner.toolchain.compare import spearman
from tuner.toolchain.hblog import parse_log, read_log, require_tables

T = "2025-01-07 09:12:{:02d},100 file: print_info_dict.py func: print_info_dict line No: 72 "

# Newer X5 builds: one DataType column, kernels as Hz*, long names cut to '...tail', '--' cells.
NEW = f"""\
{T.format(1)}Start hb_mapper....
{T.format(2)}hb_mapper version   : 1.24.3
{T.format(3)}horizon_nn version  : 1.1.0
The input of node /blk/attn/Softmax are set to : int16
The output of node /blk/attn/Softmax are set to : int16
The input of node /blk/act/Sigmoid are set to : int16
There are 1 nodes designated to run on the bpu: ['/blk/attn/Softmax'].
There are 2 nodes designated to run on the cpu: ['/head/Conv', '/head/Reshape'].
{T.format(4)}The specified model compilation architecture: bayes-e.
{T.format(5)}Run calibration model with modelwise search method.
{T.format(6)}Select max-percentile:percentile=0.99995,per_channel method.
{T.format(7)}The int16 setting of node '/blk/act/Sigmoid' is not supported, fall back to int8.
{T.format(8)}The main quantized node information:
==================================================================================================================
Node                                                ON   Subgraph  Type                    Cosine Similarity  Threshold  DataType
------------------------------------------------------------------------------------------------------------------
HZ_PREPROCESS_FOR_images                            BPU  id(0)     HzSQuantizedPreprocess  0.999761           127.0      int8
/stem/Conv                                          BPU  id(0)     HzSQuantizedConv        0.999393           1.11671    int8
/blk/act/Sigmoid                                    BPU  id(0)     HzLut                   0.995745           71.8498    int8
/blk/attn/Softmax                                   BPU  id(0)     HzLut2Layer             0.990100           8.25       int16
.../a/very/long/module/path/that/hb_mapper/cut/Mul  BPU  id(0)     HzSElementwiseMul       0.985000           3.5        int8
/blk/Split_output_0_calibrated_Requantize           BPU  id(0)     HzRequantize            --                 --         int8
/head/Conv                                          CPU  --        Conv                    0.980000           --         float
/head/Reshape                                       CPU  --        Reshape                 0.980000           --         float
{T.format(9)}The quantized model output:
=============================================================================
Output      Cosine Similarity  L1 Distance  L2 Distance  Chebyshev Distance
-----------------------------------------------------------------------------
out0        0.999806           0.245257     0.000457     3.454550
475         0.992659           0.179470     0.000446     5.521544
{T.format(10)}Convert to runtime bin file successfully!
{T.format(11)}End Model Convert
"""

# Older builds: In/Out DataType, ONNX op names as Type, no prefix on the header line.
OLD = f"""\
{T.format(1)}The converted model node information:
==========================================================================================
Node                     ON   Subgraph  Type          Cosine Similarity  Threshold   In/Out DataType
------------------------------------------------------------------------------------------
HZ_PREPROCESS_FOR_data   BPU  id(0)     HzPreprocess  0.999995           127.000000  int8/int8
/conv1/Conv              BPU  id(0)     Conv          0.999562           1.013355    int8/int32
/sm/Softmax              BPU  id(0)     Softmax       0.998000           2.5         int8/int8
/fc/Gemm                 CPU  --        Gemm          0.997000           --          float/float
{T.format(2)}The quantized model output:
===================================================================
Output  Cosine Similarity  L1 Distance  L2 Distance  Chebyshev Distance
-------------------------------------------------------------------
prob    0.997000           0.001        0.0002       0.05
"""


def test_newer_format_is_read_into_typed_records():
    log = parse_log(NEW, "new.log")
    assert [n.name for n in log.nodes][:3] == ["HZ_PREPROCESS_FOR_images", "/stem/Conv", "/blk/act/Sigmoid"]
    assert len(log.nodes) == 8
    conv = log.nodes[1]
    assert (conv.on, conv.subgraph, conv.kernel, conv.cosine, conv.threshold, conv.in_dtype, conv.out_dtype) == \
        ("BPU", 0, "HzSQuantizedConv", 0.999393, 1.11671, None, "int8")
    req = log.nodes[5]
    assert req.cosine is None and req.threshold is None and req.kernel == "HzRequantize"
    cpu = log.nodes[6]
    assert cpu.on == "CPU" and cpu.subgraph is None and cpu.threshold is None and cpu.out_dtype == "float"
    assert log.nodes[3].out_dtype == "int16"
    assert [(o.name, o.cosine, o.l1, o.l2, o.chebyshev) for o in log.outputs] == [
        ("out0", 0.999806, 0.245257, 0.000457, 3.45455), ("475", 0.992659, 0.17947, 0.000446, 5.521544)]
    assert log.method == "max-percentile:percentile=0.99995,per_channel"
    assert log.versions == {"hb_mapper": "1.24.3", "horizon_nn": "1.1.0"}
    assert log.march == "bayes-e" and log.succeeded and not log.errors and not log.warnings
    assert log.requested_bpu == ["/blk/attn/Softmax"] and log.requested_cpu == ["/head/Conv", "/head/Reshape"]
    sets = {(e.node, e.side) for e in log.int16 if e.status == "set"}
    assert sets == {("/blk/attn/Softmax", "input"), ("/blk/attn/Softmax", "output"), ("/blk/act/Sigmoid", "input")}
    [refused] = log.refused()
    assert refused.node == "/blk/act/Sigmoid" and "fall back" in refused.text
    assert log.mean_output_cosine == pytest.approx((0.999806 + 0.992659) / 2)


def test_a_cut_name_matches_its_node_by_the_tail():
    log = parse_log(NEW)
    cut = log.nodes[4]
    assert cut.truncated
    assert cut.matches("/model/a/very/long/module/path/that/hb_mapper/cut/Mul")
    assert not cut.matches("/model/other/Mul")
    assert log.rows_for("/model/a/very/long/module/path/that/hb_mapper/cut/Mul") == [cut]
    # hb_mapper splits some nodes; their rows are '<name>_...'
    assert [r.name for r in log.rows_for("/blk/Split")] == ["/blk/Split_output_0_calibrated_Requantize"]


def test_older_in_out_datatype_format():
    log = parse_log(OLD)
    assert [(n.name, n.in_dtype, n.out_dtype) for n in log.nodes] == [
        ("HZ_PREPROCESS_FOR_data", "int8", "int8"), ("/conv1/Conv", "int8", "int32"), ("/sm/Softmax", "int8", "int8"),
        ("/fc/Gemm", "float", "float")]
    assert log.nodes[1].threshold == pytest.approx(1.013355)
    assert [o.name for o in log.outputs] == ["prob"] and log.method is None


def test_header_without_datatype_and_pipe_separated_output_table():
    text = """\
======================================================================
Node          ON   Subgraph  Type     Cosine Similarity  Threshold
----------------------------------------------------------------------
/a/Conv       BPU  id(0)     Conv     0.999936           127.000000
/b/Conv       BPU  id(1)     Conv     0.999868           2.557209

Output | Cosine Similarity | L1 | L2 | Chebyshev
-----------------------------------------------
y      | 0.99              | 0.1 | 0.2 | 0.3
"""
    log = parse_log(text)
    assert [(n.name, n.subgraph, n.cosine, n.out_dtype) for n in log.nodes] == [
        ("/a/Conv", 0, 0.999936, None), ("/b/Conv", 1, 0.999868, None)]
    assert [(o.name, o.cosine, o.l1, o.l2, o.chebyshev) for o in log.outputs] == [("y", 0.99, 0.1, 0.2, 0.3)]


def test_wrapped_rows_are_joined():
    text = """\
Node                ON   Subgraph  Type              Cosine Similarity  Threshold  DataType
-----------------------------------------------------------------------------------------
/a/Conv             BPU  id(0)     HzSQuantizedConv  0.999000           1.0        int8
/backbone/stage4/block12/attention/projection/output/Conv
                    BPU  id(0)     HzSQuantizedConv  0.990000           2.0        int8
/b/Mul              BPU  id(0)     HzSElementwiseMul
                                                     0.980000           3.0        int16
/c/Add              BPU  id(0)     HzSElementwiseAdd 0.970000           4.0        int8
2025-01-07 09:12:01,000 file: x.py func: x line No: 1 done
"""
    log = parse_log(text)
    assert [(n.name, n.cosine, n.threshold, n.out_dtype) for n in log.nodes] == [
        ("/a/Conv", 0.999, 1.0, "int8"), ("/backbone/stage4/block12/attention/projection/output/Conv", 0.99, 2.0, "int8"),
        ("/b/Mul", 0.98, 3.0, "int16"), ("/c/Add", 0.97, 4.0, "int8")]
    assert not log.warnings


def test_a_log_with_several_conversions_is_read_from_the_last():
    second = NEW.replace("0.999393", "0.912345")
    log = parse_log(OLD + f"{T.format(12)}End Model Convert\n" + second)
    assert log.nodes[1].name == "/stem/Conv" and log.nodes[1].cosine == 0.912345
    assert any("conversions" in w for w in log.warnings)


def test_not_a_log_is_a_clear_error(tmp_path):
    cfg = tmp_path / "hb_config.yaml"
    cfg.write_text("model_parameters:\n  onnx_model: m.onnx\n")
    with pytest.raises(TunerError, match="not an hb_mapper makertbin log"):
        read_log(cfg)
    binary = tmp_path / "model.onnx"
    binary.write_bytes(b"\x08\x07\x12\x00\x00binary")
    with pytest.raises(TunerError, match="binary file"):
        read_log(binary)
    with pytest.raises(TunerError, match="no such file"):
        read_log(tmp_path / "missing.log")


def test_a_failed_conversion_names_its_error():
    text = (f"{T.format(1)}Start hb_mapper....\n"
            "2025-01-07 09:12:03,000 ERROR HorizonRT not support these cpu operators: GridSample\n")
    log = parse_log(text)
    assert not log.has_tables and log.errors
    with pytest.raises(TunerError, match="did not finish.*GridSample"):
        require_tables(log)


def test_record_round_trips_through_a_dict():
    from tuner.toolchain.hblog import HbLog

    log = parse_log(NEW)
    assert HbLog.from_dict(log.as_dict()) == log


def test_spearman_rank_correlation():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / 3 ** 0.5)   # ties share the mean rank
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


@pytest.mark.parametrize("cal_args", [dict(type="max", per_channel=True), dict(type="max", asymmetric=True),
                                      dict(type="max", per_channel=True, asymmetric=True),
                                      dict(type="max", max_percentile=0.999995),
                                      dict(type="kl", per_channel=True, asymmetric=True)])
def test_the_select_line_of_every_default_method_reads_back_as_the_simulated_method_string(cal_args):
    """The verify/import-log comparison sets log.method against Calibration.describe(): they must
    be the same text for each of default's 12 methods (colon form, docs/hb_rules/quantizer.md §2.2)."""
    from tuner.candidate import Calibration

    text = Calibration(**cal_args).describe()
    log = parse_log(NEW.replace("Select max-percentile:percentile=0.99995,per_channel method.", f"Select {text} method."))
    assert log.method == text
