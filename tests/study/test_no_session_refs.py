"""What a search hands out holds values, not the session (issue 24): the result files, the
report, the outcome, the exporter, the simplest fix and the end-of-search hooks of a real
small search are walked attribute by attribute (``vars()``, closures, bound methods,
partials, containers); none reaches the :class:`StudySession`."""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np
import pytest
from helpers import write_tiny_space

from tuner.study.loop import run
from tuner.study.opening import AtFinish
from tuner.study.session import StudySession

#: Leaves: nothing below them can hold a session.
LEAVES = (str, bytes, int, float, bool, complex, type(None), np.ndarray, np.generic, type, types.ModuleType)


def path_to_session(root: object, name: str) -> str | None:
    """The attribute path from ``root`` to a StudySession, or None when there is none."""
    seen: set[int] = set()
    todo: list[tuple[object, str]] = [(root, name)]
    while todo:
        obj, where = todo.pop()
        if isinstance(obj, StudySession):
            return where
        if isinstance(obj, LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if type(obj).__module__.split(".")[0] in ("onnx", "onnxruntime", "google", "threading", "_thread"):
            continue
        kids: list[tuple[object, str]] = []
        if isinstance(obj, types.MethodType):
            kids.append((obj.__self__, f"{where}.__self__"))
            kids.append((obj.__func__, f"{where}.__func__"))
        elif isinstance(obj, types.FunctionType):
            kids += [(c.cell_contents, f"{where}.<closure {n}>")
                     for n, c in zip(obj.__code__.co_freevars, obj.__closure__ or ()) if _filled(c)]
            kids += [(d, f"{where}.<default>") for d in obj.__defaults__ or ()]
        elif isinstance(obj, functools.partial):
            kids += [(obj.func, f"{where}.func")] + [(a, f"{where}.<arg>") for a in obj.args]
            kids += [(v, f"{where}.{k}") for k, v in obj.keywords.items()]
        elif isinstance(obj, dict):
            kids += [(v, f"{where}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            kids += [(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        else:
            try:
                kids += [(v, f"{where}.{k}") for k, v in vars(obj).items()]
            except TypeError:       # no __dict__: slots, builtins
                kids += [(getattr(obj, k), f"{where}.{k}") for k in getattr(type(obj), "__slots__", ())
                         if hasattr(obj, k)]
        todo += kids
    return None


def _filled(cell: Any) -> bool:
    """Whether a closure cell holds a value yet."""
    try:
        return cell.cell_contents is not cell
    except ValueError:
        return False


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    root = tmp_path_factory.mktemp("refs")
    search = StudySession.open(write_tiny_space(root), results_dir=root / "results", quiet=True)
    study, _ = run(search, n_trials=6, timeout=None, jobs=1, seed=1, progress=False)
    return search, study


def test_the_objects_a_search_returns_hold_no_session(searched):
    search, study = searched
    assert search.result_files.outcome is not None and search.minimal.last is not None   # all of them were used
    handed_out = {"outputs": search.outputs(), "result files": search.result_files, "report file": search.report_file,
                  "tracker": search.tracker, "outcome": search.tracker.stored_outcome(study),
                  "exporter": search.exporter, "minimal fix": search.minimal, "validator": search.validator,
                  "report source": search.report_source, "scorer": search.scorer, "problem": search.problem}
    for name, obj in handed_out.items():
        assert path_to_session(obj, name) is None, f"{name} reaches the session: {path_to_session(obj, name)}"


def test_the_walk_finds_a_session_behind_a_closure_or_a_bound_method(searched):
    """The check above can fail: a hook made the old way (a closure over the session, or its bound
    method) is found, however deep."""
    search, _ = searched
    assert path_to_session(AtFinish(lambda st: search.minimal.write(st)), "hook") == "hook._finish.<closure search>"
    assert path_to_session([{"f": search.study}], "hooks") == "hooks[0]['f'].__self__"
