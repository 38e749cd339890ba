"""The ``tuner`` command: one subcommand per library call.

Bad input raises ``TunerError``; it is printed as one line and the exit code is 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tuner import __version__
from tuner.errors import TunerError


def _data_dirs(text: str | None) -> list[Path] | None:
    return [Path(p) for p in text.split(";")] if text else None


def cmd_eval(args: argparse.Namespace) -> int:
    from tuner.report import text
    from tuner.workspace import Workspace, progress_printer

    t0 = time.perf_counter()
    ws = Workspace.open(args.config, data=_data_dirs(args.data), limit=args.limit, march=args.march,
                        threads=args.threads, progress=progress_printer("calibration statistics"))
    t_stats = time.perf_counter() - t0
    ev = ws.simulator.evaluate(ws.base_candidate(), per_node=not args.no_nodes)
    info = {
        "config": str(ws.config.path),
        "model": {"path": str(ws.model.path), "sha256": ws.model.fingerprint},
        "calibration_data": {"folders": [str(i.folder) for i in ws.calibration_data.inputs],
                             "samples": len(ws.calibration_data), "sha256": ws.calibration_data.fingerprint()},
        "eval_data": {"folders": [str(i.folder) for i in ws.eval_data.inputs], "samples": len(ws.eval_data)},
        "march": ws.target.march,
        "statistics": {"from_cache": ws.stats_from_cache, "seconds": t_stats},
        "warnings": ws.warnings,
    }
    if args.json:
        print(text.to_json(ev, info))
        return 0
    for w in ws.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"model      {ws.model.path}  (sha256 {ws.model.fingerprint[:12]})")
    print(f"data       {'; '.join(info['eval_data']['folders'])}  ({len(ws.eval_data)} samples)")
    src = "from cache" if ws.stats_from_cache else f"one pass over {len(ws.calibration_data)} samples"
    print(f"target     {ws.target.march}; calibration statistics {src} ({t_stats:.1f} s)")
    print(f"calibration {ev.calibration.describe()}"
          + ("" if ev.calibration == ev.candidate.calibration else f"  (YAML: {ev.candidate.calibration.type})"))
    if ev.nodes:
        print()
        print(text.node_table(ev))
    print()
    print(text.summary_line(ev))
    for note in ev.notes:
        print(f"note: {note}")
    print()
    print(text.output_table(ev))
    print(f"\nmean output cosine {ev.mean_cosine:.6f}  ({ev.seconds:.2f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("eval", help="simulate the quantization an hb_mapper YAML describes and compare with float",
                       description="Simulate the quantization that an hb_mapper makertbin YAML describes, and print "
                                   "per-output and per-node similarity to the float model.")
    p.add_argument("config", help="the hb_mapper makertbin YAML (reads onnx_model, cal_data_dir, node_info, "
                                  "calibration_parameters)")
    p.add_argument("--data", help="evaluate on this folder instead of cal_data_dir (';' between inputs)")
    p.add_argument("--limit", type=int, help="use at most this many evaluation samples")
    p.add_argument("--march", help="override model_parameters.march (bayes-e, ...)")
    p.add_argument("--threads", type=int, help="onnxruntime threads (default: all cores)")
    p.add_argument("--no-nodes", action="store_true", help="skip the per-node table (faster)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
