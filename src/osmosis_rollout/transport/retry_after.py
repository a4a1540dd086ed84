"""``Retry-After`` (RFC 9110 section 10.2.3), read the same way by every caller that retries:
the server's TrainGate client, the real-model backend and the mock TrainGate's v2 controller.
Each caps or clamps the result by its own rule; what the header means is decided here once.
"""

from __future__ import annotations

import email.utils
import math
import time

__all__ = ["parse_retry_after"]


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or an HTTP-date; a time in
    the past or a negative number is 0), or None when there is none or it cannot be read
    (``NaN`` included: it is no number of seconds). ``now`` is the clock an HTTP-date is read
    against (``time.time()`` by default)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return None if math.isnan(seconds) else max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)
