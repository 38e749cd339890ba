import onnx
import pytest
from helpers import build_tiny_model, write_tiny_space

from tuner.candidate import Calibration, Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, load_target
from tuner.simulate.plan import make_plan
from tuner.study.sections import parse_duration
from tuner.study.space import choice_setting, load_space, node_choices, resolve, setting_choice, tie_key


@pytest.fixture(scope="module")
def graph():
    return Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))


def test_defaults_fill_what_the_file_leaves_out(tmp_path):
    space = load_space(write_tiny_space(tmp_path))
    assert space.nodes["select"] == "bpu" and space.nodes["placement"] == ["BPU", "CPU"]
    assert space.objectives["accuracy"] == "mean_cosine"
    assert space.name == "tiny"
    assert space.base == (tmp_path / "tiny" / "hb_config.yaml").resolve()


def test_the_sections_are_typed_values_of_the_merged_file(tmp_path):
    from tuner.study.sections import CalibrationKnobs, NodesRule, StudySettings

    path = write_tiny_space(tmp_path)
    path.write_text(path.read_text().replace("  name: tiny\n", "  name: typed\n  timeout: 30m\n"))
    space = load_space(path)
    assert isinstance(space.rule, NodesRule) and space.rule.placement == ("BPU", "CPU")
    assert space.rule.precision == tuple(space.nodes["precision"]) and space.rule.top_k == space.nodes["top_k"]
    assert isinstance(space.knobs, CalibrationKnobs)
    assert space.knobs.max_percentile == tuple(float(p) for p in space.calibration["max_percentile"])
    assert set(space.knobs.free()) == {k for k in ("calibration_type", "max_percentile", "per_channel")
                                       if len(space.calibration[k]) > 1}
    assert isinstance(space.settings, StudySettings) and space.settings.timeout_s == 1800.0
    assert space.name == "typed" and space.objective.accuracy == space.objectives["accuracy"]
    with pytest.raises(AttributeError):
        space.rule.top_k = 3    # frozen


@pytest.mark.parametrize("extra,fragment", [
    ("nodes:\n  placment: [BPU]\n", "nodes.placment: unknown key (did you mean 'placement'?)"),
    ("nodes:\n  precision: [int4]\n", "nodes.precision: 'int4' is not one of"),
    ("nodes:\n  pattern: '(['\n", "nodes.pattern: invalid regular expression"),
    ("nodes:\n  top_k: 0\n", "nodes.top_k: expected a positive integer"),
    ("mode: pareto=>mode: fastest", "objectives.mode: must be one of"),
    ("objectives:\n  accuracy: f1\n", "objectives.accuracy: expected mean_cosine"),
    ("study:\n  timeout: soon\n", "study.timeout: expected seconds or a duration"),
    ("mode: pareto=>mode: latency\n  min_accuracy: 99.9",
     "objectives.min_accuracy: 99.9 is outside mean_cosine's range [-1, 1] (for 99.9% write 0.999)"),
    ("mode: pareto=>mode: accuracy\n  accuracy: 'cosine:seg'\n  min_accuracy: -2",
     "objectives.min_accuracy: -2 is outside cosine:seg's range [-1, 1]; no trial could meet it"),
    ("mode: pareto=>mode: accuracy\n  accuracy: 'miou:seg'\n  min_accuracy: 1.5",
     "objectives.min_accuracy: 1.5 is outside miou:seg's range [0, 1]"),
])
def test_bad_space_files_name_the_key(tmp_path, extra, fragment):
    path = write_tiny_space(tmp_path)
    text = path.read_text()
    section = extra.split(":", 1)[0]
    if "=>" in extra:
        old, new = extra.split("=>")
        text = text.replace(old, new)
    elif f"\n{section}:" in "\n" + text:  # merge into the existing section instead of repeating it
        head, body = extra.split("\n", 1)
        text = text.replace(f"{head}\n", f"{head}\n{body}", 1)
    else:
        text += extra
    path.write_text(text)
    with pytest.raises(TunerError) as err:
        load_space(path)
    assert fragment in str(err.value)


def test_latency_mode_needs_a_floor(tmp_path):
    path = write_tiny_space(tmp_path)
    path.write_text(path.read_text().replace("mode: pareto", "mode: latency"))
    with pytest.raises(TunerError, match="set objectives.min_accuracy"):
        load_space(path)


def test_missing_base_and_hb_yaml_given_as_space(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("base: nope.yaml\n")
    with pytest.raises(TunerError, match="base: 'nope.yaml' not found"):
        load_space(p)
    cfg = write_tiny_space(tmp_path).parent / "tiny" / "hb_config.yaml"
    with pytest.raises(TunerError, match="this is an hb_mapper YAML, not a search space"):
        load_space(cfg)


def test_node_choices_follow_the_target_tables():
    t = load_target("bayes-e")
    prec = ["int8", "int16_input", "int16_output", "int16"]
    all16 = ["BPU", "BPU:int16_input", "BPU:int16_output", "BPU:int16", "CPU"]
    assert node_choices("Conv", t, ["BPU", "CPU"], prec) == all16                 # int16 Conv on X5 (S3, S7)
    dilated = onnx.helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2, 2])
    assert node_choices("Conv", t, ["BPU", "CPU"], prec, dilated) == ["BPU", "BPU:int16_input", "CPU"]
    assert node_choices("ConvTranspose", t, ["BPU", "CPU"], prec) == ["BPU", "CPU"]
    assert node_choices("Conv", load_target("bernoulli2"), ["BPU", "CPU"], prec) == ["BPU", "CPU"]  # X3: no int16
    assert node_choices("Sigmoid", t, ["BPU", "CPU"], prec) == ["BPU", "BPU:int16_input", "BPU:int16_output",
                                                                 "BPU:int16", "CPU"]
    assert node_choices("Greater", t, ["BPU", "CPU"], prec) == ["BPU", "BPU:int16_input", "CPU"]  # input only
    assert node_choices("Where", t, ["BPU", "CPU"], prec) == ["CPU"]


