"""Check that each optional extra's lower bounds are versions that work: install every extra's
requirements at exactly their ``>=`` bound in a fresh venv and run the tests of that extra.

    python scripts/check_lower_bounds.py [--python python3.11] [--keep DIR]

Two venvs, because the extras' oldest versions cannot all share one (``mcp`` 2.1 needs a newer
``opentelemetry-api`` than the ``[otel]`` bound): ``ai`` (``openai``, ``agents``, ``mcp``) and
``data`` (``parquet``, ``otel``, ``redis``). Exit 0 when every group's tests pass. Run it after
raising or lowering a bound; the last run's versions are in CHANGELOG.md (issue 37).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Each group: its extras, the tests that exercise them, and packages the tests need pinned with
#: them (the OpenTelemetry SDK at the API's version).
GROUPS = {
    "ai": (
        ("openai", "agents", "mcp"),
        [
            "tests/test_openai_endpoint.py",
            "tests/test_openai_endpoint_listener.py",
            "tests/test_mcp_tools.py",
            "tests/test_templates_openai.py",
        ],
        [],
    ),
    "data": (
        ("parquet", "otel", "redis"),
        ["tests/test_datasets.py", "tests/test_telemetry.py", "tests/test_state.py"],
        ["opentelemetry-sdk=={otel}"],
    ),
}
#: What every group's tests need besides the extras (latest versions).
TEST_TOOLS = ["pytest", "hypothesis", "ruff", "trio"]
_BOUND = re.compile(r"^([A-Za-z0-9_.\[\]-]+?)(\[[^\]]*\])?>=([0-9][0-9A-Za-z.]*)$")


def pinned(extras: tuple[str, ...]) -> dict[str, str]:
    """``name -> oldest version`` for every requirement of ``extras`` in pyproject.toml."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found: dict[str, str] = {}
    for extra in extras:
        for requirement in table["optional-dependencies"][extra]:
            match = _BOUND.match(requirement.replace(" ", ""))
            if match is None:
                raise SystemExit(f"[{extra}] {requirement!r} has no plain >= bound to check")
            found[match[1] + (match[2] or "")] = match[3]
    return found


def run(command: list[str], **options: object) -> int:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=False, **options).returncode  # type: ignore[call-overload]


def check(name: str, python: str, root: Path) -> bool:
    extras, tests, extra_pins = GROUPS[name]
    versions = pinned(extras)
    plain = {re.sub(r"\[.*\]", "", k): v for k, v in versions.items()}
    pins = [f"{package}=={version}" for package, version in versions.items()]
    pins += [pin.format(**plain, otel=plain.get("opentelemetry-api", "")) for pin in extra_pins]
    venv = root / name
    if run([python, "-m", "venv", str(venv)]) != 0:
        return False
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if run([*pip, "-e", str(REPO), *TEST_TOOLS, *pins]) != 0:
        return False
    print(f"[{name}] at their bounds: {', '.join(pins)}", flush=True)
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return run([*command, *tests], cwd=REPO) == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the venvs' interpreter")
    parser.add_argument("--keep", type=Path, help="build the venvs here and keep them")
    parser.add_argument("groups", nargs="*", default=list(GROUPS), help=", ".join(GROUPS))
    args = parser.parse_args()
    unknown = sorted(set(args.groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown group {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    with tempfile.TemporaryDirectory(prefix="lower-bounds-") as scratch:
        root = args.keep or Path(scratch)
        failed = [name for name in args.groups if not check(name, args.python, root)]
    for name in args.groups:
        print(f"{name}: {'FAILED' if name in failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
