"""Warm-start plans from a hand-built space: a real tiny graph, a made-up ranking, no simulation."""

import onnx
from helpers import build_tiny_model, write_tiny_space

from tuner.candidate import Calibration, Candidate
from tuner.graph import Graph, load_target
from tuner.study.space import load_space, resolve
from tuner.study.warmstart import (
    baseline_calibrations,
    best_baseline_calibration,
    reference_calibration,
    warm_start_plans,
)

SENSITIVITY = {"/head/depth/Conv": 0.5, "/gate/Conv": 0.2, "/stem/Conv": 0.1, "/head/seg/Conv": 0.05}


def resolved(tmp_path, extra=""):
    space = load_space(write_tiny_space(tmp_path, extra))
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    return resolve(space, graph, load_target("bayes-e"), Candidate.make(Calibration(type="max")), SENSITIVITY)


def test_baselines_cover_each_calibration_once_then_the_manual_plans(tmp_path):
    r = resolved(tmp_path)
    plans = warm_start_plans(r, SENSITIVITY)
    labels = [label for label, _ in plans]
    # max and kl, each per-tensor and per-channel; max also with its percentile below 1
    assert labels[:6] == ["baseline: all-BPU int8, max", "baseline: all-BPU int8, max-percentile:percentile=0.9999",
                          "baseline: all-BPU int8, max:per_channel",
                          "baseline: all-BPU int8, max-percentile:percentile=0.9999,per_channel",
                          "baseline: all-BPU int8, kl:num_bin=1024,max_num_bin=16384",
                          "baseline: all-BPU int8, kl:num_bin=1024,max_num_bin=16384,per_channel"]
    manual = [(label, p) for label, p in plans if label.startswith("manual")]
    assert manual[0][0] == "manual: 1 most sensitive node(s) int16"
    assert manual[0][1]["node:/head/depth/Conv"] == "BPU:int16"
    # the tail node on the CPU (the depth head is in the last 20% of the graph)
    assert any(label == "manual: 1 most sensitive tail node(s) on CPU" and p["node:/head/depth/Conv"] == "CPU"
               for label, p in manual)
    keys = [r.candidate(p).key() for _, p in plans]
    assert len(keys) == len(set(keys))                     # no candidate twice


def test_the_int16_plans_escalate_to_every_decision_that_allows_it(tmp_path):
    """Horizon's recipe promotes most sensitive nodes at once; on PP-OCR's classifier that plan is the cheapest
    way to the goal (search_quality.md): after 1, 3, 5 and 10 the warm start has int16 on every ranked
    decision offering it (here 14 of the tiny model's 15), in sensitivity order, each prefix once, then the
    recipe's CPU fallback on top of that."""
    r0 = resolved(tmp_path / "all")
    ranking = {n: 1.0 / (i + 1) for i, n in enumerate(n for d in r0.decisions for n in d.nodes)}
    r = resolve(r0.space, r0.graph, load_target("bayes-e"), Candidate.make(Calibration(type="max")), ranking)
    int16_ok = [d.param for d in r.decisions if any(c in d.choices for c in ("BPU:int16", "BPU:int16_input"))]
    plans = [p for label, p in warm_start_plans(r, ranking) if "most sensitive node(s) int16" in label]
    promoted = [[k for k, v in p.items() if k.startswith("node:") and v.startswith("BPU:int16")] for p in plans]
    assert len(int16_ok) > 10
    assert [len(p) for p in promoted] == [1, 3, 5, 10, len(int16_ok)]
    assert set(promoted[-1]) == set(int16_ok)
    order = [d.param for d in r.decisions if d.param in int16_ok]   # the ranking follows the graph here
    assert all(set(p) == set(order[:len(p)]) for p in promoted)
    # the recipe's last step: all of them, the 1 and then 2 most sensitive on the CPU instead
    last = {label: p for label, p in warm_start_plans(r, ranking) if label.startswith("manual: every ranked")}
    cpu_ok = [d.param for d in r.decisions if "CPU" in d.choices and d.default_choice != "CPU"]
    for k in (1, 2):
        p = last[f"manual: every ranked node int16, the {k} most sensitive on CPU"]
        assert [n for n, v in p.items() if v == "CPU"] == cpu_ok[:k]
        assert {n for n, v in p.items() if str(v).startswith("BPU:int16")} == set(int16_ok) - set(cpu_ok[:k])


