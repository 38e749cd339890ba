"""A candidate merged into the user's base YAML, checked against hb_mapper's parser rules.

The user's other fields are kept. ``node_info`` is written in dict form (the string form
breaks on several entries in older parsers), ``'ON'`` is quoted, booleans are real
booleans, relative paths are rewritten so they still point at the same files from the new
location (hb_mapper resolves them against the YAML's folder), and the file is written
atomically. The user's input YAML is never overwritten.

An exported YAML is the user's file as written (:func:`round_trip_yaml`): comments, key order,
indentation, quoting and the spelling of every value tuner does not set (``false``, ``no``,
``'O3'``) stay; only the keys tuner sets change. ruamel.yaml does this (a round-trip loader
keeps comments and scalar styles; pyyaml drops both); pyyaml stays the reader, as hb_mapper's.
"""

from __future__ import annotations

import copy
import functools
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tuner.candidate import Candidate
from tuner.errors import TunerError
from tuner.files import write_atomic as write_atomic  # re-exported: the YAML writers import it from here
from tuner.inputs.config import parse_config

PATH_KEYS = {"model_parameters": ("onnx_model", "caffe_model", "prototxt", "working_dir"),
             "calibration_parameters": ("cal_data_dir",),
             "custom_op": ("custom_op_dir", "op_register_files")}
SECTIONS = ("model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters")


class _Dumper(yaml.SafeDumper):
    """safe_dump, with booleans as True/False like Horizon's samples (both parse as booleans)."""


_Dumper.add_representer(bool, lambda d, v: d.represent_scalar("tag:yaml.org,2002:bool", "True" if v else "False"))


def dump_yaml(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)


_MISSING = object()


def round_trip_yaml(base_text: str, merged: Mapping[str, Any]) -> str | None:
    """``merged`` written as the user's ``base_text``: the keys whose value differs from the
    text's (as pyyaml reads it, like hb_mapper) are set, those ``merged`` lacks removed, new ones
    added at the end of their mapping; everything else keeps its text, comments and order. None
    when the text would not read back as ``merged``."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import YAMLError as RuamelError
    from ruamel.yaml.util import load_yaml_guess_indent

    rt = YAML(typ="rt")
    rt.Constructor, rt.Representer = _spelled_booleans()
    rt.preserve_quotes = True
    rt.width = 4096                      # never re-wrap the user's long lines
    try:
        base = yaml.safe_load(base_text)
        _, indent, block_seq_indent = load_yaml_guess_indent(base_text)
        doc = rt.load(base_text)
    except (RuamelError, yaml.YAMLError, ValueError):
        return None
    if not isinstance(doc, CommentedMap) or not isinstance(base, dict):
        return None
    rt.indent(mapping=indent or 2, sequence=max(indent or 2, (block_seq_indent or 0) + 2),
              offset=block_seq_indent or 0)
    _sync(doc, base, merged)
    buf = io.StringIO()
    rt.dump(doc, buf)
    text = buf.getvalue()
    try:
        same = yaml.safe_load(text) == dict(merged)
    except yaml.YAMLError:
        same = False
    return text if same else None


@functools.cache
def _spelled_booleans() -> tuple[Any, Any]:
    """ruamel's round-trip constructor and representer, keeping a boolean's spelling (``False``
    stays ``False``, ``false`` ``false``; ruamel alone writes every boolean lower-case)."""
    from ruamel.yaml.constructor import RoundTripConstructor
    from ruamel.yaml.representer import RoundTripRepresenter
    from ruamel.yaml.scalarbool import ScalarBoolean

    class Spelled(ScalarBoolean):
        text = "false"

    def construct(loader: Any, node: Any) -> Spelled:
        b = Spelled(node.value.lower() == "true")
        b.text = node.value
        return b

    class Constructor(RoundTripConstructor):
        pass

    class Representer(RoundTripRepresenter):
        pass

    Constructor.add_constructor("tag:yaml.org,2002:bool", construct)
    Representer.add_representer(Spelled, lambda r, b: r.represent_scalar("tag:yaml.org,2002:bool", b.text))
    return Constructor, Representer


def _sync(node: Any, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    for k in [k for k in node if k not in new]:
        keys = list(node)
        if len(keys) > 1 and k == keys[-1]:
            _carry(node, k, keys[-2])       # the comment lines after it now follow the one before
        del node[k]
    for k, v in new.items():
        was = old.get(k, _MISSING) if isinstance(old, Mapping) else _MISSING
        if k in node and isinstance(v, Mapping) and isinstance(was, Mapping) and hasattr(node[k], "ca"):
            _sync(node[k], was, v)
        elif k in node and was is not _MISSING and was == v:
            continue
        elif k in node:
            node[k] = _fresh(v, node[k])
        else:
            last = list(node)[-1] if len(node) else None
            node[_fresh(k)] = _fresh(v)
            if last is not None:
                _carry(node, last, list(node)[-1])    # ... and so after a key added at the end


def _carry(node: Any, src: Any, dst: Any) -> None:
    """Move the comment lines that follow ``src``'s value (ruamel keeps the lines before the next
    section with the last key of a mapping) to after ``dst``'s (the deepest last key when its
    value is a mapping); ``src``'s own end-of-line comment stays with it."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    item: Any = node.ca.items.get(src) if hasattr(node, "ca") else None
    tok = item[2] if item and len(item) > 2 else None
    if tok is None or "\n" not in tok.value:
        return
    own, _, rest = tok.value.partition("\n")
    if not rest.strip():
        return
    if own.strip():
        tok.value = own + "\n"
    else:
        item[2] = None
    while hasattr(node[dst], "ca") and len(node[dst]) and isinstance(node[dst], Mapping):
        node, dst = node[dst], list(node[dst])[-1]
    slot = node.ca.items.setdefault(dst, [None, None, None, None])
    mine = slot[2].value if slot[2] is not None else "\n"
    slot[2] = CommentToken(mine + rest, CommentMark(0), None)


