"""The findings table: every finding code the toolkit reports, once, with what it means.

A finding is a named thing a check saw that a trainer depends on not happening (the mock
TrainGate's protocol checks, the rollout's OpenAI-compatible endpoint, ``osmosis test``'s run
checks, a replay, ``--token-check``, ``osmosis validate --reward``). Its code is stable: it
appears in results files, traces, ``--json`` and scripts. Each code is a constant here and one
:class:`FindingKind` in :data:`FINDINGS` (its wires, whether it makes a run untrainable, its
``osmosis validate`` problem code, a one-line meaning and fix), so the checks that raise it, the
``trainable`` verdict, the dry run's problem codes and the docs' lists read one definition, and
a misspelt code is an import error, not a silent new finding.

A leaf: it imports nothing of ours, so every layer (the endpoint, the mock TrainGate, the
evaluation engine, the validator) may import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ANY_WIRE",
    "FINDINGS",
    "POLLING",
    "WIRES",
    "FindingKind",
    "Reporter",
    "for_wire",
    "kind_of",
    "render_markdown",
]

#: The wires a finding can apply to: protocol v1, protocol v2 and the polling wire (issue 35,
#: whose server and mock land separately: its findings are here so its checks only raise them).
V1: Final = "v1"
V2: Final = "v2"
POLLING: Final = "polling"
WIRES: Final = (V1, V2, POLLING)
#: A rule of every wire (the append-only history, the tools called, one result...).
ANY_WIRE: Final = frozenset(WIRES)

#: What reports a finding: the mock TrainGate's protocol checks, the rollout's OpenAI-compatible
#: endpoint (``endpoint.session``), ``osmosis test``'s run checks (tool errors, stalls),
#: ``--replay``, ``--token-check``, ``osmosis validate --reward``.
Reporter = Literal["traingate", "endpoint", "test", "replay", "token_check", "reward_check"]

# -- the codes ---------------------------------------------------------------------------------
# The mock TrainGate, on every wire.
UNKNOWN_ROLLOUT: Final = "unknown_rollout"
BAD_API_KEY: Final = "bad_api_key"
HISTORY_REWRITTEN: Final = "history_rewritten"
DUPLICATE_COMPLETION: Final = "duplicate_completion"
NO_COMPLETION: Final = "no_completion"
UNKNOWN_TOOL: Final = "unknown_tool"
MALFORMED_REQUEST: Final = "malformed_request"
CHAT_AFTER_COMPLETION: Final = "chat_after_completion"
TRUNCATED_REPLY: Final = "truncated_reply"
TOOL_CALL_IN_TEXT: Final = "tool_call_in_text"
# The mock TrainGate, protocol v1 only.
TOOLS_SENT: Final = "tools_sent"
# The mock TrainGate, protocol v2 (and the polling wire where it says so).
TOOLS_NOT_SENT: Final = "tools_not_sent"
BODY_ID_MISMATCH: Final = "body_id_mismatch"
CALLBACK_KEY_IN_CHAT: Final = "callback_key_in_chat"
MISSING_GRADER_CALLBACK: Final = "missing_grader_callback"
GRADER_BEFORE_COMPLETION: Final = "grader_before_completion"
DUPLICATE_GRADER: Final = "duplicate_grader"
REWARD_ON_FAILURE: Final = "reward_on_failure"
NON_TERMINAL_STATUS: Final = "non_terminal_status"
STATUS_WRONG: Final = "status_wrong"
CANCEL_WRONG: Final = "cancel_wrong"
# osmosis test's run-level view of a server it did not write (``evaluation.server_support``).
STATUS_UNSUPPORTED: Final = "status_unsupported"
CANCEL_UNSUPPORTED: Final = "cancel_unsupported"
INIT_WITHOUT_KEY: Final = "init_without_key"
INIT_WITHOUT_ID: Final = "init_without_id"
# osmosis test's conformance probes of a server it did not write (``evaluation.conformance``).
ERROR_ECHOES_SECRETS: Final = "error_echoes_secrets"
BAD_INPUT_SERVER_ERROR: Final = "bad_input_server_error"
DUPLICATE_ROLLOUT_RUN_TWICE: Final = "duplicate_rollout_run_twice"
# The mock TrainGate, the polling wire.
LEASE_IGNORED: Final = "lease_ignored"
RESULT_CHANGED_AFTER_FINISH: Final = "result_changed_after_finish"
RESULT_LOST_AFTER_FINISH: Final = "result_lost_after_finish"
WRONG_LEASE_ACCEPTED: Final = "wrong_lease_accepted"
STATUS_REGRESSED: Final = "status_regressed"
# The rollout's OpenAI-compatible endpoint.
TOOLS_CHANGED: Final = "tools_changed"
TOOL_CHOICE_DROPPED: Final = "tool_choice_dropped"
PARALLEL_CALLS: Final = "parallel_calls"
N_GREATER_THAN_ONE: Final = "n_greater_than_one"
CALL_AFTER_COMPLETION: Final = "call_after_completion"
# osmosis test's run checks.
TOOL_ERRORS: Final = "tool_errors"
TOOL_ALWAYS_FAILS: Final = "tool_always_fails"
TOOL_ERROR_SHARE: Final = "tool_error_share"
EVENT_LOOP_STALL: Final = "event_loop_stall"
REPLAY_DIVERGED: Final = "replay_diverged"
TOKEN_DRIFT: Final = "token_drift"
# osmosis validate --reward.
REWARD_LEAK: Final = "reward_leak"
REWARD_CONSTANT: Final = "reward_constant"
REWARD_OUT_OF_RANGE: Final = "reward_out_of_range"
REWARD_NOT_FINITE: Final = "reward_not_finite"
GOLD_FAILS: Final = "gold_fails"


@dataclass(frozen=True, slots=True)
class FindingKind:
    """One finding code and what it means: the table's row."""

    code: str
    #: The wires on which it can be reported (:data:`ANY_WIRE` for a rule of every wire).
    wires: frozenset[str]
    reporter: Reporter
    #: Whether a run with it is not trainable as it is (``osmosis test``'s ``trainable: no``).
    untrainable: bool
    #: The ``osmosis validate`` problem code its dry run reports it as, if the dry run can see it.
    problem: str | None
    #: The page (from the repository's root) that explains it beside its neighbours.
    doc: str
    #: What happened, in one line.
    meaning: str
    #: What to do about it, in one line.
    fix: str

    def applies_to(self, wire: str) -> bool:
        """Whether ``wire`` (``"v1"``, ``"v2"``...) can report it."""
        return wire in self.wires


