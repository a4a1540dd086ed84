"""A model name given without an LLM URL, read as the original SDK read it.

The legacy SDK passed ``--model`` to LiteLLM: a bare name (``gpt-4o``) or ``openai/gpt-4o`` went to
OpenAI, and another prefix (``anthropic/...``) to that provider. Here such a model is served by an
OpenAI-compatible endpoint (``OPENAI_BASE_URL``, OpenAI's by default), so ``openai/`` is
dropped and another provider's prefix is a clear error naming the fix. With an explicit URL the
name is the server's own (vLLM's ``Qwen/Qwen2.5-7B-Instruct``) and is kept as given.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["PROVIDERS", "openai_model"]

#: LiteLLM provider prefixes the legacy SDK took that no OpenAI-compatible endpoint serves.
PROVIDERS = frozenset(
    {
        "anthropic",
        "azure",
        "bedrock",
        "cohere",
        "deepseek",
        "fireworks_ai",
        "gemini",
        "groq",
        "huggingface",
        "mistral",
        "ollama",
        "openrouter",
        "together_ai",
        "vertex_ai",
        "xai",
    }
)


def openai_model(name: str) -> str:
    """``name`` as the OpenAI-compatible endpoint knows it: ``openai/gpt-4o`` is ``gpt-4o``."""
    prefix, slash, rest = name.partition("/")
    if not slash:
        return name
    if prefix.lower() == "openai":
        return rest
    if prefix.lower() in PROVIDERS:
        raise ConfigError(
            f"model {name!r} names the provider {prefix!r}, which the original SDK reached "
            "through LiteLLM; osmosis test talks to OpenAI-compatible endpoints only: point "
            f"--llm-url at {prefix}'s OpenAI-compatible URL and pass --model {rest}"
        )
    return name
