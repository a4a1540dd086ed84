"""``osmosis test``'s usage errors: flags that cannot work together, refused before a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..testing.wire import WIRES
from ._common import fail

if TYPE_CHECKING:
    from ..testing.wire import MockWire


def jobs_count(jobs: str, *, rows: int | None = None) -> tuple[int | None, str | None]:
    """``--jobs N|auto`` as a number of worker processes, parsed once for every check that
    needs it (``01`` is 1), with why ``auto`` chose its number (None for a number); the count is
    None when ``jobs`` is neither. ``rows``: the run's rows where known (see :func:`run_rows`)."""
    value = jobs.strip().lower()
    if value == "auto":
        from ..evaluation import cpus

        chosen = cpus.auto_jobs(
            cpus.cpu_count(), cpus.machine_load(), rows, machine_cpus=os.cpu_count()
        )
        return chosen.count, chosen.reason
    try:
        count = int(value)
    except ValueError:
        return None, None
    return (count if count >= 1 else None), None


def run_rows(
    dataset: Path | None, replay: Path | None, *, offset: int, limit: int | None
) -> int | None:
    """About how many rows a batch runs, for ``--jobs auto``, without reading them: the lines
    of a .jsonl or .csv dataset (or the replayed cassette's), after ``offset``, at most
    ``limit``; None when unknown (a .json or .parquet file, or one that cannot be read)."""
    source = dataset if dataset is not None else replay
    lines: int | None = None
    if source is not None and source.suffix.lower() in (".jsonl", ".csv"):
        try:
            with source.open("rb") as handle:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
        except OSError:
            lines = None
    if lines is not None:
        lines = max(0, lines - offset)
        return lines if limit is None else min(lines, limit)
    return limit


def warm_up_workers(count: int | None) -> None:
    """With ``--jobs`` above 1, launch the workers' forkserver first thing: it imports what
    they need while this process imports, reads and binds its rows."""
    if count is not None and count > 1:
        from ..evaluation.parallel import warm_up

        warm_up()


def check_jobs(
    jobs: str,
    count: int | None,
    *,
    interactive: bool,
    server: str | None,
    record: Path | None,
    token_check: bool,
    trajectories: Path | None = None,
    launched: bool = False,
) -> int:
    """``--jobs``' number of workers, refused where it cannot work; ``server`` is the URL of
    ``--server``, or of ``--launch``'s server when ``launched``."""
    if count is None:
        fail(
            f"--jobs {jobs!r}: give a number of worker processes (1 or more) or auto",
            hint="osmosis test agent.py:MyAgent -d rows.jsonl --jobs auto",
        )
    if count == 1:
        return 1
    if interactive:
        fail("--jobs works only in batch mode, not with --interactive")
    if server is not None:
        flag, example = (
            ("--launch", "--launch CMD") if launched else ("--server", f"--server {server}")
        )
        fail(
            f"--jobs runs TARGET in worker processes; with {flag} that server runs the "
            "rollouts: drop --jobs and raise --concurrency instead",
            hint=f"osmosis test {example} -d rows.jsonl --concurrency 32",
        )
    if record is not None:
        fail(
            "--record writes one cassette from one process: record with --jobs 1, then replay "
            "it with --jobs N",
            hint="osmosis test agent.py:MyAgent --replay runs/cassette.jsonl --jobs auto",
        )
    if token_check:
        fail("--token-check runs with --jobs 1 only: drop --jobs (or give --jobs 1)")
    if trajectories is not None:
        fail(
            "--trajectories writes what one process's mock TrainGate saw: give --jobs 1",
            hint="osmosis test agent.py:MyAgent -d rows.jsonl --trajectories runs/trajectories",
        )
    return count


def check_mode_flags(
    interactive: bool, *, row: int | None, output: Path | None, json_output: bool
) -> None:
    """Refuse flags the chosen mode would silently ignore."""
    if row is not None and not interactive:
        fail(
            "--row works only with --interactive",
            hint=f"to run just that row in a batch: --offset {row - 1} --limit 1",
        )
    if interactive and (output is not None or json_output):
        flag = "--output" if output is not None else "--json"
        fail(f"{flag} works only in batch mode, not with --interactive")


def check_protocol(protocol: str, *, command: str = "test") -> MockWire:
    """``--protocol`` (any case): one of ``testing.wire.WIRES`` (the interactive debugger
    steps each of them)."""
    from ..errors import ConfigError
    from ..testing.wire import wire_named, wire_names

    example = (
        "osmosis test agent.py:MyAgent -d rows.jsonl"
        if command == "test"
        else f"osmosis {command} agent.py:MyAgent"
    )
    other = WIRES[-1].protocol
    try:
        wire = wire_named(protocol)
    except ConfigError:
        fail(
            f"--protocol {protocol!r}: choose {' or '.join(wire_names())}",
            hint=f"{example} --protocol {other}",
        )
    return wire


