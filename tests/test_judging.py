"""``judging``: rubrics, the judge client over our carriers, strict verdicts, the mock judge,
and a judge inside ``grade()`` on both wires (its failures are errors, never reward 0)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from osmosis_rollout.agent import RolloutAgentLoop, RolloutContext
from osmosis_rollout.errors import ConfigError, JudgeError, error_category
from osmosis_rollout.judging import (
    Criterion,
    Judge,
    JudgeSettings,
    MockJudge,
    Rubric,
    Verdict,
    load_judge,
    load_rubric,
)
from osmosis_rollout.judging.verdict import VerdictRefused, parse_verdict
from osmosis_rollout.redaction import ApiKey
from osmosis_rollout.results import RolloutResult
from osmosis_rollout.testing import Harness, ScriptedBackend
from osmosis_rollout.transport import AsgiTransport

pytestmark = pytest.mark.anyio

RUBRIC = Rubric(
    [Criterion("correct", "The answer names the right city.", 3), Criterion("brief", "Short.")],
    reference="Paris",
)
KEY = "judge-key-123456"
CHAT = [
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
]


def _verdict(correct: float = 1.0, brief: float = 0.5) -> str:
    return json.dumps(
        {
            "criteria": [
                {"name": "correct", "score": correct, "reason": "names Paris"},
                {"name": "brief", "score": brief, "reason": "one word"},
            ]
        }
    )


class FakeJudgeServer:
    """An OpenAI-compatible judge as an ASGI app: answers ``replies`` in turn, keeps bodies."""

    def __init__(self, *replies: str | tuple[int, str], delay_s: float = 0.0) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.delay_s = delay_s

    async def __call__(self, scope: Any, receive: Callable[..., Any], send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(json.loads(body))
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await anyio.sleep(self.delay_s)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        status, text = reply if isinstance(reply, tuple) else (200, reply)
        if status == 200:
            payload = json.dumps(
                {
                    "choices": [{"message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20},
                }
            ).encode()
        else:
            payload = text.encode()
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": payload})


def _judge(server: FakeJudgeServer, **settings: Any) -> Judge:
    s = JudgeSettings(url="http://judge.test/v1", model="grader", api_key=ApiKey(KEY), **settings)
    return Judge(s, transport=AsgiTransport(server))


def test_a_rubric_from_toml_and_its_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "rubric.toml"
    path.write_text(
        'reference = "Paris"\n[[criteria]]\nname = "correct"\ndescription = "Right city."\n'
        'weight = 2\n[[criteria]]\nname = "brief"\ndescription = "Short."\n'
    )
    rubric = load_rubric(path)
    assert rubric.names == ["correct", "brief"]
    assert rubric.reference == "Paris"
    assert rubric.weighted({"correct": 1.0, "brief": 0.0}) == pytest.approx(2 / 3)
    path.write_text('[[criteria]]\nname = "a"\ndescription = "x"\nweight = -1\n')
    with pytest.raises(ConfigError, match="weight must be finite and above 0"):
        load_rubric(path)
    path.write_text("criteria = 3\n")
    with pytest.raises(ConfigError, match=r"\[\[criteria\]\]"):
        load_rubric(path)
    with pytest.raises(ConfigError, match="must differ"):
        Rubric([Criterion("a", "x"), Criterion("a", "y")])


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("The answer is good. " + _verdict(), "not JSON"),
        ("[1, 2]", "not an object"),
        (_verdict(correct=1.5), r"not in \[0, 1\]"),
        (json.dumps({"criteria": [{"name": "correct", "score": 1, "reason": "ok"}]}), "no score"),
        (_verdict().replace("names Paris", ""), "give a reason"),
        (_verdict().replace('"brief"', '"style"'), "unknown criterion"),
    ],
)
def test_a_verdict_is_parsed_strictly(reply: str, why: str) -> None:
    """Prose around the JSON, a score out of range, a missing or unknown criterion: refused."""
    with pytest.raises(VerdictRefused, match=why):
        parse_verdict(RUBRIC, reply)


def test_a_verdict_is_the_weighted_mean_of_its_criteria() -> None:
    verdict = parse_verdict(RUBRIC, "```json\n" + _verdict(1.0, 0.5) + "\n```")
    assert verdict.score == pytest.approx((3 * 1.0 + 0.5) / 4)
    assert verdict.components == {"correct": 1.0, "brief": 0.5}
    assert verdict.reasons == {"correct": "names Paris", "brief": "one word"}


async def test_the_judge_asks_at_temperature_0_with_a_seed_and_its_own_key() -> None:
    server = FakeJudgeServer(_verdict())
    verdict = await _judge(server, seed=7).score(RUBRIC, CHAT, reference="Paris")
    assert verdict.score == pytest.approx(0.875)
    assert (verdict.prompt_tokens, verdict.response_tokens, verdict.calls) == (100, 20, 1)
    [body] = server.bodies
    assert (body["model"], body["temperature"], body["seed"]) == ("grader", 0.0, 7)
    assert "Reference answer:\nParis" in body["messages"][1]["content"]
    assert server.headers[0]["authorization"] == f"Bearer {KEY}"


async def test_a_judge_that_echoes_its_key_never_passes_it_on() -> None:
    verdict = await _judge(FakeJudgeServer(_verdict().replace("one word", f"key {KEY}"))).score(
        RUBRIC, CHAT
    )
    assert KEY not in verdict.reasons["brief"]
    assert "**********" in verdict.reasons["brief"]


async def test_one_repair_then_a_verdict() -> None:
    server = FakeJudgeServer("I think it is fine", _verdict())
    judge = _judge(server)
    verdict = await judge.score(RUBRIC, CHAT)
    assert verdict.calls == 2
    assert judge.requests == 2
    repair = server.bodies[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "I think it is fine"}
    assert "not a valid verdict" in repair[-1]["content"]


async def test_a_reply_still_unparsable_after_the_repair_is_a_judge_failure() -> None:
    judge = _judge(FakeJudgeServer("no", "still no"))
    with pytest.raises(JudgeError, match="not a verdict, even after a repair") as caught:
        await judge.score(RUBRIC, CHAT)
    assert caught.value.kind == "verdict"
    assert judge.requests == 2
    assert error_category(caught.value) == "judge_error"


async def test_http_errors_and_timeouts_are_judge_failures_without_the_key() -> None:
    with pytest.raises(JudgeError) as http:
        await _judge(FakeJudgeServer((500, f"bad key {KEY}"))).score(RUBRIC, CHAT)
    assert http.value.kind == "http"
    assert "HTTP 500" in str(http.value)
    assert KEY not in str(http.value)
    with pytest.raises(JudgeError, match=r"within 0\.05s") as late:
        await _judge(FakeJudgeServer(_verdict(), delay_s=5), timeout_s=0.05).score(RUBRIC, CHAT)
    assert late.value.kind == "timeout"


async def test_the_judge_is_refused_a_cloud_metadata_address() -> None:
    """The judge's calls go through the carriers' destination check."""
    judge = Judge(JudgeSettings(url="http://169.254.169.254/v1", api_key=ApiKey(KEY)))
    try:
        with pytest.raises(JudgeError, match="destination refused"):
            await judge.score(RUBRIC, CHAT)
    finally:
        await judge.aclose()


async def test_judge_calls_on_tape_are_kept_per_rollout_and_replayed_without_a_request() -> None:
    from osmosis_rollout.judging.tape import JudgeTape, grading_rollout, use_tape

    recording = JudgeTape(replaying=False)
    server = FakeJudgeServer(_verdict())
    token = grading_rollout.set("row-1")
    try:
        with use_tape(recording):
            recorded = await _judge(server).score(RUBRIC, CHAT)
    finally:
        grading_rollout.reset(token)
    [kept] = recording.take("row-1")
    assert kept["reply"] == _verdict()
    assert kept["usage"] == [100, 20]

    replaying = JudgeTape(replaying=True)
    replaying.load([kept])
    offline = FakeJudgeServer((500, "the judge must not be called on replay"))
    judge = _judge(offline)
    with use_tape(replaying):
        replayed = await judge.score(RUBRIC, CHAT)
        with pytest.raises(JudgeError, match="holds no judge reply") as changed:
            await judge.score(RUBRIC, CHAT[:1])  # another transcript: not on the tape
    assert (replayed.score, replayed.reasons) == (recorded.score, recorded.reasons)
    assert offline.bodies == []  # 0 judge requests
    assert judge.requests == 0
    assert replaying.answered == 1
    assert changed.value.kind == "replay"


async def test_rank_judges_the_samples_together_and_reports_the_spread() -> None:
    entry = json.loads(_verdict())["criteria"]
    low = [dict(c, score=0.0) for c in entry]
    server = FakeJudgeServer(
        json.dumps({"samples": [{"sample": 2, "criteria": low}, {"sample": 1, "criteria": entry}]})
    )
    ranking = await _judge(server).rank(RUBRIC, [CHAT, CHAT[:1]])
    assert len(server.bodies) == 1  # one call for the group
    assert "=== Sample 2 ===" in server.bodies[0]["messages"][1]["content"]
    assert ranking.scores == [pytest.approx(0.875), 0.0]
    assert ranking.spread == pytest.approx(0.875)


async def test_the_mock_judge_is_deterministic_from_rubric_and_reference() -> None:
    judge = MockJudge()
    right = await judge.score(RUBRIC, CHAT)
    wrong = await judge.score(RUBRIC, CHAT, reference="Lyon")
    empty = await judge.score(RUBRIC, CHAT[:1])
    assert (right.score, wrong.score, empty.score) == (1.0, 0.0, 0.0)
    assert empty.reasons == {"correct": "no answer", "brief": "no answer"}
    assert right.prompt_tokens > 0
    assert right.calls == 1
    assert (await judge.score(RUBRIC, CHAT)).score == right.score
    ranking = await judge.rank(RUBRIC, [CHAT, CHAT[:1]])
    assert ranking.spread == 1.0


def test_judge_settings_come_from_arguments_env_then_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.osmosis.judge]\nurl = "http://127.0.0.1:8080/v1"\nmodel = "qwen"\nseed = 3\n'
    )
    env = {"OSMOSIS_JUDGE_MODEL": "llama", "OSMOSIS_JUDGE_API_KEY": KEY}
    s = JudgeSettings.resolve(environ=env, start=tmp_path, timeout_s=9)
    assert (s.url, s.model, s.seed, s.timeout_s) == ("http://127.0.0.1:8080/v1", "llama", 3, 9.0)
    assert s.api_key is not None
    assert KEY not in repr(s)
    assert isinstance(load_judge(environ={"OSMOSIS_JUDGE_URL": "mock"}, start=tmp_path), MockJudge)
    (tmp_path / "pyproject.toml").write_text(f'[tool.osmosis.judge]\napi_key = "{KEY}"\n')
    with pytest.raises(ConfigError, match="must not hold the key"):
        JudgeSettings.resolve(environ={}, start=tmp_path)


def test_no_judge_configured_is_a_config_error(tmp_path: Path) -> None:
    """The trainer's chat URL is never borrowed: no judge URL is an error naming the settings."""
    with pytest.raises(ConfigError, match="OSMOSIS_JUDGE_URL"):
        load_judge(environ={}, start=tmp_path)
    with pytest.raises(ConfigError, match="http"):
        JudgeSettings(url="ftp://x")


