import onnx
import pytest
from helpers import build_int16_rules_model, build_tiny_model

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.simulate.plan import make_plan


@pytest.fixture(scope="module")
def graph():
    return Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))


@pytest.fixture(scope="module")
def rules():
    return Graph(onnx.shape_inference.infer_shapes(build_int16_rules_model()))


@pytest.fixture(scope="module")
def target():
    return load_target("bayes-e")


def dtype_in(plan, node, k):
    """The dtype input k of a BPU node is read in (a new quantization point or a passive op's grid)."""
    return (plan.edges.get((node, k)) or plan.passthrough[(node, k)])[1]


def plan_for(graph, target, nodes=None, optimization=()):
    return make_plan(graph, target, Candidate.make(nodes=nodes or {}, optimization=optimization))


def test_default_placement_and_subgraphs(graph, target):
    plan = plan_for(graph, target)
    assert plan.cpu_nodes == ["/gate/Greater", "/gate/Where"]  # Greater defaults to CPU, Where is CPU-only
    # /head/Concat needs the Where output: it cannot share a subgraph with the stem
    assert plan.n_subgraphs == 2
    assert plan.subgraph["/stem/Conv"] == plan.subgraph["/gate/Mul"] != plan.subgraph["/head/Concat"]


def test_fusion_edges_are_not_quantized(graph, target):
    plan = plan_for(graph, target)
    assert ("/stem/BatchNormalization", 0) not in plan.edges
    assert ("/stem/Relu", 0) not in plan.edges
    assert ("/res/Add", 0) not in plan.edges                   # Conv output inside Conv+Add+Relu
    assert plan.edges[("/res/Add", 1)] == ("/stem/relu_out", "int8")  # the residual input is quantized
    assert plan.edges[("/stem/Conv", 0)] == ("x", "int8")


def test_outputs_int32_for_conv_int8_otherwise(graph, target):
    plan = plan_for(graph, target)
    assert "seg" not in plan.outputs          # Conv leaves the BPU in int32
    # a model output no BPU node reads leaves the BPU in high precision: int16 with the same threshold
    # (hb's <out>_before int16 node; the example's depth output and /Sub_1 are int16 in every config)
    assert plan.outputs["depth"] == "int16"
    assert plan.out_dtype["/head/seg/Conv"] == "int32"


def test_bpu_to_cpu_edges_dequantize_the_producer_output(graph, target):
    plan = plan_for(graph, target, {"/gate/Mul": {"ON": "CPU"}})
    # on this (unoptimized) graph /res/relu_out (Conv+Add+Relu) is read by the CPU Mul and the CPU Where only:
    # the group hands its int32 accumulator over, unrounded (measured: A_cpu_conv5, A2_cpu_mulx; notes 1b)
    assert ("/gate/Mul", 0) not in plan.cpu_reads and plan.out_dtype["/res/Relu"] == "int32"
    # with one BPU reader more it stays int8: the CPU node reads what the BPU reader reads
    plan2 = plan_for(graph, target, {"/gate/Mul": {"ON": "CPU"}, "/gate/Where": {"ON": "BPU"}})
    if plan2.placement["/gate/Where"] == "BPU":
        assert plan2.cpu_reads[("/gate/Mul", 0)] == ("/res/relu_out", "int8")
    # a Sigmoid's table output stays int8 even when only a CPU node reads it (measured)
    assert plan.cpu_reads[("/gate/Mul", 1)] == ("/gate/sig_out", "int8")
    # the CPU Greater reads /gate/Conv_out as the BPU Sigmoid does (one quantizer per tensor)
    assert plan.cpu_reads[("/gate/Greater", 0)] == ("/gate/Conv_out", "int8")


