"""Candidate + cached statistics -> outputs of the simulated quantized model, scored.

Set-up does the expensive, candidate-independent work once: the float reference outputs on
the evaluation data and the fake-quantized weights. ``evaluate(candidate)`` then builds the
candidate's fake-quant graph in memory from cached scales, opens one onnxruntime session for it
(kept in a small LRU cache, so repeated candidates cost nothing to set up) and streams the
evaluation data through it once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from tuner.calib.stats import TensorStats
from tuner.calib.thresholds import ThresholdMemo
from tuner.candidate import Calibration, Candidate
from tuner.errors import TunerError
from tuner.graph import Graph, Target
from tuner.inputs.data import DataSet
from tuner.inputs.model import LoadedModel
from tuner.metrics import Similarity
from tuner.metrics.task import TaskScore, load_user_metrics
from tuner.simulate import fakequant
from tuner.simulate.plan import Plan, make_plan
from tuner.simulate.qdq import ExternalWeights, WeightCache, build_sim_model, weight_axis
from tuner.simulate.scales import ScaleTable
from tuner.simulate.session import make_session, run_samples, with_outputs

#: Evaluation inputs up to this size stay in memory after set-up (beyond it they are streamed from disk).
SAMPLE_CACHE_BYTES = 512 * 2**20

#: What hb_mapper's ``default`` tries (horizon_nn 1.1.0 log, reference 6.1), best output cosine wins.
DEFAULT_GRID = tuple(Calibration(type=t, max_percentile=p, per_channel=pc)
                     for t, p in (("max", None), ("max", 0.99995), ("kl", None)) for pc in (False, True))


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
    calibration: Calibration                      # the explicit calibration that was simulated
    outputs: dict[str, dict[str, float]]
    plan: Plan
    task: dict[str, float] = field(default_factory=dict)     # task metrics by spec text ("miou:seg")
    nodes: list[NodeRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mean_cosine(self) -> float:
        return float(np.mean([m["cosine"] for m in self.outputs.values()]))

    def counts(self) -> dict[str, int]:
        int16 = sum(1 for n in self.plan.placement if self.plan.in_dtype.get(n) == "int16"
                    or self.plan.out_dtype.get(n) == "int16")
        return {"subgraphs": self.plan.n_subgraphs, "cpu_nodes": len(self.plan.cpu_nodes), "int16_nodes": int16}


class Simulator:
    """Evaluates candidates of one model on one data set. Not thread-safe; one per process."""

    def __init__(self, model: LoadedModel, target: Target, stats: dict[str, TensorStats], data: DataSet,
                 threads: int | None = None, session_cache: int = 4, thresholds: ThresholdMemo | None = None,
                 task_metrics: list | None = None, labels=None, user_base=None):
        self.model = model
        self.target = target
        self.stats = stats
        self.thresholds = thresholds or ThresholdMemo(stats)
        self.data: DataSet | list[dict[str, np.ndarray]] = data   # the samples, in memory once read (below)
        self.threads = threads  # samples run in parallel (each session single-threaded)
        self.task_metrics = list(task_metrics or [])   # tuner.metrics.task.MetricSpec
        self.labels = labels                           # tuner.metrics.task.LabelSet or None
        self.user_fns = load_user_metrics(self.task_metrics, user_base)
        self.graph = Graph(model.proto, model.names)
        # One FakeQuant node per quantization point when its kernel builds here, else Q/DQ pairs
        # (same values, bit for bit; tuner.simulate.fakequant).
        self.fused = fakequant.library() is not None
        self.weights = WeightCache()
        self.external = ExternalWeights()
        self._build_memo: dict = {}   # Q/DQ and bias protos shared by the builds (tuner.simulate.qdq)
        self._sessions: OrderedDict[tuple, ort.InferenceSession] = OrderedDict()
        self._session_cache = session_cache
        self._default_choice: dict[tuple, Calibration] = {}
        self._scale_tables: dict[Calibration, ScaleTable] = {}
        self.session_builds = 0
        # Weights do not depend on the candidate: fake-quantize them all once, here.
        for node in self.graph:
            if node.op_type in target.weight_ops:
                idx, axis = target.weight_ops[node.op_type]
                if len(node.inputs) > idx and node.inputs[idx] in self.graph.initializers:
                    self.weights.get(self.graph.initializers[node.inputs[idx]], weight_axis(node.proto, node.op_type, axis))
        t0 = time.perf_counter()
        float_session = make_session(model.proto)
        names = model.output_names
        # Kept in memory with their labels (when they fit SAMPLE_CACHE_BYTES) so that each
        # evaluation does not read, check and preprocess every file again: 7.5 ms of a 125 ms
        # evaluation on the example model.
        self.reference = []
        samples: list | None = []
        self._labels: list[dict[str, np.ndarray]] | None = [] if labels is not None else None
        room = SAMPLE_CACHE_BYTES
        for i, (sample, outs) in enumerate(run_samples(float_session, names, data, threads, with_inputs=True)):
            self.reference.append(dict(zip(names, outs)))
            if samples is not None:
                room -= sum(v.nbytes for v in sample.values())
                label = labels.sample(i) if labels is not None and room >= 0 else {}
                room -= sum(v.nbytes for v in label.values())
                if room >= 0:
                    samples.append(sample)
                    if self._labels is not None:
                        self._labels.append(label)
                else:
                    samples = self._labels = None
        if samples is not None:
            self.data = samples
        self._ref_sq = [{o: Similarity.square_sum(v) for o, v in ref.items()} for ref in self.reference]
        self.float_seconds = time.perf_counter() - t0

    # -- calibration -------------------------------------------------------------------
    def scales(self, calibration: Calibration) -> ScaleTable:
        if calibration not in self._scale_tables:
            self._scale_tables[calibration] = ScaleTable(self.stats, calibration, self.thresholds)
        return self._scale_tables[calibration]

    def resolve(self, candidate: Candidate) -> tuple[Calibration, list[str]]:
        """The explicit calibration to simulate; ``default`` (and ``mix``) search like hb_mapper."""
        cal = candidate.calibration
        if cal.type in ("max", "kl"):
            return cal, []
        if cal.type in ("load", "skip"):
            raise TunerError(f"calibration_type {cal.type!r} cannot be simulated (it needs QAT thresholds or uses "
                             "random data); use max, kl or default")
        notes = []
        if cal.type == "mix":
            notes.append("calibration_type mix is simulated as default (per-node method mixing is not modelled)")
        key = (candidate.nodes, candidate.optimization)
        if key not in self._default_choice:
            best, best_cos = None, -np.inf
            for option in DEFAULT_GRID:
                ev = self._run(candidate.with_calibration(option), option, per_node=False)
                if ev.mean_cosine > best_cos:
                    best, best_cos = option, ev.mean_cosine
            self._default_choice[key] = best
        chosen = self._default_choice[key]
        notes.append(f"default calibration: Select {chosen.describe()} method.")
        return chosen, notes

    # -- evaluation --------------------------------------------------------------------
    def plan(self, candidate: Candidate) -> Plan:
        return make_plan(self.graph, self.target, candidate)

    def evaluate(self, candidate: Candidate, per_node: bool = False) -> Evaluation:
        t0 = time.perf_counter()
        calibration, notes = self.resolve(candidate)
        ev = self._run(candidate, calibration, per_node)
        self.thresholds.flush()
        ev.notes = notes + ev.plan.notes
        ev.seconds = time.perf_counter() - t0
        return ev

    def tensors(self, candidate: Candidate, names: list[str], sample: dict) -> tuple[dict, dict]:
        """(simulated, float) values of ``names`` on one sample: for debugging and tests."""
        calibration, _ = self.resolve(candidate)
        plan = self.plan(candidate)
        raw = {t: f"{t}__raw" for t in plan.outputs}
        session = self._session(candidate, calibration, plan, list(names))
        sim_names = [raw.get(t, t) if t not in self.model.output_names else t for t in names]
        sim = dict(zip(names, session.run(sim_names, sample)))
        ref = make_session(with_outputs(self.model.proto, list(names))).run(list(names), sample)
        return sim, dict(zip(names, ref))

    def _session(self, candidate: Candidate, calibration: Calibration, plan: Plan,
                 extra: list[str]) -> ort.InferenceSession:
        key = (candidate.nodes, candidate.optimization, calibration, tuple(extra))
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        proto = build_sim_model(self.model.proto, self.graph, self.target, plan, self.scales(calibration),
                                self.weights, extra_outputs=extra, external=self.external, memo=self._build_memo,
                                fused=self.fused)
        session = make_session(proto, external=self.external)
        self.session_builds += 1
        self._sessions[key] = session
        while len(self._sessions) > self._session_cache:
            self._sessions.popitem(last=False)
        return session

    def _run(self, candidate: Candidate, calibration: Calibration, per_node: bool) -> Evaluation:
        plan = self.plan(candidate)
        extra = [n.outputs[0] for n in self.graph
                 if n.outputs and self.graph.is_activation(n.outputs[0])] if per_node else []
        session = self._session(candidate, calibration, plan, extra)
        outputs = self.model.output_names
        raw = {t: f"{t}__raw" for t in plan.outputs}
        sim_names = outputs + [raw.get(t, t) for t in extra if t not in outputs]
        sims = {o: Similarity() for o in outputs}
        node_sims = {t: Similarity() for t in extra}
        task = TaskScore(self.task_metrics, self.user_fns) if self.task_metrics else None
        if per_node:
            float_nodes = make_session(with_outputs(self.model.proto, extra))
            refs = run_samples(float_nodes, extra, self.data, self.threads)
        for i, outs in enumerate(run_samples(session, sim_names, self.data, self.threads)):
            values = dict(zip(sim_names, outs))
            for o in outputs:
                sims[o].update(self.reference[i][o], values[o], self._ref_sq[i][o])
                if not sims[o].finite:
                    raise FloatingPointError(f"the simulated model produced non-finite values at output {o!r}")
            if task is not None:
                task.update(self.reference[i], {o: values[o] for o in outputs}, self._label(i))
            if per_node:
                ref = dict(zip(extra, next(refs)))
                for t in extra:
                    node_sims[t].update(ref[t], values[t] if t in outputs else values[raw.get(t, t)])
        ev = Evaluation(candidate=candidate, calibration=calibration,
                        outputs={o: s.as_dict() for o, s in sims.items()}, plan=plan,
                        task=task.results() if task is not None else {})
        if per_node:
            ev.nodes = self._rows(plan, calibration, node_sims)
        return ev

    def _label(self, i: int) -> dict[str, np.ndarray] | None:
        """Sample ``i``'s labels: from memory when set-up kept them (fresh copies, as a read gives:
        a user metric may write into its labels), else read again."""
        if self._labels is not None:
            return {k: v.copy() for k, v in self._labels[i].items()}
        return self.labels.sample(i) if self.labels is not None else None

    def _rows(self, plan: Plan, calibration: Calibration, sims: dict[str, Similarity]) -> list[NodeRow]:
        scales = self.scales(calibration)
        rows = []
        for node in self.graph:
            quantized = [plan.edges[(node.name, k)] for k, _ in self.graph.data_inputs(node)
                         if (node.name, k) in plan.edges]
            thr = scales.threshold(*quantized[0]) if quantized else None
            out = node.outputs[0] if node.outputs else None
            rows.append(NodeRow(name=node.name, op_type=node.op_type, on=plan.placement[node.name],
                                subgraph=plan.subgraph.get(node.name),
                                cosine=sims[out].cosine if out in sims else None, threshold=thr,
                                in_dtype=plan.in_dtype[node.name], out_dtype=plan.out_dtype[node.name]))
        return rows
