"""What a run of ``osmosis test`` is built from: the LLM backend, the rows, the agent, the
``--jobs`` workers. Shared by :func:`~.run.run_test` and the interactive REPL's command.

Heavy modules are imported inside the functions: ``osmosis test --help`` imports this one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, DatasetError

if TYPE_CHECKING:
    from ..agent import RolloutAgentLoop
    from ..testing.wire import MockWire
    from .options import TestOptions
    from .parallel import WorkerPool
    from .replay import ReplayBackend
    from .runner import RowInput

#: The options a replay takes from the cassette unless they are given (not None).
RECORDED_OPTIONS = ("max_turns", "temperature", "max_tokens")
#: ``max_turns`` when neither the options nor a replayed cassette give one.
DEFAULT_MAX_TURNS = 10


@dataclass
class Setup:
    """A run, set up: the backend answering the LLM turns, the rows, the agent (None with a
    ``server``), the request settings, and the ``--jobs`` workers (already starting) if any."""

    backend: Any
    rows: list[RowInput]
    agent: RolloutAgentLoop | None
    max_turns: int
    completion_params: dict[str, Any]
    pool: WorkerPool | None = None
    #: With ``skip_bad_rows``: how many malformed dataset rows were left out.
    bad_rows_skipped: int = 0


def prepare(
    options: TestOptions,
    *,
    warn: Callable[[str], None],
    start_row: int | None = None,
) -> Setup:
    """Build what ``options`` describe. The workers start first, so they import while this
    process reads its rows; they are stopped again if anything after fails. ``start_row``
    (the REPL's ``--row``) must be among the rows loaded. Raises ``ConfigError`` and the
    loader's errors."""
    pool = None
    if options.jobs > 1 and options.target is not None:
        pool = start_pool(options, warn=warn)
    try:
        return _prepare(options, warn=warn, start_row=start_row, pool=pool)
    except BaseException:
        if pool is not None:
            pool.close()
        raise


def _prepare(
    options: TestOptions,
    *,
    warn: Callable[[str], None],
    start_row: int | None,
    pool: WorkerPool | None,
) -> Setup:
    given = {
        "max_turns": options.max_turns,
        "temperature": options.temperature,
        "max_tokens": options.max_tokens,
    }
    if options.replay is not None:
        backend: Any = replay_backend(options.replay, options.replay_mode, sources=pool is not None)
        check_replay_protocol(backend, options.wire)
        note = cassette_note(backend)
        if note:
            warn(note)
        settings = recorded_settings(backend, given)
    else:
        backend = make_backend(options)
        settings = given
    completion_params: dict[str, Any] = {}
    if settings["temperature"] is not None:
        completion_params["temperature"] = settings["temperature"]
    if settings["max_tokens"] is not None:
        completion_params["max_tokens"] = settings["max_tokens"]
    bad_rows = 0
    if options.dataset:
        rows, skipped = load_rows(
            Path(options.dataset),
            limit=options.limit,
            offset=options.offset,
            skip_bad_rows=options.skip_bad_rows,
        )
        bad_rows = len(skipped)
        if skipped:
            warn(skipped_note(Path(options.dataset).name, skipped))
    elif options.replay is not None:
        end = options.offset + options.limit if options.limit else None
        rows = backend.rows()[options.offset : end]
    else:
        rows = []
    if start_row is not None and rows and not any(r.index == start_row for r in rows):
        first, last = rows[0].index, rows[-1].index
        raise ConfigError(f"--row {start_row} is not in the dataset rows loaded ({first}-{last})")
    agent = None
    if options.target is not None:
        from ..loader import load_agent

        agent = load_agent(options.target)
    max_turns = settings["max_turns"]
    return Setup(
        backend=backend,
        rows=rows,
        agent=agent,
        max_turns=DEFAULT_MAX_TURNS if max_turns is None else max_turns,
        completion_params=completion_params,
        pool=pool,
        bad_rows_skipped=bad_rows,
    )


def make_backend(options: TestOptions) -> Any:
    """The LLM backend ``llm``/``llm_url`` name: the offline mock or an OpenAI-compatible API."""
    kind = "openai" if options.llm_url else options.llm.lower()
    if kind == "mock":
        if options.model:
            raise ConfigError(
                f"--model {options.model!r} names a real model, but the LLM is the offline "
                "mock: drop --llm mock to run that model, or drop --model"
            )
        from ..testing.backends import MockLLMBackend

        return MockLLMBackend(seed=options.seed or 0, policy=options.mock_policy)
    if kind == "openai":
        from ..testing.openai_backend import OpenAICompatibleBackend

        environ: dict[str, str] = dict(os.environ)
        if options.api_key and not options.remote:  # the legacy SDK's --api-key: the LLM's key
            environ["OPENAI_API_KEY"] = options.api_key
        return OpenAICompatibleBackend.from_env(
            environ,
            base_url=options.llm_url,
            model=model_name(options),
            timeout_s=options.llm_timeout,
            seed=options.seed,
        )
    raise ConfigError(f"unknown --llm {options.llm!r}; choose mock or openai")


def model_name(options: TestOptions) -> str | None:
    """The model to ask for: ``--model`` (or ``OPENAI_MODEL``); without ``--llm-url`` read as
    The legacy SDK read it (``openai/gpt-4o`` is ``gpt-4o``, see :mod:`.model_names`)."""
    name = options.model or os.environ.get("OPENAI_MODEL")
    if name and not options.llm_url:
        from .model_names import openai_model

        return openai_model(name)
    return name


def start_pool(options: TestOptions, *, warn: Callable[[str], None]) -> WorkerPool:
    """The ``--jobs`` workers, started: each loads the target and builds the same backend."""
    from .parallel import WorkerPool
    from .worker import BackendSpec, WorkerSpec

    assert options.target is not None  # the caller checks: workers load the target
    if options.replay is not None:
        backend = BackendSpec(
            "replay", replay_mode="lenient" if options.replay_mode == "lenient" else "strict"
        )
    elif options.llm_url or options.llm.lower() == "openai":
        backend = BackendSpec(
            "openai",
            base_url=options.llm_url,
            model=model_name(options),
            timeout_s=options.llm_timeout,
            seed=options.seed,
        )
    else:
        backend = BackendSpec("mock", seed=options.seed or 0, mock_policy=options.mock_policy)
    debug_dir = options.debug_dir
    spec = WorkerSpec(
        target=options.target,
        backend=backend,
        debug_dir=str(Path(debug_dir).resolve()) if debug_dir is not None else None,
        verbose=options.verbose,
        protocol=options.wire.protocol,
    )
    pool = WorkerPool(spec, options.jobs, notify=warn)
    pool.start()
    return pool


def load_rows(
    path: Path, *, limit: int | None, offset: int, skip_bad_rows: bool = False
) -> tuple[list[RowInput], list[DatasetError]]:
    """The dataset's rows as the runner takes them, numbered from 1 in the file, and the bad
    rows skipped (only with ``skip_bad_rows``: otherwise they raise ``BadRowsError``)."""
    from .datasets import read_dataset
    from .runner import RowInput

    dataset = read_dataset(path, limit=limit, offset=offset, skip_bad_rows=skip_bad_rows)
    rows = [
        RowInput(index=r.number, messages=r.messages, metadata=r.metadata, replies=r.replies)
        for r in dataset.rows
    ]
    return rows, dataset.skipped


def skipped_note(name: str, skipped: list[DatasetError]) -> str:
    """The warning that names the bad rows a run leaves out (the first ``MAX_LISTED``)."""
    from .datasets import listed

    return "\n".join([f"skipping {len(skipped)} bad row(s) of {name}:", *listed(skipped)])


def replay_backend(path: Path, mode: str | None, *, sources: bool = False) -> ReplayBackend:
    """Read the cassette (a bad one is a ConfigError with its file and line); ``sources``
    keeps each row's line, for ``--jobs`` workers."""
    from .cassette import read_cassette
    from .replay import ReplayBackend

    cassette = read_cassette(path, sources=sources)
    return ReplayBackend(cassette, mode="lenient" if mode == "lenient" else "strict")


def recorded_settings(backend: ReplayBackend, given: dict[str, Any]) -> dict[str, Any]:
    """``max_turns``/``temperature``/``max_tokens`` as recorded, unless given (not None): a
    replay asks the agent for what the recording asked."""
    options = backend.cassette.header.options
    recorded = {
        "max_turns": options.max_turns,
        "temperature": options.completion_params.get("temperature"),
        "max_tokens": options.completion_params.get("max_tokens"),
    }
    return {
        key: given[key] if given[key] is not None else recorded[key] for key in RECORDED_OPTIONS
    }


def check_replay_protocol(backend: ReplayBackend, wire: MockWire) -> None:
    """A cassette replays on the wire it was recorded on: the agent's chat requests differ
    between wires (v2's model name, tools on every call), so a replay across them would report
    every row as diverged. Refused instead, naming the flag that fixes it."""
    recorded, protocol = backend.cassette.header.protocol, wire.protocol
    if recorded != protocol:
        raise ConfigError(
            f"{backend.cassette.path} was recorded with --protocol {recorded}; replay it with "
            f"--protocol {recorded} (or record it again with --protocol {protocol})"
        )


def cassette_note(backend: ReplayBackend) -> str | None:
    """A warning for a cassette whose recording was interrupted."""
    cassette = backend.cassette
    if cassette.complete:
        return None
    return (
        f"{cassette.path} is a partial cassette (its recording was interrupted): replaying "
        f"its {len(cassette.rows)} complete row(s)"
    )


async def with_token_check(backend: Any) -> Any:
    """Wrap the real backend in the token check; close it if no engine answers."""
    from .token_check import TokenCheckBackend

    try:
        return await TokenCheckBackend.connect(backend)
    except BaseException:
        await backend.aclose()
        raise


@contextlib.asynccontextmanager
async def closing(backend: Any) -> AsyncIterator[None]:
    """Close a backend that holds an HTTP client (the OpenAI-compatible one) when done."""
    try:
        yield
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()
