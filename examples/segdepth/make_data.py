"""Write the calibration / evaluation data of the segdepth example in hb_mapper's format.

    python examples/segdepth/make_data.py [--out DIR] [--cal N] [--eval N]

Writes (default DIR = examples/segdepth/data, next to this file):

* ``DIR/cal/NNNN.bin``            split "cal",  raw float32 NCHW [1, 5, 96, 160] (numpy.tofile)
* ``DIR/eval/NNNN.bin``           split "eval", same format
* ``DIR/labels/seg_NNNN.npy``     int64 [96, 160] class labels of eval sample NNNN
* ``DIR/labels/depth_NNNN.npy``   float32 [96, 160] depth in metres of eval sample NNNN

The samples are deterministic (see scenes.py), so running it again rewrites the
same bytes. Runnable from any working directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _load_scenes():
    spec = importlib.util.spec_from_file_location("segdepth_scenes", HERE / "scenes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


scenes = _load_scenes()


def write(out: Path, n_cal: int, n_eval: int, size: tuple[int, int] = (scenes.H, scenes.W)) -> None:
    """The files above; ``size`` = (rows, columns) of the scenes (make_hires.py writes 360x640)."""
    cal_dir, eval_dir, lab_dir = out / "cal", out / "eval", out / "labels"
    for d in (cal_dir, eval_dir, lab_dir):
        d.mkdir(parents=True, exist_ok=True)
    for i in range(n_cal):
        x, _, _ = scenes.make_sample(i, "cal", size=size)
        x[None].astype(np.float32).tofile(cal_dir / f"{i:04d}.bin")
    for i in range(n_eval):
        x, seg, depth = scenes.make_sample(i, "eval", size=size)
        x[None].astype(np.float32).tofile(eval_dir / f"{i:04d}.bin")
        np.save(lab_dir / f"seg_{i:04d}.npy", seg.astype(np.int64))
        np.save(lab_dir / f"depth_{i:04d}.npy", depth.astype(np.float32))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE / "data", help="output folder (default: %(default)s)")
    p.add_argument("--cal", type=int, default=32, help="number of calibration samples (default: 32)")
    p.add_argument("--eval", type=int, default=32, help="number of evaluation samples (default: 32)")
    a = p.parse_args(argv)
    if a.cal < 0 or a.eval < 0:
        p.error("--cal and --eval must be >= 0")
    write(a.out, a.cal, a.eval)
    print(f"wrote {a.cal} cal + {a.eval} eval samples (float32 1x5x96x160 NCHW .bin) "
          f"and {a.eval} seg/depth label pairs to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
