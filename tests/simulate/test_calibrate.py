"""calibration_type default and mix chosen as hb_mapper chooses them (tuner.simulate.calibrate)."""

import math
from dataclasses import replace

import numpy as np
import pytest
import yaml
from cli import tuner
from helpers import write_example_project, write_mix_project, write_reciprocal_project, write_tiny_project

from tuner.candidate import Calibration, Candidate
from tuner.inputs.data import dataset_from_config
from tuner.runtime.session import make_session
from tuner.simulate import Simulator
from tuner.simulate.calibrate import (
    DEFAULT_METHODS,
    PER_TENSOR_METHODS,
    SIMILARITY_TARGET,
    MixedCalibration,
    MixScales,
    calibration_nodes,
    choose_default,
    rank,
    search_cosine,
    single_node_plan,
)
from tuner.workspace import Workspace


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Workspace.open(write_tiny_project(tmp_path_factory.mktemp("cal-tiny")))


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The bundled example's YAML (all int8) with calibration_type default."""
    path = write_example_project(tmp_path_factory.mktemp("cal-ex"), n_cal=8, n_eval=4)
    cfg = yaml.safe_load(path.read_text())
    cfg["calibration_parameters"]["calibration_type"] = "default"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return Workspace.open(path)


def own_score(ws, method: Calibration, sample: dict) -> float:
    """The documented score, computed here from the simulated and float outputs of one sample:
    per-output cosine dot / (|a| |b|), mean over outputs; a per-channel method scores as its per-tensor
    twin (hmct's comparison, observed on the real toolchain)."""
    names = ws.model.output_names
    sim, ref = ws.simulator.tensors(Candidate.make(replace(method, per_channel=False)), names, sample)
    cos = [float(np.dot(ref[o].ravel().astype(np.float64), sim[o].ravel().astype(np.float64))
                 / (np.linalg.norm(ref[o].astype(np.float64)) * np.linalg.norm(sim[o].astype(np.float64))))
           for o in names]
    return float(np.mean(cos))


def test_default_tries_the_12_methods_with_hb_mappers_strings():
    assert [m.describe() for m in PER_TENSOR_METHODS] == [
        "max", "max-percentile:percentile=0.99995", "kl:num_bin=1024,max_num_bin=16384"]
    assert len(DEFAULT_METHODS) == len(set(DEFAULT_METHODS)) == 12
    assert {m.describe() for m in DEFAULT_METHODS} >= {
        "max:per_channel", "max:asymmetric", "max:per_channel,asymmetric",
        "max-percentile:percentile=0.99995,per_channel,asymmetric",
        "kl:num_bin=1024,max_num_bin=16384,per_channel"}


def test_ties_go_to_the_alphabetically_first_method_string_and_nan_last():
    mx, pct, kl = PER_TENSOR_METHODS
    mx_pc = Calibration("max", per_channel=True)
    # "max" < "max-percentile:..." < "max:per_channel" ('-' sorts before ':')
    assert rank({pct: 0.9, mx_pc: 0.9, mx: 0.9, kl: math.nan}) == [mx, pct, mx_pc, kl]
    assert rank({mx: 0.5, kl: 0.5}) == [kl, mx]           # "kl:..." < "max"
    assert rank({mx: 0.5, kl: 0.6})[0] == kl and rank({mx: 0.7, kl: 0.6})[0] == mx


def test_the_search_stops_after_stage_1_only_when_its_best_reaches_the_target():
    calls = []

    def score(values):
        return lambda m: calls.append(m) or values.get(m, 0.1)

    good = choose_default(score({Calibration("max", 0.99995): SIMILARITY_TARGET}))
    assert calls == list(PER_TENSOR_METHODS) and good.stopped_at_stage1
    assert good.method == Calibration("max", 0.99995)
    calls.clear()
    best = Calibration("kl", per_channel=True, asymmetric=True)
    bad = choose_default(score({Calibration("max"): SIMILARITY_TARGET - 1e-9, best: 0.999}))
    assert calls == list(DEFAULT_METHODS) and not bad.stopped_at_stage1 and bad.method == best
    assert bad.notes() == ["default calibration: Select kl:num_bin=1024,max_num_bin=16384,per_channel,asymmetric "
                           "method.", "Perchannel quantization is enabled.", "Asymmetric quantization is enabled."]