def test_choices_round_trip_through_node_info():
    t = load_target("bayes-e")
    for op, choice in [("Sigmoid", "BPU:int16"), ("Sigmoid", "BPU:int16_input"), ("Conv", "CPU"), ("Conv", "BPU"),
                       ("Softmax", "BPU"), ("Softmax", "CPU"), ("Mul", "BPU:int16_output")]:
        assert setting_choice(choice_setting(choice, op, t), op, t) == choice
    assert choice_setting("BPU", "Conv", t).empty          # hb_mapper's default: no entry written
    # MatMul's int16 input is its first only: InputType0, never InputType (which would cover input 1)
    assert choice_setting("BPU:int16", "MatMul", t).to_dict() == {"InputType0": "int16", "OutputType": "int16"}
    assert setting_choice(choice_setting("BPU:int16_input", "MatMul", t), "MatMul", t) == "BPU:int16_input"
    assert choice_setting("BPU:int16_input", "Conv", t).to_dict() == {"InputType": "int16"}
    assert choice_setting("BPU", "Softmax", t).on == "BPU"  # default-CPU op must be forced


def test_resolve_decisions_and_candidates(tmp_path, graph):
    space = load_space(write_tiny_space(tmp_path))
    t = load_target("bayes-e")
    r = resolve(space, graph, t, Candidate.make(Calibration("max")))
    params = {d.param: d.choices[-1] for d in r.decisions}      # every free node on CPU
    params.update(calibration_type="max", max_percentile=0.9999, per_channel=True)
    with pytest.raises(TunerError, match="no node on the BPU"):   # hb_mapper refuses it too
        make_plan(graph, t, r.candidate(params))
    params[r.decisions[0].param] = r.decisions[0].choices[0]    # all but one
    cand = r.candidate(params)
    assert cand.calibration == Calibration("max", 0.9999, True)
    plan = make_plan(graph, t, cand)
    assert set(plan.cpu_nodes) >= {d.nodes[0] for d in r.decisions[1:]}
    # parameters for a known candidate reproduce it
    assert r.candidate(r.params_for(cand.calibration, params)) == cand
    # kl ignores the percentile: two parameter sets, one candidate
    a = r.candidate(dict(params, calibration_type="kl", max_percentile=1.0))
    b = r.candidate(dict(params, calibration_type="kl", max_percentile=0.9999))
    assert a == b


def test_top_k_keeps_the_most_sensitive(tmp_path, graph):
    path = write_tiny_space(tmp_path, extra="")
    path.write_text(path.read_text() + "nodes:\n  top_k: 2\n")
    space = load_space(path)
    sens = {n.name: float(i) for i, n in enumerate(graph)}  # later nodes "more sensitive"
    r = resolve(space, graph, load_target("bayes-e"), Candidate.make(), sens)
    free = [n for d in r.decisions for n in d.nodes]
    assert len(free) == 2 and all(sens[n] >= sorted(sens.values())[-4] for n in free)


def test_tie_repeated_blocks():
    assert tie_key("/blocks.3/attn/Softmax") == tie_key("/blocks.11/attn/Softmax") == "/blocks.*/attn/Softmax"
    assert tie_key("/enc2/conv") == "/enc2/conv"


def test_durations():
    assert parse_duration("8h", "x") == 8 * 3600 and parse_duration("30m", "x") == 1800
    assert parse_duration(90, "x") == 90 and parse_duration(None, "x") is None


def test_the_search_offers_int16_convs_on_bayes_e(tmp_path, graph):
    path = write_tiny_space(tmp_path)
    path.write_text(path.read_text() + "nodes:\n  precision: [int8, int16_input, int16]\n")
    space = load_space(path)
    for march, want in (("bayes-e", ("BPU", "BPU:int16_input", "BPU:int16", "CPU")), ("bernoulli2", ("BPU", "CPU"))):
        r = resolve(space, graph, load_target(march), Candidate.make(Calibration("max")))
        conv = next(d for d in r.decisions if d.nodes == ("/stem/Conv",))
        assert conv.choices == want, march
    r = resolve(space, graph, load_target("bayes-e"), Candidate.make(Calibration("max")))
    cand = r.candidate({"node:/stem/Conv": "BPU:int16"})
    assert make_plan(graph, r.target, cand).edges[("/stem/Conv", 0)] == ("x", "int16")


def test_min_accuracy_in_range_and_unbounded_sqnr_pass(tmp_path):
    path = write_tiny_space(tmp_path)
    text = path.read_text()
    path.write_text(text.replace("mode: pareto", "mode: latency\n  min_accuracy: 0.999"))
    assert load_space(path).objective.min_accuracy == 0.999
    path.write_text(text.replace("mode: pareto", "mode: latency\n  accuracy: mean_sqnr\n  min_accuracy: 35"))
    assert load_space(path).objective.min_accuracy == 35
