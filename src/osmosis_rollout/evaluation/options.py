"""``TestOptions``: one run of ``osmosis test``, as its command-line options say it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..testing.wire import WIRES, MockWire, wire_named

if TYPE_CHECKING:
    from .launch import LaunchSpec


@dataclass(frozen=True)
class TestOptions:
    """The options of ``osmosis test`` in batch mode, with the same names and defaults.

    Give ``target`` (``"agent.py:MyAgent"``) or ``server`` (a running server's URL), and rows:
    a ``dataset`` file, or a ``replay`` cassette whose recorded rows run. ``max_turns``,
    ``temperature`` and ``max_tokens`` left at None take the cassette's values in a replay
    (``max_turns`` is 10 otherwise). ``jobs`` is a number of worker processes (1: none).
    ``concurrency`` None is 8 rollouts at once, or as many as a real model server reports
    slots (llama.cpp's ``/props``).
    ``skip_bad_rows`` runs a dataset's good rows when some are malformed, and counts the others
    in the summary (``bad_rows_skipped``); without it, bad rows are a ``DatasetError``.
    ``api_key`` is the ``server``'s key; without a ``server`` it is the LLM's (the legacy meaning of
    ``--api-key``), else ``OPENAI_API_KEY``. A ``model`` without ``llm_url`` is served by
    ``OPENAI_BASE_URL`` (OpenAI's by default); with the mock LLM it is an error, never ignored.
    ``protocol`` is the wire the mock TrainGate speaks to the server: a name of
    ``testing.wire.WIRES`` (``"v1"``, the default, or ``"v2"``), or the wire itself; None
    (with ``server`` or ``launch``) asks the server which it speaks (``wire_probe``).
    ``launch`` is a command that starts the server to test, the way the platform starts one
    (``evaluation.launch``): it runs in the current folder (or a ``LaunchSpec``'s), is told a
    free port, and is always stopped.
    """

    __test__ = False  # not a pytest test class, whatever its name

    target: str | None = None
    dataset: Path | str | None = None
    limit: int | None = None
    offset: int = 0
    skip_bad_rows: bool = False
    concurrency: int | None = None
    jobs: int = 1
    server: str | None = None
    api_key: str | None = field(default=None, repr=False)
    llm: str = "mock"
    llm_url: str | None = None
    model: str | None = None
    #: ``--seed``: the mock LLM's (0 when None), and sent to a real model server as each
    #: request's ``seed`` (one per row and sample), only when given.
    seed: int | None = None
    max_turns: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    llm_timeout: float = 120.0
    timeout: float = 300.0
    output: Path | None = None
    debug_dir: Path | None = None
    verbose: bool = False
    record: Path | None = None
    #: ``--trajectories``: each row's (each sample's) ATIF trajectory under this folder.
    trajectories: Path | None = None
    replay: Path | None = None
    replay_mode: str | None = None
    token_check: bool = False
    #: ``--fail-on``: what else makes a row fail (``"tool_errors"``: a tool call that failed).
    fail_on: tuple[str, ...] = ()
    #: ``--samples``: rollouts per row (a group), each seeded apart.
    samples: int = 1
    #: ``--pass-threshold``: a sample passes (for pass@k) when its reward is at least this.
    pass_threshold: float = 1.0
    #: ``--by``: break the group figures down by this metadata column.
    by: str | None = None
    #: How the mock LLM walks the agent (``testing.mock_policy``): walk, all, random, first, none.
    mock_policy: str = "walk"
    #: Whether rows' ``mock_replies`` script the mock (``--no-mock-replies``: they do not).
    mock_replies: bool = True
    #: ``--resume``: run only the rows (and samples) ``output`` does not hold yet.
    resume: bool = False
    #: A tool failing in more than this share of its calls is a ``tool_error_share`` finding.
    tool_error_share: float = 0.2
    protocol: MockWire | str | None = WIRES[0]
    #: ``--launch``: the server command to start (and stop) for this run, instead of
    #: ``server``; a ``LaunchSpec`` also says where it runs and what it adds to the environment.
    launch: str | LaunchSpec | None = None
    #: ``--strict``: what the server does not support (``status_unsupported``,
    #: ``cancel_unsupported``) fails the rows that showed it, not only one run-level finding.
    strict: bool = False
    #: ``--conformance/--no-conformance``: send the active probes of ``evaluation.conformance``
    #: to the server after the rows (and ``strict`` fails the run on their findings). None: on
    #: with ``launch`` (a server started for this run only), off with ``server``; True without
    #: either is a ``ConfigError`` (no server to probe).
    conformance: bool | None = None

    @property
    def wire(self) -> MockWire:
        """The wire ``protocol`` names (``ConfigError`` for a name no wire has); the default
        wire while ``protocol`` is None (not yet asked of the server)."""
        return wire_named(self.protocol if self.protocol is not None else WIRES[0])

    @property
    def remote(self) -> bool:
        """Whether a server outside this process runs the rollouts (``server`` or ``launch``)."""
        return self.server is not None or self.launch is not None