class JudgedAgent(RolloutAgentLoop):
    """One model call; the reward comes from a judge in grade()."""

    name = "judged"

    def __init__(self, judge: MockJudge) -> None:
        self.judge = judge

    def get_tools(self, request: Any) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message])

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        truth = ctx.request.metadata.get("ground_truth")
        return await self.judge.score(RUBRIC, result.final_messages, reference=truth)


@pytest.mark.parametrize("protocol", ["v1", "v2"])
async def test_a_judged_reward_carries_its_criteria_and_its_cost(protocol: str) -> None:
    agent = JudgedAgent(MockJudge())
    async with Harness(
        agent, backend=ScriptedBackend([{"content": "Paris"}]), protocol=protocol
    ) as h:
        outcome = await h.run(CHAT[:1], metadata={"ground_truth": "Paris"})
    result = outcome.result
    assert result is not None
    assert result.status == "COMPLETED", result.error_message
    assert result.reward == 1.0
    assert result.extra_fields["reward_components"] == {"correct": 1.0, "brief": 1.0}
    verdict = result.extra_fields["judge_verdict"]
    assert verdict["correct"] == {"score": 1.0, "reason": "1 of 1 reference words present"}
    metrics = result.metrics.model_dump() if result.metrics else {}
    assert metrics["judge_calls"] == 1
    assert metrics["judge_prompt_tokens"] > 0


