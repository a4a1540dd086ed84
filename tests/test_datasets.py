"""load_dataset: every format, limit/offset, and one clear error per malformed dataset."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from osmosis_rollout.errors import DatasetError
from osmosis_rollout.evaluation.datasets import MAX_LISTED, BadRowsError, read_dataset
from osmosis_rollout.testing import DatasetRow, load_dataset

from .support import ASSETS

DATASETS = ASSETS / "datasets"

CALCULATOR_SYSTEM = {"role": "system", "content": "You are a calculator. Use the tools."}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(*rows: Any) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


# -- formats ----------------------------------------------------------------------------------


def test_jsonl_prompt_and_messages_rows() -> None:
    """JSONL rows of either shape become messages; other columns and ground_truth go to metadata."""
    rows = load_dataset(DATASETS / "arithmetic.jsonl")
    assert [r.index for r in rows] == [0, 1, 2]
    assert rows[0] == DatasetRow(
        index=0,
        messages=[CALCULATOR_SYSTEM, {"role": "user", "content": "What is 3 + 4?"}],
        ground_truth="7",
        metadata={"difficulty": "easy", "ground_truth": "7"},
    )
    assert rows[1].messages == [{"role": "user", "content": "What is 12 * 3?"}]
    assert rows[1].ground_truth == "36"  # a number becomes its string form
    assert rows[2].messages[1] == {"role": "user", "content": "What is 2 ** 10?"}
    assert rows[2].metadata == {"difficulty": "hard", "ground_truth": "1024"}
    assert rows[2].number == 3


def test_csv_rows_with_blank_cells() -> None:
    """CSV rows use the header; a blank system_prompt cell means no system message."""
    rows = load_dataset(DATASETS / "arithmetic.csv")
    assert rows[0].messages == [CALCULATOR_SYSTEM, {"role": "user", "content": "What is 3 + 4?"}]
    assert rows[1].messages == [{"role": "user", "content": "What is 12 * 3?"}]
    assert rows[1].metadata == {"difficulty": "easy", "ground_truth": "36"}


def test_csv_messages_column_holds_json(tmp_path: Path) -> None:
    """In CSV a `messages` cell is a JSON-encoded list; a pandas index column is dropped."""
    cell = json.dumps([{"role": "user", "content": "hi, there"}]).replace('"', '""')
    path = write(tmp_path, "m.csv", f',messages,tag\n0,"{cell}",x\n')
    (row,) = load_dataset(path)
    assert row.messages == [{"role": "user", "content": "hi, there"}]
    assert row.metadata == {"tag": "x"}
    assert row.ground_truth is None


def test_json_object_with_rows_keeps_tool_history() -> None:
    """A JSON object with `rows` is read; assistant tool-call messages may have null content."""
    (row,) = load_dataset(DATASETS / "chats.json")
    assert [m["role"] for m in row.messages] == ["user", "assistant", "tool", "user"]
    assert row.messages[1]["content"] is None
    assert row.metadata == {"source": "handwritten", "ground_truth": "7"}


@pytest.mark.parametrize("wrap", [lambda rows: rows, lambda rows: {"data": rows}])
def test_json_list_or_data_key(tmp_path: Path, wrap: Any) -> None:
    """A JSON file may be a list of rows or an object with a `data` list."""
    path = write(tmp_path, "d.json", json.dumps(wrap([{"user_prompt": "a"}, {"user_prompt": "b"}])))
    assert [r.messages[0]["content"] for r in load_dataset(path)] == ["a", "b"]


def test_parquet_prompt_columns(tmp_path: Path) -> None:
    """Parquet rows are read with pyarrow; typed columns become JSON-ready metadata."""
    path = tmp_path / "d.parquet"
    table = pa.table(
        {
            "user_prompt": ["What is 1 + 1?", "What is 2 + 2?"],
            "ground_truth": [2, 4],
            "weight": [0.5, float("nan")],
            "tags": [["a"], []],
        }
    )
    pq.write_table(table, path)
    rows = load_dataset(path)
    assert rows[0].messages == [{"role": "user", "content": "What is 1 + 1?"}]
    assert rows[0].metadata == {"weight": 0.5, "tags": ["a"], "ground_truth": "2"}
    assert rows[1].metadata["weight"] is None  # NaN is not JSON


def test_parquet_messages_structs(tmp_path: Path) -> None:
    """A list<struct> messages column works; fields a message does not have are dropped."""
    path = tmp_path / "m.parquet"
    messages = [
        [
            {"role": "system", "content": "Be brief.", "tool_call_id": None},
            {"role": "user", "content": "Hi", "tool_call_id": None},
        ]
    ]
    pq.write_table(pa.table({"messages": messages}), path)
    (row,) = load_dataset(path)
    assert row.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_parquet_without_pyarrow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without pyarrow, a .parquet dataset names the `parquet` extra to install."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"user_prompt": ["x"]}), path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DatasetError, match=r"pip install 'osmosis-rollout\[parquet\]'"):
        load_dataset(path)


# -- limit and offset -------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_limit_and_offset(tmp_path: Path, suffix: str) -> None:
    """`offset` skips rows and `limit` keeps that many; indexes stay the file's."""
    prompts = [f"q{i}" for i in range(6)]
    path = tmp_path / f"d{suffix}"
    if suffix == ".jsonl":
        path.write_text(jsonl(*({"user_prompt": p} for p in prompts)))
    elif suffix == ".json":
        path.write_text(json.dumps([{"user_prompt": p} for p in prompts]))
    elif suffix == ".csv":
        path.write_text("user_prompt\n" + "".join(f"{p}\n" for p in prompts))
    else:
        pq.write_table(pa.table({"user_prompt": prompts}), path)
    rows = load_dataset(path, offset=2, limit=3)
    assert [r.index for r in rows] == [2, 3, 4]
    assert [r.messages[0]["content"] for r in rows] == ["q2", "q3", "q4"]
    assert [r.index for r in load_dataset(path, offset=4, limit=10)] == [4, 5]


