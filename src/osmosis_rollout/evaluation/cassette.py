"""Cassettes: one recorded run of an agent, as versioned JSON Lines, replayable offline.

A cassette is what ``osmosis test --record PATH`` writes and ``--replay PATH`` reads (format
``osmosis-cassette``, version 1; docs/real-models.md describes it for users). One JSON object
per line:

- ``{"type": "header", "format": "osmosis-cassette", "version": 1, ...}``: when, with which
  osmosis, agent, LLM (URL without credentials, model), run options and wire (``protocol``:
  ``v1`` or ``v2``; a header without it predates v2, so it is v1) it was recorded;
- ``{"type": "row", ...}`` per dataset row, written as soon as that row finishes: its ``input``
  (messages, metadata, request options), the ``tools`` the server declared, every LLM ``turn``
  (``request``: the messages the agent sent and its sampling ``params``; ``reply``: the whole
  completion, with ``usage``, ``finish_reason``, ``token_ids`` and ``logprobs`` when the server
  sent them), an ``llm_error`` when the model server failed, the ``result`` (status, finish
  reason, reward, final messages) and the ``findings``;
- ``{"type": "end", "rows": N}`` once the run finished. Without it the cassette is partial (the
  recording was interrupted) and still readable up to its last complete row.

Messages are stored once: a turn's ``request.new_messages`` holds only what the agent added after
the previous turn's request and reply (its tool results, for instance), and the result's
``new_messages`` what came after the last reply. When an agent rewrote its history, the full list
is stored as ``messages`` instead. Large contents are kept whole: they are part of the behaviour.
Secrets never reach the file: values under secret-looking keys and the given secret strings are
replaced by ``**********`` (the same scrubbing as debug traces).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .._version import __version__
from ..errors import ConfigError
from ..protocol import CompletionsRequest, CompletionsResponse, Message, describe_validation_error
from ..testing.wire import LEGACY_PROTOCOL, wire_names
from ..tracing import secret_free_json
from .collector import paused_gc

__all__ = [
    "FORMAT",
    "VERSION",
    "Cassette",
    "CassetteError",
    "CassetteHeader",
    "CassetteRow",
    "CassetteWriter",
    "RecordedInput",
    "RecordedTurn",
    "decode_history",
    "encode_history",
    "read_cassette",
    "reply_message",
]

FORMAT = "osmosis-cassette"
VERSION = 1

_M = TypeVar("_M", bound=BaseModel)


class CassetteError(ConfigError):
    """A cassette that cannot be read: missing, not JSON Lines, or of another format/version."""


class _Part(BaseModel):
    # Unknown keys are ignored: a later 1.x writer may add fields a 1.0 reader can skip.
    model_config = ConfigDict(extra="ignore")


class RecordedOptions(_Part):
    """The run's request options (``--max-turns``, ``--temperature``, ``--max-tokens``...)."""

    max_turns: int = 10
    max_tokens_total: int = 8192
    completion_params: dict[str, Any] = Field(default_factory=dict)


class CassetteHeader(_Part):
    """The first line: what was recorded, with what."""

    type: Literal["header"] = "header"
    format: str = FORMAT
    version: int = VERSION
    created: str = ""
    osmosis_version: str = __version__
    agent: str | None = None
    llm: dict[str, Any] = Field(default_factory=dict)
    options: RecordedOptions = Field(default_factory=RecordedOptions)
    #: The wire the mock TrainGate spoke (``osmosis test --protocol``: a name of
    #: ``testing.wire.WIRES``). Every writer names it; a header without one is read as v1
    #: (``LEGACY_PROTOCOL``) only because such a cassette predates protocol v2.
    protocol: str = LEGACY_PROTOCOL

    @field_validator("protocol")
    @classmethod
    def _known_wire(cls, value: str) -> str:
        if value not in wire_names():
            raise ValueError(
                f"protocol {value!r} is not a wire this osmosis speaks "
                f"({', '.join(wire_names())}): a newer osmosis recorded it"
            )
        return value


class History(_Part):
    """Messages stored as a delta: ``new_messages`` after a known prefix, or all ``messages``."""

    new_messages: list[Message] | None = None
    messages: list[Message] | None = None


class RecordedRequest(History):
    """What the agent sent for one turn: its messages and sampling parameters."""

    params: dict[str, Any] = Field(default_factory=dict)


class RecordedTurn(_Part):
    """One LLM turn: the agent's request and the model's whole reply."""

    turn: int
    request: RecordedRequest
    reply: CompletionsResponse


