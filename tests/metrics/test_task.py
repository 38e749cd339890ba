"""Task metrics against numbers worked out by hand on tiny maps."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.metrics.task import (
    DepthError,
    MetricSpec,
    SegAgreement,
    SegIoU,
    Top1,
    UserMetric,
    higher_is_better,
    load_user_metric,
    parse_metric_spec,
)


def logits_for(argmap, classes: int) -> np.ndarray:
    """[1,C,H,W] logits whose argmax over C is ``argmap`` (uneven values, not just one-hot)."""
    a = np.asarray(argmap)
    x = np.random.default_rng(0).uniform(-1.0, 0.0, size=(classes, *a.shape))
    for c in range(classes):
        x[c][a == c] = 1.0 + 0.1 * c
    return x[None].astype(np.float32)


# --------------------------------------------------------------------------- SegAgreement

F_MAP = [[0, 1, 1],
         [0, 0, 1]]
Q_MAP = [[0, 1, 0],
         [1, 0, 1]]


def test_seg_agreement_by_hand():
    m = SegAgreement()
    m.update(logits_for(F_MAP, 2), logits_for(Q_MAP, 2))
    # agree at (0,0) (0,1) (1,1) (1,2): 4 of 6 pixels -> 0.6667
    assert m.agreement == pytest.approx(4 / 6)
    assert m.as_dict() == {"seg_agreement": pytest.approx(0.666667, abs=1e-6)}
    # [C,H,W] without batch dim; identical maps: 6 more agreeing pixels -> 10 of 12
    m.update(logits_for(F_MAP, 2)[0], logits_for(F_MAP, 2)[0])
    assert (m.agree, m.count) == (10, 12)


def test_seg_agreement_streaming_equals_one_shot():
    a_f, a_q = logits_for(F_MAP, 3), logits_for(Q_MAP, 3)
    b_f, b_q = logits_for([[2, 2, 0], [1, 1, 1]], 3), logits_for([[2, 0, 0], [1, 2, 1]], 3)
    s = SegAgreement()
    s.update(a_f, a_q)
    s.update(b_f, b_q)
    one = SegAgreement()
    one.update(np.concatenate([a_f, b_f], -1), np.concatenate([a_q, b_q], -1))
    # sample A 4/6, sample B: (0,0)(0,2)(1,0)(1,2) agree 4/6 -> 8/12
    assert s.agreement == one.agreement == pytest.approx(8 / 12)


def test_seg_agreement_shape_errors():
    with pytest.raises(TunerError, match="at least 2 classes"):
        SegAgreement().update(np.zeros((1, 1, 2, 3)), np.zeros((1, 1, 2, 3)))
    with pytest.raises(TunerError, match="expected 3 dimensions"):
        SegAgreement().update(np.zeros((2, 3, 2, 3)), np.zeros((2, 3, 2, 3)))
    with pytest.raises(TunerError, match="shape mismatch"):
        SegAgreement().update(np.zeros((1, 2, 2, 3)), np.zeros((1, 2, 3, 2)))
    assert math.isnan(SegAgreement().agreement)


# --------------------------------------------------------------------------- SegIoU

PRED = [[0, 0, 1],
        [1, 2, 2]]
LABELS = np.array([[0, 1, 1],
                   [1, 2, 0]])
# class 0: TP (0,0)=1, FP (0,1)=1, FN (1,2)=1 -> 1/3
# class 1: TP (0,2),(1,0)=2, FP 0, FN (0,1)=1 -> 2/3
# class 2: TP (1,1)=1, FP (1,2)=1, FN 0      -> 1/2
# mIoU = (1/3 + 2/3 + 1/2) / 3 = 0.5; pixel accuracy 4 of 6 = 0.6667


def test_seg_iou_by_hand():
    m = SegIoU()
    m.update(logits_for(PRED, 3), LABELS)
    np.testing.assert_allclose(m.iou, [1 / 3, 2 / 3, 1 / 2])
    assert m.miou == pytest.approx(0.5)
    assert m.pixel_accuracy == pytest.approx(4 / 6)
    assert m.confusion.tolist() == [[1, 0, 1], [1, 2, 0], [0, 0, 1]]


def test_seg_iou_skips_classes_absent_from_labels_and_predictions():
    m = SegIoU()
    m.update(logits_for(PRED, 4), LABELS[None])    # class 3 never occurs; labels [1,H,W]
    # union of class 3 is 0: skipped -> still 0.5 (not 1.5/4 = 0.375, not 2.5/4 = 0.625)
    assert m.miou == pytest.approx(0.5)
    assert math.isnan(m.iou[3])


def test_seg_iou_ignore_label():
    lab = LABELS.copy()
    lab[1, 2] = 255
    m = SegIoU()
    m.update(logits_for(PRED, 3), lab)
    # (1,2) dropped: class 0 TP1 FP1 FN0 -> 1/2; class 1 -> 2/3; class 2 TP1 -> 1
    # mIoU = (0.5 + 0.6667 + 1) / 3 = 0.7222; pixel accuracy 4 of 5 = 0.8
    assert m.miou == pytest.approx(0.722222, abs=1e-6)
    assert m.pixel_accuracy == pytest.approx(0.8)
    assert m.count == 5
    lab[1, 2] = 7
    c = SegIoU(ignore_label=7)
    c.update(logits_for(PRED, 3), lab)
    assert c.miou == pytest.approx(0.722222, abs=1e-6)
    with pytest.raises(TunerError, match=r"outside the model's classes 0\.\.2"):
        SegIoU().update(logits_for(PRED, 3), lab)   # 7 is not the default ignore label 255


def test_seg_iou_streaming_equals_one_shot():
    b_pred, b_lab = [[2, 2, 2], [0, 1, 1]], np.array([[2, 2, 0], [0, 0, 1]])
    s = SegIoU()
    s.update(logits_for(PRED, 3), LABELS)
    s.update(logits_for(b_pred, 3), b_lab)
    one = SegIoU()
    one.update(np.concatenate([logits_for(PRED, 3), logits_for(b_pred, 3)], -1),
               np.concatenate([LABELS, b_lab], -1))
    np.testing.assert_array_equal(s.confusion, one.confusion)
    assert s.miou == pytest.approx(one.miou)
    # sample B [label,pred] pixels: (2,2) (2,2) (0,2) (0,0) (0,1) (1,1); with sample A the
    # confusion rows are l0 [2,1,2], l1 [1,3,0], l2 [0,0,3]:
    # class 0 TP2 union 5+3-2=6 -> 1/3; class 1 TP3 union 4+4-3=5 -> 3/5;
    # class 2 TP3 union 3+5-3=5 -> 3/5; mIoU = (1/3 + 0.6 + 0.6) / 3 = 0.511111; accuracy 8/12
    assert s.confusion.tolist() == [[2, 1, 2], [1, 3, 0], [0, 0, 3]]
    assert s.miou == pytest.approx(0.511111, abs=1e-6)
    assert s.pixel_accuracy == pytest.approx(8 / 12)


def test_seg_iou_errors():
    with pytest.raises(TunerError, match="resize the labels"):
        SegIoU().update(logits_for(PRED, 3), np.zeros((3, 2), dtype=int))
    with pytest.raises(TunerError, match="integer class ids"):
        SegIoU().update(logits_for(PRED, 3), LABELS + 0.5)
    m = SegIoU()
    m.update(logits_for(PRED, 3), LABELS)
    with pytest.raises(TunerError, match="earlier samples had 3"):
        m.update(logits_for(PRED, 4), LABELS)
    assert math.isnan(SegIoU().miou) and math.isnan(SegIoU().pixel_accuracy)


# --------------------------------------------------------------------------- DepthError

REF = np.array([[1.0, 2.0, 4.0],
                [0.0, np.nan, 2.0]])
PRED_D = np.array([[[[1.1, 3.0, 4.0],
                     [5.0, 5.0, 1.0]]]])
# valid: ref > 1e-3 and finite -> (0,0) (0,1) (0,2) (1,2); errors 0.1, 1, 0, -1
# AbsRel = (0.1/1 + 1/2 + 0/4 + 1/2) / 4 = 1.1/4 = 0.275
# RMSE = sqrt((0.01 + 1 + 0 + 1) / 4) = sqrt(0.5025) = 0.708872
# ratios 1.1 ok, 1.5 no, 1.0 ok, 0.5 no -> delta1 = 0.5


def test_depth_by_hand_invalid_pixels_excluded():
    m = DepthError()
    m.update(PRED_D, REF)
    assert m.count == 4
    assert m.abs_rel == pytest.approx(0.275)
    assert m.rmse == pytest.approx(0.708872, abs=1e-6)
    assert m.delta1 == pytest.approx(0.5)
    assert m.as_dict() == {"absrel": pytest.approx(0.275), "rmse": pytest.approx(0.708872, abs=1e-6),
                           "delta1": pytest.approx(0.5)}


def test_depth_max_depth_and_min_depth():
    m = DepthError(max_depth=3.0)
    m.update(PRED_D, REF)
    # ref 4 dropped -> (0,0) (0,1) (1,2): AbsRel 1.1/3 = 0.366667, RMSE sqrt(2.01/3) = 0.818535,
    # delta1 1/3
    assert m.count == 3
    assert m.abs_rel == pytest.approx(0.366667, abs=1e-6)
    assert m.rmse == pytest.approx(0.818535, abs=1e-6)
    assert m.delta1 == pytest.approx(1 / 3)
    hi = DepthError(min_depth=1.5)                 # ref 1.0 dropped -> (0,1) (0,2) (1,2)
    hi.update(PRED_D, REF)
    assert hi.abs_rel == pytest.approx(1.0 / 3)     # (0.5 + 0 + 0.5) / 3


def test_depth_nonpositive_prediction_fails_delta1():
    m = DepthError()
    m.update(np.array([[-1.0, 0.0]]), np.array([[1.0, 1.0]]))
    # max(p/r, r/p) = max(-1, -1) = -1 would pass a naive "< 1.25"; a depth <= 0 must fail
    assert m.delta1 == 0.0
    assert m.abs_rel == pytest.approx(1.5)       # (2/1 + 1/1) / 2


def test_depth_streaming_equals_one_shot():
    b_pred, b_ref = np.array([[[[2.0, 2.0, 9.0], [1.0, 1.0, 1.0]]]]), \
        np.array([[[[2.5, 1.0, np.inf], [1.0, 1e-4, 0.9]]]])
    s = DepthError()
    s.update(PRED_D, REF)
    s.update(b_pred, b_ref)                        # reference as a [1,1,H,W] float output
    one = DepthError()
    one.update(np.concatenate([PRED_D, b_pred], -1), np.concatenate([REF[None, None], b_ref], -1))
    assert s.count == one.count == 8               # 4 + (2.5, 1.0, 1.0, 0.9)
    assert (s.abs_rel, s.rmse, s.delta1) == pytest.approx((one.abs_rel, one.rmse, one.delta1))


def test_depth_errors():
    with pytest.raises(TunerError, match="does not match"):
        DepthError().update(np.zeros((1, 1, 2, 3)), np.zeros((3, 2)))
    with pytest.raises(TunerError, match="expected 2 dimensions"):
        DepthError().update(np.zeros((1, 2, 2, 3)), np.zeros((2, 3)))
    m = DepthError()
    m.update(np.ones((2, 2)), np.zeros((2, 2)))     # no valid pixel: nothing counted
    assert m.count == 0 and math.isnan(m.abs_rel) and math.isnan(m.rmse)


# --------------------------------------------------------------------------- Top1

def test_top1_agreement_and_accuracy():
    t = Top1()
    assert t.as_dict() == {}
    t.update(np.array([[0.1, 2.0, 0.3]]), np.array([[0.1, 0.2, 3.0]]))  # 1 vs 2: disagree
    t.update(np.array([[5.0, 1.0, 0.0]]), np.array([[4.0, 1.0, 0.0]]))  # 0 vs 0
    t.update(np.array([0.0, 0.0, 1.0]), np.array([0.0, 0.5, 0.9]))      # 2 vs 2, no batch dim
    assert t.agreement == pytest.approx(2 / 3)                          # 2 of 3 agree
    assert t.as_dict() == {"top1_agreement": pytest.approx(0.666667, abs=1e-6)}
    t.update_labels(np.array([[0.1, 2.0, 0.3]]), 1)                     # right
    t.update_labels(np.array([[5.0, 1.0, 0.0]]), np.array([2]))         # predicts 0: wrong
    assert t.accuracy == pytest.approx(0.5)
    assert (t.agree, t.count, t.correct, t.labelled) == (2, 3, 1, 2)
    assert set(t.as_dict()) == {"top1_agreement", "top1_accuracy"}


def test_top1_errors():
    with pytest.raises(TunerError, match=r"outside the model's classes 0\.\.2"):
        Top1().update_labels(np.zeros((1, 3)), 3)
    with pytest.raises(TunerError, match="one integer class id"):
        Top1().update_labels(np.zeros((1, 3)), [0, 1])
    with pytest.raises(TunerError, match="expected 1 dimensions"):
        Top1().update(np.zeros((2, 3)), np.zeros((2, 3)))


# --------------------------------------------------------------------------- user metrics

USER_SRC = """
import numpy as np

