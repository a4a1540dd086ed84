"""How ``osmosis test`` shows a run: warnings and a progress bar as it goes, then the results
and summary tables and the notes after them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from ..evaluation.run import RunObserver
from ._common import EXIT_OK, EXIT_PROBLEMS, run_async, stderr_console, stdout_console

if TYPE_CHECKING:
    from ..evaluation import TestOptions, TestReport
    from ..evaluation.runner import RowResult


def warn(message: str) -> None:
    """``Warning: message`` on stderr."""
    stderr_console().print(f"[yellow]Warning:[/] {escape(message)}", soft_wrap=True)


def info(message: str) -> None:
    """``message`` on stderr, as it is (what the run found out, e.g. the wire)."""
    stderr_console().print(escape(message), soft_wrap=True)


class Shown(RunObserver):
    """The run as the terminal shows it: warnings, a progress bar on stderr, an interrupt."""

    def __init__(self, json_output: bool, output: Path | None, *, samples: int = 1) -> None:
        self.err = stderr_console()
        self.json_output = json_output
        self.output = output
        self.samples = samples

    def warn(self, message: str) -> None:
        warn(message)

    def info(self, message: str) -> None:
        self.err.print(message)

    def batch(
        self, total: int, *, workers: int | None, concurrency: int
    ) -> contextlib.AbstractContextManager[Callable[[RowResult], None]]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "[green]{task.fields[passed]} passed[/] [red]{task.fields[failed]} failed[/]"
            ),
            TimeElapsedColumn(),
            console=self.err,
            transient=False,
        )
        task = progress.add_task("rollouts", total=total, passed=0, failed=0)
        if workers is not None:
            self.err.print(
                f"[dim]{workers} worker processes, up to {concurrency} rollouts at once in each[/]"
            )
        counts = {"passed": 0, "failed": 0}

        def advance(result: RowResult) -> None:
            counts["passed" if result.passed else "failed"] += 1
            progress.update(task, advance=1, passed=counts["passed"], failed=counts["failed"])

        @contextlib.contextmanager
        def shown() -> Iterator[Callable[[RowResult], None]]:
            with progress:
                yield advance

        return shown()

    def interruption(self) -> str:
        from ._common import INTERRUPTED_BY

        return INTERRUPTED_BY["signal"]

    def interrupted(self, partial: TestReport, total: int) -> None:
        # With --json the partial summary goes to stdout, as the results file ends with it.
        if self.json_output:
            typer.echo(json.dumps(partial.summary, indent=2))
        where = f"; their results are in {self.output}" if self.output is not None else ""
        # ``total`` counts rollouts: each row once per sample.
        counted = (
            f"{len(partial.rows)} of {total} rollouts ({total // self.samples} rows × "
            f"{self.samples} samples)"
            if self.samples > 1
            else f"{len(partial.rows)} of {total} row(s)"
        )
        self.err.print(f"{counted} finished before the interrupt{where}")


def render(report: TestReport, options: TestOptions, *, json_output: bool) -> int:
    """The results and summary tables, then the notes; the exit code."""
    from ..render import results_table, summary_table

    err = stderr_console()
    report_console = err if json_output else stdout_console()
    report_console.print(results_table(report.rows))
    report_console.print(summary_table(report.summary))
    if report.replayed:
        from ._cassettes import print_divergences

        print_divergences(report_console, report.rows)
    if report.cassette is not None:
        err.print(f"cassette of {report.cassette_rows} row(s) written to {report.cassette}")
    if report.trajectory_dir is not None:
        err.print(
            f"{report.trajectories} ATIF trajectories written to {report.trajectory_dir}",
            soft_wrap=True,
        )
    if report.trajectories_failed:
        err.print(
            f"[yellow]warning:[/] {report.trajectories_failed} trajectories could not be "
            f"written: {escape(report.trajectory_error or '?')}",
            soft_wrap=True,
        )
    if options.debug_dir is not None:
        side = " (the mock TrainGate's side of each rollout)" if options.remote else ""
        err.print(f"traces written to {options.debug_dir}{side}", soft_wrap=True)
    if options.launch is not None and report.summary["failed"] and not options.verbose:
        # A launched server may be anyone's: its output, not `osmosis serve`'s flags, explains.
        err.print(
            "[dim]Rerun with --verbose to see the launched server's output (its tracebacks), "
            "or --debug-dir DIR to keep the mock TrainGate's side of every rollout.[/]"
        )
    elif report.summary["errors"] and not options.verbose:
        # With --server the agent's own steps are the server's to trace (osmosis serve's).
        traces = (
            "or --debug-dir DIR to keep the mock TrainGate's side of every rollout (for the "
            "agent's own steps, start the server with `osmosis serve --debug-dir DIR`)"
            if options.remote
            else "or --debug-dir DIR to keep a trace of every rollout"
        )
        err.print(f"[dim]Rerun with --verbose to see the agents' tracebacks, {traces}.[/]")
    for line in [*report.token_check_lines, *report.model_lines]:
        err.print(line, markup=False, highlight=False)
    if _unscripted_zero_rewards(report.summary, options):
        err.print(
            "[dim]Every reward is 0, and no row scripts the mock LLM: its replies are not your "
            "task's answers (it calls each tool once, then reports what they returned). Give "
            "rows a mock_replies column with the right answer to check that the reward pays "
            "for it (docs/evaluating.md, 'Scripting the mock'), or use a real model "
            "(--llm-url).[/]"
        )
    slots = (report.summary.get("concurrency") or {}).get("server_slots")
    if report.max_in_flight > max(1, slots or 1):
        err.print(
            f"[dim]llm time includes queueing: up to {report.max_in_flight} turns were with the "
            "model server at once; one that serves fewer in parallel (llama.cpp --parallel, vLLM "
            "--max-num-seqs) kept the rest waiting. --concurrency 1 times the model alone.[/]"
        )
    if options.output is not None:
        err.print(f"results written to {options.output}")
    if json_output:
        typer.echo(json.dumps(report.summary, indent=2))
    return EXIT_OK if report.passed else EXIT_PROBLEMS


def _unscripted_zero_rewards(summary: dict[str, Any], options: TestOptions) -> bool:
    """Whether the run scored 0 everywhere on the mock LLM with no row scripting it."""
    groups = summary.get("groups") or {}
    on_mock = options.llm_url is None and options.llm == "mock" and options.replay is None
    return (
        on_mock
        and summary.get("scripted_rows") == 0
        and summary.get("mean_reward") == 0
        and groups.get("max_reward") == 0
    )


def interactive_run(options: TestOptions, *, start_row: int | None) -> int:
    """The REPL over the same setup as a batch, with the backend closed afterwards: on the
    server ``--server`` names or ``--launch`` starts (stopped after), over the wire it speaks."""
    from ..evaluation.assembly import closing, prepare
    from ..evaluation.served import served
    from ..repl import run_repl

    if isinstance(options.launch, str):  # a launched server's output would cut into the REPL
        from ..evaluation.launch import LaunchSpec

        options = dataclasses.replace(options, launch=LaunchSpec(options.launch))

    async def repl() -> int:
        async with served(options, info, warn) as live:
            setup = prepare(live, warn=warn, start_row=start_row)
            async with closing(setup.backend):
                return await run_repl(
                    setup.agent,
                    backend=setup.backend,
                    rows=setup.rows,
                    start_row=start_row,
                    server_url=live.server,
                    server_key=live.api_key,
                    protocol=live.wire.protocol,
                    completion_params=setup.completion_params,
                    max_turns=setup.max_turns,
                    debug_dir=live.debug_dir,
                )

    return run_async(repl())
