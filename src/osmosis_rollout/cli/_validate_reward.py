"""``osmosis validate --reward -d rows.jsonl``: the reward checks, run and shown."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from ._common import EXIT_OK, EXIT_PROBLEMS, fail, run_async, stderr_console, stdout_console


def parse_range(text: str) -> tuple[float, float]:
    """``--reward-range MIN,MAX`` as two numbers, MIN <= MAX."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        fail(f"--reward-range {text!r}: give MIN,MAX, e.g. 0,1", hint="--reward-range -1,1")
    if low > high:
        fail(f"--reward-range {text!r}: MIN is above MAX", hint="--reward-range -1,1")
    return low, high


@dataclass(frozen=True)
class Remote:
    """The rollout server whose rewards are checked: a running one, or a command to start."""

    server: str | None = None
    launch: Any = None


def reward_server(target: str | None, *, server: str | None, launch: str | None) -> Remote | None:
    """``--server`` or ``--launch`` (else ``[tool.osmosis] launch`` when no TARGET is given),
    or None for the agent in process; exits 2 when TARGET is given beside one of them."""
    from ._target import launch_spec, project_launch

    if server is not None and launch is not None:
        fail("give either --server URL or --launch CMD, not both")
    if target is not None and (server is not None or launch is not None):
        flag = "--server URL" if server is not None else "--launch CMD"
        fail(f"give either TARGET (check the agent in process) or {flag}, not both")
    command, cwd = project_launch(target, server=server, launch=launch)
    if server is None and command is None:
        return None
    if server is not None:
        from ._test_flags import check_server_url

        check_server_url(server)
    return Remote(server=server, launch=launch_spec(command, cwd))


def reward_checks(
    target: str | None,
    dataset: Path | None,
    *,
    reward_range: str,
    pass_threshold: float,
    json_output: bool,
    timeout: float,
    remote: Remote | None = None,
    protocol: str | None = "v1",
    api_key: str | None = None,
) -> None:
    """Run the checks, print the policies and findings (or JSON), exit 0 or 1."""
    from ..errors import OsmosisError
    from ..evaluation.reward_checks import POLICY_NAMES, RewardCheckOptions, check_rewards

    if dataset is None:
        fail(
            "--reward needs the rows to score: give --dataset",
            hint="osmosis validate agent.py:MyAgent --reward -d rows.jsonl",
        )
    options = RewardCheckOptions(
        target=target,
        dataset=dataset,
        reward_range=parse_range(reward_range),
        pass_threshold=pass_threshold,
        timeout=timeout,
        server=remote.server if remote is not None else None,
        launch=remote.launch if remote is not None else None,
        protocol=protocol,
        api_key=api_key,
    )
    err = stderr_console()
    try:
        report = run_async(check_rewards(options, lambda line: err.print(escape(line))))
    except OsmosisError as exc:
        fail(str(exc))
    if json_output:
        import json

        typer.echo(json.dumps({"version": 1, **report.as_dict()}, indent=2))
    else:
        console = stdout_console()
        table = Table(title="Reward checks", title_justify="left")
        table.add_column("policy")
        table.add_column("rows", justify="right")
        table.add_column("mean reward", justify="right")
        table.add_column("errors", justify="right")
        for run in report.runs:
            mean = "-" if run.mean is None else f"{run.mean:g}"
            table.add_row(
                POLICY_NAMES[run.policy], str(len(run.rewards)), mean, str(len(run.errors))
            )
        console.print(table)
        for finding in report.findings:
            console.print(f"[red]{escape(finding.code)}[/]: {escape(finding.message)}")
        if report.passed:
            console.print("[green]no findings[/]: the reference policies cannot collect the reward")
        if not any(run.policy == "gold" for run in report.runs):
            console.print(
                "[dim]No row has gold replies (a mock_replies column), so nothing checked that "
                "the reward pays for a right answer: a reward that is always 0 passes too.[/]"
            )
    raise typer.Exit(EXIT_OK if report.passed else EXIT_PROBLEMS)
