"""``OpenAICompatibleBackend``: the mock TrainGate's turns answered by a real model, through any
OpenAI-style ``/chat/completions`` endpoint (OpenAI, vLLM, SGLang, Ollama, llama.cpp).

It implements :class:`~osmosis_rollout.testing.records.LLMBackend`, like the offline backends
of :mod:`.backends`. Its POSTs go through a :class:`~osmosis_rollout.transport.PostTransport`:
the lean ``Http1Transport`` when the server's TrainGate client would use it (asyncio, no proxy,
``httptools``; ``OSMOSIS_HTTP_CLIENT=httpx2`` forces ``httpx2``), since ``httpx2`` was about
half of ``osmosis test --llm-url``'s CPU against a fast server (``benchmarks/bench_carriers.py``:
0.07-0.13x the CPU per POST); an ``httpx2`` client handed in (``http=``) is used as given.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
from pydantic import ValidationError

from ..client import RetryPolicy, default_transport
from ..errors import ConfigError, LLMBackendError
from ..protocol import (
    CompletionsRequest,
    CompletionsResponse,
    describe_validation_error,
    wire,
)
from ..redaction import scrub
from ..transport import (
    DecodeFailure,
    Httpx2Transport,
    InvalidTarget,
    PostTransport,
    Reply,
    TransportFailure,
    parse_retry_after,
    read_event_stream,
)
from .llm_errors import deterministic_error
from .records import RolloutRecord, estimate_tokens
from .server_facts import ServerFacts, probe_server
from .turn_times import TurnTimes, engine_ms

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_OPENAI_BASE_URL", "OpenAICompatibleBackend"]

#: Where ``OpenAICompatibleBackend.from_env`` points without a URL, as the OpenAI SDK does.
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
#: ``max_tokens`` for a turn that sets none: without it a local server may generate until its
#: context is full (minutes on a CPU) before answering.
DEFAULT_MAX_TOKENS = 1024
_BODY_EXCERPT = 300
#: The largest reply read (raw and decoded): far above a chat reply, even a long generation
#: with ``top_logprobs`` (a few MB), yet a bound, so a broken server cannot exhaust memory.
MAX_LLM_REPLY_BYTES = 64 * 2**20


def _sampled_ids(choice: dict[str, Any]) -> list[int] | None:
    """The token ids the model sampled, where an engine puts them: vLLM's
    ``choices[0].token_ids`` (``return_token_ids``), or the ``id`` of each entry of
    llama.cpp's ``choices[0].logprobs.content``."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return ids
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if isinstance(content, list) and content:
        found = [item.get("id") for item in content if isinstance(item, dict)]
        ints = [i for i in found if isinstance(i, int)]
        if len(ints) == len(content):
            return ints
    return None


def _generation_abandoned(exc: TransportFailure) -> bool:
    """A read timeout: the request was sent, so the server may still be generating the reply."""
    return exc.kind == "ReadTimeout"


