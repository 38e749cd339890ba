"""The fidelity suite's models and configurations (issue 22, part 3), shared by tests/fidelity/ and
benchmarks/fidelity.py.

Three models: the bundled seg+depth example (its 32 calibration scenes, scored on 16 held-out ones,
as the README's main job does), PP-OCRv4's text detector on scikit-image's photographs (8 of
them, 256x320, calibration = evaluation) and PP-OCR mobile v2.0's text-direction classifier (a
MobileNetV3: HardSwish tables, SE blocks with GlobalAveragePool, HardSigmoid with alpha 0.2 and Mul,
residual Conv+Add, a MatMul lowered to a Conv, a CPU Softmax; calibrated on 16 strips of
``skimage.data.text()``, scored on 16 of the 112 labelled strips of ``skimage.data.page()``). The detector
ships at opset 12, which hmct 1.1.0 refuses (``check_opset_version`` in
hmct/converter/preparer/prepare.py: opset 10-11 for hmct 1.x); its ops (Conv, BatchNormalization,
HardSigmoid, Clip, Resize, ConvTranspose, Constant with ``value``, ...) mean the same in opset 11, so the
suite relabels it, as a user would re-export it.

Every configuration the issue lists: max, max_percentile 0.99995, kl, default, per_channel,
set_all_nodes_int16, int16 on two Convs, ``ON: CPU`` on an interior node, on the detector int16 into a
per-channel tensor (hb's output collapses), and on the example the
input's ``/Slice`` on the CPU, two decoder Convs on the CPU (hb moves four more nodes there) and the
exported best.yaml of the README's main job (``/Slice`` int16 under ``calibration_type: default``), and two
int16 configurations of the latency benchmark (``benchmarks/latency_fidelity.py``: int16_top5, pareto_t14).
Conversions run at O0 (the same calibrated and quantized models as O3, seconds instead of minutes) and
are cached by content between runs.
"""

from __future__ import annotations

from pathlib import Path

from helpers import write_example_project
from ppocr import DET_MODEL, relabel_opset11, write_cls_project, write_ppocr_camera_project, write_ppocr_project

from tuner.toolchain.fidelity import Case

INT16 = {"InputType": "int16", "OutputType": "int16"}

#: The configurations both models run: every calibration the issue names, and set_all_nodes_int16.
CALIBRATIONS = (
    Case("max"),
    Case("percentile", {"calibration_type": "max", "max_percentile": 0.99995}),
    Case("kl", {"calibration_type": "kl"}),
    Case("default", {"calibration_type": "default"}),
    Case("per_channel", {"calibration_type": "max", "per_channel": True}),
    Case("all_int16", optimization="set_all_nodes_int16"),
)

EXAMPLE_CASES = CALIBRATIONS + (
    Case("int16_2convs", node_info={"/stem/conv/Conv": dict(INT16), "/fuse/conv/Conv": dict(INT16)}),
    Case("cpu_interior", node_info={"/Mul_1": {"ON": "CPU"}}),
    Case("cpu_slice", node_info={"/Slice": {"ON": "CPU"}}),
    # the first Conv on the CPU: /Slice stays on the BPU in int8 (the input is shared by three Slices)
    Case("cpu_stem", node_info={"/stem/conv/Conv": {"ON": "CPU"}}),
    # two decoder Convs on the CPU: hb moves their Relus, the Resize and the Concat between them there too
    Case("cpu_decoder", node_info={"/dec2/conv/Conv": {"ON": "CPU"}, "/dec3/conv/Conv": {"ON": "CPU"}}),
    Case("best", {"calibration_type": "default"}, node_info={"/Slice": dict(INT16)}),
    # the latency benchmark's int16 on the five nodes tuner sensitivity ranks first: int16 on the fused
    # /dec3/act/Relu, whose group only a Resize reads, makes nothing int16
    Case("int16_top5", node_info={n: dict(INT16) for n in ("/Slice_1", "/Slice_2", "/Slice", "/Concat_1",
                                                            "/dec3/act/Relu")}),
    # a Pareto trial of a short search (the latency benchmark's pareto_t14): int16 entries on fused Relus,
    # on the Conv of a residual block (which unfuses it) and on a Mul read through a Sigmoid
    Case("pareto_t14", node_info={
        **{n: dict(INT16) for n in ("/Concat_1", "/Concat_3", "/Mul_3", "/Slice", "/Slice_2", "/dec2/conv/Conv",
                                    "/dec3/act/Relu", "/dec3/conv/Conv", "/enc3/enc3.1/conv2/Conv")},
        "/Greater": {"ON": "BPU"}, "/Slice_1": {"ON": "CPU"},
        **{n: {"InputType": "int16"} for n in ("/enc3/enc3.0/act/Relu", "/enc3/enc3.0/conv/Conv",
                                               "/enc3/enc3.1/conv1/act/Relu")}}),
)

