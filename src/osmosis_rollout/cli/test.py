"""``osmosis test``: drive an agent through a mock TrainGate over a dataset (or step by step).

A thin layer over :func:`osmosis_rollout.evaluation.run_test`: options, usage errors, rendering.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from . import app
from ._common import fail, run_async
from ._target import TARGET_HELP
from ._test_flags import (
    DEFAULT_PROTOCOL,
    check_fail_on,
    check_jobs,
    check_mock_policy,
    check_mode_flags,
    check_protocol,
    check_row,
    check_server_url,
    check_token_check,
    jobs_count,
    llm_key,
    llm_of,
    protocol_metavar,
    run_rows,
    say_auto_jobs,
    say_no_turn_budget,
    warm_up_workers,
)

if TYPE_CHECKING:
    pass


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
    skip_bad_rows: Annotated[
        bool,
        typer.Option(
            "--skip-bad-rows",
            help="Run the dataset's good rows when some are malformed: the bad ones are named, "
            "left out and counted in the summary. Without it, bad rows stop the run (exit 2).",
        ),
    ] = False,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Rollouts run at once (per worker with --jobs). Default: 8, or with --llm-url "
            "the slots the model server reports (llama.cpp /props).",
            show_default=False,
        ),
    ] = None,
    jobs: Annotated[
        str,
        typer.Option(
            "--jobs",
            "-j",
            metavar="N|auto",
            help="Run the rows in N worker processes, each with --concurrency rollouts at "
            "once: for CPU-bound runs (the mock LLM, --replay). auto: one per free CPU (the "
            "CPUs this process may use less the load average on them), 1 when fewer than 1.5 "
            "are free, at most one per 200 rows. Not with --interactive, --server, --record or "
            "--token-check.",
        ),
    ] = "1",
    server: Annotated[
        str | None,
        typer.Option(
            help="Test an already running server (its URL, e.g. http://127.0.0.1:9000) "
            "instead of TARGET."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="An official eval config (configs/eval/NAME.toml of an osmosis-ai workspace): "
            "its dataset (data/NAME.jsonl), n as --samples, pass_threshold, limit, "
            "agent_workflow_timeout_s as --timeout, [env] and the rollout's entrypoint as "
            "--launch; the keys it does not use are listed. A flag given here wins.",
            show_default=False,
        ),
    ] = None,
    launch: Annotated[
        str | None,
        typer.Option(
            metavar="CMD",
            help="Start this server command for the run instead of TARGET (split like a "
            "shell line, run in the current folder, or with --config in its rollout's folder "
            "rollouts/<rollout>/, e.g. 'python main.py'), any Osmosis rollout "
            "server whatever wrote it: it is told a free 127.0.0.1 port in "
            "_OSMOSIS_ROLLOUT_PORT (and ROLLOUT_PORT) as the platform does, and always "
            "stopped. Also `launch` in [tool.osmosis]. See docs/any-server.md.",
            show_default=False,
        ),
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            metavar=protocol_metavar(),
            help="The wire the mock TrainGate speaks to the server: v1 (POST /v1/rollout/init, "
            "one callback) or v2 (POST /rollout, completion and grader callbacks, status, "
            "cancel), in-process or with --server. See docs/protocol-v2.md. Default: v1; with "
            "--server or --launch, the wire the server's /health shows.",
        ),
    ] = DEFAULT_PROTOCOL,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="With --server: the key that server requires (its --api-key; also read from "
            "OSMOSIS_API_KEY). Without --server: the LLM's key (else OPENAI_API_KEY).",
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
        str | None,
        typer.Option(
            help="A real model (implies --llm openai): served by --llm-url, else OPENAI_BASE_URL "
            "(default https://api.openai.com/v1) with OPENAI_API_KEY; openai/NAME is NAME. "
            "Also OPENAI_MODEL."
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of the mock LLM's tool arguments (0 by default); with a real model "
            "(--llm-url, --llm openai) sent as each request's seed, one per row and sample."
        ),
    ] = None,
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
        typer.Option(
            "--output",
            "-o",
            help="Write one JSON object per row, then a summary (JSON Lines); a .json path gets "
            "one object of summary and results, as the original SDK wrote.",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON on stdout.")
    ] = False,
    debug_dir: Annotated[
        Path | None,
        typer.Option(
            help="Write per-rollout JSONL traces here. With --server or --launch: the mock "
            "TrainGate's side of each rollout (the server's own steps are its to trace)."
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Also print the server's warnings and agents' tracebacks; with --launch, "
            "the launched server's output as it comes (each line after `server| `).",
        ),
    ] = False,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="Step through one rollout turn by turn.")
    ] = False,
    row: Annotated[
        int | None,
        typer.Option(help="With --interactive: start at this dataset row (counting from 1)."),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Record every LLM request and reply, tool result and final result of the run "
            "into this cassette (JSON Lines), to replay it offline with --replay.",
            show_default=False,
        ),
    ] = None,
    trajectories: Annotated[
        Path | None,
        typer.Option(
            help="Write each rollout as an ATIF trajectory (the Osmosis platform's format): "
            "DIR/<rollout id>/trajectory.json, one per row and sample.",
            metavar="DIR",
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
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="With --output FILE: run only the rows (and samples) FILE does not hold yet, "
            "and keep the others; refused when the agent's code, the rows or the options "
            "differ from those FILE was made with.",
        ),
    ] = False,
    samples: Annotated[
        int,
        typer.Option(
            min=1,
            help="Rollouts per row (a group), each seeded apart: the summary gives each group's "
            "reward mean, spread, min and max, pass@k for k = 1..N and the share of no-signal "
            "groups (every sample the same reward).",
        ),
    ] = 1,
    pass_threshold: Annotated[
        float, typer.Option(help="A sample passes, for pass@k, when its reward is at least this.")
    ] = 1.0,
    by: Annotated[
        str | None,
        typer.Option(
            metavar="COLUMN",
            help="Break the group figures down by this dataset column (e.g. difficulty).",
            show_default=False,
        ),
    ] = None,
    mock_policy: Annotated[
        str,
        typer.Option(
            "--mock-policy",
            help="How the mock LLM walks the agent: [bold]walk[/] (one tool call a turn, each "
            "tool once in a seeded order, submit/answer/final-looking tools last, then an "
            "answer), all (every tool at once), random, first (the first tool once), none "
            "(answer nothing at once). A row's mock_replies column scripts its replies.",
        ),
    ] = "walk",
    mock_replies: Annotated[
        bool,
        typer.Option(
            "--mock-replies/--no-mock-replies",
            help="Let a row's mock_replies column script the mock LLM's replies for it.",
        ),
    ] = True,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            metavar="WHAT",
            help="Also fail the rows that show this (repeatable): [bold]tool_errors[/], a tool "
            "call that raised or timed out.",
            show_default=False,
        ),
    ] = None,
    tool_error_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="A tool failing in more than this share of its calls is a tool_error_share "
            "finding (one failing in all of them: tool_always_fails).",
        ),
    ] = 0.2,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Fail the rows that show what the server does not support (a status route "
            "that answers unknown, a cancel that cancels nothing), not only report one "
            "run-level finding (status_unsupported, cancel_unsupported) for each; and fail the "
            "run on the conformance probes' findings.",
        ),
    ] = False,
    conformance: Annotated[
        bool | None,
        typer.Option(
            "--conformance/--no-conformance",
            help="After the rows, probe the server's POST /rollout (v2, polling) with hostile "
            "input: a 422 that echoes the body's keys, a NaN timeout answered 5xx, a repeated "
            "rollout_id run twice; each a run finding. Default: on with --launch, off with "
            "--server (the server may log the probes as errors). See docs/any-server.md.",
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
    config_env: dict[str, str] = {}
    config_cwd = None
    config_hint = None
    if config is not None:
        from ._eval_config import from_config, pick, say_config

        chosen = from_config(
            config,
            given=lambda name: _given(context, name),
            in_process=target is not None or server is not None,
            real_model=llm_url is not None or model is not None or llm.lower() == "openai",
        )
        dataset, samples = pick(dataset, chosen.dataset), pick(samples, chosen.samples)
        limit, timeout = pick(limit, chosen.limit), pick(timeout, chosen.timeout)
        pass_threshold = pick(pass_threshold, chosen.pass_threshold)
        model, launch = pick(model, chosen.model), pick(launch, chosen.launch)
        config_env, config_cwd = chosen.env, chosen.launch_cwd
        config_hint = chosen.environment_hint
        say_config(config, chosen)
    count, auto_reason = jobs_count(
        jobs, rows=run_rows(dataset, replay, offset=offset, limit=limit)
    )
    one_process = record is not None or trajectories is not None
    if server is None and launch is None and not one_process and not (interactive or token_check):
        warm_up_workers(count)
    from ._target import launch_spec, project_launch

    launch, launch_cwd = project_launch(target, server=server, launch=launch)
    launch_cwd = launch_cwd or config_cwd
    if server is None and launch is None:
        from ._target import agent_target

        target = agent_target(
            target,
            command="test",
            example="osmosis test agent.py:MyAgent --dataset rows.jsonl",
            other="a server is tested with --launch CMD or --server URL (or --config FILE)",
        )
    if server is not None and target is not None:
        fail("give either TARGET (run it in-process) or --server URL, not both")
    if launch is not None and (server is not None or target is not None):
        other = "--server URL" if server is not None else "TARGET"
        fail(f"give either --launch CMD (start that server) or {other}, not both")
    remote = server or launch
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
    check_row(row, interactive=interactive)
    check_mode_flags(interactive, row=row, output=output, json_output=json_output)
    if replay is None:
        llm = llm_of(llm, llm_given=_given(context, "llm"), model=model, llm_url=llm_url)
    fail_on_checked = check_fail_on(fail_on or [])
    if interactive and (samples > 1 or resume or by is not None):
        flag = "--samples" if samples > 1 else "--resume" if resume else "--by"
        fail(f"{flag} works only in batch mode, not with --interactive")
    if resume and output is None:
        fail(
            "--resume continues the results file of --output: give it",
            hint="osmosis test agent.py:MyAgent -d rows.jsonl -o results.jsonl --resume",
        )
    wire = check_protocol(protocol)
    if not wire.turn_budget and _given(context, "max_turns"):
        say_no_turn_budget(wire)
    if interactive and trajectories is not None:
        fail("--trajectories works only in batch mode, not with --interactive")
    if trajectories is not None and trajectories.exists() and not trajectories.is_dir():
        fail(f"--trajectories {trajectories}: a file is there; give a folder (made if missing)")
    if debug_dir is not None and debug_dir.exists() and not debug_dir.is_dir():
        fail(f"--debug-dir {debug_dir}: a file is there; give a folder (made if missing)")
    workers = check_jobs(
        jobs,
        count,
        interactive=interactive,
        server=remote,
        record=record,
        token_check=token_check,
        trajectories=trajectories,
        launched=server is None and launch is not None,
    )
    check_token_check(token_check, interactive=interactive, llm=llm, llm_url=llm_url)
    if server is not None:
        check_server_url(server)
    if conformance and (remote is None or interactive):
        fail(
            "--conformance probes a rollout server you did not write, in batch mode: give "
            "--launch CMD or --server URL (in process the server is ours), without --interactive",
            hint="osmosis test --server http://127.0.0.1:9000 -d rows.jsonl --conformance",
        )
    if auto_reason is not None and workers == 1 and not interactive and remote is None:
        say_auto_jobs(auto_reason)
    from ..errors import OsmosisError
    from ..evaluation import TestOptions
    from ..evaluation.datasets import BadRowsError

    options = TestOptions(
        target=target,
        dataset=dataset,
        limit=limit,
        offset=offset,
        skip_bad_rows=skip_bad_rows,
        concurrency=concurrency,
        jobs=workers,
        server=server,
        api_key=api_key
        if remote is not None
        else llm_key(api_key, given=_given(context, "api_key", "COMMANDLINE"), workers=workers),
        llm=llm,
        llm_url=llm_url,
        model=model,
        seed=seed,
        max_turns=max_turns if _given(context, "max_turns") else None,
        temperature=temperature,
        max_tokens=max_tokens,
        llm_timeout=llm_timeout,
        timeout=timeout,
        output=output,
        debug_dir=debug_dir,
        verbose=verbose,
        record=record,
        trajectories=trajectories,
        replay=replay,
        replay_mode=replay_mode,
        token_check=token_check,
        fail_on=fail_on_checked,
        mock_policy=check_mock_policy(mock_policy),
        samples=samples,
        resume=resume,
        mock_replies=mock_replies,
        pass_threshold=pass_threshold,
        by=by,
        tool_error_share=tool_error_share,
        protocol=wire.protocol if remote is None or _given(context, "protocol") else None,
        # --verbose: a launched server's output on stderr as it comes (not in the REPL's way).
        launch=launch_spec(
            launch, launch_cwd, config_env, config_hint, echo=verbose and not interactive
        ),
        strict=strict,
        conformance=conformance,
    )
    try:
        if interactive:
            from ._test_view import interactive_run

            raise typer.Exit(interactive_run(options, start_row=row))
        from ..evaluation import run_test
        from ._test_view import Shown, render

        report = run_async(run_test(options, Shown(json_output, output, samples=options.samples)))
    except BadRowsError as exc:
        fail(str(exc), hint="fix the rows, or run the others with --skip-bad-rows")
    except OsmosisError as exc:
        fail(str(exc))
    raise typer.Exit(render(report, options, json_output=json_output))


def _given(context: typer.Context, name: str, *sources: str) -> bool:
    """Whether an option came from the command line or the environment, not its default
    (``sources``: only from these, e.g. ``"COMMANDLINE"``)."""
    source = context.get_parameter_source(name)
    if source is None:
        return False
    if sources:
        return source.name in sources
    return source.name not in ("DEFAULT", "DEFAULT_MAP")
