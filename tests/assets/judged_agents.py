"""Agents rewarded by a judge (tests/test_judging.py): a sound mock judge, a leaky one that
scores every answer 1.0, a failing one, one ranking ``--samples`` groups together, and one
judged over HTTP by an in-process fake judge."""

from __future__ import annotations

import json
import os
from typing import Any

from osmosis_rollout.agent import RolloutAgentLoop, RolloutContext
from osmosis_rollout.judging import (
    Criterion,
    GroupJudge,
    Judge,
    JudgeSettings,
    MockJudge,
    Rubric,
    Verdict,
)
from osmosis_rollout.results import RolloutResult
from osmosis_rollout.transport import AsgiTransport

RUBRIC = Rubric([Criterion("correct", "Matches the reference.", 2), Criterion("clear", "Plain.")])


class _Judged(RolloutAgentLoop):
    name = "judged"
    judge: Any = MockJudge()

    def get_tools(self, request: Any) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message])

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        truth = ctx.request.metadata.get("ground_truth")
        verdict: Verdict = await self.judge.score(RUBRIC, result.final_messages, reference=truth)
        return verdict


class SoundJudged(_Judged):
    judge = MockJudge()


class LeakyJudged(_Judged):
    judge = MockJudge(fixed=1.0)


class FailingJudged(_Judged):
    judge = MockJudge(fail="timeout")


GROUPS = GroupJudge(MockJudge(), RUBRIC, wait_s=10)


class GroupJudged(_Judged):
    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        meta = ctx.request.metadata
        return await GROUPS.score(
            result.final_messages, metadata=meta, reference=meta.get("ground_truth")
        )


async def _fake_judge(scope: Any, receive: Any, send: Any) -> None:
    """An OpenAI-compatible judge in process: each request is a line in the file
    ``$JUDGED_AGENTS_LOG``; it answers a verdict of 0.75 on both criteria."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    with open(os.environ["JUDGED_AGENTS_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(json.loads(body)["model"]) + "\n")
    verdict = {"criteria": [{"name": n, "score": 0.75, "reason": "ok"} for n in RUBRIC.names]}
    reply = {
        "choices": [{"message": {"role": "assistant", "content": json.dumps(verdict)}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10},
    }
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": json.dumps(reply).encode()})


class HttpJudged(_Judged):
    """Judged over HTTP (our carrier into the in-process fake): recorded and replayed."""

    judge = Judge(
        JudgeSettings(url="http://judge.test/v1", model="fake-judge"),
        transport=AsgiTransport(_fake_judge),
    )