def test_cpu_placement_splits_and_requantizes(graph, target):
    plan = plan_for(graph, target, {"/res/Add": {"ON": "CPU"}})
    assert plan.placement["/res/Add"] == "CPU"
    assert ("/res/Add", 1) in plan.cpu_reads and ("/res/Add", 0) not in plan.cpu_reads  # Conv output: int32
    assert plan.edges[("/res/Relu", 0)] == ("/res/add_out", "int8")                    # CPU->BPU quantizes again
    assert plan.n_subgraphs > plan_for(graph, target).n_subgraphs


def test_int16_honoured_where_the_march_allows_it(graph, target):
    plan = plan_for(graph, target, {"/gate/Sigmoid": {"InputType": "int16"}, "/head/Concat": {"InputType1": "int16"}})
    assert plan.edges[("/gate/Sigmoid", 0)] == ("/gate/Conv_out", "int16")
    assert plan.out_dtype["/gate/Conv"] == "int16"          # the producer emits what its reader takes
    assert plan.edges[("/head/Concat", 1)] == ("/stem/relu_out", "int16")
    # int16 on one Concat input makes the Concat's group int16: every input, the output, its readers
    # (hb_mapper 1.24.3, notes on hmct's placement rules 3a: C_f16, D_t16; the example's int16_2convs)
    assert plan.edges[("/head/Concat", 0)] == ("/gate/where_out", "int16")
    assert plan.edges[("/head/depth/Conv", 0)] == ("/head/cat_out", "int16")
    # /stem/relu_out is also the residual input of /res/Conv+Add+Relu: an int16 residual unfuses it (toy
    # Conv+Add+Relu, InputType int16 on the Conv reading the residual: the Add and Relu get their own rows)
    assert plan.edges[("/res/Add", 0)] == ("/res/Conv_out", "int8")
    assert plan.edges[("/res/Add", 1)] == ("/stem/relu_out", "int16")
    assert plan.edges[("/res/Relu", 0)] == ("/res/add_out", "int8")
    assert plan.notes == []
    # without it the group stays fused
    assert ("/res/Add", 0) not in plan_for(graph, target, {"/gate/Sigmoid": {"InputType": "int16"}}).edges


def test_int16_refused_on_conv_transpose_falls_back_with_a_note(rules):
    """ConvTranspose is int8 only on bayes-e (docs/hb_rules/ops.md S3); the note is hb_mapper's warning text."""
    plan = plan_for(rules, load_target("bayes-e"), {"/up/ConvTranspose": {"InputType": "int16"}})
    assert plan.edges[("/up/ConvTranspose", 0)] == ("/dil/tanh", "int8")
    assert plan.notes == ["The input0 of Node(name:/up/ConvTranspose, type:ConvTranspose) does not support data "
                          "type: int16 (on bayes-e; stays int8, as hb_mapper falls back)"]


def test_output_type_int16_reaches_int16_capable_consumers(graph, target):
    plan = plan_for(graph, target, {"/gate/Sigmoid": {"OutputType": "int16"}})
    assert plan.edges[("/gate/Mul", 1)] == ("/gate/sig_out", "int16")
    assert plan.out_dtype["/gate/Sigmoid"] == "int16"


def test_set_all_nodes_int16(graph, target):
    plan = plan_for(graph, target, optimization=("set_all_nodes_int16",))
    assert dtype_in(plan, "/gate/Mul", 0) == "int16"
    assert plan.edges[("/stem/Conv", 0)][1] == "int16"  # Conv takes int16 on bayes-e (docs/hb_rules/ops.md S3, S7)
    assert plan.notes == []                              # set_all_nodes_int16 is silent where it cannot apply


def test_forcing_a_cpu_only_op_onto_the_bpu_is_refused(graph, target):
    plan = plan_for(graph, target, {"/gate/Where": {"ON": "BPU"}, "/gate/Greater": {"ON": "BPU"}})
    assert plan.placement["/gate/Where"] == "CPU" and plan.placement["/gate/Greater"] == "BPU"
    assert any("/gate/Where" in n for n in plan.notes)


def test_unknown_node_is_an_error(graph, target):
    with pytest.raises(TunerError, match="'/stem/Conv2' is not in the model"):
        plan_for(graph, target, {"/stem/Conv2": {"ON": "CPU"}})


