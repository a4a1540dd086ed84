"""A tool whose hand-written schema names other parameters than the function a ``Toolbox`` runs:
``osmosis validate`` names the tool, the parameter and the fix (``TOOL_SCHEMA_MISMATCH``), and
``osmosis test`` counts the calls the function refused though the declared schema allows them
as the tool's errors (``tool_always_fails``). A model's own bad arguments stay uncounted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.agent import RolloutContext
from osmosis_rollout.cli import app
from osmosis_rollout.evaluation.tool_errors import run_findings
from osmosis_rollout.protocol import OpenAIFunctionToolSchema, RolloutRequest
from osmosis_rollout.scaffold import create_project, list_templates
from osmosis_rollout.tools import Toolbox
from osmosis_rollout.validator import validate_agent_loop_async

from .support import ASSETS, CALCULATOR, load_asset

AGENTS = ASSETS / "schema_mismatch_agents.py"


def target(name: str) -> str:
    return f"{AGENTS}:{name}"


def rows_file(tmp_path: Path, count: int = 3) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"user_prompt": f"What is {i} + 1?"}) + "\n" for i in range(count))
    )
    return path


def mismatches(result: Any) -> list[Any]:
    return [p for p in result.problems if p.code == "TOOL_SCHEMA_MISMATCH"]


def test_validate_exits_1_naming_the_tool_the_parameter_and_the_fix() -> None:
    result = CliRunner().invoke(app, ["validate", target("Mismatched"), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    found = [p for p in data["problems"] if p["code"] == "TOOL_SCHEMA_MISMATCH"]
    by_location = {p["location"]: p for p in found}
    x = by_location["tools[0].function.parameters.properties.x"]
    assert x["severity"] == "error"
    assert x["check"] == "dynamic"
    assert "tool 'add'" in x["message"]
    assert "required parameter 'x'" in x["message"]
    assert "add(a, b)" in x["message"]
    assert "return toolbox.schemas from get_tools()" in x["message"]
    required = [p["message"] for p in found if p["location"].endswith(".required")]
    assert any("requires 'a'" in m for m in required)
    assert any("requires 'b'" in m for m in required)
    assert all(p["severity"] == "error" for p in found)


def test_the_dry_run_finds_a_toolbox_the_dynamic_checks_cannot_see() -> None:
    """A toolbox built in ``run``: the dry run's refused calls name the tool."""
    result = asyncio.run(validate_agent_loop_async(target("BuiltInRun")))
    assert not result.valid
    (found,) = mismatches(result)
    assert found.check == "dry_run"
    assert found.location == "get_tools()"
    assert "tool 'add'" in found.message
    assert "return toolbox.schemas from get_tools()" in found.message


def test_an_optional_declared_parameter_the_function_lacks_is_a_warning() -> None:
    result = asyncio.run(validate_agent_loop_async(target("Optional"), dry_run=False))
    assert result.valid
    (warning,) = mismatches(result)
    assert warning.severity == "warning"
    assert warning.location == "tools[0].function.parameters.properties.note"
    assert "optional parameter 'note'" in warning.message


@pytest.mark.parametrize(
    "agent",
    [
        target("Agreeing"),
        CALCULATOR,
        f"{ASSETS}/tool_agent.py:ToolAgent",
        f"{ASSETS}/sqlite_agent.py:SqliteAgent",
    ],
)
def test_a_schema_that_agrees_with_its_function_is_no_problem(agent: str) -> None:
    result = asyncio.run(validate_agent_loop_async(agent, dry_run=False))
    assert mismatches(result) == []


