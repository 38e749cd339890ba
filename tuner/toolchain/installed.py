"""The real RDK X5 toolchain, found where the user installed it (never shipped with tuner).

hb_mapper 1.24.3 (PyPI ``rdkx5-yolo-mapper``), its quantizer hmct 1.1.0 (``dg-nn-toolkit``,
importable as ``horizon_nn``) and the compiler hbdk 3.49.15 (``dgdk``) install from PyPI into a
Python 3.10 venv (they do not import on 3.11) and run on an x86 CPU without a board. Their code is
proprietary: tuner only runs them as separate programs (``tuner toolchain install`` builds the
venv with the packaged ``install_hb_toolchain.sh``; :mod:`tuner.toolchain.hbrun` runs
``hb_mapper makertbin`` in it, :mod:`tuner.toolchain.hbexec` its model executor).

Where: ``$TUNER_HB_TOOLCHAIN`` (a venv folder), else ``<cache>/hb-toolchain-1.24.3`` under
tuner's cache folder (``$TUNER_CACHE_DIR``, default ``~/.cache/tuner``). The versions are read
from the installed packages' version files (instant); :meth:`Toolchain.check` runs
``hb_mapper --version`` (about 7 s) to prove the venv runs.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.files import cache_dir

ENV = "TUNER_HB_TOOLCHAIN"
DEFAULT_NAME = "hb-toolchain-1.24.3"
#: The versions tuner's rules were checked against (reference: the X5 model zoo's July-2025 logs).
PINNED = {"hb_mapper": "1.24.3", "hmct": "1.1.0", "hbdk": "3.49.15"}
#: Package -> the file holding its ``__version__`` (relative to site-packages).
_VERSION_FILES = {"hb_mapper": "horizon_tc_ui/version.py", "hmct": "hmct/version.py", "hbdk": "hbdk/__init__.py"}
_VERSION_RE = re.compile(r"""^__version__\s*=\s*r?["']([^"']+)["']""", re.M)

INSTALL_HINT = ("install it with 'tuner toolchain install' (a Python 3.10 venv of about 6 GB, 3 GB download, "
                "about 5 minutes), or point TUNER_HB_TOOLCHAIN at a venv that has hb_mapper")


def default_dir() -> Path:
    return cache_dir() / DEFAULT_NAME


def toolchain_dir() -> Path:
    """Where tuner looks: ``$TUNER_HB_TOOLCHAIN``, else the default under the cache folder."""
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else default_dir()


def install_script() -> Path:
    """The install script shipped in the package (pins only; no vendor code)."""
    return Path(__file__).with_name("install_hb_toolchain.sh")


@dataclass(frozen=True)
class Toolchain:
    """An installed toolchain: its venv, interpreter and the versions of its three parts."""

    root: Path
    python: Path
    versions: dict[str, str]

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def hb_mapper(self) -> Path:
        return self.bin / "hb_mapper"

    @property
    def fingerprint(self) -> str:
        """What a cached result of this toolchain is keyed by: the three versions."""
        return ",".join(f"{k}={self.versions.get(k, '?')}" for k in sorted(PINNED))

    def env(self) -> dict[str, str]:
        """The environment its programs run in: its bin first on PATH (hb_mapper calls hbdk-config and
        hbdk-cc by name), no PYTHONPATH/PYTHONHOME of tuner's interpreter, one thread pool per process."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def differs_from_pinned(self) -> list[str]:
        return [f"{k} {self.versions.get(k, '?')} (tuner's rules were checked against {v})"
                for k, v in PINNED.items() if self.versions.get(k) != v]

    def check(self, timeout: float = 120) -> str:
        """Run ``hb_mapper --version``; its first line, or a TunerError saying what failed."""
        try:
            res = subprocess.run([str(self.hb_mapper), "--version"], env=self.env(), capture_output=True,
                                 text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TunerError(f"{self.hb_mapper}: does not run ({exc}); reinstall: {INSTALL_HINT}") from None
        out = (res.stdout + res.stderr).strip().splitlines()
        if res.returncode != 0 or not out:
            raise TunerError(f"{self.hb_mapper} --version failed (exit {res.returncode}): "
                             f"{out[-1] if out else 'no output'}; reinstall: {INSTALL_HINT}")
        return next((line for line in out if "version" in line), out[-1])


def _site_packages(root: Path) -> Path | None:
    for lib in ("lib", "lib64"):
        for sp in sorted((root / lib).glob("python3*/site-packages")):
            return sp
    return None


def read_versions(site_packages: Path) -> dict[str, str]:
    out = {}
    for name, rel in _VERSION_FILES.items():
        try:
            m = _VERSION_RE.search((site_packages / rel).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if m:
            out[name] = m.group(1)
    return out


def find_toolchain(root: Path | None = None) -> Toolchain | None:
    """The toolchain in ``root`` (default :func:`toolchain_dir`), or None when it is not there."""
    root = Path(root) if root is not None else toolchain_dir()
    python = root / "bin" / "python"
    if not (root / "bin" / "hb_mapper").is_file() or not python.exists():
        return None
    sp = _site_packages(root)
    if sp is None:
        return None
    versions = read_versions(sp)
    if "hb_mapper" not in versions or "hmct" not in versions:
        return None
    return Toolchain(root=root.resolve(), python=python, versions=versions)


def require_toolchain(root: Path | None = None) -> Toolchain:
    """The toolchain, or one line saying where tuner looked and how to install it."""
    tc = find_toolchain(root)
    if tc is None:
        where = Path(root) if root is not None else toolchain_dir()
        raise TunerError(f"no hb_mapper toolchain in {where}: {INSTALL_HINT}")
    return tc