_ENDPOINT_DOC: Final = "docs/bring-your-own-agent.md"
_EVALUATING: Final = "docs/evaluating.md"
_REAL_MODELS: Final = "docs/real-models.md"
_FINDINGS_DOC: Final = "docs/findings.md"
_V1_V2: Final = frozenset({V1, V2})
_PROTOCOL: Final = "DRY_RUN_PROTOCOL"


def _kind(
    code: str,
    *,
    reporter: Reporter,
    meaning: str,
    fix: str,
    wires: Iterable[str] = ANY_WIRE,
    untrainable: bool = False,
    problem: str | None = None,
    doc: str = _FINDINGS_DOC,
) -> FindingKind:
    return FindingKind(code, frozenset(wires), reporter, untrainable, problem, doc, meaning, fix)


#: Every finding, once; grouped as the docs list them.
FINDINGS: Final[tuple[FindingKind, ...]] = (
    # -- the mock TrainGate, every wire
    _kind(
        HISTORY_REWRITTEN,
        reporter="traingate",
        untrainable=True,
        problem="DRY_RUN_HISTORY_REWRITTEN",
        meaning="a chat call's messages are not the previous call's messages plus its reply, "
        "unchanged (trimmed, summarised, reordered)",
        fix="append each reply and tool result to the same list and send all of it; never edit, "
        "drop or reorder earlier messages",
    ),
    _kind(
        NO_COMPLETION,
        reporter="traingate",
        untrainable=True,
        problem="DRY_RUN_TIMEOUT",
        meaning="no completion callback arrived within the rollout's timeout",
        fix="make sure run() returns (or calls ctx.complete) before its deadline",
    ),
    _kind(
        DUPLICATE_COMPLETION,
        reporter="traingate",
        untrainable=True,
        problem="DRY_RUN_DUPLICATE_RESULT",
        meaning="a second completion callback arrived for the rollout",
        fix="a rollout must send exactly one result",
    ),
    _kind(
        BAD_API_KEY,
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a chat call or callback came without the rollout's key (v2: the llm_api_key on "
        "chat calls, the controller_api_key on callbacks)",
        fix="send each call with the key the init gave for it",
    ),
    _kind(
        UNKNOWN_TOOL,
        reporter="traingate",
        untrainable=True,
        problem="DRY_RUN_UNKNOWN_TOOL",
        meaning="the result's messages call a tool that was never declared",
        fix="only call tools returned by get_tools(), or add the tool there",
    ),
    _kind(
        UNKNOWN_ROLLOUT,
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a chat call or callback named a rollout the TrainGate never started",
        fix="send the rollout_id of the init each call belongs to",
    ),
    _kind(
        MALFORMED_REQUEST,
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a chat call or callback body that does not parse as the protocol's (answered "
        "422); the message names the field",
        fix="send bodies in the protocol's schema",
    ),
    _kind(
        TOOLS_SENT,
        wires=(V1,),
        reporter="traingate",
        untrainable=True,
        problem=_PROTOCOL,
        meaning="a protocol v1 chat call carried `tools`, which TrainGate knows from the init",
        fix="declare the tools in get_tools() and leave them out of each chat call",
    ),
    _kind(
        CHAT_AFTER_COMPLETION,
        reporter="traingate",
        untrainable=True,
        problem=_PROTOCOL,
        meaning="a chat call arrived after the rollout's completion callback",
        fix="stop calling the model once the rollout has completed",
    ),
    _kind(
        TRUNCATED_REPLY,
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="the last reply was cut by max_tokens (finish_reason `length`) and the rollout "
        "ended on it",
        fix="raise --max-tokens, or make the agent check result.finish_reason",
    ),
    _kind(
        TOOL_CALL_IN_TEXT,
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a reply wrote a tool call as text, which nothing parsed or ran",
        fix="serve the model with its tool-call parser (the message says which), or parse such "
        "text in the agent and answer it with a tool message",
    ),
    # -- the mock TrainGate, protocol v2 (and the polling wire)
    _kind(
        TOOLS_NOT_SENT,
        wires=(V2, POLLING),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a chat call without `tools` although the agent declares some: on v2 the model "
        "only knows the tools each call carries",
        fix="send the agent's tools with every chat call",
    ),
    _kind(
        CALLBACK_KEY_IN_CHAT,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a chat call carried the callback key (`controller_api_key`)",
        fix="give the agent only the LLM key; the callback key stays in the server",
    ),
    _kind(
        BODY_ID_MISMATCH,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a body (callback, chat call or the 202) names another `rollout_id` than the URL "
        "it was sent to (answered 422)",
        fix="send each body to its own rollout's URL",
    ),
    _kind(
        MISSING_GRADER_CALLBACK,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="no grader callback by the deadline (agent + grader timeouts + 60 s); the "
        "rollout was then cancelled",
        fix="send the grader callback after every completion callback, a failure included",
    ),
    _kind(
        GRADER_BEFORE_COMPLETION,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="the grader callback came before the completion callback",
        fix="send the completion callback first, then the grader's",
    ),
    _kind(
        DUPLICATE_GRADER,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a second grader callback for the rollout",
        fix="send exactly one grader callback per rollout",
    ),
    _kind(
        REWARD_ON_FAILURE,
        wires=(V2, POLLING),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a reward sent with a failure, a removed sample or a failed agent phase",
        fix="send a reward only with a successful, kept sample",
    ),
    _kind(
        NON_TERMINAL_STATUS,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="`GET /rollout/{id}/status` still said `queued`, `running` or `grading` after the "
        "grader callback",
        fix="record the outcome before sending the grader callback",
    ),
    _kind(
        STATUS_WRONG,
        wires=(V2,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="the status answer (or its reward) differs from what the grader callback said, "
        "or the server forgot the rollout",
        fix="answer a finished rollout's status from the outcome its grader callback sent",
    ),
    _kind(
        CANCEL_WRONG,
        wires=(V2, POLLING),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="`POST /rollout/cancel` gave no known disposition for the id, or `not_found` for "
        "a rollout that never ended",
        fix="answer every id with cancelled_queued, cancelled_running or not_found, and keep a "
        "rollout known until it ends",
    ),
    _kind(
        STATUS_UNSUPPORTED,
        wires=(V2,),
        reporter="test",
        meaning="the status route answered `unknown` for finished rollouts (one finding for the "
        "run): a trainer that missed a callback cannot learn the outcome",
        fix="keep each rollout's outcome for `GET /rollout/{id}/status`; `--strict` fails the rows",
    ),
    _kind(
        CANCEL_UNSUPPORTED,
        wires=(V2,),
        reporter="test",
        meaning="`POST /rollout/cancel` answered no disposition (one finding for the run): a "
        "cancel at a deadline leaves the rollout running, holding its slot",
        fix="cancel the rollouts named and answer a disposition for each; `--strict` fails the "
        "rows",
    ),
    _kind(
        INIT_WITHOUT_KEY,
        wires=(V2, POLLING),
        reporter="test",
        meaning="the server started a rollout for a `POST /rollout` without a key (one finding "
        "for the run): whoever reaches its port can start rollouts and spend the model",
        fix="require a server key on every route (docs/protocol-v2.md: the server key)",
    ),
    _kind(
        INIT_WITHOUT_ID,
        wires=(V2, POLLING),
        reporter="test",
        meaning="the `202` of `POST /rollout` carries no `rollout_id` (one finding for the run): "
        "a rollout whose id the server invents cannot be named for status or cancel",
        fix='answer `202 {"rollout_id": ...}` (docs/protocol-v2.md: an invented id)',
    ),
    _kind(
        ERROR_ECHOES_SECRETS,
        wires=(V2, POLLING),
        reporter="test",
        meaning="a conformance probe: a malformed `POST /rollout` was answered with a key it "
        "carried (one finding for the run): the keys reach the controller's logs",
        fix="answer a 4xx naming the wrong fields, never echoing a value (docs/protocol-v2.md: "
        "D3); `--strict` fails the run",
    ),
    _kind(
        BAD_INPUT_SERVER_ERROR,
        wires=(V2, POLLING),
        reporter="test",
        meaning="a conformance probe: a `NaN` or negative timeout in `POST /rollout` was "
        "answered 5xx (one finding for the run): a controller retries a hopeless body",
        fix="refuse a bad field with a 4xx naming it, a non-finite number included "
        "(docs/protocol-v2.md: D4); `--strict` fails the run",
    ),
    _kind(
        DUPLICATE_ROLLOUT_RUN_TWICE,
        wires=(V2, POLLING),
        reporter="test",
        meaning="a conformance probe: a repeated `POST /rollout` of a finished rollout's id was "
        "accepted and run again (one finding for the run): a resent init runs twice",
        fix="answer a known rollout_id with the first 202 (the same body) or a 409, and start "
        "nothing (docs/protocol-v2.md: D6); `--strict` fails the run",
    ),
    # -- the mock TrainGate, the polling wire
    _kind(
        LEASE_IGNORED,
        wires=(POLLING,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a rollout went on after its polling lease ran out (the controller stopped "
        "polling)",
        fix="cancel a rollout when its lease expires, and free its slot",
    ),
    _kind(
        RESULT_CHANGED_AFTER_FINISH,
        wires=(POLLING,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a repeated result poll of a finished rollout answered a different result",
        fix="answer a finished rollout's result as it was first answered, until its retention ends",
    ),
    _kind(
        RESULT_LOST_AFTER_FINISH,
        wires=(POLLING,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a finished rollout's result could not be read again within its retention",
        fix="keep a finished result readable until it is read and its retention ends",
    ),
    _kind(
        WRONG_LEASE_ACCEPTED,
        wires=(POLLING,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a result poll with a wrong lease token was answered instead of refused",
        fix="compare the X-Osmosis-Rollout-Lease token and answer 403 when it differs",
    ),
    _kind(
        STATUS_REGRESSED,
        wires=(POLLING,),
        reporter="traingate",
        problem=_PROTOCOL,
        meaning="a result poll answered an earlier status than a previous poll had",
        fix="only ever move a rollout's status forward (queued, running, grading, then the end)",
    ),
    # -- the rollout's OpenAI-compatible endpoint
    _kind(
        TOOLS_CHANGED,
        reporter="endpoint",
        untrainable=True,
        problem=_PROTOCOL,
        doc=_ENDPOINT_DOC,
        meaning="a call's `tools` differ from those declared at init (added, dropped, or a "
        "schema changed)",
        fix="return every tool from get_tools and send the same list each call",
    ),
    _kind(
        TOOL_CHOICE_DROPPED,
        reporter="endpoint",
        wires=(V1,),  # v2's chat calls carry tool_choice
        problem=_PROTOCOL,
        doc=_ENDPOINT_DOC,
        meaning="a call asked for `tool_choice` other than `auto`, which the wire cannot carry: "
        "the model chose freely",
        fix="leave tool_choice at auto, or accept that the model chooses",
    ),
    _kind(
        PARALLEL_CALLS,
        reporter="endpoint",
        untrainable=True,
        problem=_PROTOCOL,
        doc=_ENDPOINT_DOC,
        meaning="a call was sent while another of the same rollout ran, or with the same "
        "history and without its reply",
        fix="await each call and append its reply before the next",
    ),
    _kind(
        N_GREATER_THAN_ONE,
        reporter="endpoint",
        untrainable=True,
        problem=_PROTOCOL,
        doc=_ENDPOINT_DOC,
        meaning="a call asked for `n > 1` (refused with a 400): a turn has one reply",
        fix="ask for n=1 and run more rollouts instead",
    ),
    _kind(
        CALL_AFTER_COMPLETION,
        reporter="endpoint",
        untrainable=True,
        problem=_PROTOCOL,
        doc=_ENDPOINT_DOC,
        meaning="a call arrived after ctx.complete/ctx.error or after run() returned (refused)",
        fix="stop the agent before ending the rollout",
    ),
    # -- osmosis test's run checks
    _kind(
        TOOL_ALWAYS_FAILS,
        reporter="test",
        doc=_EVALUATING,
        meaning="every call of a tool in the run failed (a run finding): it raised, timed out, "
        "or its function refused arguments its declared schema allows",
        fix="read the tool's errors in the traces (--debug-dir); a schema its function refuses: "
        "return toolbox.schemas from get_tools",
    ),
    _kind(
        TOOL_ERROR_SHARE,
        reporter="test",
        doc=_EVALUATING,
        meaning="a tool failed in more than --tool-error-share of its calls (a run finding)",
        fix="read the failing calls in the traces, or raise --tool-error-share if that is expected",
    ),
    _kind(
        TOOL_ERRORS,
        reporter="test",
        doc=_EVALUATING,
        meaning="a row had a tool call that raised or timed out (only with --fail-on tool_errors)",
        fix="read the trace's tool_call events, which say how each call failed",
    ),
    _kind(
        EVENT_LOOP_STALL,
        reporter="test",
        doc=_EVALUATING,
        meaning="a rollout's own code blocked the event loop for 0.2 s or more (a time.sleep, a "
        "sync client in async def run)",
        fix="await an async call instead, or run the blocking one in a thread (asyncio.to_thread)",
    ),
    _kind(
        REPLAY_DIVERGED,
        reporter="replay",
        doc=_REAL_MODELS,
        meaning="a replayed row's requests or result differ from its cassette (the row, turn "
        "and field are named)",
        fix="fix the change, or record the cassette again if it was meant",
    ),
    _kind(
        TOKEN_DRIFT,
        reporter="token_check",
        doc=_REAL_MODELS,
        meaning="the tokens TrainGate would train on are not the ones the model sampled",
        fix="keep each reply (and its tool calls' arguments) exactly as returned; the message "
        "names the cause",
    ),
    # -- osmosis validate --reward
    _kind(
        REWARD_LEAK,
        reporter="reward_check",
        doc=_EVALUATING,
        meaning="a no-op or random policy scores at least the gold's reward (or, without gold "
        "rows, above the range's minimum)",
        fix="reward what a right answer has (compare with the ground truth), never an absence",
    ),
    _kind(
        REWARD_CONSTANT,
        reporter="reward_check",
        doc=_EVALUATING,
        meaning="every rollout of every policy got the same reward",
        fix="make the reward depend on the answer",
    ),
    _kind(
        REWARD_OUT_OF_RANGE,
        reporter="reward_check",
        doc=_EVALUATING,
        meaning="a reward outside --reward-range (default 0,1)",
        fix="keep the reward within the range, or pass the range it has",
    ),
    _kind(
        REWARD_NOT_FINITE,
        reporter="reward_check",
        doc=_EVALUATING,
        meaning="a NaN or infinite reward, which the server refuses",
        fix="compute a finite float",
    ),
    _kind(
        GOLD_FAILS,
        reporter="reward_check",
        doc=_EVALUATING,
        meaning="a row whose gold replies (mock_replies) score below --pass-threshold, or fail",
        fix="fix the row's mock_replies, or the reward that fails them",
    ),
)

_BY_CODE: Final[Mapping[str, FindingKind]] = {kind.code: kind for kind in FINDINGS}
if len(_BY_CODE) != len(FINDINGS):  # pragma: no cover - caught by the tests at once
    raise RuntimeError("a finding code is in the table twice")


def kind_of(code: str) -> FindingKind:
    """The table's row for ``code``; a ``KeyError`` naming it when no check reports it."""
    try:
        return _BY_CODE[code]
    except KeyError:
        raise KeyError(f"{code!r} is not a finding code (see osmosis_rollout.findings)") from None


def for_wire(wire: str) -> tuple[FindingKind, ...]:
    """The findings a run on ``wire`` can report, in the table's order."""
    if wire not in WIRES:
        raise ValueError(f"unknown wire {wire!r}: expected one of {', '.join(WIRES)}")
    return tuple(kind for kind in FINDINGS if kind.applies_to(wire))


def render_markdown(kinds: Iterable[FindingKind] = FINDINGS) -> str:
    """``kinds`` as one Markdown table (finding, wires, trainable, validate code, meaning, fix),
    for the docs and a project's AGENTS.md; ends with a newline."""
    lines = [
        "| finding | wires | trainable | `osmosis validate` | what happened | what to do |",
        "|---|---|---|---|---|---|",
    ]
    for kind in kinds:
        wires = "all" if kind.wires == ANY_WIRE else ", ".join(w for w in WIRES if w in kind.wires)
        cells = (
            f"`{kind.code}`",
            wires,
            "no" if kind.untrainable else "yes",
            f"`{kind.problem}`" if kind.problem else "",
            kind.meaning,
            kind.fix,
        )
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
