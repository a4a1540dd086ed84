"""`osmosis validate`: exit codes 0/1/2, the Rich report, --json, --strict and --no-dry-run."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app

from .commands import run_cli_text
from .support import ASSETS, ROOT


def invoke(*args: str) -> tuple[int, str, str]:
    """Run the command; Click 8.2+ keeps stdout and stderr apart on the result."""
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def target(asset: str, attr: str) -> str:
    return f"{ASSETS / asset}.py:{attr}"


def test_valid_agent_exits_0_with_a_report() -> None:
    """A good agent exits 0 and each check is listed as passing."""
    code, out, err = invoke(target("val_good", "GoodAgent"))
    assert code == 0, out + err
    assert "Static checks (source, nothing run): no problems" in out
    assert "Dry run (one rollout with the mock LLM): no problems" in out
    assert "Valid (0 error(s), 0 warning(s))" in out
    assert err == ""


def test_errors_exit_1_and_show_code_location_and_fix() -> None:
    """An agent with errors exits 1; the report shows the code, where, and how to fix it."""
    code, out, _ = invoke(target("val_tool_name_duplicate", "DuplicateAgent"))
    assert code == 1
    assert "TOOL_NAME_DUPLICATE" in out
    assert "tools[1].function.name" in out
    assert "already used by tools[0]" in out
    assert "Not valid (1 error(s), 0 warning(s))" in out


def test_a_misspelt_schema_type_is_reported_with_the_nearest_type() -> None:
    """`osmosis validate` on ``"type": "numbr"`` suggests ``number`` and lists the valid types."""
    code, out, _ = invoke(target("val_tool_schema_invalid", "BadSchemaAgent"), "--json")
    assert code == 1
    (problem,) = json.loads(out)["problems"]
    assert problem["code"] == "TOOL_SCHEMA_INVALID"
    assert problem["message"] == (
        "parameters of 'add' is not a valid JSON Schema: 'numbr' is not a JSON Schema type "
        "(did you mean 'number'?); the types are array, boolean, integer, null, number, "
        "object, string"
    )


def test_warnings_pass_unless_strict() -> None:
    """Warnings alone exit 0; with --strict they exit 1."""
    agent = target("val_tool_description_missing", "UndescribedAgent")
    code, out, _ = invoke(agent, "--no-dry-run")
    assert code == 0
    assert "TOOL_DESCRIPTION_MISSING" in out
    code, out, _ = invoke(agent, "--no-dry-run", "--strict")
    assert code == 1
    assert "Not valid with --strict" in out


@pytest.mark.parametrize(
    "bad", ["agent_without_attr.py", "tests/assets/val_nope.py:Agent", "osmosis_nope_mod:Agent"]
)
def test_unusable_target_exits_2_with_one_error_line(bad: str) -> None:
    """A target that cannot be parsed or found exits 2 with a one-line error, no traceback."""
    code, out, err = invoke(bad)
    assert code == 2
    assert out == ""
    assert err.startswith("Error: ")
    assert "Traceback" not in err


def test_misspelt_class_exits_2_with_a_suggestion() -> None:
    """A class that is not in the file is a target error with a did-you-mean."""
    code, _, err = invoke(target("val_good", "GoodAgnt"))
    assert code == 2
    assert "did you mean GoodAgent?" in err


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package `osm_fr_pkg` in the working folder: one agent and one plain function."""
    monkeypatch.syspath_prepend(str(tmp_path / "unused"))  # sys.path restored afterwards
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    pkg = tmp_path / "osm_fr_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = (ROOT / "tests/assets/docs_sandbox/agent.py").read_text()
    (pkg / "agent.py").write_text(source)
    yield pkg
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.parametrize("target", ["osm_fr_pkg.agent", "osm_fr_pkg/agent.py"])
def test_a_target_without_class_suggests_the_one_agent_defined(package: Path, target: str) -> None:
    code, _, err = run_cli_text("validate", target)
    assert code == 2
    assert f"did you mean {target}:MyAgent?" in err


