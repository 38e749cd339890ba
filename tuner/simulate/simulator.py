"""Candidate + cached statistics -> outputs of the simulated quantized model, scored.

Set-up does the expensive, candidate-independent work once: the float reference outputs on
the evaluation data and the fake-quantized weights. ``evaluate(candidate)`` then builds the
candidate's fake-quant graph in memory from cached scales, opens one onnxruntime session for it
(kept in a small LRU cache, so repeated candidates cost nothing to set up) and streams the
evaluation data through it once.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from tuner.calib.stats import TensorStats
from tuner.calib.thresholds import ThresholdMemo
from tuner.candidate import Calibration, Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, Node, Target
from tuner.graph.softmax import SOFTMAX_PARTS, softmax_part, softmax_tensors
from tuner.inputs.calibrated_map import MappedThresholds
from tuner.inputs.data import DataSet
from tuner.inputs.model import LoadedModel
from tuner.metrics import Similarity
from tuner.metrics.task import LabelSet, MetricSpec
from tuner.runtime.session import make_session, run_samples, with_outputs
from tuner.simulate.calibrate import (
    MIX_SENSITIVITY_SAMPLES,
    DefaultChoice,
    MixedCalibration,
    MixScales,
    calibration_nodes,
    choose_default,
    choose_mix,
    search_score,
    single_node_plan,
)
from tuner.simulate.perchannel import channel_scales, channel_top
from tuner.simulate.plan import Plan, make_plan
from tuner.simulate.qdq import plan_scales
from tuner.simulate.realscales import RealCalibration, RealScales, real_plan, without_real_rules
from tuner.simulate.scales import Scales, ScaleTable, channelwise
from tuner.simulate.simdata import SimData
from tuner.simulate.simmodel import SimModel
from tuner.simulate.weights import ExternalWeights, WeightCache

#: The explicit calibration a candidate is simulated with: ``default`` and ``mix`` resolved, or hb_mapper's.
Resolved = Calibration | MixedCalibration | RealCalibration



@dataclass
class NodeRow:
    """One row of the per-node table hb_mapper prints."""

    name: str
    op_type: str
    on: str
    subgraph: int | None
    cosine: float | None
    threshold: float | None
    in_dtype: str
    out_dtype: str


@dataclass
class Evaluation:
    candidate: Candidate
    calibration: Resolved   # the explicit calibration that was simulated
    outputs: dict[str, dict[str, float]]
    plan: Plan
    task: dict[str, float] = field(default_factory=dict)     # task metrics by spec text ("miou:seg")
    nodes: list[NodeRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    samples: list[dict[str, dict[str, float]]] = field(default_factory=list)  # per sample, like outputs (per_sample)
    # split=True on data with an image input_type_rt: "input_path" / "network", each {"outputs", "task"}
    split: dict[str, dict[str, Any]] | None = None

    @property
    def mean_cosine(self) -> float:
        return float(np.mean([m["cosine"] for m in self.outputs.values()]))

    def counts(self) -> dict[str, int]:
        int16 = sum(1 for n in self.plan.placement if self.plan.in_dtype.get(n) == "int16"
                    or self.plan.out_dtype.get(n) == "int16")
        return {"subgraphs": self.plan.n_subgraphs, "cpu_nodes": len(self.plan.cpu_nodes), "int16_nodes": int16}


class Simulator:
    """Evaluates candidates of one model on one data set. Not thread-safe; one per process.

    Two sides: :class:`~tuner.simulate.simmodel.SimModel` (the graph, the fake-quantized weights; pass
    ``model_side`` to share one between simulators of the same model and target) and
    :class:`~tuner.simulate.simdata.SimData` (the samples, their float outputs, labels, statistics).
    ``calibration_data`` is where ``default`` and ``mix`` choose their methods (SimData).
    """

    def __init__(self, model: LoadedModel, target: Target, stats: dict[str, TensorStats], data: DataSet,
                 threads: int | None = None, session_cache: int = 4, thresholds: ThresholdMemo | None = None,
                 task_metrics: list[MetricSpec] | None = None, labels: LabelSet | None = None,
                 user_base: Path | None = None,
                 calibration_data: DataSet | None = None, model_side: SimModel | None = None):
        if model_side is not None and (model_side.model is not model or model_side.target is not target):
            raise ValueError("model_side is another model's or target's")
        self.side = model_side or SimModel(model, target)
        self.on = SimData(model, stats, data, threads, thresholds, task_metrics, labels, user_base, calibration_data)
        self._build_memo: dict[Any, Any] = {}   # Q/DQ and bias protos shared by the builds (tuner.simulate.qdq)
        self._sessions: OrderedDict[tuple[Any, ...], ort.InferenceSession] = OrderedDict()
        self._session_cache = session_cache
        self._choices: dict[tuple[Any, ...], DefaultChoice | MixedCalibration] = {}
        self._scale_tables: dict[Resolved, Scales] = {}
        self.real: MappedThresholds | None = None   # hb_mapper's real thresholds (use_thresholds), else None
        # simulate hb's calibrated model (what its log's tables are computed on) instead of its quantized one:
        # the int16 inputs it sets back to int8 only at quantization stay int16 (Plan.as_calibrated)
        self.calibrated_model = False
        self.real_honour_qtypes = True
        self.session_builds = 0
        self.search_evaluations = 0    # model runs of default's / mix's method comparison (not mix's per-node ones)

    # -- the two sides' values, as attributes -------------------------------------------
    @property
    def model(self) -> LoadedModel:
        return self.side.model

    @property
    def target(self) -> Target:
        return self.side.target

    @property
    def graph(self) -> Graph:
        return self.side.graph

    @property
    def fused(self) -> bool:
        return self.side.fused

    @property
    def weights(self) -> WeightCache:
        return self.side.weights

    @property
    def external(self) -> ExternalWeights:
        return self.side.external

    @property
    def stats(self) -> dict[str, TensorStats]:
        return self.on.stats

    @property
    def thresholds(self) -> ThresholdMemo:
        return self.on.thresholds

    @property
    def data(self) -> DataSet | list[dict[str, np.ndarray]]:
        return self.on.data

    @property
    def dataset(self) -> DataSet:
        """The evaluation files (``data`` may be the samples read into memory)."""
        return self.on.dataset

    @property
    def reference(self) -> list[dict[str, np.ndarray]]:
        return self.on.reference

    @property
    def threads(self) -> int | None:
        return self.on.threads

    @property
    def task_metrics(self) -> list[MetricSpec]:
        return self.on.task_metrics

    @property
    def labels(self) -> LabelSet | None:
        return self.on.labels

    @property
    def calibration_data(self) -> DataSet | None:
        return self.on.calibration_data

    @property
    def float_seconds(self) -> float:
        return self.on.float_seconds

    # -- calibration -------------------------------------------------------------------
    def use_thresholds(self, real: MappedThresholds | None, honour_qtypes: bool = True) -> None:
        """Simulate with hb_mapper's real thresholds (a :class:`~tuner.inputs.calibrated_map.MappedThresholds`
        from its calibrated model) instead of tuner's calibration; None: back to tuner's own.
        ``honour_qtypes``: the real qtypes win over the plan's int8/int16 (see tuner.simulate.realscales)."""
        self.real = real
        self.real_honour_qtypes = honour_qtypes

    def scales(self, calibration: Resolved) -> Scales:
        if calibration not in self._scale_tables:
            if isinstance(calibration, RealCalibration):
                self._scale_tables[calibration] = RealScales(calibration, self.scales(calibration.fallback))
            elif isinstance(calibration, MixedCalibration):
                self._scale_tables[calibration] = MixScales(calibration, self.scales)
            else:
                self._scale_tables[calibration] = ScaleTable(self.stats, calibration, self.thresholds)
        return self._scale_tables[calibration]

    def resolve(self, candidate: Candidate) -> tuple[Resolved, list[str]]:
        """The explicit calibration to simulate; ``default`` and ``mix`` choose theirs as hb_mapper
        does (tuner.simulate.calibrate), once per (nodes, optimization)."""
        cal = candidate.calibration
        if self.real is not None:
            # tuner's scales only for tensors the file does not know: the YAML's method, resolved
            # (default: the method tuner's comparison picks; mix: max)
            real = RealCalibration(self.real, self._fallback(candidate), self.real_honour_qtypes)
            return real, [f"thresholds: hb_mapper's, from {self.real.source} (tuner's {real.fallback.describe()} "
                          "for tensors it does not have)"]
        if cal.type in ("max", "kl"):
            return cal, []
        if cal.type in ("load", "skip"):
            raise TunerError(f"calibration_type {cal.type!r} cannot be simulated (it needs QAT thresholds or uses "
                             "random data); use max, kl, default or mix")
        choice = self.choice(candidate)
        if isinstance(choice, MixedCalibration):
            return choice, choice.notes(len(calibration_nodes(self.plan(candidate))))
        return choice.method, choice.notes()

    def _fallback(self, candidate: Candidate) -> Calibration:
        """The calibration whose thresholds stand in for the real ones where the file has none: the
        YAML's own, ``default`` as tuner resolves it, ``max`` for the others (mix, load, skip)."""
        cal = candidate.calibration
        if cal.type in ("max", "kl"):
            return cal
        if cal.type == "default":
            choice = self.choice(candidate)
            if isinstance(choice, DefaultChoice) and isinstance(choice.method, Calibration):
                return choice.method
        return Calibration("max")

    def choice(self, candidate: Candidate) -> DefaultChoice | MixedCalibration:
        """What ``default`` (a DefaultChoice: the method and every method's score) or ``mix`` (a
        MixedCalibration) chose for this candidate's plan; computed once and kept."""
        kind = candidate.calibration.type
        if kind not in ("default", "mix"):
            raise ValueError(f"calibration_type {kind!r} has no search")
        key = (kind, candidate.nodes, candidate.optimization)
        if key not in self._choices:
            seen: dict[Calibration, float] = {}

            def score(method: Calibration) -> float:
                # hmct's comparison scores a per-channel method exactly as its per-tensor twin (observed by
                # wrapping it: every twin tied; its per-channel kl runs the per-tensor kernel), so the twin's
                # score is reused and the tie rule decides between them
                twin = dataclasses.replace(method, per_channel=False)
                if twin not in seen:
                    seen[twin] = self._search_score(candidate, twin)
                return seen[twin]
            if kind == "default":
                self._choices[key] = choose_default(score)
            else:
                plan = self.plan(candidate)
                self._choices[key] = choose_mix(score, calibration_nodes(plan),
                                                lambda tensor, method: self._node_score(plan, tensor, method))
            self.thresholds.flush()
        return self._choices[key]

    def _search_score(self, candidate: Candidate, method: Calibration) -> float:
        """The model-wise score of ``candidate`` under ``method`` (tuner.simulate.calibrate.search_score)."""
        samples, refs = self.on.search_set()
        # hmct compares the methods on its calibrated model, whose table ops are the graph's float ops (a
        # HardSigmoid keeps its alpha: Plan.bpu_tables)
        plan = dataclasses.replace(self.plan(candidate), bpu_tables=False)
        # a per-channel method is compared as plain per-channel fake quant, not as deployed (docs/hb_rules/quantizer.md §1.5)
        session = self._session(candidate.with_calibration(method), method, plan, [], plain=method.per_channel)
        names = self.model.output_names
        outs = [dict(zip(names, session.run(names, x))) for x in samples]
        self.search_evaluations += 1
        return search_score(refs, outs)

    def _node_score(self, plan: Plan, tensor: str, method: Calibration) -> float:
        """mix's sensitivity of one calibration node: the output score with only that node
        quantized under ``method``, on MIX_SENSITIVITY_SAMPLES sample(s). One session each (not
        kept: there is one per node and method)."""
        samples, refs = self.on.search_set()
        samples, refs = samples[:MIX_SENSITIVITY_SAMPLES], refs[:MIX_SENSITIVITY_SAMPLES]
        one = dataclasses.replace(single_node_plan(plan, tensor), bpu_tables=False)   # on hmct's calibrated model
        session = self.side.session(self.side.build(one, self.scales(method), self._build_memo))
        self.session_builds += 1
        names = self.model.output_names
        return search_score(refs, [dict(zip(names, session.run(names, x))) for x in samples])

    # -- evaluation --------------------------------------------------------------------
    def plan(self, candidate: Candidate, calibration: Resolved | None = None) -> Plan:
        """The candidate's plan; under real thresholds whose qtypes are honoured (``eval --thresholds``),
        with hb_mapper's quantization points from its calibrated model (realscales.real_plan)."""
        plan = make_plan(self.graph, self.target, candidate)
        if self.calibrated_model:
            plan = plan.as_calibrated()
        if isinstance(calibration, RealCalibration):
            plan = real_plan(plan, self.graph, calibration.real) if calibration.honour_qtypes \
                else without_real_rules(plan, calibration.real)
        return plan

    def evaluate(self, candidate: Candidate, per_node: bool = False, per_sample: bool = False,
                 split: bool = False) -> Evaluation:
        """``per_sample``: also each sample's output figures (``Evaluation.samples``), for the
        worst case next to the pooled mean. ``split``: for data with an image ``input_type_rt``, the
        loss split into the input path alone and the network alone (``Evaluation.split``; the outputs
        stay the two together); nothing for other data. Its cost is one float pass per data set
        (SimData.path_split) and one more comparison per output: eval and the report ask for it, a
        search does not."""
        t0 = time.perf_counter()
        calibration, notes = self.resolve(candidate)
        ev = self._run(candidate, calibration, per_node, per_sample, split)
        self.thresholds.flush()
        ev.notes = notes + ev.plan.notes
        ev.seconds = time.perf_counter() - t0
        return ev

    def tensors(self, candidate: Candidate, names: list[str], sample: dict[str, np.ndarray],
                plain: bool = False) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(simulated, float) values of ``names`` on one sample: for debugging and tests. ``plain``:
        in default's comparison model of a per-channel method (qdq.build_sim_model)."""
        calibration, _ = self.resolve(candidate)
        plan = self.plan(candidate, calibration)
        raw = {t: f"{t}__raw" for t in plan.outputs}
        session = self._session(candidate, calibration, plan, list(names), plain=plain)
        sim_names = [raw.get(t, t) if t not in self.model.output_names else t for t in names]
        sim = dict(zip(names, session.run(sim_names, sample)))
        ref = make_session(with_outputs(self.model.proto, list(names))).run(list(names), sample)
        return sim, dict(zip(names, ref))

    def _session(self, candidate: Candidate, calibration: Resolved, plan: Plan,
                 extra: list[str], plain: bool = False) -> ort.InferenceSession:
        """``plain``: default's comparison model of a per-channel method (qdq.build_sim_model)."""
        key = (candidate.nodes, candidate.optimization, calibration, tuple(extra), plain, plan.bpu_tables)
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        session = self.side.session(self.side.build(plan, self.scales(calibration), self._build_memo, extra, plain))
        self.session_builds += 1
        self._sessions[key] = session
        while len(self._sessions) > self._session_cache:
            self._sessions.popitem(last=False)
        return session

    def _run(self, candidate: Candidate, calibration: Resolved, per_node: bool,
             per_sample: bool = False, split: bool = False) -> Evaluation:
        plan = self.plan(candidate, calibration)
        extra = [n.outputs[0] for n in self.graph
                 if n.outputs and self.graph.is_activation(n.outputs[0])] if per_node else []
        if per_node:   # a BPU Softmax's parts are rows of their own, as in hb_mapper's table
            extra += [t for name in plan.softmax for t in softmax_tensors(name)]
        session = self._session(candidate, calibration, plan, extra)
        outputs = self.model.output_names
        raw = {t: f"{t}__raw" for t in plan.outputs}
        sim_names = outputs + [raw.get(t, t) for t in extra if t not in outputs]
        sims = {o: Similarity() for o in outputs}
        node_sims = {t: Similarity() for t in extra}
        task = self.on.task_score()
        samples: list[dict[str, dict[str, float]]] = []
        path = self.on.path_split() if split else None
        net_sims = {o: Similarity() for o in outputs}
        net_task = self.on.task_score() if path is not None else None
        if per_node:
            float_nodes = self.side.float_nodes(tuple(extra), bool(plan.softmax))
            refs = run_samples(float_nodes, extra, self.data, self.threads)
        data = self.on.board_samples(self._board_steps(plan, calibration)) if self.on.has_input_path else self.data
        for i, outs in enumerate(run_samples(session, sim_names, data, self.threads)):
            values = dict(zip(sim_names, outs))
            # per_sample: each sample's own sums, merged into the pooled ones (one pass over the arrays)
            one = {o: Similarity() for o in outputs} if per_sample else sims
            for o in outputs:
                one[o].update(self.reference[i][o], values[o], self.on.ref_sq(i, o))
                if per_sample:
                    sims[o].merge(one[o])
                if not sims[o].finite:
                    raise FloatingPointError(f"the simulated model produced non-finite values at output {o!r}")
            if per_sample:
                samples.append({o: s.as_dict() for o, s in one.items()})
            if task is not None:
                task.update(self.reference[i], {o: values[o] for o in outputs}, self.on.label(i))
            if path is not None:   # the network alone: against the float model fed the same path values
                for o in outputs:
                    net_sims[o].update(path.reference[i][o], values[o], path.ref_sq[i][o])
                if net_task is not None:
                    net_task.update(path.reference[i], {o: values[o] for o in outputs}, self.on.label(i))
            if per_node:
                ref = dict(zip(extra, next(refs)))
                for t in extra:
                    node_sims[t].update_cosine(ref[t], values[t] if t in outputs else values[raw.get(t, t)])
        ev = Evaluation(candidate=candidate, calibration=calibration,
                        outputs={o: s.as_dict() for o, s in sims.items()}, plan=plan,
                        task=task.results() if task is not None else {}, samples=samples)
        if per_node:
            ev.nodes = self._rows(plan, calibration, node_sims)
        if path is not None:
            ev.split = {"input_path": {"outputs": path.outputs, "task": path.task},
                        "network": {"outputs": {o: s.as_dict() for o, s in net_sims.items()},
                                    "task": net_task.results() if net_task is not None else {}}}
        return ev

    def _board_steps(self, plan: Plan, calibration: Resolved) -> dict[str, tuple[float, np.floating]]:
        """(threshold, float32 step) of each model input the plan quantizes to int8 per tensor: where hb's
        quantized preprocess node requantizes an image input (SimData.board_samples). None for hb's
        calibrated model (``calibrated_model``), whose preprocess output is fake-quantized as any tensor."""
        if self.calibrated_model:
            return {}
        dtypes: dict[str, set[str]] = {}
        for tensor, dtype in plan.edges.values():
            dtypes.setdefault(tensor, set()).add(dtype)
        steps: dict[str, tuple[float, np.floating]] = {}
        for name in self.model.input_names:
            if dtypes.get(name) == {"int8"}:
                s = self.scales(calibration).get(name, "int8")
                if s.per_tensor_symmetric:
                    steps[name] = (s.threshold, np.float32(s.scale))
        return steps

    def score(self, outputs: list[dict[str, np.ndarray]]
              ) -> tuple[dict[str, dict[str, float]], dict[str, float], list[dict[str, dict[str, float]]]]:
        """Another model's outputs on this simulator's data, scored as :meth:`evaluate` scores its own
        (SimData.score). The real tool's quantized model is compared with the simulation this way
        (tuner.toolchain.realrun)."""
        return self.on.score(outputs)

    def float_task(self) -> dict[str, float]:
        """The task metrics of the float model itself on this data (SimData.float_task)."""
        return self.on.float_task()

    def _softmax_rows(self, node: Node, plan: Plan, scales: Scales, sims: dict[str, Similarity], x_threshold: float | None
                      ) -> list[NodeRow]:
        """A BPU Softmax's six rows, under the names and op types of hb_mapper's table."""
        dtype = plan.softmax[node.name]
        m, d, e, s, r = softmax_tensors(node.name)
        y = node.outputs[0]
        ops = ("ReduceMax", "Sub", "Exp", "ReduceSum", "Reciprocal", "Mul")
        outs = (m, d, e, s, r, y)
        ins = (None, None, d, e, s, e)   # the input whose threshold the row shows (None: the Softmax's own)
        rows = []
        for part, op, out, src in zip(SOFTMAX_PARTS, ops, outs, ins):
            thr = x_threshold if src is None else scales.threshold(src, dtype)
            rows.append(NodeRow(name=softmax_part(node.name, part), op_type=op, on="BPU",
                                subgraph=plan.subgraph.get(node.name),
                                cosine=sims[out].cosine if out in sims else None, threshold=thr, in_dtype=dtype,
                                out_dtype=plan.out_dtype[node.name] if part == "mul" else dtype))
        return rows

    def _rows(self, plan: Plan, calibration: Resolved,
              sims: dict[str, Similarity]) -> list[NodeRow]:
        scales = plan_scales(self.scales(calibration), plan)
        # a per-channel input: hb's table prints its channel 0's threshold (PP-OCRv4 under per_channel:
        # p2o.Conv.3 reads p2o.Add.15 at 5.5824, the tensor's own 46.45 over channel 0's scale 8.3208)
        per_channel = channel_scales(self.graph, plan, self.stats, self._build_memo) \
            if isinstance(calibration, Calibration) and calibration.per_channel else {}
        rows = []
        for node in self.graph:
            # the input's threshold as hb's table prints it: the tensor whose statistics it is quantized
            # with (shared thresholds, same-scale ops: plan.scale_of), or the grid a passive op kept
            quantized = [q for k, _ in self.graph.data_inputs(node)
                         if (q := plan.edges.get((node.name, k)) or plan.passthrough.get((node.name, k)))]
            thr = scales.threshold(plan.scale_of.get(quantized[0][0], quantized[0][0]), quantized[0][1]) \
                if quantized else None
            if thr is not None and quantized[0][0] in per_channel:
                t = quantized[0][0]
                thr = channelwise(scales.get(t, quantized[0][1]), per_channel[t], channel_top(self.stats, t)).threshold \
                    / float(per_channel[t][0])
            out = node.outputs[0] if node.outputs else None
            if node.name in plan.softmax:
                rows.extend(self._softmax_rows(node, plan, scales, sims, thr))
                continue
            rows.append(NodeRow(name=node.name, op_type=node.op_type, on=plan.placement[node.name],
                                subgraph=plan.subgraph.get(node.name),
                                cosine=sims[out].cosine if out in sims else None, threshold=thr,
                                in_dtype=plan.in_dtype[node.name], out_dtype=plan.out_dtype[node.name]))
        return rows
