"""``docs/architecture.md`` is the truth about the layout, so what it claims is checked here.

- its layout block names every module under ``src/osmosis_rollout/`` and names none that is gone;
- "only ``cli`` decides exit codes": nothing outside ``cli/`` ends the process, except the entry
  points of child processes, which end their own process and never the command's;
- its "Public API" section names modules that exist, and the docs import only from those;
- every file the page names exists.

"Imports point one way" (and the arrows under "Who imports whom") is ``tests/test_imports.py``'s,
over the import graph, not here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "osmosis_rollout"
DOC = ROOT / "docs" / "architecture.md"
TREE_ROOT = "src/osmosis_rollout/"

#: The only places outside ``cli/`` that end a process: each is the entry point of a child
#: process (a ``--workers`` server process, a ``--jobs`` worker) and ends that child only.
CHILD_ENTRY_POINTS = {
    ("server/workers.py", "_child_main"),
    ("evaluation/worker.py", "worker_main"),
    ("evaluation/worker.py", "_exit_with_parent"),
}


def _section(title: str) -> str:
    """The text of ``## title`` up to the next ``## `` heading."""
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@dataclass
class Layout:
    """What the layout block names: ``path -> line`` (of the doc) for each module and folder."""

    named: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)  # the entry line of each package


def _layout() -> Layout:
    """Parse the ``src/osmosis_rollout/`` tree of the layout block.

    An entry is a name at the start of a line, indented two spaces per level of folder. In an
    entry's description, a ``name.py`` or ``name/`` is a module of the entry's folder (of the
    package for ``pkg/``, beside it for ``module.py``), or else of a ``sub/`` folder the entry
    named before it (``wire/ (v1.py, v2.py)``); ``a/b.py`` too, or else the one of that path from
    the root (``validator/sync.py`` named in the ``compat/`` entry). A name in backticks is text,
    not a module (```main.py``` of a template)."""
    lines = DOC.read_text().splitlines()
    heading = lines.index("## Layout")
    start = next(i for i in range(heading, len(lines)) if lines[i].strip() == TREE_ROOT)
    layout = Layout()
    stack: list[str] = []  # the folders of the entry being read, relative to the package
    subfolders: list[str] = []  # the sub/ folders the entry's description has named so far
    for number, line in enumerate(lines[start + 1 :], start=start + 2):  # numbered from 1
        if line.startswith("```"):
            break
        if line.strip() and not line.startswith(" "):
            break  # templates/, examples/...: outside the package
        entry = re.match(r"^( +)(\S+)(?:\s|$)", line)
        depth = len(entry.group(1)) // 2 if entry else 0
        if entry and len(entry.group(1)) == 2 * depth and depth <= len(stack) + 1:
            name = entry.group(2)
            stack = stack[: depth - 1]
            path = "/".join([*stack, name])
            layout.named.setdefault(path, number)
            if name.endswith("/"):
                stack.append(name.rstrip("/"))
                layout.entries[path] = number
            line = line[len(entry.group(0)) :]
            subfolders = []
        folder = "".join(f"{part}/" for part in stack)
        for word in re.findall(r'(?<![\w./`"-])(_?[a-z]\w*(?:/\w+)*(?:\.py|/))(?![\w/])', line):
            if word.endswith("/") and "/" in word[:-1]:
                continue  # a/b/ is not a folder's name (``openai_client/openai_base_url/``)
            path = folder + word
            if not (PACKAGE / path).exists():
                nested = [folder + sub + word for sub in reversed(subfolders)]
                found = [p for p in nested if (PACKAGE / p).exists()]
                if found:
                    path = found[0]
                elif "/" in word.rstrip("/") and (PACKAGE / word).exists():
                    path = word  # named from the root
            if word.endswith("/"):
                subfolders.append(word)
            layout.named.setdefault(path, number)
    return layout


