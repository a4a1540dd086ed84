"""``osmosis validate --reward -d rows.jsonl``: the reward checks, run and shown."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ._common import EXIT_OK, EXIT_PROBLEMS, fail, run_async, stdout_console


def parse_range(text: str) -> tuple[float, float]:
    """``--reward-range MIN,MAX`` as two numbers, MIN <= MAX."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        fail(f"--reward-range {text!r}: give MIN,MAX, e.g. 0,1", hint="--reward-range -1,1")
    if low > high:
        fail(f"--reward-range {text!r}: MIN is above MAX", hint="--reward-range -1,1")
    return low, high


def reward_checks(
    target: str,
    dataset: Path | None,
    *,
    reward_range: str,
    pass_threshold: float,
    json_output: bool,
    timeout: float,
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
    )
    try:
        report = run_async(check_rewards(options))
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
    raise typer.Exit(EXIT_OK if report.passed else EXIT_PROBLEMS)
