"""scaffold: names, templates, rendering, and writing a project all or nothing."""

from __future__ import annotations

import py_compile
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from osmosis_rollout.errors import ConfigError
from osmosis_rollout.scaffold import (
    DEFAULT_TEMPLATE,
    create_project,
    default_templates_dir,
    list_templates,
    project_names,
)

TEMPLATES = [info.name for info in list_templates()]
LEFTOVER = re.compile(r"__[A-Z][A-Z0-9_]*__")


def make_template(root: Path, name: str, files: dict[str, str | bytes]) -> Path:
    """A template folder under ``root`` with a description and the given files."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text(f'description = "The {name} template."\n')
    for relative, content in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def listing(folder: Path) -> list[str]:
    """Every path below ``folder``, relative, sorted: to compare a folder before and after."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "package", "class_name"),
    [
        ("my-agent", "my_agent", "MyAgent"),
        ("calc", "calc", "CalcAgent"),
        ("Math.Tools2", "math_tools2", "MathTools2Agent"),
        ("search_agent", "search_agent", "SearchAgent"),
        ("a", "a", "AAgent"),
    ],
)
def test_names_derive_package_and_class(name: str, package: str, class_name: str) -> None:
    """The dist name keeps its dashes; the package uses underscores; the class is CamelCase."""
    names = project_names(name)
    assert (names.project, names.package, names.class_name) == (name, package, class_name)
    assert names.target == f"{package}.agent:{class_name}"


@pytest.mark.parametrize(
    ("name", "reason", "suggestion"),
    [
        ("123abc", "start with a digit", "agent-123abc"),
        ("class", "keyword", "class-agent"),
        ("", "empty", "my-agent"),
        ("   ", "empty", "my-agent"),
        ("my agent", "only letters, digits", "my-agent"),
        ("-agent", "only letters, digits", "agent"),
        ("json", "standard library", "json-agent"),
        ("osmosis-rollout", "shadow a module the project needs", "osmosis-rollout-agent"),
        ("tests", "shadow a module the project needs", "tests-agent"),
        ("../evil", "only letters, digits", "evil"),
    ],
)
def test_bad_names_are_refused_with_a_suggestion(name: str, reason: str, suggestion: str) -> None:
    """A name that cannot be a Python package gets the reason and a name that works."""
    with pytest.raises(ConfigError) as info:
        project_names(name)
    message = str(info.value)
    assert reason in message
    assert f"try {suggestion!r}" in message
    project_names(suggestion)  # the suggestion itself is accepted


@given(st.text(max_size=20))
def test_every_suggestion_is_a_valid_name(name: str) -> None:
    """Whatever the input, it is accepted or the error suggests a name that is accepted."""
    try:
        project_names(name)
    except ConfigError as exc:
        suggestion = re.search(r"try '([^']+)'", str(exc))
        assert suggestion is not None
        project_names(suggestion.group(1))


# -- templates -------------------------------------------------------------------------------


