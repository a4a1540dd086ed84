"""v1's ``validate_agent_loop(agent, *, request=None)``: sync, v1's codes beside ours."""

from __future__ import annotations

from typing import Any

import pytest

from osmosis_rollout import validate_agent_loop_async
from osmosis_rollout.compat import (
    AgentLoopValidationError,
    OpenAIFunctionToolSchema,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
    validate_agent_loop,
)


def agent_with(tools: Any = (), **attributes: Any) -> RolloutAgentLoop:
    """An agent whose get_tools returns ``tools`` (or raises it), with ``attributes`` set."""

    class Agent(RolloutAgentLoop):
        name = "checked"

        def get_tools(self, request: RolloutRequest) -> Any:
            if isinstance(tools, Exception):
                raise tools
            return list(tools) if isinstance(tools, tuple) else tools

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete(list(ctx.request.messages))

    agent = Agent()
    for key, value in attributes.items():
        object.__setattr__(agent, key, value)
    return agent


TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
    },
}


def codes(result: Any) -> list[str]:
    return [problem.code for problem in result.problems]


def test_a_valid_agent_from_sync_code() -> None:
    result = validate_agent_loop(agent_with([TOOL]))
    assert result.valid is True
    assert bool(result) is True
    assert (result.errors, result.warnings) == ([], [])
    assert (result.agent_name, result.tool_count) == ("checked", 1)
    result.raise_if_invalid()  # returns quietly


@pytest.mark.anyio
async def test_it_also_works_when_called_inside_an_event_loop() -> None:
    """A v1 test or notebook calling the sync validator from async code does not deadlock."""
    assert validate_agent_loop(agent_with([TOOL])).valid


@pytest.mark.anyio
async def test_the_async_validator_keeps_its_own_name_and_dry_run() -> None:
    result = await validate_agent_loop_async(agent_with([TOOL]), timeout_s=10)
    assert result.valid
    assert "dry_run" in result.checks_run


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        (None, "MISSING_NAME", "Agent loop must have a 'name' attribute"),
        (42, "INVALID_NAME_TYPE", "'name' must be a string, got int"),
        ("   ", "EMPTY_NAME", "'name' cannot be empty or whitespace only"),
    ],
)
def test_name_problems_carry_v1s_codes(name: Any, code: str, message: str) -> None:
    result = validate_agent_loop(agent_with([TOOL], name=name))
    assert not result
    [error] = result.errors
    assert (error.code, error.field, error.message) == (code, "name", message)
    assert error.details == {"osmosis_code": "NAME_INVALID"}  # ours, beside v1's
    assert str(error) == f"[{code}] name: {message}"
    assert result.agent_name == (name if isinstance(name, str) else None)


def test_get_tools_is_called_with_the_given_request() -> None:
    seen: list[RolloutRequest] = []

    class Recording(RolloutAgentLoop):
        name = "recording"

        def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
            seen.append(request)
            return []

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete([])

    mine = RolloutRequest(
        rollout_id="mine",
        server_url="http://localhost:1",
        messages=[{"role": "user", "content": "x"}],
        completion_params={},
        metadata={"enabled_tools": ["search"]},
    )
    validate_agent_loop(Recording(), request=mine)
    assert {r.rollout_id for r in seen} == {"mine"}
    seen.clear()
    validate_agent_loop(Recording())
    assert {r.rollout_id for r in seen} == {"validation-test-rollout"}
    assert seen[0].metadata == {"_validation": True}


def test_get_tools_failures() -> None:
    raised = validate_agent_loop(agent_with(RuntimeError("no config")))
    [error] = raised.errors
    assert error.code == "GET_TOOLS_EXCEPTION"
    assert error.message == "get_tools() raised an exception: RuntimeError: no config"
    assert error.details is not None
    assert error.details["exception_type"] == "RuntimeError"
    assert error.details["exception_message"] == "no config"

    assert codes(validate_agent_loop(agent_with(None)))[0] == "GET_TOOLS_RETURNS_NONE"
    assert not validate_agent_loop(agent_with(None)).valid
    assert codes(validate_agent_loop(agent_with({"a": 1})))[0] == "GET_TOOLS_INVALID_TYPE"


