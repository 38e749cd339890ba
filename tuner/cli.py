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
    if args.thresholds:
        from tuner.toolchain.calibrated_report import real_thresholds

        ws.real_thresholds = real_thresholds(ws, args.thresholds)
    if args.trace and args.no_nodes:
        raise TunerError("--trace shows the per-node values that --no-nodes skips; use one of them")
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
        if args.trace:
            info["trace"] = text.accumulated_rows(ev, ws.graph)
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
        print(text.accumulated_table(ev, ws.graph) if args.trace else text.node_table(ev))
    print()
    print(text.summary_line(ev))
    for note in ev.notes:
        print(f"note: {note}")
    merge = text.merge_info_table(ev)
    if merge:
        print()
        print(merge)
    print()
    print(text.output_table(ev))
    print(f"\nmean output cosine {ev.mean_cosine:.6f}  ({ev.seconds:.2f} s)")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    import signal

    from tuner.study.runner import Search, duration, install_stop_handlers, redact, run

    # During set-up Ctrl-C interrupts at once (a process started in the background inherits
    # SIGINT as ignored: restore it); once trials run, see install_stop_handlers below.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not _data_ok(args.space):
        return 2
    search = Search.open(args.space, args.study, args.storage, args.results_dir, args.threads)
    search.heartbeat, search.max_retry = args.heartbeat, args.max_retry
    st = search.space.study
    n_trials = args.n_trials if args.n_trials is not None else st["n_trials"]
    timeout = duration(args.timeout) if args.timeout is not None else duration(st["timeout"])
    seed = args.seed if args.seed is not None else st["seed"]
    for w in search.ws.warnings:
        print(f"warning: {w}", file=sys.stderr)
    r = search.resolved
    print(f"study {search.name}: {len(r.decisions)} node decision(s), calibration knobs "
          f"{', '.join(r.calibration_params) or 'fixed'}; mode {search.mode}; storage "
          f"{redact(search.storage_url) if search.storage_url else search.paths.journal}")
    # Ctrl-C and SIGTERM (schedulers) from here on: finish the running trial, keep the storage
    # consistent, print the summary; a second Ctrl-C aborts the trial.
    install_stop_handlers(lambda text: print(f"tuner: {text}", file=sys.stderr, flush=True))
    study, info = run(search, n_trials, timeout, args.jobs, seed)
    if info["zombies"]:
        print(f"marked {len(info['zombies'])} trial(s) left running by a dead process as failed: {info['zombies']}"
              + (f" (each re-run up to {args.max_retry} time(s))" if args.max_retry > 0 else ""))
    _print_summary(study, search.paths, search.mode, search.space.objectives["min_accuracy"])
    if info.get("stopped"):
        print(f"tuner: stopped: {info['stopped']}", file=sys.stderr)
        return 1
    if info["interrupted"]:
        print("interrupted: the study is consistent; run the same command again to continue", file=sys.stderr)
        return 130
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import os
    import signal

    from optuna.trial import TrialState

    from tuner.study.runner import STOP, duration, install_stop_handlers, join_study, redact, work

    signal.signal(signal.SIGINT, signal.default_int_handler)
    search = join_study(args.study, args.storage, args.space, args.results_dir, args.threads, args.heartbeat,
                        args.max_retry)
    study = search.study(None, create=False)
    st = search.space.study
    n_trials = args.n_trials if args.n_trials is not None else st["n_trials"]
    timeout = duration(args.timeout) if args.timeout is not None else duration(st["timeout"])
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    print(f"worker {os.getpid()} joined study {search.name} ({done} of {n_trials} trials completed); storage "
          f"{redact(args.storage) if args.storage else search.paths.journal}", flush=True)
    install_stop_handlers(lambda text: print(f"tuner: {text}", file=sys.stderr, flush=True))
    work(search, study, n_trials, timeout)
    search.write_results(study, force=True)
    _print_summary(study, search.paths, search.mode, search.space.objectives["min_accuracy"])
    if STOP.is_set():
        print("interrupted: the study is consistent; run the same command again to continue", file=sys.stderr)
        return 130
    return 0


