"""The protocol v2 checks of the mock TrainGate: what a v2 rollout server did that a v2
controller (spec §11) depends on not happening, each a named :class:`Finding`.

The rules kept from v1 (the append-only history, the tools called, the replies) are
:mod:`.protocol_checks`'; these are the ones v2 adds: tools on every chat call, the body id
matching the path id, the chat key apart from the callback key, one completion then one grader
callback, no reward on a failure, and status and cancel answers that agree with the callbacks.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..findings import (
    CANCEL_WRONG,
    CHAT_AFTER_COMPLETION,
    DUPLICATE_COMPLETION,
    DUPLICATE_GRADER,
    GRADER_BEFORE_COMPLETION,
    INIT_WITHOUT_ID,
    INIT_WITHOUT_KEY,
    NON_TERMINAL_STATUS,
    REWARD_ON_FAILURE,
    STATUS_WRONG,
    TOOLS_NOT_SENT,
)
from ..protocol import (
    DISPOSITIONS,
    TERMINAL_STATUSES,
    CancelAnswer,
    CompletionCallback,
    CompletionsRequest,
    GraderCallback,
    StatusAnswer,
    describe_validation_error,
)
from .protocol_checks import check_history
from .records import RolloutRecord, V2Exchange

__all__ = [
    "check_cancel",
    "check_chat_v2",
    "check_completion_callback",
    "check_grader_callback",
    "check_status",
    "expected_status",
]


def check_chat_v2(
    record: RolloutRecord, exchange: V2Exchange, body: CompletionsRequest, sent_tools: bool
) -> None:
    """A v2 chat call, before it is recorded: after the completion callback, without the
    agent's tools (v2 declares nothing at init: each call must carry them), or rewriting the
    history."""
    turn = len(record.chats) + 1
    if exchange.completions:
        record.add(CHAT_AFTER_COMPLETION, "chat call after the completion callback", turn=turn)
    if not sent_tools and exchange.declared:
        names = ", ".join(sorted(t.name for t in exchange.declared))
        record.add(
            TOOLS_NOT_SENT,
            f"chat call without `tools` although the agent declares {names}: on v2 the model "
            "only knows the tools each call sends",
            turn=turn,
        )
    check_history(record, body, turn)


def check_completion_callback(
    record: RolloutRecord, exchange: V2Exchange, body: CompletionCallback
) -> None:
    """A completion callback, before it is recorded: a second one is a duplicate."""
    if exchange.completions:
        record.add(DUPLICATE_COMPLETION, "a second completion callback arrived")


def check_grader_callback(
    record: RolloutRecord, exchange: V2Exchange, body: GraderCallback
) -> None:
    """A grader callback, before it is recorded: the order, a duplicate, and a reward the
    trainer must not train on (a failure, a removed sample, a failed agent phase)."""
    if exchange.graders:
        record.add(DUPLICATE_GRADER, "a second grader callback arrived")
        return
    if not exchange.completions:
        record.add(
            GRADER_BEFORE_COMPLETION,
            "the grader callback arrived before the completion callback: the completion "
            "must come first",
        )
    sample = body.sample
    if sample is None or sample.reward is None:
        return
    completion = exchange.completions[0] if exchange.completions else None
    if body.status != "success":
        why = f"a grader {body.status!r}"
    elif sample.remove_sample:
        why = "a sample marked remove_sample"
    elif completion is not None and completion.status != "success":
        why = f"an agent phase that ended {completion.status!r}"
    else:
        return
    record.add(
        REWARD_ON_FAILURE,
        f"the grader callback carries reward {sample.reward!r} for {why}: a reward is only "
        "sent with a successful, kept sample",
    )


def expected_status(exchange: V2Exchange) -> tuple[str, float | None]:
    """The status and reward ``GET /rollout/{id}/status`` must answer after the grader."""
    grader = exchange.graders[0]
    completion = exchange.completions[0] if exchange.completions else None
    if completion is not None and completion.status == "cancelled":
        return "cancelled", None
    if grader.status == "success":
        sample = grader.sample
        return "success", sample.reward if sample is not None else None
    return "failure", None


def check_status(record: RolloutRecord, exchange: V2Exchange, code: int, body: Any) -> None:
    """The status answer read after the grader callback: terminal, and the grader's outcome."""
    status = body.get("status") if isinstance(body, dict) else None
    if code != 200 or not isinstance(status, str):
        record.add(
            STATUS_WRONG,
            f"GET /rollout/{{id}}/status answered HTTP {code} without a status after the "
            "grader callback",
        )
        return
    if status not in TERMINAL_STATUSES and status != "unknown":
        record.add(
            NON_TERMINAL_STATUS,
            f"GET /rollout/{{id}}/status still said {status!r} after the grader callback "
            "(the terminal event): record the outcome before sending the callback",
        )
        return
    try:
        StatusAnswer.model_validate(body)
    except ValidationError as exc:
        record.add(
            STATUS_WRONG,
            "GET /rollout/{id}/status answered a body that is not a v2 status answer: "
            + describe_validation_error(exc),
        )
        return
    want, reward = expected_status(exchange)
    got_reward = body.get("reward")
    if status != want or (status == "success" and got_reward != reward):
        record.add(
            STATUS_WRONG,
            f"GET /rollout/{{id}}/status said {status!r} (reward {got_reward!r}) after a "
            f"grader callback that means {want!r} (reward {reward!r})",
            details={"status": status, "expected": want},
        )


