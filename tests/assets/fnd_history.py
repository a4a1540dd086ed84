"""Two-turn agents for the append-only guard: one correct, the others rewrite the history.

After turn 1 the history is ``[system, user, reply_1, user_2]``; each rewriter changes it in one
way before turn 2, so the first differing message index is known in advance (``expected_index``).
"""

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
