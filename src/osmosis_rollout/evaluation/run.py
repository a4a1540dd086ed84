"""``run_test``: the Python twin of ``osmosis test``, from options to a report.

The command parses its options into :class:`~.options.TestOptions`, awaits :func:`run_test`
and renders the :class:`TestReport`; a :class:`RunObserver` is how it shows a run as it goes
(warnings, a progress bar, an interruption). Nothing here prints or decides an exit: the
report carries what the command exits with.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..judging.tape import use_tape
from .assembly import Setup, closing, prepare, with_token_check
from .model_fit import fit_to_server
from .options import TestOptions
from .results_file import OrderedRows, open_output

if TYPE_CHECKING:
    from ..testing.harness import Harness
    from ..testing.records import Finding
    from .conformance import Conformance
    from .runner import RowResult

__all__ = ["RunObserver", "TestOptions", "TestReport", "run_test"]


@dataclass(frozen=True)
class TestReport:
    """What a run found: each row's result in dataset order, the summary that ``--json`` prints
    and ``--output`` ends with, and what the command says after its tables."""

    __test__ = False  # not a pytest test class, whatever its name

    rows: list[RowResult]
    summary: dict[str, Any]
    #: The rows came from a cassette: their ``replay_diverged`` findings deserve a diff.
    replayed: bool = False
    #: With ``record``: the cassette written, and how many rows it holds.
    cassette: Path | None = None
    cassette_rows: int = 0
    #: With ``trajectories``: the folder written, and how many trajectories it got.
    trajectory_dir: Path | None = None
    trajectories: int = 0
    #: How many could not be written, and why the last one could not.
    trajectories_failed: int = 0
    trajectory_error: str | None = None
    #: With ``token_check``: the check's closing lines.
    token_check_lines: list[str] = field(default_factory=list)
    #: The most LLM turns that were with the model at once (all workers together).
    max_in_flight: int = 0
    #: With a real model: where the turns' time went, one hint per kind of lasting error.
    model_lines: list[str] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        """Every row's findings, in row order."""
        return [finding for row in self.rows for finding in row.findings]

    @property
    def passed(self) -> bool:
        """Every row completed without findings, and there was at least one (and, with
        ``strict``, the conformance probes found nothing)."""
        failing = (self.summary.get("conformance") or {}).get("fails_run", False)
        return bool(self.summary["failed"] == 0 and self.summary["rows"] > 0 and not failing)

    @property
    def exit_code(self) -> int:
        """What ``osmosis test`` exits with: 0 when :attr:`passed`, 1 otherwise."""
        return 0 if self.passed else 1


class RunObserver:
    """How a caller watches a run; this one shows nothing. The command's prints each call."""

    def warn(self, message: str) -> None:
        """Something the user should know that does not stop the run (a partial cassette, a
        worker that died)."""

    def info(self, message: str) -> None:
        """A line about how the run goes (the token check's engine)."""

    def batch(
        self, total: int, *, workers: int | None, concurrency: int
    ) -> contextlib.AbstractContextManager[Callable[[RowResult], None]]:
        """Entered while the rows run; gives the function called with each finished row."""
        return contextlib.nullcontext(lambda result: None)

    def interruption(self) -> str:
        """What stopped the run when it is cancelled, for the partial summary."""
        return "cancelled"

    def interrupted(self, partial: TestReport, total: int) -> None:
        """The run was cancelled; ``partial`` holds the rows that finished."""


async def run_test(options: TestOptions, observer: RunObserver | None = None) -> TestReport:
    """Run ``options``' rows the way ``osmosis test`` does and report what they found.

    ``--output`` is written as the rows finish (a partial summary ends it if the run is
    cancelled). Raises ``OsmosisError`` subclasses for what the options get wrong.
    """
    from .served import served

    observer = observer or RunObserver()
    if options.conformance and not options.remote:
        from ..errors import ConfigError

        raise ConfigError(
            "--conformance probes a rollout server's POST /rollout: give --launch CMD or "
            "--server URL (in process the server is ours, and has no wire to probe)"
        )
    if options.launch is not None:
        _check_before_launch(options)
    async with served(options, observer.info, observer.warn) as options:
        setup = prepare(options, warn=observer.warn)
        try:
            with _library_log_level(options.verbose):
                return await _run(options, setup, observer)
        finally:
            if setup.pool is not None:
                setup.pool.close()


