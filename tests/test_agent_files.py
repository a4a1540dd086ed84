"""agent_files: AGENTS.md, CLAUDE.md and the skills in every project, and `osmosis skills`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osmosis_rollout.agent_files import install_skills, list_skills
from osmosis_rollout.agent_files.guide import guide_findings
from osmosis_rollout.agent_files.skills import MANIFEST, SKILL_ROOTS, packaged_skills
from osmosis_rollout.findings import FINDINGS, POLLING
from osmosis_rollout.scaffold import create_project, list_templates

from .commands import run_cli

TEMPLATES = [info.name for info in list_templates()]
SKILLS = ("create-agent", "debug-agent", "evaluate-agent", "ship-agent")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    dest = tmp_path / "demo"
    create_project(dest, name="demo", template="tools")
    return dest


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_template_gives_agents_md_claude_md_and_the_skills(
    tmp_path: Path, template: str
) -> None:
    """A coding agent opening any new project finds its guide, and Claude Code its skills."""
    dest = tmp_path / "demo"
    create_project(dest, name="demo", template=template)
    agents = (dest / "AGENTS.md").read_text(encoding="utf-8")
    assert f"from the `{template}` template" in agents
    assert "`demo.agent:DemoAgent`" in agents
    assert "## Layout" in agents
    assert "`demo/agent.py`" in agents
    assert "AGENTS.md" in (dest / "CLAUDE.md").read_text(encoding="utf-8")
    for root in SKILL_ROOTS:
        for name in SKILLS:
            skill = dest / root / name / "SKILL.md"
            assert skill.is_file()
            assert not skill.is_symlink()
            assert skill.read_text(encoding="utf-8").startswith(f"---\nname: {name}\n")


def test_agents_md_lists_every_finding_from_the_table(project: Path) -> None:
    """The findings section is the findings table: every code an agent can meet, with its fix,
    so a new code in findings.py reaches every new project's guide without a copy to update."""
    agents = (project / "AGENTS.md").read_text(encoding="utf-8")
    kinds = guide_findings()
    assert {k.code for k in kinds} == {k.code for k in FINDINGS if k.wires != {POLLING}}
    for kind in kinds:
        row = next(line for line in agents.splitlines() if line.startswith(f"| `{kind.code}` |"))
        assert kind.fix.replace("|", "\\|") in row
    polling_only = [k.code for k in FINDINGS if k.wires == {POLLING}]
    assert polling_only
    assert not any(f"`{code}`" in agents for code in polling_only)


def test_agents_md_names_the_commands_in_the_order_a_change_is_checked(project: Path) -> None:
    agents = (project / "AGENTS.md").read_text(encoding="utf-8")
    section = agents[agents.index("## Check a change") : agents.index("## Findings")]
    order = [
        "osmosis validate --json",
        "osmosis test --json --strict --dataset dataset.jsonl",
        "osmosis validate --reward --json",
        "python -m pytest",
    ]
    positions = [section.index(command) for command in order]
    assert positions == sorted(positions)
    # a deliberate change fails the replay test: the guide says how to record it again
    assert "--record tests/cassettes/recorded.jsonl" in section
    for never in ("Rewrite", "Call a model directly", "Block the event loop"):
        assert never in agents


def test_the_packaged_skills_have_front_matter() -> None:
    skills = {skill.name: skill for skill in packaged_skills()}
    assert set(SKILLS) <= set(skills)
    for skill in skills.values():
        assert skill.description.startswith("Use when")


