"""A stand-in for vLLM's and llama.cpp's servers, with a small real tokenizer built offline.

:class:`EngineStub` serves chat completions (from :class:`OpenAIStub`) plus one engine's
tokenizer endpoints, field names as the engines document them:

- ``engine="vllm"``: ``POST /tokenize`` (``messages``, ``tools``, ``add_generation_prompt`` ->
  ``count``, ``max_model_len``, ``tokens``), ``POST /detokenize`` (``tokens`` -> ``prompt``);
  sampled ids in ``choices[0].token_ids`` when the request sets ``return_token_ids``.
- ``engine="llamacpp"``: ``POST /apply-template`` (``messages`` -> ``prompt``), ``POST
  /tokenize`` (``content`` -> ``tokens``), ``POST /detokenize`` (``tokens`` -> ``content``);
  sampled ids as the ``id`` of each ``choices[0].logprobs.content`` entry with ``logprobs``;
  ``GET /props`` as the real server answered it (``total_slots`` = ``slots``), ``timings`` in
  every reply and ``"content": ""`` beside parsed tool calls, as the real server sends them.

``RECORDED`` holds bodies recorded from the real llama.cpp server (``assets/
llama_cpp_recorded.json``: its ``/props``, the bare-JSON and broken text calls, the
``"content": ""`` tool call, the three deterministic HTTP 500 bodies); :func:`recorded` and
:func:`recorded_error` replay them byte for byte through an :class:`OpenAIStub` script.

The "model" writes ``sampled[turn]`` (the raw text, turn = assistant messages so far); the
server parses ``<tool_call>`` blocks (or, with ``parse_bare_json``, a bare JSON call) into
``tool_calls`` as a Hermes-style parser does, and the template renders tool calls back inside
``<tool_call>`` tags with the arguments string as given: a Qwen2.5-like template.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .openai_stub import OpenAIStub, RecordedRequest, Reply

SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
_CORPUS = [
    'system user assistant tool <tool_response> </tool_response> "name": "add", "arguments":',
    '{"a": 1, "b": 2} {"b":2,"a":1} {"type": "function", "function": {"name": "add"}}',
    "What is 1 + 2? The sum is 3. Hello there, the answer follows.",
    '"description": "Add two numbers", "parameters": {"type": "object", "properties":',
]
_TAGGED = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
RECORDED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "assets" / "llama_cpp_recorded.json").read_text()
)


def recorded(name: str) -> Reply:
    """A whole chat completion the real llama.cpp server sent (``bare_json_call``,
    ``broken_json_call``, ``empty_content_tool_call``), as it sent it."""
    return Reply(raw=copy.deepcopy(RECORDED[name]))


def recorded_error(kind: str) -> Reply:
    """One of the real server's deterministic errors (``needs_jinja``, ``context_length``,
    ``unparsable_reply``): its HTTP status and JSON body."""
    error = RECORDED["errors"][kind]
    return Reply(status=error["status"], raw=copy.deepcopy(error["body"]))


def recorded_props(slots: int | None = None) -> dict[str, Any]:
    """The real server's ``GET /props`` answer, with ``total_slots`` set to ``slots``."""
    props = copy.deepcopy(RECORDED["props"])
    if slots is not None:
        props["total_slots"] = slots
    return props