def _data_ok(space_path: str) -> bool:
    """The brief data check at the start of a search: errors stop it, warnings are listed."""
    from tuner.inputs.checks import check_data, format_report
    from tuner.study.space import load_space

    space = load_space(space_path)
    report = check_data(space.base)
    if report.exit_code() == 2:
        print(format_report(report), file=sys.stderr)
        print("tuner: error: the calibration data are unusable (see above); fix them or run 'tuner check-data "
              f"{space.base}'", file=sys.stderr)
        return False
    for f in report.findings:
        if f.severity != "info":
            print(f"data {f.severity}: {f.message}", file=sys.stderr)
    return True


def cmd_check_data(args: argparse.Namespace) -> int:
    import json

    from tuner.inputs.checks import check_data, format_report

    report = check_data(args.config, data_dirs=_data_dirs(args.data), limit=args.limit)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, allow_nan=False))
    else:
        print(format_report(report))
    return report.exit_code()


def cmd_make_cal_data(args: argparse.Namespace) -> int:
    from tuner.inputs.preprocess import make_cal_data

    written = make_cal_data(args.config, Path(args.images), args.preprocess, Path(args.out), limit=args.limit,
                            overwrite=args.force)
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} calibration file(s) in {args.out}; point calibration_parameters.cal_data_dir at it")
    return 0


def cmd_check_preprocess(args: argparse.Namespace) -> int:
    import json

    from tuner.inputs.preprocess import check_preprocess, format_preprocess_report

    report = check_preprocess(args.config, Path(args.images), args.preprocess, limit=args.limit)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, allow_nan=False))
    else:
        print(format_preprocess_report(report))
    return report.exit_code()


def _sensitivity_setup(args: argparse.Namespace):
    """(workspace, base candidate, nodes, metric, cached gains or None) for an hb_mapper YAML
    or a search space; a space's leave-one-float gains are the study's cached ones."""
    from tuner.inputs.config import read_yaml
    from tuner.workspace import Workspace, progress_printer

    raw = read_yaml(Path(args.config), "an hb_mapper YAML or a search space YAML")
    if isinstance(raw, dict) and "base" in raw and "model_parameters" not in raw:
        from tuner.candidate import Candidate
        from tuner.study.runner import StudyPaths, _reference_calibration, node_sensitivity
        from tuner.study.space import free_nodes, load_space

        space = load_space(args.config)
        ws = Workspace.for_space(space, data=_data_dirs(args.data), limit=args.limit, march=args.march,
                                 threads=args.threads, progress=progress_printer("calibration statistics"))
        b = ws.base_candidate()
        base = Candidate.make(_reference_calibration(space, b), dict(b.nodes), b.optimization)
        metric = args.metric or space.objectives["accuracy"]
        nodes = free_nodes(space, ws.graph, ws.target)
        gains = None
        if metric == space.objectives["accuracy"]:
            paths = StudyPaths(Path(args.results_dir) / (args.study or space.name))
            gains = node_sensitivity(space, ws, paths, quiet=False)
            print(f"leave-one-float gains: {paths.sensitivity} (shared with the search)", file=sys.stderr)
        return ws, base, nodes, metric, gains
    ws = Workspace.open(args.config, data=_data_dirs(args.data), limit=args.limit, march=args.march,
                        threads=args.threads, progress=progress_printer("calibration statistics"))
    nodes = [n.name for n in ws.graph if ws.target.bpu_capable(n.op_type) and ws.graph.data_inputs(n)]
    return ws, ws.base_candidate(), nodes, args.metric or "mean_cosine", None


