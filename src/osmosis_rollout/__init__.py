"""osmosis-rollout: build, validate, serve and test LLM agent loops for RL rollouts.

The names an agent author needs, in one table (``_EXPORTS``: name -> home module); ``__all__``
is derived from it. They are imported lazily (PEP 562), so ``osmosis --help`` does not pay for
pydantic, Starlette and httpx2.

Public API (kept within a major version; docs/architecture.md, "Public API"): the ``__all__``
of this package; of the packages ``testing`` (what a pytest of an agent imports), ``tools``,
``evaluation`` (``run_test``, the engine of ``osmosis test``), ``server`` (``create_app``,
``serve``), ``validator``, ``view`` (``build_index``) and ``compat`` (the legacy SDK's names:
docs/migrating-from-v1.md); and of the modules ``protocol`` (the wire models), ``errors`` (the
exception tree), ``findings`` (the findings table), ``tools.mcp``, ``trajectory`` and
``scaffold``. Every other module, and every other submodule of those packages, is internal:
import from the package, not the submodule; internals change freely.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .agent import RolloutAgentLoop, RolloutContext
    from .errors import (
        AgentDefinitionError,
        LLMBackendError,
        OsmosisError,
        ToolArgumentError,
        ToolError,
        TrainGateError,
    )
    from .protocol import (
        CompletionsRequest,
        CompletionsResponse,
        InitResponse,
        Message,
        OpenAIFunctionSchema,
        OpenAIFunctionToolSchema,
        RolloutMetrics,
        RolloutRequest,
        RolloutResponse,
        RolloutStatus,
    )
    from .results import CompletionsResult, RolloutResult
    from .rollout import (
        run_rollout,
    )
    from .tools import (
        Toolbox,
        execute_tool_calls,
        parse_arguments,
        tool,
        tool_schema,
        validate_arguments,
    )
    from .validator import (
        Problem,
        ValidationResult,
        validate_agent_loop,
        validate_agent_loop_async,
    )

_EXPORTS: dict[str, str] = {
    "CompletionsResult": "results",
    "RolloutAgentLoop": "agent",
    "RolloutContext": "agent",
    "RolloutResult": "results",
    "AgentDefinitionError": "errors",
    "LLMBackendError": "errors",
    "OsmosisError": "errors",
    "ToolArgumentError": "errors",
    "ToolError": "errors",
    "TrainGateError": "errors",
    "CompletionsRequest": "protocol",
    "CompletionsResponse": "protocol",
    "InitResponse": "protocol",
    "Message": "protocol",
    "OpenAIFunctionSchema": "protocol",
    "OpenAIFunctionToolSchema": "protocol",
    "RolloutMetrics": "protocol",
    "RolloutRequest": "protocol",
    "RolloutResponse": "protocol",
    "RolloutStatus": "protocol",
    "run_rollout": "rollout",
    "Toolbox": "tools",
    "execute_tool_calls": "tools",
    "parse_arguments": "tools",
    "tool": "tools",
    "tool_schema": "tools",
    "validate_arguments": "tools",
    "Problem": "validator",
    "ValidationResult": "validator",
    "validate_agent_loop": "validator",
    "validate_agent_loop_async": "validator",
}

__all__ = sorted([*_EXPORTS, "__version__"])

#: Names this package exported before the public surface was narrowed, and where they live
#: now: an old import fails with a message that says where to import from.
_MOVED: dict[str, str] = {
    "AgentLoadError": "errors",
    "AgentLoopNotFoundError": "compat",
    "AgentLoopRegistry": "compat",
    "AgentLoopValidationError": "compat",
    "CompletionChoice": "protocol",
    "CompletionUsage": "protocol",
    "CompletionsChoice": "compat",
    "ConfigError": "errors",
    "DEFAULT_MAX_METADATA_SIZE_BYTES": "compat",
    "DatasetError": "errors",
    "LLMClientProtocol": "compat",
    "MessageDict": "compat",
    "OpenAIFunctionCall": "protocol",
    "OpenAIFunctionCallSchema": "compat",
    "OpenAIFunctionParametersSchema": "compat",
    "OpenAIFunctionParsedSchema": "compat",
    "OpenAIFunctionPropertySchema": "compat",
    "OpenAIFunctionToolCall": "compat",
    "OpenAIToolCall": "protocol",
    "OsmosisLLMClient": "compat",
    "OsmosisRolloutError": "compat",
    "OsmosisServerError": "compat",
    "OsmosisTimeoutError": "compat",
    "OsmosisTransportError": "compat",
    "OsmosisValidationError": "compat",
    "ProtocolError": "errors",
    "RetryPolicy": "client",
    "SamplingParamsDict": "compat",
    "ServeError": "compat",
    "ToolExecutionError": "compat",
    "ToolResponse": "compat",
    "TrainGateClient": "client",
    "TrainGateHTTPError": "errors",
    "TrainGateRejectedError": "errors",
    "TrainGateServerError": "errors",
    "TrainGateTimeout": "errors",
    "TrainGateUnavailable": "errors",
    "UnsatisfiableSchemaError": "errors",
    "count_messages_by_role": "compat",
    "create_app": "compat",
    "create_tool_error_result": "compat",
    "create_tool_result": "compat",
    "get_agent_loop": "compat",
    "get_max_metadata_size_bytes": "compat",
    "get_message_content": "compat",
    "get_message_role": "compat",
    "get_tool_call_info": "compat",
    "is_assistant_message": "compat",
    "is_tool_message": "compat",
    "is_user_message": "compat",
    "list_agent_loops": "compat",
    "normalize_stop": "compat",
    "parse_tool_arguments": "compat",
    "parse_tool_calls": "compat",
    "register_agent_loop": "compat",
    "serialize_tool_result": "compat",
    "serve_agent_loop": "compat",
    "set_max_metadata_size_bytes": "compat",
    "unregister_agent_loop": "compat",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        home = _MOVED.get(name)
        hint = f"; import it from osmosis_rollout.{home}" if home else ""
        if home == "compat" and name in ("create_app", "serve_agent_loop"):
            hint += " (the legacy one), or use osmosis_rollout.server's create_app and serve (ours)"
        raise AttributeError(f"module 'osmosis_rollout' has no attribute {name!r}{hint}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
