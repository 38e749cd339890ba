"""The user's hb_mapper makertbin YAML, read and checked the way hb_mapper's parser does.

hb_mapper loads the file with ``yaml.safe_load`` and validates it against a strict schema
(unknown keys fail, booleans must be real booleans, ``'ON'`` must be quoted). We apply the
same rules here so that a problem shows up in seconds, with the key's path, instead of at
the end of an hour-long conversion.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import TunerError

STR, BOOL, INT, FLOAT, DICT = "str", "bool", "int", "float", "dict"
# Fields that hb_mapper documents as strings but that users often write as plain numbers
# (``mean_value: 128``, ``scale_value: 0.0039``); the parser converts them with str().
NUMSTR = "numstr"
NODEINFO = "node_info"

#: Every key hb_mapper's schema accepts, per section, with its type (docs/hb_rules/config.md §4).
SCHEMA: dict[str, dict[str, str]] = {
    "model_parameters": {
        "onnx_model": STR, "caffe_model": STR, "prototxt": STR, "march": STR,
        "output_model_file_prefix": STR, "working_dir": STR, "layer_out_dump": BOOL,
        "output_nodes": STR, "remove_node_type": STR, "remove_node_name": STR,
        "debug_mode": STR, "node_info": NODEINFO, "set_node_data_type": NODEINFO,
        "log_level": STR,
    },
    "input_parameters": {
        "input_name": STR, "input_type_train": STR, "input_layout_train": STR,
        "input_type_rt": STR, "input_layout_rt": STR, "input_space_and_range": STR,
        "input_shape": STR, "input_batch": NUMSTR, "norm_type": STR,
        "mean_value": NUMSTR, "scale_value": NUMSTR,
    },
    "calibration_parameters": {
        "cal_data_dir": STR, "cal_data_type": STR, "calibration_type": STR,
        "max_percentile": FLOAT, "per_channel": BOOL, "run_on_cpu": STR, "run_on_bpu": STR,
        "optimization": STR, "preprocess_on": BOOL, "enable_int16": BOOL,
    },
    "compiler_parameters": {
        "compile_mode": STR, "balance_factor": INT, "optimize_level": STR, "debug": BOOL,
        "core_num": INT, "max_time_per_fc": INT, "jobs": INT, "input_source": DICT,
        "advice": INT, "ability_entry": STR,
    },
    "custom_op": {"custom_op_method": STR, "op_register_files": STR, "custom_op_dir": STR},
}

CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("model_parameters", "march"): ("bernoulli2", "bayes", "bayes-e"),
    ("input_parameters", "input_type_train"): ("rgb", "bgr", "yuv444", "gray", "featuremap"),
    ("input_parameters", "input_type_rt"): ("nv12", "yuv444", "rgb", "bgr", "gray", "featuremap"),
    ("input_parameters", "input_layout_train"): ("NCHW", "NHWC"),
    ("input_parameters", "input_layout_rt"): ("NCHW", "NHWC"),
    ("input_parameters", "norm_type"): ("no_preprocess", "data_mean", "data_scale", "data_mean_and_scale"),
    ("calibration_parameters", "calibration_type"): ("default", "mix", "kl", "max", "load", "skip"),
    ("compiler_parameters", "compile_mode"): ("latency", "bandwidth", "balance"),
    ("compiler_parameters", "optimize_level"): ("O0", "O1", "O2", "O3"),
}

CAL_DATA_TYPES = ("float32", "uint8", "int32", "int16", "int8")
NODE_KEY = re.compile(r"^(ON|InputType\d*|OutputType)$")
DTYPES = ("int8", "int16")


@dataclass(frozen=True)
class InputSpec:
    """One model input as the YAML describes it (lists in the YAML are ';'-separated)."""

    name: str
    type_train: str
    layout_train: str
    shape: tuple[int, ...] | None
    norm_type: str
    mean: tuple[float, ...] | None
    scale: tuple[float, ...] | None
    cal_dir: Path | None
    cal_type: str | None
    preprocess_on: bool = False      # hb_mapper reads this input's cal_data_dir as images and resizes them itself
    type_rt: str | None = None       # input_type_rt: the board's input format (tuner.inputs.inputpath)
    space_and_range: str = "regular"  # input_space_and_range: bt601_video (nv12 only) or regular


@dataclass
class HbConfig:
    """A validated hb_mapper YAML. ``raw`` keeps the user's mapping untouched for export."""

    path: Path
    raw: dict[str, Any]
    onnx_model: Path
    march: str
    inputs: list[InputSpec]
    node_info: dict[str, dict[str, str]]
    calibration_type: str
    max_percentile: float | None
    per_channel: bool
    optimization: tuple[str, ...]
    legacy_placement: dict[str, dict[str, str]] = field(default_factory=dict)  # run_on_cpu / run_on_bpu only
    warnings: list[str] = field(default_factory=list)
    text: str | None = None     # the file as written (exports keep its comments and spelling)

    def section(self, name: str) -> dict[str, Any]:
        return self.raw.get(name) or {}


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            dict: "a mapping", list: "a list", type(None): "empty"}.get(type(value), type(value).__name__)


