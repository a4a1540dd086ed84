"""The reward: how well a final answer matches the row's ``ground_truth``."""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(answer: str | None, ground_truth: object) -> float | None:
    """1.0 when the last number in ``answer`` equals ``ground_truth``, else 0.0.

    None when the row has no ground truth: TrainGate then gets no reward rather than a wrong one.
    """
    if ground_truth is None:
        return None
    numbers = _NUMBER.findall(answer or "")
    if not numbers:
        return 0.0
    try:
        expected = float(str(ground_truth))
    except ValueError:
        return 0.0
    return 1.0 if math.isclose(float(numbers[-1]), expected, abs_tol=1e-6) else 0.0
