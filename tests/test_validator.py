"""validate_agent_loop_async: the broken-agent gallery, the good agents, and each check's edges."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from osmosis_rollout import Problem, ValidationResult, validate_agent_loop_async
from osmosis_rollout.testing import RolloutRecord, ScriptedBackend
from osmosis_rollout.testing.harness import RolloutOutcome
from osmosis_rollout.testing.records import Finding
from osmosis_rollout.validator.dry_run import dry_run, problems_from_outcome
from osmosis_rollout.validator.dynamic import check_tool_list
from osmosis_rollout.validator.result import PROBLEM_CODES

from .support import ASSETS, line_of, load_asset

pytestmark = pytest.mark.anyio


def target(asset: str, attr: str) -> str:
    return f"{ASSETS / asset}.py:{attr}"


def find(result: ValidationResult, code: str) -> list[Problem]:
    found = [p for p in result.problems if p.code == code]
    assert found, f"{code} not in {result.codes()}"
    return found


# --------------------------------------------------------------------------------------------
# The gallery: one small broken agent per problem code
# --------------------------------------------------------------------------------------------

# (asset, class, code, severity, check, marker in the asset or a tools[...] location)
GALLERY = [
    ("val_not_subclass", "PlainAgent", "NOT_A_SUBCLASS", "error", "static", "<- NOT_A_SUBCLASS"),
    ("val_name_missing", "NamelessAgent", "NAME_MISSING", "error", "static", "<- NAME_MISSING"),
    ("val_name_invalid", "BlankNameAgent", "NAME_INVALID", "error", "static", "<- NAME_INVALID"),
    (
        "val_name_invalid_runtime",
        "ShadowedNameAgent",
        "NAME_INVALID",
        "error",
        "dynamic",
        "<- NAME_INVALID",
    ),
    ("val_run_missing", "RunlessAgent", "RUN_MISSING", "error", "static", "<- RUN_MISSING"),
    (
        "val_get_tools_missing",
        "ToollessAgent",
        "GET_TOOLS_MISSING",
        "error",
        "static",
        "<- GET_TOOLS_MISSING",
    ),
    ("val_run_not_async", "SyncRunAgent", "RUN_NOT_ASYNC", "error", "static", "<- RUN_NOT_ASYNC"),
    ("val_run_signature", "NoCtxAgent", "RUN_SIGNATURE", "error", "static", "<- RUN_SIGNATURE"),
    (
        "val_get_tools_signature",
        "NoRequestAgent",
        "GET_TOOLS_SIGNATURE",
        "error",
        "static",
        "<- GET_TOOLS_SIGNATURE",
    ),
    ("val_blocking_call", "BlockingAgent", "BLOCKING_CALL", "warning", "static", "<- BLOCKING"),
    (
        "val_no_result",
        "ForgetfulAgent",
        "NO_RESULT_RETURNED",
        "warning",
        "static",
        "<- NO_RESULT_RETURNED",
    ),
    (
        "val_history_rebuilt",
        "RewritingAgent",
        "HISTORY_REBUILT",
        "warning",
        "static",
        "<- HISTORY_REBUILT",
    ),
    (
        "val_import_failed",
        "NeedsDependencyAgent",
        "IMPORT_FAILED",
        "error",
        "dynamic",
        "<- IMPORT_FAILED",
    ),
    ("val_module_raised", "ConfiguredAgent", "MODULE_RAISED", "error", "dynamic", "<- MODULE_"),
    ("val_init_failed", "NeedsArgsAgent", "INIT_FAILED", "error", "dynamic", "class NeedsArgs"),
    (
        "val_get_tools_raises",
        "GetToolsRaisesAgent",
        "GET_TOOLS_FAILED",
        "error",
        "dynamic",
        "<- GET_TOOLS_FAILED",
    ),
    ("val_get_tools_not_list", "DictToolsAgent", "GET_TOOLS_NOT_LIST", "error", "dynamic", None),
    ("val_get_tools_none", "NoneToolsAgent", "GET_TOOLS_RETURNED_NONE", "warning", "dynamic", None),
    (
        "val_tool_invalid",
        "InvalidToolAgent",
        "TOOL_INVALID",
        "error",
        "dynamic",
        "tools[1].function",
    ),
    (
        "val_tool_name_invalid",
        "BadNameAgent",
        "TOOL_NAME_INVALID",
        "error",
        "dynamic",
        "tools[0].function.name",
    ),
    (
        "val_tool_name_duplicate",
        "DuplicateAgent",
        "TOOL_NAME_DUPLICATE",
        "error",
        "dynamic",
        "tools[1].function.name",
    ),
    (
        "val_tool_schema_invalid",
        "BadSchemaAgent",
        "TOOL_SCHEMA_INVALID",
        "error",
        "dynamic",
        "tools[0].function.parameters.properties.a.type",
    ),
    (
        "val_tool_parameters_not_object",
        "ArrayParamsAgent",
        "TOOL_PARAMETERS_NOT_OBJECT",
        "error",
        "dynamic",
        "tools[0].function.parameters",
    ),
    (
        "val_tool_description_missing",
        "UndescribedAgent",
        "TOOL_DESCRIPTION_MISSING",
        "warning",
        "dynamic",
        "tools[0].function.description",
    ),
    (
        "val_tool_not_serializable",
        "SetDefaultAgent",
        "TOOL_NOT_SERIALIZABLE",
        "error",
        "dynamic",
        "tools[0]",
    ),
]


@pytest.mark.parametrize(
    ("asset", "attr", "code", "severity", "check", "where"),
    GALLERY,
    ids=[f"{row[0]}-{row[2]}" for row in GALLERY],
)
async def test_gallery_agent_is_reported_with_code_and_location(
    asset: str, attr: str, code: str, severity: str, check: str, where: str | None
) -> None:
    """Each broken agent yields its code, severity, check and exact location(s)."""
    result = await validate_agent_loop_async(target(asset, attr), dry_run=False)
    found = find(result, code)
    assert {p.severity for p in found} == {severity}
    assert {p.check for p in found} == {check}
    assert result.valid is (severity == "warning")
    if where is None:
        assert found[0].location == "get_tools()"
    elif where.startswith("tools["):
        assert found[0].location == where
    else:
        path = ASSETS / f"{asset}.py"
        lines = [n for n, text in enumerate(path.read_text().splitlines(), 1) if where in text]
        assert sorted(str(p.location) for p in found) == sorted(
            f"tests/assets/{asset}.py:{n}" for n in lines
        )
    assert all(p.message for p in result.problems)
    assert set(result.codes()) <= PROBLEM_CODES


async def test_tool_problems_are_all_reported_not_just_the_first() -> None:
    """Every bad tool in a list is located, unlike the server's stop-at-first check."""
    result = await validate_agent_loop_async(
        target("val_tool_invalid", "InvalidToolAgent"), dry_run=False
    )
    assert [(p.code, p.location) for p in result.problems] == [
        ("TOOL_INVALID", "tools[1].function"),
        ("TOOL_INVALID", "tools[2]"),
    ]
    assert result.tools == 3


