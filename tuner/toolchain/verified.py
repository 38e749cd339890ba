"""What a study's real-toolchain records say, read from its :class:`~tuner.study.outcome.Outcome`:
``tuner verify``'s tables, ``tuner status``'s section on verified trials and ``tuner export
--by real``'s choice (:mod:`tuner.toolchain.verify` stores the records)."""

from __future__ import annotations

from typing import Any

from tuner.console import table
from tuner.study import results
from tuner.study.outcome import Outcome
from tuner.toolchain.records import RealRecord


def _cell(v: float | None, d: int = 6, sign: bool = False) -> str:
    """A table cell: the number, or -- when there is none."""
    return "--" if v is None else (f"{v:+.{d}f}" if sign else f"{v:.{d}f}")


def results_table(done: list[tuple[results.Row, RealRecord]]) -> str:

    rows = []
    for row, rec in done:
        c = rec.comparison
        gap = None if rec.accuracy is None else rec.accuracy - row.accuracy
        rows.append([str(row.number), rec.status, _cell(row.accuracy), _cell(rec.accuracy), _cell(gap, sign=True),
                     _cell(c.output_cosine_gap if c else None, sign=True), _cell(c.spearman if c else None, 3),
                     str(len(c.int16_refused)) if c else "--", _cell(rec.seconds, 1), (rec.error or "")[:80]])
    return table(["trial", "status", "simulated", "real", "real - sim", "output cos gap", "Spearman", "int16 refused",
                  "seconds", "problem"], rows)


def local_table(done: list[tuple[results.Row, RealRecord]], objectives: Any) -> str:
    """``verify --local``'s table: the simulated objective next to the real quantized model's (the
    .bin's arithmetic) and calibrated model's, whether the real figures meet the constraints, and
    hbdk's BPU estimate next to tuner's modeled latency."""

    rows = []
    for row, rec in done:
        gap = None if rec.accuracy is None else rec.accuracy - row.accuracy
        meets = "--"
        if rec.ok and rec.accuracy is not None:
            metrics = dict(row.trial_record.metrics(objectives.metric_names_needed))
            metrics.update(rec.metrics or {})
            margins = objectives.margins(rec.accuracy, row.latency_ms, metrics)
            meets = ("yes" if all(m.margin >= 0 for m in margins) else
                     "no: " + ", ".join(m.name for m in margins if m.margin < 0)) if margins else "(none)"
        conversion = (rec.local or {}).get("conversion", {})
        cpu = conversion.get("cpu_nodes")
        level = (conversion.get("knobs") or {}).get("optimize_level")
        hbdk = _cell(rec.compiler_ms, 3) + (f" ({level})" if level and rec.compiler_ms is not None else "")
        rows.append([str(row.number), rec.status, _cell(row.accuracy), _cell(rec.accuracy), _cell(gap, sign=True),
                     _cell(rec.calibrated_accuracy), meets[:60], _cell(row.latency_ms, 3),
                     _cell(row.trial_record.latency.compiler_ms, 3), hbdk,
                     "--" if cpu is None else f"{row.trial_record.counts.cpu_nodes}/{len(cpu)}",
                     _cell(rec.seconds, 1), (rec.error or "")[:80]])
    # the modeled hbdk estimate is O3's (what a board runs); at O0 hbdk's own is several times larger
    return table(["trial", "status", "simulated", "real (quantized)", "real - sim", "real (calibrated)",
                  "constraints met (real)", "modeled ms", "modeled hbdk O3 ms", "hbdk BPU ms", "CPU sim/real",
                  "seconds", "problem"], rows)


def real_summary(found: Outcome) -> str | None:
    """``tuner status``'s section on verified trials (the study's :class:`~tuner.study.outcome.Outcome`);
    None when nothing was verified."""
    if not found.real:
        return None
    by_number = {r.number: r for r in found.rows}
    done = [(by_number[n], rec) for n, rec in found.real.items() if n in by_number]
    ok = sum(1 for _, r in done if r.ok)
    return (f"Verified with the real toolchain ({ok} of {len(done)} ok; 'real' is comparable with the objective "
            f"where the log or the command's JSON gave it):\n" + results_table(done))


def best_real(found: Outcome) -> tuple[results.Row, RealRecord] | None:
    """The trial to export by its real figure (same rule as :func:`tuner.study.results.best`), from
    the study's :class:`~tuner.study.outcome.Outcome` (its rows, objectives and real records)."""
    mode, min_accuracy = found.objectives.mode, found.objectives.min_accuracy
    by_number = {r.number: r for r in found.rows}
    cands = [(by_number[n], rec, acc) for n, rec in found.real.items()
             if n in by_number and (acc := rec.real_accuracy) is not None]
    if min_accuracy is not None:
        cands = [c for c in cands if c[2] >= min_accuracy]
    if not cands:
        return None

    def latency(c: tuple[results.Row, RealRecord, float]) -> float:
        return c[1].latency_ms if c[1].latency_ms is not None else c[0].latency_ms

    if mode == "latency" or (mode == "pareto" and min_accuracy is not None):
        chosen = min(cands, key=lambda c: (latency(c), -c[2], c[0].number))
    else:
        chosen = max(cands, key=lambda c: (c[2], -latency(c), -c[0].number))
    return chosen[0], chosen[1]