def _modules() -> list[str]:
    """Every module and package folder under ``src/osmosis_rollout/``, as the layout names them
    (``server/wire/``, ``server/wire/v1.py``; a package's ``__init__.py`` is its folder)."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py" and relative.parent != Path():
            found.append(relative.parent.as_posix() + "/")
        else:
            found.append(relative.as_posix())
    return found


def _where_to_add(module: str, layout: Layout) -> str:
    parent = module.rstrip("/").rpartition("/")[0]
    name = module.rstrip("/").rpartition("/")[2] + ("/" if module.endswith("/") else "")
    if not parent:
        return f"add a line `  {name:<18}what it owns` under `{TREE_ROOT}`"
    line = layout.entries.get(parent + "/")
    at = f" (docs/architecture.md line {line})" if line else ""
    return f"add `{name} (what it owns)` to the description of the `{parent}/` entry{at}"


def test_the_layout_block_names_every_module() -> None:
    """A module added without a line in the layout is a layout the doc no longer describes."""
    layout = _layout()
    missing = [module for module in _modules() if module not in layout.named]
    assert not missing, "docs/architecture.md's layout block does not name:\n" + "\n".join(
        f"  {TREE_ROOT}{module}: {_where_to_add(module, layout)}" for module in missing
    )


def test_every_module_the_layout_names_exists() -> None:
    """A module moved or merged away leaves no line behind that describes it."""
    existing = set(_modules())
    folders = {p.relative_to(PACKAGE).as_posix() + "/" for p in PACKAGE.rglob("*") if p.is_dir()}
    gone = {
        path: line
        for path, line in _layout().named.items()
        if path not in existing and path not in folders
    }
    assert not gone, "docs/architecture.md's layout block names what is not there:\n" + "\n".join(
        f"  {TREE_ROOT}{path} (docs/architecture.md line {line}): drop it or name where it moved"
        for path, line in gone.items()
    )


def test_what_the_layout_names_beside_the_package_exists() -> None:
    """``templates/``, ``examples/...``, ``benchmarks/``, ``tests/`` and the files their
    descriptions name (``tests/``'s support modules, ``docs/benchmarks.md``)."""
    lines = DOC.read_text().splitlines()
    start = lines.index("## Layout")
    start = next(i for i in range(start, len(lines)) if lines[i].strip() == TREE_ROOT)
    folder, gone = "", []
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        if line.startswith("```"):
            break
        if line.startswith(" ") and not folder:
            continue  # still the package's tree
        entry = re.match(r"^(\S+/)\s", line)
        if entry:
            folder = entry.group(1)
            if not (ROOT / folder).is_dir():
                gone.append(f"  {folder} (docs/architecture.md line {number})")
            line = line[len(entry.group(1)) :]
        for word in re.findall(r'(?<![\w./`"<-])([a-z_][\w/]*(?:\.py|\.md|/))(?![\w/])', line):
            if "osmosis_rollout/" in word:
                continue  # a path inside the wheel
            if not ((ROOT / folder / word).exists() or (ROOT / word).exists()):
                gone.append(f"  {folder}{word} (docs/architecture.md line {number})")
    assert not gone, "docs/architecture.md's layout block names what is not there:\n" + "\n".join(
        gone
    )


def test_every_file_the_page_names_exists() -> None:
    """A ```path.py``` in the page's prose (``server/app.py``, ``tests/test_docs.py``, or
    ``wire/control.py`` within ``server/``) is a file of the repository or of the package; a
    line that says ``(new)`` names files a change would add (the newcomer tasks' tables)."""
    package_files = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")]
    prose = re.sub(r"```.*?```", "", DOC.read_text(), flags=re.S)  # the layout has its own test
    lines = [line for line in prose.splitlines() if "(new)" not in line]
    named = set(re.findall(r"`([\w/]+\.py)`", "\n".join(lines)))
    gone = sorted(
        name
        for name in named
        if not (ROOT / name).exists()
        and not any(path == name or path.endswith(f"/{name}") for path in package_files)
    )
    assert not gone, f"docs/architecture.md names files that are not there: {gone}"


def test_the_layout_parser_reads_entries_and_descriptions() -> None:
    """The parser's own rules, on names the block is known to hold."""
    named = _layout().named
    for path in ("__init__.py", "agent.py", "server/", "server/wire/", "server/wire/v2.py"):
        assert path in named, path
    assert "server/scheduler.py" in named  # named in the server/ entry's description
    assert "endpoint/translate.py" in named


def _process_enders(tree: ast.Module) -> list[tuple[int, str, str]]:
    """``(line, what, enclosing top-level function)`` of each call or raise that ends the
    process: ``sys.exit``, ``os._exit``, ``exit``/``quit``, ``raise SystemExit``, ``typer.Exit``
    or click's ``Exit``; and each import of typer or click (the CLI's own libraries)."""
    found: list[tuple[int, str, str]] = []

    def name_of(node: ast.expr) -> str:
        if isinstance(node, ast.Call):
            node = node.func
        return ast.unparse(node)

    for top in tree.body:
        where = top.name if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) else ""
        for node in ast.walk(top):
            if isinstance(node, ast.Call):
                called = name_of(node.func)
                if called in {"sys.exit", "os._exit", "exit", "quit"}:
                    found.append((node.lineno, called, where))
            elif isinstance(node, ast.Raise) and node.exc is not None:
                raised = name_of(node.exc)
                if raised.rpartition(".")[2] in {"SystemExit", "Exit", "Abort"}:
                    found.append((node.lineno, f"raise {raised}", where))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names]
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else names
                if any(m.split(".")[0] in {"typer", "click"} for m in modules):
                    found.append((node.lineno, f"import {', '.join(modules)}", where))
    return found


