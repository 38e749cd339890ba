"""Choose the calibration of ``calibration_type: default`` and ``mix`` the way hb_mapper does.

One role: given a way to score a method (or one node under a method), pick what horizon_nn
1.1.0 (the X5 quantizer) would pick. Running models is the caller's (``Simulator``); this module
only orders, compares and stops, so every rule here can be read against its source
(docs/hb_rules/quantizer.md and its source ids; "quantizer.md §N" below).

``default`` [quantizer.md §2.1-2.2; src 24313449169 InferThresholds, 24131963830 ModelWiseSearch]:

1. stage 1: per-tensor symmetric ``max``, ``max-percentile`` 0.99995 and ``kl``; if the best
   score reaches ``SIMILARITY_TARGET`` (0.995) the search stops: per-channel thresholds are never
   computed and asymmetric ones never copied, so none of those methods is even evaluated;
2. otherwise the per-channel and asymmetric variants join: 12 methods in all, and the best of
   all of them is selected (``Select <method> method.``).

The score [quantizer.md §2.2; src 24444917129, 24395647999, 24304915993]: cosine per output per sample
(each flattened; ``dot / (max(|a|, 1e-8) max(|b|, 1e-8))``, see :func:`search_cosine`), averaged
over samples, then over outputs; on ``calibration_dataset.get_data()``.
That the data are the *first* ``DEFAULT_SEARCH_SAMPLES = 1`` calibration sample is **inferred**
(strongly, quantizer.md §2.2): the type hint of ``get_data`` is one array per input, the same call feeds
the one-shot forward of the final report, and the docs say the search uses the first sample.
A per-channel method is scored as horizon_nn scores it [quantizer.md §1.5: "during default's comparison
the per-channel candidates are evaluated without equalization"]: plain per-channel fake quant on
every calibration node and unscaled max-calibrated weights (``qdq.build_sim_model(...,
plain_per_channel=True)``), not the equalization it deploys, so the method chosen can deploy worse
than it scored. Ties keep the alphabetical order of the method strings (``kl...`` < ``max`` < ``max-percentile...``
< ``max:...``); NaN scores go last.

``mix`` [quantizer.md §2.3; src 24273942193 MixCalibrater]: the base is the best of the three stage-1
methods by the same score; under the base, each calibration node's sensitivity is the output
cosine of the model with *only that node* quantized (every other node and the weights float), on
one sample (``data_num=1``); nodes below ``MIX_SENSITIVE_BELOW`` (0.999) are sensitive and each
takes the method, among the three, whose single-node cosine is best; the others keep the base.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tuner.candidate import Calibration
from tuner.simulate.plan import Plan
from tuner.simulate.scales import Scale, Scales

#: ``modelwise_search.similarity`` of ``default`` [quantizer.md §2.1; src 24160279619, log 49159607575]:
#: stage 1 stops when its best score reaches it.
SIMILARITY_TARGET = 0.995
#: Calibration samples the model-wise comparison (and mix's ranking) runs on. **Inferred**, strongly
#: [quantizer.md §2.2; src 24131963830, 24313449169 call ``calibration_dataset.get_data()``]: one sample.
DEFAULT_SEARCH_SAMPLES = 1
#: Samples of mix's per-node sensitivity (``get_sensitivity_of_nodes(..., data_num=1)``) [src 24273942193].
MIX_SENSITIVITY_SAMPLES = 1
#: mix: nodes whose single-node cosine is below this are sensitive (``cosine_threshold_for_topk``).
MIX_SENSITIVE_BELOW = 0.999
#: The model-wise cosine clamps each norm to at least this (src 24304915993).
NORM_FLOOR = 1e-8

#: Stage 1 of default, and mix's three candidates, in the order mix's source lists them
#: (``max``, ``max-percentile`` 0.99995, ``kl``; src 24273942193).
PER_TENSOR_METHODS = (Calibration("max"), Calibration("max", 0.99995), Calibration("kl"))
#: Stage 2 of default: the per-channel and asymmetric variants (9; 12 with stage 1) [quantizer.md §2.1].
VARIANT_METHODS = tuple(replace(m, per_channel=pc, asymmetric=asym) for m in PER_TENSOR_METHODS
                        for pc in (False, True) for asym in (False, True) if pc or asym)
DEFAULT_METHODS = PER_TENSOR_METHODS + VARIANT_METHODS


def search_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine the model-wise comparison uses, of two tensors flattened:
    dot / (max(|a|, 1e-8) * max(|b|, 1e-8)) (horizon_nn ``Loss.CosineSimilarity``, src 24304915993,
    called by ``calculate_models_similarities``, src 24395647999).

    Not the ``(dot + 1e-5) / (|a||b| + 1e-5)`` of quantizer.md §4.3: that one is the cosine of the printed
    per-node and output tables (src 24861267739). The two agree to ~1e-5 / (|a||b|) on any real
    output; they differ for an all-zero output (0 here, 1 there). NaN when a value is not finite
    (such a method is ranked last, not raised on)."""
    x = np.asarray(a, np.float64).ravel()
    y = np.asarray(b, np.float64).ravel()
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return math.nan
    dot = float(np.einsum("i,i->", x, y))
    nx = max(math.sqrt(float(np.einsum("i,i->", x, x))), NORM_FLOOR)
    ny = max(math.sqrt(float(np.einsum("i,i->", y, y))), NORM_FLOOR)
    return dot / (nx * ny)