async def test_blocking_call_messages_name_the_call_and_the_fix() -> None:
    """Blocking calls are named as imported (aliases resolved) with an async alternative."""
    result = await validate_agent_loop_async(
        target("val_blocking_call", "BlockingAgent"), dry_run=False
    )
    messages = [p.message for p in find(result, "BLOCKING_CALL")]
    for name in ("time.sleep", "requests.get", "urllib.request.urlopen", "subprocess.run", "open"):
        assert any(m.startswith(f"{name}()") for m in messages), name
    assert any("socket.create_connection()" in m for m in messages)
    assert "anyio.sleep" in messages[0]
    http = next(m for m in messages if m.startswith("requests.get()"))
    assert "httpx2 (installed with osmosis-rollout; the maintained continuation of httpx)" in http
    assert "async with httpx2.AsyncClient() as http: reply = await http.get(url)" in http


async def test_a_faulted_class_is_not_reported_twice() -> None:
    """A class the static checks faulted fails at import too; only the static problem shows."""
    result = await validate_agent_loop_async(
        target("val_name_invalid", "BlankNameAgent"), dry_run=False
    )
    assert result.codes() == ["NAME_INVALID"]
    result = await validate_agent_loop_async(
        target("val_name_missing", "NamelessAgent"), dry_run=False
    )
    assert result.codes() == ["NAME_MISSING"]


