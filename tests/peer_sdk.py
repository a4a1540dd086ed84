"""The official SDK (``osmosis-ai``) in a venv of its own, for tests that run its code against ours.

osmosis-ai needs Python 3.12+ and pins packages our extras conflict with (``openai-agents``), so
it never goes into our environment: ``sdk_venv("0.3.2")`` makes, or reuses, a venv holding
``osmosis-ai[server]==0.3.2`` under ``~/.cache/osmosis-rollout-tests/`` (``$XDG_CACHE_HOME``, or
``OSMOSIS_ROLLOUT_TEST_CACHE``) and returns its folder; ``python_of(venv)`` is its interpreter.
The interpreter is the first Python 3.12+ found: ``OSMOSIS_ROLLOUT_TEST_PYTHON``, this one, each
of pyenv's versions (newest first), ``python3.12`` to ``python3.14`` on the ``PATH``. Without one,
or when the package index cannot be reached, the test skips saying why (and fails under
``TESTS_REQUIRE_PROGRAMS=1``, CI's setting: see programs.py).

A lock file keeps two test processes (or two helpers' suites) from building the same venv at
once; a venv is used only once its ``.ready`` file says it was built completely.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from .programs import skip_or_fail

__all__ = ["cache_dir", "find_python", "python_of", "sdk_venv"]

#: The oldest Python osmosis-ai 0.3 runs on.
MINIMUM = (3, 12)
#: pip's time to install the SDK from the index (the first run only).
INSTALL_TIMEOUT_S = 900


def cache_dir() -> Path:
    """Where the venvs are kept between runs."""
    chosen = os.environ.get("OSMOSIS_ROLLOUT_TEST_CACHE")
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "osmosis-rollout-tests"


def python_of(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _version_of(python: str) -> tuple[int, int] | None:
    """The interpreter's (major, minor) if it runs and has venv, else None."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys, venv; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _pyenv_pythons() -> list[str]:
    root = os.environ.get("PYENV_ROOT")
    if not root and shutil.which("pyenv"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = subprocess.run(
                ["pyenv", "root"], capture_output=True, text=True, timeout=30, check=False
            )
            root = done.stdout.strip() if done.returncode == 0 else None
    folder = Path(root or Path.home() / ".pyenv") / "versions"
    if not folder.is_dir():
        return []

    def key(path: Path) -> tuple[int, ...]:
        return tuple(int(p) if p.isdigit() else -1 for p in path.name.split("."))

    versions = sorted((p for p in folder.iterdir() if p.name[:1].isdigit()), key=key)
    return [str(p / "bin" / "python3") for p in reversed(versions)]


def find_python() -> str | None:
    """The first Python 3.12+ that runs here (see the module docstring), or None."""
    candidates = [os.environ.get("OSMOSIS_ROLLOUT_TEST_PYTHON", "")]
    if sys.version_info >= MINIMUM:  # this one's own interpreter, not a (throwaway) venv's
        candidates.append(getattr(sys, "_base_executable", sys.executable))
    candidates += _pyenv_pythons()
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (12, 13, 14)]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            found = _version_of(candidate)
            if found is not None and found >= MINIMUM:
                return candidate
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sdk_venv(version: str, *, extras: Sequence[str] = ("server",)) -> Path:
    """A venv holding ``osmosis-ai[extras]==version``, made once and reused; skips without a
    Python 3.12+ or the package (see the module docstring)."""
    python = find_python()
    if python is None:
        skip_or_fail(
            "no Python 3.12+ found (osmosis-ai needs one): install it (pyenv install 3.12) or "
            "point OSMOSIS_ROLLOUT_TEST_PYTHON at one"
        )
        raise AssertionError("unreachable")  # skip_or_fail raises
    wanted = f"[{','.join(extras)}]" if extras else ""
    requirement = f"osmosis-ai{wanted}=={version}"
    # Keyed by the interpreter itself (symlinks resolved), so each CI run's fresh venv and
    # pyenv's python3 share one cached SDK venv instead of building one each.
    real = os.path.realpath(python)
    tag = hashlib.sha256(f"{requirement} {real}".encode()).hexdigest()[:10]
    venv = cache_dir() / f"osmosis-ai-{version}-{tag}"
    ready = venv / ".ready"
    with _locked(cache_dir() / f"{venv.name}.lock"):
        if ready.is_file() and python_of(venv).exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a build that stopped half way
        problem = _build(python, venv, requirement)
        if problem is not None:
            shutil.rmtree(venv, ignore_errors=True)
            skip_or_fail(f"cannot install {requirement} into a venv of {python}: {problem}")
        ready.write_text(f"{requirement}\n{python}\n")
    return venv


def _build(python: str, venv: Path, requirement: str) -> str | None:
    """Make the venv and install ``requirement``; the problem's last lines, or None."""
    steps = [
        [python, "-m", "venv", str(venv)],
        [str(python_of(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         requirement],
    ]  # fmt: skip
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        if done.returncode != 0:
            lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            return " / ".join(lines[-3:]) or f"exit {done.returncode}"
    return None
