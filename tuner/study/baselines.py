"""The usual manual recipes, run on the same simulator as the search, to compare against it.

* :func:`greedy_revert` -- how NNCF's accuracy control works: rank nodes by how much leaving
  them float helps, move them to the CPU one by one until the accuracy goal is met.
* :func:`staged_escalation` -- the public Horizon tuning recipe: all int8, then promote to int16
  (cumulatively) the nodes whose alone-quantized accuracy is below 0.99, 0.999, 0.9999, then
  move the remaining nodes to the CPU, most sensitive first, stopping as soon as the goal is met.

Both work on the decisions of a :class:`~tuner.study.space.ResolvedSpace` (one free node or one
tied group of repeated nodes each), so they change exactly what the search may change, and are
deterministic: ties in the ranking are broken by the decision's order in the graph. Decisions
whose hb_mapper default is the CPU are left alone (the recipes start from what hb_mapper does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.candidate import Calibration, Candidate, NodeSetting
from tuner.cost import CostModel
from tuner.errors import TunerError
from tuner.metrics.accuracy import accuracy
from tuner.sensitivity import everything_else_on_cpu
from tuner.simulate import Simulator
from tuner.study.space import Decision, ResolvedSpace

#: The int16 choices a promotion takes, best first (both sides int16 where the op allows it).
INT16_CHOICES = ("BPU:int16", "BPU:int16_input", "BPU:int16_output")
STAGES = (0.99, 0.999, 0.9999)


@dataclass(frozen=True)
class Goal:
    """What "accurate enough" means: the accuracy metric above a floor, and optionally task
    metrics (higher is better) above their own floors, e.g. top-1 within 1% of float."""

    metric: str = "mean_cosine"
    min_accuracy: float = 0.99
    task_floors: tuple[tuple[str, float], ...] = ()

    def met(self, acc: float, task: dict[str, float] | None = None) -> bool:
        if not (math.isfinite(acc) and acc >= self.min_accuracy):
            return False
        return all((task or {}).get(k, -math.inf) >= v for k, v in self.task_floors)

    def describe(self) -> str:
        parts = [f"{self.metric} >= {self.min_accuracy:.10g}"] + [f"{k} >= {v:.4f}" for k, v in self.task_floors]
        return " and ".join(parts)


@dataclass(frozen=True)
class Score:
    """One evaluated candidate: what the tables show."""

    candidate: Candidate
    accuracy: float
    task: dict[str, float]
    latency_ms: float
    counts: dict[str, int]
    calibration: str = ""     # the method simulated (``default`` resolves to one)


class Scorer:
    """Evaluates candidates on the simulator, each distinct one once, and counts them."""

    def __init__(self, simulator: Simulator, cost: CostModel, metric: str):
        self.simulator, self.cost, self.metric = simulator, cost, metric
        self._memo: dict[str, Score] = {}

    @property
    def evaluations(self) -> int:
        return len(self._memo)

    def __call__(self, candidate: Candidate) -> Score:
        key = candidate.key()
        if key not in self._memo:
            try:
                ev = self.simulator.evaluate(candidate)
            except FloatingPointError:  # non-finite outputs: never accurate enough
                plan = self.simulator.plan(candidate)
                self._memo[key] = Score(candidate, -math.inf, {}, self.cost.latency(plan).total_ms, {},
                                        candidate.calibration.describe())
                return self._memo[key]
            self._memo[key] = Score(candidate, accuracy(ev.outputs, self.metric, ev.task), dict(ev.task),
                                    self.cost.latency(ev.plan).total_ms, ev.counts(), ev.calibration.describe())
        return self._memo[key]


@dataclass
class BaselineResult:
    """The steps a recipe evaluated, in order, and where it stopped."""

    method: str
    steps: list[tuple[str, Score]] = field(default_factory=list)
    reached: bool = False
    sensitivity_evaluations: int = 0
    seconds: float = 0.0

    @property
    def final(self) -> Score | None:
        """The configuration the recipe hands over: the step that met the goal, else its last."""
        return self.steps[-1][1] if self.steps else None

    @property
    def evaluations(self) -> int:
        """Distinct candidates evaluated, the ranking's own evaluations included."""
        return len({s.candidate.key() for _, s in self.steps}) + self.sensitivity_evaluations


def _node_order(resolved: ResolvedSpace) -> dict[str, int]:
    return {n.name: i for i, n in enumerate(resolved.graph)}


def _decision_rank(resolved: ResolvedSpace, value: Callable[[Decision], float]) -> list[Decision]:
    """Decisions sorted by ``value`` (ascending), ties in graph order."""
    order = _node_order(resolved)
    return sorted(resolved.decisions, key=lambda d: (value(d), min(order[n] for n in d.nodes), d.param))


def _run_steps(resolved: ResolvedSpace, scorer: Scorer, goal: Goal, calibration: Calibration,
               result: BaselineResult, label: str, choices: dict[str, str]) -> bool:
    # with_calibration: the recipe's calibration even where the space does not list it
    score = scorer(resolved.candidate(resolved.params_for(calibration, choices)).with_calibration(calibration))
    result.steps.append((label, score))
    result.reached = goal.met(score.accuracy, score.task)
    return result.reached


