"""One ``hb_mapper makertbin`` run of the real toolchain, in its own folder, cached by fingerprint.

:func:`convert` copies the user's YAML into a run folder with every path made absolute and
``working_dir`` pointing into that folder, applies the compile knobs (:class:`CompileKnobs`),
runs ``hb_mapper makertbin --config <copy> --model-type onnx`` with the toolchain's interpreter
(:mod:`tuner.toolchain.installed`), and reads what it left (:class:`Conversion`):

* ``hb_mapper_makertbin.log`` (the node and output tables, ``Select ... method.``, the CPU nodes:
  :mod:`tuner.toolchain.hblog`), and the one line of the error when it refused the YAML;
* per BPU subgraph, hbdk's estimate ``FPS=..., latency = ... us, DDR = ... bytes`` and, with
  ``debug``, the per-layer table of ``<subgraph>.json`` (compute and load/store microseconds);
* the paths of ``*_calibrated_model.onnx``, ``*_quantized_model.onnx``, ``*_quant_info.json``.

The run folder is ``<cache>/hb_runs/<key>``, where the key hashes the model's bytes, every file
of the calibration folders, the YAML as converted (paths replaced by those hashes), the knobs and
the toolchain's versions: the same conversion is made once, whoever asks (a second ``tuner
verify``, the fidelity suite's next run). A run is built in a temporary folder and renamed into
place, so an interrupted run leaves no half result behind.

Measured here (2 cores): the bundled example converts in 38 s at ``O3`` and 11 s at ``O0``;
PP-OCRv4's detector at 256x320 in 18 s at ``O0``. The calibrated and quantized models do not
depend on ``optimize_level`` (the example's quantized model gives bit-identical outputs at O0
and O3), only the compiler's latency estimate does: accuracy checks use ``O0``, latency ``O3``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.export.hb_yaml import dump_yaml
from tuner.files import cache_dir, write_atomic
from tuner.inputs.config import load_config
from tuner.inputs.data import list_samples
from tuner.toolchain.hblog import HbLog, read_log
from tuner.toolchain.installed import Toolchain

LOG_NAME = "hb_mapper_makertbin.log"
RECORD_NAME = "conversion.json"
WORK_YAML = "config.yaml"
OUT_DIR = "model_output"
#: A bump invalidates every cached run (a change of what a run records).
RUN_FORMAT = 1

_SUBGRAPH_RE = re.compile(r"Compile submodel:\s*(.+?)\s*$")
_COST_RE = re.compile(r"FPS=([\d.]+),\s*latency\s*=\s*([\d.]+)\s*us,\s*DDR\s*=\s*(\d+)\s*bytes")
_SEE_RE = re.compile(r"\(see (.+)\.html\)")
_ERROR_RE = re.compile(r"error message:\s*(.+)$")
_US_RE = re.compile(r"([\d.]+)\s*us")


@dataclass(frozen=True)
class CompileKnobs:
    """Compiler settings a run overrides (None: as the YAML says)."""

    optimize_level: str | None = None    # O0 (fast compile, same quantized model) .. O3
    jobs: int | None = None
    core_num: int | None = None
    debug: bool | None = None            # hbdk's per-layer tables (<subgraph>.json/.html)

    def apply(self, compiler: dict[str, Any]) -> dict[str, Any]:
        out = dict(compiler)
        for key in ("optimize_level", "jobs", "core_num", "debug"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class Layerwise:
    """hmct's own int16 promotion (``layerwise_search``), which hb_mapper's YAML cannot ask for: the
    ``topk`` calibration nodes of lowest single-node cosine become ``qtype`` (None: every node below
    0.999), each node calibrated with the best of max, max-percentile 0.99995 and kl. Run through
    :mod:`tuner.toolchain.hb_layerwise_script` (hb_mapper with these calibration parameters added)."""

    topk: int | None = None
    qtype: str = "int16"

    def calibration_params(self) -> dict[str, Any]:
        """What hmct's Python API takes (``hmct/common/quant/update_quant_config.py``)."""
        out: dict[str, Any] = {"use_int16": self.qtype == "int16"}
        if self.topk is not None:
            out["mix_topk"] = int(self.topk)
        return out

    def describe(self) -> str:
        return f"hmct layerwise {self.qtype} top-{self.topk if self.topk is not None else 'auto'}"