class RecordedInput(_Part):
    """The rollout's init: the row's messages and metadata and the request options."""

    messages: list[Message] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    max_turns: int = 10
    max_tokens_total: int = 8192
    completion_params: dict[str, Any] = Field(default_factory=dict)


class RecordedResult(History):
    """How the row ended (``new_messages``/``messages``: its final messages)."""

    status: str
    finish_reason: str | None = None
    reward: float | None = None
    error_message: str | None = None


class RecordedLLMError(_Part):
    """The model server's failure that ended the row (replayed as the same failure)."""

    kind: str
    message: str
    status_code: int | None = None


class CassetteRow(_Part):
    """One dataset row's rollout, as recorded."""

    type: Literal["row"] = "row"
    row: int
    #: Which of the row's ``--samples`` this is (0-based; a cassette without samples has 0s).
    sample: int = 0
    rollout_id: str
    input: RecordedInput
    tools: list[dict[str, Any]] = Field(default_factory=list)
    turns: list[RecordedTurn] = Field(default_factory=list)
    llm_error: RecordedLLMError | None = None
    result: RecordedResult
    findings: list[dict[str, Any]] = Field(default_factory=list)
    #: The judge calls its grading made (``judging.tape``): a replay answers them offline.
    judge: list[dict[str, Any]] = Field(default_factory=list)

    def request_messages(self) -> list[list[Message]]:
        """The full message list the agent sent at each turn, rebuilt from the deltas."""
        requests: list[list[Message]] = []
        previous: list[Message] = []
        for turn in self.turns:
            current = decode_history(previous, turn.request)
            requests.append(current)
            previous = [*current, reply_message(turn.reply)]
        return requests

    def final_messages(self) -> list[Message]:
        """The final messages of the rollout's result, rebuilt from the delta."""
        previous: list[Message] = []
        if self.turns:
            previous = [*self.request_messages()[-1], reply_message(self.turns[-1].reply)]
        return decode_history(previous, self.result)


class Cassette:
    """A read cassette: its header, its rows in file order, and whether the run finished.

    ``sources`` (when read with ``sources=True``) is each row's line as in the file, in the same
    order: ``osmosis test --jobs`` hands a row to a worker as its line, which costs a third of
    pickling the parsed row and unpickling it there.
    """

    def __init__(
        self,
        path: Path,
        header: CassetteHeader,
        rows: list[CassetteRow],
        complete: bool,
        sources: list[str] | None = None,
    ) -> None:
        self.path = path
        self.header = header
        self.rows = rows
        self.complete = complete
        self.sources = sources


def reply_message(reply: CompletionsResponse) -> Message:
    """The assistant message of a reply, as an agent appends it to its history: the
    ``result.message`` it was handed (``content: None`` beside tool calls included, and sent so
    since issue 41), so each turn's history is stored as the delta after it."""
    from ..results import reply_message as as_appended

    return as_appended(reply.message)


def encode_history(previous: Sequence[Message], current: list[Message]) -> dict[str, Any]:
    """``{"new_messages": ...}`` when ``current`` extends ``previous``, else all ``messages``."""
    n = len(previous)
    if len(current) >= n and current[:n] == list(previous):
        return {"new_messages": current[n:]}
    return {"messages": current}


def decode_history(previous: Sequence[Message], stored: History) -> list[Message]:
    """The inverse of :func:`encode_history`."""
    if stored.messages is not None:
        return list(stored.messages)
    return [*previous, *(stored.new_messages or [])]


def request_params(request: CompletionsRequest) -> dict[str, Any]:
    """The sampling parameters of a turn: everything but the messages and the rollout id."""
    return request.model_dump(mode="json", exclude_none=True, exclude={"messages", "rollout_id"})


