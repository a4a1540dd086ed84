"""loader: target parsing, importing files and modules, and one clear error per failure kind."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis_rollout import RolloutAgentLoop
from osmosis_rollout.errors import AgentLoadError
from osmosis_rollout.loader import (
    error_location,
    find_source,
    frame_location,
    load_agent,
    load_target,
    parse_target,
)

from .support import ASSETS, line_of

GOOD = f"{ASSETS / 'val_good.py'}:GoodAgent"

AGENT_SOURCE = """
from osmosis_rollout import RolloutAgentLoop
{imports}

class Agent(RolloutAgentLoop):
    name = "tmp"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete([])
"""


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Run in tmp_path with sys.path and sys.modules restored afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path / "unused"))  # snapshots sys.path for undo
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def load_error(target: str) -> AgentLoadError:
    with pytest.raises(AgentLoadError) as info:
        load_agent(target)
    return info.value


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("agent.py:MyAgent", ("agent.py", "MyAgent")),
        ("pkg.module:Attr", ("pkg.module", "Attr")),
        ("dir/sub/agent.py:obj.attr", ("dir/sub/agent.py", "obj.attr")),
        ("C:\\agents\\agent.py:MyAgent", ("C:\\agents\\agent.py", "MyAgent")),
    ],
)
def test_parse_target_splits_module_and_attr(target: str, expected: tuple[str, str]) -> None:
    """Files, modules, dotted attributes and Windows paths split at the last colon."""
    assert parse_target(target) == expected


@pytest.mark.parametrize(
    "target", ["agent.py", "MyAgent", ":MyAgent", "agent.py:", "pkg-mod:A", "a.py:1bad", "a:b:c-d"]
)
def test_parse_target_rejects_bad_format(target: str) -> None:
    """A malformed target says which format is expected, with an example."""
    with pytest.raises(
        AgentLoadError, match=r"MODULE:ATTR or FILE\.py:ATTR, e\.g\. agent\.py"
    ) as e:
        parse_target(target)
    assert e.value.code == "TARGET_INVALID"


def test_load_target_imports_file_under_unique_names() -> None:
    """Each load of a file gets a fresh module with its own name, and reports the file."""
    first = load_target(GOOD)
    second = load_target(GOOD)
    assert first.file == ASSETS / "val_good.py"
    assert first.attr == "GoodAgent"
    assert first.module_name != second.module_name
    assert first.obj is not second.obj
    assert first.obj.name == "good"


def test_load_agent_instantiates_classes_and_keeps_instances() -> None:
    """A class is instantiated with no arguments; an instance is returned as it is."""
    from_class = load_agent(GOOD)
    loaded = load_target(f"{ASSETS / 'val_good.py'}:good_instance")
    assert isinstance(from_class, RolloutAgentLoop)
    assert type(from_class).__name__ == "GoodAgent"
    assert load_agent(f"{ASSETS / 'val_good.py'}:good_instance").name == "good"
    assert isinstance(loaded.obj, RolloutAgentLoop)


def test_file_targets_can_import_their_siblings(isolated: Path) -> None:
    """The file's directory goes on sys.path first, so `from helpers import x` works."""
    folder = isolated / "project"
    folder.mkdir()
    (folder / "osmosis_sibling_helpers.py").write_text("GREETING = 'hi'\n")
    (folder / "agent.py").write_text(
        AGENT_SOURCE.format(imports="from osmosis_sibling_helpers import GREETING")
    )
    agent = load_agent("project/agent.py:Agent")
    assert agent.name == "tmp"


def test_module_targets_import_from_the_current_directory(isolated: Path) -> None:
    """`pkg.module:Attr` is found relative to the working directory."""
    package = isolated / "osmosis_loader_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text(AGENT_SOURCE.format(imports=""))
    loaded = load_target("osmosis_loader_pkg.agents:Agent")
    assert loaded.module_name == "osmosis_loader_pkg.agents"
    assert loaded.file == package / "agents.py"


def test_missing_file_is_file_not_found() -> None:
    """A path that does not exist is named, with where it was looked for."""
    error = load_error("no/such/agent.py:Agent")
    assert error.code == "FILE_NOT_FOUND"
    assert "file not found: no/such/agent.py" in str(error)


