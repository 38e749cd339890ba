"""A stand-in for ``hb_mapper makertbin``, written for the tests (not Horizon's tool).

``python fake_hb_mapper.py makertbin --config X.yaml --model-type onnx`` reads the YAML it is
given, quantizes the model the way tuner's simulator does, but disagrees with it on purpose,
like a real toolchain would:

* int16 on op types in FAKE_HB_REFUSE (default: Sigmoid) is refused (falls back to int8),
* every node's error is FAKE_HB_FACTOR times larger (default 3: real cosine = 1 - 3 (1 - sim)),

and computes its tables as hb_mapper does (horizon_nn's reporter, docs/hb_rules/quantizer.md §4.3): on the first
calibration sample only, cosine = (a.b + 1e-5) / (|a| |b| + 1e-5), L1 = mean |d|,
L2 = |d| / n, Chebyshev = max |d|, in float32 (written out here, not taken from tuner.metrics),

and writes ``hb_mapper_makertbin.log`` in the working directory in the documented X5 format
(FAKE_HB_STYLE=old: as before 1.24, ``In/Out DataType`` and an output table headed ``Node``
that names the node computing each output), plus the usual artefacts' folder. FAKE_HB_FAIL=1
makes it fail like a conversion error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

P = "2025-03-01 10:00:{s:02d},{ms:03d} file: {f}.py func: {f} line No: {n} "


def stamp(i: int, module: str = "model_builder") -> str:
    return P.format(s=i % 60, ms=(i * 37) % 1000, f=module, n=100 + i)


def hb_figures(q: np.ndarray, f: np.ndarray) -> tuple[float, float, float, float]:
    """hb_mapper's four figures of a calibrated tensor ``q`` vs its float ``f``."""
    a = np.asarray(q).astype(np.float32).flatten()
    b = np.asarray(f).astype(np.float32).flatten()
    eps = 1e-5
    cos = (np.dot(a, b) + eps) / (np.linalg.norm(a) * np.linalg.norm(b) + eps)
    d = a - b
    return float(cos), float(np.sum(np.abs(d)) / len(a)), float(np.sqrt(np.sum(np.square(d))) / len(a)), \
        float(np.max(np.abs(d)))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "makertbin" or "--config" not in argv:
        print("usage: hb_mapper makertbin --config X.yaml --model-type onnx", file=sys.stderr)
        return 2
    config = Path(argv[argv.index("--config") + 1])
    log_lines: list[str] = []
    log = Path("hb_mapper_makertbin.log")
    if os.environ.get("FAKE_HB_FAIL"):
        log.write_text(stamp(1, "hb_mapper") + "Start hb_mapper....\n"
                       + stamp(2, "hb_mapper") + "ERROR the model has an op that is not supported: Foo\n")
        print("ERROR conversion failed", file=sys.stderr)
        return 1

    from tuner.candidate import NodeSetting
    from tuner.workspace import Workspace

    refuse = set(filter(None, os.environ.get("FAKE_HB_REFUSE", "Sigmoid").split(",")))
    factor = float(os.environ.get("FAKE_HB_FACTOR", "3"))
    old = os.environ.get("FAKE_HB_STYLE") == "old"
    ws = Workspace.open(config, limit=1)      # simulates on the first calibration sample (thresholds: all)
    cand = ws.base_candidate()
    ops = {n.name: n.op_type for n in ws.graph}
    requested, refused = [], []
    nodes = {}
    for name, s in cand.nodes:
        if (s.input_type == "int16" or s.output_type == "int16") and name in ops:
            requested.append(name)
            if ops[name] in refuse:
                refused.append(name)
                s = NodeSetting(on=s.on)
        nodes[name] = s
    real = type(cand).make(cand.calibration, nodes, cand.optimization)
    sim = ws.simulator
    ev = sim.evaluate(real, per_node=True)     # placement, dtypes, thresholds (and ``default``'s choice)
    first = next(iter(sim.data))
    names = [n.outputs[0] for n in ws.graph if n.outputs and ws.graph.is_activation(n.outputs[0])]
    names += [o for o in ws.model.output_names if o not in names]
    q, f = sim.tensors(real.with_calibration(ev.calibration), names, first)
    figures = {t: hb_figures(q[t], f[t]) for t in names}
    out_of = {n.name: n.outputs[0] for n in ws.graph if n.outputs}

    i = 0

    def add(text: str, module: str = "model_builder") -> None:
        nonlocal i
        i += 1
        log_lines.append(stamp(i, module) + text)

    add("Start hb_mapper....", "hb_mapper")
    add("hb_mapper version   : 1.24.3-fake", "onnx2horizonrt")
    add(f"The specified model compilation architecture: {ws.target.march}.")
    for name in requested:
        s = cand.setting(name)
        if s.input_type == "int16":
            log_lines.append(f"The input of node {name} are set to : int16")
        if s.output_type == "int16":
            log_lines.append(f"The output of node {name} are set to : int16")
    add("Start to calibrate the model.")
    # mix skips the model-wise search: no Select line (docs/hb_rules/quantizer.md §1.9)
    if cand.calibration.type == "default":
        add(f"Select {ev.calibration.describe()} method.", "modelwise_search")
    for name in refused:
        add(f"The int16 of node '{name}' is not supported in this context, fall back to int8.", "quantizer")
    add("End to calibrate the model.")
    add("The main quantized node information:", "print_info_dict")
    dtype_head = "In/Out DataType" if old else "DataType"
    log_lines.append("=" * 120)
    log_lines.append(f"{'Node':<52}{'ON':<5}{'Subgraph':<10}{'Type':<27}{'Cosine Similarity':<19}{'Threshold':<11}"
                     f"{dtype_head}")
    log_lines.append("-" * 120)

    def node_cos(r):
        return None if r.cosine is None or out_of.get(r.name) not in figures else figures[out_of[r.name]][0]

    def real_cos(c):
        return None if c is None else max(-1.0, 1.0 - factor * (1.0 - c))

    def cell(v, fmt="{:.6f}"):
        return "--" if v is None else fmt.format(v)

    def row(name, on, sub, kind, cos, thr, din, dout):
        shown = name if len(name) <= 50 else "..." + name[-47:]
        dt = f"{din}/{dout}" if old else dout
        log_lines.append(f"{shown:<52}{on:<5}{sub:<10}{kind:<27}{cell(cos):<19}{cell(thr, '{:g}'):<11}{dt}")

    row(f"HZ_PREPROCESS_FOR_{ws.model.input_names[0]}", "BPU", "id(0)", "HzSQuantizedPreprocess", 0.99999, 127.0,
        "int8", "int8")
    for r in ev.nodes:
        if r.on == "BPU":
            row(r.name, "BPU", f"id({r.subgraph or 0})", f"Hz{r.op_type}", real_cos(node_cos(r)),
                None if r.threshold is None else r.threshold * 1.01, r.in_dtype, r.out_dtype)
        else:
            row(r.name, "CPU", "--", r.op_type, real_cos(node_cos(r)), None, "float", "float")
    row(f"{ev.nodes[0].name}_output_0_calibrated_Requantize", "BPU", "id(0)", "HzRequantize", None, None, "int8",
        "int8")
    add("The quantized model output:", "print_info_dict")
    log_lines.append("=" * 77)
    # before 1.24 the table is headed "Node" and names the node computing each output
    producer = {o: n.name for n in ws.graph for o in n.outputs}
    log_lines.append(f"{'Node' if old else 'Output':<20}{'Cosine Similarity':<19}{'L1 Distance':<13}{'L2 Distance':<13}"
                     "Chebyshev Distance")
    log_lines.append("-" * 77)
    for name in ev.outputs:
        cos, l1, l2, cheb = figures[name]
        log_lines.append(f"{producer[name] if old else name:<20}{real_cos(cos):<19.6f}{l1:<13.6f}{l2:<13.6f}{cheb:.6f}")
    add("Convert to runtime bin file successfully!", "hb_mapper_makertbin")
    add("End Model Convert", "hb_mapper_makertbin")
    text = "\n".join(log_lines) + "\n"
    log.write_text(text)
    workdir = config.parent / (ws.config.section("model_parameters").get("working_dir") or "model_output")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "fake.bin").write_bytes(b"\0")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
