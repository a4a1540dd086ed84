"""``V2ChatChannel``: one rollout's LLM turns on protocol v2 (``docs/protocol-v2.md``).

v2 gives each rollout an OpenAI-compatible base URL: every turn is ``POST
<chat_completions_url>/chat/completions`` with the rollout's LLM key (never the callback key:
D15), the full history, and the agent's tools on every call (v2 declares none at init; the
context adds them and the agent's ``tool_choice`` because this channel ``sends_tools``). The
body has no ``rollout_id`` (the URL routes it) and the model is ``osmosis-rollout`` unless the
agent names one. The reply is JSON or, from a streaming-only endpoint (U2), server-sent events
folded into one completion by ``transport.sse``; ``usage`` may be absent (zeros).
"""

from __future__ import annotations

from pydantic import Field, ValidationError

from .client import TrainGateClient
from .errors import ProtocolError
from .protocol import (
    CompletionsRequest,
    CompletionsResponse,
    CompletionUsage,
    describe_validation_error,
)
from .redaction import scrub
from .transport import Reply, read_event_stream

__all__ = ["V2ChatChannel", "V2Completion", "read_event_stream"]

#: The model name v2 trainers expect when the agent names none (spec section 6).
DEFAULT_MODEL = "osmosis-rollout"


class V2Completion(CompletionsResponse):
    """A v2 chat reply: as v1's, but ``usage`` may be missing."""

    usage: CompletionUsage = Field(default_factory=CompletionUsage)


class V2ChatChannel:
    """One v2 rollout's door to its chat endpoint (the base URL and the LLM key bound in)."""

    #: Tells ``RolloutContext.chat`` to put the tools and ``tool_choice`` in every body.
    sends_tools = True

    def __init__(self, client: TrainGateClient, base_url: str, api_key: str | None) -> None:
        self.client = client
        self.server_url = base_url
        self.url = f"{base_url}/chat/completions"
        self._api_key = api_key

    def __repr__(self) -> str:
        return f"V2ChatChannel(server_url={self.server_url!r})"

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        """One LLM turn; ``ProtocolError`` when the reply is not a completion."""
        given = request.model_fields_set
        if "model" not in given:
            request.model = DEFAULT_MODEL
        exclude = {"rollout_id"} if "logprobs" in given else {"rollout_id", "logprobs"}
        content = request.__pydantic_serializer__.to_json(
            request, exclude_none=True, exclude=exclude
        )
        reply = await self.client.post(
            self.url, content, api_key=self._api_key, request_id=request_id
        )
        return self._read(reply)

    def _read(self, reply: Reply) -> V2Completion:
        kind = reply.headers.get("content-type", "")
        try:
            if kind.startswith("text/event-stream"):
                return V2Completion.model_validate(read_event_stream(reply.content))
            return V2Completion.model_validate_json(reply.content)
        except ValidationError as exc:
            detail = describe_validation_error(exc)
        except ValueError as exc:  # the stream's JSON, or an error it reported
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProtocolError(
            f"the reply from {self.url} is not a chat completion "
            f"({scrub(detail, self._api_key)}); it needs choices[0].message"
        )
