"""What ``tuner search`` gets for its time: trials per hour, and TPE against random search.

    python benchmarks/search.py [--budgets 25,50,100] [--seed 0] [--timing-trials 200] [--incremental] [--quick]
                                [--size HxW] [--jobs 1,2] [--no-quality]

Not a test: it prints measurements (targets in brackets), on the bundled example
(``examples/segdepth/search.yaml``; its data are written by ``examples/segdepth/make_data.py``
when missing), with fresh temporary results folders and a fresh temporary ``TUNER_CACHE_DIR``.

1. **Trials per hour** of the real CLI (``python -m tuner search SPACE --n-trials N --jobs J``) in a
   subprocess, for ``--jobs 1`` and ``--jobs 2``. A first one-trial run fills the calibration
   statistics cache; then each J runs a new study to ``N0 = 20`` trials and another to
   ``N = --timing-trials`` trials. Both commands pay the same start-up (imports, workspace,
   node sensitivity, which is cached per study folder, worker spawn, the 11 warm-start trials), so
   ``(wall(N) - wall(N0)) / (n(N) - n(N0))`` is the cost of one sampled trial (the sampler's
   suggestion, the simulation, the journal and anytime-result writes), n being the completed
   trials each study ends with. Ratio jobs 2 / jobs 1 [goal of issue 6: >= 1.8 on 2 cores].
   The same difference of the commands' CPU time gives CPU seconds per trial, and the N-trial
   study's journal the steady state directly: the wall time between trial completions after trial
   ``N0`` (no start-up in it, so a load change between the two commands on a shared machine, which
   skews the difference, does not).

2. **Search quality against random search** at equal budget and seed, with the library API
   (``StudySession.open`` + ``run(jobs=1)``), one study per method:

   * ``tpe``: the space as shipped (multivariate TPE, warm start on);
   * ``random``: the same space with ``study.sampler: random`` and nothing enqueued (plain random
     search);
   * ``random+warm``: random sampler, after the same warm-start trials as ``tpe``.

   The spaces are copies of the shipped one in a temporary folder (its paths -- ``base``,
   ``eval_data``, ``labels`` -- made absolute, ``study.sampler`` changed); their free nodes and
   choices are checked to be the same for every method. For each budget B: the best accuracy over the completed trials,
   the lowest modeled latency among feasible trials (accuracy >= ``objectives.min_accuracy``), the
   hypervolume of the feasible Pareto front (accuracy up, latency down) and the number of repeats
   proposed (configurations already scored: pruned trials with ``duplicate_of``, answered from
   storage and not counted in the budget B).

   The hypervolume's reference point is accuracy = ``min_accuracy`` and latency = 1.1 x the largest
   modeled latency of any trial of any method; it is printed, and shown as a percentage of the box
   [min_accuracy, 1] x [0, reference latency] (1 = the highest cosine).

   By default each method's study runs once to the largest budget and budget B reads its first B
   completed trials (with ``jobs=1`` that is exactly the study an uninterrupted run to B trials
   holds). ``--incremental`` instead continues the study with one ``run()`` per budget, as running
   ``tuner search`` again with a larger ``--n-trials`` does: the sampler is rebuilt with the same
   seed on every resume, so it proposes its earlier random draws again (see the duplicates column).

``--quick``: budgets 10,20, timing with jobs 1 only and 60 trials.

``--size 360x640``: the same network and weights at the users' resolution
(``examples/segdepth/make_hires.py`` writes the model, 8 calibration and 16 evaluation samples with
labels and the example's space pointed at them into the git-ignored ``examples/segdepth/data/360x640/``
when missing); the timing also prints trials per 8 hours [goal of issue 18: >= 10,000 on 2 cores with
16 evaluation samples]. ``--no-quality`` skips part 2.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEGDEPTH = REPO / "examples" / "segdepth"
SPACE = SEGDEPTH / "search.yaml"
N0 = 20  # trials of the short timing run: more than the example's 11 warm-start trials


def prepare_data() -> None:
    if not (SEGDEPTH / "data" / "cal").is_dir() or not (SEGDEPTH / "data" / "eval").is_dir():
        print("segdepth: writing its data with examples/segdepth/make_data.py ...", flush=True)
        subprocess.run([sys.executable, str(SEGDEPTH / "make_data.py")], check=True)


def prepare_hires(size: str) -> Path:
    """The example's network at ``size`` (HxW), its data and search space (make_hires.py, into the
    git-ignored ``examples/segdepth/data/<size>/``, written when missing); returns the space file."""
    out = SEGDEPTH / "data" / size
    needed = [out / f"segdepth_{size}.onnx", out / "hb_config.yaml", out / "search.yaml", out / "cal", out / "eval"]
    if not all(p.exists() for p in needed):
        print(f"segdepth {size}: writing the model and data with examples/segdepth/make_hires.py ...", flush=True)
        subprocess.run([sys.executable, str(SEGDEPTH / "make_hires.py"), "--size", size, "--out", str(out)],
                       check=True)
    return out / "search.yaml"


# ---------------------------------------------------------------------------- 1. trials per hour
def cli_search(results: Path, study: str, n_trials: int, jobs: int, seed: int, space: Path = SPACE
               ) -> tuple[float, int, float]:
    """Wall time of one ``tuner search`` command, the completed trials its study ends with, and the
    CPU time (user + system) it used."""
    cmd = [sys.executable, "-m", "tuner", "search", str(space.relative_to(REPO)), "--n-trials", str(n_trials),
           "--jobs", str(jobs), "--seed", str(seed), "--study", study, "--results-dir", str(results)]
    c0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    with open(results / study / "trials.csv", newline="") as f:
        completed = sum(1 for _ in csv.DictReader(f))
    return wall, completed, cpu


def steady_seconds_per_trial(results: Path, study: str, skip: int) -> float:
    """Seconds between trial completions in the study's journal after its first ``skip`` completed
    trials: (last - first) / (trials - 1). Unlike the difference of two commands' wall times, no
    start-up is in it, so a change of the machine's load between the two commands does not skew it."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(results / study / "study.journal")))
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    done = sorted(t.datetime_complete for t in trials if t.datetime_complete)[skip:]
    return (done[-1] - done[0]).total_seconds() / (len(done) - 1)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_throughput(tmp: Path, jobs_list: list[int], n_trials: int, seed: int, space: Path = SPACE) -> None:
    results = tmp / "timing"
    print(f"\n== trials per hour: python -m tuner search {space.relative_to(REPO)} --jobs J "
          f"({os.cpu_count()} CPUs, affinity {len(os.sched_getaffinity(0))}; load average {load()}) ==", flush=True)
    wall, _, _ = cli_search(results, "warmup", 1, 1, seed, space)
    print(f"warm-up (1 trial, fills the statistics cache): {wall:.1f} s", flush=True)
    rate: dict[int, float] = {}
    free: dict[int, float] = {}
    steady: dict[int, float] = {}
    cores = len(os.sched_getaffinity(0))
    header = (f"{'jobs':>4}{'N0 trials':>11}{'wall s':>8}{'N trials':>10}{'wall s':>8}{'s/trial':>9}{'trials/hour':>13}"
              f"{'trials/8 h':>12}{'cpu s/trial':>13}{'8 h, free cores':>17}{'steady s':>10}{'steady 8 h':>12}")
    lines = []
    for jobs in jobs_list:
        w0, n0, c0 = cli_search(results, f"j{jobs}_n{N0}", N0, jobs, seed, space)
        w1, n1, c1 = cli_search(results, f"j{jobs}_n{n_trials}", n_trials, jobs, seed, space)
        per = (w1 - w0) / (n1 - n0)
        cpu_per = (c1 - c0) / (n1 - n0)
        rate[jobs] = 3600 / per
        free[jobs] = 8 * 3600 * cores / cpu_per
        steady[jobs] = steady_seconds_per_trial(results, f"j{jobs}_n{n_trials}", N0)
        lines.append(f"{jobs:>4}{n0:>11}{w0:>8.1f}{n1:>10}{w1:>8.1f}{per:>9.3f}{rate[jobs]:>13,.0f}"
                     f"{8 * rate[jobs]:>12,.0f}{cpu_per:>13.3f}{free[jobs]:>17,.0f}{steady[jobs]:>10.3f}"
                     f"{8 * 3600 / steady[jobs]:>12,.0f}")
        print(lines[-1], flush=True)
    print(header + "\n" + "-" * len(header) + "\n" + "\n".join(lines))
    if space != SPACE:
        best = min(steady, key=steady.__getitem__)
        print(f"trials per 8 hours: {8 * 3600 / steady[best]:,.0f} (--jobs {best}, steady state of the N-trial "
              f"study: wall time between its completions after trial {N0}) [goal of issue 18: >= 10,000 on 2 cores "
              f"with 16 evaluation samples]; {max(free.values()):,.0f} from the CPU time per trial if the {cores} "
              f"cores were free (8 h x {cores} cores / cpu s per trial)")
    if 1 in rate and 2 in rate:
        print(f"jobs 2 / jobs 1: {rate[2] / rate[1]:.2f}x, in the steady state {steady[1] / steady[2]:.2f}x "
              "[goal of issue 6: >= 1.8 on 2 cores]")
    print("s/trial = (wall(N) - wall(N0)) / (N - N0): start-up and the warm-start trials cancel out; cpu s/trial "
          "the same difference of the commands' CPU time (user + system, all threads); steady s = seconds between "
          f"completions after trial {N0} in the N-trial study's journal; "
          f"load average now {load()} (other processes on the machine skew the times, the jobs 2 ones most)")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------- 2. TPE vs random
