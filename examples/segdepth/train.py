"""Train and export the segdepth example model (torch, CPU).

    python examples/segdepth/train.py [--epochs E] [--samples N] [--seed S]

A small U-Net-like segmentation + depth network with a 5-channel input
(R, G, B, radar range in metres, radar valid mask), shaped like the users' real
network: Conv+BN+ReLU encoder with stride-2 downsampling and residual blocks,
ReLU6 (Clip) in the stem, bilinear Resize + Concat skips in the decoder, a seg
head and a depth head, and a radar branch (range scaled by 1/80 inside the
model, Sigmoid gate on the image features, Where to blend radar range into the
depth at valid returns, a slice assignment on the seg logits that exports as
ScatterND).

Trains on ``--samples`` procedurally generated scenes (scenes.py, split
"train") held in memory, with cross-entropy + relative L1 depth loss, Adam and
a one-cycle (cosine) learning rate, seed fixed, 2 CPU threads. Then prints float metrics
on 64 eval samples, exports ``segdepth.onnx`` (legacy exporter, opset 11,
IR <= 7, named nodes, static shapes, shape-inferred) next to this file, and
writes ``data/torch_ref.npz`` (inputs + torch outputs) for the onnxruntime
parity check in eval_onnx.py.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
MAX_RANGE = 80.0


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"segdepth_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


scenes = _load("scenes")
evalmod = _load("eval_onnx")


# ----------------------------------------------------------------------------- model
class ConvBNAct(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, act: str = "relu"):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU6() if act == "relu6" else nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class ResBlock(nn.Module):
    """Conv-BN-ReLU -> Conv-BN -> (+ skip) -> ReLU."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = ConvBNAct(c, c)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn2(self.conv2(self.conv1(x))) + x)


class SegDepthNet(nn.Module):
    def __init__(self, num_classes: int = 4):
        super().__init__()
        # image stem and radar branch, both at 1/2 resolution (48x80)
        self.stem = ConvBNAct(3, 16, stride=2, act="relu6")
        self.radar = ConvBNAct(2, 16, stride=2, act="relu6")
        self.radar_gate = nn.Conv2d(16, 16, 1)
        self.fuse = ConvBNAct(32, 24)
        # encoder
        self.enc2 = nn.Sequential(ConvBNAct(24, 32, stride=2), ResBlock(32))   # 24x40
        self.enc3 = nn.Sequential(ConvBNAct(32, 64, stride=2), ResBlock(64))   # 12x20
        self.enc4 = nn.Sequential(ConvBNAct(64, 64, stride=2), ResBlock(64))   # 6x10
        # decoder
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec3 = ConvBNAct(64 + 64, 48)
        self.dec2 = ConvBNAct(48 + 32, 32)
        self.dec1 = ConvBNAct(32 + 24, 24)
        # heads (at 48x80, upsampled to 96x160)
        self.seg_head = nn.Sequential(ConvBNAct(24, 16), nn.Conv2d(16, num_classes, 1))
        self.depth_head = nn.Sequential(ConvBNAct(24, 16), nn.Conv2d(16, 2, 1))  # depth logit, radar confidence
        # radar returns never come from the sky: lower the sky logit there
        self.sky_suppress = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        rgb = x[:, 0:3]
        rng_m = x[:, 3:4]                       # metres, 0 where invalid
        valid = x[:, 4:5]
        rng_n = rng_m * (1.0 / MAX_RANGE)       # scaled inside the model

        img = self.stem(rgb)
        rad = self.radar(torch.cat([rng_n, valid], dim=1))
        gate = torch.sigmoid(self.radar_gate(rad))
        f1 = self.fuse(torch.cat([img * gate, rad], dim=1))

        e2 = self.enc2(f1)
        e3 = self.enc3(e2)
        e4 = self.enc4(e3)
        d3 = self.dec3(torch.cat([self.up(e4), e3], dim=1))
        d2 = self.dec2(torch.cat([self.up(d3), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up(d2), f1], dim=1))

        seg = self.up(self.seg_head(d1))
        dh = self.up(self.depth_head(d1))
        pred_depth = torch.sigmoid(dh[:, 0:1]) * MAX_RANGE
        alpha = torch.sigmoid(dh[:, 1:2])
        blended = alpha * rng_m + (1.0 - alpha) * pred_depth
        depth = torch.where(valid > 0.5, blended, pred_depth)

        seg = seg.clone()
        seg[:, 0:1] = seg[:, 0:1] - valid * self.sky_suppress   # exports as ScatterND
        return seg, depth