@dataclass(frozen=True)
class Layer:
    """One row of hbdk's per-layer table (debug builds)."""

    name: str
    compute_us: float | None
    load_store_us: float | None


@dataclass(frozen=True)
class Subgraph:
    """hbdk's estimate for one BPU subgraph: BPU time only (no CPU op, no transfer to the CPU)."""

    name: str
    fps: float
    latency_us: float
    ddr_bytes: int
    layers: tuple[Layer, ...] = ()


@dataclass(frozen=True)
class Conversion:
    """What one ``makertbin`` run left. ``ok``: the tool wrote the quantized model and the ``.bin``."""

    key: str
    folder: str
    ok: bool
    returncode: int | None
    seconds: float
    prefix: str
    toolchain: str                      # versions, as Toolchain.fingerprint
    knobs: dict[str, Any]
    error: str | None = None            # one line: why the tool refused the YAML, or why the run failed
    method: str | None = None           # 'Select <method> method.' (calibration_type default)
    subgraphs: tuple[Subgraph, ...] = ()
    cpu_nodes: tuple[str, ...] = ()     # the node table's CPU rows
    bpu_nodes: int = 0
    quantizer: dict[str, Any] = field(default_factory=dict)   # calibration parameters added (Layerwise)
    cached: bool = False                # answered from the cache (not stored)

    @property
    def root(self) -> Path:
        return Path(self.folder)

    @property
    def out_dir(self) -> Path:
        return self.root / OUT_DIR

    @property
    def log_path(self) -> Path:
        return self.root / LOG_NAME

    def model(self, kind: str) -> Path:
        """``kind``: original_float, optimized_float, calibrated, quantized."""
        return self.out_dir / f"{self.prefix}_{kind}_model.onnx"

    @property
    def quant_info_path(self) -> Path:
        return self.out_dir / f"{self.prefix}_quant_info.json"

    @property
    def bpu_latency_ms(self) -> float | None:
        """hbdk's estimate summed over the BPU subgraphs (what the compiler says; CPU time excluded)."""
        return sum(s.latency_us for s in self.subgraphs) / 1000.0 if self.subgraphs else None

    def log(self) -> HbLog:
        return read_log(self.log_path)

    def quant_info(self) -> dict[str, Any]:
        """``*_quant_info.json``: per node ``{type, inputs, outputs, thresholds, cosine_similarity}`` (hb's eps
        cosine on calibration sample 0, after the node's output calibration)."""
        try:
            value = json.loads(self.quant_info_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TunerError(f"{self.quant_info_path}: cannot read the tool's quant_info ({exc})") from None
        if not isinstance(value, dict):
            raise TunerError(f"{self.quant_info_path}: expected a JSON object")
        return value

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("cached")
        d["format"] = RUN_FORMAT
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Conversion:
        d = dict(d)
        d.pop("format", None)
        d.pop("extra", None)      # written (always empty) by the first version of this record
        subs = tuple(Subgraph(**{**s, "layers": tuple(Layer(**lay) for lay in s.get("layers", ()))})
                     for s in d.pop("subgraphs", ()))
        return cls(subgraphs=subs, cpu_nodes=tuple(d.pop("cpu_nodes", ())), **d)


# --------------------------------------------------------------------------- the YAML as converted


def _sha_file(path: Path, h: Any | None = None) -> str:
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return str(h.hexdigest())


def _abs_list(value: str, base: Path) -> list[Path]:
    return [(base / item.strip()).resolve() for item in str(value).split(";") if item.strip()]


def prepared_config(yaml_path: Path, knobs: CompileKnobs) -> tuple[dict[str, Any], str, Path, list[Path]]:
    """(the mapping to convert, its fingerprint text, the model, the calibration folders).

    The mapping is the user's with absolute paths (hb_mapper resolves relative ones against its
    working folder, which is the run folder here) and the knobs applied; ``working_dir`` is set later."""
    config = load_config(yaml_path)          # hb_mapper's parser rules, one line on a bad YAML
    raw = copy.deepcopy(config.raw)
    base = Path(yaml_path).resolve().parent
    mp = raw.setdefault("model_parameters", {})
    cp = raw.setdefault("calibration_parameters", {}) or {}
    raw["calibration_parameters"] = cp
    model = Path(config.onnx_model).resolve()
    mp["onnx_model"] = str(model)
    folders = _abs_list(cp["cal_data_dir"], base) if cp.get("cal_data_dir") else []
    if folders:
        cp["cal_data_dir"] = ";".join(str(f) for f in folders)
    custom = raw.get("custom_op")
    if isinstance(custom, dict):
        for key in ("custom_op_dir", "op_register_files"):
            if isinstance(custom.get(key), str) and custom[key]:
                custom[key] = ";".join(str(p) for p in _abs_list(custom[key], base))
    cc = raw.get("compiler_parameters")
    raw["compiler_parameters"] = knobs.apply(cc if isinstance(cc, dict) else {})
    mp.pop("working_dir", None)
    # the fingerprint: the mapping with the paths replaced by the content they name
    keyed = copy.deepcopy(raw)
    keyed["model_parameters"]["onnx_model"] = f"sha256:{_sha_file(model)}"
    if folders:
        parts = []
        for folder in folders:
            h = hashlib.sha256()
            for p in list_samples(folder) if folder.is_dir() else []:
                h.update(p.name.encode())
                _sha_file(p, h)
            parts.append(h.hexdigest())
        keyed["calibration_parameters"]["cal_data_dir"] = ";".join(parts)
    return raw, json.dumps(keyed, sort_keys=True, default=str), model, folders


def run_key(fingerprint_text: str, tc: Toolchain) -> str:
    h = hashlib.sha256()
    h.update(f"format={RUN_FORMAT}|{tc.fingerprint}|".encode())
    h.update(fingerprint_text.encode())
    return h.hexdigest()[:20]


def runs_dir() -> Path:
    """``$TUNER_HB_RUNS``, else ``hb_runs`` in tuner's cache folder."""
    env = os.environ.get("TUNER_HB_RUNS")
    return Path(env).expanduser() if env else cache_dir() / "hb_runs"


# --------------------------------------------------------------------------- reading a run


def _us(cell: Any) -> float | None:
    m = _US_RE.search(str(cell))
    return float(m.group(1)) if m else None


def read_layers(path: Path) -> tuple[Layer, ...]:
    """hbdk's per-layer table from ``<subgraph>.json`` (debug builds); () when absent or unreadable."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["summary"]["layer details"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    if not rows or not isinstance(rows[0], list):
        return ()
    head = [str(c) for c in rows[0]]
    try:
        i_name = head.index("layer")
        i_comp = next(i for i, c in enumerate(head) if c.startswith("computing cost"))
        i_ls = next(i for i, c in enumerate(head) if c.startswith("load/store"))
    except (ValueError, StopIteration):
        return ()
    return tuple(Layer(name=str(r[i_name]), compute_us=_us(r[i_comp]), load_store_us=_us(r[i_ls]))
                 for r in rows[1:] if isinstance(r, list) and len(r) > max(i_name, i_comp, i_ls))


def read_subgraphs(log_text: str, out_dir: Path) -> tuple[Subgraph, ...]:
    """Every hbdk cost line, named by its ``(see NAME.html)`` (hb_mapper may compile two subgraphs before
    it prints their costs: the example with two CPU cuts logs ``Compile submodel`` 1 and 2, then the costs
    of 1 and 2), else by the last ``Compile submodel: NAME`` line before it."""
    subs = []
    name: str | None = None
    for line in log_text.splitlines():
        m = _SUBGRAPH_RE.search(line)
        if m:
            name = m.group(1)
            continue
        c = _COST_RE.search(line)
        if c:
            see = _SEE_RE.search(line)
            this = see.group(1) if see else name
            if this is None:
                continue
            subs.append(Subgraph(name=this, fps=float(c.group(1)), latency_us=float(c.group(2)),
                                 ddr_bytes=int(c.group(3)), layers=read_layers(out_dir / f"{this}.json")))
            name = None
    return tuple(subs)


def error_line(log_text: str, output: str) -> str | None:
    """The tool's own reason for a failed run: the last ``error message:`` line, else its last ERROR line."""
    for text in (log_text, output):
        for line in reversed(text.splitlines()):
            m = _ERROR_RE.search(line)
            if m:
                return m.group(1).strip()
    for text in (log_text, output):
        for line in reversed(text.splitlines()):
            if "ERROR" in line:
                return line.split("ERROR", 1)[1].strip(" :\x1b[0m")
    return None


def _read_run(folder: Path, base: Conversion, output: str) -> Conversion:
    log_path = folder / LOG_NAME
    log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    quantized = folder / OUT_DIR / f"{base.prefix}_quantized_model.onnx"
    method = cpu = None
    bpu = 0
    if log_text:
        try:
            log = read_log(log_path)
            method = log.method
            cpu = tuple(n.name for n in log.nodes if n.on == "CPU")
            bpu = sum(1 for n in log.nodes if n.on == "BPU")
        except TunerError:
            pass
    ok = base.returncode == 0 and quantized.is_file() and "successfully" in log_text.rsplit("Convert to runtime", 1)[-1]
    err = None if ok else (error_line(log_text, output) or f"exit code {base.returncode}, no error line in the log")
    return replace(base, ok=ok, error=err, method=method, cpu_nodes=cpu or (), bpu_nodes=bpu,
                   subgraphs=read_subgraphs(log_text, folder / OUT_DIR))


# --------------------------------------------------------------------------- running


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float | None, out_path: Path
         ) -> tuple[int | None, float, bool]:
    t0 = time.perf_counter()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = None
        except BaseException:          # Ctrl-C: take the whole tool down with us
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return rc, time.perf_counter() - t0, timed_out


