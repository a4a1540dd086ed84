"""tools: schemas from Python functions, argument parsing and validation, and tool execution."""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional, TypedDict

import anyio
import anyio.lowlevel
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from osmosis_rollout import tools
from osmosis_rollout.agent import RolloutContext
from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.errors import ToolError
from osmosis_rollout.protocol import (
    OpenAIFunctionToolSchema,
    OpenAIToolCall,
    RolloutStatus,
)
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend
from osmosis_rollout.testing._sampling.schema_instances import generate
from osmosis_rollout.tools import (
    Toolbox,
    execute_tool_calls,
    parse_arguments,
    tool,
    tool_schema,
    validate_arguments,
)

from .support import load_asset
from .tool_calls import call, make_ctx, make_request

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(BaseModel):
    x: int
    y: int = 0


class Segment(BaseModel):
    start: Point
    end: Point


class Movie(TypedDict):
    title: str
    year: int


POINT = {
    "title": "Point",
    "type": "object",
    "properties": {
        "x": {"title": "X", "type": "integer"},
        "y": {"title": "Y", "type": "integer", "default": 0},
    },
    "required": ["x"],
}


def with_param(annotation: Any, default: Any = inspect.Parameter.empty) -> Callable[..., Any]:
    """A function ``f(x)`` whose parameter has the given annotation (and optional default)."""

    def f(x):  # type: ignore[no-untyped-def]
        return x

    f.__annotations__ = {"x": annotation}
    if default is not inspect.Parameter.empty:
        f.__defaults__ = (default,)
    return f


def params(fn: Callable[..., Any]) -> dict[str, Any]:
    return tool_schema(fn).function.parameters


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------


