"""Everything one hb_mapper YAML points at, loaded once: model, target, data, statistics.

The CLI subcommands and the study all start here, so inputs are validated the same way
everywhere and the calibration statistics are computed (or read from cache) once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuner.calib.collect import cached_statistics
from tuner.calib.stats import TensorStats
from tuner.calib.thresholds import ThresholdMemo
from tuner.candidate import Candidate
from tuner.console import progress_printer as progress_printer  # re-exported: study/ imports it from here
from tuner.graph import Graph, Target, load_target
from tuner.inputs.calibrated_map import MappedThresholds
from tuner.inputs.config import HbConfig, load_config
from tuner.inputs.data import DataSet, dataset_from_config
from tuner.inputs.model import LoadedModel, load_model
from tuner.inputs.realmatch import load_thresholds
from tuner.metrics.task import LabelSet, MetricSpec
from tuner.simulate import Simulator
from tuner.simulate.plan import check_node_names
from tuner.simulate.simmodel import SimModel


@dataclass
class Workspace:
    config: HbConfig
    model: LoadedModel
    target: Target
    graph: Graph
    calibration_data: DataSet
    eval_data: DataSet
    stats: dict[str, TensorStats]
    stats_from_cache: bool
    threads: int | None = None
    warnings: list[str] = field(default_factory=list)
    thresholds: ThresholdMemo | None = None
    _simulator: Simulator | None = None
    _sim_model: SimModel | None = None   # the simulators' model side, shared by every data set

    @classmethod
    def open(cls, config_path: str | Path, data: list[Path] | None = None, limit: int | None = None,
             march: str | None = None, threads: int | None = None,
             progress: Callable[[int, int], None] | None = None, hb_optimize: bool = True,
             check: Callable[[HbConfig, LoadedModel], None] | None = None) -> Workspace:
        """``hb_optimize=False`` simulates the exported graph as it is, without hb_mapper's graph
        rewrites (tuner.graph.optimize): for comparisons with onnxruntime's own quantizer.
        ``check``: called with the YAML and model as loaded, before the data are read."""
        config = load_config(config_path)
        target = load_target(march or config.march)
        shapes = {s.name: s.shape for s in config.inputs if s.shape is not None}
        model = load_model(config.onnx_model, shapes, target.max_opset, target.max_ir_version, hb_optimize)
        if check is not None:
            check(config, model)
        graph = Graph(model.proto, model.names)
        cal = dataset_from_config(config.inputs, model.input_shapes)
        ev = dataset_from_config(config.inputs, model.input_shapes, folders=data, limit=limit) if data else cal
        if limit and not data:
            ev = dataset_from_config(config.inputs, model.input_shapes, limit=limit)
        check_node_names(graph, Candidate.from_config(config, node_info_supported=target.raw.get("node_info", True)
                                                      is not False))   # before the statistics pass
        tensors = graph.activation_tensors()
        stats, from_cache, stats_path = cached_statistics(model, cal.for_calibration(), tensors, threads, progress)
        warnings = list(config.warnings) + list(model.warnings)
        if target.raw.get("node_info", True) is False and (config.section("model_parameters").get("node_info")
                                                            or config.section("model_parameters").get("set_node_data_type")):
            warnings.append(f"march {target.march} has no node_info: hb_mapper ignores it; use "
                            "calibration_parameters.run_on_cpu / run_on_bpu for placement")
        return cls(config=config, model=model, target=target, graph=graph, calibration_data=cal, eval_data=ev,
                   stats=stats, stats_from_cache=from_cache, threads=threads, warnings=warnings,
                   thresholds=ThresholdMemo(stats, stats_path.with_suffix(".thresholds.json")))

    @classmethod
    def for_space(cls, space, data: list[Path] | None = None, limit: int | None = None, march: str | None = None,
                  threads: int | None = None, progress: Callable[[int, int], None] | None = None,
                  check: Callable[[HbConfig, LoadedModel], None] | None = None) -> Workspace:
        """The workspace a search space evaluates in: its base YAML, its ``eval_data``,
        ``eval_limit`` and ``march`` (each overridable), and its task metrics and labels."""
        ws = cls.open(space.base, data=data or space.eval_data, limit=limit or space.eval_limit,
                      march=march or space.march, threads=threads, progress=progress, check=check)
        ws.use_task_metrics(space.task_metrics(), space.labels, space.path.parent)
        if space.thresholds is not None:
            # the search places nodes and picks int16 around hb_mapper's real calibration: the
            # candidates' int8/int16 choices stand, the real thresholds (and uint8 nodes) apply
            ws.real_thresholds = load_thresholds(space.thresholds, ws.graph, ws.model.path, ws.model.proto,
                                                 ws.first_sample())
            ws.real_honour_qtypes = False
        return ws

    task_metrics: list[MetricSpec] = field(default_factory=list)
    labels: LabelSet | None = None
    user_base: Path | None = None   # the folder user metrics (file.py:function) are found relative to
    real_thresholds: MappedThresholds | None = None  # hb_mapper's, else tuner's own
    real_honour_qtypes: bool = True

    def first_sample(self) -> dict:
        """Calibration sample 0 (what a calibrated model's tensors are matched to tuner's on)."""
        return next(iter(self.calibration_data))

    def use_task_metrics(self, specs: list[MetricSpec], label_patterns: dict[str, str], base: Path) -> None:
        """Compute these task metrics in every evaluation, against these label files where given."""
        self.task_metrics = list(specs)
        self.labels = LabelSet(label_patterns, base, len(self.eval_data)) if label_patterns else None
        self.user_base = base
        self._simulator = None

    @property
    def simulator(self) -> Simulator:
        if self._simulator is None:
            self._simulator = self.simulator_on(self.eval_data, with_task=True)
        return self._simulator

    def model_side(self) -> SimModel:
        """The simulators' model side (graph, fake-quantized weights), built once for every data set."""
        if self._sim_model is None:
            self._sim_model = SimModel(self.model, self.target)
        return self._sim_model

    def simulator_on(self, data: DataSet, with_task: bool = False) -> Simulator:
        """A simulator of this workspace's model over ``data``: the same statistics, thresholds,
        calibration data and real thresholds; task metrics and labels only ``with_task`` (the
        evaluation data's; other samples have no labels)."""
        sim = Simulator(self.model, self.target, self.stats, data, self.threads, thresholds=self.thresholds,
                        task_metrics=self.task_metrics if with_task else None,
                        labels=self.labels if with_task else None, user_base=self.user_base if with_task else None,
                        calibration_data=self.calibration_data, model_side=self.model_side())
        if self.real_thresholds is not None:
            sim.use_thresholds(self.real_thresholds, self.real_honour_qtypes)
        return sim

    def base_candidate(self) -> Candidate:
        return Candidate.from_config(self.config, node_info_supported=self.node_info_supported)

    @property
    def node_info_supported(self) -> bool:
        return self.target.raw.get("node_info", True) is not False
