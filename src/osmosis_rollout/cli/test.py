"""``osmosis test``: drive an agent through a mock TrainGate over a dataset (or step by step)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.markup import escape

from . import app
from ._common import EXIT_OK, EXIT_PROBLEMS, fail, run_async, stderr_console, stdout_console
from ._target import TARGET_HELP


@app.command("test")
def command_test(
    context: typer.Context,
    target: Annotated[
        str | None, typer.Argument(help=TARGET_HELP, metavar="TARGET", show_default=False)
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            "--dataset",
            "-d",
            help="Rows to run: .jsonl, .json, .csv or .parquet.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Run at most this many rows.")] = None,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many rows first.")] = 0,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Rollouts run at once (per worker with --jobs).")
    ] = 8,
    jobs: Annotated[
        str,
        typer.Option(
            "--jobs",
            "-j",
            metavar="N|auto",
            help="Run the rows in N worker processes (auto: one per CPU), each with "
            "--concurrency rollouts at once: for CPU-bound runs (the mock LLM, --replay). "
            "Not with --interactive, --server, --record or --token-check.",
        ),
    ] = "1",
    server: Annotated[
        str | None,
        typer.Option(
            help="Test an already running server (its URL, e.g. http://127.0.0.1:9000) "
            "instead of TARGET."
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="With --server: the key that server requires (its --api-key). "
            "Also read from OSMOSIS_API_KEY.",
            envvar="OSMOSIS_API_KEY",
            show_envvar=False,
            show_default=False,
        ),
    ] = None,
    llm: Annotated[
        str, typer.Option(help="LLM backend: [bold]mock[/] (offline) or [bold]openai[/].")
    ] = "mock",
    llm_url: Annotated[
        str | None,
        typer.Option(help="OpenAI-compatible base URL (implies --llm openai; or OPENAI_BASE_URL)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name for --llm openai (or OPENAI_MODEL).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the mock LLM's tool arguments.")] = 0,
    max_turns: Annotated[int, typer.Option(min=1, help="max_turns sent with each rollout.")] = 10,
    temperature: Annotated[
        float | None, typer.Option(help="temperature in completion_params.")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="max_tokens in completion_params. With --llm openai a turn that sets none "
            "gets 1024, so a runaway generation cannot hold the model server for minutes.",
            show_default=False,
        ),
    ] = None,
    llm_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds to wait for one reply of --llm openai. A reply that times out is not "
            "retried (the server may still be generating it).",
        ),
    ] = 120.0,
    timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a rollout may take before it counts as failed.")
    ] = 300.0,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write one JSON object per row, then a summary."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON on stdout.")
    ] = False,
    debug_dir: Annotated[
        Path | None, typer.Option(help="Write per-rollout JSONL traces here.")
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Also print the server's warnings and agents' tracebacks."
        ),
    ] = False,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="Step through one rollout turn by turn.")
    ] = False,
    row: Annotated[
        int | None, typer.Option(min=1, help="With --interactive: start at this dataset row.")
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Record every LLM request and reply, tool result and final result of the run "
            "into this cassette (JSON Lines), to replay it offline with --replay.",
            show_default=False,
        ),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(
            help="Serve the replies recorded in this cassette instead of a model (offline), and "
            "report each request or result that differs as replay_diverged. Without --dataset "
            "the recorded rows run.",
            show_default=False,
        ),
    ] = None,
    replay_mode: Annotated[
        str | None,
        typer.Option(
            help="With --replay: [bold]strict[/] (default) stops a row at its first divergence; "
            "[bold]lenient[/] answers it with the nearest recorded turn and says so.",
            show_default=False,
        ),
    ] = None,
    token_check: Annotated[
        bool,
        typer.Option(
            "--token-check",
            help="With --llm-url (vLLM or llama.cpp): check through the server's own tokenizer "
            "that each turn's prompt starts with the previous prompt plus the tokens the model "
            "sampled; report token_drift where it does not.",
        ),
    ] = False,
) -> None:
    """Run an agent over a dataset through a mock TrainGate and report protocol findings.

    Offline by default: the built-in mock LLM calls your tools with schema-valid arguments,
    then answers. Exit 0 when every row completed without findings, 1 otherwise.
    """
    if server is None and record is None and not (interactive or token_check):
        _warm_up_workers(jobs)
    if server is None:
        from ._target import agent_target

        target = agent_target(
            target, command="test", example="osmosis test agent.py:MyAgent --dataset rows.jsonl"
        )
    if server is not None and target is not None:
        fail("give either TARGET (run it in-process) or --server URL, not both")
    from ._cassettes import check_flags

    check_flags(
        record=record,
        replay=replay,
        replay_mode=replay_mode,
        llm=llm,
        llm_url=llm_url,
        interactive=interactive,
    )
    if dataset is None and not interactive and replay is None:
        fail(
            "--dataset is required (or use --interactive)",
            hint="osmosis test agent.py:MyAgent --dataset dataset.jsonl",
        )
    _check_mode_flags(interactive, row=row, output=output, json_output=json_output)
    workers = _check_jobs(
        jobs, interactive=interactive, server=server, record=record, token_check=token_check
    )
    if token_check and interactive:
        fail("--token-check works only in batch mode, not with --interactive")
    if token_check and not llm_url and llm.lower() != "openai":
        fail(
            "--token-check needs a real model: the mock LLM has no tokenizer",
            hint="osmosis test agent.py:MyAgent -d rows.jsonl --llm-url "
            "http://127.0.0.1:8080/v1 --model NAME --token-check",
        )
    if server is not None:
        _check_server_url(server)
    from ..errors import OsmosisError
    from ..evaluation.collector import command_gc

    with command_gc() as gc_ready:  # no collections while it sets up
        pool = None
        if workers > 1 and target is not None:  # started now: the workers import meanwhile
            pool = _start_pool(
                workers,
                target,
                replay=replay,
                replay_mode=replay_mode,
                llm=llm,
                llm_url=llm_url,
                model=model,
                seed=seed,
                llm_timeout=llm_timeout,
                debug_dir=debug_dir,
                verbose=verbose,
            )
        try:
            if replay is not None:
                from ._cassettes import cassette_note, recorded_settings, replay_backend

                backend = replay_backend(replay, replay_mode, sources=pool is not None)
                note = cassette_note(backend)
                if note:
                    stderr_console().print(f"[yellow]Warning:[/] {escape(note)}", soft_wrap=True)
                explicit = {
                    name
                    for name in ("max_turns", "temperature", "max_tokens")
                    if _given(context, name)
                }
                given = {
                    "max_turns": max_turns,
                    "temperature": temperature,
                    "max_tokens": max_tokens,
                }
                settings = recorded_settings(backend, given, explicit)
                max_turns, temperature = settings["max_turns"], settings["temperature"]
                max_tokens = settings["max_tokens"]
            else:
                backend = _make_backend(llm, llm_url, model, seed, timeout_s=llm_timeout)
            completion_params: dict[str, Any] = {}
            if temperature is not None:
                completion_params["temperature"] = temperature
            if max_tokens is not None:
                completion_params["max_tokens"] = max_tokens
            if dataset:
                rows = _load_rows(dataset, limit=limit, offset=offset)
            elif replay is not None:
                rows = backend.rows()[offset : offset + limit if limit else None]
            else:
                rows = []
            if row is not None and rows and not any(r.index == row for r in rows):
                first, last = rows[0].index, rows[-1].index
                fail(f"--row {row} is not in the dataset rows loaded ({first}-{last})")
            agent = None
            if target is not None:
                from ..loader import load_agent

                agent = load_agent(target)
            gc_ready()  # set up: collections back on
            if interactive:
                raise typer.Exit(
                    run_async(
                        _interactive(
                            agent,
                            backend=backend,
                            rows=rows,
                            start_row=row,
                            server_url=server,
                            server_key=api_key if server is not None else None,
                            completion_params=completion_params,
                            max_turns=max_turns,
                            debug_dir=debug_dir,
                        )
                    )
                )
            code = run_async(
                _run(
                    agent,
                    rows,
                    backend=backend,
                    server=server,
                    server_key=api_key if server is not None else None,
                    completion_params=completion_params,
                    max_turns=max_turns,
                    timeout_s=timeout,
                    concurrency=concurrency,
                    output=output,
                    json_output=json_output,
                    debug_dir=debug_dir,
                    verbose=verbose,
                    record=record,
                    target=target,
                    token_check=token_check,
                    pool=pool,
                )
            )
        except OsmosisError as exc:
            fail(str(exc))
        finally:
            if pool is not None:
                pool.close()
        raise typer.Exit(code)


def _warm_up_workers(jobs: str) -> None:
    """With ``--jobs`` above 1 (checked properly later), launch the workers' forkserver first
    thing: it imports what they need while this process imports, reads and binds its rows."""
    value = jobs.strip().lower()
    if value != "auto" and not (value.isdecimal() and int(value) > 1):
        return  # one process (the default): nothing to import or launch
    from ..evaluation.parallel import cpu_count, warm_up

    if value != "auto" or cpu_count() > 1:
        warm_up()


def _check_jobs(
    jobs: str, *, interactive: bool, server: str | None, record: Path | None, token_check: bool
) -> int:
    """``--jobs N|auto`` as a number of worker processes; refused where it cannot work."""
    value = jobs.strip().lower()
    if value == "auto":
        from ..evaluation.parallel import cpu_count

        count = cpu_count()
    else:
        try:
            count = int(value)
        except ValueError:
            count = 0
        if count < 1:
            fail(
                f"--jobs {jobs!r}: give a number of worker processes (1 or more) or auto",
                hint="osmosis test agent.py:MyAgent -d rows.jsonl --jobs auto",
            )
    if value == "1":
        return 1
    if interactive:
        fail("--jobs works only in batch mode, not with --interactive")
    if server is not None:
        fail(
            "--jobs runs TARGET in worker processes; with --server that server runs the "
            "rollouts: drop --jobs and raise --concurrency instead",
            hint="osmosis test --server http://127.0.0.1:9000 -d rows.jsonl --concurrency 32",
        )
    if record is not None:
        fail(
            "--record writes one cassette from one process: record with --jobs 1, then replay "
            "it with --jobs N",
            hint="osmosis test agent.py:MyAgent --replay runs/cassette.jsonl --jobs auto",
        )
    if token_check:
        fail("--token-check runs with --jobs 1 only: drop --jobs (or give --jobs 1)")
    return count


def _start_pool(
    jobs: int,
    target: str,
    *,
    replay: Path | None,
    replay_mode: str | None,
    llm: str,
    llm_url: str | None,
    model: str | None,
    seed: int,
    llm_timeout: float,
    debug_dir: Path | None,
    verbose: bool,
) -> Any:
    """The ``--jobs`` workers, started: each loads TARGET and builds the same backend."""
    from ..evaluation.parallel import BackendSpec, WorkerPool, WorkerSpec

    if replay is not None:
        backend = BackendSpec(
            "replay", replay_mode="lenient" if replay_mode == "lenient" else "strict"
        )
    elif llm_url or llm.lower() == "openai":
        backend = BackendSpec(
            "openai",
            base_url=llm_url,
            model=model or os.environ.get("OPENAI_MODEL"),
            timeout_s=llm_timeout,
        )
    else:
        backend = BackendSpec("mock", seed=seed)
    spec = WorkerSpec(
        target=target,
        backend=backend,
        debug_dir=str(debug_dir.resolve()) if debug_dir is not None else None,
        verbose=verbose,
    )

    def warn(line: str) -> None:
        stderr_console().print(f"[yellow]Warning:[/] {escape(line)}", soft_wrap=True)

    pool = WorkerPool(spec, jobs, notify=warn)
    pool.start()
    return pool


def _check_mode_flags(
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


def _given(context: typer.Context, name: str) -> bool:
    """Whether an option came from the command line or the environment, not its default."""
    source = context.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _check_server_url(url: str) -> None:
    """--server must be a base URL, so a typo is a usage error rather than a connection error."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(
            f"--server {url!r} is not an http:// or https:// URL with a host",
            hint="osmosis test --server http://127.0.0.1:9000 --dataset rows.jsonl",
        )