def test_schema_from_typed_function_and_docstring() -> None:
    """A typed function with a Google docstring gives the exact OpenAI tool of protocol.md."""

    def add(a: float, b: float) -> float:
        """Add two numbers

        Adds them exactly, in floating point.

        Args:
            a: The first addend.
            b (float): The second
                addend, described on two lines.

        Returns:
            The sum.
        """
        return a + b

    assert tool_schema(add).model_dump(exclude_none=True) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "number", "description": "The first addend."},
                    "b": {
                        "type": "number",
                        "description": "The second addend, described on two lines.",
                    },
                },
                "required": ["a", "b"],
            },
        },
    }


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (Any, {}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list, {"type": "array"}),
        (
            list[list[str]],
            {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
        ),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (dict[str, Any], {"type": "object"}),
        (dict, {"type": "object"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
        (Literal[1, "a", None], {"enum": [1, "a", None]}),
        (Literal[True], {"type": "boolean", "enum": [True]}),
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (Optional[str], {"anyOf": [{"type": "string"}, {"type": "null"}]}),  # noqa: UP045
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (Color, {"type": "string", "enum": ["red", "blue"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (Annotated[int, "How many"], {"type": "integer", "description": "How many"}),
        (
            Annotated[int, Field(description="How many")],
            {"type": "integer", "description": "How many"},
        ),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (
            tuple[int, str],
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        (set[str], {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        (
            Movie,
            {
                "type": "object",
                "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
                "required": ["title", "year"],
            },
        ),
        (Point, POINT),
        (list[Point], {"type": "array", "items": POINT}),
    ],
    ids=repr,
)
def test_annotation_maps_to_json_schema(annotation: Any, expected: dict[str, Any]) -> None:
    """Each supported annotation maps to the exact JSON Schema expected, and is required."""
    assert params(with_param(annotation)) == {
        "type": "object",
        "properties": {"x": expected},
        "required": ["x"],
    }


def test_nested_models_hoist_their_defs_to_the_parameters_root() -> None:
    """A model's $defs move to the parameters root, so its $refs resolve when validating."""

    def draw(segment: Segment, label: str = "") -> None:
        """Draw a segment."""

    schema = params(draw)
    assert schema["$defs"] == {"Point": POINT}
    assert schema["properties"]["segment"]["properties"]["start"] == {"$ref": "#/$defs/Point"}
    bad = {"segment": {"start": {"x": 1}, "end": {"x": "far"}}}
    with pytest.raises(ToolError, match=r"\$\.segment\.end\.x: 'far' is not of type 'integer'"):
        validate_arguments(tool_schema(draw), bad)


def test_defaults_make_parameters_optional_and_appear_as_default() -> None:
    """Parameters with defaults are not required and show their JSON default (enums by value)."""

    def search(
        query: str,
        limit: int = 10,
        color: Color = Color.BLUE,
        tags: tuple[str, ...] = ("a",),
        after: str | None = None,
    ) -> list[str]:
        return []

    assert params(search) == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "default": 10},
            "color": {"type": "string", "enum": ["red", "blue"], "default": "blue"},
            "tags": {"type": "array", "items": {"type": "string"}, "default": ["a"]},
            "after": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["query"],
    }


def test_context_parameters_are_injected_not_described() -> None:
    """`ctx`, a RolloutContext annotation and a TYPE_CHECKING-only one stay out of the schema."""

    def f(ctx, a: int, c: RolloutContext, d: int) -> int:  # type: ignore[no-untyped-def]
        return a

    # As written under `if TYPE_CHECKING:` imports: a name that cannot be resolved at run time.
    f.__annotations__["d"] = "typing_only.RolloutContext"
    assert params(f) == {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
    }


def test_no_parameters_and_no_docstring() -> None:
    """A function without parameters or docstring has an empty object schema, no description."""

    def ping() -> str:
        return "pong"

    assert tool_schema(ping).model_dump(exclude_none=True) == {
        "type": "function",
        "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
    }


def test_docstring_sections_and_precedence() -> None:
    """Only the first paragraph describes the tool; Annotated beats the docstring's Args."""

    def f(a: Annotated[int, "from Annotated"], b: str, c: int = 0, **extra: Any) -> None:
        """Look something up
        across two lines.

        More detail that stays out of the description.

        Arguments:
            a: ignored, Annotated wins.
            *extra: not a parameter in the schema.
            b: the b.

        Raises:
            c: not an argument, this is the Raises section.
        """

    schema = tool_schema(f).function
    assert schema.description == "Look something up across two lines."
    assert schema.parameters["properties"] == {
        "a": {"type": "integer", "description": "from Annotated"},
        "b": {"type": "string", "description": "the b."},
        "c": {"type": "integer", "default": 0},
    }


def test_name_and_description_overrides() -> None:
    """tool_schema(name=, description=) override the function's name and docstring."""

    def f(a: int) -> int:
        """Original."""
        return a

    schema = tool_schema(f, name="renamed", description="Better text")
    assert (schema.name, schema.function.description) == ("renamed", "Better text")


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (with_param(bytes), r"parameter 'x' of tool 'f' has an unsupported type bytes"),
        (with_param(dict[int, str]), r"parameter 'x' .*JSON object keys are strings"),
        (with_param(list[complex]), r"parameter 'x' of tool 'f' has an unsupported type complex"),
        (with_param(Literal[b"x"]), r"parameter 'x' .*enum values must be JSON scalars"),
        (with_param("Missing"), r"type 'Missing' of parameter 'x' .*could not be resolved"),
        (with_param(int, object()), r"default of parameter 'x' .*JSON"),
        (lambda x: x, r"tool name '<lambda>' must match .*pass name="),
    ],
    ids=["bytes", "int-keys", "complex-items", "bytes-literal", "unresolved", "default", "lambda"],
)
def test_unsupported_definitions_raise_clear_tool_errors(
    fn: Callable[..., Any], match: str
) -> None:
    """Annotations JSON Schema cannot express raise a ToolError naming the parameter."""
    with pytest.raises(ToolError, match=match):
        tool_schema(fn)


def test_missing_annotation_and_star_args_are_refused() -> None:
    """An unannotated parameter and *args raise ToolErrors that say how to fix them."""

    def untyped(a):  # type: ignore[no-untyped-def]
        return a

    def star(*items: str) -> None:
        return None

    with pytest.raises(ToolError, match=r"parameter 'a' of tool 'untyped' has no type annotation"):
        tool_schema(untyped)
    with pytest.raises(ToolError, match=r"takes \*items.*use a list parameter"):
        tool_schema(star)


def test_tool_decorator_attaches_schema_and_keeps_the_function() -> None:
    """@tool and @tool(...) attach the schema; the function stays directly callable."""

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool(name="times", description="Multiply")
    async def mul(a: int, b: int) -> int:
        return a * b

    assert add(2, 3) == 5
    assert add.__tool_schema__ == tool_schema(add)  # type: ignore[attr-defined]
    assert mul.__tool_schema__.name == "times"  # type: ignore[attr-defined]
    assert tool_schema(mul).function.description == "Multiply"
    assert Toolbox([add, mul]).names == ["add", "times"]


def test_methods_are_tools_once_bound() -> None:
    """A bound method is a tool without `self`; an unbound one is refused by Toolbox."""

    class Calculator:
        def __init__(self) -> None:
            self.offset = 100

        @tool
        def shift(self, a: int) -> int:
            """Add the offset."""
            return a + self.offset

    assert params(Calculator.shift) == params(Calculator().shift)
    assert "self" not in params(Calculator.shift)["properties"]
    assert Toolbox([Calculator().shift]).names == ["shift"]
    with pytest.raises(ToolError, match=r"unbound method; pass the bound one \(e\.g\. self\.shift"):
        Toolbox([Calculator.shift])


def test_toolbox_refuses_duplicate_names() -> None:
    """Two functions with the same tool name are a ToolError, not a silent override."""

    def a(x: int) -> int:
        return x

    with pytest.raises(ToolError, match=r"two tools are named 'a'"):
        Toolbox([a, a])


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, {}),
        ("", {}),
        ("  \n", {}),
        ("null", {}),
        ('{"a": 1, "b": [true]}', {"a": 1, "b": [True]}),
        ({"a": 1}, {"a": 1}),
    ],
)
def test_parse_arguments_accepts_json_objects(raw: Any, expected: dict[str, Any]) -> None:
    """JSON object text or an object becomes a dict; empty or null arguments are {}."""
    assert parse_arguments(raw) == expected


