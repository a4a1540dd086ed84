"""The findings table (``osmosis_rollout.findings``): each code once, and everything that lists
codes (the checks that raise them, the trainable verdict, the dry run's problem codes, the docs)
agrees with it.

``python -m tests.test_findings --write`` regenerates the table in docs/findings.md.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis_rollout import findings
from osmosis_rollout.evaluation.trainability import UNTRAINABLE, untrainable_codes
from osmosis_rollout.findings import (
    ANY_WIRE,
    FINDINGS,
    POLLING,
    WIRES,
    FindingKind,
    for_wire,
    kind_of,
    render_markdown,
)
from osmosis_rollout.validator.result import PROBLEM_CODES

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "osmosis_rollout"
PAGE = ROOT / "docs" / "findings.md"
CODES = {kind.code for kind in FINDINGS}
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_BEGIN = re.compile(r"^<!-- findings-table: begin.*-->\n", re.MULTILINE)
_END = "<!-- findings-table: end -->"
_MARKER = re.compile(r"^<!--\s*findings:\s*(?P<selector>.*?)\s*-->$")
_CODE = re.compile(r"`([a-z][a-z0-9_]*)`")

# -- the table itself ------------------------------------------------------------------------


def test_each_code_is_in_the_table_once_as_a_constant_of_its_name() -> None:
    """A code is a constant named after it and one row; nothing else in the module is one."""
    assert len(CODES) == len(FINDINGS)
    constants = {
        value
        for name, value in vars(findings).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    } - set(WIRES)
    assert constants == CODES
    for kind in FINDINGS:
        assert getattr(findings, kind.code.upper()) == kind.code
        assert re.fullmatch(r"[a-z][a-z0-9_]*", kind.code)


def test_every_row_is_complete() -> None:
    """Wires the toolkit knows, a validate problem code that exists, a page that names the code,
    and a meaning and fix of one line each."""
    for kind in FINDINGS:
        assert kind.wires, kind.code
        assert kind.wires <= set(WIRES), kind.code
        assert kind.problem is None or kind.problem in PROBLEM_CODES, kind.code
        page = ROOT / kind.doc
        assert page.is_file(), kind.code
        assert f"`{kind.code}`" in page.read_text(), f"{kind.doc} does not name {kind.code}"
        for text in (kind.meaning, kind.fix):
            assert text, kind.code
            assert "\n" not in text, kind.code
            assert len(text) <= 160, kind.code
            assert not text.endswith("."), kind.code


def test_kind_of_finds_a_row_and_refuses_an_unknown_code() -> None:
    kind = kind_of("history_rewritten")
    assert kind.untrainable
    assert kind.problem == "DRY_RUN_HISTORY_REWRITTEN"
    assert kind.applies_to("v1")
    assert kind.applies_to("v2")
    assert kind.wires == ANY_WIRE
    with pytest.raises(KeyError, match="'history_rewriten' is not a finding code"):
        kind_of("history_rewriten")


def test_for_wire_gives_each_wire_its_own() -> None:
    v1 = {kind.code for kind in for_wire("v1")}
    v2 = {kind.code for kind in for_wire("v2")}
    assert "tools_sent" in v1
    assert "tools_sent" not in v2
    assert "tools_not_sent" in v2
    assert "tools_not_sent" not in v1
    assert {"history_rewritten", "tools_changed", "event_loop_stall"} <= v1 & v2
    polling = {kind.code for kind in for_wire(POLLING)}
    assert "lease_ignored" in polling
    assert "lease_ignored" not in v1 | v2
    with pytest.raises(ValueError, match="unknown wire 'v9'"):
        for_wire("v9")


def test_render_markdown_is_one_row_per_finding() -> None:
    text = render_markdown(for_wire("v2"))
    lines = text.splitlines()
    assert lines[0].startswith("| finding | wires | trainable |")
    assert len(lines) == 2 + len(for_wire("v2"))
    assert "| `history_rewritten` | all | no | `DRY_RUN_HISTORY_REWRITTEN` |" in text
    assert "| `tools_not_sent` | v2, polling | yes | `DRY_RUN_PROTOCOL` |" in text
    assert text.endswith("\n")
    odd = FindingKind("odd", frozenset({"v1"}), "test", False, None, "x", "a | b", "fix")
    row = render_markdown([odd]).splitlines()[2]
    assert row == "| `odd` | v1 | yes |  | a \\| b | fix |"


# -- what reads the table --------------------------------------------------------------------


def test_the_trainable_verdict_is_the_tables_untrainable_column() -> None:
    """The same ten codes as before the table, read from it."""
    assert {
        "history_rewritten",
        "tools_changed",
        "parallel_calls",
        "n_greater_than_one",
        "chat_after_completion",
        "call_after_completion",
        "tools_sent",
        "unknown_tool",
        "duplicate_completion",
        "no_completion",
    } == UNTRAINABLE
    assert untrainable_codes({"truncated_reply": 2, "tools_sent": 1, "history_rewritten": 1}) == [
        "history_rewritten",
        "tools_sent",
    ]


def test_the_dry_run_reports_each_finding_as_its_problem_code() -> None:
    from osmosis_rollout.testing.records import Finding
    from osmosis_rollout.validator.dry_run import problems_from_outcome

    from .test_validator import outcome

    for kind in FINDINGS:
        if kind.problem is None or kind.code == "no_completion":
            continue
        found = [Finding(kind.code, "what happened", turn=1)]
        problems = problems_from_outcome(outcome(findings=found), timeout_s=1, location="a.py")
        assert problems[0].code == kind.problem, kind.code
        fix = f"see {kind.doc}" if kind.problem == "DRY_RUN_PROTOCOL" else kind.fix
        assert problems[0].message == f"what happened ({kind.code}); {fix}"
    custom = [Finding("my_backends_finding", "odd")]
    problems = problems_from_outcome(outcome(findings=custom), timeout_s=1, location="a.py")
    assert problems[0].message == "odd (my_backends_finding); see docs/validate.md"


# -- every code raised in src/ is the table's ------------------------------------------------

#: Functions that pass on a code they did not choose (the recorders, the endpoint's findings
#: relayed by the mock, a resumed run's findings read back).
_RELAYS = {
    ("testing/records.py", "add"),
    ("testing/protocol_checks.py", "_endpoint_findings"),
    ("evaluation/resume.py", "row_from_dict"),
    ("endpoint/session.py", "add_finding"),
}


def _raising_calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    """(enclosing function, call) for each call that makes a finding: ``Finding(code, ...)``,
    ``record.add(code, ...)``, ``self.add_finding(code, ...)``."""
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        named = isinstance(func, ast.Name) and func.id == "Finding"
        method = isinstance(func, ast.Attribute) and (
            func.attr == "add_finding"
            or (
                func.attr == "add"
                and isinstance(func.value, ast.Name)
                and "record" in func.value.id
            )
        )
        if not (named or method):
            continue
        up: ast.AST | None = node
        while up is not None and not isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
            up = parents.get(up)
        yield (up.name if up is not None else "<module>"), node


def _from_findings(tree: ast.AST) -> set[str]:
    """The names a module imports from ``osmosis_rollout.findings``."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "findings"
        for alias in node.names
    }