#: ``--protocol``'s default: the first wire of ``testing.wire.WIRES``.
DEFAULT_PROTOCOL = WIRES[0].protocol


def protocol_metavar() -> str:
    """``--protocol``'s choices as its metavar: ``v1|v2``."""
    from ..testing.wire import wire_names

    return "|".join(wire_names())


def check_token_check(
    token_check: bool, *, interactive: bool, llm: str, llm_url: str | None
) -> None:
    """``--token-check`` needs batch mode and a real model's tokenizer."""
    if token_check and interactive:
        fail("--token-check works only in batch mode, not with --interactive")
    if token_check and not llm_url and llm.lower() != "openai":
        fail(
            "--token-check needs a real model: the mock LLM has no tokenizer",
            hint="osmosis test agent.py:MyAgent -d rows.jsonl --llm-url "
            "http://127.0.0.1:8080/v1 --model NAME --token-check",
        )


def check_server_url(url: str) -> None:
    """--server must be a base URL, so a typo is a usage error rather than a connection error."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(
            f"--server {url!r} is not an http:// or https:// URL with a host",
            hint="osmosis test --server http://127.0.0.1:9000 --dataset rows.jsonl",
        )


def say_no_turn_budget(wire: MockWire) -> None:
    """``--max-turns`` on a wire without a turn budget (v2): it cannot reach the agent
    (``--temperature`` and ``--max-tokens`` do: the mock applies them to each call)."""
    from ._common import stderr_console

    stderr_console().print(
        f"[dim]--max-turns: protocol {wire.protocol} has no turn budget, so the agent's own "
        "limit applies (--temperature and --max-tokens still reach each chat call)[/]",
        soft_wrap=True,
    )


def say_auto_jobs(reason: str) -> None:
    """One dim line saying why ``--jobs auto`` chose one process (a surprise otherwise)."""
    from rich.markup import escape

    from ._common import stderr_console

    stderr_console().print(f"[dim]--jobs auto: 1 process ({escape(reason)})[/]", soft_wrap=True)


def llm_of(llm: str, *, llm_given: bool, model: str | None, llm_url: str | None) -> str:
    """The LLM backend: ``--model NAME`` alone means that real model, as in the original SDK
    (served by ``OPENAI_BASE_URL``, OpenAI's by default), never the offline mock."""
    if model and not llm_given and llm_url is None:
        return "openai"
    return llm


def llm_key(api_key: str | None, *, given: bool, workers: int) -> str | None:
    """``--api-key`` without ``--server`` is the LLM's key (the legacy meaning); with ``--jobs`` the
    workers read ``OPENAI_API_KEY`` only, so a key given here is refused there."""
    if not given or api_key is None:
        return None
    if workers > 1:
        fail(
            "--api-key (the LLM's key) reaches --jobs workers only through the environment: "
            "set OPENAI_API_KEY instead",
            hint="OPENAI_API_KEY=sk-... osmosis test agent.py:MyAgent -d rows.jsonl --jobs auto",
        )
    return api_key


def check_row(row: int | None, *, interactive: bool) -> None:
    """``--row`` counts from 1, as every row number osmosis prints; the original SDK counted
    from 0, so the difference is said each time rather than left to surprise."""
    if row is None:
        return
    if row < 1:
        fail(
            f"--row {row}: rows count from 1 here (the original SDK's --row counted from 0)",
            hint="the dataset's first row is --row 1",
        )
    if not interactive:
        return  # check_mode_flags refuses it
    from ._common import stderr_console

    stderr_console().print(
        "[dim]note: --row counts from 1 (the original SDK's counted from 0)[/]", soft_wrap=True
    )


#: What ``--fail-on`` can name.
FAIL_ON = ("tool_errors",)


def check_fail_on(values: list[str]) -> tuple[str, ...]:
    """``--fail-on`` values, each one it knows (a typo would silently fail nothing)."""
    for value in values:
        if value not in FAIL_ON:
            fail(
                f"--fail-on {value!r}: choose {', '.join(FAIL_ON)}",
                hint="osmosis test agent.py:MyAgent -d rows.jsonl --fail-on tool_errors",
            )
    return tuple(dict.fromkeys(values))


def check_mock_policy(policy: str) -> str:
    """``--mock-policy``, one of the mock LLM's policies."""
    from ..testing.mock_policy import POLICIES

    if policy not in POLICIES:
        fail(
            f"--mock-policy {policy!r}: choose {', '.join(POLICIES)}",
            hint="osmosis test agent.py:MyAgent -d rows.jsonl --mock-policy all",
        )
    return policy