def _fresh(v: Any, before: Any = None) -> Any:
    """A value tuner sets, as ruamel writes it so that pyyaml (YAML 1.1, hb_mapper's reader) reads
    it back: a string pyyaml would read as something else (``ON``, ``1.0``) single-quoted, one
    replacing a quoted string quoted the same way."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString

    if isinstance(v, Mapping):
        return CommentedMap((_fresh(k), _fresh(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return CommentedSeq(_fresh(x) for x in v)
    if isinstance(v, str):
        if isinstance(before, (SingleQuotedScalarString, DoubleQuotedScalarString)):
            return type(before)(v)
        try:
            plain = yaml.safe_load(v) == v
        except yaml.YAMLError:
            plain = False
        return v if plain and v.strip() == v and "\n" not in v else SingleQuotedScalarString(v)
    return v


def _rebase(value: str, old_dir: Path, new_dir: Path) -> str:
    parts = []
    for item in str(value).split(";"):
        item = item.strip()
        if item and not os.path.isabs(item):
            item = os.path.relpath((old_dir / item).resolve(), new_dir.resolve())
        parts.append(item)
    return ";".join(parts)


def merged_config(base_raw: dict[str, Any], base_path: Path, candidate: Candidate, out_path: Path,
                  node_info_supported: bool = True) -> tuple[dict[str, Any], list[str]]:
    """The base YAML with the candidate's fields; returns (mapping, notes)."""
    cfg = copy.deepcopy(base_raw)
    notes: list[str] = []
    fields = candidate.to_yaml_fields()
    mp = cfg.setdefault("model_parameters", {}) or {}
    cp = cfg.setdefault("calibration_parameters", {}) or {}
    cfg["model_parameters"], cfg["calibration_parameters"] = mp, cp
    # Placement/precision now live in node_info alone (hb_mapper merges the legacy keys into it anyway).
    for legacy in ("set_node_data_type",):
        mp.pop(legacy, None)
    cp.pop("run_on_cpu", None)
    cp.pop("run_on_bpu", None)
    mp.pop("node_info", None)
    node_info = fields["model_parameters"].get("node_info")
    if node_info:
        if node_info_supported:
            mp["node_info"] = node_info
        else:
            cpu = [n for n, s in node_info.items() if s.get("ON") == "CPU"]
            bpu = [n for n, s in node_info.items() if s.get("ON") == "BPU"]
            if cpu:
                cp["run_on_cpu"] = ";".join(cpu)
            if bpu:
                cp["run_on_bpu"] = ";".join(bpu)
    for key in ("calibration_type", "max_percentile", "per_channel", "optimization"):
        cp.pop(key, None)
    cp.update(fields["calibration_parameters"])
    cc = cfg.get("compiler_parameters")
    if not isinstance(cc, dict):
        cfg["compiler_parameters"] = cc = {}
    if cc.get("optimize_level") is None:
        cc["optimize_level"] = "O3"
        notes.append("compiler_parameters.optimize_level was not set (hb_mapper would use O0); set to 'O3'")
    old_dir, new_dir = base_path.resolve().parent, out_path.resolve().parent
    if old_dir != new_dir:
        for section, keys in PATH_KEYS.items():
            body = cfg.get(section)
            if isinstance(body, dict):
                for key in keys:
                    if isinstance(body.get(key), str) and body[key]:
                        body[key] = _rebase(body[key], old_dir, new_dir)
    ordered = {s: cfg[s] for s in SECTIONS if s in cfg}
    ordered.update({k: v for k, v in cfg.items() if k not in ordered})
    return ordered, notes


def check_rules(cfg: dict[str, Any], where: Path, node_names: set[str] | None = None) -> None:
    """Raise TunerError if the mapping breaks a rule of hb_mapper's parser (docs/hb_rules/config.md §3)."""
    text = dump_yaml(cfg)
    reread = yaml.safe_load(text)
    parse_config(reread, where)  # schema: known keys, types, values, node_info grammar
    missing = [s for s in SECTIONS if s not in reread]
    if missing:
        raise TunerError(f"{where}: exported YAML lacks section(s) {', '.join(missing)}")
    node_info = (reread.get("model_parameters") or {}).get("node_info") or {}
    for name, settings in node_info.items():
        if any(not isinstance(k, str) for k in settings):
            raise TunerError(f"{where}: node_info.{name}: a key is not a string (unquoted ON?)")
        if node_names is not None and name not in node_names:
            raise TunerError(f"{where}: node_info names {name!r}, which is not a node of the model")
    if reread.get("compiler_parameters", {}).get("optimize_level") is None:
        raise TunerError(f"{where}: compiler_parameters.optimize_level must be set explicitly")
