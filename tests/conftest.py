"""Shared fixtures (builders live in helpers.py so tests can import them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import REPO, write_tiny_project

from tuner.files import cache_dir
from tuner.toolchain.installed import ENV as TOOLCHAIN_ENV
from tuner.toolchain.installed import INSTALL_HINT, Toolchain, find_toolchain

# Found before the cache folder is isolated below: the real toolchain is where the user (or .ci/run)
# installed it. Its conversions are kept between test runs in their own folder of the user's cache
# (keyed by content: a second run converts only what changed), never in the user's own hb_runs.
REAL_TOOLCHAIN = find_toolchain()
HB_RUNS = os.environ.get("TUNER_TEST_HB_RUNS") or str(cache_dir() / "hb_runs-tests")


@pytest.fixture(scope="session")
def hb_toolchain() -> Toolchain:
    """The real hb_mapper toolchain. Absent: the test is skipped, except under CI, where .ci/run
    installs it and its absence is a failure."""
    if REAL_TOOLCHAIN is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the fidelity tests, but no toolchain was found: {INSTALL_HINT}")
        pytest.skip(f"the real hb_mapper toolchain is not installed: {INSTALL_HINT}")
    return REAL_TOOLCHAIN


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests get their own statistics cache, so they never see (or fill) a user's cache.

    Session-scoped, so module-scoped fixtures (set up before function-scoped ones) see it too.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        if REAL_TOOLCHAIN is not None:
            mp.setenv(TOOLCHAIN_ENV, str(REAL_TOOLCHAIN.root))
        mp.setenv("TUNER_HB_RUNS", HB_RUNS)
        # subprocesses (python -m tuner, the stand-in hb_mapper) import this checkout's tuner, not
        # whichever one the environment has installed (an editable install of another worktree)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        yield


@pytest.fixture
def tiny_project(tmp_path) -> Path:
    return write_tiny_project(tmp_path / "tiny")
