"""Fitting the BPU coefficients to hbdk's estimates: across models (the shipped constants) and per model.

A sample is one real compile: the plan's placement, what the real calibrated model made int16 and
hbdk's own subgraphs (:func:`real_precision`: fitting on them keeps the planner's errors out of the
cost model's), and hbdk's per-subgraph estimate and per-layer table (:mod:`tuner.cost.hbdk`).

* :func:`fit_layers`: every kind's price in both precisions from hbdk's per-layer rows (its computing
  cost plus a share of its load/store cost), least squares on relative errors, every coefficient >= 0,
  pulled toward a prior where a term has little data (ridge), the max fitted by alternation;
* :func:`fit_totals`: the subgraph-level terms and one multiplier of the layer prices, from the
  totals, with a constant per model;
* :func:`fit_scales`: ``tuner latency fit``'s per-model constant and int16 and I/O scales from a
  handful of compiles of one model.

Each fit is a small non-negative least-squares problem (numpy only: coordinate descent on the normal
equations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.cost.bpu import LayerPrice
from tuner.cost.hbdk import NodeQtypes, SubgraphEstimate
from tuner.cost.latency import (
    GLOBAL_TERMS,
    PRECISIONS,
    SCALES,
    BpuCoefficients,
    CostModel,
    LayerUse,
    Precision,
    price_features,
    scale_of,
)
from tuner.simulate.plan import Plan


def hb_aliases(graph: Any) -> dict[str, list[str]]:
    """tuner node -> the user's ONNX names that tuner's optimizer replaced by it alone: hb_mapper may name
    the same node after another of them (PP-OCRv4's HardSwish: tuner's ``p2o.Div.0``, hb's ``p2o.Mul.2``)."""
    out: dict[str, list[str]] = {}
    for name, rw in graph.names.rewrites.items():
        if len(rw.nodes) == 1 and name not in graph.by_name and rw.nodes[0] in graph.by_name:
            out.setdefault(rw.nodes[0], []).append(name)
    return out


def real_subgraphs(model: CostModel, plan: Plan, estimates: Sequence[SubgraphEstimate]) -> dict[str, int]:
    """hbdk's own partition of the plan's BPU nodes: a node whose layer has a row in a subgraph's table
    is in that subgraph; the others go where most of the nodes of their plan subgraph went. (The plan's
    partition may split more: an input Slice on the CPU made tuner's plan of the example 4 subgraphs and
    hbdk's 2.)"""
    where: dict[str, int] = {}
    for i, est in enumerate(estimates):
        for r in est.layers:
            where.setdefault(r.node, i)
    aliases = hb_aliases(model.graph)
    out: dict[str, int] = {}
    votes: dict[int, dict[int, int]] = {}
    for name, sub in plan.subgraph.items():
        head = model.layers[name].head
        found = [where[n] for n in (name, head, *aliases.get(name, ()), *aliases.get(head, ())) if n in where]
        if found:
            i = found[0]
            out[name] = i
            votes.setdefault(sub, {}).setdefault(i, 0)
            votes[sub][i] += 1
    for name, sub in plan.subgraph.items():
        if name not in out:
            v = votes.get(sub)
            out[name] = max(v, key=lambda k: v[k]) if v else len(estimates) + sub
    return out


def real_precision(model: CostModel, plan: Plan, qtypes: Mapping[str, NodeQtypes],
                   estimates: Sequence[SubgraphEstimate] = ()) -> Precision:
    """The plan's placement with the real calibrated model's qtypes: a BPU node is int16 where hb_mapper
    quantizes one of its activation inputs (output) in int16; nodes hb_mapper's graph lacks keep the
    plan's precision. hbdk compiles the quantized model: an int16 input that hb_mapper sets back to int8
    at quantization (a depthwise Conv with a stride above 1, placement.md 3d; the plan's ``calibrated``)
    is int8 there although the calibrated model shows int16 (PP-OCRv4's stride-2 depthwise Convs under
    set_all_nodes_int16 cost 6-22 us, their int8 price, where its stride-1 ones cost 33-119 us). With
    hbdk's tables (``estimates``), hbdk's own subgraphs (:func:`real_subgraphs`), else the plan's."""
    g = model.graph
    plan_p = Precision.of_plan(plan)
    aliases = hb_aliases(g)
    in16, out16 = set(), set()
    reads: dict[str, set[str]] = {}
    out_dtype = dict(plan.out_dtype)
    for node in g:
        if plan.placement.get(node.name) != "BPU":
            continue
        q = qtypes.get(node.name) or next((qtypes[a] for a in aliases.get(node.name, ()) if a in qtypes), None)
        if q is None:
            if node.name in plan_p.in16:
                in16.add(node.name)
            if node.name in plan_p.out16:
                out16.add(node.name)
            continue
        for k, t in enumerate(node.inputs):
            qt = q.inputs[k] if k < len(q.inputs) else None
            if qt == "int16" and (node.name, k) in plan.calibrated:
                qt = plan.edges.get((node.name, k), (t, qt))[1]   # set back to int8 at quantization
            if qt is not None and g.is_activation(t):
                reads.setdefault(t, set()).add(qt)
                if qt == "int16":
                    in16.add(node.name)
        if q.outputs and q.outputs[0] == "int16":
            out16.add(node.name)
            out_dtype[node.name] = "int16"
        elif q.outputs and q.outputs[0] == "int8" and out_dtype.get(node.name) == "int16":
            out_dtype[node.name] = "int8"
    subgraph = real_subgraphs(model, plan, estimates) if estimates else plan.subgraph
    return Precision(placement=plan.placement, subgraph=subgraph, in16=frozenset(in16), out16=frozenset(out16),
                     reads={t: frozenset(d) for t, d in reads.items()}, out_dtype=out_dtype)


@dataclass(frozen=True)
class Sample:
    """One real compile of one model, as the fits use it: its BPU layers and subgraph-level amounts (which
    the fits price again with the coefficients being fitted), hbdk's total, and hbdk's per-layer rows
    matched to the layers."""

    model: str
    name: str
    uses: tuple[LayerUse, ...]
    extras: Mapping[int, Mapping[str, float]]
    hbdk_us: float                                          # hbdk's estimate, all subgraphs
    rows: tuple[tuple[LayerUse, float], ...] = ()           # (layer, observed us) for the per-layer fit

    def features(self, c: BpuCoefficients) -> list[dict[str, float]]:
        return price_features(self.uses, self.extras, c)


def make_sample(model: CostModel, p: Precision, hbdk_us: float, name: str = "", model_name: str = "",
                estimates: Sequence[SubgraphEstimate] = (), load_store_share: float = 0.0) -> Sample:
    """A sample of ``model`` under precision ``p``; with hbdk's per-layer tables (``estimates``) its layers
    are matched to hbdk's rows by name: observed = computing cost + ``load_store_share`` x load/store."""
    uses = tuple(model.layer_terms(p))
    by_name = {r.node: r for s in estimates for r in s.layers}
    aliases = hb_aliases(model.graph)
    rows = []
    edge = model.cut_layers(p)
    for u in uses:
        if u.head in edge:
            continue
        r = by_name.get(u.head) or next((by_name[a] for a in aliases.get(u.head, ()) if a in by_name), None)
        if r is not None:
            rows.append((u, r.compute_us + load_store_share * r.load_store_us))
    return Sample(model_name, name, uses, model.extras(p), hbdk_us, tuple(rows))


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


def fit_price(rows: Sequence[tuple[LayerUse, float]], prior: LayerPrice, ridge: float = 0.05, rounds: int = 20
              ) -> LayerPrice:
    """One kind's price in one precision from its rows: ``fixed + max(mac, input, output terms)`` on relative
    errors (floored at 2 us). The max is fitted by alternation: each row is charged to the term that bounds
    it under the current price, the prices are refitted (non-negative least squares, pulled toward the
    prior), until the assignment settles."""
    price = prior
    if not rows:
        return prior
    work = np.array([[u.macs / 1e6, u.in_elements / 1e3, u.elements / 1e3] for u, _ in rows])
    obs = np.array([us for _, us in rows])
    w = 1.0 / np.maximum(obs, 2.0)
    p0 = np.array(prior.as_list())
    assign = None
    for _ in range(rounds):
        terms = work * np.array(price.as_list()[1:])
        new_assign = terms.argmax(axis=1)
        if assign is not None and np.array_equal(new_assign, assign):
            break
        assign = new_assign
        a = np.zeros((len(rows), 4))
        a[:, 0] = 1.0
        for j in range(3):
            a[assign == j, 1 + j] = work[assign == j, j]
        aw = a * w[:, None]
        scale = np.sqrt((aw ** 2).sum(axis=0)) + 1e-9
        ridge_v = np.full(4, ridge)
        x = _nnls(aw / scale, obs * w, p0 * scale, ridge_v) / scale
        # a term no row is charged to keeps its prior, but no more than lets it bound none of the rows: a
        # prior left above the fitted term would otherwise win the max and undo the fit (PP-OCRv4's int16
        # HzChannelScale rows, whose input and output are the same size, kept the prior's 0.3 us per
        # thousand input elements while their fit charged them 0.23 per thousand output elements)
        bound = work[np.arange(len(rows)), assign] * x[1 + assign]
        for j in range(3):
            if not np.any(assign == j):
                has = work[:, j] > 0
                cap = float(np.min(bound[has] / work[has, j])) if np.any(has) else p0[1 + j]
                x[1 + j] = min(p0[1 + j], cap)
        price = LayerPrice.from_list(x)
    return price


def fit_layers(rows: Sequence[tuple[LayerUse, float]], prior: BpuCoefficients, ridge: float = 0.05,
               outlier: float = 3.0) -> BpuCoefficients:
    """Every kind's prices in both precisions (:func:`fit_price`) from hbdk's per-layer rows; a row more than
    ``outlier`` times off its first fit is left out of the second (hbdk charges some layers for work that
    is not theirs: on the example ~100 us of a layout conversion lands on one 96x160 element-wise layer
    or another from one configuration to the next)."""
    groups: dict[tuple[str, str], list[tuple[LayerUse, float]]] = {}
    for u, us in rows:
        groups.setdefault((u.kind, u.prec), []).append((u, us))
    layers = dict(prior.layers)
    for key, grp in groups.items():
        first = fit_price(grp, prior.price(*key), ridge)
        kept = [(u, us) for u, us in grp
                if 1 / outlier <= max(us, 2.0) / max(first.us(u.macs, u.in_elements, u.elements), 2.0) <= outlier]
        layers[key] = fit_price(kept, first, ridge) if kept else first
    # an int16 input never made a layer cheaper (every kind, every row measured): each int16 term is at
    # least its int8 twin, so that a thinly measured kind cannot price int16 below int8
    for (kind, prec), price in list(layers.items()):
        if prec == "int16" and (kind, "int8") in layers:
            layers[(kind, prec)] = LayerPrice(*(max(a, b) for a, b in zip(price.as_list(),
                                                                            layers[(kind, "int8")].as_list())))
    return BpuCoefficients(layers=layers, terms=dict(prior.terms), source=prior.source)


def fit_totals(samples: Sequence[Sample], coefficients: BpuCoefficients, ridge: float = 0.01) -> BpuCoefficients:
    """One multiplier of the layer prices and the subgraph-level terms, fitted to hbdk's totals (relative
    errors): how much of the per-layer sum survives the overlap of layers, and what the rest costs. Every
    model gets its own constant, so that a term is fitted on what changes between one model's compiles,
    not on what tells the models apart."""
    models = sorted({s.model for s in samples})
    cols = ["layers"] + [t for t in GLOBAL_TERMS if t != "model"] + [f"model:{m}" for m in models]
    a = np.zeros((len(samples), len(cols)))
    b = np.zeros(len(samples))
    for i, s in enumerate(samples):
        w = 1.0 / s.hbdk_us
        for f in s.features(coefficients):
            for n, amount in f.items():
                j = 0 if n in PRECISIONS else cols.index(f"model:{s.model}" if n == "model" else n)
                a[i, j] += amount * w
        b[i] = s.hbdk_us * w
    prior = np.array([1.0] + [coefficients.terms.get(c, 0.0) for c in cols[1:]])
    scale = np.sqrt((a ** 2).sum(axis=0)) + 1e-12
    x = _nnls(a / scale, b, prior * scale, np.full(len(cols), ridge)) / scale
    terms = {c: float(x[j]) for j, c in enumerate(cols) if j and not c.startswith("model:")}
    # a model's constant in proportion to its size: the shipped layers carry the median proportion, the
    # shipped constant is 0 (a constant fitted on 1 ms models would be 3x a 34 us model), and
    # `tuner latency fit` finds a model's own
    share = [x[cols.index(f"model:{m}")] / np.mean([s.hbdk_us for s in samples if s.model == m]) for m in models]
    k = 1.0 + float(np.median(share)) if share else 1.0
    terms["model"] = 0.0
    return BpuCoefficients(layers={key: p.scaled(float(x[0]) * k) for key, p in coefficients.layers.items()},
                           terms=terms, source=coefficients.source)


def fit_scales(samples: Sequence[Sample], coefficients: BpuCoefficients, ridge: float = 0.5) -> dict[str, float]:
    """``tuner latency fit``: this model's constant (``model``, us), and scales of the int16 terms and of the
    I/O terms, fitted to a handful of compiles of one model on relative errors; the int8 layers keep the
    shipped prices (their misfit on a model is mostly a constant: the constant takes it). Pulled toward the
    shipped values (ridge 0.5, on relative errors): one int16 compile of three Convs is a thin base for
    every int16 layer, and a free int16 scale fitted on it puts PP-OCRv4's set_all_nodes_int16 23 % low
    (hbdk hides part of three large int16 Convs' extra time in its schedule, not of 140 int16 layers'); at
    0.5 it is 4 % low and every configuration of both models within 10 % (0.1: the example's within 8 %,
    PP-OCRv4's set_all_nodes_int16 13 % low)."""
    fixed = np.zeros(len(samples))
    a = np.zeros((len(samples), len(SCALES)))
    b = np.zeros(len(samples))
    for i, s in enumerate(samples):
        w = 1.0 / s.hbdk_us
        for f in s.features(coefficients):
            for n, amount in f.items():
                unit = 1.0 if n in PRECISIONS else coefficients.terms.get(n, 0.0)
                group = scale_of(n)
                if group == "model":
                    a[i, SCALES.index("model")] += amount * w
                elif group in SCALES:
                    a[i, SCALES.index(group)] += unit * amount * w
                else:
                    fixed[i] += unit * amount * w
        b[i] = s.hbdk_us * w - fixed[i]
    # the constant in units of the first sample's total, so one ridge weighs all three alike; it may be
    # negative (the shipped prices may overshoot a model), so it is the difference of two columns >= 0
    m = SCALES.index("model")
    total = max(samples[0].hbdk_us, 1.0) if samples else 1.0
    base = coefficients.terms.get("model", 0.0) / total
    a2 = np.hstack([a, -a[:, [m]]])
    a2[:, m] *= total
    a2[:, -1] *= total
    prior = np.array([max(base, 0.0) if k == "model" else 1.0 for k in SCALES] + [max(-base, 0.0)])
    x = _nnls(a2, b, prior, np.full(len(SCALES) + 1, ridge))
    out = {k: float(x[j]) for j, k in enumerate(SCALES)}
    out["model"] = float((x[m] - x[-1]) * total)
    return {k: round(v, 4) for k, v in out.items()}


def modeled_us(sample: Sample, coefficients: BpuCoefficients) -> float:
    return sum(coefficients.us(f) for f in sample.features(coefficients))
