"""The one way tests run the ``tuner`` command.

``tuner(*args)`` runs ``tuner.cli.main`` in the test's own process (no interpreter start-up, no
re-import of onnxruntime and Optuna: about 2.5 s a call on the CI machine) and returns what a
subprocess would: the exit code, stdout and stderr. ``process=True`` runs ``python -m tuner`` as a
real process instead, for a test that needs one: the exit code as the shell sees it, output a
library writes outside ``sys.stdout`` / ``sys.stderr`` (a log handler, a compiler's warning, a
child process), state that lives once per process (the fused kernel's first build, signal
handlers), or a module that promises a real subprocess. ``start_tuner`` starts one in the
background (signals, several workers at once).

``env`` is added to the environment (it does not replace it); ``cwd`` is the folder the command
runs in (the test's own by default).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

Args = str | os.PathLike[str] | int | float


def _argv(args: tuple[Args, ...]) -> list[str]:
    return [str(a) for a in args]


def _env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if env is None else {**os.environ, **env}


def tuner(*args: Args, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
          timeout: float = 900, process: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``tuner ARGS``; the result has ``returncode``, ``stdout`` and ``stderr`` (text)."""
    argv = _argv(args)
    if process:
        return subprocess.run([sys.executable, "-m", "tuner", *argv], capture_output=True, text=True, cwd=cwd,
                              env=_env(env), timeout=timeout)
    return _in_process(argv, cwd, env)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """A refused command's one line: asserts exit code 2 and no traceback, returns stderr's last line."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, (result.returncode, result.stderr)
    return result.stderr.strip().splitlines()[-1]


def start_tuner(*args: Args, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                **popen: Any) -> subprocess.Popen[str]:
    """``python -m tuner ARGS`` started in the background; stdout and stderr are pipes unless given."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    return subprocess.Popen([sys.executable, "-m", "tuner", *_argv(args)], cwd=cwd, env=_env(env), **popen)


def _in_process(argv: list[str], cwd: str | Path | None,
                env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    import optuna

    from tuner.cli import main

    out, err = io.StringIO(), io.StringIO()
    # what the command changes for the rest of its process, put back for the next test
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    verbosity = optuna.logging.get_verbosity()
    try:
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for key, value in (env or {}).items():
                mp.setenv(key, value)
            if cwd is not None:
                mp.chdir(cwd)
            try:
                code = main(argv)
            except SystemExit as exc:   # argparse: --help, --version, a usage error (exit code 2)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        optuna.logging.set_verbosity(verbosity)
    return subprocess.CompletedProcess(["tuner", *argv], code, out.getvalue(), err.getvalue())