def _check_before_launch(options: TestOptions) -> None:
    """What can be refused without the server, refused before it is started (a launch can
    take a while): bad dataset rows, and a ``--resume`` of a file made otherwise. The run
    reads both again once the server answers; what it refuses then is the same."""
    from .assembly import load_rows
    from .resume import fingerprint, read_previous

    if options.dataset is None or options.replay is not None:
        return
    rows, _ = load_rows(
        Path(options.dataset),
        limit=options.limit,
        offset=options.offset,
        skip_bad_rows=options.skip_bad_rows,
    )
    if options.resume and options.output is not None:
        read_previous(options.output, fingerprint(options, None, rows))


async def _run(options: TestOptions, setup: Setup, observer: RunObserver) -> TestReport:
    import asyncio  # here, not at the top: `osmosis --help` imports the command's modules

    from ..testing.harness import Harness
    from ..testing.traingate import MockTrainGate
    from .resume import fingerprint, read_previous, recorded_rows
    from .runner import BatchReport, RunOptions, run_batch
    from .server_support import ServerSupport
    from .stalls import StallMonitor
    from .tool_errors import fail_on_tool_errors

    backend, pool = setup.backend, setup.pool
    rows = with_samples(setup.rows, options)
    server_key = options.api_key if options.remote else None
    if options.token_check:
        backend = await with_token_check(backend)
        observer.info(f"token check: using {backend.engine.name}'s tokenizer endpoints")
    fit = await fit_to_server(backend, options.concurrency, setup.completion_params)
    for line in fit.opening:
        observer.info(line)
    run_options = RunOptions(
        max_turns=setup.max_turns,
        completion_params=setup.completion_params,
        timeout_s=options.timeout,
        concurrency=fit.concurrency,
    )
    fp = fingerprint(options, setup.agent, setup.rows)
    previous = read_previous(options.output, fp) if options.resume and options.output else []
    done = {(r.index, r.sample) for r in previous}
    # Read before the recorder truncates the cassette: the rows kept are recorded already.
    recorded = (
        recorded_rows(options.record, {r.index for r in previous})
        if options.record is not None and previous
        else []
    )
    gate = MockTrainGate(backend)
    recorder = None
    # Scrubbed from the results file, the traces and the cassette: the LLM's key and the
    # server's (the mock TrainGate's per-rollout key is scrubbed by the server itself).
    secrets = [s for s in (os.environ.get("OPENAI_API_KEY"), options.api_key, server_key) if s]
    if options.record is not None:
        from .recording import CassetteRecorder, describe_llm

        recorder = CassetteRecorder(
            options.record,
            gate,
            run_options,
            agent=options.target,
            llm=describe_llm(backend),
            secrets=secrets,
            protocol=options.wire,
        )
    trajectories = None
    if options.trajectories is not None:
        from .trajectories import TrajectoryRecorder

        trajectories = TrajectoryRecorder(
            options.trajectories,
            gate,
            agent_name=setup.agent.name if setup.agent is not None else "agent",
            secrets=secrets,
        )
    todo = [r for r in rows if (r.index, r.sample) not in done]
    if recorder is not None:
        for line in recorded:
            recorder.writer.write_recorded(line)
    sink: IO[str] | None = open_output(options.output) if options.output else None
    finished: list[RowResult] = list(previous)
    started = time.perf_counter()
    writer = OrderedRows(sink, [(r.index, r.sample) for r in rows], options.output, secrets=secrets)
    for kept in previous:
        writer.add(kept)
    progress = observer.batch(
        len(todo), workers=pool.jobs if pool else None, concurrency=fit.concurrency
    )

    shown: list[Callable[[RowResult], None]] = []
    stalls = StallMonitor()
    support = ServerSupport(strict=options.strict)

    def on_result(result: RowResult) -> None:
        support.take(result)
        result.findings.extend(stalls.take(result.rollout_id))
        if "tool_errors" in options.fail_on:
            fail_on_tool_errors(result)
        finished.append(result)
        shown[0](result)
        if recorder is not None:
            recorder.row_finished(result)
        if trajectories is not None:
            trajectories.row_finished(result)
        writer.add(result)

    # Judge calls go to the recording (kept per row), or are answered from the cassette.
    tape = recorder.judge_tape if recorder is not None else getattr(backend, "judge_tape", None)
    conformance: Conformance | None = None
    try:
        async with closing(backend), stalls, use_tape(tape):
            if pool is not None:
                cassette = getattr(backend, "cassette", None)  # a replay: bind rows here
                with progress as show:
                    shown.append(show)
                    report = await pool.run(
                        todo,
                        run_options,
                        cassette=cassette,
                        bind=_binder(backend) if cassette is not None else None,
                        on_result=on_result,
                    )
            else:
                async with Harness(
                    setup.agent,
                    gate=gate,
                    server_url=options.server,
                    server_key=server_key,
                    rollout_timeout_s=options.timeout,
                    max_concurrent=fit.concurrency,
                    debug_dir=options.debug_dir,
                    secrets=secrets,
                    protocol=options.wire,
                    start_checks=options.remote,
                ) as harness:
                    if trajectories is not None and harness.server_agent is not None:
                        trajectories.agent_name = harness.server_agent  # --server's agent
                    with progress as show:
                        shown.append(show)
                        report = await run_batch(harness, todo, run_options, on_result=on_result)
                    conformance = await _conformance(harness, options, observer, finished)
        if previous:
            order = sorted(previous + report.rows, key=lambda r: (r.index, r.sample))
            report = BatchReport(order, report.wall_s, report.stopped_early, len(previous))
        summary = _summary(report, options, setup, fp, support)
        if conformance is not None:
            summary["run_findings"] += [f.as_dict() for f in conformance.findings]
            summary["conformance"] = conformance.as_dict(strict=options.strict)
        if pool is not None and fit.backend is not None:  # the turns ran in the workers
            fit.backend.times.merge(pool.times.state())
        model_lines = fit.summary(report.rows, summary)
        if options.token_check:
            summary["token_check"] = backend.report.as_dict()
        if sink is not None and writer.whole is None:
            write_groups(sink, report.rows, options)
        writer.finish(summary)
        if recorder is not None:
            recorder.close(complete=True)
    except asyncio.CancelledError:
        # Ctrl-C or SIGTERM: the rows that finished are already in the file; a closing
        # summary marks it as partial, so a half-written results file is never mistaken for
        # a whole run.
        partial = BatchReport(
            sorted(finished, key=lambda r: (r.index, r.sample)),
            wall_s=time.perf_counter() - started,
            stopped_early=f"interrupted ({observer.interruption()})",
        )
        if sink is not None:
            writer.flush_all()
            writer.finish(_summary(partial, options, setup, fp, support))
        partial_summary = _summary(partial, options, setup, fp, support)
        observer.interrupted(TestReport(partial.rows, partial_summary), len(rows))
        raise
    finally:
        if sink is not None:
            sink.close()
        if recorder is not None:
            recorder.close(complete=False)  # no-op after a finished run
        if trajectories is not None:
            trajectories.close()
    return TestReport(
        report.rows,
        summary,
        replayed=hasattr(backend, "cassette"),
        cassette=recorder.path if recorder is not None else None,
        cassette_rows=recorder.rows_written if recorder is not None else 0,
        trajectory_dir=trajectories.directory if trajectories is not None else None,
        trajectories=trajectories.files.written if trajectories is not None else 0,
        trajectories_failed=trajectories.files.failed if trajectories is not None else 0,
        trajectory_error=trajectories.files.last_error if trajectories is not None else None,
        token_check_lines=list(backend.report.lines()) if options.token_check else [],
        max_in_flight=pool.max_in_flight if pool else getattr(backend, "max_in_flight", 0),
        model_lines=model_lines,
    )


