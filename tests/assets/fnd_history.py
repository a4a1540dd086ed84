"""Two-turn agents for the append-only guard: one correct, the others rewrite the history.

After turn 1 the history is ``[system, user, reply_1, user_2]``; each rewriter changes it in one
way before turn 2, so the first differing message index is known in advance (``expected_index``).
"""

import json
from abc import abstractmethod

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class _TwoTurns(RolloutAgentLoop):
    """Runs two LLM turns; subclasses decide what happens to the history in between."""

    expected_index: int | None = None

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    @abstractmethod
    def between_turns(self, messages: list) -> None:
        """Change (or keep) the history before the second turn."""

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = [{"role": "system", "content": "Be brief."}, *ctx.request.messages]
        first = await ctx.chat(messages)
        messages.append(first.message)
        messages.append({"role": "user", "content": "And again?"})
        self.between_turns(messages)
        second = await ctx.chat(messages)
        messages.append(second.message)
        return ctx.complete(messages, reward=1.0)


class AppendOnlyAgent(_TwoTurns):
    """Only appends: the correct behaviour."""

    name = "fnd-append-only"

    def between_turns(self, messages: list) -> None:
        pass


class RebuildsReplyAgent(_TwoTurns):
    """Re-creates the reply dict with its keys in another order: still append-only."""

    name = "fnd-rebuilds-reply"

    def between_turns(self, messages: list) -> None:
        messages[2] = dict(reversed(list(messages[2].items())))


class EditsEarlierMessageAgent(_TwoTurns):
    """Replaces the user's question with another one."""

    name = "fnd-edits-earlier"
    expected_index = 1

    def between_turns(self, messages: list) -> None:
        messages[1] = {"role": "user", "content": "What is 5 + 5?"}


class DropsMessageAgent(_TwoTurns):
    """Drops the system prompt (a common context-trimming mistake)."""

    name = "fnd-drops-message"
    expected_index = 0

    def between_turns(self, messages: list) -> None:
        del messages[0]


class ForgetsReplyAgent(_TwoTurns):
    """Sends the follow-up without the assistant reply it got."""

    name = "fnd-forgets-reply"
    expected_index = 2

    def between_turns(self, messages: list) -> None:
        del messages[2]


class MutatesInPlaceAgent(_TwoTurns):
    """Edits the user's message dict in place (the list itself only grows)."""

    name = "fnd-mutates-in-place"
    expected_index = 1

    def between_turns(self, messages: list) -> None:
        messages[1]["content"] += " Show your work."


class MutatesReplyAgent(_TwoTurns):
    """Edits the assistant reply in place, e.g. to strip its reasoning."""

    name = "fnd-mutates-reply"
    expected_index = 2

    def between_turns(self, messages: list) -> None:
        messages[2]["content"] = "(trimmed)"


# -- tool-call turns: turn 1 is scripted to call `add`; the reply is appended as each agent builds
# -- it, then the tool result, then turn 2. The request's messages are one user message, so the
# -- reply is message 1.

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


class _ToolTurn(RolloutAgentLoop):
    """Appends ``reply_message(first)`` and one tool result per call, then runs turn 2."""

    name = "fnd-tool-turn"
    expected_index: int | None = None

    def get_tools(self, request: RolloutRequest) -> list:
        return [ADD]

    def reply_message(self, result) -> dict:
        return result.message

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        first = await ctx.chat(messages)
        messages.append(self.reply_message(first))
        for call in first.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "3"})
            ctx.record_tool_call()
        second = await ctx.chat(messages)
        messages.append(second.message)
        return ctx.complete(messages, reward=1.0)


def _with_arguments(result, rewrite) -> dict:
    calls = []
    for call in result.tool_calls:
        function = dict(call["function"])
        function["arguments"] = rewrite(json.loads(function["arguments"]))
        calls.append({**call, "function": function})
    return {"role": "assistant", "content": result.content, "tool_calls": calls}


class ToolAppendOnlyAgent(_ToolTurn):
    """Appends the reply as given."""

    name = "fnd-tool-append-only"


class RebuildsToolReplyAgent(_ToolTurn):
    """Rebuilds the reply from its parts: ``"content": None`` where the reply had no key."""

    name = "fnd-rebuilds-tool-reply"

    def reply_message(self, result) -> dict:
        return {"role": "assistant", "content": result.content, "tool_calls": result.tool_calls}


class CompactsArgumentsAgent(_ToolTurn):
    """Re-serialises the arguments compactly with keys in reverse order: the same JSON."""

    name = "fnd-compacts-arguments"

    def reply_message(self, result) -> dict:
        return _with_arguments(
            result,
            lambda args: json.dumps(dict(reversed(list(args.items()))), separators=(",", ":")),
        )


class ArgumentsAsObjectAgent(_ToolTurn):
    """Keeps the arguments as the parsed object, not its JSON text."""

    name = "fnd-arguments-as-object"

    def reply_message(self, result) -> dict:
        return _with_arguments(result, lambda args: args)


class EditsToolArgumentsAgent(_ToolTurn):
    """Changes an argument's value (e.g. to "fix" the model's call)."""

    name = "fnd-edits-tool-arguments"
    expected_index = 1

    def reply_message(self, result) -> dict:
        return _with_arguments(result, lambda args: json.dumps({**args, "b": 40}))


class RetypesArgumentsAgent(_ToolTurn):
    """Turns an integer argument into a float: equal in Python, not the same tokens."""

    name = "fnd-retypes-arguments"
    expected_index = 1

    def reply_message(self, result) -> dict:
        return _with_arguments(result, lambda args: json.dumps({**args, "a": float(args["a"])}))


class DropsToolCallsAgent(_ToolTurn):
    """Keeps only the reply's text, dropping its tool calls."""

    name = "fnd-drops-tool-calls"
    expected_index = 1

    def reply_message(self, result) -> dict:
        return {"role": "assistant", "content": result.content or ""}


class NullContentToolReplyAgent(_ToolTurn):
    """Rebuilds the reply with ``"content": None``, whatever the server sent (llama.cpp: "")."""

    name = "fnd-null-content-tool-reply"

    def reply_message(self, result) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": result.tool_calls}


class RenamesCallIdAgent(_ToolTurn):
    """Changes the reply's tool-call ids, which a Qwen2.5-like template does not render."""

    name = "fnd-renames-call-id"
    expected_index = 1

    def reply_message(self, result) -> dict:
        calls = [{**call, "id": f"renamed-{call['id']}"} for call in result.tool_calls]
        return {"role": "assistant", "content": result.content, "tool_calls": calls}
