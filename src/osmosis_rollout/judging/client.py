"""``Judge``: a judge model behind any OpenAI-compatible ``/chat/completions`` endpoint.

Its calls go through the toolkit's carriers (``client.default_transport``: the lean HTTP/1.1
pool, else ``httpx2``) with a :class:`~osmosis_rollout.destinations.DestinationPolicy` checking
every connection's addresses and a bound on every reply, like the server's TrainGate calls. What
the judge answers is parsed strictly (:mod:`.verdict`); a reply that is not a verdict gets one
repair request, then the judge fails with :class:`~osmosis_rollout.errors.JudgeError`: a failed
judge is never a score. The key is sent only in the ``Authorization`` header and scrubbed from
every message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from ..client import RetryPolicy, default_transport
from ..destinations import DestinationPolicy
from ..errors import ConfigError, JudgeError
from ..redaction import scrub
from ..transport import InvalidTarget, PostTransport, TransportFailure
from .rubric import Rubric
from .settings import JudgeSettings
from .tape import active_tape, request_key
from .verdict import (
    Cost,
    Ranking,
    Verdict,
    VerdictRefused,
    parse_ranking,
    parse_verdict,
    rank_prompt,
    repair_request,
    score_prompt,
    with_cost,
)

T = TypeVar("T")

__all__ = ["Judge"]

#: The largest judge reply read: a verdict is a few KB.
MAX_JUDGE_REPLY_BYTES = 2 * 2**20
_EXCERPT = 200


class Judge:
    """Scores transcripts against a rubric with a judge model (``score``; ``rank`` for the
    samples of one prompt at once). Make one per process and share it: it keeps a connection
    pool (``aclose`` releases it)."""

    def __init__(
        self,
        settings: JudgeSettings,
        *,
        transport: PostTransport | None = None,
        destinations: DestinationPolicy | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if settings.url is None or settings.is_mock:
            raise ConfigError(
                "Judge needs a judge URL (the mock judge is MockJudge, or load_judge)"
            )
        self.settings = settings
        self._given = transport
        self._transport: PostTransport | None = transport
        self._loop: asyncio.AbstractEventLoop | None = None
        self._destinations = destinations or DestinationPolicy()
        self._extra_body = dict(extra_body or {})
        self.requests = 0

    def __repr__(self) -> str:
        return f"Judge(url={self.settings.url!r}, model={self.settings.model!r})"

    async def score(
        self,
        rubric: Rubric,
        messages: Sequence[Mapping[str, Any]],
        *,
        reference: object = None,
    ) -> Verdict:
        """The verdict on one transcript: a score in [0, 1], one reason per criterion.
        ``reference`` (a row's ground truth) replaces the rubric's reference answer."""
        if reference is not None:
            rubric = rubric.with_reference(reference)
        verdict, cost = await self._judge(
            score_prompt(rubric, messages), lambda text: parse_verdict(rubric, text)
        )
        return with_cost(verdict, cost)

    async def rank(
        self,
        rubric: Rubric,
        samples: Sequence[Sequence[Mapping[str, Any]]],
        *,
        reference: object = None,
    ) -> Ranking:
        """The samples of one prompt judged together, in one call; ``spread`` says how far
        apart the judge put them (each verdict carries an even share of the call's cost)."""
        if not samples:
            return Ranking([])
        if reference is not None:
            rubric = rubric.with_reference(reference)
        count = len(samples)
        ranking, cost = await self._judge(
            rank_prompt(rubric, samples), lambda text: parse_ranking(rubric, text, count)
        )
        return Ranking([with_cost(v, cost.share(count, i)) for i, v in enumerate(ranking.verdicts)])

    async def aclose(self) -> None:
        """Release the connection pool (a transport handed in is the caller's to close)."""
        if self._transport is not None and self._given is None:
            await self._transport.aclose()
            self._transport = None

    async def _judge(
        self, prompt: list[dict[str, str]], parse: Callable[[str], T]
    ) -> tuple[T, Cost]:
        """Ask, parse strictly, ask once more for a repair, else fail the judge."""
        started = time.perf_counter()
        messages: list[dict[str, str]] = list(prompt)
        cost = Cost()
        why = ""
        for attempt in range(2):
            text, usage = await self._call(messages)
            cost = cost.plus(usage)
            try:
                parsed = parse(text)
            except VerdictRefused as exc:
                why = str(exc)
                if attempt == 0:
                    messages += [
                        {"role": "assistant", "content": text},
                        {"role": "user", "content": repair_request(why)},
                    ]
                continue
            return parsed, cost.timed((time.perf_counter() - started) * 1000)
        raise JudgeError(
            self._scrub(f"the judge's reply is not a verdict, even after a repair request: {why}"),
            kind="verdict",
        )

    async def _call(self, messages: list[dict[str, str]]) -> tuple[str, tuple[int, int]]:
        """One chat completion: the reply's text and its (prompt, completion) tokens."""
        s = self.settings
        body: dict[str, Any] = {
            **self._extra_body,
            "model": s.model,
            "messages": messages,
            "temperature": s.temperature,
            "seed": s.seed,
            "max_tokens": s.max_tokens,
        }
        tape = active_tape()
        key = request_key(body) if tape is not None else ""
        if tape is not None and tape.replaying:
            found = tape.answer(key)
            if found is None:
                raise JudgeError(
                    "replay: the cassette holds no judge reply for this request (the transcript, "
                    "the rubric or the judge's settings changed since it was recorded)",
                    kind="replay",
                )
            return found
        text, usage = await self._post(body)
        if tape is not None:
            tape.keep(key, text, usage)
        return text, usage

    async def _post(self, body: dict[str, Any]) -> tuple[str, tuple[int, int]]:
        """The HTTP call itself."""
        s = self.settings
        headers = {"content-type": "application/json", "accept": "application/json"}
        if s.api_key is not None:
            headers["authorization"] = f"Bearer {s.api_key.get_secret_value()}"
        url = f"{(s.url or '').rstrip('/')}/chat/completions"
        self.requests += 1
        try:
            with anyio.fail_after(s.timeout_s):
                reply = await self._carrier().post(url, json.dumps(body).encode(), headers)
        except TimeoutError:
            raise JudgeError(
                f"the judge did not answer within {s.timeout_s:g}s", kind="timeout"
            ) from None
        except TransportFailure as exc:
            kind = "timeout" if exc.timed_out else "http"
            raise JudgeError(
                self._scrub(f"the judge is unreachable ({exc.kind}: {exc})"), kind=kind
            ) from None
        except InvalidTarget as exc:
            raise JudgeError(
                self._scrub(f"the judge cannot be called: {exc}"), kind="http"
            ) from None
        except Exception as exc:  # a body over the bound, a bad encoding
            raise JudgeError(
                self._scrub(f"the judge's reply could not be read ({type(exc).__name__}: {exc})"),
                kind="http",
            ) from None
        if reply.status_code != 200:
            excerpt = reply.text[:_EXCERPT]
            raise JudgeError(
                self._scrub(f"the judge answered HTTP {reply.status_code}: {excerpt}"), kind="http"
            )
        try:
            data = reply.json()
            text = data["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(
                self._scrub(f"the judge's reply is not a chat completion: {reply.text[:_EXCERPT]}"),
                kind="http",
            ) from None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        # The key out of the reply before anything keeps it (a verdict's reasons, a cassette).
        tokens = (_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
        return self._scrub(text), tokens

    def _carrier(self) -> PostTransport:
        """The carrier, made in the running event loop (a pool belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._transport is None or (self._given is None and self._loop is not loop):
            retry = RetryPolicy(
                retries=0,
                attempt_timeout_s=self.settings.timeout_s,
                connect_timeout_s=min(10.0, self.settings.timeout_s),
                max_reply_bytes=MAX_JUDGE_REPLY_BYTES,
            )
            self._transport = default_transport(retry, 16, self._destinations)
            self._loop = loop
        return self._transport

    def _scrub(self, text: str) -> str:
        key = self.settings.api_key
        return scrub(text, key.get_secret_value() if key is not None else None)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