# ----------------------------------------------------------------------------- data
def make_set(n: int, split: str):
    xs = np.empty((n, 5, scenes.H, scenes.W), np.float32)
    ss = np.empty((n, scenes.H, scenes.W), np.int64)
    ds = np.empty((n, scenes.H, scenes.W), np.float32)
    for i in range(n):
        xs[i], ss[i], ds[i] = scenes.make_sample(i, split)
    return torch.from_numpy(xs), torch.from_numpy(ss), torch.from_numpy(ds)


def evaluate(model: nn.Module, n: int = 64) -> dict:
    x, s, d = make_set(n, "eval")
    m = evalmod.Metrics()
    model.eval()
    with torch.no_grad():
        for i in range(0, n, 16):
            seg, depth = model(x[i:i + 16])
            m.update(seg.numpy(), depth.numpy(), s[i:i + 16].numpy(), d[i:i + 16].numpy())
    return m.result()


# ----------------------------------------------------------------------------- export
def fold_static_subgraphs(m: onnx.ModelProto) -> onnx.ModelProto:
    """Fold what the legacy exporter left computable at export time (what onnxsim would do).

    The slice assignment exports as ScatterND whose indices/update shape come from
    Shape -> ConstantOfShape -> Equal -> Where -> Expand chains; with static shapes
    those are constants. Folds Shape of statically shaped tensors and every node whose
    inputs are all constants into initializers, then drops unused Constant nodes and
    initializers. The real-time ops (Conv, Resize, Sigmoid, Where, ScatterND, ...) stay.
    """
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    while True:
        m = onnx.shape_inference.infer_shapes(m)
        shapes = {}
        for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                shapes[vi.name] = [d.dim_value for d in dims]
        consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        for n in m.graph.node:
            if n.op_type == "Constant":
                consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        keep, new_inits, changed = [], [], False
        for n in m.graph.node:
            ins = [i for i in n.input if i]
            val = None
            if n.op_type == "Shape" and ins[0] in shapes:
                val = np.array(shapes[ins[0]], dtype=np.int64)
            elif n.op_type not in ("Constant",) and ins and all(i in consts for i in ins) and len(n.output) == 1:
                g = helper.make_graph([n], "fold", [], [helper.make_tensor_value_info(n.output[0], 0, None)],
                                      initializer=[numpy_helper.from_array(consts[i], i) for i in ins])
                sub = helper.make_model(g, opset_imports=m.opset_import)
                val = ReferenceEvaluator(sub).run(None, {})[0]
            if val is not None:
                new_inits.append(numpy_helper.from_array(np.asarray(val), n.output[0]))
                consts[n.output[0]] = np.asarray(val)
                changed = True
            else:
                keep.append(n)
        del m.graph.node[:]
        m.graph.node.extend(keep)
        m.graph.initializer.extend(new_inits)
        # drop dead Constant nodes / initializers
        used = {i for n in m.graph.node for i in n.input} | {o.name for o in m.graph.output}
        live = [n for n in m.graph.node if n.op_type != "Constant" or n.output[0] in used]
        if len(live) != len(m.graph.node):
            changed = True
        del m.graph.node[:]
        m.graph.node.extend(live)
        used = {i for n in m.graph.node for i in n.input} | {o.name for o in m.graph.output}
        inits = [t for t in m.graph.initializer if t.name in used]
        del m.graph.initializer[:]
        m.graph.initializer.extend(inits)
        del m.graph.value_info[:]
        if not changed:
            return onnx.shape_inference.infer_shapes(m)


