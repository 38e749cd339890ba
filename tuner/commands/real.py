"""``tuner toolchain``: find or install the real hb_mapper toolchain, and run one YAML through it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tuner.commands import args as a
from tuner.console import say, table
from tuner.errors import TunerError


def status(args: argparse.Namespace) -> int:
    from tuner.toolchain.installed import INSTALL_HINT, PINNED, find_toolchain, toolchain_dir

    where = Path(args.dir) if args.dir else toolchain_dir()
    tc = find_toolchain(where)
    if tc is None:
        if args.json:
            print(json.dumps({"found": False, "dir": str(where), "install": "tuner toolchain install"}))
        else:
            print(f"no hb_mapper toolchain in {where}\n{INSTALL_HINT}.\n"
                  "It is optional: everything but 'tuner toolchain run' and 'tuner verify --local' works without it.")
        return 1
    ran = tc.check() if args.check else None
    if args.json:
        print(json.dumps({"found": True, "dir": str(tc.root), "python": str(tc.python), "versions": tc.versions,
                          "pinned": PINNED, "differs": tc.differs_from_pinned(), "check": ran}, indent=2))
        return 0
    print(f"toolchain  {tc.root}")
    print("versions   " + ", ".join(f"{k} {v}" for k, v in tc.versions.items()))
    for d in tc.differs_from_pinned():
        print(f"note: {d}")
    if ran:
        print(f"runs       {ran}")
    return 0


def install(args: argparse.Namespace) -> int:
    from tuner.toolchain.installed import find_toolchain, install_script, toolchain_dir

    where = Path(args.dir) if args.dir else toolchain_dir()
    tc = find_toolchain(where)
    if tc is not None and not args.force:
        print(f"already installed in {tc.root}: " + ", ".join(f"{k} {v}" for k, v in tc.versions.items()))
        return 0
    where.parent.mkdir(parents=True, exist_ok=True)
    say(f"installing the RDK X5 toolchain into {where} (about 3 GB download, 6 GB on disk, ~5 minutes) ...")
    env = dict(os.environ)
    if args.python:
        env["PY310"] = args.python
    try:
        rc = subprocess.call(["bash", str(install_script()), str(where)], env=env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise TunerError(f"cannot run the install script ({exc}); it needs bash") from None
    if rc != 0:
        raise TunerError(f"the install failed (exit {rc}); see the lines above (a Python 3.10 is needed: --python)")
    return 0 if find_toolchain(where) is not None else 1


def _f(v: float | None, d: int = 6) -> str:
    return "--" if v is None else f"{v:.{d}f}"


def run_text(report: dict[str, Any]) -> str:
    conv = report["conversion"]
    lines = [f"hb_mapper {conv['toolchain']}",
             f"run        {conv['folder']}" + (" (cached)" if report.get("cached") else f" ({conv['seconds']:.1f} s)")]
    if not conv["ok"]:
        lines.append(f"refused    {conv.get('error')}")
        return "\n".join(lines)
    lines.append(f"calibration {report['calibration']}" + (f"  (hb_mapper: {conv['method']})" if conv.get("method") else ""))
    cpu = conv.get("cpu_nodes") or []
    lines.append(f"CPU nodes  {len(cpu)}" + (f": {', '.join(cpu[:8])}" + (" ..." if len(cpu) > 8 else "") if cpu else ""))
    subs = conv.get("subgraphs") or []
    bpu_ms = sum(s["latency_us"] for s in subs) / 1000 if subs else None
    lvl = (conv.get("knobs") or {}).get("optimize_level")
    lines.append(f"subgraphs  {len(subs)} BPU; hbdk's BPU estimate {_f(bpu_ms, 3)} ms"
                 + (f" at {lvl}" if lvl else "") + f"; tuner's modeled latency {report['modeled_ms']:.3f} ms")
    counts = report.get("qtypes") or {}
    lines.append("tensors    " + ", ".join(f"{k} {v}" for k, v in counts.items())
                 + (f"; int16: {', '.join(report['int16'][:6])}" + (" ..." if len(report['int16']) > 6 else "")
                    if report.get("int16") else ""))
    rows = []
    for o, sim in report["simulated"].items():
        q, c = report["quantized"][o], report["calibrated"][o]
        rows.append([o, _f(sim["cosine"]), _f(q["cosine"]), _f(c["cosine"]), f"{q['cosine'] - sim['cosine']:+.6f}",
                     f"{sim['sqnr_db']:.2f}", f"{q['sqnr_db']:.2f}"])
    lines += ["", table(["output", "cosine sim", "cosine real (quantized)", "cosine real (calibrated)",
                         "real - sim", "SQNR sim dB", "SQNR real dB"], rows)]
    lines.append(f"\non {report['data']} ({report['samples']} sample(s)); 'quantized' is the model the .bin computes")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tuner.console import progress_printer
    from tuner.cost.latency import CostModel
    from tuner.study.sections import parse_duration
    from tuner.toolchain.hbrun import CompileKnobs, convert
    from tuner.toolchain.installed import require_toolchain
    from tuner.toolchain.realrun import measure
    from tuner.workspace import Workspace

    tc = require_toolchain()
    data = a.data_dirs(args.data)
    ws = Workspace.open(args.config, data=data, limit=args.limit, threads=args.threads,
                        progress=progress_printer("calibration statistics"))
    knobs = CompileKnobs(optimize_level=args.optimize_level, jobs=args.jobs, core_num=args.core_num,
                         debug=True if args.debug else None)
    conv = convert(tc, args.config, knobs, timeout=parse_duration(args.timeout, "--timeout"), say=say)
    sim = ws.simulator
    cand = ws.base_candidate()
    label = "the data " + (args.data if args.data else "of cal_data_dir")
    real = measure(tc, conv, sim, str(args.config), label)
    report: dict[str, Any] = {"conversion": conv.to_json(), "cached": conv.cached, "data": label}
    if real.ok and real.quantized and real.calibrated:
        ev = sim.evaluate(cand)
        cost = CostModel(ws.graph, ws.target).latency(ev.plan)
        report.update(calibration=ev.calibration.describe(), simulated=ev.outputs, quantized=real.quantized.outputs,
                      calibrated=real.calibrated.outputs, samples=real.quantized.samples, modeled_ms=cost.total_ms,
                      qtypes=real.qtype_counts(), int16=real.int16_tensors, uint8=real.uint8_tensors)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(run_text(report))
    return 0 if conv.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("toolchain", help="find, install or run the real hb_mapper toolchain (optional)",
                       description="The real RDK X5 toolchain (hb_mapper 1.24.3, hmct 1.1.0, hbdk 3.49.15) in a "
                                   "Python 3.10 venv of its own: $TUNER_HB_TOOLCHAIN, else hb-toolchain-1.24.3 in "
                                   "tuner's cache folder. Without a subcommand: say what is installed.")
    p.add_argument("--dir", help="the toolchain's venv (default: $TUNER_HB_TOOLCHAIN or the cache folder's)")
    p.add_argument("--check", action="store_true", help="also run 'hb_mapper --version' (about 7 s)")
    a.json_output(p)
    p.set_defaults(func=status)
    ts = p.add_subparsers(dest="toolchain_command", metavar="SUBCOMMAND")

    q = ts.add_parser("install", help="install the pinned toolchain from PyPI into its own venv",
                      description="pip-installs rdkx5-yolo-mapper, dg-nn-toolkit and dgdk 1.0.0 with the pins that "
                                  "ran here, into a Python 3.10 venv (about 3 GB download, 6 GB on disk, ~5 minutes).")
    q.add_argument("--dir", help="where (default: $TUNER_HB_TOOLCHAIN or the cache folder's)")
    q.add_argument("--python", help="a CPython 3.10 interpreter (default: found on the machine)")
    q.add_argument("--force", action="store_true", help="install again over an existing one")
    q.set_defaults(func=install)

    q = ts.add_parser("run", help="convert a YAML with the real hb_mapper and compare with tuner's simulation",
                      description="Runs hb_mapper makertbin on the YAML in a cached run folder, then the tool's "
                                  "quantized and calibrated models (hmct's executor) on the data, and prints their "
                                  "output cosine/SQNR next to tuner's simulation of the same YAML, with the CPU "
                                  "nodes, int16 tensors and hbdk's BPU latency estimate. Exit 1 if the tool "
                                  "refused the YAML.")
    a.config(q)
    a.data(q)
    a.limit(q)
    a.threads(q)
    a.optimize_level(q)
    q.add_argument("--jobs", type=a.positive_int, help="compiler jobs")
    q.add_argument("--core-num", type=a.positive_int, help="BPU cores to compile for")
    q.add_argument("--debug", action="store_true", help="hbdk's per-layer tables (compiler_parameters.debug)")
    a.timeout(q, "stop the conversion after this long (seconds, or 30m)")
    a.json_output(q)
    q.set_defaults(func=run)

