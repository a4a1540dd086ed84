"""Pure renderers for the REPL: turns, conversations, tools, metrics and outcomes.

Nothing is printed here; the REPL prints what these return on the console it was given. User and
model text goes into ``Text`` objects, never into markup, so ``[brackets]`` print as typed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.padding import Padding
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..evaluation.runner import RowInput, RowResult, tool_wall_ms
from ..grading import JUDGE_VERDICT, judge_failed
from ..protocol import CompletionsResponse, Message, OpenAIFunctionToolSchema, RolloutMetrics
from ..render import format_ms
from ..testing.records import Finding
from .commands import COMMANDS
from .stepper import Turn

__all__ = [
    "full_message_view",
    "help_table",
    "message_view",
    "messages_view",
    "metrics_table",
    "outcome_view",
    "rows_view",
    "tools_view",
    "turn_summary",
    "turn_view",
    "verdict_view",
]

_ROLE_STYLE = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}
_PREVIEW_CHARS = 400
_INLINE_ARGUMENTS = 72


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: show the text ones
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(content, default=str)


def _shorten(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return f"{text[: limit - 3]}..."


def _arguments(raw: Any, *, full: bool = False) -> str | RenderableType:
    """Tool-call arguments as JSON: a one-line string when short, indented JSON when not (or
    the raw text when it is not JSON at all, which is worth seeing as is).

    Indented JSON keeps one value a line; a line wider than the terminal ends in an ellipsis
    (``show N`` prints it whole), or, with ``full``, folds onto the next lines."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return Text(raw, style="red")
    compact = json.dumps(raw, default=str)
    if len(compact) <= _INLINE_ARGUMENTS:
        return compact
    text = JSON.from_data(raw, indent=2, default=str).text
    if full:
        text.no_wrap, text.overflow = False, "fold"
    else:
        text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _tool_call_view(call: Any, *, full: bool = False) -> list[RenderableType]:
    call = call if isinstance(call, dict) else {}
    function = call.get("function") or {}
    arguments = _arguments(function.get("arguments"), full=full)
    head = Text.assemble(("  -> ", "bold"), (str(function.get("name", "?")), "bold yellow"))
    if isinstance(arguments, str):
        head.append(f"({arguments})")
    head.append(f"  [{call.get('id', '')}]", "dim")
    if isinstance(arguments, str):
        return [head]
    return [head, Padding(arguments, (0, 0, 0, 6))]


def message_view(
    message: Message, *, limit: int | None = None, full: bool = False
) -> RenderableType:
    """One chat message: a role label, its text, and each tool call with its arguments
    (``full``: long argument lines fold instead of ending in an ellipsis). An item without a
    role, as a server we did not write may send (the OpenAI Responses API's ``function_call``
    and ``function_call_output``), is shown by its ``type``."""
    if "role" not in message:
        return _item_view(message, limit)
    role = str(message.get("role", "?"))
    label = role
    if role == "tool":
        name = message.get("name")
        call_id = message.get("tool_call_id")
        label = "tool" + (f" {name}" if name else "") + (f" [{call_id}]" if call_id else "")
    text = Text.assemble((f"{label}: ", f"bold {_ROLE_STYLE.get(role, 'white')}"))
    text.append(_shorten(_content_text(message.get("content")), limit))
    parts: list[RenderableType] = [text]
    for call in message.get("tool_calls") or []:
        parts.extend(_tool_call_view(call, full=full))
    return Group(*parts)


def _item_view(item: Message, limit: int | None) -> Text:
    """A conversation item that is not a chat message: its type, then its call (name and
    arguments), its output, or the item as JSON."""
    label = str(item.get("type") or "item")
    if "name" in item and "arguments" in item:
        body = f"{item['name']}({_content_text(item['arguments'])})"
    elif "output" in item:
        body = _content_text(item["output"])
    else:
        body = json.dumps(item, ensure_ascii=False, default=str)
    text = Text.assemble((f"{label}: ", "bold magenta"))
    text.append(_shorten(body, limit))
    return text


def messages_view(messages: Sequence[Message], *, pending: Message | None = None) -> Group:
    """The whole conversation, numbered; ``pending`` is a reply the agent has not received."""
    parts: list[RenderableType] = [Rule(f"conversation: {len(messages)} message(s)", style="dim")]
    for i, message in enumerate(messages):
        parts.append(Text(f"[{i}]", style="dim"))
        parts.append(message_view(message))
    if pending is not None:
        parts.append(Text(f"[{len(messages)}] (pending: not yet sent to the agent)", style="dim"))
        parts.append(message_view(pending))
    if any(_has_argument_block(m) for m in [*messages, *([pending] if pending else [])]):
        # only an indented arguments block can be cut (its lines do not wrap)
        parts.append(Text("A line ending in … is cut: show N prints message N whole.", style="dim"))
    return Group(*parts)


def _has_argument_block(message: Message) -> bool:
    """Whether a message shows a tool call's arguments as an indented block, whose lines end
    in an ellipsis where wider than the terminal (shorter arguments stay on the call's line)."""
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        raw = function.get("arguments") if isinstance(function, dict) else None
        shown = _arguments(raw)
        if isinstance(shown, Text) and shown.no_wrap:
            return True
    return False


