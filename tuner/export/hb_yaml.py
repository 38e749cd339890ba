"""A candidate merged into the user's base YAML, checked against hb_mapper's parser rules.

The user's other fields are kept. ``node_info`` is written in dict form (the string form
breaks on several entries in older parsers), ``'ON'`` is quoted, booleans are real
booleans, relative paths are rewritten so they still point at the same files from the new
location (hb_mapper resolves them against the YAML's folder), and the file is written
atomically. The user's input YAML is never overwritten.
"""

from __future__ import annotations

import copy
import os
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