def test_only_cli_decides_exit_codes() -> None:
    """Outside ``cli/`` a result carries its exit code (``TestReport.exit_code``) and the
    command exits with it; nothing else ends the process or imports the CLI's libraries."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith("cli/") or module == "__main__.py":
            continue
        for line, what, where in _process_enders(ast.parse(path.read_text())):
            if (module, where) not in CHILD_ENTRY_POINTS:
                offenders.append(f"  src/osmosis_rollout/{module}:{line}: {what}")
    assert not offenders, (
        "only cli/ decides exit codes (docs/architecture.md): return the code, or raise an "
        "OsmosisError the command turns into one; a child process's entry point belongs in "
        "CHILD_ENTRY_POINTS:\n" + "\n".join(offenders)
    )


def test_the_exit_code_rule_sees_an_exit() -> None:
    """The checker finds each way of ending a process (so an empty list means something)."""
    source = (
        "import sys, os\nimport typer\n"
        "def f():\n    sys.exit(2)\n"
        "def g():\n    raise SystemExit(1)\n"
        "def h():\n    raise typer.Exit(code=1)\n"
        "def i():\n    os._exit(3)\n"
    )
    found = [(what, where) for _, what, where in _process_enders(ast.parse(source))]
    assert found == [
        ("import typer", ""),
        ("sys.exit", "f"),
        ("raise SystemExit", "g"),
        ("raise typer.Exit", "h"),
        ("os._exit", "i"),
    ]


def _public_modules() -> list[str]:
    """The dotted modules the "Public API" section lists (``osmosis_rollout.testing``...)."""
    return re.findall(r"`(osmosis_rollout(?:\.[a-z_]+)*)`", _section("Public API"))


def test_the_public_api_section_names_modules_with_an_all() -> None:
    """Each public module exists and says what it exports."""
    import importlib

    public = _public_modules()
    assert "osmosis_rollout" in public
    assert "osmosis_rollout.compat" in public
    for name in public:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda page: page.name)
def test_the_docs_import_only_the_public_api(page: Path) -> None:
    """A page that teaches an import of an internal module teaches what may change."""
    public = set(_public_modules())
    imported = re.findall(r"^\s*from (osmosis_rollout[\w.]*) import", page.read_text(), re.M)
    internal = sorted({name for name in imported if name not in public})
    assert not internal, (
        f"{page.name} imports from {internal}: import from a public module, or list the module "
        "under docs/architecture.md's 'Public API' (and its __init__ docstring)"
    )
