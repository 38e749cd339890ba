"""Calibration and evaluation tensors, read the way hb_mapper reads ``cal_data_dir``.

hb_mapper expects, per model input, a folder of raw ``numpy.tofile`` dumps in the training
format (``input_type_train``, ``input_layout_train``, ``input_shape``) of ``cal_data_type``,
*before* the mean/scale that ``norm_type`` fuses into the model. ``.npy`` files are read too.
Samples are streamed one at a time; the set is never held in memory.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.inputs.config import InputSpec
from tuner.inputs.images import PreprocessFn, yaml_preprocess
from tuner.inputs.inputpath import PATH_FORMAT, InputPath, input_path

IMAGE_MAGIC = {b"\xff\xd8\xff": "a JPEG image", b"\x89PNG": "a PNG image", b"BM": "a BMP image",
               b"GIF8": "a GIF image", b"II*\x00": "a TIFF image", b"MM\x00*": "a TIFF image"}
DTYPES = {"float32": np.float32, "uint8": np.uint8, "int32": np.int32, "int16": np.int16, "int8": np.int8}


@dataclass(frozen=True)
class InputData:
    """Where one model input's samples come from and how to turn them into model input."""

    name: str
    folder: Path
    dtype: str
    shape: tuple[int, ...]
    mean: np.ndarray | None = None   # HzPreprocess: (x - mean) * scale, per channel
    scale: np.ndarray | None = None
    channel_axis: int | None = 1     # None: rank < 2, one channel
    images: InputSpec | None = None  # preprocess_on: the folder holds images, read as hb_mapper reads them
    path: InputPath | None = None    # an image input_type_rt: the board's input path replaces mean/scale

    @property
    def channels(self) -> int:
        return self.shape[self.channel_axis] if self.channel_axis is not None else 1

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """What the model sees: HzPreprocess ``(x - mean) * scale`` (the dtype follows ``x``); for an
        image ``input_type_rt``, the whole input path as the board computes it (float32)."""
        if self.path is not None:
            return self.path(x)
        return self.float_normalize(x)

    def float_normalize(self, x: np.ndarray) -> np.ndarray:
        """``(x - mean) * scale`` in float, as the model was trained (no input path): the reference."""
        if self.mean is not None:
            x = x - self.mean
        if self.scale is not None:
            x = x * self.scale
        return x


def list_samples(folder: Path) -> list[Path]:
    """The files of a sample folder in the order hb_mapper pairs them: sorted, hidden ones skipped."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _image_kind(head: bytes) -> str | None:
    for magic, kind in IMAGE_MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


#: what hb_mapper reads from cal_data_dir with preprocess_on (docs/hb_rules/config.md §4: jpg/png;
#: its image reader also takes bmp)
PREPROCESS_ON_IMAGES = ("a JPEG image", "a PNG image", "a BMP image")


def image_reader(spec: InputData) -> PreprocessFn:
    """``path -> tensor`` for an input whose folder holds images (``preprocess_on: True``): decoded,
    resized (bilinear) to ``input_shape``, ``input_type_train`` channel order and layout, 0..255,
    as hb_mapper's own reading and ``tuner make-cal-data`` do. Needs Pillow."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise TunerError(f"calibration_parameters.preprocess_on is True: reading the images in {spec.folder} needs "
                         "Pillow: pip install 'tuner[images]'") from None

    if spec.images is None:
        raise ValueError(f"input {spec.name}: not an image input (preprocess_on is off)")
    return yaml_preprocess(spec.images, spec.shape)


def check_image_file(spec: InputData, path: Path, head: bytes) -> None:
    """With preprocess_on, every sample file must be an image hb_mapper reads."""
    kind = _image_kind(head)
    if kind not in PREPROCESS_ON_IMAGES:
        raise TunerError(f"{path}: is {kind or 'not an image'}; calibration_parameters.preprocess_on is True, so "
                         "hb_mapper reads cal_data_dir as JPEG/PNG/BMP images: put images there, or set "
                         "preprocess_on False for raw tensors")


