"""Running the model's tool calls: ``Toolbox`` and ``execute_tool_calls``.

Whatever goes wrong in a call becomes a ``"role": "tool"`` message, never an exception that
would end the rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel, ValidationError
from pydantic_core import to_json

from .. import telemetry
from ..agent import RolloutContext, declared_tool, record_tool_cut, tool_batch
from ..errors import ToolError
from ..protocol import Message, OpenAIFunctionToolSchema, describe_validation_error
from ..tracing import clip_text
from .arguments import _check, _shorten, _validator, parse_arguments, quick_check
from .schema import _build_spec, _ToolSpec
from .threads import ToolThreads

if TYPE_CHECKING:
    import jsonschema

logger = logging.getLogger("osmosis_rollout.tools")


def _encode(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return to_json(result, fallback=str).decode()
    except Exception as exc:  # e.g. a circular structure
        raise ToolError(f"the result could not be encoded as JSON: {exc}") from None


class _ToolFailed(ToolError):
    """The tool itself failed (``kind``: it ``"raised"``, hit its ``"timeout"``, or its
    function refused arguments that its declared schema allows: ``"schema"``), as opposed to a
    call the model got wrong: what a result's ``tool_errors`` counts."""

    def __init__(self, message: str, *, tool_name: str, kind: str) -> None:
        super().__init__(message, tool_name=tool_name)
        self.kind = kind


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # e.g. trio, through anyio
        return False
    return True


