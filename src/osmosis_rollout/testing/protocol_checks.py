"""The protocol checks of the mock TrainGate: what a chat call or a completion callback did that
the real trainer depends on not happening, each recorded as a named :class:`Finding`.

Kept apart from :mod:`.traingate` (the endpoints: parsing, routing, answering) so that each
check reads as the rule it enforces, and the handlers as the flow of a call.
"""

from __future__ import annotations

from typing import Any

from ..append_only import first_divergence
from ..findings import (
    CHAT_AFTER_COMPLETION,
    HISTORY_REWRITTEN,
    TOOL_CALL_IN_TEXT,
    TOOLS_SENT,
    TRUNCATED_REPLY,
    UNKNOWN_TOOL,
)
from ..protocol import CompletionsRequest, CompletionsResponse, RolloutResponse
from .records import RolloutRecord
from .text_tool_calls import advice, find_text_tool_call

__all__ = ["check_chat", "check_completion", "check_history"]


def check_chat(record: RolloutRecord, body: CompletionsRequest) -> None:
    """A chat call, before it is recorded: after the completion, carrying ``tools``, or with a
    history that is not the previous call's messages plus its reply."""
    turn = len(record.chats) + 1  # the turn this call starts
    if record.completions:
        record.add(CHAT_AFTER_COMPLETION, "chat call after the rollout had completed", turn=turn)
    if "tools" in (body.model_extra or {}):
        record.add(
            TOOLS_SENT,
            "chat request carried `tools`; TrainGate knows them from init",
            turn=turn,
        )
    check_history(record, body, turn)


def check_history(record: RolloutRecord, body: CompletionsRequest, turn: int) -> None:
    """The append-only rule (both wires): a call's messages are the previous call's plus its
    reply, unchanged."""
    if record.chats and record.replies:
        previous = [*record.chats[-1].messages, _reply_message(record.replies[-1])]
        index = first_divergence(previous, body.messages)
        if index is not None:
            record.add(
                HISTORY_REWRITTEN,
                f"turn {turn} rewrote the history at message {index}: "
                "each call must send the previous messages plus the reply, unchanged",
                turn=turn,
            )


def check_completion(record: RolloutRecord, body: RolloutResponse) -> None:
    """The first completion callback of a rollout: the tools it called, and its replies."""
    _check_tools_used(record, body)
    _check_replies(record, body.final_messages)
    _endpoint_findings(record, body)


def _endpoint_findings(record: RolloutRecord, body: RolloutResponse) -> None:
    """What the rollout's OpenAI-compatible endpoint saw (``endpoint.session``): the callback
    carries its findings in ``metrics.endpoint_findings``; each becomes a finding here."""
    extra = (body.metrics.model_extra or {}) if body.metrics is not None else {}
    found = extra.get("endpoint_findings")
    if not isinstance(found, list):
        return
    for item in found:
        if isinstance(item, dict) and isinstance(item.get("code"), str):
            turn = item.get("turn")
            details = {k: v for k, v in item.items() if k not in ("code", "message", "turn")}
            record.add(
                item["code"],
                str(item.get("message", "")),
                turn=turn if isinstance(turn, int) else None,
                details=details or None,
            )


def _check_tools_used(record: RolloutRecord, body: RolloutResponse) -> None:
    if not record.tools_known:
        return
    declared = record.tool_names
    for message in body.final_messages:
        for call in message.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
            if name is not None and name not in declared:
                record.add(UNKNOWN_TOOL, f"tool {name!r} was called but never declared")


def _check_replies(record: RolloutRecord, final: list[dict[str, Any]]) -> None:
    """What real models do that passes unnoticed: a last reply cut by ``max_tokens``, and
    tool calls written as text that nothing ran (once per rollout: the first says it all).
    An agent that parses such text itself and answers with a ``tool`` message is fine."""
    if record.replies and record.replies[-1].choices[0].finish_reason == "length":
        turn = len(record.replies)
        record.add(
            TRUNCATED_REPLY,
            f"turn {turn}'s reply was cut by max_tokens (finish_reason 'length') and the "
            "rollout ended on it: raise --max-tokens, or make the agent check "
            "result.finish_reason",
        )
    if not record.tools:
        return
    for turn, reply in enumerate(record.replies, start=1):
        if reply.message.tool_calls:
            continue
        found = find_text_tool_call(reply.message.content, record.tool_names)
        if found is not None and not _answered_by_tool(record, turn, final):
            broken = f" whose JSON is broken ({found.broken})" if found.broken else ""
            hint = advice(found, template_tool_format=record.template_tool_format)
            record.add(
                TOOL_CALL_IN_TEXT,
                f"turn {turn} wrote a call to tool {found.name!r} as text ({found.style}){broken} "
                f"instead of tool_calls, so it was never run: {hint}",
            )
            return


def _answered_by_tool(record: RolloutRecord, turn: int, final: list[dict[str, Any]]) -> bool:
    """Whether the message after turn ``turn``'s reply (in the next call's history, else in the
    final messages) is a tool result: the agent ran the call it found in the text."""
    if turn > len(record.chats):
        return False
    position = len(record.chats[turn - 1].messages) + 1
    later = record.chats[turn].messages if turn < len(record.chats) else final
    return position < len(later) and later[position].get("role") == "tool"


def _reply_message(reply: CompletionsResponse) -> dict[str, Any]:
    return reply.message.model_dump(mode="json", exclude_none=True)