@dataclass(frozen=True)
class Point:
    number: int
    accuracy: float
    latency_ms: float
    duplicate: bool          # a completed repeat (studies made before repeats were pruned)
    repeats: int = 0         # repeats proposed (pruned, not in the budget) before this trial


@dataclass(frozen=True)
class Method:
    label: str
    sampler: str
    warm_start: bool


METHODS = (Method("tpe", "tpe", True), Method("random", "random", False), Method("random+warm", "random", True))


def copy_space(src: Path, out: Path, **sections: dict) -> Path:
    """Write the space file ``src`` to ``out`` (a temporary folder only: the paths it writes are
    absolute), each of ``sections``' keys set in that section (``study={"sampler": "random"}``).

    Every path the space resolves against its own folder (``base``, ``eval_data``, ``labels``,
    ``profile``, a ``march`` table file) is made absolute, so the copy evaluates on the same
    model, data and labels from anywhere; ``out`` may be ``src`` (edited in place)."""
    import yaml

    raw = yaml.safe_load(src.read_text(encoding="utf-8"))
    here = src.parent

    def absolute(path: str) -> str:
        return str((here / path).resolve())

    for key in ("base", "profile"):
        if raw.get(key):
            raw[key] = absolute(raw[key])
    if isinstance(raw.get("march"), str) and raw["march"].endswith((".yaml", ".yml")):
        raw["march"] = absolute(raw["march"])
    if raw.get("eval_data"):
        raw["eval_data"] = ";".join(absolute(p) for p in str(raw["eval_data"]).split(";"))
    if raw.get("labels"):
        raw["labels"] = {k: absolute(v) for k, v in raw["labels"].items()}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return out


