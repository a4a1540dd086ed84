"""Broken: the history is edited after the first turn instead of appended to."""

from osmosis_rollout import RolloutAgentLoop

TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


class RewritingAgent(RolloutAgentLoop):
    name = "rewriting"

    def get_tools(self, request):
        return [TOOL]

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        for _ in range(3):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                break
            for call in result.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "none"})
            system = {"role": "system", "content": "Be brief."}
            messages.insert(0, system)  # <- HISTORY_REBUILT insert
            if len(messages) > 50:
                messages = messages[-10:]  # <- HISTORY_REBUILT slice
                del messages[0]  # <- HISTORY_REBUILT del
                messages[0] = {"role": "system", "content": "Summary."}  # <- HISTORY_REBUILT set
        return ctx.complete(messages)
