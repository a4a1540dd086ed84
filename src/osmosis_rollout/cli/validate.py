"""``osmosis validate``: check an agent before a GPU-hour is spent on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import app
from ._common import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, fail, run_async, stdout_console
from ._target import TARGET_HELP, agent_target
from ._test_flags import DEFAULT_PROTOCOL, check_protocol, protocol_metavar


@app.command("validate")
def validate_command(
    context: typer.Context,
    target: Annotated[
        str | None,
        typer.Argument(
            help=TARGET_HELP,
            metavar="TARGET",
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the result as JSON on stdout, nothing else.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Fail on warnings too.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run/--no-dry-run", help="Run one rollout with the mock LLM."),
    ] = True,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds allowed for the dry run.")
    ] = 30.0,
    reward: Annotated[
        bool,
        typer.Option(
            "--reward",
            help="Check the reward instead: run a no-op, a random and (with mock_replies) a "
            "gold policy over --dataset and report leaks, constant, out-of-range or "
            "non-finite rewards and failing gold rows (docs/evaluating.md).",
        ),
    ] = False,
    dataset: Annotated[
        Path | None,
        typer.Option("--dataset", "-d", help="With --reward: the rows.", show_default=False),
    ] = None,
    reward_range: Annotated[
        str, typer.Option(metavar="MIN,MAX", help="With --reward: the rewards' valid range.")
    ] = "0,1",
    pass_threshold: Annotated[
        float, typer.Option(help="With --reward: a gold row passes at this reward or above.")
    ] = 1.0,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            metavar=protocol_metavar(),
            help="The wire of the dry run (docs/protocol-v2.md). With --server or --launch: "
            "default, the wire the server's /health shows.",
        ),
    ] = DEFAULT_PROTOCOL,
    server: Annotated[
        str | None,
        typer.Option(
            help="With --reward: check the rewards of an already running rollout server (its "
            "URL) instead of TARGET.",
            show_default=False,
        ),
    ] = None,
    launch: Annotated[
        str | None,
        typer.Option(
            metavar="CMD",
            help="With --reward: start this rollout server command (any server, as `osmosis "
            "test --launch` does; also `launch` in [tool.osmosis]) and check its rewards.",
            show_default=False,
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="With --server: the key that server requires (also read from OSMOSIS_API_KEY).",
            envvar="OSMOSIS_API_KEY",
            show_envvar=False,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Check an agent statically, dynamically and with one dry rollout.

    Exit codes: 0 valid (warnings allowed unless --strict), 1 not valid, 2 the target cannot be
    found or parsed. Problem codes and the JSON shape are listed in docs/validate.md.
    """
    from ..loader import TARGET_CODES
    from ..render import validation_report
    from ..validator import validate_agent_loop_async

    wire = check_protocol(protocol, command="validate").protocol
    if reward:
        from ._validate_reward import reward_checks, reward_server

        remote = reward_server(target, server=server, launch=launch)
        if remote is None:
            target = agent_target(
                target, command="validate", example="osmosis validate agent.py:MyAgent"
            )
        source = context.get_parameter_source("protocol")
        protocol_given = source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
        reward_checks(
            target,
            dataset,
            reward_range=reward_range,
            pass_threshold=pass_threshold,
            json_output=json_output,
            timeout=timeout,
            remote=remote,
            protocol=wire if remote is None or protocol_given else None,
            api_key=api_key,
        )
    if server is not None or launch is not None:
        flag = "--server" if server is not None else "--launch"
        fail(
            f"{flag} is for --reward: the static checks and the dry run read the agent's code "
            "(give TARGET); a server's rewards are checked with --reward -d rows.jsonl",
            hint=f"osmosis validate --reward -d rows.jsonl {flag} "
            + ("URL" if server is not None else "'python main.py'"),
        )
    if dataset is not None:
        fail(
            "--dataset is for --reward",
            hint="osmosis validate agent.py:MyAgent --reward -d rows.jsonl",
        )
    target = agent_target(target, command="validate", example="osmosis validate agent.py:MyAgent")
    result = run_async(
        validate_agent_loop_async(target, dry_run=dry_run, timeout_s=timeout, protocol=wire)
    )
    unusable = next((p for p in result.errors if p.code in TARGET_CODES), None)
    if json_output:
        typer.echo(result.model_dump_json(indent=2))
    elif unusable is not None:
        fail(unusable.message, hint="osmosis validate path/to/agent.py:MyAgent")
    else:
        stdout_console().print(validation_report(result, strict=strict))
    if unusable is not None:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_OK if result.passed(strict=strict) else EXIT_PROBLEMS)
