"""``tuner eval``: simulate the quantization an hb_mapper YAML describes, print it as hb_mapper's log does."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from tuner.commands import args as a
from tuner.errors import TunerError

if TYPE_CHECKING:
    from tuner.inputs.calibrated_map import MappedThresholds


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="simulate the quantization an hb_mapper YAML describes and compare with float",
                       description="Simulate the quantization that an hb_mapper makertbin YAML describes, and print "
                                   "per-output and per-node similarity to the float model.")
    a.simulation(p)
    p.add_argument("--no-nodes", action="store_true", help="skip the per-node table (faster)")
    p.add_argument("--trace", action="store_true", help="accumulated-error view: per node in graph order, the "
                                                        "cosine, its change from the node's inputs, and CPU/BPU "
                                                        "switches; marks where error enters")
    p.add_argument("--board", help="scale the BPU latency to this board's fit (tuner latency board ... --board NAME)")
    p.add_argument("--thresholds", metavar="CALIBRATED.onnx",
                   help="simulate with hb_mapper's real thresholds and qtypes from its *_calibrated_model.onnx "
                        "instead of tuner's calibration")
    p.set_defaults(func=run)


def real_qtype_counts(real: MappedThresholds) -> dict[str, int]:
    """Activation tensors hb_mapper's calibrated model rounds, by qtype (int8, int16, uint8)."""
    counts: dict[str, int] = {}
    for nodes in real.activations.values():
        for q in sorted({n.qtype for n in nodes if n.quantizes}):
            counts[q] = counts.get(q, 0) + 1
    return dict(sorted(counts.items()))


def cost_model(ws: Any, board: str | None = None) -> Any:
    """The cost model for the workspace's model: with ``tuner latency fit``'s constants for it when they
    exist, and with board ``board``'s fit when named."""
    from tuner.cost.latency import CostModel, load_fit

    bfit = None
    if board:
        from tuner.cost.board import require_board_fit

        bfit = require_board_fit(board, ws.target.raw)
    return CostModel(ws.graph, ws.target, fit=load_fit(ws.model.fingerprint, ws.target.march), board=bfit)


def run(args: argparse.Namespace) -> int:
    from tuner.console import progress_printer
    from tuner.inputs.realmatch import load_thresholds
    from tuner.report import text
    from tuner.workspace import Workspace

    t0 = time.perf_counter()
    ws = Workspace.open(args.config, data=a.data_dirs(args.data), limit=args.limit, march=args.march,
                        threads=args.threads, progress=progress_printer("calibration statistics"))
    t_stats = time.perf_counter() - t0
    if args.thresholds:
        ws.real_thresholds = load_thresholds(args.thresholds, ws.graph, ws.model.path, ws.model.proto,
                                             ws.first_sample())
    if args.trace and args.no_nodes:
        raise TunerError("--trace shows the per-node values that --no-nodes skips; use one of them")
    ev = ws.simulator.evaluate(ws.base_candidate(), per_node=not args.no_nodes, split=True)
    cost = cost_model(ws, args.board)
    lat = cost.latency(ev.plan)
    info = _info(ws, ev, lat, cost, t_stats)
    hint = unnormalized_hint(ws, ev.mean_cosine)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    if args.json:
        if args.trace:
            info["trace"] = text.accumulated_rows(ev, ws.graph)
        print(text.to_json(ev, info))
        return 0
    _print_text(ws, ev, lat, cost, info, t_stats, args.trace)
    return 0


#: An evaluation sample whose values are integers in [0, 255] reaching above this, on an input the
#: YAML does not normalize, looks like raw pixels (check-data's rules: tuner.inputs.datarules).
PIXEL_LIKE_MAX = 32.0


def unnormalized_hint(ws: Any, cosine: float) -> str | None:
    """One line pointing at ``tuner check-data`` when the first evaluation sample of an input without
    normalization (norm_type no_preprocess) holds integers like 0..255 pixels: a model trained on
    normalized input scores near nothing then, and eval alone cannot say why."""
    import numpy as np

    sample = next(iter(ws.eval_data), None)
    if sample is None:
        return None
    for spec in ws.eval_data.inputs:
        x = np.asarray(sample.get(spec.name))
        if spec.mean is not None or spec.scale is not None or x.size == 0 or not np.issubdtype(x.dtype, np.number):
            continue
        lo, hi = float(x.min()), float(x.max())
        if lo >= 0 and PIXEL_LIKE_MAX < hi <= 255 and bool(np.all(x == np.round(x))):
            return (f"input {spec.name!r} holds integers {lo:g}..{hi:g}, like raw pixels, and the YAML does not "
                    f"normalize it (mean output cosine {cosine:.4f}); if the model was trained on normalized input, "
                    f"run 'tuner check-data {ws.config.path}'")
    return None


