"""The ``tuner`` subcommands: one module per group, each a thin layer (parse, call the library,
render) over the argument groups of :mod:`tuner.commands.args`.

The library is imported inside each command's function, so that ``tuner --help`` and a command's
argument errors do not pay for numpy, onnx, onnxruntime and Optuna.
"""

from __future__ import annotations

import argparse

from tuner.commands import data, evaluate, latency, nodes, real, search, sensitivity, toolchain

#: The one registry: every group, in the order ``tuner --help`` lists its commands.
GROUPS = (evaluate, nodes, data, sensitivity, search, toolchain, real, latency)


def register(sub: argparse._SubParsersAction) -> None:
    for group in GROUPS:
        group.register(sub)