def test_int16_input_on_a_conv_leaves_its_output_int8(rules, target):
    """hmct's AdjustConvQuantParams only inserts an int16 point at max(w thr) x input threshold in front of
    the output's unchanged calibration (its source); measured: int16 in and out on the example's stem and
    fuse Convs leaves every Conv after them int8 (int16_2convs: /enc2/enc2.1 onwards)."""
    plan = plan_for(rules, target, {"/cancel/Conv": {"InputType": "int16"}})
    assert plan.edges[("/cancel/Conv", 0)] == ("x", "int16")
    assert plan.in_dtype["/cancel/Conv"] == "int16" and plan.out_dtype["/cancel/Conv"] == "int8"
    assert plan.edges[("/cancel/Sigmoid", 0)] == ("/cancel/Conv_out", "int8")
    assert plan.notes == []
    # X3 has no int16
    x3 = plan_for(rules, load_target("bernoulli2"), {"/cancel/Conv": {"InputType": "int16"}})
    assert x3.edges[("/cancel/Conv", 0)] == ("x", "int8")


def test_a_dilated_conv_takes_int16_in_but_gives_int8_out(rules, target):
    plan = plan_for(rules, target, {"/dil/Conv": {"OutputType": "int16"}, "/dil/Tanh": {"ON": "BPU"}})
    assert plan.out_dtype["/dil/Conv"] == "int8"
    assert plan.edges[("/dil/Tanh", 0)] == ("/dil/Conv_out", "int8")
    assert plan.notes == ["The output of Node(name:/dil/Conv, type:Conv) does not support data type: int16 "
                          "(on bayes-e; stays int8, as hb_mapper falls back)"]
    plan = plan_for(rules, target, {"/dil/Conv": {"InputType": "int16"}})
    assert plan.edges[("/dil/Conv", 0)] == ("/cancel/sig", "int16")
    assert plan.out_dtype["/dil/Conv"] == "int8"
    # int8 only also means no int32 accumulator output: read by the CPU, it was rounded to int8
    plan = plan_for(rules, target, {"/dil/Tanh": {"ON": "CPU"}, "/cancel/Sigmoid": {"ON": "CPU"}})
    assert plan.cpu_reads[("/dil/Tanh", 0)] == ("/dil/Conv_out", "int8")
    assert ("/cancel/Sigmoid", 0) not in plan.cpu_reads   # a plain Conv leaves in int32


def test_matmul_int16_only_on_its_first_input(rules, target):
    plan = plan_for(rules, target, {"/mm/MatMul": {"InputType1": "int16"}})
    assert dtype_in(plan, "/mm/MatMul", 1) == "int8"
    assert plan.notes == ["The input1 of Node(name:/mm/MatMul, type:MatMul) does not support data type: int16 "
                          "(on bayes-e; stays int8, as hb_mapper falls back)"]
    plan = plan_for(rules, target, {"/mm/MatMul": {"InputType0": "int16", "OutputType": "int16"}})
    # /mm/a is a Reshape of /up/Conv_out: one group, int16 from /up/Conv on; the Transpose's /mm/at is in it
    # too, but input 1 takes int8
    assert dtype_in(plan, "/mm/MatMul", 0) == "int16" and dtype_in(plan, "/mm/MatMul", 1) == "int8"
    assert plan.out_dtype["/up/Conv"] == "int16"
    assert plan.notes == []   # (the output leaves the BPU as the int32 accumulator: a model output)
    # InputType covers every input: input 0 is honoured, input 1 refused
    plan = plan_for(rules, target, {"/mm/MatMul": {"InputType": "int16"}})
    assert [dtype_in(plan, "/mm/MatMul", k) for k in (0, 1)] == ["int16", "int8"]
    assert len(plan.notes) == 1 and plan.notes[0].startswith("The input1 of Node(name:/mm/MatMul, type:MatMul)")