def test_every_code_raised_in_src_is_a_constant_of_the_table() -> None:
    """No module defines a code of its own or raises one by a literal or a local name; and
    every row is raised somewhere."""
    problems: list[str] = []
    raised: set[str] = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "findings.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        imported = _from_findings(tree)
        for node in tree.body:  # a code defined outside the table
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Constant)
                and node.value.value in CODES
            ):
                problems.append(f"{rel}:{node.lineno} defines {node.value.value!r} again")
        for function, call in _raising_calls(tree):
            code = call.args[0]
            if isinstance(code, ast.Name) and code.id in imported and code.id.isupper():
                raised.add(getattr(findings, code.id))
            elif (rel, function) not in _RELAYS:
                problems.append(
                    f"{rel}:{call.lineno} raises {ast.unparse(code)}: "
                    "use a constant of osmosis_rollout.findings"
                )
    assert problems == []
    assert CODES - raised == set()


# -- the docs --------------------------------------------------------------------------------


def _selected(selector: str) -> set[str]:
    """The codes a ``<!-- findings: ... -->`` marker names: ``reporter=a,b``, ``wire=W``,
    ``without=W``, ``untrainable``, ``plus=code,code`` (``section``: the scope, not a filter)."""
    kinds = list(FINDINGS)
    plus: set[str] = set()
    for word in selector.split():
        key, _, value = word.partition("=")
        if key == "reporter":
            kinds = [k for k in kinds if k.reporter in value.split(",")]
        elif key == "wire":
            kinds = [k for k in kinds if k.applies_to(value)]
        elif key == "without":
            kinds = [k for k in kinds if not k.applies_to(value)]
        elif key == "untrainable":
            kinds = [k for k in kinds if k.untrainable]
        elif key == "plus":
            plus |= {kind_of(code).code for code in value.split(",")}
        elif key != "section":
            raise AssertionError(f"unknown findings selector {word!r}")
    return {k.code for k in kinds} | plus


