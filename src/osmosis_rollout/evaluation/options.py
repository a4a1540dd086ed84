"""``TestOptions``: one run of ``osmosis test``, as its command-line options say it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TestOptions:
    """The options of ``osmosis test`` in batch mode, with the same names and defaults.

    Give ``target`` (``"agent.py:MyAgent"``) or ``server`` (a running server's URL), and rows:
    a ``dataset`` file, or a ``replay`` cassette whose recorded rows run. ``max_turns``,
    ``temperature`` and ``max_tokens`` left at None take the cassette's values in a replay
    (``max_turns`` is 10 otherwise). ``jobs`` is a number of worker processes (1: none).
    ``skip_bad_rows`` runs a dataset's good rows when some are malformed, and counts the others
    in the summary (``bad_rows_skipped``); without it, bad rows are a ``DatasetError``.
    ``protocol`` is the wire the mock TrainGate speaks to the server: ``"v1"`` or ``"v2"``.
    """

    __test__ = False  # not a pytest test class, whatever its name

    target: str | None = None
    dataset: Path | str | None = None
    limit: int | None = None
    offset: int = 0
    skip_bad_rows: bool = False
    concurrency: int = 8
    jobs: int = 1
    server: str | None = None
    api_key: str | None = None
    llm: str = "mock"
    llm_url: str | None = None
    model: str | None = None
    seed: int = 0
    max_turns: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    llm_timeout: float = 120.0
    timeout: float = 300.0
    output: Path | None = None
    debug_dir: Path | None = None
    verbose: bool = False
    record: Path | None = None
    replay: Path | None = None
    replay_mode: str | None = None
    token_check: bool = False
    protocol: str = "v1"