def test_no_manual_plans_without_a_ranking_or_with_warm_start_off(tmp_path):
    r = resolved(tmp_path)
    assert all(label.startswith("baseline") for label, _ in warm_start_plans(r, {}))
    off = resolved(tmp_path / "off", "  warm_start: false\n")
    assert all(label.startswith("baseline") for label, _ in warm_start_plans(off, SENSITIVITY))


def test_manual_plans_take_the_best_scoring_baseline_calibration(tmp_path):
    r = resolved(tmp_path)
    plans = warm_start_plans(r, SENSITIVITY)
    want = Calibration(type="kl", per_channel=True)

    def score(cand):
        if cand.calibration.type == "max" and cand.calibration.max_percentile:
            raise RuntimeError("a failing baseline cannot be the best")
        return 0.99 if cand.calibration == want else 0.5

    assert best_baseline_calibration(r, plans, score) == want
    manual = [p for label, p in warm_start_plans(r, SENSITIVITY, want) if label.startswith("manual")]
    assert manual and all(r.candidate(p).calibration == want for p in manual)
    # nothing scores: the reference calibration (the base YAML's max, per-tensor)
    assert best_baseline_calibration(r, plans, lambda c: float("nan")) == reference_calibration(r.space, r.base)


def test_baselines_cover_the_whole_percentile_grid(tmp_path):
    """Every percentile x per_channel of max, and kl per_channel: one all-int8 baseline each (issue 17: only the
    last percentile was enqueued, so a user's all-int8 YAML at another percentile beat the "best baseline")."""
    path = write_tiny_space(tmp_path)
    path.write_text(path.read_text().replace("max_percentile: [1.0, 0.9999]", "max_percentile: [1.0, 0.99999, 0.9999]"))
    r = resolved_from(path)
    baselines = [r.candidate(p).calibration for label, p in warm_start_plans(r, SENSITIVITY) if label.startswith("baseline")]
    want = {Calibration(type="max", max_percentile=p, per_channel=pc) for p in (1.0, 0.99999, 0.9999)
            for pc in (False, True)} | {Calibration(type="kl", per_channel=pc) for pc in (False, True)}
    assert len(baselines) == len(want) == 8 and set(baselines) == want
    assert baseline_calibrations(r.space.knobs) == baselines


def resolved_from(space_path):
    graph = Graph(onnx.shape_inference.infer_shapes(build_tiny_model()))
    return resolve(load_space(space_path), graph, load_target("bayes-e"), Candidate.make(Calibration(type="max")),
                   SENSITIVITY)


def test_the_study_enqueues_every_baseline_of_the_grid(tmp_path):
    """0.99999 and 1.0 are both enqueued: Optuna's skip_if_exists compares floats with rtol 1e-5 and took
    one for the other (the example's 0.99999 baselines never ran)."""
    from optuna.trial import TrialState

    from tuner.study.session import StudySession

    path = write_tiny_space(tmp_path)
    path.write_text(path.read_text().replace("max_percentile: [1.0, 0.9999]", "max_percentile: [1.0, 0.99999, 0.9999]"))
    s = StudySession.open(path, results_dir=tmp_path / "results", quiet=True)
    study = s.study(seed=0)
    n = s.enqueue_warm_start(study)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert n == len(s.problem.warm_start_plans(s.manual_calibration())) == len(waiting)
    pcts = [(t.system_attrs["fixed_params"]["max_percentile"], t.system_attrs["fixed_params"]["per_channel"])
            for t in waiting if t.user_attrs["plan"].startswith("baseline: all-BPU int8, max")]
    assert sorted(pcts) == sorted((p, pc) for p in (1.0, 0.99999, 0.9999) for pc in (False, True))
