"""Method strings from the log's ``Select ... method.`` vs tuner's Calibration.describe(), in either spelling."""

import pytest

from tuner.candidate import Calibration
from tuner.toolchain.compare import normalize_method, same_method
from tuner.toolchain.hblog import parse_log

# Select lines of real X5 logs (shared/fixtures/hb_logs: 01_zoo_hb_mapper_1.24.3_yolo11n,
# 19_zoo_readme_yolo11_int16_excerpt, 12_user_wuchao_yolov8_ultra_1.18.2)
REAL = [
    ("2025-07-23 11:36:19,623 file: modelwise_search.py func: modelwise_search line No: 75 "
     "Select max-percentile:percentile=0.99995 method.", Calibration(type="max", max_percentile=0.99995)),
    ("2024-10-24 11:44:14,576 file: modelwise_search.py func: modelwise_search line No: 75 "
     "Select max-percentile:percentile=0.99995 method.", Calibration(type="max", max_percentile=0.99995)),
    ("2024-04-11 14:43:16,407 file: default_calibrater.py func: default_calibrater line No: 240 "
     "Select max method.", Calibration(type="max")),
]


@pytest.mark.parametrize("line,calibration", REAL)
def test_real_select_lines_match_tuners_description(line, calibration):
    method = parse_log(line + "\n", "x.log").method
    assert same_method(method, calibration.describe()) is True
    assert same_method(method, Calibration(type="kl").describe()) is False
    assert same_method(method, Calibration(type=calibration.type, max_percentile=calibration.max_percentile,
                                           per_channel=True).describe()) is False


@pytest.mark.parametrize("hb,tuner_form", [
    ("max:per_channel", "max,per_channel"),
    ("max:asymmetric", "max,asymmetric"),
    ("max:per_channel,asymmetric", "max,asymmetric,per_channel"),
    ("max-percentile:percentile=0.99995,per_channel", "max-percentile:percentile=0.99995,per_channel"),
    ("kl:num_bin=1024,max_num_bin=16384", "kl:num_bin=1024,max_num_bin=16384"),
    ("kl:num_bin=1024,max_num_bin=16384,per_channel", "kl:max_num_bin=16384,num_bin=1024,per_channel"),
    ("max-percentile:percentile=0.999950", "max_percentile:percentile=0.99995"),
    ("Select max method.", "max"),
])
def test_hb_and_tuner_spellings_agree(hb, tuner_form):
    assert normalize_method(hb) == normalize_method(tuner_form)


def test_different_methods_stay_different_and_missing_is_unknown():
    assert normalize_method("max:per_channel") == "max:per_channel"
    assert normalize_method("max-percentile:percentile=0.99995,per_channel") == \
        "max-percentile:percentile=0.99995,per_channel"
    assert not same_method("max-percentile:percentile=0.99995", "max-percentile:percentile=0.9999")
    assert not same_method("max:per_channel", "max")
    assert not same_method("max:per_channel", "max:asymmetric")
    assert not same_method("kl:num_bin=1024,max_num_bin=16384", "max")
    assert same_method(None, "max") is None and normalize_method("  ") is None
    # tuner's own descriptions, whatever form describe() prints, match hb_mapper's spelling
    assert same_method(Calibration(type="max", per_channel=True).describe(), "max:per_channel")
    assert same_method(Calibration(type="kl", per_channel=True).describe(),
                       "kl:num_bin=1024,max_num_bin=16384,per_channel")