def test_templates_are_listed_default_first() -> None:
    """tools (the default), minimal and a third template ship, each with a one-line summary."""
    infos = list_templates()
    assert infos[0].name == DEFAULT_TEMPLATE == "tools"
    assert {"tools", "minimal", "sandbox"} <= {info.name for info in infos}
    for info in infos:
        assert info.description
        assert "\n" not in info.description
        assert info.path.parent == default_templates_dir()


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_project_has_every_part_and_no_placeholder_left(tmp_path: Path, template: str) -> None:
    """Each template renders a complete project with the names filled in everywhere."""
    dest = tmp_path / "demo-agent"
    files = create_project(dest, name="demo-agent", template=template)

    relative = {f.relative_to(dest).as_posix() for f in files}
    assert {
        "pyproject.toml",
        "README.md",
        ".gitignore",
        "dataset.jsonl",
        "demo_agent/__init__.py",
        "demo_agent/agent.py",
    } <= relative
    assert any(r.startswith("tests/test_") for r in relative)
    assert "template.toml" not in relative
    folders = {
        parent.relative_to(dest).as_posix()
        for p in files
        for parent in p.parents
        if parent != dest and dest in parent.parents
    }
    assert sorted(listing(dest)) == sorted(relative | folders)
    for file in files:
        text = file.read_text(encoding="utf-8")
        assert not LEFTOVER.findall(text), f"{file} keeps a placeholder"
        if file.suffix == ".py":
            py_compile.compile(str(file), doraise=True, cfile=str(tmp_path / "check.pyc"))
    config = tomllib.loads((dest / "pyproject.toml").read_text())
    assert config["project"]["name"] == "demo-agent"
    assert any(d.startswith("osmosis-rollout") for d in config["project"]["dependencies"])
    assert config["tool"]["osmosis"]["agent"] == "demo_agent.agent:DemoAgent"
    assert config["tool"]["pytest"]["ini_options"]["pythonpath"] == ["."]
    readme = (dest / "README.md").read_text()
    for command in (
        "osmosis validate demo_agent.agent:DemoAgent",
        "osmosis test demo_agent.agent:DemoAgent --dataset dataset.jsonl",
        "osmosis serve",
    ):
        assert command in readme
    assert "class DemoAgent(RolloutAgentLoop)" in (dest / "demo_agent/agent.py").read_text()


@pytest.mark.parametrize("template", TEMPLATES)
def test_dataset_rows_carry_prompts_and_ground_truth(tmp_path: Path, template: str) -> None:
    """Every dataset row has a user prompt and the ground truth its reward is computed from."""
    import json

    create_project(tmp_path / "p", name="p", template=template)
    lines = (tmp_path / "p" / "dataset.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    assert len(rows) >= 3
    for row in rows:
        assert row["user_prompt"]
        assert row["ground_truth"]


# -- destination -----------------------------------------------------------------------------


def test_an_existing_non_empty_folder_is_refused(tmp_path: Path) -> None:
    """A folder with files in it is never written to, and its files stay as they were."""
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        create_project(dest, name="taken")
    assert listing(tmp_path) == ["taken", "taken/notes.txt"]
    assert (dest / "notes.txt").read_text() == "mine"


def test_an_existing_empty_folder_is_filled_in_place(tmp_path: Path) -> None:
    """An empty folder (say, the one the shell is in) is used as it is, not replaced."""
    dest = tmp_path / "here"
    dest.mkdir()
    inode = dest.stat().st_ino
    files = create_project(dest, name="here", template="minimal")
    assert dest.stat().st_ino == inode
    assert all(f.is_file() for f in files)
    assert listing(tmp_path)[0] == "here"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    """A file where the project folder should go is an error, not overwritten."""
    (tmp_path / "agent").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        create_project(tmp_path / "agent", name="agent")
    assert (tmp_path / "agent").read_text() == "x"


def test_a_missing_parent_folder_is_refused(tmp_path: Path) -> None:
    """The parent must exist: init creates one folder, not a chain of them."""
    with pytest.raises(ConfigError, match="does not exist"):
        create_project(tmp_path / "a" / "b", name="b")
    assert listing(tmp_path) == []


def test_an_unknown_template_lists_the_known_ones(tmp_path: Path) -> None:
    """A typo in the template name says which templates exist."""
    with pytest.raises(ConfigError, match=r"unknown template 'tool'; choose one of: tools"):
        create_project(tmp_path / "x", name="x", template="tool")
    assert listing(tmp_path) == []


def test_a_bad_name_writes_nothing(tmp_path: Path) -> None:
    """The name is checked before anything is written."""
    with pytest.raises(ConfigError):
        create_project(tmp_path / "x", name="class")
    assert listing(tmp_path) == []


# -- rendering and atomicity -----------------------------------------------------------------


def test_placeholders_are_replaced_in_names_and_contents(tmp_path: Path) -> None:
    """Folder names, file names and contents are all rendered; caches are not copied."""
    root = make_template(
        tmp_path / "templates",
        "custom",
        {
            "__PACKAGE__/__CLASS__.txt": "__PROJECT__ / __PACKAGE__ / __TARGET__ / __init__",
            "__PACKAGE__/__pycache__/agent.cpython-311.pyc": b"\x00junk",
        },
    )
    files = create_project(tmp_path / "out", name="my-bot", template="custom", templates_dir=root)
    assert [f.relative_to(tmp_path / "out").as_posix() for f in files] == ["my_bot/MyBotAgent.txt"]
    assert files[0].read_text() == "my-bot / my_bot / my_bot.agent:MyBotAgent / __init__"


def test_a_render_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    """An unknown placeholder in the last file fails before any file is written."""
    root = make_template(
        tmp_path / "templates",
        "broken",
        {"a.txt": "fine __PROJECT__", "z.txt": "__NOT_A_PLACEHOLDER__"},
    )
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(
        ConfigError, match=r"z.txt uses the unknown placeholder __NOT_A_PLACEHOLDER"
    ):
        create_project(out / "p", name="p", template="broken", templates_dir=root)
    assert listing(out) == []


def test_an_unreadable_template_file_is_a_clear_error(tmp_path: Path) -> None:
    """A template file that is not UTF-8 text names the file; nothing is written."""
    root = make_template(tmp_path / "templates", "binary", {"logo.png": b"\x89PNG\xff\xfe"})
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError, match=r"cannot read template 'binary', file logo.png"):
        create_project(out / "p", name="p", template="binary", templates_dir=root)
    assert listing(out) == []


