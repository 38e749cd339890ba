"""Scaling out ``tuner search``: worker processes on one machine, and the cost of each storage.

    python benchmarks/scale.py [--trials 60] [--store-trials 1000] [--probe 40] [--postgres URL] [--skip-throughput]

Not a test: it prints measurements (targets in brackets). The machine is shared and has 2 cores:
read ratios measured within one run, not absolute numbers.

1. **Trials per hour, 1 and 2 workers** (``tuner search examples/segdepth/search.yaml --jobs J``, the real
   CLI in a subprocess, a fresh study each). Start-up (imports, calibration statistics, node
   sensitivity, worker spawn) is excluded: the rate is taken from the trials' own timestamps,
   ``(completed trials after the first 11) / (last completion - completion of trial 11)``, i.e. the
   steady state after the warm-start trials. Each trial's simulation time (``record.seconds``) is
   reported next to it; the rest of a trial (sampler, storage, result writes) is per-trial work
   in each worker. Rows: ``jobs 1`` (the default: one worker, simulation threads = all cores),
   ``jobs 1 --threads 1``, ``jobs 2`` (one thread each), and two independent single-thread
   searches at once (separate studies and journals): the machine's ceiling for two processes of
   this work with no shared study. Goal of issue 6: jobs 2 >= 1.8 x jobs 1.

2. **Storage overhead per trial** with ``--store-trials`` (default 1,000) trials already in the
   study: for the Optuna journal file (the default), SQLite and PostgreSQL (``--postgres URL`` or
   $TUNER_TEST_POSTGRES_URL; skipped without one), a study over the example's space is filled
   with completed trials carrying a realistic record, then ``--probe`` more trials run through
   the real loop (multivariate TPE with constant liar, the budget gate, de-duplication, orphan
   checks, heartbeats for the databases, anytime result writes) with a stand-in evaluation of
   fixed cost (``--eval-ms``, default 150 ms, about one example trial). Every call on the
   study's storage object is timed; printed: storage seconds per trial and their share of the
   trial's wall time, and the sampler's time (which includes its own storage reads).

3. **Journal lock contention**: one and two processes append 300 lines each to one journal
   file through Optuna's ``JournalFileBackend`` and symlink lock (as tuner opens it), 3 ms of
   other work between appends; printed: milliseconds per append (lock, write, fsync).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from search import REPO, SPACE, load, prepare_data

from tuner.study.record import RECORD, CalibrationUsed, Counts, Latency, TrialRecord

WARM = 11  # the example's warm-start trials


def journal_trials(results: Path, study: str):
    from tuner.study.storage import open_existing

    return open_existing(study, None, results)[0].get_trials(deepcopy=False)


def steady_rate(trials) -> tuple[float, float, int]:
    """(trials/hour after the warm start, mean simulation seconds, trials counted)."""
    from optuna.trial import TrialState

    done = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.datetime_complete)
    if len(done) <= WARM + 2:
        raise SystemExit(f"only {len(done)} trials completed; use a larger --trials")
    t0 = done[WARM - 1].datetime_complete
    rest = done[WARM:]
    span = (rest[-1].datetime_complete - t0).total_seconds()
    recs = [TrialRecord.of_trial(t) for t in rest]
    sims = [r.seconds for r in recs if r is not None and r.duplicate_of is None]
    return 3600 * len(rest) / span, sum(sims) / max(1, len(sims)), len(rest)


def search_cmd(results: Path, study: str, n: int, jobs: int, threads: int | None = None) -> list[str]:
    return [sys.executable, "-m", "tuner", "search", str(SPACE), "--n-trials", str(n), "--jobs", str(jobs),
            "--seed", "0", "--study", study, "--results-dir", str(results)] + (
        ["--threads", str(threads)] if threads else [])


def bench_throughput(tmp: Path, n: int) -> None:
    print(f"\n== trials per hour: tuner search {SPACE.relative_to(REPO)} --jobs J, {n} trials, steady state "
          f"after the {WARM} warm-start trials ==", flush=True)
    results = tmp / "results"
    # fill the calibration statistics cache and the node sensitivity once (not measured)
    subprocess.run(search_cmd(results, "warmup", 1, 1), check=True, capture_output=True, cwd=REPO)
    rate = {}
    runs = (("jobs 1", 1, 1, None), ("jobs 1 --threads 1", 1, 1, 1), ("jobs 2", 2, 1, None),
            ("2 searches --threads 1", 1, 2, 1))
    for label, jobs, copies, threads in runs:
        tag = label.replace(" ", "").replace("-", "")
        procs = [subprocess.Popen(search_cmd(results, f"{tag}_{i}", n, jobs, threads), cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i in range(copies)]
        for p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"{label}: tuner search failed:\n{err}")
        measured = [steady_rate(journal_trials(results, f"{tag}_{i}")) for i in range(copies)]
        rate[label] = sum(m[0] for m in measured)
        sim = sum(m[1] for m in measured) / copies
        print(f"{label:>23}: {rate[label]:8,.0f} trials/hour  ({3600 / rate[label] * 1000:4.0f} ms/trial; simulation "
              f"{sim * 1000:.0f} ms of each worker's trial; {sum(m[2] for m in measured)} trials counted; "
              f"load {load()})", flush=True)
    print(f"jobs 2 / jobs 1: {rate['jobs 2'] / rate['jobs 1']:.2f}x [goal: >= 1.8]")
    print(f"jobs 2 / jobs 1 --threads 1 (one core per worker in both): "
          f"{rate['jobs 2'] / rate['jobs 1 --threads 1']:.2f}x; two independent single-thread searches / one: "
          f"{rate['2 searches --threads 1'] / rate['jobs 1 --threads 1']:.2f}x (the ceiling with no shared study)")


class TimedStorage:
    """Wraps a study's storage object: every public call is timed (the study, the sampler and
    the tuner loop all reach the storage through it)."""

    def __init__(self, inner):
        self._inner = inner
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name.startswith("__") or not callable(attr):
            return attr

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return attr(*a, **k)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        return timed

    def total(self) -> float:
        return sum(self.seconds.values())


def bench_storage(tmp: Path, kind: str, url: str | None, n_fill: int, n_probe: int, eval_ms: float) -> None:
    import optuna
    from optuna.trial import TrialState

    from tuner.study.loop import optimize_until
    from tuner.study.session import StudySession

    name = f"store_{kind}_{os.getpid()}"
    storage = {"journal": str(tmp / kind / "study.journal"), "sqlite": f"sqlite:///{tmp / kind / 'study.db'}",
               "postgresql": url}[kind]
    (tmp / kind).mkdir(parents=True, exist_ok=True)
    search = StudySession.open(SPACE, name, storage, tmp / "results", quiet=True)
    study = search.study(seed=0)
    # n_fill completed trials, as the search would have written them
    src = search.problem.resolved
    rng = random.Random(0)
    record = None
    dists = src.distributions()
    t0 = time.perf_counter()
    trials = []
    for i in range(n_fill):
        params = {d.param: rng.choice(list(d.choices)) for d in src.decisions}
        for pname, values in src.calibration_params.items():
            params[pname] = rng.choice(values)
        if record is None:
            cand = src.candidate(params)
            ev = search.problem.ws.simulator.evaluate(cand)  # the probe's stand-in evaluation returns it too
            lat = search.problem.cost.latency(ev.plan)
            record = TrialRecord(key="", accuracy=0.99, outputs=ev.outputs, task=ev.task,
                                 latency=Latency.from_json(lat.as_dict()), counts=Counts.from_json(ev.counts()),
                                 calibration=CalibrationUsed("max", "max"), candidate_fields=cand.to_yaml_fields(),
                                 cpu_nodes=tuple(ev.plan.cpu_nodes), notes=(), seconds=0.1)
        acc = 0.999 - 0.01 * rng.random()
        trials.append(optuna.trial.create_trial(
            params=params, distributions=dists, values=[acc, 1.0 + rng.random()],
            # keys no probe candidate can match: every probe trial is evaluated (late in a study
            # TPE re-proposes stored candidates often; those are answered from storage instead)
            user_attrs={RECORD: replace(record, key=f"fill-{i}", accuracy=acc).to_json(),
                        "worker": {"host": "fill", "pid": 0}}))
    study.add_trials(trials)
    fill_s = time.perf_counter() - t0

    # the probe: the real loop, a stand-in evaluation of fixed cost
    class FixedCost:
        def evaluate(self, cand, **kw):
            time.sleep(eval_ms / 1000)
            return ev

    search.problem.ws._simulator = FixedCost()
    timed = TimedStorage(study._storage)
    study._storage = timed
    sampler_s = [0.0]
    sample = study.sampler.sample_relative

    def timed_sample(*a, **k):
        t = time.perf_counter()
        try:
            return sample(*a, **k)
        finally:
            sampler_s[0] += time.perf_counter() - t

    study.sampler.sample_relative = timed_sample
    search.scorer.index(study)
    t0 = time.perf_counter()
    def after(st, t):  # as tuner's workers do: the anytime results
        if t.state == TrialState.COMPLETE:
            search.result_files.write(st, trial=t)

    optimize_until(search, study, n_fill + n_probe, None, [after])
    wall = time.perf_counter() - t0
    n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) - n_fill
    # the heartbeat thread's writes run beside the trial, not on its path: shown apart
    beat = timed.seconds.pop("record_heartbeat", 0.0)
    storage_s = timed.total()  # includes the sampler's reads of the study
    top = sorted(timed.seconds.items(), key=lambda kv: -kv[1])[:3]
    print(f"{kind:>10}: {storage_s / n * 1000:7.1f} ms storage / trial = {100 * storage_s / wall:5.1f}% of "
          f"{wall / n * 1000:6.0f} ms/trial; sampler {sampler_s[0] / n * 1000:6.1f} ms/trial; "
          + (f"heartbeats {beat / n * 1000:.1f} ms/trial (own thread); " if beat else "") +
          f"fill {n_fill} trials {fill_s:.1f} s; top calls: "
          + ", ".join(f"{k} {v / n * 1000:.1f} ms ({timed.calls[k] / n:.0f}x)" for k, v in top), flush=True)


def _appender(path: str, n: int, out) -> None:
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    backend = JournalFileBackend(path, lock_obj=JournalFileSymlinkLock(path, grace_period=10))  # as journal_storage
    t0 = time.perf_counter()
    for i in range(n):
        backend.append_logs([{"op_code": -1, "i": i, "pad": "x" * 150}])
        time.sleep(0.003)
    out.put((time.perf_counter() - t0) / n * 1000 - 3)


def bench_journal_lock(tmp: Path, n: int = 300) -> None:
    import multiprocessing as mp

    print("\n== journal appends, 1 and 2 processes on one file ==", flush=True)
    ctx = mp.get_context("spawn")
    for procs in (1, 2):
        path = tmp / f"lock{procs}.journal"
        out = ctx.Queue()
        ps = [ctx.Process(target=_appender, args=(str(path), n, out)) for _ in range(procs)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        times = [out.get(timeout=60) for _ in ps]
        print(f"{procs} process(es): " + ", ".join(f"{t:.2f}" for t in times) + " ms per append", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=60, help="trials per throughput run (default 60)")
    ap.add_argument("--store-trials", type=int, default=1000, help="trials in the study for the storage runs")
    ap.add_argument("--probe", type=int, default=40, help="trials timed on top of them")
    ap.add_argument("--eval-ms", type=float, default=150.0, help="the stand-in evaluation's cost")
    ap.add_argument("--postgres", default=os.environ.get("TUNER_TEST_POSTGRES_URL"), help="a PostgreSQL URL")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-storage", action="store_true")
    args = ap.parse_args()
    prepare_data()
    os.environ.setdefault("TUNER_CACHE_DIR", tempfile.mkdtemp(prefix="tuner-bench-cache-"))
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"machine: {os.cpu_count()} cores, load {load()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.skip_throughput:
            bench_throughput(tmp, args.trials)
        bench_journal_lock(tmp)
        if not args.skip_storage:
            print(f"\n== storage overhead: {args.store_trials} trials in the study, {args.probe} more timed, "
                  f"evaluation stand-in {args.eval_ms:.0f} ms ==", flush=True)
            for kind in ("journal", "sqlite", "postgresql"):
                if kind == "postgresql" and not args.postgres:
                    print("postgresql: skipped (no --postgres URL and no TUNER_TEST_POSTGRES_URL)")
                    continue
                bench_storage(tmp, kind, args.postgres, args.store_trials, args.probe, args.eval_ms)


if __name__ == "__main__":
    main()