def _check_type(where: str, value: Any, kind: str) -> None:
    if kind == BOOL and not isinstance(value, bool):
        hint = " without quotes" if isinstance(value, str) else ""
        raise TunerError(f"{where}: expected a boolean, got {value!r} ({_type_name(value)}); write True or False{hint}")
    if kind == INT and (isinstance(value, bool) or not isinstance(value, int)):
        raise TunerError(f"{where}: expected an integer, got {value!r} ({_type_name(value)})")
    if kind == FLOAT and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TunerError(f"{where}: expected a number, got {value!r} ({_type_name(value)})")
    if kind == STR and not isinstance(value, str):
        hint = "; join several values with ';' in one string" if isinstance(value, list) else ""
        raise TunerError(f"{where}: expected a string, got {value!r} ({_type_name(value)}){hint}")
    if kind == NUMSTR and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise TunerError(f"{where}: expected a string or number, got {value!r} ({_type_name(value)})")
    if kind == DICT and not isinstance(value, dict):
        raise TunerError(f"{where}: expected a mapping such as {{'input': 'ddr'}}, got {value!r} ({_type_name(value)})")


def parse_node_info(where: str, value: Any) -> dict[str, dict[str, str]]:
    """Parse ``node_info`` in dict form or the single-entry string form ``'name:int16'``."""
    if value is None:
        return {}
    if isinstance(value, str):
        out: dict[str, dict[str, str]] = {}
        for item in filter(None, (s.strip() for s in value.split(";"))):
            name, sep, dtype = item.rpartition(":")
            if not sep or dtype not in DTYPES:
                raise TunerError(f"{where}: string form must be 'NODE:int8' or 'NODE:int16', got {item!r}")
            out[name] = {"OutputType": dtype}
        return out
    if not isinstance(value, dict):
        raise TunerError(f"{where}: expected a mapping of node name to settings, got {_type_name(value)}")
    out = {}
    for name, settings in value.items():
        if not isinstance(name, str):
            raise TunerError(f"{where}: node name {name!r} must be a string; quote it")
        if not isinstance(settings, dict):
            raise TunerError(f"{where}.{name}: expected a mapping like {{'ON': 'CPU'}}, got {settings!r}")
        node: dict[str, str] = {}
        for key, val in settings.items():
            if key is True:
                raise TunerError(f"{where}.{name}: the key ON was read as a boolean; quote it as 'ON' "
                                 "(YAML 1.1 turns unquoted ON into True)")
            if not isinstance(key, str) or not NODE_KEY.match(key):
                raise TunerError(f"{where}.{name}.{key}: unknown key; allowed: 'ON', InputType, "
                                 "InputType0..N, OutputType")
            if key == "ON":
                if val not in ("BPU", "CPU"):
                    raise TunerError(f"{where}.{name}.ON: must be 'BPU' or 'CPU' (case-sensitive), got {val!r}")
            elif val not in DTYPES:
                raise TunerError(f"{where}.{name}.{key}: must be 'int8' or 'int16', got {val!r}")
            node[key] = val
        out[name] = node
    return out


def _split(value: Any) -> list[str]:
    """A ';'-separated list. A trailing ';' ends the list instead of adding an empty item, as in
    hb_mapper (``input_name: "states;laptop_features;phone_features;"``, the X5 LeRobot export)."""
    if value is None:
        return []
    items = [s.strip() for s in str(value).split(";")]
    return items[:-1] if len(items) > 1 and items[-1] == "" else items