def test_jsonl_is_read_lazily(tmp_path: Path) -> None:
    """Rows past offset+limit are never parsed, and skipped rows are not checked."""
    path = write(tmp_path, "d.jsonl", '{"bad": \n' + jsonl({"user_prompt": "ok"}) + "not json\n")
    (row,) = load_dataset(path, offset=1, limit=1)
    assert row.index == 1


def test_offset_beyond_the_end(tmp_path: Path) -> None:
    """An offset past the last row says how many rows there are."""
    path = write(tmp_path, "d.jsonl", jsonl({"user_prompt": "a"}, {"user_prompt": "b"}))
    with pytest.raises(DatasetError, match=r"offset 2 is beyond the end of d.jsonl.*2 row"):
        load_dataset(path, offset=2)


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"limit": 0}, "limit must be at least 1"), ({"offset": -1}, "offset")]
)
def test_bad_limit_or_offset(tmp_path: Path, kwargs: dict[str, int], message: str) -> None:
    """Non-positive limits and negative offsets are refused."""
    path = write(tmp_path, "d.jsonl", jsonl({"user_prompt": "a"}))
    with pytest.raises(DatasetError, match=message):
        load_dataset(path, **kwargs)


# -- malformed datasets -----------------------------------------------------------------------

ROW_ERRORS = [
    (
        "not_object",
        "d.jsonl",
        jsonl({"user_prompt": "a"}, [1, 2]),
        None,
        "row 2: must be an object with 'user_prompt' or 'messages', got a list (line 2)",
    ),
    (
        "invalid_json",
        "d.jsonl",
        jsonl({"user_prompt": "a"}) + "\n{oops\n",
        None,
        "row 2: invalid JSON on line 3 of d.jsonl",
    ),
    (
        "missing_prompt",
        "d.jsonl",
        jsonl({"question": "a"}),
        "user_prompt",
        "row 1, column 'user_prompt': needs a 'user_prompt' string or a 'messages' list; "
        "its columns are 'question' (line 1)",
    ),
    (
        "both_given",
        "d.json",
        json.dumps([{"user_prompt": "a"}, {"user_prompt": "a", "messages": []}]),
        "messages",
        "row 2, column 'messages': gives both 'messages' and 'user_prompt'",
    ),
    (
        "system_with_messages",
        "d.jsonl",
        jsonl({"system_prompt": "s", "messages": [{"role": "user", "content": "a"}]}),
        "system_prompt",
        "row 1, column 'system_prompt': 'system_prompt' cannot be combined",
    ),
    (
        "prompt_wrong_type",
        "d.jsonl",
        jsonl({"user_prompt": 5}),
        "user_prompt",
        "row 1, column 'user_prompt': must be a string, got a number (5)",
    ),
    (
        "prompt_empty",
        "d.jsonl",
        jsonl({"user_prompt": "  "}),
        "user_prompt",
        "row 1, column 'user_prompt': must not be empty",
    ),
    (
        "system_wrong_type",
        "d.jsonl",
        jsonl({"system_prompt": ["s"], "user_prompt": "a"}),
        "system_prompt",
        "row 1, column 'system_prompt': must be a string, got a list",
    ),
    (
        "ground_truth_wrong_type",
        "d.jsonl",
        jsonl({"user_prompt": "a", "ground_truth": {"x": 1}}),
        "ground_truth",
        "row 1, column 'ground_truth': must be a string (or a number), got an object",
    ),
    (
        "messages_not_list",
        "d.jsonl",
        jsonl({"messages": {"role": "user"}}),
        "messages",
        "row 1, column 'messages': must be a list of messages, got an object",
    ),
    (
        "messages_empty",
        "d.jsonl",
        jsonl({"messages": []}),
        "messages",
        "row 1, column 'messages': must not be an empty list",
    ),
    (
        "message_not_object",
        "d.jsonl",
        jsonl({"messages": ["hi"]}),
        "messages[0]",
        "row 1, column 'messages[0]': must be an object with 'role' and 'content', got a string",
    ),
    (
        "bad_role",
        "d.jsonl",
        jsonl({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]}),
        "messages[1].role",
        "row 1, column 'messages[1].role': must be one of assistant, developer, "
        "system, tool, user, got 'bot'",
    ),
    (
        "missing_content",
        "d.jsonl",
        jsonl({"messages": [{"role": "user"}]}),
        "messages[0].content",
        "row 1, column 'messages[0].content': must be a string or a list",
    ),
    (
        "csv_messages_not_json",
        "d.csv",
        'messages\n"[{""role"": ""user"", ""content"": ""a""}]"\n[{\n',
        "messages",
        "row 2, column 'messages': is not valid JSON",
    ),
    (
        "csv_extra_fields",
        "d.csv",
        "user_prompt,ground_truth\na,1\nb,2,3\n",
        None,
        "row 2: has 3 fields but the header has 2; quote values that hold a comma (line 3)",
    ),
    (
        "csv_duplicate_header",
        "d.csv",
        "user_prompt,user_prompt\na,b\n",
        "user_prompt",
        "column 'user_prompt': the CSV header of d.csv repeats this column",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "column", "message"),
    [(fn, text, col, msg) for _, fn, text, col, msg in ROW_ERRORS],
    ids=[case[0] for case in ROW_ERRORS],
)
def test_malformed_rows_name_row_and_column(
    tmp_path: Path, name: str, text: str, column: str | None, message: str
) -> None:
    """Each malformed row raises a DatasetError naming its 1-based row and its column."""
    with pytest.raises(DatasetError) as info:
        load_dataset(write(tmp_path, name, text))
    assert str(info.value).startswith(message)
    assert info.value.column == column


