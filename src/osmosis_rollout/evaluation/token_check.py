"""``osmosis test --token-check``: would TrainGate train on the tokens the model really sampled?

TrainGate keeps the token ids it sampled for each turn. The next turn's prompt is rendered again
from messages by the chat template, after the server parsed the reply (tool calls included) and
the agent appended it. When turn N's prompt plus the ids sampled in turn N is not a prefix of
turn N+1's prompt, the training sample and what the model saw disagree: a ``token_drift``.

The check asks the serving engine itself, so the template and tokenizer are the real ones:
vLLM's ``POST /tokenize`` with ``messages``, or llama.cpp's ``POST /apply-template`` then
``POST /tokenize``. :func:`detect_engine` finds which one answers; :class:`TokenCheckBackend`
wraps the OpenAI-compatible backend and compares consecutive turns of each rollout.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx2

from ..errors import ConfigError, LLMBackendError
from ..findings import HISTORY_REWRITTEN, TOKEN_DRIFT
from ..protocol import CompletionsRequest, CompletionsResponse, Message, wire
from ..testing.openai_backend import OpenAICompatibleBackend
from ..testing.records import RolloutRecord

__all__ = [
    "EngineTokenizer",
    "TokenCheckBackend",
    "TokenCheckReport",
    "TokenCheckUnavailable",
    "detect_engine",
]

#: Tokens shown on each side of the first difference.
_CONTEXT = 3
_PROBE = [{"role": "user", "content": "Hello"}]
_TIMEOUT_S = 30.0

#: Why turns drift, keyed by where the first difference is; the advice goes with each.
CAUSES = {
    "tool call re-rendered": (
        "the reply was a tool call, and the template renders the parsed call differently from "
        "what the model wrote (tags, spacing, key order); keep the arguments string exactly as "
        "returned, and make the model write calls the way the template renders them"
    ),
    "reply text re-rendered": (
        "the reply's text renders differently from the sampled tokens (the agent edited or "
        "trimmed it, or the template normalises whitespace or strips reasoning)"
    ),
    "earlier history re-rendered": (
        "the template renders earlier messages differently once a new one follows (e.g. it "
        "drops old reasoning), or the agent changed them"
    ),
}


class TokenCheckUnavailable(ConfigError):
    """The LLM server offers neither vLLM's nor llama.cpp's tokenizer endpoints."""


class EngineTokenizer:
    """A serving engine's own chat template and tokenizer, reached over HTTP."""

    name = "engine"
    #: Merged into chat requests so the reply carries the ids the model sampled.
    request_extras: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, http: httpx2.AsyncClient, root: str, model: str) -> None:
        self.http = http
        self.root = root
        self.model = model

    async def render(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        """The ids of the prompt the engine would build for ``messages`` (next turn open)."""
        raise NotImplementedError

    async def decode(self, ids: list[int]) -> str:
        """The text of ``ids``."""
        raise NotImplementedError

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        url = f"{self.root}{path}"
        try:
            response = await self.http.post(url, json=body, timeout=_TIMEOUT_S)
        except httpx2.TransportError as exc:
            raise LLMBackendError(
                f"--token-check: {url} failed: {type(exc).__name__}", kind="http"
            ) from None
        if response.status_code != 200:
            raise LLMBackendError(
                f"--token-check: {url} answered HTTP {response.status_code}",
                kind="http",
                status_code=response.status_code,
            )
        try:
            return response.json()
        except ValueError:
            raise LLMBackendError(
                f"--token-check: {url} did not answer JSON", kind="http"
            ) from None


class _VLLM(EngineTokenizer):
    name = "vLLM"
    request_extras: ClassVar[Mapping[str, Any]] = {"return_token_ids": True}

    async def render(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "add_generation_prompt": True,
            "add_special_tokens": False,
        }
        if tools:
            body["tools"] = tools
        return _ids(await self._post("/tokenize", body), "tokens")

    async def decode(self, ids: list[int]) -> str:
        data = await self._post("/detokenize", {"model": self.model, "tokens": ids})
        return str(data.get("prompt", "")) if isinstance(data, dict) else ""


class _LlamaCpp(EngineTokenizer):
    name = "llama.cpp"
    # One alternative per token, not the default 20: the ids are all the check needs, and a
    # reply with 20 alternatives per token is about five times the bytes to send and parse.
    request_extras: ClassVar[Mapping[str, Any]] = {"logprobs": True, "top_logprobs": 1}

    async def render(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        data = await self._post("/apply-template", body)
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(prompt, str):
            raise LLMBackendError("--token-check: /apply-template gave no prompt", kind="http")
        # As the server does for a chat turn: special tokens added and parsed.
        content = {"content": prompt, "add_special": True, "parse_special": True}
        return _ids(await self._post("/tokenize", content), "tokens")

    async def decode(self, ids: list[int]) -> str:
        data = await self._post("/detokenize", {"tokens": ids})
        return str(data.get("content", "")) if isinstance(data, dict) else ""


def _ids(data: Any, key: str) -> list[int]:
    values = data.get(key) if isinstance(data, dict) else None
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise LLMBackendError(
            f"--token-check: the answer has no list of ids in {key!r}", kind="bad_response"
        )
    return list(values)


def engine_root(base_url: str) -> str:
    """The server root of an OpenAI-style base URL: the tokenizer endpoints live beside /v1."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


async def detect_engine(http: httpx2.AsyncClient, base_url: str, model: str) -> EngineTokenizer:
    """Find which engine's tokenizer endpoints answer at ``base_url``'s server.

    llama.cpp is tried first: its ``/tokenize`` would also accept vLLM's probe body. Raises
    :class:`TokenCheckUnavailable`, saying what each probe got, when neither answers.
    """
    root = engine_root(base_url)
    tried: list[str] = []
    for engine_type in (_LlamaCpp, _VLLM):
        engine = engine_type(http, root, model)
        try:
            probe = await engine.render(list(_PROBE), [])
        except LLMBackendError as exc:
            tried.append(f"{engine.name}: {str(exc).removeprefix('--token-check: ')}")
            continue
        if probe:
            return engine
        tried.append(f"{engine.name}: the probe prompt rendered to no tokens")
    raise TokenCheckUnavailable(
        f"--token-check needs the serving engine's tokenizer endpoints, and {root} has neither "
        f"vLLM's POST /tokenize (with messages) nor llama.cpp's POST /apply-template + "
        f"/tokenize ({'; '.join(tried)}). Serve the model with vLLM or llama.cpp's "
        "llama-server, or leave out --token-check"
    )


@dataclass
class _Turn:
    prompt: list[int] | None  # None: the engine could not render it
    sampled: list[int] | None  # None: the server returned no sampled ids
    tool_call: bool


@dataclass
class TokenCheckReport:
    """The run's summary: what was compared, where it drifted, and why (by cause)."""

    engine: str
    rollouts: set[str] = field(default_factory=set)
    turns_compared: int = 0
    turns_skipped: int = 0
    drifted_rollouts: set[str] = field(default_factory=set)
    turns_with_drift: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    #: Tokenizer-endpoint failures during the run (they skip a comparison, never a rollout).
    render_errors: int = 0
    first_render_error: str | None = None
    #: Turns made by each rollout: a rollout of one turn has nothing to compare.
    turns_seen: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the ``--output`` and ``--json`` summaries."""
        return {
            "engine": self.engine,
            "rollouts_checked": len(self.rollouts),
            "rollouts_with_drift": len(self.drifted_rollouts),
            "turns_compared": self.turns_compared,
            "turns_with_drift": self.turns_with_drift,
            "turns_skipped": self.turns_skipped,
            "render_errors": self.render_errors,
            "causes": dict(self.causes.most_common()),
        }

    def lines(self) -> list[str]:
        """The summary as plain lines for the terminal."""
        out = [
            f"token check ({self.engine}): {len(self.rollouts)} rollout(s) checked, "
            f"{self.turns_compared} turn(s) compared, {self.turns_with_drift} with drift "
            f"(in {len(self.drifted_rollouts)} rollout(s))"
        ]
        if self.turns_skipped:
            why = (
                f"the tokenizer endpoint failed {self.render_errors} time(s), first: "
                f"{self.first_render_error}"
                if self.render_errors
                else "the server returned no sampled token ids for them (vLLM returns them "
                "for `return_token_ids`, in recent versions; llama.cpp with `logprobs`)"
            )
            out.append(f"  {self.turns_skipped} turn(s) not compared: {why}")
        single = sum(1 for turns in self.turns_seen.values() if turns == 1)
        if single:
            every = "every one of the" if single == len(self.rollouts) else "of the"
            out.append(
                f"  {single} ({every} {len(self.rollouts)}) rollout(s) made a single LLM turn: "
                "nothing to compare (a turn's prompt is checked against the turn before it)"
            )
        for cause, count in self.causes.most_common():
            out.append(f"  {count} x {cause}: {CAUSES[cause]}")
        return out


class TokenCheckBackend:
    """An OpenAI-compatible backend that also compares each turn's tokens with the previous
    turn's prompt plus sampled ids, and records a ``token_drift`` finding where they differ."""

    def __init__(self, inner: OpenAICompatibleBackend, engine: EngineTokenizer) -> None:
        self.inner = inner
        self.engine = engine
        inner.extra_body.update(engine.request_extras)
        self.report = TokenCheckReport(engine.name)
        self._turns: dict[str, dict[int, _Turn]] = {}

    @classmethod
    async def connect(cls, inner: OpenAICompatibleBackend) -> TokenCheckBackend:
        """Detect the engine behind ``inner``'s URL and wrap ``inner``."""
        engine = await detect_engine(inner.http, inner.base_url, inner.model)
        return cls(inner, engine)

    @property
    def base_url(self) -> str:
        """The wrapped backend's URL (cassette headers describe the model with it)."""
        return self.inner.base_url

    @property
    def model(self) -> str:
        """The wrapped backend's model name."""
        return self.inner.model

    @property
    def max_in_flight(self) -> int:
        """See :attr:`OpenAICompatibleBackend.max_in_flight`."""
        return self.inner.max_in_flight

    async def aclose(self) -> None:
        """Close the wrapped backend."""
        await self.inner.aclose()

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        """Render this turn's prompt, get the reply, compare with the previous turn."""
        index = len(record.replies)
        tools = [wire(tool) for tool in record.tools]
        prompt: list[int] | None = None
        started = time.perf_counter()
        try:
            prompt = await self.engine.render(request.messages, tools)
        except LLMBackendError as exc:  # the check is an observer: the rollout goes on
            self.report.render_errors += 1
            if self.report.first_render_error is None:
                self.report.first_render_error = str(exc).removeprefix("--token-check: ")
        self.inner.times.observed(record.rollout_id, (time.perf_counter() - started) * 1000)
        reply = await self.inner.complete(request, record)
        turns = self._turns.setdefault(record.rollout_id, {})
        self.report.rollouts.add(record.rollout_id)
        self.report.turns_seen[record.rollout_id] += 1
        previous = turns.get(index - 1)
        if previous is not None:
            await self._compare(record, index + 1, previous, prompt)
        turns[index] = _Turn(prompt, reply.token_ids, bool(reply.message.tool_calls))
        return reply

    async def _compare(
        self, record: RolloutRecord, turn: int, previous: _Turn, prompt: list[int] | None
    ) -> None:
        if previous.sampled is None or previous.prompt is None or prompt is None:
            self.report.turns_skipped += 1
            return
        self.report.turns_compared += 1
        expected = previous.prompt + previous.sampled
        at = _first_difference(expected, prompt)
        if at is None:
            _tokens_decide(record, turn)
            return
        reply_start = len(previous.prompt)
        if at < reply_start:
            cause, where = "earlier history re-rendered", "in the earlier history"
        else:
            cause = "tool call re-rendered" if previous.tool_call else "reply text re-rendered"
            where = f"at token {at - reply_start + 1} of turn {turn - 1}'s sampled reply"
        self.report.turns_with_drift += 1
        self.report.drifted_rollouts.add(record.rollout_id)
        self.report.causes[cause] += 1
        before = await self._show(expected[max(0, at - _CONTEXT) : at])
        sampled = await self._show(expected[at : at + _CONTEXT])
        rendered = await self._show(prompt[at : at + _CONTEXT])
        record.add(
            TOKEN_DRIFT,
            f"turn {turn}'s prompt differs from turn {turn - 1}'s prompt + sampled tokens at "
            f"position {at} ({where}): after {before}, the model sampled {sampled} but the "
            f"template re-renders {rendered}; TrainGate would train on tokens the model never "
            f"saw ({cause})",
        )

    async def _show(self, ids: list[int]) -> str:
        """Each token decoded on its own, so token boundaries stay visible."""
        if not ids:
            return "[end]"
        pieces = []
        for token in ids:
            try:
                text = await self.engine.decode([token])
            except LLMBackendError:
                text = f"<id {token}>"
            pieces.append(repr(text))
        return "[" + " ".join(pieces) + "]"


def _tokens_decide(record: RolloutRecord, turn: int) -> None:
    """The tokens show ``turn``'s prompt continues the last one exactly: whatever the messages
    look like, TrainGate trains on what the model saw, so a ``history_rewritten`` finding of
    that turn (a difference no template renders) is withdrawn."""
    record.findings[:] = [
        f for f in record.findings if not (f.code == HISTORY_REWRITTEN and f.turn == turn)
    ]


def _first_difference(expected: list[int], actual: list[int]) -> int | None:
    """The first index where ``actual`` does not continue ``expected``, or None."""
    for index, token in enumerate(expected):
        if index >= len(actual) or actual[index] != token:
            return index
    return None
