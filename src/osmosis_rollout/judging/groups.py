"""Group-relative judging: the samples of one prompt ranked together, in one judge call.

A judge that sees one sample at a time scores on an absolute scale it keeps badly; side by side
it separates a better answer from a worse one, which is what a group-relative trainer (GRPO)
needs. ``GroupJudge.score`` is called from each sample's ``grade()`` with its rollout's
metadata: samples sharing a ``group_id`` (``osmosis test --samples N`` sends ``group_id`` and
``group_size``; a trainer may send the same keys) wait for each other, the last to arrive makes
one ``rank`` call, and each gets its own verdict, carrying the group's ``spread``. A group that
does not fill up within ``wait_s`` (a sibling failed before grading) is ranked as it is; a
rollout without a group is scored alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio

from .rubric import Rubric
from .verdict import Ranking, Verdict

__all__ = ["GROUP_ID", "GROUP_SIZE", "GroupJudge"]

#: The metadata keys naming a rollout's group and how many samples it has.
GROUP_ID = "group_id"
GROUP_SIZE = "group_size"
#: The largest group ranked in one call: a judge's context holds every sample.
MAX_GROUP = 16


class _Judges(Protocol):
    async def score(
        self, rubric: Rubric, messages: Sequence[Mapping[str, Any]], *, reference: object = ...
    ) -> Verdict: ...

    async def rank(
        self,
        rubric: Rubric,
        samples: Sequence[Sequence[Mapping[str, Any]]],
        *,
        reference: object = ...,
    ) -> Ranking: ...


@dataclass
class _Group:
    size: int
    samples: list[Sequence[Mapping[str, Any]]] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)
    closed: bool = False
    ranking: Ranking | None = None
    error: BaseException | None = None


class GroupJudge:
    """Ranks each group's samples together with ``judge`` (a ``Judge`` or ``MockJudge``)."""

    def __init__(self, judge: _Judges, rubric: Rubric, *, wait_s: float = 30.0) -> None:
        self.judge = judge
        self.rubric = rubric
        self.wait_s = wait_s
        self._groups: dict[str, _Group] = {}
        #: The spread of each group ranked so far, by group id (the last ``MAX_GROUP * 64``).
        self.spreads: dict[str, float] = {}

    async def score(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        metadata: Mapping[str, Any],
        reference: object = None,
    ) -> Verdict:
        """This sample's verdict, judged beside its group's other samples."""
        key, size = metadata.get(GROUP_ID), metadata.get(GROUP_SIZE)
        if not isinstance(key, str) or not isinstance(size, int) or isinstance(size, bool):
            return await self.judge.score(self.rubric, messages, reference=reference)
        size = max(1, min(size, MAX_GROUP))
        group = self._groups.get(key)
        if group is None or group.closed:
            group = self._groups[key] = _Group(size)
        position = len(group.samples)
        group.samples.append(messages)
        if len(group.samples) >= group.size:
            await self._rank(key, group, reference)
        else:
            with anyio.move_on_after(self.wait_s):
                await group.done.wait()
            if not group.done.is_set() and not group.closed:
                await self._rank(key, group, reference)  # a sibling never came: rank who did
            await group.done.wait()
        if group.error is not None:
            raise group.error
        assert group.ranking is not None
        verdict = group.ranking.verdicts[position]
        return replace(verdict, spread=group.ranking.spread)

    async def _rank(self, key: str, group: _Group, reference: object) -> None:
        group.closed = True
        if self._groups.get(key) is group:
            del self._groups[key]
        try:
            group.ranking = await self.judge.rank(
                self.rubric, list(group.samples), reference=reference
            )
            self.spreads[key] = group.ranking.spread
            while len(self.spreads) > MAX_GROUP * 64:
                self.spreads.pop(next(iter(self.spreads)))
        except BaseException as exc:  # every sample of the group fails as the call did
            group.error = exc
            raise
        finally:
            group.done.set()