async def _conformance(
    harness: Harness, options: TestOptions, observer: RunObserver, rows: list[RowResult]
) -> Conformance | None:
    """The conformance probes, when this run sends them (``TestOptions.conformance``), each
    probe rollout bounded by the run's ``--timeout``."""
    from .conformance import PROBED_WIRES, probe_server

    wanted = options.launch is not None if options.conformance is None else options.conformance
    if not wanted or not options.remote:
        return None
    if options.wire.protocol not in PROBED_WIRES:
        if options.conformance:
            observer.warn(
                f"--conformance: protocol {options.wire.protocol} has no probes (they probe "
                "POST /rollout of v2 and polling): none sent"
            )
        return None
    ended = any(row.status in ("COMPLETED", "ERROR") for row in rows)
    return await probe_server(harness, observer.info, timeout_s=options.timeout, rollouts_end=ended)


def _summary(
    report: Any, options: TestOptions, setup: Setup, fp: dict[str, str], support: Any = None
) -> dict[str, Any]:
    """The runner's summary, with the bad rows left out when ``skip_bad_rows`` asked for it,
    the group and tool figures, the run-level findings of what the server does not support
    (``server_support``) and the run's fingerprint (what ``--resume`` checks)."""
    from .groups import group_rows, groups_summary
    from .runner import summarise
    from .tool_errors import summary_part

    summary = summarise(report)
    summary.update(summary_part(report.rows, options.tool_error_share))
    if support is not None:
        summary["run_findings"] += [f.as_dict() for f in support.findings()]
    summary["groups"] = groups_summary(
        group_rows(report.rows, options.pass_threshold), samples=options.samples, by=options.by
    )
    if options.skip_bad_rows:
        summary["bad_rows_skipped"] = setup.bad_rows_skipped
    # Rows whose mock_replies script the mock (when the mock answers): without any, a reward
    # of 0 everywhere says little about the agent (the mock does not know the task's answers).
    summary["scripted_rows"] = sum(1 for r in setup.rows if r.replies is not None)
    summary["fingerprint"] = fp
    return summary


