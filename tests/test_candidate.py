import yaml

from tuner.candidate import Calibration, Candidate, NodeSetting
from tuner.inputs.config import load_config, parse_config


def test_yaml_round_trip_through_safe_dump_and_load(tmp_path):
    cand = Candidate.make(
        Calibration(type="max", max_percentile=0.99995, per_channel=True),
        {"/model.10/attn/Softmax": {"ON": "BPU", "InputType": "int16", "OutputType": "int16"},
         "/head/Conv": {"ON": "CPU"}, "/blk/Mul": {"InputType0": "int16"}})
    text = yaml.safe_dump(cand.to_yaml_fields(), sort_keys=False)
    assert "'ON': BPU" in text or "'ON': 'BPU'" in text          # the key ON is quoted
    back = Candidate.from_yaml_fields(yaml.safe_load(text))
    assert back == cand
    assert back.key() == cand.key()


def test_equal_configs_compare_equal_regardless_of_order():
    a = Candidate.make(nodes={"b": {"ON": "CPU"}, "a": {"OutputType": "int16"}})
    b = Candidate.make(nodes={"a": NodeSetting(output_type="int16"), "b": NodeSetting(on="CPU")})
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert a.key() != Candidate.make(nodes={"b": {"ON": "BPU"}}).key()


def test_from_config_reads_hb_fields(tiny_project):
    text = tiny_project.read_text().replace("  node_info: {}", "  node_info: {'/res/Add': {'InputType1': 'int16'}}")
    text = text.replace("  per_channel: False", "  per_channel: True\n  optimization: 'set_model_output_int16,asymmetric'")
    tiny_project.write_text(text)
    cand = Candidate.from_config(load_config(tiny_project))
    assert cand.calibration == Calibration(type="max", per_channel=True, asymmetric=True)
    assert cand.setting("/res/Add").input_dtype(1) == "int16"
    assert cand.setting("/res/Add").input_dtype(0) is None
    assert cand.optimization == ("set_model_output_int16",)
    fields = cand.to_yaml_fields()
    assert fields["calibration_parameters"]["optimization"] == "set_model_output_int16,asymmetric"


def test_exported_fields_pass_the_config_parser(tiny_project):
    """What a candidate writes must be accepted by the same schema rules hb_mapper applies."""
    base = yaml.safe_load(tiny_project.read_text())
    cand = Candidate.make(Calibration(type="kl", per_channel=True), {"/stem/Conv": {"ON": "CPU"}})
    fields = cand.to_yaml_fields()
    for section, values in fields.items():
        base[section].update(values)
    text = yaml.safe_dump(base, sort_keys=False)
    cfg = parse_config(yaml.safe_load(text), tiny_project)
    assert Candidate.from_config(cfg) == cand


def test_describe_matches_hb_mapper_log_wording():
    assert Calibration("max", 0.99995, True).describe() == "max-percentile:percentile=0.99995,per_channel"
    assert Calibration("max").describe() == "max"
    assert Calibration("kl", per_channel=True).describe() == "kl:num_bin=1024,max_num_bin=16384,per_channel"
    assert Calibration("kl").describe() == "kl:num_bin=1024,max_num_bin=16384"
    assert Calibration("max", 0.99995).describe() == "max-percentile:percentile=0.99995"
    assert Calibration("max", 1.0, True).describe() == "max:per_channel"   # p = 1 is plain max
    assert Calibration("max", per_channel=True).describe() == "max:per_channel"
    assert Calibration("max", asymmetric=True).describe() == "max:asymmetric"
    assert Calibration("max", per_channel=True, asymmetric=True).describe() == "max:per_channel,asymmetric"
    assert Calibration("kl", per_channel=True, asymmetric=True).describe() == \
        "kl:num_bin=1024,max_num_bin=16384,per_channel,asymmetric"
    # seven digits survive (%g printed 1)
    assert Calibration("max", 0.999995).describe() == "max-percentile:percentile=0.999995"
    assert Calibration("max", 0.9999995, True).describe() == "max-percentile:percentile=0.9999995,per_channel"


def test_bernoulli2_ignores_node_info_but_keeps_run_on_cpu(tiny_project):
    text = tiny_project.read_text().replace("march: 'bayes-e'", "march: 'bernoulli2'")
    text = text.replace("node_info: {}", "node_info: {'/res/Add': {'ON': 'CPU', 'InputType': 'int16'}}")
    text = text.replace("  per_channel: False", "  per_channel: False\n  run_on_cpu: '/gate/Mul'")
    tiny_project.write_text(text)
    from tuner.workspace import Workspace

    ws = Workspace.open(tiny_project)
    cand = ws.base_candidate()
    assert dict(cand.nodes) == {"/gate/Mul": NodeSetting(on="CPU")}
    assert any("has no node_info" in w for w in ws.warnings)


def test_calibration_parse_short_forms():
    import pytest

    from tuner.errors import TunerError

    assert Calibration.parse("kl") == Calibration(type="kl")
    assert Calibration.parse("max:0.99995+pc") == Calibration(type="max", max_percentile=0.99995, per_channel=True)
    assert Calibration.parse(" max+pc ").describe() == "max:per_channel"
    for bad, fragment in (("mse", "expected max, kl"), ("kl:0.9", "max only"), ("max:abc", "not a number"),
                          ("max:1.5", "(0, 1]")):
        with pytest.raises(TunerError, match=fragment.replace("(", r"\(").replace("]", r"\]")):
            Calibration.parse(bad)


def test_percentile_one_is_plain_max_in_one_vocabulary():
    """Percentile 1.0 (hb_mapper's default, a space's plain-max value) and no percentile are one
    configuration: one key, one description, one exported YAML; a percentile means nothing to kl."""
    from tuner.candidate import Calibration, Candidate

    one = Calibration(type="max", max_percentile=1.0, per_channel=True)
    assert one == Calibration(type="max", per_channel=True) and one.max_percentile is None
    assert one.describe() == "max:per_channel" and one.percentile_value == 1.0
    assert Calibration(type="kl", max_percentile=0.9999).max_percentile is None
    assert Calibration(type="max", max_percentile=0.9999).percentile_value == 0.9999
    spelled = Candidate.from_yaml_fields({"calibration_parameters": {"calibration_type": "max", "max_percentile": 1.0,
                                                                     "per_channel": True}})
    plain = Candidate.from_yaml_fields({"calibration_parameters": {"calibration_type": "max", "per_channel": True}})
    assert spelled.key() == plain.key() and spelled == plain
    assert spelled.to_yaml_fields()["calibration_parameters"] == {"calibration_type": "max", "per_channel": True}
    pct = Candidate.make(Calibration(type="max", max_percentile=0.99995))
    assert pct.to_yaml_fields()["calibration_parameters"]["max_percentile"] == 0.99995
    assert Candidate.from_yaml_fields(pct.to_yaml_fields()).key() == pct.key()