def _make_backend(
    llm: str, llm_url: str | None, model: str | None, seed: int, *, timeout_s: float = 120.0
) -> Any:
    from ..errors import ConfigError

    kind = "openai" if llm_url else llm.lower()
    if kind == "mock":
        from ..testing.backends import MockLLMBackend

        return MockLLMBackend(seed=seed)
    if kind == "openai":
        from ..testing.backends import OpenAICompatibleBackend

        return OpenAICompatibleBackend.from_env(
            os.environ,
            base_url=llm_url,
            model=model or os.environ.get("OPENAI_MODEL"),
            timeout_s=timeout_s,
        )
    raise ConfigError(f"unknown --llm {llm!r}; choose mock or openai")


def _load_rows(path: Path, *, limit: int | None, offset: int) -> list[Any]:
    from ..evaluation.datasets import load_dataset
    from ..evaluation.runner import RowInput

    return [
        RowInput(index=r.number, messages=r.messages, metadata=r.metadata)
        for r in load_dataset(path, limit=limit, offset=offset)
    ]


async def _run(
    agent: Any,
    rows: list[Any],
    *,
    backend: Any,
    server: str | None,
    server_key: str | None,
    completion_params: dict[str, Any],
    max_turns: int,
    timeout_s: float,
    concurrency: int,
    output: Path | None,
    json_output: bool,
    debug_dir: Path | None,
    verbose: bool = False,
    record: Path | None = None,
    target: str | None = None,
    token_check: bool = False,
    pool: Any = None,
) -> int:
    import asyncio  # here, not at the top: `osmosis --help` imports this module

    # The table reports every failure; the library's own log lines would repeat them per row.
    with _library_log_level(verbose):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        from ..evaluation.runner import BatchReport, RowResult, RunOptions, run_batch, summarise
        from ..render import results_table, summary_table
        from ..testing.harness import Harness
        from ..testing.traingate import MockTrainGate

        err = stderr_console()
        report_console = err if json_output else stdout_console()
        if token_check:
            backend = await _with_token_check(backend)
            err.print(f"token check: using {backend.engine.name}'s tokenizer endpoints")
        options = RunOptions(
            max_turns=max_turns,
            completion_params=completion_params,
            timeout_s=timeout_s,
            concurrency=concurrency,
        )
        gate = MockTrainGate(backend)
        recorder = None
        if record is not None:
            from ._cassettes import make_recorder

            secrets = [s for s in (os.environ.get("OPENAI_API_KEY"), server_key) if s]
            recorder = make_recorder(
                record, gate, options, agent=target, backend=backend, secrets=secrets
            )
        sink: IO[str] | None = _open_output(output) if output else None
        counts = {"passed": 0, "failed": 0}
        finished: list[RowResult] = []
        started = time.perf_counter()
        progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "[green]{task.fields[passed]} passed[/] [red]{task.fields[failed]} failed[/]"
            ),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        task = progress.add_task("rollouts", total=len(rows), passed=0, failed=0)
        if pool is not None:
            err.print(
                f"[dim]{pool.jobs} worker processes, up to {concurrency} rollouts at once "
                "in each[/]"
            )

        writer = _OrderedRows(sink, [r.index for r in rows], output)

        def on_result(result: RowResult) -> None:
            finished.append(result)
            counts["passed" if result.passed else "failed"] += 1
            progress.update(task, advance=1, passed=counts["passed"], failed=counts["failed"])
            if recorder is not None:
                recorder.row_finished(result)
            writer.add(result)

        try:
            async with _closing(backend):
                if pool is not None:
                    cassette = getattr(backend, "cassette", None)  # a replay: bind rows here
                    with progress:
                        report = await pool.run(
                            rows,
                            options,
                            cassette=cassette,
                            bind=_binder(backend) if cassette is not None else None,
                            on_result=on_result,
                        )
                else:
                    async with Harness(
                        agent,
                        gate=gate,
                        server_url=server,
                        server_key=server_key,
                        rollout_timeout_s=timeout_s,
                        max_concurrent=concurrency,
                        debug_dir=debug_dir,
                    ) as harness:
                        with progress:
                            report = await run_batch(harness, rows, options, on_result=on_result)
            summary = summarise(report)
            if token_check:
                summary["token_check"] = backend.report.as_dict()
            if sink is not None:
                sink.write(json.dumps(summary) + "\n")
            if recorder is not None:
                recorder.close(complete=True)
        except asyncio.CancelledError:
            # Ctrl-C or SIGTERM: the rows that finished are already in the file; a closing
            # summary marks it as partial, so a half-written results file is never mistaken for
            # a whole run. With --json the same partial summary goes to stdout.
            from ._common import INTERRUPTED_BY

            partial = BatchReport(
                sorted(finished, key=lambda r: r.index),
                wall_s=time.perf_counter() - started,
                stopped_early=f"interrupted ({INTERRUPTED_BY['signal']})",
            )
            if sink is not None:
                writer.flush_all()
                sink.write(json.dumps(summarise(partial)) + "\n")
            if json_output:
                typer.echo(json.dumps(summarise(partial), indent=2))
            where = f"; their results are in {output}" if output is not None else ""
            err.print(f"{len(finished)} of {len(rows)} row(s) finished before the interrupt{where}")
            raise
        finally:
            if sink is not None:
                sink.close()
            if recorder is not None:
                recorder.close(complete=False)  # no-op after a finished run
        report_console.print(results_table(report.rows))
        report_console.print(summary_table(summary))
        if hasattr(backend, "cassette"):
            from ._cassettes import print_divergences

            print_divergences(report_console, report.rows)
        if recorder is not None:
            err.print(f"cassette of {recorder.rows_written} row(s) written to {recorder.path}")
        if summary["errors"] and not verbose:
            err.print(
                "[dim]Rerun with --verbose to see the agents' tracebacks, or --debug-dir DIR to "
                "keep a trace of every rollout.[/]"
            )
        if token_check:
            for line in backend.report.lines():
                err.print(line, markup=False, highlight=False)
        in_flight = pool.max_in_flight if pool else getattr(backend, "max_in_flight", 0)
        if in_flight > 1:
            err.print(
                f"[dim]llm time includes queueing: up to {in_flight} turns were with the model "
                "server at once; one that serves fewer in parallel (llama.cpp --parallel, vLLM "
                "--max-num-seqs) kept the rest waiting. --concurrency 1 times the model alone.[/]"
            )
        if output is not None:
            err.print(f"results written to {output}")
        if json_output:
            typer.echo(json.dumps(summary, indent=2))
        return EXIT_OK if summary["failed"] == 0 and summary["rows"] > 0 else EXIT_PROBLEMS


