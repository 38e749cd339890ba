"""tuner's latency model against hbdk's estimate (issue 23): the data, and the agreement table.

    python benchmarks/latency_fidelity.py collect [--models segdepth,ppocr_det]   # needs the toolchain
    python benchmarks/latency_fidelity.py report [--out results/benchmarks/latency_fidelity.md]

``collect`` converts every configuration below with the real toolchain at ``optimize_level: O3``
with ``compiler_parameters.debug: True`` (what a board runs; cached by content under
``$TUNER_HB_RUNS``: a second run converts only what changed) and stores, per configuration, hbdk's
per-subgraph estimate and per-layer table and what the real calibrated model makes int16
(``*_calibrated_model.onnx``), in ``results/benchmarks/latency_fidelity.json``. PP-OCRv4's detector
takes 2.5-4 min per configuration at O3 on 2 cores, all-int16 about 15 min.

``report`` needs no toolchain: it models every stored configuration with tuner's cost model (the
plan's dtypes; and the real qtypes, so that planner errors and cost errors stay apart), fits the
per-model constants on a handful of configurations as ``tuner latency fit`` does, and writes the
table (ratio to all-int8 against hbdk's, Spearman, absolute all-int8 after the per-model fit).

The configurations, per model: all-int8 ``max``; int16 on the 1, 2, 5 (PP-OCR: and 10) nodes
``tuner sensitivity`` ranks first by "gain if int16" (run on this commit's parent, 0a5d326, max
calibration, the suite's data); ``set_all_nodes_int16``; ``ON: CPU`` on a Conv of the trunk at three
depths; the fidelity suite's int16-on-two-Convs and interior-CPU cases; on the example, Pareto
trials of a short ``tuner search`` of ``examples/segdepth/search.yaml`` (40 trials, seed 0), and on
the detector int16 on the neck's Concat (whose inputs are Resize outputs, which refuse int16).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))     # the fidelity suite's models (tests/fidelity_suite.py)
DATA = REPO / "results" / "benchmarks" / "latency_fidelity.json"
BEFORE = REPO / "results" / "benchmarks" / "latency_before.json"

I16 = {"InputType": "int16", "OutputType": "int16"}
CPU = {"ON": "CPU"}


def _int16(*names: str) -> dict[str, dict[str, str]]:
    return {n: dict(I16) for n in names}


SEG_TOP = ("/Slice_1", "/Slice_2", "/Slice", "/Concat_1", "/dec3/act/Relu")
OCR_TOP = ("p2o.Conv.0", "p2o.Conv.1", "p2o.Mul.6", "p2o.Mul.0", "p2o.Conv.9",
           "p2o.Add.98", "p2o.Mul.4", "p2o.Add.6", "p2o.Conv.34", "p2o.Mul.14")


def cases() -> dict[str, list[Any]]:
    from tuner.toolchain.fidelity import Case

    common = [Case("int8")]
    seg = common + [
        Case("int16_top1", node_info=_int16(*SEG_TOP[:1])),
        Case("int16_top2", node_info=_int16(*SEG_TOP[:2])),
        Case("int16_top5", node_info=_int16(*SEG_TOP[:5])),
        Case("all_int16", optimization="set_all_nodes_int16"),
        Case("cpu_shallow", node_info={"/fuse/conv/Conv": dict(CPU)}),
        Case("cpu_mid", node_info={"/dec3/conv/Conv": dict(CPU)}),
        Case("cpu_deep", node_info={"/dec1/conv/Conv": dict(CPU)}),
        Case("int16_2convs", node_info=_int16("/stem/conv/Conv", "/fuse/conv/Conv")),
        Case("cpu_interior", node_info={"/Mul_1": dict(CPU)}),
        Case("int16_concat4", node_info=_int16("/Concat_4")),
    ] + [Case(name, calibration=cal, node_info=ni) for name, cal, ni in SEG_PARETO]
    ocr = common + [
        Case("int16_top1", node_info=_int16(*OCR_TOP[:1])),
        Case("int16_top2", node_info=_int16(*OCR_TOP[:2])),
        Case("int16_top5", node_info=_int16(*OCR_TOP[:5])),
        Case("int16_top10", node_info=_int16(*OCR_TOP[:10])),
        Case("all_int16", optimization="set_all_nodes_int16"),
        Case("cpu_shallow", node_info={"p2o.Conv.2": dict(CPU)}),
        Case("cpu_mid", node_info={"p2o.Conv.25": dict(CPU)}),
        Case("cpu_deep", node_info={"p2o.Conv.58": dict(CPU)}),
        Case("int16_2convs", node_info=_int16("p2o.Conv.0", "p2o.Conv.61")),
        Case("cpu_interior", node_info={"p2o.Mul.110": dict(CPU)}),
        Case("int16_concat", node_info=_int16("p2o.Concat.0")),
    ]
    return {"segdepth": seg, "ppocr_det": ocr}


#: Pareto trials of ``tuner search`` on the example (filled in from the short search; see the docstring).
#: The four Pareto trials of that search (trial numbers in the names); calibration as the base YAML's
#: (max): hbdk's estimate depends on what runs where in which dtype, not on thresholds.
_I16_IN = {"InputType": "int16"}
SEG_PARETO: list[tuple[str, dict[str, Any], dict[str, dict[str, str]]]] = [
    ("pareto_t14", {}, {**_int16("/Concat_1", "/Concat_3", "/Mul_3", "/Slice", "/Slice_2", "/dec2/conv/Conv",
                                 "/dec3/act/Relu", "/dec3/conv/Conv", "/enc3/enc3.1/conv2/Conv"),
                        "/Greater": {"ON": "BPU"}, "/Slice_1": dict(CPU),
                        "/enc3/enc3.0/act/Relu": _I16_IN, "/enc3/enc3.0/conv/Conv": _I16_IN,
                        "/enc3/enc3.1/conv1/act/Relu": _I16_IN}),
    ("pareto_t22", {}, {**_int16("/Concat_1", "/Concat_3", "/dec2/conv/Conv", "/enc3/enc3.1/conv1/conv/Conv",
                                 "/radar/act/Clip", "/radar_gate/Conv"),
                        "/Greater": {"ON": "BPU"}, "/Mul_3": dict(CPU), "/Slice_1": dict(CPU),
                        "/Slice": _I16_IN, "/Slice_2": _I16_IN, "/enc2/enc2.1/relu/Relu": _I16_IN,
                        "/enc3/enc3.0/act/Relu": _I16_IN, "/seg_head/seg_head.1/Conv": _I16_IN}),
    ("pareto_t23", {}, {**_int16("/Concat_1", "/Concat_3", "/Concat_4", "/Mul_5", "/Slice_2",
                                 "/enc3/enc3.1/conv1/conv/Conv", "/radar/act/Clip", "/radar_gate/Conv"),
                        "/Greater": {"ON": "BPU"}, "/Mul_3": dict(CPU), "/Slice_1": dict(CPU),
                        "/enc3/enc3.0/conv/Conv": dict(CPU), "/enc3/enc3.1/Add": dict(CPU),
                        "/Slice": _I16_IN, "/dec2/conv/Conv": _I16_IN, "/dec3/act/Relu": _I16_IN,
                        "/enc2/enc2.1/relu/Relu": _I16_IN, "/enc3/enc3.0/act/Relu": _I16_IN,
                        "/seg_head/seg_head.1/Conv": _I16_IN}),
    ("pareto_t37", {}, {**_int16("/Concat_1", "/Concat_3", "/Slice", "/enc2/enc2.1/relu/Relu",
                                 "/enc3/enc3.0/conv/Conv", "/radar_gate/Conv"),
                        "/Greater": {"ON": "BPU"}, "/Mul_3": dict(CPU), "/radar/act/Clip": dict(CPU),
                        "/Slice_1": _I16_IN, "/dec2/conv/Conv": _I16_IN, "/dec3/act/Relu": _I16_IN,
                        "/enc3/enc3.0/act/Relu": _I16_IN, "/seg_head/seg_head.1/Conv": _I16_IN}),
]


# --------------------------------------------------------------------------- the op zoo (fit data only)
#: Small models that hold one layer of each kind side by side on one feature map (C channels, H x W),
#: converted all-int8 and under set_all_nodes_int16: per-kind costs at sizes the two models lack. In
#: ``opzoo`` every branch is a model output (hb makes outputs int16 and spreads it up: mixed
#: precision even in the int8 YAML); in ``opzoo2`` a 1x1 Conv to 8 channels ends every branch (clean
#: int8; hb_mapper 1.24.3 refuses it under set_all_nodes_int16: "variable ..._y_scale_int8 already
#: exists in graph inputs").
OPZOO = {"opzoo": ((16, 64, 64), (32, 64, 64), (64, 32, 32), (16, 128, 128)),
         "opzoo2": ((16, 64, 64), (64, 32, 32), (32, 32, 32), (128, 16, 16))}


def _zoo_model(c: int, h: int, w: int, heads: bool) -> Any:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes: list[Any] = []
    inits: list[Any] = []
    outs: list[Any] = []

    def conv(name: str, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
             out: str | None = None) -> str:
        wt = numpy_helper.from_array((rng.standard_normal((cout, cin // group, k, k))
                                      / np.sqrt(cin // group * k * k)).astype(np.float32), f"{name}.w")
        b = numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{name}.b")
        inits.extend([wt, b])
        o = out or f"{name}_out"
        nodes.append(helper.make_node("Conv", [x, wt.name, b.name], [o], name=name, pads=[k // 2] * 4,
                                      strides=[stride] * 2, group=group))
        return o

    def output(name: str, shape: list[int]) -> None:   # a model output, or a 1x1 Conv head to one
        if heads:
            conv(f"/head{len(outs)}", name, shape[1], 8, k=1, out=f"y{len(outs)}")
            outs.append(helper.make_tensor_value_info(f"y{len(outs)}", TensorProto.FLOAT, [1, 8] + shape[2:]))
        else:
            outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))

    conv("/stem/Conv", "x", 3, c)
    nodes.append(helper.make_node("Relu", ["/stem/Conv_out"], ["t0"], name="/stem/Relu"))
    # the order of nodes, initializers and random draws is the one the cached conversions were made with
    for args, shape in [(("/b/conv3", "t0", c, c), [1, c, h, w]), (("/b/conv1", "t0", c, 2 * c, 1), [1, 2 * c, h, w]),
                        (("/b/dw", "t0", c, c, 3, 1, c), [1, c, h, w]),
                        (("/b/convs2", "t0", c, 2 * c, 3, 2), [1, 2 * c, h // 2, w // 2])]:
        output(conv(*args, out="o_" + str(args[0]).rsplit("/", 1)[1]), shape)
    mk = helper.make_node
    nodes.append(mk("Sigmoid", ["t0"], ["sig"], name="/b/Sigmoid"))
    for node, shape in [
        (mk("Mul", ["t0", "sig"], ["o_mul"], name="/b/Mul"), [1, c, h, w]),
        (mk("Add", ["t0", "sig"], ["o_add"], name="/b/Add"), [1, c, h, w]),
        (mk("Concat", ["t0", "sig"], ["o_cat"], name="/b/Concat", axis=1), [1, 2 * c, h, w]),
        (mk("MaxPool", ["t0"], ["o_mp3"], name="/b/MaxPool3", kernel_shape=[3, 3], pads=[1] * 4), [1, c, h, w]),
        (mk("MaxPool", ["t0"], ["o_mp2"], name="/b/MaxPool2", kernel_shape=[2, 2], strides=[2, 2]),
         [1, c, h // 2, w // 2]),
        (mk("AveragePool", ["t0"], ["o_ap2"], name="/b/AvgPool2", kernel_shape=[2, 2], strides=[2, 2]),
         [1, c, h // 2, w // 2]),
    ]:
        nodes.append(node)
        output(node.output[0], shape)
    inits += [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
              numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    for node, shape in [
        (mk("Resize", ["t0", "roi", "scales"], ["o_rs"], name="/b/Resize", mode="nearest"), [1, c, 2 * h, 2 * w]),
        (mk("Resize", ["t0", "roi", "scales"], ["o_rsl"], name="/b/ResizeLin", mode="linear"), [1, c, 2 * h, 2 * w]),
        (mk("GlobalAveragePool", ["t0"], ["o_gap"], name="/b/GAP"), [1, c, 1, 1]),
    ]:
        nodes.append(node)
        output(node.output[0], shape)
    wt = numpy_helper.from_array((rng.standard_normal((c, c, 2, 2)) / np.sqrt(4 * c)).astype(np.float32), "/b/deconv.w")
    inits.append(wt)
    for node, shape in [
        (mk("ConvTranspose", ["t0", wt.name], ["o_deconv"], name="/b/ConvTranspose", kernel_shape=[2, 2],
            strides=[2, 2]), [1, c, 2 * h, 2 * w]),
        (mk("HardSigmoid", ["t0"], ["o_hsig"], name="/b/HardSigmoid"), [1, c, h, w]),
    ]:
        nodes.append(node)
        output(node.output[0], shape)
    g = helper.make_graph(nodes, "zoo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])], outs,
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    return m


def zoo_project(root: Path, family: str, c: int, h: int, w: int) -> tuple[Path, list[Path]]:
    import numpy as np
    import onnx
    from helpers import hb_yaml

    root.mkdir(parents=True, exist_ok=True)
    onnx.save(_zoo_model(c, h, w, heads=family == "opzoo2"), str(root / "zoo.onnx"))
    (root / "cal").mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(4):
        rng.random((1, 3, h, w), dtype=np.float32).tofile(root / "cal" / f"{i:04d}.bin")
    cfg = root / "hb_config.yaml"
    cfg.write_text(hb_yaml("zoo.onnx", "x", f"1x3x{h}x{w}", prefix="zoo"))
    return cfg, [root / "cal"]


def builders() -> dict[str, Any]:
    """model name -> (build(root) -> (yaml, eval folders), the configurations)."""
    from fidelity_suite import MODELS

    from tuner.toolchain.fidelity import Case

    out: dict[str, Any] = {name: (MODELS[name][0], cs) for name, cs in cases().items()}
    for family, sizes in OPZOO.items():
        for c, h, w in sizes:
            zcases = [Case("int8")] + ([Case("all_int16", optimization="set_all_nodes_int16")]
                                       if family == "opzoo" else [])
            out[f"{family}_{c}x{h}x{w}"] = (
                lambda root, f=family, c=c, h=h, w=w: zoo_project(root, f, c, h, w), zcases)
    return out


def _machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {name}"


def _load() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8")) if DATA.is_file() else {"models": {}}


def collect(models: list[str], only: set[str] | None) -> int:
    from tuner.toolchain.hbrun import CompileKnobs
    from tuner.toolchain.installed import require_toolchain

    tc = require_toolchain()
    data = _load()
    data["toolchain"] = tc.fingerprint
    data["machine"] = _machine()
    knobs = CompileKnobs(optimize_level="O3", debug=True)
    with tempfile.TemporaryDirectory(prefix="tuner-latency-") as tmp:
        every = builders()
        for name in models:
            for mname in [m for m in every if m.startswith("opzoo")] if name == "opzoo" else [name]:
                _collect_model(tc, data, knobs, every, mname, Path(tmp), only)
    print(DATA)
    return 0


def _collect_model(tc: Any, data: dict[str, Any], knobs: Any, every: dict[str, Any], name: str, tmp: Path,
                   only: set[str] | None) -> None:
    from tuner.cost.hbdk import calibrated_qtypes, subgraph_estimates
    from tuner.files import write_atomic
    from tuner.toolchain.fidelity import write_case
    from tuner.toolchain.hbrun import convert

    build, model_cases = every[name]
    cfg, _ = build(tmp / name)
    if name in GOAL_MODELS:
        model_cases = list(model_cases) + fit_cases(cfg)
    for case in model_cases:
        if only and case.name not in only:
            continue
        path = write_case(cfg, case, tmp / name / "cases")
        t0 = time.perf_counter()
        conv = convert(tc, path, knobs, say=lambda m: print(m, file=sys.stderr, flush=True))
        rec: dict[str, Any] = {"node_info": case.node_info, "optimization": case.optimization,
                               "calibration": case.calibration, "ok": conv.ok, "error": conv.error,
                               "seconds": conv.seconds, "run": conv.key}
        if conv.ok:
            rec["subgraphs"] = [s.to_json() for s in subgraph_estimates(conv.out_dir)]
            rec["cpu_nodes"] = list(conv.cpu_nodes)
            rec["qtypes"] = {k: {"op": v.op_type, "in": list(v.inputs), "out": list(v.outputs)}
                             for k, v in calibrated_qtypes(conv.model("calibrated")).items()}
            ms = sum(s["latency_us"] for s in rec["subgraphs"]) / 1e3
            print(f"{name}/{case.name}: hbdk {ms:.3f} ms, {len(rec['subgraphs'])} subgraph(s), "
                  f"{conv.seconds:.0f} s ({time.perf_counter() - t0:.0f} s here)", file=sys.stderr, flush=True)
        else:
            print(f"{name}/{case.name}: failed: {conv.error}", file=sys.stderr, flush=True)
        # merged into the file as it is now (another collect may run beside this one)
        latest = _load()
        latest.update({k: data[k] for k in ("toolchain", "machine")})
        latest.setdefault("models", {}).setdefault(name, {"cases": {}})["cases"][case.name] = rec
        write_atomic(DATA, json.dumps(latest, indent=None, separators=(",", ":")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--models", default="segdepth,ppocr_det,opzoo", help="segdepth, ppocr_det, opzoo (the op zoo's "
                                                                      "models) or one opzoo model by name")
    c.add_argument("--cases", help="only these configurations (comma-separated)")
    f = sub.add_parser("fit")
    f.add_argument("--write", action="store_true", help="write the constants into search_spaces/targets/bayes-e.yaml")
    r = sub.add_parser("report")
    r.add_argument("--out", default=str(REPO / "results" / "benchmarks" / "latency_fidelity.md"))
    args = ap.parse_args()
    if args.cmd == "collect":
        return collect(args.models.split(","), set(args.cases.split(",")) if args.cases else None)
    if args.cmd == "fit":
        return fit_shipped(args.write)
    return report(Path(args.out))


# --------------------------------------------------------------------------- fitting and the table

GOAL_MODELS = ("segdepth", "ppocr_det")
#: What the per-model fit uses of the stored compiles: `tuner latency fit`'s variants (all-int8, int16 on
#: the largest int16-capable layers, a Conv near the middle on the CPU), converted by collect as fit_*.
FIT_CASES = ("int8", "fit_int16", "fit_cut")


def load_samples(data: dict[str, Any], tmp: Path, coefficients: Any | None = None) -> dict[str, Any]:
    """Per model: the cost model, and per stored configuration (its plan, the real and the plan's precision,
    hbdk's estimates)."""
    from tuner.candidate import Candidate
    from tuner.cost.fit import real_precision
    from tuner.cost.hbdk import NodeQtypes, SubgraphEstimate
    from tuner.cost.latency import CostModel, Precision
    from tuner.simulate.plan import make_plan
    from tuner.workspace import Workspace

    every = builders()
    out: dict[str, Any] = {}
    for name, m in data["models"].items():
        if name not in every:
            continue
        cfg, _ = every[name][0](tmp / name)
        ws = Workspace.open(cfg, limit=1)
        cm = CostModel(ws.graph, ws.target)
        entries = {}
        for cname, rec in m["cases"].items():
            if not rec.get("ok") or not rec.get("subgraphs"):
                continue
            cand = Candidate.make(nodes=rec["node_info"],
                                  optimization=(rec["optimization"],) if rec["optimization"] else ())
            plan = make_plan(ws.graph, ws.target, cand)
            q = {k: NodeQtypes(v["op"], tuple(v["in"]), tuple(v["out"])) for k, v in rec["qtypes"].items()}
            est = [SubgraphEstimate.from_json(e) for e in rec["subgraphs"]]
            entries[cname] = {"plan": plan, "real": real_precision(cm, plan, q, est), "mine": Precision.of_plan(plan),
                              "est": est, "rec": rec}
        out[name] = {"cm": cm, "ws": ws, "cases": entries}
    return out


def fit_cases(cfg: Path) -> list[Any]:
    """The compiles `tuner latency fit` makes for this YAML, as cases (their int8 one is the int8 case)."""
    from tuner.commands.latency import variants
    from tuner.graph import load_target
    from tuner.inputs.config import load_config
    from tuner.toolchain.fidelity import Case
    from tuner.workspace import Workspace

    ws = Workspace.open(cfg, limit=1)
    _ = load_config, load_target
    out = []
    for name, cand in variants(ws.graph, ws.target, ws.base_candidate(), 3, True):
        if name.startswith("fit_"):
            ni = {k: s.to_dict() for k, s in cand.nodes}
            out.append(Case(name, node_info=ni))
    return out


def samples_of(models: dict[str, Any], which: str = "real", share: float = 0.0) -> list[Any]:
    from tuner.cost.fit import make_sample

    return [make_sample(m["cm"], e[which], sum(x.latency_us for x in e["est"]), cname, name, e["est"], share)
            for name, m in models.items() for cname, e in m["cases"].items()]


def fit_shipped(write: bool) -> int:
    """Fit the shipped BPU constants on every stored compile (real qtypes) and print them (--write: into
    search_spaces/targets/bayes-e.yaml's cost.bpu)."""
    from tuner.cost.fit import fit_layers, fit_totals, modeled_us
    from tuner.cost.latency import BpuCoefficients

    data = _load()
    with tempfile.TemporaryDirectory(prefix="tuner-latency-") as tmp:
        models = load_samples(data, Path(tmp))
        samples = samples_of(models, "real", LOAD_STORE_SHARE)
        rows = [r for s in samples for r in s.rows]
        prior = BpuCoefficients.from_dict(PRIOR)
        lay = fit_layers(rows, prior)
        tot = fit_totals(samples, lay)
    n_models = len({s.model for s in samples})
    tot = BpuCoefficients(layers=tot.layers, terms=tot.terms, source=(
        f"benchmarks/latency_fidelity.py fit: {len(samples)} O3 compiles of {n_models} models (the example, "
        f"PP-OCRv4 det, the op zoo), {len(rows)} layer rows; {data.get('toolchain', '')}"))
    for s in samples:
        m = modeled_us(s, tot)
        print(f"{s.model:20s} {s.name:16s} hbdk {s.hbdk_us:9.1f} model {m:9.1f} ({m / s.hbdk_us - 1:+.1%})")
    block = _yaml_block(tot.to_dict())
    if write:
        path = REPO / "search_spaces" / "targets" / "bayes-e.yaml"
        text = path.read_text(encoding="utf-8")
        start = text.index("  bpu:\n")
        end = text.index("  # The board:")
        path.write_text(text[:start] + block + text[end:], encoding="utf-8")
        print(f"written: {path}")
    else:
        print(block)
    return 0


def _yaml_block(d: dict[str, Any]) -> str:
    lines = ["  bpu:", f"    source: \"{d['source']}\"",
             "    # kind: {precision of the input: [fixed us, then us per million MACs, per thousand input elements,",
             "    #        per thousand output elements: a layer costs the fixed part plus the largest of the three]}",
             "    layers:"]
    for kind, per in d["layers"].items():
        inner = ", ".join(f"{p}: [{', '.join(f'{v:.4g}' for v in t)}]" for p, t in per.items())  # noqa: B023
        lines.append(f"      {kind}: {{{inner}}}")
    from tuner.cost.latency import GLOBAL_TERMS

    notes = {"out16_kelem": "an int16 output's write, us per thousand elements",
             "requant_kelem": "a Requantize layer (int16 meets an op refusing it, after an int16 Conv), us per thousand elements",
             "io_kbyte": "DDR traffic of the model's inputs and outputs, us per kilobyte",
             "cut_kbyte": "DDR traffic of tensors cut between subgraphs and CPU nodes, us per kilobyte",
             "cut_tensor": "a tensor cut between a subgraph and a CPU node or another subgraph, us",
             "relayout_kpix": "a tensor handed between two BPU subgraphs, converted out of and into the BPU's "
                              "layout, us per thousand pixels",
             "subgraph": "per BPU subgraph, us",
             "model": "per model, us (tuner latency fit sets it for a model)"}
    for t in GLOBAL_TERMS:
        lines.append(f"    {t}: {d[t]:.4g}   # {notes[t]}")
    return "\n".join(lines) + "\n"


#: Where the fit starts and what it is pulled toward where a term has little data: hand estimates from the
#: example's per-layer table (all-int8 O3: a Conv ~0.3 us per million MACs, element-wise ops ~0.06 us per
#: thousand elements) and the op zoo's int16 rows (MaxPool ~1.5-2.6 us per thousand elements).
PRIOR: dict[str, Any] = {
    "layers": {
        "conv": {"int8": [1.0, 0.3, 0.01, 0.01], "int16": [2.0, 1.0, 0.2, 0.1]},
        "dwconv": {"int8": [1.0, 0.5, 0.03, 0.03], "int16": [2.0, 2.0, 0.3, 0.2]},
        "deconv": {"int8": [1.0, 0.3, 0.05, 0.1], "int16": [2.0, 1.2, 0.2, 0.2]},
        "matmul": {"int8": [1.0, 0.3, 0.05, 0.05], "int16": [2.0, 1.2, 0.2, 0.2]},
        "scale": {"int8": [1.0, 0.0, 0.03, 0.03], "int16": [2.0, 0.0, 0.3, 0.3]},
        "eltwise": {"int8": [1.0, 0.0, 0.03, 0.06], "int16": [2.0, 0.0, 0.1, 0.2]},
        "lut": {"int8": [1.0, 0.0, 0.03, 0.03], "int16": [2.0, 0.0, 0.06, 0.06]},
        "maxpool": {"int8": [1.0, 0.0, 0.03, 0.06], "int16": [2.0, 0.0, 1.0, 2.0]},
        "avgpool": {"int8": [1.0, 0.1, 0.03, 0.05], "int16": [2.0, 0.4, 0.2, 0.3]},
        "gpool": {"int8": [1.0, 0.0, 0.05, 0.05], "int16": [2.0, 0.0, 0.1, 0.1]},
        "resize": {"int8": [1.0, 0.0, 0.05, 0.1], "int16": [2.0, 0.0, 0.1, 0.2]},
        "concat": {"int8": [1.0, 0.0, 0.02, 0.04], "int16": [2.0, 0.0, 0.05, 0.1]},
        "move": {"int8": [3.0, 0.0, 0.02, 0.05], "int16": [3.0, 0.0, 0.05, 0.1]},
        "softmax": {"int8": [5.0, 0.0, 0.1, 0.2], "int16": [5.0, 0.0, 0.2, 0.4]},
        "other": {"int8": [2.0, 0.0, 0.05, 0.1], "int16": [2.0, 0.0, 0.1, 0.2]},
    },
    "out16_kelem": 0.01, "requant_kelem": 0.03, "io_kbyte": 0.01, "cut_kbyte": 0.01, "cut_tensor": 10.0, "relayout_kpix": 6.0,
    "subgraph": 10.0, "model": 0.0,
}
#: The share of a layer's load/store cost the per-layer fit adds to its computing cost (at O3 most of it
#: overlaps with computing; the subgraph totals set the rest).
LOAD_STORE_SHARE = 0.3


def _spearman(a: list[float], b: list[float]) -> float:
    import numpy as np

    def rank(x: list[float]) -> Any:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in set(x):      # ties share their mean rank
            idx = [i for i, y in enumerate(x) if y == v]
            r[idx] = np.mean(r[idx])
        return r

    if len(a) < 2:
        return float("nan")
    return float(np.corrcoef(rank(a), rank(b))[0, 1])


def _fit_without(models: dict[str, Any], data: dict[str, Any], leave: str) -> Any:
    """The shipped fit made without model ``leave``'s compiles (how the constants do on a model they never
    saw)."""
    from tuner.cost.fit import fit_layers, fit_totals
    from tuner.cost.latency import BpuCoefficients

    samples = [s for s in samples_of({k: v for k, v in models.items() if k != leave}, "real", LOAD_STORE_SHARE)]
    lay = fit_layers([r for s in samples for r in s.rows], BpuCoefficients.from_dict(PRIOR))
    return fit_totals(samples, lay)


def report(out: Path) -> int:
    from tuner.cost.fit import fit_scales, make_sample

    data = _load()
    before = json.loads(BEFORE.read_text(encoding="utf-8")) if BEFORE.is_file() else {"models": {}}
    t0 = time.perf_counter()
    sections, summary = [], []
    with tempfile.TemporaryDirectory(prefix="tuner-latency-") as tmp:
        models = load_samples(data, Path(tmp))
        for name in GOAL_MODELS:
            if name not in models or "int8" not in models[name]["cases"]:
                continue
            m = models[name]
            cm, cases_ = m["cm"], m["cases"]
            shipped = cm.shipped
            blind = _fit_without(models, data, name)

            def per_model(coef: Any, cm: Any = cm, cases_: Any = cases_) -> tuple[Any, dict[str, float]]:
                fs = [make_sample(cm, cases_[c]["real"], sum(x.latency_us for x in cases_[c]["est"]), c)
                      for c in FIT_CASES if c in cases_]
                sc = fit_scales(fs, coef) if fs else {}
                return coef.scaled(sc), sc

            fitted, scales = per_model(shipped)
            blind_fitted, _ = per_model(blind)
            names = [c for c in cases_ if not c.startswith("fit_")]
            hb = {c: sum(x.latency_us for x in cases_[c]["est"]) / 1e3 for c in names}

            def ms(c: str, which: str, coef: Any, cm: Any = cm, cases_: Any = cases_) -> float:
                return sum(cm.compiler_us(cases_[c][which], coef)) / 1e3

            def ratio(c: str, which: str, coef: Any) -> float:
                return ms(c, which, coef) / ms("int8", which, coef)

            old = before["models"].get(name, {})
            cols: dict[str, list[float]] = {k: [] for k in ("hbdk", "before", "shipped", "fitted", "real", "blind",
                                                            "layers")}
            # hbdk's own per-layer table summed (computing costs): how far its estimate is from a sum of layers
            # (the schedule overlaps them), i.e. the best any per-layer model could do
            lsum = {c: sum(r.compute_us for x in cases_[c]["est"] for r in x.layers) for c in names}
            rows = []
            for c in names:
                r_hb = hb[c] / hb["int8"]
                r_old = old[c]["bpu_ms"] / old["int8"]["bpu_ms"] if c in old and "int8" in old else float("nan")
                got = {"hbdk": r_hb, "before": r_old, "shipped": ratio(c, "mine", shipped),
                       "fitted": ratio(c, "mine", fitted), "real": ratio(c, "real", fitted),
                       "blind": ratio(c, "mine", blind_fitted), "layers": lsum[c] / lsum["int8"]}
                for k, v in got.items():
                    cols[k].append(v)
                n16 = len(cases_[c]["real"].in16)
                rows.append(f"| {c} | {len(cases_[c]['est'])} | {n16} | {hb[c]:.3f} | {r_hb:.3f} | "
                            f"{old.get(c, {}).get('bpu_ms', float('nan')):.3f} | {r_old:.3f} | "
                            f"{got['shipped']:.3f} | {ms(c, 'mine', fitted):.3f} | "
                            f"{got['fitted']:.3f} ({got['fitted'] / r_hb - 1:+.1%}) | "
                            f"{got['real']:.3f} ({got['real'] / r_hb - 1:+.1%}) |")

            def within(k: str, cols: dict[str, list[float]] = cols) -> str:
                errs = [v / h - 1 for v, h in zip(cols[k], cols["hbdk"])]
                return f"{sum(abs(e) <= 0.10 for e in errs)}/{len(errs)} (max {max(abs(e) for e in errs):.1%})"

            def sp(k: str, cols: dict[str, list[float]] = cols) -> str:
                return f"{_spearman(cols['hbdk'], cols[k]):.3f}"

            a_old = old.get("int8", {}).get("bpu_ms", float("nan"))
            a_ship, a_fit = ms("int8", "mine", shipped), ms("int8", "mine", fitted)
            summary.append(
                f"| {name} | {len(names)} | {sp('before')} | {sp('shipped')} | **{sp('fitted')}** | {sp('real')} | "
                f"{sp('blind')} | {sp('layers')} | "
                f"{within('before')} | {within('shipped')} | **{within('fitted')}** | {within('real')} | "
                f"{within('blind')} | {within('layers')} | {hb['int8']:.3f} | {a_old:.3f} ({a_old / hb['int8'] - 1:+.0%}) | "
                f"{a_ship:.3f} ({a_ship / hb['int8'] - 1:+.1%}) | **{a_fit:.3f} ({a_fit / hb['int8'] - 1:+.1%})** |")
            ranked = sorted(cols["hbdk"])
            gaps = [b - a for a, b in zip(ranked, ranked[1:])]
            close = sum(g < 0.02 for g in gaps)
            fit_text = ", ".join(f"{k} {v:+.1f} us" if k == "model" else f"{k} x{v:.3f}" for k, v in scales.items())
            sections.append(
                f"### {name}\n\nPer-model fit (`tuner latency fit`'s compiles: "
                f"{', '.join(c for c in FIT_CASES if c in cases_)}): {fit_text}. hbdk's ratios, sorted, are "
                f"{close} of {len(gaps)} times less than 0.02 apart (median gap {sorted(gaps)[len(gaps) // 2]:.3f}).\n\n"
                "| config | BPU subgraphs | int16 layers (real) | hbdk ms | hbdk ratio | before: tuner BPU ms | "
                "before: ratio | shipped: ratio | tuner ms (fitted) | tuner ratio (fitted) | "
                "tuner ratio, real qtypes |\n|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    header = (
        "# Latency: tuner's BPU model against hbdk's O3 estimate\n\n"
        f"Toolchain {data.get('toolchain', '?')}. Compiles collected with `python benchmarks/latency_fidelity.py "
        f"collect` on {data.get('machine', '?')}; this table by `python benchmarks/latency_fidelity.py report` "
        f"({time.perf_counter() - t0:.0f} s, no toolchain needed). hbdk's estimate is BPU time only (no CPU op, no "
        "BPU<->CPU transfer) at `optimize_level: O3`, what a board runs. Every ratio is to the all-int8 "
        "configuration of the same column.\n\n"
        f"* **before**: tuner's BPU part at commit {before.get('commit', '?')} (a roofline);\n"
        "* **shipped**: the constants in `search_spaces/targets/bayes-e.yaml` (fitted on every compile below and "
        "the op zoo's, real qtypes), on tuner's own plan;\n"
        "* **fitted**: after `tuner latency fit` (3 compiles of the model: all-int8, int16 on its 3 Convs with "
        "the most MACs, a Conv near the middle on the CPU), on tuner's own plan (its int16 spread and "
        "placement): what a search sees;\n"
        "* **real qtypes**: the same, on what hb_mapper's calibrated model really made int16 (the cost model's "
        "error alone, without the planner's);\n"
        "* **blind**: constants fitted without this model's compiles, then `tuner latency fit`;\n"
        "* **hbdk's layer sum**: hbdk's own per-layer table, its computing costs summed, against its estimate "
        "(a schedule: layers overlap, subgraphs fill and drain): how well per-layer prices alone, even exact "
        "ones, rank the configurations.\n\n"
        "Goal: every ratio within 10 % of hbdk's, Spearman >= 0.95, all-int8 within 15 % after the per-model "
        "fit.\n\n"
        "| model | configs | Spearman before | Spearman shipped | Spearman fitted | Spearman real qtypes | Spearman "
        "blind | Spearman hbdk's layer sum | ratio within 10 %: before | shipped | fitted | real qtypes | blind | "
        "hbdk's layer sum | all-int8 hbdk ms | before ms | shipped ms | fitted ms |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    from tuner.files import write_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, header + "\n".join(summary) + "\n\n" + "\n".join(sections))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