def full_message_view(
    messages: Sequence[Message], index: int, *, pending: Message | None = None
) -> RenderableType:
    """Message ``index`` of ``messages messages_view`` numbers, nothing shortened: its whole
    text and every tool call's arguments, folded at the terminal width."""
    shown = [*messages, pending] if pending is not None else list(messages)
    if not shown:
        return Text("The conversation is empty.", style="dim")
    if not 0 <= index < len(shown):
        last = len(shown) - 1
        return Text(f"There is no message {index}: the conversation has 0-{last}.", style="red")
    note = " (pending: not yet sent to the agent)" if index == len(messages) else ""
    return Group(
        Rule(f"message {index} of {len(shown)}{note}", style="dim"),
        message_view(shown[index], full=True),
    )


def _reply_message(reply: CompletionsResponse) -> Message:
    return reply.message.model_dump(mode="json", exclude_none=True)


def turn_summary(turn: Turn) -> Text:
    """The compact metrics line: finish reason, this turn's tokens and time, totals so far."""
    usage = turn.reply.usage
    earlier = turn.record.replies[: turn.number - 1]
    prompt_total = usage.prompt_tokens + sum(r.usage.prompt_tokens for r in earlier)
    response_total = usage.completion_tokens + sum(r.usage.completion_tokens for r in earlier)
    finish = turn.reply.choices[0].finish_reason or "-"
    return Text.assemble(
        ("finish ", "dim"),
        (finish, "bold"),
        (" | tokens ", "dim"),
        f"{usage.prompt_tokens} in / {usage.completion_tokens} out",
        (" (out estimated: edited)" if turn.edited else "", "dim"),
        (" | model ", "dim"),
        format_ms(turn.model_ms),
        (" | so far ", "dim"),
        f"{len(earlier) + 1} call(s), {prompt_total}/{response_total} tokens",
    )


def turn_view(turn: Turn, *, title: str = "") -> Group:
    """One LLM turn: what arrived since the last reply, the reply, and the metrics line."""
    heading = f"turn {turn.number}" + (f" | {title}" if title else "")
    parts: list[RenderableType] = [Rule(heading, align="left", style="blue")]
    for message in turn.new_messages:
        parts.append(message_view(message, limit=_PREVIEW_CHARS))
    if turn.edited:
        parts.append(Text("(edited by you)", style="bold magenta"))
    parts.append(message_view(_reply_message(turn.reply)))
    parts.append(turn_summary(turn))
    return Group(*parts)


def tools_view(tools: Sequence[OpenAIFunctionToolSchema]) -> RenderableType:
    """Each tool with its description and full ``parameters`` schema."""
    if not tools:
        return Text("The agent declared no tools.", style="dim")
    parts: list[RenderableType] = [Rule(f"{len(tools)} tool(s)", style="dim")]
    for tool in tools:
        parts.append(
            Text.assemble(
                (tool.name, "bold yellow"), ("  " + (tool.function.description or ""), "")
            )
        )
        parts.append(Padding(JSON.from_data(tool.function.parameters, indent=2), (0, 0, 0, 2)))
    return Group(*parts)


def metrics_table(
    metrics: RolloutMetrics,
    *,
    paused_ms: float,
    model_ms: float,
    in_flight_ms: float = 0.0,
    title: str = "Metrics",
    answered: int | None = None,
) -> Table:
    """Calls, tokens and where the time went: ``total`` = paused + llm + tool + other.

    The agent measures a turn from its request to the reply, so its ``llm`` time includes the
    time you spent at the prompt; here ``paused`` is taken out of ``llm`` and shown on its own,
    so neither reads as part of the other. ``in_flight_ms`` is the turn still waiting at the
    prompt (model time + pause), which the agent adds to ``llm`` only once it gets the reply.
    ``tool`` is wall time: parallel calls count once (their sum is noted after it).
    ``answered`` is how many LLM calls got their reply: the agent also counts a call that was
    cancelled (or failed) but has no tokens for it, so the table says whose tokens it shows.
    """
    table = Table(title=title, title_justify="left", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="dim")
    calls_note, tokens_note = "", "in / out"
    unanswered = 0 if answered is None else metrics.num_llm_calls - answered
    if unanswered > 0:
        calls_note = f"{answered} answered, {unanswered} cancelled or failed"
        tokens_note = f"in / out, of the {answered} answered; the cancelled call's: unknown"
    table.add_row("llm calls", str(metrics.num_llm_calls), calls_note)
    table.add_row("tool calls", str(metrics.num_tool_calls), "")
    tokens = f"{metrics.prompt_tokens} / {metrics.response_tokens}"
    table.add_row("tokens", tokens, tokens_note)
    table.add_row("max context", str(metrics.max_context_tokens), "tokens")
    table.add_row("total", format_ms(metrics.total_latency_ms), "since the agent started")
    table.add_row("paused", format_ms(paused_ms), "you, at this prompt")
    llm = max(0.0, metrics.llm_latency_ms + in_flight_ms - paused_ms)
    table.add_row("llm", format_ms(llm), "LLM calls, your pauses excluded")
    table.add_row("  model", format_ms(model_ms), "the LLM backend itself")
    tool = tool_wall_ms(metrics)
    summed = metrics.tool_latency_ms
    several = metrics.num_tool_calls > 1
    note = f"wall time; {format_ms(summed)} summed over parallel calls" if several else ""
    table.add_row("tool", format_ms(tool), note)
    other = metrics.total_latency_ms - metrics.llm_latency_ms - in_flight_ms - tool
    table.add_row("other", format_ms(max(0.0, other)), "agent code and the SDK")
    return table


