"""Model-server errors that a retry cannot change, told apart from transient ones.

llama.cpp answers HTTP 500 for a server started without ``--jinja`` (``tools param requires
--jinja flag``), for a slot whose context filled up mid-generation (``Context size has been
exceeded.``) and for a reply its tool-call parser rejects (``The model produced output that
does not match the expected ... format``). Retried as if transient, they cost seconds to
minutes per row and fail the same way. :func:`deterministic_error` recognises them (and the
context errors other servers send), so the backend fails them at once; each ``kind`` has one
actionable hint (:data:`HINTS`) that ``osmosis test`` prints once per run, not once per row.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HINTS", "DeterministicError", "deterministic_error"]

#: What to do about each kind of deterministic error, said once per run.
HINTS = {
    "needs_jinja": (
        "the model server renders no chat template for tool calls: restart llama-server with "
        "--jinja (vLLM: --enable-auto-tool-choice --tool-call-parser for the model)"
    ),
    "context_length": (
        "the conversation outgrew the context of the server's slot: raise llama-server's -c "
        "(each of its --parallel slots gets -c / --parallel tokens) or lower --parallel there, "
        "or lower --max-tokens / --max-turns here (vLLM: --max-model-len)"
    ),
    "unparsable_reply": (
        "the server's tool-call parser rejected what the model wrote, and at the same prompt "
        "and sampling it writes it again: serve a chat template whose tool-call format matches "
        "what the model writes (llama.cpp --chat-template-file), or show the format in the "
        "system prompt (docs/real-models.md)"
    ),
}

#: Lower-case text in an error body -> the kind it is. Checked in order.
_PATTERNS = (
    ("requires --jinja", "needs_jinja"),
    ("context size has been exceeded", "context_length"),
    ("exceeds the available context size", "context_length"),
    ("context length", "context_length"),
    ("context_length", "context_length"),
    ("maximum context", "context_length"),
    ("context window", "context_length"),
    ("context size", "context_length"),
    ("too many tokens", "context_length"),
    ("does not match the expected", "unparsable_reply"),
)


@dataclass(frozen=True)
class DeterministicError:
    """An error body that will be the same on retry: its ``kind`` and whether every row would
    hit it (``systemic``: the server's configuration, not this conversation)."""

    kind: str
    systemic: bool

    @property
    def hint(self) -> str:
        """What to change, for the run's closing notes."""
        return HINTS[self.kind]


def deterministic_error(status: int, body: str) -> DeterministicError | None:
    """The deterministic error ``body`` (HTTP ``status``) describes, or None when a retry may
    help (429, a 5xx without a known message, an overloaded server)."""
    if status == 429 or not (status >= 500 or status in (400, 413, 422)):
        return None
    text = body.lower()
    for needle, kind in _PATTERNS:
        if needle in text:
            return DeterministicError(kind, systemic=kind == "needs_jinja")
    return None