@pytest.mark.parametrize("protocol", ["v1", "v2"])
@pytest.mark.parametrize("kind", ["timeout", "http", "verdict"])
async def test_a_failed_judge_is_an_error_with_its_category_never_reward_0(
    protocol: str, kind: str
) -> None:
    agent = JudgedAgent(MockJudge(fail=kind))
    async with Harness(
        agent, backend=ScriptedBackend([{"content": "Paris"}]), protocol=protocol
    ) as h:
        outcome = await h.run(CHAT[:1], metadata={"ground_truth": "Paris"})
        record = outcome.record
    result = outcome.result
    assert result is not None
    assert result.status == "ERROR"
    assert result.reward is None
    assert "grade() raised JudgeError" in (result.error_message or "")
    if protocol == "v2":
        assert record.v2 is not None
        [grader] = record.v2.graders
        assert grader.status == "failure"
        assert grader.err_category == "judge_error"


# -- the bench: osmosis test and validate --reward -------------------------------------------

AGENTS = f"{Path(__file__).parent / 'assets' / 'judged_agents.py'}"


def _rows(tmp_path: Path, *, gold: bool = False) -> Path:
    rows = []
    for question, truth in [("Capital of France?", "Paris"), ("Red planet?", "Mars")]:
        row: dict[str, Any] = {"user_prompt": question, "ground_truth": truth}
        if gold:
            row["mock_replies"] = [truth]
        rows.append(row)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_a_failed_judge_is_counted_as_judge_errors_not_as_reward_0(tmp_path: Path) -> None:
    from osmosis_rollout.evaluation import TestOptions, run_test

    report = await run_test(TestOptions(target=f"{AGENTS}:FailingJudged", dataset=_rows(tmp_path)))
    assert report.summary["judge_errors"] == 2
    assert report.summary["mean_reward"] is None
    assert [r.reward for r in report.rows] == [None, None]
    assert report.exit_code == 1


