"""The simulation next to the real toolchain: per node and per output, for one YAML.

A :class:`Comparison` pairs the simulator's per-node rows (``Simulator.evaluate(...,
per_node=True)``) with the rows of hb_mapper's log: cosine and threshold, placement and
dtype as the tool decided vs as tuner assumed, and the int16 requests the tool refused.
The simulated figures are normally computed on the log's terms (:mod:`tuner.toolchain.logterms`:
the first calibration sample, hb_mapper's eps cosine and distances; ``terms`` says which), with
each output's pooled cosine on the evaluation data beside them.
Two summary figures say how far the simulation was: the Spearman rank correlation of the
two per-node cosine columns (does the simulator find the same weak nodes?) and the output
cosine gap (real minus simulated, mean over outputs; negative: the real model is worse).

Rows hb_mapper inserts (``HZ_PREPROCESS_FOR_*``, ``*_Requantize``, layout conversions) have
no model node and are listed apart; model nodes without a row were fused away by the tool.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tuner.candidate import Candidate
from tuner.console import table
from tuner.files import jsonable
from tuner.simulate import Evaluation
from tuner.toolchain.hblog import HbLog, OutputRecord, name_matches


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None below 3 pairs or for a constant column."""
    if len(a) != len(b) or len(a) < 3:
        return None

    def ranks(values: list[float]) -> np.ndarray:
        x = np.asarray(values, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):          # ties share their mean rank
            tie = x == v
            if tie.sum() > 1:
                r[tie] = r[tie].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def normalize_method(text: str | None) -> str | None:
    """One spelling of a calibration method string, so that the log's ``Select ... method.`` and
    tuner's :meth:`Calibration.describe` compare equal whichever form each uses.

    Accepted: hb_mapper's (``max:per_channel``, ``max-percentile:percentile=0.99995,per_channel``,
    ``kl:num_bin=1024,max_num_bin=16384``: suffixes comma-joined after a colon) and tuner's older one
    (``max,per_channel``); ``_`` or ``-`` in the method name, any case, spaces, a trailing ``method.``.
    Returned: ``name[:key=value,...,flag,...]`` with parameters sorted by key, numbers written
    the same way (``0.999950`` = ``0.99995``) and flags sorted after them.
    """
    if text is None:
        return None
    t = re.sub(r"\s+", "", text.strip()).lower()
    t = re.sub(r"^select", "", t)
    t = re.sub(r"method\.?$", "", t).rstrip(".")
    if not t:
        return None
    name, sep, rest = t.partition(":")
    if not sep:
        name, _, rest = t.partition(",")
    name = name.replace("_", "-")
    params, flags = [], []
    for token in filter(None, rest.split(",")):
        key, eq, value = token.partition("=")
        if not eq:
            flags.append(key.replace("-", "_"))
            continue
        try:
            value = format(float(value), ".12g")
        except ValueError:
            pass
        params.append(f"{key.replace('-', '_')}={value}")
    tail = sorted(params) + sorted(set(flags))
    return name + (":" + ",".join(tail) if tail else "")


def same_method(a: str | None, b: str | None) -> bool | None:
    """Whether two method strings name the same calibration; None when either is missing."""
    na, nb = normalize_method(a), normalize_method(b)
    if na is None or nb is None:
        return None
    return na == nb


def int16_requests(candidate: Candidate) -> dict[str, str]:
    """node -> 'input' | 'output' | 'input+output': what the YAML's node_info asks in int16."""
    out = {}
    for name, s in candidate.nodes:
        sides = []
        if s.input_type == "int16" or any(v == "int16" for _, v in s.input_types):
            sides.append("input")
        if s.output_type == "int16":
            sides.append("output")
        if sides:
            out[name] = "+".join(sides)
    return out


@dataclass
class NodeComparison:
    node: str
    op_type: str
    sim_on: str
    real_on: str | None
    sim_subgraph: int | None
    real_subgraph: int | None
    sim_cosine: float | None
    real_cosine: float | None
    sim_threshold: float | None
    real_threshold: float | None
    sim_dtype: str
    real_dtype: str | None
    kernel: str | None = None
    int16_requested: str | None = None
    int16_refused: bool | None = None       # None: not requested, or the log does not show it

    @property
    def placement_differs(self) -> bool:
        return self.real_on is not None and self.real_on != self.sim_on


