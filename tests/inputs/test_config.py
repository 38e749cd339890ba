from pathlib import Path

import pytest

from tuner.errors import TunerError
from tuner.inputs.config import load_config

BASE = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_reads_the_example_fields(tiny_project):
    cfg = load_config(tiny_project)
    assert cfg.march == "bayes-e"
    assert cfg.onnx_model == (tiny_project.parent / "tiny.onnx").resolve()
    assert cfg.inputs[0].name == "x" and cfg.inputs[0].shape == (1, 4, 16, 16)
    assert cfg.inputs[0].cal_dir == (tiny_project.parent / "cal").resolve()
    assert cfg.calibration_type == "max" and cfg.per_channel is False


@pytest.mark.parametrize("old,new,fragment", [
    ("  march: 'bayes-e'", "  march: 'bayes-e'\n  marhc: 1", "model_parameters.marhc: unknown key"),
    ("  per_channel: False", "  per_channel: 'False'", "per_channel: expected a boolean"),
    ("  core_num: 1", "  core_num: '1'", "core_num: expected an integer"),
    ("  march: 'bayes-e'", "  march: 'bayes-x'", "march: 'bayes-x' is not one of"),
    ("  input_name: 'x'", "  input_name: [x]", "input_name: expected a string"),
    ("  node_info: {}", "  node_info: {'/stem/Conv': {ON: 'CPU'}}", "quote it as 'ON'"),
    ("  node_info: {}", "  node_info: {'/stem/Conv': {'ON': 'cpu'}}", "must be 'BPU' or 'CPU'"),
    ("  node_info: {}", "  node_info: {'/stem/Conv': {'OutputType0': 'int16'}}", "unknown key"),
    ("  node_info: {}", "  node_info: {'/stem/Conv': {'InputType': 'int4'}}", "must be 'int8' or 'int16'"),
    ("  calibration_type: 'max'", "  calibration_type: 'max'\n  max_percentile: 1.5", "max_percentile must be in"),
    ("compiler_parameters:", "extra_params:\n  a: 1\ncompiler_parameters:", "unknown section 'extra_params'"),
    ("  per_channel: False", "  per_channel: False\n  optimization: set_all_node_int16",
     "unknown option 'set_all_node_int16'; did you mean 'set_all_nodes_int16'?"),
    ("  per_channel: False", "  per_channel: False\n  optimization: 'set_Softmax_input_int8,set_Softmax_ouput_int8'",
     "unknown option 'set_Softmax_ouput_int8'; did you mean 'set_Softmax_output_int8'?"),
    ("  march: 'bayes-e'", "  march: 'bayes-e'\n  run_on_cpu: '/gate/Where'",
     "model_parameters.run_on_cpu: run_on_cpu belongs in calibration_parameters, not model_parameters"),
    ("  march: 'bayes-e'", "  march: 'bayes-e'\n  run_on_bpu: '/gate/Where'",
     "run_on_bpu belongs in calibration_parameters"),
])
def test_bad_keys_are_named(tiny_project, old, new, fragment):
    text = tiny_project.read_text()
    assert old in text
    tiny_project.write_text(text.replace(old, new, 1))
    with pytest.raises(TunerError, match=None) as err:
        load_config(tiny_project)
    assert fragment in str(err.value)


def test_invalid_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "model_parameters:\n  onnx_model: 'a.onnx\n")
    with pytest.raises(TunerError, match="invalid YAML at line"):
        load_config(p)


def test_missing_file(tmp_path):
    with pytest.raises(TunerError, match="no such file"):
        load_config(tmp_path / "nope.yaml")


def test_legacy_placement_merges_under_node_info(tiny_project):
    text = tiny_project.read_text().replace(
        "  node_info: {}", "  node_info: {'/stem/Conv': {'ON': 'BPU'}}").replace(
        "  per_channel: False", "  per_channel: False\n  run_on_cpu: '/stem/Conv;/res/Conv'")
    tiny_project.write_text(text)
    cfg = load_config(tiny_project)
    assert cfg.node_info["/stem/Conv"] == {"ON": "BPU"}       # node_info wins, as in hb_mapper
    assert cfg.node_info["/res/Conv"] == {"ON": "CPU"}
    assert any("node_info wins" in w for w in cfg.warnings)


