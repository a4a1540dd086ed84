"""``osmosis doctor``: what is wrong with this machine and this project, before anything else.

Each :class:`Check` says ok, warn or fail, why in one line, and the fix. The checks never raise
for what they find and never print; the LLM key is reported as set or not, never shown, and a
URL is shown redacted (``server_url.redacted_url``).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from ._version import __version__
from .errors import OsmosisError

__all__ = ["PROGRAMS", "Check", "DoctorReport", "run_doctor"]

Status = Literal["ok", "warn", "fail"]

#: The optional programs: (name, the names it goes by, what needs it, how to install it).
PROGRAMS: Final = (
    (
        "redis-server",
        ("redis-server",),
        "several replicas sharing state (osmosis serve --state redis://...)",
        "apt-get install redis-server, or brew install redis",
    ),
    (
        "bwrap",
        ("bwrap",),
        "the sandbox template's run_python tool (bubblewrap, Linux only)",
        "apt-get install bubblewrap",
    ),
    (
        "chromium",
        ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"),
        "checking the pages of osmosis view in a headless browser",
        "apt-get install chromium, or install Chrome",
    ),
)
#: What is checked when the package's metadata cannot be read (a bare source tree).
_PACKAGES: Final = ("pydantic", "httpx2", "uvicorn", "starlette", "typer", "rich")
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")
_LLM_TIMEOUT_S: Final = 3.0


@dataclass(frozen=True)
class Check:
    """One check: its name, ok / warn / fail, a one-line reason, the fix, and facts as JSON."""

    name: str
    status: Status
    reason: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "fix": self.fix,
        }
        if self.details:
            data["details"] = self.details
        return data


@dataclass
class DoctorReport:
    """Every check, in the order they ran; ``ok`` is False when one failed."""

    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(check.status != "fail" for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"version": 1, "ok": self.ok, "checks": [c.as_dict() for c in self.checks]}


def _python() -> Check:
    version = platform.python_version()
    return Check(
        "python", "ok", f"Python {version} ({sys.executable})", details={"version": version}
    )


def _requirements() -> list[str]:
    """The names of osmosis-rollout's own dependencies (no extras'), from its metadata."""
    try:
        required = metadata.requires("osmosis-rollout") or []
    except metadata.PackageNotFoundError:
        return list(_PACKAGES)
    names = []
    for requirement in required:
        spec, _, marker = requirement.partition(";")
        match = _NAME.match(spec.strip())
        if match and "extra" not in marker:
            names.append(match.group(0))
    return names


def _packages() -> Check:
    """Every dependency installed: an install older than its pyproject (a new dependency not
    yet installed) fails here, not as an agent's import error later."""
    found: dict[str, str | None] = {"osmosis-rollout": __version__}
    for name in dict.fromkeys([*_requirements(), "openai"]):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    missing = [name for name, version in found.items() if version is None and name != "openai"]
    shown = ", ".join(f"{n} {v}" for n, v in found.items() if v)
    if missing:
        return Check(
            "packages",
            "fail",
            f"missing: {', '.join(missing)}",
            "pip install --upgrade osmosis-rollout (in a checkout: pip install -e .)",
            {"versions": found},
        )
    return Check("packages", "ok", shown, details={"versions": found})


def _project(cwd: Path, target: str | None) -> tuple[Check, str | None, Path]:
    from .project import find_project, workspace_rollouts

    try:
        project = find_project(cwd)
    except OsmosisError as exc:
        return Check("project", "fail", str(exc), "fix pyproject.toml"), None, cwd
    if project is not None:
        project.put_root_on_path()
    root = project.root if project is not None else cwd
    chosen = target or (project.agent_target(cwd) if project is not None else None)
    rollouts = workspace_rollouts(cwd) if chosen is None and project is None else []
    if rollouts:
        return (
            Check(
                "project",
                "warn",
                "a workspace's root: each agent project is a folder of rollouts/ "
                f"({', '.join(rollouts)})",
                f"cd rollouts/{rollouts[0]} && osmosis doctor",
            ),
            None,
            cwd,
        )
    if chosen is None:
        return (
            Check(
                "project",
                "warn",
                "no agent: no TARGET and no `agent` in [tool.osmosis] of a pyproject.toml",
                'set agent = "pkg.module:MyAgent" in [tool.osmosis], or osmosis init NAME',
            ),
            None,
            root,
        )
    where = str(project.pyproject) if project is not None else "the command line"
    return (
        Check("project", "ok", f"agent {chosen} (from {where})", details={"target": chosen}),
        chosen,
        root,
    )


def _agent_imports(target: str) -> Check:
    from .loader import load_target

    try:
        load_target(target)
    except OsmosisError as exc:
        return Check("agent", "fail", str(exc), "fix the import error, then osmosis validate")
    except Exception as exc:  # an agent's own import-time failure, whatever it raised
        message = f"{type(exc).__name__}: {exc}"
        return Check("agent", "fail", message, "fix the import error, then osmosis validate")
    return Check("agent", "ok", f"{target} imports")


