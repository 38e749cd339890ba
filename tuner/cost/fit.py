"""Fitting the BPU coefficients to hbdk's estimates: across models (the shipped constants) and per model.

A sample is one real compile: the plan's placement and subgraphs, what the real calibrated model made
int16 (:func:`real_precision`: fitting on the real qtypes keeps the planner's int16 errors out of the
cost model's), and hbdk's per-subgraph estimate and per-layer table (:mod:`tuner.cost.hbdk`).

* :func:`fit_layers`: the per-kind, per-precision layer terms from hbdk's per-layer rows (its
  computing cost plus a share of its load/store cost), least squares on relative errors, every
  coefficient >= 0, pulled toward a prior where a term has little data (ridge);
* :func:`fit_totals`: the subgraph-level terms and one multiplier of the layer terms, from the
  subgraph totals;
* :func:`fit_scales`: ``tuner latency fit``'s three per-model scales (int8 layers, int16 layers,
  subgraph I/O) from a handful of compiles of one model.

Everything is linear in the coefficients, so each fit is a small non-negative least-squares problem
(numpy only: projected coordinate descent on the normal equations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.cost.hbdk import NodeQtypes, SubgraphEstimate
from tuner.cost.latency import GLOBAL_TERMS, SCALES, BpuCoefficients, CostModel, Precision, scale_of, term_names
from tuner.simulate.plan import Plan


def real_precision(model: CostModel, plan: Plan, qtypes: Mapping[str, NodeQtypes]) -> Precision:
    """The plan's placement and subgraphs with the real calibrated model's qtypes: a BPU node is int16
    where hb_mapper quantizes one of its activation inputs (output) in int16. Nodes hb_mapper's graph
    lacks keep the plan's precision."""
    g = model.graph
    plan_p = Precision.of_plan(plan)
    in16, out16 = set(), set()
    reads: dict[str, set[str]] = {}
    out_dtype = dict(plan.out_dtype)
    for node in g:
        if plan.placement.get(node.name) != "BPU":
            continue
        q = qtypes.get(node.name)
        if q is None:
            if node.name in plan_p.in16:
                in16.add(node.name)
            if node.name in plan_p.out16:
                out16.add(node.name)
            continue
        for k, t in enumerate(node.inputs):
            qt = q.inputs[k] if k < len(q.inputs) else None
            if qt is not None and g.is_activation(t):
                reads.setdefault(t, set()).add(qt)
                if qt == "int16":
                    in16.add(node.name)
        if q.outputs and q.outputs[0] == "int16":
            out16.add(node.name)
            out_dtype[node.name] = "int16"
        elif q.outputs and q.outputs[0] == "int8" and out_dtype.get(node.name) == "int16":
            out_dtype[node.name] = "int8"
    return Precision(placement=plan.placement, subgraph=plan.subgraph, in16=frozenset(in16), out16=frozenset(out16),
                     reads={t: frozenset(d) for t, d in reads.items()}, out_dtype=out_dtype)


@dataclass(frozen=True)
class Sample:
    """One real compile of one model, as the fits use it."""

    model: str
    name: str
    features: tuple[dict[str, float], ...]         # per subgraph, modeled
    hbdk_us: float                                 # hbdk's estimate, all subgraphs
    layers: tuple[tuple[dict[str, float], float], ...] = ()   # per matched layer row: (terms, observed us)


def layer_sample_rows(model: CostModel, p: Precision, estimates: Sequence[SubgraphEstimate],
                      load_store_share: float) -> list[tuple[dict[str, float], float]]:
    """hbdk's per-layer rows matched to the model's layers by name: (terms, compute + share x load/store)."""
    rows = {r.node: r for s in estimates for r in s.layers}
    out = []
    for head, _, terms in model.layer_terms(p):
        r = rows.get(head)
        if r is not None:
            out.append((terms, r.compute_us + load_store_share * r.load_store_us))
    return out