NOT_AN_OBJECT = "arguments for tool 'add' must be a JSON object with one key per parameter, got "


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            '{"a": 1,',
            "arguments for tool 'add' are not valid JSON (Expecting property name enclosed in "
            'double quotes: line 1 column 9 (char 8)); send one JSON object, e.g. {"name": '
            '"value"}',
        ),
        ("[1, 2]", f"{NOT_AN_OBJECT}an array"),
        ("3", f"{NOT_AN_OBJECT}a number"),
        ('"x"', f"{NOT_AN_OBJECT}a string"),
        (5, "arguments for tool 'add' must be a JSON object, got int"),
    ],
)
def test_parse_arguments_errors_are_readable(raw: Any, message: str) -> None:
    """Bad JSON and non-objects raise a ToolError whose text the model can act on."""
    with pytest.raises(ToolError) as info:
        parse_arguments(raw, tool_name="add")
    assert str(info.value) == message
    assert info.value.tool_name == "add"


@given(st.text(max_size=40))
def test_parse_arguments_never_raises_anything_but_tool_error(raw: str) -> None:
    """Any text gives a dict or a ToolError, never another exception."""
    with contextlib.suppress(ToolError):
        assert isinstance(parse_arguments(raw), dict)


ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "b": {"type": "number"},
                "items": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["a", "b"],
        },
    },
}


def test_validate_arguments_accepts_valid_args_in_every_tool_form() -> None:
    """Valid args pass for a tool dict, its function part and an OpenAIFunctionToolSchema."""
    args = {"a": 1, "b": 2.5, "items": [1, 2]}
    validate_arguments(ADD_TOOL, args)
    validate_arguments(ADD_TOOL["function"], args)
    model = OpenAIFunctionToolSchema.model_validate(ADD_TOOL)
    validate_arguments(model, args)
    validate_arguments(model.function, args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"a": 1}, "invalid arguments for tool 'add': $: 'b' is a required property"),
        ({"a": 1, "b": "2"}, "invalid arguments for tool 'add': $.b: '2' is not of type 'number'"),
        (
            {"a": 1, "b": 2, "items": [1, "x"]},
            "invalid arguments for tool 'add': $.items[1]: 'x' is not of type 'integer'",
        ),
        (
            {"a": True, "items": {}},
            "invalid arguments for tool 'add': $: 'b' is a required property; "
            "$.a: True is not of type 'number'; $.items: {} is not of type 'array'",
        ),
    ],
)
def test_validate_arguments_names_the_failing_path(args: dict[str, Any], message: str) -> None:
    """Schema violations raise a ToolError naming each failing JSON path."""
    with pytest.raises(ToolError) as info:
        validate_arguments(ADD_TOOL, args)
    assert str(info.value) == message


def test_validate_arguments_caches_compiled_validators() -> None:
    """Equal schemas compile once, even when passed as distinct dict objects."""
    tool_def = json.loads(json.dumps(ADD_TOOL))
    tool_def["function"]["name"] = "cache_probe"
    tool_def["function"]["parameters"]["properties"]["probe"] = {"type": "string"}
    validate_arguments(tool_def, {"a": 1, "b": 2})
    before = tools._compiled.cache_info()
    validate_arguments(json.loads(json.dumps(tool_def)), {"a": 1, "b": 2})
    after = tools._compiled.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 1)


def test_validate_arguments_reports_a_broken_schema() -> None:
    """An invalid JSON Schema is a ToolError about the tool, not a jsonschema exception."""
    broken = {"name": "bad", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}
    with pytest.raises(ToolError, match=r"tool 'bad' has an invalid parameters schema"):
        validate_arguments(broken, {"a": 1})


