"""``tuner import-calibrated``, ``import-log``, ``verify``: the real toolchain in the loop."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuner.commands import args as a
from tuner.console import say, table
from tuner.errors import TunerError


def log_text(log: Any) -> str:
    """A parsed log on its own (no YAML to compare with)."""
    bpu = sum(1 for n in log.nodes if n.on == "BPU")
    subgraphs = len({n.subgraph for n in log.nodes if n.subgraph is not None})
    lines = [f"log        {log.path}" + (f"  (hb_mapper {log.versions['hb_mapper']})" if "hb_mapper" in log.versions
                                         else ""),
             f"nodes      {len(log.nodes)} row(s): {bpu} BPU, {len(log.nodes) - bpu} CPU, {subgraphs} BPU subgraph(s)",
             f"calibration {log.method or '(no Select line: an explicit method, or the log was cut)'}",
             f"converted  {'yes' if log.succeeded else 'no success line'}"]
    sets = [f"{e.node} ({e.side})" for e in log.int16 if e.status == "set"]
    if sets:
        lines.append(f"int16 set  {', '.join(sets[:10])}" + (" ..." if len(sets) > 10 else ""))
    for e in log.refused():
        lines.append(f"int16 refused: {e.text}")
    for w in log.warnings:
        lines.append(f"warning: {w}")
    if log.outputs:
        first = "Node (of the output)" if log.outputs_by == "node" else "Output"    # before 1.24 the table names nodes
        lines += ["", table([first, "Cosine Similarity", "L1", "L2", "Chebyshev"],
                            [[o.name] + ["--" if v is None else f"{v:.6f}" for v in (o.cosine, o.l1, o.l2, o.chebyshev)]
                             for o in log.outputs])]
    return "\n".join(lines)


def import_log(args: argparse.Namespace) -> int:
    from tuner.toolchain.hblog import read_log, require_tables

    log = require_tables(read_log(args.log))
    if args.config and args.study:
        raise TunerError("give --config YAML (compare with that YAML) or --study/--trial (attach to a trial), not both")
    comparison = None
    record = None
    target = None
    if args.study:
        from tuner.study.storage import open_existing
        from tuner.toolchain.verify import StudyContext, attach_log

        if args.trial is None:
            raise TunerError("--study needs --trial N: the trial whose YAML hb_mapper converted")
        study, paths = open_existing(args.study, args.storage, args.results_dir)
        ctx = StudyContext(study, paths, args.threads)
        record = attach_log(ctx, args.trial, log, feedback=not args.no_feedback)
        _refresh_csv(study, paths)
        if record.comparison is not None:
            comparison = record.comparison
            target = ctx.workspace().target
    elif args.config:
        from tuner.console import progress_printer
        from tuner.toolchain.logterms import compare_with_log, log_simulator
        from tuner.workspace import Workspace

        ws = Workspace.open(args.config, limit=args.limit, march=args.march, threads=args.threads,
                            progress=progress_printer("calibration statistics"))

        # on the log's terms (first calibration sample, hb's formulas); pooled over the data as well
        comparison = compare_with_log(log_simulator(ws), ws.base_candidate(), log, pooled_sim=ws.simulator,
                                      pooled_data="calibration data")
        target = ws.target
    changes = None
    if args.update_target:
        if comparison is None or target is None:
            raise TunerError("--update-target needs --config YAML (or --study/--trial): the tool's decisions are "
                             "compared with what tuner assumed for that YAML")
        from tuner.toolchain.learn import write_learned_target

        changes = write_learned_target(comparison, target, Path(args.update_target))
    if args.json:
        out: dict[str, Any] = {"log": log.as_dict()}
        if comparison is not None:
            out["comparison"] = comparison.as_dict()
        if record is not None:
            out["record"] = {k: v for k, v in record.to_json().items() if k != "comparison"}
        if changes is not None:
            out["target_changes"] = changes
        print(json.dumps(out, indent=2, allow_nan=False, default=str))
        return 0
    print(log_text(log))
    if comparison is not None:
        print()
        print(comparison.text())
    if record is not None:
        acc = record.accuracy
        print(f"\nstored on trial {args.trial} of study {args.study}"
              + (f": real {record.objective} {acc:.6f} ({record.accuracy_source}) vs simulated "
                 f"{record.sim_accuracy:.6f}" if acc is not None and record.sim_accuracy is not None else "")
              + (f"; added trial {record.feedback_trial} with the real value for the sampler"
                 if record.feedback_trial is not None else ""))
    if changes is not None:
        print(f"\n{args.update_target}: " + ("; ".join(changes) if changes else "no change (evidence recorded)"))
    return 0


def _refresh_csv(study, paths) -> Path | None:
    """trials.csv with the real records just stored (when the study has its results folder here)."""
    from tuner.study.outputs import rewrite_trials_csv

    if not Path(paths.root).is_dir():
        return None
    return rewrite_trials_csv(study, paths)


def verify(args: argparse.Namespace) -> int:
    from tuner.study.loop import duration
    from tuner.study.storage import open_existing
    from tuner.toolchain.verified import local_table, results_table
    from tuner.toolchain.verify import LocalTool, StudyContext, verify_study

    numbers = None
    if args.trials:
        try:
            numbers = [int(x) for x in args.trials.split(",") if x.strip()]
        except ValueError:
            raise TunerError(f"--trials: expected numbers separated by commas, got {args.trials!r}") from None
    if args.top is not None and args.top < 1:
        raise TunerError(f"--top: expected a positive number, got {args.top}")
    if bool(args.local) == bool(args.command):
        raise TunerError("give --local (the toolchain 'tuner toolchain' finds) or --command "
                         "'hb_mapper makertbin --config {yaml} --model-type onnx' (a tool or board script of your own)")
    local = None
    if args.local:
        from tuner.toolchain.hbrun import CompileKnobs
        from tuner.toolchain.installed import require_toolchain

        local = LocalTool(require_toolchain(), CompileKnobs(optimize_level=args.optimize_level, debug=True))
    elif args.optimize_level:
        raise TunerError("--optimize-level applies to --local runs only; write it in your command's YAML instead")
    study, paths = open_existing(args.study, args.storage, args.results_dir)
    ctx = StudyContext(study, paths, args.threads)
    done = verify_study(ctx, args.command, top=args.top, numbers=numbers, timeout=duration(args.timeout),
                        again=args.again, feedback=not args.no_feedback, log_name=args.log_name, say=say, local=local)
    print(local_table(done, ctx.info.objectives) if local else results_table(done))
    csv_path = _refresh_csv(study, paths)
    added = [str(rec.feedback_trial) for _, rec in done if rec.feedback_trial is not None]
    if added:
        print(f"\nreal values added to the study as trial(s) {', '.join(added)} (the sampler learns from them)")
    print(f"\nper trial: {paths.root / 'verify'}/trial_NNNNN/ (YAML, output.txt, the tool's artefacts)"
          + (f"; real beside simulated: {csv_path}" if csv_path else ""))
    return 0 if all(rec.ok for _, rec in done) else 1


def import_calibrated(args: argparse.Namespace) -> int:
    from tuner.console import progress_printer
    from tuner.inputs.calibrated import read_calibrated
    from tuner.toolchain.calibrated_report import build_report
    from tuner.workspace import Workspace

    cal = read_calibrated(args.calibrated)      # a file without HzCalibration nodes stops here
    ws = Workspace.open(args.config, limit=args.limit, march=args.march, threads=args.threads,
                        progress=progress_printer("calibration statistics"))
    report = build_report(ws, cal, run_pc=not args.no_run, reading=not args.no_run)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, allow_nan=False))
    else:
        print(report.text())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-calibrated", help="read hb_mapper's *_calibrated_model.onnx: real vs tuner thresholds, "
                                                 "plan differences, and the calibrated model run on the PC",
                       description="Read every HzCalibration node of hb_mapper's calibrated model (left in "
                                   "working_dir), compare its thresholds and dtypes with tuner's for the YAML, say "
                                   "which max_percentile reading they support, and run the calibrated model in "
                                   "onnxruntime against the float model on the YAML's data (the 'check the "
                                   "calibrated model on the PC' step, without the toolchain).")
    p.add_argument("calibrated", help="working_dir/<prefix>_calibrated_model.onnx")
    a.config(p, "the hb_mapper YAML that produced it")
    a.limit(p, "use at most this many calibration samples for the PC check")
    p.add_argument("--no-run", action="store_true", help="compare thresholds only (no data pass, no PC check)")
    a.march(p, "override model_parameters.march")
    a.threads(p, "evaluation threads")
    a.json_output(p, "print the report as JSON")
    p.set_defaults(func=import_calibrated)

    p = sub.add_parser("import-log", help="read an hb_mapper makertbin log; compare it with the simulation",
                       description="Parse hb_mapper_makertbin.log (node table, output table, chosen calibration, "
                                   "int16 decisions). With --config: simulate that YAML and show real and simulated "
                                   "side by side. With --study/--trial: store the real figures on that trial.")
    p.add_argument("log", help="hb_mapper_makertbin.log (written where hb_mapper was started)")
    p.add_argument("--config", help="the hb_mapper YAML that produced the log, to compare with the simulation")
    p.add_argument("--study", help="attach the log to a trial of this study (with --trial)")
    p.add_argument("--trial", type=int, help="the trial whose exported YAML was converted")
    a.storage(p)
    a.results_dir(p)
    p.add_argument("--update-target", metavar="FILE",
                   help="write/update a target table corrected by the tool's decisions (use it as 'march: FILE')")
    a.no_feedback(p, "with --study: do not add the real value as a trial")
    a.limit(p, "simulate on at most this many samples")
    a.march(p, "override model_parameters.march")
    a.threads(p, "evaluation threads")
    a.json_output(p, "print everything as JSON")
    p.set_defaults(func=import_log)

    p = sub.add_parser("verify", help="run hb_mapper (or a board script) on a study's best trials; store real figures",
                       description="For each chosen trial, export its YAML to results/<study>/verify/trial_NNNNN/ and "
                                   "convert it with the toolchain installed here (--local: the real quantized model is "
                                   "run on the study's evaluation data), or run COMMAND there ({yaml}, {dir}, "
                                   "{trial} are substituted). The command's "
                                   "hb_mapper_makertbin.log and/or a JSON object on its last output line "
                                   "({\"accuracy\": ...}) are imported and stored on the trial; real accuracies are "
                                   "added to the study so the sampler learns from them. Exit code 1 if any trial "
                                   "failed.")
    a.study(p)
    p.add_argument("--command",
                   help="e.g. 'hb_mapper makertbin --config {yaml} --model-type onnx' or 'python board_eval.py {yaml}'")
    p.add_argument("--local", action="store_true",
                   help="convert with the toolchain installed here ('tuner toolchain'), run its quantized model on "
                        "the study's evaluation data and score it as the simulation is scored")
    a.optimize_level(p, "with --local: ")
    p.add_argument("--top", type=a.positive_int, help="the K best trials (default: the whole Pareto front)")
    p.add_argument("--trials", help="these trial numbers, e.g. 12,40")
    a.timeout(p, "per trial (seconds, or 30m, 2h); the command is killed after it")
    p.add_argument("--log-name", default="hb_mapper_makertbin.log",
                   help="the log file the command writes, relative to its folder (default: %(default)s)")
    p.add_argument("--again", action="store_true", help="rerun trials verified before")
    a.no_feedback(p)
    a.storage(p)
    a.results_dir(p)
    a.threads(p, "evaluation threads for the comparison")
    p.set_defaults(func=verify)