def test_a_write_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    """A file that cannot be written (its name is too long) undoes the files already written."""
    root = make_template(
        tmp_path / "templates",
        "long",
        {"a.txt": "written first", "b/__PACKAGE____PACKAGE____PACKAGE__.txt": "fails"},
    )
    out = tmp_path / "out"
    out.mkdir()
    name = "n" * 100  # three times over 255 bytes: the file system refuses the name
    with pytest.raises(ConfigError, match="cannot write the project"):
        create_project(out / "p", name=name, template="long", templates_dir=root)
    assert listing(out) == []


def test_a_template_folder_without_templates_is_empty(tmp_path: Path) -> None:
    """A folder with no template.toml in it offers no templates."""
    assert list_templates(tmp_path) == []
    with pytest.raises(ConfigError, match=r"choose one of: \(none\)"):
        create_project(tmp_path / "x", name="x", templates_dir=tmp_path)


def test_the_workspace_layout_puts_the_project_under_rollouts(tmp_path: Path) -> None:
    """--layout workspace: the template's files under rollouts/NAME/, the layout's around them,
    names filled in everywhere."""
    files = create_project(
        tmp_path / "ws", name="demo-agent", template="minimal", layout="workspace"
    )
    relative = {f.relative_to(tmp_path / "ws").as_posix() for f in files}
    assert "rollouts/demo-agent/demo_agent/agent.py" in relative
    assert "rollouts/demo-agent/main.py" in relative
    assert {"configs/eval/demo-agent.toml", "configs/training/demo-agent.toml"} <= relative
    for file in files:
        assert "__PROJECT__" not in file.read_text()
        assert "__PROJECT__" not in str(file)


def test_a_layout_it_does_not_know_or_cannot_find_writes_nothing(tmp_path: Path) -> None:
    """An unknown layout, or templates without the layout's files: one error, nothing written."""
    with pytest.raises(
        ConfigError, match="unknown layout 'flat'; choose one of: project, workspace"
    ):
        create_project(tmp_path / "a", name="a", layout="flat")
    root = make_template(tmp_path / "templates", "custom", {"README.md": "# __PROJECT__\n"})
    with pytest.raises(ConfigError, match=r"the workspace layout's files .* are missing"):
        create_project(
            tmp_path / "b", name="b", template="custom", templates_dir=root, layout="workspace"
        )
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()
