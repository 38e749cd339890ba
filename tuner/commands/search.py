"""``tuner search``, ``worker``, ``status``, ``export``, ``report``: the Optuna study and its results."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tuner.commands import args as a
from tuner.errors import TunerError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search node placement, int16 and calibration; resumes an existing study",
                       description="Start, or continue, an Optuna study over the space file's knobs. Results are "
                                   "rewritten as they improve: results/<study>/best.yaml, pareto/, trials.csv.")
    p.add_argument("space", help="search space YAML (see search_spaces/README.md)")
    p.add_argument("--study", help="study name (default: study.name in the space, else the file name)")
    a.n_trials(p, "run until the study holds this many completed trials")
    a.timeout(p)
    p.add_argument("--jobs", type=a.positive_int, default=1, help="worker processes on this machine (default 1)")
    a.storage(p, "Optuna storage URL (default: a journal file in results/<study>/)")
    p.add_argument("--seed", type=int, help="sampler seed (default: study.seed in the space)")
    a.threads(p, "evaluation threads per worker (default: all cores)")
    a.workers(p)
    a.results_dir(p, "where study folders go (default: results)")
    p.set_defaults(func=search)

    p = sub.add_parser("worker", help="join an existing study as one more worker (another machine, same files)",
                       description="Run trials of an existing study, e.g. on another machine sharing a PostgreSQL "
                                   "storage. This machine's model, data, base YAML and space must be the study's "
                                   "(their sha256 are checked; a mismatch is refused).")
    a.study(p, "study name")
    a.storage(p, "the study's storage URL, e.g. postgresql://user:password@host/db (default: "
                 "results/<study>/study.journal)")
    p.add_argument("--space", help="this machine's copy of the space file (default: the path the study recorded)")
    a.n_trials(p, "stop when the study holds this many completed trials (default: the space's study.n_trials)")
    a.timeout(p)
    a.threads(p)
    a.workers(p)
    a.results_dir(p, "where this machine writes best.yaml, pareto/ (default: results)")
    p.set_defaults(func=worker)

    for name, func, helptext in (("status", status, "trials, best and Pareto front of a study"),
                                 ("export", export, "write a trial's hb_mapper YAML (default: the best)")):
        p = sub.add_parser(name, help=helptext, description=helptext)
        a.study(p)
        a.storage(p)
        a.results_dir(p)
        if name == "status":
            p.add_argument("--json", action="store_true", help="print the status as one JSON object (for scripts)")
        if name == "export":
            p.add_argument("--trial", type=int, help="trial number (default: the best feasible trial)")
            p.add_argument("--out", help="output YAML (default: results/<study>/trial_NNNNN.yaml); an existing file "
                                         "is refused without --force")
            p.add_argument("--force", action="store_true", help="overwrite an existing --out file (never the "
                                                                "study's base YAML)")
            p.add_argument("--by", choices=("simulated", "real"), default="simulated",
                           help="pick the best by the simulated figure (default) or by the real one 'tuner verify' "
                                "stored")
        p.set_defaults(func=func)

    p = sub.add_parser("report", help="write results/<study>/report.html (Pareto, history, sensitivity, per-node "
                                      "error, chosen node_info)",
                       description="Write the study's self-contained HTML report (opens offline). The search "
                                   "rewrites it as it goes; this command redraws it, e.g. after the search stopped.")
    a.study(p)
    a.storage(p)
    a.results_dir(p)
    a.threads(p)
    p.set_defaults(func=report)


def _stop_message(text: str) -> None:
    print(f"tuner: {text}", file=sys.stderr, flush=True)


def search(args: argparse.Namespace) -> int:
    from tuner.study.loop import duration, install_stop_handlers, run
    from tuner.study.session import StudySession
    from tuner.study.storage import redact

    # During set-up Ctrl-C interrupts at once (a process started in the background inherits
    # SIGINT as ignored: restore it); once trials run, see install_stop_handlers below.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tuner.study.join import preflight
    from tuner.study.space import load_space

    space = load_space(args.space)          # read once: the name, the data check and the study use it
    preflight(space, args.study, args.storage, args.results_dir)   # results folder, storage: before any data
    search = StudySession.open(space, args.study, args.storage, args.results_dir, args.threads, check=_data_check,
                               heartbeat=args.heartbeat, max_retry=args.max_retry)
    problem, place = search.problem, search.place
    st = problem.space.study
    n_trials = args.n_trials if args.n_trials is not None else st["n_trials"]
    timeout = duration(args.timeout) if args.timeout is not None else duration(st["timeout"])
    seed = args.seed if args.seed is not None else st["seed"]
    for w in problem.ws.warnings:
        print(f"warning: {w}", file=sys.stderr)
    r = problem.resolved
    print(f"study {place.name}: {len(r.decisions)} node decision(s), calibration knobs "
          f"{', '.join(r.calibration_params) or 'fixed'}; mode {problem.mode}; storage "
          f"{redact(place.storage_url) if place.storage_url else place.paths.journal}")
    # Ctrl-C and SIGTERM (schedulers) from here on: finish the running trial, keep the storage
    # consistent, print the summary; a second Ctrl-C aborts the trial.
    install_stop_handlers(_stop_message)
    study, info = run(search, n_trials, timeout, args.jobs, seed)
    for notice in search.notices:
        print(notice)
    if info["zombies"]:
        print(f"marked {len(info['zombies'])} trial(s) left running by a dead process as failed: {info['zombies']}"
              + (f" (each re-run up to {args.max_retry} time(s))" if args.max_retry > 0 else ""))
    found = search.tracker.stored_outcome(study)
    print_summary(study, place.paths, found, stale=search.result_files.stale)
    print_simplest(search.minimal.last, place.paths)
    if info.get("exhausted"):
        print(f"stopped early: {info['exhausted']}")
    print_convert(place.paths, place.name, found, search.minimal.last)
    if info.get("stopped"):
        print(f"tuner: stopped: {info['stopped']}", file=sys.stderr)
        return 1
    if info["interrupted"]:
        print("interrupted: the study is consistent; run the same command again to continue", file=sys.stderr)
        return 130
    return 0


def worker(args: argparse.Namespace) -> int:
    from optuna.trial import TrialState

    from tuner.study.join import join_study
    from tuner.study.loop import STOP, duration, install_stop_handlers, work
    from tuner.study.opening import AtFinish
    from tuner.study.storage import redact

    signal.signal(signal.SIGINT, signal.default_int_handler)
    search = join_study(args.study, args.storage, args.space, args.results_dir, args.threads, args.heartbeat,
                        args.max_retry)
    study = search.study(None, create=False)
    paths = search.place.paths
    st = search.problem.space.study
    n_trials = args.n_trials if args.n_trials is not None else st["n_trials"]
    timeout = duration(args.timeout) if args.timeout is not None else duration(st["timeout"])
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    print(f"worker {os.getpid()} joined study {search.place.name} ({done} of {n_trials} trials completed); storage "
          f"{redact(args.storage) if args.storage else paths.journal}", flush=True)
    install_stop_handlers(_stop_message)
    work(search, study, n_trials, timeout)
    search.result_files.write(study, force=True)
    AtFinish(search.minimal.write).finish(study)      # best_minimal.yaml, as the search's own process writes it
    found = search.tracker.stored_outcome(study)
    print_summary(study, paths, found, stale=search.result_files.stale)
    print_simplest(search.minimal.last, paths)
    print_convert(paths, search.place.name, found, search.minimal.last)
    if STOP.is_set():
        print("interrupted: the study is consistent; run the same command again to continue", file=sys.stderr)
        return 130
    return 0


def _data_check(config: Any, model: Any) -> None:
    """The brief data check at the start of a search, on the YAML and model as loaded: errors
    stop it (one line, exit 2), warnings are listed."""
    from tuner.inputs.checks import check_data, format_report

    report = check_data(config.path, loaded=(config, model))
    if report.exit_code() == 2:
        print(format_report(report), file=sys.stderr)
        raise TunerError("the calibration data are unusable (see above); fix them or run 'tuner check-data "
                         f"{config.path}'")
    for f in report.findings:
        if f.severity != "info":
            print(f"data {f.severity}: {f.message}", file=sys.stderr)


def print_summary(study: Any, paths: Any, found: Any = None, stale: str | None = None) -> None:
    """Trial counts, the Pareto front (the best marked), the best's constraints, what nothing
    feasible leaves, and where the results are: :func:`tuner.study.status.study_status` rendered
    (of ``found``, the :class:`~tuner.study.outcome.Outcome` a search kept, else read)."""
    from tuner.console import table
    from tuner.study.record import binding
    from tuner.study.results import front_table, latency_ratio, margins
    from tuner.study.status import study_status

    st = study_status(study, paths, found)
    o, b, vals = st.info.objectives, st.best, st.validations
    print(f"\n{st.completed} completed trial(s), {st.failed} failed, {st.running} running")
    if st.front:
        print("\nPareto front (accuracy up, modeled latency down):")
        print(table(*front_table(st.front, b, vals, o)))
        if b is not None:
            ms = margins(b, o)
            ratio = latency_ratio(b, o)
            if ms or ratio is not None:
                print(f"\nbest (trial {b.number})" + (f": {ratio:.2f}x the all-int8 plan's modeled latency"
                                                     if ratio is not None else "") + (":" if ms else ""))
                bind = binding(ms)
                for m in ms:
                    print(f"  {m.text()}" + ("   <- binds" if m is bind and len(ms) > 1 else ""))
            if vals:
                v = next(iter(vals.values()))
                print(f"validation: {v.samples} sample(s) the search did not select on ({v.metric}); best (*) "
                      f"chosen by the {st.chosen_by} figure" + (" (objectives.select)" if o.select else ""))
            for line in st.held_out.lines() if st.held_out is not None else []:
                print(line)
    elif st.completed:
        print("no trial meets the constraints yet (objectives.min_accuracy / max_latency_ms)")
        found = st.closest
        if found is not None:
            print(f"closest: {found.text()}  -> closest.yaml")
            print("\nPareto front of all trials (none feasible):")
            print(table(["trial", "accuracy", "latency ms", "CPU", "int16", "calibration"],
                        [[("*" if r.number == found.row.number else " ") + str(r.number), f"{r.accuracy:.6f}",
                          f"{r.latency_ms:.3f}", str(r.counts.cpu_nodes), str(r.counts.int16_nodes), r.calibration]
                         for r in st.front_of_all]))
            print("\nnext steps:")
            for step in st.next_steps:
                print(f"  - {step}")
    if stale:
        print(f"\n{stale}")
    if paths.best.exists() and b is not None:
        print(f"\nbest: {paths.best}   Pareto configs: {paths.pareto}/   trials: {paths.trials_csv}")
    elif paths.best.exists():
        print(f"\n{paths.best} is stale: no trial meets the constraints the study holds now (they changed since it "
              "was written); run the search again to move it aside")
    if b is None and paths.closest.exists():
        print(f"\nclosest (not feasible): {paths.closest}   trials: {paths.trials_csv}")
    if paths.report.exists():
        print(f"report: {paths.report}")


def report(args: argparse.Namespace) -> int:
    from tuner.console import progress_printer
    from tuner.files import check_writable
    from tuner.study.outputs import study_report
    from tuner.study.session import StudySession
    from tuner.study.storage import open_existing, redact, study_info
    from tuner.study.warmstart import node_sensitivity

    study, paths = open_existing(args.study, args.storage, args.results_dir)
    check_writable(paths.root, "report.html", "make it writable, or copy the study folder somewhere writable and "
                                              "run 'tuner report' on the copy")
    info = study_info(study)
    notes: list[str] = []
    search: StudySession | None
    out: Path | None
    try:
        search = StudySession.open(info.space_path, study.study_name, args.storage, paths.root.parent, args.threads)
        changed = search.problem.changed_inputs(info.fingerprints)
        if changed:
            raise TunerError(f"the {', '.join(changed)} file(s) changed since the study ran")
    except TunerError as exc:
        # The trials are in the storage; only the simulated views need the model and data.
        notes.append(f"per-node views left out: {exc}")
        print(f"warning: {notes[-1]}", file=sys.stderr)
        search = None
    if search is None:
        out = study_report(study, paths, redact(args.storage) if args.storage else str(paths.journal), notes=notes)
    else:
        p = search.problem
        if not p.sensitivity:
            search.with_sensitivity(node_sensitivity(p.space, p.ws, paths.sensitivity,
                                                     progress_printer("node sensitivity")))
        search.minimal.simplest(study)      # the report's 'simplest fix' section (the trim's evaluations)
        out = search.report_file.write(study, force=True)
        if out is None:
            raise TunerError(f"{paths.report} could not be written (see the warning above)")
    print(f"wrote {out}")
    return 0


def status(args: argparse.Namespace) -> int:
    from tuner.study.outcome import read_outcome
    from tuner.study.storage import open_existing, study_info
    from tuner.toolchain.verified import real_summary

    study, paths = open_existing(args.study, args.storage, args.results_dir)
    if args.json:
        import json

        from tuner.study.status import study_status

        print(json.dumps(study_status(study, paths).to_json(), indent=2, allow_nan=False))
        return 0
    info = study_info(study)
    found = read_outcome(study, info.objectives)       # read once: the summary and the real figures
    print(f"study {study.study_name}: mode {info.mode}, march {info.march}, base {info.base_path}")
    print_summary(study, paths, found)
    real = real_summary(found)
    if real:
        print(f"\n{real}")
    return 0


def export(args: argparse.Namespace) -> int:
    from tuner.files import check_writable
    from tuner.study.outcome import read_outcome
    from tuner.study.outputs import export_trial
    from tuner.study.storage import open_existing, study_info
    from tuner.toolchain.verified import best_real

    if args.out:
        if Path(args.out).is_dir():
            raise TunerError(f"--out {args.out}: is a folder; name the YAML file to write")
        if Path(args.out).exists() and not args.force:
            raise TunerError(f"--out {args.out}: the file exists; tuner does not replace it unless you pass --force "
                             "(or choose another --out)")
        check_writable(Path(args.out).parent, "the exported YAML")
    study, paths = open_existing(args.study, args.storage, args.results_dir)
    info = study_info(study)
    found = read_outcome(study, info.objectives)
    rs = list(found.rows)
    if args.trial is not None:
        match = [r for r in rs if r.number == args.trial]
        if not match:
            raise TunerError(f"trial {args.trial} of study {study.study_name!r} is not a completed trial; "
                             f"completed: {', '.join(str(r.number) for r in rs[:20]) or 'none'}")
        row = match[0]
    elif args.by == "real":
        real = best_real(found)
        if real is None:
            raise TunerError(f"study {study.study_name!r} has no trial with a real accuracy that meets the constraints; "
                             "run 'tuner verify' first, or export by the simulated figure")
        row = real[0]
        print(f"trial {row.number}: real accuracy {real[1].accuracy:.6f} ({real[1].accuracy_source})")
    else:
        picked = found.best     # best.yaml's rule
        if picked is None:
            near = found.closest
            raise TunerError(f"study {study.study_name!r} has no feasible completed trial to export yet"
                             + (f"; the closest is {near.text()}: tuner export {study.study_name} --trial "
                                f"{near.row.number}" if near is not None else ""))
        row = picked
    out = Path(args.out) if args.out else paths.root / f"trial_{row.number:05d}.yaml"
    if not args.out:
        check_writable(paths.root, out.name, f"pass --out FILE to write it elsewhere (tuner export {args.study} "
                                             f"--out trial_{row.number:05d}.yaml)")
    notes = export_trial(row, out, Path(info.base_path), info.node_info_supported, None,
                         {"study": study.study_name, **info.fingerprints})
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    print(f"wrote {out} (trial {row.number}: accuracy {row.accuracy:.6f}, modeled latency {row.latency_ms:.3f} ms)")
    return 0


def print_convert(paths: Any, name: str, found: Any, simplest: Any) -> None:
    """The one file to convert and the next command (:func:`tuner.study.status.convert_lines`)."""
    from tuner.study.status import convert_lines
    from tuner.toolchain.installed import find_toolchain

    lines = convert_lines(paths, name, found, simplest, find_toolchain() is not None)
    if lines:
        print()
    for line in lines:
        print(line)


def print_simplest(found: Any, paths: Any) -> None:
    """best.yaml's decisions, what best_minimal.yaml keeps, and the one-line calibration fixes
    (``found``: computed at the end of the search, :meth:`tuner.study.minimal.MinimalFix.write`)."""
    from tuner.study.trim import summary_lines

    if found is None:
        return
    print()
    for line in summary_lines(found, str(paths.best_minimal)):
        print(line)