class DataSet:
    """The samples of all model inputs, paired by sorted file name order."""

    def __init__(self, inputs: list[InputData], limit: int | None = None, evaluation: bool = False):
        """``evaluation``: the folders are evaluation data (``--data``, a space's eval_data or
        validation_data), not the YAML's cal_data_dir; messages name them so."""
        self.inputs = inputs
        self.calibration = False     # an input path with float weights, as hb_mapper calibrates (for_calibration)
        self.hb_reference = False    # float_samples: hb's float model (the input path, float weights), not the ideal
        self._fingerprint: str | None = None
        self.files: list[list[Path]] = []
        kind, where = (("evaluation data folder", "check the folder given with --data, or a space's eval_data / "
                        "validation_data (relative to the space)") if evaluation else
                       ("calibration folder", "check calibration_parameters.cal_data_dir (relative to the YAML)"))
        for spec in inputs:
            if not spec.folder.is_dir():
                raise TunerError(f"{spec.folder}: {kind} not found for input {spec.name!r}; {where}")
            files = list_samples(spec.folder)
            if not files:
                raise TunerError(f"{spec.folder}: empty {kind} for input {spec.name!r}; write samples "
                                 "with numpy's tofile() there")
            self.files.append(files)
        counts = {len(f) for f in self.files}
        if len(counts) > 1:
            detail = ", ".join(f"{s.name!r}: {len(f)}" for s, f in zip(inputs, self.files))
            raise TunerError(f"the input folders hold different numbers of samples ({detail}); hb_mapper pairs "
                             "them by order, so every input needs one file per sample")
        self.count = counts.pop()
        if limit is not None:
            self.count = min(self.count, limit)
        self._readers = {spec.name: image_reader(spec) for spec in inputs if spec.images is not None}
        for spec, files in zip(inputs, self.files):
            for path in files[: self.count]:
                self._check_file(spec, path)

    def __len__(self) -> int:
        return self.count

    @staticmethod
    def _check_file(spec: InputData, path: Path) -> None:
        """Cheap checks from size and magic bytes, so bad files fail before any long work."""
        with open(path, "rb") as f:
            head = f.read(8)
        if spec.images is not None:
            check_image_file(spec, path, head)
            return
        kind = _image_kind(head)
        if kind:
            raise TunerError(f"{path}: is {kind}, not a raw tensor; hb_mapper reads numpy.tofile() dumps of "
                             "preprocessed samples: convert the images (see 'tuner make-cal-data') or remove the file")
        if path.suffix == ".npy":
            return
        itemsize = np.dtype(DTYPES[spec.dtype]).itemsize
        expected = int(np.prod(spec.shape)) * itemsize
        size = path.stat().st_size
        if size != expected:
            alt = [t for t, d in DTYPES.items() if int(np.prod(spec.shape)) * np.dtype(d).itemsize == size]
            hint = f"; its size fits cal_data_type {alt[0]!r}" if alt else ""
            if not alt and spec.dtype == "float32" and size == 2 * expected:
                hint = ("; exactly twice the float32 size: the files look like float64 (numpy's default), which "
                        "hb_mapper cannot read (no cal_data_type float64): write them with "
                        "arr.astype(np.float32).tofile(path)")
            raise TunerError(f"{path}: {size} bytes, but input {spec.name!r} of shape {'x'.join(map(str, spec.shape))} "
                             f"in {spec.dtype} needs {expected} bytes{hint}")

    def _read(self, spec: InputData, path: Path) -> np.ndarray:
        if spec.path is not None and self.calibration:
            return spec.path(self._raw(spec, path), float_weights=True)
        return spec.normalize(self._raw(spec, path)).astype(np.float32, copy=False)

    def for_calibration(self) -> DataSet:
        """These samples as hb_mapper's calibration pass sees them: an input path computed with the
        preprocess node's float weights, not the int8 ones the board runs (the same DataSet without
        an input path). On PP-OCRv4's detector with nv12 that moves the input's max threshold by 0.24 %
        (1.6833 against 1.6873), which moves every int8 input value's rounding and its sigmoid map on the
        text photo (two real models with those two thresholds: output cosine 0.02 between them)."""
        if not self.has_input_path:
            return self
        out = copy.copy(self)
        out.calibration = True
        out._fingerprint = None
        return out

    def _raw(self, spec: InputData, path: Path) -> np.ndarray:
        """One file as float32, before any normalization."""
        if spec.images is not None:
            arr = self._readers[spec.name](path)
        elif path.suffix == ".npy":
            try:
                arr = np.load(path, allow_pickle=False)
            except Exception as exc:
                raise TunerError(f"{path}: not a readable .npy file ({exc})") from None
            if arr.shape != spec.shape:
                if arr.size != int(np.prod(spec.shape)) or arr.shape != spec.shape[1:]:
                    raise TunerError(f"{path}: shape {arr.shape}, but input {spec.name!r} needs "
                                     f"{'x'.join(map(str, spec.shape))}")
                arr = arr.reshape(spec.shape)
        else:
            arr = np.fromfile(path, dtype=DTYPES[spec.dtype]).reshape(spec.shape)
        x = arr.astype(np.float32)
        if not np.isfinite(x).all():
            bad = "NaN" if np.isnan(x).any() else "Inf"
            raise TunerError(f"{path}: contains {bad} values; fix the preprocessing that wrote it or remove the file")
        return x

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.count):
            yield {spec.name: self._read(spec, files[i]) for spec, files in zip(self.inputs, self.files)}

    @property
    def has_input_path(self) -> bool:
        return any(spec.path is not None for spec in self.inputs)

    def float_samples(self) -> Iterator[dict[str, np.ndarray]]:
        """The samples as the float model was trained on them: mean/scale in float, no input path
        (the reference the simulated and real outputs are scored against). With ``hb_reference``: as
        hb_mapper's float model takes them (the input path with float weights), the reference of its
        log's per-node cosines."""
        for i in range(self.count):
            yield {spec.name: (spec.path(self._raw(spec, files[i]), float_weights=True)
                               if spec.path is not None and self.hb_reference else
                               spec.float_normalize(self._raw(spec, files[i])).astype(np.float32, copy=False))
                   for spec, files in zip(self.inputs, self.files)}

    def hb_feeds(self) -> Iterator[dict[str, np.ndarray]]:
        """The samples as hb_mapper's calibrated and quantized models take them: an image input's
        runtime values minus 128 in the training layout (what hb's calibration loader gives the
        HzPreprocess node; the quantized model's int8 input, before its rounding and NHWC transpose),
        every other input as the float model takes it."""
        for i in range(self.count):
            out = {}
            for spec, files in zip(self.inputs, self.files):
                x = self._raw(spec, files[i])
                out[spec.name] = spec.path.feed(x) if spec.path is not None else \
                    spec.normalize(x).astype(np.float32, copy=False)
            yield out

    def sample_files(self, i: int) -> list[Path]:
        return [files[i] for files in self.files]

    def fingerprint(self) -> str:
        """sha256 over the used files' bytes and the preprocessing, so any change is noticed.

        Computed once per DataSet: hashing hundreds of MB again for every exported trial would
        put seconds into the search loop."""
        if self._fingerprint is None:
            self._fingerprint = self._hash()
        return self._fingerprint

    def _hash(self) -> str:
        h = hashlib.sha256()
        for spec, files in zip(self.inputs, self.files):
            h.update(f"{spec.name}|{spec.dtype}|{spec.shape}|{spec.mean}|{spec.scale}".encode())
            if spec.path is not None:
                h.update(f"|cal{self.calibration}".encode())
                h.update(f"|path{PATH_FORMAT}:{spec.path.type_train}>{spec.path.type_rt}:{spec.path.video}".encode())
            if spec.images is not None:
                h.update(f"|images:{spec.images.type_train}|{spec.images.layout_train}".encode())
            for path in files[: self.count]:
                h.update(path.name.encode())
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
        return h.hexdigest()


