"""Run the real tool's calibrated and quantized models on a data set, with hmct's own executor.

The models hold Horizon's ops (``HzCalibration``, ``HzSQuantizedConv``, ``HzLut``, ...) that only
hmct's onnxruntime build runs, so they run in the toolchain's interpreter: a small script
(``hb_exec_script.py``, tuner's own) is started there with the samples in an ``.npz`` file and
writes the outputs to another. One process runs every model asked for (hmct's import costs
about 3 s). The outputs are cached beside the conversion, keyed by the model files' and the data's
fingerprints, so the fidelity suite's second run reads them back.

The quantized model is what the ``.bin`` computes (``*_quantized_model.onnx``: the integer graph
the compiler takes); the calibrated model is the float graph with fake-quant nodes, the tool's
own simulation. They differ (PP-OCR-like detector, max: 0.978 vs 0.987 output cosine).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import TunerError
from tuner.files import write_atomic
from tuner.toolchain.installed import Toolchain

SCRIPT = Path(__file__).with_name("hb_exec_script.py")

Outputs = list[dict[str, np.ndarray]]   # per sample: output name -> array


def _digest(samples: list[dict[str, np.ndarray]], names: list[str]) -> str:
    h = hashlib.sha256()
    for s in samples:
        for n in names:
            a = np.ascontiguousarray(s[n])
            h.update(f"{n}|{a.dtype}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]


def run_models(tc: Toolchain, models: list[Path], samples: Iterable[dict[str, np.ndarray]],
               cache_dir: Path | None = None, timeout: float | None = 3600) -> list[Outputs]:
    """Each model's outputs on every sample (``samples``: input name -> float32 array, as the
    float ONNX takes it). ``cache_dir``: where to keep them (the conversion's folder)."""
    batch = [dict(s) for s in samples]
    if not batch:
        raise TunerError("no samples to run the real models on")
    names = list(batch[0])
    key = hashlib.sha256(("|".join(_file_digest(m) for m in models) + _digest(batch, names)).encode()).hexdigest()[:20]
    cached = cache_dir / f"outputs-{key}.npz" if cache_dir is not None else None
    if cached is not None and cached.is_file() and Path(str(cached) + ".names.json").is_file():
        return _read(cached, len(models), len(batch))
    with tempfile.TemporaryDirectory(prefix="tuner-hbexec-") as tmp:
        t = Path(tmp)
        arrays: dict[str, Any] = {f"s{i}_{k}": np.ascontiguousarray(s[n], dtype=np.float32)
                                  for i, s in enumerate(batch) for k, n in enumerate(names)}
        np.savez(t / "in.npz", **arrays)
        out = t / "out.npz"
        job = {"inputs": str(t / "in.npz"), "output": str(out), "models": [str(m) for m in models],
               "samples": len(batch), "names": names}
        (t / "job.json").write_text(json.dumps(job), encoding="utf-8")
        try:
            res = subprocess.run([str(tc.python), str(SCRIPT), str(t / "job.json")], env=tc.env(), capture_output=True,
                                 text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TunerError(f"hmct's executor did not finish within {timeout:g} s") from None
        if res.returncode != 0 or not out.is_file():
            tail = (res.stderr or res.stdout).strip().splitlines()
            raise TunerError(f"hmct's executor failed on {', '.join(m.name for m in models)}: "
                             f"{tail[-1] if tail else f'exit code {res.returncode}'}")
        outputs = _read(out, len(models), len(batch))
        if cached is not None:
            write_atomic(Path(str(cached) + ".names.json"), Path(str(out) + ".names.json").read_text(encoding="utf-8"))
            write_atomic(cached, out.read_bytes())
        return outputs


def _read(path: Path, n_models: int, n_samples: int) -> list[Outputs]:
    names = json.loads(Path(str(path) + ".names.json").read_text(encoding="utf-8"))
    with np.load(path) as z:
        return [[{name: z[f"m{j}_s{i}_o{k}"] for k, name in enumerate(names[j])} for i in range(n_samples)]
                for j in range(n_models)]