def test_a_comparison_that_decides_nothing_says_so():
    """Every method 0 (PP-OCR's detector on a first photo without text: the float output is ~0, the
    int8 one 0): hb's tie rule picks kl; the notes say the scores decided nothing and what to do."""
    flat = choose_default(lambda m: 0.0)
    assert flat.undecided and flat.method == Calibration("kl")
    assert any("every method scored 0 on the first calibration sample" in n for n in flat.notes())
    mixed = choose_default(lambda m: 0.9 if m.per_channel else 0.5)
    assert not mixed.undecided and not any("every method" in n for n in mixed.notes())
    alike = choose_default(lambda m: 0.9993)     # stage 1 reaches the target with three equal scores
    assert alike.stopped_at_stage1 and not alike.undecided


def test_stage_1_reaching_0995_evaluates_no_per_channel_or_asymmetric_method(tiny):
    """The tiny model: per-tensor max scores 0.9992 >= 0.995 on its first calibration sample."""
    sim = tiny.simulator
    before_evals, before_keys = sim.search_evaluations, set(sim._sessions)
    ev = sim.evaluate(Candidate.make(Calibration("default")))
    choice = sim.choice(Candidate.make(Calibration("default")))
    assert sim.search_evaluations - before_evals == 3
    assert [m for m, _ in choice.scores] == list(PER_TENSOR_METHODS)
    assert max(v for _, v in choice.scores) >= SIMILARITY_TARGET
    built = {k[2] for k in set(sim._sessions) - before_keys}
    assert not any(c.per_channel or c.asymmetric for c in built)
    assert ev.calibration == choice.method == rank(dict(choice.scores))[0]
    assert ev.notes[0] == f"default calibration: Select {choice.method.describe()} method."
    assert not any("Perchannel" in n or "Asymmetric" in n for n in ev.notes)
    # the memo: the same plan asks no second search
    sim.evaluate(Candidate.make(Calibration("default")))
    assert sim.search_evaluations - before_evals == 3


def test_below_0995_the_example_evaluates_12_methods_and_picks_by_the_documented_score(example):
    """The example's all-int8 YAML with default: per-tensor methods score <= 0.90 on the first
    calibration sample (the input has a channel on another scale), so the 9 variants are tried."""
    sim = example.simulator
    cand = example.base_candidate()
    before = sim.search_evaluations
    ev = sim.evaluate(cand)
    choice = sim.choice(cand)
    # 12 methods compared; a per-channel one scores as its per-tensor twin, so 6 model runs
    assert sim.search_evaluations - before == 6
    assert [m for m, _ in choice.scores] == list(DEFAULT_METHODS)
    scores = dict(choice.scores)
    assert max(scores[m] for m in PER_TENSOR_METHODS) < SIMILARITY_TARGET
    # The winner by the documented rank; its log lines as hb_mapper prints them.
    assert choice.method == rank(scores)[0] and ev.calibration == choice.method
    assert ev.notes[0] == f"default calibration: Select {choice.method.describe()} method."
    assert ("Perchannel quantization is enabled." in ev.notes) == choice.method.per_channel
    assert ("Asymmetric quantization is enabled." in ev.notes) == choice.method.asymmetric
    # twins tie, and the tie rule (alphabetical method strings) never picks the per-channel one
    assert not choice.method.per_channel
    first = next(iter(example.calibration_data))
    for m in (choice.method, Calibration("max"), Calibration("kl", per_channel=True)):
        assert scores[m] == pytest.approx(own_score(example, m, first), abs=1e-9), m.describe()
    # the final evaluation is the chosen method's, on the evaluation set
    assert ev.outputs == sim.evaluate(Candidate.make(choice.method)).outputs


