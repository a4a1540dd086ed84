"""The ``--output x.json`` shape: the original SDK's one JSON object, with our fields beside.

The legacy ``osmosis test -o results.json`` wrote ``{"summary": {...}, "results": [...]}``, and
scripts read it with ``json.load``. The same object is written here, each legacy key with its
meaning (``row_index`` counts from 0, ``duration_ms``, ``token_usage``...), next to every field
of our JSON Lines rows and summary (``row`` counts from 1), so a reader of either finds its keys.
"""

from __future__ import annotations

from typing import Any

__all__ = ["legacy_results"]


def legacy_results(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole results file for ``summary`` and the rows (``RowResult.as_dict()``)."""
    results = [_legacy_row(row) for row in rows]
    tokens = sum(r["token_usage"]["total_tokens"] for r in results)
    head = {
        "total": summary["rows"],
        "passed": summary["passed"],
        "failed": summary["failed"],
        "total_duration_ms": round(float(summary["wall_s"]) * 1000, 3),
        "total_tokens": tokens,
    }
    rest = {k: v for k, v in summary.items() if k != "type" and k not in head}
    return {"summary": {**head, **rest}, "results": results}


def _legacy_row(row: dict[str, Any]) -> dict[str, Any]:
    prompt, response = int(row["prompt_tokens"]), int(row["response_tokens"])
    head = {
        "row_index": int(row["row"]) - 1,
        "success": bool(row["passed"]),
        "error": row["error_message"],
        "duration_ms": row["latency_ms"],
        "token_usage": {
            "prompt_tokens": prompt,
            "completion_tokens": response,
            "total_tokens": prompt + response,
            "num_llm_calls": row["turns"],
        },
        "reward": row["reward"],
        "finish_reason": row["finish_reason"],
    }
    return {**head, **{k: v for k, v in row.items() if k != "type" and k not in head}}
