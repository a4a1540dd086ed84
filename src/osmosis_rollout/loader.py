"""Load an agent from ``"pkg.module:Attr"`` or ``"path/to/file.py:Attr"``.

``serve``, ``test`` and ``validate`` all start here, so each way of failing gets its own
``AgentLoadError`` with a stable ``code`` and one sentence that says what to fix. Like uvicorn's
importer, a missing dependency *inside* the user's module is reported as that dependency (with the
``file:line`` of the import), never as "your module was not found".
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from .agent import RolloutAgentLoop
from .errors import AgentLoadError

__all__ = [
    "TARGET_CODES",
    "LoadedTarget",
    "agent_from_object",
    "class_location",
    "display_path",
    "error_location",
    "find_source",
    "frame_location",
    "is_file_target",
    "load_agent",
    "load_target",
    "parse_target",
]

#: Failure kinds that mean "the target itself is wrong" (the CLI exits 2 on them).
TARGET_CODES = frozenset(
    {"TARGET_INVALID", "FILE_NOT_FOUND", "MODULE_NOT_FOUND", "AGENT_NOT_FOUND"}
)

_FORMAT_HINT = "must be MODULE:ATTR or FILE.py:ATTR, e.g. agent.py:MyAgent"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PACKAGE_DIR = Path(__file__).resolve().parent
_counter = itertools.count(1)


@dataclass(frozen=True)
class LoadedTarget:
    """What a target string resolved to: the module, the attribute path and the object."""

    target: str
    module_name: str
    attr: str
    file: Path | None
    obj: Any


def is_file_target(module_or_path: str) -> bool:
    """True when the part before ``:`` names a file (``.py`` or a path) rather than a module."""
    return module_or_path.endswith(".py") or "/" in module_or_path or "\\" in module_or_path


def parse_target(target: str) -> tuple[str, str]:
    """Split ``"pkg.mod:Attr"`` / ``"dir/file.py:Attr"`` into (module-or-path, attr)."""
    module, sep, attr = target.strip().rpartition(":")
    valid_attr = bool(attr) and all(part.isidentifier() for part in attr.split("."))
    valid_module = bool(module) and (is_file_target(module) or bool(_MODULE_NAME.match(module)))
    if not (sep and valid_attr and valid_module):
        raise AgentLoadError(
            f"target {target!r} {_FORMAT_HINT}{_suggest_attr(target.strip(), sep)}",
            code="TARGET_INVALID",
        )
    return module, attr


def _suggest_attr(target: str, sep: str) -> str:
    """For ``pkg.mod`` or ``agent.py`` without ``:Attr``: the agents its source defines (read
    with ``ast``, nothing imported), e.g. "; did you mean pkg.mod:MyAgent?"."""
    if sep or not (is_file_target(target) or _MODULE_NAME.match(target)):
        return ""
    source = find_source(target)
    if source is None:
        return ""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return ""
    names = [
        node.name for node in tree.body if isinstance(node, ast.ClassDef) and _is_agent_class(node)
    ]
    if len(names) == 1:
        return f"; did you mean {target}:{names[0]}?"
    if names:
        return f"; agents defined there: {', '.join(names)}"
    return ""


def _is_agent_class(node: ast.ClassDef) -> bool:
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        if name == "RolloutAgentLoop":
            return True
    return False


def display_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it, for short messages."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def find_source(module_or_path: str) -> Path | None:
    """The ``.py`` file behind a target, found without importing (or executing) anything.

    Packages on the way are searched with ``PathFinder`` rather than imported, so a module
    target's ``__init__`` files do not run either. Returns None for built-in or compiled modules.
    """
    if is_file_target(module_or_path):
        path = Path(module_or_path)
        return path if path.is_file() else None
    _ensure_cwd_on_path()
    search: list[str] | None = None
    spec: importlib.machinery.ModuleSpec | None = None
    parts = module_or_path.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        spec = importlib.machinery.PathFinder.find_spec(name, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        return None
    return Path(origin)


def load_target(target: str) -> LoadedTarget:
    """Import the module (or file) of ``target`` and return the object it names."""
    module_or_path, attr = parse_target(target)
    if is_file_target(module_or_path):
        path = Path(module_or_path)
        if not path.is_file():
            raise AgentLoadError(
                f"file not found: {module_or_path} (looked in {Path.cwd()}); check the path "
                "in the target",
                code="FILE_NOT_FOUND",
            )
        package_module = _package_module(path)
        if package_module is None:
            module = _import_file(path)
        else:
            module = _import_package_file(path, *package_module)
        file: Path | None = path
        shown = module_or_path
    else:
        module = _import_module(module_or_path)
        origin = getattr(module, "__file__", None)
        file = Path(origin) if origin else None
        shown = f"module {module_or_path!r}"
    obj = _resolve_attr(module, attr, shown)
    return LoadedTarget(target, module.__name__, attr, file, obj)


def load_agent(target: str) -> RolloutAgentLoop:
    """Load ``target`` and return an agent: the instance itself, or the class instantiated."""
    return agent_from_object(load_target(target).obj, target.rpartition(":")[2])


def agent_from_object(obj: Any, label: str) -> RolloutAgentLoop:
    """An agent from a loaded object: an instance as is, a subclass instantiated with no args."""
    if isinstance(obj, RolloutAgentLoop):
        return obj
    if inspect.isroutine(obj):
        module = inspect.getmodule(obj)
        agents = _agent_names(module) if module is not None else []
        fix = (
            f"agents defined there: {', '.join(agents)}"
            if agents
            else "write `class MyAgent(RolloutAgentLoop)` with `async def run(self, ctx)` and "
            "name that class in the target"
        )
        raise AgentLoadError(
            f"{label} is a function, not an agent: the target must name a RolloutAgentLoop "
            f"subclass or instance; {fix}",
            code="NOT_A_SUBCLASS",
        )
    if not (isinstance(obj, type) and issubclass(obj, RolloutAgentLoop)):
        raise AgentLoadError(
            f"{label} is not a RolloutAgentLoop subclass or instance (it is "
            f"{_describe(obj)}); define `class {label}(RolloutAgentLoop)`",
            code="NOT_A_SUBCLASS",
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise AgentLoadError(
            f"{label} cannot be created: it does not define {missing}; every agent needs "
            "`get_tools(self, request)` and `async def run(self, ctx)`",
            code="AGENT_ABSTRACT",
            location=class_location(obj),
        )
    try:
        return obj()
    except Exception as exc:
        raise AgentLoadError(
            f"{label}() failed with {type(exc).__name__}: {exc}; an agent class must be "
            "creatable with no arguments (or point the target at an instance)",
            code="INIT_FAILED",
            location=error_location(exc.__traceback__) or class_location(obj),
        ) from None


# --------------------------------------------------------------------------------------------
# Importing
# --------------------------------------------------------------------------------------------


def _ensure_cwd_on_path() -> None:
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def _import_file(path: Path) -> ModuleType:
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # sibling imports (`from helpers import x`) must work
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_osmosis_agent_{stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AgentLoadError(f"{path} cannot be imported as Python code", code="IMPORT_FAILED")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if not isinstance(exc, Exception | SystemExit):
            raise
        raise _import_error(exc, str(path), module_name=None) from None
    return module


def _package_module(path: Path) -> tuple[str, Path] | None:
    """(dotted module name, folder above the top package) for a file inside package folders.

    Like fastapi-cli: walk up while the folder has an ``__init__.py``; the file then imports as
    ``pkg.sub.mod`` with the top package's parent on sys.path, so both absolute imports of its
    own package and relative imports work. None for a loose file or non-identifier names.
    """
    file = path.resolve()
    parts = [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1 or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts), folder


def _import_package_file(path: Path, name: str, base: Path) -> ModuleType:
    top = name.partition(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and base / top not in _package_dirs(loaded):
        where = ", ".join(display_path(p) for p in _package_dirs(loaded)) or "elsewhere"
        raise AgentLoadError(
            f"{path} belongs to the package {top!r} in {display_path(base)}, but another "
            f"{top!r} is already imported (from {where}); rename one of them",
            code="IMPORT_FAILED",
        )
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise _import_error(exc, str(path), module_name=name) from None


def _package_dirs(module: ModuleType) -> list[Path]:
    return [Path(p).resolve() for p in getattr(module, "__path__", [])]


def _import_module(name: str) -> ModuleType:
    _ensure_cwd_on_path()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            raise AgentLoadError(
                f"module {name!r} not found (No module named {exc.name!r}); run from the "
                "directory that contains it, install its package, or give a file path "
                "like agent.py:MyAgent",
                code="MODULE_NOT_FOUND",
            ) from None
        raise _import_error(exc, f"module {name!r}", module_name=name) from None
    except (Exception, SystemExit) as exc:
        raise _import_error(exc, f"module {name!r}", module_name=name) from None


def _import_error(exc: BaseException, shown: str, *, module_name: str | None) -> AgentLoadError:
    if isinstance(exc, SyntaxError):
        where = f"{display_path(Path(exc.filename))}:{exc.lineno}" if exc.filename else None
        return AgentLoadError(
            f"syntax error in {shown}{f' at {where}' if where else ''}: {exc.msg}",
            code="SYNTAX_ERROR",
            location=where,
        )
    where = error_location(exc.__traceback__)
    at = f" at {where}" if where else ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return AgentLoadError(
            f"{shown} imports {exc.name!r}{at}, which is not installed or not on sys.path; "
            "install it in this environment or fix the import",
            code="IMPORT_FAILED",
            location=where,
        )
    if isinstance(exc, ImportError):
        return AgentLoadError(
            f"an import in {shown} failed{at}: {exc}; fix the import or install what it needs",
            code="IMPORT_FAILED",
            location=where,
        )
    return AgentLoadError(
        f"{shown} raised {type(exc).__name__} while being imported{at}: {exc}",
        code="MODULE_RAISED",
        location=where,
    )


def error_location(tb: TracebackType | None) -> str | None:
    """``file:line`` of the innermost traceback frame in the user's project.

    Frames of the stdlib, of installed libraries and of this package are passed over: when
    ``requests`` raises inside ``run``, the line to fix is the user's call, not
    ``requests/adapters.py``. Without a project frame, the innermost frame not ours.
    """
    return frame_location([(frame.filename, frame.lineno) for frame in traceback.extract_tb(tb)])


def frame_location(frames: Sequence[tuple[str, int | None]]) -> str | None:
    """``file:line`` of the innermost of ``frames`` (outermost first) in the user's project,
    else of the innermost one that is neither this package's nor synthetic (``<string>``)."""
    fallback: str | None = None
    for filename, line in reversed(frames):
        if filename.startswith("<"):
            continue
        path = Path(filename).resolve()
        if _PACKAGE_DIR in path.parents:
            continue
        where = f"{display_path(Path(filename))}:{line}"
        if not _is_library(path):
            return where
        fallback = fallback or where
    return fallback