def test_a_misspelt_type_in_a_schema_suggests_the_nearest() -> None:
    """The ToolError for ``"type": "integr"`` names ``integer`` and the valid types."""
    broken = {
        "name": "bad",
        "parameters": {"type": "object", "properties": {"a": {"type": "integr"}}},
    }
    with pytest.raises(ToolError) as caught:
        validate_arguments(broken, {"a": 1})
    assert str(caught.value) == (
        "tool 'bad' has an invalid parameters schema: 'integr' is not a JSON Schema type (did you "
        "mean 'integer'?); the types are array, boolean, integer, null, number, object, string"
    )


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def mul(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


async def test_results_keep_call_order_while_tools_run_concurrently() -> None:
    """A tool that finishes later still answers in its call's position; calls overlap."""
    fast_done = anyio.Event()
    finished: list[str] = []

    async def slow(label: str) -> str:
        await fast_done.wait()  # only returns if `fast` runs while `slow` is pending
        finished.append("slow")
        return f"slow {label}"

    async def fast(label: str) -> str:
        finished.append("fast")
        fast_done.set()
        return f"fast {label}"

    ctx = make_ctx()
    calls = [
        call("slow", '{"label": "one"}', "call_1"),
        call("fast", '{"label": "two"}', "call_2"),
    ]
    with anyio.fail_after(5):
        messages = await Toolbox([slow, fast]).execute(ctx, calls)

    assert finished == ["fast", "slow"]
    assert messages == [
        {"role": "tool", "tool_call_id": "call_1", "content": "slow one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "fast two"},
    ]


async def test_sync_tools_run_in_a_worker_thread_and_results_are_json() -> None:
    """Sync tools run off the event loop; non-str results are JSON-encoded."""
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def stats(values: list[int]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return {"sum": sum(values), "max": max(values)}

    def nothing() -> None:
        threads.append(threading.get_ident())

    def point() -> Point:
        return Point(x=1)

    messages = await Toolbox([stats, nothing, point, add]).execute(
        make_ctx(),
        [
            call("stats", '{"values": [1, 5, 2]}', "c1"),
            call("nothing", "", "c2"),
            call("point", None, "c3"),
            call("add", '{"a": 3, "b": 4}', "c4"),
        ],
    )

    assert [m["content"] for m in messages] == ['{"sum":8,"max":5}', "null", '{"x":1,"y":0}', "7.0"]
    assert len(threads) == 2
    assert loop_thread not in threads


async def test_arguments_are_converted_to_the_annotated_types() -> None:
    """Enums, pydantic models and tuples arrive as those types, not as raw JSON values."""
    seen: dict[str, Any] = {}

    async def paint(
        color: Color, at: Point, size: tuple[int, int], level: Level = Level.LOW
    ) -> str:
        seen.update(color=color, at=at, size=size, level=level)
        return "ok"

    args = {"color": "blue", "at": {"x": 3}, "size": [2, 4], "level": 2}
    [message] = await Toolbox([paint]).execute(make_ctx(), [call("paint", json.dumps(args))])

    assert message["content"] == "ok"
    assert seen == {"color": Color.BLUE, "at": Point(x=3), "size": (2, 4), "level": Level.HIGH}


async def test_every_schema_valid_call_reaches_the_function_with_its_types() -> None:
    """Whatever the schema allows, the function receives as its annotated Python types."""

    def rich(
        color: Color,
        at: Point,
        size: tuple[int, str],
        tags: set[str],
        movie: Movie,
        weights: list[float],
        mode: Literal["fast", 2],
        counts: dict[str, int],
        segment: Segment | None = None,
        limit: int | None = None,
    ) -> str:
        assert isinstance(color, Color)
        assert isinstance(at, Point)
        assert isinstance(size, tuple)
        assert isinstance(tags, set)
        assert isinstance(movie, dict)
        assert all(type(w) is float for w in weights)
        assert mode in ("fast", 2)
        assert all(type(v) is int for v in counts.values())
        assert segment is None or isinstance(segment.start, Point)
        assert limit is None or type(limit) is int
        return "ok"

    toolbox = Toolbox([rich])
    parameters = toolbox.schemas[0].function.parameters
    calls = [
        call("rich", json.dumps(generate(parameters, seed=seed)), f"c{seed}") for seed in range(25)
    ]
    messages = await toolbox.execute(make_ctx(), calls)
    assert [m["content"] for m in messages] == ["ok"] * 25


async def test_context_is_passed_to_tools_that_ask_for_it() -> None:
    """A `ctx` parameter and a RolloutContext-annotated one both receive the rollout context."""
    received: list[Any] = []

    async def by_name(ctx, x: int) -> int:  # type: ignore[no-untyped-def]
        received.append(ctx)
        return x

    def by_type(context: RolloutContext, x: int) -> int:
        received.append(context)
        return x

    ctx = make_ctx()
    await Toolbox([by_name, by_type]).execute(
        ctx, [call("by_name", '{"x": 1}'), call("by_type", '{"x": 2}')]
    )
    assert len(received) == 2
    assert all(item is ctx for item in received)


def div(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def refuse(city: str) -> str:
    """Raise a ToolError meant for the model."""
    raise ToolError(f"no weather data for {city!r}; try a capital city")


@pytest.mark.parametrize(
    ("tool_call", "content"),
    [
        (call("foo"), "Error: unknown tool 'foo'; available: add, mul, div, refuse"),
        (
            {"id": "call_1", "type": "function"},
            "Error: unknown tool (missing name); available: add, mul, div, refuse",
        ),
        (
            call("add", "{oops"),
            "Error: arguments for tool 'add' are not valid JSON (Expecting property name "
            "enclosed in double quotes: line 1 column 2 (char 1)); send one JSON object, "
            'e.g. {"name": "value"}',
        ),
        (
            call("add", "[3, 4]"),
            "Error: arguments for tool 'add' must be a JSON object with one key per parameter, "
            "got an array",
        ),
        (
            call("add", '{"a": 3}'),
            "Error: invalid arguments for tool 'add': $: 'b' is a required property",
        ),
        (
            call("add", '{"a": 3, "b": "four"}'),
            "Error: invalid arguments for tool 'add': $.b: 'four' is not of type 'number'",
        ),
        (
            call("add", '{"a": 3, "b": 4, "c": 5}'),
            "Error: invalid arguments for tool 'add': unexpected argument 'c'; expected: a, b",
        ),
        (
            call("div", '{"a": 1, "b": 0}'),
            "Error: tool 'div' raised ZeroDivisionError: float division by zero",
        ),
        (
            call("refuse", '{"city": "Atlantis"}'),
            "Error: no weather data for 'Atlantis'; try a capital city",
        ),
    ],
    ids=[
        "unknown",
        "no-name",
        "bad-json",
        "not-object",
        "missing",
        "wrong-type",
        "unexpected",
        "raises",
        "tool-error",
    ],
)
async def test_failures_become_tool_messages_the_model_can_read(
    tool_call: dict[str, Any], content: str
) -> None:
    """Every failure of a call is a tool message with a precise error, never an exception."""
    ctx = make_ctx()
    messages = await Toolbox([add, mul, div, refuse]).execute(ctx, [tool_call])
    assert messages == [{"role": "tool", "tool_call_id": "call_1", "content": content}]
    assert ctx.metrics.num_tool_calls == 1


async def test_timeouts_become_error_messages() -> None:
    """A tool past its timeout (async or sync in a thread) answers with a timeout error."""
    release = threading.Event()

    async def hang() -> str:
        await anyio.Event().wait()
        return "never"

    def block() -> str:
        release.wait(5)
        return "late"

    toolbox = Toolbox([hang, block, add], timeout_s=0.05)
    try:
        messages = await toolbox.execute(
            make_ctx(),
            [
                call("hang", "", "c1"),
                call("block", "", "c2"),
                call("add", '{"a": 1, "b": 1}', "c3"),
            ],
        )
    finally:
        release.set()
    assert [m["content"] for m in messages] == [
        "Error: tool 'hang' timed out after 0.05 s",
        "Error: tool 'block' timed out after 0.05 s",
        "2.0",
    ]
    unlimited = await toolbox.execute(make_ctx(), [call("block", "", "c4")], timeout_s=5)
    assert unlimited[0]["content"] == "late"


async def test_outer_cancellation_is_not_turned_into_a_message() -> None:
    """Cancelling the rollout cancels its tools; execute does not swallow the cancellation."""
    reached_end = False
    with anyio.CancelScope() as scope:

        async def stop_everything() -> str:
            scope.cancel()
            await anyio.Event().wait()
            return "never"

        await Toolbox([stop_everything]).execute(make_ctx(), [call("stop_everything")])
        reached_end = True
    assert scope.cancelled_caught
    assert not reached_end


async def test_metrics_and_trace_record_every_call() -> None:
    """Each call, failed or not, counts in num_tool_calls, adds latency, and is traced."""
    events: list[dict[str, Any]] = []
    ctx = make_ctx(events)

    async def wait_a_bit() -> str:
        with anyio.move_on_after(0.02):
            await anyio.Event().wait()
        return "waited"

    messages = await Toolbox([add, wait_a_bit]).execute(
        ctx,
        [
            call("add", '{"a": 1, "b": 2}', "c1"),
            call("nope", "{}", "c2"),
            call("wait_a_bit", "", "c3"),
        ],
    )

    assert [m["tool_call_id"] for m in messages] == ["c1", "c2", "c3"]
    metrics = ctx.metrics
    assert metrics.num_tool_calls == 3
    assert metrics.tool_latency_ms >= 10  # wait_a_bit alone waits 20 ms
    tool_events = [e for e in events if e["event"] == "tool_call"]
    assert sorted(e["tool_call_id"] for e in tool_events) == ["c1", "c2", "c3"]
    by_id = {e["tool_call_id"]: e for e in tool_events}
    assert (by_id["c1"]["tool"], by_id["c1"]["error"]) == ("add", None)
    assert by_id["c2"]["error"] == "unknown tool 'nope'; available: add, wait_a_bit"
    assert all(e["rollout_id"] == "r-1" for e in tool_events)


async def test_empty_batch_does_nothing() -> None:
    """No tool calls give no messages and leave the metrics untouched."""
    ctx = make_ctx()
    assert await Toolbox([add]).execute(ctx, []) == []
    assert ctx.metrics.num_tool_calls == 0


async def test_execute_tool_calls_takes_a_dict_of_functions() -> None:
    """execute_tool_calls names tools by the dict's keys and accepts OpenAIToolCall models."""
    ctx = make_ctx()
    calls: list[Any] = [
        OpenAIToolCall.model_validate(call("plus", {"a": 1, "b": 2}, "c1")),
        call("times", '{"a": 3, "b": 4}', "c2"),
    ]
    messages = await execute_tool_calls(ctx, calls, {"plus": add, "times": mul})
    assert [m["content"] for m in messages] == ["3.0", "12.0"]
    again = await execute_tool_calls(ctx, calls[1:], Toolbox({"times": mul}))
    assert again == [{"role": "tool", "tool_call_id": "c2", "content": "12.0"}]
    assert ctx.metrics.num_tool_calls == 3


# --------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------


async def test_toolbox_agent_runs_end_to_end_against_the_mock_traingate(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """An agent built on Toolbox declares its tools and feeds correct tool results back."""
    gate, client = mock_client
    agent = load_asset("tool_agent").ToolAgent()
    gate.backend = ScriptedBackend(
        [
            {
                "content": None,
                "tool_calls": [
                    call("add", json.dumps({"a": 3, "b": 4}), "call_1"),
                    call("mul", json.dumps({"a": 2, "b": 5}), "call_2"),
                    call("turn", "{}", "call_3"),
                    call("sub", "{}", "call_4"),
                ],
            },
            {"content": "7 and 10"},
        ]
    )
    request = make_request()
    channel = client.channel(request)
    gate.expect(request.rollout_id, api_key="tg-secret-key", tools=agent.get_tools(request))

    response = await run_rollout(agent, request, channel)
    await client.complete_rollout(request.server_url, response, api_key=request.api_key_value)

    assert response.status is RolloutStatus.COMPLETED
    tool_messages = [m for m in response.final_messages if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "call_1", "content": "7.0"},
        {"role": "tool", "tool_call_id": "call_2", "content": "10.0"},
        {"role": "tool", "tool_call_id": "call_3", "content": "1"},
        {
            "role": "tool",
            "tool_call_id": "call_4",
            "content": "Error: unknown tool 'sub'; available: add, mul, turn",
        },
    ]
    assert [m["role"] for m in response.final_messages] == [
        "user", "assistant", "tool", "tool", "tool", "tool", "assistant"
    ]  # fmt: skip
    record = gate.records[request.rollout_id]
    assert record.chats[1].messages[2:6] == tool_messages
    # The mock TrainGate notices the undeclared tool; the agent answered it with an error.
    assert [f.code for f in record.findings] == ["unknown_tool"]
    assert record.tools[1].function.description == "Multiply two numbers"
    assert response.metrics is not None
    assert response.metrics.num_tool_calls == 4
    assert response.metrics.tool_latency_ms > 0


async def test_hung_sync_tools_do_not_starve_the_shared_thread_pool() -> None:
    """A sync tool that hangs past its timeout holds only its toolbox's own thread tokens."""
    import threading

    import anyio.to_thread

    release = threading.Event()

    def stuck() -> str:
        """Wait for the test to let go."""
        release.wait(10)
        return "late"

    toolbox = Toolbox([stuck], timeout_s=0.1, max_threads=2)
    shared = anyio.to_thread.current_default_thread_limiter()
    try:
        [message] = await toolbox.execute(make_ctx(), [call("stuck", "{}", "c1")])
        assert "timed out" in message["content"]
        assert shared.borrowed_tokens == 0
    finally:
        release.set()


async def test_sync_tools_stuck_past_their_timeout_cannot_pile_up_threads() -> None:
    """Once max_threads calls are stuck after timing out, new sync calls fail at once."""
    release = threading.Event()
    started = 0

    def stuck() -> str:
        """Wait for the test to let go."""
        nonlocal started
        started += 1
        release.wait(10)
        return "late"

    toolbox = Toolbox([stuck], timeout_s=0.05, max_threads=1)
    try:
        [first] = await toolbox.execute(make_ctx(), [call("stuck", "{}", "c1")])
        [second] = await toolbox.execute(make_ctx(), [call("stuck", "{}", "c2")])
    finally:
        release.set()
    assert first["content"] == "Error: tool 'stuck' timed out after 0.05 s"
    assert second["content"] == (
        "Error: tool 'stuck' cannot run now: 1 earlier sync tool calls timed out and have not "
        "returned yet"
    )
    assert started == 1  # the refused call never took a thread
    with anyio.fail_after(5):  # the stuck thread returns, and its place is free again
        while True:
            [again] = await toolbox.execute(make_ctx(), [call("stuck", "{}", "c3")], timeout_s=5)
            if "cannot run now" not in again["content"]:
                break
            await anyio.sleep(0.01)
    assert again["content"] == "late"


async def test_the_model_cannot_fill_the_context_parameter_through_kwargs() -> None:
    """A `ctx` argument from the model is refused even when the tool takes **kwargs."""
    seen: list[Any] = []

    def look(ctx: RolloutContext, query: str, **extra: Any) -> str:
        """Look something up."""
        seen.append(ctx)
        return query

    context = make_ctx()
    [refused, ok] = await Toolbox([look]).execute(
        context,
        [
            call("look", '{"query": "q", "ctx": 5}', "c1"),
            call("look", '{"query": "q", "other": 1}', "c2"),
        ],
    )
    assert refused["content"] == (
        "Error: invalid arguments for tool 'look': unexpected argument 'ctx'; expected: query"
    )
    assert ok["content"] == "q"
    assert seen == [context]


# -- the quick argument check: never more lenient than JSON Schema ----------------------------

_JSON_TYPES = ["string", "number", "integer", "boolean", "null", "object", "array"]
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.sampled_from([0.0, 1.0, -3.0, 2.5])
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)
_property_schemas = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(_JSON_TYPES) | st.lists(st.sampled_from(_JSON_TYPES), min_size=1),
        "description": st.text(max_size=5),
        "default": _json_values,
    },
)
_names = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def _simple_object_schemas(draw: st.DrawFn) -> dict[str, Any]:
    properties = draw(st.dictionaries(_names, _property_schemas, max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(_names, max_size=3, unique=True))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.booleans())
    return schema


_INTEGER = {"type": "object", "properties": {"a": {"type": "integer"}}}
_NUMBER = {"type": "object", "properties": {"a": {"type": ["number", "null"]}}, "required": ["a"]}


@given(_simple_object_schemas(), st.dictionaries(_names, _json_values, max_size=4))
@example(_INTEGER, {"a": 1.0})
@example(_INTEGER, {"a": 1.5})
@example(_INTEGER, {"a": True})
@example(_NUMBER, {"a": False})
@example(_NUMBER, {"a": None})
@example(_NUMBER, {})
@example({**_INTEGER, "additionalProperties": False}, {"b": 1})
def test_the_quick_argument_check_agrees_with_json_schema(
    schema: dict[str, Any], args: dict[str, Any]
) -> None:
    """For the schemas typed functions produce, the quick check accepts exactly what the full
    JSON Schema check accepts (it may only ever skip that check, never change its answer)."""
    import jsonschema

    from osmosis_rollout.tools.arguments import quick_check

    quick = quick_check(schema)
    assert quick is not None
    assert quick(args) == jsonschema.Draft202012Validator(schema).is_valid(args)


_annotation_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=3)
    | st.lists(st.integers(), max_size=2)
)
_loose_property_schemas = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(_JSON_TYPES) | st.lists(st.sampled_from(_JSON_TYPES), min_size=1),
        "description": _annotation_values,
        "title": _annotation_values,
        "deprecated": _annotation_values,
        "examples": _annotation_values,
        "$comment": _annotation_values,
    },
)


