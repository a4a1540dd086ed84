"""What a model server says about itself, so ``osmosis test`` can fit the run to it.

llama.cpp's ``GET /props`` reports its slots (``total_slots``: how many requests it decodes at
once, ``--parallel``), each slot's context (``default_generation_settings.n_ctx``), its default
sampling and its chat template; vLLM's ``GET /v1/models`` reports ``max_model_len`` (its
``--max-num-seqs`` is not exposed). Turns beyond a server's slots only wait in its queue, so a
run against a real model is sized from ``slots`` unless ``--concurrency`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2

from .text_tool_calls import TAGS

__all__ = ["ServerFacts", "probe_server"]

_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ServerFacts:
    """What the server reported; each field None when it said nothing about it."""

    engine: str | None = None
    #: Requests decoded at once (llama.cpp ``total_slots``).
    slots: int | None = None
    #: Tokens of context each slot has (llama.cpp: ``-c`` / ``--parallel``; vLLM: the model's).
    context: int | None = None
    #: The server's own sampling defaults, for turns that set none (temperature, seed...).
    sampling: dict[str, Any] | None = None
    #: How the chat template renders tool calls: ``text_tool_calls.TAGS`` or None (unknown).
    template_tool_format: str | None = None

    def concurrency_note(self, concurrency: int) -> str:
        """One line saying what ``concurrency`` was sized from."""
        if self.slots is not None:
            return (
                f"concurrency {concurrency}: {self.engine} reports {self.slots} slot(s) "
                "(/props total_slots); --concurrency N overrides"
            )
        engine = self.engine or "the model server"
        return (
            f"concurrency {concurrency}: {engine} does not report how many requests it serves "
            "at once (llama.cpp --parallel, vLLM --max-num-seqs); pass --concurrency to match it"
        )


async def probe_server(http: httpx2.AsyncClient, base_url: str) -> ServerFacts:
    """Ask the server at ``base_url`` (``.../v1``) what it reports; never raises: a server that
    answers neither probe gives an empty :class:`ServerFacts`."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    props = await _get_json(http, f"{root}/props")
    if isinstance(props, dict) and "total_slots" in props:
        return _llama_cpp(props)
    models = await _get_json(http, f"{base_url.rstrip('/')}/models")
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    if isinstance(first.get("max_model_len"), int):
        return ServerFacts(engine="vLLM", context=first["max_model_len"])
    return ServerFacts()


def _llama_cpp(props: dict[str, Any]) -> ServerFacts:
    settings = props.get("default_generation_settings")
    settings = settings if isinstance(settings, dict) else {}
    params = settings.get("params")
    sampling = None
    if isinstance(params, dict):
        sampling = {k: params[k] for k in ("temperature", "top_p", "seed") if k in params}
    template = props.get("chat_template_tool_use") or props.get("chat_template")
    slots = props.get("total_slots")
    context = settings.get("n_ctx")
    return ServerFacts(
        engine="llama.cpp",
        slots=slots if isinstance(slots, int) and slots > 0 else None,
        context=context if isinstance(context, int) else None,
        sampling=sampling,
        template_tool_format=TAGS
        if isinstance(template, str) and "<tool_call>" in template
        else None,
    )


async def _get_json(http: httpx2.AsyncClient, url: str) -> Any:
    try:
        response = await http.get(url, timeout=_TIMEOUT_S)
        if response.status_code != 200:
            return None
        return response.json()
    except (httpx2.HTTPError, ValueError):
        return None
