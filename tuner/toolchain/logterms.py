"""tuner's figures on the terms of hb_mapper's log, so that the two can be compared.

hb_mapper prints its per-node and output tables from its fake-quant calibrated model against
the same model with calibration switched off, run on ``calibration_dataset.get_data()`` — the
first calibration sample(s) — with its own cosine (eps 1e-5) and distances
(:mod:`tuner.metrics.hb`). tuner's usual figure, a plain cosine pooled over the evaluation
data, answers another question and can differ from it by more than the simulation error.
:func:`compare_with_log` therefore simulates the YAML on the first :data:`LOG_SAMPLES`
calibration sample(s), scores it with hb_mapper's formulas, and pairs that with the log; the
pooled figure on the evaluation data stays as a secondary column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from tuner.candidate import Calibration, Candidate
from tuner.inputs.data import dataset_from_config
from tuner.metrics import HbDistances, Similarity
from tuner.simulate import Evaluation, Simulator
from tuner.toolchain.compare import Comparison
from tuner.toolchain.hblog import HbLog

#: How many calibration samples hb_mapper's printed tables are computed on. Inferred, not seen:
#: the reporter (file id 24226422292) runs ``calibration_dataset.get_data()``, which the model
#: builder (24861267739) passes on; that is most likely the first sample (see
#: docs/hb_rules/quantizer.md §4.3).
LOG_SAMPLES = 1

#: What the compared "sim" figures are, said in the reports.
TERMS = (("tuner on the first calibration sample" if LOG_SAMPLES == 1 else
          f"tuner on the first {LOG_SAMPLES} calibration samples")
         + ", hb cosine with eps 1e-5, as hb_mapper computes its table")


@dataclass
class LogFigures:
    """One candidate simulated on the log's terms."""

    evaluation: Evaluation                 # per-node rows (placement, dtypes, thresholds), LOG_SAMPLES samples
    nodes: dict[str, HbDistances]          # node -> hb figures of its (first) output
    outputs: dict[str, HbDistances]        # model output -> hb figures
    samples: int
    producers: dict[str, str]              # model output -> the node computing it (old logs name outputs so)


def log_simulator(ws) -> Simulator:
    """A simulator of the workspace's model on its first LOG_SAMPLES calibration samples (the
    workspace's calibration statistics and thresholds, so every threshold is the same), of hb's
    calibrated model (int16 that hb drops only at quantization kept: Plan.as_calibrated)."""
    data = dataset_from_config(ws.config.inputs, ws.model.input_shapes, limit=LOG_SAMPLES)
    data.hb_reference = True      # an input path: the log compares with hb's float model, which includes it
    sim = Simulator(ws.model, ws.target, ws.stats, data, ws.threads, thresholds=ws.thresholds,
                    model_side=ws.model_side())
    sim.calibrated_model = True   # the log's tables are computed on hb's calibrated model
    return sim


def log_figures(sim: Simulator, candidate: Candidate) -> LogFigures:
    """``candidate`` on ``sim``'s samples, each tensor scored as hb_mapper scores it."""
    ev = sim.evaluate(candidate, per_node=True)
    # ``default`` resolved once, on these samples (a resolved calibration keys a candidate as a Calibration does)
    explicit = candidate.with_calibration(cast(Calibration, ev.calibration))
    outputs = list(sim.model.output_names)
    # the tensors and order Simulator._run uses for per_node, so its session is reused
    names = [n.outputs[0] for n in sim.graph if n.outputs and sim.graph.is_activation(n.outputs[0])]
    names += [o for o in outputs if o not in names]
    acc = {t: Similarity() for t in names}
    samples = 0
    for sample in sim.data:
        q, ref = sim.tensors(explicit, names, sample)
        for t in names:
            acc[t].update(ref[t], q[t])
        samples += 1
    figures = {t: HbDistances.from_similarity(s) for t, s in acc.items() if s.count}
    nodes = {n.name: figures[n.outputs[0]] for n in sim.graph if n.outputs and n.outputs[0] in figures}
    producers = {o: sim.graph.producer[o].name for o in outputs if o in sim.graph.producer}
    return LogFigures(evaluation=ev, nodes=nodes, outputs={o: figures[o] for o in outputs if o in figures},
                      samples=samples, producers=producers)


def compare_with_log(log_sim: Simulator, candidate: Candidate, log: HbLog,
                     pooled_sim: Simulator | None = None, pooled_data: str = "evaluation data") -> Comparison:
    """The comparison of ``candidate`` with ``log`` on the log's terms (``log_sim`` from
    :func:`log_simulator`); with ``pooled_sim``, each output's pooled cosine on that simulator's
    data (same calibration) as a secondary figure."""
    figures = log_figures(log_sim, candidate)
    pooled = None
    if pooled_sim is not None:
        pooled = pooled_sim.evaluate(candidate.with_calibration(cast(Calibration, figures.evaluation.calibration)))
    return Comparison.build(figures.evaluation, log, figures=figures, pooled=pooled,
                            terms=TERMS, pooled_data=pooled_data,
                            pooled_samples=len(pooled_sim.reference) if pooled_sim is not None else None,
                            producers=figures.producers)
