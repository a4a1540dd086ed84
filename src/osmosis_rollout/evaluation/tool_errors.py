"""Tool errors as results: each tool's calls and failures over a run, and their findings.

A tool that raises or times out hands the model an ``"Error: ..."`` message and the rollout
goes on, so a run whose every tool call failed could pass. The context counts each tool's
calls, errors and timeouts (``tool_counts`` in the metrics), and among the errors the calls
whose function refused arguments the declared schema allows (``tool_schema_errors``: the
agent's schema and function disagree; a model's own bad arguments are not errors of the tool);
here they are added up per tool for the summary, and turned into run findings:
``tool_always_fails`` (every call of a tool failed) and ``tool_error_share`` (more than
``share`` of its calls did). With ``--fail-on tool_errors`` each row with a failed tool call
also gets a ``tool_errors`` finding, so it fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..endpoint.tool_history import call_name, content_text, reads_as_error
from ..findings import TOOL_ALWAYS_FAILS, TOOL_ERROR_SHARE, TOOL_ERRORS
from ..testing.records import Finding

if TYPE_CHECKING:
    from .runner import RowResult

__all__ = [
    "DEFAULT_SHARE",
    "by_tool",
    "fail_on_tool_errors",
    "run_findings",
]

#: A tool failing in more than this share of its calls is a finding (``--tool-error-share``).
DEFAULT_SHARE = 0.2


def by_tool(rows: Iterable[RowResult]) -> dict[str, dict[str, int]]:
    """``{tool: {"calls", "errors", "timeouts", "schema_errors"}}`` over ``rows``, in the order
    tools appeared, with ``read_errors`` too when some errors were read from the results a
    rollout's later turns carried (a harness, a server we did not write), not raised."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        schema_errors = row.tool_schema_errors
        read = row.tool_calls_from_history >= sum(c[0] for c in row.tool_counts.values())
        for name, (calls, errors, timeouts) in row.tool_counts.items():
            total = totals.setdefault(
                name, {"calls": 0, "errors": 0, "timeouts": 0, "schema_errors": 0}
            )
            total["calls"] += calls
            total["errors"] += errors
            total["timeouts"] += timeouts
            total["schema_errors"] += min(schema_errors.get(name, 0), errors)
            if read and errors:
                total["read_errors"] = total.get("read_errors", 0) + errors
    return totals


#: How much of a tool's first error message a finding quotes.
_QUOTED_CHARS = 240


def first_errors(rows: Iterable[RowResult]) -> dict[str, str]:
    """Each tool's first error message, as the model read it in a row's final messages (a
    tool message that reads as an error, matched to its call by id): the finding quotes it, so
    the fix needs no second run with ``--output`` or ``--debug-dir``."""
    found: dict[str, str] = {}
    for row in rows:
        names: dict[str, str] = {}
        for message in row.final_messages:
            for call in message.get("tool_calls") or ():
                name = call_name(call)
                if name is not None and isinstance(call.get("id"), str):
                    names[call["id"]] = name
            if message.get("role") != "tool" or not reads_as_error(message.get("content")):
                continue
            name = names.get(str(message.get("tool_call_id")))
            if name is not None and name not in found:
                found[name] = _text_of(message.get("content"))
    return found


def _text_of(content: Any) -> str:
    text = " ".join((content_text(content) or "").split())
    return text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 3] + "..."


def run_findings(
    totals: dict[str, dict[str, int]],
    share: float = DEFAULT_SHARE,
    examples: dict[str, str] | None = None,
) -> list[Finding]:
    """The findings about the run's tools: one per tool that always or often failed, quoting
    its first error message when ``examples`` has it."""
    findings = []
    for name, t in totals.items():
        calls, errors, timeouts = t["calls"], t["errors"], t["timeouts"]
        schema = t.get("schema_errors", 0)
        if not calls or not errors:
            continue
        how = _how(errors, timeouts, schema, t.get("read_errors", 0))
        details = {"tool": name, "calls": calls, "errors": errors, "timeouts": timeouts}
        if schema:
            details["schema_errors"] = schema
        fix = _SCHEMA_FIX if schema else ""
        example = (examples or {}).get(name)
        quoted = f'; the first: "{example}"' if example else ""
        if example:
            details["first_error"] = example
        if errors == calls:
            findings.append(
                Finding(
                    TOOL_ALWAYS_FAILS,
                    f"tool {name!r} failed in every one of its {calls} call(s) ({how}{quoted}): "
                    "the model only ever saw its error message; "
                    + (fix or "see the rows' tool_errors and ")
                    + ("; " if fix else "")
                    + "rerun with --debug-dir DIR to read each error",
                    details=details,
                )
            )
        elif errors / calls > share:
            findings.append(
                Finding(
                    TOOL_ERROR_SHARE,
                    f"tool {name!r} failed in {errors} of its {calls} calls "
                    f"({errors / calls:.0%}, over {share:.0%}; {how}{quoted})"
                    + (f"; {fix}" if fix else ""),
                    details=details,
                )
            )
    return findings


#: What to do about calls whose function refused arguments its declared schema allows.
_SCHEMA_FIX = (
    "the schema get_tools() declares for it and the function that runs it disagree on its "
    "parameters, so no model can call it right: return toolbox.schemas from get_tools() (or "
    "make the function take the declared parameters); osmosis validate names each one"
)


def fail_on_tool_errors(row: RowResult) -> None:
    """``--fail-on tool_errors``: a row with a failed tool call gets a finding (and fails)."""
    errors = row.tool_errors
    if not errors:
        return
    listed = ", ".join(f"{name} x{count}" for name, count in errors.items())
    schema = sum(row.tool_schema_errors.values())
    refused = (
        f" ({schema} of them refused by a function that disagrees with its declared schema)"
        if schema
        else ""
    )
    row.findings.append(
        Finding(
            TOOL_ERRORS,
            f"{sum(errors.values())} tool call(s) raised or timed out{refused}: {listed}",
            row.rollout_id,
            details={"tool_errors": errors},
        )
    )


def summary_part(rows: Sequence[RowResult], share: float) -> dict[str, Any]:
    """What the summary says of tools: per tool counts and the run findings."""
    totals = by_tool(rows)
    return {
        "tools": totals,
        "run_findings": [f.as_dict() for f in run_findings(totals, share, first_errors(rows))],
    }


def _how(errors: int, timeouts: int, schema: int = 0, read: int = 0) -> str:
    if schema == errors:
        return "its function refused arguments its declared schema allows"
    if timeouts == errors:
        return "timed out"
    if read == errors:
        return "its results read as errors"
    if not timeouts and not schema and not read:
        return "raised"
    parts = [
        f"{count} {what}"
        for count, what in (
            (errors - timeouts - schema - read, "raised"),
            (timeouts, "timed out"),
            (schema, "refused by its function though its declared schema allows them"),
            (read, "with results that read as errors"),
        )
        if count
    ]
    return ", ".join(parts)
