"""What a simulator needs of the data: the evaluation samples and the float model's outputs on them, the
labels and task metrics they are scored with, the calibration statistics and their scale tables, and the
calibration samples ``default`` and ``mix`` compare their methods on. A new data set builds this side only
(the model side, :class:`~tuner.simulate.simmodel.SimModel`, is shared)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.calib.stats import TensorStats
from tuner.calib.thresholds import ThresholdMemo
from tuner.inputs.data import DataSet
from tuner.inputs.model import LoadedModel
from tuner.metrics import Similarity
from tuner.metrics.task import LabelSet, MetricSpec, TaskScore, load_user_metrics
from tuner.runtime.session import make_session, run_samples
from tuner.simulate.calibrate import DEFAULT_SEARCH_SAMPLES

#: Evaluation inputs up to this size stay in memory after set-up (beyond it they are streamed from disk).
SAMPLE_CACHE_BYTES = 512 * 2**20

Samples = list[dict[str, np.ndarray]]
#: Requantized evaluation sets kept (SimData.board_samples): one per input threshold a study meets
#: (a handful of calibration methods), each the size of the image inputs.
BOARD_SETS = 4


@dataclass(frozen=True)
class InputPathSplit:
    """The input path alone (SimData.path_split): per output metrics and task metrics of the float model
    fed the path's values against the float model on float mean/scale; ``reference`` its outputs per
    sample (what the network alone is scored against), ``ref_sq`` their square sums."""

    outputs: dict[str, dict[str, float]]
    task: dict[str, float]
    reference: Samples
    ref_sq: list[dict[str, float]]


class SimData:
    """The data side of a simulator. ``data`` is the evaluation set (the samples in memory once read,
    when they fit SAMPLE_CACHE_BYTES); ``reference`` the float model's outputs on it. ``calibration_data``
    is where ``default`` and ``mix`` choose their methods, as hb_mapper does (on the calibration set,
    docs/hb_rules/quantizer.md §2.2): only its first ``DEFAULT_SEARCH_SAMPLES`` samples are read, once, when a search first
    needs them. Without it (None) the first evaluation sample stands in."""

    def __init__(self, model: LoadedModel, stats: dict[str, TensorStats], data: DataSet, threads: int | None = None,
                 thresholds: ThresholdMemo | None = None, task_metrics: list[MetricSpec] | None = None,
                 labels: LabelSet | None = None, user_base: Path | None = None,
                 calibration_data: DataSet | None = None):
        self.model = model
        self.stats = stats
        self.thresholds = thresholds or ThresholdMemo(stats)
        self.data: DataSet | Samples = data
        self.dataset = data       # the files (``data`` may become the samples in memory)
        self.threads = threads  # samples run in parallel (each session single-threaded)
        self.task_metrics = list(task_metrics or [])   # tuner.metrics.task.MetricSpec
        self.labels = labels                           # tuner.metrics.task.LabelSet or None
        self.user_fns = load_user_metrics(self.task_metrics, user_base)
        self.calibration_data = calibration_data
        self._search: tuple[Samples, Samples] | None = None   # (samples, float outputs) of the method searches
        self._path: InputPathSplit | None = None    # the input path alone (path_split), computed once
        self._boards: dict[tuple[tuple[str, float, float], ...], Samples] = {}     # board_samples, by input thresholds
        t0 = time.perf_counter()
        self.reference: Samples = []
        self._labels: Samples | None = None
        self._read_reference(data, labels)
        self._ref_sq = [{o: Similarity.square_sum(v) for o, v in ref.items()} for ref in self.reference]
        self.float_seconds = time.perf_counter() - t0

    def _read_reference(self, data: DataSet, labels: LabelSet | None) -> None:
        """One float pass over ``data``: the reference outputs, and the samples with their labels kept in
        memory (when they fit SAMPLE_CACHE_BYTES) so that each evaluation does not read, check and
        preprocess every file again: 7.5 ms of a 125 ms evaluation on the example model."""
        float_session = make_session(self.model.proto)
        names = self.model.output_names
        samples: Samples | None = []
        self._labels = [] if labels is not None else None
        room = SAMPLE_CACHE_BYTES
        # an image input_type_rt: the reference is the float model on the float mean/scale, the samples
        # what the board's input path gives (tuner.inputs.inputpath), so the error includes the input path
        path = data.has_input_path
        boards = iter(data) if path else None
        for i, (sample, outs) in enumerate(run_samples(float_session, names, data.float_samples() if path else data,
                                                        self.threads, with_inputs=True)):
            if boards is not None:
                sample = next(boards)
            self.reference.append(dict(zip(names, outs)))
            if samples is not None:
                room -= sum(v.nbytes for v in sample.values())
                label = labels.sample(i) if labels is not None and room >= 0 else {}
                room -= sum(v.nbytes for v in label.values())
                if room >= 0:
                    samples.append(sample)
                    if self._labels is not None:
                        self._labels.append(label)
                else:
                    samples = self._labels = None
        if samples is not None:
            self.data = samples

    @property
    def has_input_path(self) -> bool:
        return self.dataset.has_input_path

    def path_split(self) -> InputPathSplit | None:
        """The input path alone, for data with an image ``input_type_rt`` (None otherwise): the float
        model fed what the board's path gives (colour conversion, 4:2:0, int8 preprocess weights),
        scored against the float model on the float mean/scale (``reference``). Its outputs are the
        reference of "the network alone" (the quantized network against the float one fed the same
        path values: today's per-node reference). One float pass, the first time it is asked for
        (``tuner eval`` and the report; a search never calls it)."""
        if not self.has_input_path:
            return None
        if self._path is None:
            session = make_session(self.model.proto)
            names = self.model.output_names
            outs = [dict(zip(names, o)) for o in run_samples(session, names, self.data, self.threads)]
            metrics, task, _ = self.score(outs)
            self._path = InputPathSplit(outputs=metrics, task=task, reference=outs,
                                        ref_sq=[{o: Similarity.square_sum(v) for o, v in r.items()} for r in outs])
        return self._path

    def board_samples(self, steps: dict[str, tuple[float, np.floating]]) -> Iterable[dict[str, np.ndarray]]:
        """The evaluation samples with each image input as hb's quantized preprocess node emits it for the
        given (threshold, float32 step) of that input (InputPath.requantize: its half step and multiplier
        rounded, then a floor), not as the simulator's half-to-even rounding would give it. ``steps``: input
        name -> (threshold, step) of the inputs to requantize. In memory: computed once per set of steps
        (the last BOARD_SETS kept), so a trial at a threshold seen before costs nothing more."""
        paths = {spec.name: spec.path for spec in self.dataset.inputs
                 if spec.path is not None and spec.name in steps}
        if not paths or self.dataset.calibration:
            return self.data

        def board(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {k: paths[k].requantize(v, *steps[k]) if k in paths else v for k, v in sample.items()}

        if not isinstance(self.data, list):
            return _Mapped(self.data, board)
        key = tuple(sorted((k, float(t), float(s)) for k, (t, s) in steps.items() if k in paths))
        if key not in self._boards:
            if len(self._boards) >= BOARD_SETS:
                self._boards.pop(next(iter(self._boards)))
            self._boards[key] = [board(x) for x in self.data]
        return self._boards[key]

    def ref_sq(self, i: int, output: str) -> float:
        """Sample ``i``'s reference square sum at ``output`` (computed once)."""
        return self._ref_sq[i][output]

    def search_set(self) -> tuple[Samples, Samples]:
        """(samples, float outputs) the method searches score on: the first DEFAULT_SEARCH_SAMPLES
        calibration samples (only those are read), else the first evaluation sample."""
        if self._search is None:
            if self.calibration_data is not None:
                samples = list(itertools.islice(iter(self.calibration_data), DEFAULT_SEARCH_SAMPLES))
            else:
                samples = [next(iter(self.data))]
            session = make_session(self.model.proto)
            names = self.model.output_names
            refs = [dict(zip(names, session.run(names, x))) for x in samples]
            self._search = (samples, refs)
        return self._search

    def task_score(self) -> TaskScore | None:
        return TaskScore(self.task_metrics, self.user_fns) if self.task_metrics else None

    def label(self, i: int) -> dict[str, np.ndarray] | None:
        """Sample ``i``'s labels: from memory when set-up kept them (fresh copies, as a read gives:
        a user metric may write into its labels), else read again."""
        if self._labels is not None:
            return {k: v.copy() for k, v in self._labels[i].items()}
        return self.labels.sample(i) if self.labels is not None else None

    def float_task(self) -> dict[str, float]:
        """The task metrics of the float model itself on this data (against the labels where there
        are any; a metric relative to float output scores float as exact): what relative
        constraints (``miou:seg >= 0.99 x float``) scale."""
        task = self.task_score()
        if task is None:
            return {}
        for i, ref in enumerate(self.reference):
            task.update(ref, {o: ref[o].copy() for o in self.model.output_names}, self.label(i))
        return task.results()

    def score(self, outputs: list[dict[str, np.ndarray]]
              ) -> tuple[dict[str, dict[str, float]], dict[str, float], list[dict[str, dict[str, float]]]]:
        """Another model's outputs on this data (sample i of ``outputs`` is sample i of the data), scored
        as the simulator scores its own: per output metrics pooled over the samples, the task metrics,
        and the per-sample metrics."""
        if len(outputs) != len(self.reference):
            raise ValueError(f"{len(outputs)} sample(s) of outputs for {len(self.reference)} sample(s) of data")
        names = self.model.output_names
        sims = {o: Similarity() for o in names}
        task = self.task_score()
        samples = []
        for i, values in enumerate(outputs):
            missing = [o for o in names if o not in values]
            if missing:
                raise ValueError(f"the outputs lack {', '.join(missing)} (they have {', '.join(values)})")
            got = {o: np.asarray(values[o], dtype=np.float32).reshape(self.reference[i][o].shape) for o in names}
            one = {o: Similarity() for o in names}
            for o in names:
                one[o].update(self.reference[i][o], got[o], self._ref_sq[i][o])
                sims[o].merge(one[o])
            samples.append({o: s.as_dict() for o, s in one.items()})
            if task is not None:
                task.update(self.reference[i], got, self.label(i))
        return {o: s.as_dict() for o, s in sims.items()}, (task.results() if task is not None else {}), samples


@dataclass(frozen=True)
class _Mapped:
    """A streamed data set with ``fn`` applied to each sample as it is read."""

    data: DataSet
    fn: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self.fn(x) for x in self.data)
