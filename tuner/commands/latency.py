"""``tuner latency``: fit the BPU cost model to the real compiler for one model, and to a board.

``tuner latency fit CONFIG.yaml`` converts a handful of variants of the YAML with the real toolchain at
``optimize_level: O3`` with hbdk's debug tables (all-int8; int16 on the three Convs with the most MACs;
one Conv of the trunk on the CPU), reads hbdk's estimate and what the real calibrated
model made int16, fits three scales of the shipped coefficients (int8 layers, int16 layers, subgraph
I/O; :func:`tuner.cost.fit.fit_scales`) and keeps them by model fingerprint in tuner's cache folder,
where ``tuner eval`` and ``tuner search`` find them. Conversions are cached by content.

``tuner latency board PERF.txt --config CONFIG.yaml`` reads the output of ``hrt_model_exec perf``
(1 thread) for the ``.bin`` of that YAML, adds the point to the board's campaign (its firmware from the
perf output) and refits board_ms against hbdk's estimate (:mod:`tuner.cost.board`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tuner.commands import args as a
from tuner.errors import TunerError

INT16 = {"InputType": "int16", "OutputType": "int16"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("latency", help="fit the latency model to the real compiler (per model) or to a board",
                       description="Fit tuner's BPU latency model to hbdk, the real X5 compiler, for one model "
                                   "('fit'), or to a board's hrt_model_exec perf numbers ('board'); 'show' prints "
                                   "the modeled latency of a YAML and what it is fitted to.")
    lsub = p.add_subparsers(dest="latency_cmd", required=True, metavar="{fit,board,show}")

    f = lsub.add_parser("fit", help="a handful of real compiles refine the cost constants for this model",
                        description="Convert variants of the YAML at O3 with the real toolchain (all-int8, int16 on "
                                    "a few nodes, a Conv on the CPU), read hbdk's latency estimate and the real "
                                    "int16 tensors, and fit per-model scales of the shipped constants. Kept by model "
                                    "fingerprint; tuner eval and tuner search use them for this model.")
    a.config(f)
    f.add_argument("--int16-nodes", type=a.positive_int, default=3,
                   help="how many nodes the int16 variant makes int16 (default 3)")
    f.add_argument("--no-cut", action="store_true", help="skip the CPU-cut variant")
    f.add_argument("--timeout", type=a.positive_float, help="seconds per conversion")
    a.march(f)
    a.json_output(f)
    f.set_defaults(func=fit)

    b = lsub.add_parser("board", help="read hrt_model_exec perf output and refit the board against hbdk",
                        description="Read the output of hrt_model_exec perf --thread_num 1 for the .bin of "
                                    "CONFIG, add it to the board's campaign (one per board and firmware, never "
                                    "pooled) and refit board_ms = a x hbdk estimate + b x MB of float32 outputs + c.")
    b.add_argument("perf", help="the console output of hrt_model_exec perf (a file)")
    b.add_argument("--config", required=True, help="the hb_mapper YAML the .bin was built from")
    b.add_argument("--board", default="rdk-x5", help="a name for the board (default rdk-x5)")
    b.add_argument("--hbdk-ms", type=a.positive_float,
                   help="hbdk's estimate of that .bin (its log's latency lines, summed); default: convert the "
                        "YAML with the installed toolchain, else tuner's model of it")
    a.march(b)
    a.json_output(b)
    b.set_defaults(func=board)

    s = lsub.add_parser("show", help="the modeled latency of a YAML, per part, and what the model is fitted to")
    a.config(s)
    s.add_argument("--board", help="with this board's fit (tuner latency board)")
    a.march(s)
    a.json_output(s)
    s.set_defaults(func=show)


# --------------------------------------------------------------------------- helpers


def variants(graph: Any, target: Any, base: Any, n16: int, cut: bool) -> list[tuple[str, Any]]:
    """The compiles ``fit`` makes: (name, candidate), from the YAML's calibration and placement requests
    (its precision requests dropped): all-int8; int16 on the ``n16`` Convs with the most MACs (what
    int16 costs most on, and what a search makes int16 most); one Conv on the CPU, the one nearest
    the middle of the graph whose move splits the BPU part in two (a new subgraph: the DDR traffic on
    both sides of a cut). Depends only on the graph, so the same model gives the same compiles."""
    from tuner.candidate import Candidate
    from tuner.cost.bpu import layers
    from tuner.simulate.plan import make_plan

    keep = {k: {"ON": s.on} for k, s in base.nodes if s.on}
    int8 = Candidate.make(base.calibration, keep)
    plan8 = make_plan(graph, target, int8)
    out: list[tuple[str, Any]] = [("int8", int8)]
    order = {n.name: i for i, n in enumerate(graph)}
    heads = {lay.head: lay for lay in layers(graph, target).values()}
    able = [lay for h, lay in heads.items() if plan8.placement.get(h) == "BPU" and lay.kind == "conv"
            and target.int16_input(graph.by_name[h].op_type, 0) and target.int16_output(graph.by_name[h].op_type,
                                                                                         graph.by_name[h].proto)]
    chosen = [lay.head for lay in sorted(able, key=lambda x: (-x.macs, order[x.head]))[:n16]]
    if chosen:
        out.append(("fit_int16", Candidate.make(int8.calibration, {**keep, **{h: dict(INT16) for h in chosen}})))
    if cut:
        mid = len(order) / 2
        for n in sorted((n for n in graph if n.op_type == "Conv" and plan8.placement.get(n.name) == "BPU"),
                        key=lambda n: (abs(order[n.name] - mid), order[n.name])):
            cand = Candidate.make(int8.calibration, {**keep, n.name: {"ON": "CPU"}})
            try:
                if make_plan(graph, target, cand).n_subgraphs > plan8.n_subgraphs:
                    out.append(("fit_cut", cand))
                    break
            except TunerError:
                continue
    return out


# --------------------------------------------------------------------------- fit


def fit(args: argparse.Namespace) -> int:
    from tuner.toolchain.installed import find_toolchain

    tc = find_toolchain()
    if tc is None:
        print("tuner latency fit needs the real toolchain (tuner toolchain install); without it tuner uses the "
              "shipped constants", file=sys.stderr)
        return 2
    import datetime

    from tuner.console import say, table
    from tuner.cost.fit import fit_scales, make_sample, modeled_us, real_precision
    from tuner.cost.hbdk import calibrated_qtypes, subgraph_estimates
    from tuner.cost.latency import CostModel, ModelFit, fit_path
    from tuner.export.hb_yaml import dump_yaml, merged_config
    from tuner.files import cache_dir, write_atomic
    from tuner.inputs.config import load_config
    from tuner.simulate.plan import make_plan
    from tuner.toolchain.hbrun import CompileKnobs, convert
    from tuner.workspace import Workspace

    ws = Workspace.open(args.config, march=args.march, limit=1)
    cm = CostModel(ws.graph, ws.target)
    cfg = load_config(args.config)
    work = cache_dir() / "latency" / "yamls" / ws.model.fingerprint[:16]
    work.mkdir(parents=True, exist_ok=True)
    samples, rows = [], []
    t0 = time.perf_counter()
    for name, cand in variants(ws.graph, ws.target, ws.base_candidate(), args.int16_nodes, not args.no_cut):
        out = work / f"{name}.yaml"
        mapping, _ = merged_config(cfg.raw, Path(args.config), cand, out)
        write_atomic(out, dump_yaml(mapping))
        conv = convert(tc, out, CompileKnobs(optimize_level="O3", debug=True), timeout=args.timeout, say=say)
        if not conv.ok or not conv.subgraphs:
            say(f"{name}: not used ({conv.error or 'no hbdk estimate in the log'})")
            continue
        plan = make_plan(ws.graph, ws.target, cand)
        estimates = subgraph_estimates(conv.out_dir)     # every subgraph's file (the log may pair them wrong)
        p = real_precision(cm, plan, calibrated_qtypes(conv.model("calibrated")), estimates)
        hb = sum(e.latency_us for e in estimates) if estimates else sum(s.latency_us for s in conv.subgraphs)
        samples.append(make_sample(cm, p, hb, name, estimates=estimates))
        rows.append([name, f"{hb / 1e3:.3f}", f"{conv.seconds:.0f}"])
    if not samples:
        raise TunerError("no conversion gave hbdk's estimate; nothing to fit")
    scales = fit_scales(samples, cm.shipped)
    fitted = cm.shipped.scaled(scales)
    recs = []
    for s, row in zip(samples, rows):
        before, after = modeled_us(s, cm.shipped) / 1e3, modeled_us(s, fitted) / 1e3
        row[2:2] = [f"{before:.3f}", f"{after:.3f}", f"{after / (s.hbdk_us / 1e3) - 1:+.1%}"]
        recs.append({"name": s.name, "hbdk_ms": s.hbdk_us / 1e3, "modeled_ms_shipped": before, "modeled_ms": after})
    mf = ModelFit(model_sha256=ws.model.fingerprint, march=ws.target.march, scales=scales, samples=tuple(recs),
                  toolchain=tc.fingerprint, created=datetime.datetime.now(datetime.UTC).isoformat(
                      timespec="seconds"))
    path = fit_path(ws.model.fingerprint, ws.target.march)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(mf.to_json(), indent=1))
    if args.json:
        print(json.dumps({**mf.to_json(), "path": str(path)}, indent=2))
        return 0
    print(table(["compile", "hbdk ms", "modeled (shipped)", "modeled (fitted)", "fitted vs hbdk", "seconds"], rows))
    print(f"\n{mf.describe()}  ({time.perf_counter() - t0:.0f} s)")
    print(f"kept for this model ({ws.model.fingerprint[:12]}, {ws.target.march}): {path}")
    print("tuner eval and tuner search use it for this model")
    return 0


# --------------------------------------------------------------------------- board


def board(args: argparse.Namespace) -> int:
    from tuner.console import say
    from tuner.cost.board import BoardPoint, Campaign, campaign_path, load_campaign, parse_perf
    from tuner.cost.latency import BoardFit, CostModel, load_fit
    from tuner.files import write_atomic
    from tuner.workspace import Workspace

    runs = parse_perf(Path(args.perf).read_text(encoding="utf-8", errors="replace"))
    one = [r for r in runs if r.threads == 1]
    if not one:
        raise TunerError(f"{args.perf}: no run with 1 thread (threads: {', '.join(str(r.threads) for r in runs)}); "
                         "the per-frame latency needs `hrt_model_exec perf --thread_num 1`")
    run = one[-1]
    ws = Workspace.open(args.config, march=args.march, limit=1)
    est, source = args.hbdk_ms, "hbdk (given)"
    if est is None:
        from tuner.toolchain.hbrun import CompileKnobs, convert
        from tuner.toolchain.installed import find_toolchain

        tc = find_toolchain()
        if tc is not None:
            conv = convert(tc, args.config, CompileKnobs(optimize_level="O3"), say=say)
            if conv.ok and conv.bpu_latency_ms is not None:
                est, source = conv.bpu_latency_ms, "hbdk"
        if est is None:
            cm = CostModel(ws.graph, ws.target, fit=load_fit(ws.model.fingerprint, ws.target.march))
            est = cm.latency(ws.simulator.plan(ws.base_candidate())).compiler_ms
            source = "modeled"
            say(f"no hbdk estimate (no toolchain here): tuner's model of it, {est:.3f} ms, stands in")
    out_mb = sum(4 * _numel(ws.graph.shapes.get(t)) for t in ws.graph.output_names) / 1e6
    point = BoardPoint(name=Path(run.model_file or args.config).name, hbdk_ms=float(est), output_mb=out_mb,
                       board_ms=run.average_ms, estimate_source=source, source=str(Path(args.perf).resolve()))
    from tuner.cost.board import boards_dir

    folder = boards_dir()
    path = campaign_path(folder, args.board, run.firmware)
    camp = load_campaign(path) or Campaign(board=args.board, firmware=run.firmware)
    camp.points = [p for p in camp.points if p.name != point.name] + [point]
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(camp.to_json(), indent=1))
    default = BoardFit.from_dict((ws.target.raw.get("cost") or {}).get("board") or {})
    fitted, err = camp.fit(default)
    if args.json:
        print(json.dumps({"campaign": camp.to_json(), "fit": fitted.__dict__, "mean_error": err, "path": str(path)},
                         indent=2))
        return 0
    print(f"board      {args.board}  ({run.firmware})")
    print(f"perf       {run.average_ms:.3f} ms per frame, 1 thread ({run.frames or '?'} frames)")
    print(f"estimate   {est:.3f} ms ({source}); float32 outputs {out_mb:.3f} MB")
    print(f"campaign   {len(camp.points)} model(s): {path}")
    terms = "all three terms" if fitted.per_output_mb != default.per_output_mb or len(camp.points) >= 3 else \
        "the estimate's scale (fewer than 3 models: output and fixed terms from the target's default)"
    print(f"fit        board_ms = {fitted.per_estimate:.3f} x hbdk + {fitted.per_output_mb:.3f} x MB + "
          f"{fitted.fixed_ms:.3f}  ({terms}; mean error {err:.1%})")
    print(f"use it     tuner eval {args.config} --board {args.board}")
    return 0


def _numel(shape: Any) -> int:
    if not shape or any(d is None for d in shape):
        return 0
    n = 1
    for d in shape:
        n *= int(d)
    return n


# --------------------------------------------------------------------------- show


def show(args: argparse.Namespace) -> int:
    from tuner.cost.board import board_fit
    from tuner.cost.latency import BoardFit, CostModel, load_fit
    from tuner.workspace import Workspace

    ws = Workspace.open(args.config, march=args.march, limit=1)
    bfit = None
    if args.board:
        default = BoardFit.from_dict((ws.target.raw.get("cost") or {}).get("board") or {})
        found = board_fit(args.board, default)
        if found is None:
            raise TunerError(f"no board campaign named {args.board!r} (tuner latency board PERF.txt --config X.yaml "
                             f"--board {args.board})")
        bfit = found[0]
    cm = CostModel(ws.graph, ws.target, fit=load_fit(ws.model.fingerprint, ws.target.march), board=bfit)
    lat = cm.latency(ws.simulator.plan(ws.base_candidate()))
    if args.json:
        print(json.dumps(lat.as_dict(), indent=2))
        return 0
    print(breakdown_text(lat, cm))
    return 0


def breakdown_text(lat: Any, cm: Any) -> str:
    """The modeled latency and its parts, and what the BPU part is fitted to (``tuner eval``'s lines)."""
    subs = ", ".join(f"{ms:.3f}" for ms in lat.subgraph_ms)
    lines = [f"latency    {lat.total_ms:.3f} ms modeled: BPU {lat.bpu_ms:.3f} (hbdk O3 estimate {lat.compiler_ms:.3f}"
             f"{f'; per subgraph {subs}' if len(lat.subgraph_ms) > 1 else ''}), CPU {lat.cpu_ms:.3f}, switches "
             f"{lat.switch_ms:.3f} ({lat.subgraphs} BPU subgraph(s), {lat.boundary_tensors} CPU<->BPU tensor(s), "
             f"{lat.int16_layers} int16 layer(s))"]
    if cm.fit is not None:
        lines.append(f"           BPU model {cm.fit.describe()} (tuner latency fit)")
    else:
        lines.append("           BPU model: the shipped constants (fitted to hbdk's estimates of the example, "
                     "PP-OCRv4's detector and an op zoo; `tuner latency fit` fits them to this model)")
    if cm.board.label:
        lines.append(f"           board: {cm.board.label}")
    return "\n".join(lines)