def timings(prompt_n: int, predicted_n: int) -> dict[str, Any]:
    """llama.cpp's ``timings`` block, its keys as recorded, for a reply of that size."""
    shape = RECORDED["bare_json_call"]["timings"]
    # Small per-token figures: the stub answers at once, and the model's time must be part of
    # the request's (a real server's timings are).
    values = {
        "cache_n": 0,
        "prompt_n": prompt_n,
        "prompt_ms": 0.001 * prompt_n,
        "prompt_per_token_ms": 0.001,
        "prompt_per_second": 1e6,
        "predicted_n": predicted_n,
        "predicted_ms": 0.01 * predicted_n,
        "predicted_per_token_ms": 0.01,
        "predicted_per_second": 1e5,
    }
    return {key: values[key] for key in shape}


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on a few lines, with the chat template's special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """A Qwen2.5-like chat template, generation prompt included."""
    out = []
    if tools:
        listed = "\n".join(json.dumps(tool) for tool in tools)
        out.append(f"<|im_start|>system\n# Tools\n{listed}<|im_end|>\n")
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            text = message.get("content") or ""
            for call in message.get("tool_calls") or []:
                function = call["function"]
                args = function["arguments"]
                args_text = args if isinstance(args, str) else json.dumps(args)
                block = f'{{"name": "{function["name"]}", "arguments": {args_text}}}'
                text += ("\n" if text else "") + f"<tool_call>\n{block}\n</tool_call>"
            out.append(f"<|im_start|>assistant\n{text}<|im_end|>\n")
        elif role == "tool":
            content = message.get("content")
            out.append(
                f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
            )
        else:
            out.append(f"<|im_start|>{role}\n{message.get('content') or ''}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


class EngineStub(OpenAIStub):
    """vLLM or llama.cpp, as far as chat turns and their tokens go."""

    def __init__(
        self,
        engine: str,
        sampled: list[str],
        *,
        parse_bare_json: bool = False,
        tokenize_fails_after: int | None = None,
        returns_ids: bool = True,
        slots: int = 2,
    ) -> None:
        if engine not in ("vllm", "llamacpp"):
            raise ValueError(f"unknown engine {engine!r}: vllm or llamacpp")
        self.engine = engine
        self.sampled = sampled
        self.parse_bare_json = parse_bare_json
        #: Answer HTTP 500 to /tokenize once it has answered this many times.
        self.tokenize_fails_after = tokenize_fails_after
        self.tokenized = 0
        #: False: an older engine that ignores the request for sampled ids.
        self.returns_ids = returns_ids
        #: llama.cpp's ``total_slots`` in ``/props``.
        self.slots = slots
        self.tokenizer = build_tokenizer()
        self.im_end = self.tokenizer.token_to_id("<|im_end|>")
        super().__init__(responder=self._reply)

    def routes(self) -> list[Route]:
        """Chat completions plus the engine's own tokenizer endpoints."""
        routes = [
            *super().routes(),
            Route("/tokenize", self._tokenize, methods=["POST"]),
            Route("/detokenize", self._detokenize, methods=["POST"]),
        ]
        if self.engine == "llamacpp":
            routes.append(Route("/apply-template", self._apply_template, methods=["POST"]))
            routes.append(Route("/props", self._props, methods=["GET"]))
        return routes

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (special tokens recognised)."""
        return list(self.tokenizer.encode(text).ids)

    # -- the model and its reply parser --------------------------------------------------------

    def _reply(self, recorded: RecordedRequest) -> Reply:
        body = recorded.body
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        raw = self.sampled[turn] if turn < len(self.sampled) else "Done."
        ids = [*self.encode(raw), self.im_end]
        message = self._parse(raw, turn)
        choice_extra: dict[str, Any] = {}
        if self.returns_ids and self.engine == "vllm" and body.get("return_token_ids"):
            choice_extra["token_ids"] = ids
        if self.returns_ids and self.engine == "llamacpp" and body.get("logprobs"):
            entries = [
                {
                    "id": i,
                    "token": self.tokenizer.decode([i], skip_special_tokens=False),
                    "logprob": -0.1,
                }
                for i in ids
            ]
            choice_extra["logprobs"] = {"content": entries}
        prompt = self.encode(render(body["messages"], body.get("tools")))
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        extra = {"timings": timings(len(prompt), len(ids))} if self.engine == "llamacpp" else {}
        return Reply(message, usage=usage, choice_extra=choice_extra, extra=extra)

    def parsed(self, raw: str) -> dict[str, Any]:
        """The message this server answers when the model wrote ``raw`` (at turn 0)."""
        return self._parse(raw, 0)

    def _parse(self, raw: str, turn: int) -> dict[str, Any]:
        blocks = _TAGGED.findall(raw)
        if not blocks and self.parse_bare_json:
            try:
                json.loads(raw)
                blocks = [raw]
            except ValueError:
                blocks = []
        calls = []
        for index, block in enumerate(blocks):
            parsed = json.loads(block)
            calls.append(
                {
                    "type": "function",
                    "function": {
                        "name": parsed["name"],
                        "arguments": json.dumps(parsed["arguments"], ensure_ascii=False),
                    },
                    "id": f"call_{turn}_{index}",
                }
            )
        if not calls:
            return {"role": "assistant", "content": raw}
        text = _TAGGED.sub("", raw).strip() if not self.parse_bare_json else ""
        # llama.cpp answers a parsed call with "content": "", vLLM with null.
        empty = "" if self.engine == "llamacpp" else None
        return {"role": "assistant", "content": text or empty, "tool_calls": calls}

    # -- tokenizer endpoints --------------------------------------------------------------------

    async def _tokenize(self, request: Request) -> Response:
        recorded = await self.record(request)
        body = recorded.body if isinstance(recorded.body, dict) else {}
        self.tokenized += 1
        if self.tokenize_fails_after is not None and self.tokenized > self.tokenize_fails_after:
            return JSONResponse({"error": "tokenizer crashed"}, status_code=500)
        if self.engine == "vllm":
            if "messages" in body:
                text = render(body["messages"], body.get("tools"))
            elif "prompt" in body:
                text = str(body["prompt"])
            else:
                return JSONResponse({"error": "messages or prompt required"}, status_code=400)
            ids = self.encode(text)
            return JSONResponse({"count": len(ids), "max_model_len": 4096, "tokens": ids})
        if not isinstance(body.get("content"), str):
            return JSONResponse({"error": {"message": "content is required"}}, status_code=400)
        return JSONResponse({"tokens": self.encode(body["content"])})

    async def _detokenize(self, request: Request) -> Response:
        recorded = await self.record(request)
        ids = recorded.body.get("tokens", []) if isinstance(recorded.body, dict) else []
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        key = "prompt" if self.engine == "vllm" else "content"
        return JSONResponse({key: text})

    async def _props(self, request: Request) -> Response:
        await self.record(request)
        return JSONResponse(recorded_props(self.slots))

    async def _apply_template(self, request: Request) -> Response:
        recorded = await self.record(request)
        body = recorded.body if isinstance(recorded.body, dict) else {}
        return JSONResponse({"prompt": render(body.get("messages", []), body.get("tools"))})