def test_each_tool_problem_has_v1s_code_and_location() -> None:
    tools = [
        {"function": {"name": "a", "description": "d"}},
        {"type": "retrieval", "function": {"name": "b", "description": "d"}},
        {"type": "function"},
        {"type": "function", "function": "nope"},
        {"type": "function", "function": {"description": "d"}},
        {"type": "function", "function": {"name": " ", "description": "d"}},
        {"type": "function", "function": {"name": "c"}},
        {"type": "function", "function": {"name": "d", "description": "d", "parameters": []}},
        {
            "type": "function",
            "function": {"name": "e", "description": "d", "parameters": {"type": "array"}},
        },
        7,
    ]
    result = validate_agent_loop(agent_with(tools))
    v1 = [(p.code, p.severity, p.field) for p in result.problems if p.code in _V1_TOOL_CODES]
    assert v1 == [
        ("MISSING_TOOL_TYPE", "error", "tools[0]"),
        ("UNKNOWN_TOOL_TYPE", "warning", "tools[1].type"),
        ("MISSING_FUNCTION", "error", "tools[2]"),
        ("INVALID_FUNCTION_TYPE", "error", "tools[3].function"),
        ("MISSING_FUNCTION_NAME", "error", "tools[4].function.name"),
        ("INVALID_FUNCTION_NAME", "error", "tools[5].function.name"),
        ("MISSING_FUNCTION_DESCRIPTION", "warning", "tools[6].function.description"),
        ("INVALID_PARAMETERS_TYPE", "error", "tools[7].function.parameters"),
        ("PARAMETERS_TYPE_NOT_OBJECT", "warning", "tools[8].function.parameters.type"),
        ("INVALID_TOOL_TYPE", "error", "tools[9]"),
    ]
    assert result.tool_count == 10


_V1_TOOL_CODES = {
    "MISSING_TOOL_TYPE",
    "UNKNOWN_TOOL_TYPE",
    "MISSING_FUNCTION",
    "INVALID_FUNCTION_TYPE",
    "MISSING_FUNCTION_NAME",
    "INVALID_FUNCTION_NAME",
    "MISSING_FUNCTION_DESCRIPTION",
    "INVALID_PARAMETERS_TYPE",
    "PARAMETERS_TYPE_NOT_OBJECT",
    "INVALID_TOOL_TYPE",
}


def test_our_richer_checks_report_beside_v1s() -> None:
    """A schema v1 let through (an unknown JSON type, a duplicate name) is still found."""
    bad_schema = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "d",
            "parameters": {"type": "object", "properties": {"a": {"type": "decimal"}}},
        },
    }
    result = validate_agent_loop(agent_with([bad_schema, TOOL]))
    assert "TOOL_SCHEMA_INVALID" in codes(result)
    assert "TOOL_NAME_DUPLICATE" in codes(result)
    assert not result.valid


def test_a_sync_run_is_run_not_async() -> None:
    class SyncRun(RolloutAgentLoop):
        name = "sync"

        def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
            return []

        def run(self, ctx: RolloutContext) -> RolloutResult:  # type: ignore[override]
            return ctx.complete([])

    [error] = validate_agent_loop(SyncRun()).errors
    assert error.code == "RUN_NOT_ASYNC"
    assert error.message == "'run' method must be an async function (async def)"


def test_raise_if_invalid_lists_every_error() -> None:
    result = validate_agent_loop(agent_with([{"function": {"name": ""}}], name=""))
    with pytest.raises(AgentLoopValidationError) as caught:
        result.raise_if_invalid()
    text = str(caught.value)
    assert text.startswith(f"Agent loop validation failed with {len(result.errors)} error(s):")
    assert "\n  - [EMPTY_NAME] name: 'name' cannot be empty or whitespace only" in text
    assert caught.value.errors == result.errors


def test_v1s_validator_module_names_and_constructors() -> None:
    """v1 imported these from ``osmosis_ai.rollout.validator`` and built results by hand."""
    from osmosis_rollout.compat import (
        AgentLoopValidationError,
        ValidationError,
        ValidationResult,
        validate_agent_loop,
    )

    assert validate_agent_loop(agent_with([TOOL])).valid
    ok = ValidationResult(valid=True, agent_name="test", tool_count=2)
    assert (bool(ok), ok.agent_name, ok.tool_count, ok.errors) == (True, "test", 2, [])
    ok.raise_if_invalid()

    assert str(ValidationError(code="TEST", message="Test error")) == "[TEST] Test error"
    error = ValidationError(code="TEST", message="Test error", field="test_field")
    assert str(error) == "[TEST] test_field: Test error"
    bad = ValidationResult(valid=False, errors=[error], warnings=[ValidationError("W", "careful")])
    assert bool(bad) is False
    assert [w.code for w in bad.warnings] == ["W"]
    with pytest.raises(AgentLoopValidationError, match=r"1 error\(s\)") as caught:
        bad.raise_if_invalid()
    assert len(caught.value.errors) == 1
