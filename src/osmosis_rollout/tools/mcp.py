"""MCP tool sets: the tools a team already serves over MCP become the agent's tools.

:class:`McpTools` names an MCP server (a command run over stdio, or a streamable HTTP URL).
``await mcp.schemas()`` lists its tools once, as OpenAI function tools (their MCP input schemas
verbatim), for ``get_tools`` to return, so ``osmosis validate`` checks them like any other.
``async with mcp.connect() as toolbox:`` opens one session for a rollout and yields an
:class:`McpToolbox`: a :class:`~.toolbox.Toolbox` whose calls go to the server, with the
same argument checks, timeouts, traces and metrics, and errors the model can read.

Needs ``pip install 'osmosis-rollout[mcp]'``; imported only when a server is reached.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ToolError
from ..protocol import OpenAIFunctionSchema, OpenAIFunctionToolSchema
from .arguments import _validator, quick_check
from .schema import _ToolSpec
from .toolbox import Toolbox

__all__ = ["McpToolbox", "McpTools", "StdioServer"]


@dataclass(frozen=True)
class StdioServer:
    """An MCP server this process starts and talks to over its stdin and stdout."""

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None


def _require_mcp() -> Any:
    try:
        import mcp
    except ImportError:
        raise ImportError(
            "MCP tool sets need the mcp package: pip install 'osmosis-rollout[mcp]'"
        ) from None
    return mcp


def _schema(tool: Any) -> OpenAIFunctionToolSchema:
    """An MCP tool as an OpenAI function tool: name, description, input schema verbatim."""
    parameters = dict(tool.input_schema or {"type": "object", "properties": {}})
    function = OpenAIFunctionSchema(
        name=tool.name, description=tool.description, parameters=parameters
    )
    return OpenAIFunctionToolSchema(function=function)


def _text(result: Any) -> str:
    """A tool result as the text the model reads: its text blocks, else its structured data."""
    texts = [block.text for block in result.content or [] if getattr(block, "text", None)]
    if texts:
        return "\n".join(texts)
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        import json

        return json.dumps(structured)
    return ""


@dataclass
class McpTools:
    """An MCP server's tools: ``server`` is a :class:`StdioServer` or a streamable HTTP URL.

    ``timeout_s`` bounds each call (the toolbox's timeout), ``max_concurrent`` the calls one
    rollout's session runs at once."""

    server: StdioServer | str
    timeout_s: float | None = 30.0
    max_concurrent: int = 8
    _tools: list[Any] | None = field(default=None, init=False, repr=False)

    def _client(self) -> Any:
        mcp = _require_mcp()
        if isinstance(self.server, str):
            return mcp.Client(self.server)
        from mcp.client.stdio import StdioServerParameters

        params = StdioServerParameters(
            command=self.server.command,
            args=list(self.server.args),
            env=dict(self.server.env) if self.server.env is not None else None,
            cwd=self.server.cwd,
        )
        return mcp.Client(params)

    def _where(self) -> str:
        if isinstance(self.server, str):
            return self.server
        return " ".join([self.server.command, *self.server.args])

    async def _list(self, client: Any) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def schemas(self) -> list[OpenAIFunctionToolSchema]:
        """The server's tools as OpenAI function tools, listed once (``get_tools`` returns
        them). A server that cannot be reached is a ``ToolError`` naming it."""
        if self._tools is None:
            try:
                async with self._client() as client:
                    self._tools = await self._list(client)
            except ImportError:
                raise
            except Exception as exc:
                raise ToolError(
                    f"cannot list the tools of the MCP server {self._where()}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        return [_schema(tool) for tool in self._tools]

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[McpToolbox]:
        """One session with the server (for one rollout): a toolbox whose calls go there."""
        schemas = await self.schemas()
        async with self._client() as client:
            yield McpToolbox(client, schemas, timeout_s=self.timeout_s, limit=self.max_concurrent)


class McpToolbox(Toolbox):
    """A :class:`Toolbox` of one MCP session's tools: each call is ``tools/call`` on it."""

    def __init__(
        self,
        client: Any,
        schemas: Sequence[OpenAIFunctionToolSchema],
        *,
        timeout_s: float | None,
        limit: int,
    ) -> None:
        super().__init__([], timeout_s=timeout_s)
        import anyio

        self._client = client
        self._limit = anyio.Semaphore(max(1, limit))
        for schema in schemas:
            name = schema.name
            parameters = schema.function.parameters
            self._specs[name] = _ToolSpec(
                fn=self._caller(name),
                schema=schema,
                params={},
                context_params=(),
                var_keyword=True,  # every argument goes to the server as the schema says
                unbound_self=False,
                is_async=True,
            )
            self._quick[name] = quick_check(parameters)
            self._validators[name] = _validator(name, parameters)

    def _caller(self, name: str) -> Any:
        async def call(**arguments: Any) -> str:
            async with self._limit:
                result = await self._client.call_tool(name, arguments)
            text = _text(result)
            if result.is_error:
                raise ToolError(text or f"tool {name!r} failed on the MCP server", tool_name=name)
            return text

        call.__name__ = name
        return call