@pytest.mark.slow
@pytest.mark.parametrize("template", [t.name for t in list_templates()])
def test_no_template_has_a_schema_mismatch(template: str, tmp_path: Path) -> None:
    """Every template's agent, as ``osmosis init`` writes it, validates without one."""
    project = tmp_path / "demo"
    create_project(project, name="demo", template=template)
    validate = [sys.executable, "-m", "osmosis_rollout", "validate", "--no-dry-run", "--json"]
    done = subprocess.run(validate, cwd=project, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    codes = [p["code"] for p in json.loads(done.stdout)["problems"]]
    assert "TOOL_SCHEMA_MISMATCH" not in codes


def test_type_and_required_disagreements_are_named() -> None:
    """A declared type the function's cannot take, and a parameter the function requires that
    the schema makes optional."""
    module = load_asset("schema_mismatch_agents")

    class Typed(module._Calls):
        def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
            return module.declared({"a": {"type": "string"}, "b": module.NUMBER}, ["a"])

    result = asyncio.run(validate_agent_loop_async(Typed(), dry_run=False))
    found = {p.location: p for p in mismatches(result)}
    kind = found["tools[0].function.parameters.properties.a.type"]
    assert kind.severity == "error"
    assert "declares 'a' as 'string'" in kind.message
    assert "takes 'number'" in kind.message
    optional = found["tools[0].function.parameters.properties.b"]
    assert optional.severity == "warning"
    assert "makes it optional" in optional.message


def test_osmosis_test_reports_the_tool_that_can_never_work(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app,
        ["test", target("Mismatched"), "-d", str(rows_file(tmp_path)), "--json", "-o", str(output)],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tools"]["add"]["errors"] == summary["tools"]["add"]["calls"] > 0
    assert summary["tools"]["add"]["schema_errors"] == summary["tools"]["add"]["calls"]
    (finding,) = summary["run_findings"]
    assert finding["code"] == "tool_always_fails"
    assert finding["details"]["tool"] == "add"
    assert "its function refused arguments its declared schema allows" in finding["message"]
    assert "return toolbox.schemas from get_tools()" in finding["message"]
    rows = [json.loads(line) for line in output.read_text().splitlines()][:-1]
    assert all(row["tool_errors"] == {"add": row["tool_calls"]} for row in rows)


def test_osmosis_test_on_an_agreeing_schema_counts_no_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["test", target("Agreeing"), "-d", str(rows_file(tmp_path)), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tools"]["add"]["calls"] > 0
    assert summary["tools"]["add"]["errors"] == 0
    assert summary["run_findings"] == []


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def _context(declared: list[dict[str, Any]]) -> RolloutContext:
    request = RolloutRequest(
        rollout_id="r-1", server_url="http://t.test", messages=[], completion_params={}
    )
    tools = [OpenAIFunctionToolSchema.model_validate(t) for t in declared]
    return RolloutContext(request, tools, None)


def _call(arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps(arguments)},
    }


def _schema(properties: list[str], required: list[str]) -> list[dict[str, Any]]:
    parameters = {
        "type": "object",
        "properties": {p: {"type": "number"} for p in properties},
        "required": required,
    }
    return [{"type": "function", "function": {"name": "add", "parameters": parameters}}]


@pytest.mark.parametrize(
    ("declared", "arguments", "counted"),
    [
        # The schema the model saw names x and y; the function takes a and b: the agent's bug.
        (_schema(["x", "y"], ["x", "y"]), {"x": 1, "y": 2}, True),
        # Arguments against the schema the model saw too: the model's mistake.
        (_schema(["x", "y"], ["x", "y"]), {"x": 1}, False),
        (_schema(["a", "b"], ["a", "b"]), {"a": 1}, False),
        # An argument the declared schema does not name (its object is open): the model's.
        (_schema(["a", "b"], ["a", "b"]), {"a": 1, "b": 2, "c": 3}, False),
        # The toolbox's own schema: whatever it refuses is the model's mistake.
        ([Toolbox([add]).schemas[0].model_dump(exclude_none=True)], {"a": 1}, False),
        # No schema declared for the tool at all.
        ([], {"x": 1, "y": 2}, False),
    ],
)
def test_refused_calls_count_as_tool_errors_only_when_the_declared_schema_allows_them(
    declared: list[dict[str, Any]], arguments: dict[str, Any], counted: bool
) -> None:
    ctx = _context(declared)
    [message] = asyncio.run(Toolbox([add]).execute(ctx, [_call(arguments)]))
    assert message["content"].startswith("Error: invalid arguments for tool 'add'")
    extra = ctx.metrics.model_extra or {}
    assert extra["tool_counts"] == {"add": [1, int(counted), 0]}
    assert extra.get("tool_schema_errors") == ({"add": 1} if counted else None)


def test_run_findings_say_which_errors_the_schema_caused() -> None:
    totals = {
        "add": {"calls": 4, "errors": 4, "timeouts": 0, "schema_errors": 4},
        "mul": {"calls": 10, "errors": 5, "timeouts": 1, "schema_errors": 2},
    }
    findings = {f.details["tool"]: f for f in run_findings(totals) if f.details}
    assert findings["add"].code == "tool_always_fails"
    assert "(its function refused arguments its declared schema allows)" in findings["add"].message
    assert findings["add"].details is not None
    assert findings["add"].details["schema_errors"] == 4
    assert findings["mul"].code == "tool_error_share"
    assert "2 raised, 1 timed out, 2 refused by its function" in findings["mul"].message
    assert "return toolbox.schemas from get_tools()" in findings["mul"].message