def search_score(references: Sequence[dict[str, np.ndarray]], outputs: Sequence[dict[str, np.ndarray]]) -> float:
    """The model-wise score of one method: cosine per output per sample, mean over the samples,
    then mean over the outputs (``Loss._run_dict``) [quantizer.md §2.2, src 24304915993].
    ``references[i]`` and ``outputs[i]`` map output names to sample i's float and simulated values."""
    if not references:
        raise ValueError("no samples to score on")
    names = list(references[0])
    per_output = [np.mean([search_cosine(ref[o], out[o]) for ref, out in zip(references, outputs)]) for o in names]
    return float(np.mean(per_output))


def rank(scores: dict[Calibration, float]) -> list[Calibration]:
    """Methods best first, as ``compare_calibration_methods`` sorts them: by score, ties in the
    alphabetical order of their method strings, NaN last [quantizer.md §2.2]."""
    def key(m: Calibration) -> tuple[bool, float, str]:
        s = scores[m]
        return (math.isnan(s), -s if not math.isnan(s) else 0.0, m.describe())
    return sorted(scores, key=key)


@dataclass(frozen=True)
class DefaultChoice:
    """What ``default`` selected, and every method it evaluated (in evaluation order)."""

    method: Calibration
    scores: tuple[tuple[Calibration, float], ...]

    @property
    def stopped_at_stage1(self) -> bool:
        return len(self.scores) == len(PER_TENSOR_METHODS)

    def notes(self) -> list[str]:
        """hb's log lines (modelwise_search.py): the Select line, then the per-channel and
        asymmetric lines when the selected method has them."""
        notes = [f"default calibration: Select {self.method.describe()} method."]
        if self.method.per_channel:
            notes.append("Perchannel quantization is enabled.")
        if self.method.asymmetric:
            notes.append("Asymmetric quantization is enabled.")
        if self.undecided:
            notes.append(f"default calibration: every method scored {self.scores[0][1]:.6g} on the first calibration "
                         "sample, so the choice fell to the alphabetical tie rule; hb_mapper compares on that one "
                         "sample too: put a representative sample first (files are read in name order), or name "
                         "the method (calibration_type: max or kl)")
        return notes

    @property
    def undecided(self) -> bool:
        """All 12 methods scored the same (e.g. 0: the float output is ~0 on the first calibration
        sample, an image with nothing to detect), so the scores decided nothing. Three stage-1
        methods that tie at or above the target are no such case: they reached it alike."""
        values = [v for _, v in self.scores]
        return not self.stopped_at_stage1 and all(v == values[0] for v in values)


