"""The typed real-toolchain record reads what earlier versions stored, and writes the same shape.

``real_records_v4.json``: the ``real:N`` study attributes tuner 0.x wrote before the record was
typed (a verify run with the stand-in hb_mapper on the tiny study, and a failing command;
this machine's folders replaced by relative ones).
"""

import json
from pathlib import Path

import optuna
import pytest

from tuner.toolchain.compare import Comparison
from tuner.toolchain.records import RealRecord, comparison_for_trial, real_record, real_records, save_real

OLD = json.loads(Path(__file__).with_name("real_records_v4.json").read_text())


def _without_nulls(d):
    return {k: v for k, v in d.items() if v is not None}


def test_old_blobs_read_as_typed_records():
    ok, failed = RealRecord.from_json(OLD["real:3"]), RealRecord.from_json(OLD["real:1"])
    assert ok.ok and ok.accuracy == OLD["real:3"]["accuracy"] and ok.accuracy_source == "log:mean_cosine"
    assert isinstance(ok.comparison, Comparison) and ok.comparison.n_paired > 0
    assert ok.feedback_trial == OLD["real:3"]["feedback_trial"] and ok.real_accuracy == ok.accuracy
    assert ok.log_summary is not None and ok.log_summary["nodes"] == OLD["real:3"]["log_summary"]["nodes"]
    assert failed.status == "failed" and not failed.ok and failed.returncode == 3
    assert failed.accuracy is None and failed.real_accuracy is None and failed.comparison is None
    assert failed.error is not None and failed.error.startswith("exit code 3")


@pytest.mark.parametrize("key", ["real:3", "real:1"])
def test_the_stored_shape_is_the_old_one(key):
    """Round trip: the same keys and values; only keys whose value was null are left out."""
    assert RealRecord.from_json(OLD[key]).to_json() == _without_nulls(OLD[key])


def test_keys_of_another_version_are_kept_and_a_bad_status_is_refused():
    blob = {**OLD["real:1"], "board_serial": "X5-0042"}
    rec = RealRecord.from_json(blob)
    assert rec.extra == {"board_serial": "X5-0042"} and rec.to_json()["board_serial"] == "X5-0042"
    with pytest.raises(ValueError, match="status 'maybe'"):
        RealRecord.from_json({**OLD["real:1"], "status": "maybe"})


def test_json_result_is_stored_under_its_old_key_and_the_summary_is_short():
    rec = RealRecord(status="ok", when="2026-12-01T10:00:00", board={"accuracy": 0.71, "latency_ms": 8.2},
                     accuracy=0.71, accuracy_source="json:accuracy", latency_ms=8.2, sim_accuracy=0.74)
    blob = rec.to_json()
    assert blob["json"] == {"accuracy": 0.71, "latency_ms": 8.2} and "board" not in blob
    assert RealRecord.from_json(blob) == rec
    assert rec.summary() == {"status": "ok", "accuracy": 0.71, "accuracy_source": "json:accuracy", "latency_ms": 8.2,
                             "output_cosine": None, "sim_accuracy": 0.74, "when": "2026-12-01T10:00:00"}


def test_records_live_in_the_study_attributes():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    assert real_record(study, 3) is None and real_records(study) == {}
    save_real(study, 3, RealRecord.from_json(OLD["real:3"]))
    study.set_user_attr("real:1", OLD["real:1"])          # as an earlier version stored it
    recs = real_records(study)
    assert list(recs) == [1, 3] and recs[1].status == "failed"
    assert study.user_attrs["real:3"] == _without_nulls(OLD["real:3"])
    assert comparison_for_trial(study, 3) == recs[3].comparison and comparison_for_trial(study, 1) is None
