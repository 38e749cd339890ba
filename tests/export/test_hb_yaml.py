import pytest
import yaml

from tuner.candidate import Calibration, Candidate
from tuner.errors import TunerError
from tuner.export.hb_yaml import check_rules, dump_yaml, merged_config, write_atomic
from tuner.inputs.config import load_config


def test_merge_replaces_placement_keeps_the_rest_and_rebases_paths(tiny_project, tmp_path):
    raw = yaml.safe_load(tiny_project.read_text())
    raw["calibration_parameters"]["run_on_cpu"] = "/gate/Mul"
    cand = Candidate.make(Calibration("max", 0.99995, True),
                          {"/res/Add": {"ON": "CPU"}, "/gate/Sigmoid": {"InputType": "int16", "OutputType": "int16"}})
    out = tmp_path / "elsewhere" / "deep" / "x.yaml"
    cfg, notes = merged_config(raw, tiny_project, cand, out)
    assert "run_on_cpu" not in cfg["calibration_parameters"]   # placement lives in node_info alone
    assert cfg["model_parameters"]["node_info"] == {"/res/Add": {"ON": "CPU"},
                                                    "/gate/Sigmoid": {"InputType": "int16", "OutputType": "int16"}}
    assert cfg["calibration_parameters"]["max_percentile"] == 0.99995
    assert cfg["model_parameters"]["output_model_file_prefix"] == "tiny"
    check_rules(cfg, out)
    write_atomic(out, dump_yaml(cfg))
    text = out.read_text()
    assert "'ON': CPU" in text and "per_channel: True" in text
    loaded = load_config(out)
    assert loaded.onnx_model == (tiny_project.parent / "tiny.onnx").resolve()
    assert loaded.inputs[0].cal_dir == (tiny_project.parent / "cal").resolve()
    assert Candidate.from_config(loaded) == cand


def test_optimize_level_is_added_when_missing(tiny_project, tmp_path):
    raw = yaml.safe_load(tiny_project.read_text())
    del raw["compiler_parameters"]["optimize_level"]
    cfg, notes = merged_config(raw, tiny_project, Candidate.make(Calibration("kl")), tmp_path / "o.yaml")
    assert cfg["compiler_parameters"]["optimize_level"] == "O3" and any("O0" in n for n in notes)


def test_bernoulli2_exports_run_on_cpu(tiny_project, tmp_path):
    raw = yaml.safe_load(tiny_project.read_text())
    cand = Candidate.make(Calibration("max"), {"/res/Add": {"ON": "CPU"}, "/gate/Mul": {"ON": "CPU"}})
    cfg, _ = merged_config(raw, tiny_project, cand, tmp_path / "o.yaml", node_info_supported=False)
    assert "node_info" not in cfg["model_parameters"]
    assert set(cfg["calibration_parameters"]["run_on_cpu"].split(";")) == {"/res/Add", "/gate/Mul"}


def test_rules_catch_unknown_nodes_and_bad_keys(tiny_project, tmp_path):
    raw = yaml.safe_load(tiny_project.read_text())
    cfg, _ = merged_config(raw, tiny_project, Candidate.make(nodes={"/nope": {"ON": "CPU"}}), tmp_path / "o.yaml")
    with pytest.raises(TunerError, match="not a node of the model"):
        check_rules(cfg, tmp_path / "o.yaml", {"/stem/Conv"})
    cfg["calibration_parameters"]["quant_config"] = {}
    with pytest.raises(TunerError, match="quant_config: unknown key"):
        check_rules(cfg, tmp_path / "o.yaml")


def test_atomic_write_never_replaces_the_protected_file(tiny_project):
    before = tiny_project.read_text()
    with pytest.raises(TunerError, match="refusing to overwrite"):
        write_atomic(tiny_project, "x: 1\n", protect=(tiny_project,))
    assert tiny_project.read_text() == before
    assert not [p for p in tiny_project.parent.iterdir() if p.name.startswith(".hb_config")]


COMMENTED = """\
# My detector's hb_mapper config: hand-written, keep these notes
model_parameters:
    onnx_model: 'tiny.onnx'   # the float model
    march: "bayes-e"
    layer_out_dump: false     # lower-case, as I like it
    working_dir: model_output
    output_model_file_prefix: tiny
input_parameters:
    input_name: x
    input_type_rt: featuremap
    input_layout_rt: NCHW
    input_type_train: featuremap
    input_layout_train: NCHW
    input_shape: 1x4x16x16
    norm_type: no_preprocess
    # mean_value: 128 (not for featuremap)
calibration_parameters:
    cal_data_dir: cal          # 8 samples
    preprocess_on: no
    calibration_type: default
    per_channel: False
    run_on_cpu: /gate/Mul
# the compiler: latency first
compiler_parameters:
    compile_mode: latency
    debug: False
    # advice: 1
    optimize_level: 'O3'       # keep quoted
    core_num: 1
"""


def test_the_users_yaml_is_kept_as_written_but_for_tuners_keys(tiny_project, tmp_path):
    """Comments, key order, indentation, quoting and false / False / no stay; node_info, the
    calibration fields and the rebased paths change (and read back as hb_mapper reads them)."""
    from tuner.export.hb_yaml import round_trip_yaml

    base = tiny_project.parent / "commented.yaml"
    base.write_text(COMMENTED)
    cand = Candidate.make(Calibration("max", 0.99995, True),
                          {"/res/Add": {"ON": "CPU"}, "/gate/Sigmoid": {"InputType": "int16", "OutputType": "int16"}})
    out = tmp_path / "elsewhere" / "x.yaml"
    cfg, _ = merged_config(yaml.safe_load(COMMENTED), base, cand, out)
    text = round_trip_yaml(COMMENTED, cfg)
    assert text is not None and yaml.safe_load(text) == cfg
    kept = [ln for ln in COMMENTED.splitlines() if not ln.lstrip().startswith(
        ("onnx_model", "working_dir", "cal_data_dir", "calibration_type", "per_channel", "run_on_cpu"))]
    lines = text.splitlines()
    assert [ln for ln in lines if ln in kept] == kept             # every other line as written, in order
    assert "run_on_cpu" not in text and "'ON': CPU" in text
    # keys added at the end of a section go before the comment that opens the next one
    assert text.index("max_percentile:") < text.index("# the compiler") < text.index("compiler_parameters:")
    assert [ln.split(":")[0].strip() for ln in lines if ln.startswith("    cal")] == ["cal_data_dir", "calibration_type"]
    assert "../" in text.split("onnx_model:")[1].split("\n")[0] and "# the float model" in text
    out.parent.mkdir(parents=True)
    write_atomic(out, text)
    assert Candidate.from_config(load_config(out)) == cand        # what hb_mapper would read


def test_a_yaml_that_cannot_round_trip_is_written_plainly(tiny_project):
    from tuner.export.hb_yaml import round_trip_yaml

    assert round_trip_yaml("- a list\n", {"model_parameters": {}}) is None
    assert round_trip_yaml("a: [unclosed\n", {"a": 1}) is None