def _binder(backend: Any) -> Any:
    """For ``--jobs`` replays: each row's recorded row, taken in dataset order."""

    def bind(row: Any) -> Any:
        return backend.take_row(row.messages, row.metadata)

    return bind


async def _interactive(agent: Any, *, backend: Any, **options: Any) -> int:
    """The REPL, with the backend closed afterwards like in batch mode."""
    from ..repl import run_repl

    async with _closing(backend):
        return await run_repl(agent, backend=backend, **options)


@contextlib.contextmanager
def _library_log_level(verbose: bool) -> Iterator[None]:
    """For one command: the library's warnings and tracebacks on stderr with ``--verbose``,
    nothing below CRITICAL without; the previous logging setup is restored afterwards."""
    library_log = logging.getLogger("osmosis_rollout")
    previous = library_log.level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    library_log.setLevel(logging.WARNING if verbose else logging.CRITICAL)
    if verbose:
        library_log.addHandler(handler)
    try:
        yield
    finally:
        library_log.removeHandler(handler)
        library_log.setLevel(previous)


async def _with_token_check(backend: Any) -> Any:
    """Wrap the real backend in the token check; close it if no engine answers."""
    from ..evaluation.token_check import TokenCheckBackend

    try:
        return await TokenCheckBackend.connect(backend)
    except BaseException:
        await backend.aclose()
        raise