async def _static(target: str) -> Check:
    from .validator import validate_agent_loop_async

    result = await validate_agent_loop_async(target, dry_run=False)
    codes = [p.code for p in result.errors]
    warnings = [p.code for p in result.warnings]
    details = {"errors": codes, "warnings": warnings}
    if codes:
        return Check(
            "validate",
            "fail",
            f"{len(codes)} error(s): {', '.join(codes)}",
            "osmosis validate --json shows each problem and its hint",
            details,
        )
    if warnings:
        return Check(
            "validate",
            "warn",
            f"{len(warnings)} warning(s): {', '.join(warnings)}",
            "osmosis validate --json shows each problem and its hint",
            details,
        )
    return Check("validate", "ok", "the static and tool checks pass (no dry run)", details=details)


def _dataset(root: Path, dataset: Path | None) -> Check:
    from .evaluation.datasets import read_dataset

    path = dataset or root / "dataset.jsonl"
    if not path.is_file():
        return Check(
            "dataset",
            "warn",
            f"no dataset at {path}",
            "give one with --dataset, or write dataset.jsonl (one JSON row per line)",
        )
    try:
        rows = read_dataset(path, limit=3).rows
    except OsmosisError as exc:
        return Check("dataset", "fail", str(exc), "fix the rows the message names")
    first = [
        _shorten({"row": row.number, "messages": row.messages, "ground_truth": row.ground_truth})
        for row in rows
    ]
    return Check(
        "dataset",
        "ok",
        f"{path}: the first {len(rows)} row(s) read",
        details={"path": str(path), "first_rows": first},
    )


def _shorten(value: Any, limit: int = 200) -> Any:
    """A row as shown: long strings cut, so a report stays small."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, dict):
        return {k: _shorten(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v, limit) for v in value[:20]]
    return value


def _programs() -> list[Check]:
    checks = []
    for name, names, needed_by, install in PROGRAMS:
        found = next((shutil.which(n) for n in names if shutil.which(n)), None)
        if found:
            checks.append(Check(name, "ok", f"{found}", details={"path": found}))
        else:
            checks.append(Check(name, "warn", f"not found; needed by {needed_by}", install))
    return checks


def _llm(environ: dict[str, str], llm_url: str | None) -> Check:
    from .server_url import redacted_url

    url = llm_url or environ.get("OPENAI_BASE_URL")
    key_set = bool(environ.get("OPENAI_API_KEY", "").strip())
    key = "OPENAI_API_KEY is set" if key_set else "OPENAI_API_KEY is not set"
    if not url:
        return Check(
            "llm",
            "ok",
            f"no LLM URL: osmosis test uses the built-in mock LLM ({key})",
            "for a real model: --llm-url URL, or OPENAI_BASE_URL",
            {"url": None, "key_set": key_set},
        )
    shown = redacted_url(url)
    details: dict[str, Any] = {"url": shown, "key_set": key_set}
    if not url.lower().startswith(("http://", "https://")):
        return Check(
            "llm",
            "fail",
            f"{shown} is not an http(s) URL",
            "give e.g. http://HOST:8000/v1",
            details,
        )
    request = urllib.request.Request(url.rstrip("/") + "/models", method="GET")
    if key_set:
        request.add_header("Authorization", f"Bearer {environ['OPENAI_API_KEY'].strip()}")
    try:
        with urllib.request.urlopen(request, timeout=_LLM_TIMEOUT_S) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check(
            "llm",
            "warn",
            f"{shown} is not reachable ({reason}; {key})",
            "start the model server, or fix --llm-url / OPENAI_BASE_URL",
            details,
        )
    details["status"] = status
    if status in (401, 403):
        return Check(
            "llm",
            "warn",
            f"{shown} refused the key (HTTP {status}; {key})",
            "set OPENAI_API_KEY to the server's key",
            details,
        )
    return Check("llm", "ok", f"{shown} answers (HTTP {status}; {key})", details=details)


def _port(root: Path, environ: dict[str, str]) -> Check:
    from .config import ServerSettings

    pyproject = root / "pyproject.toml"
    try:
        settings = ServerSettings.resolve(
            environ=environ, pyproject=pyproject if pyproject.is_file() else None
        )
    except OsmosisError as exc:
        return Check("port", "fail", str(exc), "fix [tool.osmosis.serve] or the OSMOSIS_* value")
    host, port = settings.host, settings.port
    details = {"host": host, "port": port}
    if port == 0:
        return Check("port", "ok", f"{host}: a free port is chosen at start", details=details)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return Check(
                "port",
                "warn",
                f"osmosis serve's {host}:{port} is taken or cannot be bound ({exc.strerror})",
                "stop what listens there, or osmosis serve --port N (or OSMOSIS_PORT)",
                details,
            )
    reason = f"osmosis serve would listen on {host}:{port} (free)"
    return Check("port", "ok", reason, details=details)


async def run_doctor(
    *,
    cwd: Path | None = None,
    target: str | None = None,
    dataset: Path | None = None,
    llm_url: str | None = None,
    environ: dict[str, str] | None = None,
) -> DoctorReport:
    """Run every check for the project around ``cwd`` (the current folder by default)."""
    here = (cwd or Path.cwd()).absolute()
    env = dict(os.environ if environ is None else environ)
    checks = [_python(), _packages()]
    project, chosen, root = _project(here, target)
    checks.append(project)
    if chosen is not None:
        imported = _agent_imports(chosen)
        checks.append(imported)
        if imported.status == "ok":
            checks.append(await _static(chosen))
    checks.append(_dataset(root, dataset))
    checks.extend(_programs())
    checks.append(_llm(env, llm_url))
    checks.append(_port(root, env))
    return DoctorReport(checks)
