"""The trial record's JSON codec against records as main (a8e95c4) wrote them into a journal.

tests/study/fixtures/records_main_a8e95c4.json holds four ``record`` user attributes copied
verbatim from the journal files of real searches made with main's code before the typed
record existed: a plain all-int8 trial, one with node_info, one with task metrics and an
answered-from-storage duplicate. Old studies must keep opening: each decodes, and encodes
back to the same JSON, key order included.
"""

import json
from pathlib import Path

import optuna
import pytest

from tuner.candidate import Candidate
from tuner.study.record import RECORD, Objectives, TrialRecord
from tuner.study.results import rows

FIXTURE = Path(__file__).parent / "fixtures" / "records_main_a8e95c4.json"
RECORDS = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_records_written_by_main_round_trip_exactly(name):
    stored = RECORDS[name]
    rec = TrialRecord.from_json(stored)
    assert rec.to_json() == stored
    assert json.dumps(rec.to_json()) == json.dumps(stored)      # same key order as well
    assert TrialRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec


def test_typed_fields_read_what_main_stored():
    rec = TrialRecord.from_json(RECORDS["node_info"])
    assert rec.accuracy == RECORDS["node_info"]["accuracy"]
    assert rec.latency_ms == RECORDS["node_info"]["latency"]["total_ms"]
    assert rec.counts.cpu_nodes == RECORDS["node_info"]["counts"]["cpu_nodes"]
    assert rec.calibration.method == "max-percentile:percentile=0.9999"
    assert rec.node_info["/res/Conv"] == {"ON": "CPU"}
    assert isinstance(rec.candidate, Candidate) and rec.candidate.key() == rec.key
    dup = TrialRecord.from_json(RECORDS["duplicate"])
    assert dup.duplicate_of == 0 and TrialRecord.from_json(RECORDS["original"]).duplicate_of is None
    assert dict(TrialRecord.from_json(RECORDS["task"]).task) == RECORDS["task"]["task"]


def test_keys_a_later_version_adds_are_kept():
    stored = dict(RECORDS["original"], future_field={"x": 1})
    assert TrialRecord.from_json(stored).to_json() == stored


def test_a_study_holding_main_records_reads_as_rows():
    study = optuna.create_study(directions=["maximize", "minimize"])
    dists = {"x": optuna.distributions.CategoricalDistribution(["a"])}
    for i, name in enumerate(("original", "node_info", "duplicate")):
        rec = RECORDS[name]
        study.add_trial(optuna.trial.create_trial(params={"x": "a"}, distributions=dists,
                                                  values=[rec["accuracy"], rec["latency"]["total_ms"]],
                                                  user_attrs={RECORD: rec, "plan": f"p{i}"}))
    rs = rows(study)
    assert [r.duplicate for r in rs] == [False, False, True]
    assert [r.record for r in rs] == [RECORDS[n] for n in ("original", "node_info", "duplicate")]
    assert rs[1].counts.int16_nodes == RECORDS["node_info"]["counts"]["int16_nodes"]


def test_objectives_give_directions_values_and_constraints_once():
    o = Objectives.from_dict({"mode": "pareto", "accuracy": "mean_cosine", "report": [], "min_accuracy": 0.99,
                              "max_latency_ms": None})
    assert o.directions() == ["maximize", "minimize"] and o.values(0.995, 2.0) == [0.995, 2.0]
    assert o.constraints(0.995, 2.0) == {"min_accuracy": pytest.approx(-0.005)}
    lat = Objectives(mode="latency", min_accuracy=0.9, max_latency_ms=3)
    assert lat.directions() == ["minimize"] and lat.values(0.95, 2.5) == [2.5]
    assert lat.constraints(0.95, 2.5) == {"min_accuracy": pytest.approx(-0.05), "max_latency_ms": -0.5}
    assert Objectives(mode="accuracy").values(0.9, 1.0) == [0.9] and Objectives().constraints(0.1, 99) == {}
    assert Objectives.from_dict(o.to_dict()) == o


def test_the_study_attribute_written_before_it_was_typed_round_trips():
    """fixtures/study_info_591f9cf.json: the ``tuner`` study attribute as 591f9cf wrote it (this
    machine's folders made relative)."""
    from tuner.study.record import StudyInfo

    stored = json.loads((Path(__file__).parent / "fixtures" / "study_info_591f9cf.json").read_text())
    info = StudyInfo.from_json(stored)
    assert info.mode == "pareto" and info.objectives == Objectives() and info.march == "bayes-e"
    assert info.fingerprints["model"] == stored["fingerprints"]["model"] and info.node_info_supported
    assert json.dumps(info.to_json()) == json.dumps(stored)      # same keys, same order
    later = StudyInfo.from_json({**stored, "mode": "latency", "objectives": {**stored["objectives"], "mode": "latency",
                                                                             "min_accuracy": 0.99}, "owner": "ci"})
    assert later.mode == "latency" and later.objectives.min_accuracy == 0.99 and later.extra == {"owner": "ci"}
    assert later.to_json()["owner"] == "ci"
