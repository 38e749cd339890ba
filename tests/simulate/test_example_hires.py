"""The bundled example at the users' resolution (examples/segdepth/make_hires.py): same weights, 360x640."""

import hashlib
import importlib.util

import numpy as np
import onnx
import pytest
from helpers import EXAMPLE


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"segdepth_{name}_test", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hires():
    return _load("make_hires")


@pytest.fixture(scope="module")
def base():
    return onnx.load(str(EXAMPLE / "segdepth.onnx"))


def test_the_96x160_scenes_are_the_original_bytes():
    # make_sample(size=) must not change the bundled example's data (pinned before the option existed).
    h = hashlib.sha256()
    for a in _load("scenes").make_sample(3, "eval"):
        h.update(a.tobytes())
    assert h.hexdigest() == "12376ef3c053b5ee29c9754df86de7351c94dccbf17520901d9c65fec374d0ff"


def test_360x640_has_static_shapes_the_same_weights_and_agrees_with_the_reference(hires, base):
    model = hires.derive(base, 360, 640)
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)}
    assert dims["input"] == [1, 5, 360, 640]
    assert dims["seg"] == [1, 4, 360, 640] and dims["depth"] == [1, 1, 360, 640]
    assert dims["/enc4/enc4.1/relu/Relu_output_0"][2:] == [23, 40]  # 360 / 16 rounds up
    assert dims["/up/Resize_output_0"][2:] == [45, 80]  # resized to its skip's size, not x2
    assert all(all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim) for vi in model.graph.value_info)
    weights = {t.name: t.raw_data for t in base.graph.initializer if t.name.startswith(("onnx::Conv", "seg_head",
                                                                                         "depth_head", "radar_gate"))}
    derived = {t.name: t.raw_data for t in model.graph.initializer}
    assert weights and all(derived[k] == v for k, v in weights.items())
    d = hires.check(model, base, (360, 640))
    assert d["seg_vs_reference"] < hires.TOLERANCE["seg"], d
    assert d["depth_vs_reference"] < hires.TOLERANCE["depth"], d
    assert d["seg_argmax_agreement"] > 0.9999, d
    assert d["base_seg_vs_reference"] < hires.TOLERANCE["seg"], d  # the reference reproduces the bundled model
    assert d["base_seg_vs_derived"] == 0.0 and d["base_depth_vs_derived"] == 0.0, d


def test_the_derivation_at_96x160_is_the_bundled_graph(hires, base):
    model = hires.derive(base, 96, 160)
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in base.graph.node]
    assert [list(n.input) for n in model.graph.node] == [list(n.input) for n in base.graph.node]


def test_sizes_it_cannot_derive_are_refused(hires):
    for bad in ("359x640", "8x8", "360"):
        with pytest.raises(ValueError):
            hires.parse_size(bad)
    assert hires.parse_size("360x640") == (360, 640)
    assert np.array_equal(hires.parse_size("96X160"), (96, 160))
