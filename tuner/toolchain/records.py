"""What the real toolchain said about a trial: one typed record, and where it lives in the study.

Optuna 5.0 refuses to change a finished trial (``UpdateFinishedTrialError`` from every
storage, for user attributes too), so the real figures of trial N are stored as the study
user attribute ``real:N`` (one JSON blob, rewritten when the trial is verified again). A
verification that yields a real accuracy also adds a new COMPLETE trial with the same
parameters and the real value (see :mod:`tuner.toolchain.verify`); that trial carries
:meth:`RealRecord.summary` as its own user attribute ``real`` and ``verified_from: N``.

:class:`RealRecord` is frozen (a verification makes a new one with ``dataclasses.replace``)
and its JSON is the blob earlier versions wrote: the same keys, a key absent where its value
is None, so studies verified before the record was typed read the same
(``tests/toolchain/test_records.py`` keeps a blob of that shape). Keys this version does
not know are kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast

import optuna

from tuner.files import jsonable
from tuner.toolchain.compare import Comparison

PREFIX = "real:"

Status = Literal["ok", "error", "failed", "timeout", "unusable"]
STATUSES: tuple[str, ...] = ("ok", "error", "failed", "timeout", "unusable")

# field -> stored key, where they differ ("json" would shadow the module in readers' code)
_KEYS = {"board": "json"}
# the fields a fed-back trial carries as its ``real`` user attribute
_SUMMARY = ("status", "accuracy", "accuracy_source", "latency_ms", "output_cosine", "sim_accuracy", "when")
# and these where set (tuner verify --local)
_SUMMARY_SET = ("metrics", "calibrated_accuracy", "compiler_ms")


@dataclass(frozen=True)
class RealRecord:
    """One run of the real toolchain (or a board script) on one trial, or an imported log.

    ``status``: ``ok`` (the command ran and left something usable), ``error`` (the YAML could
    not be exported), ``failed`` (non-zero exit), ``timeout`` (killed), ``unusable`` (it ran
    but printed neither an hb_mapper log with its tables nor a JSON result).
    """

    status: Status
    when: str                                   # ISO time of the run
    dir: str | None = None                      # the trial's verify folder (tuner verify)
    imported: str | None = None                 # the log's path (tuner import-log)
    yaml: str | None = None                     # the exported YAML the command converted
    command: str | None = None                  # the command as run ({yaml} substituted)
    returncode: int | None = None
    seconds: float | None = None
    error: str | None = None                    # one line: why the status is not ok
    sim_accuracy: float | None = None           # the simulated value of the study's accuracy objective
    objective: str | None = None                # the study's accuracy objective, e.g. mean_cosine
    log_summary: dict[str, Any] | None = None   # what the log held (nodes, outputs, int16 decisions, errors)
    output_cosine: float | None = None          # the log's mean output cosine
    method: str | None = None                   # the calibration method the log names
    comparison: Comparison | None = None        # per node and output, real vs simulated
    comparison_error: str | None = None         # why the log could not be compared
    board: dict[str, Any] | None = None         # the JSON object the command printed last (stored as "json")
    latency_ms: float | None = None             # the JSON's latency_ms
    accuracy: float | None = None               # real value comparable with ``objective``
    accuracy_source: str | None = None          # "json:<key>" or "log:<objective>"
    feedback_trial: int | None = None           # the COMPLETE trial added with the real value
    metrics: dict[str, float] | None = None     # real values of the constraints' metrics (tuner verify --local)
    calibrated_accuracy: float | None = None    # the objective on the tool's calibrated model (--local)
    compiler_ms: float | None = None            # hbdk's BPU estimate summed over the subgraphs (--local)
    local: dict[str, Any] | None = None         # tuner.toolchain.realrun.RealRun.to_json() (--local)
    extra: dict[str, Any] = field(default_factory=dict)   # keys written by another version, kept

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def real_accuracy(self) -> float | None:
        """The real accuracy when the run was ok and gave one, else None."""
        return self.accuracy if self.ok else None

    def with_(self, **changes: Any) -> RealRecord:
        return replace(self, **changes)

    def summary(self) -> dict[str, Any]:
        """The short form a fed-back trial carries."""
        out = {k: jsonable(getattr(self, k)) for k in _SUMMARY}
        out.update({k: jsonable(getattr(self, k)) for k in _SUMMARY_SET if getattr(self, k) is not None})
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            out[_KEYS.get(f.name, f.name)] = value.as_dict() if isinstance(value, Comparison) else jsonable(value)
        out.update(jsonable(self.extra))
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RealRecord:
        """The record from its stored blob (any version's: unknown keys go to ``extra``)."""
        if not isinstance(d, dict):
            raise ValueError(f"a real-toolchain record is a JSON object, not {type(d).__name__}")
        stored = {_KEYS.get(f.name, f.name): f.name for f in fields(cls) if f.name != "extra"}
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in d.items():
            if key in stored:
                kw[stored[key]] = value
            else:
                extra[key] = value
        status = kw.get("status")
        if status not in STATUSES:
            raise ValueError(f"a real-toolchain record has status {status!r}; expected one of {', '.join(STATUSES)}")
        if kw.get("comparison"):
            kw["comparison"] = Comparison.from_dict(kw["comparison"])
        else:
            kw.pop("comparison", None)
        for name in ("seconds", "sim_accuracy", "output_cosine", "latency_ms", "accuracy", "calibrated_accuracy",
                     "compiler_ms"):
            if isinstance(kw.get(name), int) and not isinstance(kw[name], bool):
                kw[name] = float(kw[name])
        kw.setdefault("when", "")
        return cls(extra=extra, **kw)


def real_key(number: int) -> str:
    return f"{PREFIX}{number}"


def real_record(study: optuna.Study, number: int) -> RealRecord | None:
    blob = study.user_attrs.get(real_key(number))
    return None if blob is None else RealRecord.from_json(cast(dict[str, Any], blob))


def real_records(study: optuna.Study) -> dict[int, RealRecord]:
    """trial number -> real record, for every trial with one."""
    out = {}
    for key, value in study.user_attrs.items():
        if key.startswith(PREFIX) and key[len(PREFIX):].isdigit():
            out[int(key[len(PREFIX):])] = RealRecord.from_json(value)
    return dict(sorted(out.items()))


def save_real(study: optuna.Study, number: int, record: RealRecord) -> None:
    study.set_user_attr(real_key(number), record.to_json())


def comparison_for_trial(study: optuna.Study, trial: int | optuna.trial.FrozenTrial) -> Comparison | None:
    """The comparison stored for a trial by ``tuner verify`` or ``tuner import-log --study/--trial``,
    or None when no log was attached to it. ``trial`` is a FrozenTrial or a trial number."""
    number = trial if isinstance(trial, int) else trial.number
    rec = real_record(study, number)
    return None if rec is None else rec.comparison