# --------------------------------------------------------------------------------------------
# Targets that cannot be loaded
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        ("agent.py", "TARGET_INVALID"),
        ("tests/assets/val_nope.py:Agent", "FILE_NOT_FOUND"),
        ("osmosis_no_such_module:Agent", "MODULE_NOT_FOUND"),
        (f"{ASSETS / 'val_good.py'}:GodAgent", "AGENT_NOT_FOUND"),
    ],
)
async def test_unloadable_targets_are_one_error(bad: str, code: str) -> None:
    """A target that cannot be found or parsed gives exactly one error with its code."""
    result = await validate_agent_loop_async(bad)
    assert result.codes() == [code]
    assert not result.valid
    assert "dry_run" not in result.checks_run


async def test_missing_class_is_found_statically_without_importing() -> None:
    """A class missing from the file is reported (with a suggestion) before any import."""
    result = await validate_agent_loop_async(target("val_module_raised", "ConfigurdAgent"))
    assert result.checks_run == ["static"]
    assert result.codes() == ["AGENT_NOT_FOUND"]
    assert "did you mean ConfiguredAgent?" in result.problems[0].message


async def test_syntax_error_stops_before_import(tmp_path: Path) -> None:
    """A file that does not parse is reported at its line and never imported."""
    path = tmp_path / "broken.py"
    path.write_text("import sys\nsys.exit(3)\nclass Agent(:\n")
    result = await validate_agent_loop_async(f"{path}:Agent")
    assert result.checks_run == ["static"]
    assert [(p.code, p.location) for p in result.problems] == [("SYNTAX_ERROR", f"{path}:3")]


async def test_module_target_gets_static_checks_from_its_file() -> None:
    """`pkg.module:Attr` targets are parsed too, located by file path."""
    result = await validate_agent_loop_async(
        "tests.assets.val_no_result:ForgetfulAgent", dry_run=False
    )
    assert result.checks_run == ["static", "dynamic"]
    assert "tests/assets/val_no_result.py:12" in [p.location for p in result.problems]


# --------------------------------------------------------------------------------------------
# Good agents
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "good",
    [
        target("val_good", "GoodAgent"),
        target("val_good", "good_instance"),
        target("val_good_variants", "VariantAgent"),
        target("seed_calculator", "CalculatorAgent"),
    ],
)
async def test_good_agents_pass_every_check(good: str) -> None:
    """Good agents, including the seed's CalculatorAgent, pass static, dynamic and dry run."""
    result = await validate_agent_loop_async(good, timeout_s=10)
    assert result.problems == []
    assert result.valid
    assert result.checks_run == ["static", "dynamic", "dry_run"]
    assert result.agent_name
    assert result.tools == 1


async def test_classes_and_instances_are_accepted() -> None:
    """A class or an instance can be validated directly, static checks included."""
    module = load_asset("val_no_result")
    for obj in (module.ForgetfulAgent, module.ForgetfulAgent()):
        result = await validate_agent_loop_async(obj, dry_run=False)
        assert result.target.endswith(":ForgetfulAgent")
        assert "static" in result.checks_run
        assert "NO_RESULT_RETURNED" in result.codes()


# --------------------------------------------------------------------------------------------
# Dry run
# --------------------------------------------------------------------------------------------

DRY_RUN_GALLERY = [
    ("val_dry_run_raises", "CrashingAgent", "DRY_RUN_ERROR", "<- DRY_RUN_ERROR"),
    ("val_dry_run_hangs", "HangingAgent", "DRY_RUN_TIMEOUT", "<- DRY_RUN_TIMEOUT"),
    ("val_dry_run_reward_nan", "NanRewardAgent", "DRY_RUN_REWARD_INVALID", "<- DRY_RUN_REWARD"),
    ("val_dry_run_unknown_tool", "InventedToolAgent", "DRY_RUN_UNKNOWN_TOOL", "<- DRY_RUN_UNKNOWN"),
    ("val_history_rebuilt", "RewritingAgent", "DRY_RUN_HISTORY_REWRITTEN", "async def run"),
    ("val_no_result", "ForgetfulAgent", "DRY_RUN_NO_RESULT", "async def run"),
]


