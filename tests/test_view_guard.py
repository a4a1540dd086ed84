"""``osmosis view`` against hostile input: a crafted trace runs no script in Chromium, a foreign
Host (DNS rebinding) gets nothing, every answer carries the Content-Security-Policy."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.view import build_index, create_view_app
from osmosis_rollout.view.guard import CONTENT_SECURITY_POLICY

from .browser import Chromium, find_chromium
from .programs import skip_missing
from .support import serve_in_thread

#: Breaks out of text, of either quote of an attribute, and of a <pre>; sets __pwned if it runs.
PAYLOAD = (
    "\"'><img src=x onerror=window.__pwned=1><script>window.__pwned=1</script>"
    "</pre><svg onload=window.__pwned=1>`${window.__pwned=1}`"
)
#: A folder name may hold most of it too (no slash): the sources line shows it.
FOLDER = "run\"'><img src=x onerror=window.__pwned=1>"
RID = "row-1-crafted"


def _message(role: Any = PAYLOAD) -> dict[str, Any]:
    return {"role": role, "content": PAYLOAD, "tool_call_id": PAYLOAD}


def _results_row(rollout_id: str) -> dict[str, Any]:
    """A results row with a hostile value in every field the page shows."""
    fields = ["status", "reward", "finish_reason", "error_message", "turns", "tool_calls"]
    fields += ["prompt_tokens", "response_tokens", "latency_ms", "ground_truth"]
    row: dict[str, Any] = {"type": "row", "row": 1, "rollout_id": rollout_id}
    row |= dict.fromkeys(fields, PAYLOAD)
    row["findings"] = [{"code": PAYLOAD, "message": PAYLOAD}]
    row["trace"] = "traces/crafted.jsonl"
    call = {"id": PAYLOAD, "type": "function", "function": {"name": PAYLOAD, "arguments": PAYLOAD}}
    row["final_messages"] = [_message(), {**_message("assistant"), "tool_calls": [call]}]
    return row


def _trace(rollout_id: str) -> list[dict[str, Any]]:
    """A trace with a hostile value wherever the trace format leaves a value free."""
    base = {"v": 2, "rollout_id": rollout_id}
    call = {"id": "c1", "type": "function", "function": {"name": PAYLOAD, "arguments": PAYLOAD}}
    return [
        {**base, "ts": 1.0, "event": "rollout_start", "note": PAYLOAD},
        {
            **base,
            "ts": 1.5,
            "event": "turn",
            "turn": 1,
            "messages": [_message(), _message("tool")],
            "reply": {"role": "assistant", "content": PAYLOAD, "tool_calls": [call]},
            "finish_reason": PAYLOAD,
            "usage": {"prompt_tokens": PAYLOAD, "completion_tokens": PAYLOAD},
            "latency_ms": 5,
            "error": PAYLOAD,
        },
        {
            **base,
            "ts": 1.6,
            "event": "tool_call",
            "turn": 1,
            "tool": PAYLOAD,
            "tool_call_id": "c1",
            "arguments": PAYLOAD,
            "result": PAYLOAD,
            "result_chars": PAYLOAD,
            "latency_ms": 2,
            "error": PAYLOAD,
        },
        {**base, "ts": 1.7, "event": PAYLOAD, "detail": PAYLOAD},
        {
            **base,
            "ts": 2.0,
            "event": "rollout_end",
            "status": PAYLOAD,
            "reward": PAYLOAD,
            "finish_reason": PAYLOAD,
            "error_message": PAYLOAD,
            "metrics": {"num_llm_calls": PAYLOAD, "prompt_tokens": PAYLOAD},
            "final_messages": [_message()],
        },
        {
            **base,
            "event": "findings",
            "findings": [
                {"code": PAYLOAD, "message": PAYLOAD, "turn": 1},
                {"code": PAYLOAD, "message": PAYLOAD},
            ],
        },
    ]


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def crafted(tmp_path: Path) -> list[Path]:
    """A results file and its trace folder (one trace linked, one alone) full of payloads."""
    run = tmp_path / FOLDER
    _write_jsonl(run / "results.jsonl", [_results_row(RID)])
    _write_jsonl(run / "traces" / "crafted.jsonl", _trace(RID))
    _write_jsonl(run / "traces" / "alone.jsonl", _trace("row-1-alone"))
    return [run / "results.jsonl", run / "traces"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        skip_missing("chromium")
        raise AssertionError("unreachable")
    with Chromium(executable, tmp_path_factory.mktemp("chromium-profile")) as chromium:
        # Before any of the page's own script: record every CSP / Trusted Types violation.
        chromium.call(
            "Page.addScriptToEvaluateOnNewDocument",
            source="window.__violations = []; document.addEventListener("
            "'securitypolicyviolation', e => window.__violations.push("
            "e.violatedDirective + ' ' + e.blockedURI));",
        )
        yield chromium


def _injected(browser: Chromium) -> dict[str, Any]:
    """What a payload would leave behind had it been inserted as HTML, or run."""
    return dict(
        browser.evaluate(
            "({ pwned: window.__pwned ?? null, violations: window.__violations,"
            " elements: document.querySelectorAll("
            "'img, script:not([src]), svg, [onerror], [onload]').length,"
            " shown: document.body.textContent.includes(" + json.dumps(PAYLOAD[:40]) + ") })"
        )
    )


def test_a_crafted_trace_runs_no_script_in_chromium(crafted: list[Path], browser: Chromium) -> None:
    """Every view of rollouts whose every value is HTML and script: the values are shown as
    text, no element is injected, nothing runs, and the page itself breaks no CSP rule."""
    index = build_index(crafted)
    assert {r.rollout_id for r in index.rollouts} == {RID, "row-1-alone"}
    linked = next(r for r in index.rollouts if r.rollout_id == RID)
    alone = next(r for r in index.rollouts if r.rollout_id == "row-1-alone")
    views = [
        "#/",
        f"#/rollout/{linked.id}",
        f"#/rollout/{alone.id}",
        f"#/compare/{linked.id}/{alone.id}",
    ]
    with serve_in_thread(create_view_app(index)) as url:
        browser.open(url + "/")
        for view in views:
            browser.go(view)
            assert browser.evaluate("document.querySelector('#app .error') === null"), view
            seen = _injected(browser)
            assert seen == {"pwned": None, "violations": [], "elements": 0, "shown": True}, view
        # The values the review found inserted as HTML are on the page as text.
        browser.go(f"#/rollout/{linked.id}")
        heading = browser.evaluate("document.querySelector('.turn h3 .dim').textContent")
        assert f"{PAYLOAD} in / {PAYLOAD} out tokens" in heading
        result = browser.evaluate("document.querySelector('.tool-result .dim').textContent")
        assert f"cut from {PAYLOAD} chars" in result
        assert browser.evaluate("document.querySelector('.tool-result pre').textContent") == PAYLOAD


def test_a_string_assigned_to_innerhtml_is_refused_by_trusted_types(
    crafted: list[Path], browser: Chromium
) -> None:
    """Code that bypasses the page's render() (a future column written carelessly) cannot
    write HTML: the CSP's Trusted Types rule makes the assignment throw."""
    with serve_in_thread(create_view_app(build_index(crafted))) as url:
        browser.open(url + "/")
        refused = browser.evaluate(
            "(() => { try { document.getElementById('app').innerHTML = '<b>x</b>';"
            " return false; } catch (e) { return e instanceof TypeError; } })()"
        )
        assert refused is True
        assert browser.evaluate("document.querySelectorAll('#app b').length") == 0