def test_the_score_reads_only_the_first_calibration_sample(tiny, tmp_path):
    """Same statistics, calibration sets that differ: equal scores when only samples 1.. differ,
    different scores when sample 0 does."""
    rng = np.random.default_rng(5)
    files = tiny.calibration_data.sample_files(0)
    same_first, other_first = tmp_path / "same", tmp_path / "other"
    for folder in (same_first, other_first):
        folder.mkdir()
    (same_first / "0000.bin").write_bytes(files[0].read_bytes())
    (other_first / "0000.bin").write_bytes((rng.random((1, 4, 16, 16), dtype=np.float32) * 9).tobytes())
    for i in range(1, 4):
        for folder in (same_first, other_first):
            (rng.standard_normal((1, 4, 16, 16)).astype(np.float32) * 30).tofile(folder / f"{i:04d}.bin")

    def scores(folder):
        data = dataset_from_config(tiny.config.inputs, tiny.model.input_shapes, folders=[folder]) if folder else None
        sim = Simulator(tiny.model, tiny.target, tiny.stats, tiny.eval_data, calibration_data=data)
        return dict(sim.choice(Candidate.make(Calibration("default"))).scores)

    base = dict(tiny.simulator.choice(Candidate.make(Calibration("default"))).scores)
    assert scores(same_first) == base
    assert scores(other_first) != base
    assert scores(None) == base        # without calibration data: the first evaluation sample (here the same file)


def test_default_scores_a_per_channel_method_as_its_per_tensor_twin(tmp_path):
    """hmct's comparison gave every per-channel method exactly its per-tensor twin's score on the real
    toolchain (observed by wrapping it; its per-channel kl runs the per-tensor kernel), so on the
    reciprocal model (x -> Relu -> Reciprocal -> Conv, channel 0 ~0.005 and channel 1 ~50), where plain
    per-channel fake quant would rescue channel 0, the twins tie and the tie rule (alphabetically first
    method string) selects the per-tensor one: default never selects per_channel."""
    ws = Workspace.open(write_reciprocal_project(tmp_path / "r", conv=True))
    sim = ws.simulator
    choice = sim.choice(Candidate.make(Calibration("default")))
    scores = dict(choice.scores)
    assert len(scores) == 12 and max(scores[m] for m in PER_TENSOR_METHODS) < SIMILARITY_TARGET
    for m, v in scores.items():
        assert v == scores[replace(m, per_channel=False)], m.describe()
    assert not choice.method.per_channel and choice.method == rank(scores)[0]
    top = max(scores.values())
    tied = sorted((m for m in scores if scores[m] == top), key=lambda m: m.describe())
    assert choice.method == tied[0] and any(m.per_channel for m in tied)


def test_search_cosine_is_the_model_wise_one():
    a = np.array([1.0, 2.0, 3.0])
    assert search_cosine(a, a) == pytest.approx(1.0)
    assert search_cosine(a, -a) == pytest.approx(-1.0)
    assert search_cosine(np.zeros(3), np.zeros(3)) == 0.0       # norms floored at 1e-8, no +eps
    assert math.isnan(search_cosine(a, np.array([1.0, np.inf, 0.0])))


def test_a_single_node_plan_quantizes_only_that_node(tiny):
    sim = tiny.simulator
    cand = Candidate.make(Calibration("max"))
    plan = sim.plan(cand)
    nodes = calibration_nodes(plan)
    assert "x" in nodes and len(nodes) == len(set(nodes)) > 3
    sample = next(iter(tiny.calibration_data))
    names = tiny.model.output_names
    ref = make_session(tiny.model.proto).run(names, sample)

    def outputs(p):
        from tuner.simulate.qdq import build_sim_model

        proto = build_sim_model(tiny.model.proto, sim.graph, tiny.target, p, sim.scales(cand.calibration), sim.weights)
        return make_session(proto).run(names, sample)

    nothing = single_node_plan(plan, "no such tensor")
    assert not nothing.edges and not nothing.outputs and not nothing.cpu_reads and not nothing.weights
    for a, b in zip(outputs(nothing), ref):          # no node on: the float model, weights included
        np.testing.assert_array_equal(a, b)
    only_x = single_node_plan(plan, "x")
    assert {t for t, _ in only_x.edges.values()} == {"x"}
    assert any(not np.array_equal(a, b) for a, b in zip(outputs(only_x), ref))


@pytest.fixture(scope="module")
def mixp(tmp_path_factory):
    """Two inputs that want different methods (tests/helpers.write_mix_project), calibration mix."""
    return Workspace.open(write_mix_project(tmp_path_factory.mktemp("mix")))