def test_install_writes_updates_and_keeps_what_the_user_changed(tmp_path: Path) -> None:
    """Missing files are written, stale ones updated, edited ones kept unless forced."""
    first = install_skills(tmp_path)
    assert set(first.files.values()) == {"written"}
    assert len(first.files) == len(SKILL_ROOTS) * len(packaged_skills())
    assert install_skills(tmp_path).files == dict.fromkeys(first.files, "unchanged")

    debug = tmp_path / ".agents/skills/debug-agent/SKILL.md"
    shipped = debug.read_text(encoding="utf-8")
    debug.write_text(shipped + "\nMy own note.\n", encoding="utf-8")
    stale = tmp_path / ".claude/skills/create-agent/SKILL.md"
    # A file as an older version wrote it: its hash is the manifest's.
    manifest = json.loads((tmp_path / MANIFEST).read_text(encoding="utf-8"))
    stale.write_text("old text\n", encoding="utf-8")
    manifest["files"][".claude/skills/create-agent/SKILL.md"] = _sha("old text\n")
    (tmp_path / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")

    report = install_skills(tmp_path)
    assert report.files[".agents/skills/debug-agent/SKILL.md"] == "kept"
    assert report.files[".claude/skills/create-agent/SKILL.md"] == "updated"
    assert debug.read_text(encoding="utf-8").endswith("My own note.\n")
    assert stale.read_text(encoding="utf-8") != "old text\n"
    # Still kept on the next run: the manifest remembers what was written, not the user's edit.
    assert install_skills(tmp_path).kept == [".agents/skills/debug-agent/SKILL.md"]

    forced = install_skills(tmp_path, force=True)
    assert forced.files[".agents/skills/debug-agent/SKILL.md"] == "overwritten"
    assert debug.read_text(encoding="utf-8") == shipped


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_list_shows_each_files_state(project: Path) -> None:
    (project / ".claude/skills/ship-agent/SKILL.md").unlink()
    (project / ".agents/skills/ship-agent/SKILL.md").write_text("mine\n", encoding="utf-8")
    states = {s["name"]: s["files"] for s in list_skills(project)}
    assert states["ship-agent"] == {
        ".agents/skills/ship-agent/SKILL.md": "changed",
        ".claude/skills/ship-agent/SKILL.md": "missing",
    }
    assert set(states["debug-agent"].values()) == {"installed"}


def test_skills_commands_print_json_and_exit_1_when_a_file_is_kept(tmp_path: Path) -> None:
    result = run_cli("skills", "install", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["version"] == 1
    assert report["kept"] == []
    (tmp_path / ".agents/skills/debug-agent/SKILL.md").write_text("mine\n", encoding="utf-8")
    result = run_cli("skills", "install", str(tmp_path), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["kept"] == [".agents/skills/debug-agent/SKILL.md"]
    listed = json.loads(run_cli("skills", "list", str(tmp_path), "--json").stdout)
    assert listed["version"] == 1
    assert {s["name"] for s in listed["skills"]} >= set(SKILLS)


def test_a_broken_manifest_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).parent.mkdir(parents=True)
    (tmp_path / MANIFEST).write_text("{not json", encoding="utf-8")
    result = run_cli("skills", "install", str(tmp_path), "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert "osmosis-skills.json" in error["message"]
    assert "Traceback" not in result.stdout + result.stderr


def test_a_template_without_an_agents_table_gets_no_agent_files(tmp_path: Path) -> None:
    """A custom template decides: only a template with `[agents]` gets the files."""
    folder = tmp_path / "templates" / "bare"
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text('description = "Bare."\n', encoding="utf-8")
    (folder / "README.md").write_text("# __PROJECT__\n", encoding="utf-8")
    files = create_project(tmp_path / "out", name="x", template="bare", templates_dir=folder.parent)
    assert [f.name for f in files] == ["README.md"]


def test_every_shipped_template_has_an_agents_contract() -> None:
    import tomllib

    for info in list_templates():
        data = tomllib.loads((info.path / "template.toml").read_text(encoding="utf-8"))
        assert data["agents"]["contract"].strip().startswith("- Here:"), info.name


def test_a_workspace_points_at_its_projects_guide_and_skills(tmp_path: Path) -> None:
    """--layout workspace: the project under rollouts/NAME/ has its guide and skills; the
    workspace's own AGENTS.md and CLAUDE.md say where they are."""
    dest = tmp_path / "ws"
    create_project(dest, name="demo", template="tools", layout="workspace")
    project = dest / "rollouts" / "demo"
    assert "`demo.agent:DemoAgent`" in (project / "AGENTS.md").read_text(encoding="utf-8")
    for root in SKILL_ROOTS:
        for name in SKILLS:
            assert (project / root / name / "SKILL.md").is_file()
    for pointer in ("AGENTS.md", "CLAUDE.md"):
        assert "rollouts/demo/AGENTS.md" in (dest / pointer).read_text(encoding="utf-8")
    assert "osmosis-rollout" in (dest / "AGENTS.md").read_text(encoding="utf-8")
