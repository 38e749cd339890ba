"""Float metrics of the segdepth ONNX model with onnxruntime (numpy + onnxruntime, no torch).

    python examples/segdepth/eval_onnx.py [--model segdepth.onnx] [--n 64] [--ref REF.npz]

Runs the model on ``make_sample(i, "eval")`` for i < n and prints pixel accuracy,
mIoU and depth AbsRel (same definitions as train.py). With ``--ref`` (written
by train.py: inputs plus torch outputs) it also checks that onnxruntime matches
torch (max abs diff < 1e-3) and exits non-zero if not.

Metric definitions (``metrics`` below, also used by train.py):
* pixel accuracy: correct pixels / all pixels, over all n samples;
* mIoU: mean over the 4 classes of TP / (TP + FP + FN), confusion summed over all n samples;
* AbsRel: mean of |pred - gt| / gt over the non-sky pixels (gt label != 0) of all n samples.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"segdepth_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Metrics:
    """Streaming seg/depth metrics; feed numpy logits [N,4,H,W], depth [N,1,H,W] and labels."""

    def __init__(self, num_classes: int = 4):
        self.k = num_classes
        self.conf = np.zeros((num_classes, num_classes), dtype=np.int64)  # [gt, pred]
        self.absrel_sum = 0.0
        self.absrel_n = 0

    def update(self, seg_logits: np.ndarray, depth: np.ndarray, seg_gt: np.ndarray, depth_gt: np.ndarray) -> None:
        pred = seg_logits.argmax(axis=1).reshape(-1)
        gt = seg_gt.reshape(-1).astype(np.int64)
        self.conf += np.bincount(gt * self.k + pred, minlength=self.k * self.k).reshape(self.k, self.k)
        d = depth.reshape(-1).astype(np.float64)
        dg = depth_gt.reshape(-1).astype(np.float64)
        m = gt != 0  # non-sky
        self.absrel_sum += float((np.abs(d[m] - dg[m]) / dg[m]).sum())
        self.absrel_n += int(m.sum())

    def result(self) -> dict:
        c = self.conf.astype(np.float64)
        tp = np.diag(c)
        iou = tp / np.maximum(c.sum(0) + c.sum(1) - tp, 1.0)
        return {
            "pixel_acc": float(tp.sum() / max(c.sum(), 1.0)),
            "miou": float(iou.mean()),
            "iou": [float(v) for v in iou],
            "absrel": self.absrel_sum / max(self.absrel_n, 1),
        }


def format_metrics(r: dict) -> str:
    iou = " ".join(f"{v:.3f}" for v in r["iou"])
    return (f"pixel_acc {r['pixel_acc']:.4f}  mIoU {r['miou']:.4f} (per class sky/ground/vehicle/ped-pole: {iou})"
            f"  depth AbsRel {r['absrel']:.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=HERE / "segdepth.onnx")
    p.add_argument("--n", type=int, default=64, help="number of eval samples (default: 64)")
    p.add_argument("--ref", type=Path, default=None, help="npz from train.py with input/seg/depth torch outputs")
    a = p.parse_args(argv)

    import onnxruntime as ort

    scenes = _load("scenes")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(a.model), so, providers=["CPUExecutionProvider"])
    m = Metrics()
    for i in range(a.n):
        x, seg, depth = scenes.make_sample(i, "eval")
        s, d = sess.run(["seg", "depth"], {"input": x[None]})
        m.update(s, d, seg[None], depth[None])
    print(f"onnxruntime float, {a.n} eval samples: {format_metrics(m.result())}")

    if a.ref is not None:
        ref = np.load(a.ref)
        ds = dd = 0.0
        for j in range(ref["input"].shape[0]):  # the model has a static batch of 1
            s, d = sess.run(["seg", "depth"], {"input": ref["input"][j:j + 1]})
            ds = max(ds, float(np.abs(s - ref["seg"][j:j + 1]).max()))
            dd = max(dd, float(np.abs(d - ref["depth"][j:j + 1]).max()))
        ok = ds < 1e-3 and dd < 1e-3
        print(f"onnxruntime vs torch on {ref['input'].shape[0]} inputs: max |diff| seg {ds:.2e}, depth {dd:.2e} "
              f"-> {'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