@pytest.mark.parametrize(("asset", "attr", "code", "marker"), DRY_RUN_GALLERY)
async def test_dry_run_gallery(
    asset: str, attr: str, code: str, marker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Agents that only fail when run are caught by the dry run, located, and nothing prints."""
    result = await validate_agent_loop_async(target(asset, attr), timeout_s=0.5)
    assert result.checks_run == ["static", "dynamic", "dry_run"]
    problem = find(result, code)[0]
    assert problem.check == "dry_run"
    assert problem.severity == "error"
    line = line_of(ASSETS / f"{asset}.py", marker)
    assert problem.location == f"tests/assets/{asset}.py:{line}"
    assert not result.valid
    assert capsys.readouterr() == ("", "")


async def test_dry_run_error_carries_the_agents_message() -> None:
    """A crash in run() shows the exception the agent raised."""
    result = await validate_agent_loop_async(target("val_dry_run_raises", "CrashingAgent"))
    assert "agent raised KeyError: 'score'" in find(result, "DRY_RUN_ERROR")[0].message


@pytest.mark.parametrize(
    ("attr", "tool"), [("SlowSqlAgent", "run_sql"), ("SlowFetchAgent", "fetch")]
)
async def test_dry_run_timeout_names_the_hanging_tool(attr: str, tool: str) -> None:
    """A tool call still running at the limit (sync or async) is named, with its running time."""
    result = await validate_agent_loop_async(target("val_dry_run_tool_hangs", attr), timeout_s=0.5)
    problem = find(result, "DRY_RUN_TIMEOUT")[0]
    assert re.fullmatch(
        rf"run\(\) did not finish within 0\.5 s: tool '{tool}' had been running for "
        r"0\.\d s of it; check that tool for a call that never returns, and give the Toolbox "
        r"a timeout_s \(or raise --timeout if the tool is just slow\)",
        problem.message,
    ), problem.message
    line = line_of(ASSETS / "val_dry_run_tool_hangs.py", "<- DRY_RUN_TIMEOUT")
    assert problem.location == f"tests/assets/val_dry_run_tool_hangs.py:{line}"


@pytest.mark.parametrize(
    ("attr", "marker", "raised"),
    [
        ("StdlibRaisesAgent", "<- STDLIB RAISES", "JSONDecodeError"),
        ("LibraryRaisesAgent", "<- LIBRARY RAISES", "ValidationError"),
    ],
)
async def test_dry_run_error_in_a_library_points_at_the_agents_call(
    attr: str, marker: str, raised: str
) -> None:
    """When the stdlib or an installed library raises inside run(), the location is the
    agent's own line that called it, not json/decoder.py or site-packages/jsonschema."""
    asset = "val_dry_run_library_raises"
    result = await validate_agent_loop_async(target(asset, attr), timeout_s=2.0)
    problem = find(result, "DRY_RUN_ERROR")[0]
    assert f"agent raised {raised}" in problem.message
    line = line_of(ASSETS / f"{asset}.py", marker)
    assert problem.location == f"tests/assets/{asset}.py:{line}"


async def test_dry_run_is_skipped_when_dynamic_checks_fail() -> None:
    """An agent the server would refuse is not dry-run."""
    result = await validate_agent_loop_async(target("val_tool_name_invalid", "BadNameAgent"))
    assert result.checks_run == ["static", "dynamic"]


async def test_dry_run_with_a_scripted_backend_passes_a_good_agent() -> None:
    """The dry run drives the real server and mock TrainGate with any LLM backend."""
    agent = load_asset("val_good").GoodAgent()
    assert await dry_run(agent, timeout_s=5, location=None, backend=ScriptedBackend([])) == []


def outcome(status: int = 202, findings: list[Finding] | None = None) -> RolloutOutcome:
    return RolloutOutcome(
        rollout_id="r",
        init_status=status,
        init_body={"detail": "get_tools failed: boom"},
        record=RolloutRecord("r"),
        wall_ms=1.0,
        findings=findings or [],
    )


def test_refused_init_is_dry_run_init_failed() -> None:
    """A non-202 init becomes DRY_RUN_INIT_FAILED with the server's reason."""
    problems = problems_from_outcome(outcome(500), timeout_s=1, location="a.py:3")
    assert [(p.code, p.location) for p in problems] == [("DRY_RUN_INIT_FAILED", "get_tools()")]
    assert "HTTP 500: get_tools failed: boom" in problems[0].message


def test_findings_map_to_dry_run_codes() -> None:
    """Mock TrainGate findings become stable codes; a missing result is a timeout."""
    findings = [
        Finding("duplicate_completion", "a second completion callback arrived"),
        Finding("chat_after_completion", "chat call after the rollout had completed"),
        Finding("no_completion", "no completion callback within 1 s"),
    ]
    problems = problems_from_outcome(outcome(findings=findings), timeout_s=1, location="a.py:3")
    assert [p.code for p in problems] == [
        "DRY_RUN_DUPLICATE_RESULT",
        "DRY_RUN_PROTOCOL",
        "DRY_RUN_TIMEOUT",
    ]
    assert "(chat_after_completion)" in problems[1].message
    assert {p.location for p in problems} == {"a.py:3"}


def test_endpoint_findings_point_to_the_page_that_explains_them() -> None:
    """An agent on the OpenAI-compatible endpoint gets the page on those findings, not the
    generic validate.md."""
    findings = [Finding("tools_changed", "turn 1 sent tools that differ", turn=1)]
    problems = problems_from_outcome(outcome(findings=findings), timeout_s=1, location="a.py:3")
    assert problems[0].code == "DRY_RUN_PROTOCOL"  # (then DRY_RUN_TIMEOUT: no result here)
    assert problems[0].message.endswith("(tools_changed); see docs/bring-your-own-agent.md")


# --------------------------------------------------------------------------------------------
# Static checks on small sources
# --------------------------------------------------------------------------------------------

TEMPLATE = """
import time
import anyio
from osmosis_rollout import RolloutAgentLoop


class Agent(RolloutAgentLoop):
    name = "t"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
{body}
"""


@pytest.mark.parametrize(
    ("body", "codes"),
    [
        ("messages = list(ctx.request.messages)\nreturn ctx.complete(messages)", []),
        ("while True:\n    await ctx.chat([])", []),
        ("while True:\n    break\nreturn ctx.error('x')", []),
        ("for _ in range(3):\n    return ctx.complete([])", ["NO_RESULT_RETURNED"]),
        ("try:\n    return ctx.complete([])\nexcept ValueError:\n    raise", []),
        ("try:\n    return ctx.complete([])\nexcept ValueError:\n    pass", ["NO_RESULT_RETURNED"]),
        ("if ctx.turns:\n    return ctx.complete([])\nelse:\n    return ctx.error('x')", []),
        ("if ctx.turns:\n    return ctx.complete([])", ["NO_RESULT_RETURNED"]),
        (
            "match ctx.turns:\n    case 0:\n        return ctx.error('x')\n    case _:\n"
            "        return ctx.complete([])",
            [],
        ),
        ("return await self.finish(ctx)", []),
        ("await anyio.to_thread.run_sync(time.sleep, 1)\nreturn ctx.complete([])", []),
        ("def helper():\n    time.sleep(1)\nreturn ctx.complete([])", []),
        ("time.sleep(1)\nreturn ctx.complete([])", ["BLOCKING_CALL"]),
        ("m = []\nr = await ctx.chat(m)\nm = m + [r.message]\nreturn ctx.complete(m)", []),
        (
            "m = []\nr = await ctx.chat(m)\nm = [r.message]\nreturn ctx.complete(m)",
            ["HISTORY_REBUILT"],
        ),
        (
            "m = []\nr = await ctx.chat(messages=m)\nm.clear()\nreturn ctx.complete(m)",
            ["HISTORY_REBUILT"],
        ),
        (
            "for _ in range(2):\n    m = [{'role': 'user', 'content': 'hi'}]\n"
            "    await ctx.chat(m)\nreturn ctx.complete(m)",
            ["HISTORY_REBUILT"],
        ),
        ("other = [1]\nother.pop()\nreturn ctx.complete([])", []),
    ],
)
async def test_static_run_checks(tmp_path: Path, body: str, codes: list[str]) -> None:
    """Return-path, blocking-call and history checks flag what they should and nothing else."""
    source = TEMPLATE.format(body="\n".join(f"        {line}" for line in body.splitlines()))
    path = tmp_path / "agent.py"
    path.write_text(source)
    result = await validate_agent_loop_async(f"{path}:Agent", dry_run=False)
    assert [p.code for p in result.problems if p.check == "static"] == codes


def test_every_schema_problem_of_a_tool_is_named_not_just_the_first() -> None:
    """A tool whose parameters break the metaschema in two places gets both located."""
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a book up.",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "text"}, "year": {"minimum": "1900"}},
                "required": "title",
            },
        },
    }
    problems = check_tool_list([tool])
    where = "tools[0].function.parameters"
    assert [(p.code, p.location) for p in problems] == [
        ("TOOL_SCHEMA_INVALID", f"{where}.properties.title.type"),
        ("TOOL_SCHEMA_INVALID", f"{where}.properties.year.minimum"),
        ("TOOL_SCHEMA_INVALID", f"{where}.required"),
    ]
    assert "'text' is not a JSON Schema type; the types are array, boolean" in problems[0].message