PPOCR_CASES = CALIBRATIONS + (
    Case("int16_2convs", node_info={"p2o.Conv.0": dict(INT16), "p2o.Conv.61": dict(INT16)}),
    Case("cpu_interior", node_info={"p2o.Mul.110": {"ON": "CPU"}}),
    # int16 on the HardSwish before the lowered p2o.Mul.10, whose output p2o.Add.15 is per channel: hb's
    # AdjustConvQuantParams copy multiplies it by ~270 before p2o.Conv.3 and the detector collapses
    # (docs/hb_rules/calibration.md section 5; search_quality --quick's trial, real output cosine 0.038)
    Case("per_channel_int16", {"calibration_type": "max", "per_channel": True}, node_info={"p2o.Mul.8": dict(INT16)}),
)

#: The classifier: int16 on an SE block's HardSigmoid (hb's int16 table) and its Mul.
CLS_CASES = CALIBRATIONS + (
    Case("int16_se", node_info={"HardSigmoid@7": dict(INT16), "Mul@22": dict(INT16)}),
)


#: The detector as a camera model (issue 26): ``input_type_rt: nv12`` from uint8 BGR files, its normalization
#: as ``data_mean_and_scale``; hb's HzPreprocess (YUV -> BGR and mean/scale, int8 weights) after 4:2:0 chroma.
NV12_CASES = (
    Case("max"),
    Case("default", {"calibration_type": "default"}),
    Case("per_channel", {"calibration_type": "max", "per_channel": True}),
)


#: The detector with an rgb or bgr runtime input (NHWC uint8 from the camera; data_mean_and_scale): one
#: configuration each, the input path being what differs from ``ppocr_nv12``.
CAMERA_CASES = (Case("max"),)


def example_project(root: Path) -> tuple[Path, list[Path]]:
    """(the base YAML, the evaluation folders) of the example, data written into ``root``."""
    cfg = write_example_project(root, n_cal=32, n_eval=16)
    return cfg, [root / "data" / "eval"]


def ppocr_project(root: Path) -> tuple[Path, list[Path]]:
    cfg = write_ppocr_project(root)
    relabel_opset11(root / DET_MODEL)
    return cfg, [root / "cal"]


def ppocr_nv12_project(root: Path) -> tuple[Path, list[Path]]:
    """The detector with ``input_type_rt: nv12``: its 8 photos as uint8 BGR, calibration = evaluation."""
    return write_ppocr_camera_project(root, "nv12"), [root / "cal"]


def ppocr_rgb_project(root: Path) -> tuple[Path, list[Path]]:
    """The detector with ``input_type_rt: rgb`` (NHWC) from its BGR training type: hb's preprocess swaps the
    channels and applies mean/scale in int8."""
    return write_ppocr_camera_project(root, "rgb"), [root / "cal"]


def ppocr_bgr_project(root: Path) -> tuple[Path, list[Path]]:
    """The detector with ``input_type_rt: bgr`` (NHWC): mean/scale alone in hb's preprocess."""
    return write_ppocr_camera_project(root, "bgr"), [root / "cal"]


def cls_project(root: Path) -> tuple[Path, list[Path]]:
    """The classifier: 16 calibration strips, the 112 labelled strips (56 upright, 56 turned) to score on."""
    cfg, _ = write_cls_project(root)
    return cfg, [root / "eval"]


MODELS = {"segdepth": (example_project, EXAMPLE_CASES), "ppocr_det": (ppocr_project, PPOCR_CASES),
          "ppocr_cls": (cls_project, CLS_CASES), "ppocr_nv12": (ppocr_nv12_project, NV12_CASES),
          "ppocr_rgb": (ppocr_rgb_project, CAMERA_CASES), "ppocr_bgr": (ppocr_bgr_project, CAMERA_CASES)}
#: Evaluation samples per model (16 unless listed). The classifier's output cosine is decided by its few
#: strips near the decision boundary, where hb's integer kernels and any float simulation part ways (its
#: calibrated model, computed in float, is as far from its quantized one there as tuner is): on 16 of the
#: strips (every 7th) real and simulated max differ by 0.0055, on all 112 by 0.0018.
SAMPLES = {"ppocr_cls": 112}


def run_suite(tc, name: str, root: Path, say=None) -> list:
    """Every case of model ``name``, real against simulated: [(CaseResult, RealRun | None)]."""
    from tuner.toolchain.fidelity import check_case, write_case
    from tuner.toolchain.logterms import log_simulator
    from tuner.workspace import Workspace

    build, cases = MODELS[name]
    cfg, eval_dirs = build(root / name)
    ws = Workspace.open(cfg, data=eval_dirs, limit=SAMPLES.get(name, 16))
    sim, log_sim = ws.simulator, log_simulator(ws)
    out = []
    for case in cases:
        path = write_case(cfg, case, root / name / "cases")
        if say:
            say(f"{name}/{case.name}")
        out.append(check_case(tc, ws, path, name, case.name, sim=sim, log_sim=log_sim, say=say))
    return out