def test_the_html_tag_escapes_each_value_once(crafted: list[Path], browser: Chromium) -> None:
    """The page's one escaping path: values (strings, numbers, arrays, esc()'d ones) are
    escaped exactly once; fragments made by html`` stay markup."""
    with serve_in_thread(create_view_app(build_index(crafted))) as url:
        browser.open(url + "/")
        got = browser.evaluate(
            "[html`<i title=\"${'\"x'}\">${'<b>'}</i>`.text,"
            " html`${esc('<b>')}|${['<a>', html`<br>`, 7]}|${null}|${undefined}`.text]"
        )
    assert got == ['<i title="&quot;x">&lt;b&gt;</i>', "&lt;b&gt;|&lt;a&gt;<br>7||"]


def _get(port: int, path: str, host: str, extra: str = "") -> tuple[int, dict[str, str], str]:
    """One raw HTTP/1.1 GET on a real socket: status, headers (lower-case names), body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    return int(status_line.split()[1]), headers, body.decode()


def test_a_foreign_host_gets_no_rollout_dns_rebinding(crafted: list[Path]) -> None:
    """Host: attacker.example (a rebound name pointing at 127.0.0.1) is refused on every path;
    127.0.0.1 and localhost are answered."""
    with serve_in_thread(create_view_app(build_index(crafted))) as url:
        port = int(url.rsplit(":", 1)[1])
        for path in ("/api/rollouts", "/api/rollouts/r1-0", "/", "/static/view.js"):
            for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.evil:{port}"):
                status, headers, body = _get(port, path, host)
                assert status == 421, (path, host)
                assert RID not in body
                assert '"rollouts"' not in body
                assert f"open http://127.0.0.1:{port}/" in body
                assert headers["content-type"].startswith("text/plain")
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
            status, _, body = _get(port, "/api/rollouts", host)
            assert status == 200, host
            assert RID in body


def test_another_sites_request_for_the_data_is_refused(crafted: list[Path]) -> None:
    """A browser marks a request another site's page makes (Sec-Fetch-Site: cross-site): the
    API refuses it; the page's own requests (same-origin) and a typed URL (none) pass."""
    with serve_in_thread(create_view_app(build_index(crafted))) as url:
        port = int(url.rsplit(":", 1)[1])
        host = f"127.0.0.1:{port}"
        for site, expected in (("cross-site", 403), ("same-site", 403), ("same-origin", 200)):
            status, _, body = _get(port, "/api/rollouts", host, f"Sec-Fetch-Site: {site}\r\n")
            assert status == expected, site
            assert (RID in body) is (expected == 200)
        assert _get(port, "/api/rollouts", host, "Sec-Fetch-Site: none\r\n")[0] == 200


def test_every_answer_carries_the_csp(crafted: list[Path]) -> None:
    """The page, its script, the API, a 404 and a refusal all send the policy (no inline
    script, only this origin, Trusted Types) and nosniff."""
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert "require-trusted-types-for 'script'" in CONTENT_SECURITY_POLICY
    with serve_in_thread(create_view_app(build_index(crafted))) as url:
        port = int(url.rsplit(":", 1)[1])
        answers = [
            _get(port, path, f"127.0.0.1:{port}")
            for path in ("/", "/static/view.js", "/api/rollouts", "/api/rollouts/nope", "/nope")
        ]
        answers.append(_get(port, "/", "attacker.example"))
        assert [status for status, _, _ in answers] == [200, 200, 200, 404, 404, 421]
        for _, headers, _ in answers:
            assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