def convert(tc: Toolchain, yaml_path: str | Path, knobs: CompileKnobs | None = None, timeout: float | None = None,
            cache: bool = True, say: Any = None, layerwise: Layerwise | None = None) -> Conversion:
    """Convert ``yaml_path`` with the real tool (or return the cached run of the same inputs).
    ``layerwise``: with hmct's own int16 promotion on top of the YAML (:class:`Layerwise`).

    A YAML the tool refuses is a Conversion with ``ok`` False and ``error`` its one line, not an
    exception; a YAML tuner's own parser refuses raises TunerError before anything runs."""
    knobs = knobs or CompileKnobs()
    yaml_path = Path(yaml_path)
    raw, fp_text, model, _ = prepared_config(yaml_path, knobs)
    extra = layerwise.calibration_params() if layerwise is not None else {}
    if extra:
        fp_text += "|quantizer=" + json.dumps(extra, sort_keys=True)
    key = run_key(fp_text, tc)
    root = runs_dir()
    final = root / key
    record = final / RECORD_NAME
    if cache and record.is_file():
        try:
            return replace(Conversion.from_json(json.loads(record.read_text(encoding="utf-8"))), folder=str(final),
                           cached=True)
        except (ValueError, TypeError, KeyError):
            shutil.rmtree(final, ignore_errors=True)      # a record of another format: convert again
    prefix = str(raw["model_parameters"].get("output_model_file_prefix") or model.stem)
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".{key}.{os.getpid()}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        raw["model_parameters"]["working_dir"] = str(work / OUT_DIR)
        write_atomic(work / WORK_YAML, dump_yaml(raw))
        if say:
            say(f"hb_mapper makertbin {yaml_path.name} (run {key[:12]}) ...")
        cmd = [str(tc.hb_mapper)]
        if extra:
            cmd = [str(tc.python), str(Path(__file__).with_name("hb_layerwise_script.py")), json.dumps(extra)]
        rc, seconds, timed_out = _run(cmd + ["makertbin", "--config", WORK_YAML, "--model-type", "onnx"],
                                      work, tc.env(), timeout, work / "output.txt")
        output = (work / "output.txt").read_text(encoding="utf-8", errors="replace")
        base = Conversion(key=key, folder=str(final), ok=False, returncode=rc, seconds=round(seconds, 2),
                          prefix=prefix, toolchain=tc.fingerprint,
                          knobs={k: v for k, v in asdict(knobs).items() if v is not None}, quantizer=extra)
        conv = _read_run(work, base, output)
        if timed_out:
            conv = replace(conv, ok=False, error=f"hb_mapper did not finish within {timeout:g} s and was stopped")
        # the tool wrote its absolute working_dir into the YAML copy and log: keep them as they are (the
        # folder is renamed below; readers use the record's folder)
        if timed_out:                 # kept for a look, never answered from the cache
            conv = replace(conv, folder=str(final) + ".timeout")
        write_atomic(work / RECORD_NAME, json.dumps(conv.to_json(), indent=1))
        target = Path(conv.folder)
        if not cache or timed_out:
            shutil.rmtree(target, ignore_errors=True)
        if target.exists():           # another process finished the same run first: keep theirs
            shutil.rmtree(work, ignore_errors=True)
        else:
            os.replace(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return conv