@st.composite
def _loose_object_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Simple object schemas, some of them invalid (an annotation of the wrong type, a type or
    required name listed twice)."""
    properties = draw(st.dictionaries(_names, _loose_property_schemas, max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(_names, max_size=3))
    if draw(st.booleans()):
        schema["description"] = draw(_annotation_values)
    return schema


@given(_loose_object_schemas())
@example({"type": "object", "properties": {"a": {"type": ["string", "string"]}}})
@example({"type": "object", "properties": {"a": {"description": 5}}})
@example({"type": "object", "properties": {}, "required": ["a", "a"]})
def test_a_schema_a_toolbox_compiles_is_one_json_schema_accepts(schema: dict[str, Any]) -> None:
    """A toolbox compiles each tool's schema at construction (the quick check may then skip
    it per call): it accepts exactly the schemas the meta-schema check accepts."""
    import jsonschema

    from osmosis_rollout.errors import ToolError
    from osmosis_rollout.tools.arguments import _validator

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        with pytest.raises(ToolError, match="invalid parameters schema"):
            _validator("t", schema)
    else:
        _validator("t", schema)


def test_the_quick_check_leaves_other_schemas_to_json_schema() -> None:
    from osmosis_rollout.tools.arguments import quick_check

    assert quick_check({"type": "object", "properties": {"a": {"type": "string"}}}) is not None
    for schema in (
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}},
        {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}},
        {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "int"}}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {}, "minProperties": 1},
        {"type": "array"},
        {"$ref": "#/$defs/x"},
    ):
        assert quick_check(schema) is None, schema


async def test_tool_arguments_are_still_checked_with_their_messages() -> None:
    """Arguments the quick check refuses get the full check's messages, as before."""

    def add(a: float, b: float) -> float:
        return a + b

    box = Toolbox([add])
    calls = [
        call("add", '{"a": 1, "b": 2.5}'),
        call("add", '{"a": "1", "b": true}'),
        call("add", '{"a": 1}'),
    ]
    ok, wrong_types, missing = await box.execute(make_ctx(), calls)
    assert ok["content"] == "3.5"
    assert wrong_types["content"] == (
        "Error: invalid arguments for tool 'add': $.a: '1' is not of type 'number'; "
        "$.b: True is not of type 'number'"
    )
    assert missing["content"] == (
        "Error: invalid arguments for tool 'add': $: 'b' is a required property"
    )