def test_missing_module_is_module_not_found(isolated: Path) -> None:
    """A module that does not exist is reported as such, with how to fix it."""
    error = load_error("osmosis_no_such_module.agents:Agent")
    assert error.code == "MODULE_NOT_FOUND"
    assert "module 'osmosis_no_such_module.agents' not found" in str(error)


def test_missing_dependency_names_the_import_not_the_module(isolated: Path) -> None:
    """A failing import inside an existing module names that import and its file:line."""
    package = isolated / "osmosis_dep_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text("\n\nimport osmosis_absent_dependency\n")
    error = load_error("osmosis_dep_pkg.agents:Agent")
    assert error.code == "IMPORT_FAILED"
    assert "'osmosis_absent_dependency'" in str(error)
    assert error.location == "osmosis_dep_pkg/agents.py:3"


def test_missing_dependency_in_a_file() -> None:
    """The same holds for file targets: the missing package and the line of its import."""
    path = ASSETS / "val_import_failed.py"
    error = load_error(f"{path}:NeedsDependencyAgent")
    assert error.code == "IMPORT_FAILED"
    assert "imports 'osmosis_validate_missing_dependency'" in str(error)
    assert error.location is not None
    assert error.location.endswith(f"val_import_failed.py:{line_of(path, '<- IMPORT_FAILED')}")


def test_module_that_raises_reports_type_message_and_line() -> None:
    """An exception during import shows its type, message and the line that raised."""
    path = ASSETS / "val_module_raised.py"
    error = load_error(f"{path}:ConfiguredAgent")
    assert error.code == "MODULE_RAISED"
    assert "raised KeyError while being imported" in str(error)
    assert "'model_path'" in str(error)
    assert error.location is not None
    assert error.location.endswith(f"val_module_raised.py:{line_of(path, '<- MODULE_RAISED')}")


def test_syntax_error_is_located(isolated: Path) -> None:
    """A syntax error names the file and line."""
    (isolated / "broken.py").write_text("x = 1\ndef run(:\n")
    error = load_error("broken.py:Agent")
    assert error.code == "SYNTAX_ERROR"
    assert error.location == "broken.py:2"


def test_missing_attribute_suggests_close_names() -> None:
    """A misspelt class name gets a did-you-mean from difflib."""
    error = load_error(f"{ASSETS / 'val_good.py'}:GoodAgnet")
    assert error.code == "AGENT_NOT_FOUND"
    assert "has no attribute 'GoodAgnet'; did you mean GoodAgent" in str(error)


def test_missing_attribute_lists_the_agents_there() -> None:
    """Without a close match, the agents defined in the module are listed."""
    error = load_error(f"{ASSETS / 'val_good.py'}:Zebra")
    assert "agents defined there: GoodAgent" in str(error)


def test_the_agents_listed_are_the_modules_not_our_bases(isolated: Path) -> None:
    """A v1 module imports ``osmosis_rollout.compat``'s RolloutAgentLoop: only its own agent is
    listed, not that base class."""
    (isolated / "v1_agent.py").write_text(
        "from osmosis_rollout.compat import RolloutAgentLoop\n\n"
        "class MyAgent(RolloutAgentLoop):\n"
        '    name = "mine"\n\n'
        "    def get_tools(self, request):\n"
        "        return []\n\n"
        "    async def run(self, ctx):\n"
        "        return ctx.complete([])\n"
    )
    listed = str(load_error("v1_agent.py:Zebra")).partition("agents defined there: ")[2]
    assert listed == "MyAgent"


def test_object_that_is_not_an_agent() -> None:
    """Anything but a RolloutAgentLoop subclass or instance is refused by name."""
    error = load_error(f"{ASSETS / 'val_not_subclass.py'}:PlainAgent")
    assert error.code == "NOT_A_SUBCLASS"
    assert "PlainAgent is not a RolloutAgentLoop subclass or instance" in str(error)


def test_abstract_agent_names_the_missing_methods() -> None:
    """A class without run() cannot be created; the error says which methods are missing."""
    error = load_error(f"{ASSETS / 'val_run_missing.py'}:RunlessAgent")
    assert error.code == "AGENT_ABSTRACT"
    assert "does not define run" in str(error)


