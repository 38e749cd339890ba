import json
import os

from cli import tuner as run
from helpers import write_int16_rules_project

from tuner.inputs.nodes import list_nodes


def test_nodes_lists_hb_names_default_placement_and_int16_keys(tiny_project):
    rows = {r.name: r for r in list_nodes(tiny_project)}
    # hb_mapper's names after its optimizer: the Mul by a constant is a lowered HzChannelScale
    assert rows["/head/depth/Mul"].op_type == "HzChannelScale"
    # hb's optimizer splits Where into Cast/Equal/Cast (CPU) and Mul/Mul/Add (BPU), folds the BN into its Conv
    assert rows["/gate/Where_cast"].default == "CPU" and rows["/gate/Where_cast"].placements == ("CPU",)
    assert rows["/gate/Where_add"].default == "BPU"
    assert "/gate/Where" not in rows and "/stem/BatchNormalization" not in rows
    assert rows["/gate/Greater"].default == "CPU" and "BPU" in rows["/gate/Greater"].placements
    assert rows["/stem/Conv"].int16 == ("InputType", "OutputType")
    assert [r.name for r in list_nodes(tiny_project, op="conv")] == ["/stem/Conv", "/res/Conv", "/gate/Conv",
                                                                    "/head/seg/Conv", "/head/depth/Conv"]


def test_nodes_follows_the_marchs_int16_rules(tmp_path):
    rows = {r.name: r for r in list_nodes(write_int16_rules_project(tmp_path / "r"))}
    assert rows["/mm/MatMul"].int16 == ("InputType0", "OutputType")     # never input 1
    assert rows["/dil/Conv"].int16 == ("InputType",)                    # a dilated Conv outputs int8 only
    assert rows["/up/ConvTranspose"].int16 == ()


def test_nodes_command_and_a_name_from_another_model(tiny_project, tmp_path):
    r = run("nodes", tiny_project, "--op", "Conv", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data[0] == {"name": "/stem/Conv", "op_type": "Conv", "default": "BPU", "placements": ["BPU", "CPU"],
                       "int16": ["InputType", "OutputType"], "node_info": None}
    r = run("nodes", tiny_project)
    assert r.returncode == 0 and "/gate/Where_mul_x" in r.stdout and "20 node(s)" in r.stdout
    # node_info naming a node of another model: the model's own names as examples
    text = tiny_project.read_text().replace("  node_info: {}", "  node_info: {'Conv_170': {'ON': 'CPU'}}")
    tiny_project.write_text(text)
    env = dict(os.environ, TUNER_CACHE_DIR=str(tmp_path / "cache"))
    r = run("eval", tiny_project, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert not (tmp_path / "cache").exists()             # refused before the statistics pass
    assert ("node 'Conv_170' is not in the model (this model names its Conv nodes like '/stem/Conv', '/res/Conv', "
            "'/gate/Conv')") in r.stderr
    assert "'tuner nodes CONFIG.yaml' lists them" in r.stderr
    tiny_project.write_text(text.replace("Conv_170", "/stem/Cnv"))
    r = run("eval", tiny_project)
    assert r.returncode == 2 and "did you mean '/stem/Conv'" in r.stderr
