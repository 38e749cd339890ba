"""``tuner sensitivity``: which node's quantization hurts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tuner.commands import args as a


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sensitivity", help="per node: the gain of putting it on the CPU or in int16, and the accuracy "
                                            "with it alone quantized (int8 / int16)",
                       description="Rank the BPU nodes of the model an hb_mapper YAML describes by how much their "
                                   "quantization costs, under the YAML's calibration (or --calibration). Given a "
                                   "search space instead, rank its free nodes with its metric and data, and share "
                                   "the per-node gains with the search (results/<study>/sensitivity.json).")
    a.simulation(p)
    p.add_argument("--metric", help="mean_cosine (default; a space's objectives.accuracy), min_cosine, mean_sqnr, "
                                    "cosine:<out>, or a task metric")
    p.add_argument("--calibration", help="compare calibrations, comma-separated: max, kl, max:0.99995, +pc for "
                                         "per-channel (e.g. max,kl,max:0.99995+pc)")
    p.add_argument("--study", help="with a space: the study whose cache to use (default: the space's name)")
    a.results_dir(p, "with a space: where study folders are")
    p.add_argument("--top", type=a.positive_int, help="show only the N most sensitive nodes")
    p.add_argument("--csv", help="write every row to this CSV file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.console import progress_printer, say
    from tuner.files import check_writable, write_atomic
    from tuner.rank import rank
    from tuner.report import sensitivity as report

    if args.csv:
        check_writable(Path(args.csv).parent, "the CSV file")
    result = rank(args.config, (args.calibration or "").split(","), args.metric, a.data_dirs(args.data), args.limit,
                  args.march, args.threads, args.study, args.results_dir, progress=progress_printer, say=say)
    if args.csv:
        write_atomic(Path(args.csv), report.csv_text(result))
    if args.json:
        print(json.dumps(report.as_dict(result), indent=2))
        return 0
    print(report.text(result, args.top))
    if args.csv:
        print(f"\nall rows: {args.csv}")
    return 0