def outcome_view(
    row: RowResult,
    *,
    paused_ms: float,
    model_ms: float,
    answered: int | None = None,
    server_notes: Sequence[Finding] = (),
    metrics_title: str = "Metrics",
) -> Group:
    """How a rollout ended: status, finish reason, reward, findings, metrics. ``server_notes``
    are findings about the server itself (a batch lifts them to run-level findings)."""
    ok = row.status == "COMPLETED"
    head = Text.assemble(
        ("rollout ", "bold"),
        (row.status, "bold green" if ok else "bold red"),
        ("  finish ", "dim"),
        row.finish_reason or "-",
        ("  reward ", "dim"),
        "-" if row.reward is None else f"{row.reward:g}",
    )
    parts: list[RenderableType] = [Rule("end of rollout", align="left", style="blue"), head]
    if row.error_message:
        parts.append(Text.assemble(("error: ", "bold red"), row.error_message))
    if row.findings:
        parts.append(Text(f"findings ({len(row.findings)}):", style="bold yellow"))
        for finding in row.findings:
            parts.append(Text.assemble(("  " + finding.code, "yellow"), f": {finding.message}"))
    else:
        parts.append(Text("findings: none (the protocol checks passed)", style="green"))
    for note in server_notes:
        parts.append(Text.assemble(("server: " + note.code, "dim yellow"), f": {note.message}"))
    if row.metrics:
        metrics = RolloutMetrics.model_validate(row.metrics)
        parts.append(
            metrics_table(
                metrics,
                paused_ms=paused_ms,
                model_ms=model_ms,
                answered=answered,
                title=metrics_title,
            )
        )
    judged = verdict_view(row)
    if judged is not None:  # last: the verdict is what the stepped rollout led to
        parts.append(judged)
    return Group(*parts)


def verdict_view(row: RowResult) -> RenderableType | None:
    """A judge's verdict on the rollout (each criterion's score and reason, and what judging
    cost), or why there is none; None when no judge graded it."""
    verdict = row.extra_fields.get(JUDGE_VERDICT)
    if judge_failed(row.error_message):
        return Group(
            Rule("judge verdict", align="left", style="blue"),
            Text("none: the judge failed (a judge_error, not a reward)", style="bold red"),
        )
    if not isinstance(verdict, dict) or not verdict:
        return None
    table = Table(show_header=True, box=None, padding=(0, 2, 0, 0))
    table.add_column("criterion", style="bold")
    table.add_column("score", justify="right")
    table.add_column("reason")
    for name, entry in verdict.items():
        entry = entry if isinstance(entry, dict) else {}
        score = entry.get("score")
        shown = f"{score:g}" if isinstance(score, int | float) else "-"
        table.add_row(Text(str(name)), shown, Text(str(entry.get("reason", ""))))
    m = row.metrics
    cost = Text.assemble(
        ("judge ", "dim"),
        f"{int(m.get('judge_calls') or 0)} call(s), {format_ms(float(m.get('judge_ms') or 0))}, "
        f"{int(m.get('judge_prompt_tokens') or 0)} prompt + "
        f"{int(m.get('judge_response_tokens') or 0)} response tokens",
        ("  (apart from the policy's)", "dim"),
    )
    score = "-" if row.reward is None else f"{row.reward:g}"
    head = Text.assemble(("score ", "bold"), score)
    return Group(Rule("judge verdict", align="left", style="blue"), head, table, cost)


def rows_view(rows: Sequence[RowInput], *, limit: int = 10) -> Table:
    """The dataset's rows, each with its last user message, so the user can pick one."""
    table = Table(title=f"Dataset: {len(rows)} row(s)", title_justify="left", box=None)
    table.add_column("row", justify="right", style="bold")
    table.add_column("user message", overflow="ellipsis", no_wrap=True, max_width=70)
    for row in rows[:limit]:
        users = [m for m in row.messages if m.get("role") == "user"]
        text = _content_text(users[-1].get("content")) if users else "(no user message)"
        table.add_row(str(row.index), Text(" ".join(text.split())))
    if len(rows) > limit:
        table.add_row("...", Text(f"{len(rows) - limit} more", style="dim"))
    return table


def help_table() -> Table:
    """Every command with its short forms and what it does."""
    table = Table(title="Commands", title_justify="left", show_header=False, box=None)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for spec in COMMANDS:
        table.add_row(spec.usage, spec.help)
    table.add_row("Ctrl-C", "cancel the running rollout (it ends ERROR/cancelled)")
    return table