def check_cancel(record: RolloutRecord, exchange: V2Exchange, code: int, body: Any) -> None:
    """The answer to the controller's ``POST /rollout/cancel {"ids": [id]}`` at its deadline:
    an entry for the id, a known disposition, and ``not_found`` only for a rollout that ended."""
    dispositions = body.get("dispositions") if isinstance(body, dict) else None
    found = dispositions.get(record.rollout_id) if isinstance(dispositions, dict) else None
    if code != 200 or found not in DISPOSITIONS:
        record.add(
            CANCEL_WRONG,
            f"POST /rollout/cancel answered HTTP {code} with disposition {found!r} for this "
            "id: expected cancelled_queued, cancelled_running or not_found",
            details={"http": code, "dispositions": dispositions}
            if isinstance(dispositions, dict) and not dispositions
            else None,
        )
        return
    try:
        CancelAnswer.model_validate(body)
    except ValidationError as exc:
        record.add(
            CANCEL_WRONG,
            "POST /rollout/cancel answered a body that is not a v2 cancel answer: "
            + describe_validation_error(exc),
        )
        return
    if found == "not_found" and not exchange.completions:
        record.add(
            CANCEL_WRONG,
            "POST /rollout/cancel said not_found for a rollout that sent no callback at all: "
            "the server lost it, or cannot cancel it",
        )


#: Where docs/protocol-v2.md explains each risk a server's start answer shows (checked by
#: tests/test_server_support.py against the page).
WHY_KEY = "docs/protocol-v2.md:18"
WHY_ID = "docs/protocol-v2.md:183"


def check_start(record: RolloutRecord, body: Any, *, keyed: bool) -> None:
    """A remote server's ``202`` to ``POST /rollout``: started without a server key (none was
    given), and without the ``rollout_id`` in its answer. Run-level facts about the server,
    lifted off the rows by ``evaluation.server_support``."""
    if not keyed:
        record.add(
            INIT_WITHOUT_KEY,
            "POST /rollout without a key was answered 202: anyone who reaches the server's "
            f"port can start rollouts ({WHY_KEY})",
            turn=0,
        )
    if not (isinstance(body, dict) and body.get("rollout_id") == record.rollout_id):
        record.add(
            INIT_WITHOUT_ID,
            "the 202 of POST /rollout does not carry the rollout_id: an id the server "
            f"invents could never be named for status or cancel ({WHY_ID})",
            turn=0,
        )