def cmd_sensitivity(args: argparse.Namespace) -> int:
    import csv
    import io
    import json

    from tuner.candidate import Calibration
    from tuner.export.hb_yaml import write_atomic
    from tuner.report.text import table
    from tuner.sensitivity import sensitivity_table
    from tuner.workspace import progress_printer

    specs = [t for t in (args.calibration or "").split(",") if t.strip()]
    cals = [Calibration.parse(t) for t in specs]
    ws, base, nodes, metric, gains = _sensitivity_setup(args)
    runs = []   # (label, calibration, rows)
    for label, cal in ([(t.strip(), c) for t, c in zip(specs, cals)] or [("", base.calibration)]):
        cand = base.with_calibration(cal)
        rows = sensitivity_table(ws.simulator, cand, nodes, metric,
                                 progress_printer(f"node sensitivity {label}".rstrip()),
                                 gains=gains if cal == base.calibration else None)
        runs.append((label or cal.describe(), ws.simulator.resolve(cand)[0], rows))
    if args.csv:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["node", "op_type", "float_gain", "alone_int8_accuracy", "alone_int8_cosine", "alone_int8_sqnr_db",
                    "alone_int16_accuracy", "alone_int16_cosine", "alone_int16_sqnr_db", "calibration"])
        for _, cal, rows in runs:
            for r in rows:
                a16 = r.alone_int16 or {}
                w.writerow([r.node, r.op_type, f"{r.float_gain:.8f}"]
                           + [f"{r.alone_int8[k]:.8f}" for k in ("accuracy", "cosine", "sqnr_db")]
                           + [f"{a16[k]:.8f}" if k in a16 else "" for k in ("accuracy", "cosine", "sqnr_db")]
                           + [cal.describe()])
        write_atomic(Path(args.csv), buf.getvalue())
    if args.json:
        print(json.dumps({"metric": metric, "calibration": runs[0][1].describe(),
                          "nodes": [r.as_dict() for r in runs[0][2]],
                          "by_calibration": [{"calibration": cal.describe(), "nodes": [r.as_dict() for r in rows]}
                                             for _, cal, rows in runs]}, indent=2))
        return 0
    if len(runs) == 1:
        _, cal, rows = runs[0]
        shown = rows[: args.top] if args.top else rows
        print(f"sensitivity of {len(rows)} BPU node(s) ({metric}; calibration {cal.describe()}); most sensitive first")
        print(table(["node", "type", "gain if float", "alone int8", "alone int16", "alone int8 SQNR dB"],
                    [[r.node, r.op_type, f"{r.float_gain:+.6f}", f"{r.alone_int8['accuracy']:.6f}",
                      f"{r.alone_int16['accuracy']:.6f}" if r.alone_int16 else "--", f"{r.alone_int8['sqnr_db']:.1f}"]
                     for r in shown]))
    else:
        by = [{r.node: r for r in rows} for _, _, rows in runs]
        order = sorted(by[0], key=lambda n: -max(b[n].float_gain for b in by))
        shown = order[: args.top] if args.top else order
        print(f"sensitivity of {len(order)} BPU node(s) ({metric}) under {len(runs)} calibrations; most sensitive "
              "first (largest gain under any of them)")
        print(table(["node", "type"] + [f"gain {label}" for label, _, _ in runs]
                    + [f"alone int8 {label}" for label, _, _ in runs],
                    [[n, by[0][n].op_type] + [f"{b[n].float_gain:+.6f}" for b in by]
                     + [f"{b[n].alone_int8['accuracy']:.6f}" for b in by] for n in shown]))
        print("\n" + "; ".join(f"{label} = {cal.describe()}" for label, cal, _ in runs))
    if args.csv:
        print(f"\nall rows: {args.csv}")
    return 0