def test_string_form_node_info(tiny_project):
    tiny_project.write_text(tiny_project.read_text().replace("  node_info: {}", "  node_info: '/res/Add:int16'"))
    assert load_config(tiny_project).node_info == {"/res/Add": {"OutputType": "int16"}}


def test_folder_suffix_rule_for_missing_cal_data_type(tiny_project):
    """The '_f32' folder-name rule is for image inputs (Horizon's PTQ docs); featuremap samples are float32."""
    text = tiny_project.read_text().replace("  cal_data_type: 'float32'\n", "")
    tiny_project.write_text(text.replace("input_type_train: 'featuremap'", "input_type_train: 'rgb'")
                            .replace("input_type_rt: 'featuremap'", "input_type_rt: 'rgb'"))
    cfg = load_config(tiny_project)
    assert cfg.inputs[0].cal_type == "uint8"
    assert any("folder-name rule" in w for w in cfg.warnings)
    tiny_project.write_text(text)
    cfg = load_config(tiny_project)
    assert cfg.inputs[0].cal_type == "float32" and not any("cal_data_type" in w for w in cfg.warnings)


def test_multi_input_lists_are_checked_per_input(tiny_project):
    text = tiny_project.read_text()
    text = (text.replace("input_name: 'x'", "input_name: 'x;y'")
            .replace("input_type_train: 'featuremap'", "input_type_train: 'featuremap;featuremap'")
            .replace("input_type_rt: 'featuremap'", "input_type_rt: 'featuremap;featuremap'")
            .replace("input_layout_train: 'NCHW'", "input_layout_train: 'NCHW;NCHW'")
            .replace("input_layout_rt: 'NCHW'", "input_layout_rt: 'NCHW;NCHW'")
            .replace("input_shape: '1x4x16x16'", "input_shape: '1x4x16x16;1x2x8x8'")
            .replace("cal_data_dir: 'cal'", "cal_data_dir: 'cal;cal2'")
            .replace("cal_data_type: 'float32'", "cal_data_type: 'float32;float32'"))
    tiny_project.write_text(text)
    cfg = load_config(tiny_project)
    assert [i.name for i in cfg.inputs] == ["x", "y"] and cfg.inputs[1].shape == (1, 2, 8, 8)
    assert cfg.inputs[1].cal_dir.name == "cal2"
    tiny_project.write_text(text.replace("'featuremap;featuremap'", "'featuremap;featmap'", 1))
    with pytest.raises(TunerError, match="'featmap' is not one of"):
        load_config(tiny_project)


def test_valid_optimization_options_pass(tiny_project):
    text = tiny_project.read_text().replace("  per_channel: False", "  per_channel: False\n  optimization: "
                                            "'set_all_nodes_int16,set_Conv_input_int16;set_Mul_output_int16'")
    tiny_project.write_text(text)
    assert load_config(tiny_project).optimization == ("set_all_nodes_int16", "set_Conv_input_int16",
                                                      "set_Mul_output_int16")


@pytest.mark.parametrize("old,new,lines", [
    ("  calibration_type: 'max'", "  calibration_type: 'max'\n  calibration_type: 'kl'", (18, 19)),
    ("  node_info: {}", "  node_info:\n    '/stem/Conv': {'ON': 'CPU'}\n    '/res/Conv': {'ON': 'CPU'}\n"
                        "    '/stem/Conv': {'InputType': 'int16'}", (7, 9)),
])
def test_duplicate_keys_name_both_lines(tiny_project, old, new, lines):
    text = tiny_project.read_text()
    assert old in text
    tiny_project.write_text(text.replace(old, new, 1))
    with pytest.raises(TunerError) as err:
        load_config(tiny_project)
    assert f"given twice in one mapping, at line {lines[0]} and line {lines[1]}" in str(err.value)


def test_duplicate_keys_in_a_space_file(tiny_project):
    from tuner.study.space import load_space
    space = tiny_project.parent / "space.yaml"
    space.write_text(f"base: {tiny_project.name}\nstudy: s\nstudy: t\n")
    with pytest.raises(TunerError, match="key 'study' is given twice in one mapping, at line 2 and line 3"):
        load_space(space)