def _numbers(where: str, text: str) -> tuple[float, ...] | None:
    if text in ("", "None", "none"):
        return None
    try:
        return tuple(float(v) for v in text.split())
    except ValueError:
        raise TunerError(f"{where}: expected space-separated numbers, got {text!r}") from None


def _shape(where: str, text: str) -> tuple[int, ...] | None:
    if text == "":
        return None
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise TunerError(f"{where}: expected a shape like 1x3x224x224, got {text!r}") from None
    if any(d <= 0 for d in dims):
        raise TunerError(f"{where}: dimensions must be positive, got {text!r}")
    return dims


class DuplicateKeyError(yaml.YAMLError):
    pass


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, tuple[int, int]] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:       # an unhashable key: the base class reports it
                    continue
                at = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                if first is not None:
                    where = (f"line {first[0]} and line {at[0]}" if first[0] != at[0] else
                             f"line {at[0]}, columns {first[1]} and {at[1]}")
                    raise DuplicateKeyError(f"key {key!r} is given twice in one mapping, at {where} (YAML keeps "
                                            "only the last); remove or merge one of them")
                seen[key] = at
        return super().construct_mapping(node, deep=deep)



OPTIMIZATIONS = ("set_model_output_int8", "set_model_output_int16", "set_all_nodes_int16",
                 "set_Softmax_input_int8", "set_Softmax_output_int8", "set_Softmax_input_int16",
                 "set_Softmax_output_int16", "asymmetric", "bias_correction", "lstm_batch_last", "run_fast")
_OPTYPE_OPTION = re.compile(r"set_[A-Z][A-Za-z0-9]*_(input|output)_int(8|16)")