def mse(outputs_float, outputs_quant, labels):
    return float(np.mean((outputs_float["y"] - outputs_quant["y"]) ** 2))

def bad_nan(outputs_float, outputs_quant, labels):
    return float("nan")

def bad_str(outputs_float, outputs_quant, labels):
    return "0.9"

def uses_labels(outputs_float, outputs_quant, labels):
    return np.float32(labels["k"])

THRESHOLD = 0.5
"""


def feed(metric: UserMetric) -> None:
    # diffs (1, 1) -> mse 1.0; diffs (1, -3) -> (1 + 9) / 2 = 5.0; mean (1 + 5) / 2 = 3.0
    metric.update({"y": np.array([1.0, 2.0])}, {"y": np.array([0.0, 1.0])})
    metric.update({"y": np.array([1.0, 0.0])}, {"y": np.array([0.0, 3.0])}, None)


def test_user_metric_from_file(tmp_path):
    (tmp_path / "m.py").write_text(USER_SRC)
    u = UserMetric.from_spec(f"{tmp_path / 'm.py'}:mse")
    feed(u)
    assert u.value == pytest.approx(3.0)
    assert u.as_dict() == {"user": pytest.approx(3.0)}
    rel = UserMetric.from_spec("m.py:uses_labels", base_dir=tmp_path)   # relative to base_dir
    rel.update({}, {}, {"k": 2})
    rel.update({}, {}, {"k": 4})
    assert rel.value == pytest.approx(3.0)


def test_user_metric_from_module(tmp_path, monkeypatch):
    (tmp_path / "tuner_test_usermetric_mod.py").write_text(USER_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_user_metric("tuner_test_usermetric_mod:mse")
    u = UserMetric(fn)
    feed(u)
    assert u.value == pytest.approx(3.0)


def test_user_metric_load_errors(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text(USER_SRC)
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "tuner_test_needs_dep.py").write_text("import tuner_test_no_such_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "tuner_test_no_such_module:fn": "module 'tuner_test_no_such_module' not found",
        "tuner_test_needs_dep:fn": "tuner_test_no_such_dep",
        f"{tmp_path / 'missing.py'}:fn": "missing.py' not found",
        f"{tmp_path / 'broken.py'}:f": "SyntaxError",
        f"{tmp_path / 'm.py'}:nope": "has no function 'nope'; it defines bad_nan, bad_str, mse",
        f"{tmp_path / 'm.py'}:THRESHOLD": "'THRESHOLD'.* is a float, not a function",
        "no_colon_here": "expected 'package.module:function'",
        "mod:": "expected",
    }
    for spec, fragment in cases.items():
        with pytest.raises(TunerError, match=fragment) as err:
            load_user_metric(spec)
        assert repr(spec) in str(err.value), spec             # every message names the spec


def test_user_metric_bad_return_values(tmp_path):
    (tmp_path / "m.py").write_text(USER_SRC)
    spec = f"{tmp_path / 'm.py'}:bad_nan"
    u = UserMetric.from_spec(spec)
    with pytest.raises(TunerError, match=r"bad_nan'.* returned nan .*finite number"):
        u.update({}, {}, None)
    fn = load_user_metric(f"{tmp_path / 'm.py'}:bad_str")
    with pytest.raises(TunerError, match=r"'bad_str' returned str"):
        UserMetric(fn).update({}, {}, None)                   # unnamed: the function's name
    assert u.count == 0


# --------------------------------------------------------------------------- spec parsing

def test_parse_metric_spec_forms():
    assert parse_metric_spec("seg_agreement:seg") == MetricSpec("seg_agreement", "seg")
    assert parse_metric_spec(" miou:seg ") == MetricSpec("miou", "seg")
    assert parse_metric_spec("absrel:depth") == MetricSpec("absrel", "depth")
    assert parse_metric_spec("rmse:depth").kind == "rmse"
    assert parse_metric_spec("delta1:depth").output == "depth"
    assert parse_metric_spec("top1:Identity:0") == MetricSpec("top1", "Identity:0")
    assert parse_metric_spec("user:mymodule:fn") == MetricSpec("user", None, "mymodule:fn")
    assert parse_metric_spec("user:dir/my.py:fn").user == "dir/my.py:fn"
    spec = parse_metric_spec("miou:seg")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.kind = "rmse"


@pytest.mark.parametrize("text, fragment", [
    ("cosine:seg", "unknown metric 'cosine'"),
    ("miou", "bad form"),
    ("miou:", "bad form"),
    ("user:fn", "needs a module or file and a function"),
    ("user:mod:", "needs a module or file and a function"),
])
def test_parse_metric_spec_errors(text, fragment):
    with pytest.raises(TunerError, match=fragment) as err:
        parse_metric_spec(text)
    if "user" not in text:
        assert "seg_agreement:<output>" in str(err.value) and "user:<module>:<function>" in str(err.value)


def test_higher_is_better():
    assert [higher_is_better(k) for k in ("seg_agreement", "miou", "delta1", "top1", "user")] \
        == [True] * 5
    assert higher_is_better("absrel") is False and higher_is_better("rmse") is False
    assert parse_metric_spec("rmse:d").higher_is_better is False
    with pytest.raises(TunerError, match="unknown metric kind 'psnr'"):
        higher_is_better("psnr")


def test_user_file_with_dataclass_loads(tmp_path):
    # string annotations make @dataclass look the module up in sys.modules while it executes
    (tmp_path / "dc.py").write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
        "@dataclass\nclass Cfg:\n    scale: float = 2.0\n\n"
        "def score(f, q, labels):\n    return Cfg().scale\n")
    u = UserMetric.from_spec(f"{tmp_path / 'dc.py'}:score")
    u.update({}, {}, None)
    assert u.value == 2.0
