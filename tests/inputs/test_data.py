import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.inputs.config import InputSpec
from tuner.inputs.data import DataSet, InputData, dataset_from_config

SHAPE = (1, 3, 4, 5)


def spec(folder, dtype="float32", mean=None, scale=None):
    return InputData(name="x", folder=folder, dtype=dtype, shape=SHAPE, mean=mean, scale=scale)


def test_reads_bin_and_npy_in_name_order(tmp_path):
    a = np.arange(60, dtype=np.float32).reshape(SHAPE)
    a.tofile(tmp_path / "0001.bin")
    np.save(tmp_path / "0002.npy", a[0] * 2)          # .npy without the batch dim is accepted
    ds = DataSet([spec(tmp_path)])
    got = [s["x"] for s in ds]
    assert len(ds) == 2
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], a * 2)


def test_wrong_size_names_the_file_and_the_fitting_dtype(tmp_path):
    np.zeros(SHAPE, np.uint8).tofile(tmp_path / "bad.bin")
    with pytest.raises(TunerError, match=r"bad.bin: 60 bytes.*needs 240 bytes; its size fits cal_data_type 'uint8'"):
        DataSet([spec(tmp_path)])


def test_float64_files_are_named_as_such(tmp_path):
    np.zeros(SHAPE, np.float64).tofile(tmp_path / "f64.bin")
    with pytest.raises(TunerError, match=r"f64.bin: 480 bytes.*needs 240 bytes; exactly twice the float32 size: the "
                                         r"files look like float64.*arr.astype\(np.float32\).tofile"):
        DataSet([spec(tmp_path)])


def test_image_in_folder_is_named(tmp_path):
    np.zeros(SHAPE, np.float32).tofile(tmp_path / "0.bin")
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 300)
    with pytest.raises(TunerError, match="photo.jpg: is a JPEG image, not a raw tensor"):
        DataSet([spec(tmp_path)])


def test_nan_is_named(tmp_path):
    a = np.zeros(SHAPE, np.float32)
    a[0, 1, 2, 3] = np.nan
    a.tofile(tmp_path / "nan.bin")
    with pytest.raises(TunerError, match="nan.bin: contains NaN"):
        list(DataSet([spec(tmp_path)]))


def test_empty_and_missing_folders(tmp_path):
    with pytest.raises(TunerError, match="empty calibration folder"):
        DataSet([spec(tmp_path)])
    with pytest.raises(TunerError, match="calibration folder not found"):
        DataSet([spec(tmp_path / "nope")])


def test_multi_input_counts_must_match(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for i in range(3):
        np.zeros(SHAPE, np.float32).tofile(tmp_path / "a" / f"{i}.bin")
    for i in range(2):
        np.zeros(SHAPE, np.float32).tofile(tmp_path / "b" / f"{i}.bin")
    inputs = [spec(tmp_path / "a"), InputData("y", tmp_path / "b", "float32", SHAPE)]
    with pytest.raises(TunerError, match="different numbers of samples"):
        DataSet(inputs)


def test_hzpreprocess_mean_and_scale_per_channel(tmp_path):
    """norm_type data_mean_and_scale: the model sees (x - mean) * scale, per channel, as HzPreprocess computes."""
    raw = np.random.default_rng(0).integers(0, 256, SHAPE).astype(np.uint8)
    raw.tofile(tmp_path / "0.bin")
    s = InputSpec(name="x", type_train="rgb", layout_train="NCHW", shape=SHAPE, norm_type="data_mean_and_scale",
                  mean=(123.675, 116.28, 103.53), scale=(0.01712475, 0.017507, 0.01742919), cal_dir=tmp_path,
                  cal_type="uint8")
    ds = dataset_from_config([s], {"x": SHAPE})
    got = next(iter(ds))["x"]
    mean = np.array([123.675, 116.28, 103.53], np.float32).reshape(1, 3, 1, 1)
    scale = np.array([0.01712475, 0.017507, 0.01742919], np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(got, (raw.astype(np.float32) - mean) * scale, rtol=1e-6)


def test_fingerprint_changes_with_content(tmp_path):
    np.zeros(SHAPE, np.float32).tofile(tmp_path / "0.bin")
    fp1 = DataSet([spec(tmp_path)]).fingerprint()
    np.ones(SHAPE, np.float32).tofile(tmp_path / "0.bin")
    assert DataSet([spec(tmp_path)]).fingerprint() != fp1
