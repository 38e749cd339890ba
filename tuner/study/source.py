"""What report.html is drawn from during a search, as values: :class:`ReportSource` (the
problem, the scorer, the tracker's outcome and the simplest fix) gathers the page's
:class:`~tuner.study.results.ReportSnapshot`, :class:`Page` renders and writes it. The
:class:`~tuner.study.outputs.ReportFile` holds these, never the session."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna

from tuner.candidate import Candidate
from tuner.export.hb_yaml import write_atomic
from tuner.study import results
from tuner.study.minimal import MinimalFix
from tuner.study.outcome import Tracker
from tuner.study.outputs import snapshot
from tuner.study.problem import Place, Problem
from tuner.study.results import ReportSnapshot, Trace
from tuner.study.scorer import Scorer
from tuner.study.warmstart import reference_calibration


@dataclass(frozen=True)
class ReportSource:
    """The report's view of a study searched in this process: ``source(study, full)``."""

    problem: Problem
    place: Place
    scorer: Scorer
    tracker: Tracker
    minimal: MinimalFix

    def __call__(self, study: optuna.Study, full: bool = True) -> ReportSnapshot:
        """``full``: with the per-node traces, evaluated on the simulator when not cached; else
        (mid-run, the trial loop is using the simulator) only the traces already cached, and the
        page says where the others are drawn."""
        skipped = 0

        def draw(rs: list[results.Row], best: results.Row | None) -> list[Trace]:
            nonlocal skipped
            drawn, skipped = self.draw_traces(rs, full, best)
            return drawn

        snap = snapshot(study, self.place.paths, self.place.where(), self.problem.sensitivity, draw,
                        found=self.tracker.stored_outcome(study))
        if not full and snap.rows and skipped:
            snap.notes.append("the per-node error along the graph is drawn at the end of the search and by "
                              f"'tuner report {self.place.name}' (it needs the simulator, which the search is using)")
        snap.simplest = self.minimal.last
        return snap

    def trace_candidates(self, rs: list[results.Row],
                         best: results.Row | None = None) -> list[tuple[str, int | None, Candidate]]:
        """(label, trial, candidate) of the per-node traces: the exported trial (``best``, default the
        best by the eval figure) and the all-int8 baseline."""
        want: list[tuple[str, int | None, Candidate]] = []
        o = self.problem.objectives
        best = best if best is not None else results.best(rs, o.mode, o.floor)
        if best is not None:
            want.append((f"trial {best.number} (exported)", best.number, best.trial_record.candidate))
        base = [r for r in rs if r.plan and r.plan.startswith("baseline")]
        if base:
            b = max(base, key=lambda r: (r.accuracy, -r.number))
            want.append((f"best all-BPU int8 baseline ({b.calibration}, trial {b.number})", b.number,
                         b.trial_record.candidate))
        else:
            r = self.problem.resolved
            ref = r.candidate(r.params_for(reference_calibration(self.problem.space, r.base)))
            want.append(("all-BPU int8 baseline", None, ref))
        return want

    def draw_traces(self, rs: list[results.Row], evaluate: bool = True,
                    best: results.Row | None = None) -> tuple[list[Trace], int]:
        """Per-node cosine along the graph for the exported trial (``best``: best.yaml's, when the
        caller knows it) and the all-int8 baseline (two evaluations with every node's output;
        cached by the scorer, so a rewrite that does not change the best costs nothing), and how
        many were skipped as not cached. ``evaluate=False``: only the cached ones."""
        out, skipped = [], 0
        for label, number, cand in self.trace_candidates(rs, best):
            ev = self.scorer.per_node(cand, evaluate)
            if ev is None:
                skipped += 1
                continue
            out.append(Trace.from_evaluation(label, number, ev))
        return out, skipped


@dataclass(frozen=True)
class Page:
    """Renders a snapshot (``render``: the caller's, else :func:`tuner.report.html.render`) to ``path``."""

    path: Path
    render: Callable[[ReportSnapshot], str]

    def __call__(self, snap: ReportSnapshot) -> Path:
        write_atomic(self.path, self.render(snap))
        return self.path


def warn(text: str) -> None:
    """A report's warning, on stderr."""
    print(text, file=sys.stderr)
