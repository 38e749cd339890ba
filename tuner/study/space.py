"""Search space files: what the study may change, validated on load with the key's path.

A space file names the user's hb_mapper YAML (``base``) and says which nodes are free and
which knobs the study may turn. Every key has a default in ``search_spaces/default.yaml``;
a space file only sets what differs. :func:`resolve` then turns the rules into concrete,
static Optuna decisions for one model and target: one categorical per free node (or per
tied group of repeated blocks) whose choices are only the combinations the march allows,
plus the calibration knobs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import onnx
import yaml

from tuner.candidate import Calibration, Candidate, NodeSetting
from tuner.errors import TunerError
from tuner.graph import Graph, Target
from tuner.inputs.config import read_yaml
from tuner.metrics.task import MetricSpec, parse_metric_spec
from tuner.simulate.placement import CPU_RUNTIME_LACKS
from tuner.study.record import Objectives
from tuner.study.sections import (
    PRECISIONS,
    CalibrationKnobs,
    NodesRule,
    StudySettings,
    objectives_section,
    task_metric_texts,
)

DEFAULTS_PATH = Path(__file__).resolve().parents[2] / "search_spaces" / "default.yaml"

#: Space keys that decide which trials are kept, not what a trial measures: a study resumes
#: with other values (feasibility is derived again from the stored values; see
#: tuner.study.results.rows).
NOT_MEASURED: dict[str, tuple[str, ...]] = {
    "": ("validation_data", "validation_limit"),
    "objectives": ("min_accuracy", "max_latency_ms", "select", "max_latency_ratio", "constraints"),
    "study": ("n_trials", "timeout", "seed", "min_eval_samples"),
}

def _defaults() -> dict[str, Any]:
    defaults: dict[str, Any] = yaml.safe_load(DEFAULTS_PATH.read_text(encoding="utf-8"))
    return defaults


def _merge(defaults: dict[str, Any], given: dict[str, Any], where: str, path: Path) -> dict[str, Any]:
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        if key not in defaults:
            close = [k for k in defaults if k.startswith(str(key)[:3])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TunerError(f"{path}: {where}{key}: unknown key{hint}; see search_spaces/README.md")
        if isinstance(defaults[key], dict) and defaults[key]:  # an empty default ({}) is a free-form mapping
            if not isinstance(value, dict):
                raise TunerError(f"{path}: {where}{key}: expected a mapping, got {value!r}")
            out[key] = _merge(defaults[key], value, f"{where}{key}.", path)
        else:
            out[key] = value
    return out


@dataclass
class SearchSpace:
    """A validated space file, with every default filled in, and its typed sections."""

    path: Path
    raw: dict[str, Any]
    base: Path
    eval_data: list[Path] | None
    rule: NodesRule
    knobs: CalibrationKnobs
    objective: Objectives
    settings: StudySettings
    profile: Path | None = None
    board: str | None = None           # a board campaign's name (tuner latency board): latency on that board
    thresholds: Path | None = None     # hb_mapper's calibrated model: real thresholds for every trial
    validation_data: list[Path] | None = None   # re-score the winners here (None: see validation.validation_data)

    # The sections as the file has them (for display and stored studies); code reads the typed ones.
    @property
    def nodes(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.raw["nodes"])

    @property
    def calibration(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.raw["calibration"])

    @property
    def objectives(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.raw["objectives"])

    @property
    def study(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.raw["study"])

    @property
    def march(self) -> str | None:
        march = self.raw["march"]
        assert march is None or isinstance(march, str), "checked by load_space"
        return march

    @property
    def eval_limit(self) -> int | None:
        limit = self.raw["eval_limit"]
        assert limit is None or isinstance(limit, int), "checked by load_space"
        return limit

    @property
    def labels(self) -> dict[str, str]:
        labels = self.raw["labels"]
        assert isinstance(labels, dict), "checked by load_space"
        return labels

    def task_metrics(self) -> list[MetricSpec]:
        """The task metrics the evaluations must compute: the objective's (if a task metric) and report's."""
        return list(dict.fromkeys(parse_metric_spec(t) for t in task_metric_texts(self.objective)))

    @property
    def name(self) -> str:
        return self.settings.name or self.path.stem

    def fingerprint(self, legacy: bool = False) -> str:
        """The sha256 of what the trials measure: the space without :data:`NOT_MEASURED` (floors,
        budget), so a study resumes with another floor. ``legacy``: of the whole space, as
        studies made before 2026-12 stored it (still accepted on resume)."""
        raw = self.raw
        if not legacy:
            raw = {k: ({kk: vv for kk, vv in v.items() if kk not in NOT_MEASURED[k]}
                       if k in NOT_MEASURED and isinstance(v, dict) else v)
                   for k, v in raw.items() if k not in NOT_MEASURED[""]}
        blob = json.dumps(raw, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def load_space(path: str | Path) -> SearchSpace:
    path = Path(path)
    given = read_yaml(path, "a search space YAML", " (the search space file)")
    if not isinstance(given, dict):
        raise TunerError(f"{path}: expected a mapping of search space keys, got {type(given).__name__}")
    if "model_parameters" in given:
        raise TunerError(f"{path}: this is an hb_mapper YAML, not a search space; write a space file with "
                         f"'base: {path.name}' (see search_spaces/README.md)")
    raw = _merge(_defaults(), given, "", path)
    if raw["version"] != 1:
        raise TunerError(f"{path}: version: only version 1 exists, got {raw['version']!r}")
    if not raw["base"] or not isinstance(raw["base"], str):
        raise TunerError(f"{path}: base: required: the path of your hb_mapper YAML, relative to this file")
    base = (path.parent / raw["base"]).resolve()
    if not base.is_file():
        raise TunerError(f"{path}: base: {raw['base']!r} not found (resolved to {base})")
    rule = NodesRule.from_section(raw["nodes"], f"{path}: nodes")
    knobs = CalibrationKnobs.from_section(raw["calibration"], f"{path}: calibration")
    objective = objectives_section(raw["objectives"], f"{path}: objectives")
    if not isinstance(raw["labels"], dict) or not all(isinstance(v, str) for v in raw["labels"].values()):
        raise TunerError(f"{path}: labels: expected a mapping of output name to a file pattern, e.g. "
                         "{seg: 'labels/seg_*.npy'}")
    settings = StudySettings.from_section(raw["study"], f"{path}: study")
    if raw["march"] is not None and not isinstance(raw["march"], str):
        raise TunerError(f"{path}: march: expected a march name or a target YAML path, got {raw['march']!r}")
    if isinstance(raw["march"], str) and raw["march"].endswith((".yaml", ".yml")):
        # a target table file (e.g. one corrected by 'tuner import-log --update-target'), relative to this file
        raw["march"] = str((path.parent / raw["march"]).resolve())
    eval_data = None
    if raw["eval_data"] is not None:
        eval_data = [(path.parent / p).resolve() for p in str(raw["eval_data"]).split(";")]
    for key in ("eval_limit", "validation_limit"):
        if raw[key] is not None and (isinstance(raw[key], bool) or not isinstance(raw[key], int) or raw[key] < 1):
            raise TunerError(f"{path}: {key}: expected a positive integer, got {raw[key]!r}")
    validation_data = None
    if raw["validation_data"] is not None:
        validation_data = [(path.parent / p).resolve() for p in str(raw["validation_data"]).split(";")]
        missing = [p for p in validation_data if not p.is_dir()]
        if missing:
            raise TunerError(f"{path}: validation_data: {missing[0]} is not a folder (give the folder(s) of samples "
                             "to re-score the winners on, ';' between inputs)")
    profile = None
    if raw["profile"] is not None:
        profile = (path.parent / str(raw["profile"])).resolve()
        if not profile.is_file():
            raise TunerError(f"{path}: profile: {raw['profile']!r} not found (resolved to {profile})")
    board = raw.get("board")
    if board is not None and (not isinstance(board, str) or not board.strip()):
        raise TunerError(f"{path}: board: expected the name of a board campaign (tuner latency board ... --board NAME), "
                         f"got {board!r}")
    thresholds = None
    if raw.get("thresholds") is not None:
        thresholds = (path.parent / str(raw["thresholds"])).resolve()
        if not thresholds.is_file():
            raise TunerError(f"{path}: thresholds: {raw['thresholds']!r} not found (resolved to {thresholds}); give "
                             "hb_mapper's working_dir/<prefix>_calibrated_model.onnx")
        from tuner.inputs.model import file_fingerprint

        raw["thresholds_sha256"] = file_fingerprint(thresholds)   # a new calibrated model is a new space
        knobs = _pinned_to_base(path, given, base, raw)
    return SearchSpace(path=path, raw=raw, base=base, eval_data=eval_data, rule=rule, knobs=knobs, objective=objective,
                       settings=settings, profile=profile, thresholds=thresholds, validation_data=validation_data,
                       board=board.strip() if board else None)


def _pinned_to_base(path: Path, given: dict[str, Any], base: Path, raw: dict[str, Any]) -> CalibrationKnobs:
    """With ``thresholds:``, the calibration is the base YAML's, not searched.

    hb_mapper's calibrated model holds the thresholds of the calibration that made it: a trial
    with another ``calibration_type`` would be simulated with those thresholds all the same (only
    tensors hb_mapper did not calibrate fall back to tuner's own), and the YAML it exported would
    make hb_mapper compute other thresholds than the ones the trial was scored with. So the space's
    calibration is pinned to the base YAML's, and a space that lists calibration values to search
    is refused: the two keys contradict each other.
    """
    from tuner.inputs.config import load_config

    listed = {k: v for k, v in (given.get("calibration") or {}).items() if isinstance(v, list) and len(v) > 1}
    if listed:
        key = next(iter(listed))
        raise TunerError(f"{path}: thresholds: and calibration.{key}: {listed[key]} contradict each other: the "
                         "calibrated model's thresholds come from one calibration (the base YAML's); remove "
                         "the calibration lists to search placement and int16 around it, or remove thresholds: "
                         "to search the calibration")
    cfg = load_config(base)
    cal = Calibration(type=cfg.calibration_type, max_percentile=cfg.max_percentile, per_channel=cfg.per_channel)
    raw["calibration"] = {"calibration_type": [cal.type], "max_percentile": [cal.percentile_value],
                          "per_channel": [bool(cal.per_channel)]}
    return CalibrationKnobs.from_section(raw["calibration"], f"{path}: calibration")


# --------------------------------------------------------------------------- resolution


@dataclass(frozen=True)
class Decision:
    """One categorical Optuna parameter: a free node, or a tied group of repeated nodes."""

    param: str
    nodes: tuple[str, ...]
    choices: tuple[str, ...]
    default_choice: str


def tie_key(name: str) -> str:
    """Names of repeated blocks differ only in '.N' module indices: /blocks.3/attn -> /blocks.*/attn."""
    return re.sub(r"\.\d+", ".*", name)


def node_choices(op_type: str, target: Target, placements: list[str], precisions: list[str],
                 node: onnx.NodeProto | None = None) -> list[str]:
    """The legal choices for one node, as strings: 'BPU', 'BPU:int16_input', ..., 'CPU'.

    With ``node``, its attributes count too (a dilated Conv has no int16 output). A fused activation has no
    'CPU': hb_mapper refuses it there (tuner.simulate.placement.CPU_RUNTIME_LACKS)."""
    out = []
    if "BPU" in placements and target.bpu_capable(op_type):
        for p in precisions:
            in16, out16 = PRECISIONS[p]
            if in16 and not target.int16_input(op_type):
                continue
            if out16 and not target.int16_output(op_type, node):
                continue
            out.append("BPU" if p == "int8" else f"BPU:{p}")
    if "CPU" in placements and op_type not in CPU_RUNTIME_LACKS:
        out.append("CPU")
    return out


def default_choice(op_type: str, target: Target) -> str:
    """What hb_mapper does with no node_info entry."""
    return "BPU" if op_type in target.bpu_ops else "CPU"


def choice_setting(choice: str, op_type: str, target: Target) -> NodeSetting:
    """The minimal node_info entry for a choice (nothing where hb_mapper's default already does it)."""
    if choice == "CPU":
        return NodeSetting(on="CPU") if op_type in target.bpu_ops else NodeSetting()
    on = None if op_type in target.bpu_ops else "BPU"
    precision = choice.split(":", 1)[1] if ":" in choice else "int8"
    in16, out16 = PRECISIONS[precision]
    only = target.int16_input_indices(op_type)
    if in16 and only is not None:   # MatMul: InputType0 only, never InputType (which covers input 1)
        return NodeSetting(on=on, input_types=tuple((k, in16) for k in sorted(only)), output_type=out16)
    return NodeSetting(on=on, input_type=in16, output_type=out16)


def setting_choice(setting: NodeSetting, op_type: str, target: Target) -> str:
    """Inverse of :func:`choice_setting` for the entries it writes (used to enqueue known plans)."""
    on = setting.on or default_choice(op_type, target)
    if on == "CPU":
        return "CPU"
    in16 = setting.input_type == "int16" or any(v == "int16" for _, v in setting.input_types)
    out16 = setting.output_type == "int16"
    return {(False, False): "BPU", (True, False): "BPU:int16_input", (False, True): "BPU:int16_output",
            (True, True): "BPU:int16"}[(in16, out16)]


@dataclass
class ResolvedSpace:
    """The concrete decisions of a space for one model and target."""

    space: SearchSpace
    target: Target
    graph: Graph
    base: Candidate
    decisions: list[Decision]
    calibration_params: dict[str, list[Any]]
    notes: list[str] = field(default_factory=list)

    def distributions(self) -> dict[str, Any]:
        import optuna

        d = {dec.param: optuna.distributions.CategoricalDistribution(list(dec.choices)) for dec in self.decisions}
        for name, values in self.calibration_params.items():
            d[name] = optuna.distributions.CategoricalDistribution(values)
        return d

    def candidate(self, params: dict[str, Any]) -> Candidate:
        nodes = dict(self.base.nodes)
        for dec in self.decisions:
            choice = params.get(dec.param, dec.default_choice)
            for name in dec.nodes:
                setting = choice_setting(choice, self.graph.by_name[name].op_type, self.target)
                if setting.empty:
                    nodes.pop(name, None)
                else:
                    nodes[name] = setting
        cal = self.calibration_from(params)
        return Candidate.make(cal, nodes, self.base.optimization)

    def calibration_from(self, params: dict[str, Any]) -> Calibration:
        k = self.space.knobs
        ctype = params.get("calibration_type", k.calibration_type[0])
        pct = params.get("max_percentile", k.max_percentile[0])
        pc = params.get("per_channel", k.per_channel[0])
        return Calibration(type=ctype, max_percentile=pct,
                           per_channel=bool(pc) if ctype in ("max", "kl") else False)

    def params_for(self, calibration: Calibration, choices: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Parameters that reproduce ``calibration`` and per-node ``choices`` (others at hb defaults)."""
        params: dict[str, Any] = {}
        for dec in self.decisions:
            want = (choices or {}).get(dec.param, dec.default_choice)
            params[dec.param] = want if want in dec.choices else dec.default_choice
        c = self.calibration_params
        if "calibration_type" in c:
            params["calibration_type"] = calibration.type
        if "max_percentile" in c:
            pct = calibration.percentile_value
            params["max_percentile"] = pct if pct in c["max_percentile"] else c["max_percentile"][0]
        if "per_channel" in c:
            params["per_channel"] = calibration.per_channel
        return params

    def fingerprint(self, legacy: bool = False) -> str:
        blob = json.dumps({"space": self.space.fingerprint(legacy), "march": self.target.march,
                           "decisions": [[d.param, list(d.nodes), list(d.choices)] for d in self.decisions],
                           "calibration": self.calibration_params}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def free_nodes(space: SearchSpace, graph: Graph, target: Target) -> list[str]:
    """Node names the rules leave free, in topological order (before top_k)."""
    n = space.rule
    # an ONNX name hb_mapper's optimizer replaced stands for the nodes that replaced it (as in node_info)
    rewrites = {x: graph.names.rewrites[x].nodes for x in n.names
                if x not in graph.by_name and x in graph.names.rewrites and graph.names.rewrites[x].nodes}
    wanted = set(n.names) | {m for nodes in rewrites.values() for m in nodes}
    names = []
    for node in graph:
        if n.select == "bpu" and not target.bpu_capable(node.op_type):
            continue
        if n.op_types and node.op_type not in n.op_types:
            continue
        if n.pattern and not re.search(n.pattern, node.name):
            continue
        if n.names and node.name not in wanted:
            continue
        if any(re.search(p, node.name) for p in n.exclude):
            continue
        if not graph.data_inputs(node):  # nothing to quantize: placement cannot matter
            continue
        names.append(node.name)
    missing = [x for x in n.names if x not in graph.by_name and x not in rewrites]
    if missing:
        graph.node(missing[0])  # raises with close matches
    return names


def resolve(space: SearchSpace, graph: Graph, target: Target, base: Candidate,
            sensitivity: dict[str, float] | None = None) -> ResolvedSpace:
    n = space.rule
    names = free_nodes(space, graph, target)
    notes = []
    if n.top_k is not None and len(names) > n.top_k:
        if sensitivity is None:
            raise ValueError("top_k needs the sensitivity ranking")
        ranked = sorted(names, key=lambda x: -sensitivity.get(x, 0.0))
        keep = set(ranked[: n.top_k])
        names = [x for x in names if x in keep]
        notes.append(f"nodes.top_k: {len(names)} most sensitive nodes are free")
    groups: dict[str, list[str]] = {}
    for name in names:
        key = tie_key(name) if n.tie_repeated else name
        groups.setdefault(key, []).append(name)
    decisions = []
    for key, members in groups.items():
        choice_sets = [node_choices(graph.by_name[m].op_type, target, list(n.placement), list(n.precision),
                                    graph.by_name[m].proto) for m in members]
        choices = [c for c in choice_sets[0] if all(c in s for s in choice_sets[1:])]
        first = graph.by_name[members[0]]
        default = default_choice(first.op_type, target)
        if len(choices) < 2:
            continue
        if default not in choices:
            default = choices[0]
        prefix = "tie:" if len(members) > 1 else "node:"
        decisions.append(Decision(param=f"{prefix}{key}", nodes=tuple(members), choices=tuple(choices),
                                  default_choice=default))
    calibration_params = space.knobs.free()
    if not decisions and not calibration_params:
        raise TunerError(f"{space.path}: the space has nothing to search: no free node has two legal choices and "
                         "every calibration list has one value")
    return ResolvedSpace(space=space, target=target, graph=graph, base=base, decisions=decisions,
                         calibration_params=calibration_params, notes=notes)