def _nnls(a: np.ndarray, b: np.ndarray, prior: np.ndarray, ridge: np.ndarray, iters: int = 3000) -> np.ndarray:
    """min |a x - b|^2 + sum ridge (x - prior)^2 subject to x >= 0 (coordinate descent on the normal equations)."""
    q = a.T @ a + np.diag(ridge)
    c = a.T @ b + ridge * prior
    x = np.clip(prior.astype(float).copy(), 0, None)
    diag = np.diag(q).copy()
    diag[diag <= 0] = 1e-12
    for _ in range(iters):
        delta = 0.0
        for j in range(len(x)):
            g = c[j] - q[j] @ x + q[j, j] * x[j]
            new = max(0.0, g / diag[j])
            delta = max(delta, abs(new - x[j]))
            x[j] = new
        if delta < 1e-10:
            break
    return x


def fit_layers(rows: Sequence[tuple[dict[str, float], float]], prior: BpuCoefficients, ridge: float = 0.05
               ) -> BpuCoefficients:
    """The per-layer terms, fitted to observed per-layer microseconds (relative errors, floored at 2 us)."""
    names = [n for n in term_names() if n not in GLOBAL_TERMS and n != "out16_kelem"] + ["out16_kelem"]
    used = [n for n in names if any(t.get(n, 0.0) for t, _ in rows)]
    idx = {n: i for i, n in enumerate(used)}
    a = np.zeros((len(rows), len(used)))
    b = np.zeros(len(rows))
    for i, (terms, us) in enumerate(rows):
        w = 1.0 / max(us, 2.0)
        for n, amount in terms.items():
            if n in idx:
                a[i, idx[n]] = amount * w
        b[i] = us * w
    p0 = np.array([prior.values.get(n, 0.0) for n in used])
    scale = np.sqrt((a ** 2).sum(axis=0)) + 1e-12
    x = _nnls(a / scale, b, p0 * scale, np.full(len(used), ridge))
    values = dict(prior.values)
    values.update({n: float(v) for n, v in zip(used, x / scale)})
    return BpuCoefficients(values=values, source=prior.source)


def fit_totals(samples: Sequence[Sample], coefficients: BpuCoefficients, ridge: float = 0.01) -> BpuCoefficients:
    """One multiplier of the layer terms and the subgraph-level terms (requantize, I/O, per subgraph),
    fitted to hbdk's totals on relative errors."""
    cols = ["layers", "requant_kelem", "io_kbyte", "subgraph"]
    a = np.zeros((len(samples), len(cols)))
    b = np.zeros(len(samples))
    v = coefficients.values
    for i, s in enumerate(samples):
        w = 1.0 / s.hbdk_us
        for f in s.features:
            for n, amount in f.items():
                if n in cols:
                    a[i, cols.index(n)] += amount * w
                else:
                    a[i, 0] += v.get(n, 0.0) * amount * w
        b[i] = s.hbdk_us * w
    prior = np.array([1.0] + [v.get(c, 0.0) for c in cols[1:]])
    scale = np.sqrt((a ** 2).sum(axis=0)) + 1e-12
    x = _nnls(a / scale, b, prior * scale, np.full(len(cols), ridge)) / scale
    values = {n: (val * x[0] if n not in cols else val) for n, val in v.items()}
    values.update({c: float(x[j]) for j, c in enumerate(cols) if j})
    return BpuCoefficients(values=values, source=coefficients.source)


def fit_scales(samples: Sequence[Sample], coefficients: BpuCoefficients, ridge: float = 0.02) -> dict[str, float]:
    """``tuner latency fit``: per-model scales of the int8 layer terms, the int16 terms and the subgraph I/O
    terms, fitted to a handful of compiles of one model on relative errors, pulled toward 1 (ridge): a
    scale no compile informs stays 1."""
    a = np.zeros((len(samples), len(SCALES)))
    b = np.zeros(len(samples))
    v = coefficients.values
    for i, s in enumerate(samples):
        w = 1.0 / s.hbdk_us
        for f in s.features:
            for n, amount in f.items():
                a[i, SCALES.index(scale_of(n))] += v.get(n, 0.0) * amount * w
        b[i] = s.hbdk_us * w
    x = _nnls(a, b, np.ones(len(SCALES)), np.full(len(SCALES), ridge))
    return {k: float(round(val, 4)) for k, val in zip(SCALES, x)}


def modeled_us(sample: Sample, coefficients: BpuCoefficients) -> float:
    return sum(coefficients.us(f) for f in sample.features)