def _per_channel(values: tuple[float, ...] | None, shape: tuple[int, ...], layout: str) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float32)
    if len(shape) != 4:
        return arr.reshape(()) if arr.size == 1 else arr
    axis = channel_axis(shape, layout)
    assert axis is not None   # 4-D
    channels = shape[axis]
    if arr.size not in (1, channels):
        raise TunerError(f"mean_value/scale_value give {arr.size} values for an input with {channels} channels")
    bshape = [1, 1, 1, 1]
    bshape[axis] = arr.size
    return arr.reshape(bshape)


def channel_axis(shape: tuple[int, ...], layout: str) -> int | None:
    """The channel axis of an input: 1 for NCHW, 3 for NHWC (4-D), else 1 (rank >= 2) or None."""
    if len(shape) == 4:
        return 1 if layout == "NCHW" else 3
    return 1 if len(shape) >= 2 else None


def input_data(specs: list[InputSpec], input_shapes: dict[str, tuple[int, ...]],
               folders: list[Path] | None = None, require_folder: bool = True) -> list[InputData]:
    """How each model input's samples are read, from the YAML (no file access).

    ``folders`` replaces ``cal_data_dir`` (``--data``)."""
    names = list(input_shapes)
    if len(specs) != len(names):
        raise TunerError(f"the YAML describes {len(specs)} inputs but the model has {len(names)}: {names}; "
                         "list them in input_parameters.input_name")
    if folders is not None and len(folders) != len(names):
        raise TunerError(f"--data gives {len(folders)} folders for a model with {len(names)} inputs; "
                         "separate one folder per input with ';'")
    inputs = []
    for i, spec in enumerate(specs):
        name = spec.name or names[i]
        if name not in input_shapes:
            raise TunerError(f"input_parameters.input_name {name!r} is not a model input; the model has {names}")
        shape = input_shapes[name]
        folder = folders[i] if folders is not None else spec.cal_dir
        if folder is None and require_folder:
            raise TunerError(f"no calibration folder for input {name!r}; set calibration_parameters.cal_data_dir")
        inputs.append(InputData(name=name, folder=Path(folder) if folder is not None else Path(),
                                dtype=spec.cal_type or "float32", shape=shape,
                                mean=_per_channel(spec.mean, shape, spec.layout_train),
                                scale=_per_channel(spec.scale, shape, spec.layout_train),
                                channel_axis=channel_axis(shape, spec.layout_train),
                                images=spec if spec.preprocess_on else None,
                                path=input_path(spec.type_train, spec.type_rt, spec.space_and_range,
                                                spec.layout_train, shape, spec.mean, spec.scale)))
    return inputs


def dataset_from_config(specs: list[InputSpec], input_shapes: dict[str, tuple[int, ...]],
                        folders: list[Path] | None = None, limit: int | None = None) -> DataSet:
    """Build the DataSet the YAML describes; ``folders`` replaces ``cal_data_dir`` (``--data``)."""
    return DataSet(input_data(specs, input_shapes, folders), limit=limit, evaluation=folders is not None)
