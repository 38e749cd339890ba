"""``tuner check-data``, ``make-cal-data``, ``check-preprocess``: the calibration data and the
preprocessing that made them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tuner.commands import args as a


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-data", help="check calibration data against the YAML: format, statistics, known mistakes",
                       description="Check the calibration data an hb_mapper YAML points at: file format and size, "
                                   "per-channel statistics, and the known mistakes (unnormalized or doubly normalized "
                                   "data, channels on very different scales, constant channels, duplicates, too few "
                                   "samples). Exit code 0: clean, 1: findings, 2: unusable data.")
    a.config(p)
    a.data(p, "check this folder instead of cal_data_dir (';' between inputs)")
    a.limit(p, "read at most this many samples")
    a.json_output(p, "print the report as JSON")
    p.set_defaults(func=check_data)

    p = sub.add_parser("make-cal-data", help="write hb_mapper calibration files from images with your preprocessing",
                       description="Run your preprocessing (an image path -> the model-input tensor before the "
                                   "YAML's mean/scale) on every image in IMAGES and write one numpy.tofile() dump of "
                                   "cal_data_type per image into --out, as hb_mapper reads cal_data_dir. "
                                   "Single-input models.")
    a.config(p)
    p.add_argument("images", help="folder of images (jpg, jpeg, png, bmp, tif, tiff, webp), taken in sorted order")
    a.preprocess(p)
    p.add_argument("--out", required=True, help="folder to write the calibration files into")
    a.limit(p, "use at most this many images")
    p.add_argument("--force", action="store_true", help="overwrite existing files of the same names")
    p.set_defaults(func=make_cal_data)

    p = sub.add_parser("check-preprocess",
                       help="check that cal_data_dir holds what your preprocessing makes of the images",
                       description="Recompute the calibration tensors from the images with your preprocessing and "
                                   "compare them with the files in cal_data_dir (paired by sorted name), per channel "
                                   "and through the float model; names RGB/BGR swaps, x255 scales and doubly "
                                   "normalised files. Exit code 0: consistent, 1: differences, 2: unusable.")
    a.config(p)
    p.add_argument("images", help="folder of the original images, in the same sorted order as the files")
    a.preprocess(p)
    a.limit(p, "compare at most this many pairs")
    a.json_output(p, "print the report as JSON")
    p.set_defaults(func=check_preprocess)


def check_data(args: argparse.Namespace) -> int:
    from tuner.inputs.checks import check_data, format_report

    report = check_data(args.config, data_dirs=a.data_dirs(args.data), limit=args.limit)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, allow_nan=False))
    else:
        print(format_report(report))
    return report.exit_code()


def make_cal_data(args: argparse.Namespace) -> int:
    from tuner.inputs.preprocess import camera_note, make_cal_data

    written = make_cal_data(args.config, Path(args.images), args.preprocess, Path(args.out), limit=args.limit,
                            overwrite=args.force)
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} calibration file(s) in {args.out}; point calibration_parameters.cal_data_dir at it")
    note = camera_note(args.config)
    if note:
        print(note)
    return 0


def check_preprocess(args: argparse.Namespace) -> int:
    from tuner.inputs.check_preprocess import check_preprocess, format_preprocess_report

    report = check_preprocess(args.config, Path(args.images), args.preprocess, limit=args.limit)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, allow_nan=False))
    else:
        print(format_preprocess_report(report))
    return report.exit_code()