@pytest.mark.parametrize("calls", [1, 2, 3])
async def test_a_deadline_around_a_batch_also_cancels_what_a_tool_awaits_while_cleaning_up(
    calls: int,
) -> None:
    """A rollout's deadline is an anyio one: every await under it is cancelled, the ones in a
    tool's ``finally`` too, for a batch of calls as for one. A tool whose cleanup waits for
    something that never comes must not hold a timed-out rollout (and its callback) forever."""
    never = anyio.Event()
    ended: list[str] = []

    async def sticky(label: str) -> str:
        try:
            await anyio.sleep_forever()
        finally:
            try:
                await never.wait()
                ended.append("waited")
            except anyio.get_cancelled_exc_class():
                ended.append("cancelled")
                raise
        return label

    async def end_a_failing_run() -> None:
        await anyio.sleep(10)  # only reached when the cleanup was not cancelled
        never.set()

    batch = [call("sticky", json.dumps({"label": str(i)}), f"call_{i}") for i in range(calls)]
    async with anyio.create_task_group() as guard:
        guard.start_soon(end_a_failing_run)
        with anyio.move_on_after(0.1) as deadline:
            await Toolbox([sticky]).execute(make_ctx(), batch)
        guard.cancel_scope.cancel()
    assert deadline.cancelled_caught
    assert ended == ["cancelled"] * calls
    await anyio.lowlevel.checkpoint()  # the caller goes on: no cancellation is left over


async def test_a_toolkit_error_in_one_call_of_a_batch_cancels_the_others_and_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a tool's error (those are messages) but the toolkit's own: raised as the call raised
    it, once every other call of the batch has been cancelled and has ended."""
    cancelled: list[str] = []

    async def slow(label: str) -> str:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(label)
            raise
        return label

    async def broken(label: str) -> str:
        return label

    box = Toolbox([slow, broken])
    original = box._run_one

    async def run_one(ctx: RolloutContext, tool_call: dict[str, Any], limit: Any) -> Any:
        if tool_call["function"]["name"] == "broken":
            raise LookupError("a toolkit bug")
        return await original(ctx, tool_call, limit)

    monkeypatch.setattr(box, "_run_one", run_one)
    batch = [call("slow", '{"label": "a"}', "call_1"), call("broken", '{"label": "b"}', "call_2")]
    with anyio.fail_after(5), pytest.raises(LookupError, match="a toolkit bug"):
        await box.execute(make_ctx(), batch)
    assert cancelled == ["a"]