async def test_osmosis_test_shows_the_judge_apart_from_the_policy(tmp_path: Path) -> None:
    from osmosis_rollout.evaluation import TestOptions, run_test

    options = TestOptions(target=f"{AGENTS}:SoundJudged", dataset=_rows(tmp_path, gold=True))
    summary = (await run_test(options)).summary
    assert summary["mean_reward"] == 1.0
    assert summary["reward_components"] == {"correct": 1.0, "clear": 1.0}
    assert summary["judge_calls"] == 2
    assert summary["judge_errors"] == 0
    assert summary["judge_prompt_tokens"] > 0
    assert summary["judge_prompt_tokens"] != summary["prompt_tokens"]


async def test_samples_of_a_row_are_ranked_together_in_one_judge_call(tmp_path: Path) -> None:
    from osmosis_rollout.evaluation import TestOptions, run_test

    options = TestOptions(target=f"{AGENTS}:GroupJudged", dataset=_rows(tmp_path), samples=3)
    report = await run_test(options)
    assert report.summary["completed"] == 6
    assert report.summary["judge_calls"] == 2  # one per row's group of 3, not one per sample
    for row in report.rows:
        assert row.metadata["group_size"] == 3
        assert "judge_group_spread" in row.metrics


@pytest.mark.slow
async def test_with_jobs_a_rows_samples_stay_in_one_worker_for_the_judge(tmp_path: Path) -> None:
    """--jobs hands a row's samples to one worker, so its group is still ranked in one call."""
    from osmosis_rollout.evaluation import TestOptions, run_test

    rows = tmp_path / "many.jsonl"
    rows.write_text(
        "".join(json.dumps({"user_prompt": f"q{i}?", "ground_truth": "a"}) + "\n" for i in range(6))
    )
    options = TestOptions(
        target=f"{AGENTS}:GroupJudged", dataset=rows, samples=3, jobs=2, concurrency=3
    )
    report = await run_test(options)
    assert report.summary["completed"] == 18
    assert report.summary["judge_calls"] == 6


@pytest.mark.slow
async def test_a_recorded_run_replays_with_0_judge_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--record keeps each row's judge calls in the cassette; --replay answers them from it."""
    from osmosis_rollout.evaluation import TestOptions, run_test
    from osmosis_rollout.evaluation.cassette import read_cassette

    log = tmp_path / "judge-requests.log"
    monkeypatch.setenv("JUDGED_AGENTS_LOG", str(log))
    cassette = tmp_path / "cassette.jsonl"
    target = f"{AGENTS}:HttpJudged"
    recorded = await run_test(TestOptions(target=target, dataset=_rows(tmp_path), record=cassette))
    assert recorded.summary["mean_reward"] == 0.75
    assert len(log.read_text().splitlines()) == 2
    rows = read_cassette(cassette).rows
    assert [len(row.judge) for row in rows] == [1, 1]

    log.write_text("")
    replayed = await run_test(TestOptions(target=target, replay=cassette))
    assert replayed.passed, [f.message for f in replayed.findings]
    assert [r.reward for r in replayed.rows] == [0.75, 0.75]
    assert log.read_text() == ""  # 0 judge requests
    assert replayed.summary["judge_calls"] == 2  # answered from the cassette

    log.write_text("")
    jobs = await run_test(TestOptions(target=target, replay=cassette, jobs=2))
    assert [r.reward for r in jobs.rows] == [0.75, 0.75]
    assert log.read_text() == ""


async def test_validate_reward_reports_a_judge_that_rewards_an_empty_answer(
    tmp_path: Path,
) -> None:
    from osmosis_rollout.evaluation.reward_checks import RewardCheckOptions, check_rewards

    rows = _rows(tmp_path, gold=True)
    leaky = await check_rewards(RewardCheckOptions(target=f"{AGENTS}:LeakyJudged", dataset=rows))
    sound = await check_rewards(RewardCheckOptions(target=f"{AGENTS}:SoundJudged", dataset=rows))
    assert "reward_leak" in [f.code for f in leaky.findings]
    assert [f.code for f in sound.findings] == []
