"""Images read the way an hb_mapper YAML describes its input (its own ``preprocess_on`` reading).

Used by the calibration data reader (``preprocess_on: True``), make-cal-data and check-preprocess.
It sits below them all, so that none of them imports another to read an image.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.inputs.config import InputSpec

PreprocessFn = Callable[[Path], np.ndarray]


def dims(shape: tuple[int, ...]) -> str:
    """A shape as the YAML writes it (``1x3x224x224``; ``()`` for a scalar)."""
    return "x".join(map(str, shape)) if shape else "()"


def yaml_preprocess(spec: InputSpec, shape: tuple[int, ...]) -> PreprocessFn:
    """Images read the way the YAML describes the input: decoded, resized (bilinear) to
    ``input_shape``, converted to ``input_type_train`` (rgb / bgr / gray / yuv444) in
    ``input_layout_train``, pixel values 0..255 (mean/scale stay in the model, as hb_mapper's
    HzPreprocess applies them). This is what hb_mapper's own ``preprocess_on`` reading does;
    a training pipeline that crops or resizes differently needs ``--preprocess``."""
    if spec.type_train == "featuremap":
        raise TunerError("input_type_train is featuremap: images cannot be turned into a feature map from the YAML's "
                         "parameters; give your preprocessing with --preprocess module:function")
    try:
        from PIL import Image
    except ImportError:
        raise TunerError("reading images needs Pillow: pip install 'tuner[images]' (or pillow), or give "
                         "--preprocess module:function") from None
    if len(shape) != 4:
        raise TunerError(f"input_shape {dims(shape)}: reading images needs a 4-D NCHW or NHWC input")
    nhwc = spec.layout_train == "NHWC"
    height, width, channels = (shape[1], shape[2], shape[3]) if nhwc else (shape[2], shape[3], shape[1])
    gray = spec.type_train == "gray"
    if channels != (1 if gray else 3):
        raise TunerError(f"input_type_train {spec.type_train} needs {1 if gray else 3} channel(s) but input_shape "
                         f"{dims(shape)} has {channels}")

    def read(path: Path) -> np.ndarray:
        try:
            with Image.open(path) as img:
                mode = {"gray": "L", "yuv444": "YCbCr"}.get(spec.type_train, "RGB")
                a = np.asarray(img.convert(mode).resize((width, height), Image.Resampling.BILINEAR), dtype=np.float32)
        except (OSError, ValueError) as exc:
            raise TunerError(f"{path}: not a readable image ({exc})") from None
        if gray:
            a = a[..., None]
        if spec.type_train == "bgr":
            a = a[..., ::-1]
        a = a if nhwc else a.transpose(2, 0, 1)
        return np.ascontiguousarray(a[None])

    return read