class OpenAICompatibleBackend:
    """Answers turns with a real model behind an OpenAI-style ``/chat/completions`` endpoint.

    Works with OpenAI, vLLM, SGLang, Ollama and llama.cpp servers. Like the OpenAI SDK, it
    appends ``/chat/completions`` to ``base_url`` as given, so pass the URL up to and including
    the version segment (``http://localhost:8000/v1``). Each request carries the turn's
    messages and sampling parameters plus ``tools`` (the tools the rollout server declared at
    init); our ``rollout_id`` and ``logprobs`` extensions are sent only with
    ``forward_extensions=True``. A turn without ``max_tokens`` gets ``default_max_tokens``
    (``None`` sends none).

    429 and 5xx answers and transport errors are retried with backoff (``retry``; ``sleep`` is
    injectable for tests), except a reply that timed out (the server may still be generating
    it, so a retry would only queue behind the abandoned generation) and an error a retry
    cannot change (:mod:`.llm_errors`: no ``--jinja``, a full context, an unparsable reply):
    those fail at once and say so. Failures raise :class:`~osmosis_rollout.errors.LLMBackendError`
    whose ``kind`` and ``systemic`` flag let a batch stop early on a bad key or a dead server.
    A reply without ``usage`` gets an estimate, since the protocol requires one; a streamed
    reply (``"stream": true`` in ``extra_body``) is folded into one. Replies are read up to
    ``max_reply_bytes``. The API key is never part of an error message or ``repr``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        http: httpx2.AsyncClient | None = None,
        timeout_s: float = 120.0,
        extra_headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
        forward_extensions: bool = False,
        default_max_tokens: int | None = DEFAULT_MAX_TOKENS,
        extra_body: Mapping[str, Any] | None = None,
        max_reply_bytes: int = MAX_LLM_REPLY_BYTES,
        seed: int | None = None,
    ) -> None:
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"LLM URL {base_url!r} must be an http:// or https:// URL with a host, "
                "e.g. http://localhost:8000/v1"
            )
        if not model.strip():
            raise ConfigError("the model name is empty: pass --model NAME")
        self.base_url = base_url.strip().rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self._api_key = api_key or None
        self.timeout_s = timeout_s
        self.extra_headers = dict(extra_headers or {})
        self.retry = retry or RetryPolicy(retries=3, base_delay_s=1.0, max_delay_s=20.0)
        self.forward_extensions = forward_extensions
        self.default_max_tokens = default_max_tokens
        #: Merged into every request body (engine-specific switches, e.g. ``return_token_ids``).
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        #: The most turns that were with the server at once: above the server's own slots,
        #: part of the measured LLM time is queueing there, not generation.
        self.max_in_flight = 0
        self._in_flight = 0
        #: Each turn's request time and the engine's own (llama.cpp ``timings``).
        self.times = TurnTimes()
        #: What the server reported about itself (:meth:`probe`), once asked.
        self.facts: ServerFacts | None = None
        self._sleep = sleep
        self._http = http
        self._owns_http = http is None
        self.max_reply_bytes = max_reply_bytes
        #: What the turns are posted through, made at the first turn (it must know the loop).
        self._carrier: PostTransport | None = None
        #: ``osmosis test --seed``: sent as each request's ``seed`` (see :meth:`seed_for`).
        self.seed = seed
        self._keys: dict[str, str] = {}  # rollout id -> its row and sample (bind_rollout)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        base_url: str | None = None,
        model: str | None = None,
        **options: Any,
    ) -> OpenAICompatibleBackend:
        """Build from flags, falling back to ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.

        Without a URL anywhere, it uses OpenAI's own (``DEFAULT_OPENAI_BASE_URL``).
        """
        if not model:
            raise ConfigError(
                "no model name: pass --model NAME (the name the LLM server serves, "
                "e.g. 'gpt-4o-mini' or vLLM's --served-model-name)"
            )
        url = base_url or environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_BASE_URL
        api_key = environ.get("OPENAI_API_KEY") or None
        if url == DEFAULT_OPENAI_BASE_URL and api_key is None:
            raise ConfigError(
                "OpenAI's API needs a key: set OPENAI_API_KEY, or point --llm-url at your own "
                "OpenAI-compatible server (vLLM, SGLang, Ollama...)"
            )
        return cls(url, model, api_key, **options)

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(base_url={self.base_url!r}, model={self.model!r})"

    async def __aenter__(self) -> OpenAICompatibleBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def http(self) -> httpx2.AsyncClient:
        """The HTTP client: the one passed in, or one created on first use (then owned)."""
        if self._http is None:
            timeout = httpx2.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s))
            self._http = httpx2.AsyncClient(timeout=timeout)
        return self._http

    @property
    def carrier(self) -> PostTransport:
        """What the turns are posted through: the ``httpx2`` client handed in, else the
        carrier the server's TrainGate client would pick (``client.default_transport``)."""
        if self._carrier is None:
            if self._http is not None and not self._owns_http:
                self._carrier = Httpx2Transport(self._http, max_reply_bytes=self.max_reply_bytes)
            else:
                policy = RetryPolicy(
                    attempt_timeout_s=self.timeout_s,
                    connect_timeout_s=min(10.0, self.timeout_s),
                    max_reply_bytes=self.max_reply_bytes,
                )
                self._carrier = default_transport(policy, 100)
        return self._carrier

    async def aclose(self) -> None:
        """Close the HTTP client and the carrier if this backend created them."""
        if self._carrier is not None and self._owns_http:
            await self._carrier.aclose()
        self._carrier = None
        if self._owns_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        """Send one turn to the LLM server and map its reply (or failure)."""
        if self.facts is not None and self.facts.template_tool_format is not None:
            record.template_tool_format = self.facts.template_tool_format
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        started = time.perf_counter()
        try:
            response = await self._post(json.dumps(self.body(request, record)).encode())
        finally:
            self._in_flight -= 1
        wall_ms = (time.perf_counter() - started) * 1000
        reply, model_ms = self._parse(response, request)
        self.times.add(record.rollout_id, wall_ms, model_ms)
        return reply

    async def probe(self) -> ServerFacts:
        """Ask the server what it reports about itself (slots, context, sampling, template);
        kept in :attr:`facts`. A server that says nothing gives empty facts, never an error."""
        self.facts = await probe_server(self.http, self.base_url)
        return self.facts

    def bind_rollout(self, rollout_id: str, key: str, replies: list[Any] | None = None) -> None:
        """``rollout_id`` is row and sample ``key`` (``"3"``, ``"3/1"``): what its seed is
        made from, so each sample of a row is seeded apart and a rerun repeats."""
        if self.seed is not None:
            self._keys[rollout_id] = key

    def rollout_completed(self, record: RolloutRecord, response: Any) -> None:
        """The rollout is over: forget its key."""
        self._keys.pop(record.rollout_id, None)

    def seed_for(self, rollout_id: str) -> int | None:
        """The ``seed`` of ``rollout_id``'s requests: ``--seed`` plus a digest of its row and
        sample (the seed itself when unbound), under 2**31; None without ``--seed``."""
        if self.seed is None:
            return None
        key = self._keys.get(rollout_id)
        return self.seed if key is None else (self.seed + zlib.crc32(key.encode())) % 2**31

    def body(self, request: CompletionsRequest, record: RolloutRecord) -> dict[str, Any]:
        """The JSON body for one turn: the OpenAI SDK's shape, with the declared tools."""
        body: dict[str, Any] = {"model": self.model, "messages": request.messages}
        for key in ("temperature", "top_p", "max_tokens", "stop"):
            value = getattr(request, key)
            if value is not None:
                body[key] = value
        if request.max_tokens is None and self.default_max_tokens is not None:
            body["max_tokens"] = self.default_max_tokens
        body.update({k: v for k, v in (request.model_extra or {}).items() if k != "tools"})
        body.update(self.extra_body)
        seed = self.seed_for(record.rollout_id)
        if seed is not None:
            body.setdefault("seed", seed)  # an agent's own seed wins
        if record.tools:
            body["tools"] = [wire(tool) for tool in record.tools]
        if self.forward_extensions:
            body["rollout_id"] = request.rollout_id
            if request.logprobs is not None:
                body["logprobs"] = request.logprobs
        return body

    # -- HTTP and retries -------------------------------------------------------------------

    async def _post(self, content: bytes) -> Reply:
        headers = {"Content-Type": "application/json", **self.extra_headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        policy = self.retry
        for attempt in range(policy.retries + 1):
            last = attempt == policy.retries
            try:
                response = await self.carrier.post(self.url, content, headers)
            except TransportFailure as exc:
                if last or _generation_abandoned(exc):
                    raise self._transport_error(exc, attempt + 1) from None
                delay = policy.backoff(attempt, random.random())
            except InvalidTarget as exc:
                raise LLMBackendError(
                    f"cannot call the LLM server at {self.url}: {self._scrub(str(exc))[:200]}",
                    kind="http",
                    systemic=True,
                ) from None
            except DecodeFailure as exc:
                raise LLMBackendError(
                    f"the reply of the LLM server at {self.url} could not be read: "
                    f"{self._scrub(str(exc))[:200]}",
                    kind="bad_response",
                ) from None
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return response
                if last or not (status == 429 or status >= 500) or self._repeats(response):
                    raise self._status_error(response, attempt + 1)
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                delay = (
                    min(retry_after, policy.retry_after_cap_s)
                    if retry_after is not None
                    else policy.backoff(attempt, random.random())
                )
            await self._sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _repeats(self, response: Reply) -> bool:
        """Whether the error would come back the same on a retry."""
        return deterministic_error(response.status_code, self._excerpt(response)) is not None

    def _transport_error(self, exc: TransportFailure, attempts: int) -> LLMBackendError:
        detail = self._scrub(str(exc))[:200]
        tried = f" ({attempts} attempts)" if attempts > 1 else ""
        if exc.kind in ("ConnectError", "ConnectTimeout"):
            return LLMBackendError(
                f"cannot connect to the LLM server at {self.base_url}{tried}: "
                f"{exc.kind} {detail}. Is it running? Check --llm-url / OPENAI_BASE_URL",
                kind="unreachable",
                systemic=True,
            )
        if _generation_abandoned(exc):
            return LLMBackendError(
                f"the LLM server at {self.base_url} did not answer within {self.timeout_s:g} s; "
                "not retried, since it may still be generating this reply (a retry would queue "
                "behind it). Lower --max-tokens, or allow more time with --llm-timeout",
                kind="timeout",
            )
        if exc.timed_out:
            return LLMBackendError(
                f"the LLM server at {self.base_url} did not answer within {self.timeout_s:g} s"
                f"{tried}",
                kind="timeout",
            )
        return LLMBackendError(
            f"the connection to the LLM server at {self.base_url} failed{tried}: "
            f"{exc.kind} {detail}",
            kind="http",
        )

    def _status_error(self, response: Reply, attempts: int) -> LLMBackendError:
        status = response.status_code
        where = f"the LLM server at {self.url} answered HTTP {status}"
        tried = f" after {attempts} attempts" if attempts > 1 else ""
        body = self._excerpt(response)
        if status in (401, 403):
            hint = (
                "it needs an API key: set OPENAI_API_KEY"
                if self._api_key is None
                else "check the API key in OPENAI_API_KEY"
            )
            # No body here: providers echo parts of a rejected key in it.
            return LLMBackendError(
                f"{where}: {hint}", kind="auth", systemic=True, status_code=status
            )
        if status == 404:
            return LLMBackendError(
                f"{where}: check the URL (it usually ends in /v1; /chat/completions is appended) "
                f"and the model name {self.model!r}" + (f" ({body})" if body else ""),
                kind="not_found",
                systemic=True,
                status_code=status,
            )
        if status == 429:
            return LLMBackendError(
                f"{where}{tried}: rate limited; lower --concurrency or try again later"
                + (f" ({body})" if body else ""),
                kind="rate_limit",
                status_code=status,
            )
        known = deterministic_error(status, body)
        if known is not None and known.kind == "context_length":
            return LLMBackendError(
                f"{where}: the conversation is longer than the model's context window; lower "
                f"--max-tokens or --max-turns, or shorten the prompts ({body})",
                kind="context_length",
                status_code=status,
            )
        if known is not None:
            return LLMBackendError(
                f"{where}{tried}: {body} (not retried: it would fail the same way)",
                kind=known.kind,
                systemic=known.systemic,
                status_code=status,
            )
        return LLMBackendError(
            f"{where}{tried}" + (f": {body}" if body else ""), kind="http", status_code=status
        )

    def _parse(
        self, response: Reply, request: CompletionsRequest
    ) -> tuple[CompletionsResponse, float | None]:
        """The reply as a chat completion, and the engine's own time for it (ms) if it says."""
        data: Any
        try:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                data = read_event_stream(response.content)
            else:
                data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise LLMBackendError(
                f"the LLM server at {self.url} did not answer with a JSON object "
                f"({self._excerpt(response) or 'empty body'})",
                kind="bad_response",
            )
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(first, dict):
            per_choice = first.get("logprobs")
            if data.get("token_ids") is None:
                data["token_ids"] = _sampled_ids(first)
            if data.get("logprobs") is None and isinstance(per_choice, dict):
                data["logprobs"] = per_choice
            if data.get("usage") is None and isinstance(first.get("message"), dict):
                prompt = estimate_tokens(request.messages)
                completion = estimate_tokens([first["message"]])
                data["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion}
        try:
            return CompletionsResponse.model_validate(data), engine_ms(data)
        except ValidationError as exc:
            raise LLMBackendError(
                f"the LLM server at {self.url} sent a reply that is not a chat completion "
                f"({describe_validation_error(exc)}); it needs choices[0].message",
                kind="bad_response",
            ) from None

    def _scrub(self, text: str) -> str:
        return scrub(text, self._api_key)

    def _excerpt(self, response: Reply) -> str:
        try:
            text = response.text
        except (UnicodeDecodeError, LookupError):
            return ""
        text = self._scrub(" ".join(text.split()))
        return text[:_BODY_EXCERPT] + ("..." if len(text) > _BODY_EXCERPT else "")
