"""A project's ``AGENTS.md`` and ``CLAUDE.md``: what a coding agent must know before it edits.

Rendered when ``osmosis init`` renders the project, never kept as a copy: the findings section is
:func:`osmosis_rollout.findings.render_markdown` of the table itself, so the guide a coding agent
reads names exactly the codes this version reports, with the table's meaning and fix. What is
specific to a template (its contract: where ``run`` is, how tools are declared, the reward) comes
from the ``[agents] contract`` of its ``template.toml``; its layout is the ``## Layout`` section
of its own README, so the two cannot disagree.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from ..findings import FINDINGS, POLLING, FindingKind, render_markdown

__all__ = ["AGENTS_MD", "CLAUDE_MD", "agent_guide_files", "guide_findings", "render_agents_md"]

AGENTS_MD = PurePosixPath("AGENTS.md")
CLAUDE_MD = PurePosixPath("CLAUDE.md")

_LAYOUT = re.compile(r"^## Layout\n(?P<body>.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)

_CLAUDE = """\
# CLAUDE.md

Read [AGENTS.md](AGENTS.md) first: it is this project's guide for coding agents (the agent
contract, the commands that check a change, what each finding means). The skills in
`.claude/skills/` (the same as `.agents/skills/`) walk through creating, debugging, evaluating
and shipping the agent.
"""


def guide_findings() -> tuple[FindingKind, ...]:
    """The findings an agent of this toolkit can meet: the server wires' (v1, v2), in the table's
    order. The polling wire's own findings judge a server, not an agent, and are left out."""
    return tuple(k for k in FINDINGS if k.wires != frozenset({POLLING}))


def render_agents_md(*, template: str, target: str, contract: str, readme: str) -> str:
    """``AGENTS.md`` for a project made from ``template`` whose agent is ``target``.

    ``contract`` is the template's own rules (Markdown); ``readme`` the project's rendered
    README, whose ``## Layout`` section is reused as it is.
    """
    layout = _LAYOUT.search(readme)
    layout_text = layout.group("body").strip() if layout else "See README.md."
    return f"""\
# AGENTS.md

This project is an agent loop for reinforcement-learning rollouts, built with osmosis-rollout
from the `{template}` template. Its agent is `{target}` (named in `[tool.osmosis] agent` of
`pyproject.toml`, so no command below needs a TARGET). Run every command from this folder.
Where the platform's SDK (`osmosis-ai`) owns the `osmosis` command, `osmosis-rollout` is this
toolkit's, the same program: `osmosis --version` says which one you have.

## The agent contract

- `run(ctx)` is one rollout: it starts from `ctx.request.messages`, asks the model only through
  the context (`ctx.chat(messages)` or the client `ctx.openai_client()` returns), and returns
  `ctx.complete(messages, reward=...)` within the rollout's deadline and `ctx.request.max_turns`.
- The history only grows: each call sends the previous call's messages plus its reply and the
  tool results, unchanged. TrainGate trains on exactly those tokens.
- Every tool the model may call is declared by `get_tools()`, with a JSON Schema that matches the
  function it runs; `osmosis validate` checks each schema, `osmosis test` each call's result
  (a tool that fails every call is `tool_always_fails`).
- The reward is a finite number in the dataset's range (0 to 1 here), computed from the row
  (`ctx.request.metadata`, e.g. `ground_truth`); `None` when the row cannot be scored.
{contract.strip()}

## Layout

{layout_text}

## Check a change, in this order

Each command prints JSON with `--json` (shapes: the toolkit's docs/json.md) and exits 0 when
all is well, 1 when it found problems, 2 on a usage or configuration error. `osmosis test`
fails a row on an error or a finding; what it finds about the run as a whole (`run_findings`:
a tool that always fails, say) fails it only with `--strict`, as below.

```bash
osmosis doctor --json                             # this machine and this project
osmosis validate --json                           # static checks, the tools, one dry rollout
osmosis test --json --strict --dataset dataset.jsonl  # every row, mock TrainGate, offline
osmosis validate --reward --json --dataset dataset.jsonl  # can a no-op or random policy score?
python -m pytest -q                               # this project's own tests
```

A change is done when `osmosis validate --json` says `"valid": true`, the summary `osmosis test
--json` prints says `"trainable": true` with empty `findings` and `run_findings`, and the tests
pass. When one does not, follow the debug-agent skill.

A deliberate change of what the agent sends (a tool added or changed, the prompt, the loop)
makes `tests/test_replay.py` fail with `replay_diverged`, naming the turn and field: the test
is doing its job. Check that the difference is the one you meant, then record the run again
(this is not weakening the test) and commit the new cassette:

```bash
osmosis test --dataset dataset.jsonl --limit 2 --record tests/cassettes/recorded.jsonl
```

## Findings

A finding is a rule a trainer depends on that a run broke; its code appears in `osmosis test
--json` (`findings`, `run_findings`), in `osmosis validate --json` (as its problem code) and in
traces. "trainable: no" means a run with it cannot be trained on as it is.

{render_markdown(guide_findings()).strip()}

## Never

- Rewrite, trim, summarise or reorder the message history between model calls.
- Call a model directly (an `openai.OpenAI(...)` of your own, a fixed model name, an HTTP
  request to a provider): the policy being trained must answer every turn, through the context.
- Block the event loop in `run` or an async tool (`time.sleep`, `requests`, a long CPU loop):
  use `await asyncio.sleep`, an async client, or a sync tool (`Toolbox` runs those in threads).
- Print or write API keys; give them in the environment (`OSMOSIS_API_KEY`, `OPENAI_API_KEY`).
- Weaken a test in `tests/` to make it pass.

## Skills

Step-by-step guides live in `.agents/skills/` (copied in `.claude/skills/`): `create-agent`,
`debug-agent`, `evaluate-agent`, `ship-agent`. `osmosis skills list --json` lists them;
`osmosis skills install` brings them up to date.
"""


def agent_guide_files(
    *, template: str, target: str, contract: str, readme: str
) -> dict[PurePosixPath, str]:
    """``AGENTS.md`` and ``CLAUDE.md`` for a rendered project."""
    agents = render_agents_md(template=template, target=target, contract=contract, readme=readme)
    return {AGENTS_MD: agents, CLAUDE_MD: _CLAUDE}