def _is_library(path: Path) -> bool:
    """``path`` is in the stdlib or an installed distribution (site-packages, dist-packages)."""
    if {"site-packages", "dist-packages"} & set(path.parts):
        return True
    return any(root in path.parents for root in _library_roots())


@functools.cache
def _library_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple({Path(paths[name]).resolve() for name in names if name in paths})


def class_location(cls: type) -> str | None:
    """``file:line`` where ``cls`` is defined, when its source can be found."""
    try:
        file = inspect.getsourcefile(cls)
        _, line = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    return f"{display_path(Path(file))}:{line}" if file else None


# --------------------------------------------------------------------------------------------
# Attributes
# --------------------------------------------------------------------------------------------


def _resolve_attr(module: ModuleType, attr: str, shown: str) -> Any:
    obj: Any = module
    owner = shown
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AgentLoadError(
                f"{owner} has no attribute {part!r}{_suggest(part, obj, module)}",
                code="AGENT_NOT_FOUND",
            ) from None
        owner = repr(part)
    return obj


def _suggest(name: str, owner: Any, module: ModuleType) -> str:
    names = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        return f"; did you mean {', '.join(close)}?"
    agents = _agent_names(module)
    if agents:
        return f"; agents defined there: {', '.join(agents)}"
    return "; it defines no RolloutAgentLoop subclass"


def _agent_names(module: ModuleType) -> list[str]:
    """The RolloutAgentLoop subclasses a module defines or imports, sorted."""
    return sorted(
        n
        for n, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, RolloutAgentLoop)
        and not value.__module__.startswith("osmosis_rollout.")  # our bases (compat's too)
        and value is not RolloutAgentLoop
    )


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    if inspect.ismodule(obj):
        return f"the module {obj.__name__}"
    return f"a {type(obj).__name__}"
