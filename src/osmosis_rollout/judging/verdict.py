"""What a judge is asked and what it must answer: the prompt built from a rubric and a
transcript, and the strict parsing of its JSON verdict.

Strict because a judge's reply becomes a reward the trainer optimises: a reply that is not
exactly one score in [0, 1] and one reason per criterion is refused (:class:`VerdictRefused`),
and the client then asks once for a repair before failing the judge. Nothing here is guessed
from prose.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .rubric import Rubric

__all__ = [
    "Cost",
    "CriterionVerdict",
    "Ranking",
    "Verdict",
    "VerdictRefused",
    "parse_ranking",
    "parse_verdict",
    "rank_prompt",
    "score_prompt",
]

#: How much of a transcript the judge is shown (the end is kept: it holds the answer).
MAX_TRANSCRIPT_CHARS = 24_000
_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class Cost:
    """What judging took: wall time, the judge's tokens, and how many calls (2: a repair)."""

    judge_ms: float = 0.0
    prompt_tokens: int = 0
    response_tokens: int = 0
    calls: int = 0

    def plus(self, usage: tuple[int, int]) -> Cost:
        return Cost(
            self.judge_ms,
            self.prompt_tokens + usage[0],
            self.response_tokens + usage[1],
            self.calls + 1,
        )

    def timed(self, ms: float) -> Cost:
        return replace(self, judge_ms=ms)

    def share(self, count: int, index: int) -> Cost:
        """Sample ``index``'s even share of a call judging ``count`` samples together (the
        calls counted once, on the first)."""
        return Cost(
            self.judge_ms / count,
            self.prompt_tokens // count,
            self.response_tokens // count,
            self.calls if index == 0 else 0,
        )


class VerdictRefused(ValueError):
    """The judge's reply is not a verdict for this rubric; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class CriterionVerdict:
    """One criterion's score in [0, 1] and the judge's reason for it."""

    score: float
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judge's verdict on one transcript: ``score`` (the rubric's weighted mean, in [0, 1]),
    each criterion's score and reason, and what the judge cost (time, tokens, calls)."""

    score: float
    criteria: dict[str, CriterionVerdict]
    judge_ms: float = 0.0
    prompt_tokens: int = 0
    response_tokens: int = 0
    calls: int = 1
    #: Judged in a group (``GroupJudge``): the spread of the group's scores.
    spread: float | None = None

    @property
    def reasons(self) -> dict[str, str]:
        """One reason per criterion."""
        return {name: c.reason for name, c in self.criteria.items()}

    @property
    def components(self) -> dict[str, float]:
        """Each criterion's score, for ``reward_components``."""
        return {name: c.score for name, c in self.criteria.items()}

    @property
    def usage(self) -> dict[str, float]:
        """The judge's cost, as the ``judge_*`` metrics of a rollout."""
        usage: dict[str, float] = {
            "judge_ms": round(self.judge_ms, 3),
            "judge_prompt_tokens": self.prompt_tokens,
            "judge_response_tokens": self.response_tokens,
            "judge_calls": self.calls,
        }
        if self.spread is not None:
            usage["judge_group_spread"] = self.spread
        return usage


@dataclass(frozen=True, slots=True)
class Ranking:
    """The verdicts on the samples of one prompt, judged together in one call, in their order;
    ``spread`` is the highest score minus the lowest (0: the judge gave the group no signal)."""

    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return [v.score for v in self.verdicts]

    @property
    def spread(self) -> float:
        scores = self.scores
        return round(max(scores) - min(scores), 6) if scores else 0.0


def with_cost(verdict: Verdict, cost: Cost) -> Verdict:
    """``verdict`` carrying what it cost."""
    return replace(
        verdict,
        judge_ms=cost.judge_ms,
        prompt_tokens=cost.prompt_tokens,
        response_tokens=cost.response_tokens,
        calls=cost.calls,
    )


def repair_request(why: str) -> str:
    """The one follow-up sent after a reply that is not a verdict."""
    return (
        f"That reply is not a valid verdict: {why}. Reply again with only the JSON object, "
        "in the shape asked for."
    )


def transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """The transcript as the judge reads it: one ``[role]`` block per message, bounded."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        text = "" if content is None else str(content)
        calls = message.get("tool_calls")
        if calls:
            text += "\n(tool calls: " + json.dumps(calls, default=str)[:2000] + ")"
        parts.append(f"[{message.get('role', '?')}]\n{text}")
    joined = "\n\n".join(parts)
    if len(joined) > MAX_TRANSCRIPT_CHARS:
        joined = "[...earlier messages cut...]\n" + joined[-MAX_TRANSCRIPT_CHARS:]
    return joined


def _rubric_text(rubric: Rubric) -> str:
    lines = [f"- {c.name} (weight {c.weight:g}): {c.description}" for c in rubric.criteria]
    text = "Criteria:\n" + "\n".join(lines)
    if rubric.instructions:
        text = rubric.instructions.strip() + "\n\n" + text
    if rubric.reference is not None:
        text += f"\n\nReference answer:\n{rubric.reference}"
    return text


_SYSTEM = (
    "You are a strict grader. Score the transcript on each criterion from 0.0 (not met) to 1.0 "
    "(fully met). An empty or evasive answer meets no criterion. Reply with one JSON object "
    "and nothing else."
)


def score_prompt(rubric: Rubric, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The judge's messages for one transcript."""
    shape = {"criteria": [{"name": n, "score": 0.0, "reason": "..."} for n in rubric.names]}
    user = (
        f"{_rubric_text(rubric)}\n\nTranscript:\n{transcript(messages)}\n\n"
        f"Answer with exactly this JSON shape, one entry per criterion:\n{json.dumps(shape)}"
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def rank_prompt(
    rubric: Rubric, samples: Sequence[Sequence[Mapping[str, Any]]]
) -> list[dict[str, str]]:
    """The judge's messages for the samples of one prompt, judged side by side."""
    entry = {"criteria": [{"name": n, "score": 0.0, "reason": "..."} for n in rubric.names]}
    shape = {"samples": [{"sample": k, **entry} for k in range(1, len(samples) + 1)]}
    blocks = "\n\n".join(f"=== Sample {k} ===\n{transcript(s)}" for k, s in enumerate(samples, 1))
    user = (
        f"{_rubric_text(rubric)}\n\nThese {len(samples)} samples answer the same prompt. Compare "
        f"them: a better sample must score higher.\n\n{blocks}\n\n"
        f"Answer with exactly this JSON shape, one entry per sample:\n{json.dumps(shape)}"
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def _json_object(text: str) -> dict[str, Any]:
    """The reply as one JSON object; a single ```json fence around it is allowed."""
    body = text.strip()
    if body.startswith("```"):
        first, _, rest = body.partition("\n")
        if first.strip() not in ("```", "```json") or not rest.rstrip().endswith("```"):
            raise VerdictRefused("the reply is not one JSON object")
        body = rest.rstrip()[:-3].strip()
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise VerdictRefused(f"the reply is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise VerdictRefused(f"the reply is JSON but not an object ({type(data).__name__})")
    return data


def _criteria(rubric: Rubric, raw: object, where: str) -> dict[str, CriterionVerdict]:
    if not isinstance(raw, list):
        raise VerdictRefused(f"{where}'criteria' must be a list")
    found: dict[str, CriterionVerdict] = {}
    for item in raw:
        if not isinstance(item, dict):
            raise VerdictRefused(f"{where}each criterion must be an object")
        name, score, reason = item.get("name"), item.get("score"), item.get("reason")
        if not isinstance(name, str) or name not in rubric.names:
            raise VerdictRefused(f"{where}unknown criterion {name!r}; the rubric's: {rubric.names}")
        if name in found:
            raise VerdictRefused(f"{where}criterion {name!r} scored twice")
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise VerdictRefused(f"{where}criterion {name!r}: score must be a number")
        if not math.isfinite(score) or not 0.0 <= score <= 1.0:
            raise VerdictRefused(f"{where}criterion {name!r}: score {score!r} is not in [0, 1]")
        if not isinstance(reason, str) or not reason.strip():
            raise VerdictRefused(f"{where}criterion {name!r}: give a reason")
        found[name] = CriterionVerdict(float(score), reason.strip()[:_REASON_CHARS])
    missing = [n for n in rubric.names if n not in found]
    if missing:
        raise VerdictRefused(f"{where}no score for {missing}")
    return {n: found[n] for n in rubric.names}


def parse_verdict(rubric: Rubric, text: str) -> Verdict:
    """The verdict in a judge's reply, or :class:`VerdictRefused` saying why there is none."""
    criteria = _criteria(rubric, _json_object(text).get("criteria"), "")
    score = rubric.weighted({n: c.score for n, c in criteria.items()})
    return Verdict(score=round(score, 6), criteria=criteria)


def parse_ranking(rubric: Rubric, text: str, count: int) -> Ranking:
    """The verdicts on ``count`` samples in a judge's reply (each sample once, numbered from 1)."""
    raw = _json_object(text).get("samples")
    if not isinstance(raw, list) or len(raw) != count:
        raise VerdictRefused(f"'samples' must be a list of {count} entries")
    by_number: dict[int, Verdict] = {}
    for item in raw:
        number = item.get("sample") if isinstance(item, dict) else None
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
            raise VerdictRefused(f"each entry needs a 'sample' number from 1 to {count}")
        if number in by_number:
            raise VerdictRefused(f"sample {number} judged twice")
        criteria = _criteria(rubric, item.get("criteria"), f"sample {number}: ")
        score = rubric.weighted({n: c.score for n, c in criteria.items()})
        by_number[number] = Verdict(score=round(score, 6), criteria=criteria)
    return Ranking([by_number[k] for k in range(1, count + 1)])