def _print_summary(study, paths, mode: str, min_accuracy) -> None:
    from optuna.trial import TrialState

    from tuner.report.text import table
    from tuner.study.results import best, pareto, rows

    rs = rows(study)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    n_fail = sum(s == TrialState.FAIL for s in states)
    print(f"\n{len(rs)} completed trial(s), {n_fail} failed, {sum(s == TrialState.RUNNING for s in states)} running")
    front = pareto(rs)
    if front:
        b = best(rs, mode, min_accuracy)
        print("\nPareto front (accuracy up, modeled latency down):")
        print(table(["trial", "accuracy", "latency ms", "subgraphs", "CPU", "int16", "calibration", "plan"],
                    [[("*" if b and r.number == b.number else " ") + str(r.number), f"{r.accuracy:.6f}",
                      f"{r.latency_ms:.3f}", str(r.counts["subgraphs"]), str(r.counts["cpu_nodes"]),
                      str(r.counts["int16_nodes"]), r.calibration, r.plan or ""] for r in front]))
    elif rs:
        print("no trial meets the constraints yet (objectives.min_accuracy / max_latency_ms)")
    if paths.best.exists():
        print(f"\nbest: {paths.best}   Pareto configs: {paths.pareto}/   trials: {paths.trials_csv}")
    if paths.report.exists():
        print(f"report: {paths.report}")


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.study.runner import FINGERPRINTS, Search, node_sensitivity, open_existing, study_info

    study, paths = open_existing(args.study, args.storage, args.results_dir)
    info = study_info(study)
    notes: list[str] = []
    try:
        search = Search.open(info["space_path"], study.study_name, args.storage, paths.root.parent, args.threads)
        changed = [k for k in FINGERPRINTS if search.fingerprints()[k] != info["fingerprints"].get(k)]
        if changed:
            raise TunerError(f"the {', '.join(changed)} file(s) changed since the study ran")
    except TunerError as exc:
        # The trials are in the storage; only the simulated views need the model and data.
        notes.append(f"per-node views left out: {exc}")
        print(f"warning: {notes[-1]}", file=sys.stderr)
        search = None
    if search is None:
        from tuner.study.runner import redact, study_report

        out = study_report(study, paths, redact(args.storage) if args.storage else str(paths.journal), notes=notes)
    else:
        if not search.sensitivity:
            search.sensitivity = node_sensitivity(search.space, search.ws, paths, quiet=False)
        out = search.write_report(study, force=True)
        if out is None:
            raise TunerError(f"{paths.report} could not be written (see the warning above)")
    print(f"wrote {out}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from tuner.study.runner import open_existing, study_info

    study, paths = open_existing(args.study, args.storage, args.results_dir)
    info = study_info(study)
    print(f"study {study.study_name}: mode {info['mode']}, march {info['march']}, base {info['base_path']}")
    _print_summary(study, paths, info["mode"], info["objectives"].get("min_accuracy"))
    from tuner.toolchain.verify import real_summary

    real = real_summary(study)
    if real:
        print(f"\n{real}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path as P

    from tuner.study.results import best, rows
    from tuner.study.runner import export_trial, open_existing, study_info

    study, paths = open_existing(args.study, args.storage, args.results_dir)
    info = study_info(study)
    rs = rows(study)
    if args.trial is not None:
        match = [r for r in rs if r.number == args.trial]
        if not match:
            raise TunerError(f"trial {args.trial} of study {study.study_name!r} is not a completed trial; "
                             f"completed: {', '.join(str(r.number) for r in rs[:20]) or 'none'}")
        row = match[0]
    elif args.by == "real":
        from tuner.toolchain.verify import best_real

        found = best_real(study, info["mode"], info["objectives"].get("min_accuracy"))
        if found is None:
            raise TunerError(f"study {study.study_name!r} has no trial with a real accuracy that meets the constraints; "
                             "run 'tuner verify' first, or export by the simulated figure")
        row = found[0]
        print(f"trial {row.number}: real accuracy {found[1]['accuracy']:.6f} ({found[1]['accuracy_source']})")
    else:
        row = best(rs, info["mode"], info["objectives"].get("min_accuracy"))
        if row is None:
            raise TunerError(f"study {study.study_name!r} has no feasible completed trial to export yet")
    out = P(args.out) if args.out else paths.root / f"trial_{row.number:05d}.yaml"
    notes = export_trial(row, out, P(info["base_path"]), info.get("node_info_supported", True), None,
                         {"study": study.study_name, **info["fingerprints"]})
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    print(f"wrote {out} (trial {row.number}: accuracy {row.accuracy:.6f}, modeled latency {row.latency_ms:.3f} ms)")
    return 0


def _simulation_args(p: argparse.ArgumentParser) -> None:
    """What every command that simulates an hb_mapper YAML takes."""
    p.add_argument("config", help="the hb_mapper makertbin YAML (reads onnx_model, cal_data_dir, node_info, "
                                  "calibration_parameters); sensitivity also takes a search space")
    p.add_argument("--data", help="evaluate on this folder instead of cal_data_dir (';' between inputs)")
    p.add_argument("--limit", type=int, help="use at most this many evaluation samples")
    p.add_argument("--march", help="override model_parameters.march (bayes-e, ...)")
    p.add_argument("--threads", type=int, help="evaluation threads (default: all cores)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _worker_args(p: argparse.ArgumentParser) -> None:
    """How workers survive each other's death."""
    p.add_argument("--max-retry", type=int, default=1, help="times a trial left running by a killed worker is "
                                                            "re-run (default 1; 0: never)")
    p.add_argument("--heartbeat", type=float, help="database storages: seconds between a worker's heartbeats; a "
                                                   "trial silent for 3 heartbeats is failed (default 20)")


def _preprocess_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preprocess", help="your preprocessing: 'module:function' or 'path/to/file.py:function' "
                                        "(default: read and resize the images as the YAML's input parameters say)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("eval", help="simulate the quantization an hb_mapper YAML describes and compare with float",
                       description="Simulate the quantization that an hb_mapper makertbin YAML describes, and print "
                                   "per-output and per-node similarity to the float model.")
    _simulation_args(p)
    p.add_argument("--no-nodes", action="store_true", help="skip the per-node table (faster)")
    p.add_argument("--trace", action="store_true", help="accumulated-error view: per node in graph order, the "
                                                        "cosine, its change from the node's inputs, and CPU/BPU "
                                                        "switches; marks where error enters")
    p.add_argument("--thresholds", metavar="CALIBRATED.onnx",
                   help="simulate with hb_mapper's real thresholds and qtypes from its *_calibrated_model.onnx "
                        "instead of tuner's calibration")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("check-data", help="check calibration data against the YAML: format, statistics, known mistakes",
                       description="Check the calibration data an hb_mapper YAML points at: file format and size, "
                                   "per-channel statistics, and the known mistakes (unnormalized or doubly normalized "
                                   "data, channels on very different scales, constant channels, duplicates, too few "
                                   "samples). Exit code 0: clean, 1: findings, 2: unusable data.")
    p.add_argument("config", help="the hb_mapper makertbin YAML")
    p.add_argument("--data", help="check this folder instead of cal_data_dir (';' between inputs)")
    p.add_argument("--limit", type=int, help="read at most this many samples")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_check_data)

    p = sub.add_parser("make-cal-data", help="write hb_mapper calibration files from images with your preprocessing",
                       description="Run your preprocessing (an image path -> the model-input tensor before the "
                                   "YAML's mean/scale) on every image in IMAGES and write one numpy.tofile() dump of "
                                   "cal_data_type per image into --out, as hb_mapper reads cal_data_dir. "
                                   "Single-input models.")
    p.add_argument("config", help="the hb_mapper makertbin YAML")
    p.add_argument("images", help="folder of images (jpg, jpeg, png, bmp, tif, tiff, webp), taken in sorted order")
    _preprocess_arg(p)
    p.add_argument("--out", required=True, help="folder to write the calibration files into")
    p.add_argument("--limit", type=int, help="use at most this many images")
    p.add_argument("--force", action="store_true", help="overwrite existing files of the same names")
    p.set_defaults(func=cmd_make_cal_data)

    p = sub.add_parser("check-preprocess",
                       help="check that cal_data_dir holds what your preprocessing makes of the images",
                       description="Recompute the calibration tensors from the images with your preprocessing and "
                                   "compare them with the files in cal_data_dir (paired by sorted name), per channel "
                                   "and through the float model; names RGB/BGR swaps, x255 scales and doubly "
                                   "normalised files. Exit code 0: consistent, 1: differences, 2: unusable.")
    p.add_argument("config", help="the hb_mapper makertbin YAML")
    p.add_argument("images", help="folder of the original images, in the same sorted order as the files")
    _preprocess_arg(p)
    p.add_argument("--limit", type=int, help="compare at most this many pairs")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_check_preprocess)

    p = sub.add_parser("sensitivity", help="per node: the gain of leaving it float, and the accuracy with it alone "
                                            "quantized (int8 / int16)",
                       description="Rank the BPU nodes of the model an hb_mapper YAML describes by how much their "
                                   "quantization costs, under the YAML's calibration (or --calibration). Given a "
                                   "search space instead, rank its free nodes with its metric and data, and share "
                                   "the leave-one-float gains with the search (results/<study>/sensitivity.json).")
    _simulation_args(p)
    p.add_argument("--metric", help="mean_cosine (default; a space's objectives.accuracy), min_cosine, mean_sqnr, "
                                    "cosine:<out>, or a task metric")
    p.add_argument("--calibration", help="compare calibrations, comma-separated: max, kl, max:0.99995, +pc for "
                                         "per-channel (e.g. max,kl,max:0.99995+pc)")
    p.add_argument("--study", help="with a space: the study whose cache to use (default: the space's name)")
    p.add_argument("--results-dir", default="results", help="with a space: where study folders are")
    p.add_argument("--top", type=int, help="show only the N most sensitive nodes")
    p.add_argument("--csv", help="write every row to this CSV file")
    p.set_defaults(func=cmd_sensitivity)

    p = sub.add_parser("search", help="search node placement, int16 and calibration; resumes an existing study",
                       description="Start, or continue, an Optuna study over the space file's knobs. Results are "
                                   "rewritten as they improve: results/<study>/best.yaml, pareto/, trials.csv.")
    p.add_argument("space", help="search space YAML (see search_spaces/README.md)")
    p.add_argument("--study", help="study name (default: study.name in the space, else the file name)")
    p.add_argument("--n-trials", type=int, help="run until the study holds this many completed trials")
    p.add_argument("--timeout", help="stop after this long (seconds, or 30m, 8h)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes on this machine (default 1)")
    p.add_argument("--storage", help="Optuna storage URL (default: a journal file in results/<study>/)")
    p.add_argument("--seed", type=int, help="sampler seed (default: study.seed in the space)")
    p.add_argument("--threads", type=int, help="evaluation threads per worker (default: all cores)")
    _worker_args(p)
    p.add_argument("--results-dir", default="results", help="where study folders go (default: results)")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("worker", help="join an existing study as one more worker (another machine, same files)",
                       description="Run trials of an existing study, e.g. on another machine sharing a PostgreSQL "
                                   "storage. This machine's model, data, base YAML and space must be the study's "
                                   "(their sha256 are checked; a mismatch is refused).")
    p.add_argument("study", help="study name")
    p.add_argument("--storage", help="the study's storage URL, e.g. postgresql://user:password@host/db (default: "
                                     "results/<study>/study.journal)")
    p.add_argument("--space", help="this machine's copy of the space file (default: the path the study recorded)")
    p.add_argument("--n-trials", type=int, help="stop when the study holds this many completed trials "
                                                "(default: the space's study.n_trials)")
    p.add_argument("--timeout", help="stop after this long (seconds, or 30m, 8h)")
    p.add_argument("--threads", type=int, help="evaluation threads (default: all cores)")
    _worker_args(p)
    p.add_argument("--results-dir", default="results", help="where this machine writes best.yaml, pareto/ "
                                                            "(default: results)")
    p.set_defaults(func=cmd_worker)

    for name, func, helptext in (("status", cmd_status, "trials, best and Pareto front of a study"),
                                 ("export", cmd_export, "write a trial's hb_mapper YAML (default: the best)")):
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument("study", help="study name (results/<name>) or its folder")
        p.add_argument("--storage", help="Optuna storage URL, when the study is not in results/")
        p.add_argument("--results-dir", default="results", help="where study folders are (default: results)")
        if name == "export":
            p.add_argument("--trial", type=int, help="trial number (default: the best feasible trial)")
            p.add_argument("--out", help="output YAML (default: results/<study>/trial_NNNNN.yaml)")
            p.add_argument("--by", choices=("simulated", "real"), default="simulated",
                           help="pick the best by the simulated figure (default) or by the real one 'tuner verify' "
                                "stored")
        p.set_defaults(func=func)

    p = sub.add_parser("report", help="write results/<study>/report.html (Pareto, history, sensitivity, per-node "
                                      "error, chosen node_info)",
                       description="Write the study's self-contained HTML report (opens offline). The search "
                                   "rewrites it as it goes; this command redraws it, e.g. after the search stopped.")
    p.add_argument("study", help="study name (results/<name>) or its folder")
    p.add_argument("--storage", help="Optuna storage URL, when the study is not in results/")
    p.add_argument("--results-dir", default="results", help="where study folders are (default: results)")
    p.add_argument("--threads", type=int, help="evaluation threads (default: all cores)")
    p.set_defaults(func=cmd_report)

    from tuner.toolchain.commands import add_commands

    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import optuna

        # Optuna's INFO line per trial drowns the progress bar, and its WARNING for a failed trial
        # carries a traceback; tuner reports failures itself, in one line with the reason.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
    except ImportError:
        pass
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
