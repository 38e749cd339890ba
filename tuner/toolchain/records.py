"""Where the real figures of a trial live in the study.

Optuna 5.0 refuses to change a finished trial (``UpdateFinishedTrialError`` from every
storage, for user attributes too), so the real figures of trial N are stored as the study
user attribute ``real:N`` (one JSON blob, rewritten when the trial is verified again). A
verification that yields a real accuracy also adds a new COMPLETE trial with the same
parameters and the real value (see :mod:`tuner.toolchain.verify`); that trial carries the
same blob as its own user attribute ``real`` and ``verified_from: N``.
"""

from __future__ import annotations

import math
from typing import Any

import optuna

PREFIX = "real:"


def real_key(number: int) -> str:
    return f"{PREFIX}{number}"


def real_record(study: optuna.Study, number: int) -> dict[str, Any] | None:
    return study.user_attrs.get(real_key(number))


def real_records(study: optuna.Study) -> dict[int, dict[str, Any]]:
    """trial number -> real record, for every trial with one."""
    out = {}
    for key, value in study.user_attrs.items():
        if key.startswith(PREFIX) and key[len(PREFIX):].isdigit():
            out[int(key[len(PREFIX):])] = value
    return dict(sorted(out.items()))


def save_real(study: optuna.Study, number: int, record: dict[str, Any]) -> None:
    study.set_user_attr(real_key(number), jsonable(record))


def jsonable(v: Any) -> Any:
    """``v`` as plain JSON (what every storage keeps): non-finite floats become None, keys strings,
    tuples lists, anything else its ``str``."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)