def test_a_misspelt_type_names_the_valid_types_and_the_nearest() -> None:
    """``"integr"`` (alone or in a list) is named with the nearest type and the valid ones, not
    jsonschema's "is not valid under any of the given schemas"."""
    tool = {
        "type": "function",
        "function": {
            "name": "count",
            "description": "Count.",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integr"}, "s": {"type": ["string", "nul"]}},
            },
        },
    }
    problems = check_tool_list([tool])
    where = "tools[0].function.parameters.properties"
    assert [(p.location, p.message) for p in problems] == [
        (
            f"{where}.n.type",
            "parameters of 'count' is not a valid JSON Schema: 'integr' is not a JSON Schema "
            "type (did you mean 'integer'?); the types are array, boolean, integer, null, "
            "number, object, string",
        ),
        (
            f"{where}.s.type",
            "parameters of 'count' is not a valid JSON Schema: 'nul' is not a JSON Schema type "
            "(did you mean 'null'?); the types are array, boolean, integer, null, number, "
            "object, string",
        ),
    ]


def test_tool_models_and_dicts_are_both_checked() -> None:
    """Pydantic tool models are dumped and checked like dicts."""
    from osmosis_rollout import OpenAIFunctionSchema, OpenAIFunctionToolSchema

    model = OpenAIFunctionToolSchema(
        function=OpenAIFunctionSchema(name="bad name", parameters={"type": "string"})
    )
    problems = check_tool_list([model])
    assert [(p.code, p.location) for p in problems] == [
        ("TOOL_NAME_INVALID", "tools[0].function.name"),
        ("TOOL_DESCRIPTION_MISSING", "tools[0].function.description"),
        ("TOOL_PARAMETERS_NOT_OBJECT", "tools[0].function.parameters"),
    ]


