"""Shared fixtures (builders live in helpers.py so tests can import them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import REPO, write_tiny_project


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests get their own statistics cache, so they never see (or fill) a user's cache.

    Session-scoped, so module-scoped fixtures (set up before function-scoped ones) see it too.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        # subprocesses (python -m tuner, the stand-in hb_mapper) import this checkout's tuner, not
        # whichever one the environment has installed (an editable install of another worktree)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        yield


@pytest.fixture
def tiny_project(tmp_path) -> Path:
    return write_tiny_project(tmp_path / "tiny")