def _marked_lists(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, selector, lines) of each marked list: the block up to the next blank line, or
    with ``section`` up to the next heading."""
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        marker = _MARKER.match(line)
        if marker is None:
            continue
        selector = marker["selector"]
        section = "section" in selector.split()
        block: list[str] = []
        fenced = False
        for following in lines[number:]:
            fenced ^= following.startswith("```")
            heading = following.startswith("#") and not fenced
            if heading or (not section and not following.strip()):
                if block or section:
                    break
                continue
            block.append(following)
        yield number, selector, block


def _listed(block: list[str]) -> tuple[set[str], set[str]]:
    """(codes listed, unknown codes): a table's first column, else every backquoted code."""
    rows = [line for line in block if line.startswith("| `")]
    if rows and len(rows) == len([line for line in block if line.startswith("|")]) - 2:
        first = {cell.strip("` ") for cell in (row.split("|")[1] for row in rows)}
        return first & CODES, first - CODES
    return set(_CODE.findall("\n".join(block))) & CODES, set()


def test_every_marked_list_in_the_docs_is_the_tables() -> None:
    """Each ``<!-- findings: SELECTOR -->`` list names exactly the table's codes it selects."""
    seen = 0
    for page in DOC_PAGES:
        for line, selector, block in _marked_lists(page.read_text()):
            listed, unknown = _listed(block)
            where = f"{page.relative_to(ROOT)}:{line} ({selector})"
            assert unknown == set(), f"{where} lists codes that are not findings: {unknown}"
            want = _selected(selector)
            assert listed == want, (
                f"{where}: missing {sorted(want - listed)}, extra {sorted(listed - want)}"
            )
            seen += 1
    assert seen >= 6


def test_every_findings_table_in_the_docs_is_marked() -> None:
    """A docs table of findings (``| finding |``) says which codes it lists, so a test reads it."""
    for page in DOC_PAGES:
        if page == PAGE:
            continue
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.startswith("| finding |"):
                assert _MARKER.match(lines[number - 1]), f"{page.name}:{number + 1} is not marked"


def test_the_marked_list_check_catches_a_missing_and_a_wrong_code() -> None:
    table = "<!-- findings: reporter=reward_check -->\n| finding | when |\n|---|---|\n"
    rows = [f"| `{c}` | x |" for c in sorted(_selected("reporter=reward_check"))]
    (_, selector, block) = next(
        _marked_lists(table + "\n".join([*rows[:-1], "| `reward_lek` | x |"]))
    )
    listed, unknown = _listed(block)
    assert unknown == {"reward_lek"}
    assert _selected(selector) - listed == {sorted(_selected(selector))[-1]}


def test_a_section_runs_to_the_next_heading_past_its_code_blocks() -> None:
    page = "<!-- findings: plus=gold_fails section -->\ntext\n\n```bash\n# a comment\n```\n"
    page += "`gold_fails`\n\n## Next\n`reward_leak`\n"
    (_, _, block) = next(_marked_lists(page))
    assert _listed(block) == ({"gold_fails"}, set())


def _spliced(text: str) -> str:
    begin = _BEGIN.search(text)
    end = text.index(_END)
    assert begin is not None
    assert begin.end() <= end
    return text[: begin.end()] + render_markdown() + text[end:]


def test_docs_findings_page_is_the_table() -> None:
    text = PAGE.read_text()
    assert _spliced(text) == text, (
        "docs/findings.md is stale: python -m tests.test_findings --write"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_findings --write")
    PAGE.write_text(_spliced(PAGE.read_text()))