@pytest.mark.usefixtures("no_inherited_settings")
def test_a_function_target_says_it_is_a_function_and_names_the_agents(package: Path) -> None:
    code, out, _ = run_cli_text("validate", "osm_fr_pkg.agent:add", "--json")
    assert code == 1
    message = json.loads(out)["problems"][0]["message"]
    assert message.startswith("add is a function, not an agent")
    assert message.endswith("agents defined there: MyAgent")
    assert "class add(" not in message


def test_validate_names_the_classes_and_the_bad_line(tmp_path: Path) -> None:
    """A wrong class name lists the classes in the file; a syntax error quotes the line."""
    from osmosis_rollout.cli import app as cli_app

    agent = tmp_path / "agent.py"
    agent.write_text("class Alpha:\n    pass\n\n\nclass Beta:\n    pass\n")
    missing = CliRunner().invoke(cli_app, ["validate", f"{agent}:Zzz"])
    assert missing.exit_code == 2
    assert "classes defined there: Alpha, Beta" in missing.stderr
    agent.write_text("class Alpha:\n    def f(self)\n        pass\n")
    broken = CliRunner().invoke(cli_app, ["validate", f"{agent}:Alpha", "--json"])
    assert broken.exit_code == 1
    assert "def f(self)" in broken.stdout


def test_json_prints_only_the_result() -> None:
    """--json prints the ValidationResult as JSON on stdout and keeps the exit code."""
    code, out, err = invoke(target("val_tool_invalid", "InvalidToolAgent"), "--json")
    assert code == 1
    assert err == ""
    data = json.loads(out)
    assert set(data) == {
        "version",
        "target",
        "agent_name",
        "tools",
        "checks_run",
        "problems",
        "valid",
    }
    assert data["valid"] is False
    assert data["checks_run"] == ["static", "dynamic"]
    assert data["problems"][0] == {
        "code": "TOOL_INVALID",
        "severity": "error",
        "check": "dynamic",
        "location": "tools[1].function",
        "message": "tools[1] is not a valid OpenAI function tool: function: Field required",
    }


def test_json_for_an_unusable_target_still_exits_2() -> None:
    """With --json a target error is JSON too, and the exit code is still 2."""
    code, out, _ = invoke("osmosis_nope_mod:Agent", "--json")
    assert code == 2
    assert [p["code"] for p in json.loads(out)["problems"]] == ["MODULE_NOT_FOUND"]


def test_no_dry_run_and_timeout_are_passed_through() -> None:
    """--no-dry-run skips the rollout; --timeout bounds it."""
    hanging = target("val_dry_run_hangs", "HangingAgent")
    code, out, _ = invoke(hanging, "--no-dry-run", "--json")
    assert code == 0
    assert json.loads(out)["checks_run"] == ["static", "dynamic"]
    code, out, _ = invoke(hanging, "--timeout", "0.3", "--json")
    assert code == 1
    problems = json.loads(out)["problems"]
    assert [p["code"] for p in problems] == ["DRY_RUN_TIMEOUT"]
    assert "0.3 s" in problems[0]["message"]


def test_validate_is_listed_in_help() -> None:
    """The command registers itself on the osmosis app."""
    result = CliRunner().invoke(app, ["--help"])
    assert "validate" in result.stdout


def test_an_unknown_protocol_is_a_usage_error() -> None:
    code, out, err = invoke(target("val_good", "GoodAgent"), "--protocol", "v9")
    assert code == 2
    assert "--protocol 'v9': choose v1 or v2" in err
    assert "Traceback" not in out + err


def test_the_dry_run_speaks_v2_with_protocol_v2() -> None:
    code, out, err = invoke(target("val_good", "GoodAgent"), "--protocol", "v2", "--json")
    assert code == 0, out + err
    result = json.loads(out)
    assert result["problems"] == []
    assert "dry_run" in result["checks_run"]


def test_the_dry_run_speaks_the_polling_wire_with_protocol_polling() -> None:
    code, out, err = invoke(target("val_good", "GoodAgent"), "--protocol", "polling", "--json")
    assert code == 0, out + err
    result = json.loads(out)
    assert result["problems"] == []
    assert "dry_run" in result["checks_run"]
