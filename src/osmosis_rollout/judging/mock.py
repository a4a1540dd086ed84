"""``MockJudge``: a deterministic judge from the rubric and the reference, no model needed.

So tests and CI exercise the whole judged path offline. Its rule, simple enough to predict: the
answer is the last assistant message's text; an empty answer scores 0 on every criterion; with a
reference answer, each criterion scores the share of the reference's words the answer contains;
without one, the share of the criterion's own key words (longer than three letters) it
contains. ``fixed`` makes it score everything the same (a leaky judge, for tests of
``osmosis validate --reward``); ``fail`` makes every call a judge failure of that kind.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import JudgeError
from .rubric import Rubric
from .verdict import (
    Cost,
    CriterionVerdict,
    Ranking,
    Verdict,
    rank_prompt,
    score_prompt,
    with_cost,
)

__all__ = ["MockJudge", "answer_of"]

_WORD = re.compile(r"[^\W_]+")


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def _tokens(value: object) -> int:
    """The mock's token count: about four characters a token, as the mock LLM counts."""
    return max(1, len(json.dumps(value, sort_keys=True, default=str)) // 4)


def answer_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The last assistant message's text ("" when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            return "" if content is None else str(content)
    return ""


class MockJudge:
    """The built-in judge of ``url = "mock"``: same API as :class:`~.client.Judge`."""

    def __init__(self, *, fixed: float | None = None, fail: str | None = None) -> None:
        if fixed is not None and not 0.0 <= fixed <= 1.0:
            raise ValueError("fixed must be in [0, 1]")
        if fail is not None and fail not in ("timeout", "http", "verdict"):
            raise ValueError("fail is one of timeout, http, verdict")
        self.fixed = fixed
        self.fail = fail
        self.requests = 0

    def __repr__(self) -> str:
        return "MockJudge()"

    async def score(
        self,
        rubric: Rubric,
        messages: Sequence[Mapping[str, Any]],
        *,
        reference: object = None,
    ) -> Verdict:
        """The mock's verdict on one transcript (see the module's rule)."""
        started = time.perf_counter()
        if reference is not None:
            rubric = rubric.with_reference(reference)
        self._maybe_fail()
        verdict = self._verdict(rubric, answer_of(messages))
        return with_cost(verdict, self._cost(score_prompt(rubric, messages), verdict, started))

    async def rank(
        self,
        rubric: Rubric,
        samples: Sequence[Sequence[Mapping[str, Any]]],
        *,
        reference: object = None,
    ) -> Ranking:
        """Each sample's mock verdict, as one call."""
        if not samples:
            return Ranking([])
        started = time.perf_counter()
        if reference is not None:
            rubric = rubric.with_reference(reference)
        self._maybe_fail()
        verdicts = [self._verdict(rubric, answer_of(s)) for s in samples]
        cost = self._cost(rank_prompt(rubric, samples), verdicts, started)
        return Ranking([with_cost(v, cost.share(len(samples), i)) for i, v in enumerate(verdicts)])

    async def aclose(self) -> None:
        """Nothing to release."""

    def _maybe_fail(self) -> None:
        self.requests += 1
        if self.fail == "timeout":
            raise JudgeError("the judge did not answer within its deadline (mock)", kind="timeout")
        if self.fail == "http":
            raise JudgeError("the judge answered HTTP 503 (mock)", kind="http")
        if self.fail == "verdict":
            raise JudgeError(
                "the judge's reply is not a verdict, even after a repair request (mock)",
                kind="verdict",
            )

    def _verdict(self, rubric: Rubric, answer: str) -> Verdict:
        said = _words(answer)
        criteria: dict[str, CriterionVerdict] = {}
        for criterion in rubric.criteria:
            if self.fixed is not None:
                score, reason = self.fixed, f"fixed score {self.fixed:g} (mock)"
            elif not said:
                score, reason = 0.0, "no answer"
            else:
                source = rubric.reference
                wanted = (
                    _words(source)
                    if source is not None
                    else {w for w in _words(criterion.description) if len(w) > 3}
                )
                hit = len(wanted & said)
                score = round(hit / len(wanted), 4) if wanted else 1.0
                what = "reference" if source is not None else "key"
                reason = f"{hit} of {len(wanted)} {what} words present"
            criteria[criterion.name] = CriterionVerdict(score, reason)
        total = rubric.weighted({n: c.score for n, c in criteria.items()})
        return Verdict(score=round(total, 6), criteria=criteria)

    @staticmethod
    def _cost(prompt: object, verdict: Verdict | list[Verdict], started: float) -> Cost:
        shape = verdict if isinstance(verdict, list) else [verdict]
        reply = [{n: c.score for n, c in v.criteria.items()} for v in shape]
        return Cost((time.perf_counter() - started) * 1000, _tokens(prompt), _tokens(reply), 1)
