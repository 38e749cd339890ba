"""A user's own metric (``user:module:function`` or ``user:path/file.py:function``) and the loader
of user callables that preprocessing (``--preprocess``) shares.

A user metric is a per-sample function ``fn(float_outputs, quant_outputs, labels) -> float``;
:class:`UserMetric` averages it over the samples like the built-in accumulators of
:mod:`tuner.metrics.task`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import TunerError


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


UserFn = Callable[[dict[str, np.ndarray], dict[str, np.ndarray], "dict | None"], float]


_USER_FORMS = ("'package.module:function' (importable, e.g. on PYTHONPATH) or "
               "'path/to/file.py:function'")


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def load_callable(spec: str, base_dir: str | Path | None = None, what: str = "user metric",
                  signature: str = "fn(outputs_float, outputs_quant, labels) -> float") -> Callable:
    """Load the user's ``"module:function"`` or ``"path/to/file.py:function"`` (``what`` and
    ``signature`` word the error messages: metrics and preprocessing callables share this).

    A relative file path is resolved against ``base_dir`` (default: the current directory).
    The function is called once per sample as ``fn(outputs_float, outputs_quant, labels)``
    (dicts of output name -> array; ``labels`` a dict or None) and must return a finite number;
    :class:`UserMetric` averages it over samples. Exceptions the function raises propagate
    unchanged (with their traceback); problems loading it raise :class:`TunerError`.
    """
    target, sep, fn_name = str(spec).strip().rpartition(":")
    if not sep or not target or not fn_name or not fn_name.isidentifier():
        raise TunerError(f"{what} {spec!r}: expected {_USER_FORMS}")
    if _is_path(target):
        path = Path(target).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise TunerError(f"{what} {spec!r}: file {str(path)!r} not found; give an existing "
                             "path (relative paths are resolved against "
                             f"{str(base_dir) if base_dir is not None else 'the current directory'})")
        mod_name = f"_tuner_user_{abs(hash(str(path.resolve())))}"
        try:
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            if mspec is None or mspec.loader is None:
                raise ImportError(f"cannot import {path}")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module      # dataclasses etc. look their module up here
            mspec.loader.exec_module(module)
        except Exception as e:  # the user's file is user input
            sys.modules.pop(mod_name, None)
            raise TunerError(f"{what} {spec!r}: loading {str(path)!r} failed: "
                             f"{type(e).__name__}: {e}; fix the file") from e
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            if e.name and (target == e.name or target.startswith(e.name + ".")):
                raise TunerError(f"{what} {spec!r}: module {target!r} not found; put its "
                                 f"directory on PYTHONPATH, install it, or use 'path/to/file.py:"
                                 f"{fn_name}'") from e
            raise TunerError(f"{what} {spec!r}: importing {target!r} failed: {e}; install "
                             "the missing dependency") from e
        except Exception as e:
            raise TunerError(f"{what} {spec!r}: importing {target!r} failed: "
                             f"{type(e).__name__}: {e}; fix the module") from e
    if not hasattr(module, fn_name):
        public = sorted(n for n, v in vars(module).items()
                        if callable(v) and not n.startswith("_"))
        raise TunerError(f"{what} {spec!r}: {target!r} has no function {fn_name!r}"
                         + (f"; it defines {', '.join(public)}" if public else "")
                         + "; fix the name after the ':'")
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise TunerError(f"{what} {spec!r}: {fn_name!r} in {target!r} is a "
                         f"{type(fn).__name__}, not a function; point the spec at a function "
                         f"{signature}")
    return fn

def load_user_metric(spec: str, base_dir: str | Path | None = None) -> UserFn:
    """A user metric, called once per sample as ``fn(outputs_float, outputs_quant, labels)``
    (dicts of output name -> array; ``labels`` a dict or None), returning a finite number that
    :class:`UserMetric` averages. Its exceptions propagate unchanged; loading problems raise
    :class:`TunerError`."""
    return load_callable(spec, base_dir)


@dataclass
class UserMetric:
    """The mean over samples of a user function's per-sample value (see :func:`load_user_metric`)."""

    fn: UserFn
    name: str = ""
    total: float = 0.0
    count: int = 0

    @classmethod
    def from_spec(cls, spec: str, base_dir: str | Path | None = None) -> UserMetric:
        return cls(load_user_metric(spec, base_dir), name=spec)

    def update(self, outputs_float: dict[str, np.ndarray], outputs_quant: dict[str, np.ndarray],
               labels: dict | None = None) -> None:
        value = self.fn(outputs_float, outputs_quant, labels)
        label = self.name or getattr(self.fn, "__qualname__", repr(self.fn))
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TunerError(f"user metric {label!r} returned {type(value).__name__} {value!r:.80}; "
                             "it must return one finite number per sample")
        value = float(value)
        if not math.isfinite(value):
            raise TunerError(f"user metric {label!r} returned {value} for sample {self.count}; "
                             "it must return a finite number per sample")
        self.total += value
        self.count += 1

    @property
    def value(self) -> float:
        return _ratio(self.total, self.count)

    def as_dict(self) -> dict[str, float]:
        return {"user": self.value}