async def test_result_json_shape_is_stable() -> None:
    """The JSON has exactly the documented keys, with `valid` computed from the problems."""
    result = await validate_agent_loop_async(
        target("val_tool_description_missing", "UndescribedAgent"), dry_run=False
    )
    data = json.loads(result.model_dump_json())
    assert list(data) == [
        "version",
        "target",
        "agent_name",
        "tools",
        "checks_run",
        "problems",
        "valid",
    ]
    assert data["version"] == 1
    assert data["valid"] is True
    assert list(data["problems"][0]) == ["code", "severity", "check", "location", "message"]
    assert result.passed()
    assert not result.passed(strict=True)
    assert len(result.warnings) == 1
    assert result.errors == []


def test_every_code_is_documented() -> None:
    """docs/validate.md has one table row per problem code, and no others."""
    doc = (Path(__file__).parent.parent / "docs" / "validate.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", doc, re.MULTILINE))
    assert documented == PROBLEM_CODES
    used = {row[2] for row in GALLERY} | {row[2] for row in DRY_RUN_GALLERY}
    assert used <= PROBLEM_CODES


# --------------------------------------------------------------------------------------------
# Review fixes
# --------------------------------------------------------------------------------------------

ASSIGNED_METHODS = """
from osmosis_rollout import RolloutAgentLoop


async def shared_run(self, ctx):
    messages = list(ctx.request.messages)
    result = await ctx.chat(messages)
    messages.append(result.message)
    return ctx.complete(messages)


def no_tools(self, request):
    return []


class Agent(RolloutAgentLoop):
    name = "assigned"
    get_tools = no_tools
    run = shared_run
"""


async def test_methods_bound_by_assignment_are_not_missing(tmp_path: Path) -> None:
    """`run = shared_run` in the class body is a method, not a missing one; the agent passes."""
    path = tmp_path / "agent.py"
    path.write_text(ASSIGNED_METHODS)
    result = await validate_agent_loop_async(f"{path}:Agent", timeout_s=10)
    assert result.problems == []
    assert result.checks_run == ["static", "dynamic", "dry_run"]