def test_parquet_value_that_is_not_json(tmp_path: Path) -> None:
    """A binary Parquet column cannot go into metadata; the error names row and column."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"user_prompt": ["a", "b"], "blob": [b"ok", b"\x00"]}), path)
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    # Both rows are bad, so both are named (Parquet has no lines to name).
    assert str(info.value) == (
        "2 rows of d.parquet are bad:\n"
        "  row 1, column 'blob': holds a bytes value, which is not JSON; convert it to a string\n"
        "  row 2, column 'blob': holds a bytes value, which is not JSON; convert it to a string"
    )


BAD_ROWS = (
    '{"user_prompt": "a"}\n'
    '{"user_prompt": "b",\n'
    '{"user_prompt": 5}\n'
    '{"user_prompt": "d"}\n'
    '{"question": "e"}\n'
)


def test_every_bad_row_is_named_with_its_line_not_only_the_first(tmp_path: Path) -> None:
    """One run shows every row to fix: its row, line, column, what is wrong and the fix."""
    with pytest.raises(BadRowsError) as info:
        load_dataset(write(tmp_path, "d.jsonl", BAD_ROWS))
    assert str(info.value) == (
        "3 rows of d.jsonl are bad:\n"
        "  row 2: invalid JSON on line 2 of d.jsonl: Expecting property name enclosed in "
        "double quotes (column 21); each line must be one whole JSON object\n"
        "  row 3, column 'user_prompt': must be a string, got a number (5) (line 3)\n"
        "  row 5, column 'user_prompt': needs a 'user_prompt' string or a 'messages' list; its "
        "columns are 'question' (line 5)"
    )
    assert [p.row for p in info.value.problems] == [2, 3, 5]
    assert isinstance(info.value, DatasetError)  # still a ConfigError: exit 2 in the CLI


def test_a_long_list_of_bad_rows_stops_at_twenty(tmp_path: Path) -> None:
    """The first MAX_LISTED bad rows, then how many more."""
    text = '{"user_prompt": 1}\n' * 25 + '{"user_prompt": "ok"}\n' + "[]\n" * 2
    with pytest.raises(BadRowsError) as info:
        load_dataset(write(tmp_path, "d.jsonl", text))
    lines = str(info.value).splitlines()
    assert MAX_LISTED == 20
    assert lines[0] == "27 rows of d.jsonl are bad:"
    assert len(lines) == 1 + MAX_LISTED + 1
    assert lines[MAX_LISTED].startswith("  row 20, column 'user_prompt': must be a string")
    assert lines[-1] == "  and 7 more"
    assert len(info.value.problems) == 27


def test_csv_bad_rows_are_all_named(tmp_path: Path) -> None:
    """A row with too many fields no longer hides the rows after it."""
    path = write(tmp_path, "d.csv", "user_prompt,ground_truth\na,1\nb,2,3\n,4\n")
    with pytest.raises(BadRowsError) as info:
        load_dataset(path)
    assert str(info.value).splitlines()[1:] == [
        "  row 2: has 3 fields but the header has 2; quote values that hold a comma (line 3)",
        "  row 3, column 'user_prompt': needs a 'user_prompt' string or a 'messages' list; its "
        "columns are 'ground_truth' (line 4)",
    ]


def test_skip_bad_rows_keeps_the_good_ones_and_names_the_rest(tmp_path: Path) -> None:
    """The good rows keep their file numbers; the skipped ones are given back, not lost."""
    path = write(tmp_path, "d.jsonl", BAD_ROWS)
    dataset = read_dataset(path, skip_bad_rows=True)
    assert [row.number for row in dataset.rows] == [1, 4]
    assert [problem.row for problem in dataset.skipped] == [2, 3, 5]
    assert [row.number for row in load_dataset(path, skip_bad_rows=True)] == [1, 4]
    # limit and offset count the file's rows, bad or good.
    assert [row.number for row in load_dataset(path, offset=1, limit=3, skip_bad_rows=True)] == [4]


def test_skipping_every_row_is_still_an_error(tmp_path: Path) -> None:
    """Nothing left to run: say so, with the rows, rather than run zero rows."""
    path = write(tmp_path, "d.jsonl", '{"user_prompt": 1}\n')
    with pytest.raises(BadRowsError) as info:
        load_dataset(path, skip_bad_rows=True)
    assert str(info.value) == (
        "every row read from d.jsonl is bad (1):\n"
        "  row 1, column 'user_prompt': must be a string, got a number (1) (line 1)"
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "\n\n", "has no rows"),
        ("empty.csv", "user_prompt\n", "has no rows"),
        ("empty.json", "[]", "has no rows"),
        ("blank.csv", "", "has no rows"),
        ("bad.json", '{"rows": [', "bad.json is not valid JSON: Expecting value at line 1"),
        ("shape.json", '{"items": []}', "must hold a list of rows, or an object with a 'rows'"),
        ("data.txt", "hello", "unsupported extension '.txt'; use .jsonl, .json, .csv or .parquet"),
        ("noext", "hello", "unsupported extension '(none)'"),
        ("broken.parquet", "not parquet", "cannot read broken.parquet as Parquet"),
    ],
)
def test_malformed_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    """File-level problems (empty, wrong shape, unknown extension) say what is wrong."""
    with pytest.raises(DatasetError) as info:
        load_dataset(write(tmp_path, name, content))
    assert message in str(info.value)


def test_not_utf8(tmp_path: Path) -> None:
    """A file that is not UTF-8 text says so instead of raising UnicodeDecodeError."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"user_prompt": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match="not UTF-8 text"):
        load_dataset(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    """A path that does not exist, or is a directory, is named in the error."""
    with pytest.raises(DatasetError, match=r"dataset file not found: .*nope\.jsonl"):
        load_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="is a directory"):
        load_dataset(tmp_path)


def test_csv_with_an_unclosed_quote_is_an_error(tmp_path: Path) -> None:
    """An unclosed quote would swallow the rest of the file into one cell: report it instead."""
    path = tmp_path / "rows.csv"
    path.write_text('user_prompt,ground_truth\n"hello,1\nworld,2\n', encoding="utf-8")
    with pytest.raises(DatasetError, match="not valid CSV near line 3"):
        load_dataset(path)