@dataclass
class OutputComparison:
    name: str
    sim_cosine: float | None                 # on the comparison's terms (Comparison.terms)
    real_cosine: float | None
    sim_cosine_pooled: float | None = None   # plain cosine pooled over the evaluation data, same calibration
    sim_l1: float | None = None              # hb_mapper's distances (tuner.metrics.hb), on the same terms
    sim_l2: float | None = None
    sim_chebyshev: float | None = None
    real_l1: float | None = None
    real_l2: float | None = None
    real_chebyshev: float | None = None
    real_row: str | None = None              # the log's name for it when not the output's (before 1.24: its node)

    @property
    def gap(self) -> float | None:
        if self.sim_cosine is None or self.real_cosine is None:
            return None
        return self.real_cosine - self.sim_cosine


@dataclass
class Comparison:
    nodes: list[NodeComparison]
    outputs: list[OutputComparison]
    sim_method: str | None = None
    real_method: str | None = None
    log_only: list[str] = field(default_factory=list)
    without_row: list[str] = field(default_factory=list)
    source: str | None = None
    terms: str | None = None                 # what the "sim" figures are (None: stored before this was said)
    pooled_data: str | None = None           # where sim_cosine_pooled comes from
    pooled_samples: int | None = None

    # -- summary figures -----------------------------------------------------------------
    def _paired(self) -> list[NodeComparison]:
        return [n for n in self.nodes if n.sim_cosine is not None and n.real_cosine is not None
                and math.isfinite(n.sim_cosine) and math.isfinite(n.real_cosine)]

    @property
    def spearman(self) -> float | None:
        p = self._paired()
        return spearman([n.sim_cosine for n in p if n.sim_cosine is not None],
                        [n.real_cosine for n in p if n.real_cosine is not None])

    @property
    def n_paired(self) -> int:
        return len(self._paired())

    @property
    def output_cosine_gap(self) -> float | None:
        gaps = [o.gap for o in self.outputs if o.gap is not None]
        return float(np.mean(gaps)) if gaps else None

    @property
    def real_output_cosine(self) -> float | None:
        v = [o.real_cosine for o in self.outputs if o.real_cosine is not None]
        return float(np.mean(v)) if v else None

    @property
    def sim_output_cosine(self) -> float | None:
        v = [o.sim_cosine for o in self.outputs if o.sim_cosine is not None]
        return float(np.mean(v)) if v else None

    @property
    def sim_output_cosine_pooled(self) -> float | None:
        v = [o.sim_cosine_pooled for o in self.outputs if o.sim_cosine_pooled is not None]
        return float(np.mean(v)) if v else None

    @property
    def same_method(self) -> bool | None:
        """Whether the log's ``Select ... method.`` names tuner's choice (either spelling); None
        when the log has no Select line."""
        return same_method(self.real_method, self.sim_method)

    @property
    def placement_differs(self) -> list[str]:
        return [n.node for n in self.nodes if n.placement_differs]

    @property
    def int16_refused(self) -> list[str]:
        return [n.node for n in self.nodes if n.int16_refused]

    # -- building ------------------------------------------------------------------------
    @classmethod
    def build(cls, ev: Evaluation, log: HbLog, figures=None, pooled: Evaluation | None = None,
              terms: str | None = None, pooled_data: str | None = None,
              pooled_samples: int | None = None, producers: Mapping[str, str] | None = None) -> Comparison:
        """Pair an evaluation made with ``per_node=True`` with a parsed log.

        ``figures`` (a :class:`tuner.toolchain.logterms.LogFigures`) replaces the evaluation's
        cosines by hb_mapper's figures on the log's terms (``terms`` says which); without it the
        evaluation's own (pooled, plain) cosines are compared. ``pooled``: an evaluation of the same
        candidate and calibration whose output cosines are kept as ``sim_cosine_pooled``.
        ``producers``: model output -> the node that computes it, to pair an output table that
        names nodes (hb_mapper before 1.24) with the model's outputs (:func:`output_rows`)."""
        hb_nodes = figures.nodes if figures is not None else None
        hb_outputs = figures.outputs if figures is not None else {}
        requested = int16_requests(ev.candidate)
        refused_msgs = {e.node for e in log.refused()}
        used: set[int] = set()
        nodes, without_row = [], []
        model_nodes = [r.name for r in ev.nodes]
        for r in ev.nodes:
            rows = log.rows_for(r.name, model_nodes)
            used.update(id(x) for x in rows)
            own = rows[0] if rows and rows[0].matches(r.name) else None
            want = requested.get(r.name)
            refused = None
            if want:
                refused = _refused(want, rows) if rows else None
                if any(name_matches(m, r.name) for m in refused_msgs):
                    refused = True
            if not rows:
                without_row.append(r.name)
            nodes.append(NodeComparison(
                node=r.name, op_type=r.op_type, sim_on=r.on, real_on=rows[0].on if rows else None,
                sim_subgraph=r.subgraph, real_subgraph=rows[0].subgraph if rows else None,
                sim_cosine=(r.cosine if hb_nodes is None else
                            hb_nodes[r.name].cosine if r.name in hb_nodes and r.cosine is not None else None),
                real_cosine=own.cosine if own else None,
                sim_threshold=r.threshold, real_threshold=own.threshold if own else None,
                sim_dtype=f"{r.in_dtype}/{r.out_dtype}",
                real_dtype=_dtype_text(own or (rows[0] if rows else None)),
                kernel=rows[0].kernel if rows else None, int16_requested=want, int16_refused=refused))
        log_only = [x.name for x in log.nodes if id(x) not in used]
        real_out = output_rows(log, list(ev.outputs), producers)
        outputs = []
        for name, m in ev.outputs.items():
            hb = hb_outputs.get(name)
            real = real_out.get(name)
            outputs.append(OutputComparison(
                name=name, sim_cosine=hb.cosine if hb else None if figures is not None else m.get("cosine"),
                real_cosine=real.cosine if real else None,
                sim_cosine_pooled=pooled.outputs[name]["cosine"] if pooled is not None and name in pooled.outputs
                else None,
                sim_l1=hb.l1 if hb else None, sim_l2=hb.l2 if hb else None, sim_chebyshev=hb.chebyshev if hb else None,
                real_l1=real.l1 if real else None, real_l2=real.l2 if real else None,
                real_chebyshev=real.chebyshev if real else None,
                real_row=real.name if real is not None and real.name != name else None))
        paired = {id(o) for o in real_out.values()}
        outputs += [OutputComparison(name=o.name, sim_cosine=None, real_cosine=o.cosine, real_l1=o.l1, real_l2=o.l2,
                                     real_chebyshev=o.chebyshev)
                    for o in log.outputs if id(o) not in paired]
        if terms is None and figures is None:
            terms = "tuner pooled over its evaluation data, plain cosine (not hb_mapper's terms)"
        return cls(nodes=nodes, outputs=outputs, sim_method=ev.calibration.describe(), real_method=log.method,
                   log_only=log_only, without_row=without_row, source=log.path, terms=terms,
                   pooled_data=pooled_data if pooled is not None else None,
                   pooled_samples=pooled_samples if pooled is not None else None)

    # -- (de)serialising -----------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for o in d["outputs"]:      # absent unless an old log named the output's node: the stored shape stays
            if o["real_row"] is None:
                del o["real_row"]
        d["summary"] = {"spearman": self.spearman, "n_paired": self.n_paired,
                        "output_cosine_gap": self.output_cosine_gap, "real_output_cosine": self.real_output_cosine,
                        "sim_output_cosine": self.sim_output_cosine,
                        "sim_output_cosine_pooled": self.sim_output_cosine_pooled, "terms": self.terms,
                        "same_method": self.same_method, "placement_differs": self.placement_differs,
                        "int16_refused": self.int16_refused}
        return jsonable(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        d = {k: v for k, v in d.items() if k != "summary"}
        d["nodes"] = [NodeComparison(**n) for n in d.get("nodes", [])]
        d["outputs"] = [OutputComparison(**o) for o in d.get("outputs", [])]
        return cls(**d)

    # -- text ----------------------------------------------------------------------------
    def summary(self) -> str:
        rho = self.spearman
        gap = self.output_cosine_gap
        lines = [f"compared on: {self.terms or 'not recorded (stored before; tuner pooled over its evaluation data)'}",
                 f"output cosine: real {_f(self.real_output_cosine)}, simulated {_f(self.sim_output_cosine)}, "
                 f"gap {_f(gap, sign=True)} (real - simulated)"]
        if self.sim_output_cosine_pooled is not None:
            n = f" ({self.pooled_samples} sample(s))" if self.pooled_samples else ""
            lines.append(f"simulated output cosine pooled over the {self.pooled_data or 'evaluation data'}{n}: "
                         f"{_f(self.sim_output_cosine_pooled)} (plain cosine, same calibration)")
        lines.append(f"per-node cosine rank correlation (Spearman): {_f(rho, 3)} over {self.n_paired} node(s)")
        if self.real_method or self.sim_method:
            verdict = {True: " (same method)", False: " (different methods)", None: ""}[self.same_method]
            lines.append(f"calibration: real {self.real_method or '(no Select line)'}, simulated {self.sim_method}"
                         + verdict)
        if self.placement_differs:
            lines.append(f"placement differs on {len(self.placement_differs)} node(s): "
                         + ", ".join(self.placement_differs[:8]) + (" ..." if len(self.placement_differs) > 8 else ""))
        if self.int16_refused:
            lines.append(f"int16 refused by the tool on {len(self.int16_refused)} node(s): "
                         + ", ".join(self.int16_refused[:8]) + (" ..." if len(self.int16_refused) > 8 else ""))
        if self.without_row:
            lines.append(f"{len(self.without_row)} model node(s) have no row in the log (fused by the tool)")
        if self.log_only:
            lines.append(f"{len(self.log_only)} log row(s) have no model node (inserted by the tool)")
        return "\n".join(lines)

    def node_table(self) -> str:

        rows = []
        for n in self.nodes:
            mark = "*" if n.placement_differs or n.int16_refused else " "
            delta = (n.real_cosine - n.sim_cosine) if n.real_cosine is not None and n.sim_cosine is not None else None
            int16 = "" if not n.int16_requested else f"{n.int16_requested}: " + (
                "refused" if n.int16_refused else "kept" if n.int16_refused is False else "?")
            rows.append([mark + n.node, f"{n.real_on or '--'}/{n.sim_on}", n.kernel or "--", _f(n.real_cosine),
                         _f(n.sim_cosine), _f(delta, sign=True), _f(n.real_threshold, 4), _f(n.sim_threshold, 4),
                         f"{n.real_dtype or '--'} | {n.sim_dtype}", int16])
        return table(["Node", "ON real/sim", "Type (real)", "Cosine real", "Cosine sim", "delta", "Threshold real",
                      "Threshold sim", "DataType real | sim", "int16 request"], rows)

    def output_table(self) -> str:

        return table(["Output", "Cosine real", "Cosine sim", "gap", "Cosine sim pooled", "L1 real", "L1 sim",
                      "L2 real", "L2 sim", "Chebyshev real", "Chebyshev sim"],
                     [[o.name + (f" (log: {o.real_row})" if o.real_row else ""),
                       _f(o.real_cosine), _f(o.sim_cosine), _f(o.gap, sign=True), _f(o.sim_cosine_pooled),
                       _f(o.real_l1), _f(o.sim_l1), _f(o.real_l2), _f(o.sim_l2), _f(o.real_chebyshev),
                       _f(o.sim_chebyshev)] for o in self.outputs])

    def text(self) -> str:
        return "\n\n".join([self.node_table(), self.output_table(), self.summary()])


def _refused(want: str, rows) -> bool | None:
    """Whether the tool dropped an int16 request, from the DataType column of the node's rows."""
    verdicts = []
    if "output" in want:
        outs = [r.out_dtype for r in rows if r.out_dtype]
        verdicts.append(None if not outs else "int16" not in outs)
    if "input" in want:
        ins = [r.in_dtype for r in rows if r.in_dtype]
        if ins:
            verdicts.append("int16" not in ins)
        elif "output" not in want:
            # newer logs print one DataType (the output's): an input-only request is not visible there
            outs = [r.out_dtype for r in rows if r.out_dtype]
            verdicts.append(False if "int16" in outs else None)
    known = [v for v in verdicts if v is not None]
    return any(known) if known else None


def _dtype_text(row) -> str | None:
    if row is None:
        return None
    if row.in_dtype:
        return f"{row.in_dtype}/{row.out_dtype}"
    return row.out_dtype


def output_rows(log: HbLog, outputs: list[str], producers: Mapping[str, str] | None) -> dict[str, OutputRecord]:
    """Model output -> its row of the log's output table.

    From hb_mapper 1.24 the table names the model's outputs. Before, it is headed ``Node`` and
    names the node that computes each output (the 1.18.2 log in tests/toolchain/real_logs:
    ``/model.22/Sigmoid`` for an output called ``output0``), so a row is the output whose
    producer it names (as the log prints names: a cut ``...tail`` matches by its tail), and
    without ``producers`` such a table pairs with no output."""
    if log.outputs_by != "node":
        by_name = {o.name: o for o in log.outputs}
        return {name: by_name[name] for name in outputs if name in by_name}
    out: dict[str, OutputRecord] = {}
    for name in outputs:
        node = (producers or {}).get(name)
        row = next((o for o in log.outputs if node and name_matches(o.name, node)), None)
        if row is not None and all(row is not r for r in out.values()):
            out[name] = row
    return out


def _f(value: float | None, digits: int = 6, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "--"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"