def choose_default(score: Callable[[Calibration], float], target: float = SIMILARITY_TARGET) -> DefaultChoice:
    """``default`` as InferThresholds + ModelWiseSearch run it (see the module docstring).

    ``score(method)`` is the model-wise score of the candidate under ``method``; it is called
    once per evaluated method: 3 times when stage 1 reaches ``target``, else 12."""
    scores = {m: score(m) for m in PER_TENSOR_METHODS}
    best = rank(scores)[0]
    if not scores[best] >= target:           # a NaN best goes on too
        scores.update((m, score(m)) for m in VARIANT_METHODS)
        best = rank(scores)[0]
    return DefaultChoice(method=best, scores=tuple(scores.items()))


@dataclass(frozen=True)
class MixedCalibration:
    """The outcome of ``mix``: a base method, and the calibration nodes (tensors) that take another.

    Hashable and compared on ``base`` and ``merged`` only, so it keys session and scale caches
    like a :class:`~tuner.candidate.Calibration`. ``merge_info`` holds hb's "Merge_Info" table:
    every sensitive node with its single-node cosine under each method (base first)."""

    base: Calibration
    merged: tuple[tuple[str, Calibration], ...] = ()          # (tensor, method), sorted by tensor
    merge_info: tuple[tuple[str, tuple[tuple[Calibration, float], ...]], ...] = field(default=(), compare=False)
    ranking: tuple[tuple[Calibration, float], ...] = field(default=(), compare=False)   # step 1: the 3 methods

    type = "mix"
    per_channel = False       # mix never tries per-channel or asymmetric methods [quantizer.md §2.3]
    asymmetric = False

    @property
    def max_percentile(self) -> float | None:
        return self.base.max_percentile

    def method_for(self, tensor: str) -> Calibration:
        for t, m in self.merged:
            if t == tensor:
                return m
        return self.base

    def methods(self) -> tuple[Calibration, ...]:
        return tuple(dict.fromkeys([self.base] + [m for _, m in self.merged]))

    def describe(self) -> str:
        text = f"mix:base={self.base.describe()}"
        if self.merged:
            counts: dict[str, int] = {}
            for _, m in self.merged:
                counts[m.describe()] = counts.get(m.describe(), 0) + 1
            text += "; " + "; ".join(f"{d} on {n} node(s)" for d, n in counts.items())
        return text

    def merge_rows(self) -> list[dict[str, Any]]:
        """Merge_Info as rows: node, its cosine under each method (hb prints the method string's
        part after the colon), and the selected method."""
        rows = []
        for tensor, values in self.merge_info:
            chosen = self.method_for(tensor)
            rows.append({"node": tensor, "selected": chosen.describe(),
                         "cosine": {m.describe(): v for m, v in values}})
        return rows

    def notes(self, n_nodes: int) -> list[str]:
        """hb's log lines of the layer-wise search (mix_calibrater.py)."""
        sensitive = len(self.merge_info)
        return ["Run calibration model with layerwise search method.",
                f"Calculate all sensitivity nodes with {self.base.describe()} calibration method using "
                "cosine-similarity metric.",
                f"Topk is not set by the user, select top-{sensitive} nodes with cosine-similarity less than "
                f"{MIX_SENSITIVE_BELOW} to merge multi calibration methods.",
                f"mix calibration: {n_nodes} calibration node(s), {sensitive} sensitive, {len(self.merged)} take "
                f"another method than the base {self.base.describe()}"]