async def test_every_static_error_at_the_class_line_is_reported(tmp_path: Path) -> None:
    """A class missing name, get_tools and run gets all three errors, not just the first."""
    path = tmp_path / "agent.py"
    path.write_text(
        "from osmosis_rollout import RolloutAgentLoop\n\n\nclass Agent(RolloutAgentLoop):\n"
        "    def helper(self):\n        return 1\n"
    )
    result = await validate_agent_loop_async(f"{path}:Agent")
    assert result.codes() == ["NAME_MISSING", "GET_TOOLS_MISSING", "RUN_MISSING"]
    assert {p.location for p in result.problems} == {f"{path}:4"}


async def test_local_names_like_modules_are_not_blocking_calls(tmp_path: Path) -> None:
    """A local `requests` list or `socket` dict is not the module: no BLOCKING_CALL."""
    body = (
        "requests = []\nrequests.append(1)\nsocket = {}\nsocket.get('x')\nreturn ctx.complete([])"
    )
    source = TEMPLATE.format(body="\n".join(f"        {line}" for line in body.splitlines()))
    path = tmp_path / "agent.py"
    path.write_text(source)
    result = await validate_agent_loop_async(f"{path}:Agent", dry_run=False)
    assert result.codes() == []


async def test_a_timeout_error_raised_by_get_tools_is_a_failure_not_our_deadline(
    tmp_path: Path,
) -> None:
    """get_tools raising TimeoutError at once is GET_TOOLS_FAILED, not GET_TOOLS_TIMEOUT."""
    path = tmp_path / "agent.py"
    path.write_text(
        "from osmosis_rollout import RolloutAgentLoop\n\n\nclass Agent(RolloutAgentLoop):\n"
        '    name = "t"\n\n    async def get_tools(self, request):\n'
        '        raise TimeoutError("the tool registry timed out")\n\n'
        "    async def run(self, ctx):\n        return ctx.complete([])\n"
    )
    result = await validate_agent_loop_async(f"{path}:Agent", timeout_s=30)
    [problem] = result.problems
    assert problem.code == "GET_TOOLS_FAILED"
    assert "TimeoutError: the tool registry timed out" in problem.message
    assert problem.location == f"{path}:8"


ASYNC_TOOLS = '''
import time

from anyio import sleep


async def slow_echo(text: str) -> str:
    """Echo a text, slowly.

    Args:
        text: The text.
    """
    time.sleep(0.5)  # <- BLOCKING in an async tool
    return text


async def fine_echo(text: str) -> str:
    """Echo a text, politely.

    Args:
        text: The text.
    """
    await sleep(0.01)
    return text


def sync_echo(text: str) -> str:
    """Echo a text in a thread.

    Args:
        text: The text.
    """
    time.sleep(0.01)  # a sync tool runs in a thread: fine
    return text
'''

AGENT_WITH_ASYNC_TOOLS = """
from osmosis_rollout import RolloutAgentLoop
from osmosis_rollout.tools import Toolbox

from async_tools import fine_echo, slow_echo, sync_echo


class EchoAgent(RolloutAgentLoop):
    name = "echo"

    def __init__(self):
        self.toolbox = Toolbox([slow_echo, fine_echo, sync_echo])

    def get_tools(self, request):
        return self.toolbox.schemas

    async def run(self, ctx):
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message])
"""


async def test_a_blocking_call_in_an_async_tool_of_another_module_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold trial: an ``async def`` tool in the template's ``tools.py`` calling
    ``time.sleep`` passed ``osmosis validate`` with no problem (the static checks read the
    agent's file only). It is a ``BLOCKING_CALL`` warning naming the tool's file and line; a
    sync tool (run in a thread) and an async one that awaits are not."""
    (tmp_path / "async_tools.py").write_text(ASYNC_TOOLS)
    (tmp_path / "echo_agent.py").write_text(AGENT_WITH_ASYNC_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = await validate_agent_loop_async(f"{tmp_path / 'echo_agent.py'}:EchoAgent")
    (blocking,) = find(result, "BLOCKING_CALL")
    line = ASYNC_TOOLS.splitlines().index("    time.sleep(0.5)  # <- BLOCKING in an async tool") + 1
    assert blocking.location == f"async_tools.py:{line} (tool 'slow_echo')"
    assert blocking.severity == "warning"
    assert blocking.message.startswith("time.sleep() in the async tool 'slow_echo'")
    assert "make the tool a plain def" in blocking.message
    assert result.valid