def greedy_revert(resolved: ResolvedSpace, scorer: Scorer, goal: Goal, calibration: Calibration,
                  gains: dict[str, float], sensitivity_evaluations: int = 0) -> BaselineResult:
    """All int8 under ``calibration``; then, most helpful first (the nodes' sensitivity ``gains``, the
    largest of a tied group's nodes), one more decision on the CPU per step until ``goal`` is met."""
    t0 = time.perf_counter()
    result = BaselineResult("greedy revert", sensitivity_evaluations=sensitivity_evaluations)
    choices: dict[str, str] = {}
    if not _run_steps(resolved, scorer, goal, calibration, result, "all int8", choices):
        ranked = _decision_rank(resolved, lambda d: -max(gains.get(n, 0.0) for n in d.nodes))
        _cpu_one_by_one(resolved, scorer, goal, calibration, result, ranked, choices)
    result.seconds = time.perf_counter() - t0
    return result


def _cpu_one_by_one(resolved: ResolvedSpace, scorer: Scorer, goal: Goal, calibration: Calibration,
                    result: BaselineResult, ranked: list[Decision], choices: dict[str, str]) -> bool:
    """Both recipes' last resort: move decisions to the CPU in ``ranked`` order, one per step
    (keeping ``choices`` made so far), until ``goal`` is met. Decisions hb_mapper already puts
    on the CPU, or that cannot go there, are skipped. The recipe ends where the next step would leave
    no node on the BPU: hb_mapper refuses that configuration (tuner.simulate.plan.make_plan)."""
    for dec in ranked:
        if "CPU" not in dec.choices or dec.default_choice == "CPU":
            continue
        choices[dec.param] = "CPU"
        try:
            if _run_steps(resolved, scorer, goal, calibration, result, f"+CPU {dec.param}", choices):
                return True
        except TunerError:
            del choices[dec.param]
            return False
    return False


def alone_int8(simulator: Simulator, metric: str, calibration: Calibration, nodes: list[str],
               optimization: tuple[str, ...] = ()) -> dict[str, float]:
    """Accuracy with only this node quantized (int8 on the BPU, everything else float on the CPU):
    the per-node "sensitivity" the Horizon recipe thresholds. One evaluation per node."""
    all_cpu = everything_else_on_cpu(simulator.graph)
    out = {}
    for name in nodes:
        settings = dict(all_cpu)
        settings[name] = NodeSetting(on="BPU")
        try:
            ev = simulator.evaluate(Candidate.make(calibration, settings, optimization))
            out[name] = accuracy(ev.outputs, metric, ev.task)
        except FloatingPointError:
            out[name] = -math.inf
    return out


def staged_escalation(resolved: ResolvedSpace, scorer: Scorer, goal: Goal, calibration: Calibration,
                      alone: dict[str, float], stages: tuple[float, ...] = STAGES,
                      sensitivity_evaluations: int = 0) -> BaselineResult:
    """All int8; then, per stage threshold, promote every decision whose alone-int8 accuracy
    (``alone``, the lowest of a tied group's nodes) is below it to int16, keeping earlier
    promotions; then put decisions on the CPU one by one, most sensitive first. A stage that
    promotes nothing new is not evaluated. Stops at the first step meeting ``goal``."""
    t0 = time.perf_counter()
    result = BaselineResult("staged escalation", sensitivity_evaluations=sensitivity_evaluations)
    worst = {d.param: min(alone.get(n, 1.0) for n in d.nodes) for d in resolved.decisions}
    ranked = _decision_rank(resolved, lambda d: worst[d.param])
    choices: dict[str, str] = {}
    done = _run_steps(resolved, scorer, goal, calibration, result, "all int8", choices)
    for thr in stages:
        if done:
            break
        new = {}
        for dec in ranked:
            if worst[dec.param] < thr and dec.param not in choices and dec.default_choice != "CPU":
                want = next((c for c in INT16_CHOICES if c in dec.choices), None)
                if want is not None:
                    new[dec.param] = want
        if new:
            choices.update(new)
            done = _run_steps(resolved, scorer, goal, calibration, result, f"int16 below {thr:g} (+{len(new)})",
                              choices)
    if not done:
        _cpu_one_by_one(resolved, scorer, goal, calibration, result, ranked, choices)
    result.seconds = time.perf_counter() - t0
    return result


def all_int8(resolved: ResolvedSpace, scorer: Scorer, goal: Goal, calibration: Calibration) -> BaselineResult:
    """hb_mapper's defaults: every node BPU int8 under one calibration (one evaluation)."""
    t0 = time.perf_counter()
    result = BaselineResult(f"all int8, {calibration.describe()}")
    _run_steps(resolved, scorer, goal, calibration, result, "all int8", {})
    result.seconds = time.perf_counter() - t0
    return result


__all__ = ["Goal", "Score", "Scorer", "BaselineResult", "greedy_revert", "staged_escalation", "alone_int8", "all_int8",
           "STAGES"]