async def _run_tasks(calls: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``calls`` as asyncio tasks; all have ended when this returns or raises.

    The first toolkit bug cancels the others and is raised (several: as a group). Each
    cancellation of the caller is passed on to the calls still running: anyio's deadlines (a
    rollout's) are delivered again until the work under them ends, so, as under an anyio task
    group, they also cancel what a tool awaits while it cleans up (``asyncio.TaskGroup`` would
    cancel the calls once, and a tool stuck in its ``finally`` would hold the rollout forever).
    """
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(call) for call in calls]
    try:
        _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        await _cancel_until_done(tasks)
        raise
    if pending:  # one raised: the rest are not needed
        await _cancel_until_done(tasks)
    errors: list[BaseException] = []
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise BaseExceptionGroup("tool calls failed", errors)


async def _cancel_until_done(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling them again at each cancellation of ours."""
    while not all(task.done() for task in tasks):
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(tasks)


def _as_dict(call: Any) -> dict[str, Any]:
    if isinstance(call, BaseModel):
        return call.model_dump()
    return call if isinstance(call, dict) else {}


class Toolbox:
    """Python functions served as tools: their schemas, and a runner for the model's calls.

    ``functions`` is a list of functions (plain or ``@tool``-marked, sync or async, bound
    methods included) or a mapping from tool name to function. ``timeout_s`` bounds each call;
    a sync function that times out keeps running in its worker thread, but its result is
    dropped. At most ``max_threads`` sync calls run at once (a limit of this toolbox's own, so
    tools that hang can never starve the server's shared thread pool), and at most
    ``max_threads`` more may still hold a thread after timing out; while that many are stuck,
    further sync calls fail at once with an error message, so hung tools cannot pile up
    threads without bound.
    """

    def __init__(
        self,
        functions: Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
        *,
        timeout_s: float | None = None,
        max_threads: int = 32,
    ) -> None:
        if isinstance(functions, Mapping):
            specs = [_build_spec(fn, name) for name, fn in functions.items()]
        else:
            specs = [_build_spec(fn) for fn in functions]
        self._specs: dict[str, _ToolSpec] = {}
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}
        self._quick: dict[str, Callable[[Mapping[str, Any]], bool] | None] = {}
        for spec in specs:
            if spec.unbound_self:
                raise ToolError(
                    f"tool {spec.name!r} is an unbound method; pass the bound one "
                    f"(e.g. self.{spec.name})",
                    tool_name=spec.name,
                )
            if spec.name in self._specs:
                raise ToolError(f"two tools are named {spec.name!r}", tool_name=spec.name)
            self._specs[spec.name] = spec
            parameters = spec.schema.function.parameters
            self._quick[spec.name] = quick_check(parameters)
            # Compiled now, so that a bad schema fails here rather than at a call.
            self._validators[spec.name] = _validator(spec.name, parameters)
        self.timeout_s = timeout_s
        self._threads = ToolThreads(max_threads)

    @property
    def max_threads(self) -> int:
        """At most this many sync calls run at once, and this many more may be stuck."""
        return self._threads.limit

    @max_threads.setter
    def max_threads(self, value: int) -> None:
        self._threads.limit = value

    @property
    def schemas(self) -> list[OpenAIFunctionToolSchema]:
        """The tools to return from ``get_tools``."""
        return [spec.schema for spec in self._specs.values()]

    @property
    def names(self) -> list[str]:
        """Tool names, in the order the functions were given."""
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Toolbox({', '.join(self._specs)})"

    async def execute(
        self,
        ctx: RolloutContext,
        tool_calls: Sequence[Mapping[str, Any] | BaseModel],
        *,
        timeout_s: float | None = None,
    ) -> list[Message]:
        """Run a batch of tool calls concurrently; return one tool message per call, in order.

        ``tool_calls`` are the OpenAI dicts from ``CompletionsResult.tool_calls``. Failures
        become ``"Error: ..."`` messages; each call's latency goes to ``ctx.record_tool_call``.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        results: list[Message] = [{} for _ in tool_calls]

        async def run(index: int, call: Mapping[str, Any] | BaseModel) -> None:
            results[index] = await self._run_one(ctx, _as_dict(call), timeout)

        with tool_batch(ctx):
            if len(tool_calls) == 1:  # most turns: no task group to pay for
                await run(0, tool_calls[0])
                return results
            if not tool_calls:
                return results
            if _on_asyncio():  # a quarter of the cost of anyio's task group
                await _run_tasks([run(index, call) for index, call in enumerate(tool_calls)])
                return results
            try:
                async with anyio.create_task_group() as group:  # e.g. trio
                    for index, call in enumerate(tool_calls):
                        group.start_soon(run, index, call)
            except BaseExceptionGroup as group:  # a toolkit bug: raised as one call raises it
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
        return results

    async def _run_one(
        self, ctx: RolloutContext, call: dict[str, Any], time_limit: float | None
    ) -> Message:
        call_id = call.get("id")
        call_id = call_id if isinstance(call_id, str) else ""
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        started = time.perf_counter()
        error: str | None = None
        failed: str | None = None
        try:
            tool = name if isinstance(name, str) else None
            with telemetry.tool_span(ctx.request.rollout_id, tool, ctx.turns):
                content = await self._call(ctx, name, function.get("arguments"), time_limit)
        except ToolError as exc:
            error = _shorten(str(exc))
            content = f"Error: {error}"
            failed = exc.kind if isinstance(exc, _ToolFailed) else None
        except anyio.get_cancelled_exc_class():
            # Cut by a deadline (the rollout's): its message can name the tool that held it.
            if name in self._specs:
                record_tool_cut(ctx, name, started)
            raise
        latency_ms = (time.perf_counter() - started) * 1000
        known = name if name in self._specs else None
        ctx.record_tool_call(latency_ms, tool=known, error=failed)
        result, result_chars = clip_text(content)
        ctx.log_event(
            "tool_call",
            turn=ctx.turns,
            tool=name,
            tool_call_id=call_id,
            arguments=function.get("arguments"),
            result=result,
            result_chars=result_chars,
            latency_ms=round(latency_ms, 3),
            error=error,
            **({"failed": failed} if failed else {}),
        )
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    async def _call(
        self, ctx: RolloutContext, name: Any, raw_args: Any, time_limit: float | None
    ) -> str:
        spec = self._specs.get(name) if isinstance(name, str) else None
        if spec is None:
            available = ", ".join(self._specs) or "(none)"
            shown = repr(name) if isinstance(name, str) else "(missing name)"
            raise ToolError(f"unknown tool {shown}; available: {available}", tool_name=None)
        args = parse_arguments(raw_args, tool_name=spec.name)
        quick = self._quick[spec.name]
        try:
            if quick is None or not quick(args):  # the full check, for its messages
                _check(spec.name, self._validators[spec.name], args)
            self._check_names(spec, args)
        except ToolError as exc:
            if _declared_allows(ctx, spec, args):  # the agent's bug, not the model's
                raise _ToolFailed(str(exc), tool_name=spec.name, kind="schema") from None
            raise
        positional, keywords = self._bind(ctx, spec, args)
        if time_limit is None:  # no cancel scope to pay for
            return _encode(await self._invoke(spec, positional, keywords))
        result: Any = None
        with anyio.move_on_after(time_limit) as scope:
            result = await self._invoke(spec, positional, keywords)
        if scope.cancelled_caught:
            raise _ToolFailed(
                f"tool {spec.name!r} timed out after {time_limit:g} s",
                tool_name=spec.name,
                kind="timeout",
            )
        return _encode(result)

    async def _invoke(
        self, spec: _ToolSpec, positional: list[Any], keywords: dict[str, Any]
    ) -> Any:
        """Call the tool (sync ones on this toolbox's threads); its exceptions become ToolError."""
        try:
            if spec.is_async:
                result = await spec.fn(*positional, **keywords)
            else:
                call = functools.partial(spec.fn, *positional, **keywords)
                result = await self._run_in_thread(spec.name, call)
            if inspect.isawaitable(result):
                result = await result
        except ToolError as exc:  # the tool's own message, meant for the model
            raise _ToolFailed(str(exc), tool_name=spec.name, kind="raised") from None
        except Exception as exc:  # a tool's bug is the model's feedback, not a crash
            logger.debug("tool %r raised", spec.name, exc_info=True)
            raise _ToolFailed(
                f"tool {spec.name!r} raised {type(exc).__name__}: {exc}",
                tool_name=spec.name,
                kind="raised",
            ) from None
        return result

    async def _run_in_thread(self, name: str, call: Callable[[], Any]) -> Any:
        """Run a sync tool on this toolbox's threads, unless too many are stuck already."""
        stuck = self._threads.stuck
        if stuck >= self._threads.limit:
            raise ToolError(
                f"tool {name!r} cannot run now: {stuck} earlier sync tool calls "
                "timed out and have not returned yet",
                tool_name=name,
            )
        return await self._threads.run(call)

    @staticmethod
    def _check_names(spec: _ToolSpec, args: dict[str, Any]) -> None:
        """Every argument names a parameter of the function (a model cannot fill the ctx
        parameter, even through ``**kwargs``)."""
        unexpected = [
            key
            for key in args
            if key not in spec.params and (key in spec.context_params or not spec.var_keyword)
        ]
        if unexpected:
            expected = ", ".join(spec.params) or "no arguments"
            raise ToolError(
                f"invalid arguments for tool {spec.name!r}: unexpected argument "
                f"{', '.join(map(repr, unexpected))}; expected: {expected}",
                tool_name=spec.name,
            )

    @staticmethod
    def _bind(
        ctx: RolloutContext, spec: _ToolSpec, args: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        keywords: dict[str, Any] = dict.fromkeys(spec.context_params, ctx)
        for key, value in args.items():
            param = spec.params.get(key)
            if param is not None and param.adapter is not None:
                try:
                    value = param.adapter.validate_python(value)
                except ValidationError as exc:
                    raise ToolError(
                        f"invalid arguments for tool {spec.name!r}: {key}: "
                        f"{describe_validation_error(exc)}",
                        tool_name=spec.name,
                    ) from None
            keywords[key] = value
        positional = [
            keywords.pop(p.name, p.default) for p in spec.params.values() if p.positional_only
        ]
        return positional, keywords


def _declared_allows(ctx: RolloutContext, spec: _ToolSpec, args: dict[str, Any]) -> bool:
    """Whether arguments this toolbox refused are ones the schema the model was shown allows.

    A model's bad arguments are its own mistake, the training signal a tool error message is
    for, and not counted against the tool. But when ``get_tools`` declared a schema of its own
    for the tool (not ``toolbox.schemas``), a call that schema accepts, naming only the
    properties it declares, was refused because the schema and the function disagree: every
    such call fails whatever the model learns, so it is counted as the tool's failure. Only
    run on a refused call, so it costs the calls that succeed nothing.
    """
    declared = declared_tool(ctx, spec.name)
    if declared is None:
        return False
    parameters = declared.function.parameters
    if parameters == spec.schema.function.parameters:
        return False  # the toolbox's own schema: the model saw what the function takes
    properties = parameters.get("properties", {})
    if not isinstance(properties, Mapping) or not set(args) <= set(properties):
        return False
    try:
        _check(spec.name, _validator(spec.name, parameters), args)
    except ToolError:  # refused by what the model saw too, or a schema we cannot check
        return False
    return True


async def execute_tool_calls(
    ctx: RolloutContext,
    tool_calls: Sequence[Mapping[str, Any] | BaseModel],
    functions: Toolbox | Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
    *,
    timeout_s: float | None = None,
) -> list[Message]:
    """Run ``tool_calls`` with ``functions`` (a dict by tool name, a list, or a Toolbox).

    Same behaviour as :meth:`Toolbox.execute`; build a ``Toolbox`` once to skip re-reading the
    functions' signatures on every turn.
    """
    toolbox = functions if isinstance(functions, Toolbox) else Toolbox(functions)
    return await toolbox.execute(ctx, tool_calls, timeout_s=timeout_s)
