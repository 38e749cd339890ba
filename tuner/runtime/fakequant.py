"""A fused fake-quantization kernel for onnxruntime, built on first use: one pass instead of two.

Each quantization point of a simulated graph is QuantizeLinear -> DequantizeLinear: two
element-wise passes and an integer tensor in between. On PP-OCRv4's detector (216 points) they
made the simulated run ~1.4x the float run. ``FakeQuant`` (domain ``tuner.sim``, source in
``fakequant.c``) computes the same values bit for bit in one pass.

onnxruntime loads custom kernels from a shared library, so the source is compiled with the
machine's C compiler (``$CC``, else ``cc``) the first time a simulator needs it, and kept in the
cache folder under a name keyed by the source, the compiler, the CPU and the onnxruntime version.
A new build is kept only after a separate process has run it against QuantizeLinear /
DequantizeLinear on awkward values (ties, saturation, per-channel scales, each dtype) with equal
results: a broken build can then neither crash a study nor skew it. Without a compiler, when the
check fails, or with ``TUNER_FAKEQUANT=0``, graphs keep the Q/DQ pairs: same results, slower.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tuner.files import cache_dir

DOMAIN = "tuner.sim"
OP = "FakeQuant"
SOURCE = Path(__file__).with_name("fakequant.c")
#: Integer range of each zero-point dtype (numpy char code), as QuantizeLinear saturates.
QRANGE = {"b": (-128, 127), "B": (0, 255), "h": (-32768, 32767), "H": (0, 65535)}

log = logging.getLogger(__name__)
_library: str | None = None
_tried = False


def enabled() -> bool:
    return os.environ.get("TUNER_FAKEQUANT", "1").strip().lower() not in ("0", "no", "false", "off")


def library() -> str | None:
    """Path of the checked kernel library, building it if needed; None to use Q/DQ pairs."""
    global _library, _tried
    if not enabled():
        return None
    if not _tried:
        _tried = True
        try:
            _library = _find_or_build()
        except (OSError, subprocess.SubprocessError) as exc:  # no such compiler, unwritable cache, a hung build
            log.warning("tuner: fused fake-quant kernel unavailable (%s); using QuantizeLinear/DequantizeLinear "
                        "pairs (same results, slower)", exc)
    return _library


def bounds(zero_point: np.ndarray | np.integer[Any]) -> tuple[float, float] | None:
    """(lo, hi) of ``round(x / s)`` for this zero point, or None when FakeQuant cannot express it
    (zero points that differ per channel)."""
    zp = np.asarray(zero_point)
    if zp.dtype.char not in QRANGE:
        return None
    qmin, qmax = QRANGE[zp.dtype.char]
    if (zp.size > 1 and not (zp == zp.flat[0]).all()):
        return None
    z = int(zp.flat[0]) if zp.size else 0
    return float(qmin - z), float(qmax - z)


def make_node(src: str, scale: str, out: str, name: str, lo: float, hi: float, axis: int | None) -> onnx.NodeProto:
    node = onnx.NodeProto(op_type=OP, domain=DOMAIN, name=name, input=[src, scale], output=[out])
    node.attribute.extend([onnx.helper.make_attribute("lo", lo), onnx.helper.make_attribute("hi", hi)])
    if axis is not None:
        node.attribute.append(onnx.helper.make_attribute("axis", axis))
    return node


def uses_kernel(model: onnx.ModelProto) -> bool:
    return any(o.domain == DOMAIN for o in model.opset_import)


# -- building ------------------------------------------------------------------------------
def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _find_or_build() -> str | None:
    cc = _compiler()
    if cc is None:
        log.warning("tuner: no C compiler (set CC, or install gcc) for the fused fake-quant kernel; using "
                    "QuantizeLinear/DequantizeLinear pairs (same results, slower)")
        return None
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cc.encode(), platform.machine().encode(), _cpu_flags().encode(),
                 ort.__version__.encode()):
        key.update(part)
    target = cache_dir() / "kernels" / f"fakequant-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".fakequant-", suffix=".so")
    os.close(fd)
    try:
        built = None
        for flags in (["-march=native"], []):  # -march=native vectorises nearbyintf; not every compiler takes it
            cmd = [cc, "-O3", *flags, "-std=c99", "-shared", "-fPIC", "-fvisibility=hidden", "-o", tmp,
                   str(SOURCE), "-lm"]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if run.returncode == 0:
                built = run
                break
        if built is None:
            log.warning("tuner: could not compile the fused fake-quant kernel with %s; using QuantizeLinear/"
                        "DequantizeLinear pairs (same results, slower):\n%s", cc, run.stderr.strip()[-2000:])
            return None
        check = subprocess.run([sys.executable, "-c", "import sys; from tuner.runtime.fakequant import "
                                "self_check; self_check(sys.argv[1])", tmp], capture_output=True, text=True,
                               timeout=300, env={**os.environ, "TUNER_FAKEQUANT": "0"})
        if check.returncode != 0:
            log.warning("tuner: the fused fake-quant kernel failed its check against QuantizeLinear/"
                        "DequantizeLinear (exit %s); using the Q/DQ pairs:\n%s", check.returncode,
                        (check.stderr or check.stdout).strip()[-2000:])
            return None
        os.replace(tmp, target)
        return str(target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# -- the check a build must pass -----------------------------------------------------------
def _check_values(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Normal values, exact ties (k + 0.5) * s, values far beyond the range, zeros and -0.0."""
    x = (rng.standard_normal(shape) * 40 * scale).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    k = rng.integers(-300, 300, n // 4)
    flat[: n // 4] = ((k + 0.5) * scale).astype(np.float32)
    flat[n // 4: n // 4 + 8] = [1e30, -1e30, 0.0, -0.0, 127.5 * scale, -128.5 * scale, 1e-38, -1e-38]
    return x


def self_check(path: str) -> None:
    """Raise (exit non-zero in the checking process) unless FakeQuant in ``path`` equals
    QuantizeLinear -> DequantizeLinear bit for bit, for every dtype, per tensor and per channel."""
    rng = np.random.default_rng(0)
    shape = (2, 5, 7, 9)   # odd sizes: vector loops and their remainders
    cases = []
    for dtype in (np.int8, np.uint8, np.int16):
        for per_channel in (False, True):
            for zp_value in ((0, 3) if dtype != np.uint8 else (128, 0)):
                scale = (rng.uniform(0.001, 0.2, shape[1]) if per_channel else np.array(rng.uniform(0.001, 0.2)))
                zp = np.full(scale.shape, zp_value, dtype)
                cases.append((scale.astype(np.float32), zp))
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(path)
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    opts.log_severity_level = 3
    for k, (scale, zp) in enumerate(cases):
        axis = 1 if scale.ndim else None
        lo_hi = bounds(zp)
        assert lo_hi is not None   # every case has one zero point
        lo, hi = lo_hi
        attrs: dict[str, Any] = {"axis": axis} if axis is not None else {}
        inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain="com.microsoft", **attrs),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["ref"], domain="com.microsoft", **attrs),
                 make_node("x", "s", "got", "fq", lo, hi, axis)]
        graph = helper.make_graph(nodes, "check", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("ref", "got")],
                                  inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(
            "com.microsoft", 1), helper.make_opsetid(DOMAIN, 1)])
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        x = _check_values(rng, shape, float(scale.min()))
        ref, got = session.run(None, {"x": x})
        if not np.array_equal(ref.view(np.uint32), got.view(np.uint32)):
            bad = int(np.flatnonzero(ref.view(np.uint32) != got.view(np.uint32))[0])
            raise AssertionError(f"case {k} ({zp.dtype}, zero point {zp.flat[0]}, per channel {axis is not None}): "
                                 f"x={x.flat[bad]!r} gives {got.flat[bad]!r}, QuantizeLinear/DequantizeLinear "
                                 f"{ref.flat[bad]!r}")