def export(model: nn.Module, path: Path) -> onnx.ModelProto:
    model.eval()
    dummy = torch.from_numpy(scenes.make_sample(0, "eval")[0][None])
    tmp = path.with_suffix(".raw.onnx")
    torch.onnx.export(model, dummy, str(tmp), dynamo=False, opset_version=11,
                      input_names=["input"], output_names=["seg", "depth"], do_constant_folding=True)
    m = onnx.load(str(tmp))
    tmp.unlink()
    onnx.checker.check_model(m)
    m = fold_static_subgraphs(m)
    if m.ir_version > 7:
        m.ir_version = 7
    # every node gets a non-empty unique name
    seen: set[str] = set()
    counts: collections.Counter = collections.Counter()
    for node in m.graph.node:
        name = node.name
        if not name or name in seen:
            base = name or f"/{node.op_type}"
            counts[base] += 1
            name = f"{base}_{counts[base]}"
            while name in seen:
                counts[base] += 1
                name = f"{base}_{counts[base]}"
            node.name = name
        seen.add(name)
    m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    onnx.checker.check_model(m, full_check=True)
    assert [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] == [11], m.opset_import
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        assert vi.type.tensor_type.HasField("shape"), f"no shape: {vi.name}"
        assert all(dd.HasField("dim_value") for dd in dims), f"non-static shape: {vi.name}"  # rank 0 is fine
    onnx.save(m, str(path))
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "segdepth.onnx")
    p.add_argument("--budget-min", type=float, default=11.5, help="hard cap on training wall time (minutes)")
    a = p.parse_args(argv)

    t_start = time.perf_counter()
    torch.set_num_threads(2)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)

    x, s, d = make_set(a.samples, "train")
    print(f"generated {a.samples} training scenes in {time.perf_counter() - t_start:.1f} s")

    model = SegDepthNet()
    n_params = sum(t.numel() for t in model.parameters())
    print(f"parameters: {n_params}")
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    steps_per_epoch = a.samples // a.batch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.epochs * steps_per_epoch,
                                                pct_start=0.1)
    cls_w = torch.tensor([1.0, 1.0, 2.0, 4.0])
    g = torch.Generator().manual_seed(a.seed)

    t_train = time.perf_counter()
    stopped_early = False
    for ep in range(a.epochs):
        model.train()
        perm = torch.randperm(a.samples, generator=g)
        tot = tot_ce = tot_d = 0.0
        for it in range(steps_per_epoch):
            idx = perm[it * a.batch:(it + 1) * a.batch]
            xb, sb, db = x[idx], s[idx], d[idx]
            seg, depth = model(xb)
            ce = F.cross_entropy(seg, sb, weight=cls_w)
            l1 = (torch.abs(depth[:, 0] - db) / db).mean()   # L1 relative to the true depth
            loss = ce + l1
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tot += loss.item()
            tot_ce += ce.item()
            tot_d += l1.item()
            if time.perf_counter() - t_train > a.budget_min * 60:
                stopped_early = True
                break
        el = time.perf_counter() - t_train
        k = it + 1
        print(f"epoch {ep + 1}/{a.epochs}: loss {tot / k:.4f} (ce {tot_ce / k:.4f}, "
              f"rel-L1 {tot_d / k:.4f})  {el:.0f} s", flush=True)
        if stopped_early:
            print(f"WARNING: training budget of {a.budget_min} min reached after {k} steps of epoch {ep + 1}; "
                  "stopping early (the result then depends on the machine's speed)")
            break
    train_s = time.perf_counter() - t_train

    r = evaluate(model)
    print(f"torch float, 64 eval samples: {evalmod.format_metrics(r)}")

    m = export(model, a.out)
    census = collections.Counter(n.op_type for n in m.graph.node)
    size = a.out.stat().st_size
    print(f"exported {a.out} ({size} bytes, {len(m.graph.node)} nodes, ir {m.ir_version}, opset 11)")
    print("op census: " + ", ".join(f"{k} {v}" for k, v in sorted(census.items())))
    for op in ("Where", "ScatterND", "Sigmoid", "Concat"):
        print(f"  {op}: " + ", ".join(n.name for n in m.graph.node if n.op_type == op))

    # reference inputs/outputs for the onnxruntime parity check (data/ is git-ignored)
    ref_path = HERE / "data" / "torch_ref.npz"
    ref_path.parent.mkdir(parents=True, exist_ok=True)
    xr = torch.from_numpy(np.stack([scenes.make_sample(i, "eval")[0] for i in range(4)]))
    with torch.no_grad():
        sr, dr = model.eval()(xr)
    np.savez(ref_path, input=xr.numpy(), seg=sr.numpy(), depth=dr.numpy())

    summary = {
        "seed": a.seed, "samples": a.samples, "epochs_run": ep + 1, "batch": a.batch, "lr": a.lr,
        "stopped_early": stopped_early, "train_seconds": round(train_s, 1),
        "total_seconds": round(time.perf_counter() - t_start, 1), "params": n_params,
        "onnx_bytes": size, "metrics": r, "census": dict(sorted(census.items())),
        "torch": torch.__version__, "onnx": onnx.__version__,
    }
    print("summary " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