def choose_mix(score: Callable[[Calibration], float], nodes: Iterable[str],
               node_score: Callable[[str, Calibration], float],
               threshold: float = MIX_SENSITIVE_BELOW) -> MixedCalibration:
    """``mix`` as MixCalibrater runs it [quantizer.md §2.3; src 24273942193].

    ``score(method)``: the model-wise score (as for default); ``node_score(tensor, method)``: the
    output cosine with only that calibration node quantized, under ``method``.

    Source details kept: step 1 sorts the three methods with a stable sort in their listed order
    (max, max-percentile, kl), so ties keep that order (not the alphabetical one of default);
    step 4 takes ``argmax`` over the node's cosines with the base's first, so a tie keeps the base.
    NaN: a NaN single-node cosine does not make a node sensitive (the source's bisection treats
    NaN like "not below") and is never the selected method (**inferred**; np.argmax would pick NaN).
    """
    ranking = {m: score(m) for m in PER_TENSOR_METHODS}
    ordered = sorted(PER_TENSOR_METHODS, key=lambda m: (math.isnan(ranking[m]), -ranking[m]
                                                       if not math.isnan(ranking[m]) else 0.0))
    base, others = ordered[0], ordered[1:]
    sensitivity = {t: node_score(t, base) for t in nodes}
    sensitive = sorted((t for t, c in sensitivity.items() if c < threshold), key=lambda t: (sensitivity[t], t))
    merged, info = [], []
    for t in sensitive:
        values = [(base, sensitivity[t])] + [(m, node_score(t, m)) for m in others]
        best_m, best_v = values[0]
        for m, v in values[1:]:
            if not math.isnan(v) and v > best_v:
                best_m, best_v = m, v
        if best_m != base:
            merged.append((t, best_m))
        info.append((t, tuple(values)))
    return MixedCalibration(base=base, merged=tuple(sorted(merged)), merge_info=tuple(info),
                            ranking=tuple((m, ranking[m]) for m in ordered))


def calibration_nodes(plan: Plan) -> list[str]:
    """The calibration nodes of a plan, as tensors: every quantization point's scale source
    (edges, outputs, BPU->CPU reads; a same-scale op's output shares its input's node), in a
    stable order."""
    tensors = ([t for t, _ in plan.edges.values()] + list(plan.outputs) + [t for t, _ in plan.cpu_reads.values()]
               + [t for t, _ in plan.internal.values()])
    return list(dict.fromkeys(plan.scale_of.get(t, t) for t in tensors))


def single_node_plan(plan: Plan, tensor: str) -> Plan:
    """``plan`` with only ``tensor``'s calibration node on: its quantization points kept, every
    other point and every weight float (hb switches all other calibration nodes off, weights
    included, for the node sensitivity of mix [src 24273942193, get_sensitivity_of_nodes
    node_type="activation"])."""
    def mine(t: str) -> bool:
        return plan.scale_of.get(t, t) == tensor

    return replace(plan, edges={k: v for k, v in plan.edges.items() if mine(v[0])},
                   outputs={t: d for t, d in plan.outputs.items() if mine(t)},
                   cpu_reads={k: v for k, v in plan.cpu_reads.items() if mine(v[0])},
                   internal={k: v for k, v in plan.internal.items() if mine(v[0])},
                   weights=[], passthrough={}, notes=[])


class MixScales:
    """Scales of a :class:`MixedCalibration`: each tensor's from the ScaleTable of its method.

    The interface ``build_sim_model`` (tuner.simulate.qdq) and the per-node table use
    (``get(tensor, dtype)``, ``threshold(tensor, dtype)``, ``stats``, ``calibration``); whatever a
    ScaleTable does for a method (per-channel, asymmetric rules) applies here unchanged."""

    def __init__(self, calibration: MixedCalibration, table: Callable[[Calibration], Scales]):
        self.calibration = calibration
        self._table = table
        self.stats = table(calibration.base).stats

    def get(self, tensor: str, dtype: str, channel: bool = False) -> Scale:
        return self._table(self.calibration.method_for(tensor)).get(tensor, dtype, channel)

    def threshold(self, tensor: str, dtype: str = "int8") -> float:
        return self.get(tensor, dtype).threshold