def _check_optimization(path: Path, option: str) -> None:
    """hb_mapper's parser passes optimization through; horizon_nn fails on an unknown option at build time
    (docs/hb_rules/config.md §5): refuse it here, with a did-you-mean."""
    if option in OPTIMIZATIONS or _OPTYPE_OPTION.fullmatch(option):
        return
    close = difflib.get_close_matches(option, OPTIMIZATIONS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise TunerError(f"{path}: calibration_parameters.optimization: unknown option {option!r}; {hint}valid: "
                     f"{', '.join(OPTIMIZATIONS[:3])}, set_<OpType>_input_int8/int16, set_<OpType>_output_int8/int16, "
                     "asymmetric, bias_correction, lstm_batch_last")


def read_yaml(path: Path, what: str, missing_hint: str = "") -> Any:
    """``yaml.safe_load`` of a user file, every failure as one TunerError naming the file."""
    return read_yaml_text(path, what, missing_hint)[0]


def read_yaml_text(path: Path, what: str, missing_hint: str = "") -> tuple[Any, str]:
    """:func:`read_yaml` and the file's text (read once)."""
    if not path.is_file():
        raise TunerError(f"{path}: no such file{missing_hint}")
    try:
        text = path.read_text(encoding="utf-8")
        return yaml.load(text, Loader=UniqueKeyLoader), text
    except DuplicateKeyError as exc:
        raise TunerError(f"{path}: {exc}") from None
    except UnicodeDecodeError:
        raise TunerError(f"{path}: not a text file; pass {what}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TunerError(f"{path}: invalid YAML{at}: {problem}") from None


def load_config(path: str | Path) -> HbConfig:
    """Read and validate an hb_mapper YAML. Raises TunerError naming the bad key."""
    path = Path(path)
    raw, text = read_yaml_text(path, "the hb_mapper YAML",
                               "; pass the hb_mapper YAML given to 'hb_mapper makertbin --config'")
    cfg = parse_config(raw, path)
    cfg.text = text
    return cfg


def parse_config(raw: Any, path: Path) -> HbConfig:
    """``raw`` (the YAML's mapping) checked against hb_mapper's schema and its own rules, one TunerError
    naming the first bad key; what hb_mapper accepts but does differently from what users expect becomes
    a warning."""
    _check_schema(raw, path)
    warnings: list[str] = []
    for section in ("model_parameters", "input_parameters", "calibration_parameters"):
        if not raw.get(section):
            raise TunerError(f"{path}: missing section {section}")
    mp, ip, cp = raw["model_parameters"], raw["input_parameters"], raw["calibration_parameters"]
    cc = raw.get("compiler_parameters") or {}
    if "compiler_parameters" not in raw:
        warnings.append("no compiler_parameters section: hb_mapper's docs require all four sections")
    if cc.get("optimize_level") is None:
        warnings.append("compiler_parameters.optimize_level is not set: hb_mapper then compiles with O0; set 'O3'")
    if "onnx_model" not in mp:
        raise TunerError(f"{path}: model_parameters.onnx_model is missing; tuner works on ONNX models")
    if "march" not in mp:
        raise TunerError(f"{path}: model_parameters.march is missing; use 'bayes-e' for RDK X5")
    if not mp["onnx_model"] or not str(mp["onnx_model"]).endswith(".onnx"):
        raise TunerError(f"{path}: model_parameters.onnx_model must name a .onnx file, got {mp['onnx_model']!r}")
    onnx_model = (path.parent / mp["onnx_model"]).resolve()
    node_info, legacy_placement = _node_info(path, mp, cp, warnings)
    calibration_type = cp.get("calibration_type", "default")
    inputs = _inputs(path, ip, cp, calibration_type, warnings)
    pct = cp.get("max_percentile")
    if pct is not None and not 0.0 < float(pct) <= 1.0:
        raise TunerError(f"{path}: calibration_parameters.max_percentile must be in (0, 1], got {pct}")
    optimization = tuple(o.strip() for o in re.split(r"[,;]", cp.get("optimization") or "") if o.strip())
    for option in optimization:
        _check_optimization(path, option)
    return HbConfig(path=path, raw=raw, onnx_model=onnx_model, march=mp["march"], inputs=inputs,
                    node_info=node_info, calibration_type=calibration_type,
                    max_percentile=float(pct) if pct is not None else None,
                    per_channel=bool(cp.get("per_channel", False)), optimization=optimization,
                    legacy_placement=legacy_placement, warnings=warnings)


def _check_schema(raw: Any, path: Path) -> None:
    """hb_mapper's schema: known sections holding mappings, known keys in their own section (a key in
    another section named as such), values of the key's type and among its choices."""
    if not isinstance(raw, dict):
        raise TunerError(f"{path}: expected a mapping with model_parameters, input_parameters, "
                         f"calibration_parameters and compiler_parameters, got {_type_name(raw)}")
    for section, body in raw.items():
        if section not in SCHEMA:
            raise TunerError(f"{path}: unknown section {section!r}; allowed: {', '.join(SCHEMA)}")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise TunerError(f"{path}: {section} must be a mapping, got {_type_name(body)}")
        for key, value in body.items():
            _check_key(path, section, key, value)


def _check_key(path: Path, section: str, key: Any, value: Any) -> None:
    where = f"{section}.{key}"
    if key not in SCHEMA[section]:
        home = [other for other in SCHEMA if other != section and key in SCHEMA[other]]
        if home:
            raise TunerError(f"{path}: {where}: {key} belongs in {home[0]}, not {section}; move it there "
                             "(hb_mapper rejects keys outside their section)")
        close = difflib.get_close_matches(str(key), list(SCHEMA[section]), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TunerError(f"{path}: {where}: unknown key{hint}; hb_mapper rejects keys outside its schema")
    kind = SCHEMA[section][key]
    if kind != NODEINFO and value is not None:
        _check_type(f"{path}: {where}", value, kind)
    allowed = CHOICES.get((section, key))
    # input_parameters lists hold one value per input, ';'-separated
    items = _split(value) if section == "input_parameters" and isinstance(value, str) else [value]
    for item in items:
        if allowed and value is not None and item not in allowed:
            raise TunerError(f"{path}: {where}: {item!r} is not one of {', '.join(allowed)}")


def _node_info(path: Path, mp: dict[str, Any], cp: dict[str, Any],
               warnings: list[str]) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """(node_info, the placement run_on_cpu / run_on_bpu ask for): node_info first, then the legacy
    set_node_data_type's entries it does not set, then run_on_cpu / run_on_bpu where node_info sets no
    ON (a conflict warned about: node_info wins, as in hb_mapper)."""
    node_info = parse_node_info(f"{path}: model_parameters.node_info", mp.get("node_info"))
    legacy = parse_node_info(f"{path}: model_parameters.set_node_data_type", mp.get("set_node_data_type"))
    for name, settings in legacy.items():
        node_info.setdefault(name, {})
        for k, v in settings.items():
            node_info[name].setdefault(k, v)
    legacy_placement: dict[str, dict[str, str]] = {}
    for key, unit in (("run_on_cpu", "CPU"), ("run_on_bpu", "BPU")):
        for name in filter(None, _split(cp.get(key))):
            legacy_placement.setdefault(name, {"ON": unit})
            current = node_info.setdefault(name, {})
            if "ON" in current and current["ON"] != unit:
                warnings.append(f"calibration_parameters.{key} lists {name!r} but node_info sets ON={current['ON']}; "
                                "node_info wins, as in hb_mapper")
            current.setdefault("ON", unit)
    return node_info, legacy_placement


def _per_input(path: Path, section: dict[str, Any], sec: str, key: str, default: str | None,
               n_inputs: int) -> list[str | None]:
    """A ';'-separated per-input list: one value per input (mean, scale and norm type given once apply to
    every input), ``default`` for each when the key is absent."""
    values: list[str | None] = list(_split(section.get(key))) if section.get(key) is not None else []
    if not values:
        return [default] * n_inputs
    if len(values) == 1 and n_inputs > 1 and key in ("mean_value", "scale_value", "norm_type"):
        values = values * n_inputs
    if len(values) != n_inputs:
        raise TunerError(f"{path}: {sec}.{key} has {len(values)} ';'-separated values for {n_inputs} inputs")
    return values


def _inputs(path: Path, ip: dict[str, Any], cp: dict[str, Any], calibration_type: str,
            warnings: list[str]) -> list[InputSpec]:
    """The model inputs the YAML describes, in the order of cal_data_dir."""
    names = _split(ip.get("input_name"))
    n_inputs = max(len(names), len(_split(cp.get("cal_data_dir"))), 1)
    if n_inputs > 1 and (len(names) != n_inputs or "" in names):
        raise TunerError(f"{path}: input_parameters.input_name must list all {n_inputs} inputs, ';'-separated, "
                         "in the order of cal_data_dir")

    def ips(key: str, default: str | None) -> list[str | None]:
        return _per_input(path, ip, "input_parameters", key, default, n_inputs)

    cal_dirs = _per_input(path, cp, "calibration_parameters", "cal_data_dir", None, n_inputs)
    if calibration_type not in ("load", "skip") and cal_dirs[0] is None:
        raise TunerError(f"{path}: calibration_parameters.cal_data_dir is missing; point it at the folder of "
                         "calibration tensors")
    cal_types = _per_input(path, cp, "calibration_parameters", "cal_data_type", None, n_inputs)
    for t in cal_types:
        if t is not None and t not in CAL_DATA_TYPES:
            raise TunerError(f"{path}: calibration_parameters.cal_data_type: {t!r} is not one of {', '.join(CAL_DATA_TYPES)}")
    preprocess_on = cp.get("preprocess_on") is True
    specs = [_input_spec(path, name, ttrain, layout, shape, norm, mean, scale, cal_dirs[i], cal_types[i],
                         preprocess_on, warnings)
             for i, (name, ttrain, layout, shape, norm, mean, scale) in enumerate(zip(
                 names if names else [""], ips("input_type_train", None), ips("input_layout_train", None),
                 ips("input_shape", ""), ips("norm_type", "no_preprocess"), ips("mean_value", "None"),
                 ips("scale_value", "None")))]
    def runtime(key: str, default: str | None) -> list[str | None]:
        """Lenient where tuner needs no more: one value given for several inputs applies to each."""
        values: list[str | None] = list(_split(ip.get(key))) if ip.get(key) is not None else []
        return values if len(values) == n_inputs else (values * n_inputs if len(values) == 1 else [default] * n_inputs)

    types_rt = runtime("input_type_rt", None)
    for spec, rt, layout in zip(specs, types_rt, runtime("input_layout_rt", None)):
        if rt is not None and rt != "nv12" and layout is None:
            raise TunerError(f"{path}: input_parameters.input_layout_rt is missing for input {spec.name!r} "
                             f"(input_type_rt {rt!r}): hb_mapper needs it for every runtime type but nv12 "
                             "(\"Input_layout_rt missing\"); add 'NHWC' or 'NCHW'")
    return [_with_runtime(path, spec, rt, space or "regular")
            for spec, rt, space in zip(specs, types_rt, runtime("input_space_and_range", None))]


def _with_runtime(path: Path, spec: InputSpec, rt: str | None, space: str) -> InputSpec:
    """``spec`` with its runtime type, refused where hb_mapper fails (docs/hb_rules/input.md): bt601_video
    with another type than nv12 (its parser), and a colour conversion in float (rgb/bgr -> yuv444, nv12
    bt601_video) from integer calibration files (hb's converter adds a float to the uint8 array in place
    and stops with "Cannot cast ufunc 'add' output from dtype('float64') to dtype('uint8')")."""
    if space == "bt601_video" and rt != "nv12":
        raise TunerError(f"{path}: input_parameters.input_space_and_range 'bt601_video' needs input_type_rt "
                         f"'nv12', not {rt!r}")
    floats = (rt == "yuv444" and spec.type_train in ("rgb", "bgr")) or (rt == "nv12" and space == "bt601_video")
    if floats and not spec.preprocess_on and spec.cal_type not in (None, "float32"):
        what = "input_type_rt 'yuv444'" if rt == "yuv444" else "input_space_and_range 'bt601_video'"
        raise TunerError(f"{path}: {what} from input_type_train {spec.type_train!r} needs float32 calibration "
                         f"files (cal_data_type 'float32'), not {spec.cal_type!r}: hb_mapper's colour conversion "
                         "fails on integer files (\"Cannot cast ufunc 'add' output\")")
    return replace(spec, type_rt=rt, space_and_range=space)


def _input_spec(path: Path, name: str, ttrain: str | None, layout: str | None, shape: str | None, norm: str | None,
                mean: str | None, scale: str | None, d: str | None, cal_type: str | None, preprocess_on: bool,
                warnings: list[str]) -> InputSpec:
    """One input, checked: its normalization has the values it needs (none for a featuremap), and its
    calibration data type is known (hb's folder-name rule when unset, with a warning)."""
    if ttrain is None:
        raise TunerError(f"{path}: input_parameters.input_type_train is missing (e.g. 'rgb' or 'featuremap')")
    if layout is None:
        raise TunerError(f"{path}: input_parameters.input_layout_train is missing ('NCHW' or 'NHWC')")
    m = _numbers(f"{path}: input_parameters.mean_value", mean or "None")
    s = _numbers(f"{path}: input_parameters.scale_value", scale or "None")
    if norm in ("data_mean", "data_mean_and_scale") and m is None:
        raise TunerError(f"{path}: input_parameters.norm_type {norm!r} needs mean_value")
    if norm in ("data_scale", "data_mean_and_scale") and s is None:
        raise TunerError(f"{path}: input_parameters.norm_type {norm!r} needs scale_value")
    if norm != "no_preprocess" and ttrain == "featuremap":
        raise TunerError(f"{path}: input_parameters.norm_type must be 'no_preprocess' for featuremap inputs")
    cal_dir = (path.parent / d).resolve() if d else None
    images = preprocess_on and ttrain != "featuremap"
    if images:
        what = f"input {name!r}" if name else "the input"
        warnings.append(f"calibration_parameters.preprocess_on is True: hb_mapper reads the images in "
                        f"{cal_dir.name if cal_dir else 'cal_data_dir'} for {what} and resizes them itself, "
                        "which rarely matches your training preprocessing (crop, letterbox, interpolation, "
                        "colour order); write the tensors with 'tuner make-cal-data --preprocess' and set "
                        "preprocess_on False")
    elif cal_type is None and ttrain == "featuremap":
        cal_type = "float32"     # Horizon's PTQ docs: featuremap samples are float32; no folder-name rule
    elif cal_type is None and cal_dir is not None:
        cal_type = "float32" if cal_dir.name.endswith("_f32") else "uint8"
        warnings.append(f"calibration_parameters.cal_data_type is not set: hb_mapper reads {cal_dir.name} "
                        f"as {cal_type} (folder-name rule); set it explicitly")
    return InputSpec(name=name, type_train=ttrain, layout_train=layout,
                     shape=_shape(f"{path}: input_parameters.input_shape", shape or ""),
                     norm_type=norm or "no_preprocess",
                     mean=m if norm in ("data_mean", "data_mean_and_scale") else None,
                     scale=s if norm in ("data_scale", "data_mean_and_scale") else None,
                     cal_dir=cal_dir, cal_type=cal_type, preprocess_on=images)
