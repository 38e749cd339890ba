"""What one search trial costs: the simulator versus the float model and versus quantize_static.

    python benchmarks/trial_cost.py [--samples N] [--threads T] [--models segdepth,ppocr] [--repeat R]
                                    [--size HxW]

Not a test: it prints measurements (targets in brackets), on

* ``segdepth``: the bundled example (``examples/segdepth/hb_config.yaml``; its data are written
  by ``examples/segdepth/make_data.py`` when missing), evaluated on ``data/eval``; with ``--size 360x640``
  the same network and weights at the users' resolution (``examples/segdepth/make_hires.py`` writes
  the model, 8 calibration and 16 evaluation samples into ``data/360x640/`` when missing);
* ``ppocr``: PP-OCRv4's text detector from ``rapidocr-onnxruntime`` on scikit-image photos,
  prepared as in ``tests/ppocr.py`` (calibration and evaluation on the same photos).

For each model:

* calibration data passes of the whole run (every method included) [target 1], counted by
  wrapping ``tuner.calib.collect.collect_statistics``, and those of a second ``Workspace.open``
  of the same inputs [0: the statistics come from the cache]; the run uses a fresh temporary
  ``TUNER_CACHE_DIR``;
* the float pass: a new session of the float model plus one pass over the evaluation data, run
  the way the simulator runs its models (``make_session`` + ``run_samples``);
* ``Simulator.evaluate`` of five candidates, each the first evaluation of that candidate after
  set-up (no cached session; the first use of a calibration method includes its thresholds);
* the naive path per candidate: ``tuner.simulate.oracle.ort_quantize`` (quantize_static with the
  same scales forced, calibrating on its default 2 samples, and again on all calibration
  samples) + a new session + the same evaluation;
* ratios evaluate / float pass [<= 1.3] and naive / evaluate [>= 10];
* where an evaluation's time goes: thresholds, plan + graph, session creation, run, scoring; and
  the first candidate again with QuantizeLinear/DequantizeLinear pairs instead of FakeQuant nodes
  (``tuner.runtime.fakequant``; ``TUNER_FAKEQUANT=0`` runs the whole benchmark that way).

Times are the median of ``--repeat`` runs (at least 3; fresh simulator each run, so every evaluation stays a
first one, and each run times a float pass just before its evaluations); the machine's other load
shows up in them, so compare ratios, not absolute times. ``cpu e/f`` is evaluate / float pass in
process CPU time, which a busy shared machine distorts much less than wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from search import prepare_data, prepare_hires  # benchmarks/search.py: write the example's data when missing

REPO = Path(__file__).resolve().parents[1]
SEGDEPTH = REPO / "examples" / "segdepth"


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prepare_segdepth(size: str | None = None) -> tuple[Path, Path | None] | None:
    cfg = SEGDEPTH / "hb_config.yaml"
    if not cfg.is_file() or not (SEGDEPTH / "segdepth.onnx").is_file():
        print(f"segdepth: skipped ({cfg.relative_to(REPO)} or segdepth.onnx is missing)")
        return None
    if size:
        space = prepare_hires(size)
        return space.parent / "hb_config.yaml", space.parent / "eval"
    prepare_data()
    return cfg, SEGDEPTH / "data" / "eval"


def prepare_ppocr(root: Path) -> tuple[Path, Path | None] | None:
    sys.path.insert(0, str(REPO / "tests"))  # tests/ppocr.py: the preprocessing the tests use
    from ppocr import det_model_path, write_ppocr_project

    if det_model_path() is None:
        print("ppocr: skipped (pip install --no-deps rapidocr-onnxruntime==1.4.4)")
        return None
    return write_ppocr_project(root / "ppocr"), None


def candidates(ws):
    """Five candidates: four calibrations, and max with one node on the CPU and one int16 output."""
    from tuner.candidate import Calibration, Candidate

    nodes = list(ws.graph)
    bpu = [n for n in nodes if ws.target.bpu_capable(n.op_type) and n.op_type in ws.target.bpu_ops]
    cpu_node = bpu[len(bpu) // 2]
    later = [n for n in nodes[nodes.index(cpu_node) + 1:] if n in bpu and ws.target.int16_output(n.op_type)]
    int16_node = later[0] if later else next(n for n in bpu if ws.target.int16_output(n.op_type))
    return [
        ("max", Candidate.make(Calibration("max"))),
        ("kl", Candidate.make(Calibration("kl"))),
        ("max p=0.99995", Candidate.make(Calibration("max", 0.99995))),
        ("max per_channel", Candidate.make(Calibration("max", per_channel=True))),
        (f"max, {cpu_node.op_type} CPU + {int16_node.op_type} int16",
         Candidate.make(Calibration("max"), {cpu_node.name: {"ON": "CPU"}, int16_node.name: {"OutputType": "int16"}})),
    ], (cpu_node.name, int16_node.name)


def breakdown(ws, simulator, candidate, fused: bool) -> dict[str, float]:
    """The steps of one first evaluation, timed one by one (fresh scale table and session), with
    FakeQuant nodes (``fused``) or Q/DQ pairs."""
    import numpy as np

    from tuner.metrics import Similarity
    from tuner.runtime.session import make_session, run_samples
    from tuner.simulate.plan import make_plan
    from tuner.simulate.qdq import build_sim_model
    from tuner.simulate.scales import ScaleTable

    out = {}
    t0 = time.perf_counter()
    calibration, _ = simulator.resolve(candidate)
    table = ScaleTable(ws.stats, calibration)
    plan = make_plan(simulator.graph, ws.target, candidate)
    for tensor, dtype in list(plan.edges.values()) + list(plan.cpu_reads.values()) + list(plan.outputs.items()):
        table.get(tensor, dtype)
    out["thresholds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    proto = build_sim_model(ws.model.proto, simulator.graph, ws.target, plan, table, simulator.weights, fused=fused)
    out["plan+graph"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    session = make_session(proto)  # serializes it, as evaluate does
    out["session"] = time.perf_counter() - t0
    names = ws.model.output_names
    t0 = time.perf_counter()
    values = list(run_samples(session, names, simulator.data, simulator.threads))
    out["run"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sims = {o: Similarity() for o in names}
    for i, vals in enumerate(values):
        for o, v in zip(names, vals):
            assert np.isfinite(v).all()
            sims[o].update(simulator.reference[i][o], v)
    out["score"] = time.perf_counter() - t0
    out["points"] = sum(n.op_type in ("QuantizeLinear", "FakeQuant") for n in proto.graph.node)
    return out


def bench_model(label: str, cfg: Path, eval_dir: Path | None, samples: int | None, threads: int | None,
                repeat: int) -> None:
    import tuner.calib.collect as collect

    passes: list[int] = []
    real = collect.collect_statistics

    def counting(*a, **k):
        passes.append(1)
        return real(*a, **k)

    collect.collect_statistics = counting  # counts every data pass of this model's whole run
    try:
        _bench(label, cfg, eval_dir, samples, threads, repeat, passes)
    finally:
        collect.collect_statistics = real


def _bench(label: str, cfg: Path, eval_dir: Path | None, samples: int | None, threads: int | None, repeat: int,
           passes: list[int]) -> None:
    from tuner.candidate import Candidate
    from tuner.metrics import Similarity
    from tuner.runtime.session import default_threads, make_session, run_samples
    from tuner.simulate import Simulator
    from tuner.simulate.oracle import ort_quantize
    from tuner.workspace import Workspace

    data_arg = [eval_dir] if eval_dir else None
    t0 = time.perf_counter()
    ws = Workspace.open(cfg, data=data_arg, limit=samples, threads=threads)
    open_s = time.perf_counter() - t0
    first_open = len(passes)
    again = Workspace.open(cfg, data=data_arg, limit=samples, threads=threads)
    second_open = len(passes) - first_open

    names = ws.model.output_names
    data = list(ws.eval_data)
    n_threads = threads or default_threads()
    print(f"\n== {label}: {cfg.relative_to(REPO) if cfg.is_relative_to(REPO) else cfg.name}, {len(ws.graph)} nodes, "
          f"{len(ws.calibration_data)} calibration / {len(data)} evaluation samples, {n_threads} threads ==")

    # The float model run the way the simulator runs its models (make_session + run_samples).
    def float_pass():
        session = make_session(ws.model.proto)
        list(run_samples(session, names, data, threads))

    session = make_session(ws.model.proto)
    float_run = _median_time(lambda: list(run_samples(session, names, data, threads)), max(3, repeat))

    cands, (cpu_node, int16_node) = candidates(ws)
    # Fresh simulators: every evaluation below is the first one of its candidate (and of its method).
    # Each run also times a float pass just before its evaluations, in wall and in CPU time
    # (process_time: all threads), so a load change on the shared machine hits both sides.
    evaluate_s = {name: [] for name, _ in cands}
    evaluate_cpu = {name: [] for name, _ in cands}
    float_wall, float_cpu = [], []
    results = {}
    setup_s = []
    builds = []
    for _ in range(max(3, repeat)):
        c0, t0 = time.process_time(), time.perf_counter()
        float_pass()
        float_wall.append(time.perf_counter() - t0)
        float_cpu.append(time.process_time() - c0)
        t0 = time.perf_counter()
        simulator = Simulator(ws.model, ws.target, ws.stats, ws.eval_data, threads, calibration_data=ws.calibration_data)
        setup_s.append(time.perf_counter() - t0)
        before = simulator.session_builds
        for name, cand in cands:
            c0, t0 = time.process_time(), time.perf_counter()
            results[name] = simulator.evaluate(cand)
            evaluate_s[name].append(time.perf_counter() - t0)
            evaluate_cpu[name].append(time.process_time() - c0)
        builds.append(simulator.session_builds - before)
    evaluate_med = {k: statistics.median(v) for k, v in evaluate_s.items()}
    cpu_ratio = {k: statistics.median(v) / statistics.median(float_cpu) for k, v in evaluate_cpu.items()}
    float_s = statistics.median(float_wall)

    naive_s, naive_full_s = {}, {}
    n_cal = len(ws.calibration_data)
    # quantize_static quantizes the graph as exported (it cannot load hb_mapper's fused nodes,
    # tuner.graph.optimize): the naive path runs on that graph, its own statistics pass not counted.
    passes_before = len(passes)
    exported = Workspace.open(cfg, data=data_arg, limit=samples, threads=threads, hb_optimize=False)
    exported_passes = len(passes) - passes_before
    exported_sim = Simulator(exported.model, exported.target, exported.stats, exported.eval_data, threads,
                             calibration_data=exported.calibration_data)
    for name, cand in cands:
        ev = exported_sim.evaluate(Candidate.make(cand.calibration, {n: st for n, st in cand.nodes
                                                                     if n in exported.graph.by_name}))
        table = exported_sim.scales(ev.calibration)
        for tensor in exported.graph.activation_tensors():  # ort_quantize reads every tensor's scale: not timed
            if tensor in exported.stats:
                table.get(tensor, "int8")

        def naive(calib_samples=2, ev=ev, table=table):
            qdq = ort_quantize(exported.model.proto, exported.graph, ev.plan, table, exported.calibration_data,
                               calib_samples)
            s = make_session(qdq)
            sims = {o: Similarity() for o in names}
            for i, outs in enumerate(run_samples(s, names, data, threads)):
                for o, v in zip(names, outs):
                    sims[o].update(simulator.reference[i][o], v)

        naive_s[name] = _median_time(naive, 1)
        naive_full_s[name] = _median_time(lambda: naive(n_cal), 1)

    run_passes = len(passes) - second_open - exported_passes  # the whole run but the second open: all candidates
    print(f"calibration data passes: {run_passes} for the whole run, all methods [target 1] "
          f"(first open: {first_open}, {open_s:.2f} s); second open of the same inputs: {second_open} "
          f"(from cache: {again.stats_from_cache}) [target 0]")
    points = ("FakeQuant nodes (fused kernel)" if simulator.fused else
              "QuantizeLinear/DequantizeLinear pairs (no fused kernel here, or TUNER_FAKEQUANT=0)")
    print(f"quantization points: {points}")
    print(f"float pass (new session + {len(data)} samples): {float_s:.3f} s (run only {float_run:.3f} s); "
          f"simulator set-up {statistics.median(setup_s):.3f} s; sessions built per 5 candidates: {builds[0]}")
    print(f"candidate 5 = node {cpu_node!r} on CPU + node {int16_node!r} OutputType int16")
    header = (f"{'candidate':<34}{'evaluate':>10}{'eval/float':>12}{'naive':>10}{'naive/eval':>12}"
              f"{'naive-all':>11}{'/eval':>8}{'cosine':>9}{'cpu e/f':>9}")
    print(header + "\n" + "-" * len(header))
    for name, _ in cands:
        e, n, nf = evaluate_med[name], naive_s[name], naive_full_s[name]
        print(f"{name:<34}{e:>9.3f}s{e / float_s:>11.2f}x{n:>9.2f}s{n / e:>11.1f}x{nf:>10.2f}s{nf / e:>7.1f}x"
              f"{results[name].mean_cosine:>9.4f}{cpu_ratio[name]:>8.2f}x")
    med_e = statistics.median(evaluate_med.values())
    med_n = statistics.median(naive_s.values())
    med_nf = statistics.median(naive_full_s.values())
    print(f"{'median':<34}{med_e:>9.3f}s{med_e / float_s:>11.2f}x{med_n:>9.2f}s{med_n / med_e:>11.1f}x"
          f"{med_nf:>10.2f}s{med_nf / med_e:>7.1f}x{'':>9}{statistics.median(cpu_ratio.values()):>8.2f}x")
    print("targets: eval/float <= 1.3, naive/eval >= 10. naive = ort_quantize (quantize_static calibrating on its "
          f"default 2 samples) + new session + evaluation; naive-all calibrates on all {n_cal} samples, as a "
          "per-trial quantize_static would; cpu e/f = the same ratio in process CPU time (steadier than wall "
          "time when other processes share the cores)")

    print("\nwhere a first evaluation's time goes (s):")
    cols = ("thresholds", "plan+graph", "session", "run", "score")
    kind = "FakeQuant" if simulator.fused else "Q/DQ"
    print(f"{'candidate':<34}" + "".join(f"{c:>12}" for c in cols) + f"{'points':>8}  kernel")
    runs = {True: [], False: []}
    rows = [(name, cand, simulator.fused) for name, cand in cands]
    if simulator.fused:
        rows.append((f"{cands[0][0]}, as Q/DQ pairs", cands[0][1], False))
    for name, cand, fused in rows:
        sim = Simulator(ws.model, ws.target, ws.stats, ws.eval_data, threads, calibration_data=ws.calibration_data)
        b = breakdown(ws, sim, cand, fused)
        runs[fused].append(b["run"])
        print(f"{name:<34}" + "".join(f"{b[c]:>12.3f}" for c in cols) + f"{b['points']:>8d}  "
              f"{'FakeQuant' if fused else 'Q/DQ'}")
    float_session = _median_time(lambda: make_session(ws.model.proto), max(3, repeat))
    print(f"{'float model':<34}{'':>12}{'':>12}{float_session:>12.3f}{float_run:>12.3f}")
    print(f"run / float run {statistics.median(runs[simulator.fused]) / float_run:.2f}x with {kind} nodes: what "
          "the quantization points cost, which no set-up change removes (a FakeQuant node is one element-wise "
          "pass, a QuantizeLinear/DequantizeLinear pair two; tuner.runtime.fakequant)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=None, help="evaluation samples per model (default: all)")
    p.add_argument("--threads", type=int, default=None, help="samples run at once, as Simulator(threads=) (default: all cores)")
    p.add_argument("--models", default="segdepth,ppocr", help="comma-separated: segdepth, ppocr")
    p.add_argument("--repeat", type=int, default=3, help="runs per timing, the median is shown (default: 3)")
    p.add_argument("--size", default=None,
                   help="segdepth at this HxW instead of 96x160 (360x640: the users' resolution; make_hires.py)")
    a = p.parse_args(argv)
    if a.samples is not None and a.samples < 1:
        p.error("--samples must be >= 1")
    with tempfile.TemporaryDirectory(prefix="trial_cost.") as tmp:
        # A fresh statistics cache: the first open must make its one data pass, honestly counted.
        os.environ["TUNER_CACHE_DIR"] = str(Path(tmp) / "cache")
        for model in [m.strip() for m in a.models.split(",") if m.strip()]:
            if model == "segdepth":
                prepared = prepare_segdepth(a.size)
                if a.size:
                    model = f"segdepth {a.size}"
            elif model == "ppocr":
                prepared = prepare_ppocr(Path(tmp))
            else:
                p.error(f"unknown model {model!r}")
            if prepared:
                bench_model(model, *prepared, samples=a.samples, threads=a.threads, repeat=a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
