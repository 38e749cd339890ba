"""tuner's simulation against the real hb_mapper toolchain (issue 22's fidelity suite).

    python benchmarks/fidelity.py [--models segdepth,ppocr_det,ppocr_cls,ppocr_nv12,ppocr_rgb,ppocr_bgr]
                                  [--out results/benchmarks/fidelity.md]

Needs the real toolchain (``tuner toolchain install``) and, for the PP-OCR models, rapidocr-onnxruntime
(see the README's test command). For every configuration of ``tests/fidelity_suite.py`` it converts
the YAML with the real tool (at O0, cached by content: a second run converts only what changed),
runs the tool's quantized model (what the board runs) and calibrated model on the evaluation data,
simulates the same YAML with tuner, and writes the comparison table (markdown) and the records
(JSON beside it). The assertions on these figures are in tests/fidelity/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))     # the suite's models and cases (tests/fidelity_suite.py)


def _machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {name}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="segdepth,ppocr_det,ppocr_cls,ppocr_nv12,ppocr_rgb,ppocr_bgr")
    ap.add_argument("--out", default=str(REPO / "results" / "benchmarks" / "fidelity.md"))
    args = ap.parse_args()

    from fidelity_suite import MODELS, run_suite

    from tuner.files import write_atomic
    from tuner.toolchain.fidelity import markdown, suite_summary
    from tuner.toolchain.installed import require_toolchain

    tc = require_toolchain()
    results, summaries = [], []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tuner-fidelity-") as tmp:
        for name in args.models.split(","):
            if name not in MODELS:
                raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
            done = [r for r, _ in run_suite(tc, name, Path(tmp), say=lambda m: print(m, file=sys.stderr))]
            results += done
            summaries.append(suite_summary(name, done))
    header = (f"# Fidelity: tuner's simulation against the real toolchain\n\n"
              f"Toolchain {tc.fingerprint}; `python benchmarks/fidelity.py` on {_machine()}, "
              f"{time.perf_counter() - t0:.0f} s with the cache as it was. "
              "'real' is the tool's quantized model (what the .bin computes), run with hmct's executor; 'sim' is "
              "`tuner eval` of the same YAML on the same samples (pooled plain cosine, SQNR in dB). The second "
              "table is on the log's terms (calibration sample 0, hb's eps cosine per node); its last column sets hbdk's "
              "estimate at O0 (these conversions compile at O0, seconds; the quantized model is the same at O3) beside "
              "tuner's modeled O3 estimate: the two are not comparable, latency agreement is measured at O3 in "
              "latency_fidelity.md.\n\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the "## Before" history (figures of earlier simulators, added by hand) survives a re-run
    old = out.read_text(encoding="utf-8") if out.is_file() else ""
    before = "\n\n" + old[old.index("## Before"):].rstrip() + "\n" if "## Before" in old else ""
    write_atomic(out, header + markdown(results, summaries).rstrip("\n") + "\n" + before)
    write_atomic(out.with_suffix(".json"), json.dumps([r.to_json() for r in results], indent=1, default=str))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