def points(study) -> list[Point]:
    """Completed trials in trial order."""
    import bisect

    from tuner.study.loop import repeat_of
    from tuner.study.results import rows

    rep = sorted(t.number for t in study.get_trials(deepcopy=False) if repeat_of(t) is not None)
    return sorted((Point(r.number, r.accuracy, r.latency_ms, r.duplicate, bisect.bisect_left(rep, r.number))
                   for r in rows(study)), key=lambda p: p.number)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The distinct non-dominated (accuracy up, latency down) points, by latency: one sort and a
    sweep, as ``tuner.study.results.pareto`` does for a study's rows."""
    front: list[tuple[float, float]] = []
    for acc, lat in sorted(set(points), key=lambda p: (p[1], -p[0])):
        if not front or acc > front[-1][0]:
            front.append((acc, lat))
    return front


def hypervolume(pts: list[Point], floor: float, ref_ms: float) -> float:
    """Area dominated by the feasible points (accuracy >= floor) above ``floor`` and left of ``ref_ms``."""
    area, best_acc = 0.0, floor
    for p in sorted((p for p in pts if p.accuracy >= floor), key=lambda p: (p.latency_ms, -p.accuracy)):
        if p.accuracy > best_acc and p.latency_ms < ref_ms:
            area += (ref_ms - p.latency_ms) * (p.accuracy - best_acc)
            best_acc = p.accuracy
    return area


def run_method(tmp: Path, method: Method, budgets: list[int], seed: int, incremental: bool, space_file: Path = SPACE):
    """The method's completed trials at each budget, its free decisions, and the set-up time."""
    from tuner.study.loop import run
    from tuner.study.session import StudySession

    space = copy_space(space_file, tmp / "spaces" / f"search_{method.sampler}.yaml", study={"sampler": method.sampler})
    t0 = time.perf_counter()
    search = StudySession.open(space, name=method.label, results_dir=tmp / "quality", quiet=True)
    open_s = time.perf_counter() - t0
    if not method.warm_start:
        search.enqueue_warm_start = lambda study: 0  # plain random search: nothing enqueued
    decisions = [(d.param, d.choices) for d in search.problem.resolved.decisions], dict(search.problem.resolved.calibration_params)
    at = {}
    t0 = time.perf_counter()
    for b in (budgets if incremental else budgets[-1:]):
        study, info = run(search, n_trials=b, timeout=None, jobs=1, seed=seed, progress=False)
        if info.get("stopped") or info["interrupted"]:
            raise SystemExit(f"{method.label}: the study stopped early: {info}")
        at[b] = points(study)
    run_s = time.perf_counter() - t0
    final = at[budgets[-1]]
    by_budget = {b: (at[b] if incremental else final[:b]) for b in budgets}
    return by_budget, decisions, open_s, run_s