def _info(ws: Any, ev: Any, lat: Any, cost: Any, t_stats: float) -> dict[str, Any]:
    """What ``tuner eval --json`` reports beside the evaluation: inputs, statistics, warnings, graph
    rewrites, modeled latency, and hb_mapper's real qtypes or default's comparison."""
    info: dict[str, Any] = {
        "config": str(ws.config.path),
        "model": {"path": str(ws.model.path), "sha256": ws.model.fingerprint},
        "calibration_data": {"folders": [str(i.folder) for i in ws.calibration_data.inputs],
                             "samples": len(ws.calibration_data), "sha256": ws.calibration_data.fingerprint()},
        "eval_data": {"folders": [str(i.folder) for i in ws.eval_data.inputs], "samples": len(ws.eval_data)},
        "march": ws.target.march,
        "statistics": {"from_cache": ws.stats_from_cache, "seconds": t_stats},
        "warnings": ws.warnings,
        "graph": ws.model.names.summary(),   # what hb_mapper's optimizer changed (tuner.graph.optimize)
        # modeled latency (tuner.cost): BPU = hbdk's O3 estimate as modeled (x the board's scale), CPU, switches
        "latency": {**lat.as_dict(), "bpu_model": lat.fitted or cost.shipped.source, "board": cost.board.label},
    }
    if ws.real_thresholds is not None:
        # the plan's counts (summary line) are the YAML's; hb_mapper's qtypes are what is simulated
        info["real_qtypes"] = real_qtype_counts(ws.real_thresholds)
    elif ev.candidate.calibration.type == "default":
        # hb_mapper's model-wise comparison, every method it evaluated, in its order (the log has
        # only the Select line): why default chose what it chose
        from tuner.simulate.calibrate import DefaultChoice

        choice = ws.simulator.choice(ev.candidate)
        if isinstance(choice, DefaultChoice):
            info["default_comparison"] = [{"method": m.describe(), "score": v} for m, v in choice.scores]
    return info


def _print_text(ws: Any, ev: Any, lat: Any, cost: Any, info: dict[str, Any], t_stats: float, trace: bool) -> None:
    """The terminal report, as hb_mapper's log has it: inputs, calibration, per-node table, summary,
    latency, notes, default's comparison, merges and per-output similarity."""
    from tuner.commands.latency import breakdown_text
    from tuner.report import text

    for w in ws.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"model      {ws.model.path}  (sha256 {ws.model.fingerprint[:12]})")
    print(f"data       {'; '.join(info['eval_data']['folders'])}  ({len(ws.eval_data)} samples)")
    src = "from cache" if ws.stats_from_cache else f"one pass over {len(ws.calibration_data)} samples"
    print(f"target     {ws.target.march}; calibration statistics {src} ({t_stats:.1f} s)")
    for line in info["graph"]:
        print(f"graph      {line}")
    print(f"calibration {ev.calibration.describe()}"
          + ("" if ev.calibration == ev.candidate.calibration else f"  (YAML: {ev.candidate.calibration.type})"))
    if ev.nodes:
        print()
        print(text.accumulated_table(ev, ws.graph) if trace else text.node_table(ev))
    print()
    print(text.summary_line(ev))
    print(breakdown_text(lat, cost))
    if "real_qtypes" in info:
        counts = ", ".join(f"{n} {q}" for q, n in info["real_qtypes"].items())
        print(f"hb_mapper's calibrated model quantizes {counts} tensor(s); those qtypes are simulated "
              "(the node counts above are the YAML's own plan)")
    for note in ev.notes:
        print(f"note: {note}")
    if "default_comparison" in info:
        _print_default_comparison(ev, info["default_comparison"])
    merge = text.merge_info_table(ev)
    if merge:
        print()
        print(merge)
    print()
    print(text.output_table(ev))
    split = text.split_table(ev)
    if split:
        print()
        print(split)
    print(f"\nmean output cosine {ev.mean_cosine:.6f}  ({ev.seconds:.2f} s)")


def _print_default_comparison(ev: Any, comparison: list[dict[str, Any]]) -> None:
    """hb_mapper's default calibration: the score of every method it compared, the chosen one marked."""
    from tuner.console import table

    chosen = ev.calibration.describe()
    rows = [[r["method"], f"{r['score']:.6f}", "<< selected" if r["method"] == chosen else ""] for r in comparison]
    print()
    print("default's comparison (model-wise output cosine on the first calibration sample; per-channel "
          "methods as plain per-channel fake quant)")
    print(table(["Method", "Score", ""], rows))
