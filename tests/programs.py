"""Programs some tests need besides Python and pip, and the one way a test asks for them.

The README's ``python -m pytest`` must pass on a machine with only Python and pip: a test whose
program is missing skips, with a reason that names the program and how to install it. CI
installs every program (``.ci/run``) and sets ``TESTS_REQUIRE_PROGRAMS=1``, so there a missing
one fails the test instead of quietly skipping it.
"""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = [
    "INSTALL",
    "missing_reason",
    "require_program",
    "requires_all_programs",
    "skip_missing",
    "skip_or_fail",
]

#: How to install each program (Debian's package, as .ci/run does; Homebrew's on macOS).
INSTALL = {
    "redis-server": "apt-get install redis-server, or brew install redis",
    "chromium": "apt-get install chromium, or install Chrome",
    "openssl": "apt-get install openssl, or brew install openssl",
    "curl": "apt-get install curl, or brew install curl",
    "bwrap": "apt-get install bubblewrap (Linux only)",
    "prlimit": "apt-get install util-linux (Linux only)",
}


def requires_all_programs() -> bool:
    """CI's setting: every program is installed, so none may be missing."""
    return os.environ.get("TESTS_REQUIRE_PROGRAMS") == "1"


def missing_reason(program: str, *, what: str = "") -> str:
    """The skip reason for a missing ``program``: which one, and how to install it."""
    needed = f" (needed by {what})" if what else ""
    how = INSTALL.get(program, f"install {program}")
    return f"{program} is not installed{needed}: {how}; .ci/run installs it"


def skip_missing(program: str, *, what: str = "") -> None:
    """Skip the test for the missing ``program`` (fail it where CI requires every program)."""
    skip_or_fail(missing_reason(program, what=what))


def skip_or_fail(reason: str) -> None:
    """``pytest.skip(reason)``, or a failure where ``TESTS_REQUIRE_PROGRAMS=1`` (CI)."""
    if requires_all_programs():
        pytest.fail(f"{reason}; but TESTS_REQUIRE_PROGRAMS=1 says every program is installed")
    pytest.skip(reason)


def require_program(program: str, *alternatives: str) -> str:
    """The path of ``program`` (or of the first of ``alternatives`` found), else skip."""
    for name in (program, *alternatives):
        found = shutil.which(name)
        if found:
            return found
    skip_missing(program)
    raise AssertionError("unreachable")  # pytest.skip raises