def test_failing_constructor_is_init_failed() -> None:
    """A constructor that needs arguments is reported with the exception it raised."""
    path = ASSETS / "val_init_failed.py"
    error = load_error(f"{path}:NeedsArgsAgent")
    assert error.code == "INIT_FAILED"
    assert "NeedsArgsAgent() failed with TypeError" in str(error)
    assert error.location is not None
    assert error.location.endswith(f"val_init_failed.py:{line_of(path, 'class NeedsArgsAgent')}")


def test_find_source_does_not_run_package_code(isolated: Path) -> None:
    """find_source locates a module's file without executing its package's __init__."""
    package = isolated / "osmosis_boom_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (package / "agents.py").write_text("")
    assert find_source("osmosis_boom_pkg.agents") == package / "agents.py"
    assert "osmosis_boom_pkg" not in sys.modules
    assert find_source("osmosis_boom_pkg.missing") is None


@pytest.mark.parametrize(
    "imports", ["from .helpers import VALUE", "from osmosis_rel_pkg.helpers import VALUE"]
)
def test_a_file_inside_a_package_imports_as_its_dotted_module(isolated: Path, imports: str) -> None:
    """Like fastapi-cli: pkg/agent.py is imported as pkg.agent, so relative and absolute imports
    of its own package both work (they used to fail: "relative import", "not installed")."""
    package = isolated / "osmosis_rel_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("VALUE = 1\n")
    (package / "agent.py").write_text(AGENT_SOURCE.format(imports=imports))
    loaded = load_target("osmosis_rel_pkg/agent.py:Agent")
    assert loaded.module_name == "osmosis_rel_pkg.agent"
    assert loaded.file == Path("osmosis_rel_pkg/agent.py")
    assert isinstance(loaded.obj(), RolloutAgentLoop)


def test_a_nested_package_file_is_found_from_anywhere(isolated: Path) -> None:
    """The top package's parent goes on sys.path, wherever the command runs."""
    sub = isolated / "src" / "osmosis_nest_pkg" / "agents"
    sub.mkdir(parents=True)
    (sub.parent / "__init__.py").write_text("")
    (sub / "__init__.py").write_text("")
    (sub.parent / "tools.py").write_text("VALUE = 1\n")
    (sub / "main.py").write_text(AGENT_SOURCE.format(imports="from ..tools import VALUE"))
    elsewhere = isolated / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)
    loaded = load_target("../src/osmosis_nest_pkg/agents/main.py:Agent")
    assert loaded.module_name == "osmosis_nest_pkg.agents.main"


def test_a_package_file_shadowed_by_an_imported_package_is_one_clear_error(
    isolated: Path,
) -> None:
    """A file in ./json/ (say) cannot import as json.x when the stdlib json is loaded."""
    package = isolated / "osmosis_twin_pkg"
    for folder in (isolated / "a" / package.name, isolated / "b" / package.name):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        (folder / "agent.py").write_text(AGENT_SOURCE.format(imports=""))
    load_target(f"a/{package.name}/agent.py:Agent")
    error = load_error(f"b/{package.name}/agent.py:Agent")
    assert error.code == "IMPORT_FAILED"
    assert "but another 'osmosis_twin_pkg' is already imported (from a/osmosis_twin_pkg)" in str(
        error
    )


def test_error_location_is_the_users_call_not_the_stdlib_or_a_library() -> None:
    """A traceback ending in json/decoder.py is located at this file's call into json."""
    import json

    try:
        json.loads("not json")  # <- THE CALL
    except ValueError as exc:
        where = error_location(exc.__traceback__)
    assert where == f"tests/test_loader.py:{line_of(Path(__file__), '<- THE CALL')}"


def test_frame_location_skips_site_packages_and_falls_back_to_the_innermost() -> None:
    """Project frames win over site-packages ones; with none, the innermost frame not ours."""
    library = "/venv/lib/python3.11/site-packages/requests/adapters.py"
    assert frame_location([("/proj/agent.py", 12), (library, 729)]) == "/proj/agent.py:12"
    assert frame_location([(library, 700), (library, 729)]) == f"{library}:729"
    assert frame_location([("<string>", 1)]) is None