def test_mix_takes_per_node_methods(mixp):
    """Two inputs that want different methods: the base is the best per-tensor method (kl, which
    clips u's outlier, and v's spike less than max-percentile does); v and |v|, whose spike carries
    an output, are sensitive under kl and take max, whose single-node cosine is best. (Measured:
    base ranking kl 0.9748 > max 0.9567 > max-percentile 0.5587, which clips v's spike to the noise;
    v under kl 0.9757, max 0.9995.)"""
    example = mixp
    sim = example.simulator
    cand = Candidate.make(Calibration("mix"))
    builds = sim.session_builds
    ev = sim.evaluate(cand)
    mix = ev.calibration
    assert isinstance(mix, MixedCalibration)
    ranking = dict(mix.ranking)
    assert set(ranking) == set(PER_TENSOR_METHODS) and mix.base == max(ranking, key=ranking.get)
    assert mix.merge_info and mix.merged
    for tensor, values in mix.merge_info:
        values = dict(values)
        assert set(values) == set(PER_TENSOR_METHODS) and values[mix.base] < 0.999
        assert values[mix.method_for(tensor)] == max(values.values())
    for _tensor, method in mix.merged:
        assert method != mix.base
    taken = Calibration("max")
    assert mix.base == Calibration("kl") and dict(mix.merged) == {"v": taken, "av": taken}
    # per-tensor mixing of the scales: the merged node has its method's threshold, the others the base's
    scales = sim.scales(mix)
    assert isinstance(scales, MixScales)
    assert scales.threshold("v") == sim.scales(taken).threshold("v") != sim.scales(mix.base).threshold("v")
    other = next(t for t in calibration_nodes(ev.plan) if t not in dict(mix.merged))
    assert scales.threshold(other) == sim.scales(mix.base).threshold(other)
    # sessions are keyed by the mix: a second evaluation builds nothing, the base alone is another model
    n = sim.session_builds
    assert sim.evaluate(cand).outputs == ev.outputs and sim.session_builds == n > builds
    assert sim.evaluate(Candidate.make(mix.base)).outputs != ev.outputs
    assert any("select top-2 nodes" in note for note in ev.notes)



def test_eval_shows_the_mix_choice_and_its_merge_info(mixp):
    """`tuner eval` prints hb's Merge_Info table for a mix YAML; --json carries the merge."""
    import json

    run = ["eval", mixp.config.path, "--no-nodes"]
    text = tuner(*run)
    assert text.returncode == 0, text.stderr
    assert "Merge_Info(cosine-similarity)" in text.stdout
    merge_line = next(line for line in text.stdout.splitlines() if line.startswith("v "))
    assert "(select)" in merge_line
    assert "calibration mix:base=kl:" in text.stdout and "; max on 2 node(s)" in text.stdout
    out = tuner(*run, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["calibration"]
    assert data["type"] == "mix"
    assert sorted(data["merged"], key=lambda m: m["node"]) == [{"node": "av", "method": "max"}, {"node": "v", "method": "max"}]
    info = {row["node"]: row for row in data["merge_info"]}
    assert info["v"]["selected"] == info["av"]["selected"] == "max"
    assert len(data["ranking"]) == 3 and data["base"]["method"] == data["ranking"][0]["method"]


def test_eval_shows_defaults_comparison(example):
    """`tuner eval` on a default YAML prints every method default compared, with its score, and
    marks the one selected; --json carries the same list. The scores are the simulator's own."""
    import json

    cfg = example.config.path
    r = tuner("eval", str(cfg), "--no-nodes")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    choice = example.simulator.choice(example.base_candidate())
    chosen = next(line for line in out.splitlines() if line.endswith("<< selected"))
    assert chosen.split()[0] == choice.method.describe()
    assert sum(1 for line in out.splitlines() if line.split() and line.split()[0] in
               {m.describe() for m in DEFAULT_METHODS}) == len(choice.scores)
    r = tuner("eval", str(cfg), "--no-nodes", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["default_comparison"]
    assert [(r["method"], r["score"]) for r in rows] == [(m.describe(), v) for m, v in choice.scores]
    tiny_cfg = write_tiny_project(example.config.path.parent.parent / "tiny-max")   # calibration max: none
    r = tuner("eval", str(tiny_cfg), "--no-nodes", "--json")
    assert r.returncode == 0, r.stderr
    assert "default_comparison" not in json.loads(r.stdout)
