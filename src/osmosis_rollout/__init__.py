"""osmosis-rollout: build, validate, serve and test LLM agent loops for RL rollouts.

Names are imported lazily (PEP 562) so that ``osmosis --help`` does not pay for pydantic,
Starlette and httpx2; ``from osmosis_rollout import X`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .agent import CompletionsResult, RolloutAgentLoop, RolloutContext, RolloutResult
    from .client import RetryPolicy, TrainGateClient
    from .errors import (
        AgentDefinitionError,
        AgentLoadError,
        ConfigError,
        DatasetError,
        LLMBackendError,
        OsmosisError,
        ProtocolError,
        ToolError,
        TrainGateError,
        TrainGateHTTPError,
        TrainGateUnavailable,
        UnsatisfiableSchemaError,
    )
    from .protocol import (
        CompletionsRequest,
        CompletionsResponse,
        InitResponse,
        OpenAIFunctionCall,
        OpenAIFunctionSchema,
        OpenAIFunctionToolSchema,
        OpenAIToolCall,
        RolloutMetrics,
        RolloutRequest,
        RolloutResponse,
        RolloutStatus,
    )
    from .rollout import run_rollout
    from .tools import (
        Toolbox,
        execute_tool_calls,
        parse_arguments,
        tool,
        tool_schema,
        validate_arguments,
    )
    from .validator import Problem, ValidationResult, validate_agent_loop

_EXPORTS: dict[str, str] = {
    "AgentDefinitionError": "errors",
    "AgentLoadError": "errors",
    "CompletionsRequest": "protocol",
    "CompletionsResponse": "protocol",
    "CompletionsResult": "agent",
    "ConfigError": "errors",
    "DatasetError": "errors",
    "InitResponse": "protocol",
    "LLMBackendError": "errors",
    "OpenAIFunctionCall": "protocol",
    "OpenAIFunctionSchema": "protocol",
    "OpenAIFunctionToolSchema": "protocol",
    "OpenAIToolCall": "protocol",
    "OsmosisError": "errors",
    "Problem": "validator",
    "ProtocolError": "errors",
    "RetryPolicy": "client",
    "RolloutAgentLoop": "agent",
    "RolloutContext": "agent",
    "RolloutMetrics": "protocol",
    "RolloutRequest": "protocol",
    "RolloutResponse": "protocol",
    "RolloutResult": "agent",
    "RolloutStatus": "protocol",
    "Toolbox": "tools",
    "ToolError": "errors",
    "UnsatisfiableSchemaError": "errors",
    "TrainGateClient": "client",
    "TrainGateError": "errors",
    "TrainGateHTTPError": "errors",
    "TrainGateUnavailable": "errors",
    "ValidationResult": "validator",
    "execute_tool_calls": "tools",
    "parse_arguments": "tools",
    "run_rollout": "rollout",
    "tool": "tools",
    "tool_schema": "tools",
    "validate_agent_loop": "validator",
    "validate_arguments": "tools",
}

__all__ = [
    "AgentDefinitionError",
    "AgentLoadError",
    "CompletionsRequest",
    "CompletionsResponse",
    "CompletionsResult",
    "ConfigError",
    "DatasetError",
    "InitResponse",
    "LLMBackendError",
    "OpenAIFunctionCall",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "OpenAIToolCall",
    "OsmosisError",
    "Problem",
    "ProtocolError",
    "RetryPolicy",
    "RolloutAgentLoop",
    "RolloutContext",
    "RolloutMetrics",
    "RolloutRequest",
    "RolloutResponse",
    "RolloutResult",
    "RolloutStatus",
    "ToolError",
    "Toolbox",
    "TrainGateClient",
    "TrainGateError",
    "TrainGateHTTPError",
    "TrainGateUnavailable",
    "UnsatisfiableSchemaError",
    "ValidationResult",
    "__version__",
    "execute_tool_calls",
    "parse_arguments",
    "run_rollout",
    "tool",
    "tool_schema",
    "validate_agent_loop",
    "validate_arguments",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'osmosis_rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
