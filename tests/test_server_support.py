"""What a server we did not write lacks, reported once for the run: the start answer's checks
(a ``POST /rollout`` started without a key, a ``202`` without the id), each citing the line
of docs/protocol-v2.md that explains its risk; here on a server of nothing but Starlette."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.testing import protocol_checks_v2

from .support import ROOT, serve_in_thread

pytestmark = pytest.mark.anyio


def test_each_cited_line_of_the_protocol_page_explains_its_risk() -> None:
    page = (ROOT / "docs" / "protocol-v2.md").read_text().splitlines()
    for cited, words in ((protocol_checks_v2.WHY_KEY, "server key on every route"),
                         (protocol_checks_v2.WHY_ID, "invents one")):  # fmt: skip
        line = int(cited.rsplit(":", 1)[1])
        assert words in page[line - 1], cited


async def test_a_start_without_key_and_id_is_one_run_finding_each(tmp_path: Path) -> None:
    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def callbacks(body: dict[str, Any]) -> None:
        headers = {"authorization": f"Bearer {body['controller_api_key']}"}
        rid = body["rollout_id"]
        sample = {"messages": body["initial_messages"], "reward": 1.0}
        async with httpx2.AsyncClient(timeout=10) as http:
            await http.post(
                body["completion_callback_url"],
                json={"rollout_id": rid, "status": "success"},
                headers=headers,
            )
            await http.post(
                body["grader_callback_url"],
                json={"rollout_id": rid, "status": "success", "sample": sample},
                headers=headers,
            )

    async def start(request: Request) -> JSONResponse:
        body = await request.json()
        # as osmosis-ai 0.3.2 answers: no id, and the callbacks after the answer
        return JSONResponse({}, status_code=202, background=BackgroundTask(callbacks, body))

    async def status(request: Request) -> JSONResponse:
        rid = request.path_params["rid"]
        return JSONResponse({"rollout_id": rid, "status": "unknown"})  # keeps none, as 0.3.2

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/rollout", start, methods=["POST"]),
            Route("/rollout/{rid}/status", status),
        ]
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"user_prompt": f"q{i}"}) + "\n" for i in range(2)))
    with serve_in_thread(app) as url:
        options = TestOptions(server=url, dataset=rows, protocol=None, timeout=5)
        report = await run_test(options)
    codes = [f["code"] for f in report.summary["run_findings"]]
    assert codes == ["status_unsupported", "init_without_key", "init_without_id"]
    found = {f["code"]: f["message"] for f in report.summary["run_findings"]}
    assert "docs/protocol-v2.md:18" in found["init_without_key"]
    assert "2 of 2 rollout(s)" in found["init_without_id"]
    for row in report.rows:
        assert row.passed, (row.error_message, row.findings)
        assert not {f.code for f in row.findings} & {"init_without_key", "init_without_id"}