def with_samples(rows: list[Any], options: TestOptions) -> list[Any]:
    """Each row ``samples`` times (sample 0, 1, ...), checking that ``--by`` names a column."""
    import dataclasses

    from ..errors import ConfigError

    if options.by is not None and rows and not any(options.by in r.metadata for r in rows):
        columns = sorted({key for r in rows for key in r.metadata}) or ["none"]
        raise ConfigError(
            f"--by {options.by!r}: no row has that column; the rows' columns are "
            f"{', '.join(columns)}"
        )
    if not options.mock_replies:
        rows = [dataclasses.replace(r, replies=None) for r in rows]
    if options.replay is not None:  # the cassette's rows are its samples, each recorded
        recorded = 1 + max((r.sample for r in rows), default=0)
        if options.samples > 1 and options.samples != recorded:
            raise ConfigError(
                f"--samples {options.samples}: the cassette holds {recorded} sample(s) of each "
                f"row; replay them with --samples {recorded} (or without --samples)"
            )
        return rows
    if options.samples <= 1:
        return rows
    # Each sample names its group (judging.GroupJudge ranks a group's samples in one call).
    return [
        dataclasses.replace(
            r,
            sample=k,
            metadata={**r.metadata, "group_id": f"row-{r.index}", "group_size": options.samples},
        )
        for r in rows
        for k in range(options.samples)
    ]


def write_groups(sink: IO[str], rows: list[Any], options: TestOptions) -> None:
    """With ``--samples`` above 1: one ``"type": "group"`` line per row, before the summary."""
    if options.samples <= 1:
        return
    from .groups import group_rows

    for group in group_rows(rows, options.pass_threshold):
        sink.write(json.dumps({"type": "group", **group.stats()}) + "\n")


def _binder(backend: Any) -> Any:
    """For ``--jobs`` replays: each row's recorded row, taken in dataset order."""

    def bind(row: Any) -> Any:
        return backend.take_row(row.messages, row.metadata, row.sample)

    return bind


@contextlib.contextmanager
def _library_log_level(verbose: bool) -> Iterator[None]:
    """For one run: the library's warnings and tracebacks on stderr with ``verbose``, nothing
    below CRITICAL without (the report shows every failure; the log would repeat them per row);
    the previous logging setup is restored afterwards."""
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