@contextlib.asynccontextmanager
async def _closing(backend: Any) -> AsyncIterator[None]:
    """Close a backend that holds an HTTP client (the OpenAI-compatible one) when done."""
    try:
        yield
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()


class _OrderedRows:
    """Writes ``--output`` rows in dataset order as soon as each one's predecessors are done,
    with trace paths relative to the results file so the pair can be moved together."""

    def __init__(self, sink: IO[str] | None, order: list[int], output: Path | None) -> None:
        self.sink = sink
        self.order = order
        self.next = 0
        self.waiting: dict[int, Any] = {}
        self.base = output.resolve().parent if output is not None else None

    def add(self, result: Any) -> None:
        """Hold ``result`` until every earlier row is written, then write what is ready."""
        if self.sink is None:
            return
        self.waiting[result.index] = result
        while self.next < len(self.order) and self.order[self.next] in self.waiting:
            self._write(self.waiting.pop(self.order[self.next]))
            self.next += 1
        self.sink.flush()

    def flush_all(self) -> None:
        """On an interrupt: write the rows still held back, in order, gaps and all."""
        for index in sorted(self.waiting):
            self._write(self.waiting.pop(index))

    def _write(self, result: Any) -> None:
        assert self.sink is not None
        row = result.as_dict()
        if row.get("trace") and self.base is not None:
            row["trace"] = os.path.relpath(row["trace"], self.base)
        self.sink.write(json.dumps(row, default=str) + "\n")


def _open_output(path: Path) -> IO[str]:
    from ..errors import ConfigError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write --output {path}: {exc.strerror or exc}") from None