def test_an_int16_reader_of_an_int8_only_producer_reads_its_int8_output_requantized(rules, target):
    """A ConvTranspose cannot emit int16; hb_mapper logs it and requantizes its int8 output to int16 for the
    int16 Conv after it (notes on hmct's placement rules, 3b D_m16: ``ctr_Requantize`` int8 -> int16, the
    Conv's DataType int16): the values are the int8 ones, rounded to int8 first (``plan.emitted``)."""
    plan = plan_for(rules, target, {"/up/Conv": {"InputType": "int16"}})
    assert plan.edges[("/up/Conv", 0)] == ("/up/ct", "int16") and plan.emitted == {"/up/ct": "int8"}
    assert plan.out_dtype["/up/ConvTranspose"] == "int8"
    assert plan.notes == ["The output of Node(name:/up/ConvTranspose, type:ConvTranspose) does not support data type: "
                          "int16 (on bayes-e; it stays int8 and is requantized to int16 for its int16 readers, as "
                          "hb_mapper does)"]
    plan = plan_for(rules, target, optimization=("set_all_nodes_int16",))
    assert dtype_in(plan, "/up/Conv", 0) == dtype_in(plan, "/mm/MatMul", 0) == "int16"
    assert dtype_in(plan, "/mm/MatMul", 1) == "int8" and dtype_in(plan, "/up/ConvTranspose", 0) == "int8"
    assert plan.notes == []


# -- hb's own moves to the CPU ---------------------------------------------------------------------


def _decoder(tap_maxpool: bool = False):
    """helpers.decoder_toy as a Graph."""
    from helpers import decoder_toy

    t, outs = decoder_toy(tap_maxpool)
    return t.graph(outs)


def test_hb_moves_a_cpu_convs_activation_and_the_pass_through_ops_that_only_feed_the_cpu():
    """Measured with toy models on hb_mapper 1.24.3 (decoder P2/P6/P7/P8/P10, Q_*/R_* in the session's notes):
    a Relu or Clip fused after an ``ON: CPU`` Conv is on the CPU in hb's node table; a MaxPool, AveragePool,
    Concat, Resize or Slice whose readers are all on the CPU goes there too, repeatedly; an entry of its own
    (``ON: BPU``, ``InputType``) keeps it on the BPU, as does a reader on the BPU."""
    target = load_target("bayes-e")
    g = _decoder()
    plan = make_plan(g, target, Candidate.make(nodes={"/conv_2": {"ON": "CPU"}}))
    assert {n for n in plan.cpu_nodes} == {"/conv_2", "/relu_2", "/cat", "/up"}
    assert plan.placement["/relu_1"] == "BPU"                    # fused with its BPU Conv
    assert any("/up (Resize): every node reading it is on the CPU" in n for n in plan.notes)
    assert any("/relu_2 (Relu): follows its Conv /conv_2" in n for n in plan.notes)
    for entry in ({"ON": "BPU"}, {"InputType": "int16"}):
        kept = make_plan(g, target, Candidate.make(nodes={"/conv_2": {"ON": "CPU"}, "/cat": entry}))
        assert set(kept.cpu_nodes) == {"/conv_2", "/relu_2"}, entry
    # a CPU Conv's own Relu follows it; the Resize after it, read by the BPU Concat, stays
    first = make_plan(g, target, Candidate.make(nodes={"/conv_1": {"ON": "CPU"}}))
    assert set(first.cpu_nodes) == {"/conv_1", "/relu_1"}
    # a MaxPool with a reader on the BPU stays there; with both readers on the CPU it goes too
    g2 = _decoder(tap_maxpool=True)
    assert make_plan(g2, target, Candidate.make(nodes={"/conv_4": {"ON": "CPU"}})).placement["/pool"] == "BPU"
    both = make_plan(g2, target, Candidate.make(nodes={"/conv_4": {"ON": "CPU"}, "/conv_5": {"ON": "CPU"}}))
    assert both.placement["/pool"] == "CPU"
