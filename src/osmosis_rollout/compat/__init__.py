"""The legacy SDK's names (the original SDK, ``osmosis_ai.rollout``), all in one place.

A legacy agent project runs after one change: its ``from osmosis_ai.rollout import X`` lines (and
its submodules': ``core.schemas``, ``server.app``, ``validator``...) become
``from osmosis_rollout.compat import X``. The table below says where each name lives (lazily
imported, so importing one stays cheap); ``__all__`` is derived from it.

Public API: the names of ``__all__`` (``from osmosis_rollout.compat import X``). The submodules
are the adapters over our core, internal (import from the package): ``context`` (the legacy
``RolloutAgentLoop`` and ``RolloutContext``: ``ctx.llm`` as a legacy client, legacy-style fake
clients, the underscored keywords), ``schemas`` (typed tool classes, the metadata limit),
``helpers``, ``registry``, ``client`` (``OsmosisLLMClient``), ``validation`` (the sync
``validate_agent_loop``, the core's, and the legacy ``ValidationError``), ``server`` (the legacy
``create_app``, ``serve_agent_loop``, ``validate_and_report``), ``app``, ``settings`` and
``test_mode`` (``DatasetReader``, ``ExternalLLMClient``, ``LocalTestRunner`` over our test
engine). The other names are our own classes, which keep the legacy contract.
``docs/migrating-from-v1.md`` lists every deliberate difference.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import (
        AgentLoopNotFoundError,
        AgentLoopValidationError,
        OsmosisRolloutError,
        OsmosisServerError,
        OsmosisTimeoutError,
        OsmosisTransportError,
        OsmosisValidationError,
        ServeError,
        ToolArgumentError,
        ToolExecutionError,
    )
    from ..protocol import (
        CompletionsRequest,
        CompletionsResponse,
        CompletionUsage,
        InitResponse,
        RolloutMetrics,
        RolloutRequest,
        RolloutResponse,
        RolloutStatus,
    )
    from ..results import CompletionsResult, RolloutResult
    from .client import (
        OsmosisLLMClient,
    )
    from .context import (
        LLMClientProtocol,
        RolloutAgentLoop,
        RolloutContext,
    )
    from .helpers import (
        count_messages_by_role,
        create_tool_error_result,
        create_tool_result,
        execute_tool_calls,
        get_message_content,
        get_message_role,
        get_tool_call_info,
        is_assistant_message,
        is_tool_message,
        is_user_message,
        normalize_stop,
        parse_tool_arguments,
        parse_tool_calls,
        serialize_tool_result,
    )
    from .registry import (
        AgentLoopRegistry,
        get_agent_loop,
        list_agent_loops,
        register_agent_loop,
        unregister_agent_loop,
    )
    from .schemas import (
        DEFAULT_MAX_METADATA_SIZE_BYTES,
        CompletionsChoice,
        MessageDict,
        OpenAIFunctionCallSchema,
        OpenAIFunctionParametersSchema,
        OpenAIFunctionParsedSchema,
        OpenAIFunctionPropertySchema,
        OpenAIFunctionSchema,
        OpenAIFunctionToolCall,
        OpenAIFunctionToolSchema,
        SamplingParamsDict,
        ToolResponse,
        get_max_metadata_size_bytes,
        set_max_metadata_size_bytes,
    )
    from .server import (
        DEFAULT_HOST,
        DEFAULT_PORT,
        create_app,
        serve_agent_loop,
        validate_and_report,
    )
    from .test_mode import (
        DatasetParseError,
        DatasetReader,
        DatasetRow,
        DatasetValidationError,
        ExternalLLMClient,
        LocalTestBatchResult,
        LocalTestRunner,
        LocalTestRunResult,
        ProviderError,
        dataset_row_to_request,
    )
    from .validation import (
        ValidationError,
        ValidationResult,
        validate_agent_loop,
    )

#: Each legacy name -> the module of ``osmosis_rollout`` that defines it.
_EXPORTS: dict[str, str] = {
    "CompletionsResult": "results",
    "RolloutResult": "results",
    "LLMClientProtocol": "compat.context",
    "RolloutAgentLoop": "compat.context",
    "RolloutContext": "compat.context",
    "CompletionUsage": "protocol",
    "CompletionsRequest": "protocol",
    "CompletionsResponse": "protocol",
    "InitResponse": "protocol",
    "OpenAIFunctionSchema": "compat.schemas",
    "OpenAIFunctionToolSchema": "compat.schemas",
    "RolloutMetrics": "protocol",
    "RolloutRequest": "protocol",
    "RolloutResponse": "protocol",
    "RolloutStatus": "protocol",
    "DEFAULT_MAX_METADATA_SIZE_BYTES": "compat.schemas",
    "CompletionsChoice": "compat.schemas",
    "MessageDict": "compat.schemas",
    "OpenAIFunctionCallSchema": "compat.schemas",
    "OpenAIFunctionParametersSchema": "compat.schemas",
    "OpenAIFunctionParsedSchema": "compat.schemas",
    "OpenAIFunctionPropertySchema": "compat.schemas",
    "OpenAIFunctionToolCall": "compat.schemas",
    "SamplingParamsDict": "compat.schemas",
    "ToolResponse": "compat.schemas",
    "get_max_metadata_size_bytes": "compat.schemas",
    "set_max_metadata_size_bytes": "compat.schemas",
    "AgentLoopNotFoundError": "errors",
    "AgentLoopValidationError": "errors",
    "OsmosisRolloutError": "errors",
    "OsmosisServerError": "errors",
    "OsmosisTimeoutError": "errors",
    "OsmosisTransportError": "errors",
    "OsmosisValidationError": "errors",
    "ServeError": "errors",
    "ToolArgumentError": "errors",
    "ToolExecutionError": "errors",
    "ValidationError": "compat.validation",
    "ValidationResult": "compat.validation",
    "validate_agent_loop": "compat.validation",
    "create_app": "compat.server",
    "serve_agent_loop": "compat.server",
    "validate_and_report": "compat.server",
    "DEFAULT_HOST": "compat.server",
    "DEFAULT_PORT": "compat.server",
    "DatasetParseError": "compat.test_mode",
    "DatasetReader": "compat.test_mode",
    "DatasetRow": "compat.test_mode",
    "DatasetValidationError": "compat.test_mode",
    "ExternalLLMClient": "compat.test_mode",
    "LocalTestBatchResult": "compat.test_mode",
    "LocalTestRunResult": "compat.test_mode",
    "LocalTestRunner": "compat.test_mode",
    "ProviderError": "compat.test_mode",
    "dataset_row_to_request": "compat.test_mode",
    "AgentLoopRegistry": "compat.registry",
    "get_agent_loop": "compat.registry",
    "list_agent_loops": "compat.registry",
    "register_agent_loop": "compat.registry",
    "unregister_agent_loop": "compat.registry",
    "count_messages_by_role": "compat.helpers",
    "create_tool_error_result": "compat.helpers",
    "create_tool_result": "compat.helpers",
    "execute_tool_calls": "compat.helpers",
    "get_message_content": "compat.helpers",
    "get_message_role": "compat.helpers",
    "get_tool_call_info": "compat.helpers",
    "is_assistant_message": "compat.helpers",
    "is_tool_message": "compat.helpers",
    "is_user_message": "compat.helpers",
    "normalize_stop": "compat.helpers",
    "parse_tool_arguments": "compat.helpers",
    "parse_tool_calls": "compat.helpers",
    "serialize_tool_result": "compat.helpers",
    "OsmosisLLMClient": "compat.client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"osmosis_rollout.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