def bench_quality(tmp: Path, budgets: list[int], seed: int, incremental: bool, space: Path = SPACE) -> None:
    import optuna

    from tuner.study.space import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objectives = load_space(space).objectives
    floor = float(objectives["min_accuracy"])
    how = "one run() per budget, resumed with the same seed" if incremental else \
        f"one run to {budgets[-1]} trials, budget B = its first B completed trials"
    print(f"\n== search quality: {space.relative_to(REPO)}, seed {seed}, jobs 1 ({how}) ==", flush=True)
    runs, spaces = {}, {}
    for m in METHODS:
        runs[m.label], spaces[m.label], open_s, run_s = run_method(tmp, m, budgets, seed, incremental, space)
        print(f"{m.label}: StudySession.open {open_s:.1f} s (node sensitivity included), trials {run_s:.1f} s", flush=True)
    first = spaces[METHODS[0].label]
    if any(s != first for s in spaces.values()):
        raise SystemExit("the methods' spaces differ (free nodes or choices): the comparison would not be fair")
    print(f"space: {len(first[0])} node decisions, calibration knobs {', '.join(first[1])}; "
          f"objectives {objectives['mode']} on {objectives['accuracy']}, min_accuracy {floor}")

    ref_ms = 1.1 * max(p.latency_ms for r in runs.values() for pts in r.values() for p in pts)
    box = (1.0 - floor) * ref_ms
    print(f"hypervolume reference point: accuracy {floor}, latency {ref_ms:.3f} ms (1.1 x the largest modeled "
          f"latency of any trial); HV % = HV / ((1 - {floor}) x {ref_ms:.3f} ms)")
    header = (f"{'budget':>6}  {'method':<12}{'best acc':>10}{'best feas. ms':>15}{'HV':>11}{'HV %':>7}"
              f"{'feasible':>10}{'front':>7}{'dups':>6}")
    print(header + "\n" + "-" * len(header))
    for b in budgets:
        for m in METHODS:
            pts = runs[m.label][b]
            feas = [p for p in pts if p.accuracy >= floor]
            hv = hypervolume(pts, floor, ref_ms)
            front = len(pareto_front([(p.accuracy, p.latency_ms) for p in feas]))
            best_ms = f"{min(p.latency_ms for p in feas):.3f}" if feas else "-"
            print(f"{b if m is METHODS[0] else '':>6}  {m.label:<12}{max(p.accuracy for p in pts):>10.6f}"
                  f"{best_ms:>15}{hv:>11.3e}{100 * hv / box:>7.1f}{f'{len(feas)}/{len(pts)}':>10}{front:>7}"
                  f"{sum(p.duplicate for p in pts) + (pts[-1].repeats if pts else 0):>6}")
    print("best acc: max accuracy of any completed trial; best feas. ms: lowest modeled latency with accuracy >= "
          "min_accuracy; front: distinct feasible Pareto points; dups: proposals of a configuration "
          "already scored (duplicate_of), answered from storage and not counted in the budget")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", default="25,50,100", help="comma-separated completed-trial budgets (default 25,50,100)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed of every study (default 0)")
    p.add_argument("--timing-trials", type=int, default=200,
                   help=f"trials of the long timing run (default 200; the short one has {N0})")
    p.add_argument("--incremental", action="store_true",
                   help="continue each study with one run() per budget instead of reading prefixes of one run")
    p.add_argument("--quick", action="store_true", help="budgets 10,20; timing with jobs 1 only, 60 trials")
    p.add_argument("--size", default=None, help="the example's network at this HxW (360x640: the users' resolution)")
    p.add_argument("--jobs", default=None, help="comma-separated --jobs values of the timing (default 1,2; --quick: 1)")
    p.add_argument("--no-quality", action="store_true", help="the timing only (part 1)")
    a = p.parse_args(argv)
    budgets = [10, 20] if a.quick else sorted({int(b) for b in a.budgets.split(",") if b.strip()})
    timing_trials = 60 if a.quick else a.timing_trials
    if not budgets or budgets[0] < 1:
        p.error("--budgets: positive integers")
    if timing_trials <= N0:
        p.error(f"--timing-trials must be > {N0}")
    jobs = [int(j) for j in a.jobs.split(",")] if a.jobs else [1] if a.quick else [1, 2]
    if a.size:
        space = prepare_hires(a.size)
    else:
        prepare_data()
        space = SPACE
    with tempfile.TemporaryDirectory(prefix="bench_search.") as tmp:
        # A fresh statistics cache, set before tuner is imported (the CLI subprocesses inherit it).
        os.environ["TUNER_CACHE_DIR"] = str(Path(tmp) / "cache")
        bench_throughput(Path(tmp), jobs, timing_trials, a.seed, space)
        if not a.no_quality:
            bench_quality(Path(tmp), budgets, a.seed, a.incremental, space)
    return 0


if __name__ == "__main__":
    sys.exit(main())