class CassetteWriter:
    """Writes a cassette row by row: each row is one ``write`` of a whole line, then flushed, so
    an interrupted recording leaves a readable cassette up to its last finished row.

    ``secrets`` (API keys) are replaced by ``**********`` wherever they occur.
    """

    def __init__(
        self, path: str | Path, header: CassetteHeader, *, secrets: Iterable[str | None] = ()
    ) -> None:
        self.path = Path(path)
        self.secrets = [s for s in secrets if s]
        self.rows_written = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = self.path.open("w", encoding="utf-8")
        except OSError as exc:
            raise CassetteError(
                f"cannot write the cassette {self.path}: {exc.strerror or exc}"
            ) from None
        if not header.created:
            now = dt.datetime.now(dt.UTC).replace(microsecond=0)
            header = header.model_copy(update={"created": now.isoformat().replace("+00:00", "Z")})
        self._line(header.model_dump(mode="json", exclude_none=True))

    def write_row(self, row: CassetteRow) -> None:
        """Append one finished row."""
        self._line(row.model_dump(mode="json", exclude_none=True))
        self.rows_written += 1

    def write_recorded(self, line: str) -> None:
        """Append a row line as an earlier recording wrote it (``--resume`` keeps those)."""
        if self._file is None:
            raise CassetteError(f"the cassette {self.path} is already closed")
        self._file.write(line.rstrip("\n") + "\n")
        self._file.flush()
        self.rows_written += 1

    def close(self, *, complete: bool = True) -> None:
        """Finish the file; ``complete=False`` (an interrupted run) leaves out the end line."""
        if self._file is None:
            return
        if complete:
            self._line({"type": "end", "rows": self.rows_written})
        self._file.close()
        self._file = None

    def _line(self, data: dict[str, Any]) -> None:
        if self._file is None:
            raise CassetteError(f"the cassette {self.path} is already closed")
        self._file.write(secret_free_json(data, self.secrets) + "\n")
        self._file.flush()


def read_cassette(path: str | Path, *, sources: bool = False) -> Cassette:
    """Read a cassette; a partial one (no end line) reads up to its last complete row.

    Raises :class:`CassetteError` naming the file and line when it cannot be used. With
    ``sources``, each row's line is kept too (:attr:`Cassette.sources`).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CassetteError(
            f"no cassette at {path}: record one with "
            "`osmosis test TARGET -d rows.jsonl --llm-url URL --model M --record PATH`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CassetteError(f"cannot read the cassette {path}: {exc}") from None
    lines = text.split("\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline that ends the last complete line
    elif lines and not text.endswith("\n"):
        lines.pop()  # a line cut short by an interrupted recording
    if not lines:
        raise CassetteError(f"{path} is empty: not a cassette")
    header = _parse(path, 1, lines[0], CassetteHeader, "header")
    kept: list[str] | None = [] if sources else None
    with paused_gc():  # thousands of objects, all kept: collections would only walk them
        rows, complete = _rows(path, lines, kept)
    return Cassette(path, header, rows, complete, kept)


def _rows(
    path: Path, lines: list[str], sources: list[str] | None = None
) -> tuple[list[CassetteRow], bool]:
    """The rows after the header, and whether the end line was reached; each row's line is
    appended to ``sources`` when given."""
    rows: list[CassetteRow] = []
    complete = False
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if line.startswith(_ROW_PREFIX):
            # The writer puts "type" first: a row is validated at once, without a json.loads
            # to find its type (which cost as much as the validation). A line that does not
            # validate takes the slow path below, for its usual error message.
            try:
                rows.append(CassetteRow.model_validate_json(line))
                if sources is not None:
                    sources.append(line)
                continue
            except ValidationError:
                pass
        kind = _kind(path, number, line)
        if kind == "end":
            complete = True
            break
        if kind == "row":
            rows.append(_parse(path, number, line, CassetteRow, "row"))
            if sources is not None:
                sources.append(line)
        # other types: added by a later 1.x writer, skipped
    return rows, complete


_ROW_PREFIX = '{"type": "row", '


def _kind(path: Path, number: int, line: str) -> str:
    try:
        data = json.loads(line)
    except ValueError:
        raise CassetteError(f"{path}:{number}: not a JSON object; is this a cassette?") from None
    if not isinstance(data, dict):
        raise CassetteError(f"{path}:{number}: not a JSON object; is this a cassette?")
    return str(data.get("type"))


def _parse(path: Path, number: int, line: str, model: type[_M], what: str) -> _M:
    if what == "header":
        _check_header(path, line)
    try:
        return model.model_validate_json(line)
    except ValidationError as exc:
        raise CassetteError(
            f"{path}:{number}: a malformed {what} ({describe_validation_error(exc)})"
        ) from None


def _check_header(path: Path, line: str) -> None:
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CassetteError(
            f"{path} is not an osmosis cassette (its first line has no "
            f'"format": "{FORMAT}"); record one with --record'
        )
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CassetteError(
            f"{path} is a cassette of format version {version!r}; this osmosis reads version "
            f"{VERSION} and older: upgrade osmosis-rollout, or record the cassette again"
        )
